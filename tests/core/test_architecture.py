"""Imports point one way: cli -> playbook -> workloads/data/cluster/runtime -> remote/providers/autostop -> core.

Every `import` in every module of clusterctl/ counts, wherever it stands: at the top, inside a function (a
lazy import is still a dependency, and still closes a cycle when the function runs), or under TYPE_CHECKING.
The rules (docs/ARCHITECTURE.md draws them):
- every package sits on one layer of LAYERS; a module imports its own layer and the layers below, never one
  above (core: errors, types, hostsfile, resources, retry, units, s3uri, proc, paths, state and the package's
  __init__, imports nothing of clusterctl but core);
- a package that is on no layer is itself a finding (a new package gets its place here first);
- no import cycle between modules (Tarjan's strongly connected components over the module graph);
- no import cycle between packages either: packages on one layer may import each other, but one way only
  (today workloads -> cluster -> runtime -> data), so each can be read, tested and moved without the others.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

from conftest import REPO

PACKAGE = REPO / "clusterctl"

CORE = {"errors", "types", "hostsfile", "resources", "retry", "units", "s3uri", "proc", "paths", "state"}
# Top to bottom. Packages on one layer may import each other (no cycle between modules, below).
LAYERS = (
    {"main"},  # clusterctl/__main__.py
    {"cli"},
    {"playbook"},  # a playbook's steps are the workloads' and data's commands
    {"workloads", "data", "cluster", "runtime"},
    {"remote", "providers", "autostop"},
    {"core"},
    {"node"},  # what runs on the nodes: the standard library and the node runtime only (test_node_package_...)
)


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    where: str  # path:line of the import statement


def module_names(package: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file under the package (a package is its __init__)."""
    names = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def imports(package: Path) -> list[Edge]:
    """Every import of a module of the package by a module of the package, at any depth of the syntax tree."""
    modules = module_names(package)
    edges: dict[Edge, None] = {}  # one edge per statement, in reading order
    for source, path in modules.items():
        is_package, shown = path.name == "__init__.py", path.relative_to(package.parent)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the module's own package upwards
                    anchor = source.split(".")
                    anchor = anchor if is_package else anchor[:-1]
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                # `from pkg import mod` imports the module pkg.mod; `from mod import name` imports mod.
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            for target in targets:
                while target and target not in modules:  # `import pkg.mod.attr`-like spellings: the module
                    target = target.rpartition(".")[0]
                if target and target != source:
                    edges[Edge(source, target, f"{shown}:{node.lineno}")] = None
    return list(edges)


