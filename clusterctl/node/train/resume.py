"""Rank 0's checkpoints around the loop: which one to resume from (the newest complete one of the leader's
folder, the --checkpoint-copy node and --checkpoint-to), the hyperparameters they were trained with, sealing
a saved one (its manifest, then its copies), the stop for a spot notice, and whether every rank ends with the
same variables."""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

from clusterctl.node.train import checkpoints
from clusterctl.node.train.log import emit
from clusterctl.node.train.options import EXIT_SPOT
from clusterctl.node.train.spot import SpotWatch


def checkpoint_variables(tf: Any, ckpt: Any) -> list[Any]:
    """Every variable the checkpoint tracks, each once: the model, the optimizer with its slots, and a
    LossScaleOptimizer's loss scale and its counter (which its .variables leaves out in Keras 2.15)."""
    seen: set[Any] = set()
    out: list[Any] = []
    for obj in tf.train.TrackableView(ckpt).descendants():
        if isinstance(obj, tf.Variable) and obj.ref() not in seen:
            seen.add(obj.ref())
            out.append(obj)
    return out


def check_hparams(path: str, hparams: dict[str, Any], has_checkpoint: bool) -> str | None:
    """Compare with the hparams.json beside the checkpoints (written when missing). Why a resume under
    these hyperparameters is refused, or None."""
    if os.path.isfile(path):
        with open(path) as f:
            saved = json.load(f)
        diff = [f"{k} {saved[k]!r} -> {hparams[k]!r}" for k in hparams if k in saved and saved[k] != hparams[k]]
        if diff and has_checkpoint:
            return (
                f"the checkpoints in {os.path.dirname(path)} were trained with other hyperparameters "
                f"({', '.join(diff)}); give another --model-dir or the same flags"
            )
        if not diff:
            return None
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(hparams, f, indent=1, sort_keys=True)
    os.replace(tmp, path)
    return None


def checkpoint_copies(args: argparse.Namespace, ckpt_dir: str) -> list[checkpoints.Copy]:
    """The places besides rank 0's own folder that keep every checkpoint (--checkpoint-copy, --checkpoint-to)."""
    copies: list[checkpoints.Copy] = []
    if args.checkpoint_copy:
        copies.append(checkpoints.SshCopy(args.checkpoint_copy, os.path.abspath(ckpt_dir)))
    if args.checkpoint_to:
        copies.append(checkpoints.S3Copy(args.checkpoint_to, args.s3_endpoint_url))
    return copies


def choose_checkpoint(tf: Any, args: argparse.Namespace, ckpt_dir: str) -> checkpoints.Copier:
    """Rank 0: point TensorFlow's checkpoint state at the newest complete checkpoint of the leader's folder,
    the --checkpoint-copy node and --checkpoint-to (fetched here first when it is elsewhere), so the
    CheckpointManager restores it; none complete: no state, a fresh start. Returns the Copier for saves."""
    copies = checkpoint_copies(args, ckpt_dir)
    try:
        path, place, manifest = checkpoints.newest(ckpt_dir, copies, emit)
    except Exception as exc:  # a failed fetch: what is complete here is still good
        emit("warning", kind="checkpoint_fetch_failed", message=" ".join(str(exc).split())[:300])
        path, place, manifest = checkpoints.newest(ckpt_dir, [], emit)
    state = os.path.join(ckpt_dir, "checkpoint")
    if path is None:
        if os.path.exists(state):
            os.remove(state)
    else:
        complete, _ = checkpoints.scan_listing(*checkpoints.local_listing(ckpt_dir))
        kept = [os.path.join(ckpt_dir, complete[n]["name"]) for n in sorted(complete)]  # by images, oldest first
        # Timestamps after the last preserved one: the manager counts these as its own and prunes them, fewest
        # images first, to --keep-checkpoints (without, a restart would keep every older checkpoint forever).
        now = time.time()
        quiet = tf.get_logger().level
        tf.get_logger().setLevel("ERROR")  # its deprecation note: the manager reads this very state file
        try:
            tf.compat.v1.train.update_checkpoint_state(
                ckpt_dir,
                path,
                all_model_checkpoint_paths=kept,
                all_model_checkpoint_timestamps=[now - len(kept) + i for i in range(len(kept))],
                last_preserved_timestamp=now - len(kept) - 1,
            )
        finally:
            tf.get_logger().setLevel(quiet)
        if place != "local" and manifest is not None:
            emit("checkpoint_fetched", images=manifest["images"], step=manifest["step"], place=place, path=path)
    return checkpoints.Copier(copies, args.keep_checkpoints, emit)


