"""The cluster as the watchdog sees it: the hosts file (its first host is the leader), which address is this
node, the members asked over the node package's one ssh, and the power-off of a member or of this node."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading

from clusterctl.node import ssh as node_ssh
from clusterctl.node.watchdog.activity import PROGRAM, Probe
from clusterctl.node.watchdog.files import Config, log, read_file

# ConnectTimeout and ServerAlive*: a member that is gone costs a check about ten seconds
SSH = node_ssh.argv(5, alive=(5, 2))


def hosts_file(cfg: Config) -> list[str]:
    path = os.path.expanduser(f"~{cfg['user']}/hosts")
    try:
        with open(path) as f:
            return [line.split()[0] for line in f if line.strip() and not line.startswith("#")]
    except OSError:
        return []


def own_addresses() -> set[str]:
    try:
        out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    return set(out.split()) | {socket.gethostname()}


def is_me(address: str) -> bool:
    """An address of this node? (A datagram socket "connected" to a local address takes it as its source.)"""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((address, 9))
            return bool(s.getsockname()[0] == address)
    except OSError:
        return False


def answers(host: str, port: int = 22, timeout: float = 3.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def ssh(cfg: Config, host: str, command: str, timeout: float) -> subprocess.CompletedProcess[str]:
    argv = [*SSH, host, command]
    if os.geteuid() == 0 and cfg["user"] != "root":
        argv = ["runuser", "-u", cfg["user"], "--", *argv]
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as exc:
        return subprocess.CompletedProcess(argv, 255, "", str(exc))


def probe_members(cfg: Config, members: list[str]) -> dict[str, Probe | None]:
    """host -> probe of that member (None when it did not answer), all members at once."""
    result: dict[str, Probe | None] = {}
    archive = cfg.get("script") or os.path.abspath(sys.argv[0])  # every node has it at the same path

    def one(host: str) -> None:
        r = ssh(cfg, host, f"{cfg['python']} {archive} {PROGRAM} probe", timeout=60)
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


def poweroff_command(cfg: Config) -> str:
    if cfg["poweroff"] == "node-init":  # a namespace node: its PID 1 ends, and every process of it with it
        return "kill -TERM 1"
    return "shutdown -h now" if cfg["user"] == "root" else "sudo -n shutdown -h now"


def poweroff_self(cfg: Config, d: str) -> None:
    if cfg["poweroff"] == "node-init":
        os.kill(1, signal.SIGTERM)
        return
    comm = (read_file("/proc/1/comm") or b"").decode().strip()
    if comm == "sshd":  # PID 1 is sshd: a namespace node sharing the host's init; never shut that down
        log(d, "refusing to run shutdown: PID 1 is sshd (a namespace node); set poweroff to node-init")
        return
    subprocess.run(["shutdown", "-h", "now"], timeout=60)
