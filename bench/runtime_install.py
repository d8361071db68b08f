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
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from sync_bench import OwnCpu  # noqa: E402

CLUSTERCTL = [sys.executable, "-m", "clusterctl"]


def sh(argv, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=True, capture_output=True, text=True, **kw)


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


def direct(home: Path, name: str, hosts: list[str], rid: str) -> None:
    from clusterctl.runtime import cache

    pack = cache.entry(rid) / "runtime.tar.zst"
    cdir = home / "clusters" / name
    ssh = [
        "ssh",
        "-F",
        "/dev/null",
        "-i",
        str(cdir / "id_ed25519"),
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        f"UserKnownHostsFile={cdir / 'known_hosts'}",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "BatchMode=yes",
        "-c",
        "aes128-gcm@openssh.com",
        "-l",
        "root",
    ]

    def one(host: str) -> None:
        with open(pack, "rb") as f:
            subprocess.run([*ssh, host, "zstd -q -d -c | tar -x -C / -f -"], stdin=f, check=True, capture_output=True)

    with ThreadPoolExecutor(len(hosts)) as pool:
        list(pool.map(one, hosts))


def clear(home: Path, name: str) -> None:
    sh(
        [*CLUSTERCTL, "run", "--cluster", name, "rm -rf /opt/clusterctl-runtime ~/.clusterctl/runtime"],
        env={**os.environ, "CLUSTERCTL_HOME": str(home)},
    )


def run(nodes: int, cpu: OwnCpu) -> list[dict]:
    base = Path(tempfile.mkdtemp(prefix="rt-bench-"))
    home, name = base / "home", "rb" + uuid.uuid4().hex[:6]
    env = {**os.environ, "CLUSTERCTL_HOME": str(home)}
    sh(
        [
            *CLUSTERCTL,
            "up",
            "--provider",
            "local",
            "--name",
            name,
            "--nodes",
            str(nodes),
            "--yes",
            "--runtime",
            "none",
            "--hosts-file",
            str(base / "hosts"),
        ],
        env=env,
    )
    hosts = [line.split()[0] for line in (base / "hosts").read_text().splitlines()]
    rows = []
    try:
        for method in ("clusterctl", "direct"):
            clear(home, name)
            c0, t0 = cpu.seconds(), time.monotonic()
            if method == "clusterctl":
                rid = install_step(home, name)
            else:
                direct(home, name, hosts, rid)
            wall, core = time.monotonic() - t0, cpu.seconds() - c0
            rows.append({"nodes": nodes, "method": method, "wall_s": wall, "core_s_per_node": core / nodes})
            print(
                f"   {method:<10} {nodes} node(s): {wall:6.1f} s wall, {core / nodes:5.1f} core-s per node", flush=True
            )
    finally:
        subprocess.run([*CLUSTERCTL, "down", name, "--yes"], env=env, capture_output=True)
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
