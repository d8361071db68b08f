"""Commands about clusters: up down ls status keep autostop gc hosts ssh."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import List, Optional

import typer

from clusterctl.cli.shared import _confirm, _hourly, _provider, _store, within
from clusterctl.cli.workloads import _launch_status, _train_status
from clusterctl.errors import UsageError
from clusterctl.units import duration, money

app = typer.Typer()  # its commands are merged into cli/app.py's app (see COMMANDS there)


# ---- clusters --------------------------------------------------------------------------------------------
@app.command()
def up(
    nodes: int = typer.Option(2, "--nodes", "-n", help="Number of nodes (the first is the leader)."),
    type_: str = typer.Option("p3.16xlarge", "--type", "-t", help="Instance type (AWS)."),
    name: Optional[str] = typer.Option(None, "--name", help="Cluster name (default: 'local' or 'cluster')."),
    provider: str = typer.Option("aws", "--provider", help="aws, or local: namespace nodes on this machine."),
    slots: Optional[int] = typer.Option(
        None, "--slots", help="Processes per node (default: GPUs per node; 1 locally)."
    ),
    region: Optional[str] = typer.Option(None, "--region", help="AWS region (default: the AWS config's)."),
    hosts_file: Path = typer.Option(Path("hosts"), "--hosts-file", help="Where to write the hosts file."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
    ssh_config_entry: Optional[bool] = typer.Option(
        None,
        "--ssh-config-entry/--no-ssh-config-entry",
        help="Add `Include ~/.ssh/clusterctl/*.conf` to ~/.ssh/config (once) so "
        "`ssh NAME` works (default: ask on a terminal).",
    ),
    ami: Optional[str] = typer.Option(None, "--ami", help="Image id (default: the current Deep Learning AMI)."),
    ami_parameter: Optional[str] = typer.Option(None, "--ami-parameter", help="SSM public parameter naming the image."),
    ssh_user: Optional[str] = typer.Option(
        None, "--ssh-user", help="Login user (default: from the image; ubuntu for the DLAMI)."
    ),
    volume_size: int = typer.Option(200, "--volume-size", help="Root disk GB per node."),
    volume_type: str = typer.Option("io2", "--volume-type", help="io2 | io1 | gp3 | gp2."),
    iops: Optional[int] = typer.Option(
        None, "--iops", help="Provisioned IOPS (default 10000 for io1/io2, 3000 for gp3)."
    ),
    spot: bool = typer.Option(False, "--spot", help="Spot instances (one-time; terminated on interruption)."),
    vpc: Optional[str] = typer.Option(None, "--vpc", help="Use this VPC (its subnets) instead of creating one."),
    subnet: List[str] = typer.Option([], "--subnet", help="Use this subnet (repeatable: AZs tried in order)."),
    cidr: Optional[str] = typer.Option(None, "--cidr", help="Address range of a VPC clusterctl creates (10.0.0.0/16)."),
    ssh_cidr: Optional[str] = typer.Option(None, "--ssh-cidr", help="Who may ssh in (default: your public IP /32)."),
    s3_read: List[str] = typer.Option([], "--s3-read", help="s3://bucket/prefix the nodes may read (repeatable)."),
    private_ips: bool = typer.Option(
        False, "--private-ips", help="No public addresses: reach nodes by private IP (VPN/VPC)."
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan and check permissions; create nothing."),
    max_hourly: float = typer.Option(
        50.0, "--max-hourly", "--confirm-above", help="Ask before launching above this many $/hour."
    ),
    ssh_timeout: float = typer.Option(600.0, "--ssh-timeout", help="Seconds to wait for every node's ssh."),
    trust_first_contact: bool = typer.Option(
        False,
        "--trust-first-contact",
        help="AWS: accept the host key a node shows at first contact when its "
        "console has none (default: fail, exit 5).",
    ),
    idle_stop: str = typer.Option(
        "60m", "--idle-stop", help="Stop the cluster after this long with nothing busy (off: never)."
    ),
    max_lifetime: Optional[str] = typer.Option(
        None, "--max-lifetime", help="Stop it this long after it was made, busy or not (e.g. 12h)."
    ),
    runtime: str = typer.Option(
        "install", "--runtime", help="install: the node runtime (TensorFlow + Horovod) on every node; none: skip it."
    ),
    python: Optional[str] = typer.Option(
        None, "--python", help="Bring your own: this Python on the nodes runs the jobs (no runtime installed)."
    ),
    runtime_cache: Optional[str] = typer.Option(
        None, "--runtime-cache", help="AWS: s3://bucket/prefix where built runtimes are kept and reused."
    ),
    runtime_wheels: Optional[str] = typer.Option(
        None,
        "--runtime-wheels",
        help="AWS: a wheel mirror URL (every wheel the runtime needs) the leader installs from instead of PyPI.",
    ),
) -> None:
    """Bring up identical nodes, keys pinned, runtime installed.

    One network, one zone, one placement group; safe to re-run and to interrupt.
    """
    from clusterctl.autostop import settings as autostop
    from clusterctl.cli import display
    from clusterctl.cluster import provision
    from clusterctl.state import validate_name
    from clusterctl.types import ClusterSpec

    store = _store()
    name = validate_name(name or ("local" if provider == "local" else "cluster"))
    stop_rules = autostop.settings(idle_stop, max_lifetime)
    within("--slots", slots, 1, 1024)
    within("--nodes", nodes, 1)
    options: dict = {}
    if provider == "aws":
        within("--nodes", nodes, 1, 1000)
        options = {
            "ami": ami,
            "ami_parameter": ami_parameter,
            "ssh_user": ssh_user,
            "volume_size": volume_size,
            "volume_type": volume_type,
            "iops": iops,
            "spot": spot,
            "vpc": vpc,
            "subnets": tuple(subnet),
            "cidr": cidr,
            "ssh_cidr": ssh_cidr,
            "s3_read": tuple(s3_read),
            "private_ips": private_ips,
        }
    spec = ClusterSpec(
        name=name,
        provider=provider,
        nodes=nodes,
        slots=slots,
        instance_type=type_ if provider != "local" else "local",
        region=region or "",
        options=options,
        autostop=stop_rules,
    )
    impl = _provider(provider, store, region)
    request = _runtime_request(runtime, python, runtime_cache, runtime_wheels, impl.builds_runtime_locally)
    plan = impl.plan(spec)
    for line in plan.lines:
        display.info(f"plan: {line}")
    display.info(f"plan: autostop: {autostop.describe(stop_rules)}")
    display.info(f"plan: node runtime: {_runtime_line(request)}")
    if dry_run:
        for line in impl.dry_run(spec):
            display.info(f"dry run: {line}")
        display.info("dry run: nothing was created")
        return
    if plan.hourly_usd is None or plan.hourly_usd > max_hourly:
        cost = "an unknown price" if plan.hourly_usd is None else f"{money(plan.hourly_usd)}/hour"
        _confirm(f"Launch {nodes} x {type_} at {cost}?", yes)
    start = time.monotonic()
    cluster = provision.up(
        spec,
        store,
        impl,
        hosts_out=hosts_file,
        report=lambda m: display.info(m),
        ssh_timeout=ssh_timeout,
        runtime=request,
        trust_first_contact=trust_first_contact,
        runtime_cache=_runtime_s3(request.cache, region) if request.cache else None,
    )
    display.info(
        f"cluster {cluster.name} is up: {len(cluster.nodes)} node(s), {cluster.total_slots} slot(s), "
        f"in {time.monotonic() - start:.1f}s; hosts file: {hosts_file}"
    )
    _ssh_entry(cluster, store, ssh_config_entry)
    display.node_table(cluster)


def _ssh_entry(cluster, store, entry: Optional[bool] = None) -> None:
    """`ssh NAME` / `ssh NAME-member-1`: the cluster's OpenSSH config (see sshentry), and with the user's
    consent (the flag, or asked on a terminal) the one Include line in ~/.ssh/config that finds it."""
    from clusterctl.cli import display
    from clusterctl.cluster import sshentry

    try:
        path = sshentry.write(cluster, store)
        if entry is None and not sshentry.has_include() and sys.stdin.isatty() and sys.stderr.isatty():
            entry = typer.confirm(
                f"Add `{sshentry.include_line()}` to {sshentry.user_config()} so `ssh {cluster.name}` works?",
                default=True,
                err=True,
            )
        if entry and sshentry.add_include():
            display.info(f"added `{sshentry.include_line()}` at the top of {sshentry.user_config()}")
    except OSError as exc:
        display.warn(f"could not write the cluster's ssh config ({exc}); `clusterctl ssh` still works")
        return
    if sshentry.has_include():
        display.info(f"ssh config: {path} (ssh {cluster.name}, ssh {cluster.nodes[-1].name})")
    else:
        display.info(
            f"ssh config: {path} (ssh -F {path} {cluster.name}; `up --ssh-config-entry` adds "
            f"`{sshentry.include_line()}` to {sshentry.user_config()} for `ssh {cluster.name}`)"
        )


def _runtime_request(
    runtime: str, python: Optional[str], cache: Optional[str], wheels: Optional[str], builds_here: bool
):
    from clusterctl.runtime.install import RuntimeRequest

    if runtime not in ("install", "none"):
        raise UsageError(f"unknown --runtime {runtime!r}", "use install or none")
    if python is not None and runtime == "none":
        raise UsageError("--python and --runtime none together", "give one of them")
    if (cache or wheels) and builds_here:  # the leader builds (or fetches) it: a cache or wheels are for it
        raise UsageError(
            "--runtime-cache and --runtime-wheels are for AWS clusters",
            "local clusters build the runtime once on this machine and cache it here",
        )
    if python is not None:
        return RuntimeRequest("own", python=python)
    return RuntimeRequest(runtime, cache=cache or "", wheels=wheels or "")  # type: ignore[arg-type]  # checked above


def _runtime_line(request) -> str:
    from clusterctl.runtime.spec import ROOT, RuntimeSpec

    if request.mode == "none":
        return "none (--runtime none): jobs need a Python with TensorFlow and Horovod on the nodes"
    if request.mode == "own":
        return f"your own Python {request.python} (`clusterctl doctor` checks it has TensorFlow and Horovod)"
    s = RuntimeSpec()
    where = f"; cache {request.cache}" if request.cache else ""
    return f"TensorFlow {s.tensorflow} + Horovod {s.horovod} at {ROOT}/<id> on every node{where}"


def _runtime_s3(url: str, region: Optional[str]):
    import boto3

    from clusterctl.runtime.install import S3Cache

    return S3Cache(url, boto3.session.Session(region_name=region or None).client("s3"))


@app.command()
def down(
    name: Optional[str] = typer.Argument(None, help="Cluster to remove (default: the current one)."),
    all_: bool = typer.Option(False, "--all", help="Every cluster of this provider."),
    provider: Optional[str] = typer.Option(None, "--provider", help="Where to look when the local record is gone."),
    region: Optional[str] = typer.Option(
        None, "--region", help="AWS region (default: the record's, else the AWS config's)."
    ),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
    force: bool = typer.Option(
        False, "--force", help="AWS: also another owner's cluster of this name (no record here)."
    ),
) -> None:
    """Remove a cluster and all it created; prove nothing is left.

    Everything is found by tags (or names), so this works without the local record.
    """
    from clusterctl.cli import display
    from clusterctl.cluster import overview, provision

    store = _store()
    providers = overview.Providers(lambda kind, reg: _provider(kind, store, reg), force=force)
    targets = overview.down_targets(store, providers, name, all_, provider, region, display.warn)
    if not targets:
        display.info("no clusters found")
        return
    known = {}
    if all_:
        now = time.time()
        for key, (created, owner) in overview.ages_and_owners(targets, providers).items():
            known[key] = (f", age {duration(now - created)}" if created else "") + (f", owner {owner}" if owner else "")
    if all_ and not force:  # another owner's cluster (no record here) is kept; --force includes it
        mine = []
        for t in targets:
            try:
                providers.get(t.provider, t.region).resources(t.name)
                mine.append(t)
            except UsageError as exc:
                display.info(f"cluster {t.name}: kept ({exc.message}; --force removes it)")
        targets = mine
        if not targets:
            display.info("no clusters of yours found")
            return
    owners: dict = {}
    for t in targets:
        impl = providers.get(t.provider, t.region)
        found = impl.resources(t.name)  # another owner's cluster: refused here, before anything changes
        owners[t.name] = impl.owners(t.name)
        where = (t.provider if impl.region == t.provider else f"{t.provider}, {impl.region}") + known.get(
            (t.name, t.provider), ""
        )
        display.info(
            f"cluster {t.name} ({where}): " + (f"{len(found)} resource(s) to remove" if found else "nothing found")
        )
        for line in found:
            display.info(f"  {line}")
    _confirm(
        f"Remove cluster(s) {', '.join(t.name + (' (owner ' + ', '.join(owners[t.name]) + ')' if owners.get(t.name) else '') for t in targets)} "
        "and everything they created?",
        yes,
    )
    from clusterctl.remote import agent

    agent.stop(store.root)  # the connection agent holds ssh connections to these nodes: nothing stays running
    failed = []
    for t in targets:
        teardown = provision.down(t.name, store, providers.get(t.provider, t.region), report=display.info)
        if teardown.clean:
            display.info(f"cluster {t.name} is gone: nothing tagged for it is left")
            from clusterctl.cluster import sshentry

            sshentry.remove(t.name)  # its ssh config entry goes with it
        else:
            failed.append(f"{t.name}: {'; '.join(teardown.left)}")
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
) -> None:
    """List clusters: nodes, type, AZ, state, uptime, cost so far."""
    from clusterctl.cli import display
    from clusterctl.cluster import overview

    store = _store()
    providers = overview.Providers(lambda kind, reg: _provider(kind, store, reg))
    found = overview.listing(store, providers, provider, region, display.warn)
    totals = {"hourly": found.hourly_usd, "so_far": found.so_far_usd, "unknown": found.unknown}
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
    display.cluster_table(
        rows, ("name", "provider", "region", "nodes", "type", "az", "state", "uptime", "$/hour", "cost so far", "note")
    )
    display.info(
        f"total: {money(totals['hourly'])}/hour now, {money(totals['so_far'])} so far "
        f"for {len(rows)} cluster(s)"
        + (f" ({totals['unknown']} cluster(s) of unknown price not counted)" if totals["unknown"] else "")
        + " (built-in on-demand prices; not a bill)"
    )


@app.command()
def status(
    name: Optional[str] = typer.Argument(None, help="Cluster (default: the current one)."),
    provider: Optional[str] = typer.Option(None, "--provider", help="Where to look when the local record is gone."),
    region: Optional[str] = typer.Option(
        None, "--region", help="AWS region (default: the record's, else the AWS config's)."
    ),
) -> None:
    """Show a cluster's nodes, as its provider sees them now.

    Says where the local record and the provider disagree.
    """
    from clusterctl.cli import display
    from clusterctl.cluster import overview, provision
    from clusterctl.errors import StateError
    from clusterctl.state import validate_name

    store = _store()
    n = name or store.resolve(None).cluster.name
    validate_name(n)
    record = store.load(n) if store.exists(n) else None
    kind = provider or (record.cluster.provider if record is not None else overview.guess_provider(n, region))
    if kind == "local":
        if record is None:
            record = store.load(n)  # raises "no cluster named ..."
        display.node_table(record.cluster, current=n == store.current())
        _autostop_status(store, record)
        _runtime_status(record)
        if record.status == "up":
            _train_status(n)
            _launch_status(n)
        return
    reg = region or (record.cluster.region if record is not None and record.cluster.provider == kind else None)
    st = _provider(kind, store, reg).status(n)
    if st is None:
        if record is None:
            raise StateError(f"no cluster named {n!r} here or in the cloud", "see `clusterctl ls --provider aws`")
        from clusterctl.providers.base import ClusterStatus

        st = ClusterStatus(n, kind, record.cluster.region, record.cluster.instance_type, ())
    display.cluster_status(
        st,
        time.time(),
        current=n == store.current(),
        notes=provision.disagreements(record, st if (st.nodes or st.other) else None),
    )
    if record is not None:
        if st.nodes or record.status == "stopped":
            _autostop_status(store, record)
        _runtime_status(record)
        _train_status(n)
        if st.nodes:
            _launch_status(n)


def _runtime_status(record) -> None:
    from clusterctl.cli import display
    from clusterctl.runtime.install import describe

    display.console().print(display._esc(describe(record.cluster.extra)))


def _autostop_status(store, record) -> None:
    from clusterctl.cli import display
    from clusterctl.cluster import autostop_status
    from clusterctl.providers.local import supervisor

    for line in autostop_status.status_lines(store, record, supervisor.watchdog_running):
        display.console().print(display._esc(line))


@app.command()
def keep(
    name: Optional[str] = typer.Argument(None, help="Cluster (default: the current one)."),
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
def autostop_(
    name: Optional[str] = typer.Argument(None, help="Cluster (default: the current one)."),
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
        values: dict = {}
        if idle_stop:
            values["idle_stop"] = autostop.parse_duration(idle_stop, "--idle-stop")
        if max_lifetime:
            values["max_lifetime"] = autostop.parse_duration(max_lifetime, "--max-lifetime")
        failed = control.change(store, record, "on", **values)
        _autostop_done(record, failed, f"cluster {c.name}: autostop is on")
    _autostop_status(store, record)


def _running(record):
    if record.status != "up":
        from clusterctl.errors import StateError

        why = f" ({record.note})" if record.note else ""
        raise StateError(
            f"cluster {record.cluster.name} is {record.status}{why}",
            "bring it up again with `clusterctl up`, or remove its record with `clusterctl down`",
        )
    return record


def _autostop_done(record, failed: list, message: str) -> None:
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
    older_than: Optional[str] = typer.Option(None, "--older-than", help="Only clusters at least this old, e.g. 2h."),
    provider: Optional[str] = typer.Option(None, "--provider", help="aws or local (default: both)."),
    region: Optional[str] = typer.Option(None, "--region", help="AWS region (default: the AWS config's)."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
    force: bool = typer.Option(False, "--force", help="Also another owner's clusters (their owner tag is not yours)."),
) -> None:
    """Find and remove everything clusterctl left behind.

    Every resource tagged by clusterctl in the AWS region (with or without a local record) and every
    local cluster on this machine, shown with age and owner; on AWS exactly the listed resource ids are
    removed, and another owner's clusters only with --force.
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
    display.gc_table(list(found.found), list(found.chosen), now)
    if found.others:
        display.info(
            f"kept: {len(found.others)} cluster(s) of other owners ("
            + ", ".join(f"{c.name} of {c.owner or 'unknown'}" for c in found.others)
            + "); --force removes them"
        )
    if not found.chosen:
        display.info(
            f"nothing is older than {older_than}" if older_than and not found.others else "nothing of yours to remove"
        )
        return
    total = sum(len(c.found) for c in found.chosen)
    _confirm(
        f"Remove {total} resource(s) of {len(found.chosen)} cluster(s) ("
        + ", ".join(c.name + ("" if c.mine else f" (owner {c.owner or 'unknown'})") for c in found.chosen)
        + ")?",
        yes,
    )
    from clusterctl.remote import agent

    agent.stop(store.root)
    failed = gclib.remove(store, providers, found.chosen, display.info)
    if failed:
        from clusterctl.errors import ProvisionError

        raise ProvisionError(f"some resources remain ({' | '.join(failed)})", "run `clusterctl gc` again")


