"""`python3 PYZ train ARGS`: one rank's whole run, in the order Horovod's examples write it: the flags, the
device, the data and what it implies, the model and optimizer, the checkpoint to resume from (rank 0's, to every
rank), then the loop (elastic.py's under --elastic), the checkpoints, the evaluation. What each line means and
the exit statuses: the package's docstring (clusterctl/node/train/__init__.py)."""

from __future__ import annotations

import os
import socket
import sys
import time
from typing import Any

from clusterctl.node import nccl_report
from clusterctl.node.train import checkpoints, elastic, step as step_fns
from clusterctl.node.train.dali import device_id as dali_device
from clusterctl.node.train.data import (
    BAD_LABEL,
    IMAGENET_TRAIN_EXAMPLES,
    count_records,
    data_files,
    data_seed,
    dataset_meta,
    label_problem,
    synthetic_dataset,
    train_dataset,
)
from clusterctl.node.train.evaluate import evaluate
from clusterctl.node.train.log import STARTED, emit, mean_losses, table_header, table_row
from clusterctl.node.train.model import (
    build_model,
    choose_precision,
    describe,
    device_report,
    pin_device,
    report_devices,
    zero_gamma_layers,
)
from clusterctl.node.train.options import (
    EXIT_BAD_LABELS,
    EXIT_CHECKPOINT,
    EXIT_HPARAMS,
    EXIT_NO_DATA,
    EXIT_SIZE_MISMATCH,
    HPARAMS,
    learning_rate,
    parse_args,
)
from clusterctl.node.train.resume import (
    check_hparams,
    checkpoint_variables,
    choose_checkpoint,
    replicas_agree,
    seal_checkpoint,
    spot_notice,
    stop_for_spot,
)
from clusterctl.node.train.spot import SpotWatch

