"""Shared fixtures: the real CLI in a subprocess, and real local clusters (namespace nodes + sshd).

Tests that bring up nodes need root, iproute2 and openssh-server; `install.sh test` installs them,
and a machine without them fails these tests loudly rather than skipping them.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# Tables follow COLUMNS: a CI terminal's width must not reach the commands the tests run (a test of a narrow
# table sets its own).
os.environ["COLUMNS"] = "200"
# A suite started in the background (`&`, nohup) inherits SIGINT ignored, and so would every command it starts:
# the tests' Ctrl-C would reach rsync and ssh but not clusterctl. Commands get the terminal's default.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
FIXTURES = REPO / "tests" / "fixtures"  # recorded logs and outputs the unit tests parse


# The longest modules (from `pytest --durations`), started first.
LONGEST = (
    "workloads/test_train_elastic.py",
    "workloads/test_bench_ladder.py",
    "providers/test_aws.py",
    "workloads/test_train_checkpoints.py",
    "workloads/test_repair_resume.py",
    "playbook/test_playbooks.py",
    "runtime/test_runtime_aws.py",
    "workloads/test_train_dali_cluster.py",
    "workloads/test_doctor.py",
    "autostop/test_autostop_local.py",
    "workloads/test_train_trust_cluster.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest modules first, then those that start nodes, then the rest, each module's tests in their own
    order. `install.sh test` runs modules side by side (pytest-xdist, each module whole on one worker, in this
    order): a long one started last would leave one worker running alone at the end."""
    rank: dict[Path, int] = {}
    for item in items:
        path = item.path.relative_to(REPO / "tests").as_posix()
        known = LONGEST.index(path) if path in LONGEST else len(LONGEST) + 1
        nodes = len(LONGEST) if item.get_closest_marker("integration") else known
        rank[item.path] = min(rank.get(item.path, known), known, nodes)
    items.sort(key=lambda item: rank[item.path])


@functools.cache
def node_pyz() -> str:
    """The node package as a file, as every node has it (built once per test run, removed at exit)."""
    from clusterctl.remote import nodepkg

    folder = tempfile.mkdtemp(prefix="node-pyz-")
    atexit.register(shutil.rmtree, folder, True)
    path = Path(folder) / nodepkg.package().name
    path.write_bytes(nodepkg.package().data)
    return str(path)


def node_argv(program: str, *args: object) -> list[str]:
    """A program of the node package, run as a node runs it (this Python, the package as a file)."""
    return [sys.executable, node_pyz(), program, *map(str, args)]


@dataclass
class Cli:
    home: Path  # CLUSTERCTL_HOME
    cwd: Path

    def env(self, extra: dict | None = None) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env["CLUSTERCTL_HOME"] = str(self.home)
        env["CLUSTERCTL_SSH_DIR"] = str(self.home / "ssh-config.d")  # `up`'s ssh config entries: not the real ~/.ssh
        env["PYTHONPATH"] = str(REPO)
        env.setdefault("COLUMNS", "200")
        env.update(extra or {})
        return env

    def __call__(
        self, *args: str, timeout: float = 300, env: dict | None = None, input: str | None = None, check: bool = False
    ) -> subprocess.CompletedProcess:
        proc = subprocess.run(
            [sys.executable, "-m", "clusterctl", *args],
            cwd=self.cwd,
            env=self.env(env),
            text=True,
            capture_output=True,
            timeout=timeout,
            input=input,
            stdin=None if input is not None else subprocess.DEVNULL,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"clusterctl {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
        return proc

    def popen(self, *args: str, env: dict | None = None) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "clusterctl", *args],
            cwd=self.cwd,
            env=self.env(env),
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
        )


# The Python with TensorFlow + Horovod that the template tests run (CLUSTERCTL_TRAIN_PYTHON overrides).
TRAIN_PY = os.environ.get("CLUSTERCTL_TRAIN_PYTHON", sys.executable)
HOROVODRUN = str(Path(TRAIN_PY).parent / "horovodrun")


@pytest.fixture(scope="module")
def horovod_present() -> None:
    probe = subprocess.run([TRAIN_PY, "-c", "import horovod.tensorflow"], capture_output=True, text=True)
    if probe.returncode != 0 or not Path(HOROVODRUN).exists():
        pytest.fail(
            f"{TRAIN_PY} cannot import horovod.tensorflow (or has no horovodrun beside it): install the training "
            "extra (tensorflow-cpu 2.15.1, then horovod 0.28.1 built with gloo, see install.sh) or point "
            f"CLUSTERCTL_TRAIN_PYTHON at a Python that has them.\n{probe.stderr[-2000:]}",
            pytrace=False,
        )