def group(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1 or parts[1] in CORE:
        return "core"
    if parts[1] == "__main__":
        return "main"
    return parts[1]


def layer(group_name: str) -> int | None:
    return next((i for i, groups in enumerate(LAYERS) if group_name in groups), None)


def layering_violations(edges: list[Edge]) -> list[str]:
    bad = []
    for e in edges:
        src, dst = group(e.source), group(e.target)
        above, below = layer(src), layer(dst)
        for name, module, where in ((src, e.source, above), (dst, e.target, below)):
            if where is None:
                bad.append(
                    f"{e.where}: {module} is in package {name}/, which is on no layer (tests/core/test_architecture.py)"
                )
        if src == dst or above is None or below is None:
            continue
        if below < above:
            what = "core imports only core" if src == "core" else f"{src}/ is below {dst}/"
            bad.append(f"{e.where}: {e.source} imports {e.target} ({what})")
    return sorted(set(bad))


def cycles(edges: list[Edge]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative), each as one closed path
    through it with the import statements that make it."""
    graph: dict[str, set[str]] = {}
    for e in edges:
        graph.setdefault(e.source, set()).add(e.target)
        graph.setdefault(e.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    sccs: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                scc = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    scc.append(member)
                    if member == node:
                        break
                if len(scc) > 1:
                    sccs.append(sorted(scc))
    where = {(e.source, e.target): e.where for e in edges}
    return [_closed_path(scc, graph, where) for scc in sccs]


def package_edges(edges: list[Edge]) -> list[Edge]:
    """The module graph folded onto packages (core counts as one): one edge per pair of packages, the first
    import statement that makes it standing for it."""
    folded: dict[tuple[str, str], Edge] = {}
    for e in edges:
        src, dst = group(e.source), group(e.target)
        if src != dst:
            folded.setdefault((src, dst), Edge(src, dst, e.where))
    return list(folded.values())


def _closed_path(scc: list[str], graph: dict[str, set[str]], where: dict[tuple[str, str], str]) -> list[str]:
    """The shortest way from the SCC's first module back to itself, one line per import."""
    start, members = scc[0], set(scc)
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier and start not in previous:
        nxt = []
        for node in frontier:
            for child in sorted(graph[node] & members):
                if child not in previous:
                    previous[child] = node
                    nxt.append(child)
        frontier = nxt
    path = [start]
    node = previous[start]
    while node != start:
        path.append(node)
        node = previous[node]
    path.append(start)
    path.reverse()
    lines = [f"{a} -> {b}  ({where[a, b]})" for a, b in zip(path, path[1:])]
    if len(members) > len(path) - 1:
        lines.append(f"(the component also holds: {', '.join(sorted(members - set(path)))})")
    return lines


def test_imports_point_one_way():
    edges = imports(PACKAGE)
    assert len(edges) > 100, "the import graph is suspiciously small: is the parser reading the package?"
    bad = layering_violations(edges)
    assert not bad, "imports that point up:\n" + "\n".join(bad)


def test_no_import_cycles():
    found = cycles(imports(PACKAGE))
    assert not found, "import cycles:\n\n" + "\n\n".join("\n".join(c) for c in found)


def test_no_package_cycles():
    found = cycles(package_edges(imports(PACKAGE)))
    assert not found, "import cycles between packages:\n\n" + "\n\n".join("\n".join(c) for c in found)


def test_the_checker_sees_package_cycles_that_no_module_cycle_shows(tmp_path):
    """Four packages of one layer in a ring, each import a different module: no module cycle, one package cycle."""
    pkg = tmp_path / "clusterctl"
    files = {
        "__init__.py": "",
        "errors.py": "",
        "cluster/__init__.py": "",
        "cluster/provision.py": "from clusterctl.runtime import install\n",
        "runtime/__init__.py": "",
        "runtime/install.py": "def ship():\n    from clusterctl.data import sync\n",
        "data/__init__.py": "",
        "data/sync.py": "from clusterctl.workloads.launch import new_job\n",
        "workloads/__init__.py": "",
        "workloads/launch.py": "import clusterctl.errors\n",
        "workloads/bench/ladder.py": "from clusterctl.cluster import provision\nfrom clusterctl import errors\n",
    }
    for name, text in files.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(text)
    edges = imports(pkg)
    assert layering_violations(edges) == [] and cycles(edges) == []
    assert cycles(package_edges(edges)) == [
        [
            "cluster -> runtime  (clusterctl/cluster/provision.py:1)",
            "runtime -> data  (clusterctl/runtime/install.py:2)",
            "data -> workloads  (clusterctl/data/sync.py:1)",
            "workloads -> cluster  (clusterctl/workloads/bench/ladder.py:1)",
        ]
    ]
    # the ring broken (data no longer imports workloads): clean
    (pkg / "data/sync.py").write_text("import clusterctl.errors\n")
    assert cycles(package_edges(imports(pkg))) == []


def test_the_checker_sees_function_level_imports_and_cycles(tmp_path):
    """The rules above hold on a small package made to break them, so a green run means a clean tree."""
    pkg = tmp_path / "clusterctl"
    files = {
        "__init__.py": "",
        "__main__.py": "from clusterctl.cli.app import main\n",
        "errors.py": "def f():\n    from clusterctl.cluster import state\n",
        "cli/__init__.py": "",
        "cli/app.py": "from clusterctl import errors\n",
        "cluster/__init__.py": "",
        "cluster/state.py": "import clusterctl.errors\n\ndef show():\n    from ..cli import app\n",
        "playbook/__init__.py": "",
        "playbook/run.py": "from clusterctl.playbook import steps\n",
        "playbook/steps.py": "def go():\n    from . import run\n",
        "workloads/__init__.py": "",
        "workloads/bench/ladder.py": "from clusterctl.cluster.state import show\nfrom clusterctl.playbook.run import x\n",
        "gadgets/__init__.py": "import clusterctl.errors\n",
    }
    for name, text in files.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(text)
    edges = imports(pkg)
    bad = layering_violations(edges)
    assert bad == [
        "clusterctl/cluster/state.py:4: clusterctl.cluster.state imports clusterctl.cli.app (cluster/ is below cli/)",
        "clusterctl/errors.py:2: clusterctl.errors imports clusterctl.cluster.state (core imports only core)",
        "clusterctl/gadgets/__init__.py:1: clusterctl.gadgets is in package gadgets/, which is on no layer "
        "(tests/core/test_architecture.py)",
        "clusterctl/workloads/bench/ladder.py:2: clusterctl.workloads.bench.ladder imports clusterctl.playbook.run "
        "(workloads/ is below playbook/)",
    ]
    assert cycles(edges) == [
        [
            "clusterctl.cli.app -> clusterctl.errors  (clusterctl/cli/app.py:1)",
            "clusterctl.errors -> clusterctl.cluster.state  (clusterctl/errors.py:2)",
            "clusterctl.cluster.state -> clusterctl.cli.app  (clusterctl/cluster/state.py:4)",
        ],
        [
            "clusterctl.playbook.run -> clusterctl.playbook.steps  (clusterctl/playbook/run.py:1)",
            "clusterctl.playbook.steps -> clusterctl.playbook.run  (clusterctl/playbook/steps.py:2)",
        ],
    ]


# ---- the provider contract (providers/base.py) ---------------------------------------------------------
# Outside providers/ a provider is reached through the contract only: no module imports a provider's own
# package (providers/aws, providers/local), no comparison names one (`provider == "aws"`: a capability or the
# option schema says it instead), and no module but the AWS provider's and the node programs' imports AWS's
# SDK (ruff's TID251 says the same as you type; this rule holds it for the whole tree).
PROVIDER_NAMES = ("aws", "local")
SDK = ("boto3", "botocore")
# Programs that run on the nodes, whose runtime has boto3 for S3 (sync's pulls, checkpoint uploads).
NODE_PROGRAMS = ("clusterctl/node/",)


def _names_a_provider(node: ast.Compare) -> bool:
    """`x.provider == "aws"`, `provider != "local"`, `"aws" in (cluster.provider, ...)`-like comparisons."""
    sides = [node.left, *node.comparators]
    named = any(isinstance(s, ast.Constant) and s.value in PROVIDER_NAMES for s in sides)
    about = any("provider" in ast.unparse(s).rsplit(".", 1)[-1] for s in sides if not isinstance(s, ast.Constant))
    return named and about


def provider_leaks(package: Path) -> list[str]:
    bad = []
    for path in sorted(package.rglob("*.py")):
        shown = path.relative_to(package.parent).as_posix()
        if shown.startswith(f"{package.name}/providers/"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), shown)):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
            for name in names:
                if any(name.startswith(f"clusterctl.providers.{p}") for p in PROVIDER_NAMES):
                    bad.append(f"{shown}:{node.lineno}: imports {name} (a provider's own package)")
                    break
                if name.split(".")[0] in SDK and not shown.startswith(NODE_PROGRAMS):
                    bad.append(f"{shown}:{node.lineno}: imports {name} (AWS's SDK: providers/aws only)")
                    break
            if isinstance(node, ast.Compare) and _names_a_provider(node):
                bad.append(f"{shown}:{node.lineno}: `{ast.unparse(node)}` names a provider (ask a capability)")
    return bad


