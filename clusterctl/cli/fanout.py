"""Commands that fan out over every node: run jobs logs kill clean agent; the jobs table and clean's disk table."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, List, Optional, Sequence

import typer

from clusterctl.cli.display import _esc, fitted_table, fold_hosts, info, warn
from clusterctl.cli.shared import (
    _SSH,
    DEFAULT_SSH,
    FANOUT,
    HOSTS,
    LOGIN,
    Ssh,
    _confirm,
    _fan_out,
    _inventory,
    _print_line,
    _provider,
    _store,
    ssh_options,
    within,
)
from clusterctl.cli.train import _train_logs
from clusterctl.errors import UsageError, combined
from clusterctl.units import duration

if TYPE_CHECKING:
    from rich.console import JustifyMethod

    from clusterctl.cluster.clean import DiskRow
    from clusterctl.cluster.clean_run import CleanSpec
    from clusterctl.cluster.inventory import Inventory
    from clusterctl.types import RunReport
    from clusterctl.workloads.jobs import Job

app = typer.Typer()  # its commands are merged into cli/app.py's app (see COMMANDS there)


class _FlagsAfter(typer.core.TyperCommand):
    """`run hosts CMD --timeout 5`: run's own flags after the command are read as flags, as where they belong
    (CMD is one quoted word; anything after its first word that is no flag of run is still refused)."""

    def parse_args(self, ctx: Any, args: List[str]) -> List[str]:
        takes = {
            o: not getattr(p, "is_flag", False) for p in self.params if p.param_type_name == "option" for o in p.opts
        }
        i, words = 0, False
        while i < len(args) and args[i] != "--":
            name = args[i].split("=", 1)[0]
            if name in takes and words:
                args = args[i:] + args[:i]  # the flags first, then the [HOSTS] CMD they followed
                break
            words = words or name not in takes
            i += 1 + (name in takes and takes[name] and "=" not in args[i])
        return super().parse_args(ctx, args)


@app.command(cls=_FlagsAfter, context_settings={"allow_interspersed_args": False})
@ssh_options(*LOGIN)
def run(
    args: List[str] = typer.Argument(..., metavar="[HOSTS] CMD", help="A hosts file (optional) and the command."),
    cluster: Optional[str] = _SSH["cluster"],
    parallel: int = _SSH["parallel"],
    timeout: Optional[float] = typer.Option(None, "--timeout", help="Seconds the command may run on each host."),
    connect_timeout: float = _SSH["connect_timeout"],
    group: bool = typer.Option(False, "--group", "-g", help="Fold identical outputs into one block."),
    json_: bool = typer.Option(False, "--json", help="One JSON object per host."),
    detach: Optional[str] = typer.Option(
        None,
        "--detach",
        "-d",
        metavar="NAME",
        help="Start it in tmux session NAME on every host and return (see logs, kill).",
    ),
    ssh: Ssh = DEFAULT_SSH,
    failed_hosts: Optional[str] = typer.Option(
        None,
        "--failed-hosts",
        metavar="FILE",
        help="Write the hosts that failed or were unreachable to FILE, a hosts "
        "file: `clusterctl run FILE CMD` retries just those.",
    ),
) -> None:
    """Run a command on every node at once."""
    from clusterctl.cli import display

    if len(args) > 2:
        import shlex

        hosts_first = Path(args[0]).is_file()  # the command's words after a hosts file, or the words alone
        quoted = [*args[:1], shlex.join(args[1:])] if hosts_first else [shlex.join(args)]
        raise UsageError("too many arguments", f"quote the command: clusterctl run {shlex.join(quoted)}")
    hosts_path, cmd = (args[0], args[1]) if len(args) == 2 else (None, args[0])
    within("--timeout", timeout, above=0)
    if detach is not None:
        from clusterctl.remote import tmux as jobs

        cmd = jobs.detach_command(detach, cmd)  # validates NAME before anything connects
    ssh = replace(ssh, cluster=cluster, parallel=parallel, connect_timeout=connect_timeout)
    inv = _inventory(hosts_path, ssh)
    report = _fan_out(inv, cmd, parallel, timeout, live=not (group or json_))
    if failed_hosts is not None:
        _write_failed_hosts(inv, report, failed_hosts)
    if json_:
        display.json_lines(report)
    elif group:
        display.grouped_output(report)
    if not json_:
        display.summary(report)
    raise typer.Exit(report.exit_code)


def _write_failed_hosts(inv: Inventory, report: RunReport, path: str) -> None:
    """pssh -o / clush -b habits: the hosts to retry, with their slots (an empty file when none failed, so an
    old list never lingers)."""
    from clusterctl.cli import display
    from clusterctl.state import atomic_write

    bad = {r.host for r in report if not r.ok}
    text = "".join(f"{e.host} slots={e.slots}\n" for e in inv.hosts.entries if e.host in bad)
    atomic_write(Path(path).expanduser(), text, mode=0o644)
    display.info(f"{len(bad)} failed host(s) written to {path}" if bad else f"no host failed: {path} is empty")


@app.command("jobs", short_help="Every detached job on the nodes, by id: kind, state, exit.")
@ssh_options(*FANOUT)
def jobs_(
    hostsfile: Optional[str] = HOSTS,
    json_: bool = typer.Option(False, "--json", help="A JSON list, one object per job (keys: docs/run.md)."),
    ssh: Ssh = DEFAULT_SSH,
) -> None:
    """List every detached job the nodes hold (run --detach, train, launch, sweep, tensorboard, data tfrecords
    --on leader), newest first: id, name, kind, state, start, duration, nodes, exit status. `logs` and `kill`
    take the id or the name. Exit status 0, or the unreachable hosts' status when some did not answer."""
    import json

    from clusterctl.cli import display

    inv = _inventory(hostsfile, ssh)
    found, report = _jobs(inv, ssh.parallel)
    now = time.time()
    if json_:
        _print_line(json.dumps([j.to_json(now) for j in found], indent=1))
    else:
        jobs_table(found, now)
    for r in report:
        if not r.ok:
            display.warn(f"{r.host}: {r.error or f'exit {r.exit_code}'}: its jobs are not listed")
    raise typer.Exit(0 if all(r.ok for r in report) else report.exit_code)


