"""Running a playbook: its variables rendered into the steps (at load), the steps run in order."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path
from typing import Any, Mapping

from clusterctl.playbook import steps as playsteps
from clusterctl.playbook.model import (
    Context,
    LaunchSpec,
    Playbook,
    PlaybookError,
    PlaySpec,
    PutSpec,
    RunSpec,
    Step,
    StepResult,
)

_VAR = re.compile(r"{{\s*([A-Za-z_][A-Za-z0-9_]*)\s*(?:\|\s*([A-Za-z_]+)\s*)?}}")


def render(value: Any, variables: Mapping[str, str], where: str, shell: bool = False) -> Any:
    """Substitute {{ var }} in every string; an unknown variable is an error. A string that is exactly
    one variable becomes that value as typed YAML would read it (so `steps: "{{ n }}"` is a number), but
    never null (`--var logs=~` stays the text ~). shell: a shell command, every value goes in quoted for
    where it stands (bare, '...' or "...": remote/shelltext.py) unless written {{ var | raw }}."""
    import yaml

    from clusterctl.errors import UsageError
    from clusterctl.remote import shelltext

    if isinstance(value, dict):
        return {k: render(v, variables, where, shell) for k, v in value.items()}
    if isinstance(value, list):
        return [render(v, variables, where, shell) for v in value]
    if not isinstance(value, str):
        return value
    for name, flt in _VAR.findall(value):
        if name not in variables:
            raise PlaybookError(f"{where}: unknown variable {name!r}", "declare it under vars:")
        if flt and flt != "raw":
            raise PlaybookError(f"{where}: unknown filter {flt!r} on {name!r}", "the one filter is `raw`")

    whole = _VAR.fullmatch(value.strip())
    if whole and not shell:
        text = str(variables[whole.group(1)])
        typed = yaml.safe_load(text) if text != "" else ""
        return text if typed is None else typed
    if not shell:
        return _VAR.sub(lambda m: str(variables[m.group(1)]), value)
    try:
        return shelltext.fill(value, _VAR, lambda m: str(variables[m.group(1)]), raw=lambda m: m.group(2) == "raw")
    except UsageError as exc:
        raise PlaybookError(f"{where}: {exc.message}", exc.hint) from None


def describe(step: Step) -> str:
    """The fully rendered action, for --dry-run: the fields the file set, in its order."""
    s = step.spec
    if isinstance(s, RunSpec):
        expect = {f.name: getattr(s.expect, f.name) for f in fields(s.expect) if getattr(s.expect, f.name) is not None}
        return f"run on {s.nodes}: {s.command}" + (f"  (expect {expect})" if "expect" in step.given else "")
    if isinstance(s, PutSpec):
        return f"put template {s.template} -> {s.dest} on {s.nodes}"
    if isinstance(s, LaunchSpec):
        flags = [*([f"--np {s.np}"] if s.np else []), *(f"--file {f}" for f in s.files), *(["--attach"] * s.wait)]
        return " ".join(["clusterctl launch", *flags, "--", s.command])
    if isinstance(s, PlaySpec):
        return " ".join(["clusterctl play", s.playbook, *(f"--var {k}={v}" for k, v in s.vars.items())])
    given = ((k, getattr(s, k)) for k in step.given)
    args = " ".join(
        f"--{k.replace('_', '-')} {f'{v:g}' if isinstance(v, float) else v}" for k, v in given if v not in ("", None)
    )
    return f"clusterctl {step.kind} {args}".rstrip()


def execute(pb: Playbook, ctx: Context, start_from: str | None = None) -> list[StepResult]:
    names = [s.name for s in pb.steps]
    if start_from is not None and start_from not in names:
        raise PlaybookError(f"{Path(pb.path).name}: no step named {start_from!r}", f"steps: {', '.join(names)}")
    started = start_from is None
    for step in pb.steps:
        if not started and step.name == start_from:
            started = True
        if not started:
            ctx.results.append(StepResult(step, True, "skipped (--from)", skipped=True))
            continue
        ctx.report(f"step {step.name} ({step.kind})")
        ok, detail = playsteps.run_step(step, ctx)
        ctx.results.append(StepResult(step, ok, detail))
        if not ok and step.on_failure == "stop":
            break
    return ctx.results
