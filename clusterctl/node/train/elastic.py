"""The training loop under Elastic Horovod (`train --elastic`).

horovodrun (`--min-np/--max-np --host-discovery-script`) starts and drops processes as nodes come and go;
this loop is wrapped in `hvd.elastic.run`, so a collective that fails because a peer died restores the last
commit on every survivor and runs the loop again at the new size, and a host added or removed by the
discovery script is taken up at the next commit. What a commit keeps (in host memory): every variable the
checkpoint tracks (the model, the optimizer's slots, a loss-scale optimizer's scale and counter, the step,
epoch and images seen), and the plan in images. The data's position is the images seen: after a change each
rank starts a fresh shuffle, seeded by that count.

The schedule stays in images: at size N the global batch is batch * N, the peak learning rate
base-lr * batch * N / 256, and the learning rate at `images seen / global batch` of the schedule's steps;
the run ends when the images seen reach the plan (--max-steps or --epochs, in steps of the starting size's
global batch). Steps since the last commit are redone after a loss: no image is counted twice.

Rank 0's duties (the TensorBoard writer, the checkpoints and their copies, the table, every line below) belong
to whichever process is rank 0 after each reset, not to the one that started as rank 0: a process that becomes
rank 0 makes its writer and checkpoint manager then (Chief), on its own node's disk under the same
--model-dir, and saves the committed state there at once (`reason=membership`); one that stops being rank 0
closes its writer and lets its copies finish. So a run goes on when rank 0's own process is lost.

Lines (rank 0): `world_size size=2 was=3 lost=HOST joined= ... message='world size 3 -> 2 (lost HOST)'` at
every change; `checkpoint ... reason=membership` (the committed state, saved when a peer is lost: the run may
not go on if too few nodes are left) and `reason=spot` (a spot notice: checkpoint and commit, then go on).
"""

from __future__ import annotations

import argparse
import collections
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from clusterctl.node.train import checkpoints
from clusterctl.node.train.data import data_seed, synthetic_dataset, train_dataset
from clusterctl.node.train.evaluate import evaluate
from clusterctl.node.train.log import STARTED, emit, mean_losses, table_row
from clusterctl.node.train.options import learning_rate
from clusterctl.node.train.resume import check_hparams, checkpoint_copies, replicas_agree, seal_checkpoint, spot_notice
from clusterctl.node.train.spot import SpotWatch
from clusterctl.node.train.step import broadcast_from_rank0


@dataclass
class Chief:
    """Rank 0's tools, held by whichever process is rank 0 now: its TensorBoard writer, its CheckpointManager
    (None: it may not save, e.g. its folder holds another run's checkpoints) and its Copier. `make` builds them
    on a process that becomes rank 0 mid-run."""

    make: Callable[[], tuple[Any, Any, checkpoints.Copier | None]]
    writer: Any = None
    manager: Any = None
    copier: checkpoints.Copier | None = None
    held: bool = field(default=False)  # this process holds them now

    def follow(self, chief: bool) -> bool:
        """Take the tools on becoming rank 0, give them up on ceasing to be; True when this process has just
        become rank 0 (it was not at the start, nor after the last reset)."""
        if chief and not self.held:
            self.writer, self.manager, self.copier = self.make()
            self.held = True
            return True
        if not chief and self.held:
            if self.writer is not None:
                self.writer.close()
            if self.copier is not None:
                self.copier.wait(timeout=300)  # the last checkpoint's copies, before another rank saves
            self.writer = self.manager = self.copier = None
            self.held = False
        return False


def chief_tools(
    tf: Any, args: argparse.Namespace, ckpt: Any, hparams: dict[str, Any]
) -> tuple[Any, Any, checkpoints.Copier]:
    """What a process that becomes rank 0 mid-run makes: the writer and checkpoint manager on its own node's
    --model-dir (hparams.json written there, or a mismatch said: that folder holds another run's checkpoints,
    so this one saves none), and the copier to the same places. Nothing is restored: the state is the commit's."""
    ckpt_dir = os.path.join(args.model_dir, "checkpoints")
    os.makedirs(ckpt_dir, exist_ok=True)
    manager: Any = tf.train.CheckpointManager(ckpt, ckpt_dir, max_to_keep=args.keep_checkpoints)
    mismatch = check_hparams(os.path.join(ckpt_dir, "hparams.json"), hparams, bool(manager.latest_checkpoint))
    if mismatch:
        emit("warning", kind="hparams_mismatch", message=f"{mismatch}; no checkpoints from {socket.gethostname()}")
        manager = None
    writer = tf.summary.create_file_writer(os.path.join(args.model_dir, "tensorboard"))
    # --checkpoint-copy names a node; when that is this one, its folder is the copy already
    here = {os.environ.get("HOROVOD_HOSTNAME", ""), socket.gethostname()}
    copies = [
        c for c in checkpoint_copies(args, ckpt_dir) if not (isinstance(c, checkpoints.SshCopy) and c.host in here)
    ]
    return writer, manager, checkpoints.Copier(copies, args.keep_checkpoints, emit)


