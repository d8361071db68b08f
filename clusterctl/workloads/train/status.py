"""Where a training job is, from its log read back (train/log.py): state, step, epoch, rate, loss, ETA, the
last checkpoint, the evaluation, an elastic run's latest change of size. Pure."""

from __future__ import annotations

from dataclasses import dataclass

from clusterctl.workloads.train.log import CheckpointSaved, EvalResult, TrainLog


@dataclass(frozen=True)
class TrainStatus:
    state: str  # starting | running | evaluating | finished | failed | stopped
    step: int
    stop_step: int
    total_steps: int
    epoch: float
    epochs: float
    img_per_sec: float | None  # recent rate, all processes
    loss: float | None
    total_loss: float | None
    lr: float | None
    elapsed_s: float  # this run, since its process started
    total_elapsed_s: float  # every run of the job in the log
    eta_s: float | None  # to the last step at the recent rate (evaluation not included)
    size: int
    restarts: int  # runs before the current one
    resumed_from_step: int | None
    last_checkpoint: CheckpointSaved | None
    result: EvalResult | None
    reason: str | None = None  # why it failed or stopped
    validation: EvalResult | None = None  # the latest --eval-every evaluation during training
    resized: str | None = None  # an elastic run's latest change of size (`world size 3 -> 2 (lost HOST)`)

    def cost_to_finish(self, dollars_per_hour: float) -> float | None:
        """What the remaining steps cost at the cluster's hourly price (None while unknown)."""
        return None if self.eta_s is None else dollars_per_hour * self.eta_s / 3600


def status(log: TrainLog, *, running: bool | None = None, recent: int = 5) -> TrainStatus:
    """Where the job is. `running` says whether its process still lives (the caller knows: tmux, ps);
    None when unknown, and then a run without an end counts as running. The rate is the mean of the
    last `recent` rows of the current run, leaving out its first row (graph tracing, not training)."""
    run = log.current
    if run is None or (run.start is None and run.eval is None and not run.rows and not run.errors and not run.failure):
        return TrainStatus(
            state="starting" if running is not False else "stopped",
            step=0,
            stop_step=0,
            total_steps=0,
            epoch=0.0,
            epochs=0.0,
            img_per_sec=None,
            loss=None,
            total_loss=None,
            lr=None,
            elapsed_s=0.0,
            total_elapsed_s=0.0,
            eta_s=None,
            size=0,
            restarts=0,
            resumed_from_step=None,
            last_checkpoint=None,
            result=None,
            reason=None if running is not False else "no training output",
        )
    start = run.start
    prior = [r for r in log.runs[:-1] if r.start is not None]
    start_step = start.start_step if start else 0
    stop_step = start.stop_step if start else 0
    total_steps = start.total_steps if start else 0
    spe = start.steps_per_epoch if start else 0
    last = run.rows[-1] if run.rows else None
    step = max([start_step] + [r.step for r in run.rows] + ([run.done.step] if run.done else []))
    if run.eval is not None and not start:
        step = run.eval.step
    epoch = step / spe if spe else (run.eval.epoch if run.eval else 0.0)
    timed = [r for r in run.rows if r.step > start_step + 1][-recent:]
    rate = sum(r.img_per_sec for r in timed) / len(timed) if timed else None
    eta = None
    if start and rate and rate > 0:
        eta = max(0, stop_step - step) * start.global_batch / rate
    elapsed = max([r.elapsed for r in run.rows] + ([run.done.elapsed] if run.done else []) + [0.0])
    before = sum(max([r.elapsed for r in p.rows] + ([p.done.elapsed] if p.done else []) + [0.0]) for p in prior)

    reason = None
    if run.errors:
        state = "failed"
        e = run.errors[-1].fields
        reason = e.get("kind", "error") + (f": {e['message']}" if e.get("message") else "")
    elif run.failure:
        state, reason = "failed", run.failure
    elif run.eval is not None:
        state = "finished"
    elif run.done is not None:
        no_eval = start is not None and start.fields.get("validation_files") == "0"
        state = "finished" if running is False or no_eval else "evaluating"
    elif running is False:
        state, reason = "stopped", "the process ended without finishing (killed?)"
    else:
        state = "running" if run.rows else "starting"
    if state in ("finished", "failed", "stopped"):
        eta = 0.0 if state == "finished" else None
    return TrainStatus(
        state=state,
        step=step,
        stop_step=stop_step,
        total_steps=total_steps,
        epoch=epoch,
        epochs=start.epochs if start else 0.0,
        img_per_sec=rate if rate is not None else (last.img_per_sec if last else None),
        loss=last.loss if last else None,
        total_loss=last.total_loss if last else None,
        lr=last.lr if last else None,
        elapsed_s=elapsed,
        total_elapsed_s=before + elapsed,
        eta_s=eta,
        size=run.resizes[-1].size if run.resizes else (start.size if start else 0),
        restarts=len(prior),
        resumed_from_step=run.resumed_from.step if run.resumed_from else None,
        last_checkpoint=run.checkpoints[-1] if run.checkpoints else (run.resumed_from if run.resumed_from else None),
        result=run.eval,
        reason=reason,
        validation=next((r.evals[-1] for r in reversed(log.runs) if r.evals), None),
        resized=run.resizes[-1].message if run.resizes else None,
    )
