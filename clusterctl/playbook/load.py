"""Playbooks: the recipe's steps as YAML files that run (playbooks/*.yaml).

    name: smoke
    vars: {model: tiny}                 # defaults; --var k=v overrides
    steps:
      - name: preflight
        doctor: {}
      - name: ladder
        bench: {model: "{{ model }}", ladder: "1,2"}
        on_failure: stop                # or continue

A step is one kind of model.SPECS; each calls the same library function the CLI command calls. The
whole file is checked (kinds, fields and their types, variables: every string is rendered) before
anything runs, and every error names file:line.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import types
import typing
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from clusterctl.errors import ClusterctlError, UsageError, within
from clusterctl.playbook import steps as playsteps
from clusterctl.playbook.model import (
    SPECS,
    BenchSpec,
    CleanSpec,
    LaunchSpec,
    OnFailure,
    Playbook,
    PlaybookError,
    PlaySpec,
    RunSpec,
    Spec,
    Step,
    SyncSpec,
    TrainSpec,
)
from clusterctl.playbook.run import render

if TYPE_CHECKING:
    import yaml

STEP_KEYS = ("name", "on_failure")


def find(name: str) -> Path:
    """A playbook by path, or by the name of a shipped one (smoke, cleanup ...) when no such file is here."""
    path = Path(name)
    if path.exists() or "/" in name:
        return path
    from clusterctl import resources

    shipped = resources.folder("playbooks") / (name if name.endswith(".yaml") else f"{name}.yaml")
    return shipped if shipped.exists() else path


def parse_vars(items: Sequence[str]) -> dict[str, str]:
    """`--var name=value` (repeatable): the overrides of the playbook's vars; a bad one is a UsageError."""
    overrides = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--var takes name=value, not {item!r}")
        overrides[key] = value
    return overrides


