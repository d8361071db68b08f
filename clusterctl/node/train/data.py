"""The trainer's input: the TFRecord shards and dataset.json of --data, the training pipeline (Inception-style
crop, flip, 8-bit images to the device) with seeds per rank and restart, the evaluation pipeline, the synthetic
batch, and the normalisation the device applies. TensorFlow is passed in (`tf`), imported by the caller after
its argument checks."""

from __future__ import annotations

import argparse
import glob
import json
import os
from typing import Any

BAD_LABEL = "label outside 0..classes-1 after --label-offset"
IMAGENET_TRAIN_EXAMPLES = 1281167
MEAN_RGB = (0.485 * 255, 0.456 * 255, 0.406 * 255)
STDDEV_RGB = (0.229 * 255, 0.224 * 255, 0.225 * 255)


def data_files(data_dir: str, split: str) -> list[str]:
    """`train-*` / `validation-*` shards, sorted; hidden and temporary files are not shards."""
    return sorted(
        f
        for f in glob.glob(os.path.join(data_dir, f"{split}-*"))
        if not f.endswith((".tmp", ".partial")) and os.path.isfile(f)
    )


def dataset_meta(data_dir: str | None) -> dict[str, Any]:
    """dataset.json and labels.txt written by `clusterctl data`, when present."""
    meta: dict[str, Any] = {}
    if not data_dir:
        return meta
    path = os.path.join(data_dir, "dataset.json")
    if os.path.isfile(path):
        with open(path) as f:
            meta = json.load(f)
    labels = os.path.join(data_dir, "labels.txt")
    if "num_classes" not in meta and os.path.isfile(labels):
        with open(labels) as f:
            meta["num_classes"] = sum(1 for line in f if line.strip())
    return meta


def label_problem(meta: dict[str, Any], label_offset: int, classes: int) -> str | None:
    """Why the labels of a dataset.json (label_base, num_classes) fall outside 0..classes-1 after the
    offset; None when they fit or the metadata does not say."""
    base, n = meta.get("label_base"), meta.get("num_classes")
    if not isinstance(base, int) or not isinstance(n, int) or n < 1:
        return None
    low, high = base - label_offset, base + n - 1 - label_offset
    if low < 0 or high > classes - 1:
        return (
            f"labels {base}..{base + n - 1} minus --label-offset {label_offset} are {low}..{high}, "
            f"outside 0..{classes - 1}: use --label-offset {base}"
        )
    return None


def parse_record(tf: Any, serialized: Any, label_offset: int, classes: int | None = None) -> tuple[Any, Any, Any]:
    """One serialized Example -> (JPEG bytes, 0-based label, boxes [1, N, 4] as ymin, xmin, ymax, xmax).
    With `classes`, a label outside 0..classes-1 raises InvalidArgumentError (one_hot would silently make
    it an all-zero target)."""
    features = {
        "image/encoded": tf.io.FixedLenFeature([], tf.string, default_value=""),
        "image/class/label": tf.io.FixedLenFeature([], tf.int64, default_value=-1),
    }
    for k in ("xmin", "ymin", "xmax", "ymax"):
        features[f"image/object/bbox/{k}"] = tf.io.VarLenFeature(tf.float32)
    p = tf.io.parse_single_example(serialized, features)
    label = tf.cast(p["image/class/label"], tf.int32) - label_offset
    if classes is not None:
        tf.debugging.assert_less(label, classes, message=BAD_LABEL)
        tf.debugging.assert_non_negative(label, message=BAD_LABEL)
    box = tf.stack([tf.sparse.to_dense(p[f"image/object/bbox/{k}"]) for k in ("ymin", "xmin", "ymax", "xmax")], axis=-1)
    return p["image/encoded"], label, tf.reshape(box, [1, -1, 4])


def normalize(tf: Any, image: Any) -> Any:
    """Cast and normalise, on the device: the step's first op (XLA fuses it into the model's first conv)."""
    image = tf.cast(image, tf.float32)
    return (image - tf.constant(MEAN_RGB)) / tf.constant(STDDEV_RGB)


def _to_uint8(tf: Any, image: Any) -> Any:
    """The pipeline hands 8-bit images to the device (a quarter of float32's bytes, as NVIDIA's reference
    pipeline does); normalize runs there."""
    return tf.cast(tf.clip_by_value(tf.round(image), 0.0, 255.0), tf.uint8)


def preprocess_train(tf: Any, encoded: Any, box: Any, size: int, min_area: float, seed: Any) -> Any:
    """The Inception-style random crop (guided by the boxes when there are any), resize, flip; `seed`
    (shape [2]) decides both, so each rank and each restart draws its own (see augment_seeds)."""
    crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    shape = tf.image.extract_jpeg_shape(encoded)
    begin, crop, _ = tf.image.stateless_sample_distorted_bounding_box(
        shape,
        bounding_boxes=box,
        seed=crop_seed,
        min_object_covered=0.1,
        aspect_ratio_range=(3 / 4, 4 / 3),
        area_range=(min_area, 1.0),
        max_attempts=10,
        use_image_if_no_bounding_boxes=True,
    )
    y, x, _ = tf.unstack(begin)
    h, w, _ = tf.unstack(crop)
    image = tf.image.decode_and_crop_jpeg(encoded, tf.stack([y, x, h, w]), channels=3)
    image = tf.image.resize(image, [size, size], method="bilinear")
    image = tf.image.stateless_random_flip_left_right(image, flip_seed)
    return _to_uint8(tf, image)


