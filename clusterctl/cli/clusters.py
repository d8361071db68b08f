"""Commands about clusters: down ls stop start repair, and `ls`'s table (`up` is cli/up.py, `status` cli/status.py)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, List, Mapping, Optional, Sequence

import typer

from clusterctl.cli.display import _esc, fitted_table
from clusterctl.cli.shared import _confirm, _provider, _store, one_cluster
from clusterctl.errors import UsageError
from clusterctl.units import duration, money

if TYPE_CHECKING:
    from clusterctl.cluster.overview import Listing

app = typer.Typer()  # its commands are merged into cli/app.py's app (see COMMANDS there)


@app.command()
@one_cluster("Cluster to remove")
def down(
    name: Optional[str] = None,
    all_: bool = typer.Option(False, "--all", help="Every cluster of this provider."),
    provider: Optional[str] = typer.Option(None, "--provider", help="Where to look when the local record is gone."),
    region: Optional[str] = typer.Option(
        None, "--region", help="AWS region (default: the record's, else the AWS config's)."
    ),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
    force: bool = typer.Option(
        False,
        "--force",
        help="Also another owner's cluster (AWS: another owner tag, no record here; local: another CLUSTERCTL_HOME's).",
    ),
) -> None:
    """Remove a cluster and all it created; prove nothing is left.

    Everything is found by tags (or names), so this works without the local record.
    """
    from clusterctl.cli import display
    from clusterctl.cluster import overview

    store = _store()
    providers = overview.Providers(lambda kind, reg: _provider(kind, store, reg), force=force)
    targets = overview.down_targets(store, providers, name, all_, provider, region, display.warn)
    plan = overview.plan_down(targets, providers, all_)
    for t, why in plan.kept:
        display.info(f"cluster {t.name}: kept ({why}; --force removes it)")
    if not plan.removals:
        display.info("no clusters of yours found" if plan.kept else "no clusters found")
        return
    for r in plan.removals:
        display.info(
            f"cluster {r.target.name} ({r.where}): "
            + (f"{len(r.found)} resource(s) to remove" if r.found else "nothing found")
        )
        for line in r.found:
            display.info(f"  {line}")
    named = (r.target.name + (f" (owner {', '.join(r.owners)})" if r.owners else "") for r in plan.removals)
    _confirm(f"Remove cluster(s) {', '.join(named)} and everything they created?", yes)
    failed = overview.take_down(plan, store, providers, report=display.info)
    if failed:
        from clusterctl.errors import ProvisionError

        raise ProvisionError(f"some resources remain ({' | '.join(failed)})", "run `clusterctl down` again")


@app.command("ls")
def ls(
    provider: Optional[str] = typer.Option(
        None, "--provider", help="Also ask this provider for clusters without a record (aws)."
    ),
    region: Optional[str] = typer.Option(
        None, "--region", help="AWS region to ask (default: the records', else the AWS config's)."
    ),
    json_: bool = typer.Option(False, "--json", help="One JSON object: the clusters and the totals."),
) -> None:
    """List clusters: nodes, type, AZ, state, uptime, cost so far."""
    from clusterctl.cli import display
    from clusterctl.cluster import overview

    store = _store()
    providers = overview.Providers(lambda kind, reg: _provider(kind, store, reg))
    found = overview.listing(store, providers, provider, region, display.warn)
    if json_:
        return display.json_out(overview.listing_json(found))
    rows = [
        {
            "name": r.name + (" *" if r.current else ""),
            "provider": r.provider,
            "region": r.region,
            "nodes": r.nodes,
            "type": r.instance_type or "-",
            "az": r.zones or "-",
            "state": r.state,
            "uptime": duration(r.uptime_s),
            "$/hour": money(r.hourly_usd) if r.priced else "-",
            "cost so far": money(r.so_far_usd) if r.priced else "-",
            "note": r.note,
        }
        for r in found.rows
    ]
    if not rows:
        display.info("no clusters; bring one up with `clusterctl up --provider local --nodes 2`")
        return
    cluster_table(
        rows, ("name", "provider", "region", "nodes", "type", "az", "state", "uptime", "$/hour", "cost so far", "note")
    )
    display.info(_total_line(found))


def _total_line(found: Listing) -> str:
    """`ls`'s last line: what the clusters cost now and so far, and what the stopped ones' disks cost."""
    return (
        f"total: {money(found.hourly_usd)}/hour now, {money(found.so_far_usd)} so far for {len(found.rows)} cluster(s)"
        + (f" ({found.unknown} cluster(s) of unknown price not counted)" if found.unknown else "")
        + (
            f"; {money(found.stopped_monthly_usd)}/month for stopped clusters' disks"
            if found.stopped_monthly_usd
            else ""
        )
        + " (built-in on-demand prices; not a bill)"
    )


@app.command()
@one_cluster("Cluster to stop")
def stop(
    name: Optional[str] = None,
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask; needed when jobs run (they end)."),
) -> None:
    """Stop a cluster's nodes, their disks kept.

    `clusterctl start` brings it back. AWS: the instances stop (EBS volumes, addresses inside the VPC and host
    keys kept; the disks are billed while stopped). Local: the nodes' namespaces end, their homes are kept.
    Running jobs end: they are listed, and `stop` refuses without --yes while any runs.
    """
    from clusterctl.cli import display
    from clusterctl.cluster import costs, provision

    store = _store()
    record = store.resolve(name)
    c = record.cluster
    impl = _provider(c.provider, store, c.region)
    provision.refuse_unfinished(record)
    if record.status == "stopped" or provision.stopped(record, impl, every=True):
        display.info(f"cluster {c.name} is already stopped" + (f" ({record.note})" if record.note else ""))
        return
    running = _running_jobs(c.name)
    for line in running:
        display.info(f"running: {line}")
    if running and not yes:
        raise UsageError(
            f"{len(running)} job(s) run on cluster {c.name}, and stopping it ends them",
            f"let them finish (`clusterctl jobs -c {c.name}`), or pass --yes to stop it anyway",
        )
    _confirm(f"Stop cluster {c.name} ({len(c.nodes)} node(s)), its disks kept?", yes)
    provision.stop(c.name, store, impl, report=display.info)
    monthly = costs.stopped_monthly(impl.status(c.name), not impl.lists_from_cloud)
    display.info(f"cluster {c.name} is stopped; {costs.stopped_line(monthly)}")
    display.info(f"`clusterctl start {c.name}` starts it again")


@app.command()
@one_cluster("Cluster to start")
def start(
    name: Optional[str] = None,
    ssh_timeout: float = typer.Option(300.0, "--ssh-timeout", help="Seconds to wait for ssh on every node."),
) -> None:
    """Start a stopped cluster again.

    On its kept disks: the same nodes, names, host keys and runtime; AWS gives them new public addresses, and
    the ssh config, the pinned known_hosts and the hosts files follow. Autostop's watchdog is back as `up` left
    it.
    """
    from clusterctl.cli import display
    from clusterctl.cli.status import node_table
    from clusterctl.cluster import provision

    store = _store()
    record = store.resolve(name)
    c = record.cluster
    began = time.monotonic()
    cluster = provision.start(c.name, store, _provider(c.provider, store, c.region), display.info, ssh_timeout)
    if cluster is None:
        display.info(f"cluster {c.name} is already running; nothing to do")
        return
    display.info(
        f"cluster {c.name} is up again: {len(cluster.nodes)} node(s) in {time.monotonic() - began:.1f}s; "
        f"hosts: {', '.join(n.private_ip for n in cluster.nodes)}"
    )
    node_table(cluster)


def _running_jobs(name: str) -> list[str]:
    """The cluster's running detached jobs (what `clusterctl jobs` lists), one line each; a node that does not
    answer is warned about (its jobs cannot be listed)."""
    from clusterctl.cli import display
    from clusterctl.cli.fanout import _jobs
    from clusterctl.cli.shared import Ssh, _inventory

    found, report = _jobs(_inventory(None, Ssh(cluster=name)), 64)
    for r in report:
        if not r.ok:
            display.warn(f"{r.host}: {r.error or f'exit {r.exit_code}'}: its jobs are not known")
    return [f"job {j.id} {j.name} ({j.kind}, on {', '.join(j.hosts)})" for j in found if j.state == "running"]


@app.command()
@one_cluster()
def repair(
    name: Optional[str] = None,
    drop: bool = typer.Option(
        False, "--drop", help="Remove the lost nodes from the cluster instead of replacing them."
    ),
    data: List[str] = typer.Option(
        [], "--data", help="Also copy this dataset folder (a `sync` DST) from a peer; repeatable."
    ),
    node: List[str] = typer.Option(
        [],
        "--node",
        help="Replace (or drop) this node too, though it runs or is stopped with its disks; repeatable.",
    ),
    unreachable_for: str = typer.Option(
        "3m",
        "--unreachable-for",
        help="How long a running node may not answer ssh (probed 4 times over it) before it is reported.",
    ),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
    watch: Optional[float] = typer.Option(
        None, "--watch", help="Check again every this many seconds and repair what is lost, until Ctrl-C (needs --yes)."
    ),
) -> None:
    """Replace lost nodes with new ones like their peers.

    A node is lost when its provider says it is gone (terminated, missing; a local node's namespace). A running
    node that does not answer ssh over --unreachable-for, or a stopped one (its disks kept), is reported and kept
    unless named with --node. The new nodes get pinned host keys, the cluster key, the node runtime and the
    datasets `sync` put on the cluster, all checked, before the hosts files, the ssh config and the record name
    them; only then is what is left of the lost nodes removed. --drop removes the lost nodes from the cluster
    instead. Then the same `train` command resumes from its last checkpoint.
    """
    from clusterctl.autostop import settings as autostop
    from clusterctl.cli import display
    from clusterctl.cluster import repair as repairing

    window = autostop.parse_duration(unreachable_for, "--unreachable-for", allow_off=False)
    probing = repairing.Probing(float(window or repairing.UNREACHABLE_FOR))
    store = _store()
    record = store.resolve(name)
    impl = _provider(record.cluster.provider, store, record.cluster.region)
    if watch is not None:
        if not yes:
            raise UsageError("--watch repairs without asking", "pass --yes with it")
        display.info(f"checking cluster {record.cluster.name} every {watch:g}s; Ctrl-C stops")
        repairing.watch(
            store,
            impl,
            record.cluster.name,
            drop=drop,
            interval=watch,
            report=display.info,
            data=data,
            named=node,
            probing=probing,
        )
        return
    plan = repairing.plan(store, impl, record.cluster.name, drop, named=node, probing=probing, report=display.info)
    for line in plan.lines():
        display.info(line)
    repairing.check(plan)
    if not plan.lost:
        return
    _confirm(f"{'Drop' if drop else 'Replace'} {len(plan.lost)} lost node(s) of {record.cluster.name}?", yes)
    repairing.carry_out(store, impl, plan, report=display.info, data=data)


# ---- `ls`'s table ------------------------------------------------------------------------------------------
def cluster_table(
    rows: Sequence[Mapping[str, object]],
    columns: Sequence[str] = ("name", "provider", "nodes", "type", "slots", "age", "state"),
) -> None:
    fitted_table(
        [c.upper() for c in columns], [[_esc(str(r.get(c, ""))) for c in columns] for r in rows], prose=("NOTE",)
    )
