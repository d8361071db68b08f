"""`completion`: the shell's tab completion script, from typer's (click's) completion machinery."""

from __future__ import annotations

import sys

import typer

from clusterctl.errors import UsageError

app = typer.Typer()  # its commands are merged into cli/app.py's app (see COMMANDS there)

SHELLS = ("bash", "zsh", "fish")


@app.command(short_help="Print the shell completion script.")
def completion(shell: str = typer.Argument(..., help="bash | zsh | fish")) -> None:
    """Print the tab completion script for a shell: commands, options and their values.

    bash: `source <(clusterctl completion bash)` (in ~/.bashrc to keep it); zsh: `source <(clusterctl
    completion zsh)` after compinit; fish: `clusterctl completion fish > ~/.config/fish/completions/clusterctl.fish`.
    """
    from typer.completion import get_completion_script

    if shell not in SHELLS:
        raise UsageError(f"no completion for shell {shell!r}", f"use one of {', '.join(SHELLS)}")
    script = get_completion_script(prog_name="clusterctl", complete_var="_CLUSTERCTL_COMPLETE", shell=shell)
    sys.stdout.write(script + "\n")
