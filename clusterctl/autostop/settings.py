"""Autostop: a cluster that nobody uses stops itself, independent of the laptop that made it.

The watchdog is templates/idle_watchdog.py (stdlib only), the one source of truth for the settings file,
the activity rules and the deadlines; this module loads it for the same functions on this machine.

  * AWS: the user data installs it on every node as the systemd unit clusterctl-autostop, with its
    settings in /var/lib/clusterctl/autostop/config.json. It decides on the leader (asking every member
    over ssh with the cluster's internal key) and its `shutdown -h now` terminates each instance, since
    instances are launched with instance-initiated shutdown = terminate.
  * local: a namespace node cannot delete its own namespaces, so the local provider pairs the watchdog
    (a detached process inside the leader node, settings in the node's ~/.clusterctl/autostop) with a
    per-cluster host-side supervisor, `python -m clusterctl.autostop supervise NAME`, started detached by
    `up`. The supervisor (re)starts the watchdog whenever the leader's PID 1 (re)starts, as an init system
    would; when the watchdog fired (fired.json) and the leader's PID 1 ended (its power-off), it tears the
    cluster down through the provider's own terminate (the same as `down`) and writes why into the state
    record (status "stopped"). It exits when the cluster's namespaces are gone; `down` stops it first.
"""

from __future__ import annotations

import base64
import getpass
import gzip
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Callable

from clusterctl.errors import UsageError
from clusterctl.types import Autostop
from clusterctl.units import duration

SCRIPT = "idle_watchdog.py"
AWS_DIR = "/var/lib/clusterctl/autostop"
AWS_SCRIPT = "/opt/clusterctl/idle_watchdog.py"
AWS_UNIT = "clusterctl-autostop.service"
LOCAL_NODE_DIR = "/root/.clusterctl/autostop"  # inside a local node (its /root is the node's own home)
NODE_PYTHON = "/usr/bin/python3"  # Debian's/Ubuntu's own: readable by any login user, present on the DLAMI
DEFAULT_IDLE = "60m"

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


# ---- durations -----------------------------------------------------------------------------------
def parse_duration(text: str | None, flag: str, allow_off: bool = True) -> int | None:
    """'20s', '30m', '12h', '2d', '1h30m' -> seconds; 'off'/'none'/'0' -> None (when allowed)."""
    t = (text or "").strip().lower()
    if allow_off and t in ("off", "none", "no", "0", "never"):
        return None
    if not re.fullmatch(r"(\d+(\.\d+)?[smhd])+", t):
        raise UsageError(f"{flag} {text!r} is not a duration",
                         "give one like 20s, 30m, 12h or 1h30m" + (", or off" if allow_off else ""))
    seconds = sum(float(n) * _UNITS[u] for n, _, u in re.findall(r"(\d+(\.\d+)?)([smhd])", t))
    if seconds < 1:
        raise UsageError(f"{flag} {text!r} is shorter than a second")
    return int(seconds)


def settings(idle_stop: str | None, max_lifetime: str | None) -> Autostop:
    return Autostop(parse_duration(idle_stop if idle_stop is not None else DEFAULT_IDLE, "--idle-stop"),
                    parse_duration(max_lifetime, "--max-lifetime") if max_lifetime else None)


def describe(a: Autostop | None) -> str:
    if a is None or not a.enabled:
        return "off: the cluster runs until `clusterctl down`"
    parts = []
    if a.idle_stop_s:
        parts.append(f"after {duration(a.idle_stop_s)} with nothing busy (no GPU in use, no training process, no ssh "
                     "command, no sync or launch of clusterctl running)")
    if a.max_lifetime_s:
        parts.append(f"at the latest {duration(a.max_lifetime_s)} after it was made")
    return "stops itself " + ", and ".join(parts) + " (`clusterctl keep NAME --for 4h` extends)"


