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

from clusterctl.errors import ClusterctlError, ExitCode, UsageError

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
        from clusterctl import display

        try:
            return fn(*args, **kwargs)
        except ClusterctlError as exc:
            if _debug:
                traceback.print_exc()
            display.error(exc.one_line())
            raise typer.Exit(int(exc.exit_code))
        except KeyboardInterrupt:
            display.error("interrupted")
            raise typer.Exit(int(ExitCode.INTERRUPTED))

    return wrapper


def _store():
    from clusterctl.state import StateStore

    return StateStore()


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
) -> None:
    """Bring up identical nodes with pinned host keys and a hosts file."""
    from clusterctl import display, provision, providers
    from clusterctl.state import validate_name
    from clusterctl.types import ClusterSpec

    store = _store()
    name = validate_name(name or ("local" if provider == "local" else "cluster"))
    if slots is not None and not 1 <= slots <= 1024:
        raise UsageError(f"--slots must be 1..1024, not {slots}")
    if nodes < 1:
        raise UsageError(f"--nodes must be at least 1, not {nodes}")
    spec = ClusterSpec(name=name, provider=provider, nodes=nodes, slots=slots,
                       instance_type=type_ if provider != "local" else "local", region=region or "")
    impl = providers.get(provider, store=store)
    for line in impl.plan(spec):
        display.info(f"plan: {line}")
    start = time.monotonic()
    cluster = provision.up(spec, store, impl, hosts_out=hosts_file, report=lambda m: display.info(m))
    display.info(f"cluster {cluster.name} is up: {len(cluster.nodes)} node(s), {cluster.total_slots} slot(s), "
                 f"in {time.monotonic() - start:.1f}s; hosts file: {hosts_file}")
    display.node_table(cluster)


