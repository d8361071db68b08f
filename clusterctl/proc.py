"""Facts about processes on this machine: is a pid alive, and who this process runs as (core: stdlib only)."""

from __future__ import annotations

import getpass
import os
import socket
from pathlib import Path


def alive(pid: int) -> bool:
    """Running. A zombie counts as gone (it holds nothing); when it is our own child it is reaped here, so a
    caller that started it sees it end (a Popen it never waits on, a detached sshd, a supervisor)."""
    if pid <= 0:  # waitpid() would read 0 and -N as process groups
        return False
    try:
        waited, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:  # not our child: ask /proc
        pass
    else:
        return waited == 0
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # the state follows the command name, which may hold ')'


def owner() -> str:
    """Who made a resource (the `clusterctl:owner` tag): user@host of this machine."""
    try:
        user = getpass.getuser()
    except Exception:
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}"[:200]
