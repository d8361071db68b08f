"""Namespace nodes: the machinery under the local provider, beside what makes and starts a node (boot.py).

Each node is a network namespace with its own address on a bridge of its cluster, and its own PID, UTS and mount
namespaces, in which OpenSSH sshd runs as PID 1. Here: the names of a cluster's namespaces, links and bridge, the
subnet a cluster takes, whose each cluster is, and what of a cluster is left and its teardown. There is no default
route: nodes reach only each other and the bridge's own address (the operator).

Everything is named after the cluster, so teardown finds it again with no state at all.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clusterctl.errors import ConfigError, NeedsRootError, ProvisionError
from clusterctl.types import Node, node_index as index_of

NETNS_PREFIX = "clusterctl-"
DEFAULT_POOL = ipaddress.IPv4Network("10.213.0.0/16")
NET_LOCK = Path("/run/clusterctl-net.lock")
# Whose each local cluster is: one file per cluster naming the CLUSTERCTL_HOME (and user@host) that made it,
# written before its first namespace and removed with its last. Kept with the namespaces (in /run: a reboot
# clears both), not in /etc/netns/NS, whose files `ip netns exec` binds over the node's /etc.
OWNERS = Path("/run/clusterctl-owners")
SSHD = "/usr/sbin/sshd"


def require_root() -> None:
    if os.geteuid() != 0:
        raise NeedsRootError(
            "the local provider needs root (it creates network namespaces and runs sshd)",
            "run clusterctl as root, e.g. with sudo",
        )
    for tool in ("ip", "unshare", SSHD):
        if not shutil.which(tool):
            raise NeedsRootError(f"{tool} is not installed", "install openssh-server and iproute2 (see README)")


def _h(cluster: str) -> str:
    return hashlib.sha1(cluster.encode()).hexdigest()


def bridge_name(cluster: str) -> str:
    return "ccb" + _h(cluster)[:8]  # interface names are at most 15 characters


def veth_name(cluster: str, index: int) -> str:
    return f"ccv{_h(cluster)[:7]}{index}"


def netns_name(cluster: str, index: int) -> str:
    return f"{NETNS_PREFIX}{cluster}-{index}"


def node_index(cluster: str, node: Node) -> int:
    """The namespace index of a node, from its name (types.node_index): positions in the record shift when
    `repair --drop` removes a node, names never do."""
    index = index_of(cluster, node.name)
    if index is None:
        raise ConfigError(f"node {node.name!r} is not named like a node of local cluster {cluster}")
    return index


def run(argv: list[str], check: bool = True, input: str | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, input=input)
    if check and proc.returncode != 0:
        raise ProvisionError(f"{shlex.join(argv)} failed: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def _ip_json(*args: str) -> list[dict[str, Any]]:
    out = run(["ip", "-j", *args]).stdout.strip()
    return json.loads(out) if out else []


# ---- address planning -----------------------------------------------------------------------------
def networks_in_use() -> list[ipaddress.IPv4Network]:
    used = []
    for link in _ip_json("addr"):
        for a in link.get("addr_info", []):
            if a.get("family") == "inet":
                used.append(ipaddress.IPv4Network(f"{a['local']}/{a['prefixlen']}", strict=False))
    for route in _ip_json("route", "show", "table", "all"):
        dst = route.get("dst", "")
        if dst and dst != "default" and ":" not in dst:
            try:
                used.append(ipaddress.IPv4Network(dst if "/" in dst else f"{dst}/32", strict=False))
            except ValueError:
                pass
    return used


def pick_subnet(pool: ipaddress.IPv4Network = DEFAULT_POOL) -> ipaddress.IPv4Network:
    used = networks_in_use()
    for candidate in pool.subnets(new_prefix=24):
        if not any(candidate.overlaps(u) for u in used):
            return candidate
    raise ProvisionError(f"no free /24 left in {pool} for a local cluster", "bring another local cluster down first")


def check_subnet_free(subnet: ipaddress.IPv4Network) -> None:
    clash = [str(u) for u in networks_in_use() if subnet.overlaps(u)]
    if clash:
        raise ProvisionError(
            f"subnet {subnet} is already in use on this machine ({', '.join(clash)})", "choose another"
        )


# ---- a node's /opt, found again by its mount's source ------------------------------------------------
def opt_source(ns: str) -> str:
    return f"clusterctl-opt-{ns}"


def opt_mounts(cluster: str) -> list[str]:
    """Mount points of the cluster's node /opt tmpfs (by their source name: exactly this cluster's)."""
    pattern = re.compile(re.escape(opt_source(f"{NETNS_PREFIX}{cluster}-")) + r"\d+$")
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields, _, rest = line.partition(" - ")
        parts = rest.split()
        if len(parts) >= 2 and pattern.match(parts[1]):
            found.append(fields.split()[4].encode().decode("unicode_escape"))
    return sorted(set(found))


# ---- ownership ---------------------------------------------------------------------------------------
def _owner_file(cluster: str) -> Path:
    return OWNERS / f"{NETNS_PREFIX}{cluster}"


def write_owner(cluster: str, owner: str) -> None:
    """Mark the cluster as `owner`'s (before anything of it is made: a half-made cluster has an owner too)."""
    OWNERS.mkdir(mode=0o755, exist_ok=True)
    tmp = _owner_file(cluster).with_suffix(".tmp")
    tmp.write_text(owner + "\n")
    os.replace(tmp, _owner_file(cluster))


def read_owner(cluster: str) -> str:
    """Who made the cluster ("" when no mark says: a cluster made before marks, or an unreadable one)."""
    try:
        return _owner_file(cluster).read_text().strip()
    except OSError:
        return ""


