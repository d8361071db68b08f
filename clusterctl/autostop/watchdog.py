"""Autostop's watchdog: a cluster that nobody uses stops itself, independent of the laptop that made it.

The watchdog is templates/idle_watchdog.py (stdlib only), the one source of truth for the settings file,
the activity rules and the deadlines; this module loads it for the same functions on this machine, and
writes what the nodes run.

  * AWS: the user data installs it on every node as the systemd unit clusterctl-autostop, with its
    settings in /var/lib/clusterctl/autostop/config.json. It decides on the leader (asking every member
    over ssh with the cluster's internal key) and its `shutdown -h now` stops or terminates each instance,
    as the instance-initiated shutdown behaviour set at launch says (--idle-action: stop or terminate).
  * local: a namespace node cannot delete its own namespaces, so the local provider pairs the watchdog
    (a detached process inside the leader node, settings in the node's ~/.clusterctl/autostop) with a
    per-cluster host-side supervisor (providers/local/supervisor.py) that restarts it and, once it fired,
    stops the cluster (its namespaces end, the nodes' homes are kept) or tears it down (--idle-action).
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import shlex
from pathlib import Path
from types import ModuleType

from clusterctl.autostop.settings import poll_seconds
from clusterctl.state import StateStore
from clusterctl.types import Autostop

SCRIPT = "idle_watchdog.py"
AWS_DIR = "/var/lib/clusterctl/autostop"
AWS_SCRIPT = "/opt/clusterctl/idle_watchdog.py"
AWS_UNIT = "clusterctl-autostop.service"
LOCAL_NODE_DIR = "/root/.clusterctl/autostop"  # inside a local node (its /root is the node's own home)
NODE_PYTHON = "/usr/bin/python3"  # Debian's/Ubuntu's own: readable by any login user, present on the DLAMI

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
        exec(compile(path.read_text(), str(path), "exec"), module.__dict__)  # our own template
        _MODULE = module
    return _MODULE


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
ExecStart={NODE_PYTHON} {AWS_SCRIPT} run --dir {AWS_DIR}
Restart=always
RestartSec=15

[Install]
WantedBy=multi-user.target
"""


def cloud_init(cluster: str, a: Autostop, user: str) -> dict[str, str]:
    """What the user data writes (script gzip+base64, settings, unit). No launch time in it: the same
    spec renders the same bytes (a RunInstances retried with its ClientToken must not differ); the
    watchdog counts --max-lifetime from the node's boot."""
    from clusterctl import resources

    script = resources.template_bytes(SCRIPT)
    cfg = node_config(cluster, a, poweroff="shutdown", user=user, script=AWS_SCRIPT, created_at=None)
    return {
        "script_gz_b64": base64.b64encode(gzip.compress(script, mtime=0)).decode(),
        "script_path": AWS_SCRIPT,
        "config_path": f"{AWS_DIR}/config.json",
        "config_json": json.dumps(cfg, sort_keys=True) + "\n",
        "unit_path": f"/etc/systemd/system/{AWS_UNIT}",
        "unit": UNIT_TEXT,
        "unit_name": AWS_UNIT,
    }


def remote_command(action: str, *args: str) -> str:
    """The watchdog's own command on a cloud node (root through sudo for the login user). It carries the
    script's name, so the watchdog never counts it as activity."""
    argv = " ".join(shlex.quote(x) for x in (NODE_PYTHON, AWS_SCRIPT, action, "--dir", AWS_DIR, *args))
    return (
        f"if [ \"$(id -u)\" = 0 ]; then S=; else S='sudo -n'; fi; "
        f"if [ ! -f {AWS_SCRIPT} ]; then echo 'no autostop watchdog on this node' >&2; exit 3; fi; $S {argv}"
    )


# ---- local: the nodes' files, seen from this machine ---------------------------------------------------------
def local_dir(store: StateStore, name: str, index: int = 0) -> Path:
    """A local node's autostop folder, seen from the host (the node's home is a folder of the state dir)."""
    return store.cluster_dir(name) / "nodes" / str(index) / "home" / ".clusterctl" / "autostop"


def install_local(store: StateStore, name: str, nodes: int, a: Autostop, created_at: float) -> None:
    """The script and its settings in every node's home (only the leader runs it; members answer probes)."""
    from clusterctl import resources

    script = resources.template_bytes(SCRIPT)
    cfg = node_config(
        name, a, poweroff="node-init", user="root", script=f"{LOCAL_NODE_DIR}/{SCRIPT}", created_at=created_at
    )
    for i in range(nodes):
        d = local_dir(store, name, i)
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
        for old in ("fired.json", "state.json"):  # a stopped cluster started again: its last firing is history
            (d / old).unlink(missing_ok=True)
        (d / SCRIPT).write_bytes(script)
        os.chmod(d / SCRIPT, 0o755)
        watchdog().write_json(str(d / "config.json"), cfg)


def edit_local(store: StateStore, name: str, nodes: int, **changes: object) -> None:
    for i in range(nodes):
        d = local_dir(store, name, i)
        if (d / "config.json").exists():
            watchdog().edit_config(str(d), **changes)
