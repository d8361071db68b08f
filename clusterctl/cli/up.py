"""`up`: bring a cluster up, with what it asks first (the node runtime, the ssh config entry)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, List, Optional

import typer

from clusterctl.cli.shared import _confirm, _provider, _store, option_group
from clusterctl.errors import UsageError

if TYPE_CHECKING:
    from clusterctl.cluster.up_plan import UpPlan
    from clusterctl.state import StateStore
    from clusterctl.types import Cluster

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
    from clusterctl.cli import display, tables
    from clusterctl.cluster import up_plan

    if json_ and not dry_run:
        raise UsageError("--json is for --dry-run (the plan)", "add --dry-run")
    store = _store()
    request = up_plan.UpRequest(
        provider=provider,
        nodes=nodes,
        instance_type=type_,
        name=name,
        slots=slots,
        region=region,
        given=tuple(_given(ctx)),
        options=options,
        idle_stop=idle_stop,
        max_lifetime=max_lifetime,
        idle_action=idle_action,
        runtime=runtime,
        python=python,
        runtime_cache=runtime_cache,
        runtime_wheels=runtime_wheels,
    )
    plan = lambda line: display.info(f"plan: {line}")  # noqa: E731  # each line as it is known
    up = up_plan.prepare(request, store, lambda kind, reg: _provider(kind, store, reg), plan)
    if dry_run:
        return _dry_run(up, json_)
    question = up.question(max_hourly)
    if question is not None:
        _confirm(question, yes)
    with display.StepLine() as steps:
        cluster, seconds = up_plan.launch(up, store, hosts_file, display.info, ssh_timeout, trust_first_contact, steps)
    display.info(
        f"cluster {cluster.name} is up: {len(cluster.nodes)} node(s), {cluster.total_slots} slot(s), "
        f"in {seconds:.1f}s; hosts file: {hosts_file}"
    )
    _ssh_entry(cluster, store, ssh_config_entry)
    tables.node_table(cluster)


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
