"""Namespace nodes: the machinery under the local provider.

Each node is a network namespace with its own address on a bridge this module creates, and its own
PID, UTS and mount namespaces, in which OpenSSH sshd runs as PID 1. Inside a node:
  * /root is the node's own home (a bind mount of a per-node folder), /tmp and /dev/shm are private
    tmpfs, so a file copied to one node is not on another and tmux sockets do not collide;
  * /etc/hosts and /etc/hostname come from /etc/netns/<ns>/ (ip netns exec bind-mounts them), so the
    node's own hostname resolves, as gloo requires;
  * /opt is the node's own and /usr/local an empty skeleton; the operator's clusterctl files (state with
    its private keys, venv, checkout, runtime cache) are covered: the rest of the file system is the
    host's base OS, as an AMI would give, never the operator's Python environment.
There is no default route: nodes reach only each other and the bridge's own address (the operator).

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
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from clusterctl.errors import NeedsRootError, ProvisionError, WaitTimeout
from clusterctl.proc import alive

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


@dataclass(frozen=True)
class NodeSpec:
    index: int  # 0 = leader
    hostname: str
    address: str


@dataclass(frozen=True)
class NetNode:
    index: int
    hostname: str
    address: str
    netns: str
    pid: int  # the unshare process whose child is the node's PID 1 (sshd)
    host_public_key: str  # "ssh-ed25519 AAAA..." as pinned at creation


def _run(argv: list[str], check: bool = True, input: str | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, input=input)
    if check and proc.returncode != 0:
        raise ProvisionError(f"{shlex.join(argv)} failed: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def _ip_json(*args: str) -> list[dict[str, Any]]:
    out = _run(["ip", "-j", *args]).stdout.strip()
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


# ---- creation ---------------------------------------------------------------------------------------
def create_bridge(cluster: str, subnet: ipaddress.IPv4Network, gateway: str) -> str:
    br = bridge_name(cluster)
    _run(["ip", "link", "add", br, "type", "bridge"])
    _run(["ip", "addr", "add", f"{gateway}/{subnet.prefixlen}", "dev", br])
    _run(["ip", "link", "set", br, "up"])
    return br


def sshd_config(address: str, port: int) -> str:
    return f"""\
