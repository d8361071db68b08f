"""Leases: a long clusterctl operation (sync, launch, data --on leader) holds one in DIR/leases/ while it runs,
renewed by its operator; the watchdog counts a lease that has not expired as activity."""

from __future__ import annotations

import os
import re
import time

from clusterctl.node.watchdog.files import read_json, write_json


def _lease_path(d: str, lease_id: str | None) -> str:
    if lease_id is None or not re.fullmatch(r"[A-Za-z0-9_.-]{1,80}", lease_id) or lease_id.startswith("."):
        raise ValueError(f"bad lease id {lease_id!r}")
    return os.path.join(d, "leases", f"{lease_id}.json")


def take_lease(d: str, lease_id: str | None, seconds: float, what: str = "") -> None:
    """Busy until now + seconds; the operation renews it while it runs and releases it at its end (a lease
    of an operator that vanished expires by itself)."""
    path = _lease_path(d, lease_id)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_json(path, {"until": time.time() + float(seconds), "what": str(what)[:120]})


def release_lease(d: str, lease_id: str | None) -> None:
    try:
        os.unlink(_lease_path(d, lease_id))
    except FileNotFoundError:
        pass


def leases(d: str, now: float | None = None) -> list[str]:
    """Reasons for the leases that have not expired; expired ones are removed."""
    now = time.time() if now is None else now
    reasons = []
    folder = os.path.join(d, "leases")
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    for name in names:
        if not name.endswith(".json"):
            continue
        info = read_json(os.path.join(folder, name))
        until = float((info or {}).get("until") or 0) if isinstance(info, dict) else 0
        if until > now:
            reasons.append(
                f"lease {name[:-5]}: {info.get('what') or 'a clusterctl operation'} runs "
                f"(for {int(until - now)}s more unless renewed)"
            )
        else:  # expired, or unreadable for a minute (a lease released meanwhile is simply gone)
            try:
                if info is not None or now - os.path.getmtime(os.path.join(folder, name)) > 60:
                    os.unlink(os.path.join(folder, name))
            except OSError:
                pass
    return reasons
