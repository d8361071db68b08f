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
    from clusterctl import agent

    agent.stop(store.root)  # the connection agent holds ssh connections to these nodes: nothing stays running
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
def _ssh_opts():
    """The ssh options every fan-out command shares, as typer parameters (see run/logs/kill/clean)."""
    return dict(
        cluster=typer.Option(None, "--cluster", "-c", help="A cluster by name (default: the current)."),
        parallel=typer.Option(64, "--parallel", "-p", help="At most this many hosts at once."),
        connect_timeout=typer.Option(10.0, "--connect-timeout", help="Seconds to wait for each connection."),
        user=typer.Option(None, "--user", "-l", help="Login user."),
        identity=typer.Option([], "--identity", "-i", help="Private key file (repeatable)."),
        known_hosts=typer.Option(None, "--known-hosts", help="known_hosts file to trust."),
        ssh_config=typer.Option(None, "--ssh-config", help="ssh config file (default ~/.ssh/config)."),
    )


_SSH = _ssh_opts()


def _inventory(hosts_path, cluster, parallel, connect_timeout, user, identity, known_hosts, ssh_config):
    from clusterctl import inventory

    if parallel < 1:
        raise UsageError("--parallel must be at least 1")
    if connect_timeout <= 0:
        raise UsageError("--connect-timeout must be positive")
    return inventory.resolve(hosts_path, cluster, _store(), inventory.SshOverrides(
        user=user, identity=tuple(identity), known_hosts=known_hosts, ssh_config=ssh_config,
        connect_timeout=connect_timeout))


def _fan_out(inv, cmd: str, parallel: int, timeout: float | None = None, live: bool = True):
    """Run through the connection agent (reused connections), host-prefixed live output unless not `live`."""
    from clusterctl import agent, display

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
) -> None:
    """Run a command on every node at once."""
    from clusterctl import display

    if len(args) > 2:
        raise UsageError("too many arguments", 'quote the command: clusterctl run hosts "CMD ARGS"')
    hosts_path, cmd = (args[0], args[1]) if len(args) == 2 else (None, args[0])
    if timeout is not None and timeout <= 0:
        raise UsageError("--timeout must be positive")
    if detach is not None:
        from clusterctl import jobs

        cmd = jobs.detach_command(detach, cmd)  # validates NAME before anything connects
    inv = _inventory(hosts_path, cluster, parallel, connect_timeout, user, identity, known_hosts, ssh_config)
    report = _fan_out(inv, cmd, parallel, timeout, live=not (group or json_))
    if json_:
        display.json_lines(report)
    elif group:
        display.grouped_output(report)
    if not json_:
        display.summary(report)
    raise typer.Exit(report.exit_code)


@app.command()
@command
def logs(
    name: str = typer.Argument(..., help="The job's name (as given to run --detach)."),
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
    from clusterctl import display, jobs

    cmd = jobs.logs_command(name, follow)
    inv = _inventory(hostsfile, cluster, parallel, connect_timeout, user, identity, known_hosts, ssh_config)
    report = _fan_out(inv, cmd, parallel)
    display.summary(report)
    raise typer.Exit(report.exit_code)


@app.command("kill")
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
    from clusterctl import display, jobs

    if not 0 <= grace <= 300:
        raise UsageError("--grace must be 0..300 seconds")
    cmd = jobs.kill_job_command(name, grace)
    inv = _inventory(hostsfile, cluster, parallel, connect_timeout, user, identity, known_hosts, ssh_config)
    report = _fan_out(inv, cmd, parallel)
    display.summary(report)
    raise typer.Exit(report.exit_code)


@app.command()
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
    from clusterctl import clean as cleanlib, display

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
    raise typer.Exit(_worst(codes))


def _worst(codes: list[int]) -> int:
    """The run table's precedence: timeout, then unreachable, then the worst other status."""
    for special in (int(ExitCode.TIMEOUT), int(ExitCode.UNREACHABLE)):
        if special in codes:
            return special
    return max(codes, default=0)


def _name_this_process() -> None:
    try:
        import ctypes

        ctypes.CDLL(None).prctl(15, b"clusterctl", 0, 0, 0)  # PR_SET_NAME
    except Exception:
        pass


def _reboot(inv, parallel: int, wait: float) -> int:
    from clusterctl import agent, clean as cleanlib, display, providers
    from clusterctl.remote import SshPool

    start = time.monotonic()
    agent.stop(_store().root)  # its connections die with the nodes
    if inv.cluster is not None and inv.cluster.provider == "local":
        hosts = [t.label for t in inv.targets]
        display.info(f"rebooting {len(hosts)} local node(s): every process in them is killed, sshd starts again")
        why = providers.get("local", store=_store()).reboot(inv.cluster, hosts, timeout=wait)
        back = cleanlib.wait_rebooted(lambda: SshPool(inv.settings), [t for t in inv.targets if why.get(t.label) is None],
                                      {}, max(1.0, wait - (time.monotonic() - start)))
        why.update(back)
    else:
        with SshPool(inv.settings) as pool:
            report = pool.run(inv.targets, cleanlib.REBOOT_COMMAND, parallel=parallel, timeout=30)
        boot_ids = {r.host: r.stdout.strip() for r in report if r.ok}
        why = {r.host: (r.error or r.stderr.strip() or f"exit {r.exit_code}") for r in report if not r.ok}
        display.info(f"reboot issued on {len(boot_ids)} node(s); waiting up to {wait:.0f}s for each to answer ssh again")
        why.update(cleanlib.wait_rebooted(lambda: SshPool(inv.settings), [t for t in inv.targets if t.label in boot_ids],
                                          boot_ids, wait))
    bad = {h: w for h, w in why.items() if w}
    for t in inv.targets:
        if why.get(t.label) is None:
            display.info(f"{t.label}: back after {time.monotonic() - start:.1f}s")
        else:
            display.warn(f"{t.label}: {why[t.label]}")
    if not bad:
        display.info(f"{len(inv.targets)} node(s) rebooted and answering ssh")
        return 0
    refused = [w for w in bad.values() if str(w).startswith("refused")]
    return int(ExitCode.CONFIG) if len(refused) == len(bad) else int(ExitCode.TIMEOUT)


@app.command("agent")
@command
def agent_(action: str = typer.Argument("status", help="status | stop")) -> None:
    """The background holder of reused ssh connections: status, or stop it (down stops it too)."""
    from clusterctl import agent, display

    root = _store().root
    if action == "status":
        info = agent.ping(root)
        if info is None or info.get("t") != "pong":
            display.info("no connection agent running")
        else:
            display.info(f"connection agent pid {info['pid']}: {info['connections']} connection(s) open, "
                         f"exits after {info['idle']:.0f}s idle; socket {agent.socket_path(root)}")
    elif action == "stop":
        display.info("connection agent stopped" if agent.stop(root) else "no connection agent running")
    else:
        raise UsageError(f"unknown action {action!r}", "use status or stop")


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
