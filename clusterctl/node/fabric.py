"""`python3 PYZ fabric`: allreduce bandwidth with Horovod's own allreduce (gloo on CPU), for `clusterctl doctor
--fabric`.

Launched by horovodrun from the node package: over the whole cluster (one process per node) and over pairs of
ring neighbours.
Rank 0 prints one machine line, in nccl-tests' terms (algbw = bytes / time; busbw = algbw x 2(n-1)/n,
what each link carries in a ring allreduce, comparable across process counts):

    CLUSTERCTL-FABRIC result size=2 bytes=8388608 seconds=0.081 algbw_gbit=0.83 busbw_gbit=0.83 conf=0.02
"""

from __future__ import annotations

import argparse
import os
import time

from clusterctl.node import nccl_report

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
MARK = "CLUSTERCTL-FABRIC"
DESCRIPTION = "Allreduce bandwidth with Horovod's own allreduce (gloo on CPU), for `clusterctl doctor --fabric`."


def emit(kind: str, /, **fields: object) -> None:
    print(" ".join([MARK, kind, *(f"{k}={v}" for k, v in fields.items())]), flush=True)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="fabric", description=DESCRIPTION)
    p.add_argument("--mb", type=float, default=64.0, help="MiB allreduced per step")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=10)
    args = p.parse_args(argv)
    if args.mb <= 0 or args.warmup < 1 or args.iters < 2:
        p.error("--mb must be positive, --warmup at least 1, --iters at least 2")

    nccl_report.capture()  # before NCCL starts: its report of the network into this process's own file
    import horovod.tensorflow as hvd  # the node runtime's
    import tensorflow as tf

    hvd.init()
    nccl_report.check(tf, hvd, tf.config.list_physical_devices("GPU"), emit)  # the network NCCL chose, judged
    size = hvd.size()
    count = max(1, int(args.mb * 2**20 / 4))
    x = tf.ones((count,), tf.float32)
    for _ in range(args.warmup):  # connections, buffers, the first negotiation
        hvd.allreduce(x, op=hvd.Sum, name="fabric").numpy()
    busbw: list[float] = []
    for _ in range(args.iters):
        t0 = time.perf_counter()
        hvd.allreduce(x, op=hvd.Sum, name="fabric").numpy()
        dt = time.perf_counter() - t0
        # the op ends when its slowest rank's part arrives: every rank's time, the longest counts
        dt = float(hvd.allreduce(tf.constant(dt, tf.float64), op=hvd.Max, name="fabric_t"))
        busbw.append(count * 4 * 8 / dt / 1e9 * (2 * (size - 1) / size if size > 1 else 1.0))
    mean = sum(busbw) / len(busbw)
    conf = 1.96 * (sum((b - mean) ** 2 for b in busbw) / len(busbw)) ** 0.5
    if hvd.rank() == 0:
        factor = 2 * (size - 1) / size if size > 1 else 1.0
        seconds = count * 4 * 8 / (mean * 1e9) * factor
        print(
            f"{MARK} result size={size} bytes={count * 4} seconds={seconds:.4f} algbw_gbit={mean / factor:.4f} "
            f"busbw_gbit={mean:.4f} conf={conf:.4f}",
            flush=True,
        )
    return 0
