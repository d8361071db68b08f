"""What the commands share: the state store, providers, confirmation, the ssh options and inventory."""

from __future__ import annotations

import sys

import typer

from clusterctl.errors import UsageError


def within(
    flag: str,
    value: float | None,
    low: float | None = None,
    high: float | None = None,
    *,
    above: float | None = None,
    unit: str = "",
) -> None:
    """The one range check of numeric options: a one-line UsageError (exit 2) naming the flag, the range
    and the value given; None (an option not given) passes. `above` is an open lower bound."""
    if value is None or (
        (low is None or value >= low) and (above is None or value > above) and (high is None or value <= high)
    ):
        return
    u = f" {unit}" if unit else ""
    if high is None:
        want = f"at least {low}{u}" if above is None else "positive" if above == 0 else f"above {above}{u}"
    else:
        want = f"{low}..{high}{u}" if above is None else f"in ({above}, {high}]{u}"
    raise UsageError(f"{flag} must be {want}, not {value}")


def _store():
    from clusterctl.state import StateStore

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


def _hourly(cluster) -> float | None:
    from clusterctl.cluster import costs

    return costs.hourly(cluster)


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
        ssh_config=typer.Option(
            None, "--ssh-config", help="ssh config file (default ~/.ssh/config), read as OpenSSH does (ssh -G)."
        ),
    )


_SSH = _ssh_opts()


def _inventory(hosts_path, cluster, parallel, connect_timeout, user, identity, known_hosts, ssh_config):

    within("--parallel", parallel, 1)
    within("--connect-timeout", connect_timeout, above=0)
    return _resolve_hosts(hosts_path, cluster, user, identity, known_hosts, ssh_config, connect_timeout)


def _resolve_hosts(
    hosts_path,
    cluster,
    user=None,
    identity=(),
    known_hosts=None,
    ssh_config=None,
    connect_timeout: float = 10.0,
    store=None,
):
    """The inventory with the shared ssh options (flags win over the ssh config; a ConnectTimeout in the
    config applies unless --connect-timeout was given)."""
    try:  # newer typer carries its own click (and may not install click): its context is the live one
        from typer._click.core import ParameterSource
        from typer._click.globals import get_current_context
    except ImportError:  # a typer that uses click itself: the same names, other (equal) classes for mypy
        from click.core import ParameterSource  # type: ignore[assignment]
        from click.globals import get_current_context  # type: ignore[no-redef]

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
            user=user,
            identity=tuple(identity or ()),
            known_hosts=known_hosts,
            ssh_config=ssh_config,
            connect_timeout=connect_timeout,
            connect_timeout_given=given,
        ),
        warn=display.warn,
    )


def _fan_out(inv, cmd: str, parallel: int, timeout: float | None = None, live: bool = True):
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