def preprocess_eval(tf: Any, encoded: Any, size: int) -> Any:
    """Centre crop of 87.5% of the shorter side, resize."""
    image = tf.io.decode_jpeg(encoded, channels=3)
    shape = tf.shape(image)
    side = tf.cast(tf.cast(tf.minimum(shape[0], shape[1]), tf.float32) * 0.875, tf.int32)
    image = tf.image.crop_to_bounding_box(image, (shape[0] - side) // 2, (shape[1] - side) // 2, side, side)
    image = tf.image.resize(image, [size, size], method="bilinear")
    return _to_uint8(tf, image)


def augment_seeds(tf: Any, seed: int) -> Any:
    """An endless stream of [2]-shaped seeds, one per training image, for the stateless crop and flip.
    `seed` is data_seed(): it differs by rank and by the step a run starts from, so ranks and restarts
    do not draw the same augmentation sequence (the global seed alone would give every rank the same)."""
    return tf.data.Dataset.random(seed=seed).batch(2)


def data_seed(seed: int, rank: int, start_step: int) -> int:
    """A different shuffle and augmentation on every (re)start, different on every rank."""
    return seed + 7919 * rank + 104729 * start_step


def records(tf: Any, files: list[str], rank: int, size: int, *, training: bool, seed: int, threads: int = 8) -> Any:
    """This rank's records. Each file goes to one rank when there are at least as many files as ranks
    (every record read once per pass, by exactly one rank); with fewer files, records are dealt out.
    Up to `threads` files are read in parallel."""
    if len(files) >= size:
        ds = tf.data.Dataset.from_tensor_slices(files).shard(size, rank)
        if training:
            ds = ds.shuffle(len(files), seed=seed, reshuffle_each_iteration=True).repeat()
        ds = ds.interleave(
            lambda f: tf.data.TFRecordDataset(f, buffer_size=8 << 20),
            cycle_length=min(threads, max(1, len(files) // size)),
            block_length=1,
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=not training,
        )
        return ds
    ds = tf.data.TFRecordDataset(files, buffer_size=8 << 20).shard(size, rank)
    return ds.repeat() if training else ds


def _sized(tf: Any, ds: Any, threads: int) -> Any:
    """The pipeline's own thread pool, the node's CPUs shared by its processes (not each process all)."""
    options = tf.data.Options()
    options.threading.private_threadpool_size = threads
    options.threading.max_intra_op_parallelism = 1
    return ds.with_options(options)


def train_dataset(
    tf: Any,
    args: argparse.Namespace,
    files: list[str],
    rank: int,
    size: int,
    seed: int,
    classes: int | None = None,
    threads: int = 8,
) -> Any:
    if args.input == "dali":  # the same batches decoded by DALI (dali.py); args.device_id: main.py's
        from clusterctl.node.train import dali

        return dali.train_dataset(tf, args, files, rank, size, seed, threads, args.device_id)
    ds = records(tf, files, rank, size, training=True, seed=seed, threads=threads)
    ds = ds.shuffle(args.shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    # The seed rides with each record through the parallel map: the same image gets the same crop
    # whichever thread decodes it.
    ds = tf.data.Dataset.zip((ds, augment_seeds(tf, seed)))

    def fn(serialized: Any, aug_seed: Any) -> tuple[Any, Any]:
        encoded, label, box = parse_record(tf, serialized, args.label_offset, classes)
        return preprocess_train(tf, encoded, box, args.image_size, args.min_crop_area, aug_seed), label

    # AUTOTUNE: tf.data sizes the parallelism itself, within the pipeline's own pool of `threads` (_sized).
    # No AutoGraph (tf.data's default): no Python control flow over tensors here, and converting costs each
    # process CPU at its start.
    ds = ds.map(tf.autograph.experimental.do_not_convert(fn), num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
    return _sized(tf, ds.batch(args.batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE), threads)


def eval_dataset(tf: Any, args: argparse.Namespace, files: list[str], rank: int, size: int, threads: int = 8) -> Any:
    if args.input == "dali":
        from clusterctl.node.train import dali

        return dali.eval_dataset(tf, args, files, rank, size, threads, args.device_id)
    ds = records(tf, files, rank, size, training=False, seed=0, threads=threads)

    def fn(serialized: Any) -> tuple[Any, Any]:
        encoded, label, _ = parse_record(tf, serialized, args.label_offset)
        return preprocess_eval(tf, encoded, args.image_size), label

    ds = ds.map(tf.autograph.experimental.do_not_convert(fn), num_parallel_calls=tf.data.AUTOTUNE)
    return _sized(tf, ds.batch(args.eval_batch_size).prefetch(tf.data.AUTOTUNE), threads)


def synthetic_dataset(tf: Any, args: argparse.Namespace, classes: int, seed: int, batch: int) -> Any:
    """One random batch of 8-bit images on this process, repeated: measures everything but storage and
    decoding."""
    g = tf.random.Generator.from_seed(seed)
    images = tf.cast(g.uniform((batch, args.image_size, args.image_size, 3), maxval=256, dtype=tf.int32), tf.uint8)
    labels = g.uniform((batch,), maxval=classes, dtype=tf.int32)
    return tf.data.Dataset.from_tensors((images, labels)).repeat()


def count_records(tf: Any, hvd: Any, files: list[str], alone: bool = False) -> int:
    """Records in `files`, each rank counting its own share, summed over all ranks (alone: this rank counts
    them all, no collective: an elastic job's process may join while the others train)."""
    rank, size = (0, 1) if alone else (hvd.rank(), hvd.size())
    mine = [f for i, f in enumerate(files) if i % size == rank]
    n = 0
    if mine:
        n = int(tf.data.TFRecordDataset(mine).reduce(tf.constant(0, tf.int64), lambda c, _: c + 1))
    return n if alone else int(hvd.allreduce(tf.constant(n, tf.int64), op=hvd.Sum))
