"""The local record of clusters under ~/.clusterctl (CLUSTERCTL_HOME overrides).

A cache, not the truth: providers find their resources again by tags (AWS) or names (local).
Records are written atomically (temp file + rename), mode 0600, and every change to a cluster holds
an exclusive lock, so two `up`/`down` of one cluster cannot interleave: the second fails at once and
names the holder's PID. A record that is truncated or not ours is refused, never overwritten.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Literal, get_args

from clusterctl.errors import ConfigError, StateError
from clusterctl.types import Cluster

FORMAT = "clusterctl-state/1"
_NAME = re.compile(r"^[a-z][a-z0-9-]{0,30}$")


def validate_name(name: str) -> str:
    if not _NAME.match(name or ""):
        raise ConfigError(
            f"invalid cluster name {name!r}",
            "use 1-31 characters: lowercase letters, digits and '-', starting with a letter",
        )
    return name


def home() -> Path:
    return Path(os.environ.get("CLUSTERCTL_HOME") or Path.home() / ".clusterctl")


# What the record says of the cluster, as written:
#   creating  `up` began (before the first resource): still running, or it crashed (status tells which)
#   up        `up` finished; the nodes answered
#   stopped   `stop` or autostop stopped it (note says who, when and why: autostop's terminate leaves a stopped
#             record whose nodes are gone); `down` removes the record instead
Status = Literal["creating", "up", "stopped"]
STATUSES: tuple[str, ...] = get_args(Status)


@dataclass(frozen=True)
class Record:
    cluster: Cluster
    status: Status
    updated_at: float
    note: str = ""  # why the cluster is in this status (e.g. "idle-stop fired")

    @property
    def disks_kept(self) -> bool:
        """A stopped cluster whose nodes kept their disks (`start` or `up` brings it back), not one autostop
        terminated (its note says so)."""
        return self.status == "stopped" and not self.note.startswith("terminated")


class StateStore:
    def __init__(self, root: Path | None = None):
        self.root = Path(root) if root else home()
        tighten(self.root)

    # ---- paths ---------------------------------------------------------------------------------
    def cluster_dir(self, name: str) -> Path:
        return self.root / "clusters" / validate_name(name)

    def record_path(self, name: str) -> Path:
        return self.cluster_dir(name) / "cluster.json"

    def ensure_dir(self, name: str) -> Path:
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)
        d = self.cluster_dir(name)
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
        return d

    # ---- locking -------------------------------------------------------------------------------
    @contextlib.contextmanager
    def lock(self, name: str) -> Iterator[None]:
        """Exclusive, non-blocking: a second holder fails at once, naming the first one's PID."""
        d = self.ensure_dir(name)
        fd = os.open(d / "lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
                raise StateError(
                    f"cluster {name!r} is busy: another clusterctl (pid {holder}) is changing it",
                    "wait for it to finish, or stop that process",
                ) from None
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            yield
        finally:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
            os.close(fd)  # closing releases the flock

    # ---- records -------------------------------------------------------------------------------
    def save(self, record: Record) -> None:
        d = self.ensure_dir(record.cluster.name)
        data = {
            "format": FORMAT,
            "status": record.status,
            "updated_at": record.updated_at,
            "note": record.note,
            "cluster": record.cluster.to_dict(),
        }
        atomic_write(d / "cluster.json", json.dumps(data, indent=2, sort_keys=True) + "\n")

    def load(self, name: str) -> Record:
        path = self.record_path(name)
        try:
            text = path.read_text()
        except FileNotFoundError:
            raise StateError(
                f"no cluster named {name!r}", "see `clusterctl ls`, or bring it up with `clusterctl up`"
            ) from None
        return self._parse(path, text)

    def exists(self, name: str) -> bool:
        return self.record_path(name).exists()

    def _parse(self, path: Path, text: str) -> Record:
        try:
            data = json.loads(text)
            if not isinstance(data, dict) or data.get("format") != FORMAT:
                raise ValueError("not a clusterctl state record")
            status = data["status"]
            if status not in STATUSES:
                raise ValueError(f"status {status!r}")
            return Record(
                cluster=Cluster.from_dict(data["cluster"]),
                status=status,
                updated_at=float(data["updated_at"]),
                note=str(data.get("note", "")),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise StateError(
                f"state file {path} is damaged or not clusterctl's ({exc.__class__.__name__})",
                "move it aside; `clusterctl down NAME` still finds the cluster's resources without it",
            ) from None

    def list(self) -> tuple[list[Record], list[str]]:
        """(every readable record, one line per damaged one). A damaged record is skipped, not fatal, so
        ls, gc and down --all go on with the others; the caller shows the lines (state never prints)."""
        records: list[Record] = []
        damaged: list[str] = []
        base = self.root / "clusters"
        if not base.is_dir():
            return records, damaged
        for d in sorted(base.iterdir()):
            path = d / "cluster.json"
            if path.is_file():
                try:
                    records.append(self._parse(path, path.read_text(errors="replace")))
                except (StateError, OSError) as exc:
                    damaged.append(f"skipped cluster {d.name!r}: {exc}")
        return records, damaged

    def delete(self, name: str) -> None:
        """Remove the cluster's record and keys (after its resources are gone)."""
        d = self.cluster_dir(name)
        if d.exists():
            shutil.rmtree(d)
        if self.current() == name:
            (self.root / "current").unlink(missing_ok=True)

    # ---- the default cluster -------------------------------------------------------------------
    def current(self) -> str | None:
        try:
            name = (self.root / "current").read_text().strip()
        except FileNotFoundError:
            return None
        return name if _NAME.match(name) else None

    def set_current(self, name: str) -> None:
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        atomic_write(self.root / "current", validate_name(name) + "\n")

    def resolve(self, name: str | None) -> Record:
        """The cluster named, or the last one brought up."""
        if name is None:
            name = self.current()
            if name is None:
                raise StateError(
                    "no cluster given and none is current", "pass -c/--cluster NAME (`clusterctl ls` lists them)"
                )
        return self.load(name)


def tighten(root: Path) -> None:
    """An existing CLUSTERCTL_HOME of ours is made 0700 (keys, records and the agent socket live there)."""
    try:
        st = root.stat()
        if st.st_uid == os.getuid() and st.st_mode & 0o077:
            os.chmod(root, 0o700)
    except OSError:
        pass


def atomic_write(path: Path, text: str, mode: int = 0o600) -> None:
    """Write-then-rename in the same directory, so a reader sees the old file or the new, never half."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def now() -> float:
    return time.time()
