"""Autostop's settings: --idle-stop / --max-lifetime / --idle-action parsed into an Autostop and described (the
record keeps them through Autostop.extra and ClusterFacts.autostop). Pure (no files, no processes): the AWS and local providers import it.

The rest of autostop: watchdog.py (the node-side watchdog, its files and the AWS user data); the operator's
side in cluster/ (autostop_control.py: keep, --on/--off, leases; autostop_status.py: what `status` and
`autostop` show); the local provider's host-side supervisor is providers/local/supervisor.py.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from clusterctl.errors import UsageError
from clusterctl.types import Autostop
from clusterctl.units import duration

DEFAULT_IDLE = "60m"

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str | None, flag: str, allow_off: bool = True) -> int | None:
    """'20s', '30m', '12h', '2d', '1h30m' -> seconds; 'off'/'none'/'0' -> None (when allowed)."""
    t = (text or "").strip().lower()
    if allow_off and t in ("off", "none", "no", "0", "never"):
        return None
    if not re.fullmatch(r"(\d+(\.\d+)?[smhd])+", t):
        raise UsageError(
            f"{flag} {text!r} is not a duration",
            "give one like 20s, 30m, 12h or 1h30m" + (", or off" if allow_off else ""),
        )
    seconds = sum(float(n) * _UNITS[u] for n, _, u in re.findall(r"(\d+(\.\d+)?)([smhd])", t))
    if seconds < 1:
        raise UsageError(f"{flag} {text!r} is shorter than a second")
    return int(seconds)


# What the watchdog's power-off does, as SkyPilot's autostop (stop) and its `--down` (terminate). A flag with
# both values named, not a bare --down: `up`'s plan and `autostop` print the word the user typed. Stop is the
# default: nothing is lost (the job's output, the data copied to the nodes); stopped instances cost their
# disks only (EBS), and `clusterctl start NAME` starts them again with what they held.
IDLE_ACTIONS = ("stop", "terminate")
DEFAULT_ACTION = "stop"


def parse_action(text: str | None) -> str:
    t = (text or DEFAULT_ACTION).strip().lower()
    if t not in IDLE_ACTIONS:
        raise UsageError(
            f"--idle-action {text!r} is neither stop nor terminate",
            "give --idle-action stop (disks kept; `clusterctl start NAME` starts it again) or --idle-action terminate",
        )
    return t


def settings(
    idle_stop: str | None, max_lifetime: str | None, idle_action: str | None = None, spot: bool = False
) -> Autostop:
    """`spot`: one-time spot instances, which EC2 can only terminate, so that is their default action (a
    `--idle-action stop` given with them is refused by the AWS provider, naming the way out)."""
    return Autostop(
        parse_duration(idle_stop if idle_stop is not None else DEFAULT_IDLE, "--idle-stop"),
        parse_duration(max_lifetime, "--max-lifetime") if max_lifetime else None,
        parse_action(idle_action if idle_action is not None or not spot else "terminate"),
    )


def action_of(config: Mapping[str, Any]) -> str:
    """The action a watchdog's settings file names; a file from before the choice: terminate (what it did)."""
    return "stop" if config.get("idle_action") == "stop" else "terminate"


def describe_action(action: str) -> str:
    if action == "stop":
        return "stop: the nodes power off, their disks are kept (and cost); `clusterctl start NAME` starts them again"
    return "terminate: the nodes and their disks are removed, with whatever they held"


def describe(a: Autostop | None) -> str:
    if a is None or not a.enabled:
        return "off: the cluster runs until `clusterctl down`"
    parts = []
    if a.idle_stop_s:
        parts.append(
            f"after {duration(a.idle_stop_s)} with nothing busy (no GPU in use, no training process, no ssh "
            "command or login, no detached job of clusterctl, no sync or launch of clusterctl running, no network "
            "or disk traffic)"
        )
    if a.max_lifetime_s:
        parts.append(f"at the latest {duration(a.max_lifetime_s)} after it was made")
    verb = "stops" if a.idle_action == "stop" else "terminates"
    return (
        f"{verb} itself "
        + ", and ".join(parts)
        + f" (`clusterctl keep NAME --for 4h` extends); idle action {describe_action(a.idle_action)}"
    )


def poll_seconds(a: Autostop) -> int:
    shortest = min(x for x in (a.idle_stop_s, a.max_lifetime_s) if x) if a.enabled else 600
    return max(1, min(60, shortest // 10))  # a tenth of the limit: 2s for 20s, a minute for an hour or more
