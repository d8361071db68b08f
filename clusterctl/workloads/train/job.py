"""The training job on a cluster: its record (TrainJob, train.json), start on the leader in tmux after asking
every node (workloads/train/nodes.py judges the answers), stop, evaluate, its log and status. The trainer's
argv comes from workloads/train/options.py; its log is read by workloads/train/log.py; TensorBoard is
workloads/train/tensorboard.py."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from clusterctl.remote import nodepkg
from clusterctl.remote.jobfolder import node_path
from clusterctl.workloads.train import config as train_config, feed as train_feed
from clusterctl.workloads.train.log import MARK, EvalResult, TrainStatus, parse_eval, parse_train_log, status
from clusterctl.workloads.train.nodes import (
    PROBE_TIMEOUT_S,
    choose_nodes,
    data_check_command,
    data_problems,
    keep_nodes,
    left_out_line,
)
from clusterctl.workloads.train.options import TrainOptions, horovod_env, trainer_argv, trainer_flags

if TYPE_CHECKING:
    from clusterctl.cluster.inventory import Inventory
    from clusterctl.remote.ssh import SshPool
    from clusterctl.remote.targets import SshTarget
    from clusterctl.state import StateStore
    from clusterctl.workloads.horovod import Elastic

DISCOVERY = (
    "live_hosts"  # the node package's program for an elastic job's host discovery, run by horovodrun on the leader
)
SPOT_POLL_S = 5.0  # EC2 gives two minutes' notice; AWS suggests checking every 5 seconds


# ---- the job on a cluster ----------------------------------------------------------------------------
# The trainer (the node package's `train`) runs under horovodrun on the leader (clusterctl.workloads.launch: a job folder at the
# same path on every node, a scrubbed environment, host keys checked), inside a tmux session there
# (clusterctl.remote.tmux: the log at ~/.clusterctl/jobs/JOB.log on the leader, its exit status beside it), so
# closing the laptop changes nothing. Checkpoints and TensorBoard logs go to the model folder on the
# leader (rank 0's disk), which stays the same from one launch to the next; every checkpoint is also
# copied to the same folder on the second node and, with --checkpoint-to, to S3 (clusterctl/node/train/checkpoints.py).
# A restart resumes from the newest complete one of those. clusterctl remembers the last launch locally
# (train.json) for logs / status / eval.

RECORD = "train.json"
MODEL_DIR = "clusterctl-train/model"  # under the leader's login home, unless --model-dir says otherwise


@dataclass(frozen=True)
class TrainJob:
    """The last training launch on a cluster, as clusterctl remembers it."""

    key: str  # the cluster's name (or hosts-<digest> for a plain hosts file)
    job: str  # launch job name = tmux session on the leader
    job_dir: str  # the job folder on every node (hosts; the ranks' working folder)
    home: str  # the login home on the nodes
    leader: str  # the leader's label (hosts-file token)
    model_dir: str
    np: int
    python: str
    options: TrainOptions  # as launched (paths absolute on the nodes); a JSON object in train.json
    started_at: float
    previous: tuple[str, ...] = ()  # earlier launches of this job (restarts), oldest first
    hosts: tuple[str, ...] = ()  # the nodes this launch runs on, leader first (labels; () in older records)

    @property
    def log_path(self) -> str:
        return f"{self.home}/.clusterctl/jobs/{self.job}.log"

    def to_json(self) -> str:
        import dataclasses
        import json

        d = dataclasses.asdict(self)  # options becomes a dict, its extra a list (as train.json always held)
        d["options"]["extra"] = list(self.options.extra)
        d["previous"] = list(self.previous)
        d["hosts"] = list(self.hosts)
        return json.dumps(d, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> "TrainJob":
        import json

        d = json.loads(text)
        d["previous"] = tuple(d.get("previous", ()))
        d["hosts"] = tuple(d.get("hosts", ()))
        opts = d.get("options", {})
        opts["extra"] = tuple(opts.get("extra", ()))
        # an option an older or newer clusterctl wrote that this one does not know is left out
        d["options"] = TrainOptions(**{k: v for k, v in opts.items() if k in TrainOptions.__dataclass_fields__})
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


def job_inventory(inv: Inventory, job: TrainJob) -> Inventory:
    """The inventory of the nodes the job runs on, its leader first: after a spot node was left out, the
    leader may be another node than the hosts' first."""
    labels = {t.label for t in inv.targets}
    if not job.hosts or not set(job.hosts) <= labels:
        return inv
    from clusterctl.cluster import inventory

    return inventory.subset(inv, job.hosts)