# clusterctl local node: key-only root login, host keys pinned by the client, nothing forwarded but TCP.
ListenAddress {address}:{port}
HostKey /etc/ssh/ssh_host_ed25519_key
PidFile none
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes yes
AuthorizedKeysFile .ssh/authorized_keys
AllowAgentForwarding no
AllowTcpForwarding yes
X11Forwarding no
PrintMotd no
UseDNS no
MaxStartups 512:30:1024
MaxSessions 256
ClientAliveInterval 30
Subsystem sftp internal-sftp
"""


def create_node(
    cluster: str,
    bridge: str,
    subnet: ipaddress.IPv4Network,
    node: NodeSpec,
    all_nodes: Iterable[NodeSpec],
    node_dir: Path,
    authorized_keys: str,
    port: int = 22,
    tmp_size: str = "2g",
) -> NetNode:
    """Make one node and start its sshd. The caller waits for the port."""
    from clusterctl.remote.sshkeys import generate_ed25519

    ns = netns_name(cluster, node.index)
    veth = veth_name(cluster, node.index)
    _run(["ip", "netns", "add", ns])
    _run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns])
    _run(["ip", "link", "set", veth, "master", bridge, "up"])
    _run(["ip", "-n", ns, "addr", "add", f"{node.address}/{subnet.prefixlen}", "dev", "eth0"])
    _run(["ip", "-n", ns, "link", "set", "eth0", "up"])
    _run(["ip", "-n", ns, "link", "set", "lo", "up"])

    etc = Path("/etc/netns") / ns
    etc.mkdir(parents=True, exist_ok=True)
    hosts = "127.0.0.1 localhost\n::1 localhost ip6-localhost\n"
    hosts += "".join(f"{n.address} {n.hostname}\n" for n in all_nodes)
    (etc / "hosts").write_text(hosts)
    (etc / "hostname").write_text(node.hostname + "\n")

    home = node_dir / "home"
    (home / ".ssh").mkdir(parents=True, exist_ok=True)
    os.chmod(node_dir, 0o700)
    os.chmod(home, 0o700)
    os.chmod(home / ".ssh", 0o700)
    (home / ".ssh" / "authorized_keys").write_text(authorized_keys)
    os.chmod(home / ".ssh" / "authorized_keys", 0o600)
    # The node's /etc/ssh: its own sshd_config and host key, as on a real machine.
    etc_ssh = node_dir / "etc-ssh"
    etc_ssh.mkdir(mode=0o755, exist_ok=True)
    key_path, pub_path = etc_ssh / "ssh_host_ed25519_key", etc_ssh / "ssh_host_ed25519_key.pub"
    if key_path.is_file() and pub_path.is_file():  # a stopped node started again: its disk kept its host key
        public = pub_path.read_text().strip()
    else:
        private, public = generate_ed25519(f"{node.hostname}")
        key_path.write_text(private)
        os.chmod(key_path, 0o600)
        pub_path.write_text(public + "\n")
    (etc_ssh / "sshd_config").write_text(sshd_config(node.address, port))
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation dir
    pid = start_node(ns, node.hostname, node_dir, tmp_size)
    return NetNode(node.index, node.hostname, node.address, ns, pid, public.rsplit(" ", 1)[0])


# What an AMI's /usr/local holds: empty folders (Debian's skeleton).
USR_LOCAL_SKELETON = ("bin", "etc", "games", "include", "lib", "man", "sbin", "share", "src")


def operator_paths() -> list[str]:
    """This machine's clusterctl files that a node must not see (it shares the base OS, never the
    operator's environment): its state (private keys), the runtime cache and wheelhouse, the venv running
    clusterctl, and a source checkout. Paths under what a node already has of its own are left out."""
    from clusterctl import paths, resources, state

    found = [
        str(state.home()),
        str(paths.runtime_cache()),
        str(paths.wheelhouse()),
        str(resources.source_checkout() or ""),
    ]
    if sys.prefix != sys.base_prefix:  # a venv (install.sh's /opt/clusterctl/venv, or a user's)
        found.append(sys.prefix)
    own = ("/root", "/tmp", "/opt", "/usr/local", "/dev/shm", "/proc", "/sys", "/etc/ssh")
    out: list[str] = []
    for p in found:
        real = os.path.realpath(p) if p else ""
        if not real or real == "/" or not os.path.isdir(real) or real in out:
            continue
        if any(real == o or real.startswith(o + "/") for o in own):
            continue
        out.append(real)
    return sorted(out)


def _opt_source(ns: str) -> str:
    return f"clusterctl-opt-{ns}"


def mount_opt(ns: str, path: Path) -> None:
    """The node's /opt (where its runtime is unpacked): a tmpfs mounted here on the host, so it outlives a
    node restart like a disk would, while unpacking and teardown cost memory speed rather than this
    machine's slow disk (1.3 GB in 22k files per node). Found again by its source name in destroy()."""
    path.mkdir(mode=0o755, exist_ok=True)
    if not os.path.ismount(path):
        _run(["mount", "-t", "tmpfs", "-o", "size=16g,mode=0755", _opt_source(ns), str(path)])


def opt_mounts(cluster: str) -> list[str]:
    """Mount points of the cluster's node /opt tmpfs (by their source name: exactly this cluster's)."""
    pattern = re.compile(re.escape(_opt_source(f"{NETNS_PREFIX}{cluster}-")) + r"\d+$")
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields, _, rest = line.partition(" - ")
        parts = rest.split()
        if len(parts) >= 2 and pattern.match(parts[1]):
            found.append(fields.split()[4].encode().decode("unicode_escape"))
    return sorted(set(found))


def _binds(node_dir: Path) -> list[tuple[Path, str]]:
    """The node's own /etc/ssh, /opt and /root, ordered so that none covers node_dir before its turn."""
    binds = [(node_dir / "etc-ssh", "/etc/ssh"), (node_dir / "opt", "/opt"), (node_dir / "home", "/root")]
    real = os.path.realpath(node_dir)
    return sorted(binds, key=lambda b: real == b[1] or real.startswith(b[1] + "/"))


