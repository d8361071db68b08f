"""The command line: parse, call the library, render with display, exit with the one table's code.

Thin on purpose: no boto3, no ssh here; heavy imports happen inside the commands, so `--help` is fast.
"""

from __future__ import annotations

import functools
import traceback
from typing import TYPE_CHECKING, Any, Callable, TypeVar, cast

import typer

from clusterctl.cli import (
    autostop,
    bench,
    clusters,
    completion,
    data,
    doctor,
    fanout,
    fastargs as _fastargs,
    gc,
    launch,
    play,
    ssh,
    status,
    sweep,
    train,
    up,
)
from clusterctl.errors import ClusterctlError, ExitCode

if TYPE_CHECKING:
    from typer._click import Context  # the click typer carries, which its group's methods take

_fastargs.install()  # plain str/int/float/bool options without pydantic: ~0.1 s less per invocation


class _Listed(typer.core.TyperGroup):
    """The root group: `--help` lists commands and groups (data, sweep) in COMMANDS' order."""

    def list_commands(self, ctx: Context) -> list[str]:
        names = super().list_commands(ctx)
        return sorted(names, key=lambda n: COMMANDS.index(n) if n in COMMANDS else len(COMMANDS))


app = typer.Typer(
    cls=_Listed,
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    help="From nothing to Horovod training across many multi-GPU nodes, and back to zero cost.",
    context_settings={"help_option_names": ["-h", "--help"]},
)
_debug = False


def _version(value: bool) -> None:
    if value:
        from clusterctl import __version__

        typer.echo(f"clusterctl {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks for errors."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    global _debug
    _debug = debug


F = TypeVar("F", bound=Callable[..., Any])


def command(fn: F) -> F:
    """Every command's errors become one `Error: ...` line and the table's exit code; Ctrl-C is 130."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from clusterctl.cli import display

        try:
            return fn(*args, **kwargs)
        except ClusterctlError as exc:
            if _debug:
                traceback.print_exc()
            display.error(exc.one_line())
            raise typer.Exit(int(exc.exit_code)) from None
        except KeyboardInterrupt as exc:
            done = exc.summary() if hasattr(exc, "summary") else ""  # a fan-out says what it stopped
            display.error(f"interrupted: {done}" if done else "interrupted")
            raise typer.Exit(int(ExitCode.INTERRUPTED)) from None

    return cast(F, wrapper)


# The commands in the order `--help` lists them (the order they had in one file): each module registers its
# own on a typer app of its own, merged here, each wrapped in `command` (one Error: line, the table's code).
COMMANDS = (
    "up",
    "down",
    "ls",
    "status",
    "stop",
    "start",
    "repair",
    "keep",
    "autostop",
    "gc",
    "hosts",
    "run",
    "ssh",
    "jobs",
    "logs",
    "kill",
    "clean",
    "agent",
    "bench",
    "doctor",
    "sync",
    "play",
    "run-job",
    "sweep",
    "train",
    "launch",
    "eval",
    "tensorboard",
    "data",
    "completion",
)


def _merge() -> None:
    infos = {}
    groups = set()
    for module in (
        up,
        clusters,
        status,
        autostop,
        gc,
        ssh,
        fanout,
        data,
        bench,
        doctor,
        play,
        sweep,
        train,
        launch,
        completion,
    ):
        for info in module.app.registered_commands:
            infos[info.name or info.callback.__name__.lower().replace("_", "-")] = info
        for group in module.app.registered_groups:  # `data tfrecords`, `sweep run` ...: the same wrapping
            for info in group.typer_instance.registered_commands:
                info.callback = command(info.callback)
            groups.add(group.name)
        app.registered_groups.extend(module.app.registered_groups)
    if set(infos) | groups != set(COMMANDS):  # a command added without a place in the list, or a name changed
        raise RuntimeError(f"cli commands and COMMANDS differ: {sorted((set(infos) | groups) ^ set(COMMANDS))}")
    for name in (n for n in COMMANDS if n not in groups):
        infos[name].callback = command(infos[name].callback)
        app.registered_commands.append(infos[name])


_merge()


def main() -> None:
    import os

    if os.environ.get("_CLUSTERCTL_COMPLETE"):  # a completion script asks (see `clusterctl completion`)
        from typer._completion_classes import completion_init  # typer's shells, as add_completion would add

        completion_init()
    app(prog_name="clusterctl")


if __name__ == "__main__":
    main()
