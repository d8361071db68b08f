"""Playbooks: the recipe's steps as YAML files that run (playbooks/*.yaml).

    name: smoke
    vars: {model: tiny}                 # defaults; --var k=v overrides
    steps:
      - name: preflight
        doctor: {}
      - name: ladder
        bench: {model: "{{ model }}", ladder: "1,2"}
        on_failure: stop                # or continue

A step is one of STEP_KINDS; each calls the same library function the CLI command calls. The whole
file is checked (kinds, fields, variables: every string is rendered) before anything runs, and every
error names file:line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from clusterctl.errors import ConfigError

# kind -> (required fields, optional fields)
STEP_KINDS: dict[str, tuple[set[str], set[str]]] = {
    "run": ({"command"}, {"nodes", "timeout", "expect"}),
    "put": ({"template", "dest"}, {"nodes", "mode", "vars"}),
    "doctor": (set(), {"python"}),
    "bench": (set(), {"model", "ladder", "batch_size", "steps", "iters", "warmup_steps", "threshold", "timeout", "out"}),
    "sync": ({"src", "dst"}, {"strategy", "fanout", "delete", "endpoint_url"}),
    "train": (set(), {"data", "epochs", "batch_size", "model", "synthetic", "wait", "extra"}),
    "eval": (set(), {"data", "model"}),
    "clean": (set(), {"kill", "logs", "disk", "force"}),
}
STEP_KEYS = {"name", "on_failure", "when"}


class PlaybookError(ConfigError):
    pass


@dataclass(frozen=True)
class Step:
    name: str
    kind: str
    params: Mapping[str, Any]  # rendered: no template left in any string
    on_failure: str  # "stop" | "continue"
    line: int


@dataclass(frozen=True)
class Playbook:
    name: str
    path: str
    steps: tuple[Step, ...]
    variables: Mapping[str, str]


def load(path: str | Path, overrides: Mapping[str, str] | None = None) -> Playbook:
    """Parse, validate and render a playbook; raise PlaybookError naming file:line on any problem."""
    import yaml

    path = Path(path)
    where = path.name
    try:
        text = path.read_text()
    except OSError as exc:
        raise PlaybookError(f"{path}: cannot read playbook ({exc.strerror})") from None
    try:
        root = yaml.compose(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark else 0
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise PlaybookError(f"{where}:{line}: bad YAML: {problem}") from None
    if not isinstance(root, yaml.MappingNode):
        raise PlaybookError(f"{where}:1: a playbook is a mapping with `steps:`")
    top = _mapping(root)
    for key, (knode, _) in top.items():
        if key not in ("name", "description", "vars", "steps"):
            raise PlaybookError(f"{where}:{knode.start_mark.line + 1}: unknown top-level key {key!r}")
    defaults: dict[str, str] = {}
    if "vars" in top:
        vnode = top["vars"][1]
        if not isinstance(vnode, yaml.MappingNode):
            raise PlaybookError(f"{where}:{vnode.start_mark.line + 1}: `vars` is a mapping of name: default")
        for k, (_, v) in _mapping(vnode).items():
            defaults[k] = _plain(yaml, v, where)
    for k in overrides or {}:
        if k not in defaults:
            raise PlaybookError(f"{where}: --var {k}: the playbook has no variable {k!r}",
                                f"known: {', '.join(sorted(defaults)) or 'none'}")
    variables = {**defaults, **(overrides or {})}
    if "steps" not in top or not isinstance(top["steps"][1], yaml.SequenceNode):
        raise PlaybookError(f"{where}:1: a playbook needs `steps:`, a list")
    steps = []
    seen: set[str] = set()
    for i, snode in enumerate(top["steps"][1].value, start=1):
        line = snode.start_mark.line + 1
        if not isinstance(snode, yaml.MappingNode):
            raise PlaybookError(f"{where}:{line}: step {i} is not a mapping")
        fields = _mapping(snode)
        kinds = [k for k in fields if k in STEP_KINDS]
        unknown = [k for k in fields if k not in STEP_KINDS and k not in STEP_KEYS]
        if unknown:
            raise PlaybookError(f"{where}:{fields[unknown[0]][0].start_mark.line + 1}: unknown step kind or key "
                                f"{unknown[0]!r}", f"a step is one of {', '.join(STEP_KINDS)}")
        if len(kinds) != 1:
            raise PlaybookError(f"{where}:{line}: step {i} must have exactly one of {', '.join(STEP_KINDS)}")
        kind = kinds[0]
        name = _plain(yaml, fields["name"][1], where) if "name" in fields else f"{i}-{kind}"
        if name in seen:
            raise PlaybookError(f"{where}:{line}: two steps are named {name!r}")
        seen.add(name)
        on_failure = _plain(yaml, fields["on_failure"][1], where) if "on_failure" in fields else "stop"
        if on_failure not in ("stop", "continue"):
            raise PlaybookError(f"{where}:{line}: on_failure is stop or continue, not {on_failure!r}")
        pnode = fields[kind][1]
        params_raw = yaml.safe_load(yaml.serialize(pnode)) if not _is_null(pnode) else {}
        if not isinstance(params_raw, dict):
            raise PlaybookError(f"{where}:{pnode.start_mark.line + 1}: `{kind}:` takes a mapping of fields")
        required, optional = STEP_KINDS[kind]
        missing = required - set(params_raw)
        if missing:
            raise PlaybookError(f"{where}:{line}: {kind} step {name!r} is missing {', '.join(sorted(missing))}")
        extra = set(params_raw) - required - optional
        if extra:
            raise PlaybookError(f"{where}:{pnode.start_mark.line + 1}: {kind} step {name!r} has no field "
                                f"{sorted(extra)[0]!r}", f"fields: {', '.join(sorted(required | optional))}")
        at = f"{where}:{pnode.start_mark.line + 1}"
        # a run step's command is shell: variables go in quoted ({{ v | raw }} opts out)
        params = {k: _render(v, variables, at, shell=(kind == "run" and k == "command")) for k, v in params_raw.items()}
        if params.get("nodes", "all") not in ("all", "leader", "members"):
            raise PlaybookError(f"{where}:{line}: nodes is all, leader or members, not {params['nodes']!r}")
        steps.append(Step(name, kind, params, on_failure, line))
    pb_name = _plain(yaml, top["name"][1], where) if "name" in top else path.stem
    return Playbook(pb_name, str(path), tuple(steps), variables)


def _mapping(node) -> dict[str, tuple[Any, Any]]:
    return {k.value: (k, v) for k, v in node.value}


def _is_null(node) -> bool:
    return getattr(node, "tag", "").endswith(":null")


def _plain(yaml, node, where: str) -> str:
    if not isinstance(node, yaml.ScalarNode):
        raise PlaybookError(f"{where}:{node.start_mark.line + 1}: expected a plain value")
    return str(node.value)


_VAR = re.compile(r"{{\s*([A-Za-z_][A-Za-z0-9_]*)\s*(?:\|\s*([A-Za-z_]+)\s*)?}}")


def _render(value: Any, variables: Mapping[str, str], where: str, shell: bool = False) -> Any:
    """Substitute {{ var }} in every string; an unknown variable is an error. A string that is exactly
    one variable becomes that value as typed YAML would read it (so `steps: "{{ n }}"` is a number), but
    never null (`--var logs=~` stays the text ~). shell: a shell command, every value goes in
    shlex-quoted unless written {{ var | raw }}."""
    import shlex

    import yaml

    if isinstance(value, dict):
        return {k: _render(v, variables, where, shell) for k, v in value.items()}
    if isinstance(value, list):
        return [_render(v, variables, where, shell) for v in value]
    if not isinstance(value, str):
        return value
    for name, flt in _VAR.findall(value):
        if name not in variables:
            raise PlaybookError(f"{where}: unknown variable {name!r}", "declare it under vars:")
        if flt and flt != "raw":
            raise PlaybookError(f"{where}: unknown filter {flt!r} on {name!r}", "the one filter is `raw`")

    def sub(m: re.Match) -> str:
        text = str(variables[m.group(1)])
        return text if not shell or m.group(2) == "raw" else shlex.quote(text)

    whole = _VAR.fullmatch(value.strip())
    if whole and not shell:
        text = str(variables[whole.group(1)])
        typed = yaml.safe_load(text) if text != "" else ""
        return text if typed is None else typed
    return _VAR.sub(sub, value)


# ---- running ---------------------------------------------------------------------------------------------
@dataclass
class StepResult:
    step: Step
    ok: bool
    detail: str
    skipped: bool = False


@dataclass
class Context:
    """What steps run against; built by the caller (the CLI) from the cluster."""

    inventory: Any
    store: Any
    report: Callable[[str], None] = lambda _: None
    results: list[StepResult] = field(default_factory=list)


def describe(step: Step) -> str:
    """The fully rendered action, for --dry-run."""
    p = step.params
    if step.kind == "run":
        return f"run on {p.get('nodes', 'all')}: {p['command']}" + (f"  (expect {p['expect']})" if p.get("expect") else "")
    if step.kind == "put":
        return f"put template {p['template']} -> {p['dest']} on {p.get('nodes', 'all')}"
    args = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in p.items() if v not in ("", None))
    return f"clusterctl {step.kind} {args}".rstrip()


def execute(pb: Playbook, ctx: Context, start_from: str | None = None) -> list[StepResult]:
    from clusterctl.playbook import steps as playsteps

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
