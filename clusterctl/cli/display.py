"""All terminal output (rich): host-prefixed live lines, folded identical outputs, summaries, tables.

Library code never prints; it hands typed values here. Output goes to stdout, diagnostics to stderr.
"""

from __future__ import annotations

import json
import re
import sys
import threading
from typing import TYPE_CHECKING, Iterable, Sequence

from clusterctl.units import duration, money

if TYPE_CHECKING:
    from rich.console import JustifyMethod
    from rich.live import Live

_lock = threading.Lock()
_consoles: dict[str, object] = {}
_PALETTE = ["cyan", "magenta", "green", "yellow", "blue", "bright_cyan", "bright_magenta", "bright_green"]


def console(stderr: bool = False):
    key = "err" if stderr else "out"
    if key not in _consoles:
        from rich.console import Console

        stream = sys.stderr if stderr else sys.stdout
        # Piped output is read by people and scripts alike: do not squeeze tables into 80 columns.
        width = None if stream.isatty() else 160
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
def grouped_output(report) -> None:
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


def summary(report, tail_lines: int = 3) -> None:
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


def disk_table(rows) -> None:
    """clean --disk: one row per node and file system; under 10% free flagged."""
    from rich.table import Table

    t = Table(box=None, header_style="bold")
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("HOST", "left"),
        ("MOUNT", "left"),
        ("SIZE", "right"),
        ("USED", "right"),
        ("FREE", "right"),
        ("FREE%", "right"),
        ("", "left"),
    )
    for col, just in columns:
        t.add_column(col, justify=just)
    for r in rows:
        flag = "[red]LOW[/]" if r.low else ""
        t.add_row(r.host, r.mount, _size(r.size_kb), _size(r.used_kb), _size(r.free_kb), f"{r.free_fraction:.0%}", flag)
    console().print(t)
    low = sorted({r.host for r in rows if r.low})
    if low:
        warn(f"under 10% free on {fold_hosts(low)}")


def _size(kb: int) -> str:
    value = float(kb)
    for unit in ("K", "M", "G", "T"):
        if value < 1024 or unit == "T":
            return f"{value:.0f}{unit}" if unit == "K" else f"{value:.1f}{unit}"
        value /= 1024
    return f"{value:.1f}P"


def json_lines(report) -> None:
    for r in report:
        sys.stdout.write(json.dumps(r.to_dict()) + "\n")
    sys.stdout.flush()


# ---- clusters ----------------------------------------------------------------------------------------
def cluster_table(
    rows: Sequence[dict], columns: Sequence[str] = ("name", "provider", "nodes", "type", "slots", "age", "state")
) -> None:
    from rich.table import Table

    t = Table(box=None, header_style="bold")
    for col in columns:
        t.add_column(col.upper())
    for r in rows:
        t.add_row(*(_esc(str(r.get(c, ""))) for c in columns))
    console().print(t)


def cluster_status(status, now: float, current: bool = False, notes: Sequence[str] = ()) -> None:
    """`status` of a cluster as its provider sees it: one row per node, then $/hour and cost so far."""
    from rich.table import Table

    c = console()
    c.print(
        f"[bold]{_esc(status.name)}[/] ({status.provider}, {status.region}, {status.instance_type or '-'})"
        + (" [dim]current[/]" if current else "")
    )
    t = Table(box=None, header_style="bold")
    for col in ("NODE", "ROLE", "INSTANCE", "AZ", "STATE", "ADDRESS", "SSH", "SLOTS", "UPTIME"):
        t.add_column(col)
    for ns in status.nodes:
        n = ns.node
        up = duration(now - ns.launched_at) if ns.launched_at and ns.state in ("pending", "running") else "-"
        t.add_row(
            n.name,
            n.role,
            n.instance_id or "-",
            ns.zone or "-",
            ns.state,
            n.private_ip,
            f"{n.ssh_user}@{n.ssh_host}:{n.ssh_port}",
            str(n.slots),
            up,
        )
    if status.nodes:
        c.print(t)
    hourly, so_far = status.hourly_usd, status.cost_so_far(now)
    c.print(f"cost: {money(hourly)}/hour now, {money(so_far)} so far (built-in on-demand prices; not a bill)")
    for line in status.other:
        c.print(f"  left without nodes: {_esc(line)}")
    for note in notes:
        c.print(f"[yellow]note:[/] {_esc(note)}")


