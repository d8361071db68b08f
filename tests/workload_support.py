"""What the workload tests stage on nodes: a user's own Horovod script with a helper module beside it (the
`launch` tests and the AWS runtime test), and an ImageNet-layout folder of real JPEGs (`data tfrecords`
here and on the leader)."""

from __future__ import annotations

import re
from pathlib import Path

HELPER = """import socket
import sys


def describe(rank, size):
    return f"RANK {rank} SIZE {size} HOST {socket.gethostname()} PY {sys.executable}"
"""

SCRIPT = """import argparse
import time

import numpy as np
import tensorflow as tf
import horovod.tensorflow.keras as hvd

from helper import describe  # staged beside this script by --file

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=3)
p.add_argument("--forever", action="store_true")
args = p.parse_args()

hvd.init()
print(describe(hvd.rank(), hvd.size()), flush=True)
if args.forever:
    print(f"READY rank={hvd.rank()}", flush=True)
    time.sleep(3600)  # no output, no collective: only `kill` ends the ranks on the member

model = tf.keras.Sequential([tf.keras.layers.Input((8,)), tf.keras.layers.Dense(1)])
model.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.legacy.SGD(0.01 * hvd.size())), loss="mse")
rng = np.random.default_rng(hvd.rank())
x = rng.random((64, 8), dtype=np.float32)
y = x.sum(axis=1, keepdims=True)
hist = model.fit(x, y, batch_size=16, steps_per_epoch=args.steps, epochs=1, verbose=0,
                 callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
print(f"DONE rank={hvd.rank()} loss={hist.history['loss'][-1]:.4f}", flush=True)
"""

RANK_LINE = re.compile(r"RANK (\d+) SIZE (\d+) HOST (\S+) PY (\S+)")


def imagenet_layout(root: Path, tf) -> dict[str, str]:
    """train/<synset>/*.JPEG for three synsets and the official flat val/ of ILSVRC2012_val_<N>.JPEG (with a
    LICENSE beside them); returns image stem -> synset of the validation images."""
    import numpy as np

    synsets = ("n01440764", "n01443537", "n02119789")  # sorted: labels 1, 2, 3
    for k, s in enumerate(synsets):
        d = root / "train" / s
        d.mkdir(parents=True)
        for i in range(2):
            (d / f"{s}_{i}.JPEG").write_bytes(tf.io.encode_jpeg(np.full((10, 10, 3), 30 * k, np.uint8)).numpy())
    (root / "val").mkdir()
    truth = {}
    for n in range(1, 8):
        s = synsets[(n * 2) % 3]
        stem = f"ILSVRC2012_val_{n:08d}"
        (root / "val" / f"{stem}.JPEG").write_bytes(tf.io.encode_jpeg(np.full((10, 10, 3), n, np.uint8)).numpy())
        truth[stem] = s
    (root / "val" / "LICENSE.txt").write_text("terms\n")
    return truth
