"""`clusterctl train` as library calls: the options from the command line's flags (checked by TrainOptions,
as a playbook's train step is), the start with its preconditions (one ssh port, the S3 grant for
--checkpoint-to), the stop, and following the job to its end with what the run cost.

train/start.py starts the job, train/job.py stops and reads it; this module is the order those steps go in for one command.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping

from clusterctl.errors import UsageError
from clusterctl.remote import jobfolder
from clusterctl.workloads.train import cost as train_cost, job as train_job, start as train_start
from clusterctl.workloads.train.options import TrainOptions

if TYPE_CHECKING:
    from clusterctl.cluster.inventory import Inventory
    from clusterctl.state import StateStore


def precision_of(precision: str | None, fp32: bool, mixed: bool = False) -> str | None:
    """One precision from --precision and its synonyms --fp32 and --mixed-precision (None: the GPU type's)."""
    if fp32:
        if precision not in (None, "fp32"):
            raise UsageError(f"--fp32 and --precision {precision} say different things", "give one of them")
        precision = "fp32"
    if mixed:
        if precision is not None:
            raise UsageError("--mixed-precision and --precision/--fp32 say different things", "give one of them")
        precision = "mixed"
    return precision  # an unknown one is refused by TrainOptions/BenchOptions, as a playbook's is


def options(flags: Mapping[str, Any], checkpoint_to: str | None) -> TrainOptions:
    """TrainOptions from `train`'s training flags (TRAIN_FLAGS' names), checked whole; a source required."""
    given = dict(flags)
    precision = precision_of(given.pop("precision"), given.pop("fp32"))
    extra = tuple(given.pop("trainer_arg") or ())
    return TrainOptions(**given, precision=precision, checkpoint_to=checkpoint_to, extra=extra).require_source()


@dataclass(frozen=True)
class Started:
    job: train_job.TrainJob
    estimate: str  # what the run will cost, or how to measure it (train_cost.estimate_line)

    def line(self) -> str:
        j = self.job
        return (
            f"started training job {j.job}: {j.np} process(es), leader {j.leader} (tmux session "
            f"{j.job}); checkpoints in {j.model_dir}"
        )


def start(
    inv: Inventory,
    store: StateStore,
    opts: TrainOptions,
    *,
    np: int | None,
    python: str | None,
    force: bool,
    verify_data: bool,
    checkpoint_copy: bool,
    report: Callable[[str], None],
) -> Started:
    """Start the training job on the leader (train/start.py), once horovodrun can reach every host and the
    nodes may write to --checkpoint-to."""
    from clusterctl import providers

    inv.hosts.check_launchable()  # horovodrun takes one ssh port for every host
    if opts.checkpoint_to is not None and inv.cluster is not None:
        c = inv.cluster
        providers.get(c.provider, store=store, region=c.region or None, report=report).grant_checkpoint_write(
            c, opts.checkpoint_to
        )
    job = train_start.start(
        inv,
        store,
        opts,
        np=np,
        python=python,
        force=force,
        verify_data=verify_data,
        report=report,
        checkpoint_copy=checkpoint_copy,
    )
    return Started(job, train_cost.estimate_line(store, train_job.job_inventory(inv, job), job, opts))


def stop(inv: Inventory, store: StateStore) -> str:
    """Stop the cluster's training job on every node; its name."""
    job = train_job.require_job(store, inv)
    train_job.stop(inv, job)
    return job.job


@dataclass(frozen=True)
class Ended:
    code: int  # the job's exit status
    cost: str  # how long it took and what it cost (train_cost.run_line)


def follow(inv: Inventory, job: train_job.TrainJob, on_line: Callable[[str], None]) -> Ended:
    """Stream the job's log to its end."""
    from clusterctl.cluster import costs

    began = time.monotonic()
    code = jobfolder.follow(train_job.job_inventory(inv, job), job.job, on_line)
    return Ended(code, train_cost.run_line(time.monotonic() - began, costs.hourly(inv.cluster)))
