#!/usr/bin/env python3
"""clusterctl's autostop watchdog: power the cluster off when it has been idle, or up, for too long.

Standard library only; shipped by clusterctl (templates/idle_watchdog.py). On AWS every node runs it as
the systemd unit clusterctl-autostop (from the user data) and a shutdown terminates the instance; on the
local provider it runs inside the leader node and a host-side supervisor removes the cluster.

  idle_watchdog.py run --dir DIR             watch; power off when idle (--idle-stop) or too old (--max-lifetime)
  idle_watchdog.py probe                     this node's activity as one JSON line (what `run` asks every node)
  idle_watchdog.py status --dir DIR          settings, state and time left as one JSON line
  idle_watchdog.py keep --dir DIR --for S    no stop of any kind before now + S seconds
  idle_watchdog.py lease --dir DIR --id ID --for S [--what TEXT]   busy until now + S (renewed while it runs)
  idle_watchdog.py release --dir DIR --id ID                       that lease ends now
  idle_watchdog.py off|on --dir DIR          disable / enable

DIR holds config.json (written by clusterctl: the settings), state.json (written here at every check),
watchdog.log (why it fired), leases/ID.json (one per long clusterctl operation that runs: sync, launch)
and, once it fired, fired.json.

Busy means, when ANY of these says so (idle_reasons / busy_reasons decide, pure functions of the samples):
  * a live process in a tmux session clusterctl started (`run --detach`, `train`, `launch`, `sweep`, `data
    --on leader`, `tensorboard`: every one goes through clusterctl.remote.tmux.detach_command, whose pane
    shell carries `.clusterctl/jobs/NAME.exit` in its command line), whatever it runs (`sleep`, `aws s3 sync`);
  * a lease that has not expired (on the deciding node): sync, launch, data --on leader hold one;
  * an ssh command that runs, an interactive login (a shell on a terminal), or since the last check a
    command that ran (on any node of the cluster);
  * a training process (python, horovodrun, mpirun, orted ...) outside system.slice;
  * a GPU in use (nvidia-smi utilization at or above gpu_busy_percent);
  * network or disk throughput above a floor (net_busy_bytes_per_s, disk_busy_bytes_per_s: bytes per
    second between two checks, from /proc/net/dev without lo and /proc/diskstats' physical disks; None
    turns one off: a namespace node shares this machine's disks, so the local provider turns disk off).
Idle GPUs do not make a copy or a shell idle. Kept-open ssh connections with nothing running, system
daemons, and clusterctl's own checks (anything running this script) do not count. The node whose address
is first in the hosts file (the leader) decides for the whole cluster: it asks every member over ssh, and
when it fires it powers the members off first, then itself. A member defers to the leader while the leader
answers on port 22, and acts alone (on its own activity) when there is no hosts file yet or the leader is
gone. What idle does (idle_action): "stop" (AWS: the instances stop, their disks kept; `clusterctl up
--name NAME` starts them again) or "terminate" (gone, disks included); the power-off is the same, the instance's
shutdown behaviour (set at launch) or the local supervisor makes the difference.
"""

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

MARK = "idle_watchdog.py"  # clusterctl's own processes carry this in their command line
TRAINING = re.compile(
    r"^(python[0-9.]*|horovodrun|mpirun|mpiexec|orted|prted|prterun|torchrun|deepspeed|hydra_pmi_proxy)$"
)
DEFAULTS = {
    "enabled": True,
    "idle_stop": 3600,
    "max_lifetime": None,
    "keep_until": None,
    "created_at": None,
    "poll": 30,
    "poweroff": "shutdown",
    "user": "root",
    "python": "/usr/bin/python3",
    "script": None,
    "gpu_busy_percent": 1,
    # Throughput floors, bytes per second between two checks. The watchdog's own probes move a few KB per
    # member per check; a copy (`aws s3 sync`, a dataset download, a conversion writing shards) moves MBs.
    "net_busy_bytes_per_s": 256 * 1024,
    "disk_busy_bytes_per_s": 1024 * 1024,
    "idle_action": "terminate",
    "cluster": "",
}
JOB_MARK = re.compile(r"\.clusterctl/jobs/([A-Za-z0-9][A-Za-z0-9_-]{0,62})\.exit")


