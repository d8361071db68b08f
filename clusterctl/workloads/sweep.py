"""`clusterctl sweep`: many independent experiments at once, one per GPU, across the cluster.

    trials (pure: grid product or random samples, command template)  ->  stage config + scheduler on the
    leader, user files on every node  ->  templates/sweep_scheduler.py detached in tmux on the leader
    (state in ~/clusterctl-sweeps/ID/state.json there)  ->  the CLI reads that state over ssh (live table,
    --status, --attach), asks for --cancel, and at the end writes sweep-results/<time>/ here: results.json,
    the trials' logs, and metric_vs_params.png.

The scheduler needs nothing of clusterctl on the leader: it is a standalone stdlib script that ssh-es
from the leader to each node with the cluster's internal key and pinned known_hosts (StrictHostKeyChecking
=yes, BatchMode), as horovodrun does. See its docstring for the files on the nodes.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import random
import re
import secrets
import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

from clusterctl import resources
from clusterctl.errors import ClusterctlError, ConfigError, RemoteCommandError, UnreachableError, UsageError
from clusterctl.remote import tmux as jobs
from clusterctl.workloads import launch

SWEEPS = "clusterctl-sweeps"  # under the login home of every node
SCHEDULER = "sweep_scheduler.py"
RESERVED = ("python", "trial")  # placeholders clusterctl fills in itself
ENDED = ("done", "cancelled", "failed")
FINAL = ("done", "failed", "lost", "cancelled")
MARK = "\x1e"
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ID = re.compile(r"^sweep-[0-9]{8}-[0-9]{6}-[0-9a-f]{4}$")
_PLACEHOLDER = re.compile(r"(?<!\$)\{([A-Za-z_][A-Za-z0-9_]*)\}")  # {lr}; ${HOME} stays the shell's
SSH = (
    "ssh",
    "-o",
    "BatchMode=yes",
    "-o",
    "StrictHostKeyChecking=yes",
    "-o",
    "ConnectTimeout=5",
    "-o",
    "ServerAliveInterval=5",
    "-o",
    "ServerAliveCountMax=2",
    "-o",
    "LogLevel=ERROR",
)


# ---- trials (pure) -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Range:
    low: float
    high: float
    scale: str = "linear"  # linear | log | int

    def sample(self, rng: random.Random) -> str:
        if self.scale == "int":
            return str(rng.randint(int(self.low), int(self.high)))
        if self.scale == "log":
            return _fmt(math.exp(rng.uniform(math.log(self.low), math.log(self.high))))
        return _fmt(rng.uniform(self.low, self.high))


def _fmt(value: float) -> str:
    return f"{value:.4g}"


def _check_name(name: str, flag: str) -> str:
    if not _NAME.match(name):
        raise UsageError(f"{flag}: parameter name {name!r} is not a name", "use letters, digits and '_', e.g. lr")
    if name in RESERVED:
        raise UsageError(f"{flag}: {{{name}}} is filled in by clusterctl", "give the parameter another name")
    return name


def parse_grid(items: Sequence[str]) -> dict[str, list[str]]:
    """--grid lr=0.1,0.01 (repeatable) -> {"lr": ["0.1", "0.01"]}, in the order given."""
    grid: dict[str, list[str]] = {}
    for item in items:
        name, sep, values = item.partition("=")
        if not sep:
            raise UsageError(f"--grid takes NAME=V1,V2,..., not {item!r}")
        _check_name(name.strip(), "--grid")
        vals = [v.strip() for v in values.split(",")]
        if not values.strip() or any(v == "" for v in vals):
            raise UsageError(f"--grid {name}: empty value in {values!r}")
        if len(set(vals)) != len(vals):
            raise UsageError(f"--grid {name}: a value is listed twice in {values!r}")
        if name.strip() in grid:
            raise UsageError(f"--grid {name} is given twice", "list every value in one --grid")
        grid[name.strip()] = vals
    return grid


def parse_ranges(items: Sequence[str]) -> dict[str, Range]:
    """--range lr=1e-4:1e-1:log, --range batch=16:128:int, --range dropout=0.1:0.5 (uniform)."""
    ranges: dict[str, Range] = {}
    for item in items:
        name, sep, spec = item.partition("=")
        parts = spec.split(":")
        if not sep or len(parts) not in (2, 3):
            raise UsageError(f"--range takes NAME=LOW:HIGH[:log|int], not {item!r}")
        name = _check_name(name.strip(), "--range")
        scale = parts[2].strip() if len(parts) == 3 else "linear"
        if scale not in ("linear", "log", "int"):
            raise UsageError(f"--range {name}: scale {scale!r} is not linear, log or int")
        try:
            low, high = float(parts[0]), float(parts[1])
        except ValueError:
            raise UsageError(f"--range {name}: {parts[0]!r}:{parts[1]!r} are not numbers") from None
        if not (math.isfinite(low) and math.isfinite(high)) or low >= high:
            raise UsageError(f"--range {name}: LOW must be below HIGH, not {spec!r}")
        if scale == "log" and low <= 0:
            raise UsageError(f"--range {name}: a log range must be above 0, not {spec!r}")
        if scale == "int" and (low != int(low) or high != int(high)):
            raise UsageError(f"--range {name}: an int range takes whole numbers, not {spec!r}")
        if name in ranges:
            raise UsageError(f"--range {name} is given twice")
        ranges[name] = Range(low, high, scale)
    return ranges


def expand(
    grid: Mapping[str, Sequence[str]],
    ranges: Mapping[str, Range] | None = None,
    random_k: int | None = None,
    seed: int = 0,
) -> list[dict[str, str]]:
    """Every combination of the grid (the first --grid varies slowest); with `random_k`, that many samples
    instead: each range drawn uniformly (log-uniform, whole numbers), each grid parameter picked at random."""
    ranges = dict(ranges or {})
    both = set(grid) & set(ranges)
    if both:
        raise UsageError(f"{', '.join(sorted(both))} given both as --grid and --range")
    if random_k is None:
        if ranges:
            raise UsageError("--range needs --random K (how many samples to draw)")
        if not grid:
            raise UsageError("nothing to sweep", "give --grid NAME=V1,V2 (repeatable) or --random K with --range")
        names = list(grid)
        return [dict(zip(names, combo)) for combo in itertools.product(*(grid[n] for n in names))]
    if random_k < 1:
        raise UsageError(f"--random must be at least 1, not {random_k}")
    if not grid and not ranges:
        raise UsageError("--random K samples from --range (and --grid) parameters; none given")
    rng = random.Random(seed)
    names = list(grid) + list(ranges)
    return [
        {n: (rng.choice(list(grid[n])) if n in grid else ranges[n].sample(rng)) for n in names} for _ in range(random_k)
    ]


def placeholders(template: Sequence[str]) -> list[str]:
    seen: list[str] = []
    for part in template:
        for name in _PLACEHOLDER.findall(part):
            if name not in seen:
                seen.append(name)
    return seen


def render_command(template: Sequence[str], values: Mapping[str, str]) -> str:
    """The shell command of one trial. Several words (`-- python train.py --lr {lr}`): each word filled in,
    then quoted for the shell. One word (`-- 'python t.py --lr {lr} | tee out'`): shell text, with each
    value quoted where it goes."""

    def fill(text: str, quote: bool) -> str:
        def sub(m: re.Match) -> str:
            value = str(values[m.group(1)])
            return shlex.quote(value) if quote else value

        return _PLACEHOLDER.sub(sub, text)

    if len(template) == 1:
        return fill(template[0], True)
    return shlex.join(fill(word, False) for word in template)


@dataclass(frozen=True)
class Trial:
    id: int
    params: dict
    command: str


def check_model_dir(template: Sequence[str]) -> None:
    """Trials run at the same time in one folder: the shipped trainer's --model-dir must differ per trial
    ({trial} in it), or be left out (the trainer then uses train_out/<sweep>/trial-<N>). A shared one would
    let trials overwrite and resume each other's checkpoints."""
    words = shlex.split(template[0]) if len(template) == 1 else list(template)
    if not any("train_imagenet" in w for w in words):
        return
    for i, w in enumerate(words):
        value = (
            w.split("=", 1)[1]
            if w.startswith("--model-dir=")
            else (words[i + 1] if w == "--model-dir" and i + 1 < len(words) else None)
        )
        if value is not None and "{trial}" not in value:
            raise UsageError(
                f"--model-dir {value!r} would be shared by every trial (they would resume each other's checkpoints)",
                "put {trial} in it (--model-dir run{trial}) or leave it out",
            )


