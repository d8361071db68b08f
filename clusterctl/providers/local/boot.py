"""A namespace node made and started (the names, addresses, ownership and teardown of what this makes: netns.py).

Its veth on the cluster's bridge, its own sshd config and host key (kept across a stop, as a disk keeps it), and
sshd as PID 1 of its own PID, UTS and mount namespaces. Inside a node:
  * /root is the node's own home (a bind mount of a per-node folder), /tmp and /dev/shm are private
    tmpfs, so a file copied to one node is not on another and tmux sockets do not collide;
  * /etc/hosts and /etc/hostname come from /etc/netns/<ns>/ (ip netns exec bind-mounts them), so the
    node's own hostname resolves, as gloo requires;
  * /opt is the node's own and /usr/local an empty skeleton; the operator's clusterctl files (state with
    its private keys, venv, checkout, runtime cache) are covered: the rest of the file system is the
    host's base OS, as an AMI would give, never the operator's Python environment.
"""

from __future__ import annotations

import ipaddress
import os
import shlex
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from clusterctl.errors import ProvisionError, WaitTimeout
from clusterctl.proc import alive
from clusterctl.providers.local.netns import SSHD, bridge_name, kill_netns, netns_name, opt_source, run, veth_name


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


def create_bridge(cluster: str, subnet: ipaddress.IPv4Network, gateway: str) -> str:
    br = bridge_name(cluster)
    run(["ip", "link", "add", br, "type", "bridge"])
    run(["ip", "addr", "add", f"{gateway}/{subnet.prefixlen}", "dev", br])
    run(["ip", "link", "set", br, "up"])
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
    run(["ip", "netns", "add", ns])
    run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns])
    run(["ip", "link", "set", veth, "master", bridge, "up"])
    run(["ip", "-n", ns, "addr", "add", f"{node.address}/{subnet.prefixlen}", "dev", "eth0"])
    run(["ip", "-n", ns, "link", "set", "eth0", "up"])
    run(["ip", "-n", ns, "link", "set", "lo", "up"])

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


def mount_opt(ns: str, path: Path) -> None:
    """The node's /opt (where its runtime is unpacked): a tmpfs mounted here on the host, so it outlives a
    node restart like a disk would, while unpacking and teardown cost memory speed rather than this
    machine's slow disk (1.3 GB in 22k files per node). Found again by its source name in destroy()."""
    path.mkdir(mode=0o755, exist_ok=True)
    if not os.path.ismount(path):
        run(["mount", "-t", "tmpfs", "-o", "size=16g,mode=0755", opt_source(ns), str(path)])


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
