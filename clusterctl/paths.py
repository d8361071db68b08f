"""This machine's clusterctl folders outside any CLUSTERCTL_HOME (core: stdlib only): the node runtime cache
and install.sh's wheelhouse. runtime/cache.py builds into them; the local provider hides them from its
nodes (boot.operator_paths) without importing the runtime package."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_RUNTIME_CACHE = "/var/cache/clusterctl/runtimes"
DEFAULT_WHEELHOUSE = "/var/cache/clusterctl/wheelhouse"


def runtime_cache() -> Path:
    """Built runtimes by id (CLUSTERCTL_RUNTIME_CACHE overrides)."""
    return Path(os.environ.get("CLUSTERCTL_RUNTIME_CACHE") or DEFAULT_RUNTIME_CACHE)


def wheelhouse() -> Path:
    """install.sh's wheels, so a runtime builds offline (CLUSTERCTL_WHEELHOUSE overrides)."""
    return Path(os.environ.get("CLUSTERCTL_WHEELHOUSE") or DEFAULT_WHEELHOUSE)