def compose(path: Path, what: str, layout: str) -> yaml.MappingNode:
    """The file's YAML as nodes (each knows its line), the top a mapping; PlaybookError naming file:line on
    anything else. `what` names the file in the errors ("playbook"), `layout` says what its top holds."""
    import yaml

    where = path.name
    try:
        text = path.read_text()
    except OSError as exc:
        raise PlaybookError(f"{path}: cannot read {what} ({exc.strerror})") from None
    try:
        root = yaml.compose(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark else 0
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise PlaybookError(f"{where}:{line}: bad YAML: {problem}") from None
    if not isinstance(root, yaml.MappingNode):
        raise PlaybookError(f"{where}:1: a {what} is a mapping {layout}")
    return root


def load(path: str | Path, overrides: Mapping[str, str] | None = None) -> Playbook:
    """Parse, validate and render a playbook; raise PlaybookError naming file:line on any problem."""
    import yaml

    path = Path(path)
    where = path.name
    root = compose(path, "playbook", "with `steps:`")
    top = _mapping(root)
    for key, (knode, _) in top.items():
        if key not in ("name", "description", "vars", "steps"):
            raise PlaybookError(f"{where}:{knode.start_mark.line + 1}: unknown top-level key {key!r}")
    defaults = variables(top, where)
    for k in overrides or {}:
        if k not in defaults:
            raise PlaybookError(
                f"{where}: --var {k}: the playbook has no variable {k!r}",
                f"known: {', '.join(sorted(defaults)) or 'none'}",
            )
    values = {**defaults, **(overrides or {})}
    if "steps" not in top or not isinstance(top["steps"][1], yaml.SequenceNode):
        raise PlaybookError(f"{where}:1: a playbook needs `steps:`, a list")
    steps_ = steps(top["steps"][1].value, where, values, base=path.parent)
    pb_name = _plain(top["name"][1], where) if "name" in top else path.stem
    return Playbook(pb_name, str(path), steps_, values)


def variables(top: Mapping[str, tuple[yaml.Node, yaml.Node]], where: str) -> dict[str, str]:
    """The file's `vars:` (name: default), as text."""
    import yaml

    defaults: dict[str, str] = {}
    if "vars" in top:
        vnode = top["vars"][1]
        if not isinstance(vnode, yaml.MappingNode):
            raise PlaybookError(f"{where}:{vnode.start_mark.line + 1}: `vars` is a mapping of name: default")
        for k, (_, v) in _mapping(vnode).items():
            defaults[k] = _plain(v, where)
    return defaults


def steps(
    nodes: Sequence[yaml.Node],
    where: str,
    values: Mapping[str, str],
    kinds: Mapping[str, type] = SPECS,
    base: Path = Path("."),
) -> tuple[Step, ...]:
    """A list of steps, each checked whole, names unique."""
    out: list[Step] = []
    seen: set[str] = set()
    for i, snode in enumerate(nodes, start=1):
        step = _step(snode, i, where, values, kinds, base)
        if step.name in seen:
            raise PlaybookError(f"{where}:{step.line}: two steps are named {step.name!r}")
        seen.add(step.name)
        out.append(step)
    return tuple(out)


def _step(
    snode: yaml.Node,
    i: int,
    where: str,
    variables: Mapping[str, str],
    kinds: Mapping[str, type] = SPECS,
    base: Path = Path("."),
) -> Step:
    """One step (or a spec file's job: `kinds` JOB_SPECS), checked whole; `base`: its file's folder."""
    import yaml

    line = snode.start_mark.line + 1
    if not isinstance(snode, yaml.MappingNode):
        raise PlaybookError(f"{where}:{line}: step {i} is not a mapping")
    fields = _mapping(snode)
    if "when" in fields:
        raise PlaybookError(
            f"{where}:{fields['when'][0].start_mark.line + 1}: `when:` is not supported: every step runs, in order",
            "`on_failure: continue` goes on past a failed step; --from resumes at one",
        )
    found = [k for k in fields if k in kinds]
    unknown = [k for k in fields if k not in kinds and k not in STEP_KEYS]
    if unknown:
        raise PlaybookError(
            f"{where}:{fields[unknown[0]][0].start_mark.line + 1}: unknown step kind or key {unknown[0]!r}",
            f"a step is one of {', '.join(kinds)}",
        )
    if len(found) != 1:
        raise PlaybookError(f"{where}:{line}: step {i} must have exactly one of {', '.join(kinds)}")
    kind = found[0]
    name = _plain(fields["name"][1], where) if "name" in fields else f"{i}-{kind}"
    written = _plain(fields["on_failure"][1], where) if "on_failure" in fields else "stop"
    if written not in ("stop", "continue"):
        raise PlaybookError(f"{where}:{line}: on_failure is stop or continue, not {written!r}")
    on_failure: OnFailure = "continue" if written == "continue" else "stop"
    pnode = fields[kind][1]
    raw = yaml.safe_load(yaml.serialize(pnode)) if not _is_null(pnode) else {}
    if not isinstance(raw, dict):
        raise PlaybookError(f"{where}:{pnode.start_mark.line + 1}: `{kind}:` takes a mapping of fields")
    spec_type = kinds[kind]
    known = [f.name for f in dataclasses.fields(spec_type)]
    required = [
        f.name
        for f in dataclasses.fields(spec_type)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    missing = [f for f in required if f not in raw]
    if missing:
        raise PlaybookError(f"{where}:{line}: {kind} step {name!r} is missing {', '.join(missing)}")
    extra = sorted(k for k in raw if k not in known)
    if extra:
        raise PlaybookError(
            f"{where}:{pnode.start_mark.line + 1}: {kind} step {name!r} has no field {extra[0]!r}",
            f"fields: {', '.join(sorted(known)) or 'none'}",
        )
    at = f"{where}:{pnode.start_mark.line + 1}"
    rendered = {k: render(v, variables, at, shell=(kind == "run" and k == "command")) for k, v in raw.items()}
    spec = _build(spec_type, rendered, f"{where}:{line}: {kind} step {name!r}")
    _check(spec, f"{where}:{line}: {kind} step {name!r}", base)
    return Step(name, spec, tuple(raw), on_failure, line)


def playbook_of(s: PlaySpec, base: Path) -> Playbook:
    """A play job's playbook (beside its file, or a shipped one), loaded and checked whole with its vars."""
    where = base / s.playbook
    return load(where if where.exists() else find(s.playbook), {k: str(v) for k, v in s.vars.items()})


def _build(spec_type: type, values: Mapping[str, Any], what: str) -> Any:
    hints = typing.get_type_hints(spec_type)
    args = {}
    for f in dataclasses.fields(spec_type):
        if f.name in values:
            args[f.name] = _convert(values[f.name], hints[f.name], f.name, what, octal=f.metadata.get("octal", False))
    return spec_type(**args)


def _convert(value: Any, hint: Any, name: str, what: str, octal: bool = False) -> Any:
    """The rendered YAML value as the spec's type says; a value that is not one is refused, never
    guessed (`logs:` left empty must not become "no logs")."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):  # X | None: None is the default, never written
        hint = next(a for a in args if a is not type(None))
        origin, args = typing.get_origin(hint), typing.get_args(hint)

    def refuse(kind: str) -> PlaybookError:
        return PlaybookError(f"{what}: {name} takes {kind}, not {value!r}")

    if origin is typing.Literal:
        if value not in args:
            raise PlaybookError(f"{what}: {name} is {', '.join(args[:-1])} or {args[-1]}, not {value!r}")
        return value
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            raise refuse("a mapping")
        extra = sorted(k for k in value if k not in {f.name for f in dataclasses.fields(hint)})
        if extra:
            raise PlaybookError(
                f"{what}: {name} has no field {extra[0]!r}",
                f"fields: {', '.join(f.name for f in dataclasses.fields(hint))}",
            )
        return _build(hint, value, f"{what}: {name}")
    if hint is bool:
        if not isinstance(value, bool):
            raise refuse("true or false")
        return value
    if hint in (str, int, float):
        wanted = "octal digits (644)" if octal else {str: "a text", int: "a whole number", float: "a number"}[hint]
        if isinstance(value, (bool, dict, list)) or value is None:
            raise refuse(wanted)
        try:
            if octal:
                return int(str(value), 8)
            if hint is int and isinstance(value, float):
                return _whole(value)
            return hint(value)  # "3" read as text still counts as 3, as before the specs
        except ValueError:
            raise refuse(wanted) from None
    if hint is Path or origin in (tuple, list):  # a path; tuple[str, ...], List[str]
        return _texts(value, hint, origin, refuse)
    if origin in (collections.abc.Mapping, dict):
        if not isinstance(value, dict):
            raise refuse("a mapping")
        return value
    raise refuse(str(hint))  # a spec field of a type this function was not taught


def _texts(value: Any, hint: Any, origin: Any, refuse: Callable[[str], PlaybookError]) -> Any:
    if hint is Path:
        if not isinstance(value, str):
            raise refuse("a path")
        return Path(value)
    if not isinstance(value, list) or any(isinstance(x, (dict, list)) or x is None for x in value):
        raise refuse("a list of texts")
    return origin(str(x) for x in value)


def _whole(value: float) -> int:
    if not value.is_integer():
        raise ValueError(value)
    return int(value)


def _check(spec: Spec, what: str, base: Path) -> None:
    """What a field's type cannot say: the library's own checks of the values, the ones the CLI command's
    flags go through (the same one-line error, after file:line), before any step runs."""
    try:
        if isinstance(spec, RunSpec):
            within("--timeout", spec.timeout, above=0)  # `clusterctl run --timeout`'s check
        elif isinstance(spec, TrainSpec):
            playsteps.train_options(spec)
        elif isinstance(spec, BenchSpec):
            playsteps.bench_options(spec)
        elif isinstance(spec, SyncSpec):
            playsteps.check_sync(spec)
        elif isinstance(spec, LaunchSpec):
            playsteps.launch_plan(spec, base)
        elif isinstance(spec, PlaySpec):
            try:
                playbook_of(spec, base)
            except PlaybookError as exc:  # its own file:line follows the job's
                raise PlaybookError(f"{what}: playbook {spec.playbook}: {exc.message}", exc.hint) from None
        elif isinstance(spec, CleanSpec) and spec.logs is not None:
            from clusterctl.cluster import clean

            clean.check_logs_path(spec.logs)
    except ClusterctlError as exc:
        if isinstance(exc, PlaybookError):
            raise
        raise PlaybookError(f"{what}: {exc.message}", exc.hint) from None


def _mapping(node: yaml.MappingNode) -> dict[str, tuple[yaml.Node, yaml.Node]]:
    return {k.value: (k, v) for k, v in node.value}


def _is_null(node: yaml.Node) -> bool:
    return getattr(node, "tag", "").endswith(":null")


def _plain(node: yaml.Node, where: str) -> str:
    import yaml

    if not isinstance(node, yaml.ScalarNode):
        raise PlaybookError(f"{where}:{node.start_mark.line + 1}: expected a plain value")
    return str(node.value)