def gc_table(found, chosen, now: float) -> None:
    """`gc`: one row per cluster found (age, owner, record here), then each resource of the ones to remove."""
    from rich.table import Table

    picked = {id(c) for c in chosen}  # per identity: two owners' clusters may share a name
    t = Table(box=None, header_style="bold")
    for col in ("CLUSTER", "WHERE", "AGE", "OWNER", "RECORD HERE", "NODES", "RESOURCES", ""):
        t.add_column(col)
    for c in found:
        nodes = sum(f.kind in ("instance", "namespace") for f in c.found)
        t.add_row(
            _esc(c.name),
            c.where,
            duration(now - c.created_at) if c.created_at else "?",
            _esc(c.owner or "?"),
            c.record or "none",
            str(nodes),
            str(len(c.found)),
            "remove"
            if id(c) in picked
            else "kept (younger)"
            if getattr(c, "mine", True)
            else "kept (another owner's: --force)",
        )
    console().print(t)
    for c in chosen:
        for f in c.found:
            info(
                f"  {c.name}: {f.kind} {f.id}"
                + (f" ({f.state})" if f.state else "")
                + (f", {duration(now - f.created_at)} old" if f.created_at else "")
            )


def node_table(cluster, current: bool = False) -> None:
    from rich.table import Table

    c = console()
    c.print(
        f"[bold]{_esc(cluster.name)}[/] ({cluster.provider}, {cluster.region}, {cluster.instance_type})"
        + (" [dim]current[/]" if current else "")
    )
    t = Table(box=None, header_style="bold")
    for col in ("NODE", "ROLE", "ADDRESS", "SSH", "SLOTS"):
        t.add_column(col)
    for n in cluster.nodes:
        t.add_row(n.name, n.role, n.private_ip, f"{n.ssh_user}@{n.ssh_host}:{n.ssh_port}", str(n.slots))
    c.print(t)


# ---- the benchmark ladder ----------------------------------------------------------------------------
class BenchProgress:
    """on_event of bench.run_ladder: a line per rung as it starts and ends (the table comes at the end)."""

    def __init__(self):
        self.started = 0.0

    def __call__(self, kind: str, value) -> None:
        import time

        c = console(stderr=True)
        if kind == "start":
            self.started = time.monotonic()
            c.print(f"[bold]rung: {value}{' process(es)' if isinstance(value, int) else ''}[/] ...")
        elif kind == "rung":
            r = value
            c.print(
                f"  {r.np:>4} procs on {r.nodes} node(s): {r.img_per_sec:10.1f} img/s, speedup {r.speedup:5.2f}x, "
                f"efficiency {r.efficiency:6.1%} ({r.seconds:.1f}s)"
            )


def ladder_table(ladder) -> None:
    from rich.table import Table

    t = Table(title=f"Synthetic {ladder.model} ladder (batch {ladder.batch_size}/process)", header_style="bold")
    for col in ("processes", "nodes", "img/s (+- 1.96 sigma)", "speedup", "efficiency", "per process vs one node"):
        t.add_column(col, justify="right")
    for r in ladder.rungs:
        t.add_row(
            str(r.np),
            str(r.nodes),
            f"{r.img_per_sec:.1f} +- {r.conf:.1f}",
            f"{r.speedup:.2f}x",
            f"{r.efficiency:.1%}",
            "-" if r.node_scaling is None else f"{r.node_scaling:.1%} +- {r.node_scaling_conf:.1%}",
        )
    c = console()
    c.print(t)
    if ladder.alone:
        nodes = Table(title="each node alone, all at once: img/s per process", header_style="bold")
        nodes.add_column("node")
        nodes.add_column("processes", justify="right")
        nodes.add_column("img/s per process (+- 1.96 sigma)", justify="right")
        for a in ladder.alone:
            nodes.add_row(
                _esc(
                    a.node
                    + (f" ({a.hostname})" if a.hostname else "")
                    + (" (slow)" if a.node in ladder.slow_nodes else "")
                ),
                str(a.np),
                f"{a.per_proc:.1f} +- {a.conf:.1f}",
            )
        c.print(nodes)
    style = (
        ("green" if ladder.passed else "yellow" if ladder.status == "INCONCLUSIVE" else "red")
        if ladder.judged
        else "yellow"
    )
    c.print(f"[{style}]{_esc(ladder.verdict)}[/]")
    c.print(f"results: {_esc(ladder.results_dir)}/results.json, scaling.png, rung logs")