def test_no_provider_is_named_outside_providers():
    found = provider_leaks(PACKAGE)
    assert not found, "a provider named outside providers/:\n" + "\n".join(found)


def test_the_provider_rule_catches_names_imports_and_the_sdk(tmp_path):
    pkg = tmp_path / "clusterctl"
    files = {
        "cli/up.py": 'def f(provider):\n    return provider == "local"\n',
        "cluster/gc.py": 'def g(c):\n    return "aws" != c.provider\n',
        "cluster/costs.py": "from clusterctl.providers.aws import catalog\n",
        "cli/clusters.py": "import clusterctl.providers.local.supervisor\n",
        "runtime/install.py": "def h():\n    from botocore.exceptions import ClientError\n",
        "data/sync.py": 'def k(src):\n    return src.kind == "local"\n',  # a source's kind, not a provider
        "node/sync/s3pull.py": "import boto3\n",  # runs on a node
        "providers/aws/api.py": 'import boto3\n\nname = "aws"\nok = name == "aws"\n',
    }
    for name, text in files.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(text)
    assert provider_leaks(pkg) == [
        "clusterctl/cli/clusters.py:1: imports clusterctl.providers.local.supervisor (a provider's own package)",
        "clusterctl/cli/up.py:2: `provider == 'local'` names a provider (ask a capability)",
        "clusterctl/cluster/costs.py:1: imports clusterctl.providers.aws (a provider's own package)",
        "clusterctl/cluster/gc.py:2: `'aws' != c.provider` names a provider (ask a capability)",
        "clusterctl/runtime/install.py:2: imports botocore.exceptions (AWS's SDK: providers/aws only)",
    ]


