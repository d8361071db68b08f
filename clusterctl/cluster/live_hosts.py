"""The cluster's live hosts, kept in one file on the leader for a running elastic job to read.

`~/.clusterctl/live-hosts` on the leader holds one `host:slots` line per node that may run the job (Horovod's
host discovery format; hosts as the leader's ssh reaches them). node/live_hosts.py, the job's host
discovery script, prints the lines of those that answer ssh now. `train --elastic` writes the file at start
from the job's hosts; `repair` writes it again when it replaces or drops a node, so a running job takes the
new node at its next commit.
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING

from clusterctl.errors import UnreachableError
from clusterctl.hostsfile import HostsFile
from clusterctl.node import live_hosts as node_live_hosts

if TYPE_CHECKING:
    from clusterctl.remote.ssh import SshPool
    from clusterctl.remote.targets import SshTarget

PATH = node_live_hosts.PATH  # under the leader's login home: what the discovery reads


def render(hosts: HostsFile) -> str:
    """`host:slots` lines (HostsFile has checked every host: no shell or ssh option text)."""
    hosts.check_launchable("an elastic job")
    return "".join(f"{e.host}:{e.slots}\n" for e in hosts.entries)


def write_command(hosts: HostsFile) -> str:
    """Shell text writing the file on the leader at once (a reader sees the old lines or the new, never half)."""
    tmp = f"{PATH}.tmp.$$"
    return (
        f'cd "$HOME" && mkdir -p -m 700 .clusterctl && umask 077 && printf %s {shlex.quote(render(hosts))} > {tmp} '
        f"&& mv -f {tmp} {PATH}"
    )


def write(pool: SshPool, leader: SshTarget, hosts: HostsFile) -> None:
    """Write the live hosts on the leader, replacing what was there."""
    r = pool.run_one(leader, write_command(hosts), timeout=30)
    if r.exit_code != 0:
        raise UnreachableError(
            f"could not write ~/{PATH} on the leader {leader.label}: {r.error or r.stderr.strip() or r.exit_code}"
        )
