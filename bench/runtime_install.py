#!/usr/bin/env python3
"""Putting the node runtime on N nodes: `up`'s runtime step against each node copying it from the operator.

For each N, a local cluster comes up with `--runtime none`; then, on the same nodes, one after another:

    clusterctl   the runtime step of `up` (runtime/install.py): probe, the cached pack relayed down sync's
                 chain (sha256-checked on every node), unpacked, verified, marked
    direct       every node at once pulls the pack straight from this machine over its own ssh and unpacks
                 it (`ssh node 'zstd -d | tar -x' < pack`): no relay, no verification

Wall time, and core-seconds per node from a cpuacct cgroup of this benchmark's own (it starts the nodes, so
their sshd sessions count). The pack comes from the runtime cache: run `./install.sh deps` and one `up`
first, or the first round includes the build. Needs root. Example:

    python bench/runtime_install.py --nodes 1 4 8

On these 2 shared cores every node's unpack competes for the same CPUs: the figures show the relay's cost,
not the 8-nodes-within-1.5x-of-1 goal, which holds where each node has its own cores and disk.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from localcluster import CLI, LocalCluster, sh
from owncpu import OwnCpu


def install_step(home: Path, name: str) -> str:
    """`up`'s runtime step on an existing cluster, as `up` runs it; returns the runtime id."""
    os.environ["CLUSTERCTL_HOME"] = str(home)
    from clusterctl.cluster import reach
    from clusterctl.remote.ssh import SshPool
    from clusterctl.runtime.install import RuntimeRequest, install
    from clusterctl.state import StateStore

    store = StateStore(home)
    cluster = store.load(name).cluster
    with SshPool(reach.ssh_settings(cluster, store)) as pool:
        fields = install(
            cluster,
            pool,
            reach.ssh_targets(cluster, store),
            reach.hosts_file(cluster).hosts,
            str(reach.paths(store, name).known_hosts),
            RuntimeRequest("install"),
            lambda m: None,
        )
    return fields["runtime"]


def direct(c: LocalCluster, rid: str) -> None:
    from clusterctl.runtime import cache

    pack = cache.entry(rid) / "runtime.tar.zst"
    ssh = [*c.ssh, "-c", "aes128-gcm@openssh.com"]

    def one(host: str) -> None:
        with open(pack, "rb") as f:
            subprocess.run([*ssh, host, "zstd -q -d -c | tar -x -C / -f -"], stdin=f, check=True, capture_output=True)

    with ThreadPoolExecutor(len(c.hosts)) as pool:
        list(pool.map(one, c.hosts))


def clear(c: LocalCluster) -> None:
    sh([*CLI, "run", "--cluster", c.name, "rm -rf /opt/clusterctl-runtime ~/.clusterctl/runtime"], env=c.env)


def run(nodes: int, cpu: OwnCpu) -> list[dict]:
    base = Path(tempfile.mkdtemp(prefix="rt-bench-"))
    c = LocalCluster("rb", nodes, base / "home", base)
    c.up()
    rows = []
    try:
        for method in ("clusterctl", "direct"):
            clear(c)
            c0, t0 = cpu.seconds(), time.monotonic()
            if method == "clusterctl":
                rid = install_step(c.home, c.name)
            else:
                direct(c, rid)
            wall, core = time.monotonic() - t0, cpu.seconds() - c0
            rows.append({"nodes": nodes, "method": method, "wall_s": wall, "core_s_per_node": core / nodes})
            print(
                f"   {method:<10} {nodes} node(s): {wall:6.1f} s wall, {core / nodes:5.1f} core-s per node", flush=True
            )
    finally:
        c.down()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[1, 4, 8])
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("Error: needs root (local clusters): run with sudo")
    cpu = OwnCpu()
    try:
        rows = [r for n in args.nodes for r in run(n, cpu)]
    finally:
        cpu.close()
    one = {r["method"]: r["wall_s"] for r in rows if r["nodes"] == min(args.nodes)}
    print("\n| nodes | method | wall s | x its 1-node time | core-s per node |\n|---:|---|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['nodes']} | {r['method']} | {r['wall_s']:.1f} | {r['wall_s'] / one[r['method']]:.2f} | "
            f"{r['core_s_per_node']:.1f} |"
        )
    print("\nload average now: " + " ".join(f"{x:.1f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main()
