"""Terminal output (rich): messages, host-prefixed live lines, folded outputs, summaries, live progress
(each command's tables and live views sit beside the command, e.g. cli/bench.py, cli/sweep.py).

Library code never prints; it hands typed values here. Output goes to stdout, diagnostics to stderr.
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
from typing import TYPE_CHECKING, Iterable, Sequence

if TYPE_CHECKING:
    from types import TracebackType

    from rich.console import Console, JustifyMethod
    from rich.progress import Progress, TaskID
    from rich.table import Table

    from clusterctl.playbook.model import StepResult
    from clusterctl.types import RunReport, Step

_lock = threading.Lock()
_consoles: dict[str, Console] = {}
_PALETTE = ["cyan", "magenta", "green", "yellow", "blue", "bright_cyan", "bright_magenta", "bright_green"]


def console(stderr: bool = False) -> Console:
    key = "err" if stderr else "out"
    if key not in _consoles:
        from rich.console import Console

        stream = sys.stderr if stderr else sys.stdout
        # Piped output is read by people and scripts alike: do not squeeze tables into 80 columns, unless
        # COLUMNS says how wide the reader is.
        columns = os.environ.get("COLUMNS", "")
        width = None if stream.isatty() else int(columns) if columns.isdigit() and int(columns) > 0 else 160
        _consoles[key] = Console(stderr=stderr, highlight=False, soft_wrap=True, width=width)
    return _consoles[key]


def error(message: str) -> None:
    console(stderr=True).print(f"[bold red]Error:[/] {_esc(message)}")


def info(message: str) -> None:
    console(stderr=True).print(_esc(message))


def warn(message: str) -> None:
    console(stderr=True).print(f"[yellow]Warning:[/] {_esc(message)}")


def _esc(text: str) -> str:
    from rich.markup import escape

    return escape(text)


# ---- live lines --------------------------------------------------------------------------------------
class HostPrinter:
    """The on_line callback of remote.run: `host: line`, one colour per host on a terminal."""

    def __init__(self, hosts: Sequence[str]):
        width = max((len(h) for h in hosts), default=0)
        self.prefix = {h: h.ljust(width) for h in hosts}
        self.colour = {h: _PALETTE[i % len(_PALETTE)] for i, h in enumerate(hosts)}
        self.tty = sys.stdout.isatty()

    def __call__(self, host: str, stream: str, line: str) -> None:
        prefix = self.prefix.get(host, host)
        with _lock:
            if self.tty:
                style = self.colour.get(host, "white")
                mark = "[red]![/]" if stream == "stderr" else " "
                console().print(f"[{style}]{_esc(prefix)}[/]{mark}| {_esc(line)}")
            else:  # `host: line`, unpadded, as pdsh prints it (dshbak and grep read it back)
                out = sys.stdout if stream == "stdout" else sys.stderr
                out.write(f"{host}: {line}\n")
                out.flush()


# ---- long steps ------------------------------------------------------------------------------------
HEARTBEAT_S = 30.0  # off a terminal: a long step's `still running` line at most this far apart


class StepLine:
    """An OnStep (types.Step) drawn on stderr. On a terminal: one rich progress line per running step (spinner,
    name, a bar when the amount is known, the time so far), gone when the step ends, which leaves one line
    with the time it took. Elsewhere (logs, CI, tests read these): plain lines, `NAME ...` when it begins, one
    at each quarter of a known amount (`NAME: 25% of 338 MiB (3.1s)`, `NAME: 1 of 3 (40.2s)`), `NAME: still
    running (30.0s)` every HEARTBEAT_S of silence, and `NAME: done in 4.2s` (or its detail) when it ends."""

    def __init__(self, out: Console | None = None, heartbeat_s: float = HEARTBEAT_S):
        self.out = out or console(stderr=True)
        self.tty = self.out.is_terminal
        self.heartbeat_s = heartbeat_s
        self.bars: Progress | None = None
        self.tasks: dict[str, TaskID] = {}
        self.started: dict[str, float] = {}
        self.quarter: dict[str, int] = {}
        self.said = 0.0  # when the last plain line was written
        self._wake = threading.Event()
        self._beat: threading.Thread | None = None

    def __enter__(self) -> "StepLine":
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def __call__(self, step: Step) -> None:
        if step.phase == "begin":
            self.begin(step.name, step.total, step.unit)
        elif step.phase == "advance":
            self.advance(step.name, step.done, step.total, step.unit)
        else:
            self.end(step.name, step.detail)

    def begin(self, name: str, total: int | None = None, unit: str = "") -> None:
        import time

        with _lock:
            self.started[name], self.quarter[name] = time.monotonic(), 0
            if self.tty:
                bars = self._bars()
                self.tasks[name] = bars.add_task(_esc(name), total=total, amount=_amount(0, total, unit))
                return
            self._say(f"{name} ...")
            if self._beat is None:
                self._beat = threading.Thread(target=self._heartbeat, name="step-heartbeat", daemon=True)
                self._beat.start()

    def advance(self, name: str, done: int, total: int | None = None, unit: str = "") -> None:
        with _lock:
            if name not in self.started:
                return
            if self.bars is not None and name in self.tasks:
                self.bars.update(self.tasks[name], completed=done, total=total, amount=_amount(done, total, unit))
            elif not self.tty and total:
                quarter = min(4, int(4 * done / total))
                if quarter > self.quarter[name]:
                    self.quarter[name] = quarter
                    if unit == "bytes":
                        self._say(f"{name}: {25 * quarter}% of {_amount(total, None, unit)} ({self._took(name)})")
                    elif done < total:  # a count: its end line follows the last
                        self._say(f"{name}: {done} of {total} ({self._took(name)})")

    def end(self, name: str, detail: str = "", quiet: bool = False) -> None:
        """The step is over; quiet: no line of its own (the caller prints its result)."""
        with _lock:
            if name not in self.started:
                return
            took = self._took(name)
            del self.started[name]
            if self.bars is not None and name in self.tasks:
                self.bars.remove_task(self.tasks.pop(name))
                if not self.tasks:
                    self.bars.stop()
                    self.bars = None
            if not self.started:
                self._wake.set()
            if not quiet:
                self._say(f"{name}: {detail} ({took})" if detail else f"{name}: done in {took}")

    def close(self) -> None:
        """Stop drawing (an error left steps running)."""
        for name in list(self.started):
            self.end(name, quiet=True)

    def _bars(self) -> Progress:
        if self.bars is None:
            from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
            from rich.table import Column

            fixed = Column(no_wrap=True)  # a narrow terminal wraps the name, never cuts a figure
            self.bars = Progress(
                SpinnerColumn(table_column=fixed),
                TextColumn("{task.description}", table_column=Column(overflow="fold")),
                BarColumn(bar_width=20, table_column=fixed),
                TextColumn("{task.fields[amount]}", table_column=Column(no_wrap=True)),
                TimeElapsedColumn(table_column=Column(no_wrap=True)),
                console=self.out,
                transient=True,
                refresh_per_second=4,
                redirect_stdout=False,  # stdout stays stdout (piped to a script while stderr is a terminal)
            )
            self.bars.start()
        return self.bars

    def _say(self, text: str) -> None:
        import time

        self.said = time.monotonic()
        self.out.print(text, markup=False, highlight=False)

    def _took(self, name: str) -> str:
        import time

        return f"{time.monotonic() - self.started[name]:.1f}s"

    def _heartbeat(self) -> None:
        import time

        while True:
            self._wake.wait(self.heartbeat_s / 4)
            with _lock:
                self._wake.clear()
                if not self.started:
                    self._beat = None
                    return
                if time.monotonic() - self.said >= self.heartbeat_s:
                    name = next(iter(self.started))
                    self._say(f"{name}: still running ({self._took(name)})")


def _amount(done: int, total: int | None, unit: str) -> str:
    """`84/338 MiB`, `2/5`, or (no total) what is done so far; "" before anything is."""
    if unit == "bytes":
        return f"{done / 2**20:.0f}/{total / 2**20:.0f} MiB" if total else f"{done / 2**20:.0f} MiB"
    return f"{done}/{total}" if total else (str(done) if done else "")


# ---- host lists --------------------------------------------------------------------------------------
def fold_hosts(hosts: Iterable[str]) -> str:
    """ClusterShell-style folding: 10.0.0.2,10.0.0.3,10.0.0.4,node7 -> 10.0.0.[2-4],node7."""
    groups: dict[tuple[str, str], list[tuple[int, str]]] = {}
    order: list[tuple[str, str]] = []
    singles: list[str] = []
    for h in hosts:
        m = re.match(r"^(.*?)(\d+)(\D*)$", h)
        if not m:
            singles.append(h)
            continue
        key = (m.group(1), m.group(3))
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append((int(m.group(2)), m.group(2)))
    parts = []
    for key in order:
        nums = sorted(set(groups[key]))
        if len(nums) == 1:
            parts.append(f"{key[0]}{nums[0][1]}{key[1]}")
            continue
        ranges, start, prev = [], nums[0], nums[0]
        for n in nums[1:] + [None]:
            if n is not None and n[0] == prev[0] + 1 and len(n[1]) == len(prev[1]):
                prev = n
                continue
            ranges.append(start[1] if start == prev else f"{start[1]}-{prev[1]}")
            if n is not None:
                start = prev = n
        parts.append(f"{key[0]}[{','.join(ranges)}]{key[1]}")
    return ",".join(parts + singles)


# ---- run results -------------------------------------------------------------------------------------
def grouped_output(report: RunReport) -> None:
    """Identical outputs folded into one block under a folded host list (dshbak -c / clush -b)."""
    blocks: dict[str, list[str]] = {}
    for r in report:
        text = r.stdout + (r.stderr if r.stderr else "")
        blocks.setdefault(text, []).append(r.host)
    c = console()
    for text, hosts in blocks.items():
        c.print(f"[bold]---------------- {_esc(fold_hosts(hosts))} ({len(hosts)})[/]")
        c.print("----------------", markup=False)
        c.print(_esc(text.rstrip("\n")) if text else "[dim](no output)[/]")


def summary(report: RunReport, tail_lines: int = 3) -> None:
    """To stderr: hosts ok / failed / unreachable / timed out, then one line per host that was not ok.
    Plain text when stderr is not a terminal (no rich import: it is most of a repeated run's start-up)."""
    counts = {s: len(report.by_status(s)) for s in ("ok", "failed", "unreachable", "timeout")}
    line = ", ".join(f"{n} {'timed out' if s == 'timeout' else s}" for s, n in counts.items() if n or s == "ok")
    lines: list[tuple[str, str | None, str | None]] = [
        (f"{len(report)} host(s): {line}", "green" if report.all_ok else "red", None)
    ]
    for r in report:
        if r.status == "failed":
            tail = " / ".join(r.stderr.strip().splitlines()[-tail_lines:])
            lines.append((f"exit {r.exit_code}" + (f": {tail}" if tail else ""), None, r.host))
        elif r.status in ("unreachable", "timeout"):
            label = "timed out" if r.status == "timeout" else r.status
            lines.append((f"{label}: {r.error or ''}", None, r.host))
    if not sys.stderr.isatty():
        sys.stderr.write("".join(f"  {host}: {text}\n" if host else f"{text}\n" for text, _, host in lines))
        sys.stderr.flush()
        return
    c = console(stderr=True)
    for text, style, host in lines:
        c.print(f"  [red]{_esc(host)}[/]: {_esc(text)}" if host else f"[{style}]{_esc(text)}[/]")


PROSE_WIDTH = 24  # a free-text column's share of a narrow table: about four words a line


def fitted_table(
    columns: Sequence[str | tuple[str, JustifyMethod]],
    rows: Sequence[Sequence[str]],
    keys: int = 1,
    title: str | None = None,
    boxed: bool = False,
    prose: Sequence[str] = (),
    caption: str | None = None,
    show: bool = True,
) -> list[Table]:
    """A table (cells in rich markup; headers plain) that fits the console without cutting a word: when its
    columns are wider than the console, those after the first `keys` wrap into further blocks below, each
    repeating the key columns; a cell wider than its column wraps at spaces (a `prose` column gets about four
    words a line), and only a single word wider than the whole console folds. Never an ellipsis. The title
    heads the first block; a caption goes under the last, wrapped at the console's width. Printed on stdout,
    or with show=False only returned (a live view draws them)."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    cols = [(c, "left") if isinstance(c, str) else c for c in columns]
    border = 1 if boxed else 0  # a box's rule between columns (and at each edge)
    need = [
        min(
            max([Text(h).cell_len, *(Text.from_markup(r[i]).cell_len for r in rows)]),
            PROSE_WIDTH if h in prose else 10**6,
        )
        + 2
        + border
        for i, (h, _) in enumerate(cols)
    ]
    width = console().width - border
    blocks: list[list[int]] = []
    used = width  # start a block at the first column after the keys
    for i in range(keys, len(cols)):
        if used + need[i] > width and not (blocks and used == sum(need[:keys])):
            blocks.append([])
            used = sum(need[:keys])
        blocks[-1].append(i)
        used += need[i]
    tables = []
    for n, block in enumerate(blocks or [[]]):
        t = Table(title=title if n == 0 else None, box=box.HEAVY_HEAD if boxed else None, header_style="bold")
        picked = [*range(keys), *block]
        for i in picked:
            t.add_column(_esc(cols[i][0]), justify=cols[i][1], overflow="fold")
        for r in rows:
            t.add_row(*(r[i] for i in picked))
        tables.append(t)
    if show:
        for t in tables:
            console().print(t)
        if caption:
            console().print(caption, style="dim", soft_wrap=False)
    return tables


def json_out(value: object) -> None:
    """One JSON document on stdout (`--json` of ls, status, hosts, up --dry-run): keys sorted, so stable."""
    sys.stdout.write(json.dumps(value, indent=2, sort_keys=True) + "\n")
    sys.stdout.flush()


def json_lines(report: RunReport) -> None:
    for r in report:
        sys.stdout.write(json.dumps(r.to_dict()) + "\n")
    sys.stdout.flush()


# ---- playbook steps (play, and up -f's setup) ---------------------------------------------------------
def play_summary(results: Sequence[StepResult]) -> None:
    c = console()
    for r in results:
        mark = "[dim]skip[/]" if r.skipped else ("[green]ok[/]" if r.ok else "[bold red]FAIL[/]")
        c.print(f"{mark:>6} {_esc(r.step.name)} ({r.step.kind}): {_esc(r.detail)}")
    failed = [r for r in results if not r.ok]
    c.print("[green]playbook finished[/]" if not failed else f"[red]{len(failed)} step(s) failed[/]")