@app.command()
def hosts(
    hostsfile: Optional[str] = typer.Argument(None, help="A hosts file to read (default: the current cluster)."),
    cluster: Optional[str] = typer.Option(None, "--cluster", "-c", help="A cluster by name."),
    format_: str = typer.Option("slots", "--format", "-f", help="slots | horovod | mpi | tf-config | json"),
) -> None:
    """Print the hosts file for horovodrun, mpirun, TF_CONFIG."""
    from clusterctl.cluster import provision
    from clusterctl.hostsfile import HostsFile

    if hostsfile is not None:
        hf = HostsFile.read(hostsfile)
    else:
        hf = provision.hosts_file(_store().resolve(cluster).cluster)
    sys.stdout.write(hf.render_as(format_))


@app.command(
    "ssh",
    short_help="A shell or a command on a node, host keys checked.",
    context_settings={"allow_interspersed_args": False},
)
def ssh_(
    args: Optional[List[str]] = typer.Argument(
        None,
        metavar="[NODE] [-- CMD ...]",
        help="A node (leader, member-N, its index or address; default: the "
        "leader), then the command (default: an interactive shell).",
    ),
    cluster: Optional[str] = typer.Option(None, "--cluster", "-c", help="A cluster by name (default: the current)."),
) -> None:
    """A shell (a real tty) or a command on a node, with OpenSSH and the cluster's pinned host keys."""
    import os

    from clusterctl.cluster import sshentry

    store = _store()
    record = store.resolve(cluster)
    args = list(args or [])
    node = None
    if args:
        try:
            node = sshentry.node_alias(record.cluster, args[0])
            args = args[1:]
        except UsageError:
            if len(args) == 1:  # one word that names no node: a typo of a node more likely than a command
                raise
    alias = sshentry.node_alias(record.cluster, node)
    path = sshentry.write(record.cluster, store)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvp("ssh", ["ssh", "-F", str(path), alias, *args])