# ---- files --------------------------------------------------------------------------------------------
def read_json(path, default=None):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return default


def write_json(path, data):
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, sort_keys=True)
        f.write("\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def load_config(d):
    cfg = dict(DEFAULTS)
    cfg.update(read_json(os.path.join(d, "config.json"), {}) or {})
    return cfg


def edit_config(d, **changes):
    cfg = read_json(os.path.join(d, "config.json"), {}) or {}
    cfg.update(changes)
    write_json(os.path.join(d, "config.json"), cfg)
    return cfg


def log(d, text, echo=True):
    line = time.strftime("%Y-%m-%dT%H:%M:%S%z") + " " + text
    if echo:  # the watchdog's own output goes to the journal; a command's output is its JSON alone
        print(line, flush=True)
    try:
        with open(os.path.join(d, "watchdog.log"), "a") as f:
            f.write(line + "\n")
    except OSError:
        pass


# ---- what runs on this node ---------------------------------------------------------------------------
def _read(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def processes():
    """pid -> (ppid, comm, cmdline, start ticks, faults of reaped children, cgroup) for every live process."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        stat = _read(f"/proc/{name}/stat")
        if not stat:
            continue
        stat = stat.decode(errors="replace")
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        f = stat[stat.rindex(")") + 2 :].split()
        if f[0] in ("Z", "X"):
            continue
        cmd = (_read(f"/proc/{name}/cmdline") or b"").replace(b"\0", b" ").decode(errors="replace").strip()
        cgroup = (_read(f"/proc/{name}/cgroup") or b"").decode(errors="replace")
        # fields after the comm: state ppid ... cminflt(8) ... cmajflt(10) ... starttime(19)
        out[int(name)] = (int(f[1]), comm, cmd, int(f[19]), int(f[8]) + int(f[10]), cgroup)
    return out


def gpu_use(threshold):
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


def detached_jobs(procs):
    """clusterctl's detached jobs that run on this node: [{"name", "pid", "cmd"}]. A job's pane shell (and the
    subshell it forks) carries `.clusterctl/jobs/NAME.exit`; the top one of those is the job, the first of its
    descendants without the mark is what the user's command runs (`sleep 400`, `horovodrun ...`)."""
    # tmux itself is no job: its server's command line is the first client's, the first job's text included
    marked = {pid: None if p[1].startswith("tmux") else JOB_MARK.search(p[2]) for pid, p in procs.items()}
    kids = {}
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


def io_counters():
    """Bytes moved since boot: {"net": received + sent on every interface but lo, "disk": read + written on
    the physical disks (a /sys/block entry with a device: no partition, loop, dm or md counted twice)}, with
    the time they were read. None where a file is missing."""
    net = None
    text = (_read("/proc/net/dev") or b"").decode(errors="replace")
    for line in text.splitlines()[2:]:
        name, _, rest = line.partition(":")
        f = rest.split()
        if name.strip() != "lo" and len(f) >= 9:
            net = (net or 0) + int(f[0]) + int(f[8])
    disk = None
    for line in (_read("/proc/diskstats") or b"").decode(errors="replace").splitlines():
        f = line.split()
        if len(f) >= 10 and os.path.exists(f"/sys/block/{f[2]}/device"):
            disk = (disk or 0) + (int(f[5]) + int(f[9])) * 512  # sectors read, written: 512 bytes each
    return {"t": time.time(), "net": net, "disk": disk}


def _shown(cmd):
    """A command line as a person reads it: the command clusterctl's session wrapper (remote/session.py:
    `printf ...clusterctl-sid...; exec </dev/null; eval 'CMD'`) runs, not the wrapper."""
    head, sep, tail = cmd.partition("; eval ")
    if sep and "clusterctl-sid" in head:
        try:
            return " ".join(shlex.split(tail)) or cmd
        except ValueError:
            return tail
    return cmd


def probe(threshold=1):
    procs = processes()
    mine = {os.getpid()}
    pid = os.getpid()
    while pid in procs and pid > 1:  # this probe, and what started it (the ssh command of the leader's check)
        pid = procs[pid][0]
        mine.add(pid)
    training, sessions = [], {}
    for pid, (_ppid, comm, cmd, _start, _faults, cgroup) in procs.items():
        if pid in mine or MARK in cmd or "system.slice" in cgroup:
            continue
        if TRAINING.match(comm):
            training.append(f"{comm}[{pid}] {cmd[:80]}".strip())
    for pid, (_ppid, comm, cmd, start, faults, _cgroup) in procs.items():
        if comm == "sshd" and "@" in cmd:  # "sshd: user@notty" / "sshd: user@pts/0": a logged-in session
            kids = [{"cmd": _shown(c)[:80], "own": MARK in c} for p, (pp, _, c, *_rest) in procs.items() if pp == pid]
            login = re.search(r"sshd: (\S+@(pts|tty)\S*)", cmd)  # a terminal: an interactive login
            sessions[f"{pid}:{start}"] = {"faults": faults, "children": kids, "login": login.group(1) if login else ""}
    return {
        "gpus": gpu_use(threshold),
        "training": sorted(training),
        "sessions": sessions,
        "jobs": [j for j in detached_jobs(procs) if j["pid"] not in mine],
        "io": io_counters(),
    }


def _rate(bytes_per_s):
    return f"{bytes_per_s / 1e6:.1f} MB/s" if bytes_per_s >= 1e6 else f"{bytes_per_s / 1e3:.0f} KB/s"


def throughput(pr, prev):
    """Bytes per second moved between two probes of one node: {"net": rate, "disk": rate}, a rate None when
    either probe lacks its counter (a counter that went down, a node rebooted: None too)."""
    now, then = pr.get("io") or {}, (prev or {}).get("io") or {}
    dt = (now.get("t") or 0) - (then.get("t") or 0)
    out = {}
    for kind in ("net", "disk"):
        a, b = then.get(kind), now.get(kind)
        out[kind] = (b - a) / dt if dt > 0 and a is not None and b is not None and b >= a else None
    return out


def busy_reasons(host, pr, prev, own, first, cfg=None):
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
        if floor is not None and rates[key] is not None and rates[key] > float(floor):
            reasons.append(f"{host}: {kind} {_rate(rates[key])} (above {_rate(float(floor))})")
    return reasons


# ---- leases: a long clusterctl operation (sync, launch) holds one while it runs ------------------------------
def _lease_path(d, lease_id):
    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,80}", lease_id or "") or lease_id.startswith("."):
        raise ValueError(f"bad lease id {lease_id!r}")
    return os.path.join(d, "leases", lease_id + ".json")


def take_lease(d, lease_id, seconds, what=""):
    """Busy until now + seconds; the operation renews it while it runs and releases it at its end (a lease
    of an operator that vanished expires by itself)."""
    path = _lease_path(d, lease_id)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_json(path, {"until": time.time() + float(seconds), "what": str(what)[:120]})


def release_lease(d, lease_id):
    try:
        os.unlink(_lease_path(d, lease_id))
    except FileNotFoundError:
        pass


def leases(d, now=None):
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


# ---- the cluster ---------------------------------------------------------------------------------------
def hosts_file(cfg):
    path = os.path.expanduser(f"~{cfg['user']}/hosts")
    try:
        with open(path) as f:
            return [line.split()[0] for line in f if line.strip() and not line.startswith("#")]
    except OSError:
        return []


def own_addresses():
    try:
        out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    return set(out.split()) | {socket.gethostname()}


def is_me(address):
    """An address of this node? (A datagram socket "connected" to a local address takes it as its source.)"""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((address, 9))
            return s.getsockname()[0] == address
    except OSError:
        return False


def answers(host, port=22, timeout=3.0):
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def ssh(cfg, host, command, timeout):
    argv = [
        "ssh",
        "-o",
        "BatchMode=yes",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "ConnectTimeout=5",
        "-o",
        "ServerAliveInterval=5",
        "-o",
        "ServerAliveCountMax=2",
        host,
        command,
    ]
    if os.geteuid() == 0 and cfg["user"] != "root":
        argv = ["runuser", "-u", cfg["user"], "--"] + argv
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as exc:
        return subprocess.CompletedProcess(argv, 255, "", str(exc))


def probe_members(cfg, members):
    """host -> probe of that member (None when it did not answer), all members at once."""
    result = {}
    script = cfg.get("script") or os.path.abspath(__file__)

    def one(host):
        r = ssh(cfg, host, f"{cfg['python']} {script} probe", timeout=60)
        try:
            result[host] = json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else None
        except (ValueError, IndexError):
            result[host] = None

    threads = [threading.Thread(target=one, args=(h,), daemon=True) for h in members]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    return result


def poweroff_command(cfg):
    if cfg["poweroff"] == "node-init":  # a namespace node: its PID 1 ends, and every process of it with it
        return "kill -TERM 1"
    return "shutdown -h now" if cfg["user"] == "root" else "sudo -n shutdown -h now"


def poweroff_self(cfg, d):
    if cfg["poweroff"] == "node-init":
        os.kill(1, signal.SIGTERM)
        return
    comm = (_read("/proc/1/comm") or b"").decode().strip()
    if comm == "sshd":  # PID 1 is sshd: a namespace node sharing the host's init; never shut that down
        log(d, "refusing to run shutdown: PID 1 is sshd (a namespace node); set poweroff to node-init")
        return
    subprocess.run(["shutdown", "-h", "now"], timeout=60)


# ---- deadlines ------------------------------------------------------------------------------------------
def boot_time():
    """When this machine booted (a cloud node: about when it was launched), or None."""
    try:
        with open("/proc/uptime") as f:
            return time.time() - float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def plan(cfg, last_active, started, now):
    """When the cluster stops and why: {"stop_at": epoch or None, "why": "idle-stop"|"max-lifetime"|None, ...}."""
    keep = cfg.get("keep_until") or 0
    out = {
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


def status(d):
    cfg = load_config(d)
    state = read_json(os.path.join(d, "state.json"), {}) or {}
    now = time.time()
    pid = state.get("pid")
    alive = (
        bool(pid)
        and os.path.exists(f"/proc/{pid}")
        and MARK in (_read(f"/proc/{pid}/cmdline") or b"").decode(errors="replace")
    )
    started = state.get("started_at") or now
    p = plan(cfg, state.get("last_active") or started, started, now)
    return {
        "config": cfg,
        "state": state,
        "running": alive,
        "now": now,
        "plan": p,
        "fired": read_json(os.path.join(d, "fired.json")),
    }


def _name_process():
    try:
        import ctypes

        ctypes.CDLL(None).prctl(15, b"cc-autostop", 0, 0, 0)  # PR_SET_NAME: never taken for a training process
    except Exception:
        pass


def idle_action(cfg):
    """What firing does: "stop" (disks kept) or "terminate"; a settings file from before the choice: terminate."""
    return "stop" if cfg.get("idle_action") == "stop" else "terminate"


def decide(cfg, reasons, last_active, last_reason, started, now):
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


def run(d):
    os.makedirs(d, exist_ok=True)
    started = time.time()
    last_active, last_reason = started, "the watchdog started"
    seen, own, first, leader_gone, failing = {}, set(), True, 0, {}
    cfg = load_config(d)
    log(
        d,
        f"started (pid {os.getpid()}): idle-stop {cfg.get('idle_stop')}s, max-lifetime {cfg.get('max_lifetime')}s, "
        f"enabled {cfg.get('enabled')}",
    )
    while True:
        cfg = load_config(d)
        now = time.time()
        hosts = hosts_file(cfg)
        mine = own_addresses()
        role = "alone"
        if hosts:
            if hosts[0] in mine or is_me(hosts[0]):
                role = "leader"
            elif answers(hosts[0]):
                role, leader_gone = "member", 0
            else:
                leader_gone += 1
                role = "member" if leader_gone < 3 else "alone"
        if not cfg.get("enabled", True) or role == "member":
            reasons = ["autostop is off" if not cfg.get("enabled", True) else f"the leader {hosts[0]} decides"]
            seen, first = {}, True  # sessions seen before a pause say nothing about activity after it
        else:
            here = probe(cfg.get("gpu_busy_percent", 1))
            label = f"{hosts[0]} (leader)" if role == "leader" else "this node"
            reasons = leases(d, now) + busy_reasons(label, here, seen.get("", {}), own, first, cfg)
            seen[""] = here
            members = [h for h in hosts[1:] if h not in mine] if role == "leader" else []
            probes = probe_members(cfg, members) if members else {}
            for host, pr in probes.items():
                if pr is None:  # up but not answering the check (load, a blip): busy, for one idle window at most
                    since = failing.setdefault(host, now)
                    if now - since < float(cfg.get("idle_stop") or 0) and answers(host):
                        reasons.append(f"{host}: did not answer the check since {int(now - since)}s")
                    continue
                failing.pop(host, None)
                reasons += busy_reasons(host, pr, seen.get(host, {}), own, first, cfg)
                seen[host] = pr
            first = False
        last_active, last_reason, p, why = decide(cfg, reasons, last_active, last_reason, started, now)
        write_json(
            os.path.join(d, "state.json"),
            {
                "pid": os.getpid(),
                "started_at": started,
                "checked_at": now,
                "last_active": last_active,
                "last_reason": last_reason,
                # what holds the cluster at this check (`status` says); nothing while off or a member
                "busy": [r[:200] for r in reasons[:20]] if role != "member" and cfg.get("enabled", True) else [],
                "role": role,
                "plan": p,
            },
        )
        if why is not None:
            fire(cfg, d, why, [h for h in hosts[1:] if h not in mine] if role == "leader" else [])
            return
        time.sleep(max(1, int(cfg.get("poll") or 30)))


def fire(cfg, d, why, members):
    log(d, f"firing: {why}")
    fired = {"at": time.time(), "reason": why, "cluster": cfg.get("cluster", ""), "action": idle_action(cfg)}
    write_json(os.path.join(d, "fired.json"), fired)
    if members:
        log(d, f"powering off {len(members)} member(s): {', '.join(members)}")
        threads = [threading.Thread(target=ssh, args=(cfg, h, poweroff_command(cfg), 20), daemon=True) for h in members]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    log(d, "powering off this node")
    poweroff_self(cfg, d)
    time.sleep(60)


def main(argv):
    if not argv or argv[0] not in ("run", "probe", "status", "keep", "off", "on", "lease", "release"):
        sys.stderr.write(__doc__)
        return 2
    cmd, args = argv[0], argv[1:]
    _name_process()  # probes on members too: never counted as someone's python process

    def opt(name):
        return args[args.index(name) + 1] if name in args and args.index(name) + 1 < len(args) else None

    d = opt("--dir")
    if cmd == "probe":
        print(json.dumps(probe()))
        return 0
    if d is None:
        sys.stderr.write(f"{cmd} needs --dir DIR\n")
        return 2
    if cmd == "run":
        run(d)
    elif cmd == "status":
        print(json.dumps(status(d), sort_keys=True))
    elif cmd in ("lease", "release"):
        try:
            if cmd == "lease":
                take_lease(d, opt("--id"), float(opt("--for")), opt("--what") or "")
            else:
                release_lease(d, opt("--id"))
        except (TypeError, ValueError) as exc:
            sys.stderr.write(f"{cmd}: {exc}\n")
            return 2
        print(json.dumps({"lease": opt("--id"), "held": cmd == "lease"}))
    elif cmd == "keep":
        seconds = float(opt("--for"))
        edit_config(d, keep_until=time.time() + seconds)
        log(d, f"keep: no stop before {int(seconds)}s from now", echo=False)
        print(json.dumps(status(d), sort_keys=True))
    else:
        changes = {"enabled": cmd == "on"}
        for flag, key in (("--idle-stop", "idle_stop"), ("--max-lifetime", "max_lifetime")):
            if opt(flag) is not None:  # seconds, or "none"
                changes[key] = None if opt(flag) == "none" else int(float(opt(flag)))
        edit_config(d, **changes)
        log(
            d,
            f"autostop turned {cmd}" + "".join(f", {k} {v}" for k, v in changes.items() if k != "enabled"),
            echo=False,
        )
        print(json.dumps(status(d), sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
