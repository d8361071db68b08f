#!/usr/bin/env python3
"""img/s of the tiny model in both precisions, and of the input pipeline alone, on a local cluster.

One local cluster (namespace nodes, the cached node runtime) runs `clusterctl bench --synthetic` three
times at every slot of the cluster:

    fp32         --model tiny
    mixed        --model tiny --mixed-precision      (bfloat16 on CPUs: they have no fast float16)
    input only   --model tiny --input-only           (JPEG decode, crop, flip, resize, batch, prefetch; no model)

and prints each as mean +- 1.96 sigma over the timed batches. When the input-only figure is not well above
the model's, feeding is the bottleneck: a real run could not go faster than its input pipeline. Needs root
and a built node runtime (one `clusterctl up --provider local` first). Example:

    python bench/tiny_throughput.py --nodes 2 --slots 2 --iters 5
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CLUSTERCTL = [sys.executable, "-m", "clusterctl"]
MODES = {"fp32": [], "mixed": ["--mixed-precision"], "input only": ["--input-only"]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--slots", type=int, default=2)
    p.add_argument("--iters", type=int, default=5, help="timed batches per run")
    p.add_argument("--steps", type=int, default=10, help="steps per timed batch")
    p.add_argument("--batch-size", type=int, default=32)
    args = p.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root: local clusters are network namespaces")
    work = Path(tempfile.mkdtemp(prefix="tiny-tp-"))
    env = {**os.environ, "CLUSTERCTL_HOME": str(work / "home"), "PYTHONPATH": str(REPO)}
    name = "tp" + uuid.uuid4().hex[:6]
    np_ = args.nodes * args.slots

    def cli(*a: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run([*CLUSTERCTL, *a], cwd=work, env=env, capture_output=True, text=True, check=check)

    cli("up", "--provider", "local", "--name", name, "--nodes", str(args.nodes), "--slots", str(args.slots), "--yes")
    rows = []
    try:
        for mode, flags in MODES.items():
            out = work / mode.replace(" ", "-")
            proc = cli(
                "bench",
                "--synthetic",
                "--model",
                "tiny",
                "--ladder",
                str(np_),
                "--iters",
                str(args.iters),
                "--max-seconds",
                "0",  # exactly --iters timed batches: throughput, not a verdict
                "--steps",
                str(args.steps),
                "--batch-size",
                str(args.batch_size),
                "--out",
                str(out),
                *flags,
                check=False,
            )
            if proc.returncode != 0:
                print(proc.stdout[-2000:], proc.stderr[-2000:], file=sys.stderr)
                return 1
            (res,) = out.iterdir()
            data = json.loads((res / "results.json").read_text())
            top = max(data["rungs"], key=lambda r: r["np"])
            rows.append((mode, top["img_per_sec"], top["conf"]))
    finally:
        cli("down", name, "--yes", check=False)
    print(
        f"{np_} processes on {args.nodes} node(s) x {args.slots} slot(s), batch {args.batch_size}/process, "
        f"{args.iters} timed batches of {args.steps} steps, {os.cpu_count()} cores on this machine"
    )
    print(f"{'mode':<12} {'img/s':>10}   1.96 sigma")
    for mode, ips, conf in rows:
        print(f"{mode:<12} {ips:>10.1f}   +- {conf:.1f}")
    model = max(ips for mode, ips, _ in rows if mode != "input only")
    feed = next(ips for mode, ips, _ in rows if mode == "input only")
    print(
        f"input pipeline / fastest model: {feed / model:.2f}x"
        + ("  <- feeding is the bottleneck" if feed < 1.2 * model else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