# ---- the doctor --------------------------------------------------------------------------------------
def doctor_table(report) -> None:
    from rich.table import Table

    marks = {"ok": "[green]ok[/]", "fail": "[bold red]FAIL[/]", "n/a": "[dim]n/a[/]"}
    t = Table(title="clusterctl doctor", header_style="bold")
    t.add_column("node")
    for check in report.checks:
        t.add_column(check)
    for n in report.nodes:
        t.add_row(_esc(n.host + (f" ({n.name})" if n.name else "")), *(marks[n.cells[c].status] for c in report.checks))
    c = console()
    c.print(t)
    if report.fabric is not None:
        f = report.fabric
        c.print(f"fabric: measured with {_esc(f.tool)}: {_esc(f.tool_why)}")
        if f.nccl is not None:  # all_reduce_perf times each size many times; no spread to print
            c.print(
                f"fabric: all_reduce_perf avg bus bandwidth {f.nccl.avg_busbw_gbyte:.2f} GB/s over "
                f"{len(f.nccl.rows)} sizes, {f.nccl.peak_busbw_gbyte:.2f} GB/s at the largest"
            )
        spread = (lambda a: "") if f.tool == "nccl-tests" else (lambda a: f" +- {a.conf:.2f}")
        c.print(
            "fabric: cluster allreduce "
            + (
                f"{f.cluster.busbw_gbit:.2f}{spread(f.cluster)} Gbit/s busbw"
                if not f.cluster.error
                else f"failed: {_esc(f.cluster.error)}"
            )
        )
        for p in f.pairs:
            c.print(
                f"fabric: pair {_esc(' <-> '.join(p.hosts))}: "
                + (f"{p.busbw_gbit:.2f}{spread(p)} Gbit/s" if not p.error else f"failed: {_esc(p.error)}")
            )
        c.print(f"fabric: judged against {_esc(f.reference)}")
    for line in report.failures():
        c.print(f"[red]FAIL[/] {_esc(line)}")
    c.print("[green]all checks passed[/]" if report.ok else f"[red]{len(report.failures())} check(s) failed[/]")


# ---- sync ----------------------------------------------------------------------------------------------
class SyncProgress:
    """sync's Events (data/outcome.py) drawn with rich: one bar per node (bytes, rate) plus the total, on stderr."""

    def __init__(self, hosts: Sequence[str]):
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TransferSpeedColumn,
        )

        self.bars = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeElapsedColumn(),
            console=console(stderr=True),
            transient=False,
            refresh_per_second=4,
        )
        width = max((len(h) for h in hosts), default=5)
        self.width = max(width, 5)
        self.total = self.bars.add_task("total".ljust(self.width), total=0, start=False)
        self.tasks = {h: self.bars.add_task(_esc(h.ljust(self.width)), total=0, start=False) for h in hosts}
        self.needs: dict[str, int] = {}
        self.done: dict[str, int] = {}
        self._lock = threading.Lock()

    def __enter__(self) -> "SyncProgress":
        self.bars.start()
        return self

    def __exit__(self, *exc) -> None:
        self.bars.stop()

    def phase(self, text: str) -> None:
        self.bars.console.print(f"[dim]{_esc(text)}[/]")

    def need(self, host: str, total: int) -> None:
        with self._lock:
            self.needs[host] = total
            self.done[host] = 0
            self.bars.start_task(self.tasks[host])
            self.bars.update(self.tasks[host], total=total, completed=0)
            self.bars.start_task(self.total)
            self.bars.update(self.total, total=sum(self.needs.values()), completed=sum(self.done.values()))

    def progress(self, host: str, done: int) -> None:
        with self._lock:
            if host not in self.tasks or done < self.done.get(host, 0):
                return
            self.done[host] = done
            self.bars.update(self.tasks[host], completed=done)
            self.bars.update(self.total, completed=sum(self.done.values()))

    def finished(self, outcome) -> None:
        mark = "[green]verified[/]" if outcome.verified else f"[red]{outcome.status}[/]"
        with self._lock:
            if outcome.host in self.tasks:
                if outcome.verified:
                    self.done[outcome.host] = self.needs.get(outcome.host, 0)
                    self.bars.update(self.tasks[outcome.host], completed=self.done[outcome.host])
                self.bars.update(self.tasks[outcome.host], description=f"{_esc(outcome.host.ljust(self.width))} {mark}")
                self.bars.update(self.total, completed=sum(self.done.values()))


