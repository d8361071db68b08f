"""What runs on this node, as one probe: training processes, ssh sessions and what they run, clusterctl's
detached jobs, GPU use and the bytes moved; and which command lines are the watchdog's own."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import time
from typing import Any

from clusterctl.node.watchdog.files import read_file

PROGRAM = "watchdog"  # its name in the node package (node/__main__.py)
COMMANDS = ("run", "probe", "status", "keep", "off", "on", "lease", "release")
OLD_SCRIPT = "idle_watchdog.py"  # what a watchdog of an older version ran as
TRAINING = re.compile(
    r"^(python[0-9.]*|horovodrun|mpirun|mpiexec|orted|prted|prterun|torchrun|deepspeed|hydra_pmi_proxy)$"
)
JOB_MARK = re.compile(r"\.clusterctl/jobs/([A-Za-z0-9][A-Za-z0-9_-]{0,62})\.exit")
Proc = tuple[int, str, str, int, int, str]  # (ppid, comm, cmdline, start ticks, faults of reaped children, cgroup)
Probe = dict[str, Any]  # what `watchdog probe` prints: gpus, training, sessions, jobs, io


def is_own(cmdline: str) -> bool:
    """A command line (words joined by spaces or NULs, as /proc has them) that runs the watchdog: `... ARCHIVE
    watchdog COMMAND ...` (an archive or its unpacked folder), or an older version's script; clusterctl's own
    checks carry it too, so they never count as activity."""
    words = cmdline.replace("\0", " ").split()
    ours = any(words[i] == PROGRAM and words[i + 1] in COMMANDS for i in range(1, len(words) - 1))
    return ours or any(OLD_SCRIPT in word for word in words)


def processes() -> dict[int, Proc]:
    """pid -> (ppid, comm, cmdline, start ticks, faults of reaped children, cgroup) for every live process."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        raw = read_file(f"/proc/{name}/stat")
        if not raw:
            continue
        stat = raw.decode(errors="replace")
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        f = stat[stat.rindex(")") + 2 :].split()
        if f[0] in ("Z", "X"):
            continue
        cmd = (read_file(f"/proc/{name}/cmdline") or b"").replace(b"\0", b" ").decode(errors="replace").strip()
        cgroup = (read_file(f"/proc/{name}/cgroup") or b"").decode(errors="replace")
        # fields after the comm: state ppid ... cminflt(8) ... cmajflt(10) ... starttime(19)
        out[int(name)] = (int(f[1]), comm, cmd, int(f[19]), int(f[8]) + int(f[10]), cgroup)
    return out


def gpu_use(threshold: int) -> list[int] | None:
    """Utilization per GPU (percent), or None without nvidia-smi (or when it does not answer)."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        r = subprocess.run(
            ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        values = [int(v.strip()) for v in r.stdout.split("\n") if v.strip()]
    except (OSError, ValueError, subprocess.SubprocessError):
        return None
    return values if r.returncode == 0 and values else None


def detached_jobs(procs: dict[int, Proc]) -> list[dict[str, Any]]:
    """clusterctl's detached jobs that run on this node: [{"name", "pid", "cmd"}]. A job's pane shell (and the
    subshell it forks) carries `.clusterctl/jobs/NAME.exit`; the top one of those is the job, the first of its
    descendants without the mark is what the user's command runs (`sleep 400`, `horovodrun ...`)."""
    # tmux itself is no job: its server's command line is the first client's, the first job's text included
    marked = {pid: None if p[1].startswith("tmux") else JOB_MARK.search(p[2]) for pid, p in procs.items()}
    kids: dict[int, list[int]] = {}
    for pid, p in procs.items():
        kids.setdefault(p[0], []).append(pid)
    out = []
    for pid, m in sorted(marked.items()):
        if m is None or marked.get(procs[pid][0]) is not None:  # not a job's top (its subshell)
            continue
        shown, todo = "", sorted(kids.get(pid, []))
        while todo and not shown:
            child = todo.pop(0)
            if marked.get(child) is None and procs[child][1] != "tee":
                shown = procs[child][2] or procs[child][1]
            else:
                todo += sorted(kids.get(child, []))
        out.append({"name": m.group(1), "pid": pid, "cmd": shown[:80]})
    return out


def io_counters() -> dict[str, Any]:
    """Bytes moved since boot: {"net": received + sent on every interface but lo, "disk": read + written on
    the physical disks (a /sys/block entry with a device: no partition, loop, dm or md counted twice)}, with
    the time they were read. None where a file is missing."""
    net = None
    text = (read_file("/proc/net/dev") or b"").decode(errors="replace")
    for line in text.splitlines()[2:]:
        name, _, rest = line.partition(":")
        f = rest.split()
        if name.strip() != "lo" and len(f) >= 9:
            net = (net or 0) + int(f[0]) + int(f[8])
    disk = None
    for line in (read_file("/proc/diskstats") or b"").decode(errors="replace").splitlines():
        f = line.split()
        if len(f) >= 10 and os.path.exists(f"/sys/block/{f[2]}/device"):
            disk = (disk or 0) + (int(f[5]) + int(f[9])) * 512  # sectors read, written: 512 bytes each
    return {"t": time.time(), "net": net, "disk": disk}


def _shown(cmd: str) -> str:
    """A command line as a person reads it: the command clusterctl's session wrapper (remote/session.py:
    `printf ...clusterctl-sid...; exec </dev/null; eval 'CMD'`) runs, not the wrapper."""
    head, sep, tail = cmd.partition("; eval ")
    if sep and "clusterctl-sid" in head:
        try:
            return " ".join(shlex.split(tail)) or cmd
        except ValueError:
            return tail
    return cmd


def probe(threshold: int = 1) -> Probe:
    procs = processes()
    mine = {os.getpid()}
    pid = os.getpid()
    while pid in procs and pid > 1:  # this probe, and what started it (the ssh command of the leader's check)
        pid = procs[pid][0]
        mine.add(pid)
    training, sessions = [], {}
    for pid, (_ppid, comm, cmd, _start, _faults, cgroup) in procs.items():
        if pid in mine or is_own(cmd) or "system.slice" in cgroup:
            continue
        if TRAINING.match(comm):
            training.append(f"{comm}[{pid}] {cmd[:80]}".strip())
    for pid, (_ppid, comm, cmd, start, faults, _cgroup) in procs.items():
        if comm == "sshd" and "@" in cmd:  # "sshd: user@notty" / "sshd: user@pts/0": a logged-in session
            kids = [{"cmd": _shown(c)[:80], "own": is_own(c)} for p, (pp, _, c, *_rest) in procs.items() if pp == pid]
            login = re.search(r"sshd: (\S+@(pts|tty)\S*)", cmd)  # a terminal: an interactive login
            sessions[f"{pid}:{start}"] = {"faults": faults, "children": kids, "login": login.group(1) if login else ""}
    return {
        "gpus": gpu_use(threshold),
        "training": sorted(training),
        "sessions": sessions,
        "jobs": [j for j in detached_jobs(procs) if j["pid"] not in mine],
        "io": io_counters(),
    }
