"""clusterctl/node/ as one zipapp, named by the sha256 of its bytes, put on a node only when it lacks it.

The archive is built here from the package's sources, byte for byte the same for the same sources (entries
sorted, every timestamp and mode fixed), so its name, `node-<sha256[:16]>.pyz`, is a function of the code:
a node that has the name has the code, and an upgrade is a new name beside the old one, never a file
rewritten under a running program. It lives at one path under the login home of every node
(`~/.clusterctl/node/`), written under a temporary name and renamed (SshPool.put_one). A node runs it as
`python3 PYZ PROGRAM ARGS...` with any Python 3 it has: the archive holds only clusterctl/node/ and an
empty clusterctl/__init__.py, so nothing else of clusterctl can be imported there.
"""

from __future__ import annotations

import functools
import hashlib
import io
import shlex
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


def sources(root: Path = SOURCE) -> dict[str, bytes]:
    """Archive name -> bytes of every module of the package, in name order."""
    files = {f"clusterctl/node/{p.relative_to(root).as_posix()}": p.read_bytes() for p in root.rglob("*.py")}
    return dict(sorted(files.items()))


def build(root: Path = SOURCE) -> NodePackage:
    """The zipapp of the package at root: the same sources give the same bytes."""
    entries = {"__main__.py": _MAIN, "clusterctl/__init__.py": b"", **sources(root)}
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in entries.items():
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


def ship_one(pool: SshPool, target: SshTarget, pkg: NodePackage | None = None) -> HostResult:
    """The package onto one node unless it has it (one `test -f` when it does)."""
    pkg = pkg or package()
    present = f"test -f {shlex.quote(pkg.path)}"
    there = pool.run_one(target, present, timeout=30)
    if there.exit_code == 0 or there.exit_code is None:  # there already, or unreachable (said by the check)
        return there
    put = pool.put_one(target, {pkg.path: (pkg.data, 0o644)})
    if not put.ok and pool.run_one(target, present, timeout=30).exit_code == 0:
        return HostResult(target.label, 0)  # another run put the same bytes there first
    return put


def ship(pool: SshPool, targets: Sequence[SshTarget], pkg: NodePackage | None = None) -> RunReport:
    """The package onto every target that lacks it."""
    pkg = pkg or package()
    return pool.fan_out(targets, lambda t: ship_one(pool, t, pkg), parallel=64)
