"""`clusterctl keep` and `autostop`: the cluster's autostop held off, changed or turned off, and its state after."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Optional

import typer

from clusterctl.cli.shared import (
    _hourly,
    _store,
    one_cluster,
)
from clusterctl.errors import UsageError
from clusterctl.units import duration, money

if TYPE_CHECKING:
    from clusterctl.state import Record, StateStore

app = typer.Typer()  # its commands are merged into cli/app.py's app (see COMMANDS there)


def _autostop_status(store: StateStore, record: Record) -> None:
    from clusterctl.cli import display
    from clusterctl.cluster import autostop_status

    for line in autostop_status.status_lines(store, record):
        display.console().print(display._esc(line))


@app.command()
@one_cluster()
def keep(
    name: Optional[str] = None,
    for_: str = typer.Option(..., "--for", help="How long nothing may stop it, e.g. 4h."),
) -> None:
    """Keep a cluster up a while longer, idle or not."""
    from clusterctl.autostop import settings as autostop
    from clusterctl.cluster import autostop_control as control

    seconds = autostop.parse_duration(for_, "--for", allow_off=False)
    assert seconds is not None  # allow_off=False: a duration, or an error
    store = _store()
    record = _running(store.resolve(name))
    failed = control.change(store, record, "keep", seconds=seconds)
    until = time.strftime("%Y-%m-%d %H:%M", time.localtime(time.time() + seconds))
    _autostop_done(
        record,
        failed,
        f"cluster {record.cluster.name}: autostop waits until {until} "
        f"({duration(seconds)} from now); then idle-stop and max lifetime apply again",
    )
    _autostop_status(store, record)


@app.command("autostop")
@one_cluster()
def autostop_(
    name: Optional[str] = None,
    off: bool = typer.Option(False, "--off", help="Never stop it by itself (it runs until `down`)."),
    on: bool = typer.Option(False, "--on", help="Turn autostop back on."),
    idle_stop: Optional[str] = typer.Option(None, "--idle-stop", help="New idle limit, e.g. 30m (off: none)."),
    max_lifetime: Optional[str] = typer.Option(
        None, "--max-lifetime", help="New lifetime limit from creation, e.g. 12h (off: none)."
    ),
) -> None:
    """Show or change when a cluster stops itself."""
    from clusterctl.autostop import settings as autostop
    from clusterctl.cli import display
    from clusterctl.cluster import autostop_control as control

    if off and (on or idle_stop or max_lifetime):
        raise UsageError("--off goes alone")
    store = _store()
    record = store.resolve(name)
    c = record.cluster
    if off or on or idle_stop or max_lifetime:
        _running(record)
    if off:
        failed = control.change(store, record, "off")
        _autostop_done(record, failed, f"cluster {c.name}: autostop is off")
        if not failed:
            hourly = _hourly(c)
            display.warn(
                f"{c.name} now runs until `clusterctl down {c.name}`, costing "
                f"{money(hourly)}/hour while it does; `clusterctl autostop {c.name} --on` undoes this"
            )
    elif on or idle_stop or max_lifetime:
        values: dict[str, float | None] = {}
        if idle_stop:
            values["idle_stop"] = autostop.parse_duration(idle_stop, "--idle-stop")
        if max_lifetime:
            values["max_lifetime"] = autostop.parse_duration(max_lifetime, "--max-lifetime")
        failed = control.change(store, record, "on", **values)
        _autostop_done(record, failed, f"cluster {c.name}: autostop is on")
    _autostop_status(store, record)


def _running(record: Record) -> Record:
    if record.status != "up":
        from clusterctl.errors import StateError

        why = f" ({record.note})" if record.note else ""
        name = record.cluster.name
        raise StateError(
            f"cluster {name} is {record.status}{why}",
            f"start it with `clusterctl start {name}`"
            if record.disks_kept
            else "bring it up again with `clusterctl up`, or remove its record with `clusterctl down`",
        )
    return record


def _autostop_done(record: Record, failed: list[str], message: str) -> None:
    from clusterctl.cli import display
    from clusterctl.errors import UnreachableError

    if failed:
        for line in failed:
            display.warn(line)
        raise UnreachableError(
            f"the change did not reach every node of {record.cluster.name} ({len(failed)} failed)",
            "run the command again once the nodes answer",
        )
    display.info(message)
