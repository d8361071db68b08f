"""Runtimes built on this machine, for local clusters, cached by id outside any CLUSTERCTL_HOME.

A local node's base OS is this machine's, so this machine builds the runtime once: in a private mount
namespace whose /opt is an empty tmpfs, at the runtime's final path (the same absolute path the nodes will
have), from install.sh's wheelhouse when there is one (offline: Horovod is never rebuilt), then packed into
CACHE/<id>/. Nothing of the operator's own environment is in the namespace's /opt, and the build leaves
nothing there: the pack is all that stays.

A cache entry is complete when its runtime.json exists (the build script writes it last); builds of one id
are serialised by a lock file, so parallel `up`s build once.
"""

from __future__ import annotations

import fcntl
import os
import shlex
import subprocess
from pathlib import Path
from typing import Callable

from clusterctl import paths, resources
from clusterctl.errors import NeedsRootError, ProvisionError
from clusterctl.runtime.spec import INFO, PACK, ROOT, Build, Platform, RuntimeSpec, build_argv, runtime_id


def entry(rid: str) -> Path:
    return paths.runtime_cache() / rid


def complete(rid: str) -> bool:
    d = entry(rid)
    return (d / INFO).is_file() and (d / PACK).is_file()


def ensure(spec: RuntimeSpec, platform: Platform, report: Callable[[str], None]) -> tuple[Path, bool]:
    """The cache folder holding PACK and INFO for this spec and platform, built here if missing.
    Returns (folder, built_now)."""
    rid = runtime_id(spec, platform)
    if complete(rid):
        return entry(rid), False
    if os.geteuid() != 0:
        raise NeedsRootError(
            "building a node runtime for local nodes needs root (a private mount namespace)",
            "run clusterctl as root, e.g. with sudo",
        )
    if not os.path.exists(platform.python_path):
        raise ProvisionError(
            f"the nodes' python3 ({platform.python_path}) is not on this machine, so it cannot build their runtime",
            "local nodes share this machine's base OS: install python3",
        )
    paths.runtime_cache().mkdir(parents=True, exist_ok=True, mode=0o755)
    lock = os.open(paths.runtime_cache() / f".{rid}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another `up` may be building this very id: wait for it
        if complete(rid):
            return entry(rid), False
        _build(Build(rid, spec, platform, str(entry(rid)), *_sources()), report)
        if not complete(rid):
            raise ProvisionError(f"building runtime {rid} finished without its pack", "see the lines above")
        return entry(rid), True
    finally:
        os.close(lock)


def _sources() -> tuple[str, bool]:
    """install.sh's wheelhouse (offline, Horovod prebuilt) when it exists; else the package index."""
    wh = paths.wheelhouse()
    if wh.is_dir() and any(wh.glob("horovod-*.whl")):
        return str(wh), True
    return "", False


def _build(build: Build, report: Callable[[str], None]) -> None:
    script = str(resources.template_path("runtime_build.sh"))
    # A private mount namespace: /opt is an empty tmpfs, so the build sees none of this machine's /opt and
    # writes its tree at the runtime's final path without touching the real /opt.
    inner = (
        f"mount -t tmpfs -o mode=0755 clusterctl-runtime /opt && mkdir -p {shlex.quote(ROOT)} && "
        f"exec {shlex.join(build_argv(script, build))}"
    )
    report(
        f"building node runtime {build.rid} on this machine "
        f"({'from the wheelhouse ' + build.find_links if build.no_index else 'from the package index'})"
    )
    proc = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", inner],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    tail: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip()
            tail = (tail + [line])[-20:]
            if line.startswith("runtime: "):
                report(f"  {line[len('runtime: ') :]}")
        code = proc.wait()
    except BaseException:  # Ctrl-C: the whole build goes, it never reaches runtime.json
        os.killpg(proc.pid, 9)
        proc.wait()
        raise
    if code != 0:
        raise ProvisionError(
            f"building the node runtime failed (exit {code}): {' | '.join(tail[-3:])}",
            "see the output above; `./install.sh deps` builds the wheelhouse it installs from",
        )
