"""Placeholders in shell text (sweep commands, playbook run steps) are quoted for the context they land in:
a value that would run a command if mis-quoted arrives literally when a real shell runs the result."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from clusterctl.errors import UsageError
from clusterctl.playbook import load as playbook_load
from clusterctl.playbook.model import PlaybookError
from clusterctl.remote import shelltext
from clusterctl.workloads.sweep import plan as sweep_plan

BRACE = re.compile(r"(?<!\$)\{([A-Za-z_][A-Za-z0-9_]*)\}")


def evil(marker: Path) -> str:
    """Every way out of a quote: closing ' and ", $( ), backticks, a backslash, ; and a newline."""
    return f"a'b\"c $(touch {marker}) `touch {marker}` \\ ; touch {marker}\nz"


def sh(command: str, cwd: Path, shell: str = "sh") -> str:
    proc = subprocess.run([shell, "-c", command], cwd=cwd, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


# (the template, what the shell prints with the value v in it)
CONTEXTS = [
    ("printf '%s|' {v}", "{v}|"),
    ("printf '%s|' '--tag={v}'", "--tag={v}|"),
    ("printf '%s|' \"--tag={v}\"", "--tag={v}|"),
    ("printf '%s|' x{v}y", "x{v}y|"),
    ("printf '%s|' \"$(printf '%s' {v})\"", "{v}|"),
    ("printf '%s|' \"$(printf '%s' '[{v}]')\"", "[{v}]|"),
    ("printf '%s|' 'a'\"b{v}\"'c'", "ab{v}c|"),
    ("printf '%s|' \\'{v}", "'{v}|"),
]


@pytest.mark.parametrize("shell", ["sh", "bash"])
@pytest.mark.parametrize("template, printed", CONTEXTS)
def test_a_value_arrives_literally_in_every_context(tmp_path, shell, template, printed):
    marker = tmp_path / "ran"
    value = evil(marker)
    command = shelltext.fill(template, BRACE, lambda m: value)
    assert sh(command, tmp_path, shell) == printed.replace("{v}", value)
    assert not marker.exists()


def test_golden_strings():
    q = lambda t, v: shelltext.fill(t, BRACE, lambda m: v)  # noqa: E731
    assert q("echo {v}", "a b") == "echo 'a b'"
    assert q("echo '--tag={v}'", "it's") == "echo '--tag=it'\\''s'"
    assert q('echo "--tag={v}"', 'a"$b`\\') == 'echo "--tag=a\\"\\$b\\`\\\\"'
    assert q("echo '{v}' {v}", "x") == "echo 'x' x"


@pytest.mark.parametrize(
    "template, message",
    [
        ("echo `echo {v}`", "{v} cannot be quoted for the shell inside `...`: write $(...) instead of backticks"),
        ("echo $'{v}'", "{v} cannot be quoted for the shell inside $'...': put it outside those quotes"),
        ("cat <<EOF\n{v}\nEOF", "{v} cannot be quoted for the shell after a here-document (<<)"),
    ],
)
def test_a_context_with_no_safe_quoting_is_refused_saying_how_to_write_it(template, message):
    with pytest.raises(UsageError) as info:
        shelltext.fill(template, BRACE, lambda m: "x")
    assert info.value.one_line().startswith(message)


def test_a_sweep_trial_runs_with_the_value_literal_inside_the_users_quotes(tmp_path):
    marker = tmp_path / "ran"
    (tmp_path / "out").mkdir()
    value = evil(marker)
    trials = sweep_plan.build_trials(["echo '--tag={tag}' > out/{trial}.txt"], [{"tag": value}], "python3")
    sh(trials[0].command, tmp_path)
    assert (tmp_path / "out" / "1.txt").read_text() == f"--tag={value}\n"
    assert not marker.exists()
    with pytest.raises(UsageError, match="inside `...`"):
        sweep_plan.build_trials(["echo `echo {tag}`"], [{"tag": "x"}], "python3")


def test_a_playbook_run_step_runs_with_the_value_literal_inside_the_users_quotes(tmp_path):
    marker = tmp_path / "ran"
    value = evil(marker)
    book = tmp_path / "book.yaml"
    book.write_text(
        "vars: {tag: none}\nsteps:\n"
        "  - name: single\n    run: {command: \"echo '--tag={{ tag }}' > single.txt\"}\n"
        "  - name: double\n    run: {command: 'echo \"--tag={{ tag }}\" > double.txt'}\n"
        "  - name: bare\n    run: {command: 'echo --tag={{ tag }} > bare.txt'}\n"
    )
    steps = playbook_load.load(book, {"tag": value}).steps
    for step in steps:
        sh(step.spec.command, tmp_path)
        assert (tmp_path / f"{step.name}.txt").read_text() == f"--tag={value}\n"
    assert not marker.exists()
    book.write_text("vars: {tag: x}\nsteps:\n  - name: a\n    run: {command: 'echo `echo {{ tag }}`'}\n")
    with pytest.raises(PlaybookError) as info:
        playbook_load.load(book)
    assert info.value.one_line().startswith("book.yaml:4: {{ tag }} cannot be quoted for the shell inside `...`")