def test_every_provider_subclasses_the_contract():
    """mypy checks each method of a Provider subclass against providers/base.py; the registry hands out only
    subclasses, and a subclass missing a method of the contract cannot be made."""
    from clusterctl import providers
    from clusterctl.providers.base import Provider

    for name in providers.names():
        cls = providers.provider_class(name)
        assert issubclass(cls, Provider) and not getattr(cls, "__abstractmethods__", None), name
        assert cls.name == name
        assert isinstance(cls.shares_this_machine, bool) and isinstance(cls.up_flags, frozenset), name


def test_the_registry_refuses_a_class_outside_the_contract(monkeypatch):
    import pytest

    from clusterctl import providers
    from clusterctl.providers.base import Provider

    class Loose:  # all the methods, no contract: what the registry built by getattr before
        name = "loose"

    class Partial(Provider):  # the contract, a method short
        name = "partial"

    import sys
    import types

    module = types.ModuleType("zz_contract_fake")
    module.Loose, module.Partial = Loose, Partial  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "zz_contract_fake", module)
    monkeypatch.setitem(providers._PROVIDERS, "loose", ("zz_contract_fake", "Loose"))
    monkeypatch.setitem(providers._PROVIDERS, "partial", ("zz_contract_fake", "Partial"))
    with pytest.raises(TypeError, match="does not subclass providers.base.Provider"):
        providers.get("loose")
    with pytest.raises(TypeError, match="abstract"):
        providers.get("partial")


# ---- the CLI parses, calls the library, renders and exits ----------------------------------------------------
COMMAND_BODY_LIMIT = 40  # lines of a command function's body, its docstring not counted
# Commands still over the limit, each with what is left to move into the library; an entry whose command got
# short enough is a finding too, so the list only shrinks.
LONG_COMMANDS: dict[str, str] = {}


def command_bodies(cli_dir: Path) -> dict[str, int]:
    """file:function -> lines of its body (docstring not counted), for every function registered as a command
    (decorated with `<app>.command(...)`)."""
    sizes = {}
    for path in sorted(cli_dir.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if not any(
                isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute) and d.func.attr == "command"
                for d in node.decorator_list
            ):
                continue
            body = node.body
            if len(body) > 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                body = body[1:]
            sizes[f"{path.name}:{node.name}"] = (node.end_lineno or body[-1].lineno) - body[0].lineno + 1
    return sizes


def long_commands(sizes: dict[str, int], allowed: dict[str, str], limit: int = COMMAND_BODY_LIMIT) -> list[str]:
    found = [f"{name}: {n} lines (limit {limit})" for name, n in sizes.items() if n > limit and name not in allowed]
    found += [
        f"{name}: listed as long, now {sizes.get(name, 0)} lines" for name in allowed if sizes.get(name, 0) <= limit
    ]
    return found


def test_no_command_body_is_over_the_limit():
    sizes = command_bodies(PACKAGE / "cli")
    assert len(sizes) >= 25, f"suspiciously few commands found: {sorted(sizes)}"
    assert long_commands(sizes, LONG_COMMANDS) == []


