"""Errors and the one exit-code table of the whole tool.

Every error a user can cause or meet is a ClusterctlError child: the CLI prints it as one line
`Error: ...` (message, then what to do) and exits with its code. Nothing else maps errors to codes.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Iterable


class ExitCode(IntEnum):
    OK = 0
    REMOTE_FAILED = 1  # a remote command exited non-zero on some host
    USAGE = 2  # bad flags or arguments (typer/click also use 2)
    CONFIG = 3  # bad config, input, hosts file or local state
    PROVISION = 4  # provisioning failed: capacity, quota, cloud error
    UNREACHABLE = 5  # some hosts could not be reached over ssh
    INCONCLUSIVE = 6  # bench: the measured interval straddles the threshold, no verdict
    TIMEOUT = 124  # a command or wait ran out of time (like timeout(1))
    INTERRUPTED = 130  # Ctrl-C (128 + SIGINT)


def exit_status(timed_out: bool, unreachable: bool, worst: int) -> int:
    """The run table's precedence, written once: a timeout beats unreachable hosts beats the worst other status."""
    return int(ExitCode.TIMEOUT) if timed_out else int(ExitCode.UNREACHABLE) if unreachable else worst


def combined(codes: Iterable[int]) -> int:
    """Several steps' exit statuses as one (clean --kill --disk --reboot), by exit_status's precedence."""
    ints = [int(c) for c in codes]
    return exit_status(int(ExitCode.TIMEOUT) in ints, int(ExitCode.UNREACHABLE) in ints, max(ints, default=0))


class ClusterctlError(Exception):
    """Base of every error that reaches the user. `hint` says what to do next."""

    exit_code: ExitCode = ExitCode.CONFIG

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def one_line(self) -> str:
        text = self.message if not self.hint else f"{self.message}: {self.hint}"
        return " ".join(text.split())  # exactly one line, whatever the message held


class UsageError(ClusterctlError):
    exit_code = ExitCode.USAGE


class ConfigError(ClusterctlError):
    exit_code = ExitCode.CONFIG


class HostsFileError(ConfigError):
    """A bad hosts file; the message starts with `hosts:LINE:`."""


class StateError(ConfigError):
    """The local state is missing, foreign, truncated or locked by another clusterctl."""


class NeedsRootError(ConfigError):
    pass


class ProvisionError(ClusterctlError):
    exit_code = ExitCode.PROVISION


class CapacityError(ProvisionError):
    pass


class RemoteCommandError(ClusterctlError):
    exit_code = ExitCode.REMOTE_FAILED


class UnreachableError(ClusterctlError):
    exit_code = ExitCode.UNREACHABLE


class HostKeyError(UnreachableError):
    """`up` found no host key for a node from an authenticated source (its console output, or the leader
    for members) and was not told --trust-first-contact: it fails closed rather than trust first contact."""


class WaitTimeout(ClusterctlError):
    exit_code = ExitCode.TIMEOUT


# ---- the one range check of numeric options (the CLI's flags, playbook steps, typed specs) ------------
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
