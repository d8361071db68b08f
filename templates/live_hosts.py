#!/usr/bin/env python3
"""Horovod's host discovery script for an elastic job, run by horovodrun on the leader (every second).

Prints `host:slots` for each line of ~/.clusterctl/live-hosts (clusterctl keeps that file on the leader:
`train --elastic` writes it at start, `repair` when it replaces or drops a node) whose host answers ssh now,
host keys checked and within a few seconds; without that file, the lines of the job's hosts file (argv[1],
`HOST slots=N`). Standalone, stdlib only: it runs on the node.
"""

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

LIVE_HOSTS = os.path.expanduser("~/.clusterctl/live-hosts")
SSH = [
    "ssh",
    "-o", "BatchMode=yes",
    "-o", "StrictHostKeyChecking=yes",
    "-o", "PasswordAuthentication=no",
    "-o", "ForwardAgent=no",
    "-o", "ConnectTimeout=3",
]  # fmt: skip
TIMEOUT_S = 5


def entries(text: str) -> list:
    """(host, slots) of `host:slots` or `host slots=N` lines; blank lines and comments skipped."""
    out = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        if " " in line:
            host, _, rest = line.partition(" ")
            slots = rest.strip().removeprefix("slots=")
        else:
            host, _, slots = line.rpartition(":")
        if host and not host.startswith("-") and slots.isdigit() and int(slots) > 0:
            out.append((host, int(slots)))
    return out


def answers(host: str) -> bool:
    try:
        return subprocess.run([*SSH, host, "true"], capture_output=True, timeout=TIMEOUT_S).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def main(argv: list) -> int:
    path = LIVE_HOSTS if os.path.exists(LIVE_HOSTS) else argv[1]
    with open(path) as f:
        hosts = entries(f.read())
    with ThreadPoolExecutor(max_workers=min(32, max(1, len(hosts)))) as pool:
        alive = list(pool.map(answers, [h for h, _ in hosts]))
    for (host, slots), ok in zip(hosts, alive):
        if ok:
            print(f"{host}:{slots}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
