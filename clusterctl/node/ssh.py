"""The ssh one node runs to reach another of its cluster (the sweep scheduler's rounds, the watchdog's checks
of the members, and the node programs that reach their peers): the cluster's internal key, host keys pinned in the login user's known_hosts,
never a prompt nor a forwarded agent. The one copy of these options; the operator's own ssh to the nodes
is remote/openssh.py's."""

from __future__ import annotations

PINNED = (
    "-o",
    "BatchMode=yes",
    "-o",
    "StrictHostKeyChecking=yes",
    "-o",
    "PasswordAuthentication=no",
    "-o",
    "ForwardAgent=no",
)


def argv(connect_timeout: int, *, alive: tuple[int, int] | None = None, quiet: bool = False) -> list[str]:
    """`ssh` and its options, the host and command to follow. alive: (ServerAliveInterval, ServerAliveCountMax),
    how soon a connection to a dead peer ends; quiet: LogLevel=ERROR (no banners, no warnings on stderr)."""
    words = ["ssh", *PINNED, "-o", f"ConnectTimeout={connect_timeout}"]
    if alive is not None:
        words += ["-o", f"ServerAliveInterval={alive[0]}", "-o", f"ServerAliveCountMax={alive[1]}"]
    if quiet:
        words += ["-o", "LogLevel=ERROR"]
    return words