def sync_table(report) -> None:
    """The final table: node, bytes, seconds, MB/s, verified; and one summary line."""
    from rich.table import Table

    t = Table(box=None, header_style="bold")
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("NODE", "left"),
        ("BYTES", "right"),
        ("SECONDS", "right"),
        ("MB/S", "right"),
        ("VERIFIED", "left"),
    )
    for col, just in columns:
        t.add_column(col, justify=just)
    for o in report.outcomes:
        rate = f"{o.bytes / o.seconds / 1e6:.1f}" if o.seconds > 0 and o.bytes else "-"
        verified = "yes" if o.verified else f"no: {o.status}: {o.detail}"
        t.add_row(_esc(o.host), f"{o.bytes:,}", f"{o.seconds:.1f}", rate, _esc(verified))
    console().print(t)
    ok = sum(1 for o in report.outcomes if o.verified)
    style = "green" if ok == len(report.outcomes) else "red"
    console(stderr=True).print(
        f"[{style}]{ok} of {len(report.outcomes)} node(s) verified and marked complete: "
        f"{report.files} file(s), {report.total_bytes:,} bytes, {report.strategy}, "
        f"{report.seconds:.1f}s[/]"
    )


# ---- playbooks ---------------------------------------------------------------------------------------
def play_summary(results) -> None:
    c = console()
    for r in results:
        mark = "[dim]skip[/]" if r.skipped else ("[green]ok[/]" if r.ok else "[bold red]FAIL[/]")
        c.print(f"{mark:>6} {_esc(r.step.name)} ({r.step.kind}): {_esc(r.detail)}")
    failed = [r for r in results if not r.ok]
    c.print("[green]playbook finished[/]" if not failed else f"[red]{len(failed)} step(s) failed[/]")


# ---- sweeps --------------------------------------------------------------------------------------------
_SWEEP_STYLE = {
    "done": "green",
    "running": "cyan",
    "starting": "cyan",
    "queued": "dim",
    "failed": "red",
    "lost": "red",
    "cancelled": "yellow",
}


def _sweep_rich_table(rows: Sequence[dict], params: Sequence[str], metric_name: str, title: str | None = None):
    from rich.table import Table

    t = Table(title=title, box=None, header_style="bold", title_justify="left")
    columns: list[tuple[str, JustifyMethod]] = [
        ("TRIAL", "right"),
        *((p.upper(), "right") for p in params),
        ("NODE/GPU", "left"),
        ("STATE", "left"),
        ("ELAPSED", "right"),
        (metric_name.upper(), "right"),
        ("", "left"),
    ]
    for col, just in columns:
        t.add_column(_esc(col), justify=just)
    for r in rows:
        style = _SWEEP_STYLE.get(r["state"], "")
        mark = "[bold green]best[/]" if r["best"] else ""
        note = f"[dim]{_esc(r['note'])}[/]" if r["note"] else ""
        t.add_row(
            r["trial"],
            *(_esc(v) for v in r["params"]),
            _esc(r["node"]),
            f"[{style}]{_esc(r['state'])}[/]" if style else _esc(r["state"]),
            r["elapsed"],
            _esc(r["metric"]),
            " ".join(x for x in (mark, note) if x),
        )
    return t