def start_node(ns: str, hostname: str, node_dir: Path, tmp_size: str = "2g") -> int:
    """Start the node's PID 1 (sshd) in namespace `ns` with its own hostname, mounts and a fresh /tmp;
    returns the host PID of the unshare process. Used at creation and by `restart_node`.

    Inside, the node has the base OS and nothing of the operator's: /opt is the node's own (empty at
    first, as on an AMI; the node runtime goes there), /usr/local is an empty skeleton, and the
    operator's clusterctl files (`operator_paths`) are covered by empty read-only tmpfs."""
    opt = node_dir / "opt"
    mount_opt(ns, opt)
    skeleton = " ".join(shlex.quote(f"/usr/local/{d}") for d in USR_LOCAL_SKELETON)
    inner = " && ".join(
        [
            f"hostname {shlex.quote(hostname)}",
            # Order matters: the sources live in node_dir, which may be under /root (the default
            # CLUSTERCTL_HOME), /opt, /tmp or the operator's paths: bind them all before any of those is covered,
            # and the target that holds node_dir last.
            *[f"mount --bind {shlex.quote(str(src))} {target}" for src, target in _binds(node_dir)],
            *[f"mount -t tmpfs -o ro,size=4k,mode=0755 clusterctl-hidden {shlex.quote(p)}" for p in operator_paths()],
            "mount -t tmpfs -o mode=0755 tmpfs /usr/local",
            f"mkdir -p {skeleton}",
            f"mount -t tmpfs -o size={tmp_size},mode=1777 tmpfs /tmp",
            "mount -t tmpfs -o mode=1777 tmpfs /dev/shm",
            f"exec {SSHD} -D -e -f /etc/ssh/sshd_config",
        ]
    )
    log = open(node_dir / "sshd.log", "ab")
    proc = subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            ns,
            "unshare",
            "--pid",
            "--fork",
            "--kill-child",
            "--mount-proc",
            "--uts",
            "--",
            "/bin/sh",
            "-c",
            inner,
        ],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
        start_new_session=True,
        close_fds=True,
    )
    log.close()
    return proc.pid


def restart_node(ns: str, hostname: str, address: str, node_dir: Path, port: int = 22, timeout: float = 30.0) -> int:
    """A local node's reboot: every process in it is killed (as a reboot would), then its sshd starts
    again with the same host key, address and home, and a fresh /tmp. Waits for the ssh port."""
    if not (Path("/run/netns") / ns).exists():
        raise ProvisionError(f"node namespace {ns} does not exist", "bring the cluster up again")
    deadline = time.monotonic() + timeout
    survivors = kill_netns(ns, timeout)
    if survivors:
        raise WaitTimeout(f"processes of node {hostname} survived SIGKILL for {timeout:.0f}s: {survivors}")
    pid = start_node(ns, hostname, node_dir)
    wait_port(address, port, max(1.0, deadline - time.monotonic()), pid, node_dir / "sshd.log")
    return pid


def wait_port(address: str, port: int, timeout: float, pid: int | None = None, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((address, port), timeout=1.0):
                return
        except OSError:
            pass
        if pid is not None and not alive(pid):
            detail = log.read_text()[-300:].strip() if log and log.exists() else ""
            raise ProvisionError(f"sshd of node {address} exited at start: {detail}")
        if time.monotonic() > deadline:
            raise WaitTimeout(f"node {address} did not answer on port {port} within {timeout:.0f}s")
        time.sleep(0.05)


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
    proc = _run(["ip", "netns", "pids", ns], check=False)
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
        _run(["ip", "netns", "del", ns], check=False)
    for link in cluster_links(cluster):
        _run(["ip", "link", "del", link], check=False)
    for mount in opt_mounts(cluster):  # the nodes are gone: their /opt goes with them
        _run(["umount", "-l", mount], check=False)
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
        _run(["ip", "netns", "del", ns], check=False)
        removed.append(f"namespace {ns}")
    veth = veth_name(cluster, index)
    if any(link.get("ifname") == veth for link in _ip_json("link")):
        _run(["ip", "link", "del", veth], check=False)
        removed.append(f"link {veth}")
    source = _opt_source(ns)
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields, _, rest = line.partition(" - ")
        parts = rest.split()
        if len(parts) >= 2 and parts[1] == source:
            _run(["umount", "-l", fields.split()[4].encode().decode("unicode_escape")], check=False)
            removed.append(f"node /opt of {ns}")
    etc = Path("/etc/netns") / ns
    if etc.exists():
        shutil.rmtree(etc, ignore_errors=True)
    return removed


def forget_address(cluster: str, bridge: str, address: str) -> None:
    """A node made again at an address: the neighbour entries for it (the old node's MAC) dropped on this machine's
    bridge and in every node of the cluster, so nobody waits for a stale entry to time out."""
    _run(["ip", "neigh", "flush", "to", address, "dev", bridge], check=False)
    for ns in cluster_netns(cluster):
        _run(["ip", "-n", ns, "neigh", "flush", "to", address], check=False)
