"""The training job's lifecycle: the trainer's command line, and the job on a cluster (start on the
leader in tmux, the nodes it runs on, stop, evaluate, TensorBoard). The log it writes is read by
workloads/train_log.py."""

from __future__ import annotations

import contextlib
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from clusterctl.workloads.train_log import MARK, EvalResult, TrainStatus, parse_eval, parse_train_log, status

TEMPLATE = "train_imagenet.py"
COMPANION = "train_ckpt.py"  # the trainer imports it from its own folder: checkpoint manifests, copies, spot
SPOT_POLL_S = 5.0  # EC2 gives two minutes' notice; AWS suggests checking every 5 seconds


# ---- the command line ------------------------------------------------------------------------------
@dataclass(frozen=True)
class TrainOptions:
    """What `clusterctl train` passes to the trainer; None leaves the trainer's default."""

    data: str | None = None
    synthetic: bool = False
    model: str = "resnet50"
    epochs: float | None = None
    batch_size: int | None = None
    model_dir: str | None = None
    image_size: int | None = None
    max_steps: int | None = None
    base_lr: float | None = None
    warmup_epochs: float | None = None
    checkpoint_every: int | None = None
    keep_checkpoints: int | None = None
    log_every: int | None = None
    mixed_precision: bool = False
    precision: str | None = None  # auto | fp32 | float16 | bfloat16 | mixed (the trainer's default: auto)
    fp16_allreduce: bool = False
    recipe: str | None = None  # default | goyal
    eval_every: int | None = None  # epochs between evaluations during training
    fusion_threshold_mb: float | None = None  # Horovod's tensor fusion buffer (an environment variable, not a flag)
    cycle_time_ms: float | None = None  # Horovod's cycle time (likewise)
    xla: bool = False
    no_eval: bool = False
    eval_only: bool = False
    no_gpu: bool = False
    expect_size: int | None = None
    checkpoint_copy: str | None = None  # a second node (as the leader's ssh reaches it) keeping a copy
    checkpoint_to: str | None = None  # s3://bucket/prefix keeping a copy
    spot_poll: float | None = None  # seconds between polls of the spot interruption notice
    extra: tuple[str, ...] = ()  # more trainer flags, passed as they are


_VALUE_FLAGS = (
    ("data", "--data"),
    ("model", "--model"),
    ("epochs", "--epochs"),
    ("batch_size", "--batch-size"),
    ("model_dir", "--model-dir"),
    ("image_size", "--image-size"),
    ("max_steps", "--max-steps"),
    ("base_lr", "--base-lr"),
    ("warmup_epochs", "--warmup-epochs"),
    ("checkpoint_every", "--checkpoint-every"),
    ("precision", "--precision"),
    ("recipe", "--recipe"),
    ("eval_every", "--eval-every"),
    ("keep_checkpoints", "--keep-checkpoints"),
    ("log_every", "--log-every"),
    ("expect_size", "--expect-size"),
    ("checkpoint_copy", "--checkpoint-copy"),
    ("checkpoint_to", "--checkpoint-to"),
    ("spot_poll", "--spot-poll"),
)
_SWITCHES = (
    ("synthetic", "--synthetic"),
    ("mixed_precision", "--mixed-precision"),
    ("xla", "--xla"),
    ("no_eval", "--no-eval"),
    ("eval_only", "--eval-only"),
    ("no_gpu", "--no-gpu"),
    ("fp16_allreduce", "--fp16-allreduce"),
)
PRECISIONS = ("auto", "fp32", "float16", "bfloat16", "mixed")
RECIPES = ("default", "goyal")
# Horovod's tensor fusion buffer as its tensor-fusion docs give it (64 MB; 0.21+ builds default to 128 MB)
# and its cycle time (1 ms, its default since 0.21): set explicitly so every rank runs with the same.
FUSION_THRESHOLD_MB = 64.0
CYCLE_TIME_MS = 1.0