def _record_path(store: StateStore, inv: Inventory) -> Path:
    import hashlib
    from pathlib import Path

    if inv.cluster is not None:
        return Path(store.cluster_dir(inv.cluster.name)) / RECORD
    digest = hashlib.sha256(inv.hosts.render().encode()).hexdigest()[:12]
    return Path(store.root) / "train" / f"hosts-{digest}.json"


def load_job(store: StateStore, inv: Inventory) -> TrainJob | None:
    path = _record_path(store, inv)
    try:
        return TrainJob.from_json(path.read_text())
    except FileNotFoundError:
        return None


def require_job(store: StateStore, inv: Inventory) -> TrainJob:
    from clusterctl.errors import ConfigError

    job = load_job(store, inv)
    if job is None:
        where = inv.cluster.name if inv.cluster is not None else "these hosts"
        raise ConfigError(f"no training job on {where}", "start one with `clusterctl train --data DIR`")
    return job


def _save_job(store: StateStore, inv: Inventory, job: TrainJob) -> None:
    from clusterctl.state import atomic_write

    path = _record_path(store, inv)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    atomic_write(path, job.to_json())


GPU_CHECK_TIMEOUT_S = 900.0  # TensorFlow loading CUDA on a fresh GPU node can take minutes
FEED_PROBE = "input_rate"  # the node package's program: the trainer's input pipeline, every rank's at once
FEED_TIMEOUT_S = 600.0
FEED_SECONDS = 10.0  # the probe times this long (after every rank's first batch)


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
        on it (train_feed.choose_input); each said in one line, and the warning when tf.data would starve GPUs."""
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
    import time as _time

    from clusterctl.remote import tmux as jobs
    from clusterctl.workloads import horovod

    n = jobs.validate_job_name(job_name)
    cmd = f'head -c 4000000 "{jobs.JOBS_DIR}/{n}.log" 2>/dev/null; echo; {jobs.alive_command(n)}'
    deadline = _time.monotonic() + timeout
    while True:
        r = pool.run_one(leader, cmd, timeout=60)
        text, _, alive = r.stdout.rstrip("\n").rpartition("\n")
        try:
            reports = horovod.parse_devices(text, MARK)
        except ValueError:
            reports = ()
        if len(reports) >= np:
            return horovod.device_problems(reports, np, gpus)
        if (r.exit_code == 0 and alive.strip() == "gone") or _time.monotonic() > deadline:
            return None
        _time.sleep(poll)


def is_running(pool: SshPool, leader: SshTarget, job: TrainJob) -> bool | None:
    """Whether the job's tmux session still lives on the leader (None: the leader did not answer)."""
    from clusterctl.remote import tmux as jobs

    r = pool.run_one(leader, jobs.alive_command(job.job), timeout=30)
    if r.exit_code is None:
        return None
    return r.stdout.strip() == "alive"


