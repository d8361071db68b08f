"""`clusterctl doctor`: the preflight check of every node, and its table."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Optional

import typer

from clusterctl.cli.display import _esc, console, fitted_table
from clusterctl.cli.shared import (
    CLUSTER,
    DEFAULT_SSH,
    HOSTS,
    LOGIN,
    Ssh,
    _provider,
    _resolve_hosts,
    _store,
    ssh_options,
    within,
)
from clusterctl.errors import ExitCode

if TYPE_CHECKING:
    from clusterctl.state import StateStore
    from clusterctl.types import Cluster
    from clusterctl.workloads.doctor.judge import Allreduce, DoctorReport

app = typer.Typer()  # its commands are merged into cli/app.py's app (see COMMANDS there)


# ---- the preflight check ---------------------------------------------------------------------------------
@app.command()
@ssh_options(*LOGIN)
def doctor(
    hostsfile: Optional[str] = HOSTS,
    cluster: Optional[str] = CLUSTER,
    json_: bool = typer.Option(False, "--json", help="The report as JSON."),
    python: Optional[str] = typer.Option(None, "--python", help="Python on the nodes (default: the cluster's)."),
    timeout: float = typer.Option(120.0, "--timeout", help="Seconds the probe may take on each node."),
    fabric: bool = typer.Option(
        False, "--fabric", help="Also measure allreduce bandwidth: the cluster, and ring neighbours."
    ),
    fabric_mb: float = typer.Option(64.0, "--fabric-mb", help="MiB per allreduce in the --fabric test."),
    ssh: Ssh = DEFAULT_SSH,
) -> None:
    """Preflight checks that silently ruin multi-node training.

    ssh mesh, versions, GPUs, disk, memory, clock, stale processes, cloud placement; with --fabric, the
    allreduce bandwidth of the cluster and of each node's ring neighbours, the slow node named.
    """
    import json as jsonlib

    from clusterctl.cli import display
    from clusterctl.workloads.doctor import preflight as doctorlib

    if fabric:
        within("--fabric-mb", fabric_mb, above=0, high=4096)
    store = _store()
    inv = _resolve_hosts(hostsfile, cluster, ssh, store=store)
    if fabric:
        inv.hosts.check_launchable()  # horovodrun takes one ssh port for every host
    with display.StepLine() as steps:
        report = doctorlib.run(inv, python, timeout, _cloud_facts(inv.cluster, store), steps)
        if fabric:
            report = doctorlib.with_fabric(
                report, doctorlib.fabric(inv, python=python, mb=fabric_mb, timeout=max(timeout, 300.0), on_step=steps)
            )
    if json_:
        sys.stdout.write(jsonlib.dumps(report.to_dict()) + "\n")
    else:
        doctor_table(report)
    if any(n.cells["reachable"].status == "fail" for n in report.nodes):
        raise typer.Exit(int(ExitCode.UNREACHABLE))
    if not report.ok:
        raise typer.Exit(int(ExitCode.REMOTE_FAILED))


def _cloud_facts(cluster: Cluster | None, store: StateStore) -> dict[str, dict[str, str]] | None:
    """Instance type / zone / placement per node, as the cluster's provider sees them (None for a hosts file)."""
    if cluster is None:
        return None
    from clusterctl.workloads.doctor import preflight as doctorlib

    impl = _provider(cluster.provider, store, cluster.region)
    return doctorlib.placement_facts(cluster, impl.node_facts(cluster))


# ---- the doctor's table ------------------------------------------------------------------------------------
def doctor_table(report: DoctorReport) -> None:
    marks = {"ok": "[green]ok[/]", "fail": "[bold red]FAIL[/]", "n/a": "[dim]n/a[/]"}
    rows = [
        [_esc(n.host + (f" ({n.name})" if n.name else "")), *(marks[n.cells[c].status] for c in report.checks)]
        for n in report.nodes
    ]
    fitted_table(("node", *report.checks), rows, title="clusterctl doctor", boxed=True)
    c = console()
    if report.fabric is not None:
        f = report.fabric
        c.print(f"fabric: measured with {_esc(f.tool)}: {_esc(f.tool_why)}")
        if f.network:
            c.print(_esc(f.network))
        if f.nccl is not None:  # all_reduce_perf times each size many times; no spread to print
            c.print(
                f"fabric: all_reduce_perf avg bus bandwidth {f.nccl.avg_busbw_gbyte:.2f} GB/s over "
                f"{len(f.nccl.rows)} sizes, {f.nccl.peak_busbw_gbyte:.2f} GB/s at the largest"
            )
        timed_alone = f.tool != "nccl-tests"  # our own allreduce: a spread over its timed runs

        def spread(a: Allreduce) -> str:
            return f" +- {a.conf:.2f}" if timed_alone else ""

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
