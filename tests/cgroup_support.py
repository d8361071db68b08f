"""CPU held back or favoured for the processes a test names: a cgroup of its own (removed afterwards) where a
slow node or a slow rank is what the test is about."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path


def node_pids(cluster: str, index: int) -> list[int]:
    """Every process of node `index`: its namespace's process tree (sshd, the PID 1 netns.py starts); what they
    fork later is in the group too."""
    from clusterctl.providers.local import netns

    return list(netns.netns_pids(netns.netns_name(cluster, index)))


@contextmanager
def cpu_group(pids: Iterable[int], cores: float | None = None, weight: int | None = None) -> Iterator[None]:
    """`pids` (and what they fork from now on) held to at most `cores` CPUs (the CFS bandwidth limit), and/or
    weighing `weight` plain processes when the CPUs are contended. cgroup v2's cpu.max and cpu.weight where the
    unified hierarchy has the cpu controller; else v1's cfs quota and cpu.shares (this machine mounts cgroups
    hybrid, with cpu on v1: the same limits under other names)."""
    period = 100_000
    unified = Path("/sys/fs/cgroup")
    v2 = (unified / "cgroup.controllers").exists() and "cpu" in (unified / "cgroup.controllers").read_text().split()
    root = unified if v2 else unified / "cpu"
    group = root / f"clusterctl-test-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    try:
        if cores is not None:
            quota = int(cores * period)
            if v2:
                (group / "cpu.max").write_text(f"{quota} {period}")
            else:
                (group / "cpu.cfs_period_us").write_text(str(period))
                (group / "cpu.cfs_quota_us").write_text(str(quota))
        if weight is not None:  # v2's default weight is 100 (at most 10000), v1's shares 1024
            knob, value = ("cpu.weight", min(100 * weight, 10_000)) if v2 else ("cpu.shares", 1024 * weight)
            (group / knob).write_text(str(value))
        for pid in pids:
            try:
                (group / "cgroup.procs").write_text(str(pid))
            except (ProcessLookupError, OSError):
                pass  # gone meanwhile
        yield
    finally:
        for _ in range(50):  # back to the root group, forks included, then the group can go
            left = (group / "cgroup.procs").read_text().split()
            if not left:
                break
            for pid in left:
                try:
                    (root / "cgroup.procs").write_text(pid)
                except OSError:
                    pass
        group.rmdir()
