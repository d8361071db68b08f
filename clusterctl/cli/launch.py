"""`clusterctl launch`: the user's own Horovod script, run on the cluster in tmux."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, List, Optional

import typer

from clusterctl.cli.shared import (
    CLUSTER,
    DEFAULT_SSH,
    LOGIN,
    Ssh,
    _print_line,
    _resolve_hosts,
    _store,
    ssh_options,
)
from clusterctl.errors import ExitCode

if TYPE_CHECKING:
    pass

app = typer.Typer()  # its commands are merged into cli/app.py's app (see COMMANDS there)


@app.command(short_help="Run your own Horovod script on the cluster, in tmux.")
@ssh_options(*LOGIN)
def launch(
    args: List[str] = typer.Argument(
        None,
        metavar="[HOSTS] -- python SCRIPT [ARGS]",
        help="A hosts file (optional), then after -- the command every rank runs.",
    ),
    np_: Optional[int] = typer.Option(None, "--np", help="Processes (default: every slot of the hosts)."),
    file: List[str] = typer.Option(
        [],
        "--file",
        metavar="PATH",
        help="One more file for the job folder (repeatable); "
        "the script named in the command is copied when it is a file here.",
    ),
    name: Optional[str] = typer.Option(None, "--name", help="The job's name (default: launch-<time>-<pid>)."),
    attach: bool = typer.Option(False, "--attach", help="Follow the job to its end (exit status: the job's)."),
    cluster: Optional[str] = CLUSTER,
    ssh: Ssh = DEFAULT_SSH,
) -> None:
    """Run your own Horovod script: horovodrun on the leader, detached in tmux.

    The script and --file files go to one job folder at the same path on every node; the leading
    `python` becomes the node runtime's Python; horovodrun runs over every slot (or --np) with host
    keys checked and a scrubbed environment. Follow it with `clusterctl logs NAME`, end it with
    `clusterctl kill NAME`; `clusterctl status` lists it."""
    from clusterctl.cli import display
    from clusterctl.remote import jobfolder
    from clusterctl.workloads import launch, userjob

    hosts_path, command_argv = userjob.split_hosts(args or [])
    the_plan = userjob.plan(command_argv, file, Path.cwd())  # bad input fails here, before any connection
    if name is not None:
        from clusterctl.remote import tmux as jobs

        jobs.validate_job_name(name)
    userjob.check_np(np_, 1 << 30)  # the lower bound now; the slots once the hosts are known
    inv = _resolve_hosts(hosts_path, cluster, ssh)
    inv.hosts.check_launchable()  # horovodrun takes one ssh port for every host
    np_ = userjob.check_np(np_, inv.hosts.total_slots)
    from clusterctl.cluster import autostop_control as autostop

    with autostop.lease(_store(), inv.cluster, "launch", warn=display.warn):  # autostop waits for the start
        job = userjob.start(inv, _store(), the_plan, np=np_, name=name, report=display.info)
    display.info(f"`{the_plan.command.python}` runs as the node runtime's Python on every node: {job.python}")
    display.info(
        f"started job {job.job}: {job.np} process(es) on {len(job.nodes)} node(s), horovodrun on the "
        f"leader {job.leader} (tmux session {job.job}, folder {job.job_dir})"
    )
    if not attach:
        display.info(f"follow it: clusterctl logs {job.job} -f; end it: clusterctl kill {job.job}")
        return
    try:
        with autostop.lease(_store(), inv.cluster, "launch --attach", warn=display.warn):
            code = jobfolder.follow(inv, job.job, launch.with_network_line(_print_line))
    except KeyboardInterrupt:
        display.info(f"detached; {job.job} keeps running (clusterctl kill {job.job} ends it)")
        raise typer.Exit(int(ExitCode.INTERRUPTED)) from None
    if code != 0:
        display.error(f"job {job.job} exited {code}")
        raise typer.Exit(int(ExitCode.REMOTE_FAILED))
