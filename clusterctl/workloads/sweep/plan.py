"""`clusterctl sweep`'s plan, pure but for reading --file: the trials (grid product or random samples), each
trial's command rendered from the template, the sweep's description (SweepSpec) and its id.

workloads/sweep/leader.py stages the plan on the leader and starts the scheduler; workloads/sweep/state.py reads
its state back; workloads/sweep/results.py ranks, shows and writes the results.
"""

from __future__ import annotations

import itertools
import math
import random
import re
import secrets
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from clusterctl import resources
from clusterctl.errors import ClusterctlError, UsageError, within

RESERVED = ("python", "trial")  # placeholders clusterctl fills in itself
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ID = re.compile(r"^sweep-[0-9]{8}-[0-9]{6}-[0-9a-f]{4}$")
_PLACEHOLDER = re.compile(r"(?<!\$)\{([A-Za-z_][A-Za-z0-9_]*)\}")  # {lr}; ${HOME} stays the shell's


# ---- trials ------------------------------------------------------------------------------------------------
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
    value quoted for where it stands (bare, '...' or "..."; remote/shelltext.py)."""
    from clusterctl.remote import shelltext

    if len(template) == 1:
        return shelltext.fill(template[0], _PLACEHOLDER, lambda m: str(values[m.group(1)]))
    return shlex.join(_PLACEHOLDER.sub(lambda m: str(values[m.group(1)]), word) for word in template)


@dataclass(frozen=True)
class Trial:
    id: int
    params: dict[str, str]
    command: str

    def params_text(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.params.items())


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
            "no command to sweep",
            "put it after --: clusterctl sweep run --grid lr=0.1,0.01 -- python train.py --lr {lr}",
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
        trial = Trial(i, dict(combo), render_command(template, values))
        check_trainer_options(trial)
        trials.append(trial)
    return trials


def check_trainer_options(trial: Trial) -> None:
    """A trial of the shipped trainer gets `clusterctl train`'s checks of the options it gives (TrainOptions),
    before the sweep starts: `--grid epochs=10,-3` is refused here, not by trial 2's trainer an hour later."""
    import typing

    from clusterctl.workloads.train import options as train_options

    try:
        words = shlex.split(trial.command)
    except ValueError:
        return  # shell text shlex cannot split: the shell will say
    if not any("train_imagenet" in w for w in words):
        return
    by_flag = {flag: name for name, flag in train_options.FLAGS.items() if name not in ("data", "checkpoint_copy")}
    hints = typing.get_type_hints(train_options.TrainOptions)
    given: dict[str, object] = {}
    for i, word in enumerate(words):
        flag, eq, text = word.partition("=")
        if flag not in by_flag or (not eq and i + 1 >= len(words)):
            continue
        name, value = by_flag[flag], text if eq else words[i + 1]
        kind = next((t for t in (int, float) if t in typing.get_args(hints[name]) or hints[name] is t), str)
        try:
            given[name] = kind(value)
        except ValueError:
            what = "a whole number" if kind is int else "a number"
            raise UsageError(f"trial {trial.id} ({trial.params_text()}): {flag} takes {what}, not {value!r}") from None
    try:
        train_options.TrainOptions(synthetic=True, **given)  # type: ignore[arg-type]
    except UsageError as exc:
        raise UsageError(f"trial {trial.id} ({trial.params_text()}): {exc.message}", exc.hint) from None


def unused(template: Sequence[str], names: Sequence[str]) -> list[str]:
    used = set(placeholders(template))
    return [n for n in names if n not in used]


# ---- the sweep's description for the scheduler ---------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class SweepSpec:
    """A sweep as the user asks for it, built by keyword and checked whole on construction (the CLI and any
    other caller get the same UsageError before anything connects): the trials follow from it and the nodes'
    Python (trials())."""

    template: tuple[str, ...]  # the trial's command: {NAME} placeholders, {python}, {trial}
    grid: tuple[str, ...] = ()  # NAME=V1,V2 each: every combination is a trial
    ranges: tuple[str, ...] = ()  # NAME=LOW:HIGH[:log|int] each, sampled by random_k
    random_k: int | None = None
    seed: int = 0
    gpus_per_trial: int = 1
    metric_regex: str | None = None
    metric_key: str = "metric"
    goal: str = "max"
    file_paths: tuple[str, ...] = ()  # files here (or shipped templates' names) for every node's sweep folder
    workdir: str | None = None
    trial_timeout: float | None = None
    node_timeout: float = 30.0
    poll: float = 1.0
    # worked out on construction from the fields above
    combos: tuple[dict[str, str], ...] = field(init=False, repr=False)
    files: tuple[tuple[str, bytes], ...] = field(init=False, repr=False)  # (name in the sweep folder, content)
    params: tuple[str, ...] = field(init=False)
    log_scale: tuple[str, ...] = field(init=False)  # parameters sampled on a log scale (plotted so)

    def __post_init__(self) -> None:
        if self.goal not in ("max", "min"):
            raise UsageError(f"--goal must be max or min, not {self.goal!r}")
        within("--gpus-per-trial", self.gpus_per_trial, 1)
        within("--trial-timeout", self.trial_timeout, above=0)
        within("--node-timeout", self.node_timeout, above=0)
        within("--poll", self.poll, 0.1, 60, unit="seconds")
        check_metric(self.metric_regex)
        ranges = parse_ranges(self.ranges)
        combos = tuple(expand(parse_grid(self.grid), ranges, self.random_k, self.seed))
        object.__setattr__(self, "combos", combos)
        object.__setattr__(self, "params", tuple(combos[0]))
        object.__setattr__(self, "log_scale", tuple(n for n, r in ranges.items() if r.scale == "log"))
        object.__setattr__(self, "files", tuple(stage_files(self.file_paths)))
        build_trials(self.template, combos, "python")  # a bad command or trial fails here, before connecting

    def trials(self, python: str) -> tuple[Trial, ...]:
        """Every trial's command, with {python} the nodes' Python."""
        return tuple(build_trials(self.template, self.combos, python))

    def unused(self) -> list[str]:
        """Parameters the command does not name (worth a warning: their values change nothing)."""
        return unused(self.template, self.params)

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
        raise UsageError(
            f"{sweep_id!r} is not a sweep id", "ids look like sweep-20240101-120000-ab12; see `clusterctl sweep status`"
        )
    return sweep_id


def is_id(name: str) -> bool:
    return bool(_ID.match(name))


def stage_files(files: Sequence[str]) -> list[tuple[str, bytes]]:
    """--file PATH (a file here, or a shipped template's name) as (name, bytes) for every node's sweep folder;
    the trainer's name (train_imagenet.py) stages the node package under it, which runs the trainer."""
    from clusterctl.node.__main__ import NAMED
    from clusterctl.remote import nodepkg

    staged = []
    for f in files:
        path = Path(f).expanduser()
        if f in NAMED and not path.is_file():
            staged.append((f, nodepkg.package().data))
            continue
        if not path.is_file() and "/" not in f:
            try:
                path = resources.template_path(f)
            except ClusterctlError:
                pass
        if not path.is_file():
            raise UsageError(f"--file {f}: no such file here (nor a shipped template)")
        staged.append((path.name, path.read_bytes()))
    if len({n for n, _ in staged}) != len(staged):
        raise UsageError("--file: two files have the same name")
    return staged
