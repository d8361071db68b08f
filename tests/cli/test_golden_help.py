"""`--help` of every command and subcommand, byte for byte as recorded in golden_help/.

A change to a command's options or words shows here first: a change made by design regenerates that command's
files (CLUSTERCTL_GOLDEN_WRITE=1 pytest tests/cli/test_golden_help.py) and the diff is reviewed with the code.
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from conftest import REPO

GOLDEN = REPO / "tests" / "cli" / "golden_help"


def command_paths() -> list[tuple[str, ...]]:
    """Every command line that has a --help: the root, each command, each group's subcommands."""
    import typer.main

    from clusterctl.cli.app import app

    paths: list[tuple[str, ...]] = [()]

    def walk(cmd, prefix: tuple[str, ...]) -> None:
        for name, sub in sorted(getattr(cmd, "commands", {}).items()):
            paths.append((*prefix, name))
            walk(sub, (*prefix, name))

    walk(typer.main.get_command(app), ())
    return paths


def golden_name(path: tuple[str, ...]) -> str:
    return ("_".join(path) or "_root") + ".txt"


def help_text(path: tuple[str, ...]) -> str:
    env = {**os.environ, "COLUMNS": "200", "TERM": "dumb", "NO_COLOR": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "clusterctl", *path, "--help"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_every_help_matches_its_golden_file():
    paths = command_paths()
    with ThreadPoolExecutor(max_workers=2) as pool:
        texts = dict(zip(paths, pool.map(help_text, paths)))
    if os.environ.get("CLUSTERCTL_GOLDEN_WRITE") == "1":
        for path, text in texts.items():
            (GOLDEN / golden_name(path)).write_text(text)
    assert findings(texts, GOLDEN) == []


def findings(texts: dict[tuple[str, ...], str], golden: Path) -> list[str]:
    """What differs from the recorded files: a changed text, a command without a file, a file without one."""
    found = [f"--help of `{' '.join(p) or '(root)'}` changed" for p, t in texts.items() if _read(golden, p) != t]
    stale = {f.name for f in golden.glob("*.txt")} - {golden_name(p) for p in texts}
    return found + [f"{name}: no such command any more" for name in sorted(stale)]


def _read(golden: Path, path: tuple[str, ...]) -> str | None:
    file = golden / golden_name(path)
    return file.read_text() if file.exists() else None


def test_the_check_sees_a_changed_word_a_new_command_and_a_stale_file(tmp_path):
    """Made to break: each kind of difference is a finding, and the recorded run --help is none."""
    path = ("run",)
    text = help_text(path)
    (tmp_path / "run.txt").write_text(text)
    assert findings({path: text}, tmp_path) == []
    assert findings({path: text.replace("Run", "Runs", 1)}, tmp_path) == ["--help of `run` changed"]
    assert findings({path: text, ("new",): "x"}, tmp_path) == ["--help of `new` changed"]
    (tmp_path / "gone.txt").write_text("x")
    assert findings({path: text}, tmp_path) == ["gone.txt: no such command any more"]
