"""clusterctl/node/ as one zipapp, named by the sha256 of its bytes, put on a node only when it lacks it.

The archive is built here from the package's sources, byte for byte the same for the same sources (entries
sorted, every timestamp and mode fixed), so its name, `node-<sha256[:16]>.pyz`, is a function of the code:
a node that has the name has the code, and an upgrade is a new name beside the old one, never a file
rewritten under a running program. It lives at one path under the login home of every node
(`~/.clusterctl/node/`), put there in the same ssh session that finds it missing (one round for every node:
ship_command), written under a temporary name, its sha256 checked, and renamed. A node runs it as
`python3 PYZ PROGRAM ARGS...` with any Python 3 it has: the archive holds only clusterctl/node/ and an
empty clusterctl/__init__.py, so nothing else of clusterctl can be imported there.

One program alone (`program=`: its module and what it imports of the package, found by reading the
imports) makes a smaller set by the same rules; unpacked, a folder of those files runs the same way
(`python3 FOLDER PROGRAM`): the autostop watchdog's, written by EC2 user data (16 KB at most).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import io
import shlex
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import clusterctl.node
from clusterctl.types import HostResult, RunReport

if TYPE_CHECKING:
    from clusterctl.remote.ssh import SshPool
    from clusterctl.remote.targets import SshTarget

SOURCE = Path(clusterctl.node.__file__).resolve().parent
NODE_DIR = ".clusterctl/node"  # under the login home of every node
SEND = "CLUSTERCTL-SEND"  # a node's line asking for the package (ship_command)
_EPOCH = (1980, 1, 1, 0, 0, 0)  # the earliest time a zip entry can hold: no build time in the bytes
# Guarded, so that running it under another name runs nothing. (multiprocessing's spawn does not run a zipapp's
# __main__ again in its children, whose __spec__ name is "__main__": a child has only what it imports.)
_MAIN = b"""import os
import sys

