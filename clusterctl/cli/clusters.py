"""Commands about clusters: down ls status stop start repair keep autostop gc hosts ssh (`up` is cli/up.py)."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any, List, Optional

import typer

from clusterctl.cli.shared import CLUSTER, CURRENT_CLUSTER, _confirm, _hourly, _provider, _store, one_cluster
from clusterctl.errors import UsageError
from clusterctl.hostsfile import FORMATS
from clusterctl.units import duration, money

if TYPE_CHECKING:
    from clusterctl.cluster.overview import Listing
    from clusterctl.state import Record, StateStore
    from clusterctl.types import Cluster

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
    from clusterctl.cli import display, tables
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
    tables.cluster_table(
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
    from clusterctl.cli import display, tables
    from clusterctl.cluster import overview
    from clusterctl.errors import ExitCode
    from clusterctl.workloads import cluster_view

    store = _store()
    providers = overview.Providers(lambda kind, reg: _provider(kind, store, reg))
    view = cluster_view.gather(store, providers, name, provider, region)
    if json_:
        display.json_out(cluster_view.as_json(view))
    else:
        tables.cluster_view(view)
    if any(not x.disks_kept for x in view.lost):  # a stopped node (its disks kept) is shown, not a failure
        raise typer.Exit(int(ExitCode.UNREACHABLE))


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
    from clusterctl.cli import display, tables
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
    tables.node_table(cluster)


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
    from clusterctl.cli import display, tables
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
    tables.gc_table(found, now)
    for line in found.notes(older_than):
        display.info(line)
    if found.chosen:
        _confirm(found.question(), yes)
        gclib.collect(store, providers, found.chosen, display.info)


@app.command()
def hosts(
    hostsfile: Optional[str] = typer.Argument(None, help="A hosts file to read (default: the current cluster)."),
    cluster: Optional[str] = CLUSTER,
    format_: str = typer.Option("slots", "--format", "-f", help=FORMATS),
    task: Optional[int] = typer.Option(
        None, "--task", help="tf-config: this node's index (0, the leader, is the chief)."
    ),
    json_: bool = typer.Option(False, "--json", help="The same as --format json."),
) -> None:
    """Print the hosts for DeepSpeed, Horovod, MPI, pdsh, TF_CONFIG.

    Each format is written as its reader parses it; a host it cannot express (a port of its own, an IPv6
    address Horovod or pdsh cannot read) is refused, never passed through.
    """
    from clusterctl.cluster import reach
    from clusterctl.hostsfile import HostsFile

    if json_ and format_ not in ("slots", "json"):
        raise UsageError("--json and --format together", "give one of them")
    if hostsfile is not None:
        hf = HostsFile.read(hostsfile)
    else:
        hf = reach.hosts_file(_store().resolve(cluster).cluster)
    sys.stdout.write(hf.render_as("json" if json_ else format_, task))


class _AfterDashes(typer.core.TyperCommand):
    """Keeps what follows `--` apart (click drops the `--`), so `ssh -- hostname` is a command, not a node."""

    def parse_args(self, ctx: Any, args: List[str]) -> List[str]:
        ctx.meta["after --"] = args[args.index("--") + 1 :] if "--" in args else None
        return super().parse_args(ctx, args[: args.index("--")] if "--" in args else args)


@app.command(
    "ssh",
    cls=_AfterDashes,
    short_help="A shell or a command on a node, host keys checked.",
    context_settings={"allow_interspersed_args": False},
)
def ssh_(
    ctx: typer.Context,
    args: Optional[List[str]] = typer.Argument(
        None,
        metavar="[NODE] [-- CMD ...]",
        help="A node (leader, member-N, its index or address; default: the "
        "leader), then the command (default: an interactive shell).",
    ),
    cluster: Optional[str] = CURRENT_CLUSTER,
) -> None:
    """A shell (a real tty) or a command on a node, with OpenSSH and the cluster's pinned host keys."""
    import os

    from clusterctl.cluster import sshentry

    store = _store()
    target, node, command = _node_and_command(store, cluster, list(args or []), ctx.meta.get("after --"))
    alias = sshentry.node_alias(target, node)
    path = sshentry.write(target, store)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvp("ssh", ["ssh", "-F", str(path), alias, *command])


def _node_and_command(
    store: StateStore, cluster: Optional[str], words: List[str], after: Optional[List[str]]
) -> tuple[Cluster, Optional[str], List[str]]:
    """[NODE] [-- CMD]: before `--` at most the node; without `--`, the first word when it names a node. A
    cluster's name where the node goes means its leader (as `ssh NAME` through its ssh config does)."""
    from clusterctl.cluster import sshentry

    if after is not None and len(words) > 1:
        raise UsageError(f"one node before `--`, not {' '.join(words)!r}", "put the command after `--`")
    node = words[0] if words else None
    rest = after if after is not None else words[1:]
    if node is not None and cluster is None and _is_cluster(store, node):
        current = store.current()
        if current is None or current == node or not _names_node(store.load(current).cluster, node):
            return store.load(node).cluster, None, rest
    target = store.resolve(cluster).cluster
    if node is not None and after is None and len(words) > 1 and not _names_node(target, node):
        return target, None, words  # no node: the whole line is the command
    sshentry.node_alias(target, node)  # a word that names no node: a typo of a node more likely than a command
    return target, node, rest


def _names_node(cluster: Cluster, word: str) -> bool:
    from clusterctl.cluster import sshentry

    try:
        sshentry.node_alias(cluster, word)
        return True
    except UsageError:
        return False


def _is_cluster(store: StateStore, word: str) -> bool:
    from clusterctl.errors import ClusterctlError

    try:
        return store.exists(word)
    except ClusterctlError:  # not even a valid cluster name
        return False
