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
from clusterctl.types import RunReport

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


def test_one_programs_files_are_its_modules_and_what_they_import(tmp_path, monkeypatch):
    """Imports followed through and through: relative, inside functions, `from PACKAGE import MODULE`."""
    copy = tmp_path / "node"
    shutil.copytree(nodepkg.SOURCE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "extra").mkdir()
    (copy / "extra" / "__init__.py").write_text("")
    (copy / "extra" / "a.py").write_text("import json\nfrom . import b\n")
    (copy / "extra" / "b.py").write_text(
        "def f():\n    from ..sweep import scripts\n    from clusterctl.node import ssh\n"
    )
    (copy / "extra" / "unused.py").write_text("from clusterctl.node.sync import main\n")
    monkeypatch.setitem(PROGRAMS, "extra", "clusterctl.node.extra.a")
    names = set(nodepkg.entries(copy, program="extra"))
    assert names == {
        "__main__.py",
        "clusterctl/__init__.py",
        *(
            f"clusterctl/node/{n}"
            for n in ("__init__.py", "__main__.py", "ssh.py", "sweep/__init__.py", "sweep/scripts.py")
        ),
        *(f"clusterctl/node/extra/{n}" for n in ("__init__.py", "a.py", "b.py")),
    }
    assert set(nodepkg.entries(copy)) > names  # the whole package holds every module


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


class _ShellChannel:
    """A paramiko channel's calls that ship_one makes, over `sh -c` in a target's login home."""

    def __init__(self, pool: _ShellPool, label: str):
        self.pool, self.label = pool, label

    def settimeout(self, timeout):
        pass

    def exec_command(self, command):
        env = {"HOME": str(self.pool.homes[self.label]), "PATH": self.pool.path}
        self.proc = subprocess.Popen(
            ["sh", "-c", f"{self.pool.login}{command}"],
            cwd=env["HOME"],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )

    def makefile(self, mode):
        return self.proc.stdout

    def makefile_stderr(self, mode):
        return self.proc.stderr

    def sendall(self, data):
        self.pool.sent.append(self.label)
        self.proc.stdin.write(data)

    def shutdown_write(self):
        self.proc.stdin.close()

    def recv_exit_status(self):
        return self.proc.wait()

    @property
    def status_event(self):
        return type("Exited", (), {"wait": lambda _, timeout: self.proc.wait(timeout) is not None})()

    def close(self):
        self.proc.stdout.close()
        self.proc.stderr.close()


class _ShellPool:
    """What ship() asks of an SshPool, done for real on this machine: each target's login home a folder, its
    ssh sessions run by sh there. Every session opened and every target sent the bytes are kept."""

    def __init__(self, root, labels, path="/usr/bin:/bin"):
        self.homes = {label: root / label for label in labels}
        for home in self.homes.values():
            home.mkdir(parents=True, exist_ok=True)
        self.sessions, self.sent, self.path = [], [], path
        self.login = ""  # what the login shell runs first (a user's rc file that prints)

    def client(self, target):
        pool = self

        class Transport:
            def open_session(self, timeout=None):
                pool.sessions.append(target.label)
                return _ShellChannel(pool, target.label)

        return type("Client", (), {"get_transport": lambda self: Transport()})()

    def fan_out(self, targets, fn, parallel):
        return RunReport(tuple(fn(t) for t in targets))


def test_ship_puts_the_archive_only_where_it_is_missing(tmp_path):
    from clusterctl.remote.targets import SshTarget

    pkg = nodepkg.package()
    pool = _ShellPool(tmp_path, ["a", "b"])
    (pool.homes["a"] / pkg.path).parent.mkdir(parents=True)
    (pool.homes["a"] / pkg.path).write_bytes(pkg.data)
    targets = [SshTarget("a", "a"), SshTarget("b", "b")]
    report = nodepkg.ship(pool, targets)  # type: ignore[arg-type]
    assert report.all_ok and pool.sent == ["b"] and (pool.homes["b"] / pkg.path).read_bytes() == pkg.data
    assert nodepkg.ship(pool, targets).all_ok and pool.sent == ["b"]  # type: ignore[arg-type]


def test_ship_is_one_ssh_session_per_node_whether_or_not_it_sends(tmp_path):
    """One round for every node: the check and, where the package is missing, its bytes go in the same
    session (a check, then an SFTP put after it, made two rounds of every first run)."""
    from clusterctl.remote.targets import SshTarget

    pool = _ShellPool(tmp_path, ["a", "b", "c"])
    targets = [SshTarget(label, label) for label in pool.homes]
    assert nodepkg.ship(pool, targets).all_ok  # type: ignore[arg-type]
    assert sorted(pool.sessions) == sorted(pool.sent) == ["a", "b", "c"]
    assert nodepkg.ship(pool, targets).all_ok  # type: ignore[arg-type]
    assert sorted(pool.sessions) == ["a", "a", "b", "b", "c", "c"] and len(pool.sent) == 3