def _stop(pool: SshPool, targets: Sequence[SshTarget], job: TrainJob) -> None:
    """End a launch everywhere: its tmux session and process tree on the leader, any rank left on any node."""
    from clusterctl.remote import jobfolder, tmux as jobs
    from clusterctl.workloads import launch

    leader = next((t for t in targets if t.label == job.leader), targets[0])
    pool.run_one(leader, jobs.kill_job_command(job.job), timeout=60)
    launch.kill_job(pool, targets, jobfolder.JobFolder(job.job, job.home))


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
    import time as _time
    from dataclasses import replace

    from clusterctl.cluster import live_hosts
    from clusterctl.errors import ConfigError, RemoteCommandError, UnreachableError, UsageError
    from clusterctl.remote import jobfolder, tmux as jobs
    from clusterctl.remote.ssh import SshPool
    from clusterctl.workloads import horovod, launch

    opts.require_source()
    total = inv.hosts.total_slots
    if np is not None and not 1 <= np <= total:
        raise UsageError(f"--np {np}: the hosts have {total} slot(s)")
    spot = inv.cluster is not None and inv.cluster.facts.spot
    python = python or jobfolder.node_python(inv.cluster)
    with SshPool(inv.settings) as pool:
        # One short round first: an unreachable node fails here, by name, before anything is staged; on a
        # spot cluster it is left out instead (the connections stay open in the pool for what follows).
        probe = pool.run(list(inv.targets), "true", timeout=PROBE_TIMEOUT_S)
        labels = [t.label for t in inv.targets]
        choice = choose_nodes(
            labels,
            [r.error or f"exit {r.exit_code}" if r.exit_code != 0 else None for r in probe],
            spot=spot,
            np_given=np is not None,
        )
        if choice.left_out:
            report(left_out_line(labels, choice))
            inv = keep_nodes(inv, choice.keep)
        np = np or inv.hosts.total_slots
        hosts = launch.rung_hosts(inv.hosts, np)
        targets = list(inv.targets[: len(hosts.entries)])
        leader = inv.targets[0]
        job = jobfolder.new_job(pool, leader, "train")
        previous = load_job(store, inv)
        if previous is not None:
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
                _stop(pool, list(inv.targets), previous)
        try:
            data = node_path(opts.data, job.home) if opts.data and not opts.synthetic else None
            model_dir = node_path(opts.model_dir or f"~/{MODEL_DIR}", job.home)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        if data and verify_data:
            checks = pool.run(targets, data_check_command(data), timeout=60)
            problems = data_problems({r.host: (r.stdout if r.exit_code == 0 else None) for r in checks})
            if problems:
                raise ConfigError(
                    f"the data {data} is not ready on every node: {'; '.join(problems)}",
                    f"copy and verify it with `clusterctl sync SRC {opts.data}` "
                    "(or pass --no-verify-data when it is on a shared file system)",
                )
        # An elastic job's size changes by design: no --expect-size.
        opts = replace(opts, data=data, model_dir=model_dir, expect_size=None if opts.elastic else np)
        # The GPU type's configuration (train/config.py), the user's flags over it: what bench measures too.
        opts, config = train_config.for_train(opts, inv.cluster)
        report(f"configuration for {config.describe()} ({config.source})")
        if checkpoint_copy and opts.checkpoint_copy is None and len(inv.hosts.entries) > 1:
            opts = replace(opts, checkpoint_copy=inv.hosts.entries[1].host)
        if opts.spot_poll is None and inv.cluster is not None and inv.cluster.facts.spot:
            opts = replace(opts, spot_poll=SPOT_POLL_S)
        pkg = nodepkg.package()
        report(f"staging the trainer ({pkg.name}) and {job.dir} on {len(targets)} node(s)")
        gpus = horovod.gpus_per_node(inv.cluster)
        # real records: what the leader's input pipeline delivers, against its GPUs' rate ("": none to judge by)
        gpu = train_feed.gpu_to_feed(gpus, config.gpu, config.precision, data)
        launch.stage(
            pool,
            targets,
            job,
            {},
            hosts,
            package=pkg,
        )
        own_python = inv.cluster is None or inv.cluster.facts.runtime in ("", "none", "own")
        feeding = Feeding(pool, leader, job.dir, python, hosts.entries[0].slots, gpus, gpu)
        opts = replace(opts, input=feeding.choose(opts, data, dali_installed=not own_python, report=report))
        env = {
            **launch.job_env(inv.cluster, python, opts.allow_socket_transport),
            **train_config.gpu_env(config),
            **horovod_env(opts),
        }
        elastic = None
        if opts.elastic:
            elastic = elastic_args(opts, np, python, job.dir, pkg.at(job.home))
            np = min(np, elastic.max_np)
            live_hosts.write(pool, leader, hosts)  # what the discovery script offers; `repair` rewrites it
            env["CLUSTERCTL_EVENT_MARK"] = MARK  # horovodrun's line when too few nodes are left
            # Horovod's own fusion buffer and cycle time: with HOROVOD_FUSION_THRESHOLD and HOROVOD_CYCLE_TIME
            # set, horovod 0.28.1's re-init after a lost peer segfaults (measured on local nodes, gloo).
            for name in horovod_env(opts):
                env.pop(name, None)
            report(
                f"elastic: {np} process(es) to start, at least {elastic.min_np}, at most {elastic.max_np}; "
                f"hosts from ~/{live_hosts.PATH} on {leader.label}"
            )
        cmd = launch.leader_command(job, np, trainer_argv(python, pkg.at(job.home), opts), python, env, elastic=elastic)
        r = pool.run_one(
            leader,
            f"mkdir -p {shlex.quote(model_dir)} && "
            + jobs.detach_command(job.name, cmd, kind="train", nodes=len(targets)),
            timeout=60,
        )
        if r.exit_code is None:
            raise UnreachableError(f"could not start the job on the leader {leader.label}: {r.error}")
        if r.exit_code != 0:
            raise RemoteCommandError(
                f"could not start the job on the leader {leader.label} "
                f"(exit {r.exit_code}): {(r.stderr or r.stdout).strip()[-300:]}"
            )
        # Earlier launches that trained into the same model folder are this job's history (its restarts).
        same = previous is not None and previous.model_dir == model_dir
        earlier = (*previous.previous, previous.job) if previous is not None and same else ()
        record = TrainJob(
            key=inv.cluster.name if inv.cluster is not None else "hosts",
            job=job.name,
            job_dir=job.dir,
            home=job.home,
            leader=leader.label,
            model_dir=model_dir,
            np=np,
            python=python,
            options=opts,
            started_at=_time.time(),
            previous=earlier[-20:],
            hosts=tuple(t.label for t in targets),
        )
        _save_job(store, inv, record)
        if gpus:
            report(f"waiting until each of the {np} processes reports its GPU ({gpus} per node)")
            gpu_problems = wait_for_devices(pool, leader, job.name, np, gpus, gpu_check_timeout)
            if gpu_problems:
                _stop(pool, list(inv.targets), record)
                raise RemoteCommandError(
                    f"training job {job.name} stopped: not one process per GPU: " + "; ".join(gpu_problems),
                    "see `clusterctl logs`; `clusterctl doctor` checks every node's GPUs",
                )
            if gpu_problems is None:
                report(
                    "no GPU report from every process yet (the job ended or is slow to start): "
                    "see `clusterctl status` and `clusterctl logs`"
                )
        return record


