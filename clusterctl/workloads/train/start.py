"""A training job started on a cluster, in order: the nodes asked (train/nodes.py judges the answers), a job
still running stopped or refused, every node's copy of the data checked, the options resolved and the job folder
staged, the input pipeline timed on the leader, then train/plan.py's plan run on the leader in tmux, its record
kept (train/job.py) and every rank's GPU checked.
"""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable, Sequence

from clusterctl.errors import ConfigError, RemoteCommandError, UsageError
from clusterctl.remote import jobfolder, nodepkg
from clusterctl.workloads import horovod, launch
from clusterctl.workloads.train import feed as train_feed, plan as train_plan
from clusterctl.workloads.train.job import TrainJob, end_launch, is_running, load_job, save_job
from clusterctl.workloads.train.log import MARK
from clusterctl.workloads.train.nodes import (
    PROBE_TIMEOUT_S,
    choose_nodes,
    data_check_command,
    data_problems,
    keep_nodes,
    left_out_line,
)
from clusterctl.workloads.train.options import TrainOptions, trainer_flags

if TYPE_CHECKING:
    from clusterctl.cluster.inventory import Inventory
    from clusterctl.hostsfile import HostsFile
    from clusterctl.remote.jobfolder import JobFolder
    from clusterctl.remote.ssh import SshPool
    from clusterctl.remote.targets import SshTarget
    from clusterctl.state import StateStore

MODEL_DIR = "clusterctl-train/model"  # under the leader's login home, unless --model-dir says otherwise
GPU_CHECK_TIMEOUT_S = 900.0  # TensorFlow loading CUDA on a fresh GPU node can take minutes
FEED_PROBE = "input_rate"  # the node package's program: the trainer's input pipeline, every rank's at once
FEED_TIMEOUT_S = 600.0
FEED_SECONDS = 10.0  # the probe times this long (after every rank's first batch)


def start(
    inv: Inventory,
    store: StateStore,
    opts: TrainOptions,
    *,
    np: int | None = None,
    python: str | None = None,
    force: bool = False,
    verify_data: bool = True,
    report: Callable[[str], None] = lambda _m: None,
    gpu_check_timeout: float = GPU_CHECK_TIMEOUT_S,
    checkpoint_copy: bool = True,
) -> TrainJob:
    """Launch the trainer on the cluster and return (the job runs in tmux on the leader). On a cluster
    whose type has GPUs, first wait until every rank said which GPU it computes on: a rank on the CPU or
    two ranks on one GPU stop the job and raise RemoteCommandError. With checkpoint_copy, the second
    node of the hosts keeps a copy of every checkpoint; on spot nodes the trainer polls the interruption
    notice."""
    from clusterctl.remote.ssh import SshPool

    opts.require_source()
    total = inv.hosts.total_slots
    if np is not None and not 1 <= np <= total:
        raise UsageError(f"--np {np}: the hosts have {total} slot(s)")
    python = python or jobfolder.node_python(inv.cluster)
    with SshPool(inv.settings) as pool:
        inv = _reachable(pool, inv, np_given=np is not None, report=report)
        np = np or inv.hosts.total_slots
        hosts = launch.rung_hosts(inv.hosts, np)
        targets, leader = list(inv.targets[: len(hosts.entries)]), inv.targets[0]
        job = jobfolder.new_job(pool, leader, "train")
        previous = _previous(pool, store, inv, force, report)
        data, model_dir = _node_paths(opts, job.home)
        if data and verify_data:
            _verify_data(pool, targets, data, opts.data)
        opts, config = train_plan.resolve(
            opts, inv.cluster, inv.hosts, data=data, model_dir=model_dir, np=np, checkpoint_copy=checkpoint_copy
        )
        report(f"configuration for {config.describe()} ({config.source})")
        pkg = nodepkg.package()
        report(f"staging the trainer ({pkg.name}) and {job.dir} on {len(targets)} node(s)")
        gpus = horovod.gpus_per_node(inv.cluster)
        # real records: what the leader's input pipeline delivers, against its GPUs' rate ("": none to judge by)
        gpu = train_feed.gpu_to_feed(gpus, config.gpu, config.precision, data)
        launch.stage(pool, targets, job, {}, hosts, package=pkg)
        own_python = inv.cluster is None or inv.cluster.facts.runtime in ("", "none", "own")
        feeding = Feeding(pool, leader, job.dir, python, hosts.entries[0].slots, gpus, gpu)
        opts = replace(opts, input=feeding.choose(opts, data, dali_installed=not own_python, report=report))
        plan = train_plan.plan(opts, config, inv.cluster, np, python, job.dir, pkg.at(job.home))
        _run(pool, leader, job, plan, python, hosts, len(targets), report)
        record = _record(inv, job, leader, plan, python, previous, targets)
        save_job(store, inv, record)
        if gpus:
            _check_devices(pool, list(inv.targets), record, gpus, gpu_check_timeout, report)
        return record


