"""The training job on a cluster once started (train/start.py starts it): its record (TrainJob, train.json),
stop, evaluate, its log and status. Its log is read by train/log.py; TensorBoard is train/tensorboard.py."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from clusterctl.remote import nodepkg
from clusterctl.workloads.train.log import EvalResult, parse_eval, parse_train_log
from clusterctl.workloads.train.options import TrainOptions, trainer_argv
from clusterctl.workloads.train.status import TrainStatus, status

if TYPE_CHECKING:
    from clusterctl.cluster.inventory import Inventory
    from clusterctl.remote.ssh import SshPool
    from clusterctl.remote.targets import SshTarget
    from clusterctl.state import StateStore


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


def save_job(store: StateStore, inv: Inventory, job: TrainJob) -> None:
    from clusterctl.state import atomic_write

    path = _record_path(store, inv)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    atomic_write(path, job.to_json())


def is_running(pool: SshPool, leader: SshTarget, job: TrainJob) -> bool | None:
    """Whether the job's tmux session still lives on the leader (None: the leader did not answer)."""
    from clusterctl.remote import tmux as jobs

    r = pool.run_one(leader, jobs.alive_command(job.job), timeout=30)
    if r.exit_code is None:
        return None
    return r.stdout.strip() == "alive"


def end_launch(pool: SshPool, targets: Sequence[SshTarget], job: TrainJob) -> None:
    """End a launch everywhere: its tmux session and process tree on the leader, any rank left on any node."""
    from clusterctl.remote import jobfolder, tmux as jobs
    from clusterctl.workloads import launch

    leader = next((t for t in targets if t.label == job.leader), targets[0])
    pool.run_one(leader, jobs.kill_job_command(job.job), timeout=60)
    launch.kill_job(pool, targets, jobfolder.JobFolder(job.job, job.home))


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
        end_launch(pool, list(job_inventory(inv, job).targets), job)


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