@dataclass
class Job:
    """What the trainer built before the loop (main.main)."""

    train_step: Any
    tracked: list[Any]
    sums: Any
    chief: Chief  # rank 0's writer, checkpoint manager and copier (held by whichever process is rank 0)
    step_var: Any
    epoch_var: Any
    batch_var: Any
    images_var: Any
    classes: int
    train_files: list[str]
    train_examples: int
    threads: int
    gpus: int
    plan_images: int  # where the run ends: images seen, all ranks together
    status: int  # rank 0's verdict on its checkpoint (non-zero: every rank stops with it)
    model: Any
    opt: Any  # the loss-scale optimizer (None without loss scaling)
    eval_kwargs: dict[str, Any]


def size_line(was: list[str], now: list[str]) -> tuple[list[str], list[str], str]:
    """The hosts lost and joined between two memberships (one entry per process), and the line saying so."""
    before, after = collections.Counter(was), collections.Counter(now)
    lost, joined = sorted((before - after).elements()), sorted((after - before).elements())
    parts = [f"lost {', '.join(lost)}"] if lost else []
    parts += [f"joined {', '.join(joined)}"] if joined else []
    return lost, joined, f"world size {len(was)} -> {len(now)}" + (f" ({'; '.join(parts)})" if parts else "")


def run(tf: Any, hvd: Any, args: argparse.Namespace, job: Job) -> int:  # noqa: C901 (the elastic loop in the order Horovod's elastic examples write it)
    from horovod.common.elastic import ObjectState
    from horovod.common.exceptions import HostsUpdatedInterrupt

    def checkpoint(reason: str) -> None:
        """Rank 0: ckpt-<images> of the variables as they are now, unless that one is saved already."""
        manager = job.chief.manager
        if manager is None:
            return
        images = int(job.images_var.numpy())
        if (manager.latest_checkpoint or "").endswith(f"ckpt-{images}"):
            return
        batch, step = int(job.batch_var.numpy()), int(job.step_var.numpy())
        job.epoch_var.assign(images // max(1, job.train_examples))
        t = time.time()
        path = manager.save(checkpoint_number=images)
        seal_checkpoint(job.chief.copier, path, step, images, batch)
        fields = {"reason": reason} if reason else {}
        emit(
            "checkpoint",
            step=step,
            images=images,
            epoch=int(job.epoch_var.numpy()),
            path=path,
            seconds=time.time() - t,
            **fields,
        )

    class State(ObjectState):  # type: ignore[misc]  # horovod ships no types
        """The variables in host memory at each commit, and the plan; rank 0's reach every rank at a sync."""

        def __init__(self, **kwargs: Any) -> None:
            self._values = [v.numpy() for v in job.tracked]
            super().__init__(bcast_object=hvd.broadcast_object, get_rank=hvd.rank, **kwargs)

        def save(self) -> None:
            self._values = [v.numpy() for v in job.tracked]
            super().save()

        def restore(self) -> None:
            for v, value in zip(job.tracked, self._values):
                v.assign(value)
            super().restore()
            checkpoint("membership")  # the committed state on disk: the run may stop if too few nodes are left

        def check_host_updates(self) -> None:
            try:
                super().check_host_updates()
            except HostsUpdatedInterrupt:
                checkpoint("membership")  # as in restore: the hosts may not come back
                raise

        def sync(self) -> None:
            # TensorFlowState broadcasts nothing in eager mode: the variables go from rank 0 here.
            broadcast_from_rank0(tf, hvd, job.tracked)
            self._values = [v.numpy() for v in job.tracked]
            super().sync()

    state = State(plan_images=job.plan_images, members=[], status=job.status, started=time.time(), trained=0)
    spot = SpotWatch(args.imds_endpoint, args.spot_poll).start() if args.spot_poll and hvd.local_rank() == 0 else None
    handled = [False]  # this process's spot notice, acted on once

    def train_once(state: Any) -> int:
        if state.status:
            return int(state.status)
        size, rank = hvd.size(), hvd.rank()
        chief = rank == 0
        became = job.chief.follow(chief)
        members = hvd.allgather_object(os.environ.get("HOROVOD_HOSTNAME") or socket.gethostname())
        images = int(job.images_var.numpy())
        batch = args.batch_size * size
        spe = max(1, job.train_examples // batch)
        total_steps = max(1, int(round(args.epochs * spe)))
        peak = args.base_lr * batch / 256
        warmup = args.warmup_epochs * spe
        step = images // batch  # this global batch's step at those images
        if chief and state.members and collections.Counter(members) != collections.Counter(state.members):
            lost, joined, line = size_line(state.members, members)
            emit(
                "world_size",
                size=size,
                was=len(state.members),
                lost=",".join(lost),
                joined=",".join(joined),
                step=step,
                images=images,
                global_batch=batch,
                peak_lr=peak,
                message=line,
            )
        state.members = members
        if became:  # rank 0's process was lost: the committed state saved at once on this node
            checkpoint("membership")
        job.step_var.assign(step)
        job.batch_var.assign(batch)
        job.sums.assign(tf.zeros(3, tf.float64))
        seed = data_seed(args.seed, rank, images)  # a fresh shuffle from the images seen
        if args.synthetic:
            ds = synthetic_dataset(tf, args, job.classes, seed, args.batch_size)
        else:
            ds = train_dataset(tf, args, job.train_files, rank, size, seed, job.classes, job.threads)
        if job.gpus and args.input != "dali":  # DALI's batches are on the GPU already
            ds = ds.apply(tf.data.experimental.prefetch_to_device("/GPU:0", buffer_size=2))
        it = iter(ds)
        batch_t = tf.constant(batch, tf.int64)
        epoch_images = spe * batch
        last_step, last_time = step, time.time()
        while images < state.plan_images:
            if args.spot_poll and spot_notice(tf, hvd, spot) and not handled[0]:
                handled[0] = True
                checkpoint("spot")
                if spot is not None and spot.notice is not None:
                    emit("spot_notice", rank=rank, seen_at=f"{spot.seen_at:.3f}", action=spot.notice.get("action", ""))
                state.commit()  # the node with the notice goes; the others go on from here
            lr = learning_rate(images / batch, peak, warmup, total_steps, args.lr_schedule)
            x, y = next(it)
            job.train_step(x, y, tf.constant(lr, tf.float32), batch_t)
            step += 1
            images += batch
            state.trained += batch
            if step % args.log_every == 0 or images >= state.plan_images:
                loss, total = mean_losses(tf, hvd, job.sums)
                now = time.time()
                rate = (step - last_step) * batch / max(now - last_time, 1e-9)
                last_step, last_time = step, now
                if chief:
                    table_row(step, images / epoch_images, rate, loss, total, lr)
                    with job.chief.writer.as_default(step=images // args.batch_size):
                        tf.summary.scalar("train/loss", loss)
                        tf.summary.scalar("train/learning_rate", lr)
                        tf.summary.scalar("train/images_per_sec", rate)
                        tf.summary.scalar("train/world_size", size)
            epoch_end = images // epoch_images > (images - batch) // epoch_images
            if chief and (epoch_end or (args.checkpoint_every and step % args.checkpoint_every == 0)):
                checkpoint("")
            if step % args.commit_every == 0:
                state.commit()
        if chief:
            checkpoint("")
        return 0

    train = hvd.elastic.run(train_once)
    status: int = train(state)
    if status:
        return status
    # After the loop: the same ending as a fixed-size run (a change now fails the job: the work is saved).
    chief = hvd.rank() == 0
    job.chief.follow(chief)  # (a change of size now fails the job: this is the last membership)
    step, images = int(job.step_var.numpy()), int(job.images_var.numpy())
    batch = args.batch_size * hvd.size()
    spe = max(1, job.train_examples // batch)
    own = {v.ref() for v in job.model.non_trainable_variables} | {job.epoch_var.ref()}
    sync = replicas_agree(
        tf, hvd, [v for v in job.tracked if v.ref() not in own and "save_counter" not in v.name], job.opt
    )
    if chief:
        emit("sync", step=step, identical=sync[0], variables=len(job.tracked) - len(own), loss_scales=sync[1])
        job.chief.writer.flush()
        trained = time.time() - state.started
        emit(
            "done",
            step=step,
            epoch=images / (spe * batch),
            complete=step >= max(1, int(round(args.epochs * spe))),
            elapsed=time.time() - STARTED,
            img_per_sec=state.trained / max(trained, 1e-9),
            images=images,
            plan_images=state.plan_images,
        )
        print(f"Finished in {trained:.1f} s", flush=True)
    if job.chief.copier is not None:
        job.chief.copier.wait()
    if args.no_eval:
        return 0
    return evaluate(
        tf,
        hvd,
        args,
        job.model,
        step,
        spe,
        job.chief.manager.latest_checkpoint if job.chief.manager else "",
        writer=job.chief.writer,
        **job.eval_kwargs,
    )
