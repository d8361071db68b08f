"""Autostop's watchdog: a cluster that nobody uses stops itself, independent of the laptop that made it.

The watchdog is the node package's `watchdog` program (node/watchdog/, stdlib only), the one source of truth
for the settings file, the activity rules and the deadlines; this module imports it for the same functions on
this machine, and writes what the nodes run.

  * AWS: the user data writes the program (its files alone, unpacked: remote/nodepkg.py) into /opt/clusterctl/
    autostop on every node and runs it as the systemd unit clusterctl-autostop, with its settings in
    /var/lib/clusterctl/autostop/config.json. It decides on the leader (asking every member
    over ssh with the cluster's internal key) and its `shutdown -h now` stops or terminates each instance,
    as the instance-initiated shutdown behaviour set at launch says (--idle-action: stop or terminate).
  * local: a namespace node cannot delete its own namespaces, so the local provider pairs the watchdog
    (the node package's, a detached process inside the leader node, settings in the node's
    ~/.clusterctl/autostop) with a
    per-cluster host-side supervisor (providers/local/supervisor.py) that restarts it and, once it fired,
    stops the cluster (its namespaces end, the nodes' homes are kept) or tears it down (--idle-action).
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Iterable
from pathlib import Path

from clusterctl.autostop.settings import poll_seconds
from clusterctl.node.watchdog.activity import OLD_SCRIPT, PROGRAM
from clusterctl.node.watchdog.files import edit_config, load_config, write_json
from clusterctl.state import StateStore
from clusterctl.types import Autostop

AWS_DIR = "/var/lib/clusterctl/autostop"
AWS_PROGRAM = "/opt/clusterctl/autostop"  # the watchdog's files, unpacked: `python3 FOLDER watchdog ...` runs it
AWS_OLD_SCRIPT = f"/opt/clusterctl/{OLD_SCRIPT}"  # on a node an older version brought up
AWS_UNIT = "clusterctl-autostop.service"
LOCAL_NODE_DIR = "/root/.clusterctl/autostop"  # inside a local node (its /root is the node's own home)
LOCAL_HOME = "/root"  # a local node's login home, where the node package is (remote/nodepkg.py)
NODE_PYTHON = "/usr/bin/python3"  # Debian's/Ubuntu's own: readable by any login user, present on the DLAMI


def node_config(
    cluster: str, a: Autostop, *, poweroff: str, user: str, script: str, created_at: float | None
) -> dict[str, object]:
    return {
        "cluster": cluster,
        "enabled": a.enabled,
        "idle_stop": a.idle_stop_s,
        "max_lifetime": a.max_lifetime_s,
        "keep_until": None,
        "created_at": created_at,
        "poll": poll_seconds(a),
        "poweroff": poweroff,
        "user": user,
        "python": NODE_PYTHON,
        "script": script,
        "gpu_busy_percent": 1,
        "idle_action": a.idle_action,
        # a namespace node shares this machine's disks: their traffic is anyone's, so it never counts there
        **({"disk_busy_bytes_per_s": None} if poweroff == "node-init" else {}),
    }


# ---- AWS: the user data's part ---------------------------------------------------------------------------
UNIT_TEXT = f"""[Unit]
Description=clusterctl autostop: power off when idle (--idle-stop) or too old (--max-lifetime)
After=network-online.target
Wants=network-online.target

[Service]
ExecStart={NODE_PYTHON} {AWS_PROGRAM} {PROGRAM} run --dir {AWS_DIR}
Restart=always
RestartSec=15