def _reachable(pool: SshPool, inv: Inventory, *, np_given: bool, report: Callable[[str], None]) -> Inventory:
    """One short round first: an unreachable node fails here, by name, before anything is staged; on a
    spot cluster it is left out instead (the connections stay open in the pool for what follows)."""
    probe = pool.run(list(inv.targets), "true", timeout=PROBE_TIMEOUT_S)
    labels = [t.label for t in inv.targets]
    choice = choose_nodes(
        labels,
        [r.error or f"exit {r.exit_code}" if r.exit_code != 0 else None for r in probe],
        spot=inv.cluster is not None and inv.cluster.facts.spot,
        np_given=np_given,
    )
    if not choice.left_out:
        return inv
    report(left_out_line(labels, choice))
    return keep_nodes(inv, choice.keep)


def _previous(
    pool: SshPool, store: StateStore, inv: Inventory, force: bool, report: Callable[[str], None]
) -> TrainJob | None:
    """The last launch here, stopped everywhere when it still runs and --force says so (refused without)."""
    previous = load_job(store, inv)
    if previous is None:
        return None
    # asked where it ran: a spot restart may lead from another node than the last launch did
    was = next((t for t in inv.targets if t.label == previous.leader), None)
    alive = is_running(pool, was, previous) if was is not None else None
    if alive and not force:
        raise ConfigError(
            f"training job {previous.job} is still running on {previous.leader}",
            "follow it with `clusterctl logs -f`, or pass --force to stop it and start again",
        )
    if alive or force:
        report(f"stopping {previous.job} everywhere")
        end_launch(pool, list(inv.targets), previous)
    return previous


def _node_paths(opts: TrainOptions, home: str) -> tuple[str | None, str]:
    """--data (None for a synthetic run) and --model-dir as absolute paths on the nodes."""
    try:
        data = jobfolder.node_path(opts.data, home) if opts.data and not opts.synthetic else None
        return data, jobfolder.node_path(opts.model_dir or f"~/{MODEL_DIR}", home)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _verify_data(pool: SshPool, targets: Sequence[SshTarget], data: str, given: str | None) -> None:
    checks = pool.run(list(targets), data_check_command(data), timeout=60)
    problems = data_problems({r.host: (r.stdout if r.exit_code == 0 else None) for r in checks})
    if problems:
        raise ConfigError(
            f"the data {data} is not ready on every node: {'; '.join(problems)}",
            f"copy and verify it with `clusterctl sync SRC {given}` "
            "(or pass --no-verify-data when it is on a shared file system)",
        )


def _run(
    pool: SshPool,
    leader: SshTarget,
    job: JobFolder,
    plan: train_plan.TrainPlan,
    python: str,
    hosts: HostsFile,
    nodes: int,
    report: Callable[[str], None],
) -> None:
    """The plan started on the leader in tmux (an elastic job's hosts written where its discovery reads them)."""
    from clusterctl.cluster import live_hosts
    from clusterctl.remote import tmux as jobs

    if plan.elastic is not None:
        live_hosts.write(pool, leader, hosts)  # what the discovery script offers; `repair` rewrites it
        report(
            f"elastic: {plan.np} process(es) to start, at least {plan.elastic.min_np}, at most "
            f"{plan.elastic.max_np}; hosts from ~/{live_hosts.PATH} on {leader.label}"
        )
    r = pool.run_one(
        leader,
        f"mkdir -p {shlex.quote(plan.model_dir)} && "
        + jobs.detach_command(job.name, plan.leader_command(job, python), kind="train", nodes=nodes),
        timeout=60,
    )
    launch.check_started(r, leader.label)


def _record(
    inv: Inventory,
    job: JobFolder,
    leader: SshTarget,
    plan: train_plan.TrainPlan,
    python: str,
    previous: TrainJob | None,
    targets: Sequence[SshTarget],
) -> TrainJob:
    model_dir = plan.model_dir
    # Earlier launches that trained into the same model folder are this job's history (its restarts).
    same = previous is not None and previous.model_dir == model_dir
    earlier = (*previous.previous, previous.job) if previous is not None and same else ()
    return TrainJob(
        key=inv.cluster.name if inv.cluster is not None else "hosts",
        job=job.name,
        job_dir=job.dir,
        home=job.home,
        leader=leader.label,
        model_dir=model_dir,
        np=plan.np,
        python=python,
        options=plan.opts,
        started_at=time.time(),
        previous=earlier[-20:],
        hosts=tuple(t.label for t in targets),
    )