def build_trials(template: Sequence[str], combos: Sequence[Mapping[str, str]], python: str) -> list[Trial]:
    if not template or not "".join(template).strip():
        raise UsageError(
            "no command to sweep", "put it after --: clusterctl sweep --grid lr=0.1,0.01 -- python train.py --lr {lr}"
        )
    try:
        check_model_dir(template)
    except ValueError:
        pass  # shell text shlex cannot split: the shell will say
    names = list(combos[0]) if combos else []
    unknown = [p for p in placeholders(template) if p not in names and p not in RESERVED]
    if unknown:
        raise UsageError(
            f"the command uses {', '.join('{' + u + '}' for u in unknown)}, which no --grid or --range defines",
            f"parameters: {', '.join(names) or 'none'}; also {{python}} and {{trial}}",
        )
    trials = []
    for i, combo in enumerate(combos, start=1):
        values = dict(combo, python=python, trial=str(i))
        trials.append(Trial(i, dict(combo), render_command(template, values)))
    return trials


def unused(template: Sequence[str], names: Sequence[str]) -> list[str]:
    used = set(placeholders(template))
    return [n for n in names if n not in used]


# ---- the sweep's description for the scheduler ---------------------------------------------------------------
@dataclass(frozen=True)
class SweepSpec:
    template: tuple[str, ...]
    trials: tuple[Trial, ...]
    params: tuple[str, ...]
    gpus_per_trial: int = 1
    metric_regex: str | None = None
    metric_key: str = "metric"
    goal: str = "max"
    files: tuple[tuple[str, bytes], ...] = ()  # (name in the sweep folder, content)
    workdir: str | None = None
    trial_timeout: float | None = None
    node_timeout: float = 30.0
    poll: float = 1.0
    log_scale: tuple[str, ...] = ()  # parameters sampled on a log scale (plotted so)

    @property
    def metric_name(self) -> str:
        if self.metric_regex:
            names = [n for n in re.compile(self.metric_regex).groupindex if n != "value"]
            word = re.match(r"\^?([A-Za-z][A-Za-z0-9_]*)", self.metric_regex)
            return names[0] if names else (word.group(1) if word else "metric")
        return self.metric_key