[Install]
WantedBy=multi-user.target
"""


def cloud_init(cluster: str, a: Autostop, user: str) -> dict[str, object]:
    """What the user data writes (the program's files as text, settings, unit). No launch time in it: the same
    spec renders the same bytes (a RunInstances retried with its ClientToken must not differ); the
    watchdog counts --max-lifetime from the node's boot."""
    from clusterctl.remote import nodepkg

    cfg = node_config(cluster, a, poweroff="shutdown", user=user, script=AWS_PROGRAM, created_at=None)
    files = nodepkg.entries(program=PROGRAM)
    return {
        "files": [{"path": f"{AWS_PROGRAM}/{name}", "content": data.decode()} for name, data in files.items()],
        "config_path": f"{AWS_DIR}/config.json",
        "config_json": json.dumps(cfg, sort_keys=True) + "\n",
        "unit_path": f"/etc/systemd/system/{AWS_UNIT}",
        "unit": UNIT_TEXT,
        "unit_name": AWS_UNIT,
    }


def remote_command(action: str, *args: str) -> str:
    """The watchdog's own command on a cloud node (root through sudo for the login user), or its older
    version's where a node has that. It carries the program's words, so the watchdog never counts it as
    activity."""
    rest = " ".join(shlex.quote(x) for x in (action, "--dir", AWS_DIR, *args))
    return (
        f"if [ \"$(id -u)\" = 0 ]; then S=; else S='sudo -n'; fi; "
        f"if [ -f {AWS_PROGRAM}/__main__.py ]; then $S {NODE_PYTHON} {AWS_PROGRAM} {PROGRAM} {rest}; "
        f"elif [ -f {AWS_OLD_SCRIPT} ]; then $S {NODE_PYTHON} {AWS_OLD_SCRIPT} {rest}; "
        "else echo 'no autostop watchdog on this node' >&2; exit 3; fi"
    )


# ---- local: the nodes' files, seen from this machine ---------------------------------------------------------
def local_dir(store: StateStore, name: str, index: int = 0) -> Path:
    """A local node's autostop folder, seen from the host (the node's home is a folder of the state dir)."""
    return store.cluster_dir(name) / "nodes" / str(index) / "home" / ".clusterctl" / "autostop"


def install_local(store: StateStore, name: str, indices: Iterable[int], a: Autostop, created_at: float) -> None:
    """The node package and the watchdog's settings in the homes of these nodes (only the leader runs it;
    members answer probes): the package where shipping it would put it, so a node that has it has it once."""
    from clusterctl.remote import nodepkg

    pkg = nodepkg.package()
    cfg = node_config(name, a, poweroff="node-init", user="root", script=pkg.at(LOCAL_HOME), created_at=created_at)
    for i in indices:
        d = local_dir(store, name, i)
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
        _forget_firing(d)
        archive = d.parent.parent / pkg.path  # the node's home / .clusterctl/node/NAME
        if not _holds(archive, pkg.data):  # written whole under another name, as shipping does
            archive.parent.mkdir(parents=True, exist_ok=True)
            partial = archive.with_name(f"{archive.name}.tmp{os.getpid()}")
            partial.write_bytes(pkg.data)
            os.replace(partial, archive)
        write_json(str(d / "config.json"), cfg)


def _forget_firing(d: Path) -> None:
    for old in ("fired.json", "state.json"):  # a stopped cluster started again: its last firing is history
        (d / old).unlink(missing_ok=True)


def restart_local(store: StateStore, name: str, indices: Iterable[int], started_at: float) -> bool:
    """A stopped local cluster started again (`start`): the settings its homes kept (an `autostop --off` too),
    its last firing forgotten, --max-lifetime counted from now (a started instance's watchdog counts from its
    boot). False when the cluster has no watchdog."""
    found = False
    for i in indices:
        d = local_dir(store, name, i)
        if (d / "config.json").exists():
            _forget_firing(d)
            edit_config(str(d), created_at=started_at)
            found = True
    return found


def _holds(path: Path, data: bytes) -> bool:
    """The file at path is these bytes (a local node's package is trusted by its bytes, never by its name)."""
    try:
        return path.stat().st_size == len(data) and path.read_bytes() == data
    except OSError:
        return False


def local_command(store: StateStore, name: str) -> str:
    """The leader's `watchdog run`, as its settings say (the python and the package install_local wrote)."""
    cfg = load_config(str(local_dir(store, name)))
    return shlex.join([cfg["python"], cfg["script"], PROGRAM, "run", "--dir", LOCAL_NODE_DIR])


def edit_local(store: StateStore, name: str, nodes: int, **changes: object) -> None:
    for i in range(nodes):
        d = local_dir(store, name, i)
        if (d / "config.json").exists():
            edit_config(str(d), **changes)
