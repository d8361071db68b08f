"""Run a Horovod job across a cluster the way a real cluster does: horovodrun on the leader.

    stage the scripts in one job folder (same absolute path on every node), the node package where a node
    lacks it -> write the job's hosts file -> on the leader: cd into the job folder, scrub the environment,
    run the node package's horovodrun (node/horovodrun.py: host keys checked) -> afterwards, kill anything
    of the job left anywhere.

Why this shape (shared/FACTS.md): horovodrun runs `cd <driver cwd>` and `env <driver env>` on every
rank, so the cwd must exist everywhere and the environment must hold no secret; the remote ranks run
the driver's Python path, so that path must exist on every node; launched from outside the nodes its
rendezvous server binds an address the nodes may not reach. The Python is the node runtime's
(runtime/), the same absolute path on every node.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Callable, Mapping, Sequence

from clusterctl import providers
from clusterctl.errors import RemoteCommandError, UnreachableError
from clusterctl.hostsfile import HostEntry, HostsFile
from clusterctl.node import nccl_report
from clusterctl.remote import nodepkg
from clusterctl.remote.jobfolder import BASE_PATH, JOBS, JobFolder
from clusterctl.remote.ssh import SshPool
from clusterctl.remote.stream import OnLine
from clusterctl.remote.targets import SshTarget
from clusterctl.types import Cluster, HostResult, RunReport
from clusterctl.workloads import horovod

# The DLAMI's EFA, aws-ofi-nccl (NCCL's EFA plugin) and CUDA libraries, kept under the scrubbed `env -i`
# (the image sets them in login shells only): those that exist on the leader, which horovodrun passes to
# every rank (identical nodes). None exists on a local node: then LD_LIBRARY_PATH is not set at all.
NODE_LIB_DIRS = ("/opt/amazon/efa/lib", "/opt/amazon/ofi-nccl/lib", "/usr/local/cuda/lib64")
LIB_PATH_SH = "L=; for d in " + " ".join(NODE_LIB_DIRS) + '; do [ -d "$d" ] && L="${L:+$L:}$d"; done;'


HOROVODRUN = "horovodrun"  # the node package's program (node/horovodrun.py): horovodrun, host keys checked


def rung_hosts(hosts: HostsFile, np: int) -> HostsFile:
    """The first `np` slots, leader first: 1 -> the leader alone, one node's slots -> the leader full."""
    entries, left = [], np
    for e in hosts.entries:
        if left <= 0:
            break
        take = min(e.slots, left)
        entries.append(HostEntry(e.host, take))
        left -= take
    if left > 0:
        raise ValueError(f"{np} processes asked for, but the cluster has only {hosts.total_slots} slots")
    return HostsFile(tuple(entries))


def rank_path(python: str) -> str:
    """The ranks' PATH: the job's Python's folder first, then the system's."""
    return f"{os.path.dirname(python)}:{BASE_PATH}" if python.startswith("/") else BASE_PATH


def job_env(cluster: Cluster | None, python: str, allow_socket: bool = False) -> dict[str, str]:
    """What every rank needs set, decided by clusterctl, not the user. `allow_socket`: a GPU job on an EFA type
    may run over another transport (--allow-socket-transport); otherwise its programs stop when NCCL did not
    choose EFA (node/nccl_report.py)."""
    env = {"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"}
    # NCCL over libfabric's EFA (aws-ofi-nccl), as AWS's "Get started with EFA and NCCL" guide runs it:
    # FI_PROVIDER=efa, and FI_EFA_USE_DEVICE_RDMA=1 on the types whose EFA does RDMA (p4d, p5).
    if cluster is not None and cluster.facts.efa:
        env["FI_PROVIDER"] = "efa"
        if cluster.facts.efa_rdma:  # p4d/p5: device RDMA; p3dn's EFA has none
            env["FI_EFA_USE_DEVICE_RDMA"] = "1"
        if not allow_socket:
            env[nccl_report.EXPECT_ENV] = nccl_report.EFA
    if cluster is not None and not providers.shares_this_machine(cluster):
        env["NCCL_SOCKET_IFNAME"] = "^lo,docker"
    if horovod.gpus_per_node(cluster):
        # NCCL's own report of the network it chose (its start-up lines only), read back by the job's programs
        env.update(nccl_report.DEBUG_ENV)
    if cluster is not None and cluster.facts.cuda_home:
        env.update(xla_env(cluster.facts.cuda_home, python))
    return env


def xla_env(cuda_home: str, python: str) -> dict[str, str]:
    """XLA on the GPU runtime's own CUDA 12 toolkit: TensorFlow 2.15 prefers a ptxas on PATH and else looks
    under /usr/local/cuda (CUDA 13 on the 2026 DLAMIs, which cannot target sm_70) for ptxas and libdevice;
    --xla_gpu_cuda_data_dir names the toolkit for both."""
    return {
        "PATH": f"{cuda_home}/bin:{rank_path(python)}",
        "XLA_FLAGS": f"--xla_gpu_cuda_data_dir={cuda_home}",
    }


