#!/usr/bin/env python3
"""How much of the allreduce the training step hides behind its backward pass: ResNet-50 on 2 namespace nodes.

One local cluster (2 nodes x 1 process, the cached node runtime, Horovod over gloo on CPUs) runs the node
package's `overlap` program (the trainer's step, node/train/step.py) twice through `clusterctl launch`:

    1. link as it is: compute alone for both step designs (blocks: XLA per segment, the step's; whole: the
       model as one XLA op, the design before), and the allreduce alone;
    2. the link shaped with htb (both ways, on both nodes) so that the allreduce alone takes about as long as
       the blocks design's compute: compute alone, allreduce alone and both (the blocks design; --whole-too:
       the whole design's as well), and Horovod's timeline of a few steps.

and prints the step times, the exposed share of the allreduce, (both - compute) / allreduce (0: hidden
entirely, 1: not at all), the compute-alone ratio blocks / whole (from run 1: the same processes, one design
after the other), and from the timeline the first gradient's point in the backward pass. Needs root and a
built node runtime (the first `clusterctl up --provider local` builds it); the machine's load average is
printed with the figures: on a busy machine run it again. No arguments:

    python bench/overlap.py

On a cluster that exists (GPUs on EC2: docs/REAL_HARDWARE.md), `--cluster NAME` runs the probe there once,
over every slot, both designs with their timelines, nothing shaped; the probe's own flags follow `--`:

    python bench/overlap.py --cluster NAME -- --precision float16 --fp16-allreduce --image-size 224 --batch-size 256
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
CLI = [sys.executable, "-m", "clusterctl"]  # this checkout's (PYTHONPATH), not whichever is installed

from clusterctl.providers.local import netns  # noqa: E402
from clusterctl.remote import nodepkg  # noqa: E402

# ResNet-50 at a small image and batch: the real network and gradient set (161 tensors, 102 MB in float32),
# a step of about a second on this machine's cores.
WORKLOAD = tuple("--model resnet50 --image-size 64 --batch-size 4 --warmup-steps 2 --steps 3 --rounds 5".split())
PARAMETERS = 25_557_032  # ResNet-50 v1.5 at 1,000 classes (node/train/model.py)
LINE = re.compile(r"CLUSTERCTL-OVERLAP (\w+) (.*)")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cluster", help="run the probe on this cluster as it is (nothing brought up or shaped)")
    p.add_argument(
        "--whole-too",
        action="store_true",
        help="the whole-model design on the shaped link too (its exposed share; its compile adds minutes)",
    )
    p.add_argument("probe", nargs=argparse.REMAINDER, help="after --: flags for the node package's overlap program")
    args = p.parse_args()
    probe = [a for a in args.probe if a != "--"]
    if args.cluster:
        return on_cluster(args.cluster, probe)
    if os.geteuid() != 0:
        sys.exit("needs root: local clusters are network namespaces")
    work = Path(tempfile.mkdtemp(prefix="overlap-"))
    env = {**os.environ, "CLUSTERCTL_HOME": str(work / "home"), "PYTHONPATH": str(REPO)}
    name = "ov" + uuid.uuid4().hex[:6]
    designs = ["blocks", "whole"] if args.whole_too else ["blocks"]

    def cli(*a: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*CLI, *a], cwd=work, env=env, capture_output=True, text=True, timeout=timeout)

    def overlap(*a: str) -> list[tuple[str, dict[str, str]]]:
        return run_probe(cli, name, work, [*WORKLOAD, *probe, *a])

    started = time.time()
    up = cli("up", "--provider", "local", "--name", name, "--nodes", "2", "--slots", "1", "--yes")
    if up.returncode != 0:
        sys.exit(f"up failed:\n{up.stderr[-3000:]}")
    try:
        first = times(overlap("--designs", "blocks,whole", "--modes", "compute,allreduce"))
        compute, plain = first[("blocks", "compute")], first[("-", "allreduce")]
        # what the wire must take for the allreduce alone to last about as long as the compute (90%: run 1's
        # compute is one run's, the second's may differ by as much): a 2-process ring sends each process's
        # whole gradient set once (half in reduce-scatter, half in all-gather)
        wire = max(0.9 * compute - plain, compute / 2)
        mbit = PARAMETERS * 4 * 8 / wire / 1e6
        for i in range(2):
            shape(name, i, f"{mbit:.0f}mbit")
        second = overlap("--designs", ",".join(designs), "--trace", "/tmp/clusterctl-overlap")
    finally:
        cli("down", name, "--yes", timeout=300)
    shaped = times(second)
    traces = {f["design"]: f for kind, f in second if kind == "timeline"}
    load = os.getloadavg()
    print(
        f"ResNet-50 v1.5 {WORKLOAD[3]}px, batch {WORKLOAD[5]} per process, 2 namespace nodes x 1 process, "
        f"Horovod over gloo, link shaped to {mbit:.0f} Mbit/s (htb), {os.cpu_count()} cores, "
        f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}, {time.time() - started:.0f} s"
    )
    print(f"{'design':<8} {'compute s':>10} {'allreduce s':>12} {'both s':>8} {'exposed':>8}")
    allreduce = shaped[("-", "allreduce")]
    for design in designs:
        c, b = shaped[(design, "compute")], shaped[(design, "both")]
        print(f"{design:<8} {c:>10.3f} {allreduce:>12.3f} {b:>8.3f} {(b - c) / allreduce:>8.2f}")
    ratio = first[("blocks", "compute")] / first[("whole", "compute")]
    print(f"compute alone, blocks / whole (link unshaped, same processes): {ratio:.3f}")
    print(f"allreduce alone / compute alone (blocks): {allreduce / shaped[('blocks', 'compute')]:.2f}")
    for design, f in traces.items():
        print(
            f"timeline {design}: {f.get('gradients', '0')} gradients; the first at {f.get('first', '-')} of the "
            f"backward pass (forward {f.get('forward_s', '-')} s, first {f.get('first_s', '-')} s, last "
            f"{f.get('last_s', '-')} s after the step's start; upper bound {f.get('bound', '-')})"
        )
    return 0


def run_probe(cli: Any, cluster: str, work: Path, flags: list[str]) -> list[tuple[str, dict[str, str]]]:
    """The node package's overlap program on every slot of the cluster (clusterctl launch), its lines parsed."""
    pyz = work / nodepkg.package().name
    pyz.write_bytes(nodepkg.package().data)
    proc = cli("launch", "-c", cluster, "--attach", "--", "python", pyz.name, "overlap", *flags)
    lines = [(m.group(1), dict(kv.split("=", 1) for kv in m.group(2).split())) for m in LINE.finditer(proc.stdout)]
    if proc.returncode != 0 or not lines:
        sys.exit(f"overlap failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}")
    return lines