def test_a_login_shell_that_prints_first_does_not_stop_the_shipping(tmp_path):
    from clusterctl.remote.targets import SshTarget

    pkg = nodepkg.package()
    pool = _ShellPool(tmp_path, ["n1"])
    pool.login = "echo Welcome; echo send me nothing; "
    assert nodepkg.ship_one(pool, SshTarget("n1", "n1")).ok  # type: ignore[arg-type]
    assert pool.sent == ["n1"] and (pool.homes["n1"] / pkg.path).read_bytes() == pkg.data


def test_bytes_other_than_the_names_are_not_kept(tmp_path):
    """The node keeps what arrives only when its sha256 is the name's: a copy cut short on the way is refused."""
    from clusterctl.remote.targets import SshTarget

    pkg = nodepkg.package()
    short = nodepkg.NodePackage(pkg.data[:1000], pkg.digest)
    pool = _ShellPool(tmp_path, ["n1"])
    r = nodepkg.ship_one(pool, SshTarget("n1", "n1"), short)  # type: ignore[arg-type]
    assert not r.ok and r.error == f"cannot put ~/{pkg.path}: its bytes arrived other than sent"
    assert sorted(p.name for p in (pool.homes["n1"] / nodepkg.NODE_DIR).iterdir()) == []


@pytest.mark.parametrize("broken", ["other bytes", "cut short"])
def test_a_file_that_is_not_what_its_name_says_is_replaced_and_said(tmp_path, capsys, broken):
    """A file of other bytes under the package's name, or the package cut short (a full disk, a killed copy): it
    used to run (or fail every later command with a SyntaxError); now it is replaced before it runs, in one line."""
    from clusterctl.remote.targets import SshTarget

    pkg = nodepkg.package()
    pool = _ShellPool(tmp_path, ["n1"])
    path = pool.homes["n1"] / pkg.path
    path.parent.mkdir(parents=True)
    path.write_bytes(b"print('not clusterctl')\n" if broken == "other bytes" else pkg.data[: len(pkg.data) // 2])
    r = nodepkg.ship_one(pool, SshTarget("n1", "n1"))  # type: ignore[arg-type]
    assert r.ok and pool.sent == ["n1"] and path.read_bytes() == pkg.data
    assert capsys.readouterr().err == nodepkg.replaced_line(pkg, "n1") + "\n"
    assert nodepkg.replaced_line(pkg, "n1") == (
        f"n1: ~/{pkg.path} was not the file its name says (other bytes, or cut short): replaced"
    )
    assert nodepkg.ship_one(pool, SshTarget("n1", "n1")).ok and pool.sent == ["n1"]  # type: ignore[arg-type]
    r = subprocess.run([SYSTEM_PYTHON, str(path), "nope"], capture_output=True, text=True)
    assert "SyntaxError" not in r.stderr and "not clusterctl" not in r.stdout


def test_the_digest_is_read_once_per_file_and_again_after_a_change(tmp_path):
    """The first check hashes the file and stamps it; later ones are one stat (a sha256sum that fails is never
    called); a write under the name (same size, other bytes) changes its ctime: hashed again, replaced."""
    from clusterctl.remote.targets import SshTarget

    pkg = nodepkg.package()
    pool = _ShellPool(tmp_path, ["n1"])
    target = SshTarget("n1", "n1")
    assert nodepkg.ship_one(pool, target).ok  # type: ignore[arg-type]
    assert nodepkg.ship_one(pool, target).ok  # type: ignore[arg-type]  # hashed and stamped
    path = pool.homes["n1"] / pkg.path
    assert path.with_name(path.name + ".ok").exists()
    fake = tmp_path / "fakebin"
    fake.mkdir()
    (fake / "sha256sum").write_text("#!/bin/sh\nexit 1\n")
    (fake / "sha256sum").chmod(0o755)
    pool.path = f"{fake}:/usr/bin:/bin"
    assert nodepkg.ship_one(pool, target).ok and pool.sent == ["n1"]  # type: ignore[arg-type]  # the stamp
    data = bytearray(path.read_bytes())
    data[100] ^= 1
    path.write_bytes(bytes(data))
    pool.path = "/usr/bin:/bin"
    assert nodepkg.ship_one(pool, target).ok and pool.sent == ["n1", "n1"]  # type: ignore[arg-type]
    assert path.read_bytes() == pkg.data