def wait_for(predicate, timeout: float, what: str, interval: float = 0.25):
    """predicate()'s first truthy value within `timeout` seconds, or the test fails naming `what`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}")


def free_port() -> int:
    """A loopback TCP port free right now (a test server binds it next)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Forward:
    """A TCP forwarder in this process: connections to `listen` (address, port; port 0 picks one) are piped to
    `target`. For a host on another port or address than its sshd's; closed with close()."""

    def __init__(self, listen: tuple[str, int], target: tuple[str, int]):
        self.srv = socket.create_server(listen)
        self.port, self.target, self.stop = self.srv.getsockname()[1], target, threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _serve(self) -> None:
        self.srv.settimeout(0.2)
        while not self.stop.is_set():
            try:
                conn, _ = self.srv.accept()
            except (socket.timeout, OSError):
                continue
            up = socket.create_connection(self.target, timeout=5)
            up.settimeout(None)  # 5 s to connect, not to answer: moto may digest a 355 MB PUT for longer under load
            for a, b in ((conn, up), (up, conn)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.srv.close()


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    home = tmp_path / "cchome"
    work = tmp_path / "work"
    work.mkdir()
    return Cli(home, work)


def require_root() -> None:
    if os.geteuid() != 0:
        pytest.fail("this test brings up namespace nodes and needs root: run the suite with ./install.sh test")


@dataclass
class LocalCluster:
    name: str
    cli: Cli
    hosts: list[str]
    up_stderr: str = ""  # what its `up` printed

    @property
    def hosts_file(self) -> Path:
        return self.cli.cwd / "hosts"

    def node_exec(self, index: int, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        """Run a command inside node `index` directly (as its PID 1's namespaces), bypassing ssh."""
        pid = node_pid(self.name, index)
        proc = subprocess.run(["nsenter", "-t", str(pid), "-a", *argv], capture_output=True, text=True, timeout=60)
        if check and proc.returncode != 0:
            raise AssertionError(f"{argv} in node {index} failed: {proc.stderr}")
        return proc


def node_ssh(cluster: LocalCluster, *options: str) -> list[str]:
    """OpenSSH to the cluster's nodes: its key, only its pinned host keys, no config, no prompt."""
    state = cluster.cli.home / "clusters" / cluster.name
    return [
        "ssh",
        "-F",
        "/dev/null",
        "-i",
        str(state / "id_ed25519"),
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        f"UserKnownHostsFile={state / 'known_hosts'}",
        "-o",
        "GlobalKnownHostsFile=/dev/null",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "BatchMode=yes",
        *options,
    ]


def reverse_tunnel(cluster: LocalCluster, index: int, port: int) -> subprocess.Popen:
    """The node's 127.0.0.1:port is this machine's 127.0.0.1:port (ssh -R, host key checked) until killed."""
    forward = ("-N", "-o", "ExitOnForwardFailure=yes", "-R", f"127.0.0.1:{port}:127.0.0.1:{port}")
    return subprocess.Popen(
        [*node_ssh(cluster, *forward), f"root@{cluster.hosts[index]}"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def node_pid(cluster: str, index: int) -> int:
    """PID (host view) of the node's sshd, PID 1 of its namespaces."""
    from clusterctl.providers.local import netns

    ns = netns.netns_name(cluster, index)
    for pid in netns.netns_pids(ns):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except FileNotFoundError:
            continue
        nspid = next(line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:"))
        if nspid[-1] == "1":  # PID 1 inside the node
            return pid
    raise AssertionError(f"no sshd in {ns}")


@pytest.fixture
def local_cluster_factory(cli: Cli):
    yield from _cluster_factory(cli)


@pytest.fixture(scope="module")
def module_cli(tmp_path_factory) -> Cli:
    """A CLUSTERCTL_HOME and working folder shared by one test module."""
    base = tmp_path_factory.mktemp("mod")
    (base / "work").mkdir()
    return Cli(base / "cchome", base / "work")


@pytest.fixture(scope="module")
def module_cluster_factory(module_cli: Cli):
    """local_cluster_factory shared by a module's tests: each cluster comes up once, goes down at the end
    (bring-ups are the slow part of the suite). Each `up` rewrites the module's ./hosts: tests that hold
    several clusters read a cluster's own hosts file from its state folder."""
    yield from _cluster_factory(module_cli)


def _cluster_factory(cli: Cli):
    made: list[str] = []

    def make(nodes: int = 3, slots: int = 2, extra: tuple[str, ...] = (), runtime: bool = False) -> LocalCluster:
        require_root()
        name = "t" + uuid.uuid4().hex[:8]
        # The node runtime (TensorFlow + Horovod, relayed and unpacked on every node) only where a test runs
        # Horovod: it is built once per machine (cached outside CLUSTERCTL_HOME), relayed on every `up`.
        proc = cli(
            "up",
            "--provider",
            "local",
            "--name",
            name,
            "--nodes",
            str(nodes),
            "--slots",
            str(slots),
            "--yes",
            *(() if runtime else ("--runtime", "none")),
            *extra,
            timeout=900 if runtime else 120,
        )
        made.append(name)
        assert proc.returncode == 0, proc.stderr
        hosts = [line.split()[0] for line in (cli.cwd / "hosts").read_text().splitlines()]
        return LocalCluster(name, cli, hosts, proc.stderr)

    yield make
    from clusterctl.providers.local import netns

    for name in made:
        cli("down", name, "--yes", timeout=120)
        left = netns.leftovers(name)
        assert left.empty, f"cluster {name} left {left.describe()}"
    if made:
        from clusterctl.remote import agent

        assert agent.ping(cli.home) is None, "a connection agent is still running after down"


@pytest.fixture
def local_cluster(local_cluster_factory) -> LocalCluster:
    return local_cluster_factory(3, 2)


# AWS for the tests: moto on 127.0.0.1 with its gaps filled, instances backed by namespace nodes (motoaws.py).
from motoaws import aws, aws_cli  # noqa: E402,F401
