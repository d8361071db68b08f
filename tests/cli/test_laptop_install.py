"""The laptop: the wheel installed without extras, into a fresh venv of another Python, drives AWS.

No TensorFlow, no repository on the path: its dependencies come from the package index. Against moto it
plans an `up --dry-run`, lists a cluster (brought up here by the operator's install), and takes it
down with `down --all --yes`; `data` says which extra it needs in one line.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

pytestmark = pytest.mark.integration

OTHER_PYTHONS = ("3.13", "3.12")  # pyenv builds on this machine image; any that differs from the operator's


def _other_python() -> str:
    mine = f"{sys.version_info.major}.{sys.version_info.minor}"
    for version in OTHER_PYTHONS:
        if version == mine:
            continue
        found = sorted(glob.glob(f"/root/.pyenv/versions/{version}.*/bin/python{version}"))
        if found:
            return found[-1]
    pytest.fail(
        f"no pyenv Python {' or '.join(OTHER_PYTHONS)} under /root/.pyenv/versions (other than {mine})", pytrace=False
    )


@pytest.fixture(scope="module")
def laptop(tmp_path_factory) -> Path:
    """A fresh venv of another Python with the built wheel and nothing else of ours: its bin folder."""
    d = tmp_path_factory.mktemp("laptop")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(d), str(REPO)],
        check=True,
        capture_output=True,
    )
    wheel = next(d.glob("clusterctl-*.whl"))
    subprocess.run([_other_python(), "-m", "venv", str(d / "venv")], check=True)
    pip = subprocess.run(
        [str(d / "venv/bin/python"), "-m", "pip", "install", "-q", str(wheel)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert pip.returncode == 0, pip.stderr[-3000:]
    return d / "venv" / "bin"


def _run(bin_: Path, cli, env: dict, *args: str) -> subprocess.CompletedProcess:
    full = cli.env(env)
    full.pop("PYTHONPATH", None)  # the installed wheel, never this checkout
    return subprocess.run(
        [str(bin_ / "clusterctl"), *args],
        cwd=cli.cwd,
        env=full,
        text=True,
        capture_output=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )


def test_the_wheel_without_extras_drives_aws_from_another_python(laptop, aws, aws_cli, cli):
    env = aws.env()
    probe = subprocess.run(
        [
            str(laptop / "python"),
            "-c",
            "import sys, clusterctl, importlib.util as u; "
            "print(sys.version_info[:2], clusterctl.__file__, u.find_spec('tensorflow'))",
        ],
        capture_output=True,
        text=True,
        cwd=cli.cwd,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    assert probe.returncode == 0, probe.stderr
    assert str(laptop.parent) in probe.stdout and probe.stdout.rstrip().endswith("None"), probe.stdout
    assert f"({sys.version_info.major}, {sys.version_info.minor})" not in probe.stdout

    plan = _run(laptop, cli, env, *aws_cli.up_args("lap", 2), "--dry-run")
    assert plan.returncode == 0, plan.stdout + plan.stderr
    assert "nothing was created" in plan.stderr and aws.nodes == {}
    calls = aws.actions("RunInstances")  # it asked moto (EC2's DryRun), and only as a dry run
    assert calls and all(c.params.get("DryRun") == "true" for c in calls), calls

    up = aws_cli(*aws_cli.up_args("lap", 1))  # the operator's install brings one up; the laptop sees it
    assert up.returncode == 0, up.stdout + up.stderr
    ls = _run(laptop, cli, env, "ls")
    assert ls.returncode == 0, ls.stdout + ls.stderr
    row = next(line for line in ls.stdout.splitlines() if line.strip().startswith("lap"))
    assert "aws" in row and "1 running" in row

    # --provider aws: without it, `down --all` would also take down every local cluster on this machine,
    # other test runs' included
    down = _run(laptop, cli, env, "down", "--all", "--provider", "aws", "--yes")
    assert down.returncode == 0, down.stdout + down.stderr
    assert "cluster lap is gone" in down.stderr and aws.nodes == {}

    # a heavy part names the extra it needs, in one line
    data = _run(laptop, cli, env, "data", "synthetic", str(cli.cwd / "ds"), "--images", "2", "--classes", "2")
    assert data.returncode != 0
    errors = [line for line in data.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "-m pip install tensorflow-cpu==2.15.1" in errors[0], data.stderr  # advice that works


def test_the_local_provider_without_root_names_what_it_needs(tmp_path):
    import pwd
    import shutil
    import tempfile

    home = Path(tempfile.mkdtemp(prefix="cc-nobody-"))  # outside pytest's root-only tmp folders
    try:
        os.chown(home, pwd.getpwnam("nobody").pw_uid, -1)
        env = {
            "PATH": os.environ["PATH"],
            "HOME": str(home),
            "CLUSTERCTL_HOME": str(home / "cc"),
            "CLUSTERCTL_SSH_DIR": str(home / "ssh"),
            "PYTHONPATH": str(REPO),
        }
        proc = subprocess.run(
            [
                "runuser",
                "-u",
                "nobody",
                "--",
                "env",
                *(f"{k}={v}" for k, v in env.items()),
                sys.executable,
                "-m",
                "clusterctl",
                "up",
                "--provider",
                "local",
                "--name",
                "nr",
                "--nodes",
                "1",
                "--yes",
                "--runtime",
                "none",
            ],
            cwd=home,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        shutil.rmtree(home)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("Error:")]
    assert errors == [
        "Error: the local provider needs root (it creates network namespaces and runs sshd): "
        "run clusterctl as root, e.g. with sudo"
    ], proc.stderr
