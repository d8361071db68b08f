"""The local provider's half of autostop: a per-cluster host-side supervisor.

A namespace node cannot delete its own namespaces, so `up` pairs the leader's watchdog (autostop/watchdog.py:
a detached process inside the leader node, settings in the node's ~/.clusterctl/autostop) with this
supervisor, `python -m clusterctl.providers.local supervise NAME`, started detached. It (re)starts the
watchdog whenever the leader's PID 1 (re)starts, as an init system would; when the watchdog fired
(fired.json) and the leader's PID 1 ended (its power-off), it tears the cluster down through the provider's
own stop (--idle-action stop: the nodes end, their homes are kept) or terminate (the same as `down`) and
writes why into the state record (status "stopped", its note says which). It exits when
the cluster's namespaces are gone; `down` stops it first.

Running supervisors are found by their command line. Versions before this module ran them as
`python -m clusterctl.autostop supervise NAME`: that argv is still recognised, so `down` and the
supervisor's own teardown stop an older version's supervisor too.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from clusterctl.autostop.watchdog import local_command, local_dir
from clusterctl.node.watchdog.activity import is_own
from clusterctl.node.watchdog.files import read_json
from clusterctl.proc import alive
from clusterctl.providers.base import Teardown
from clusterctl.providers.local import netns

if TYPE_CHECKING:
    from clusterctl.state import StateStore

ENTRY = "clusterctl.providers.local"  # `python -m` this package: its __main__ runs supervise()
OLD_ENTRY = "clusterctl.autostop"  # the argv of supervisors started by older versions


def _argv(name: str) -> list[str]:
    return [sys.executable, "-m", ENTRY, "supervise", name]


def supervisors(name: str) -> list[int]:
    """PIDs of the host-side supervisors of local cluster `name` (names are unique on a machine), this
    version's or an older one's."""
    wanted = [["-m", entry, "supervise", name] for entry in (ENTRY, OLD_ENTRY)]
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
        except OSError:
            continue
        if argv[1:] in wanted:
            found.append(int(entry))
    return found


def start_supervisor(store: StateStore, name: str) -> int:
    import clusterctl

    log = open(store.cluster_dir(name) / "autostop-supervisor.log", "ab")
    env = dict(
        os.environ,
        CLUSTERCTL_HOME=str(store.root),
        PYTHONPATH=os.pathsep.join(
            [str(Path(clusterctl.__file__).resolve().parent.parent), *filter(None, [os.environ.get("PYTHONPATH")])]
        ),
    )
    try:
        proc = subprocess.Popen(
            _argv(name),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env=env,
            cwd="/",
            start_new_session=True,
            close_fds=True,
        )
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
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.05)
    for pid in pids:
        if alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return pids


def node_init_pid(ns: str) -> int | None:
    """Host PID of the node's PID 1 once it is sshd (its mounts are in place by then)."""
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


def start_watchdog_in(init_pid: int, command: str) -> None:
    """The watchdog (`command`: autostop/watchdog.py's local_command) as a detached process inside the node of
    `init_pid` (reparented to its PID 1)."""
    inner = f"cd / && exec setsid -f {command} </dev/null >/dev/null 2>&1"
    subprocess.run(["nsenter", "-t", str(init_pid), "-a", "/bin/sh", "-c", inner], capture_output=True, timeout=30)


def watchdog_running(name: str) -> bool:
    """Whether the watchdog runs in the cluster's leader node (its own state holds the node's view of its pid:
    look among the leader's processes instead). What `status` asks of a local cluster."""
    return any(is_own(_cmdline(p)) for p in netns.netns_pids(netns.netns_name(name, 0)))


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


def _say(text: str) -> None:
    print(time.strftime("%Y-%m-%dT%H:%M:%S ") + text, flush=True)


def supervise(
    name: str,
    store: StateStore,
    terminate: Callable[[str], Teardown],
    stop_nodes: Callable[[str], Teardown] | None = None,
    poll: float = 0.5,
) -> int:
    """The host-side half of a local cluster's autostop (see the module's docstring). `terminate`, `stop_nodes`:
    the local provider's own (given by __main__, so this module does not import the provider that imports it);
    the watchdog's idle action (fired.json) picks one: stop keeps the nodes' homes."""
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
            return _power_off(store, name, ns, fired, terminate, stop_nodes)
        if (init is None or not alive(init)) and time.monotonic() - looked >= (2.0 if init is None else 0.0):
            looked = time.monotonic()  # a node without PID 1 (killed, rebooting) is looked for every 2s only
            now_init = node_init_pid(ns)
            if now_init is not None:
                _say(f"leader PID 1 is {now_init}: starting the watchdog in it")
                start_watchdog_in(now_init, local_command(store, name))
            init = now_init
        time.sleep(poll)
    _say("stopped")
    return 0


def _power_off(
    store: StateStore,
    name: str,
    ns: str,
    fired: Path,
    terminate: Callable[[str], Teardown],
    stop_nodes: Callable[[str], Teardown] | None,
) -> int:
    """The leader powered itself off (or is about to): stop the cluster (its homes kept) or remove it as `down`
    does, as the watchdog's idle action says; say why."""
    from clusterctl.errors import StateError
    from clusterctl.state import Record

    info = read_json(str(fired), {}) or {}
    reason = str(info.get("reason") or "the watchdog fired")
    _say(f"the watchdog fired: {reason}")
    deadline = time.monotonic() + 60  # it powers the members off first (bounded), then the leader
    while time.monotonic() < deadline and node_init_pid(ns) is not None:
        time.sleep(0.2)
    record = store.load(name) if store.exists(name) else None
    for _ in range(600):
        try:
            with store.lock(name):
                end = stop_nodes if stop_nodes is not None and info.get("action") == "stop" else terminate
                teardown = end(name)
                for line in teardown.removed:
                    _say(f"removed {line}")
                when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(info.get("at") or time.time())))
                if end is terminate:
                    note = f"terminated by autostop at {when} (the nodes' homes are gone): {reason}"
                else:
                    note = f"stopped by autostop at {when} (the nodes' homes kept: `clusterctl start {name}` starts it "
                    note += f"again): {reason}"
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