# TF's C++ start-up chatter would bury the table in every rank's output.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main(argv: list[str] | None = None) -> int:  # noqa: C901 (a rank's whole run, in the order Horovod's examples write it)
    args = parse_args(argv)
    nccl_report.capture()  # before NCCL starts: its report of the network into this process's own file

    import horovod.tensorflow as hvd
    import tensorflow as tf

    hvd.init()
    rank, size, local_rank = hvd.rank(), hvd.size(), hvd.local_rank()
    chief = rank == 0

    if args.expect_size is not None and size != args.expect_size:
        if chief:
            emit("error", kind="size_mismatch", size=size, expected=args.expect_size)
        return EXIT_SIZE_MISMATCH

    # This host's cores shared between its processes: the input pipeline's threads (and on CPU the model's).
    gpus, capabilities, threads = pin_device(tf, hvd, hide_gpus=args.no_gpu)
    args.device_id = dali_device(gpus)  # where --input dali decodes: this rank's GPU, else DALI's CPU backend

    # Every rank says which GPU it has (after the device set-up above: this starts TensorFlow's runtime).
    if args.elastic:
        # No collective before the elastic loop: a process joining later would meet the others in its sync.
        gpu_ids, logical = device_report(tf)
        emit("device", rank=rank, host=socket.gethostname(), local_rank=local_rank, gpus=gpu_ids, logical=logical)
    else:
        report_devices(tf, hvd, emit)
        nccl_report.check(tf, hvd, gpus, emit)  # the network NCCL chose: a wrong one ends the run here

    precision = choose_precision(args.precision, capabilities)
    if precision != "float32":
        tf.keras.mixed_precision.set_global_policy(precision)
    loss_scaling = precision == "mixed_float16"

    # ---- the data and what it implies
    meta = dataset_meta(None if args.synthetic else args.data)
    train_files: list[str] = []
    val_files: list[str] = []
    if not args.synthetic:
        train_files = data_files(args.data, "train")
        val_files = data_files(args.data, "validation")
        missing: list[str] = []
        if not args.eval_only and not train_files:
            missing.append("train")
        if (args.eval_only or not args.no_eval or args.eval_every) and not val_files:
            missing.append("validation")
        if missing:
            if chief:
                emit("error", kind="no_data", data=args.data, missing=",".join(missing))
                print(
                    f"train: no {' or '.join(s + '-*' for s in missing)} files in {args.data}",
                    file=sys.stderr,
                    flush=True,
                )
            return EXIT_NO_DATA
    classes = args.num_classes or meta.get("num_classes") or (10 if args.synthetic and args.model == "tiny" else 1000)
    if args.train_examples:
        train_examples = args.train_examples
    elif args.synthetic:
        train_examples = IMAGENET_TRAIN_EXAMPLES
    elif meta.get("splits", {}).get("train", {}).get("examples"):
        train_examples = int(meta["splits"]["train"]["examples"])
    else:
        train_examples = count_records(tf, hvd, train_files, alone=args.elastic) if train_files else 0

    bad_labels = None if args.synthetic else label_problem(meta, args.label_offset, classes)
    if bad_labels:
        if chief:
            emit("error", kind="bad_labels", message=bad_labels)
            print(f"train: Error: {bad_labels}", file=sys.stderr, flush=True)
        return EXIT_BAD_LABELS

    global_batch: int = args.batch_size * size
    steps_per_epoch = max(1, train_examples // global_batch)
    total_steps = max(1, int(round(args.epochs * steps_per_epoch)))
    stop_step = min(total_steps, args.max_steps) if args.max_steps else total_steps
    peak_lr = args.base_lr * global_batch / 256
    warmup_steps = args.warmup_epochs * steps_per_epoch

    # ---- model, optimizer, checkpoint
    tf.random.set_seed(args.seed)  # the same initial weights everywhere (and the broadcast makes sure)
    model = build_model(tf, args.model, args.image_size, classes, args.recipe)
    zeroed = zero_gamma_layers(tf, model)
    if chief:
        print(describe(args.model, model), flush=True)
    opt, inner = step_fns.make_optimizer(tf, peak_lr, args.momentum, loss_scaling)
    inner.build(model.trainable_variables)  # momentum slots exist now: restore and broadcast can fill them
    step_var = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
    epoch_var = tf.Variable(0, dtype=tf.int64, trainable=False, name="epoch")
    # The global batch the steps were counted in: a job resumed on another number of processes keeps its
    # place in the schedule by epochs, not by steps.
    batch_var = tf.Variable(global_batch, dtype=tf.int64, trainable=False, name="global_batch")
    # Images trained on, all ranks together: what orders and names the checkpoints (ckpt-<images>), and where a
    # resume on another number of processes takes up the schedule; steps are rescaled there, images never.
    images_var = tf.Variable(0, dtype=tf.int64, trainable=False, name="images_seen")
    ckpt = tf.train.Checkpoint(
        model=model, optimizer=opt, step=step_var, epoch=epoch_var, global_batch=batch_var, images=images_var
    )
    ckpt_dir = os.path.join(args.model_dir, "checkpoints")
    copier: checkpoints.Copier | None = None
    manager: Any = None  # rank 0's CheckpointManager
    restored = ""
    status = 0
    hparams = {k: getattr(args, k) for k in HPARAMS if k != "num_classes"}
    hparams["num_classes"] = classes
    if chief:
        os.makedirs(ckpt_dir, exist_ok=True)
        copier = choose_checkpoint(tf, args, ckpt_dir)
        manager = tf.train.CheckpointManager(ckpt, ckpt_dir, max_to_keep=args.keep_checkpoints)
        mismatch = (
            None
            if args.eval_only
            else check_hparams(os.path.join(ckpt_dir, "hparams.json"), hparams, bool(manager.latest_checkpoint))
        )
        if mismatch:
            emit("error", kind="hparams_mismatch", message=mismatch)
            print(f"train: Error: {mismatch}", file=sys.stderr, flush=True)
            status = EXIT_HPARAMS
        elif manager.latest_checkpoint:
            try:
                ckpt.restore(manager.latest_checkpoint).assert_existing_objects_matched()
                restored = manager.latest_checkpoint
            except (AssertionError, ValueError, tf.errors.OpError) as exc:
                emit(
                    "error",
                    kind="bad_checkpoint",
                    checkpoint=manager.latest_checkpoint,
                    message=" ".join(str(exc).split())[:300],
                )
                status = EXIT_CHECKPOINT
        elif args.eval_only:
            emit("error", kind="no_checkpoint", model_dir=args.model_dir)
            status = EXIT_CHECKPOINT
    # Every rank learns rank 0's verdict, so all exit together instead of waiting in a collective.
    if not args.elastic:  # (elastic: rank 0's status and variables reach every rank in the state's sync)
        status = int(hvd.broadcast(tf.constant(status, tf.int32), root_rank=0, name="restore_status"))
        if status:
            return status
    # Everything the checkpoint holds, not model + opt.variables: a LossScaleOptimizer's loss scale is not
    # among its .variables, and a rank left at the initial scale unscales the averaged gradients differently.
    _ = ckpt.save_counter  # created lazily (by a restore or a save): make it on every rank, so all list the same
    tracked = checkpoint_variables(tf, ckpt)
    if not args.elastic:
        step_fns.broadcast_from_rank0(tf, hvd, tracked)
    start_step = int(step_var.numpy())
    saved_batch = int(batch_var.numpy())
    start_images = int(images_var.numpy())

    eval_kwargs: dict[str, Any] = dict(classes=classes, val_files=val_files, threads=threads)
    if args.eval_only:
        # Epochs as the training run counted them (its global batch, not this evaluation's).
        saved_spe = max(1, train_examples // saved_batch) if saved_batch > 0 else steps_per_epoch
        return evaluate(tf, hvd, args, model, start_step, saved_spe, restored, **eval_kwargs)
    batch_changed: dict[str, int] = {}
    if saved_batch != global_batch:
        moved = int(round(start_images / global_batch))  # the step of this global batch at those images
        if restored:
            batch_changed = dict(saved=saved_batch, now=global_batch, step=start_step, new_step=moved)
        start_step = moved
        step_var.assign(moved)
        batch_var.assign(global_batch)

    writer: Any = tf.summary.create_file_writer(os.path.join(args.model_dir, "tensorboard")) if chief else None
    if chief:
        emit(
            "start",
            size=size,
            model=args.model,
            image_size=args.image_size,
            classes=classes,
            batch=args.batch_size,
            global_batch=global_batch,
            train_examples=train_examples,
            steps_per_epoch=steps_per_epoch,
            epochs=float(args.epochs),
            total_steps=total_steps,
            stop_step=stop_step,
            start_step=start_step,
            start_images=start_images,
            peak_lr=peak_lr,
            schedule=args.lr_schedule,
            precision=precision,
            loss_scaling=loss_scaling,
            fp16_allreduce=args.fp16_allreduce,
            recipe=args.recipe,
            label_smoothing=args.label_smoothing,
            zero_gamma_layers=zeroed,
            eval_every=args.eval_every,
            input_threads=threads,
            input=args.input,
            fusion_threshold=os.environ.get("HOROVOD_FUSION_THRESHOLD", ""),
            cycle_time_ms=os.environ.get("HOROVOD_CYCLE_TIME", ""),
            xla=args.xla,
            gpus=len(gpus),
            synthetic=args.synthetic,
            data=args.data or "",
            model_dir=args.model_dir,
            train_files=len(train_files),
            validation_files=len(val_files),
            elastic=args.elastic,
            commit_every=args.commit_every,
        )
        if restored:
            emit("resume", step=start_step, images=start_images, epoch=int(epoch_var.numpy()), checkpoint=restored)
        if batch_changed:
            emit("warning", kind="global_batch_changed", **batch_changed)
        if train_files and len(train_files) % size:
            emit("warning", kind="uneven_shards", files=len(train_files), size=size)

    if start_step >= stop_step and not args.elastic:
        if chief:
            emit(
                "done",
                step=start_step,
                epoch=start_step / steps_per_epoch,
                complete=start_step >= total_steps,
                elapsed=time.time() - STARTED,
                img_per_sec=0.0,
                note="nothing left to train",
            )
        if args.no_eval:
            return 0
        return evaluate(tf, hvd, args, model, start_step, steps_per_epoch, restored, writer=writer, **eval_kwargs)

    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    sums = tf.Variable(tf.zeros(3, tf.float64), trainable=False)  # loss, total loss, steps since the last line
    objective = step_fns.make_objective(tf, model, classes, args.label_smoothing, args.weight_decay, args.recipe)
    forward = step_fns.make_forward(tf, model, args.xla)
    forward_backward = step_fns.make_step(
        tf, hvd, model, opt, objective, forward, loss_scaling=loss_scaling, compression=compression
    )

    def one_step(images: Any, labels: Any, lr: Any, batch: Any) -> None:
        inner.learning_rate.assign(lr)
        loss, total = forward_backward(images, labels)
        step_var.assign_add(1)
        images_var.assign_add(batch)  # the global batch (a tensor: an elastic job's size changes, no retrace)
        sums.assign_add(tf.cast(tf.stack([loss, total, 1.0]), tf.float64))

    train_step = tf.function(one_step, autograph=False)  # see bench.py
    if chief:
        table_header()
    if args.elastic:
        return elastic.run(
            tf,
            hvd,
            args,
            elastic.Job(
                train_step=train_step,
                tracked=tracked,
                sums=sums,
                chief=elastic.Chief(
                    make=lambda: elastic.chief_tools(tf, args, ckpt, hparams),
                    writer=writer,
                    manager=manager,
                    copier=copier,
                    held=chief,
                ),
                step_var=step_var,
                epoch_var=epoch_var,
                batch_var=batch_var,
                images_var=images_var,
                classes=classes,
                train_files=train_files,
                train_examples=train_examples,
                threads=threads,
                gpus=len(gpus),
                plan_images=stop_step * global_batch,
                status=status,
                model=model,
                opt=opt if loss_scaling else None,
                eval_kwargs=eval_kwargs,
            ),
        )
    # A different shuffle and augmentation on every (re)start, different on every rank.
    seed = data_seed(args.seed, rank, start_step)
    if args.synthetic:
        train_ds = synthetic_dataset(tf, args, classes, seed, args.batch_size)
    else:
        train_ds = train_dataset(tf, args, train_files, rank, size, seed, classes, threads)
    if gpus and args.input != "dali":  # DALI's batches are on the GPU already
        train_ds = train_ds.apply(tf.data.experimental.prefetch_to_device("/GPU:0", buffer_size=2))

    # Each node's first process watches its own instance; a notice on any node stops every rank.
    spot = SpotWatch(args.imds_endpoint, args.spot_poll).start() if args.spot_poll and local_rank == 0 else None
    it = iter(train_ds)
    step = start_step
    last_step, last_time = step, time.time()
    run_start = last_time

    def latest() -> str:
        """The checkpoint an evaluation reports (rank 0's newest; "" elsewhere)."""
        return manager.latest_checkpoint if manager else ""

    def position(step: int) -> float:
        """Where the schedule is, in steps of this global batch, counted from the images seen (exact after a
        resume on another number of processes, where `step` was rounded)."""
        return (start_images + (step - start_step) * global_batch) / global_batch

    lr = learning_rate(position(step), peak_lr, warmup_steps, total_steps, args.lr_schedule)
    while step < stop_step:
        if args.spot_poll and spot_notice(tf, hvd, spot):
            return stop_for_spot(
                tf, hvd, args, manager, copier, epoch_var, step, steps_per_epoch, spot, images_var, global_batch
            )
        lr = learning_rate(position(step), peak_lr, warmup_steps, total_steps, args.lr_schedule)
        try:
            images, labels = next(it)
        except tf.errors.InvalidArgumentError as exc:
            if BAD_LABEL not in str(exc):
                raise
            # Any rank may meet it first: it says so itself; horovodrun then ends the others.
            message = f"a {BAD_LABEL} in rank {rank}'s data at step {step + 1}: check --label-offset and --num-classes"
            emit("error", kind="bad_labels", rank=rank, step=step + 1, message=message)
            print(f"train: Error: {message}", file=sys.stderr, flush=True)
            return EXIT_BAD_LABELS
        train_step(images, labels, tf.constant(lr, tf.float32), tf.constant(global_batch, tf.int64))
        step += 1
        if step % args.log_every == 0 or step == start_step + 1 or step == stop_step:
            loss, total = mean_losses(tf, hvd, sums)  # a collective: all ranks come here
            now = time.time()
            rate = (step - last_step) * global_batch / max(now - last_time, 1e-9)
            last_step, last_time = step, now
            if chief:
                table_row(step, step / steps_per_epoch, rate, loss, total, lr)
                with writer.as_default(step=step):
                    tf.summary.scalar("train/loss", loss)
                    tf.summary.scalar("train/total_loss", total)
                    tf.summary.scalar("train/learning_rate", lr)
                    tf.summary.scalar("train/images_per_sec", rate)
                    tf.summary.scalar("train/epoch", step / steps_per_epoch)
        epoch_end = step % steps_per_epoch == 0
        if chief and (epoch_end or step == stop_step or (args.checkpoint_every and step % args.checkpoint_every == 0)):
            epoch_var.assign(step // steps_per_epoch)
            t = time.time()
            seen = int(images_var.numpy())  # (`images` is the batch)
            path = manager.save(checkpoint_number=seen)
            seal_checkpoint(copier, path, step, seen, global_batch)
            emit("checkpoint", step=step, images=seen, epoch=int(epoch_var.numpy()), path=path, seconds=time.time() - t)
        if (
            args.eval_every
            and epoch_end
            and (step // steps_per_epoch) % args.eval_every == 0
            and (step < stop_step or args.no_eval)
        ):
            # All ranks, each validation image once (the final evaluation's sharding); not the sweep's metric.
            evaluate(tf, hvd, args, model, step, steps_per_epoch, latest(), writer=writer, final=False, **eval_kwargs)
    # Batch-norm moving statistics are each rank's own (not averaged), the epoch and the save counter are
    # set by rank 0 when it saves; everything else must be the same.
    own = {v.ref() for v in model.non_trainable_variables} | {epoch_var.ref(), ckpt.save_counter.ref()}
    sync = replicas_agree(tf, hvd, [v for v in tracked if v.ref() not in own], opt if loss_scaling else None)
    if chief:
        emit("sync", step=step, identical=sync[0], variables=len(tracked) - len(own), loss_scales=sync[1])
        if not sync[0]:
            emit("warning", kind="replicas_differ", step=step, loss_scales=sync[1], variables=sync[2])
        writer.flush()
        trained = time.time() - run_start
        emit(
            "done",
            step=step,
            epoch=step / steps_per_epoch,
            complete=step >= total_steps,
            elapsed=time.time() - STARTED,
            img_per_sec=(step - start_step) * global_batch / max(trained, 1e-9),
        )
        print(f"Finished in {trained:.1f} s", flush=True)
    if copier is not None:
        copier.wait()
    if args.no_eval:
        return 0
    return evaluate(tf, hvd, args, model, step, steps_per_epoch, latest(), writer=writer, **eval_kwargs)
