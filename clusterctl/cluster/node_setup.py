"""New nodes made members, the same for `up`, `start` and the nodes `repair` and a resize add: every ssh port
answered, host keys pinned (from an authenticated source, or at first contact where the operator allows it), the
cluster's internal key, the node-side known_hosts and hosts file handed out, and the leader's ssh to every member
proved with host keys checked.
"""

from __future__ import annotations

import shlex
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from clusterctl.cluster.reach import ClusterPaths, behind_leader
from clusterctl.errors import HostKeyError, ProvisionError, UnreachableError, WaitTimeout
from clusterctl.remote import sshkeys
from clusterctl.remote.ssh import SshPool
from clusterctl.remote.targets import SshTarget
from clusterctl.state import atomic_write
from clusterctl.types import Cluster, Node

if TYPE_CHECKING:
    from clusterctl.hostsfile import HostsFile


def wait_for_ssh(cluster: Cluster, timeout: float) -> None:
    """Every node's ssh port answers (concurrently), or WaitTimeout naming the ones that did not."""
    deadline = time.monotonic() + timeout
    stop = threading.Event()  # set on the way out (Ctrl-C included), so no worker outlives this call

    def one(node: Node) -> str | None:
        while time.monotonic() < deadline and not stop.is_set():
            try:
                with socket.create_connection((node.ssh_host, node.ssh_port), timeout=2.0) as s:
                    s.settimeout(5.0)
                    if s.recv(4).startswith(b"SSH-"):
                        return None
            except OSError:
                stop.wait(0.5)
        return node.ssh_host

    # Members behind the leader are not dialled from here: their pinned console keys say sshd is up, and the
    # first connection through the leader proves it (pin_host_keys).
    direct = [n for n in cluster.nodes if not behind_leader(cluster, n)]
    with ThreadPoolExecutor(max_workers=min(64, len(direct))) as pool:
        try:
            missing = [h for h in pool.map(one, direct) if h]
        finally:
            stop.set()
    if missing:
        raise WaitTimeout(
            f"no ssh answer within {timeout:.0f}s from {', '.join(missing)}",
            "check the nodes' security group and that they booted",
        )


def pin_host_keys(cluster: Cluster, known: dict[str, tuple[str, ...]], path: Path) -> dict[str, tuple[str, ...]]:
    """Write the cluster's known_hosts. Keys known at creation are used as they are; a node without one
    is pinned at first contact (its key recorded once, and never silently replaced afterwards)."""
    pinned = dict(known)
    for node in cluster.nodes:
        if node.ssh_host not in pinned and behind_leader(cluster, node):
            raise HostKeyError(
                f"no host key for {node.name} ({node.ssh_host}) in its console output; a member reached "
                "through the leader is pinned from its console only",
                "check that the image runs cloud-init (it prints the keys), or pass --private-ips from inside the VPC",
            )
        if node.ssh_host not in pinned:
            pinned[node.ssh_host] = (first_contact_key(node.ssh_host, node.ssh_port),)
    text = "".join(
        sshkeys.render_known_hosts({n.ssh_host: list(pinned[n.ssh_host])}, port=n.ssh_port) for n in cluster.nodes
    )
    atomic_write(path, text, mode=0o600)
    return {n.ssh_host: pinned[n.ssh_host] for n in cluster.nodes}


def first_contact_key(host: str, port: int) -> str:
    import paramiko

    sock = socket.create_connection((host, port), timeout=10)
    t = paramiko.Transport(sock)
    try:
        t.get_security_options().key_types = ["ssh-ed25519"] + [
            k for k in t.get_security_options().key_types if k != "ssh-ed25519"
        ]
        t.start_client(timeout=10)
        key = t.get_remote_server_key()
        return f"{key.get_name()} {key.get_base64()}"
    finally:
        t.close()


def setup_nodes(
    cluster: Cluster,
    pool: SshPool,
    targets: list[SshTarget],
    pinned: dict[str, tuple[str, ...]],
    p: ClusterPaths,
    hf: HostsFile,
) -> None:
    """Hand every node the cluster's internal key, the node-side known_hosts and the hosts file, then
    prove the leader reaches every member with host keys checked."""
    node_view: dict[str, list[str]] = {}
    for n in cluster.nodes:
        node_view[n.private_ip] = list(pinned[n.ssh_host])
        node_view[n.name] = list(pinned[n.ssh_host])
    files = {
        ".ssh/id_ed25519": (p.internal_key.read_bytes(), 0o600),
        ".ssh/id_ed25519.pub": (p.internal_key.with_name(p.internal_key.name + ".pub").read_bytes(), 0o644),
        ".ssh/known_hosts": (sshkeys.render_known_hosts(node_view).encode(), 0o644),
        "hosts": (hf.render().encode(), 0o644),
    }
    report = pool.put(targets, files)
    if not report.all_ok:
        bad = "; ".join(f"{r.host}: {r.error}" for r in report.failed)
        raise UnreachableError(f"could not set up every node: {bad}")
    # The internal key must open every node to the others. Cloud nodes only know the operator key
    # (their key pair) from boot, so it is authorized here, once, for every provider alike.
    internal_pub = p.internal_key.with_name(p.internal_key.name + ".pub").read_text().strip()
    line = shlex.quote(internal_pub)
    authorize = (
        f"umask 077; mkdir -p ~/.ssh && touch ~/.ssh/authorized_keys && "
        f"(grep -qxF {line} ~/.ssh/authorized_keys || printf '%s\\n' {line} >> ~/.ssh/authorized_keys)"
    )
    report = pool.run(targets, authorize, timeout=60)
    if not report.all_ok:
        bad = "; ".join(f"{r.host}: {r.error or r.stderr.strip()[-200:]}" for r in report.failed)
        raise UnreachableError(f"could not authorize the cluster key on every node: {bad}")
    if not cluster.members:
        return
    checks = " ".join(
        f"ssh -o BatchMode=yes -o StrictHostKeyChecking=yes -o ConnectTimeout=10 {shlex.quote(m.private_ip)} true "
        f"|| echo {shlex.quote(m.private_ip)};"
        for m in cluster.members
    )
    result = pool.run_one(targets[0], checks, timeout=120)
    if not result.ok or result.stdout.strip():
        detail = result.error or result.stdout.strip().replace("\n", ", ") or result.stderr.strip()[-200:]
        raise ProvisionError(f"the leader cannot ssh to every member: {detail}")