def seal_checkpoint(copier: checkpoints.Copier | None, path: str, step: int, images: int, global_batch: int) -> None:
    """The manifest, written last, makes a saved checkpoint complete; then the copies, in the background."""
    folder, name = os.path.split(path)
    manifest = checkpoints.make_manifest(folder, name, step, images, global_batch)
    checkpoints.write_manifest(folder, manifest)
    checkpoints.prune_local(folder)
    if copier is not None:
        copier.submit(folder, manifest)


def spot_notice(tf: Any, hvd: Any, spot: SpotWatch | None) -> bool:
    """Whether any node has an interruption notice (one tiny allreduce per step, only with --spot-poll)."""
    mine = 1 if spot is not None and spot.notice is not None else 0
    return int(hvd.allreduce(tf.constant(mine, tf.int32), op=hvd.Max, name="spot_notice").numpy()) > 0


def stop_for_spot(
    tf: Any,
    hvd: Any,
    args: argparse.Namespace,
    manager: Any,
    copier: checkpoints.Copier | None,
    epoch_var: Any,
    step: int,
    steps_per_epoch: int,
    spot: SpotWatch | None,
    images_var: Any,
    global_batch: int,
) -> int:
    """Checkpoint now (unless this step's is saved), wait for its copies, and stop every rank together."""
    if manager is not None:
        t = time.time()
        path = manager.latest_checkpoint or ""
        images = int(images_var.numpy())
        if not path.endswith(f"ckpt-{images}"):
            epoch_var.assign(step // steps_per_epoch)
            path = manager.save(checkpoint_number=images)
            seal_checkpoint(copier, path, step, images, global_batch)
            emit(
                "checkpoint",
                step=step,
                images=images,
                epoch=int(epoch_var.numpy()),
                path=path,
                seconds=time.time() - t,
                reason="spot",
            )
        if copier is not None:
            copier.wait()
        emit(
            "error",
            kind="spot_interruption",
            step=step,
            checkpoint=path,
            at=f"{time.time():.3f}",
            message=f"spot interruption notice: checkpoint {os.path.basename(path)} saved and copied; "
            "start the job again with the same command",
        )
    if spot is not None and spot.notice is not None:
        emit("spot_notice", rank=hvd.rank(), seen_at=f"{spot.seen_at:.3f}", action=spot.notice.get("action", ""))
    # Nobody exits before rank 0's checkpoint is safe; then only rank 0 says why (horovodrun ends every
    # process once one has exited non-zero: the others exit 0, so the job's status is rank 0's).
    hvd.allreduce(tf.constant(0, tf.int32), name="spot_saved")
    return EXIT_SPOT if hvd.rank() == 0 else 0


def replicas_agree(tf: Any, hvd: Any, variables: list[Any], loss_scale_opt: Any = None) -> tuple[bool, str, str]:
    """Whether every rank holds the same values of `variables` (a float64 sum and sum of squares of each,
    gathered), each rank's loss scale ("-" without loss scaling), and the first names that differ."""
    fp = tf.stack(
        [
            tf.stack([tf.reduce_sum(tf.cast(v, tf.float64)), tf.reduce_sum(tf.cast(v, tf.float64) ** 2)])
            for v in variables
        ]
    )
    scale = float(loss_scale_opt.loss_scale.numpy()) if loss_scale_opt is not None else -1.0
    every = hvd.allgather_object((fp.numpy().tolist(), scale))
    identical = all(f == every[0][0] and s == every[0][1] for f, s in every)
    scales = ",".join("-" if s < 0 else f"{s:g}" for _, s in every)
    differ = [v.name for i, v in enumerate(variables) if any(f[i] != every[0][0][i] for f, _ in every)]
    return identical, scales, ",".join(differ[:5]) or "-"
