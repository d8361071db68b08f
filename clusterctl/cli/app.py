"""The command line: parse, call the library, render with display, exit with the one table's code.

Thin on purpose: no boto3, no ssh here; heavy imports happen inside the commands, so `--help` is fast.
"""

from __future__ import annotations

import functools
import sys
import time
import traceback
from pathlib import Path
from typing import Callable, List, Optional

import typer

from clusterctl.cli import fastargs as _fastargs
from clusterctl.errors import ClusterctlError, ExitCode, UsageError, combined
from clusterctl.units import duration, money

_fastargs.install()  # plain str/int/float/bool options without pydantic: ~0.1 s less per invocation

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    help="From nothing to Horovod training across many multi-GPU nodes, and back to zero cost.",
    context_settings={"help_option_names": ["-h", "--help"]},
)
_debug = False


def _version(value: bool) -> None:
    if value:
        from clusterctl import __version__

        typer.echo(f"clusterctl {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks for errors."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    global _debug
    _debug = debug


def command(fn: Callable) -> Callable:
    """Every command's errors become one `Error: ...` line and the table's exit code; Ctrl-C is 130."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from clusterctl.cli import display

        try:
            return fn(*args, **kwargs)
        except ClusterctlError as exc:
            if _debug:
                traceback.print_exc()
            display.error(exc.one_line())
            raise typer.Exit(int(exc.exit_code))
        except KeyboardInterrupt as exc:
            done = exc.summary() if hasattr(exc, "summary") else ""  # a fan-out says what it stopped
            display.error(f"interrupted: {done}" if done else "interrupted")
            raise typer.Exit(int(ExitCode.INTERRUPTED))

    return wrapper


def _store():
    from clusterctl.cluster.state import StateStore

    return StateStore()


def _provider(kind: str, store, region: str | None = None):
    """A provider by name, in a region (where it has regions), reporting its progress on stderr."""
    from clusterctl import providers
    from clusterctl.cli import display

    return providers.get(kind, store=store, region=region or None, report=display.info)


def _confirm(question: str, yes: bool) -> None:
    if yes:
        return
    if not sys.stdin.isatty():
        raise UsageError(f"{question} needs confirmation", "pass --yes to confirm without a terminal")
    if not typer.confirm(question, default=False):
        raise UsageError("cancelled", "nothing was changed")


# ---- clusters --------------------------------------------------------------------------------------------
@app.command()
@command
def up(
    nodes: int = typer.Option(2, "--nodes", "-n", help="Number of nodes (the first is the leader)."),
    type_: str = typer.Option("p3.16xlarge", "--type", "-t", help="Instance type (AWS)."),
    name: Optional[str] = typer.Option(None, "--name", help="Cluster name (default: 'local' or 'cluster')."),
    provider: str = typer.Option("aws", "--provider", help="aws, or local: namespace nodes on this machine."),
    slots: Optional[int] = typer.Option(None, "--slots", help="Processes per node (default: GPUs per node; 1 locally)."),
    region: Optional[str] = typer.Option(None, "--region", help="AWS region (default: the AWS config's)."),
    hosts_file: Path = typer.Option(Path("hosts"), "--hosts-file", help="Where to write the hosts file."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
    ssh_config_entry: Optional[bool] = typer.Option(None, "--ssh-config-entry/--no-ssh-config-entry",
                                                    help="Add `Include ~/.ssh/clusterctl/*.conf` to ~/.ssh/config (once) so "
                                                         "`ssh NAME` works (default: ask on a terminal)."),
    ami: Optional[str] = typer.Option(None, "--ami", help="Image id (default: the current Deep Learning AMI)."),
    ami_parameter: Optional[str] = typer.Option(None, "--ami-parameter", help="SSM public parameter naming the image."),
    ssh_user: Optional[str] = typer.Option(None, "--ssh-user", help="Login user (default: from the image; ubuntu for the DLAMI)."),
    volume_size: int = typer.Option(200, "--volume-size", help="Root disk GB per node."),
    volume_type: str = typer.Option("io2", "--volume-type", help="io2 | io1 | gp3 | gp2."),
    iops: Optional[int] = typer.Option(None, "--iops", help="Provisioned IOPS (default 10000 for io1/io2, 3000 for gp3)."),
    spot: bool = typer.Option(False, "--spot", help="Spot instances (one-time; terminated on interruption)."),
    vpc: Optional[str] = typer.Option(None, "--vpc", help="Use this VPC (its subnets) instead of creating one."),
    subnet: List[str] = typer.Option([], "--subnet", help="Use this subnet (repeatable: AZs tried in order)."),
    cidr: Optional[str] = typer.Option(None, "--cidr", help="Address range of a VPC clusterctl creates (10.0.0.0/16)."),
    ssh_cidr: Optional[str] = typer.Option(None, "--ssh-cidr", help="Who may ssh in (default: your public IP /32)."),
    s3_read: List[str] = typer.Option([], "--s3-read", help="s3://bucket/prefix the nodes may read (repeatable)."),
    private_ips: bool = typer.Option(False, "--private-ips", help="No public addresses: reach nodes by private IP (VPN/VPC)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan and check permissions; create nothing."),
    max_hourly: float = typer.Option(50.0, "--max-hourly", "--confirm-above", help="Ask before launching above this many $/hour."),
    ssh_timeout: float = typer.Option(600.0, "--ssh-timeout", help="Seconds to wait for every node's ssh."),
    trust_first_contact: bool = typer.Option(False, "--trust-first-contact",
                                             help="AWS: accept the host key a node shows at first contact when its "
                                                  "console has none (default: fail, exit 5)."),
    idle_stop: str = typer.Option("60m", "--idle-stop", help="Stop the cluster after this long with nothing busy (off: never)."),
    max_lifetime: Optional[str] = typer.Option(None, "--max-lifetime", help="Stop it this long after it was made, busy or not (e.g. 12h)."),
    runtime: str = typer.Option("install", "--runtime", help="install: the node runtime (TensorFlow + Horovod) on every node; none: skip it."),
    python: Optional[str] = typer.Option(None, "--python", help="Bring your own: this Python on the nodes runs the jobs (no runtime installed)."),
    runtime_cache: Optional[str] = typer.Option(None, "--runtime-cache", help="AWS: s3://bucket/prefix where built runtimes are kept and reused."),
    runtime_wheels: Optional[str] = typer.Option(None, "--runtime-wheels", help="AWS: a wheel mirror URL (every wheel the runtime needs) the leader installs from instead of PyPI."),
) -> None:
    """Bring up identical nodes, keys pinned, runtime installed.

    One network, one zone, one placement group; safe to re-run and to interrupt.
    """
    from clusterctl.autostop import settings as autostop
    from clusterctl.cli import display
    from clusterctl.cluster import provision
    from clusterctl.cluster.state import validate_name
    from clusterctl.types import ClusterSpec

    store = _store()
    name = validate_name(name or ("local" if provider == "local" else "cluster"))
    stop_rules = autostop.settings(idle_stop, max_lifetime)
    if slots is not None and not 1 <= slots <= 1024:
        raise UsageError(f"--slots must be 1..1024, not {slots}")
    if nodes < 1:
        raise UsageError(f"--nodes must be at least 1, not {nodes}")
    options: dict = {}
    if provider == "aws":
        if nodes > 1000:
            raise UsageError(f"--nodes must be at most 1000, not {nodes}")
        options = {"ami": ami, "ami_parameter": ami_parameter, "ssh_user": ssh_user, "volume_size": volume_size,
                   "volume_type": volume_type, "iops": iops, "spot": spot, "vpc": vpc, "subnets": tuple(subnet),
                   "cidr": cidr, "ssh_cidr": ssh_cidr, "s3_read": tuple(s3_read), "private_ips": private_ips}
    spec = ClusterSpec(name=name, provider=provider, nodes=nodes, slots=slots,
                       instance_type=type_ if provider != "local" else "local", region=region or "", options=options,
                       autostop=stop_rules)
    request = _runtime_request(runtime, python, runtime_cache, runtime_wheels, provider)
    impl = _provider(provider, store, region)
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
    cluster = provision.up(spec, store, impl, hosts_out=hosts_file, report=lambda m: display.info(m),
                           ssh_timeout=ssh_timeout, runtime=request, trust_first_contact=trust_first_contact,
                           runtime_cache=_runtime_s3(request.cache, region) if request.cache else None)
    display.info(f"cluster {cluster.name} is up: {len(cluster.nodes)} node(s), {cluster.total_slots} slot(s), "
                 f"in {time.monotonic() - start:.1f}s; hosts file: {hosts_file}")
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
            entry = typer.confirm(f"Add `{sshentry.include_line()}` to {sshentry.user_config()} so `ssh {cluster.name}` "
                                  "works?", default=True, err=True)
        if entry and sshentry.add_include():
            display.info(f"added `{sshentry.include_line()}` at the top of {sshentry.user_config()}")
    except OSError as exc:
        display.warn(f"could not write the cluster's ssh config ({exc}); `clusterctl ssh` still works")
        return
    if sshentry.has_include():
        display.info(f"ssh config: {path} (ssh {cluster.name}, ssh {cluster.nodes[-1].name})")
    else:
        display.info(f"ssh config: {path} (ssh -F {path} {cluster.name}; `up --ssh-config-entry` adds "
                     f"`{sshentry.include_line()}` to {sshentry.user_config()} for `ssh {cluster.name}`)")


def _runtime_request(runtime: str, python: Optional[str], cache: Optional[str], wheels: Optional[str], provider: str):
    from clusterctl.runtime.install import RuntimeRequest

    if runtime not in ("install", "none"):
        raise UsageError(f"unknown --runtime {runtime!r}", "use install or none")
    if python is not None and runtime == "none":
        raise UsageError("--python and --runtime none together", "give one of them")
    if (cache or wheels) and provider != "aws":
        raise UsageError("--runtime-cache and --runtime-wheels are for AWS clusters",
                         "local clusters build the runtime once on this machine and cache it here")
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
@command
def down(
    name: Optional[str] = typer.Argument(None, help="Cluster to remove (default: the current one)."),
    all_: bool = typer.Option(False, "--all", help="Every cluster of this provider."),
    provider: Optional[str] = typer.Option(None, "--provider", help="Where to look when the local record is gone."),
    region: Optional[str] = typer.Option(None, "--region", help="AWS region (default: the record's, else the AWS config's)."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
    force: bool = typer.Option(False, "--force", help="AWS: also another owner's cluster of this name (no record here)."),
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
        where = (t.provider if impl.region == t.provider else f"{t.provider}, {impl.region}") + known.get((t.name, t.provider), "")
        display.info(f"cluster {t.name} ({where}): " + (f"{len(found)} resource(s) to remove" if found else "nothing found"))
        for line in found:
            display.info(f"  {line}")
    _confirm(f"Remove cluster(s) {', '.join(t.name + (' (owner ' + ', '.join(owners[t.name]) + ')' if owners.get(t.name) else '') for t in targets)} "
             "and everything they created?", yes)
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
@command
def ls(
    provider: Optional[str] = typer.Option(None, "--provider", help="Also ask this provider for clusters without a record (aws)."),
    region: Optional[str] = typer.Option(None, "--region", help="AWS region to ask (default: the records', else the AWS config's)."),
) -> None:
    """List clusters: nodes, type, AZ, state, uptime, cost so far."""
    from clusterctl.cli import display
    from clusterctl.cluster import overview

    store = _store()
    providers = overview.Providers(lambda kind, reg: _provider(kind, store, reg))
    found = overview.listing(store, providers, provider, region, display.warn)
    totals = {"hourly": found.hourly_usd, "so_far": found.so_far_usd, "unknown": found.unknown}
    rows = [{"name": r.name + (" *" if r.current else ""), "provider": r.provider, "region": r.region, "nodes": r.nodes,
             "type": r.instance_type or "-", "az": r.zones or "-", "state": r.state, "uptime": duration(r.uptime_s),
             "$/hour": money(r.hourly_usd) if r.priced else "-", "cost so far": money(r.so_far_usd) if r.priced else "-",
             "note": r.note} for r in found.rows]
    if not rows:
        display.info("no clusters; bring one up with `clusterctl up --provider local --nodes 2`")
        return
    display.cluster_table(rows, ("name", "provider", "region", "nodes", "type", "az", "state", "uptime", "$/hour",
                                 "cost so far", "note"))
    display.info(f"total: {money(totals['hourly'])}/hour now, {money(totals['so_far'])} so far "
                 f"for {len(rows)} cluster(s)" + (f" ({totals['unknown']} cluster(s) of unknown price not counted)"
                                                  if totals["unknown"] else "")
                 + " (built-in on-demand prices; not a bill)")


@app.command()
@command
def status(
    name: Optional[str] = typer.Argument(None, help="Cluster (default: the current one)."),
    provider: Optional[str] = typer.Option(None, "--provider", help="Where to look when the local record is gone."),
    region: Optional[str] = typer.Option(None, "--region", help="AWS region (default: the record's, else the AWS config's)."),
) -> None:
    """Show a cluster's nodes, as its provider sees them now.

    Says where the local record and the provider disagree.
    """
    from clusterctl.cli import display
    from clusterctl.cluster import overview, provision
    from clusterctl.errors import StateError
    from clusterctl.cluster.state import validate_name

    store = _store()
    n = name or store.resolve(None).cluster.name
    validate_name(n)
    record = store.load(n) if store.exists(n) else None
    kind = provider or (record.cluster.provider if record is not None else overview.guess_provider(n, region))
    if kind == "local":
        if record is None:
            store.load(n)  # raises "no cluster named ..."
        display.node_table(record.cluster, current=n == store.current())
        _autostop_status(store, record)
        _runtime_status(record)
        if record.status == "up":
            _train_status(n)
            _launch_status(n)
        return
    reg = region or (record.cluster.region if record is not None and record.cluster.provider == "aws" else None)
    st = _provider(kind, store, reg).status(n)
    if st is None and record is None:
        raise StateError(f"no cluster named {n!r} here or in the cloud", "see `clusterctl ls --provider aws`")
    if st is None:
        from clusterctl.providers.base import ClusterStatus

        st = ClusterStatus(n, kind, record.cluster.region, record.cluster.instance_type, ())
    display.cluster_status(st, time.time(), current=n == store.current(),
                           notes=provision.disagreements(record, st if (st.nodes or st.other) else None))
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
    from clusterctl.autostop import status as autostop_status
    from clusterctl.cli import display
    from clusterctl.providers.local import supervisor

    for line in autostop_status.status_lines(store, record, supervisor.watchdog_running):
        display.console().print(display._esc(line))


@app.command()
@command
def keep(
    name: Optional[str] = typer.Argument(None, help="Cluster (default: the current one)."),
    for_: str = typer.Option(..., "--for", help="How long nothing may stop it, e.g. 4h."),
) -> None:
    """Keep a cluster up a while longer, idle or not."""
    from clusterctl.autostop import control
    from clusterctl.autostop import settings as autostop

    seconds = autostop.parse_duration(for_, "--for", allow_off=False)
    store = _store()
    record = _running(store.resolve(name))
    failed = control.change(store, record, "keep", seconds=seconds)
    until = time.strftime("%Y-%m-%d %H:%M", time.localtime(time.time() + seconds))
    _autostop_done(record, failed, f"cluster {record.cluster.name}: autostop waits until {until} "
                                   f"({duration(seconds)} from now); then idle-stop and max lifetime apply again")
    _autostop_status(store, record)


@app.command("autostop")
@command
def autostop_(
    name: Optional[str] = typer.Argument(None, help="Cluster (default: the current one)."),
    off: bool = typer.Option(False, "--off", help="Never stop it by itself (it runs until `down`)."),
    on: bool = typer.Option(False, "--on", help="Turn autostop back on."),
    idle_stop: Optional[str] = typer.Option(None, "--idle-stop", help="New idle limit, e.g. 30m (off: none)."),
    max_lifetime: Optional[str] = typer.Option(None, "--max-lifetime", help="New lifetime limit from creation, e.g. 12h (off: none)."),
) -> None:
    """Show or change when a cluster stops itself."""
    from clusterctl.autostop import control
    from clusterctl.autostop import settings as autostop
    from clusterctl.cli import display

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
            display.warn(f"{c.name} now runs until `clusterctl down {c.name}`, costing "
                         f"{money(hourly)}/hour while it does; `clusterctl autostop {c.name} --on` undoes this")
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
        raise StateError(f"cluster {record.cluster.name} is {record.status}{why}",
                         "bring it up again with `clusterctl up`, or remove its record with `clusterctl down`")
    return record


def _autostop_done(record, failed: list, message: str) -> None:
    from clusterctl.cli import display
    from clusterctl.errors import UnreachableError

    if failed:
        for line in failed:
            display.warn(line)
        raise UnreachableError(f"the change did not reach every node of {record.cluster.name} ({len(failed)} failed)",
                               "run the command again once the nodes answer")
    display.info(message)


def _hourly(cluster) -> float | None:
    from clusterctl.cluster import costs

    return costs.hourly(cluster)


@app.command()
@command
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
    from clusterctl.cluster import gc as gclib
    from clusterctl.cluster import overview

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
        display.info(f"kept: {len(found.others)} cluster(s) of other owners ("
                     + ", ".join(f"{c.name} of {c.owner or 'unknown'}" for c in found.others) + "); --force removes them")
    if not found.chosen:
        display.info(f"nothing is older than {older_than}" if older_than and not found.others else "nothing of yours to remove")
        return
    total = sum(len(c.found) for c in found.chosen)
    _confirm(f"Remove {total} resource(s) of {len(found.chosen)} cluster(s) ("
             + ", ".join(c.name + ("" if c.mine else f" (owner {c.owner or 'unknown'})") for c in found.chosen) + ")?", yes)
    from clusterctl.remote import agent

    agent.stop(store.root)
    failed = gclib.remove(store, providers, found.chosen, display.info)
    if failed:
        from clusterctl.errors import ProvisionError

        raise ProvisionError(f"some resources remain ({' | '.join(failed)})", "run `clusterctl gc` again")


@app.command()
@command
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


# ---- running commands ------------------------------------------------------------------------------------
def _ssh_opts():
    """The ssh options every fan-out command shares, as typer parameters (see run/logs/kill/clean)."""
    return dict(
        cluster=typer.Option(None, "--cluster", "-c", help="A cluster by name (default: the current)."),
        parallel=typer.Option(64, "--parallel", "-p", help="At most this many hosts at once."),
        connect_timeout=typer.Option(10.0, "--connect-timeout", help="Seconds to wait for each connection."),
        user=typer.Option(None, "--user", "-l", help="Login user."),
        identity=typer.Option([], "--identity", "-i", help="Private key file (repeatable)."),
        known_hosts=typer.Option(None, "--known-hosts", help="known_hosts file to trust."),
        ssh_config=typer.Option(None, "--ssh-config", help="ssh config file (default ~/.ssh/config), read as OpenSSH does (ssh -G)."),
    )


_SSH = _ssh_opts()


def _inventory(hosts_path, cluster, parallel, connect_timeout, user, identity, known_hosts, ssh_config):

    if parallel < 1:
        raise UsageError("--parallel must be at least 1")
    if connect_timeout <= 0:
        raise UsageError("--connect-timeout must be positive")
    return _resolve_hosts(hosts_path, cluster, user, identity, known_hosts, ssh_config, connect_timeout)


def _resolve_hosts(hosts_path, cluster, user=None, identity=(), known_hosts=None, ssh_config=None,
                   connect_timeout: float = 10.0, store=None):
    """The inventory with the shared ssh options (flags win over the ssh config; a ConnectTimeout in the
    config applies unless --connect-timeout was given)."""
    try:  # newer typer carries its own click (and may not install click): its context is the live one
        from typer._click.core import ParameterSource
        from typer._click.globals import get_current_context
    except ImportError:
        from click.core import ParameterSource
        from click.globals import get_current_context

    from clusterctl.cli import display
    from clusterctl.cluster import inventory

    ctx = get_current_context(silent=True)
    given = True
    if ctx is not None and "connect_timeout" in ctx.params:
        given = ctx.get_parameter_source("connect_timeout") != ParameterSource.DEFAULT
    return inventory.resolve(hosts_path, cluster, store or _store(), inventory.SshOverrides(
        user=user, identity=tuple(identity or ()), known_hosts=known_hosts, ssh_config=ssh_config,
        connect_timeout=connect_timeout, connect_timeout_given=given), warn=display.warn)


def _fan_out(inv, cmd: str, parallel: int, timeout: float | None = None, live: bool = True):
    """Run through the connection agent (reused connections), host-prefixed live output unless not `live`."""
    from clusterctl.remote import agent
    from clusterctl.cli import display

    printer = display.HostPrinter([t.label for t in inv.targets]) if live else None
    return agent.run(inv.targets, inv.settings, cmd, parallel=parallel, timeout=timeout, on_line=printer,
                     warn=display.warn)


@app.command(context_settings={"allow_interspersed_args": False})
@command
def run(
    args: List[str] = typer.Argument(..., metavar="[HOSTS] CMD", help="A hosts file (optional) and the command."),
    cluster: Optional[str] = _SSH["cluster"],
    parallel: int = _SSH["parallel"],
    timeout: Optional[float] = typer.Option(None, "--timeout", help="Seconds the command may run on each host."),
    connect_timeout: float = _SSH["connect_timeout"],
    group: bool = typer.Option(False, "--group", "-g", help="Fold identical outputs into one block."),
    json_: bool = typer.Option(False, "--json", help="One JSON object per host."),
    detach: Optional[str] = typer.Option(None, "--detach", "-d", metavar="NAME",
                                         help="Start it in tmux session NAME on every host and return (see logs, kill)."),
    user: Optional[str] = _SSH["user"],
    identity: List[str] = _SSH["identity"],
    known_hosts: Optional[str] = _SSH["known_hosts"],
    ssh_config: Optional[str] = _SSH["ssh_config"],
    failed_hosts: Optional[str] = typer.Option(None, "--failed-hosts", metavar="FILE",
                                               help="Write the hosts that failed or were unreachable to FILE, a hosts "
                                                    "file: `clusterctl run FILE CMD` retries just those."),
) -> None:
    """Run a command on every node at once."""
    from clusterctl.cli import display

    if len(args) > 2:
        raise UsageError("too many arguments", 'quote the command: clusterctl run hosts "CMD ARGS"')
    hosts_path, cmd = (args[0], args[1]) if len(args) == 2 else (None, args[0])
    if timeout is not None and timeout <= 0:
        raise UsageError("--timeout must be positive")
    if detach is not None:
        from clusterctl.remote import tmux as jobs

        cmd = jobs.detach_command(detach, cmd)  # validates NAME before anything connects
    inv = _inventory(hosts_path, cluster, parallel, connect_timeout, user, identity, known_hosts, ssh_config)
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


def _write_failed_hosts(inv, report, path: str) -> None:
    """pssh -o / clush -b habits: the hosts to retry, with their slots (an empty file when none failed, so an
    old list never lingers)."""
    from clusterctl.cli import display
    from clusterctl.cluster.state import atomic_write

    bad = {r.host for r in report if not r.ok}
    text = "".join(f"{e.host} slots={e.slots}\n" for e in inv.hosts.entries if e.host in bad)
    atomic_write(Path(path).expanduser(), text, mode=0o644)
    display.info(f"{len(bad)} failed host(s) written to {path}" if bad else f"no host failed: {path} is empty")


@app.command("ssh", short_help="A shell or a command on a node, host keys checked.",
             context_settings={"allow_interspersed_args": False})
@command
def ssh_(
    args: Optional[List[str]] = typer.Argument(None, metavar="[NODE] [-- CMD ...]",
                                               help="A node (leader, member-N, its index or address; default: the "
                                                    "leader), then the command (default: an interactive shell)."),
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


@app.command(short_help="Stream a detached job's output.")
@command
def logs(
    name: Optional[str] = typer.Argument(None, help="The job's name (as given to run --detach); default: the training job, from the leader."),
    hostsfile: Optional[str] = typer.Argument(None, metavar="[HOSTS]", help="A hosts file (default: the current cluster)."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep streaming until the job ends everywhere."),
    cluster: Optional[str] = _SSH["cluster"],
    parallel: int = _SSH["parallel"],
    connect_timeout: float = _SSH["connect_timeout"],
    user: Optional[str] = _SSH["user"],
    identity: List[str] = _SSH["identity"],
    known_hosts: Optional[str] = _SSH["known_hosts"],
    ssh_config: Optional[str] = _SSH["ssh_config"],
) -> None:
    """Stream a detached job's output from every host, prefixed by host; with -f, until it ends.
    Exit status: the job's worst exit status once it ended (0 while it still runs)."""
    from clusterctl.cli import display
    from clusterctl.remote import tmux as jobs

    if name is None:
        return _train_logs(hostsfile, cluster, follow, connect_timeout)
    cmd = jobs.logs_command(name, follow)
    inv = _inventory(hostsfile, cluster, parallel, connect_timeout, user, identity, known_hosts, ssh_config)
    report = _fan_out(inv, cmd, parallel)
    display.summary(report)
    raise typer.Exit(report.exit_code)


@app.command("kill", short_help="End a detached job on every node.")
@command
def kill_(
    name: str = typer.Argument(..., help="The job's name (as given to run --detach)."),
    hostsfile: Optional[str] = typer.Argument(None, metavar="[HOSTS]", help="A hosts file (default: the current cluster)."),
    grace: float = typer.Option(3.0, "--grace", help="Seconds between SIGTERM and SIGKILL."),
    cluster: Optional[str] = _SSH["cluster"],
    parallel: int = _SSH["parallel"],
    connect_timeout: float = _SSH["connect_timeout"],
    user: Optional[str] = _SSH["user"],
    identity: List[str] = _SSH["identity"],
    known_hosts: Optional[str] = _SSH["known_hosts"],
    ssh_config: Optional[str] = _SSH["ssh_config"],
) -> None:
    """End a detached job on every host: its whole process tree, then its tmux session; verified."""
    from clusterctl.cli import display
    from clusterctl.remote import tmux as jobs

    if not 0 <= grace <= 300:
        raise UsageError("--grace must be 0..300 seconds")
    cmd = jobs.kill_job_command(name, grace)
    inv = _inventory(hostsfile, cluster, parallel, connect_timeout, user, identity, known_hosts, ssh_config)
    report = _fan_out(inv, cmd, parallel)
    display.summary(report)
    raise typer.Exit(report.exit_code)


@app.command(short_help="Kill leftovers, remove logs, disks, reboot.")
@command
def clean(
    hostsfile: Optional[str] = typer.Argument(None, metavar="[HOSTS]", help="A hosts file (default: the current cluster)."),
    kill: bool = typer.Option(False, "--kill", help="SIGKILL python/horovodrun/mpirun/orted trees (the default action)."),
    logs_dir: Optional[str] = typer.Option(None, "--logs", metavar="DIR", help="Remove this folder on every node."),
    force: bool = typer.Option(False, "--force", help="With --logs: allow a folder outside the login user's home."),
    disk: bool = typer.Option(False, "--disk", help="Table of free/used disk per node (under 10%% free flagged)."),
    reboot: bool = typer.Option(False, "--reboot", help="Reboot every node and wait until each answers ssh again."),
    wait: float = typer.Option(300.0, "--wait", help="Seconds to wait for rebooted nodes."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation (--logs, --reboot)."),
    cluster: Optional[str] = _SSH["cluster"],
    parallel: int = _SSH["parallel"],
    connect_timeout: float = _SSH["connect_timeout"],
    user: Optional[str] = _SSH["user"],
    identity: List[str] = _SSH["identity"],
    known_hosts: Optional[str] = _SSH["known_hosts"],
    ssh_config: Optional[str] = _SSH["ssh_config"],
) -> None:
    """The troubleshooting commands, done safely: kill leftover jobs, remove a log folder, show disks, reboot."""
    from clusterctl.remote import clean as cleanlib
    from clusterctl.cli import display

    kill = kill or not (logs_dir is not None or disk or reboot)
    if logs_dir is not None:
        cleanlib.check_logs_path(logs_dir)
    if force and logs_dir is None:
        raise UsageError("--force goes with --logs DIR")
    if wait <= 0:
        raise UsageError("--wait must be positive")
    inv = _inventory(hostsfile, cluster, parallel, connect_timeout, user, identity, known_hosts, ssh_config)
    where = f"{len(inv.targets)} node(s)"
    if logs_dir is not None:
        _confirm(f"Remove {logs_dir} on {where}?", yes)
    if reboot:
        _confirm(f"Reboot {where}?", yes)
    codes = []
    if kill:
        _name_this_process()  # so a clean run from a node never matches clusterctl itself
        report = _fan_out(inv, cleanlib.kill_command(), parallel)
        display.summary(report)
        codes.append(report.exit_code)
    if logs_dir is not None:
        report = _fan_out(inv, cleanlib.logs_command(logs_dir, force), parallel)
        display.summary(report)
        codes.append(report.exit_code)
    if disk:
        report = _fan_out(inv, cleanlib.DISK_COMMAND, parallel, live=False)
        rows = [row for r in report if r.ok for row in cleanlib.parse_disk(r.host, r.stdout)]
        display.disk_table(rows)
        if not report.all_ok:
            display.summary(report)
        codes.append(report.exit_code)
    if reboot:
        codes.append(_reboot(inv, parallel, wait))
    raise typer.Exit(combined(codes))


def _name_this_process() -> None:
    try:
        import ctypes

        ctypes.CDLL(None).prctl(15, b"clusterctl", 0, 0, 0)  # PR_SET_NAME
    except Exception:
        pass


def _reboot(inv, parallel: int, wait: float) -> int:
    from clusterctl.cli import display
    from clusterctl.remote import clean as cleanlib

    start = time.monotonic()
    store = _store()
    provider = _provider(inv.cluster.provider, store, inv.cluster.region) if inv.cluster is not None else None
    why = cleanlib.reboot(inv, provider, parallel, wait, display.info, store.root)
    bad = {h: w for h, w in why.items() if w}
    for t in inv.targets:
        if why.get(t.label) is None:
            display.info(f"{t.label}: back after {time.monotonic() - start:.1f}s")
        else:
            display.warn(f"{t.label}: {why[t.label]}")
    if not bad:
        display.info(f"{len(inv.targets)} node(s) rebooted and answering ssh")
        return 0
    if all(str(w).startswith("refused") for w in bad.values()):
        return int(ExitCode.CONFIG)
    if any("host key" in str(w) for w in bad.values()):
        return int(ExitCode.UNREACHABLE)
    return int(ExitCode.TIMEOUT)


@app.command("agent", short_help="Status or stop of the connection agent.")
@command
def agent_(action: str = typer.Argument("status", help="status | stop")) -> None:
    """The background holder of reused ssh connections: status, or stop it (down stops it too)."""
    from clusterctl.remote import agent
    from clusterctl.cli import display

    root = _store().root
    if action == "status":
        info = agent.ping(root)
        if info is None or info.get("event") != "pong":
            display.info("no connection agent running")
        else:
            display.info(f"connection agent pid {info['pid']}: {info['connections']} connection(s) open, "
                         f"exits after {info['idle']:.0f}s idle; socket {agent.socket_path(root)}")
    elif action == "stop":
        display.info("connection agent stopped" if agent.stop(root) else "no connection agent running")
    else:
        raise UsageError(f"unknown action {action!r}", "use status or stop")


# ---- the synthetic benchmark -----------------------------------------------------------------------------
@app.command()
@command
def bench(
    hostsfile: Optional[str] = typer.Argument(None, metavar="[HOSTS]", help="A hosts file (default: the current cluster)."),
    synthetic: bool = typer.Option(False, "--synthetic", help="Synthetic images (the only kind; real data is `train`)."),
    cluster: Optional[str] = typer.Option(None, "--cluster", "-c", help="A cluster by name."),
    model: str = typer.Option("resnet50", "--model", help="resnet50, or tiny for CPU smoke runs."),
    batch_size: int = typer.Option(32, "--batch-size", help="Images per process per step."),
    steps: int = typer.Option(10, "--steps", help="Steps per timed batch."),
    iters: int = typer.Option(10, "--iters", help="Timed batches per rung (mean +- 1.96 sigma over them)."),
    warmup: int = typer.Option(10, "--warmup-steps", help="Untimed steps first (at least 10)."),
    input_only: bool = typer.Option(False, "--input-only", help="Time the input pipeline alone (no model)."),
    ladder: Optional[str] = typer.Option(None, "--ladder", help="Process counts, e.g. 1,8,16,32 (default: 1, one node, all)."),
    threshold: float = typer.Option(0.90, "--threshold", help="Scaling efficiency required per added node."),
    mixed_precision: bool = typer.Option(False, "--mixed-precision", help="float16 compute."),
    xla: bool = typer.Option(False, "--xla", help="Compile the step with XLA."),
    timeout: float = typer.Option(900.0, "--timeout", help="Seconds each rung may take."),
    python: Optional[str] = typer.Option(None, "--python", help="Python on the nodes (default: the cluster's)."),
    out: Path = typer.Option(Path("bench-results"), "--out", help="Folder for results.json, logs and scaling.png."),
    user: Optional[str] = _SSH["user"],
    identity: List[str] = _SSH["identity"],
    known_hosts: Optional[str] = _SSH["known_hosts"],
    ssh_config: Optional[str] = _SSH["ssh_config"],
) -> None:
    """Synthetic Horovod ladder: 1 GPU, 1 node, all; a verdict."""
    from clusterctl.workloads import bench as benchlib
    from clusterctl.cli import display

    if not synthetic:
        raise UsageError("only --synthetic is supported", "run `clusterctl bench --synthetic`; real data is `clusterctl train`")
    if model not in ("resnet50", "tiny"):
        raise UsageError(f"unknown model {model!r}", "use resnet50 or tiny")
    if not 0 < threshold <= 1:
        raise UsageError(f"--threshold must be in (0, 1], not {threshold}")
    if warmup < benchlib.MIN_WARMUP or iters < benchlib.MIN_ITERS or steps < 1 or batch_size < 1:
        raise UsageError(f"--warmup-steps must be at least {benchlib.MIN_WARMUP}, --iters at least "
                         f"{benchlib.MIN_ITERS}, --steps and --batch-size at least 1")
    inv = _resolve_hosts(hostsfile, cluster, user, identity, known_hosts, ssh_config)
    inv.hosts.check_launchable()  # horovodrun takes one ssh port for every host
    rungs = benchlib.parse_ladder(ladder, inv.hosts) if ladder else benchlib.default_ladder(inv.hosts)
    opts = benchlib.BenchOptions(model=model, batch_size=batch_size, steps=steps, iters=iters, warmup_steps=warmup,
                                 mixed_precision=mixed_precision, xla=xla, input_only=input_only,
                                 threshold=threshold, timeout=timeout)
    display.info(f"ladder: {', '.join(map(str, rungs))} process(es) on {len(inv.hosts.entries)} node(s), "
                 f"model {model}, batch {batch_size}/process")
    result = benchlib.run_ladder(inv, rungs, opts, out, python=python, on_event=display.BenchProgress())
    display.ladder_table(result)
    _bench_cost(inv, result, "input-pipeline" if input_only else model)
    if result.judged and result.status == "INCONCLUSIVE":
        raise typer.Exit(int(ExitCode.INCONCLUSIVE))
    if result.judged and not result.passed:
        raise typer.Exit(int(ExitCode.REMOTE_FAILED))


def _bench_cost(inv, ladder, model: str) -> None:
    """What the ladder cost, and what ImageNet costs at the rate measured on the top rung (bench.cost_lines)."""
    from clusterctl.workloads import bench as benchlib
    from clusterctl.cluster import costs
    from clusterctl.cli import display

    per_hour = costs.hourly(inv.cluster)
    for line in benchlib.cost_lines(ladder, per_hour, model):
        display.info(line)
    top = max(ladder.rungs, key=lambda r: r.np, default=None)
    if top is not None and top.img_per_sec > 0 and inv.cluster is not None and model != "input-pipeline":
        costs.save_measured(_store(), inv.cluster.name, top.img_per_sec, top.np, model)


# ---- the preflight check ---------------------------------------------------------------------------------
@app.command()
@command
def doctor(
    hostsfile: Optional[str] = typer.Argument(None, metavar="[HOSTS]", help="A hosts file (default: the current cluster)."),
    cluster: Optional[str] = typer.Option(None, "--cluster", "-c", help="A cluster by name."),
    json_: bool = typer.Option(False, "--json", help="The report as JSON."),
    python: Optional[str] = typer.Option(None, "--python", help="Python on the nodes (default: the cluster's)."),
    timeout: float = typer.Option(120.0, "--timeout", help="Seconds the probe may take on each node."),
    fabric: bool = typer.Option(False, "--fabric", help="Also measure allreduce bandwidth: the cluster, and ring neighbours."),
    fabric_mb: float = typer.Option(64.0, "--fabric-mb", help="MiB per allreduce in the --fabric test."),
    user: Optional[str] = _SSH["user"],
    identity: List[str] = _SSH["identity"],
    known_hosts: Optional[str] = _SSH["known_hosts"],
    ssh_config: Optional[str] = _SSH["ssh_config"],
) -> None:
    """Preflight checks that silently ruin multi-node training.

    ssh mesh, versions, GPUs, disk, memory, clock, stale processes, cloud placement; with --fabric, the
    allreduce bandwidth of the cluster and of each node's ring neighbours, the slow node named.
    """
    import json as jsonlib

    from clusterctl.cli import display
    from clusterctl.workloads import doctor as doctorlib

    if fabric and not 0 < fabric_mb <= 4096:
        raise UsageError(f"--fabric-mb must be in (0, 4096], not {fabric_mb}")
    store = _store()
    inv = _resolve_hosts(hostsfile, cluster, user, identity, known_hosts, ssh_config, store=store)
    if fabric:
        inv.hosts.check_launchable()  # horovodrun takes one ssh port for every host
    report = doctorlib.run(inv, python=python, timeout=timeout, cloud=_cloud_facts(inv.cluster, store))
    if fabric:
        report = doctorlib.with_fabric(report, doctorlib.fabric(inv, python=python, mb=fabric_mb,
                                                                timeout=max(timeout, 300.0)))
    if json_:
        sys.stdout.write(jsonlib.dumps(report.to_dict()) + "\n")
    else:
        display.doctor_table(report)
    if any(n.cells["reachable"].status == "fail" for n in report.nodes):
        raise typer.Exit(int(ExitCode.UNREACHABLE))
    if not report.ok:
        raise typer.Exit(int(ExitCode.REMOTE_FAILED))


def _cloud_facts(cluster, store):
    """Instance type / zone / placement per node, as the cluster's provider sees them (None for a hosts file)."""
    if cluster is None:
        return None
    from clusterctl.workloads import doctor as doctorlib

    impl = _provider(cluster.provider, store, cluster.region)
    return doctorlib.placement_facts(cluster, impl.node_facts(cluster))


# ---- the dataset on every node ---------------------------------------------------------------------------
@app.command()
@command
def sync(
    args: List[str] = typer.Argument(..., metavar="[HOSTS] SRC DST",
                                     help="A hosts file (optional); SRC: a local folder, leader:PATH or "
                                          "s3://bucket/prefix; DST: the folder on every node. Put -- before "
                                          "paths that start with '-'."),
    cluster: Optional[str] = typer.Option(None, "--cluster", "-c", help="A cluster by name (default: the current)."),
    strategy: str = typer.Option("chain", "--strategy", help="chain (pipelined relay), tree, parallel or sequential."),
    fanout: int = typer.Option(1, "--fanout", help="chain: split the nodes after the first into K chains."),
    plan: bool = typer.Option(False, "--plan", help="Print who sends to whom, and copy nothing."),
    delete: bool = typer.Option(False, "--delete", help="Mirror: remove files on the nodes that SRC does not have."),
    endpoint_url: Optional[str] = typer.Option(None, "--endpoint-url", help="S3 endpoint the nodes use (e.g. a test server)."),
    stall_timeout: float = typer.Option(120.0, "--stall-timeout", help="chain: seconds with no data moving before the "
                                        "node that stopped taking it is reported failed and cut out (the rest finish)."),
    verify: str = typer.Option("stream", "--verify", help="stream: a chain node's copy is proved by the sha256 of "
                               "every file as it was written (no second read); disk: every file read back and hashed."),
    connect_timeout: float = typer.Option(10.0, "--connect-timeout", help="Seconds to wait for each connection."),
    user: Optional[str] = _SSH["user"],
    identity: List[str] = _SSH["identity"],
    known_hosts: Optional[str] = _SSH["known_hosts"],
    ssh_config: Optional[str] = _SSH["ssh_config"],
) -> None:
    """Put a dataset on every node: fast, verified, resumable.

    A pipelined relay by default, a sha256 manifest checked on every node.
    """
    from clusterctl.cli import display
    from clusterctl.workloads import launch
    from clusterctl.data import sync as transfer
    from clusterctl.remote.ssh import SshPool

    if len(args) not in (2, 3):
        raise UsageError("expected [HOSTS] SRC DST", "e.g. clusterctl sync hosts ~/imagenet_data ~/imagenet_data")
    hosts_path, src, dst = (args[0], args[1], args[2]) if len(args) == 3 else (None, args[0], args[1])
    if strategy not in transfer.STRATEGIES:
        raise UsageError(f"unknown --strategy {strategy!r}", f"use one of {', '.join(transfer.STRATEGIES)}")
    if fanout < 1:
        raise UsageError("--fanout must be at least 1")
    if not stall_timeout > 0:
        raise UsageError(f"--stall-timeout must be positive, not {stall_timeout:g}")
    if verify not in transfer.VERIFY:
        raise UsageError(f"unknown --verify {verify!r}", "use stream (the default) or disk")
    transfer.check_dst(dst)
    source = transfer.parse_source(src)
    inv = _resolve_hosts(hosts_path, cluster, user, identity, known_hosts, ssh_config, connect_timeout)
    labels = [t.label for t in inv.targets]
    if plan:
        for line in transfer.render_plan(strategy, labels, source, fanout, labels[0] if labels else None):
            sys.stdout.write(line + "\n")
        return
    from clusterctl.autostop import control as autostop

    with autostop.lease(_store(), inv.cluster, "sync", warn=display.warn), SshPool(inv.settings) as pool, \
            display.SyncProgress(labels) as events:  # the lease: autostop counts the copy as activity
        syncer = transfer.Syncer(inv.targets, [e.address for e in inv.hosts.entries], inv.settings.known_hosts, pool, source, dst,
                                 strategy=strategy, fanout=fanout, delete=delete, endpoint_url=endpoint_url,
                                 managed=inv.cluster is not None, events=events,
                                 node_python=launch.node_python(inv.cluster), stall_timeout=stall_timeout,
                                 verify=verify)
        report = syncer.run()
    display.sync_table(report)
    err = report.error()
    if err is not None:
        raise err


# ---- playbooks -------------------------------------------------------------------------------------------
@app.command()
@command
def play(
    playbook: str = typer.Argument(..., help="A playbook file, or the name of a shipped one (smoke, cleanup ...)."),
    hostsfile: Optional[str] = typer.Option(None, "--hosts", help="A hosts file (default: the current cluster)."),
    cluster: Optional[str] = typer.Option(None, "--cluster", "-c", help="A cluster by name."),
    var: List[str] = typer.Option([], "--var", help="Override a variable: --var name=value (repeatable)."),
    start_from: Optional[str] = typer.Option(None, "--from", help="Resume from this step."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print what each step would run; run nothing."),
) -> None:
    """Run a playbook of named steps (run, put, sync, bench ...)."""
    from clusterctl import resources
    from clusterctl.cli import display
    from clusterctl.cluster import inventory
    from clusterctl.playbook import load as pbload
    from clusterctl.playbook import model as pbmodel
    from clusterctl.playbook import run as pb

    path = Path(playbook)
    if not path.exists() and "/" not in playbook:
        shipped = resources.folder("playbooks") / (playbook if playbook.endswith(".yaml") else f"{playbook}.yaml")
        path = shipped if shipped.exists() else path
    overrides = {}
    for item in var:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--var takes name=value, not {item!r}")
        overrides[key] = value
    book = pbload.load(path, overrides)
    if dry_run:
        for step in book.steps:
            display.info(f"{step.name}: {pb.describe(step)}" + ("" if step.on_failure == "stop" else "  [on_failure: continue]"))
        return
    store = _store()
    ctx = pbmodel.Context(inventory.resolve(hostsfile, cluster, store), store, report=display.info)
    results = pb.execute(book, ctx, start_from)
    display.play_summary(results)
    if not all(r.ok for r in results):
        raise typer.Exit(int(ExitCode.REMOTE_FAILED))


# ---- datasets --------------------------------------------------------------------------------------------
data_app = typer.Typer(no_args_is_help=True, short_help="Make ImageNet-format TFRecord datasets.",
                       help="Make ImageNet-format TFRecord datasets (to rehearse before ImageNet).")
app.add_typer(data_app, name="data")


def _data_report(info) -> None:
    from clusterctl.cli import display

    parts = ", ".join(f"{s.examples} {s.name} image(s) in {len(s.shards)} shard(s)" for s in info.splits.values())
    display.info(f"{info.path}: {parts}, {info.num_classes} class(es), {info.bytes / 1e6:.1f} MB "
                 f"in {info.seconds:.1f}s; labels.txt and dataset.json written")
    if info.reencoded:
        display.info(f"{info.reencoded} image(s) were PNG or not RGB and were re-encoded as RGB JPEG")
    for path, why in info.skipped[:10]:
        display.warn(f"skipped {path}: {why}")
    if len(info.skipped) > 10:
        display.warn(f"... and {len(info.skipped) - 10} more unreadable image(s)")


@data_app.command("tfrecords")
@command
def data_tfrecords(
    src: str = typer.Argument(..., help="A folder of class sub-folders of JPEG/PNG images (or train/ and validation/ holding them); with --on leader a folder there or s3://bucket/prefix."),
    dst: str = typer.Argument(..., help="Folder to write train-*, validation-*, labels.txt, dataset.json into (with --on leader: on the leader)."),
    validation_fraction: float = typer.Option(0.1, "--validation-fraction", help="Share of each class held out (when SRC has no validation/)."),
    train_shards: Optional[int] = typer.Option(None, "--train-shards", help="Default: 1024 for ImageNet's size, fewer for small sets."),
    validation_shards: Optional[int] = typer.Option(None, "--validation-shards", help="Default: 128 for ImageNet's size, fewer for small sets."),
    seed: int = typer.Option(0, "--seed", help="Seed of the split and the shuffle."),
    force: bool = typer.Option(False, "--force", help="Replace a dataset already in DST."),
    val_labels: Optional[Path] = typer.Option(None, "--val-labels", metavar="FILE", help="Classes of a flat val/ folder (ImageNet's 50,000 images without class sub-folders): LOC_val_solution.csv, or the devkit's ground truth with --val-synsets."),
    val_synsets: Optional[Path] = typer.Option(None, "--val-synsets", metavar="FILE", help="The devkit's synset list for --val-labels ground truth (line N: the synset of class ID N)."),
    on: Optional[str] = typer.Option(None, "--on", metavar="leader", help="Convert on the cluster's leader (SRC and DST there; SRC may be s3://), with the node runtime's Python."),
    endpoint_url: Optional[str] = typer.Option(None, "--endpoint-url", help="S3 endpoint the leader uses for an s3:// SRC (e.g. a test server)."),
    cluster: Optional[str] = typer.Option(None, "--cluster", "-c", help="With --on leader: a cluster by name (default: the current)."),
) -> None:
    """Image folders to ImageNet-format TFRecords.

    Class sub-folders of JPEG/PNG images (the flowers layout, or train/ and validation/ holding them)
    become train-*/validation-* TFRecord shards with labels.txt and dataset.json. ImageNet's flat val/
    needs --val-labels. --on leader converts where the data is (then `clusterctl sync leader:DST DST`)."""
    import re

    from clusterctl.data import tfrecords as data
    from clusterctl.cli import display

    for flag, value in (("--train-shards", train_shards), ("--validation-shards", validation_shards)):
        if value is not None and value < 1:
            raise UsageError(f"{flag} must be at least 1, not {value}")
    if on is None and (src.startswith("s3://") or endpoint_url):
        raise UsageError("an s3:// SRC (and --endpoint-url) needs --on leader", "the leader reads it with its instance profile")
    if on is not None:
        if on != "leader":
            raise UsageError(f"--on {on!r}: only `--on leader` is understood")
        if endpoint_url is not None and not re.match(r"^https?://[^\s'\"]+$", endpoint_url):
            raise UsageError(f"--endpoint-url {endpoint_url!r} is not an http(s) URL")
        inv = _resolve_hosts(None, cluster)
        from clusterctl.autostop import control as autostop

        with autostop.lease(_store(), inv.cluster, "data", warn=display.warn):  # autostop waits for the conversion
            _data_report(data.convert_on_leader(inv, src, dst, val_labels=val_labels, val_synsets=val_synsets,
                                                on_line=display.info, train_shards=train_shards,
                                                validation_shards=validation_shards,
                                                validation_fraction=validation_fraction, seed=seed, force=force,
                                                endpoint_url=endpoint_url))
        return
    _data_report(data.convert_folder(src, dst, train_shards=train_shards, validation_shards=validation_shards,
                                     validation_fraction=validation_fraction, seed=seed, force=force,
                                     val_labels=val_labels, val_synsets=val_synsets))


@data_app.command("synthetic")
@command
def data_synthetic(
    dst: Path = typer.Argument(..., help="Folder to write the dataset into."),
    images: int = typer.Option(..., "--images", help="Training images."),
    classes: int = typer.Option(..., "--classes", help="Classes (balanced)."),
    validation_images: Optional[int] = typer.Option(None, "--validation-images", help="Default: a fifth of --images."),
    image_size: int = typer.Option(64, "--image-size", help="Side of the square images, in pixels."),
    train_shards: Optional[int] = typer.Option(None, "--train-shards"),
    validation_shards: Optional[int] = typer.Option(None, "--validation-shards"),
    seed: int = typer.Option(0, "--seed"),
    force: bool = typer.Option(False, "--force", help="Replace a dataset already in DST."),
) -> None:
    """A small generated set, same format.

    Generated images a small CNN can learn (a hue and stripes per class, noise), in the same
    ImageNet TFRecord format, for smoke tests and rehearsals."""
    from clusterctl.data import tfrecords as data

    for flag, value in (("--train-shards", train_shards), ("--validation-shards", validation_shards)):
        if value is not None and value < 1:
            raise UsageError(f"{flag} must be at least 1, not {value}")
    _data_report(data.write_synthetic(dst, images=images, classes=classes, validation_images=validation_images,
                                      image_size=image_size, train_shards=train_shards,
                                      validation_shards=validation_shards, seed=seed, force=force))


# ---- parameter sweeps ------------------------------------------------------------------------------------
@app.command(context_settings={"allow_interspersed_args": False})
@command
def sweep(
    cmd: Optional[List[str]] = typer.Argument(None, metavar="-- CMD ...",
                                              help="The trial's command: {NAME} takes each parameter's value, "
                                                   "{python} the nodes' Python, {trial} the trial number."),
    grid: List[str] = typer.Option([], "--grid", metavar="NAME=V1,V2", help="Values of one parameter (repeatable): every combination is a trial."),
    range_: List[str] = typer.Option([], "--range", metavar="NAME=LOW:HIGH[:log|int]", help="A range to sample with --random (repeatable)."),
    random_k: Optional[int] = typer.Option(None, "--random", metavar="K", help="K random trials from --range (and --grid values) instead of the grid."),
    seed: int = typer.Option(0, "--seed", help="Seed of --random."),
    gpus_per_trial: int = typer.Option(1, "--gpus-per-trial", help="GPUs (slots of one node) each trial gets."),
    metric: Optional[str] = typer.Option(None, "--metric", metavar="REGEX",
                                         help="The last output line matching REGEX gives the metric (its group 1, else the "
                                              "number in or after the match). Default: the last JSON line's \"metric\"."),
    metric_key: str = typer.Option("metric", "--metric-key", help="The key of the metric in a JSON output line."),
    goal: str = typer.Option("max", "--goal", help="max or min: which metric is best."),
    files: List[str] = typer.Option([], "--file", metavar="PATH",
                                    help="Copy to every node's sweep folder, where trials run (repeatable); a shipped "
                                         "template's name (train_imagenet.py) works too."),
    workdir: Optional[str] = typer.Option(None, "--workdir", help="Run trials in this folder on the nodes instead."),
    trial_timeout: Optional[float] = typer.Option(None, "--trial-timeout", help="Seconds a trial may run before it is killed."),
    node_timeout: float = typer.Option(30.0, "--node-timeout", help="Seconds of failed ssh before a node is dead and its trials re-queued."),
    detach: bool = typer.Option(False, "--detach", help="Start the sweep and return (then --status, --attach, --cancel)."),
    status: bool = typer.Option(False, "--status", help="Show a sweep's trials now (from another terminal too)."),
    attach: bool = typer.Option(False, "--attach", help="Watch a sweep until it ends, then write its results here."),
    cancel: bool = typer.Option(False, "--cancel", help="End every trial of a sweep and stop it."),
    sweep_id: Optional[str] = typer.Option(None, "--id", help="The sweep for --status/--attach/--cancel (default: the latest)."),
    json_: bool = typer.Option(False, "--json", help="With --status: the scheduler's whole state as JSON."),
    out: Path = typer.Option(Path("sweep-results"), "--out", help="Folder for <time>/results.json, logs and the plot."),
    cluster: Optional[str] = typer.Option(None, "--cluster", "-c", help="A cluster by name (default: the current)."),
    hostsfile: Optional[str] = typer.Option(None, "--hosts", help="A hosts file instead of a cluster."),
    python: Optional[str] = typer.Option(None, "--python", help="Python on the nodes (default: the cluster's)."),
    poll: float = typer.Option(1.0, "--poll", help="Seconds between the scheduler's rounds (and this watch's)."),
    user: Optional[str] = _SSH["user"],
    identity: List[str] = _SSH["identity"],
    known_hosts: Optional[str] = _SSH["known_hosts"],
    ssh_config: Optional[str] = _SSH["ssh_config"],
) -> None:
    """Parallel experiments: one trial per GPU, run detached.

    A grid or random search across every node.
    """
    import json as jsonlib

    from clusterctl.cli import display
    from clusterctl.workloads import sweep as sweeplib
    from clusterctl.remote.ssh import SshPool

    modes = [name for name, on in (("--status", status), ("--attach", attach), ("--cancel", cancel), ("--detach", detach)) if on]
    if len(modes) > 1:
        raise UsageError(f"{' and '.join(modes)} do not go together")
    control = status or attach or cancel
    if control and (cmd or grid or range_ or random_k is not None or files):
        raise UsageError(f"{modes[0]} takes no command or parameters", "name the sweep with --id (default: the latest)")
    if sweep_id is not None and not control:
        raise UsageError("--id goes with --status, --attach or --cancel")
    if json_ and not status:
        raise UsageError("--json goes with --status")
    if not 0.1 <= poll <= 60:
        raise UsageError("--poll must be 0.1..60 seconds")
    if sweep_id is not None:
        sweeplib.validate_id(sweep_id)
    spec = None
    if not control:
        if goal not in ("max", "min"):
            raise UsageError(f"--goal must be max or min, not {goal!r}")
        if gpus_per_trial < 1:
            raise UsageError(f"--gpus-per-trial must be at least 1, not {gpus_per_trial}")
        if trial_timeout is not None and trial_timeout <= 0:
            raise UsageError("--trial-timeout must be positive")
        if node_timeout <= 0:
            raise UsageError("--node-timeout must be positive")
        sweeplib.check_metric(metric)
        grid_values = sweeplib.parse_grid(grid)
        ranges = sweeplib.parse_ranges(range_)
        combos = sweeplib.expand(grid_values, ranges, random_k, seed)
        staged = sweeplib.stage_files(files)
        sweeplib.build_trials(cmd or [], combos[:1], "python")  # a bad command template fails before connecting
    inv = _resolve_hosts(hostsfile, cluster, user, identity, known_hosts, ssh_config)
    inv.hosts.check_launchable("the sweep scheduler (ssh from the leader to each node)")
    py = sweeplib.python_for(inv.cluster, python)
    if not control:
        trials = sweeplib.build_trials(cmd or [], combos, py)
        params = tuple(combos[0])
        for name in sweeplib.unused(cmd or [], params):
            display.warn(f"parameter {name} is not used in the command (no {{{name}}} in it)")
        spec = sweeplib.SweepSpec(tuple(cmd or ()), tuple(trials), params, gpus_per_trial, metric, metric_key, goal,
                                  tuple(staged), workdir, trial_timeout, node_timeout, poll,
                                  tuple(n for n, r in ranges.items() if r.scale == "log"))
    with SshPool(inv.settings) as pool:
        leader = inv.targets[0]
        if spec is not None:
            sid, folder = sweeplib.start(pool, inv, spec, py)
            slots = sum(e.slots for e in inv.hosts.entries) // gpus_per_trial
            display.info(f"sweep {sid}: {len(spec.trials)} trial(s) on {len(inv.hosts.entries)} node(s), up to {slots} "
                         f"at once; scheduler detached on the leader {leader.label} (tmux {sid}), trials' logs in {folder}")
            if detach:
                display.info(f"follow it with: clusterctl sweep --attach --id {sid}  (or --status, --cancel)")
                return
            _sweep_watch(pool, inv, sid, out, poll)
            return
        sid = sweeplib.validate_id(sweep_id) if sweep_id else sweeplib.latest(pool, leader)
        if status:
            snap = sweeplib.read_state(pool, leader, sid)
            if json_:
                sys.stdout.write(jsonlib.dumps({"id": sid, "scheduler": "running" if snap.alive else "stopped",
                                                "state": snap.state}) + "\n")
                return
            if snap.state is None:
                display.info(f"sweep {sid}: the scheduler has not written its state yet"
                             + ("" if snap.alive else f" and is not running; see ~/.clusterctl/jobs/{sid}.log on the leader"))
                return
            _sweep_show(snap.state, sort=snap.state.get("status") in sweeplib.ENDED)
            if not snap.alive and snap.state.get("status") not in sweeplib.ENDED and snap.log_tail.strip():
                display.warn("the scheduler's last words: " + " / ".join(snap.log_tail.strip().splitlines()[-3:]))
            display.info(sweeplib.summary(snap.state) + ("" if snap.alive or snap.state.get("status") in sweeplib.ENDED
                                                       else "; the scheduler is not running (--cancel ends its trials)"))
            return
        if cancel:
            state = sweeplib.cancel(pool, leader, sid, py)
            _sweep_show(state, sort=False)
            display.info(sweeplib.summary(state))
            return
        _sweep_watch(pool, inv, sid, out, poll)


def _sweep_show(state: dict, sort: bool, title: Optional[str] = None) -> None:
    from clusterctl.cli import display
    from clusterctl.workloads import sweep as sweeplib

    meta = state.get("meta") or {}
    params = meta.get("params") or (list(state["trials"][0]["params"]) if state.get("trials") else [])
    display.sweep_table(sweeplib.rows(state, params, meta.get("goal", "max"), sort), params,
                        meta.get("metric", "metric"), title)


def _sweep_watch(pool, inv, sid: str, out: Path, poll: float) -> None:
    """Follow a sweep to its end, then: the sorted table, results.json, the logs, the plot; exit status."""
    from clusterctl.cli import display
    from clusterctl.workloads import sweep as sweeplib
    from clusterctl.errors import RemoteCommandError

    try:
        state = sweeplib.watch(pool, inv.targets[0], sid, display.SweepProgress, poll=poll)
    except KeyboardInterrupt:
        display.info(f"stopped watching; sweep {sid} goes on on the leader: "
                     f"clusterctl sweep --status | --attach | --cancel  (--id {sid})")
        raise
    meta = state.get("meta") or {}
    params, goal = meta.get("params") or list(state["trials"][0]["params"]), meta.get("goal", "max")
    folder = sweeplib.results_dir(out)
    missing = sweeplib.collect_logs(pool, inv, state, folder)
    sweeplib.write_results(folder, state, {"cluster": inv.cluster.name if inv.cluster else None, **meta})
    plotted = sweeplib.plot(state, params, meta.get("metric", "metric"), goal, folder / "metric_vs_params.png",
                            meta.get("log_scale") or ())
    _sweep_show(state, sort=True, title=f"sweep {sid}: {meta.get('metric', 'metric')} ({goal}), best first")
    top = sweeplib.best(state, goal)
    display.info(sweeplib.summary(state))
    if state.get("error"):
        display.warn(state["error"])
    if top is not None:
        display.info(f"best: trial {top['id']} (" + " ".join(f"{k}={v}" for k, v in top["params"].items())
                     + f") {meta.get('metric', 'metric')} {top['metric']:.6g}")
    if missing:
        display.warn(f"no logs from {', '.join(missing)} (node dead or unreachable)")
    display.info(f"results: {folder}/results.json, logs/" + (", metric_vs_params.png" if plotted else ""))
    trials = state.get("trials", [])
    if state.get("status") == "cancelled":
        raise RemoteCommandError(f"sweep {sid} was cancelled", f"results so far are in {folder}")
    bad = [t for t in trials if t.get("state") != "done" or t.get("metric") is None]
    if bad:
        raise RemoteCommandError(f"{len(bad)} of {len(trials)} trial(s) did not finish with a metric "
                                 f"({', '.join(str(t['id']) for t in bad[:10])})", f"see their logs in {folder}/logs")


# ---- training ------------------------------------------------------------------------------------------
def _train_inventory(hostsfile, cluster, connect_timeout: float = 10.0):
    from clusterctl.cluster import inventory

    return inventory.resolve(hostsfile, cluster, _store(), inventory.SshOverrides(connect_timeout=connect_timeout))


def _print_line(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


@app.command()
@command
def train(
    hostsfile: Optional[str] = typer.Argument(None, metavar="[HOSTS]", help="A hosts file (default: the current cluster)."),
    data: Optional[str] = typer.Option(None, "--data", help="Dataset folder on every node (ImageNet-format TFRecords, put there by `clusterctl sync`)."),
    synthetic: bool = typer.Option(False, "--synthetic", help="Random in-memory images instead of --data."),
    model: str = typer.Option("resnet50", "--model", help="resnet50, or tiny for CPU rehearsals."),
    epochs: float = typer.Option(90, "--epochs"),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", help="Images per process per step (trainer default 64)."),
    model_dir: Optional[str] = typer.Option(None, "--model-dir", help="Checkpoints and TensorBoard logs on the leader (default ~/clusterctl-train/model); a restart resumes from it."),
    checkpoint_every: Optional[int] = typer.Option(None, "--checkpoint-every", help="Steps between checkpoints (also at every epoch)."),
    log_every: Optional[int] = typer.Option(None, "--log-every", help="Steps between log lines."),
    max_steps: Optional[int] = typer.Option(None, "--max-steps", help="Stop at this step (the schedule still spans --epochs)."),
    base_lr: Optional[float] = typer.Option(None, "--base-lr", help="Learning rate per 256 images (scaled with the global batch)."),
    warmup_epochs: Optional[float] = typer.Option(None, "--warmup-epochs"),
    mixed_precision: bool = typer.Option(False, "--mixed-precision", help="float16 on GPUs, bfloat16 on CPUs (--precision mixed)."),
    precision: Optional[str] = typer.Option(None, "--precision", help="auto (the trainer's default: float16 with loss scaling on GPUs with tensor cores, compute capability 7.0+, else fp32), fp32, float16, bfloat16 or mixed."),
    fp32: bool = typer.Option(False, "--fp32", help="No mixed precision, even on tensor-core GPUs (--precision fp32)."),
    fp16_allreduce: bool = typer.Option(False, "--fp16-allreduce", help="Compress gradients to float16 for the allreduce."),
    recipe: Optional[str] = typer.Option(None, "--recipe", help="default (cosine decay, label smoothing 0.1) or goyal (Goyal et al. 2017: /10 at epochs 30, 60, 80 of 90, 5 warm-up epochs, no label smoothing, zero last BN gamma per residual block)."),
    eval_every: Optional[int] = typer.Option(None, "--eval-every", help="Also evaluate every N epochs during training (all processes, each validation image once)."),
    fusion_threshold_mb: float = typer.Option(64.0, "--fusion-threshold-mb", help="Horovod's tensor fusion buffer (HOROVOD_FUSION_THRESHOLD), MiB."),
    cycle_time_ms: float = typer.Option(1.0, "--cycle-time-ms", help="Horovod's cycle time (HOROVOD_CYCLE_TIME), ms."),
    xla: bool = typer.Option(False, "--xla"),
    trainer_arg: List[str] = typer.Option([], "--trainer-arg", help="One more argument for train_imagenet.py (repeatable)."),
    np_: Optional[int] = typer.Option(None, "--np", help="Processes (default: every slot of the hosts)."),
    python: Optional[str] = typer.Option(None, "--python", help="Python on the nodes (default: the cluster's)."),
    wait: bool = typer.Option(False, "--wait", help="Follow the job to its end (exit status: the job's)."),
    force: bool = typer.Option(False, "--force", help="Stop a job still running first."),
    stop: bool = typer.Option(False, "--stop", help="Stop the training job everywhere, and start nothing."),
    no_verify_data: bool = typer.Option(False, "--no-verify-data", help="Skip the check that `clusterctl sync` verified the data on every node."),
    checkpoint_to: Optional[str] = typer.Option(None, "--checkpoint-to", metavar="S3_URI", help="Also upload every checkpoint to s3://bucket/prefix (the nodes' instance profile; on AWS clusters clusterctl grants it write on that prefix only)."),
    no_checkpoint_copy: bool = typer.Option(False, "--no-checkpoint-copy", help="Do not keep a copy of every checkpoint on the second node."),
    cluster: Optional[str] = typer.Option(None, "--cluster", "-c", help="A cluster by name."),
    user: Optional[str] = _SSH["user"],
    identity: List[str] = _SSH["identity"],
    known_hosts: Optional[str] = _SSH["known_hosts"],
    ssh_config: Optional[str] = _SSH["ssh_config"],
) -> None:
    """Start training on the leader, in tmux.

    Horovod over every slot, launched by horovodrun on the leader inside tmux; returns at once (--wait
    follows it). Refuses while a job runs (--force stops it first) or when the data is not verified on
    every node. Started again, the job resumes from the latest checkpoint in --model-dir."""
    from clusterctl.cli import display
    from clusterctl.workloads import launch as launchlib
    from clusterctl.workloads import train_job as trainlib

    inv = _resolve_hosts(hostsfile, cluster, user, identity, known_hosts, ssh_config)
    store = _store()
    if stop:
        job = trainlib.require_job(store, inv)
        trainlib.stop(inv, job)
        display.info(f"stopped {job.job} on every node")
        return
    inv.hosts.check_launchable()  # horovodrun takes one ssh port for every host
    if synthetic == bool(data):
        raise UsageError("give --data DIR or --synthetic (one of them)")
    if model not in ("resnet50", "tiny"):
        raise UsageError(f"unknown model {model!r}", "use resnet50 or tiny")
    for flag, value in (("--batch-size", batch_size), ("--checkpoint-every", checkpoint_every),
                        ("--log-every", log_every), ("--max-steps", max_steps), ("--np", np_)):
        if value is not None and value < (0 if flag == "--checkpoint-every" else 1):
            raise UsageError(f"{flag} must be at least {0 if flag == '--checkpoint-every' else 1}, not {value}")
    if epochs <= 0:
        raise UsageError("--epochs must be positive")
    if fp32:
        if precision not in (None, "fp32"):
            raise UsageError(f"--fp32 and --precision {precision} say different things", "give one of them")
        precision = "fp32"
    if mixed_precision and precision is not None:
        raise UsageError("--mixed-precision and --precision/--fp32 say different things", "give one of them")
    if precision is not None and precision not in trainlib.PRECISIONS:
        raise UsageError(f"unknown precision {precision!r}", f"use one of {', '.join(trainlib.PRECISIONS)}")
    if recipe is not None and recipe not in trainlib.RECIPES:
        raise UsageError(f"unknown recipe {recipe!r}", f"use one of {', '.join(trainlib.RECIPES)}")
    if eval_every is not None and eval_every < 1:
        raise UsageError(f"--eval-every must be at least 1, not {eval_every}")
    if fusion_threshold_mb < 0 or cycle_time_ms <= 0:
        raise UsageError("--fusion-threshold-mb must not be negative and --cycle-time-ms must be positive")
    if checkpoint_to is not None:
        trainlib.check_s3_uri(checkpoint_to)
        if inv.cluster is not None:
            _provider(inv.cluster.provider, store, inv.cluster.region).grant_checkpoint_write(inv.cluster, checkpoint_to)
    opts = trainlib.TrainOptions(
        data=data, synthetic=synthetic, model=model, epochs=epochs, batch_size=batch_size, model_dir=model_dir,
        max_steps=max_steps, base_lr=base_lr, warmup_epochs=warmup_epochs, checkpoint_every=checkpoint_every,
        log_every=log_every, mixed_precision=mixed_precision, xla=xla, checkpoint_to=checkpoint_to,
        extra=tuple(trainer_arg))
    from dataclasses import replace

    opts = replace(opts, precision=precision, fp16_allreduce=fp16_allreduce, recipe=recipe, eval_every=eval_every,
                   fusion_threshold_mb=fusion_threshold_mb, cycle_time_ms=cycle_time_ms)
    job = trainlib.start(inv, store, opts, np=np_, python=python, force=force, verify_data=not no_verify_data,
                         report=display.info, checkpoint_copy=not no_checkpoint_copy)
    display.info(f"started training job {job.job}: {job.np} process(es), leader {job.leader} (tmux session "
                 f"{job.job}); checkpoints in {job.model_dir}")
    _train_estimate(trainlib.job_inventory(inv, job), job, opts)
    if not wait:
        display.info("follow it: clusterctl logs -f; where it is: clusterctl status")
        return
    began = time.monotonic()
    code = launchlib.follow(trainlib.job_inventory(inv, job), job.job, _print_line)
    from clusterctl.cluster import costs

    per_hour = costs.hourly(inv.cluster)
    took = time.monotonic() - began
    display.info(f"cost: this run took {duration(took)}" + (
        f" on a {money(per_hour)}/hour cluster: about {money(costs.run_cost(took, per_hour))}"
        if per_hour is not None else ""))
    if code != 0:
        raise typer.Exit(int(ExitCode.REMOTE_FAILED))


def _train_estimate(inv, job, opts) -> None:
    """The run's estimated cost: images to train (the dataset's count x epochs, or --max-steps) at the img/s
    `bench` measured on this cluster for this model."""
    from clusterctl.cluster import costs
    from clusterctl.cli import display

    per_hour = costs.hourly(inv.cluster)
    measured = costs.load_measured(_store(), inv.cluster.name) if inv.cluster is not None else None
    if measured is None or measured.get("model") != opts.model:
        display.info(f"cost: {money(per_hour)}/hour; no img/s measured for {opts.model} on this cluster yet "
                     f"(`clusterctl bench --synthetic --model {opts.model}` measures it; `clusterctl status` shows "
                     "the cost to finish once the job runs)")
        return
    images, what = None, ""
    if opts.max_steps:
        images, what = opts.max_steps * (opts.batch_size or 64) * job.np, f"{opts.max_steps} step(s)"
    elif job.options.get("data"):
        from clusterctl.workloads import train_job as trainlib

        per_epoch = trainlib.dataset_examples(inv, job.options["data"])
        if per_epoch:
            images, what = int(per_epoch * opts.epochs), f"{opts.epochs:g} epoch(s) of {per_epoch:,} images"
    if images is None:
        images, what = int(costs.IMAGENET_TRAIN_IMAGES * opts.epochs), f"{opts.epochs:g} ImageNet-sized epoch(s)"
    rate = float(measured["img_per_sec"]) * job.np / max(1, int(measured.get("np") or job.np))
    display.info(f"cost: estimated {costs.epoch_line(rate, per_hour, images, 1.0, what)} (from the "
                 f"{float(measured['img_per_sec']):,.0f} img/s `bench` measured at {measured.get('np')} process(es), "
                 "scaled linearly; `clusterctl status` shows the cost to finish from the job's own rate)")


# ---- your own Horovod script -------------------------------------------------------------------------------
@app.command(short_help="Run your own Horovod script on the cluster, in tmux.")
@command
def launch(
    args: List[str] = typer.Argument(None, metavar="[HOSTS] -- python SCRIPT [ARGS]",
                                     help="A hosts file (optional), then after -- the command every rank runs."),
    np_: Optional[int] = typer.Option(None, "--np", help="Processes (default: every slot of the hosts)."),
    file: List[str] = typer.Option([], "--file", metavar="PATH", help="One more file for the job folder (repeatable); "
                                   "the script named in the command is copied when it is a file here."),
    name: Optional[str] = typer.Option(None, "--name", help="The job's name (default: launch-<time>-<pid>)."),
    attach: bool = typer.Option(False, "--attach", help="Follow the job to its end (exit status: the job's)."),
    cluster: Optional[str] = typer.Option(None, "--cluster", "-c", help="A cluster by name."),
    user: Optional[str] = _SSH["user"],
    identity: List[str] = _SSH["identity"],
    known_hosts: Optional[str] = _SSH["known_hosts"],
    ssh_config: Optional[str] = _SSH["ssh_config"],
) -> None:
    """Run your own Horovod script: horovodrun on the leader, detached in tmux.

    The script and --file files go to one job folder at the same path on every node; the leading
    `python` becomes the node runtime's Python; horovodrun runs over every slot (or --np) with host
    keys checked and a scrubbed environment. Follow it with `clusterctl logs NAME`, end it with
    `clusterctl kill NAME`; `clusterctl status` lists it."""
    from clusterctl.cli import display
    from clusterctl.workloads import launch as launchlib
    from clusterctl.workloads import userjob

    hosts_path, command_argv = userjob.split_hosts(args or [])
    the_plan = userjob.plan(command_argv, file, Path.cwd())  # bad input fails here, before any connection
    if name is not None:
        from clusterctl.remote import tmux as jobs

        jobs.validate_job_name(name)
    userjob.check_np(np_, 1 << 30)  # the lower bound now; the slots once the hosts are known
    inv = _resolve_hosts(hosts_path, cluster, user, identity, known_hosts, ssh_config)
    inv.hosts.check_launchable()  # horovodrun takes one ssh port for every host
    np_ = userjob.check_np(np_, inv.hosts.total_slots)
    from clusterctl.autostop import control as autostop

    with autostop.lease(_store(), inv.cluster, "launch", warn=display.warn):  # autostop waits for the start
        job = userjob.start(inv, _store(), the_plan, np=np_, name=name, report=display.info)
    display.info(f"`{the_plan.command.python}` runs as the node runtime's Python on every node: {job.python}")
    display.info(f"started job {job.job}: {job.np} process(es) on {len(job.nodes)} node(s), horovodrun on the "
                 f"leader {job.leader} (tmux session {job.job}, folder {job.job_dir})")
    if not attach:
        display.info(f"follow it: clusterctl logs {job.job} -f; end it: clusterctl kill {job.job}")
        return
    try:
        with autostop.lease(_store(), inv.cluster, "launch --attach", warn=display.warn):
            code = launchlib.follow(inv, job.job, _print_line)
    except KeyboardInterrupt:
        display.info(f"detached; {job.job} keeps running (clusterctl kill {job.job} ends it)")
        raise typer.Exit(int(ExitCode.INTERRUPTED))
    if code != 0:
        display.error(f"job {job.job} exited {code}")
        raise typer.Exit(int(ExitCode.REMOTE_FAILED))


def _launch_status(name: str) -> None:
    """The cluster's `launch` jobs (running ones and the latest), after its node table in `status`."""
    from clusterctl.cli import display
    from clusterctl.cluster import inventory
    from clusterctl.workloads import userjob

    store = _store()
    try:
        inv = inventory.resolve(None, name, store)
        lines = userjob.status_lines(store, inv)
    except ClusterctlError as exc:
        display.warn(f"launch jobs: {exc.one_line()}")
        return
    for line in lines:
        display.console().print(display._esc(line))


@app.command("eval")
@command
def eval_(
    hostsfile: Optional[str] = typer.Argument(None, metavar="[HOSTS]", help="A hosts file (default: the current cluster)."),
    cluster: Optional[str] = typer.Option(None, "--cluster", "-c", help="A cluster by name."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show the evaluation's own output."),
    timeout: Optional[float] = typer.Option(None, "--timeout", help="Seconds the evaluation may take."),
) -> None:
    """Top-1/top-5 of the latest checkpoint.

    Evaluates the training job's latest checkpoint on the leader alone (GPUs hidden while it trains)."""
    from clusterctl.cli import display
    from clusterctl.workloads import train_job as trainlib

    inv = _train_inventory(hostsfile, cluster)
    job = trainlib.require_job(_store(), inv)
    result = trainlib.evaluate(inv, job, on_line=_print_line if verbose else None, timeout=timeout)
    display.train_eval(result)


@app.command()
@command
def tensorboard(
    hostsfile: Optional[str] = typer.Argument(None, metavar="[HOSTS]", help="A hosts file (default: the current cluster)."),
    cluster: Optional[str] = typer.Option(None, "--cluster", "-c", help="A cluster by name."),
    port: int = typer.Option(6006, "--port", help="Local port of the tunnel (127.0.0.1 only)."),
    remote_port: int = typer.Option(6006, "--remote-port", help="TensorBoard's port on the leader (127.0.0.1 only)."),
) -> None:
    """TensorBoard on the leader, via ssh tunnel.

    TensorBoard bound to the leader's 127.0.0.1 (never an open port), reached through an ssh tunnel to
    local --port; Ctrl-C ends both."""
    from clusterctl.cli import display
    from clusterctl.workloads import train_job as trainlib

    for flag, value in (("--port", port), ("--remote-port", remote_port)):
        if not 1 <= value <= 65535:
            raise UsageError(f"{flag} must be 1-65535, not {value}")
    inv = _train_inventory(hostsfile, cluster)
    job = trainlib.require_job(_store(), inv)
    tunnel = trainlib.open_tensorboard(inv, job, port, remote_port)
    try:
        display.info(f"TensorBoard of {job.job}: http://127.0.0.1:{port}/ (Ctrl-C to stop)")
        code = tunnel.wait()
        raise ClusterctlError(f"the ssh tunnel ended (exit {code})", "run `clusterctl tensorboard` again")
    finally:
        trainlib.close_tensorboard(trainlib.job_inventory(inv, job), tunnel)


def _train_logs(hostsfile, cluster, follow: bool, connect_timeout: float) -> None:
    """`clusterctl logs` without a job name: the training job's log, from the leader."""
    from clusterctl.workloads import launch as launchlib
    from clusterctl.workloads import train_job as trainlib

    inv = _train_inventory(hostsfile, cluster, connect_timeout)
    job = trainlib.require_job(_store(), inv)
    if follow:
        code = launchlib.follow(trainlib.job_inventory(inv, job), job.job, _print_line)
        raise typer.Exit(0 if code == 0 else int(ExitCode.REMOTE_FAILED))
    text, _running = trainlib.read_log(inv, job)
    sys.stdout.write(text)


def _train_status(name: str) -> None:
    """The training job's place, when the cluster has one (`status` calls this after its node table)."""
    from clusterctl.cli import display
    from clusterctl.cluster import inventory
    from clusterctl.workloads import train_job as trainlib

    store = _store()
    try:
        inv = inventory.resolve(None, name, store)
    except ClusterctlError:
        return
    job = trainlib.load_job(store, inv)
    if job is None:
        return
    try:
        st = trainlib.job_status(inv, job)
    except ClusterctlError as exc:
        display.warn(f"training job {job.job}: {exc.one_line()}")
        return
    display.train_status(job, st, _hourly(inv.cluster))


def main() -> None:
    app(prog_name="clusterctl")


if __name__ == "__main__":
    main()