def _check_devices(
    pool: SshPool,
    targets: Sequence[SshTarget],
    record: TrainJob,
    gpus: int,
    timeout: float,
    report: Callable[[str], None],
) -> None:
    """Until every rank said which GPU it has: not one process per GPU stops the job."""
    report(f"waiting until each of the {record.np} processes reports its GPU ({gpus} per node)")
    leader = next(t for t in targets if t.label == record.leader)
    gpu_problems = wait_for_devices(pool, leader, record.job, record.np, gpus, timeout)
    if gpu_problems:
        end_launch(pool, list(targets), record)
        raise RemoteCommandError(
            f"training job {record.job} stopped: not one process per GPU: " + "; ".join(gpu_problems),
            "see `clusterctl logs`; `clusterctl doctor` checks every node's GPUs",
        )
    if gpu_problems is None:
        report(
            "no GPU report from every process yet (the job ended or is slow to start): "
            "see `clusterctl status` and `clusterctl logs`"
        )


def feed_check(
    pool: SshPool, leader: SshTarget, job_dir: str, python: str, opts: TrainOptions, ranks: int, gpus: int, gpu: str
) -> tuple[train_feed.Feed | None, list[str]]:
    """Before a run with real records: the trainer's own input pipeline timed on the leader, `ranks` pipelines
    at once (the ranks it runs) at each rank's thread count, on the run's records and flags (node/input_rate.py,
    GPUs hidden). Returns the GPUs' Feed (None without a GPU rate to judge by) and the line to show, `input: ...`;
    (None, []) when the probe did not answer (the run goes on)."""
    probe = nodepkg.package().command(
        FEED_PROBE, "--ranks", str(ranks), "--seconds", f"{FEED_SECONDS:g}", "--", *trainer_flags(opts), python=python
    )
    r = pool.run_one(leader, f"cd {shlex.quote(job_dir)} && {probe} 2>&1", timeout=FEED_TIMEOUT_S)
    measured = train_feed.parse_probe(r.stdout) if r.exit_code == 0 else None
    if measured is None:
        return None, []
    f = train_feed.feed(measured.cores, measured.images_per_sec, gpus, gpu, measured.path)  # None for no GPU rate
    return f, [train_feed.input_line(measured, f)]


@dataclass(frozen=True)
class Feeding:
    """Where a run's input pipeline is judged: the leader, its ranks and the GPUs they feed."""

    pool: SshPool
    leader: SshTarget
    job_dir: str
    python: str
    ranks: int  # the leader's ranks: pipelines timed at once
    gpus: int
    gpu: str  # the GPU type whose rate the feed is judged against ("" for none)

    def choose(self, opts: TrainOptions, data: str | None, dali_installed: bool, report: Callable[[str], None]) -> str:
        """The run's --input (tfdata or dali): the feed measured on real records (feed_check), then `auto` decided
        on it (train/feed.choose_input); each said in one line, and the warning when tf.data would starve GPUs."""
        fed: train_feed.Feed | None = None
        measured: list[str] = []
        if data and self.gpu:  # with no GPU rate to judge it by, a figure would only cost the start ~15 s
            report(
                f"timing the input pipeline on {self.leader.label}: {self.ranks} rank(s) at once (decode + augment, "
                f"{data})"
            )
            fed, measured = feed_check(
                self.pool, self.leader, self.job_dir, self.python, opts, self.ranks, self.gpus, self.gpu
            )
            for line in measured:
                report(line)
        chosen = train_feed.choose_input(opts.input, fed, self.gpus, data, dali_installed=dali_installed)
        short = train_feed.warning(fed) if fed and chosen.input == "tfdata" else None
        if short:
            report(f"warning: {short}")
        if not (measured and opts.input in (None, "auto") and chosen.input == "tfdata"):  # else `measured` says it
            report(chosen.line())
        return chosen.input


def wait_for_devices(
    pool: SshPool,
    leader: SshTarget,
    job_name: str,
    np: int,
    gpus: int,
    timeout: float = GPU_CHECK_TIMEOUT_S,
    poll: float = 2.0,
) -> list[str] | None:
    """Read the job's log on the leader until every rank said which GPU it has; then the problems
    (horovod.device_problems: [] when each rank has a GPU of its own). None when the job ended first or
    `timeout` passed: nothing proven either way (`status` and the log say why it ended)."""
    from clusterctl.remote import tmux as jobs

    n = jobs.validate_job_name(job_name)
    cmd = f'head -c 4000000 "{jobs.JOBS_DIR}/{n}.log" 2>/dev/null; echo; {jobs.alive_command(n)}'
    deadline = time.monotonic() + timeout
    while True:
        r = pool.run_one(leader, cmd, timeout=60)
        text, _, alive = r.stdout.rstrip("\n").rpartition("\n")
        try:
            reports = horovod.parse_devices(text, MARK)
        except ValueError:
            reports = ()
        if len(reports) >= np:
            return horovod.device_problems(reports, np, gpus)
        if (r.exit_code == 0 and alive.strip() == "gone") or time.monotonic() > deadline:
            return None
        time.sleep(poll)
