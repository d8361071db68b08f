"""Units shown to people, written once: money and durations (every table, estimate and status line)."""

from __future__ import annotations


def money(usd: float | None) -> str:
    """$1,234.50; 'unknown' when there is no price."""
    return "unknown" if usd is None else f"${usd:,.2f}"


def duration(seconds: float | None) -> str:
    """5s, 119s, 2m30s, 16m, 90m, 25h00m, 2d04h; '-' when unknown; a negative span is 0s.

    Seconds up to two minutes, then minutes (with the seconds only under ten minutes, where they still
    matter), hours and minutes from two hours, days and hours from two days: a short span keeps its
    digits, a long one drops what nobody reads."""
    if seconds is None:
        return "-"
    s = max(0, int(round(seconds)))
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m" + (f"{s % 60:02d}s" if s < 600 and s % 60 else "")
    if s < 172800:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 86400}d{(s % 86400) // 3600:02d}h"
