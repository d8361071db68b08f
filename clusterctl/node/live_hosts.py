"""`python3 PYZ live_hosts JOB_DIR/hosts`: Horovod's host discovery for an elastic job, run by horovodrun on
the leader (every second).

Prints `host:slots` for each line of ~/.clusterctl/live-hosts (clusterctl keeps that file on the leader:
`train --elastic` writes it at start, `repair` when it replaces or drops a node) whose host answers ssh now,
host keys checked and within a few seconds; without that file, the lines of the job's hosts file (the
argument, `HOST slots=N`). The job's folder is the one that holds that hosts file.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

from clusterctl.node import ssh

PATH = ".clusterctl/live-hosts"  # under the leader's login home (cluster/live_hosts.py writes it)
SSH = ssh.argv(3)
TIMEOUT_S = 5
COPY_TIMEOUT_S = 60
# The zipapp this runs from (clusterctl/node/live_hosts.py inside it): every rank runs its `train`, at the same
# path on every node.
ARCHIVE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def entries(text: str) -> list[tuple[str, int]]:
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


def answers(host: str, job_dir: str, archive: str = ARCHIVE) -> bool:
    """The host answers ssh and holds this job's folder and the node package: one staged at the start has them;
    one that came later (`clusterctl repair` replaced it) gets copies of the leader's first, or Horovod would
    start a process there without its folder or its trainer, and that failure ends the whole job."""
    package = os.path.isfile(archive)  # a zipapp (run from a source tree in tests: nothing to copy)
    probe = f"test -d {shlex.quote(job_dir)}; a=$?; " + (f"test -f {shlex.quote(archive)}; " if package else "true; ")
    try:
        r = subprocess.run([*SSH, host, probe + 'echo "$a $?"'], capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return False
    has = r.stdout.split()
    if r.returncode != 0 or len(has) != 2:
        return False
    return (has[0] == "0" or copy_job_dir(host, job_dir)) and (has[1] == "0" or copy_archive(host, archive))


def copy_archive(host: str, archive: str) -> bool:
    """The node package to the same path there (rsync writes a temporary file and renames it into place)."""
    try:
        mkdir = shlex.join(["mkdir", "-p", os.path.dirname(archive)])
        if subprocess.run([*SSH, host, mkdir], capture_output=True, timeout=TIMEOUT_S).returncode != 0:
            return False
        copied = subprocess.run(
            ["rsync", "-a", "--protect-args", "-e", shlex.join(SSH), archive, f"{host}:{archive}"],
            capture_output=True,
            timeout=COPY_TIMEOUT_S,
        )
        return copied.returncode == 0
    except subprocess.TimeoutExpired:
        return False


def copy_job_dir(host: str, job_dir: str) -> bool:
    """The job folder copied beside its place, then renamed into it: never seen half copied."""
    incoming = job_dir + ".incoming"
    try:
        # rsync makes the last folder only: the jobs folder first
        mkdir = shlex.join(["mkdir", "-p", os.path.dirname(job_dir)])
        if subprocess.run([*SSH, host, mkdir], capture_output=True, timeout=TIMEOUT_S).returncode != 0:
            return False
        copied = subprocess.run(
            ["rsync", "-a", "--delete", "--protect-args", "-e", shlex.join(SSH), job_dir + "/", f"{host}:{incoming}/"],
            capture_output=True,
            timeout=COPY_TIMEOUT_S,
        )
        if copied.returncode != 0:
            return False
        cmd = shlex.join(["mv", "-T", incoming, job_dir])
        return subprocess.run([*SSH, host, cmd], capture_output=True, timeout=TIMEOUT_S).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0].startswith("-"):
        print("usage: live_hosts JOB_DIR/hosts  (the job's hosts file; its folder is the job's)", file=sys.stderr)
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    live = os.path.join(os.path.expanduser("~"), PATH)
    job_dir = os.path.dirname(os.path.abspath(argv[0]))
    with open(live if os.path.exists(live) else argv[0]) as f:
        hosts = entries(f.read())
    with ThreadPoolExecutor(max_workers=min(32, max(1, len(hosts)))) as pool:
        alive = list(pool.map(lambda h: answers(h, job_dir), [h for h, _ in hosts]))
    for (host, slots), ok in zip(hosts, alive):
        if ok:
            print(f"{host}:{slots}")
    return 0
