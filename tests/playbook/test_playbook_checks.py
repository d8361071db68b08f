"""One check per option, in the library: `clusterctl train/bench/sync` and a playbook's step of the same kind
refuse a bad value with the same one-line error (the playbook's after file:line), and a playbook is refused
whole at load, before any of its steps runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO


def clusterctl(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "CLUSTERCTL_HOME": str(tmp_path / "home"), "PYTHONPATH": str(REPO), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "clusterctl", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=120,
    )


def error_line(proc: subprocess.CompletedProcess) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.startswith("Error: ")]
    assert len(lines) == 1, proc.stderr
    return lines[0][len("Error: ") :]


# (the CLI's argv, the playbook step's YAML, the error both give)
CASES = [
    (
        ("train", "--data", "d", "--epochs", "-3"),
        "train: {data: d, model: resnet50, epochs: -3, batch_size: 0}",
        "--epochs must be positive, not -3.0",
    ),
    (
        ("train", "--data", "d", "--batch-size", "0"),
        "train: {data: d, batch_size: 0}",
        "--batch-size must be at least 1, not 0",
    ),
    (
        ("train", "--data", "d", "--model", "vgg"),
        "train: {data: d, model: vgg}",
        "unknown model 'vgg': use one of resnet50, tiny",
    ),
    (("train", "--data=-rf"), "train: {data: -rf}", "--data '-rf': a path may not start with '-': write ./-rf"),
    (
        ("train", "--synthetic", "--data", "d"),
        "train: {synthetic: true, data: d}",
        "give --data DIR or --synthetic (one of them): not both",
    ),
    (("bench", "--synthetic", "--steps", "0"), "bench: {steps: 0}", "--steps must be at least 1, not 0"),
    (
        ("bench", "--synthetic", "--warmup-steps", "5"),
        "bench: {warmup_steps: 5}",
        "--warmup-steps must be at least 10, not 5",
    ),
    (
        ("bench", "--synthetic", "--threshold", "1.5"),
        "bench: {threshold: 1.5}",
        "--threshold must be in (0, 1], not 1.5",
    ),
    (("bench", "--synthetic", "--model", "vgg"), "bench: {model: vgg}", "unknown model 'vgg': use resnet50 or tiny"),
    (
        ("bench", "--synthetic", "--max-seconds", "900"),
        "bench: {max_seconds: 900}",
        "--max-seconds 900 leaves no time of --timeout 900 for each rung's launch and warm-up: give --max-seconds "
        "below --timeout, e.g. --timeout 1800",
    ),
    (
        ("sync", "--fanout", "0", "/srv/x", "/srv/y"),
        "sync: {src: /srv/x, dst: /srv/y, fanout: 0}",
        "--fanout must be at least 1, not 0",
    ),
    (
        ("run", "--timeout", "0", "HOSTS", "true"),
        "run: {command: 'true', timeout: 0}",
        "--timeout must be positive, not 0.0",
    ),
    (
        ("sync", "--strategy", "pigeon", "/srv/x", "/srv/y"),
        "sync: {src: /srv/x, dst: /srv/y, strategy: pigeon}",
        "unknown --strategy 'pigeon': use one of chain, tree, parallel, sequential",
    ),
]


@pytest.mark.parametrize("argv, step, message", CASES, ids=[c[2][:24] for c in CASES])
def test_the_cli_and_a_playbook_refuse_a_value_with_the_same_error(tmp_path, argv, step, message):
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 slots=1\n")
    argv = [str(hosts) if a == "HOSTS" else a for a in argv] if "HOSTS" in argv else [argv[0], str(hosts), *argv[1:]]
    cli = clusterctl(tmp_path, *argv)
    assert cli.returncode == 2 and error_line(cli) == message, cli.stderr
    marker = tmp_path / "first-step-ran"
    book = tmp_path / "book.yaml"
    book.write_text(f"steps:\n  - name: first\n    run: {{command: 'touch {marker}'}}\n  - name: bad\n    {step}\n")
    for extra in (("--dry-run",), ("--hosts", str(hosts))):
        play = clusterctl(tmp_path, "play", str(book), *extra)
        assert play.returncode == 3, play.stderr
        kind = step.split(":")[0]
        assert error_line(play) == f"book.yaml:4: {kind} step 'bad': {message}", play.stderr
        assert play.stdout == "" and not marker.exists()


def test_a_good_train_step_passes_the_checks_and_is_shown_as_given(tmp_path):
    book = tmp_path / "book.yaml"
    book.write_text("steps:\n  - name: t\n    train: {data: d, model: tiny, epochs: 2, batch_size: 8}\n")
    proc = clusterctl(tmp_path, "play", str(book), "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "t: clusterctl train --data d --model tiny --epochs 2 --batch-size 8" in proc.stderr


def test_a_sweep_of_the_trainer_gets_the_same_checks_before_it_starts(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 slots=1\n")
    argv = ["python", "train_imagenet.py", "--synthetic", "--epochs", "{epochs}", "--batch-size={bs}"]
    proc = clusterctl(
        tmp_path, "sweep", "run", "--hosts", str(hosts), "--grid", "epochs=1,-3", "--grid", "bs=8", "--", *argv
    )
    assert proc.returncode == 2, proc.stderr
    assert error_line(proc) == "trial 2 (epochs=-3, bs=8): --epochs must be positive, not -3.0"
    proc = clusterctl(
        tmp_path, "sweep", "run", "--hosts", str(hosts), "--grid", "epochs=1", "--grid", "bs=0,8", "--", *argv
    )
    assert (
        proc.returncode == 2 and error_line(proc) == "trial 1 (epochs=1, bs=0): --batch-size must be at least 1, not 0"
    )
