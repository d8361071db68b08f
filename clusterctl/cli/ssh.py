"""`clusterctl hosts` and `ssh`: a cluster's hosts file, and a login or command on one of its nodes."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, List, Optional

import typer

from clusterctl.cli.shared import (
    CLUSTER,
    CURRENT_CLUSTER,
    _store,
)
from clusterctl.errors import ClusterctlError, UsageError
from clusterctl.hostsfile import FORMATS

if TYPE_CHECKING:
    from clusterctl.state import StateStore
    from clusterctl.types import Cluster

app = typer.Typer()  # its commands are merged into cli/app.py's app (see COMMANDS there)


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

    try:
        return store.exists(word)
    except ClusterctlError:  # not even a valid cluster name
        return False
