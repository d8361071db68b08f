"""`ssh mycluster`: an OpenSSH config per cluster, so ssh, scp, rsync -e ssh, VS Code Remote and ansible
reach its nodes with host keys checked.

`up` writes FOLDER/NAME.conf (FOLDER: $CLUSTERCTL_SSH_DIR, else ~/.ssh/clusterctl of the passwd entry's
home, which is where OpenSSH looks, whatever $HOME says) with one `Host` block per node (`NAME` and
`NAME-leader` for the leader, `NAME-member-N`): the cluster key only, its pinned known_hosts,
StrictHostKeyChecking yes, and ProxyJump through the leader for members without a public address.
`down` removes it. `Include FOLDER/*.conf` at the top of ~/.ssh/config (the passwd entry's, as OpenSSH reads) makes
`ssh NAME` work: `up --ssh-config-entry` adds that one line (once; asked on a terminal); without it,
`ssh -F FOLDER/NAME.conf NAME` (what `clusterctl ssh` runs).
"""

from __future__ import annotations

import os
import pwd
from pathlib import Path
from typing import TYPE_CHECKING

from clusterctl.types import Cluster

if TYPE_CHECKING:
    from clusterctl.state import StateStore


def folder() -> Path:
    env = os.environ.get("CLUSTERCTL_SSH_DIR")
    if env:
        return Path(env).expanduser()
    try:
        home = pwd.getpwuid(os.getuid()).pw_dir
    except KeyError:
        home = str(Path.home())
    return Path(home) / ".ssh" / "clusterctl"


def config_path(name: str) -> Path:
    return folder() / f"{name}.conf"


def _q(value: str) -> str:
    return '"' + value.replace('"', "") + '"'


def render(cluster: Cluster, store: StateStore) -> str:
    from clusterctl.cluster import reach

    p = reach.paths(store, cluster.name)
    targets = reach.ssh_targets(cluster, store)
    lines = [f"# written by clusterctl for cluster {cluster.name}; `clusterctl down` removes it", ""]
    for i, (node, t) in enumerate(zip(cluster.nodes, targets)):
        names = f"{cluster.name} {node.name}" if i == 0 else node.name
        lines += [
            f"Host {names}",
            f"    HostName {t.hostname}",
            f"    Port {t.port}",
            f"    User {t.user}",
            *(f"    IdentityFile {_q(k)}" for k in t.identity_files),
            "    IdentitiesOnly yes",
            f"    UserKnownHostsFile {_q(str(p.known_hosts))}",
            "    GlobalKnownHostsFile /dev/null",
            # the key is pinned under the address dialled ([addr]:port off 22): the alias names that entry
            f"    HostKeyAlias {t.hostname if t.port == 22 else f'[{t.hostname}]:{t.port}'}",
            "    StrictHostKeyChecking yes",
            "    ForwardAgent no",
        ]
        if t.proxy_jump is not None:
            lines.append(f"    ProxyJump {cluster.nodes[0].name}")
        lines.append("")
    return "\n".join(lines)


def write(cluster: Cluster, store: StateStore) -> Path:
    from clusterctl.state import atomic_write

    path = config_path(cluster.name)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    atomic_write(path, render(cluster, store), mode=0o600)
    return path


def remove(name: str) -> bool:
    try:
        config_path(name).unlink()
        return True
    except FileNotFoundError:
        return False


def node_alias(cluster: Cluster, node: str | None) -> str:
    """The Host name of a node given as its name, its suffix (leader, member-2), an index or an address."""
    from clusterctl.errors import UsageError

    if node is None:
        return cluster.nodes[0].name
    for i, n in enumerate(cluster.nodes):
        if node in (n.name, n.name[len(cluster.name) + 1 :], str(i), n.private_ip, n.public_ip):
            return n.name
    raise UsageError(
        f"cluster {cluster.name} has no node {node!r}",
        "name one as leader, member-N, its index or its address (see `clusterctl status`)",
    )


def _passwd_home() -> Path:
    try:
        return Path(pwd.getpwuid(os.getuid()).pw_dir)
    except KeyError:
        return Path.home()


def user_config() -> Path:
    """The ssh config OpenSSH reads for this user: ~/.ssh/config of the passwd entry's home, wherever FOLDER
    is (OpenSSH reads no `config` beside a CLUSTERCTL_SSH_DIR elsewhere)."""
    return _passwd_home() / ".ssh" / "config"


def include_line() -> str:
    default = folder() == _passwd_home() / ".ssh" / "clusterctl"
    return f"Include {'~/.ssh/clusterctl' if default else folder()}/*.conf"


def has_include() -> bool:
    try:
        text = user_config().read_text()
    except OSError:
        return False
    want = include_line().split(None, 1)[1]
    return any(line.strip().lower().startswith("include") and want in line for line in text.splitlines())


def add_include() -> bool:
    """Put the Include line at the top of the user's ssh config (first, so it applies to every host and
    no `Host` block above it captures it). False when it was there already."""
    from clusterctl.state import atomic_write

    if has_include():
        return False
    path = user_config()
    try:
        text, mode = path.read_text(), path.stat().st_mode & 0o777
    except FileNotFoundError:
        text, mode = "", 0o600
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    atomic_write(
        path, f"# clusters made by clusterctl: ssh NAME, ssh NAME-member-1\n{include_line()}\n\n" + text, mode=mode
    )
    return True
