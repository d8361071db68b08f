"""`up`: bring a cluster up, with what it asks first (the node runtime, the ssh config entry)."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, List, Optional, Sequence

import typer

from clusterctl.cli.shared import _confirm, _provider, _store, option_group
from clusterctl.errors import UsageError

if TYPE_CHECKING:
    from clusterctl.cluster.up_plan import UpPlan, UpRequest
    from clusterctl.playbook.specfile import SpecFile
    from clusterctl.state import StateStore
    from clusterctl.types import Cluster, Node

app = typer.Typer()  # its commands are merged into cli/app.py's app (see COMMANDS there)


# The flags of a provider's own settings (the option schema: providers/base.py up_flags), declared once and
# handed to the library by option name as ClusterSpec.options; the provider checks them (AWS: AwsOptions).
PROVIDER_FLAGS = dict(
    ami=(Optional[str], typer.Option(None, "--ami", help="Image id (default: the current Deep Learning AMI).")),
    ami_parameter=(
        Optional[str],
        typer.Option(None, "--ami-parameter", help="SSM public parameter naming the image."),
    ),
    ssh_user=(
        Optional[str],
        typer.Option(None, "--ssh-user", help="Login user (default: from the image; ubuntu for the DLAMI)."),
    ),
    volume_size=(int, typer.Option(200, "--volume-size", help="Root disk GB per node.")),
    volume_type=(str, typer.Option("io2", "--volume-type", help="io2 | io1 | gp3 | gp2.")),
    iops=(
        Optional[int],
        typer.Option(None, "--iops", help="Provisioned IOPS (default 10000 for io1/io2, 3000 for gp3)."),
    ),
    spot=(bool, typer.Option(False, "--spot", help="Spot instances (one-time; terminated on interruption).")),
    vpc=(Optional[str], typer.Option(None, "--vpc", help="Use this VPC (its subnets) instead of creating one.")),
    subnets=(List[str], typer.Option([], "--subnet", help="Use this subnet (repeatable: AZs tried in order).")),
    cidr=(
        Optional[str],
        typer.Option(None, "--cidr", help="Address range of a VPC clusterctl creates (10.0.0.0/16)."),
    ),
    ssh_cidr=(Optional[str], typer.Option(None, "--ssh-cidr", help="Who may ssh in (default: your public IP /32).")),
    s3_read=(List[str], typer.Option([], "--s3-read", help="s3://bucket/prefix the nodes may read (repeatable).")),
    private_ips=(
        bool,
        typer.Option(False, "--private-ips", help="No public addresses: reach nodes by private IP (VPN/VPC)."),
    ),
)


# ---- clusters --------------------------------------------------------------------------------------------
@app.command()
@option_group("options", PROVIDER_FLAGS, dict)
def up(
    ctx: typer.Context,
    spec_file: Optional[Path] = typer.Option(
        None,
        "--file",
        "-f",
        help="A spec file: any option below by its name (idle_stop: --idle-stop), datasets, setup and jobs; "
        "flags given override it (default: ./clusterctl.yaml when no --name, --provider, --nodes, --type, "
        "--slots or --region is given).",
    ),
    nodes: int = typer.Option(2, "--nodes", "-n", help="Number of nodes (the first is the leader)."),
    type_: str = typer.Option("p3.16xlarge", "--type", "-t", help="Instance type (AWS)."),
    name: Optional[str] = typer.Option(
        None, "--name", "--cluster", "-c", help="Cluster name (default: 'local' or 'cluster')."
    ),
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
    options: dict[str, Any] = {},  # noqa: B006  # PROVIDER_FLAGS in its place (option_group)
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan and check permissions; create nothing."),
    json_: bool = typer.Option(False, "--json", help="With --dry-run: the plan as one JSON object on stdout."),
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
    idle_action: Optional[str] = typer.Option(
        None,
        "--idle-action",
        help="What autostop does: stop (the default; disks kept, `clusterctl start NAME` starts it again) or "
        "terminate (the default with --spot, which EC2 cannot stop).",
    ),
    runtime: str = typer.Option(
        "install",
        "--runtime",
        help="install: the node runtime (TensorFlow + Horovod; on GPU nodes NVIDIA DALI too) on every node; dali: the same with DALI on CPU nodes too (`train --input dali` on its CPU backend); none: skip it.",
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
    from clusterctl.cli import display
    from clusterctl.cli.status import node_table
    from clusterctl.cluster import up_plan

    if json_ and not dry_run:
        raise UsageError("--json is for --dry-run (the plan)", "add --dry-run")
    sf = _spec_file(ctx, spec_file)
    v = _merged(ctx, sf)
    store = _store()
    plan = lambda line: display.info(f"plan: {line}")  # noqa: E731  # each line as it is known
    with _located(sf, ctx):
        up = up_plan.prepare(_request(ctx, v, sf), store, lambda kind, reg: _provider(kind, store, reg), plan)
        if dry_run:
            return _dry_run(up, json_)
    if up.resize is not None:
        return _resize(up, store, v, sf, yes)
    question = up.question(v["max_hourly"])
    if question is not None:
        _confirm(question, yes)
    matches = f" and matches {sf.where}" if sf is not None else ""
    with display.StepLine() as steps:
        cluster, seconds = up_plan.launch(
            up, store, v["hosts_file"], display.info, v["ssh_timeout"], v["trust_first_contact"], steps, matches
        )
    if up.existing and sf is not None:
        return None  # it matches the file: the one line said so
    display.info(
        f"cluster {cluster.name} is up: {len(cluster.nodes)} node(s), {cluster.total_slots} slot(s), "
        f"in {seconds:.1f}s; hosts file: {v['hosts_file']}"
    )
    _ssh_entry(cluster, store, v["ssh_config_entry"])
    node_table(cluster)
    if sf is not None:  # made (or started) now: its datasets and setup
        _after_up(sf, cluster, store)


SHAPE = ("--name", "--provider", "--nodes", "--type", "--slots", "--region")  # no clusterctl.yaml when given
PER_RUN = ("ctx", "spec_file", "yes", "dry_run", "json_")  # what each run says for itself: never a file's


def file_schema() -> dict[str, tuple[Any, str]]:
    """`up`'s options a spec file may set: key (the option's name: idle_stop, type, subnets) -> (its type, its
    flag), read from the command's own parameters (PROVIDER_FLAGS in their place), so the two never differ."""
    import inspect

    return {
        p.name.rstrip("_"): (p.annotation, p.default.param_decls[0])
        for p in inspect.signature(up).parameters.values()
        if p.name not in PER_RUN
    }


