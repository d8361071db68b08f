"""A sweep's results from its typed state (workloads/sweep/state.py), pure but for the files: trials ranked by
the goal, the table's rows, one line per change (output that is not a terminal), the summary line,
results.json and metric_vs_params.png in sweep-results/<time>/.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Sequence

from clusterctl.workloads.sweep.state import FINAL, SweepState, TrialState


def ranked(state: SweepState, goal: str) -> list[TrialState]:
    """Trials best first: done with a metric (by the goal), then the rest by id."""
    scored = [t for t in state.trials if t.done_with_metric]
    scored.sort(key=lambda t: (-(t.metric or 0.0) if goal == "max" else (t.metric or 0.0), t.id))
    rest = sorted((t for t in state.trials if not t.done_with_metric), key=lambda t: t.id)
    return scored + rest


def best(state: SweepState, goal: str) -> TrialState | None:
    r = ranked(state, goal)
    return r[0] if r and r[0].done_with_metric else None


def rows(
    state: SweepState, params: Sequence[str], goal: str, sort: bool, now: float | None = None
) -> list[dict[str, Any]]:
    """Table rows (strings) for display: trial, each parameter, node/gpu, state, elapsed, metric. A running
    trial's elapsed time is reckoned to the state's last update (the cluster's clocks, not this machine's)."""
    now = (state.updated or time.time()) if now is None else now
    trials = ranked(state, goal) if sort else sorted(state.trials, key=lambda t: t.id)
    top = best(state, goal)
    out: list[dict[str, Any]] = []  # one display row: strings, the parameters' list, `best`
    for t in trials:
        secs = t.elapsed(now)
        note = t.error or ""
        if t.requeued and t.state != "lost":
            note = (note + "; " if note else "") + "re-run after its node died"
        out.append(
            {
                "trial": str(t.id),
                "params": [t.params.get(p, "") for p in params],
                "node": t.where(),
                "state": t.state,
                "elapsed": "-" if secs is None else f"{secs:.1f}s",
                "metric": "-" if t.metric is None else f"{t.metric:.6g}",
                "best": top is not None and t.id == top.id,
                "note": note,
            }
        )
    return out


def events(prev: SweepState | None, cur: SweepState, metric_name: str = "metric") -> list[str]:
    """One line per change between two states (for output that is not a terminal)."""
    lines = []
    was_alive = {n.host: n.alive for n in (prev.nodes if prev else ())}
    for n in cur.nodes:
        if not n.alive and was_alive.get(n.host, True):
            lines.append(f"node {n.host} is dead ({n.why or 'no answer'}); its running trials are re-queued")
    old = {t.id: t for t in (prev.trials if prev else ())}
    for t in cur.trials:
        o = old.get(t.id)
        params = t.params_text()
        if t.requeued > (o.requeued if o else 0):
            died = [a.node for a in t.attempts if a.outcome == "node died"]
            lines.append(f"trial {t.id} ({params}) re-queued: its node {died[-1] if died else '?'} died")
        if len(t.attempts) > (len(o.attempts) if o else 0) and t.state in ("running", *FINAL):
            lines.append(f"trial {t.id} ({params}) started on {t.where()}")
        if t.state in FINAL and (o is None or o.state not in FINAL):
            secs = t.elapsed(time.time())
            what = f"{metric_name} {t.metric:.6g}" if t.metric is not None else (t.error or "no metric")
            took = f" after {secs:.1f}s" if secs is not None else ""
            lines.append(f"trial {t.id} {t.state}{took}: {what}")
    return lines


def summary(state: SweepState) -> str:
    """'sweep ID running: 3 done, 1 running; dead node(s): ...' (status lines and the watch's footer)."""
    counts: dict[str, int] = {}
    for t in state.trials:
        counts[t.state] = counts.get(t.state, 0) + 1
    dead = [n.host for n in state.nodes if not n.alive]
    text = f"sweep {state.id} {state.status}: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
    return text + (f"; dead node(s): {', '.join(dead)}" if dead else "")


def results_dir(root: Path) -> Path:
    base = root / time.strftime("%Y%m%d-%H%M%S")
    path, i = base, 1
    while path.exists():
        i += 1
        path = base.with_name(f"{base.name}-{i}")
    path.mkdir(parents=True)
    return path


def write_results(out_dir: Path, state: SweepState, cluster: str | None) -> Path:
    """results.json: the cluster, how the sweep was set up (its meta), then its outcome, trials best first."""
    goal = state.meta.goal
    top = best(state, goal)
    doc = {
        "cluster": cluster,
        **state.meta.to_dict(),
        "id": state.id,
        "status": state.status,
        "started": state.started,
        "ended": state.ended,
        "best": None if top is None else top.to_dict(),
        "nodes": [n.to_dict() for n in state.nodes],
        "trials": [t.to_dict() for t in ranked(state, goal)],
    }
    path = out_dir / "results.json"
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return path


def _numeric(values: Sequence[str]) -> list[float] | None:
    try:
        return [float(v) for v in values]
    except ValueError:
        return None


def plot(state: SweepState, path: Path) -> bool:
    """The metric against each parameter, one panel per parameter, best trial starred (headless), scales from
    the state's meta. False when no trial has a metric (nothing to plot)."""
    done = [t for t in state.trials if t.done_with_metric]
    params, metric_name, goal = state.params, state.meta.metric, state.meta.goal
    if not done or not params:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    top = best(state, goal)
    fig, axes = plt.subplots(1, len(params), figsize=(4.2 * len(params), 3.6), dpi=100, squeeze=False)
    for ax, p in zip(axes[0], params):
        raw = [t.params.get(p, "") for t in done]
        ys = [t.metric for t in done]
        xs = _numeric(raw)
        if xs is None:  # categories, in first-seen order
            cats = list(dict.fromkeys(raw))
            xs = [cats.index(v) for v in raw]
            ax.set_xticks(range(len(cats)))
            ax.set_xticklabels(cats, rotation=30)
        elif p in state.meta.log_scale or (min(xs) > 0 and max(xs) / min(xs) >= 100):
            ax.set_xscale("log")
        ax.scatter(xs, ys, color="tab:blue", alpha=0.8, label="trials")
        if top is not None:
            i = done.index(top)
            ax.scatter(
                [xs[i]], [ys[i]], marker="*", s=220, color="tab:orange", zorder=3, label=f"best (trial {top.id})"
            )
        ax.set_xlabel(p)
        ax.set_ylabel(metric_name)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"{state.id}: {metric_name} ({goal}) against each parameter", fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True
