#!/usr/bin/env python3
"""Putting one dataset on N nodes: `clusterctl sync` against what users would otherwise run.

Builds a local cluster (namespace nodes, real sshd), shapes every link with tc htb (the host side of
every veth, every node's eth0, and the bridge: the source's side), makes a dataset of a few hundred MB
in a few thousand files, and times, one after another on the same cluster:

    clusterctl sync      the pipelined relay (chain), end to end: manifest, stream, sha256 check, marker
    clusterctl-disk      the same with --verify disk (every copy read back, as before verify-on-receive)
    clusterctl-ref       another checkout's clusterctl (--ref-repo: e.g. the commit before a change)
    sequential           the recipe's copyclust loop: rsync -a to one node after another
    parallel             rsync -a from the source to every node at once
    tree                 a binary tree of rsync hops (every node that has the data sends to one more)
    bare chain           tar | tee | ssh down the nodes by hand (no manifest, no verification), aes128-gcm;
                         bare-chain-chacha: the same with chacha20-poly1305 (the cipher choice, measured)

Each as a ratio to the one-copy limit (dataset size / link rate), with the machine's CPU use, the bench's
own core-seconds per GB per hop (its cgroup: source, nodes and sshds; hops = N), and every node's copy
checked against the source (sha256 of every file). Every N gets a cluster of its own under a new
CLUSTERCTL_HOME (bench/localcluster.py), so the first clusterctl round is a first sync: the node package
shipped, a hop's rate measured. The methods are bench/sync_methods.py's. Needs root. Example:

    python bench/sync_bench.py --nodes 4 8 --rate 450 --size-mb 400 --files 2000
    python bench/sync_bench.py --nodes 8 --rate 150 --methods clusterctl
    python bench/sync_bench.py --small-files 200000 --nodes 4 --rate 450 --repeat 2
        # files/s against one bare tar | ssh copy to one node and the bare chain to all N (links unshaped
        # unless --rate is given; --rate 0: unshaped)
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from owncpu import OwnCpu, cpu_busy
from sync_methods import METHODS, TREE_DIGEST, Bench


def tree_digest(root: Path) -> str:
    """The digest of a folder here as Bench.digests takes it on the nodes."""
    cmd = f"cd {shlex.quote(str(root))} && {TREE_DIGEST}"
    return subprocess.run(cmd, shell=True, capture_output=True, text=True, executable="/bin/bash").stdout.split()[0]


def make_dataset(root: Path, size_mb: int, files: int) -> tuple[int, str]:
    root.mkdir(parents=True, exist_ok=True)
    per = size_mb * 1_000_000 // files
    block = os.urandom(1 << 20)
    for i in range(files):
        sub = root / f"shard-{i % 16:02d}"
        sub.mkdir(exist_ok=True)
        off = (i * 7919) % ((1 << 20) - 1)
        data = (block[off:] + block[:off]) * (per // (1 << 20) + 1)
        (sub / f"img-{i:05d}.bin").write_bytes(i.to_bytes(8, "big") + data[: per - 8])
    return per * files, tree_digest(root)


def make_small_files(root: Path, files: int, size: int = 4000) -> tuple[int, str]:
    """`files` files of `size` bytes in 1,000 folders (ImageNet's shape, smaller files)."""
    block = os.urandom(1 << 20)
    for i in range(files):
        sub = root / f"n{i % 1000:05d}"
        if i < 1000:
            sub.mkdir(parents=True, exist_ok=True)
        off = (i * 7919) % ((1 << 20) - size)
        (sub / f"img-{i:07d}.jpg").write_bytes(i.to_bytes(8, "big") + block[off : off + size - 8])
    return size * files, tree_digest(root)


SMALL_METHODS = ("bare-one", "bare-chain", "clusterctl")


def run_small(args) -> list[dict]:
    """Many small files: clusterctl sync to N nodes, verified, against two yardsticks timed in the same
    rounds (interleaved): one bare `tar | ssh` copy to ONE node, and the bare chain (tar | tee | ssh to all
    N, unverified; on a machine of few cores, N nodes extracting cost N times one, so only the chain is a
    like-for-like yardstick). Links shaped at --rate when it is given and > 0, else unshaped (the per-file
    cost is what is measured). files/s, the ratios, and the bench's own cgroup CPU (core-s)."""
    work = Path(tempfile.mkdtemp(prefix="sync-bench-", dir="/var/tmp"))
    results = []
    own = OwnCpu()
    rate = args.rate or 0.0
    methods = SMALL_METHODS + (("clusterctl-ref",) if args.ref_repo else ())
    try:
        src = work / "small"
        t0 = time.perf_counter()
        size, digest = make_small_files(src, args.small_files)
        print(
            f"dataset: {args.small_files} files, {size / 1e6:.0f} MB in 1,000 folders (made in "
            f"{time.perf_counter() - t0:.0f} s); links "
            + (f"shaped at {rate:g} Mbit/s (one-copy limit {size * 8 / (rate * 1e6):.1f} s)" if rate else "unshaped"),
            flush=True,
        )
        for n in args.nodes:
            b = Bench(n, rate, work / f"home{n}", work, args.ref_repo)
            b.up()
            try:
                if rate:
                    b.shape(rate)
                for method in [m for _ in range(args.repeat) for m in methods]:
                    b.prepare()
                    o0 = own.seconds()
                    secs = b.timed(method, src)
                    ours = own.seconds() - o0
                    digests = b.digests()
                    ok = sum(1 for d in (digests[:1] if method == "bare-one" else digests) if d == [digest])
                    row = {
                        "nodes": n,
                        "rate_mbit": rate,
                        "method": method,
                        "seconds": round(secs, 2),
                        "files": args.small_files,
                        "files_per_s": round(args.small_files / secs),
                        "own_cpu_seconds": round(ours, 1),
                        "verified_nodes": ok,
                        "notes": b.notes,
                    }
                    if method.startswith("clusterctl"):
                        row["phases_s"] = {k: round(v, 2) for k, v in b.phases}
                    results.append(row)
                    print(
                        f"  {method:<14} {secs:7.1f} s  {args.small_files / secs:8.0f} files/s  {ours:6.1f} core-s "
                        f"({'1 node' if method == 'bare-one' else f'{n} nodes, right on {ok}/{n}'})"
                        + (f"  (phases at: {row['phases_s']}; {'; '.join(b.notes)})" if b.notes else ""),
                        flush=True,
                    )
                b.clear()
            finally:
                b.down()
            rows = [r for r in results if r["nodes"] == n]
            best = {m: min((r for r in rows if r["method"] == m), key=lambda r: r["seconds"]) for m in methods}
            print(f"N={n}, best of {args.repeat} (spread: min-max s; the machine is shared):", flush=True)
            for m in methods:
                r, secs = best[m], [x["seconds"] for x in rows if x["method"] == m]
                print(
                    f"  {m:<14} {r['seconds']:7.1f} s  {r['files_per_s']:8d} files/s  "
                    f"{r['seconds'] / best['bare-one']['seconds']:5.2f}x one copy  "
                    f"{r['seconds'] / best['bare-chain']['seconds']:5.2f}x bare chain  "
                    f"{r['own_cpu_seconds']:6.1f} core-s  (spread {min(secs):.1f}-{max(secs):.1f} s)",
                    flush=True,
                )
    finally:
        shutil.rmtree(work, ignore_errors=True)
        own.close()
    return results


def run(args) -> list[dict]:
    work = Path(tempfile.mkdtemp(prefix="sync-bench-", dir="/var/tmp"))
    results = []
    own = OwnCpu()
    try:
        src = work / "dataset"
        size, digest = make_dataset(src, args.size_mb, args.files)
        limit = size * 8 / (args.rate * 1e6)
        print(
            f"dataset: {size / 1e6:.0f} MB in {args.files} files; links at {args.rate} Mbit/s; "
            f"one-copy limit {limit:.1f} s",
            flush=True,
        )
        for n in args.nodes:
            b = Bench(n, args.rate, work / f"home{n}", work, args.ref_repo)
            b.up()
            try:
                b.shape(args.rate)
                link = b.measure_link()
                print(f"N={n}: one shaped link carries {link:.0f} Mbit/s of raw TCP", flush=True)
                for method in [m for _ in range(args.repeat) for m in args.methods]:
                    b.prepare()
                    c0, o0 = cpu_busy(), own.seconds()
                    secs = b.timed(method, src)
                    c1, o1 = cpu_busy(), own.seconds()
                    cores = os.cpu_count() or 1
                    cpu = (c1[0] - c0[0]) / max(1e-9, c1[1] - c0[1])
                    ours = o1 - o0
                    ok = sum(1 for d in b.digests() if d == [digest])
                    row = {
                        "nodes": n,
                        "rate_mbit": args.rate,
                        "method": method,
                        "seconds": round(secs, 2),
                        "ratio": round(secs / limit, 2),
                        "machine_cpu_busy": round(cpu, 3),
                        "own_cpu_seconds": round(ours, 1),
                        "own_cpu_share": round(ours / secs / cores, 3),
                        "verified_nodes": ok,
                        "core_s_per_gb_hop": round(ours / (size / 1e9) / n, 2),
                        "size_bytes": size,
                        "files": args.files,
                        "link_mbit_measured": round(link),
                    }
                    if method.startswith("clusterctl"):
                        row["phases_s"] = {k: round(v, 2) for k, v in b.phases}
                        row["notes"] = b.notes
                    results.append(row)
                    print(
                        f"  {method:<17} {secs:7.1f} s  {secs / limit:5.2f}x the one-copy limit  "
                        f"CPU: its own {ours:5.1f} core-s ({ours / secs / cores:4.0%} of {cores} cores, "
                        f"{row['core_s_per_gb_hop']:.2f} core-s/GB/hop), machine {cpu:4.0%} busy  verified {ok}/{n}"
                        + (f"  (phases at: {row['phases_s']}; {'; '.join(b.notes)})" if "phases_s" in row else ""),
                        flush=True,
                    )
                b.clear()
            finally:
                b.down()
    finally:
        shutil.rmtree(work, ignore_errors=True)
        own.close()
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, nargs="+", default=[4, 8])
    p.add_argument(
        "--rate",
        type=float,
        help="Mbit/s of every link (default 450; with --small-files: unshaped unless given, 0 = unshaped)",
    )
    p.add_argument("--size-mb", type=int, default=400)
    p.add_argument("--files", type=int, default=2000)
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    p.add_argument("--repeat", type=int, default=1, help="run every method this many times (rounds interleaved)")
    p.add_argument(
        "--small-files",
        type=int,
        help="instead: this many 4 kB files, clusterctl against one bare tar | ssh copy and the bare chain",
    )
    p.add_argument("--ref-repo", type=Path, help="clusterctl-ref: the checkout to compare with (a git worktree)")
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args()
    if os.geteuid() != 0:
        sys.exit("Error: the benchmark makes namespace nodes and shapes links: run it as root")
    import signal

    def stop(*_):
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, stop)  # also when started in the background, where SIGINT is ignored
    signal.signal(signal.SIGTERM, stop)  # either way the cluster goes down and the cgroup is removed
    if args.small_files:
        results = run_small(args)
        if args.json:
            args.json.write_text(json.dumps(results, indent=2) + "\n")
        return
    if not args.rate:
        args.rate = 450.0
    results = run(args)
    if args.repeat > 1:
        print("best of", args.repeat, "(the machine is shared: the fastest round is the least disturbed one):")
        best: dict[tuple, dict] = {}
        for r in results:
            key = (r["nodes"], r["method"])
            if key not in best or r["seconds"] < best[key]["seconds"]:
                best[key] = r
        for (n, method), r in best.items():
            spread = [x["seconds"] for x in results if (x["nodes"], x["method"]) == (n, method)]
            print(
                f"  N={n} {method:<17} {r['seconds']:7.1f} s  {r['ratio']:5.2f}x  (spread {min(spread):.1f}-"
                f"{max(spread):.1f} s)  own CPU {r['own_cpu_seconds']:5.1f} core-s ({r['core_s_per_gb_hop']:.2f}/GB/hop)"
                f"  machine {r['machine_cpu_busy']:4.0%} busy  verified {r['verified_nodes']}/{n}"
            )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
