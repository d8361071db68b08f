"""What the commands share: the state store, providers, confirmation, the ssh options and inventory."""

from __future__ import annotations

import functools
import inspect
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, List, Mapping, Optional, Tuple, TypeVar, cast

import typer

from clusterctl.errors import UsageError, within  # within: the one range check, in core for the library too

if TYPE_CHECKING:
    from clusterctl.cluster.inventory import Inventory
    from clusterctl.providers.base import Provider
    from clusterctl.state import StateStore
    from clusterctl.types import Cluster, RunReport

__all__ = ["within"]  # re-exported for the commands (the rest is imported by name from here)

F = TypeVar("F", bound=Callable[..., Any])


def _store() -> StateStore:
    from clusterctl.state import StateStore

    return StateStore()


def _provider(kind: str, store: StateStore, region: str | None = None) -> Provider:
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


def _hourly(cluster: Cluster | None) -> float | None:
    from clusterctl.cluster import costs

    return costs.hourly(cluster)


# ---- running commands ------------------------------------------------------------------------------------
# The ssh options the commands share, each declared once: its type and its typer parameter (see ssh_options).
_SSH_OPTIONS = dict(
    cluster=(Optional[str], typer.Option(None, "--cluster", "-c", help="A cluster by name (default: the current).")),
    parallel=(int, typer.Option(64, "--parallel", "-p", help="At most this many hosts at once.")),
    connect_timeout=(float, typer.Option(10.0, "--connect-timeout", help="Seconds to wait for each connection.")),
    user=(Optional[str], typer.Option(None, "--user", "-l", help="Login user.")),
    identity=(List[str], typer.Option([], "--identity", "-i", help="Private key file (repeatable).")),
    known_hosts=(Optional[str], typer.Option(None, "--known-hosts", help="known_hosts file to trust.")),
    ssh_config=(
        Optional[str],
        typer.Option(
            None, "--ssh-config", help="ssh config file (default ~/.ssh/config), read as OpenSSH does (ssh -G)."
        ),
    ),
)
_SSH = {name: option for name, (_, option) in _SSH_OPTIONS.items()}  # one by one, where a command interleaves
# The target parameters many commands write the same way (typer copies a parameter for each command).
HOSTS = typer.Argument(None, metavar="[HOSTS]", help="A hosts file (default: the current cluster).")
CLUSTER = typer.Option(None, "--cluster", "-c", help="A cluster by name.")
CURRENT_CLUSTER = _SSH["cluster"]  # the same, saying the default


def _one_name(name: str | None = None, cluster: str | None = None) -> str | None:
    if name is not None and cluster is not None and name != cluster:
        raise UsageError(f"two clusters named ({name!r} and --cluster {cluster!r})", "name one, with -c/--cluster NAME")
    return cluster if cluster is not None else name


def one_cluster(what: str = "Cluster") -> Callable[[F], F]:
    """The cluster a command acts on, named one way everywhere (`-c/--cluster NAME`), and by the positional
    NAME these commands always took (an alias): the command's parameter `name` gets the one given, or None."""
    return option_group(
        "name",
        {
            "name": (Optional[str], typer.Argument(None, help=f"{what} (default: the current one).")),
            "cluster": (
                Optional[str],
                typer.Option(None, "--cluster", "-c", help="The cluster, by name (instead of the argument)."),
            ),
        },
        _one_name,
    )


LOGIN = ("user", "identity", "known_hosts", "ssh_config")  # how to log in: every command that connects
FANOUT = ("cluster", "parallel", "connect_timeout", *LOGIN)  # logs, kill, clean: the whole set


@dataclass(frozen=True)
class Ssh:
    """The shared ssh options of one command line; the ones a command does not declare keep these defaults."""

    cluster: Optional[str] = None
    parallel: int = 64
    connect_timeout: float = 10.0
    user: Optional[str] = None
    identity: Tuple[str, ...] = ()
    known_hosts: Optional[str] = None
    ssh_config: Optional[str] = None