from clusterctl.node.__main__ import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], os.path.basename(sys.argv[0])))
"""


@dataclass(frozen=True)
class NodePackage:
    data: bytes
    digest: str  # sha256 of data, hex

    @property
    def name(self) -> str:
        return f"node-{self.digest[:16]}.pyz"

    @property
    def path(self) -> str:
        """Relative to the login home (SFTP and a login shell both start there)."""
        return f"{NODE_DIR}/{self.name}"

    def at(self, home: str) -> str:
        """The absolute path under a login home (horovodrun's ranks get their argv quoted: no $HOME there)."""
        return f"{home}/{self.path}"

    @property
    def shell_path(self) -> str:
        """The path as one shell word, right from any folder."""
        return f'"$HOME"/{self.path}'

    def command(self, program: str, *args: str, python: str = "python3") -> str:
        """A shell command running one program of the package."""
        words = (shlex.quote(python), self.shell_path, shlex.quote(program), *(shlex.quote(a) for a in args))
        return " ".join(words)


def sources(root: Path = SOURCE, program: str | None = None) -> dict[str, bytes]:
    """Archive name -> bytes of every module of the package (or of one program and what it imports), in
    name order."""
    files = {f"clusterctl/node/{p.relative_to(root).as_posix()}": p.read_bytes() for p in root.rglob("*.py")}
    if program is not None:
        from clusterctl.node.__main__ import PROGRAMS

        wanted = _imported(files, ["clusterctl.node.__main__", PROGRAMS[program]])
        files = {name: data for name, data in files.items() if name in wanted}
    return dict(sorted(files.items()))


def _file_of(files: dict[str, bytes], module: str) -> str | None:
    """The archive name of a module of the package (a module file or a package's __init__), None if none."""
    base = module.replace(".", "/")
    return next((n for n in (f"{base}.py", f"{base}/__init__.py") if n in files), None)


def _imported(files: dict[str, bytes], modules: list[str]) -> set[str]:
    """The archive names of `modules`, the packages above them and every module of the package they import,
    through and through (imports inside functions too)."""
    found: set[str] = set()
    todo = list(modules)
    while todo:
        parts = todo.pop().split(".")
        for i in range(2, len(parts) + 1):  # the module and its packages (clusterctl/__init__.py: build's own)
            name = _file_of(files, ".".join(parts[:i]))
            if name is not None and name not in found:
                found.add(name)
                todo += _imports(name, files[name])
    return found


def _imports(name: str, data: bytes) -> list[str]:
    """What one file imports: modules, and `from` names that may be modules; relative imports resolved."""
    package = name.removesuffix(".py").replace("/", ".").removesuffix(".__init__")
    if not name.endswith("/__init__.py"):
        package = package.rpartition(".")[0]
    out: list[str] = []
    for node in ast.walk(ast.parse(data)):
        if isinstance(node, ast.Import):
            out += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            source = ".".join(filter(None, (base, node.module)))
            out += [source, *(f"{source}.{alias.name}" for alias in node.names)]
    return out


def entries(root: Path = SOURCE, program: str | None = None) -> dict[str, bytes]:
    """Every file of the archive (or of one program's): the launcher, clusterctl/__init__.py, the sources."""
    return {"__main__.py": _MAIN, "clusterctl/__init__.py": b"", **sources(root, program)}


def build(root: Path = SOURCE) -> NodePackage:
    """The zipapp of the package at root: the same sources give the same bytes."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in entries(root).items():
            info = zipfile.ZipInfo(name, date_time=_EPOCH)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o100644 << 16  # a regular file, rw-r--r--, whatever the checkout's modes
            info.create_system = 3  # unix, whichever system built it
            archive.writestr(info, data, compresslevel=9)
    data = buffer.getvalue()
    return NodePackage(data, hashlib.sha256(data).hexdigest())


@functools.cache
def package() -> NodePackage:
    """This installation's package, built once per process (it takes milliseconds)."""
    return build()


def ship_command(pkg: NodePackage) -> str:
    """On a node: exit 0 when the package there is the one its name says (its sha256 read once per file: a stamp
    beside it, NAME.ok, keeps the size, mtime, ctime and inode it was read at, so a later check is one stat);
    else say `CLUSTERCTL-SEND 1` (missing) or `... 2` (other bytes, or cut short), take the package on stdin, keep it
    only when its sha256 is the name's (exit 3 when not), rename it over the name and stamp it."""
    sha_ok = f'h=$(sha256sum < "$f") && [ "${{h%% *}}" = {pkg.digest} ]'
    stamp = 'echo "$m" > "$f.ok.tmp" && mv -f "$f.ok.tmp" "$f.ok"'
    stat = "m=$(stat -L -c '%s %y %z %i' \"$f\")"
    return (
        f'f={shlex.quote(pkg.path)}; s=1; if [ -f "$f" ]; then '
        f'{stat} && [ "$(cat "$f.ok" 2>/dev/null)" = "$m" ] && exit 0; '
        f"{sha_ok} && {{ {stamp}; exit 0; }}; s=2; fi; "
        f'echo "{SEND} $s"; t="$f.tmp.$$"; (umask 077 && mkdir -p {shlex.quote(NODE_DIR)}) && cat > "$t" && '
        f'{sha_ok.replace("$f", "$t")} && chmod 644 "$t" && mv -f "$t" "$f" || {{ rm -f "$t"; exit 3; }}; '
        f"{stat} && {sha_ok} && {stamp}; exit 0"  # stamped as a later check would: stat, then its bytes read
    )


def replaced_line(pkg: NodePackage, host: str) -> str:
    return f"{host}: ~/{pkg.path} was not the file its name says (other bytes, or cut short): replaced"


def ship_one(pool: SshPool, target: SshTarget, pkg: NodePackage | None = None, timeout: float = 60.0) -> HostResult:
    """The package onto one node unless it has it, whole, in one ssh session (ship_command: one stat when it
    has it, checked before; the bytes sent only when the node asks, and kept only when their sha256 is the
    name's); a file of other bytes under its name is replaced, and said on stderr in one line."""
    from clusterctl.remote.connect import describe_connect_error

    pkg = pkg or package()
    start = time.monotonic()
    try:
        chan = pool.client(target).get_transport().open_session(timeout=timeout)
    except Exception as exc:  # unreachable: a value, as every SshPool call gives it
        return HostResult(target.label, None, error=describe_connect_error(target, exc), duration_s=0.0)
    try:
        chan.settimeout(timeout)
        chan.exec_command(ship_command(pkg))
        asked: list[bytes] = []
        for line in chan.makefile("rb"):  # a login shell's own lines, if it prints any, come first
            if line.startswith(SEND.encode()):
                asked = line.split()
                chan.sendall(pkg.data)
                break
        chan.shutdown_write()
        if not chan.status_event.wait(timeout):
            raise TimeoutError(f"no answer in {timeout:g} s")
        code = chan.recv_exit_status()
        err = chan.makefile_stderr("rb").read().decode(errors="replace").strip()
    except Exception as exc:
        return HostResult(
            target.label, None, error=f"connection lost: {exc}"[:300], duration_s=time.monotonic() - start
        )
    finally:
        chan.close()
    took = time.monotonic() - start
    if code != 0:
        why = err[-200:] or ("its bytes arrived other than sent" if code == 3 else f"exit {code}")
        return HostResult(target.label, None, error=f"cannot put ~/{pkg.path}: {why}", duration_s=took)
    if asked[1:] == [b"2"]:
        sys.stderr.write(replaced_line(pkg, target.label) + "\n")
    return HostResult(target.label, 0, duration_s=took)


def ship(pool: SshPool, targets: Sequence[SshTarget], pkg: NodePackage | None = None) -> RunReport:
    """The package onto every target that lacks it."""
    pkg = pkg or package()
    return pool.fan_out(targets, lambda t: ship_one(pool, t, pkg), parallel=64)
