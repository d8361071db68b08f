"""The user data every node boots with: cloud-init's template (templates/cloud-init.yaml.j2) rendered with the
cluster's internal key, the node's facts and the autostop watchdog, gzip-compressed (cloud-init reads it so):
EC2 takes 16 KB of user data, and the watchdog's source, as text, shrinks about threefold."""

from __future__ import annotations

import gzip
import json

from clusterctl import resources
from clusterctl.types import Autostop


def render_user_data(
    cluster: str, region: str, ssh_user: str, slots: int, internal_public_key: str, autostop: Autostop | None = None
) -> str:
    import jinja2

    from clusterctl.autostop import watchdog as autostop_lib

    text = resources.template_path("cloud-init.yaml.j2").read_text()
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False)
    node = {"cluster": cluster, "region": region, "ssh_user": ssh_user, "slots": slots}
    watchdog = autostop_lib.cloud_init(cluster, autostop, ssh_user) if autostop is not None else None
    return env.from_string(text).render(
        cluster=cluster,
        internal_public_key=internal_public_key,
        node_json=json.dumps(node, sort_keys=True) + "\n",
        autostop=watchdog,
    )


LIMIT = 16384  # bytes of user data EC2 takes (before its base64)


def user_data(
    cluster: str, region: str, ssh_user: str, slots: int, internal_public_key: str, autostop: Autostop | None = None
) -> bytes:
    """What RunInstances gets: the rendered text, gzip-compressed; the same spec gives the same bytes."""
    text = render_user_data(cluster, region, ssh_user, slots, internal_public_key, autostop)
    return gzip.compress(text.encode(), compresslevel=9, mtime=0)
