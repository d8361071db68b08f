"""`clusterctl completion bash|zsh|fish`: a script each shell loads, answered by the CLI itself."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from clusterctl.cli.app import COMMANDS


def _clusterctl_on_path(tmp_path, cli) -> dict:
    """A `clusterctl` on PATH that is this checkout (what the completion script calls)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "clusterctl"
    exe.write_text(f'#!/bin/sh\nexec {sys.executable} -m clusterctl "$@"\n')
    exe.chmod(0o755)
    env = cli.env()
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    return env


def test_bash_sources_the_script_and_completes_commands_and_options(cli, tmp_path):
    env = _clusterctl_on_path(tmp_path, cli)
    script = (
        "source <(clusterctl completion bash) && complete -p clusterctl && "
        'COMP_WORDS=(clusterctl ""); COMP_CWORD=1; _clusterctl_completion clusterctl; '
        'printf "%s\\n" "${COMPREPLY[@]}"; echo ---; '
        "COMP_WORDS=(clusterctl status --); COMP_CWORD=2; _clusterctl_completion clusterctl; "
        'printf "%s\\n" "${COMPREPLY[@]}"'
    )
    proc = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    registered, rest = proc.stdout.split("\n", 1)
    assert registered == "complete -o default -F _clusterctl_completion clusterctl"
    commands, options = rest.split("---\n")
    assert set(commands.split()) == set(COMMANDS), commands
    assert {"--cluster", "--json", "--provider", "--region"} <= set(options.split()), options


@pytest.mark.parametrize(
    "shell, env, first",
    [
        ("zsh", {"_CLUSTERCTL_COMPLETE": "complete_zsh"}, "#compdef clusterctl"),
        ("fish", {"_CLUSTERCTL_COMPLETE": "complete_fish", "_TYPER_COMPLETE_FISH_ACTION": "get-args"}, "complete "),
    ],
)
def test_zsh_and_fish_scripts_and_the_answers_they_ask_for(cli, shell, env, first):
    proc = cli("completion", shell)
    assert proc.returncode == 0 and proc.stdout.startswith(first) and "_CLUSTERCTL_COMPLETE" in proc.stdout
    if shutil.which(shell):  # the shell itself parses the script where it is installed
        check = subprocess.run([shell, "-n"], input=proc.stdout, capture_output=True, text=True, timeout=30)
        assert check.returncode == 0, check.stderr
    answer = cli(env={**env, "_TYPER_COMPLETE_ARGS": "clusterctl sta"})
    assert answer.returncode == 0 and "status" in answer.stdout and "down" not in answer.stdout, answer.stdout


def test_an_unknown_shell_names_the_ones_there_are(cli):
    proc = cli("completion", "tcsh")
    assert (
        proc.returncode == 2
        and proc.stderr.strip() == "Error: no completion for shell 'tcsh': use one of bash, zsh, fish"
    )