def stage(
    pool: SshPool,
    targets: Sequence[SshTarget],
    job: JobFolder,
    files: Mapping[str, bytes],
    hosts: HostsFile,
    package: nodepkg.NodePackage | None = None,
) -> None:
    """The job's files into its folder on every node, and the node package (this installation's unless
    `package`) where a node lacks it: every node may launch horovodrun from it (bench's per-node rung,
    doctor's pairs)."""
    payload = {f"{job.dir}/{name}": (data, 0o644) for name, data in files.items()}
    payload[f"{job.dir}/hosts"] = (hosts.render().encode(), 0o644)
    _copied(pool.put(targets, payload))
    ship_package(pool, targets, package)


def ship_package(pool: SshPool, targets: Sequence[SshTarget], package: nodepkg.NodePackage | None = None) -> None:
    """The node package onto every target that lacks it, for a job that runs one of its programs."""
    _copied(nodepkg.ship(pool, targets, package))


def _copied(report: RunReport) -> None:
    if not report.all_ok:
        why = "; ".join(f"{r.host}: {r.error or r.stderr.strip()}" for r in report.failed)
        raise UnreachableError(f"could not copy the job to every node: {why}")


def leader_command(
    job: JobFolder,
    np: int,
    script_argv: Sequence[str],
    python: str,
    env: Mapping[str, str],
    start_timeout: int = horovod.DEFAULT_START_TIMEOUT_S,
    hosts: "HostsFile | str | Path" = Path("hosts"),
    elastic: horovod.Elastic | None = None,
) -> str:
    """The shell command run on the leader: horovodrun in the job folder, in a scrubbed environment.
    `hosts`: the job's hosts file by default; `localhost:N` runs a node on its own (bench's per-node rung)."""
    argv = horovod.horovodrun_argv(
        np,
        hosts,
        list(script_argv),
        extra_env=dict(env),
        start_timeout=start_timeout,
        horovodrun="@HOROVODRUN@",
        elastic=elastic,
    )
    at = argv.index("@HOROVODRUN@")
    argv[at : at + 1] = [python, nodepkg.package().at(job.home), HOROVODRUN]
    path = rank_path(python)
    return (
        f'{LIB_PATH_SH} cd {shlex.quote(job.dir)} && exec env -i HOME="$HOME" USER="$(id -un)" LANG=C.UTF-8 '
        f'PATH={shlex.quote(path)} ${{L:+LD_LIBRARY_PATH="$L"}} {shlex.join(argv)} 2>&1'
    )


def run_on_leader(
    pool: SshPool, leader: SshTarget, command: str, timeout: float | None, on_line: OnLine | None = None
) -> HostResult:
    return pool.run_one(leader, command, timeout=timeout, on_line=on_line)


def check_started(r: HostResult, leader: str) -> None:
    """The leader's answer to a detached job's start: the job did not start, said as the error it is."""
    if r.exit_code is None:
        raise UnreachableError(f"could not start the job on the leader {leader}: {r.error}")
    if r.exit_code != 0:
        raise RemoteCommandError(
            f"could not start the job on the leader {leader} (exit {r.exit_code}): {(r.stderr or r.stdout).strip()[-300:]}"
        )


def kill_job(pool: SshPool, targets: Sequence[SshTarget], job: JobFolder) -> RunReport:
    """End every process of the job on every node (ranks, horovodrun, its task services), and no other."""
    return pool.run(targets, kill_job_command(job), timeout=30)


def kill_job_command(job: JobFolder) -> str:
    """SIGKILL to the job's processes on a node: those whose command line names the job's folder, and those
    running in it. horovodrun starts every remote process with `cd <job folder>`, so its task services
    (`python -m horovod.runner.task_fn ...`, whose command line holds no path of ours) are found by their
    working directory; a pattern like 'horovod.runner' would also end another job's, or another user's."""
    # The shell running this holds the folder's path in its own command line (d=...): it skips itself ($$).
    pattern = shlex.quote(f"{job.home}/{JOBS}/{job.name}(/| |$)")  # not job-10's when job-1 ends
    return (
        f"d={shlex.quote(job.dir)}; pids=; "
        f'for p in $(pgrep -f -- {pattern}); do [ "$p" = "$$" ] || pids="$pids $p"; done; '
        'for p in /proc/[0-9]*; do c=$(readlink "$p/cwd" 2>/dev/null) || continue; '
        'case "$c" in "$d"|"$d"/*) pids="$pids ${p#/proc/}";; esac; done; '
        '[ -z "$pids" ] || kill -KILL $pids 2>/dev/null; true'
    )


def with_network_line(on_line: Callable[[str], None]) -> Callable[[str], None]:
    """on_line for a followed job, and after NCCL's lines the one `network:` line they make (GPU clusters: launch
    asks NCCL for them, node/nccl_report.py)."""
    watch = nccl_report.Watch()

    def out(line: str) -> None:
        on_line(line)
        if said := watch.feed(line):
            on_line(said)

    return out