def _spec_file(ctx: typer.Context, given: Path | None) -> SpecFile | None:
    """-f's spec file, or ./clusterctl.yaml when no shape flag was given (said in one line), loaded and checked."""
    from clusterctl.cli import display
    from clusterctl.playbook import specfile

    path = specfile.find(given, Path.cwd(), any(f in SHAPE for f in _given(ctx)))
    if path is None:
        return None
    if given is None:
        display.info(f"using ./{specfile.FILE_NAME} (the working folder's spec file; -f FILE names another)")
    return specfile.load(path, file_schema())


def _merged(ctx: typer.Context, sf: SpecFile | None) -> dict[str, Any]:
    """Every option's value: the command line's where given, else the spec file's, else the option's default."""
    values = dict(ctx.params)
    given = set(_given(ctx))
    for name, param in ((p.name, p) for p in ctx.command.params if p.name):
        setting = sf.settings.get(name.rstrip("_")) if sf is not None else None
        if setting is not None and param.opts[0] not in given:
            values[name] = setting.value
    return values


def _request(ctx: typer.Context, v: dict[str, Any], sf: SpecFile | None) -> UpRequest:
    """The UpRequest of the merged values; the file's options count as given (asked for), as flags do."""
    import dataclasses

    from clusterctl.cli import display
    from clusterctl.cluster import up_plan

    given = _given(ctx)
    if sf is not None:
        for line in sf.lines(given):
            display.info(f"plan: {line}")
        given += [s.flag for s in sf.settings.values() if s.flag not in given]
    same = {f.name: v[f.name] for f in dataclasses.fields(up_plan.UpRequest) if f.name in v}  # nodes, name ...
    options = {k: v[k] for k in PROVIDER_FLAGS}
    return up_plan.UpRequest(**same, instance_type=v["type_"], given=tuple(given), options=options)