def _jobs(inv: Inventory, parallel: int) -> tuple[list[Job], RunReport]:
    from clusterctl.remote import tmux
    from clusterctl.workloads import jobs as joblib

    report = _fan_out(inv, tmux.list_command(), parallel, live=False)
    return joblib.parse(report), report


def _job_name(inv: Inventory, key: str, parallel: int) -> str:
    """`key` as logs and kill take it: a job's name, or its id (looked up on the nodes)."""
    from clusterctl.remote import tmux
    from clusterctl.workloads import jobs as joblib

    tmux.validate_job_name(key)
    if not joblib.is_id(key):
        return key
    return joblib.find(_jobs(inv, parallel)[0], key).name


@app.command(short_help="Stream a detached job's output.")
@ssh_options(*FANOUT)
def logs(
    name: Optional[str] = typer.Argument(
        None, help="The job's id or name (see jobs); default: the training job, from the leader."
    ),
    hostsfile: Optional[str] = HOSTS,
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep streaming until the job ends everywhere."),
    ssh: Ssh = DEFAULT_SSH,
) -> None:
    """Stream a detached job's output from every host, prefixed by host; with -f, until it ends.
    Exit status: the job's worst exit status once it ended (0 while it still runs)."""
    from clusterctl.cli import display
    from clusterctl.remote import tmux as jobs

    if name is None:
        return _train_logs(hostsfile, ssh.cluster, follow, ssh.connect_timeout)
    inv = _inventory(hostsfile, ssh)
    cmd = jobs.logs_command(_job_name(inv, name, ssh.parallel), follow)
    report = _fan_out(inv, cmd, ssh.parallel)
    display.summary(report)
    raise typer.Exit(report.exit_code)


