"""What `status` says about autostop: the leader watchdog's own status (a local node's files, or over ssh on
a cloud node), as lines. When the cluster stops and why; from the settings alone when the leader does not
answer. Operator side: it reads ssh targets from the cluster's record (cluster/reach.py)."""

from __future__ import annotations

import json
import time
from typing import Any, Callable

from clusterctl.autostop.settings import action_of, describe_action
from clusterctl.autostop.watchdog import local_dir, remote_command
from clusterctl.node.watchdog.main import status
from clusterctl.state import Record, StateStore
from clusterctl.types import Autostop, Cluster
from clusterctl.units import duration


def local_status(store: StateStore, name: str, running: Callable[[str], bool]) -> dict[str, Any] | None:
    """A local leader's watchdog status from its files; `running(name)` says whether the watchdog process runs
    in the leader (the local provider's supervisor.watchdog_running: the state's pid is the node's own view)."""
    d = local_dir(store, name)
    if not (d / "config.json").exists():
        return None
    st: dict[str, Any] = status(str(d))
    st["running"] = running(name)
    return st


def remote_status(cluster: Cluster, store: StateStore, timeout: float = 20.0) -> dict[str, Any] | None:
    """The leader's watchdog status over ssh (a fresh connection, not the agent's: it must not look like
    activity), or None when it does not answer."""
    from clusterctl.cluster import reach
    from clusterctl.remote.ssh import SshPool

    target = reach.ssh_targets(cluster, store)[0]
    with SshPool(reach.ssh_settings(cluster, store, connect_timeout=5.0)) as pool:
        r = pool.run_one(target, remote_command("status"), timeout=timeout)
    try:
        st: dict[str, Any] | None = json.loads(r.stdout.strip().splitlines()[-1]) if r.ok else None
        return st
    except (ValueError, IndexError):
        return None


def status_lines(store: StateStore, record: Record) -> list[str]:
    """What `status` says about autostop for a cluster with a local record (whether the watchdog of a cluster on
    this machine runs: its provider's watchdog_running)."""
    from clusterctl import providers

    c = record.cluster
    if record.status == "stopped":  # autostop's own stop says so; `clusterctl stop`'s note is status's stopped line
        return [f"autostop: {record.note}"] if "by autostop" in record.note else []
    if providers.shares_this_machine(c):  # the watchdog's files are on this machine
        impl = providers.of(c)
        running = local_status(store, c.name, lambda _name: bool(impl.watchdog_running(c)))
        return summary(running, c.facts.autostop, c.created_at)
    try:
        st = remote_status(c, store)
    except Exception:  # unreachable, keys gone ...: say what is known from the settings
        st = None
    return summary(st, c.facts.autostop, c.created_at)


def summary(
    st: dict[str, Any] | None,
    fallback: Autostop | None = None,
    created_at: float | None = None,
    now: float | None = None,
) -> list[str]:
    """Lines for `status`: when the cluster stops and why, from the watchdog's own status (or, when the
    leader did not answer, from the settings alone)."""
    now = now or time.time()
    if st is None:
        if fallback is None:
            return ["autostop: no watchdog on this cluster"]
        if not fallback.enabled:
            return ["autostop: off"]
        lines = [
            f"autostop: idle-stop {duration(fallback.idle_stop_s) if fallback.idle_stop_s else 'off'}"
            + (f", max lifetime {duration(fallback.max_lifetime_s)}" if fallback.max_lifetime_s else "")
            + " (the leader's watchdog did not answer: time left unknown)"
        ]
        if fallback.max_lifetime_s and created_at:
            lines.append(
                f"autostop: stops at the latest in {duration(created_at + fallback.max_lifetime_s - now)} "
                "(max lifetime)"
            )
        return lines
    cfg, state, plan = st.get("config", {}), st.get("state", {}), st.get("plan", {})
    verb = "terminates" if action_of(cfg) == "terminate" else "stops"
    if st.get("fired"):
        return [f"autostop: fired: {st['fired'].get('reason')}"]
    if not cfg.get("enabled", True):
        return [
            "autostop: OFF: the cluster runs (and costs) until `clusterctl down` "
            "(`clusterctl autostop NAME --on` turns it back on)"
        ]
    if not st.get("running"):
        lines = ["autostop: the watchdog is not running on the leader"]
    elif plan.get("stop_at") is None:
        return ["autostop: no limits set (`clusterctl autostop NAME --idle-stop 30m` sets one)"]
    else:
        left = plan["stop_at"] - st.get("now", now)
        busy = state.get("busy") or []
        if plan.get("why") == "idle-stop" and busy:
            # the job, login, copy ... that holds it: the stop waits for it (idle-stop counts from its end)
            checked = duration(max(0.0, st.get("now", now) - (state.get("checked_at") or now)))
            lines = [f"autostop: busy: {reason}" for reason in busy[:5]]
            if len(busy) > 5:
                lines.append(f"autostop: busy: ... and {len(busy) - 5} more")
            lines.append(
                f"autostop: held by the above (checked {checked} ago): it {verb} {duration(cfg.get('idle_stop'))} "
                "after the last of them ends"
            )
            return lines + _tail(cfg, plan, now, verb)
        if plan.get("why") == "idle-stop":
            lines = [
                f"autostop: {verb} in {duration(left)} if nothing runs (idle-stop {duration(cfg.get('idle_stop'))}, "
                f"idle for {duration(plan.get('idle_for'))})"
            ]
        else:
            lines = [f"autostop: {verb} in {duration(left)} (max lifetime {duration(cfg.get('max_lifetime'))})"]
    if state.get("last_reason"):
        lines.append(
            f"autostop: last activity {duration(now - (state.get('last_active') or now))} ago: {state['last_reason']}"
        )
    return lines + _tail(cfg, plan, now, verb)


def _tail(cfg: dict[str, Any], plan: dict[str, Any], now: float, verb: str) -> list[str]:
    lines = []
    if cfg.get("keep_until") and cfg["keep_until"] > now:
        lines.append(f"autostop: kept until {time.strftime('%Y-%m-%d %H:%M', time.localtime(cfg['keep_until']))}")
    if plan.get("why") == "idle-stop" and plan.get("lifetime_at"):
        lines.append(f"autostop: max lifetime ends in {duration(plan['lifetime_at'] - now)}")
    lines.append(f"autostop: when it fires: {describe_action(action_of(cfg))}")
    return lines
