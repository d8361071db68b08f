"""`clusterctl gc`: everything clusterctl made, grouped by cluster and owner, and what gc removes."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Optional

import typer

from clusterctl.cli.display import _esc, fitted_table, info
from clusterctl.cli.shared import (
    _confirm,
    _provider,
    _store,
)
from clusterctl.units import duration

if TYPE_CHECKING:
    from clusterctl.cluster.gc import Scan

app = typer.Typer()  # its commands are merged into cli/app.py's app (see COMMANDS there)


@app.command()
def gc(
    older_than: Optional[str] = typer.Option(
        None,
        "--older-than",
        help="Only clusters at least this old, e.g. 2h (default: AWS clusters this machine has no record of "
        "once 1h old, the rest whatever their age).",
    ),
    provider: Optional[str] = typer.Option(None, "--provider", help="aws or local (default: both)."),
    region: Optional[str] = typer.Option(None, "--region", help="AWS region (default: the AWS config's)."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
    force: bool = typer.Option(
        False, "--force", help="Also another owner's clusters (AWS: owner tag; local: made by another CLUSTERCTL_HOME)."
    ),
) -> None:
    """Find and remove everything clusterctl left behind.

    Every resource tagged by clusterctl in the AWS region (with or without a local record) and every
    local cluster on this machine, shown with age and owner; on AWS exactly the listed resource ids are
    removed. An AWS cluster this machine has no record of is kept while younger than an hour (it may be in use
    elsewhere) unless --older-than says otherwise. Another owner's clusters (a local one made from another
    CLUSTERCTL_HOME) only with --force.
    """
    from clusterctl.autostop import settings as autostop
    from clusterctl.cli import display
    from clusterctl.cluster import gc as gclib, overview

    limit = autostop.parse_duration(older_than, "--older-than", allow_off=False) if older_than else None
    store = _store()
    providers = overview.Providers(lambda kind, reg: _provider(kind, store, reg), force=force)
    now = time.time()
    found = gclib.scan(store, providers, provider, region, limit, force, display.warn, now)
    for line in found.not_looked:
        display.info(line)
    if not found.found:
        display.info("nothing found: clusterctl left nothing behind")
        return
    gc_table(found, now)
    for line in found.notes(older_than):
        display.info(line)
    if found.chosen:
        _confirm(found.question(), yes)
        gclib.collect(store, providers, found.chosen, display.info)


def gc_table(scan: Scan, now: float) -> None:
    """`gc`: one row per cluster found (age, owner, record here, what happens to it), then each resource of the
    ones to remove."""
    picked, young = {id(c) for c in scan.chosen}, {id(c) for c in scan.young}  # per identity: names may repeat
    rows = []
    for c in scan.found:
        nodes = sum(f.kind in ("instance", "namespace") for f in c.found)
        rows.append(
            [
                _esc(c.name),
                c.where,
                duration(now - c.created_at) if c.created_at else "?",
                _esc(c.owner or "?"),
                c.record or "none",
                str(nodes),
                str(len(c.found)),
                "remove"
                if id(c) in picked
                else ("kept (no record here, young: --older-than)" if c.mine else "kept (another owner's, young)")
                if id(c) in young
                else "kept (younger)"
                if c.mine
                else "kept (another owner's: --force)",
            ]
        )
    fitted_table(("CLUSTER", "WHERE", "AGE", "OWNER", "RECORD HERE", "NODES", "RESOURCES", ""), rows, prose=("",))
    for c in scan.chosen:
        for f in c.found:
            info(
                f"  {c.name}: {f.kind} {f.id}"
                + (f" ({f.state})" if f.state else "")
                + (f", {duration(now - f.created_at)} old" if f.created_at else "")
            )