def poll_seconds(a: Autostop) -> int:
    shortest = min(x for x in (a.idle_stop_s, a.max_lifetime_s) if x) if a.enabled else 600
    return max(1, min(60, shortest // 10))  # a tenth of the limit: 2s for 20s, a minute for an hour or more


def extra(a: Autostop | None) -> dict[str, str]:
    """The settings as Cluster.extra facts (kept in the local record)."""
    if a is None:
        return {}
    return {"autostop_idle_stop": str(a.idle_stop_s or ""), "autostop_max_lifetime": str(a.max_lifetime_s or "")}


def from_extra(extra) -> Autostop | None:
    if "autostop_idle_stop" not in extra:
        return None
    num = lambda v: int(v) if str(v).isdigit() else None  # noqa: E731
    return Autostop(num(extra.get("autostop_idle_stop")), num(extra.get("autostop_max_lifetime")))


# ---- the watchdog template ------------------------------------------------------------------------------
_MODULE: ModuleType | None = None


def watchdog() -> ModuleType:
    """templates/idle_watchdog.py as a module (its settings, rules and deadlines are the only ones)."""
    global _MODULE
    if _MODULE is None:
        from clusterctl import resources

        path = resources.template_path(SCRIPT)
        module = ModuleType("clusterctl_idle_watchdog")
        module.__file__ = str(path)
        # compiled here, not imported: no __pycache__ appears among the shipped templates
        exec(compile(path.read_text(), str(path), "exec"), module.__dict__)  # noqa: S102 (our own template)
        _MODULE = module
    return _MODULE


def node_config(cluster: str, a: Autostop, *, poweroff: str, user: str, script: str,
                created_at: float | None) -> dict:
    return {"cluster": cluster, "enabled": a.enabled, "idle_stop": a.idle_stop_s, "max_lifetime": a.max_lifetime_s,
            "keep_until": None, "created_at": created_at, "poll": poll_seconds(a), "poweroff": poweroff,
            "user": user, "python": NODE_PYTHON, "script": script, "gpu_busy_percent": 1}


# ---- AWS: the user data's part ---------------------------------------------------------------------------
UNIT_TEXT = f"""[Unit]
Description=clusterctl autostop: power off when idle (--idle-stop) or too old (--max-lifetime)
After=network-online.target
Wants=network-online.target

[Service]
ExecStart={NODE_PYTHON} {AWS_SCRIPT} run --dir {AWS_DIR}
Restart=always
RestartSec=15

[Install]
WantedBy=multi-user.target
"""


def cloud_init(cluster: str, a: Autostop, user: str) -> dict:
    """What the user data writes (script gzip+base64, settings, unit). No launch time in it: the same
    spec renders the same bytes (a RunInstances retried with its ClientToken must not differ); the
    watchdog counts --max-lifetime from the node's boot."""
    from clusterctl import resources

    script = resources.template_bytes(SCRIPT)
    cfg = node_config(cluster, a, poweroff="shutdown", user=user, script=AWS_SCRIPT, created_at=None)
    return {"script_gz_b64": base64.b64encode(gzip.compress(script, mtime=0)).decode(), "script_path": AWS_SCRIPT,
            "config_path": f"{AWS_DIR}/config.json", "config_json": json.dumps(cfg, sort_keys=True) + "\n",
            "unit_path": f"/etc/systemd/system/{AWS_UNIT}", "unit": UNIT_TEXT, "unit_name": AWS_UNIT}


def remote_command(action: str, *args: str) -> str:
    """The watchdog's own command on a cloud node (root through sudo for the login user). It carries the
    script's name, so the watchdog never counts it as activity."""
    import shlex

    argv = " ".join(shlex.quote(x) for x in (NODE_PYTHON, AWS_SCRIPT, action, "--dir", AWS_DIR, *args))
    return (f"if [ \"$(id -u)\" = 0 ]; then S=; else S='sudo -n'; fi; "
            f"if [ ! -f {AWS_SCRIPT} ]; then echo 'no autostop watchdog on this node' >&2; exit 3; fi; $S {argv}")


# ---- local: files on this machine, the supervisor ---------------------------------------------------------
def local_dir(store, name: str, index: int = 0) -> Path:
    """A local node's autostop folder, seen from the host (the node's home is a folder of the state dir)."""
    return store.cluster_dir(name) / "nodes" / str(index) / "home" / ".clusterctl" / "autostop"


def install_local(store, name: str, nodes: int, a: Autostop, created_at: float) -> None:
    """The script and its settings in every node's home (only the leader runs it; members answer probes)."""
    from clusterctl import resources

    script = resources.template_bytes(SCRIPT)
    cfg = node_config(name, a, poweroff="node-init", user="root", script=f"{LOCAL_NODE_DIR}/{SCRIPT}",
                      created_at=created_at)
    for i in range(nodes):
        d = local_dir(store, name, i)
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
        (d / SCRIPT).write_bytes(script)
        os.chmod(d / SCRIPT, 0o755)
        watchdog().write_json(str(d / "config.json"), cfg)


def _supervisor_argv(name: str) -> list[str]:
    return [sys.executable, "-m", "clusterctl.autostop", "supervise", name]


def supervisors(name: str) -> list[int]:
    """PIDs of the host-side supervisors of local cluster `name` (names are unique on a machine)."""
    want = ["-m", "clusterctl.autostop", "supervise", name]
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
        except OSError:
            continue
        if argv[1:] == want:
            found.append(int(entry))
    return found


def start_supervisor(store, name: str) -> int:
    import clusterctl

    log = open(store.cluster_dir(name) / "autostop-supervisor.log", "ab")
    env = dict(os.environ, CLUSTERCTL_HOME=str(store.root),
               PYTHONPATH=os.pathsep.join([str(Path(clusterctl.__file__).resolve().parent.parent),
                                           *filter(None, [os.environ.get("PYTHONPATH")])]))
    try:
        proc = subprocess.Popen(_supervisor_argv(name), stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
                                cwd="/", start_new_session=True, close_fds=True)
    finally:
        log.close()
    return proc.pid


def stop_supervisor(name: str, timeout: float = 5.0) -> list[int]:
    """Stop the cluster's supervisor (not this process, when the supervisor itself tears down)."""
    pids = [p for p in supervisors(name) if p != os.getpid()]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.05)
    for pid in pids:
        if _alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return pids


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    if stat.rsplit(")", 1)[1].split()[0] == "Z":
        try:
            os.waitpid(pid, os.WNOHANG)  # our own child (in-process use): reap it
        except ChildProcessError:
            pass
        return False
    return True


def node_init_pid(ns: str) -> int | None:
    """Host PID of the node's PID 1 once it is sshd (its mounts are in place by then)."""
    from clusterctl.providers.local import netns

    for pid in netns.netns_pids(ns):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        nspid = next((line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:")), [])
        if nspid and nspid[-1] == "1":
            try:
                if Path(f"/proc/{pid}/comm").read_text().strip() == "sshd":
                    return pid
            except OSError:
                pass
    return None


def start_watchdog_in(init_pid: int) -> None:
    """The watchdog as a detached process inside the node of `init_pid` (reparented to its PID 1)."""
    script = f"{LOCAL_NODE_DIR}/{SCRIPT}"
    inner = (f"cd / && exec setsid -f {NODE_PYTHON} {script} run --dir {LOCAL_NODE_DIR} "
             "</dev/null >/dev/null 2>&1")
    subprocess.run(["nsenter", "-t", str(init_pid), "-a", "/bin/sh", "-c", inner], capture_output=True, timeout=30)


def _say(text: str) -> None:
    print(time.strftime("%Y-%m-%dT%H:%M:%S ") + text, flush=True)


def supervise(name: str, poll: float = 0.5) -> int:
    """The host-side half of a local cluster's autostop (see the module's docstring)."""
    from clusterctl.providers.local import netns
    from clusterctl.cluster.state import StateStore

    store = StateStore()
    ns = netns.netns_name(name, 0)
    fired = local_dir(store, name) / "fired.json"
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    init: int | None = None
    looked = 0.0
    _say(f"supervising local cluster {name} (pid {os.getpid()})")
    while not stop["now"]:
        if not (Path("/run/netns") / ns).exists():
            _say("the cluster's namespaces are gone; nothing to supervise")
            return 0
        if fired.exists():
            return _power_off(store, name, ns, fired)
        if (init is None or not _alive(init)) and time.monotonic() - looked >= (2.0 if init is None else 0.0):
            looked = time.monotonic()  # a node without PID 1 (killed, rebooting) is looked for every 2s only
            now_init = node_init_pid(ns)
            if now_init is not None:
                _say(f"leader PID 1 is {now_init}: starting the watchdog in it")
                start_watchdog_in(now_init)
            init = now_init
        time.sleep(poll)
    _say("stopped")
    return 0


def _power_off(store, name: str, ns: str, fired: Path) -> int:
    """The leader powered itself off (or is about to): remove the cluster as `down` does, say why."""
    from clusterctl.errors import StateError
    from clusterctl.providers.local.provider import LocalProvider
    from clusterctl.cluster.state import Record

    info = watchdog().read_json(str(fired), {}) or {}
    reason = str(info.get("reason") or "the watchdog fired")
    _say(f"the watchdog fired: {reason}")
    deadline = time.monotonic() + 60  # it powers the members off first (bounded), then the leader
    while time.monotonic() < deadline and node_init_pid(ns) is not None:
        time.sleep(0.2)
    record = store.load(name) if store.exists(name) else None
    for _ in range(600):
        try:
            with store.lock(name):
                teardown = LocalProvider(store).terminate(name)
                for line in teardown.removed:
                    _say(f"removed {line}")
                when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(info.get("at") or time.time())))
                note = f"stopped by autostop at {when}: {reason}"
                if not teardown.clean:
                    note += f" (left: {'; '.join(teardown.left)}; run `clusterctl down {name} --yes`)"
                if record is not None:
                    store.save(Record(record.cluster, "stopped", time.time(), note))
                _say(note)
                return 0 if teardown.clean else 1
        except StateError:  # a `down` or `up` holds the cluster: it will finish the job, or we retry
            if not (Path("/run/netns") / ns).exists():
                return 0
            time.sleep(0.2)
    return 1


# ---- what `status` shows ----------------------------------------------------------------------------------
def local_status(store, name: str) -> dict | None:
    from clusterctl.providers.local import netns

    d = local_dir(store, name)
    if not (d / "config.json").exists():
        return None
    st = watchdog().status(str(d))
    # the state's pid is the node's own view: look for the watchdog among the leader node's processes instead
    st["running"] = any(SCRIPT in _cmdline(p) for p in netns.netns_pids(netns.netns_name(name, 0)))
    return st


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


def edit_local(store, name: str, nodes: int, **changes) -> None:
    for i in range(nodes):
        d = local_dir(store, name, i)
        if (d / "config.json").exists():
            watchdog().edit_config(str(d), **changes)


def remote_status(cluster, store, timeout: float = 20.0) -> dict | None:
    """The leader's watchdog status over ssh (a fresh connection, not the agent's: it must not look like
    activity), or None when it does not answer."""
    from clusterctl.cluster import provision
    from clusterctl.remote.ssh import SshPool

    target = provision.ssh_targets(cluster, store)[0]
    with SshPool(provision.ssh_settings(cluster, store, connect_timeout=5.0)) as pool:
        r = pool.run_one(target, remote_command("status"), timeout=timeout)
    try:
        return json.loads(r.stdout.strip().splitlines()[-1]) if r.ok else None
    except (ValueError, IndexError):
        return None


def status_lines(store, record) -> list[str]:
    """What `status` says about autostop for a cluster with a local record."""
    c = record.cluster
    if record.status == "stopped" and record.note:
        return [f"autostop: {record.note}"]
    if c.provider == "local":
        return summary(local_status(store, c.name), from_extra(c.extra), c.created_at)
    try:
        st = remote_status(c, store)
    except Exception:  # unreachable, keys gone ...: say what is known from the settings
        st = None
    return summary(st, from_extra(c.extra), c.created_at)


def change(store, record, action: str, **values) -> list[str]:
    """keep / off / on on every node of the cluster; returns one line per node that did not take it.
    values: seconds (keep), idle_stop / max_lifetime (on: seconds, or None to clear)."""
    c = record.cluster
    if action == "keep":
        changes: dict = {"keep_until": time.time() + float(values["seconds"])}
        args = ("--for", str(int(values["seconds"])))
    else:
        changes = {"enabled": action == "on"}
        args = ()
        for key, flag in (("idle_stop", "--idle-stop"), ("max_lifetime", "--max-lifetime")):
            if key in values:
                changes[key] = values[key]
                args += (flag, "none" if values[key] is None else str(int(values[key])))
    if c.provider == "local":
        if local_status(store, c.name) is None:
            return [f"{c.name}: no autostop watchdog on this cluster (it was brought up without one)"]
        edit_local(store, c.name, len(c.nodes), **changes)
        return []
    from clusterctl.cluster import provision
    from clusterctl.remote.ssh import SshPool

    with SshPool(provision.ssh_settings(c, store, connect_timeout=10.0)) as pool:
        report = pool.run(provision.ssh_targets(c, store), remote_command(action, *args), timeout=60)
    return [f"{r.host}: {r.error or (r.stderr.strip() or r.stdout.strip())[-200:] or f'exit {r.exit_code}'}"
            for r in report if not r.ok]


# ---- leases: long operations keep the cluster up while they run --------------------------------------------
LEASE_TTL = 600.0  # a lease outlives its operator by at most this (a laptop closed mid-sync); renewed every third


@contextmanager
def lease(store, cluster, what: str, ttl: float = LEASE_TTL, warn: Callable[[str], None] | None = None):
    """Hold an autostop lease on `cluster` (a Cluster of a record, or None for a plain hosts file: nothing to
    hold) while the block runs: the watchdog counts it as activity. Renewed in the background, released at the
    end whatever happens; a node that does not take it is a warning, never a failure of the operation."""
    if cluster is None or from_extra(cluster.extra) is None:
        yield None
        return
    lease_id = f"{re.sub(r'[^A-Za-z0-9_.-]', '-', what)[:20]}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    text = f"clusterctl {what} from {owner()}"
    stop = threading.Event()

    def hold(take: bool) -> None:
        try:
            failed = _lease_all(store, cluster, lease_id, ttl if take else None, text)
        except Exception as exc:  # noqa: BLE001  (unreachable leader, keys gone: the operation goes on)
            failed = [f"{cluster.name}: {exc}"]
        if failed and warn is not None:
            warn(f"autostop lease for this {what} not {'taken' if take else 'released'} on: {'; '.join(failed)[:300]}")

    def renew() -> None:
        while not stop.wait(ttl / 3):
            hold(True)

    hold(True)
    renewer = threading.Thread(target=renew, name="autostop-lease", daemon=True)
    renewer.start()
    try:
        yield lease_id
    finally:
        stop.set()
        renewer.join(30)
        hold(False)


def _lease_all(store, cluster, lease_id: str, seconds: float | None, what: str) -> list[str]:
    """Take (seconds) or release (None) a lease on every node's watchdog; one line per node that did not."""
    if cluster.provider == "local":
        for i in range(len(cluster.nodes)):
            d = str(local_dir(store, cluster.name, i))
            if not os.path.exists(os.path.join(d, "config.json")):
                continue
            if seconds is None:
                watchdog().release_lease(d, lease_id)
            else:
                watchdog().take_lease(d, lease_id, seconds, what)
        return []
    from clusterctl.cluster import provision
    from clusterctl.remote.ssh import SshPool

    args = ("--id", lease_id) + (("--for", str(int(seconds)), "--what", what) if seconds is not None else ())
    with SshPool(provision.ssh_settings(cluster, store, connect_timeout=10.0)) as pool:
        report = pool.run(provision.ssh_targets(cluster, store),
                          remote_command("lease" if seconds is not None else "release", *args), timeout=60)
    return [f"{r.host}: {r.error or (r.stderr.strip() or r.stdout.strip())[-200:] or f'exit {r.exit_code}'}"
            for r in report if not r.ok]


def summary(st: dict | None, fallback: Autostop | None = None, created_at: float | None = None,
            now: float | None = None) -> list[str]:
    """Lines for `status`: when the cluster stops and why, from the watchdog's own status (or, when the
    leader did not answer, from the settings alone)."""
    now = now or time.time()
    if st is None:
        if fallback is None:
            return ["autostop: no watchdog on this cluster"]
        if not fallback.enabled:
            return ["autostop: off"]
        lines = [f"autostop: idle-stop {duration(fallback.idle_stop_s) if fallback.idle_stop_s else 'off'}"
                 + (f", max lifetime {duration(fallback.max_lifetime_s)}" if fallback.max_lifetime_s else "")
                 + " (the leader's watchdog did not answer: time left unknown)"]
        if fallback.max_lifetime_s and created_at:
            lines.append(f"autostop: stops at the latest in {duration(created_at + fallback.max_lifetime_s - now)} "
                         "(max lifetime)")
        return lines
    cfg, state, plan = st.get("config", {}), st.get("state", {}), st.get("plan", {})
    if st.get("fired"):
        return [f"autostop: fired: {st['fired'].get('reason')}"]
    if not cfg.get("enabled", True):
        return ["autostop: OFF: the cluster runs (and costs) until `clusterctl down` "
                "(`clusterctl autostop NAME --on` turns it back on)"]
    if not st.get("running"):
        lines = ["autostop: the watchdog is not running on the leader"]
    elif plan.get("stop_at") is None:
        return ["autostop: no limits set (`clusterctl autostop NAME --idle-stop 30m` sets one)"]
    else:
        left = plan["stop_at"] - st.get("now", now)
        if plan.get("why") == "idle-stop":
            lines = [f"autostop: stops in {duration(left)} if nothing runs (idle-stop {duration(cfg.get('idle_stop'))}, "
                     f"idle for {duration(plan.get('idle_for'))})"]
        else:
            lines = [f"autostop: stops in {duration(left)} (max lifetime {duration(cfg.get('max_lifetime'))})"]
    if state.get("last_reason"):
        lines.append(f"autostop: last activity {duration(now - (state.get('last_active') or now))} ago: "
                     f"{state['last_reason']}")
    if cfg.get("keep_until") and cfg["keep_until"] > now:
        lines.append(f"autostop: kept until {time.strftime('%Y-%m-%d %H:%M', time.localtime(cfg['keep_until']))}")
    if plan.get("why") == "idle-stop" and plan.get("lifetime_at"):
        lines.append(f"autostop: max lifetime ends in {duration(plan['lifetime_at'] - now)}")
    return lines


def owner() -> str:
    """Who made a resource (the `clusterctl:owner` tag): user@host of this machine."""
    try:
        user = getpass.getuser()
    except Exception:
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}"[:200]


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "supervise":
        from clusterctl.cluster.state import validate_name

        return supervise(validate_name(argv[1]))
    sys.stderr.write("usage: python -m clusterctl.autostop supervise NAME\n")
    return 2

