"""top-1 / top-5 on the validation shards (or a synthetic batch), every rank evaluating rank 0's model on its share:
the `eval` line, and after the final one a JSON line for `clusterctl sweep`."""

from __future__ import annotations

import argparse
import datetime
import json
import time
from typing import Any

from clusterctl.node.train.data import eval_dataset, normalize, synthetic_dataset
from clusterctl.node.train.log import emit
from clusterctl.node.train.step import broadcast_from_rank0


def evaluate(
    tf: Any,
    hvd: Any,
    args: argparse.Namespace,
    model: Any,
    step: int,
    steps_per_epoch: int,
    checkpoint: str,
    *,
    classes: int,
    val_files: list[str],
    writer: Any = None,
    threads: int = 8,
    final: bool = True,
) -> int:
    """top-1 / top-5 over the validation shards, each record seen by exactly one rank; one collective at the end.
    A periodic one (final=False) says final=0 on its line and prints no JSON line for the sweep."""
    rank, size = hvd.rank(), hvd.size()
    # Batch-norm statistics are not averaged during training: every rank evaluates rank 0's model (the
    # one in the checkpoint), so the result does not depend on the number of processes.
    broadcast_from_rank0(tf, hvd, model.variables)
    if args.synthetic:
        ds = synthetic_dataset(tf, args, classes, args.seed + 31 * rank + 1, args.eval_batch_size)
        limit = args.eval_steps or 10
    else:
        ds = eval_dataset(tf, args, val_files, rank, size, threads)
        limit = args.eval_steps
    k = min(5, classes)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="sum")

    def one_batch(images: Any, labels: Any) -> Any:
        logits = tf.cast(model(normalize(tf, images), training=False), tf.float32)
        top1 = tf.reduce_sum(tf.cast(tf.math.in_top_k(labels, logits, 1), tf.float64))
        topk = tf.reduce_sum(tf.cast(tf.math.in_top_k(labels, logits, k), tf.float64))
        return tf.stack(
            [top1, topk, tf.cast(loss_fn(labels, logits), tf.float64), tf.cast(tf.shape(labels)[0], tf.float64)]
        )

    eval_step = tf.function(one_batch, autograph=False)  # see bench.py
    t = time.time()
    acc = tf.zeros(4, tf.float64)
    for i, (images, labels) in enumerate(ds):
        if limit is not None and i >= limit:
            break
        acc += eval_step(images, labels)
    top1, topk, loss, n = hvd.allreduce(acc, op=hvd.Sum, name="eval_sums").numpy()
    if rank == 0:
        n = int(n)
        top1_pct = 100.0 * top1 / max(n, 1)
        topk_pct = 100.0 * topk / max(n, 1)
        emit(
            "eval",
            step=step,
            epoch=step / steps_per_epoch,
            top1=round(top1_pct, 3),
            top5=round(topk_pct, 3),
            loss=loss / max(n, 1),
            examples=n,
            k=k,
            checkpoint=checkpoint or "",
            time=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            seconds=time.time() - t,
            size=size,
            final=final,
        )
        print(f"Validation: top-1 {top1_pct:.2f}%  top-5 {topk_pct:.2f}%  on {n} images at step {step}", flush=True)
        # for `clusterctl sweep` (its default metric is a JSON line's "metric")
        if final:
            print(
                json.dumps(
                    {
                        "metric": round(top1_pct, 3),
                        "top1": round(top1_pct, 3),
                        "top5": round(topk_pct, 3),
                        "eval_loss": float(loss / max(n, 1)),
                        "step": int(step),
                    }
                ),
                flush=True,
            )
        if writer is not None:
            with writer.as_default(step=step):
                tf.summary.scalar("eval/top1", top1_pct)
                tf.summary.scalar("eval/top5", topk_pct)
                tf.summary.scalar("eval/loss", loss / max(n, 1))
            writer.flush()
    return 0
