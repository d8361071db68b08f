"""A spec file: a cluster described once, in a YAML file kept with the project (`clusterctl up -f cluster.yaml`,
or a clusterctl.yaml in the working folder).

    name: resnet                       # every `up` option, by its flag's name (--idle-stop: idle_stop)
    provider: aws
    nodes: 32
    type: p3.16xlarge
    datasets:                          # synced after up: `clusterctl sync`'s fields
      - {src: s3://my-bucket/imagenet, dst: /data/imagenet}
    setup:                             # shell commands run on every node after up
      - sudo apt-get install -y htop
    jobs:                              # `clusterctl run-job NAME`: playbook steps, plus launch and play
      - name: resnet50
        train: {data: /data/imagenet, epochs: 90}

The whole file is checked at load, before anything is made, through the same machinery and specs as playbooks
(playbook/load.py): unknown keys, wrong types and bad values are one line naming file:line. Which keys `up` takes,
and their types, are `up`'s own options (the schema its caller hands in), so the file and the flags never differ;
their defaults stay the command's. A value only the library can judge (--nodes 0, --idle-stop soon) is judged
where the flag is, and `locate` puts the line of the key that set it in front of the error.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Sequence

from clusterctl.errors import ClusterctlError
from clusterctl.playbook import load as pbload, run, steps as playsteps
from clusterctl.playbook.model import JOB_SPECS, Context, Playbook, PlaybookError, PlaySpec, RunSpec, Step, SyncSpec

if TYPE_CHECKING:
    import yaml

FILE_NAME = "clusterctl.yaml"  # found in the working folder when `up` is given no -f and no shape flag
SECTIONS = ("description", "vars", "datasets", "setup", "jobs")


@dataclass(frozen=True)
class Setting:
    """One `up` option the file sets: its value (typed as the option), its line, and the flag it stands for."""

    value: Any
    line: int
    flag: str


@dataclass(frozen=True)
class SpecFile:
    path: Path
    settings: Mapping[str, Setting]  # `up`'s options the file sets, by key (the flag's name: idle_stop)
    datasets: tuple[Step, ...]  # sync steps, run after up
    setup: tuple[Step, ...]  # run steps on every node, after the datasets
    jobs: tuple[Step, ...]  # what `run-job NAME` starts

    @property
    def where(self) -> str:
        return self.path.name

    def after_up(self) -> Playbook:
        """The datasets, then the setup commands, as one playbook (run by playbook/run.py, step by step)."""
        return Playbook(self.path.stem, str(self.path), (*self.datasets, *self.setup), {})

    def job(self, name: str) -> Step:
        for step in self.jobs:
            if step.name == name:
                return step
        known = ", ".join(s.name for s in self.jobs) or "none"
        raise PlaybookError(f"{self.where}: no job named {name!r}", f"its jobs: {known}")

    def locate(self, exc: ClusterctlError, overridden: Sequence[str] = ()) -> ClusterctlError:
        """A check's error about a value the file set (the error names its flag, as for the command line), with
        the file and the key's line in front, as bad input (exit 3, as every error of the file); any other error
        as it is. `overridden`: flags the command line gave."""
        for key, s in sorted(self.settings.items(), key=lambda kv: kv[1].line):
            if s.flag not in overridden and re.search(re.escape(s.flag) + r"(?![\w-])", exc.message):
                return PlaybookError(f"{self.where}:{s.line}: {key}: {exc.message}", exc.hint)  # bad input: 3
        return exc

    @staticmethod
    def key_of(flag: str) -> str:
        return flag.removeprefix("--").replace("-", "_")

    def lines(self, given: Sequence[str]) -> Iterator[str]:
        """The plan's lines about the file: what it sets, and each flag of the command line that overrides it."""
        kept = [f"{k} {_shown(s.value)}" for k, s in self.settings.items() if s.flag not in given]
        yield f"{self.where}: " + (", ".join(kept) or "no `up` options")
        for key, s in self.settings.items():
            if s.flag in given:
                yield f"{s.flag} on the command line overrides {self.where}:{s.line} ({key} {_shown(s.value)})"


def _shown(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value)) or "[]"
    return str(value).lower() if isinstance(value, bool) else str(value)


