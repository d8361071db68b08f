"""The node zipapp: the same sources give the same bytes and name, a changed module a new name, and the
archive runs every program with the system's own python3 (what a node has before its runtime)."""

from __future__ import annotations

import io
import shutil
import subprocess
import sys
import zipfile

import pytest

from clusterctl.node.__main__ import PROGRAMS
from clusterctl.remote import nodepkg
from clusterctl.types import HostResult, RunReport

SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin:/bin") or "python3"


def test_the_same_sources_give_the_same_bytes_and_name(tmp_path):
    copy = tmp_path / "node"
    shutil.copytree(nodepkg.SOURCE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "__main__.py").touch()  # a new mtime: not part of the bytes
    a, b = nodepkg.build(), nodepkg.build(copy)
    assert a.data == b.data and a.name == b.name == f"node-{a.digest[:16]}.pyz"
    assert a.path == f".clusterctl/node/{a.name}" and a.shell_path == f'"$HOME"/.clusterctl/node/{a.name}'
    names = zipfile.ZipFile(io.BytesIO(a.data))
    listed = names.namelist()
    assert listed[:2] == ["__main__.py", "clusterctl/__init__.py"] and listed[2:] == sorted(listed[2:])
    assert all(n.startswith("clusterctl/node/") and n.endswith(".py") for n in listed[2:])
    assert {i.date_time for i in names.infolist()} == {(1980, 1, 1, 0, 0, 0)}


def test_a_changed_module_is_a_new_name(tmp_path):
    copy = tmp_path / "node"
    shutil.copytree(nodepkg.SOURCE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    before = nodepkg.build(copy)
    (copy / "__main__.py").write_text((copy / "__main__.py").read_text() + "\n# changed\n")
    assert nodepkg.build(copy).name != before.name
    (copy / "extra.py").write_text("")
    assert len({nodepkg.build(copy).name, before.name}) == 2


def _run(pyz, *args, python=SYSTEM_PYTHON):
    return subprocess.run([python, str(pyz), *args], capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def pyz(tmp_path_factory):
    path = tmp_path_factory.mktemp("pyz") / nodepkg.package().name
    path.write_bytes(nodepkg.package().data)
    return path


def test_the_archive_dispatches_by_program_name(pyz):
    listed = _run(pyz, "--help")
    assert listed.returncode == 0 and "programs: " + ", ".join(sorted(PROGRAMS)) in listed.stderr
    unknown = _run(pyz, "no-such-program")
    assert unknown.returncode == 2 and "unknown program 'no-such-program'" in unknown.stderr


# A program that takes no --help (sync answers every call with one JSON line): a trivial call, and what it says.
TRIVIAL = {"sync": (["manifest", "--", "{tmp}"], '"entries": []')}
# Programs that are Horovod's own from their first line: the node runtime's Python (this venv stands in for it).
RUNTIME = {"horovodrun"}


@pytest.mark.parametrize("program", sorted(PROGRAMS))
def test_every_program_runs_from_the_archive_with_the_system_python(pyz, program, tmp_path):
    args, says = TRIVIAL.get(program, (["--help"], "usage:"))
    python = sys.executable if program in RUNTIME else SYSTEM_PYTHON
    r = _run(pyz, program, *(a.format(tmp=tmp_path) for a in args), python=python)
    assert r.returncode == 0, r.stdout + r.stderr
    assert says in r.stdout + r.stderr


def test_the_archive_runs_nothing_when_a_spawned_child_imports_it(pyz):
    """multiprocessing's spawn runs a script parent's main module again in each child, named __mp_main__ (a
    zipapp's it leaves alone): run so, the archive does nothing."""
    code = f"import runpy, sys; sys.argv = ['x', 'sync']; runpy.run_path({str(pyz)!r}, run_name='__mp_main__')"
    r = subprocess.run([SYSTEM_PYTHON, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout == r.stderr == ""


class _Pool:
    """What ship() asks of an SshPool: a command, a put, the fan-out; the node's files are a set."""

    def __init__(self, files: dict[str, set[str]]):
        self.files, self.puts = files, []

    def run_one(self, target, command, timeout=None):
        path = command.split()[-1]
        return HostResult(target.label, 0 if path in self.files[target.label] else 1)

    def put_one(self, target, files):
        self.puts.append(target.label)
        self.files[target.label] |= set(files)
        return HostResult(target.label, 0)

    def fan_out(self, targets, fn, parallel):
        return RunReport(tuple(fn(t) for t in targets))


def test_ship_puts_the_archive_only_where_it_is_missing():
    from clusterctl.remote.targets import SshTarget

    pkg = nodepkg.package()
    pool = _Pool({"a": {pkg.path}, "b": set()})
    targets = [SshTarget("a", "a"), SshTarget("b", "b")]
    report = nodepkg.ship(pool, targets)  # type: ignore[arg-type]
    assert report.all_ok and pool.puts == ["b"]
    assert nodepkg.ship(pool, targets).all_ok and pool.puts == ["b"]  # type: ignore[arg-type]