def check_metric(regex: str | None) -> None:
    if regex is None:
        return
    try:
        re.compile(regex)
    except re.error as exc:
        raise UsageError(f"--metric {regex!r} is not a regular expression: {exc}") from None


def new_id() -> str:
    return f"sweep-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def validate_id(sweep_id: str) -> str:
    if not _ID.match(sweep_id or ""):
        raise UsageError(f"{sweep_id!r} is not a sweep id", "ids look like sweep-20240101-120000-ab12; see --status")
    return sweep_id


def config(spec: SweepSpec, sweep_id: str, sweep_dir: str, hosts, user: str, python: str) -> dict:
    """config.json for the scheduler: everything it needs, nothing it must work out."""
    from clusterctl.remote.session import TREE_FN

    biggest = max(e.slots for e in hosts.entries)
    if spec.gpus_per_trial > biggest:
        raise UsageError(f"--gpus-per-trial {spec.gpus_per_trial} is more than any node has ({biggest} slot(s))")
    return {
        "id": sweep_id,
        "nodes": [{"host": e.host, "slots": e.slots} for e in hosts.entries],
        "gpus_per_trial": spec.gpus_per_trial,
        "trials": [{"id": t.id, "params": t.params, "command": t.command} for t in spec.trials],
        "metric": {"regex": spec.metric_regex, "key": spec.metric_key},
        "env": {"PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "2"},
        "path_prefix": os.path.dirname(python),
        "workdir": spec.workdir,
        "trial_timeout": spec.trial_timeout,
        "node_timeout": spec.node_timeout,
        "poll": spec.poll,
        "max_requeue": 1,
        "ssh": list(SSH),
        "user": user,
        "tree_fn": TREE_FN,
        # for whoever reads the state later (--status, --attach, results.json): how to show it
        "meta": {
            "template": list(spec.template),
            "params": list(spec.params),
            "metric": spec.metric_name,
            "metric_regex": spec.metric_regex,
            "metric_key": spec.metric_key,
            "goal": spec.goal,
            "log_scale": list(spec.log_scale),
            "gpus_per_trial": spec.gpus_per_trial,
        },
    }


# ---- on the leader -------------------------------------------------------------------------------------------
def leader_home(pool, leader) -> str:
    result = pool.run_one(leader, 'printf %s "$HOME"', timeout=30)
    if not result.ok or not result.stdout.startswith("/"):
        raise UnreachableError(f"cannot reach the leader {leader.label}: {result.error or result.stderr.strip()}")
    return result.stdout.strip()


def sweep_dir(home: str, sweep_id: str) -> str:
    return f"{home}/{SWEEPS}/{validate_id(sweep_id)}"


def running_sweeps(pool, leader) -> list[str]:
    """Sweeps whose scheduler still runs on the leader and has not ended (one that just wrote its final
    state may still be closing its connections)."""
    cmd = (
        "for s in $(tmux ls -F '#{session_name}' 2>/dev/null | grep '^sweep-'); do "
        f'printf "%s %s\\n" "$s" "$(grep -o \'"status": "[a-z]*"\' "$HOME/{SWEEPS}/$s/state.json" 2>/dev/null | head -n 1)"; '
        "done; true"
    )
    r = pool.run_one(leader, cmd, timeout=30)
    if not r.ok:
        raise UnreachableError(f"cannot reach the leader {leader.label}: {r.error or r.stderr.strip()}")
    busy = []
    for line in r.stdout.splitlines():
        name, _, status = line.partition(" ")
        if _ID.match(name) and not any(f'"{s}"' in status for s in ENDED):
            busy.append(name)
    return busy


def start(pool, inv, spec: SweepSpec, python: str, sweep_id: str | None = None) -> tuple[str, str]:
    """Stage and start the scheduler on the leader. Returns (sweep id, its folder on the nodes)."""
    leader = inv.targets[0]
    busy = running_sweeps(pool, leader)
    if busy:
        raise ConfigError(
            f"sweep {busy[0]} is still running on this cluster (its trials hold the GPUs)",
            f"wait for it (clusterctl sweep --attach --id {busy[0]}) or cancel it (--cancel --id {busy[0]})",
        )
    sweep_id = sweep_id or new_id()
    home = leader_home(pool, leader)
    d = sweep_dir(home, sweep_id)
    workdir = spec.workdir
    if workdir and (workdir == "~" or workdir.startswith("~/")):
        workdir = home + workdir[1:]
    spec_cfg = config(SweepSpec(**{**spec.__dict__, "workdir": workdir}), sweep_id, d, inv.hosts, leader.user, python)
    if spec.files:
        report = pool.put(list(inv.targets), {f"{d}/{name}": (data, 0o644) for name, data in spec.files})
        if not report.all_ok:
            raise UnreachableError(
                "could not copy the files to every node: " + "; ".join(f"{r.host}: {r.error}" for r in report.failed)
            )
    put = pool.put(
        [leader],
        {
            f"{d}/{SCHEDULER}": (resources.template_bytes(SCHEDULER), 0o644),
            f"{d}/config.json": (json.dumps(spec_cfg, indent=1).encode(), 0o644),
        },
    )
    if not put.all_ok:
        raise UnreachableError(f"could not stage the sweep on the leader: {put.failed[0].error}")
    cmd = jobs.detach_command(
        sweep_id, f"exec {shlex.quote(python)} {shlex.quote(d + '/' + SCHEDULER)} {shlex.quote(d)}"
    )
    r = pool.run_one(leader, cmd, timeout=60)
    if not r.ok:
        raise RemoteCommandError(f"the scheduler did not start on the leader: {(r.error or r.stderr).strip()}")
    return sweep_id, d


def latest(pool, leader) -> str:
    r = pool.run_one(leader, f'ls -1 "$HOME/{SWEEPS}" 2>/dev/null | grep "^sweep-" | sort | tail -n 1', timeout=30)
    if not r.ok:
        raise UnreachableError(f"cannot reach the leader {leader.label}: {r.error or r.stderr.strip()}")
    found = r.stdout.strip()
    if not found:
        raise ConfigError("no sweep on this cluster yet", "start one: clusterctl sweep --grid lr=0.1,0.01 -- CMD")
    return validate_id(found)


@dataclass
class Snapshot:
    state: dict | None  # None until the scheduler wrote its first state
    alive: bool  # its tmux session still exists
    log_tail: str = ""


def read_state(pool, leader, sweep_id: str) -> Snapshot:
    n = validate_id(sweep_id)
    cmd = (
        f'd="$HOME/{SWEEPS}/{n}"; [ -d "$d" ] || {{ echo "no sweep {n} on this cluster" >&2; exit 3; }}; '
        f'cat "$d/state.json" 2>/dev/null; printf "\\n{MARK}"; '
        f"tmux has-session -t {shlex.quote('=' + n)} 2>/dev/null && echo alive || "
        f'{{ echo gone; tail -n 15 "{jobs.JOBS_DIR}/{n}.log" 2>/dev/null; }}; true'
    )
    r = pool.run_one(leader, cmd, timeout=30)
    if r.exit_code == 3:
        raise ConfigError(f"no sweep {n} on this cluster", "see `clusterctl sweep --status` for the latest one")
    if not r.ok:
        raise UnreachableError(
            f"cannot read the sweep's state on the leader {leader.label}: {r.error or r.stderr.strip()}"
        )
    text, _, tail = r.stdout.partition(MARK)
    alive_line, _, log_tail = tail.partition("\n")
    try:
        state = json.loads(text) if text.strip() else None
    except ValueError:
        state = None
    return Snapshot(state, alive_line.strip() == "alive", log_tail)


RECONNECT_S = 300.0  # how long a watch re-dials a leader it lost (a reboot, a network blip) before it gives up


def follow(
    pool,
    leader,
    sweep_id: str,
    on_state: Callable[[dict], None],
    poll: float = 1.0,
    start_timeout: float = 60.0,
    reconnect: float = RECONNECT_S,
) -> dict:
    """Read the state every `poll` seconds until the sweep ends; the final state. A leader that stops
    answering is re-dialled with backoff for `reconnect` seconds (the sweep goes on without us)."""
    from clusterctl import retry

    began = time.monotonic()
    lost: float | None = None
    delays = retry.backoff(poll, 15.0)
    while True:
        try:
            snap = read_state(pool, leader, sweep_id)
            lost, delays = None, retry.backoff(poll, 15.0)
        except UnreachableError as exc:
            lost = time.monotonic() if lost is None else lost
            if time.monotonic() - lost >= reconnect:
                raise UnreachableError(f"{exc} (re-dialled for {reconnect:.0f}s)") from None
            time.sleep(next(delays))
            continue
        if snap.state is not None:
            on_state(snap.state)
            if snap.state.get("status") in ENDED:
                return snap.state
        if not snap.alive:
            status = (snap.state or {}).get("status", "not started")
            raise RemoteCommandError(
                f"the scheduler of {sweep_id} stopped on the leader while the sweep was {status}"
                + (f": {snap.log_tail.strip().splitlines()[-1]}" if snap.log_tail.strip() else ""),
                f"see ~/.clusterctl/jobs/{sweep_id}.log on the leader; end its trials with --cancel",
            )
        if snap.state is None and time.monotonic() - began > start_timeout:
            raise RemoteCommandError(
                f"the scheduler of {sweep_id} wrote no state in {start_timeout:.0f}s",
                f"see ~/.clusterctl/jobs/{sweep_id}.log on the leader",
            )
        time.sleep(poll)


def cancel(pool, leader, sweep_id: str, python: str, timeout: float = 60.0) -> dict:
    """Ask the scheduler to end every trial and wait until it did; with the scheduler gone, run its
    cancel on the leader directly. The final state."""
    n = validate_id(sweep_id)
    snap = read_state(pool, leader, n)
    if snap.state is not None and snap.state.get("status") in ENDED:
        return snap.state
    d = f'"$HOME/{SWEEPS}/{n}"'
    if snap.alive:
        r = pool.run_one(leader, f"touch {d}/cancel", timeout=30)
        if not r.ok:
            raise UnreachableError(f"cannot reach the leader {leader.label}: {r.error or r.stderr.strip()}")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            snap = read_state(pool, leader, n)
            if snap.state is not None and snap.state.get("status") in ENDED:
                return snap.state
            if not snap.alive:
                break
            time.sleep(0.5)
        else:
            raise RemoteCommandError(
                f"the scheduler of {n} did not finish cancelling in {timeout:.0f}s",
                f"see ~/.clusterctl/jobs/{n}.log on the leader",
            )
    r = pool.run_one(leader, f"{shlex.quote(python)} {d}/{SCHEDULER} {d} --cancel", timeout=120)
    if not r.ok:
        raise RemoteCommandError(f"cancelling {n} on the leader failed: {(r.error or r.stderr).strip()}")
    snap = read_state(pool, leader, n)
    return snap.state or {}


def collect_logs(pool, inv, state: dict, out_dir: Path, limit: int = 1048576) -> list[str]:
    """Copy each trial's log (of its last attempt, from its node) into out_dir/logs/. Returns the hosts
    that could not be read."""
    by_host: dict[str, list[str]] = {}
    for t in state.get("trials", []):
        if t.get("log") and t.get("node"):
            by_host.setdefault(t["node"], []).append(t["log"])
    alive = {n["host"] for n in state.get("nodes", []) if n.get("alive")}
    targets = {e.host: t for e, t in zip(inv.hosts.entries, inv.targets)}
    wanted = [targets[h] for h in by_host if h in alive and h in targets]
    logs = out_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    if not wanted:
        return sorted(set(by_host) - alive)
    host_of = {t.label: h for h, t in targets.items()}

    def command(target) -> str:
        paths = by_host[host_of[target.label]]
        return "; ".join(
            f"printf '{MARK}%s\\n' {shlex.quote(os.path.basename(p))}; tail -c {int(limit)} {shlex.quote(p)} 2>/dev/null"
            for p in paths
        )

    report = pool.run(wanted, command, timeout=120)
    missing = sorted(set(by_host) - alive)
    for r in report:
        if not r.ok:
            missing.append(host_of.get(r.host, r.host))
            continue
        for chunk in r.stdout.split(MARK)[1:]:
            name, _, text = chunk.partition("\n")
            if re.match(r"^trial-[0-9]{4,}\.log$", name):
                (logs / name).write_text(text)
    return missing


# ---- results (pure but for the files) ------------------------------------------------------------------------
def elapsed(t: dict, now: float) -> float | None:
    if not t.get("started"):
        return None
    return (t.get("ended") or now) - t["started"]


def ranked(state: dict, goal: str) -> list[dict]:
    """Trials best first: done with a metric (by the goal), then the rest by id."""
    trials = state.get("trials", [])
    scored = [t for t in trials if t.get("state") == "done" and t.get("metric") is not None]
    scored.sort(key=lambda t: (-t["metric"] if goal == "max" else t["metric"], t["id"]))
    rest = sorted((t for t in trials if t not in scored), key=lambda t: t["id"])
    return scored + rest


def best(state: dict, goal: str) -> dict | None:
    r = ranked(state, goal)
    return r[0] if r and r[0].get("state") == "done" and r[0].get("metric") is not None else None


def where(t: dict) -> str:
    if not t.get("node"):
        return "-"
    return f"{t['node']}/gpu{','.join(str(g) for g in t.get('gpus') or [])}"


def rows(state: dict, params: Sequence[str], goal: str, sort: bool, now: float | None = None) -> list[dict]:
    """Table rows (strings) for display: trial, each parameter, node/gpu, state, elapsed, metric. A running
    trial's elapsed time is reckoned to the state's last update (the cluster's clocks, not this machine's)."""
    now = (state.get("updated") or time.time()) if now is None else now
    trials = ranked(state, goal) if sort else sorted(state.get("trials", []), key=lambda t: t["id"])
    top = best(state, goal)
    out = []
    for t in trials:
        secs = elapsed(t, now)
        note = t.get("error") or ""
        if t.get("requeued") and t.get("state") not in ("lost",):
            note = (note + "; " if note else "") + "re-run after its node died"
        out.append(
            {
                "trial": str(t["id"]),
                "params": [str(t["params"].get(p, "")) for p in params],
                "node": where(t),
                "state": t.get("state", "?"),
                "elapsed": "-" if secs is None else f"{secs:.1f}s",
                "metric": "-" if t.get("metric") is None else f"{t['metric']:.6g}",
                "best": top is not None and t["id"] == top["id"],
                "note": note,
            }
        )
    return out


def events(prev: dict | None, cur: dict, metric_name: str = "metric") -> list[str]:
    """One line per change between two states (for output that is not a terminal)."""
    lines = []
    old_nodes = {n["host"]: n for n in (prev or {}).get("nodes", [])}
    for n in cur.get("nodes", []):
        if not n.get("alive") and old_nodes.get(n["host"], {}).get("alive", True):
            lines.append(f"node {n['host']} is dead ({n.get('why') or 'no answer'}); its running trials are re-queued")
    old = {t["id"]: t for t in (prev or {}).get("trials", [])}
    for t in cur.get("trials", []):
        o = old.get(t["id"], {})
        params = " ".join(f"{k}={v}" for k, v in t["params"].items())
        attempts, old_attempts = len(t.get("attempts", [])), len(o.get("attempts", []))
        if t.get("requeued", 0) > o.get("requeued", 0):
            died = [a["node"] for a in t.get("attempts", []) if a.get("outcome") == "node died"]
            lines.append(f"trial {t['id']} ({params}) re-queued: its node {died[-1] if died else '?'} died")
        if attempts > old_attempts and t.get("state") in ("running",) + FINAL:
            lines.append(f"trial {t['id']} ({params}) started on {where(t)}")
        if t.get("state") in FINAL and o.get("state") not in FINAL:
            secs = elapsed(t, time.time())
            what = (
                f"{metric_name} {t['metric']:.6g}" if t.get("metric") is not None else (t.get("error") or "no metric")
            )
            took = f" after {secs:.1f}s" if secs is not None else ""
            lines.append(f"trial {t['id']} {t['state']}{took}: {what}")
    return lines


def results_dir(root: Path) -> Path:
    base = root / time.strftime("%Y%m%d-%H%M%S")
    path, i = base, 1
    while path.exists():
        i += 1
        path = base.with_name(f"{base.name}-{i}")
    path.mkdir(parents=True)
    return path


def write_results(out_dir: Path, state: dict, meta: Mapping) -> Path:
    goal = meta.get("goal", "max")
    doc = dict(meta)
    doc.update(
        {
            "id": state.get("id"),
            "status": state.get("status"),
            "started": state.get("started"),
            "ended": state.get("ended"),
            "best": best(state, goal),
            "nodes": state.get("nodes", []),
            "trials": ranked(state, goal),
        }
    )
    path = out_dir / "results.json"
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return path


def _numeric(values: Sequence[str]) -> list[float] | None:
    try:
        return [float(v) for v in values]
    except ValueError:
        return None


def plot(
    state: dict, params: Sequence[str], metric_name: str, goal: str, path: Path, log_scale: Sequence[str] = ()
) -> bool:
    """The metric against each parameter, one panel per parameter, best trial starred (headless).
    False when no trial has a metric (nothing to plot)."""
    done = [t for t in state.get("trials", []) if t.get("state") == "done" and t.get("metric") is not None]
    if not done or not params:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    top = best(state, goal)
    fig, axes = plt.subplots(1, len(params), figsize=(4.2 * len(params), 3.6), dpi=100, squeeze=False)
    for ax, p in zip(axes[0], params):
        raw = [str(t["params"][p]) for t in done]
        ys = [t["metric"] for t in done]
        xs = _numeric(raw)
        if xs is None:  # categories, in first-seen order
            cats = list(dict.fromkeys(raw))
            xs = [cats.index(v) for v in raw]
            ax.set_xticks(range(len(cats)))
            ax.set_xticklabels(cats, rotation=30)
        elif p in log_scale or (min(xs) > 0 and max(xs) / min(xs) >= 100):
            ax.set_xscale("log")
        ax.scatter(xs, ys, color="tab:blue", alpha=0.8, label="trials")
        if top is not None:
            i = done.index(top)
            ax.scatter(
                [xs[i]], [ys[i]], marker="*", s=220, color="tab:orange", zorder=3, label=f"best (trial {top['id']})"
            )
        ax.set_xlabel(p)
        ax.set_ylabel(metric_name)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"{state.get('id', 'sweep')}: {metric_name} ({goal}) against each parameter", fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def python_for(cluster, python: str | None) -> str:
    return python or launch.node_python(cluster)


def summary(state: dict) -> str:
    """'sweep ID running: 3 done, 1 running; dead node(s): ...' (status lines and the watch's footer)."""
    counts: dict = {}
    for t in state.get("trials", []):
        counts[t["state"]] = counts.get(t["state"], 0) + 1
    dead = [n["host"] for n in state.get("nodes", []) if not n.get("alive")]
    text = f"sweep {state.get('id')} {state.get('status')}: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
    return text + (f"; dead node(s): {', '.join(dead)}" if dead else "")


def watch(pool, leader, sweep_id: str, open_view: Callable, poll: float = 1.0) -> dict:
    """Follow a sweep to its end (follow()) and return its last state, shown in a view opened at the first
    state, when the parameters are known: open_view(params, metric name) is a context manager with
    update(rows, summary line, events); it is closed however the watch ends (Ctrl-C too)."""
    import contextlib

    with contextlib.ExitStack() as stack:
        seen: dict = {"prev": None, "params": None, "view": None}

        def on_state(state: dict) -> None:
            meta = state.get("meta") or {}
            if seen["view"] is None:
                seen["params"] = meta.get("params") or list(state["trials"][0]["params"])
                seen["view"] = stack.enter_context(open_view(seen["params"], meta.get("metric", "metric")))
            seen["view"].update(
                rows(state, seen["params"], meta.get("goal", "max"), sort=False),
                summary(state),
                events(seen["prev"], state, meta.get("metric", "metric")),
            )
            seen["prev"] = state

        return follow(pool, leader, sweep_id, on_state, poll=poll)


def stage_files(files: Sequence[str]) -> list[tuple[str, bytes]]:
    """--file PATH (a file here, or a shipped template's name) as (name, bytes) for every node's sweep folder;
    train_imagenet.py brings its checkpoint module along."""
    staged = []
    for f in files:
        path = Path(f).expanduser()
        if not path.is_file() and "/" not in f:
            try:
                path = resources.template_path(f)
            except ClusterctlError:
                pass
        if not path.is_file():
            raise UsageError(f"--file {f}: no such file here (nor a shipped template)")
        staged.append((path.name, path.read_bytes()))
        if path.name == "train_imagenet.py":  # it imports its checkpoint module from its own folder
            staged.append(("train_ckpt.py", resources.template_bytes("train_ckpt.py")))
    if len({n for n, _ in staged}) != len(staged):
        raise UsageError("--file: two files have the same name")
    return staged
