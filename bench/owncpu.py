"""CPU time as the benchmarks here count it: their own (a cpuacct cgroup) and the machine's."""

from __future__ import annotations

import os
import time
from pathlib import Path


class OwnCpu:
    """CPU time of this benchmark and everything it starts (the nodes' sshd and sessions included), from
    a cpuacct cgroup of its own: on a machine others use too, the machine-wide figure is not ours."""

    ROOT = Path("/sys/fs/cgroup/cpuacct")

    def __init__(self):
        self.path = self.ROOT / f"clusterctl-bench-{os.getpid()}"
        self.ok = False
        try:
            self.path.mkdir()
            (self.path / "cgroup.procs").write_text(str(os.getpid()))
            self.ok = True
        except OSError as exc:
            print(f"(no cpuacct cgroup: {exc}; only the machine-wide CPU is shown)", flush=True)

    def seconds(self) -> float:
        return int((self.path / "cpuacct.usage").read_text()) / 1e9 if self.ok else float("nan")

    def close(self) -> None:
        if self.ok:
            (self.ROOT / "cgroup.procs").write_text(str(os.getpid()))
            for _ in range(50):
                try:
                    self.path.rmdir()
                    return
                except OSError:
                    time.sleep(0.1)


def cpu_busy() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine so far: two readings make its busy share between them."""
    with open("/proc/stat") as f:
        parts = [float(x) for x in f.readline().split()[1:]]
    idle = parts[3] + parts[4]
    return sum(parts) - idle, sum(parts)
