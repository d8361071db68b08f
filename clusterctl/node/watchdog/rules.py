"""Busy or idle, and when the cluster stops: pure functions of the probes, the settings and the clock (only
boot_time reads /proc, for a --max-lifetime without a launch time)."""

from __future__ import annotations

import time
from typing import Any

from clusterctl.node.watchdog.activity import Probe
from clusterctl.node.watchdog.files import DEFAULTS, Config

Plan = dict[str, Any]  # stop_at, why, idle_for, idle_at, lifetime_at


def _rate(bytes_per_s: float) -> str:
    return f"{bytes_per_s / 1e6:.1f} MB/s" if bytes_per_s >= 1e6 else f"{bytes_per_s / 1e3:.0f} KB/s"


def throughput(pr: Probe, prev: Probe | None) -> dict[str, float | None]:
    """Bytes per second moved between two probes of one node: {"net": rate, "disk": rate}, a rate None when
    either probe lacks its counter (a counter that went down, a node rebooted: None too)."""
    now, then = pr.get("io") or {}, (prev or {}).get("io") or {}
    dt = (now.get("t") or 0) - (then.get("t") or 0)
    out: dict[str, float | None] = {}
    for kind in ("net", "disk"):
        a, b = then.get(kind), now.get(kind)
        out[kind] = (b - a) / dt if dt > 0 and a is not None and b is not None and b >= a else None
    return out


def busy_reasons(
    host: str, pr: Probe, prev: Probe | None, own: set[str], first: bool, cfg: Config | None = None
) -> list[str]:
    """Why node `host` is busy now (empty: idle), from its probe `pr` and its probe at the last check `prev`
    ({} when none): every signal counts, GPUs or not (idle GPUs do not make a running copy or shell idle).
    `own`: session keys known to be clusterctl's own checks (updated here); `first`: no history yet (a
    session that ran something before the first check says nothing); `cfg`: the settings (DEFAULTS')."""
    cfg = {**DEFAULTS, **(cfg or {})}
    seen = (prev or {}).get("sessions", {})
    reasons = [
        f"{host}: detached job {j['name']} (tmux session {j['name']}, pid {j['pid']}"
        + (f": {j['cmd']})" if j.get("cmd") else ")")
        for j in pr.get("jobs", [])
    ]
    for key, s in pr.get("sessions", {}).items():
        kids = s.get("children", [])
        if kids and all(k["own"] for k in kids):
            own.add(f"{host}/{key}")
        if f"{host}/{key}" in own:
            continue
        running = next((k["cmd"] for k in kids if not k["own"]), None)
        if running is not None and s.get("login"):
            reasons.append(f"{host}: interactive login {s['login']} running {running}")
        elif running is not None:
            reasons.append(f"{host}: ssh session running {running}")
        elif key in seen and s["faults"] > seen[key]["faults"]:
            reasons.append(f"{host}: a command ran in an ssh session")
        elif key not in seen and not first and s["faults"] > 0:
            reasons.append(f"{host}: a new ssh session ran a command")
    reasons += [f"{host}: {t}" for t in pr.get("training", [])]
    threshold = cfg.get("gpu_busy_percent") or 1
    reasons += [f"{host}: GPU {i} at {u}%" for i, u in enumerate(pr.get("gpus") or []) if u >= threshold]
    rates = throughput(pr, prev)
    for kind, key in (("network", "net"), ("disk", "disk")):
        floor = cfg.get(f"{key}_busy_bytes_per_s")
        rate = rates[key]
        if floor is not None and rate is not None and rate > float(floor):
            reasons.append(f"{host}: {kind} {_rate(rate)} (above {_rate(float(floor))})")
    return reasons


def boot_time() -> float | None:
    """When this machine booted (a cloud node: about when it was launched), or None."""
    try:
        with open("/proc/uptime") as f:
            return time.time() - float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def plan(cfg: Config, last_active: float, started: float, now: float) -> Plan:
    """When the cluster stops and why: {"stop_at": epoch or None, "why": "idle-stop"|"max-lifetime"|None, ...}."""
    keep = cfg.get("keep_until") or 0
    out: Plan = {
        "stop_at": None,
        "why": None,
        "idle_for": max(0.0, now - max(last_active, started)),
        "idle_at": None,
        "lifetime_at": None,
    }
    if not cfg.get("enabled", True):
        return out
    if cfg.get("idle_stop"):
        out["idle_at"] = max(last_active, started, keep) + float(cfg["idle_stop"])
    if cfg.get("max_lifetime"):
        born = cfg.get("created_at") or boot_time() or started
        out["lifetime_at"] = max(born + float(cfg["max_lifetime"]), keep)
    options = [(t, why) for t, why in ((out["idle_at"], "idle-stop"), (out["lifetime_at"], "max-lifetime")) if t]
    if options:
        out["stop_at"], out["why"] = min(options)
    return out


def idle_action(cfg: Config) -> str:
    """What firing does: "stop" (disks kept) or "terminate"; a settings file from before the choice: terminate."""
    return "stop" if cfg.get("idle_action") == "stop" else "terminate"


def decide(
    cfg: Config, reasons: list[str], last_active: float, last_reason: str, started: float, now: float
) -> tuple[float, str, Plan, str | None]:
    """One check's decision, from what was found busy now (`reasons`, every node's and the leases'):
    (last_active, last_reason, plan, why it fires now or None). Pure: the samples in, the decision out."""
    if reasons:
        last_active, last_reason = now, "; ".join(reasons)[:300]
    p = plan(cfg, last_active, started, now)
    if p["stop_at"] is None or now < p["stop_at"]:
        return last_active, last_reason, p, None
    if p["why"] == "idle-stop":
        why = (
            f"idle-stop: nothing busy for {int(now - max(last_active, started))}s (limit "
            f"{int(cfg['idle_stop'])}s); last activity: {last_reason}"
        )
    else:
        born = cfg.get("created_at") or boot_time() or started
        why = f"max-lifetime: up {int(now - born)}s (limit {int(cfg['max_lifetime'])}s)"
    return last_active, last_reason, p, why
