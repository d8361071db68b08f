#!/usr/bin/env python3
"""Horovod's host discovery script for an elastic job, run by horovodrun on the leader (every second).

Prints `host:slots` for each line of ~/.clusterctl/live-hosts (clusterctl keeps that file on the leader:
`train --elastic` writes it at start, `repair` when it replaces or drops a node) whose host answers ssh now,
host keys checked and within a few seconds; without that file, the lines of the job's hosts file (argv[1],
`HOST slots=N`). Standalone, stdlib only: it runs on the node.
"""

import os
import shlex
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
COPY_TIMEOUT_S = 60
JOB_DIR = os.path.dirname(os.path.abspath(__file__))  # this script is staged in the job's folder


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
    """The host answers ssh and holds this job's folder: one staged at the start has it; one that came later
    (`clusterctl repair` replaced it) gets a copy of the leader's first, or Horovod would start a process there
    on a trainer that is not on it, and that failure ends the whole job."""
    try:
        probe = subprocess.run(
            [*SSH, host, shlex.join(["test", "-d", JOB_DIR])], capture_output=True, timeout=TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        return False
    return probe.returncode == 0 or (probe.returncode == 1 and copy_job_dir(host))


def copy_job_dir(host: str) -> bool:
    """The job folder copied beside its place, then renamed into it: never seen half copied."""
    incoming = JOB_DIR + ".incoming"
    try:
        # rsync makes the last folder only: the jobs folder first
        mkdir = shlex.join(["mkdir", "-p", os.path.dirname(JOB_DIR)])
        if subprocess.run([*SSH, host, mkdir], capture_output=True, timeout=TIMEOUT_S).returncode != 0:
            return False
        copied = subprocess.run(
            ["rsync", "-a", "--delete", "--protect-args", "-e", shlex.join(SSH), JOB_DIR + "/", f"{host}:{incoming}/"],
            capture_output=True,
            timeout=COPY_TIMEOUT_S,
        )
        if copied.returncode != 0:
            return False
        cmd = shlex.join(["mv", "-T", incoming, JOB_DIR])
        return subprocess.run([*SSH, host, cmd], capture_output=True, timeout=TIMEOUT_S).returncode == 0
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