def sweep_table(rows: Sequence[dict], params: Sequence[str], metric_name: str, title: str | None = None) -> None:
    """The sweep's trials as a table on stdout (the caller orders the rows)."""
    console().print(_sweep_rich_table(rows, params, metric_name, title))


class SweepProgress:
    """The live view of a running sweep: a table redrawn in place on a terminal; elsewhere, one line per
    change (trial started / finished / re-queued, node dead) on stderr."""

    def __init__(self, params: Sequence[str], metric_name: str):
        self.params, self.metric_name = list(params), metric_name
        self.live: Live | None = None
        self.tty = sys.stderr.isatty()

    def __enter__(self) -> "SweepProgress":
        if self.tty:
            from rich.live import Live

            self.live = Live(console=console(stderr=True), refresh_per_second=4, transient=True)
            self.live.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.live is not None:
            self.live.stop()

    def update(self, rows: Sequence[dict], summary: str, lines: Sequence[str]) -> None:
        if self.live is not None:
            from rich.console import Group
            from rich.text import Text

            self.live.update(Group(_sweep_rich_table(rows, self.params, self.metric_name), Text(summary)))
        else:
            for line in lines:
                info(line)


# ---- training ----------------------------------------------------------------------------------------
def train_eval(result) -> None:
    """`clusterctl eval`: the recipe's evaluation line, top-1/top-5 in percent."""
    from rich.table import Table

    t = Table(box=None, header_style="bold")
    for col in ("STEP", "EPOCH", "TOP-1", "TOP-5", "LOSS", "IMAGES", "CHECKPOINT", "TIME (UTC)"):
        t.add_column(col)
    t.add_row(
        str(result.step),
        f"{result.epoch:.1f}",
        f"{result.top1:.2f}%",
        f"{result.top5:.2f}%",
        f"{result.loss:.3f}",
        str(result.examples),
        _esc(result.checkpoint.rsplit("/", 1)[-1] or "-"),
        _esc(result.time or "-"),
    )
    console().print(t)


def train_status(job, st, dollars_per_hour) -> None:
    """The training job under `status`: state, step, epoch, img/s, loss, elapsed, ETA and its cost."""

    c = console()
    c.print(
        f"[bold]training[/] {_esc(job.job)}: {st.state}"
        + (f" ({_esc(st.reason)})" if st.reason else "")
        + (f", restarted {st.restarts}x" if st.restarts else "")
    )
    if st.stop_step:
        c.print(
            f"  step {st.step}/{st.stop_step}  epoch {st.epoch:.2f}/{st.epochs:g}  "
            f"{'-' if st.img_per_sec is None else f'{st.img_per_sec:,.1f}'} img/s  "
            f"loss {'-' if st.loss is None else f'{st.loss:.4f}'}  lr {'-' if st.lr is None else f'{st.lr:.6f}'}  "
            f"{st.size} process(es)"
        )
    cost = None if dollars_per_hour is None else st.cost_to_finish(dollars_per_hour)
    c.print(
        f"  elapsed {duration(st.elapsed_s)} (all runs {duration(st.total_elapsed_s)})  "
        f"ETA {duration(st.eta_s)}  cost to finish {money(cost)}"
    )
    if st.last_checkpoint is not None:
        c.print(f"  last checkpoint: step {st.last_checkpoint.step} ({_esc(st.last_checkpoint.path)})")
    if st.result is not None:
        r = st.result
        c.print(f"  evaluation: top-1 {r.top1:.2f}%  top-5 {r.top5:.2f}%  at step {r.step} ({r.examples} images)")
    elif st.validation is not None:
        v = st.validation
        c.print(
            f"  validation during training: top-1 {v.top1:.2f}%  top-5 {v.top5:.2f}%  at epoch {v.epoch:g} "
            f"(step {v.step}, {v.examples} images)"
        )