def elastic_args(opts: TrainOptions, np: int, python: str, job_dir: str, pyz: str) -> Elastic:
    """horovodrun's elastic options for a job of `np` slots: --min-np (default 1), --max-np (default the
    slots at launch), the discovery (the node package `pyz`'s program, given the job's hosts file),
    --elastic-timeout."""
    from clusterctl.errors import UsageError
    from clusterctl.workloads import horovod
    from clusterctl.workloads.train import options as train_options

    max_np = opts.max_np or np
    min_np = opts.min_np or 1
    if min_np > min(np, max_np):
        raise UsageError(
            f"--min-np {min_np} is more than the {min(np, max_np)} process(es) the job can start with",
            "lower --min-np, or bring more nodes up",
        )
    discovery = shlex.join([python, pyz, DISCOVERY, f"{job_dir}/hosts"])
    timeout = opts.elastic_timeout or train_options.ELASTIC_TIMEOUT_S
    return horovod.Elastic(min_np, max_np, discovery, timeout)


def history_command(job: TrainJob, launches: int = 10) -> str:
    """Print the logs of the job's last `launches` launches (restarts first, the current one last)."""
    from clusterctl.remote import tmux as jobs

    names = [jobs.validate_job_name(n) for n in (*job.previous, job.job)][-launches:]
    # a newline after each earlier log (a killed job may have stopped mid-line), none after the live one
    earlier = "".join(f'cat "{jobs.JOBS_DIR}/{n}.log" 2>/dev/null && echo; ' for n in names[:-1])
    return earlier + f'cat "{jobs.JOBS_DIR}/{names[-1]}.log" 2>/dev/null; true'


