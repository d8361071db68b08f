"""`clusterctl status`: one cluster as its record, its provider, autostop and its jobs see it: the node table and the training job."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Sequence

import typer

from clusterctl.cli.display import _esc, console, fitted_table, warn
from clusterctl.cli.shared import (
    _provider,
    _store,
    one_cluster,
)
from clusterctl.errors import ExitCode
from clusterctl.units import duration, money

if TYPE_CHECKING:
    from clusterctl.providers.base import ClusterStatus
    from clusterctl.types import Cluster
    from clusterctl.workloads.cluster_view import ClusterView

app = typer.Typer()  # its commands are merged into cli/app.py's app (see COMMANDS there)


@app.command()
@one_cluster()
def status(
    name: Optional[str] = None,
    provider: Optional[str] = typer.Option(None, "--provider", help="Where to look when the local record is gone."),
    region: Optional[str] = typer.Option(
        None, "--region", help="AWS region (default: the record's, else the AWS config's)."
    ),
    json_: bool = typer.Option(False, "--json", help="One JSON object: nodes, lost nodes, autostop, jobs."),
) -> None:
    """Show a cluster's nodes, as its provider sees them now.

    Says where the local record and the provider disagree. Exit status 5 when a node is lost (gone at its
    provider, or not answering ssh).
    """
    from clusterctl.cli import display
    from clusterctl.cluster import overview
    from clusterctl.workloads import cluster_view

    store = _store()
    providers = overview.Providers(lambda kind, reg: _provider(kind, store, reg))
    view = cluster_view.gather(store, providers, name, provider, region)
    if json_:
        display.json_out(cluster_view.as_json(view))
    else:
        view_table(view)
    if any(not x.disks_kept for x in view.lost):  # a stopped node (its disks kept) is shown, not a failure
        raise typer.Exit(int(ExitCode.UNREACHABLE))


def cluster_status(status: ClusterStatus, now: float, current: bool = False, notes: Sequence[str] = ()) -> None:
    """`status` of a cluster as its provider sees it: one row per node, then $/hour and cost so far."""
    c = console()
    c.print(
        f"[bold]{_esc(status.name)}[/] ({status.provider}, {status.region}, {status.instance_type or '-'})"
        + (" [dim]current[/]" if current else "")
    )
    rows = []
    for ns in status.nodes:
        n = ns.node
        up = duration(now - ns.launched_at) if ns.launched_at and ns.state in ("pending", "running") else "-"
        rows.append(
            [
                n.name,
                n.role,
                n.instance_id or "-",
                ns.zone or "-",
                ns.state,
                n.private_ip,
                f"{n.ssh_user}@{n.ssh_host}:{n.ssh_port}",
                str(n.slots),
                up,
            ]
        )
    if status.nodes:
        fitted_table(("NODE", "ROLE", "INSTANCE", "AZ", "STATE", "ADDRESS", "SSH", "SLOTS", "UPTIME"), rows)
    hourly, so_far = status.hourly_usd, status.cost_so_far(now)
    c.print(f"cost: {money(hourly)}/hour now, {money(so_far)} so far (built-in on-demand prices; not a bill)")
    for line in status.other:
        c.print(f"  left without nodes: {_esc(line)}")
    for note in notes:
        c.print(f"[yellow]note:[/] {_esc(note)}")


def view_table(view: ClusterView) -> None:
    """`status`: the cluster's nodes (as the record, or the cloud, has them), then what is lost, autostop,
    the node runtime, and the jobs on it."""
    from clusterctl.cli.train import train_status

    if view.nodes is not None:
        node_table(view.nodes, current=view.current)
    elif view.cloud is not None:
        cluster_status(view.cloud, view.now, current=view.current, notes=view.notes)
    for x in view.lost:
        if x.disks_kept:  # repair keeps it unless named
            warn(f"not running: {x.node.name} ({x.node.private_ip}): {x.why}; its disks are kept")
        else:
            warn(f"lost: {x.node.name} ({x.node.private_ip}): {x.why}; `clusterctl repair` replaces it")
    c = console()
    for line in view.stopped.lines() if view.stopped is not None else ():
        c.print(_esc(line))
    for line in view.autostop:
        c.print(_esc(line))
    if view.runtime is not None:
        c.print(_esc(view.runtime))
    if view.training is not None:
        t = view.training
        if t.status is None:
            warn(f"training job {t.job.job}: {t.error}")
        else:
            train_status(t.job, t.status, t.hourly_usd)
    if view.launches is not None:
        if view.launches.error:
            warn(f"launch jobs: {view.launches.error}")
        for line in view.launches.lines:
            c.print(_esc(line))


def node_table(cluster: Cluster, current: bool = False) -> None:
    console().print(
        f"[bold]{_esc(cluster.name)}[/] ({cluster.provider}, {cluster.region}, {cluster.instance_type})"
        + (" [dim]current[/]" if current else "")
    )
    fitted_table(
        ("NODE", "ROLE", "ADDRESS", "SSH", "SLOTS"),
        [
            [n.name, n.role, n.private_ip, f"{n.ssh_user}@{n.ssh_host}:{n.ssh_port}", str(n.slots)]
            for n in cluster.nodes
        ],
    )