def test_the_command_size_check_sees_a_long_body_and_a_stale_exemption(tmp_path):
    """Made to break: a long command is a finding, its docstring is not counted, a helper is not a command,
    and an exemption for a command that got short is a finding."""
    long_body = "".join(f"    x{i} = {i}\n" for i in range(41))
    (tmp_path / "cmds.py").write_text(
        "import typer\napp = typer.Typer()\n\n"
        f"@app.command()\ndef big():\n{long_body}\n"
        f'@app.command("ok")\ndef ok_():\n    """{"doc line" + chr(10) * 30}"""\n'
        + "".join(f"    y{i} = {i}\n" for i in range(40))
        + "\n"
        f"def helper():\n{long_body}\n"
    )
    sizes = command_bodies(tmp_path)
    assert sizes == {"cmds.py:big": 41, "cmds.py:ok_": 40}
    assert long_commands(sizes, {}) == ["cmds.py:big: 41 lines (limit 40)"]
    assert long_commands(sizes, {"cmds.py:big": "why", "cmds.py:ok_": "why"}) == [
        "cmds.py:ok_: listed as long, now 40 lines"
    ]


# ---- the node package (clusterctl/node/) ----------------------------------------------------------------
# It runs on the nodes from one zipapp that holds nothing else of clusterctl: its modules import the standard
# library, the node runtime (lazily, inside functions) and clusterctl.node.* only.
NODE_RUNTIME = {"tensorflow", "horovod", "numpy", "boto3", "botocore", "nvidia"}  # nvidia: DALI (GPU runtime)


def node_leaks(package: Path) -> list[str]:
    bad = []
    root = package / "node"
    for path in sorted(root.rglob("*.py")):
        shown = path.relative_to(package.parent).as_posix()
        module = ["clusterctl", *path.relative_to(package).with_suffix("").parts]
        for node in ast.walk(ast.parse(path.read_text(), shown)):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                anchor = module[: len(module) - node.level] if node.level else []
                names = [".".join(anchor + ([node.module] if node.module else []))]
            for name in names:
                top = name.split(".")[0]
                inside = name == "clusterctl.node" or name.startswith("clusterctl.node.")
                if not inside and top not in sys.stdlib_module_names and top not in NODE_RUNTIME:
                    bad.append(
                        f"{shown}:{node.lineno}: imports {name} (a node has the standard library, "
                        "its runtime and clusterctl.node only)"
                    )
    return bad


def test_node_package_imports_only_what_a_node_has():
    assert (PACKAGE / "node" / "__main__.py").is_file()
    found = node_leaks(PACKAGE)
    assert not found, "the node package imports what a node lacks:\n" + "\n".join(found)


def test_the_node_rule_catches_clusterctl_and_third_parties(tmp_path):
    pkg = tmp_path / "clusterctl"
    files = {
        "node/__init__.py": "",
        "node/sync.py": "import json\nfrom clusterctl.node import manifest\nfrom . import scan\n",
        "node/train.py": "def f():\n    import tensorflow as tf\n    import horovod.tensorflow\n",
        "node/bad.py": "from clusterctl.errors import UsageError\nimport yaml\n",
        "node/worse.py": "def g():\n    from .. import types\n    from clusterctl.data import plan\n",
        "data/sync.py": "import yaml\n",  # the operator side: not this rule's
    }
    for name, text in files.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(text)
    assert [line.split(" (")[0] for line in node_leaks(pkg)] == [
        "clusterctl/node/bad.py:1: imports clusterctl.errors",
        "clusterctl/node/bad.py:2: imports yaml",
        "clusterctl/node/worse.py:2: imports clusterctl",
        "clusterctl/node/worse.py:3: imports clusterctl.data",
    ]
    # the layers say it too: node is below core
    (pkg / "errors.py").write_text("")
    (pkg / "node/bad.py").write_text("from clusterctl import errors\n")
    assert layering_violations(imports(pkg)) == [
        "clusterctl/node/bad.py:1: clusterctl.node.bad imports clusterctl.errors (node/ is below core/)"
    ]
