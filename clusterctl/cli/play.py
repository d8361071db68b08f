"""`clusterctl play` and `run-job`: a playbook's steps, or a spec file's job, and the steps' summary."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, List, Optional

import typer

from clusterctl.cli.shared import (
    CLUSTER,
    _store,
)
from clusterctl.errors import ExitCode, UsageError

if TYPE_CHECKING:
    pass

app = typer.Typer()  # its commands are merged into cli/app.py's app (see COMMANDS there)


# ---- playbooks -------------------------------------------------------------------------------------------
@app.command()
def play(
    playbook: str = typer.Argument(..., help="A playbook file, or the name of a shipped one (smoke, cleanup ...)."),
    hostsfile: Optional[str] = typer.Option(None, "--hosts", help="A hosts file (default: the current cluster)."),
    cluster: Optional[str] = CLUSTER,
    var: List[str] = typer.Option([], "--var", help="Override a variable: --var name=value (repeatable)."),
    start_from: Optional[str] = typer.Option(None, "--from", help="Resume from this step."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print what each step would run; run nothing."),
) -> None:
    """Run a playbook of named steps (run, put, sync, bench ...)."""
    from clusterctl.cli import display
    from clusterctl.cluster import inventory
    from clusterctl.playbook import load as pbload, model as pbmodel, run as pb

    book = pbload.load(pbload.find(playbook), pbload.parse_vars(var))
    if dry_run:
        for step in book.steps:
            display.info(
                f"{step.name}: {pb.describe(step)}" + ("" if step.on_failure == "stop" else "  [on_failure: continue]")
            )
        return
    store = _store()
    with display.StepLine() as on_step:
        ctx = pbmodel.Context(
            inventory.resolve(hostsfile, cluster, store),
            store,
            report=display.info,
            on_step=on_step,
            base=Path(book.path).parent,
        )
        results = pb.execute(book, ctx, start_from)
    display.play_summary(results)
    if not all(r.ok for r in results):
        raise typer.Exit(int(ExitCode.REMOTE_FAILED))


@app.command("run-job", short_help="Start a job the spec file names (its `jobs:`).")
def run_job(
    job: str = typer.Argument(..., help="The job's name in the spec file's `jobs:`."),
    spec_file: Optional[Path] = typer.Option(None, "--file", "-f", help="The spec file (default: ./clusterctl.yaml)."),
    cluster: Optional[str] = typer.Option(
        None, "--cluster", "-c", help="A cluster by name (default: the file's name, else the current)."
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print what the job would run; run nothing."),
) -> None:
    """Start a job of the spec file: a train, a launch, a playbook (play) or any playbook step, by its name."""
    from clusterctl.cli import display
    from clusterctl.cli.up import file_schema
    from clusterctl.cluster import inventory
    from clusterctl.playbook import model as pbmodel, run as pb, specfile

    path = specfile.find(spec_file, Path.cwd(), shape_given=False)
    if path is None:
        raise UsageError(f"no spec file: no ./{specfile.FILE_NAME} here", "name one with -f FILE")
    sf = specfile.load(path, file_schema())
    step = sf.job(job)
    if dry_run:
        display.info(f"{step.name}: {pb.describe(step)}")
        return
    name = cluster or (str(sf.settings["name"].value) if "name" in sf.settings else None)
    store = _store()
    ctx = pbmodel.Context(inventory.resolve(None, name, store), store, report=display.info, base=path.parent)
    display.info(f"job {step.name} ({step.kind}) from {sf.where}:{step.line}")
    ok, detail = specfile.run_job(sf, step, ctx)
    display.info(f"job {step.name}: {detail}")
    if not ok:
        raise typer.Exit(int(ExitCode.REMOTE_FAILED))