@dataclass(frozen=True)
class JobLog:
    """The job's log as the leader holds it, and whether the job still runs there."""

    text: str  # every launch of the job: a restart's log follows the one it resumed
    running: bool | None  # None: the leader did not answer that question


def read_log(inv: Inventory, job: TrainJob) -> JobLog:
    """The job's log from the leader (every launch of it: a restart's log follows the one it resumed),
    and whether it still runs."""
    from clusterctl.errors import UnreachableError
    from clusterctl.remote.ssh import SshPool

    inv = job_inventory(inv, job)
    with SshPool(inv.settings) as pool:
        leader = inv.targets[0]
        r = pool.run_one(leader, history_command(job), timeout=120)
        if r.exit_code is None:
            raise UnreachableError(f"cannot read the log on {leader.label}: {r.error}")
        return JobLog(r.stdout, is_running(pool, leader, job))


def job_status(inv: Inventory, job: TrainJob) -> TrainStatus:
    log = read_log(inv, job)
    return status(parse_train_log(log.text, strict=False), running=log.running)


def evaluate(
    inv: Inventory, job: TrainJob, on_line: Callable[[str], None] | None = None, timeout: float | None = None
) -> EvalResult:
    """--eval-only of the latest checkpoint, on the leader alone (GPUs hidden while the job trains)."""
    from dataclasses import replace

    from clusterctl.errors import RemoteCommandError, UnreachableError
    from clusterctl.remote import jobfolder
    from clusterctl.remote.ssh import SshPool
    from clusterctl.workloads import launch

    opts = replace(job.options, eval_only=True, expect_size=None, no_eval=False)
    pkg = nodepkg.package()
    inv = job_inventory(inv, job)
    with SshPool(inv.settings) as pool:
        leader = inv.targets[0]
        running = is_running(pool, leader, job)
        if running:
            opts = replace(opts, no_gpu=True)
        launch.ship_package(pool, [leader], pkg)  # this clusterctl's trainer, where the leader lacks it
        env = {**launch.job_env(inv.cluster, job.python)}
        if running:
            env["CUDA_VISIBLE_DEVICES"] = ""
        path = f"{job.python.rsplit('/', 1)[0]}:{jobfolder.BASE_PATH}"
        assigns = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        cmd = (
            f'cd {shlex.quote(job.job_dir)} && exec env -i HOME="$HOME" USER="$(id -un)" LANG=C.UTF-8 '
            f"PATH={shlex.quote(path)} {assigns} {shlex.join(trainer_argv(job.python, pkg.at(job.home), opts))} 2>&1"
        )
        r = pool.run_one(
            leader, cmd, timeout=timeout, on_line=(lambda _h, _s, line: on_line(line)) if on_line else None
        )
    if r.exit_code is None:
        raise UnreachableError(f"evaluation on {leader.label} did not finish: {r.error}")
    try:
        return parse_eval(r.stdout)
    except ValueError as exc:
        raise RemoteCommandError(
            f"evaluation failed on {leader.label} (exit {r.exit_code}): {exc}",
            (r.stdout + r.stderr).strip().splitlines()[-1][:300] if (r.stdout + r.stderr).strip() else None,
        ) from None


def stop(inv: Inventory, job: TrainJob) -> None:
    from clusterctl.remote.ssh import SshPool

    with SshPool(inv.settings) as pool:
        _stop(pool, list(job_inventory(inv, job).targets), job)


def dataset_examples(inv: Inventory, data: str) -> int | None:
    """The train split's example count from the dataset's dataset.json on the leader (`data tfrecords` writes
    it), for the cost estimate; None when it cannot be read."""
    import json

    from clusterctl.remote.ssh import SshPool

    with SshPool(inv.settings) as pool:
        r = pool.run_one(inv.targets[0], f"cat {shlex.quote(data)}/dataset.json", timeout=30)
    try:
        return int(json.loads(r.stdout)["splits"]["train"]["examples"]) if r.ok else None
    except (ValueError, KeyError, TypeError):
        return None