def find(given: Path | None, cwd: Path, shape_given: bool) -> Path | None:
    """The spec file: -f's, else a clusterctl.yaml in the working folder when no shape flag was given."""
    if given is not None:
        return given
    here = cwd / FILE_NAME
    return here if not shape_given and here.is_file() else None


def load(path: Path, schema: Mapping[str, tuple[Any, str]]) -> SpecFile:
    """The file checked whole; `schema`: `up`'s options the file may set, key -> (type, flag)."""
    import yaml

    where = path.name
    top = pbload._mapping(pbload.compose(path, "spec file", "of `up` options, datasets, setup and jobs"))
    settings: dict[str, Setting] = {}
    for key, (knode, vnode) in top.items():
        line = knode.start_mark.line + 1
        if key in SECTIONS:
            continue
        if key not in schema:
            raise PlaybookError(f"{where}:{line}: unknown key {key!r}", _advice(key, [*schema, *SECTIONS]))
        hint, flag = schema[key]
        raw = yaml.safe_load(yaml.serialize(vnode))
        settings[key] = Setting(pbload._convert(raw, hint, key, f"{where}:{line}"), line, flag)
    variables = pbload.variables(top, where)
    base = path.parent
    datasets = tuple(_dataset(n, i, where, variables, base) for i, n in enumerate(_list(top, "datasets", where), 1))
    setup = tuple(_setup(n, i, where) for i, n in enumerate(_list(top, "setup", where), 1))
    jobs = pbload.steps(_list(top, "jobs", where), where, variables, JOB_SPECS, base)
    return SpecFile(path, settings, datasets, setup, jobs)


def _advice(key: str, known: Sequence[str]) -> str:
    close = difflib.get_close_matches(key, known, n=1)
    keys = "`up`'s options by their flags' names (idle_stop for --idle-stop), or " + ", ".join(SECTIONS)
    return f"did you mean {close[0]!r}? " + keys if close else keys


def _list(top: Mapping[str, tuple[yaml.Node, yaml.Node]], key: str, where: str) -> list[yaml.Node]:
    import yaml

    if key not in top or pbload._is_null(top[key][1]):
        return []
    node = top[key][1]
    if not isinstance(node, yaml.SequenceNode):
        raise PlaybookError(f"{where}:{node.start_mark.line + 1}: `{key}:` is a list")
    return list(node.value)


def _dataset(node: yaml.Node, i: int, where: str, variables: Mapping[str, str], base: Path) -> Step:
    """A dataset: `clusterctl sync`'s fields (src, dst, strategy ...), checked as the sync step's."""
    import yaml

    line = node.start_mark.line + 1
    if not isinstance(node, yaml.MappingNode):
        raise PlaybookError(f"{where}:{line}: dataset {i} is a mapping of sync's fields (src, dst ...)")
    text = "tag:yaml.org,2002:str"
    name = (yaml.ScalarNode(text, "name"), yaml.ScalarNode(text, f"dataset {i}"))
    wrapped = yaml.MappingNode("tag:yaml.org,2002:map", [name, (yaml.ScalarNode(text, "sync"), node)])
    wrapped.start_mark = node.start_mark
    step = pbload._step(wrapped, i, where, variables, {"sync": SyncSpec}, base)
    spec = step.spec
    assert isinstance(spec, SyncSpec)  # the one kind allowed above
    return Step(f"dataset {spec.dst}", spec, step.given, "stop", line)


def _setup(node: yaml.Node, i: int, where: str) -> Step:
    """A setup command: one shell line run on every node as it is written (no variables: nothing is filled in)."""
    line = node.start_mark.line + 1
    command = pbload._plain(node, where)
    if not command.strip():
        raise PlaybookError(f"{where}:{line}: setup command {i} is empty")
    return Step(f"setup {i}", RunSpec(command), ("command",), "stop", line)


def run_job(sf: SpecFile, step: Step, ctx: Context) -> tuple[bool, str]:
    """One job of the file, as its command would run it (a play job: its playbook's steps, in order)."""
    if isinstance(step.spec, PlaySpec):
        book = pbload.playbook_of(step.spec, sf.path.parent)
        inner = Context(ctx.inventory, ctx.store, ctx.report, base=Path(book.path).parent)
        failed = [r.step.name for r in run.execute(book, inner) if not r.ok]
        return not failed, f"failed: {', '.join(failed)}" if failed else f"{len(book.steps)} step(s) passed"
    return playsteps.run_step(step, ctx)
