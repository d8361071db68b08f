"""The hosts file `up` leaves in the working folder (./hosts, or --hosts-file PATH): written only where no file is,
or over one clusterctl wrote and nobody changed since. Anything else there (an Ansible inventory, /etc/hosts when
run from /etc) is the user's: `up` refuses before it launches anything.

Which files clusterctl wrote is kept beside them, not in them: horovodrun's hosts-file parser raises on a `#`
line, so the file carries no marker. A sidecar `.NAME.clusterctl` next to it holds the sha256 of what was
written (beside the file, so any clusterctl on the machine, whatever its CLUSTERCTL_HOME, knows its own); a file
is clusterctl's while its digest still matches.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from clusterctl.errors import ConfigError
from clusterctl.state import atomic_write


def sidecar(path: Path) -> Path:
    path = Path(path)
    return path.with_name(f".{path.name}.clusterctl")


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _recorded(path: Path) -> str | None:
    try:
        words = sidecar(path).read_text().split()
    except OSError:
        return None
    return words[1] if len(words) >= 2 and words[0] == "sha256" else None


def problem(path: Path) -> str | None:
    """Why `up` may not write `path` (None: it may): something is there that clusterctl did not write."""
    if not os.path.lexists(path):
        return None
    if os.path.islink(path) or not os.path.isfile(path):
        return f"{path} exists and is not a hosts file clusterctl wrote"
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        return f"{path} exists and cannot be read ({exc.strerror})"
    if _recorded(path) != _digest(data):
        return f"{path} exists and clusterctl did not write it (or it was changed since)"
    return None


def check(path: Path) -> None:
    """Refuse, naming the ways out, when `up` may not write `path`."""
    why = problem(path)
    if why is not None:
        raise ConfigError(
            why,
            f"pass --hosts-file PATH to write the cluster's hosts file elsewhere, or move {path} away; "
            "`up` never overwrites a file it did not write",
        )


def write(path: Path, text: str, cluster: str) -> bool:
    """Write `path` and its sidecar; False (nothing written) when the file there is, by now, not clusterctl's
    (made while `up` ran)."""
    if problem(path) is not None:
        return False
    atomic_write(sidecar(path), f"sha256 {_digest(text.encode())} written by clusterctl up {cluster}\n", mode=0o644)
    atomic_write(path, text, mode=0o644)
    return True