def horovod_env(opts: TrainOptions) -> dict[str, str]:
    """HOROVOD_FUSION_THRESHOLD (bytes) and HOROVOD_CYCLE_TIME (ms) for every rank."""
    mb = FUSION_THRESHOLD_MB if opts.fusion_threshold_mb is None else opts.fusion_threshold_mb
    ms = CYCLE_TIME_MS if opts.cycle_time_ms is None else opts.cycle_time_ms
    if mb < 0 or ms <= 0:
        raise ValueError("the fusion threshold must not be negative and the cycle time must be positive")
    return {"HOROVOD_FUSION_THRESHOLD": str(int(mb * 1024 * 1024)), "HOROVOD_CYCLE_TIME": f"{ms:g}"}


def check_s3_uri(uri: str) -> tuple[str, str]:
    """(bucket, prefix ending in /) of --checkpoint-to; UsageError for anything but s3://bucket/prefix."""
    from clusterctl.errors import UsageError

    m = re.fullmatch(r"s3://([a-z0-9][a-z0-9.\-]{1,61}[a-z0-9])(?:/([^*?\s]*))?", uri)
    if not m:
        raise UsageError(
            f"--checkpoint-to {uri!r} is not an S3 location", "give one like s3://my-bucket/checkpoints/run1"
        )
    prefix = (m.group(2) or "").strip("/")
    if not prefix:
        raise UsageError(
            f"--checkpoint-to {uri!r} needs a prefix (the nodes may write there only)",
            "give one like s3://my-bucket/checkpoints/run1",
        )
    return m.group(1), prefix + "/"


def trainer_argv(python: str, script: str, opts: TrainOptions) -> list[str]:
    """`python script --flag value ...` for templates/train_imagenet.py (an argv: quote it with shlex.join)."""
    if not opts.synthetic and not opts.data:
        raise ValueError("give a data folder or synthetic=True")
    if opts.model not in ("resnet50", "tiny"):
        raise ValueError(f"model must be resnet50 or tiny, not {opts.model!r}")
    if opts.precision is not None and opts.precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, not {opts.precision!r}")
    if opts.recipe is not None and opts.recipe not in RECIPES:
        raise ValueError(f"recipe must be one of {', '.join(RECIPES)}, not {opts.recipe!r}")
    argv = [python, script]
    for name, flag in _VALUE_FLAGS:
        value = getattr(opts, name)
        if value is None or (name == "data" and opts.synthetic):
            continue
        text = f"{value:g}" if isinstance(value, float) else str(value)
        if text.startswith("-") and name in ("data", "model_dir"):
            raise ValueError(f"{flag} {text!r}: a path may not start with '-'")
        argv += [flag, text]
    argv += [flag for name, flag in _SWITCHES if getattr(opts, name)]
    return argv + list(opts.extra)


# ---- the job on a cluster ----------------------------------------------------------------------------
# templates/train_imagenet.py runs under horovodrun on the leader (clusterctl.workloads.launch: a job folder at the
# same path on every node, a scrubbed environment, host keys checked), inside a tmux session there
# (clusterctl.remote.tmux: the log at ~/.clusterctl/jobs/JOB.log on the leader, its exit status beside it), so
# closing the laptop changes nothing. Checkpoints and TensorBoard logs go to the model folder on the
# leader (rank 0's disk), which stays the same from one launch to the next; every checkpoint is also
# copied to the same folder on the second node and, with --checkpoint-to, to S3 (templates/train_ckpt.py).
# A restart resumes from the newest complete one of those. clusterctl remembers the last launch locally
# (train.json) for logs / status / eval.

RECORD = "train.json"
MODEL_DIR = "clusterctl-train/model"  # under the leader's login home, unless --model-dir says otherwise
TENSORBOARD_SESSION = "clusterctl-tensorboard"