@contextlib.contextmanager
def _located(sf: SpecFile | None, ctx: typer.Context) -> Iterator[None]:
    """A check's error about a value the spec file set names the file and the key's line."""
    from clusterctl.errors import ClusterctlError

    try:
        yield
    except ClusterctlError as exc:
        if sf is None:
            raise
        raise sf.locate(exc, _given(ctx)) from None


def _resize(up: UpPlan, store: StateStore, v: dict[str, Any], sf: SpecFile | None, yes: bool) -> None:
    """More nodes (added as `repair` adds them, then the file's setup on them) or fewer (asked first)."""
    from clusterctl.cli import display
    from clusterctl.cli.status import node_table
    from clusterctl.cluster import up_plan

    assert up.resize is not None  # the caller's test
    question = up.resize.question()
    if question is not None:
        _confirm(question, yes)
    cluster, added = up_plan.resize(up, store, display.info, v["hosts_file"], v["ssh_timeout"])
    display.info(f"cluster {cluster.name} has {len(cluster.nodes)} node(s), {cluster.total_slots} slot(s)")
    node_table(cluster)
    if sf is not None and added:
        _after_up(sf, cluster, store, added)


def _after_up(sf: SpecFile, cluster: Cluster, store: StateStore, only: Sequence[Node] = ()) -> None:
    """The file's datasets, then its setup commands, on a cluster just made (`only`: on nodes just added, the
    setup alone: `repair`'s steps already copied the datasets the record holds)."""
    import dataclasses

    from clusterctl.cli import display
    from clusterctl.cluster import inventory
    from clusterctl.errors import RemoteCommandError
    from clusterctl.playbook import model, run

    book = sf.after_up()
    if only:
        book = dataclasses.replace(book, steps=sf.setup)
    if not book.steps:
        return
    inv = inventory.resolve(None, cluster.name, store)
    if only:
        inv = inventory.subset(inv, [a for n in only for a in (n.private_ip, n.ssh_host)])
    results = run.execute(book, model.Context(inv, store, report=display.info, base=sf.path.parent))
    display.play_summary(results)
    failed = [r.step for r in results if not r.ok]
    if failed:
        raise RemoteCommandError(
            f"cluster {cluster.name} is up, but {sf.where}:{failed[0].line} ({failed[0].name}) failed",
            f"fix it, then run the rest by hand (`clusterctl sync`, `clusterctl run -c {cluster.name} -- CMD`)",
        )


def _dry_run(up: UpPlan, json_: bool) -> None:
    """The provider's checks (no mutating call), and with --json the plan as one object on stdout."""
    from clusterctl.cli import display
    from clusterctl.cluster import up_plan

    checks = up.provider.dry_run(up.spec)
    for line in checks:
        display.info(f"dry run: {line}")
    display.info("dry run: nothing was created")
    if json_:
        display.json_out(up_plan.plan_json(up, checks))


def _given(ctx: typer.Context) -> list[str]:
    """The flags given on the command line (each by its first name), in the command's order."""
    return [
        p.opts[0]
        for p in ctx.command.params
        # by name: typer 0.29 carries its own copy of click, whose ParameterSource is not click's
        if p.name and getattr(ctx.get_parameter_source(p.name), "name", "") == "COMMANDLINE"
    ]


def _ssh_entry(cluster: Cluster, store: StateStore, entry: Optional[bool] = None) -> None:
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