def on_cluster(cluster: str, probe: list[str]) -> int:
    """One run on a cluster as it is: both designs timed, each with its timeline; the lines as the probe says them."""
    work = Path(tempfile.mkdtemp(prefix="overlap-"))

    def cli(*a: str, timeout: float = 3600) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*CLI, *a], cwd=work, capture_output=True, text=True, timeout=timeout)

    for kind, fields in run_probe(cli, cluster, work, ["--trace", "/tmp/clusterctl-overlap", *probe]):
        print(kind, " ".join(f"{k}={v}" for k, v in fields.items()))
    return 0


def times(lines: list[tuple[str, dict[str, str]]]) -> dict[tuple[str, str], float]:
    return {(f["design"], f["mode"]): float(f["seconds"]) for kind, f in lines if kind == "time"}


def shape(cluster: str, index: int, rate: str) -> None:
    """htb on node `index`'s link both ways (this kernel has htb, no netem): into the node on the bridge's veth,
    out of it on its eth0. `down` removes the links and their queues."""
    inside = ["ip", "netns", "exec", netns.netns_name(cluster, index)]
    for prefix, dev in (([], netns.veth_name(cluster, index)), (inside, "eth0")):
        for tc in (
            f"tc qdisc replace dev {dev} root handle 1: htb default 10",
            f"tc class replace dev {dev} parent 1: classid 1:10 htb rate {rate} ceil {rate} burst 256k cburst 256k",
        ):
            subprocess.run([*prefix, *tc.split()], check=True)


if __name__ == "__main__":
    sys.exit(main())