@dataclass(frozen=True)
class TrainJob:
    """The last training launch on a cluster, as clusterctl remembers it."""

    key: str  # the cluster's name (or hosts-<digest> for a plain hosts file)
    job: str  # launch job name = tmux session on the leader
    job_dir: str  # the job folder on every node (train_imagenet.py, hvd_launch.py, hosts)
    home: str  # the login home on the nodes
    leader: str  # the leader's label (hosts-file token)
    model_dir: str
    np: int
    python: str
    options: Mapping[str, object]  # TrainOptions as a dict (paths absolute on the nodes)
    started_at: float
    previous: tuple[str, ...] = ()  # earlier launches of this job (restarts), oldest first
    hosts: tuple[str, ...] = ()  # the nodes this launch runs on, leader first (labels; () in older records)

    @property
    def log_path(self) -> str:
        return f"{self.home}/.clusterctl/jobs/{self.job}.log"

    def train_options(self) -> TrainOptions:
        opts: dict[str, Any] = dict(self.options)
        opts["extra"] = tuple(opts.get("extra", ()))
        return TrainOptions(**opts)

    def to_json(self) -> str:
        import dataclasses
        import json

        d = dataclasses.asdict(self)
        d["previous"] = list(self.previous)
        d["hosts"] = list(self.hosts)
        return json.dumps(d, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> "TrainJob":
        import json

        d = json.loads(text)
        d["previous"] = tuple(d.get("previous", ()))
        d["hosts"] = tuple(d.get("hosts", ()))
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


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


def data_check_command(data_dir: str) -> str:
    """Prints `shards TRAIN VALIDATION` then the sync completion marker (one JSON line) or `unverified`."""
    q = shlex.quote(data_dir)
    return (
        f"cd {q} 2>/dev/null || {{ echo missing; exit 0; }}; "
        't=0; v=0; for f in train-*; do [ -f "$f" ] && t=$((t+1)); done; '
        'for f in validation-*; do [ -f "$f" ] && v=$((v+1)); done; echo "shards $t $v"; '
        "cat .clusterctl-sync/COMPLETE 2>/dev/null || echo unverified"
    )


def data_problems(outputs: Mapping[str, str | None]) -> list[str]:
    """What is wrong with the data on the nodes, from each node's data_check_command output (None: the
    node could not be asked). Every node needs shards and a completion marker, all of the same manifest."""
    import json

    problems, digests = [], {}
    for host, out in outputs.items():
        if out is None:
            problems.append(f"{host}: could not check (unreachable)")
            continue
        lines = out.strip().splitlines()
        if not lines or lines[0] == "missing":
            problems.append(f"{host}: no such folder")
            continue
        parts = lines[0].split()
        if len(parts) != 3 or parts[0] != "shards" or parts[1] == "0":
            problems.append(f"{host}: no train-* shards")
            continue
        if len(lines) < 2 or lines[1] == "unverified":
            problems.append(f"{host}: not verified by `clusterctl sync` (no completion marker)")
            continue
        try:
            digests[host] = json.loads(lines[1])["manifest_sha256"]
        except (ValueError, KeyError, TypeError):
            problems.append(f"{host}: unreadable completion marker")
    if len(set(digests.values())) > 1:
        first = next(iter(digests.values()))
        odd = [h for h, d in digests.items() if d != first]
        problems.append(f"{', '.join(odd)}: a different dataset than {next(iter(digests))} (another manifest)")
    return problems


@dataclass(frozen=True)
class NodeChoice:
    """The nodes a launch runs on (indices into the hosts, leader first) and those left out, with why."""

    keep: tuple[int, ...]
    left_out: tuple[tuple[int, str], ...] = ()


def choose_nodes(
    labels: tuple[str, ...] | list[str],
    errors: list[str | None] | tuple[str | None, ...],
    *,
    spot: bool,
    np_given: bool,
) -> NodeChoice:
    """Which nodes to train on, from one probe of each (errors[i]: None when node i answered, else why not).
    On a spot cluster without --np, the unreachable nodes are left out (an interrupted instance is gone) and
    the first reachable one leads. Anywhere else an unreachable node is an error (UnreachableError): the
    job was asked for every node, and running on fewer would change it silently."""
    from clusterctl.errors import UnreachableError

    if len(labels) != len(errors):
        raise ValueError("one probe result per node")
    gone = tuple((i, e) for i, e in enumerate(errors) if e is not None)
    keep = tuple(i for i, e in enumerate(errors) if e is None)
    if not gone:
        return NodeChoice(keep)
    named = "; ".join(f"{labels[i]}: {e}" for i, e in gone)
    if not keep:
        raise UnreachableError(
            f"no node of the cluster answered ({named})",
            "check that the nodes run (`clusterctl status`), then run the same command again",
        )
    if not spot:
        raise UnreachableError(
            f"{len(gone)} of {len(labels)} node(s) did not answer ({named})",
            "bring them back (`clusterctl status`, `clusterctl doctor`), or train on the others "
            "with a hosts file that leaves them out",
        )
    if np_given:
        raise UnreachableError(
            f"{len(gone)} of {len(labels)} spot node(s) did not answer ({named}) and --np "
            "asks for a fixed number of processes",
            "run the same command without --np: it trains on the nodes that answer",
        )
    return NodeChoice(keep, gone)


def left_out_line(labels, choice: NodeChoice) -> str:
    """One line for the operator: which nodes a spot launch leaves out, why, and who leads."""
    out = ", ".join(f"{labels[i]} ({' '.join(e.split())[:120]})" for i, e in choice.left_out)
    return (
        f"spot cluster: left out {out}, unreachable (an interrupted instance?); training on "
        f"{len(choice.keep)} of {len(labels)} node(s), leader {labels[choice.keep[0]]}"
    )


def keep_nodes(inv, keep: tuple[int, ...]):
    """The inventory with the nodes at these indices only (in the hosts' order)."""
    from clusterctl.cluster import inventory

    return inventory.subset(inv, [inv.hosts.entries[i].host for i in keep])


def job_inventory(inv, job: "TrainJob"):
    """The inventory of the nodes the job runs on, its leader first: after a spot node was left out, the
    leader may be another node than the hosts' first."""
    labels = {t.label for t in inv.targets}
    if not job.hosts or not set(job.hosts) <= labels:
        return inv
    from clusterctl.cluster import inventory

    return inventory.subset(inv, job.hosts)


PROBE_TIMEOUT_S = 30.0


def _record_path(store, inv) -> Path:
    import hashlib
    from pathlib import Path

    if inv.cluster is not None:
        return Path(store.cluster_dir(inv.cluster.name)) / RECORD
    digest = hashlib.sha256(inv.hosts.render().encode()).hexdigest()[:12]
    return Path(store.root) / "train" / f"hosts-{digest}.json"


def load_job(store, inv) -> TrainJob | None:
    path = _record_path(store, inv)
    try:
        return TrainJob.from_json(path.read_text())
    except FileNotFoundError:
        return None


def require_job(store, inv) -> TrainJob:
    from clusterctl.errors import ConfigError

    job = load_job(store, inv)
    if job is None:
        where = inv.cluster.name if inv.cluster is not None else "these hosts"
        raise ConfigError(f"no training job on {where}", "start one with `clusterctl train --data DIR`")
    return job


def _save_job(store, inv, job: TrainJob) -> None:
    from clusterctl.state import atomic_write

    path = _record_path(store, inv)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    atomic_write(path, job.to_json())


GPU_CHECK_TIMEOUT_S = 900.0  # TensorFlow loading CUDA on a fresh GPU node can take minutes


def wait_for_devices(
    pool, leader, job_name: str, np: int, gpus: int, timeout: float = GPU_CHECK_TIMEOUT_S, poll: float = 2.0
) -> list[str] | None:
    """Read the job's log on the leader until every rank said which GPU it has; then the problems
    (horovod.device_problems: [] when each rank has a GPU of its own). None when the job ended first or
    `timeout` passed: nothing proven either way (`status` and the log say why it ended)."""
    import time as _time

    from clusterctl.remote import tmux as jobs
    from clusterctl.workloads import horovod

    n = jobs.validate_job_name(job_name)
    cmd = f'head -c 4000000 "{jobs.JOBS_DIR}/{n}.log" 2>/dev/null; echo; {_alive_command(n)}'
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


def _alive_command(session: str) -> str:
    return f"tmux has-session -t {shlex.quote('=' + session)} 2>/dev/null && echo alive || echo gone"


def is_running(pool, leader, job: TrainJob) -> bool | None:
    """Whether the job's tmux session still lives on the leader (None: the leader did not answer)."""
    r = pool.run_one(leader, _alive_command(job.job), timeout=30)
    if r.exit_code is None:
        return None
    return r.stdout.strip() == "alive"


def _stop(pool, targets, job: TrainJob) -> None:
    """End a launch everywhere: its tmux session and process tree on the leader, any rank left on any node."""
    from clusterctl.remote import tmux as jobs
    from clusterctl.workloads import launch

    leader = next((t for t in targets if t.label == job.leader), targets[0])
    pool.run_one(leader, jobs.kill_job_command(job.job), timeout=60)
    launch.kill_job(pool, targets, launch.JobFolder(job.job, job.home))


def start(
    inv,
    store,
    opts: TrainOptions,
    *,
    np: int | None = None,
    python: str | None = None,
    force: bool = False,
    verify_data: bool = True,
    report=lambda _m: None,
    gpu_check_timeout: float = GPU_CHECK_TIMEOUT_S,
    checkpoint_copy: bool = True,
) -> TrainJob:
    """Launch the trainer on the cluster and return (the job runs in tmux on the leader). On a cluster
    whose type has GPUs, first wait until every rank said which GPU it computes on: a rank on the CPU or
    two ranks on one GPU stop the job and raise RemoteCommandError. With checkpoint_copy, the second
    node of the hosts keeps a copy of every checkpoint; on spot nodes the trainer polls the interruption
    notice."""
    import time as _time
    from dataclasses import asdict, replace

    from clusterctl import resources
    from clusterctl.errors import ConfigError, RemoteCommandError, UnreachableError, UsageError
    from clusterctl.remote import tmux as jobs
    from clusterctl.remote.ssh import SshPool
    from clusterctl.workloads import horovod, launch

    total = inv.hosts.total_slots
    if np is not None and not 1 <= np <= total:
        raise UsageError(f"--np {np}: the hosts have {total} slot(s)")
    spot = inv.cluster is not None and inv.cluster.extra.get("spot") == "true"
    python = python or launch.node_python(inv.cluster)
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
        job = launch.new_job(pool, leader, "train")
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
        opts = replace(opts, data=data, model_dir=model_dir, expect_size=np)
        if checkpoint_copy and opts.checkpoint_copy is None and len(inv.hosts.entries) > 1:
            opts = replace(opts, checkpoint_copy=inv.hosts.entries[1].host)
        if opts.spot_poll is None and inv.cluster is not None and inv.cluster.extra.get("spot") == "true":
            opts = replace(opts, spot_poll=SPOT_POLL_S)
        script = f"{job.dir}/{TEMPLATE}"
        report(f"staging {TEMPLATE} in {job.dir} on {len(targets)} node(s)")
        launch.stage(
            pool,
            targets,
            job,
            {TEMPLATE: resources.template_bytes(TEMPLATE), COMPANION: resources.template_bytes(COMPANION)},
            hosts,
        )
        env = {**launch.job_env(inv.cluster, python), **horovod_env(opts)}
        cmd = launch.leader_command(job, np, trainer_argv(python, script, opts), python, env)
        r = pool.run_one(
            leader, f"mkdir -p {shlex.quote(model_dir)} && " + jobs.detach_command(job.name, cmd), timeout=60
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
            options={**asdict(opts), "extra": list(opts.extra)},
            started_at=_time.time(),
            previous=earlier[-20:],
            hosts=tuple(t.label for t in targets),
        )
        _save_job(store, inv, record)
        gpus = horovod.gpus_per_node(inv.cluster)
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


def history_command(job: TrainJob, launches: int = 10) -> str:
    """Print the logs of the job's last `launches` launches (restarts first, the current one last)."""
    from clusterctl.remote import tmux as jobs

    names = [jobs.validate_job_name(n) for n in (*job.previous, job.job)][-launches:]
    # a newline after each earlier log (a killed job may have stopped mid-line), none after the live one
    earlier = "".join(f'cat "{jobs.JOBS_DIR}/{n}.log" 2>/dev/null && echo; ' for n in names[:-1])
    return earlier + f'cat "{jobs.JOBS_DIR}/{names[-1]}.log" 2>/dev/null; true'


def read_log(inv, job: TrainJob) -> tuple[str, bool | None]:
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
        return r.stdout, is_running(pool, leader, job)


def job_status(inv, job: TrainJob) -> TrainStatus:
    text, running = read_log(inv, job)
    return status(parse_train_log(text, strict=False), running=running)


def evaluate(inv, job: TrainJob, on_line=None, timeout: float | None = None) -> EvalResult:
    """--eval-only of the latest checkpoint, on the leader alone (GPUs hidden while the job trains)."""
    from dataclasses import replace

    from clusterctl import resources
    from clusterctl.errors import RemoteCommandError, UnreachableError
    from clusterctl.remote.ssh import SshPool
    from clusterctl.workloads import launch

    opts = replace(job.train_options(), eval_only=True, expect_size=None, no_eval=False)
    script = f"{job.job_dir}/{TEMPLATE}"
    inv = job_inventory(inv, job)
    with SshPool(inv.settings) as pool:
        leader = inv.targets[0]
        running = is_running(pool, leader, job)
        if running:
            opts = replace(opts, no_gpu=True)
        put = pool.put(
            [leader],
            {
                script: (resources.template_bytes(TEMPLATE), 0o644),
                f"{job.job_dir}/{COMPANION}": (resources.template_bytes(COMPANION), 0o644),
            },
        )
        if not put.all_ok:
            raise UnreachableError(f"cannot copy {TEMPLATE} to the leader {leader.label}")
        env = {**launch.job_env(inv.cluster, job.python)}
        if running:
            env["CUDA_VISIBLE_DEVICES"] = ""
        path = f"{job.python.rsplit('/', 1)[0]}:{launch.BASE_PATH}"
        assigns = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        cmd = (
            f'cd {shlex.quote(job.job_dir)} && exec env -i HOME="$HOME" USER="$(id -un)" LANG=C.UTF-8 '
            f"PATH={shlex.quote(path)} {assigns} {shlex.join(trainer_argv(job.python, script, opts))} 2>&1"
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


def stop(inv, job: TrainJob) -> None:
    from clusterctl.remote.ssh import SshPool

    with SshPool(inv.settings) as pool:
        _stop(pool, list(job_inventory(inv, job).targets), job)


def tensorboard_command(job: TrainJob, port: int) -> str:
    """TensorBoard on the leader, bound to 127.0.0.1 only (reached through an ssh tunnel, never a port)."""
    logdir = f"{job.model_dir}/tensorboard"
    return (
        f'exec env -i HOME="$HOME" LANG=C.UTF-8 PATH={shlex.quote(job.python.rsplit("/", 1)[0] + ":" + "/usr/bin:/bin")} '
        f"{shlex.quote(job.python)} -m tensorboard.main --logdir {shlex.quote(logdir)} --host 127.0.0.1 "
        f"--port {int(port)} 2>&1"
    )


@contextlib.contextmanager
def tensorboard_tunnel(inv, job: TrainJob, local_port: int, remote_port: int = 6006, wait_s: float = 120.0):
    """TensorBoard on the leader (tmux session clusterctl-tensorboard, 127.0.0.1 only; an existing one is
    reused) reached through an ssh tunnel 127.0.0.1:local_port -> leader's 127.0.0.1:remote_port, host key
    checked. Yields the tunnel process (subprocess.Popen). However the block is left (a failure while
    opening, Ctrl-C at any moment, the tunnel ending), the tunnel and the session are both stopped: a Ctrl-C
    that landed between starting TensorBoard and returning the tunnel once left both running."""
    _require_free(local_port)  # else the tunnel's readiness check would talk to whatever listens there
    inv = job_inventory(inv, job)
    tunnel = None
    try:
        _start_tensorboard(inv, job, remote_port, wait_s)
        tunnel = _open_tunnel(inv, local_port, remote_port)
        yield tunnel
    finally:
        _close_tensorboard(inv, tunnel)


def _require_free(port: int) -> None:
    import socket

    from clusterctl.errors import ConfigError

    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError as exc:
            raise ConfigError(
                f"local port {port} is not free on this machine ({exc.strerror})", "pick another with --port"
            ) from None


def _start_tensorboard(inv, job: TrainJob, remote_port: int, wait_s: float) -> None:
    import time as _time

    from clusterctl.errors import RemoteCommandError
    from clusterctl.remote import tmux as jobs
    from clusterctl.remote.ssh import SshPool

    leader = inv.targets[0]
    with SshPool(inv.settings) as pool:
        r = pool.run_one(
            leader, jobs.detach_command(TENSORBOARD_SESSION, tensorboard_command(job, remote_port)), timeout=60
        )
        if r.exit_code not in (0, 3):  # 3: already running, reuse it
            raise RemoteCommandError(
                f"could not start TensorBoard on {leader.label}: {(r.error or r.stderr or r.stdout).strip()[-300:]}"
            )
        probe = (
            f'{shlex.quote(job.python)} -c \'import socket,sys; socket.create_connection(("127.0.0.1", '
            f"{int(remote_port)}), 2)' 2>/dev/null"
        )
        deadline = _time.monotonic() + wait_s
        alive = _alive_command(TENSORBOARD_SESSION)
        while True:
            if pool.run_one(leader, probe, timeout=30).exit_code == 0:
                return
            gone = pool.run_one(leader, alive, timeout=30).stdout.strip() == "gone"
            if gone or _time.monotonic() > deadline:
                log = pool.run_one(leader, jobs.logs_command(TENSORBOARD_SESSION), timeout=30).stdout
                why = "exited" if gone else f"did not answer within {wait_s:.0f}s"
                raise RemoteCommandError(
                    f"TensorBoard {why} on {leader.label}", log.strip().splitlines()[-1][:300] if log.strip() else None
                )
            _time.sleep(1)


def _open_tunnel(inv, local_port: int, remote_port: int):
    import socket
    import subprocess
    import time as _time

    from clusterctl.errors import UnreachableError
    from clusterctl.remote import openssh

    leader = inv.targets[0]
    argv = openssh.operator_ssh(leader, inv.settings.known_hosts, inv.cluster is not None)
    argv += [
        "-N",
        "-o",
        "ExitOnForwardFailure=yes",
        "-L",
        f"127.0.0.1:{int(local_port)}:127.0.0.1:{int(remote_port)}",
        leader.hostname,
    ]
    tunnel = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = _time.monotonic() + 30
        while _time.monotonic() < deadline:
            if tunnel.poll() is not None:
                why = tunnel.stderr.read().strip()[-300:] if tunnel.stderr is not None else ""
                raise UnreachableError(f"the ssh tunnel to {leader.label} failed: {why}")
            try:
                socket.create_connection(("127.0.0.1", local_port), 1).close()
                return tunnel
            except OSError:
                _time.sleep(0.2)
        raise UnreachableError(f"the ssh tunnel to {leader.label} did not open local port {local_port}")
    except BaseException:
        _end(tunnel)
        raise


def _end(tunnel) -> None:
    if tunnel.poll() is None:
        tunnel.terminate()
        try:
            tunnel.wait(5)
        except Exception:
            tunnel.kill()
            tunnel.wait()


def _close_tensorboard(inv, tunnel) -> None:
    from clusterctl.errors import RemoteCommandError
    from clusterctl.remote import tmux as jobs
    from clusterctl.remote.ssh import SshPool

    if tunnel is not None:
        _end(tunnel)
    with SshPool(inv.settings) as pool:
        r = pool.run_one(inv.targets[0], jobs.kill_job_command(TENSORBOARD_SESSION, 2.0), timeout=60)
    if not r.ok:  # never leave it running silently
        raise RemoteCommandError(
            f"TensorBoard may still run on {inv.targets[0].label}: {(r.error or r.stderr or r.stdout).strip()[-200:]}",
            f"stop it: clusterctl kill {TENSORBOARD_SESSION}",
        )


def dataset_examples(inv, data: str) -> int | None:
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
