"""The cluster every benchmark here measures on: `clusterctl up --provider local` (namespace nodes with real
sshd, no node runtime) under a CLUSTERCTL_HOME of the benchmark's own, OpenSSH's argv to its nodes (the
cluster's key, its pinned known_hosts, strict checking), every link shaped with tc htb, and `down`.
Needs root."""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # this checkout's clusterctl, here too (its local provider's names)
CLI = [sys.executable, "-m", "clusterctl"]  # this checkout's (PYTHONPATH), not whichever is installed


def sh(argv: list[str], **kw) -> subprocess.CompletedProcess:
    """Run argv; its output kept; a failure raises, with what it printed."""
    proc = subprocess.run(argv, capture_output=True, text=True, **kw)
    if proc.returncode != 0:
        raise SystemExit(f"{shlex.join(map(str, argv))} exited {proc.returncode}: {proc.stderr.strip()[-500:]}")
    return proc


def htb(dev: str, rate_mbit: float) -> list[list[str]]:
    """tc commands shaping what `dev` sends to rate_mbit (htb, a 256 kB burst: this kernel has no netem)."""
    rate, burst = f"{rate_mbit}mbit", "256k"
    return [
        ["tc", "qdisc", "replace", "dev", dev, "root", "handle", "1:", "htb", "default", "10"],
        ["tc", "class", "replace", "dev", dev, "parent", "1:", "classid", "1:10", "htb", "rate", rate, "ceil", rate]
        + ["burst", burst, "cburst", burst],
    ]


class LocalCluster:
    """One local cluster of `nodes` nodes named PREFIX + a random suffix, its state under `home`, its hosts
    file at `work`/hosts; `cli` is the clusterctl that brings it up (default: this checkout's)."""

    def __init__(self, prefix: str, nodes: int, home: Path, work: Path, cli: list[str] = CLI):
        self.name = prefix + uuid.uuid4().hex[:6]
        self.n, self.home, self.work, self.cli = nodes, home, work, cli
        self.env = {**os.environ, "CLUSTERCTL_HOME": str(home), "PYTHONPATH": str(REPO)}
        self.hosts: list[str] = []

    @property
    def state(self) -> Path:
        """The cluster's folder under the home: its key, known_hosts, hosts file."""
        return self.home / "clusters" / self.name

    def up(self) -> list[str]:
        """The cluster, up; its nodes' addresses, leader first."""
        self.work.mkdir(parents=True, exist_ok=True)
        hosts = self.work / "hosts"
        sh(
            [*self.cli, "up", "--provider", "local", "--name", self.name, "--nodes", str(self.n), "--yes"]
            + ["--runtime", "none", "--hosts-file", str(hosts)],
            env=self.env,
            cwd=self.work,
        )
        self.hosts = [line.split()[0] for line in hosts.read_text().splitlines()]
        return self.hosts

    def down(self) -> None:
        subprocess.run([*self.cli, "down", self.name, "--yes"], env=self.env, capture_output=True, cwd=self.work)

    @property
    def ssh(self) -> list[str]:
        """OpenSSH to a node as a user would reach it: the cluster's key, its pinned host keys, no prompt."""
        return [
            "ssh",
            "-F",
            "/dev/null",
            "-i",
            str(self.state / "id_ed25519"),
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            f"UserKnownHostsFile={self.state / 'known_hosts'}",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "BatchMode=yes",
            "-l",
            "root",
        ]

    def on(self, host: str, command: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run([*self.ssh, host, command], capture_output=True, text=True, check=check)

    def on_all(self, command: str, check: bool = True) -> list[subprocess.CompletedProcess]:
        """The command on every node at once, in hosts order."""
        with ThreadPoolExecutor(max(1, len(self.hosts))) as ex:
            return list(ex.map(lambda h: self.on(h, command, check), self.hosts))

    def shape(self, rate_mbit: float) -> None:
        """Every link at rate_mbit: the bridge (this machine into the nodes), each node's way in (the host side
        of its veth) and out (its eth0)."""
        from clusterctl.providers.local import netns

        for cmd in htb(netns.bridge_name(self.name), rate_mbit):
            sh(cmd)
        for i in range(self.n):
            for cmd in htb(netns.veth_name(self.name, i), rate_mbit):
                sh(cmd)
            for cmd in htb("eth0", rate_mbit):
                sh(["ip", "netns", "exec", netns.netns_name(self.name, i), *cmd])

    def measure_link(self, megabytes: int = 60) -> float:
        """Raw TCP from this machine into node 0 (no ssh): what one shaped link really carries, Mbit/s."""
        from clusterctl.providers.local import netns

        port = 5599
        server = subprocess.Popen(
            ["ip", "netns", "exec", netns.netns_name(self.name, 0), "python3", "-c"]
            + [
                "import socket;s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1);"
                f"s.bind(('{self.hosts[0]}',{port}));s.listen(1);c,_=s.accept()\n"
                "while c.recv(1<<20): pass"
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        data = b"\0" * (1 << 20)
        for _ in range(100):
            try:
                s = socket.create_connection((self.hosts[0], port), timeout=10)
                break
            except ConnectionRefusedError:
                time.sleep(0.1)
        with s:
            start = time.perf_counter()
            for _ in range(megabytes):
                s.sendall(data)
        server.wait(timeout=30)
        return megabytes * (1 << 20) * 8 / 1e6 / (time.perf_counter() - start)
