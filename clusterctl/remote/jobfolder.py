"""A job's folder on the nodes and what runs in it: the folder (the same absolute path on every node, under
the login home), the Python a job runs (the node runtime's), the PATH its scrubbed environment gets, paths
as the nodes' shells read them, and following a detached job's log. Shared by every command that runs
something on the nodes (workloads/launch.py's Horovod jobs, bench, doctor, `data tfrecords --on leader`).
"""

from __future__ import annotations

import os
import shlex
import time
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

from clusterctl.errors import UnreachableError
from clusterctl.remote.ssh import SshPool
from clusterctl.remote.targets import SshSettings, SshTarget
from clusterctl.types import Cluster, RunReport

JOBS = "clusterctl-jobs"  # under the login home of every node
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class JobFolder:
    """A job's folder, at the same path on every node: what it runs is staged there (not a process)."""

    name: str
    home: str  # the login home on the nodes (identical nodes: the same everywhere)

    @property
    def dir(self) -> str:
        return f"{self.home}/{JOBS}/{self.name}"


def new_job(pool: SshPool, leader: SshTarget, prefix: str) -> JobFolder:
    result = pool.run_one(leader, 'printf %s "$HOME"', timeout=30)
    if not result.ok or not result.stdout.startswith("/"):
        raise UnreachableError(f"cannot reach the leader {leader.label}: {result.error or result.stderr.strip()}")
    return JobFolder(f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}", result.stdout.strip())


def node_python(cluster: Cluster | None) -> str:
    """The Python every rank runs: the cluster's recorded one (its node runtime, or the user's own
    `up --python`), else the nodes' python3 (a plain hosts file; `--python` overrides). Never this
    machine's interpreter: no node has its path."""
    if cluster is not None and cluster.facts.python:
        return cluster.facts.python
    return "python3"


def node_path(path: str, home: str) -> str:
    """A path as the nodes' shells would read it: `~/x` and relative paths are under the login home."""
    if not path or any(c in path for c in "\n\r\0"):
        raise ValueError(f"bad path {path!r}")
    if path == "~":
        return home
    if path.startswith("~/"):
        return f"{home}/{path[2:]}"
    if path.startswith("~"):
        raise ValueError(f"{path}: only ~/ (the login user's home) is understood")
    return path if path.startswith("/") else f"{home}/{path}"


def remove_job(pool: SshPool, targets: Sequence[SshTarget], job: JobFolder) -> RunReport:
    return pool.run(targets, f"rm -rf -- {shlex.quote(job.dir)}", timeout=30)


class Reachable(Protocol):
    """What following a job needs of an inventory (cluster/inventory.py's Inventory): the leader first."""

    @property
    def targets(self) -> Sequence[SshTarget]: ...

    @property
    def settings(self) -> SshSettings: ...


def follow(inv: Reachable, job_name: str, on_line: Callable[[str], None]) -> int:
    """Stream a detached job's log (train or launch) from the leader until it ends; the job's exit status
    (0 while it still runs after a dropped connection)."""
    from clusterctl.remote import tmux as jobs

    with SshPool(inv.settings) as pool:
        r = pool.run_one(
            inv.targets[0], jobs.logs_command(job_name, follow=True), on_line=lambda _h, _s, line: on_line(line)
        )
    if r.exit_code is None:
        raise UnreachableError(f"lost the log of {job_name}: {r.error}")
    return r.exit_code
