"""The nodes' host keys from their console output: cloud-init prints them there, and EC2's API (signed, over TLS)
is an authenticated source, so `up` and `repair` pin them without trusting first contact.
"""

from __future__ import annotations

import base64
import re
import time

from clusterctl.providers.aws.api import Api, _code
from clusterctl.types import Cluster

# How long `up` reads the consoles for cloud-init's host keys. Without Latest=True (Xen types) EC2 posts console
# output only every few minutes after boot, so this is generous; with it (Nitro) the keys show within seconds.
CONSOLE_WAIT = 600.0
_KEYS_BLOCK = re.compile(r"-----BEGIN SSH HOST KEY KEYS-----(.*?)-----END SSH HOST KEY KEYS-----", re.S)
_KEY = re.compile(r"\b(ssh-ed25519|ecdsa-sha2-nistp(?:256|384|521)|ssh-rsa)\s+([A-Za-z0-9+/]+={0,3})")
_CLOUD_INIT_DONE = re.compile(r"Cloud-init v\. \S+ finished at")
_KEY_ORDER = {
    "ssh-ed25519": 0,
    "ecdsa-sha2-nistp256": 1,
    "ecdsa-sha2-nistp384": 1,
    "ecdsa-sha2-nistp521": 1,
    "ssh-rsa": 2,
}


def host_keys_from_console(text: str) -> tuple[str, ...]:
    """The host keys cloud-init printed (its last "SSH HOST KEY KEYS" block), ed25519 first."""
    blocks = _KEYS_BLOCK.findall(text or "")
    if not blocks:
        return ()
    keys = {f"{m.group(1)} {m.group(2)}" for m in _KEY.finditer(blocks[-1])}
    return tuple(sorted(keys, key=lambda k: (_KEY_ORDER.get(k.split()[0], 9), k)))


def _decode_console(output: str) -> str:
    """GetConsoleOutput's Output is base64 on the wire; boto3 hands it over as text, maybe still encoded."""
    if not output:
        return ""
    if "\n" in output or " " in output:
        return output
    try:
        return base64.b64decode(output, validate=True).decode(errors="replace")
    except ValueError:
        return output


def host_keys(api: Api, cluster: Cluster, nitro: bool, console_wait: float) -> dict[str, tuple[str, ...]]:
    """Host keys cloud-init printed to each node's console: an authenticated source (EC2's API, signed and
    over TLS). Read with Latest=True where the type takes it (Nitro: the console as it is now; other types
    get what EC2 posted, some minutes after boot), polled for at most console_wait (CONSOLE_WAIT, 10
    minutes) or until cloud-init says it finished without printing keys. A node missing here fails `up`
    unless the operator accepts first contact (node_setup.pin_host_keys)."""
    from botocore.exceptions import ClientError

    found: dict[str, tuple[str, ...]] = {}
    pending = {n.instance_id: n for n in cluster.nodes if n.instance_id}
    latest = nitro
    deadline = time.monotonic() + console_wait
    while pending:
        for iid, node in list(pending.items()):
            try:
                out = (
                    api.call("ec2", "get_console_output", InstanceId=iid, **({"Latest": True} if latest else {})).get(
                        "Output"
                    )
                    or ""
                )
            except ClientError as exc:
                if latest and _code(exc) in ("UnsupportedOperation", "InvalidParameterCombination"):
                    latest = False  # the type said Nitro, EC2 disagrees: the posted console, then
                    continue
                raise api.error("GetConsoleOutput", exc) from None
            text = _decode_console(out)
            keys = host_keys_from_console(text)
            if keys:
                found[node.ssh_host] = keys
                del pending[iid]
            elif _CLOUD_INIT_DONE.search(text):
                del pending[iid]  # cloud-init is done and printed no keys: they will not come
        if not pending or time.monotonic() > deadline:
            break
        time.sleep(api.poll_interval)
    if found:
        api.report(
            f"host keys of {len(found)} node(s) read from their console output (cloud-init"
            + (", GetConsoleOutput Latest=True)" if latest else ")")
        )
    missing = [n.ssh_host for n in cluster.nodes if n.ssh_host not in found]
    if missing:
        api.report(
            f"no host keys in the console output of {len(missing)} node(s) after "
            f"{console_wait:.0f}s at most: {', '.join(missing)}"
        )
    return found