@app.command("kill", short_help="End a detached job on every node.")
@ssh_options(*FANOUT)
def kill_(
    name: str = typer.Argument(..., help="The job's id or name (see jobs)."),
    hostsfile: Optional[str] = HOSTS,
    grace: float = typer.Option(3.0, "--grace", help="Seconds between SIGTERM and SIGKILL."),
    ssh: Ssh = DEFAULT_SSH,
) -> None:
    """End a detached job on every host: its whole process tree, then its tmux session; verified."""
    from clusterctl.cli import display
    from clusterctl.remote import tmux as jobs

    within("--grace", grace, 0, 300, unit="seconds")
    jobs.validate_job_name(name)
    inv = _inventory(hostsfile, ssh)
    cmd = jobs.kill_job_command(_job_name(inv, name, ssh.parallel), grace)
    report = _fan_out(inv, cmd, ssh.parallel)
    display.summary(report)
    raise typer.Exit(report.exit_code)


@app.command(short_help="Kill leftovers, remove logs, disks, reboot.")
@ssh_options(*FANOUT)
def clean(
    hostsfile: Optional[str] = HOSTS,
    kill: bool = typer.Option(
        False, "--kill", help="SIGKILL the jobs clusterctl started, every process of them (the default action)."
    ),
    all_user_processes: bool = typer.Option(
        False,
        "--all-user-processes",
        help="With --kill: every python/horovodrun/mpirun/orted tree of the login user, whoever started it.",
    ),
    logs_dir: Optional[str] = typer.Option(None, "--logs", metavar="DIR", help="Remove this folder on every node."),
    force: bool = typer.Option(
        False,
        "--force",
        help="With --logs: allow a folder outside the login user's home, or one holding a verified dataset or a "
        "checkpoint.",
    ),
    disk: bool = typer.Option(False, "--disk", help="Table of free/used disk per node (under 10%% free flagged)."),
    reboot: bool = typer.Option(False, "--reboot", help="Reboot every node and wait until each answers ssh again."),
    wait: float = typer.Option(300.0, "--wait", help="Seconds to wait for rebooted nodes."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation (--kill, --logs, --reboot)."),
    ssh: Ssh = DEFAULT_SSH,
) -> None:
    """The troubleshooting commands, done safely: kill leftover jobs, remove a log folder, show disks, reboot.

    --kill (the default) ends the jobs clusterctl started (run --detach, launch, train, sweep: every process of
    them, on every node) after naming them and asking; --all-user-processes widens it to every python,
    horovodrun, mpirun or orted tree of the login user. Without a terminal, --yes confirms (else exit 2)."""
    from clusterctl.cli import display
    from clusterctl.cluster import clean as cleanlib, clean_run

    spec = clean_run.CleanSpec(  # every option checked here, before anything connects
        kill=kill,
        all_user_processes=all_user_processes,
        logs_dir=logs_dir,
        force=force,
        disk=disk,
        reboot=reboot,
        wait=wait,
    )
    inv = _inventory(hostsfile, ssh)
    where = f"{len(inv.targets)} node(s)"
    doomed = _clean_preview(inv, spec, ssh.parallel, where) if spec.kill else 0
    resolved = _logs_preview(inv, spec, ssh.parallel) if spec.logs_dir is not None else []
    for question in spec.questions(where, doomed, resolved):
        _confirm(question, yes)
    codes = []
    for step in spec.steps():
        report = _fan_out(inv, step.command, ssh.parallel, live=step.live)
        if step.kind == "disk":
            disk_table([row for r in report if r.ok for row in cleanlib.parse_disk(r.host, r.stdout)])
        if step.live or not report.all_ok:
            display.summary(report)
        codes.append(report.exit_code)
    if spec.reboot:
        codes.append(_reboot(inv, ssh.parallel, spec.wait))
    raise typer.Exit(combined(codes))


def _clean_preview(inv: Inventory, spec: CleanSpec, parallel: int, where: str) -> int:
    """Name every process tree `clean` would kill, on every node; how many."""
    from clusterctl.cli import display

    _name_this_process()  # so a clean run from a node never matches clusterctl itself
    listed = _fan_out(inv, spec.list_command(), parallel, live=False)
    doomed = [(r.host, line.strip()) for r in listed if r.ok for line in r.stdout.splitlines() if line.strip()]
    for host, line in doomed:
        display.info(f"{host}: would kill {line}")
    if not listed.all_ok:
        display.summary(listed)
    if not doomed:
        display.info(f"no {spec.whose} to kill on {where}")
    return len(doomed)


def _logs_preview(inv: Inventory, spec: CleanSpec, parallel: int) -> list[str]:
    """Every --logs check on every node first, nothing changed: the folders it resolves to (named in the
    confirmation), or, when any node refuses, that node's line and its exit status before anything is removed."""
    from clusterctl.cli import display
    from clusterctl.cluster import clean as cleanlib

    checked = _fan_out(inv, spec.logs_check_command(), parallel, live=False)
    if not checked.all_ok:
        display.summary(checked)
        raise typer.Exit(checked.exit_code)
    resolved = [(r.host, cleanlib.would_remove(r.stdout)) for r in checked]
    for host, real in resolved:
        display.info(f"{host}: would remove {real}" if real else f"{host}: nothing at {spec.logs_dir}")
    return [real for _, real in resolved if real]


def _name_this_process() -> None:
    try:
        import ctypes

        ctypes.CDLL(None).prctl(15, b"clusterctl", 0, 0, 0)  # PR_SET_NAME
    except Exception:
        pass


def _reboot(inv: Inventory, parallel: int, wait: float) -> int:
    from clusterctl.cli import display
    from clusterctl.cluster import clean as cleanlib

    start = time.monotonic()
    store = _store()
    provider = _provider(inv.cluster.provider, store, inv.cluster.region) if inv.cluster is not None else None
    why = cleanlib.reboot(inv, provider, parallel, wait, display.info, store.root)
    for t in inv.targets:
        if why.get(t.label) is None:
            display.info(f"{t.label}: back after {time.monotonic() - start:.1f}s")
        else:
            display.warn(f"{t.label}: {why[t.label]}")
    code = cleanlib.reboot_exit_code(why)
    if code == 0:
        display.info(f"{len(inv.targets)} node(s) rebooted and answering ssh")
    return code


@app.command("agent", short_help="Status or stop of the connection agent.")
def agent_(action: str = typer.Argument("status", help="status | stop")) -> None:
    """The background holder of reused ssh connections: status, or stop it (down stops it too)."""
    from clusterctl.cli import display
    from clusterctl.remote import agent

    root = _store().root
    if action == "status":
        info = agent.ping(root)
        if info is None or info.get("event") != "pong":
            display.info("no connection agent running")
        else:
            display.info(
                f"connection agent pid {info['pid']}: {info['connections']} connection(s) open, "
                f"exits after {info['idle']:.0f}s idle; socket {agent.socket_path(root)}"
            )
    elif action == "stop":
        display.info("connection agent stopped" if agent.stop(root) else "no connection agent running")
    else:
        raise UsageError(f"unknown action {action!r}", "use status or stop")


def jobs_table(found: Sequence[Job], now: float) -> None:
    """`jobs`: one row per detached job, newest first."""
    import time as _time

    if not found:
        info("no detached jobs on these nodes")
        return
    rows = [
        [
            j.id,
            _esc(j.name),
            j.kind,
            j.state,
            _time.strftime("%Y-%m-%d %H:%M", _time.localtime(j.started)) if j.started is not None else "-",
            duration(j.duration(now)),
            str(j.nodes or len(j.hosts)),
            "-" if j.exit_status is None else str(j.exit_status),
        ]
        for j in found
    ]
    fitted_table(("ID", "NAME", "KIND", "STATE", "STARTED", "DURATION", "NODES", "EXIT"), rows)


def disk_table(rows: Sequence[DiskRow]) -> None:
    """clean --disk: one row per node and file system; under 10% free flagged."""
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("HOST", "left"),
        ("MOUNT", "left"),
        ("SIZE", "right"),
        ("USED", "right"),
        ("FREE", "right"),
        ("FREE%", "right"),
        ("", "left"),
    )
    fitted_table(
        columns,
        [
            [
                _esc(r.host),
                _esc(r.mount),
                _size(r.size_kb),
                _size(r.used_kb),
                _size(r.free_kb),
                f"{r.free_fraction:.0%}",
                "[red]LOW[/]" if r.low else "",
            ]
            for r in rows
        ],
    )
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
