"""proc.alive: the one "is this pid alive" (agent stop, local nodes' sshd, autostop supervisors) and owner()."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from clusterctl import proc


def _wait_zombie(pid: int) -> None:
    deadline = time.monotonic() + 10
    while open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":
        assert time.monotonic() < deadline, f"{pid} never exited"
        time.sleep(0.01)


def test_a_running_process_is_alive_and_an_ended_child_is_reaped():
    assert proc.alive(os.getpid())
    child = subprocess.Popen(["sleep", "30"])
    try:
        assert proc.alive(child.pid)
    finally:
        child.kill()
    _wait_zombie(child.pid)
    assert not proc.alive(child.pid)  # a zombie holds nothing
    try:  # ... and our own was reaped by the check (a caller polling it would otherwise wait forever)
        os.waitpid(child.pid, os.WNOHANG)
        raise AssertionError("the zombie child was not reaped")
    except ChildProcessError:
        pass
    assert not proc.alive(child.pid)  # gone for good


def test_another_process_zombie_counts_as_gone_and_odd_command_names_are_read_right(tmp_path):
    odd = tmp_path / "x) Z y"  # the state field follows the LAST ')' of /proc/PID/stat
    odd.symlink_to("/bin/sleep")
    # a parent that never reaps: its first child ends (a zombie that is not ours), its second runs
    script = (
        "import os, subprocess, sys, time\n"
        "z = subprocess.Popen(['true'])\n"
        f"r = subprocess.Popen([{str(odd)!r}, '30'])\n"
        "print(z.pid, r.pid, flush=True)\n"
        "time.sleep(30)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    zombie, running = map(int, parent.stdout.readline().split())
    try:
        _wait_zombie(zombie)
        assert not proc.alive(zombie)
        assert proc.alive(running)
        assert open(f"/proc/{running}/comm").read().strip() == odd.name
    finally:
        os.kill(running, signal.SIGKILL)
        parent.kill()
        parent.wait()


def test_no_pid_is_not_a_process_group():
    child = subprocess.Popen(["sleep", "30"])
    try:  # waitpid(0 or -1) would answer for any child of ours
        assert not proc.alive(0) and not proc.alive(-1)
        assert proc.alive(child.pid)
    finally:
        child.kill()
        child.wait()


def test_owner_is_user_at_host():
    user, host = proc.owner().split("@")
    assert user and host == os.uname().nodename[: 200 - len(user) - 1]