@app.command()
@command
def down(
    name: Optional[str] = typer.Argument(None, help="Cluster to remove (default: the current one)."),
    all_: bool = typer.Option(False, "--all", help="Every cluster of this provider."),
    provider: Optional[str] = typer.Option(None, "--provider", help="Where to look when the local record is gone."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
) -> None:
    """Remove a cluster and everything it created; prove nothing is left."""
    from clusterctl import display, provision, providers

    store = _store()
    if all_:
        names = sorted({r.cluster.name for r in store.list()} | set(providers.get(provider or "local", store=store).all_clusters()))
    else:
        names = [name or store.current() or ""]
        if not names[0]:
            raise UsageError("no cluster given and none is current", "name the cluster: clusterctl down NAME")
    if not names:
        display.info("no clusters found")
        return
    _confirm(f"Remove cluster(s) {', '.join(names)} and everything they created?", yes)
    failed = []
    for n in names:
        kind = provider or (store.load(n).cluster.provider if store.exists(n) else "local")
        teardown = provision.down(n, store, providers.get(kind, store=store), report=display.info)
        if teardown.clean:
            display.info(f"cluster {n} is gone: nothing tagged for it is left")
        else:
            failed.append(f"{n}: {'; '.join(teardown.left)}")
    if failed:
        from clusterctl.errors import ProvisionError

        raise ProvisionError(f"some resources remain ({' | '.join(failed)})", "run `clusterctl down` again")


@app.command("ls")
@command
def ls() -> None:
    """List clusters: provider, nodes, type, age, state."""
    from clusterctl import display

    store = _store()
    current = store.current()
    rows = []
    for r in store.list():
        c = r.cluster
        rows.append({"name": c.name + (" *" if c.name == current else ""), "provider": c.provider,
                     "nodes": len(c.nodes), "type": c.instance_type, "slots": c.total_slots,
                     "age": display.age(time.time() - c.created_at), "state": r.status})
    if not rows:
        display.info("no clusters; bring one up with `clusterctl up --provider local --nodes 2`")
        return
    display.cluster_table(rows)


@app.command()
@command
def status(name: Optional[str] = typer.Argument(None, help="Cluster (default: the current one).")) -> None:
    """Show a cluster's nodes."""
    from clusterctl import display

    store = _store()
    record = store.resolve(name)
    display.node_table(record.cluster, current=record.cluster.name == store.current())


@app.command()
@command
def hosts(
    hostsfile: Optional[str] = typer.Argument(None, help="A hosts file to read (default: the current cluster)."),
    cluster: Optional[str] = typer.Option(None, "--cluster", "-c", help="A cluster by name."),
    format_: str = typer.Option("slots", "--format", "-f", help="slots | horovod | mpi | tf-config | json"),
) -> None:
    """Print the hosts file for horovodrun, mpirun, TF_CONFIG or JSON."""
    from clusterctl import provision
    from clusterctl.hostsfile import HostsFile

    if hostsfile is not None:
        hf = HostsFile.read(hostsfile)
    else:
        hf = provision.hosts_file(_store().resolve(cluster).cluster)
    sys.stdout.write(hf.render_as(format_))


# ---- running commands ------------------------------------------------------------------------------------
@app.command(context_settings={"allow_interspersed_args": False})
@command
def run(
    args: List[str] = typer.Argument(..., metavar="[HOSTS] CMD", help="A hosts file (optional) and the command."),
    cluster: Optional[str] = typer.Option(None, "--cluster", "-c", help="A cluster by name (default: the current)."),
    parallel: int = typer.Option(64, "--parallel", "-p", help="At most this many hosts at once."),
    timeout: Optional[float] = typer.Option(None, "--timeout", help="Seconds the command may run on each host."),
    connect_timeout: float = typer.Option(10.0, "--connect-timeout", help="Seconds to wait for each connection."),
    group: bool = typer.Option(False, "--group", "-g", help="Fold identical outputs into one block."),
    json_: bool = typer.Option(False, "--json", help="One JSON object per host."),
    user: Optional[str] = typer.Option(None, "--user", "-l", help="Login user."),
    identity: List[str] = typer.Option([], "--identity", "-i", help="Private key file (repeatable)."),
    known_hosts: Optional[str] = typer.Option(None, "--known-hosts", help="known_hosts file to trust."),
    ssh_config: Optional[str] = typer.Option(None, "--ssh-config", help="ssh config file (default ~/.ssh/config)."),
) -> None:
    """Run a command on every node at once."""
    from clusterctl import display, inventory
    from clusterctl.remote import SshPool

    if len(args) > 2:
        raise UsageError("too many arguments", 'quote the command: clusterctl run hosts "CMD ARGS"')
    hosts_path, cmd = (args[0], args[1]) if len(args) == 2 else (None, args[0])
    if parallel < 1:
        raise UsageError("--parallel must be at least 1")
    inv = inventory.resolve(hosts_path, cluster, _store(), inventory.SshOverrides(
        user=user, identity=tuple(identity), known_hosts=known_hosts, ssh_config=ssh_config,
        connect_timeout=connect_timeout))
    printer = None if (group or json_) else display.HostPrinter([t.label for t in inv.targets])
    with SshPool(inv.settings) as pool:
        report = pool.run(inv.targets, cmd, parallel=parallel, timeout=timeout, on_line=printer)
    if json_:
        display.json_lines(report)
    elif group:
        display.grouped_output(report)
    if not json_:
        display.summary(report)
    raise typer.Exit(report.exit_code)


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
    connect_timeout: float = typer.Option(10.0, "--connect-timeout", help="Seconds to wait for each connection."),
) -> None:
    """Put a dataset on every node, fast (a pipelined relay), verified (sha256 manifest), resumable."""
    from clusterctl import display, inventory, transfer
    from clusterctl.remote import SshPool

    if len(args) not in (2, 3):
        raise UsageError("expected [HOSTS] SRC DST", "e.g. clusterctl sync hosts ~/imagenet_data ~/imagenet_data")
    hosts_path, src, dst = (args[0], args[1], args[2]) if len(args) == 3 else (None, args[0], args[1])
    if strategy not in transfer.STRATEGIES:
        raise UsageError(f"unknown --strategy {strategy!r}", f"use one of {', '.join(transfer.STRATEGIES)}")
    if fanout < 1:
        raise UsageError("--fanout must be at least 1")
    transfer.check_dst(dst)
    source = transfer.parse_source(src)
    inv = inventory.resolve(hosts_path, cluster, _store(), inventory.SshOverrides(connect_timeout=connect_timeout))
    labels = [t.label for t in inv.targets]
    if plan:
        for line in transfer.render_plan(strategy, labels, source, fanout, labels[0] if labels else None):
            sys.stdout.write(line + "\n")
        return
    with SshPool(inv.settings) as pool, display.SyncProgress(labels) as events:
        syncer = transfer.Syncer(inv.targets, inv.hosts.hosts, inv.settings.known_hosts, pool, source, dst,
                                 strategy=strategy, fanout=fanout, delete=delete, endpoint_url=endpoint_url,
                                 managed=inv.cluster is not None, events=events)
        report = syncer.run()
    display.sync_table(report)
    err = report.error()
    if err is not None:
        raise err


def main() -> None:
    app(prog_name="clusterctl")


if __name__ == "__main__":
    main()
