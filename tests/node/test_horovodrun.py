"""`python PYZ horovodrun`: Horovod's own horovodrun, from the node package, whose every ssh checks host keys (also
those its spawned processes run), and its line when an elastic job has too few nodes."""

from __future__ import annotations

import os
import subprocess
import sys

from clusterctl.node import horovodrun, ssh as node_ssh
from clusterctl.workloads.train import log as train_log
from conftest import node_pyz


def test_the_ssh_of_the_processes_it_spawns_checks_host_keys(tmp_path):
    """horovodrun's ssh check of a remote host runs in a process it spawns (multiprocessing's spawn): an `ssh`
    first on PATH records what it was asked to run, and fails as a changed key would."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "ssh").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/ssh.log\nexit 255\n')
    (fake / "ssh").chmod(0o755)
    env = {"HOME": str(tmp_path), "PATH": f"{fake}:{os.path.dirname(sys.executable)}:/usr/bin:/bin"}
    argv = ["-np", "1", "-H", "192.0.2.1:1", "--gloo", "--disable-cache", "--start-timeout", "5", "true"]
    r = subprocess.run(
        [sys.executable, node_pyz(), "horovodrun", *argv], env=env, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 1 and "could not connect to some hosts via ssh" in r.stderr, r.stdout + r.stderr
    calls = (tmp_path / "ssh.log").read_text().splitlines()
    assert calls and all(c.startswith(" ".join(node_ssh.PINNED) + " 192.0.2.1 ") for c in calls), calls
    assert all("StrictHostKeyChecking=no" not in c for c in calls)


def test_its_help_is_horovodruns():
    r = subprocess.run([sys.executable, node_pyz(), "horovodrun", "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("usage: horovodrun "), r.stdout + r.stderr


def test_the_line_when_too_few_nodes_are_left():
    line = horovodrun.too_few_line(["-np", "3", "--min-np", "2", "--elastic-timeout", "30", "python", "t.py"])
    fields = train_log.parse_train_log(
        line.replace("CLUSTERCTL-HOROVOD", train_log.MARK) + "\n", strict=True
    ).current.errors[0]
    assert fields.fields["kind"] == "too_few_nodes" and fields.fields["min_np"] == "2"
    assert fields.fields["message"].startswith("fewer than --min-np 2 processes could run for 30 s")


def test_horovods_gloo_check_is_asked_once_per_installed_build(tmp_path, monkeypatch):
    """horovodrun's check imports TensorFlow in a new process at every launch: asked once, then again only when
    the extension's file changes."""
    import horovod.runner.launch as launch

    asked = []
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    ext = tmp_path / "horovod" / "tensorflow" / "mpi_lib.cpython-311-x86_64-linux-gnu.so"
    ext.parent.mkdir(parents=True)

    def launch_asks() -> list[bool]:  # one horovodrun process: its own check, wrapped at its start
        monkeypatch.setattr(launch, "gloo_built", lambda verbose=False: asked.append(verbose) or True)
        horovodrun.remember_gloo_build(str(tmp_path / "horovod"))
        return [launch.gloo_built(), launch.gloo_built()]

    ext.write_bytes(b"built")
    assert launch_asks() == [True, True] and len(asked) == 1
    assert launch_asks() == [True, True] and len(asked) == 1  # the next launch: not asked
    ext.write_bytes(b"built again")  # a reinstall
    assert launch_asks() == [True, True] and len(asked) == 2