# ---- discovery and teardown -------------------------------------------------------------------------
def cluster_netns(cluster: str) -> list[str]:
    try:
        names = os.listdir("/run/netns")
    except FileNotFoundError:
        return []
    prefix = f"{NETNS_PREFIX}{cluster}-"
    return sorted(n for n in names if n.startswith(prefix) and n[len(prefix) :].isdigit())


def all_clusters() -> list[str]:
    """Names of every local cluster that has a namespace on this machine."""
    try:
        names = os.listdir("/run/netns")
    except FileNotFoundError:
        return []
    found = {n[len(NETNS_PREFIX) :].rsplit("-", 1)[0] for n in names if n.startswith(NETNS_PREFIX)}
    return sorted(found)


def netns_pids(ns: str) -> list[int]:
    proc = run(["ip", "netns", "pids", ns], check=False)
    return [int(p) for p in proc.stdout.split() if p.isdigit()]


def cluster_links(cluster: str) -> list[str]:
    h = _h(cluster)
    return sorted(
        link["ifname"] for link in _ip_json("link") if link.get("ifname", "").startswith(("ccb" + h[:8], "ccv" + h[:7]))
    )


@dataclass(frozen=True)
class Leftovers:
    netns: tuple[str, ...]
    links: tuple[str, ...]
    pids: tuple[int, ...]
    etc_dirs: tuple[str, ...]
    mounts: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.netns or self.links or self.pids or self.etc_dirs or self.mounts)

    def describe(self) -> str:
        parts = []
        for label, items in (
            ("namespaces", self.netns),
            ("links", self.links),
            ("processes", self.pids),
            ("config dirs", self.etc_dirs),
            ("mounts", self.mounts),
        ):
            if items:
                parts.append(f"{label}: {', '.join(map(str, items))}")
        return "; ".join(parts) or "nothing"


def leftovers(cluster: str) -> Leftovers:
    namespaces = cluster_netns(cluster)
    pids = tuple(p for ns in namespaces for p in netns_pids(ns))
    etc_dirs = tuple(str(p) for p in _etc_dirs(cluster))
    return Leftovers(tuple(namespaces), tuple(cluster_links(cluster)), pids, etc_dirs, tuple(opt_mounts(cluster)))


def kill_netns(ns: str, timeout: float) -> list[int]:
    """SIGKILL every process in the namespace until none is left; the survivors after `timeout`."""
    deadline = time.monotonic() + timeout
    while pids := netns_pids(ns):
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if time.monotonic() > deadline:
            return pids
        time.sleep(0.02)
    return []


def destroy(cluster: str, timeout: float = 10.0) -> Leftovers:
    """Kill every process in the cluster's namespaces, delete them, the links and config; return what is left."""
    for ns in cluster_netns(cluster):
        kill_netns(ns, timeout)
        run(["ip", "netns", "del", ns], check=False)
    for link in cluster_links(cluster):
        run(["ip", "link", "del", link], check=False)
    for mount in opt_mounts(cluster):  # the nodes are gone: their /opt goes with them
        run(["umount", "-l", mount], check=False)
    for d in _etc_dirs(cluster):
        shutil.rmtree(d, ignore_errors=True)
    left = leftovers(cluster)
    if left.empty:  # the owner's mark goes last, with nothing left to own
        _owner_file(cluster).unlink(missing_ok=True)
    return left


def _etc_dirs(cluster: str) -> list[Path]:
    """This cluster's /etc/netns folders only: `clusterctl-a-*` would also match cluster a-1's."""
    prefix = f"{NETNS_PREFIX}{cluster}-"
    try:
        names = os.listdir("/etc/netns")
    except FileNotFoundError:
        return []
    return sorted(Path("/etc/netns") / n for n in names if n.startswith(prefix) and n[len(prefix) :].isdigit())


def node_alive(cluster: str, index: int) -> str | None:
    """None when node `index` has its namespace and a process in it (its sshd), else why not."""
    ns = netns_name(cluster, index)
    if not (Path("/run/netns") / ns).exists():
        return "namespace gone"
    if not netns_pids(ns):
        return "no process left in its namespace (sshd gone)"
    return None


def destroy_node(cluster: str, index: int, timeout: float = 10.0) -> list[str]:
    """One node of a cluster gone (its processes, namespace, link, /opt tmpfs, /etc/netns folder); what was removed."""
    ns = netns_name(cluster, index)
    removed: list[str] = []
    if (Path("/run/netns") / ns).exists():
        kill_netns(ns, timeout)
        run(["ip", "netns", "del", ns], check=False)
        removed.append(f"namespace {ns}")
    veth = veth_name(cluster, index)
    if any(link.get("ifname") == veth for link in _ip_json("link")):
        run(["ip", "link", "del", veth], check=False)
        removed.append(f"link {veth}")
    source = opt_source(ns)
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields, _, rest = line.partition(" - ")
        parts = rest.split()
        if len(parts) >= 2 and parts[1] == source:
            run(["umount", "-l", fields.split()[4].encode().decode("unicode_escape")], check=False)
            removed.append(f"node /opt of {ns}")
    etc = Path("/etc/netns") / ns
    if etc.exists():
        shutil.rmtree(etc, ignore_errors=True)
    return removed


def forget_address(cluster: str, bridge: str, address: str) -> None:
    """A node made again at an address: the neighbour entries for it (the old node's MAC) dropped on this machine's
    bridge and in every node of the cluster, so nobody waits for a stale entry to time out."""
    run(["ip", "neigh", "flush", "to", address, "dev", bridge], check=False)
    for ns in cluster_netns(cluster):
        run(["ip", "-n", ns, "neigh", "flush", "to", address], check=False)