DEFAULT_SSH = Ssh()  # the `ssh` parameter's default in a command's own signature (ssh_options replaces it)


def ssh_options(*names: str) -> Callable[[F], F]:
    """sqlite-utils' shared option decorators, for typer: the command declares one parameter `ssh: Ssh`, and
    typer sees these options in its place (so `--help` lists them where that parameter stands); the command
    gets them back as one Ssh value."""

    def ssh(**given: Any) -> Ssh:
        if "identity" in given:
            given["identity"] = tuple(given["identity"] or ())
        return Ssh(**given)

    return option_group("ssh", {n: _SSH_OPTIONS[n] for n in names}, ssh)


def option_group(param: str, options: Mapping[str, Tuple[Any, Any]], build: Callable[..., Any]) -> Callable[[F], F]:
    """Options declared once for one parameter: typer sees `options` (name -> (type, typer parameter)) where
    the command's parameter `param` stands, and the command gets `build(**their values)` in it."""

    def decorate(fn: F) -> F:
        sig = inspect.signature(fn, eval_str=True)
        params = []
        for p in sig.parameters.values():
            if p.name != param:
                params.append(p)
                continue
            params.extend(
                inspect.Parameter(n, p.kind, default=opt, annotation=kind) for n, (kind, opt) in options.items()
            )

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            given = {n: kwargs.pop(n) for n in options if n in kwargs}
            return fn(*args, **{param: build(**given)}, **kwargs)

        wrapper.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]  # what typer reads
        wrapper.__annotations__ = {p.name: p.annotation for p in params}
        return cast(F, wrapper)  # fn's type to mypy; typer reads the options from __signature__

    return decorate


def _inventory(hosts_path: str | None, ssh: Ssh) -> Inventory:
    within("--parallel", ssh.parallel, 1)
    within("--connect-timeout", ssh.connect_timeout, above=0)
    return _resolve_hosts(hosts_path, ssh.cluster, ssh)


def _resolve_hosts(
    hosts_path: str | None, cluster: str | None, ssh: Ssh = DEFAULT_SSH, store: StateStore | None = None
) -> Inventory:
    """The inventory with the shared ssh options (flags win over the ssh config; a ConnectTimeout in the
    config applies unless --connect-timeout was given)."""
    try:  # newer typer carries its own click (and may not install click): its context is the live one
        from typer._click.core import ParameterSource
        from typer._click.globals import get_current_context
    except ImportError:  # a typer that uses click itself: the same names, other (equal) classes for mypy
        from click.core import ParameterSource  # type: ignore[assignment]  # click's class, equal to typer's
        from click.globals import get_current_context  # type: ignore[no-redef]  # the same function from click

    from clusterctl.cli import display
    from clusterctl.cluster import inventory

    ctx = get_current_context(silent=True)
    given = True
    if ctx is not None and "connect_timeout" in ctx.params:
        given = ctx.get_parameter_source("connect_timeout") != ParameterSource.DEFAULT
    return inventory.resolve(
        hosts_path,
        cluster,
        store or _store(),
        inventory.SshOverrides(
            user=ssh.user,
            identity=ssh.identity,
            known_hosts=ssh.known_hosts,
            ssh_config=ssh.ssh_config,
            connect_timeout=ssh.connect_timeout,
            connect_timeout_given=given,
        ),
        warn=display.warn,
    )


def _fan_out(inv: Inventory, cmd: str, parallel: int, timeout: float | None = None, live: bool = True) -> RunReport:
    """Run through the connection agent (reused connections), host-prefixed live output unless not `live`."""
    from clusterctl.cli import display
    from clusterctl.remote import agent

    printer = display.HostPrinter([t.label for t in inv.targets]) if live else None
    return agent.run(
        inv.targets, inv.settings, cmd, parallel=parallel, timeout=timeout, on_line=printer, warn=display.warn
    )


def _print_line(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
