"""NVIDIA DALI as the trainer's input (`--input dali`): the same records, augmentations and evaluation crop as
data.py's tf.data pipelines, decoded by DALI: on the GPU (device 'mixed': nvJPEG) where the rank has one, on
DALI's CPU backend elsewhere.

What matches data.py: the Inception-style random crop (area min_crop_area..1 of the image, aspect 3/4..4/3,
10 attempts, else the whole image), a bilinear resize without antialiasing to image_size (tf.image.resize's
default), a coin-flip mirror, 8-bit images out; the evaluation's centre crop of 7/8 of the shorter side
(the same integer arithmetic as data.preprocess_eval) and the same resize. What does not: the bounding boxes
of ImageNet's records do not guide the crop (NVIDIA's DALI pipeline ignores them too; `clusterctl data`
writes none), and the random draws are DALI's, not tf.random's.

DALI's TFRecord reader needs an index of each file (the byte offset and length of every record, one line
each, the format of DALI's tfrecord2idx): `index_files` writes them on the node with the standard library,
next to the records in DATA/.dali-index/ (hidden, so no `train-*` glob sees them), or in the system's temporary
folder where DATA is read-only; an index older than its record is written again.

Batches reach TensorFlow through DALI's TensorFlow plugin (nvidia.dali.plugin.tf.DALIDataset) when the runtime
has it (the GPU runtime builds it against its TensorFlow); otherwise through tf.data.Dataset.from_generator
over the pipeline's outputs (host memory). Sharding: DALI's reader gives rank r of n the r-th contiguous n-th
of all records.
"""

from __future__ import annotations

import os
import struct
import tempfile
from dataclasses import dataclass
from typing import Any, Iterator

INDEX_DIR = ".dali-index"
EVAL_CROP = (7, 8)  # data.preprocess_eval's 0.875 of the shorter side: 7 * side // 8 is exactly its float result


class DaliMissing(RuntimeError):
    """DALI is not installed in this Python (the CPU node runtime does not carry it)."""


def record_offsets(path: str) -> Iterator[tuple[int, int]]:
    """(offset, length) of every record of a TFRecord file: 8-byte length, 4-byte CRC, data, 4-byte CRC.
    ValueError for a truncated file."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        offset = 0
        while offset < size:
            head = f.read(12)
            if len(head) < 12:
                raise ValueError(f"{path}: truncated record header at byte {offset}")
            (length,) = struct.unpack("<Q", head[:8])
            end = offset + 12 + length + 4
            if end > size:
                raise ValueError(f"{path}: record at byte {offset} runs past the end of the file")
            f.seek(end)
            yield offset, end - offset
            offset = end


def write_index(record: str, index: str) -> int:
    """DALI's index of `record` (`offset length` per line), written under a temporary name and renamed, so
    ranks building the same index at once never read half of one. Returns the records indexed."""
    lines = [f"{o} {n}\n" for o, n in record_offsets(record)]
    tmp = f"{index}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.writelines(lines)
    os.replace(tmp, index)
    return len(lines)


def _index_dir(data_dir: str) -> str:
    """DATA/.dali-index, or a folder in the temporary directory named after DATA when DATA is read-only."""
    own = os.path.join(data_dir, INDEX_DIR)
    try:
        os.makedirs(own, exist_ok=True)
        if os.access(own, os.W_OK):
            return own
    except OSError:
        pass
    name = os.path.realpath(data_dir).strip("/").replace("/", "_") or "root"
    fallback = os.path.join(tempfile.gettempdir(), "clusterctl-dali-index", name)
    os.makedirs(fallback, exist_ok=True)
    return fallback


def index_files(files: list[str]) -> list[str]:
    """One index per record file (built when missing, or older than its file), in the order of `files`."""
    out = []
    folders: dict[str, str] = {}
    for record in files:
        parent = os.path.dirname(os.path.abspath(record))
        folder = folders.setdefault(parent, _index_dir(parent))
        index = os.path.join(folder, os.path.basename(record) + ".idx")
        if not os.path.isfile(index) or os.path.getmtime(index) < os.path.getmtime(record):
            write_index(record, index)
        out.append(index)
    return out


def shard_range(records: int, rank: int, size: int) -> tuple[int, int]:
    """The records DALI's reader gives shard `rank` of `size` (its ShardingPolicy: contiguous, floor-divided)."""
    return records * rank // size, records * (rank + 1) // size


def count_indexed(indexes: list[str]) -> int:
    total = 0
    for index in indexes:
        with open(index) as f:
            total += sum(1 for line in f if line.strip())
    return total


def _dali() -> Any:
    try:
        import nvidia.dali as dali
    except ImportError as exc:
        raise DaliMissing(
            f"--input dali needs NVIDIA DALI in the node runtime ({exc}); the GPU runtime carries it"
        ) from None
    return dali


def plugin_available() -> bool:
    """DALI's TensorFlow plugin loads in this process (it is built against the runtime's TensorFlow)."""
    try:
        import nvidia.dali.plugin.tf  # noqa: F401
    except Exception:  # the plugin raises its own errors when its library does not match this TF
        return False
    return True


def device_id(gpus: list[Any]) -> int | None:
    """The CUDA device DALI decodes on: the one GPU model.pin_device left this process (its physical index,
    as TensorFlow names it `/physical_device:GPU:N`), or None on the CPU."""
    return int(gpus[0].name.rsplit(":", 1)[1]) if gpus else None


def _features(dali: Any) -> dict[str, Any]:
    tfrec = dali.tfrecord
    return {
        "image/encoded": tfrec.FixedLenFeature((), tfrec.string, ""),
        "image/class/label": tfrec.FixedLenFeature([1], tfrec.int64, -1),
    }


@dataclass(frozen=True)
class Shard:
    """What a pipeline reads and makes: this rank's share of `files` (with their `indexes`), batches of
    `batch` 8-bit images of `image_size` squared, labels less `label_offset`; DALI's `threads`, on GPU
    `device_id` (None: DALI's CPU backend)."""

    files: list[str]
    indexes: list[str]
    rank: int
    size: int
    batch: int
    image_size: int
    label_offset: int
    threads: int
    device_id: int | None

    @property
    def decoder(self) -> str:
        return "cpu" if self.device_id is None else "mixed"

    def read(self, dali: Any, **how: Any) -> Any:
        """The shard's records (DALI's reader)."""
        features = _features(dali)
        return dali.fn.readers.tfrecord(
            path=self.files, index_path=self.indexes, features=features, shard_id=self.rank, num_shards=self.size, **how
        )

    def build(self, dali: Any, graph: Any, seed: int) -> Any:
        """The pipeline of `graph` (a function of no arguments returning its outputs), not yet built."""
        threads = max(1, self.threads)
        return dali.pipeline_def(
            graph, batch_size=self.batch, num_threads=threads, device_id=self.device_id, seed=seed
        )()


def _resize(dali: Any, images: Any, image_size: int) -> Any:
    """tf.image.resize's default: bilinear, half-pixel centres, no antialiasing."""
    linear = dali.types.INTERP_LINEAR
    return dali.fn.resize(images, resize_x=image_size, resize_y=image_size, interp_type=linear, antialias=False)


def _labels(dali: Any, inputs: Any, label_offset: int, device_id: int | None) -> Any:
    """0-based int32 labels, on the GPU beside the images when they are decoded there (DALIDataset on a GPU
    returns every output from it, as NVIDIA's reference pipeline moves its labels)."""
    fn, types = dali.fn, dali.types
    label = fn.cast(fn.reshape(inputs["image/class/label"], shape=[]) - label_offset, dtype=types.INT32)
    return label if device_id is None else label.gpu()


def train_pipeline(shard: Shard, *, min_area: float, shuffle: int, seed: int) -> Any:
    """The training pipeline: shuffled records of the shard, decoded with a random crop (on the GPU when the
    shard has one), resized, mirrored at random; 8-bit HWC images and int32 labels."""
    dali = _dali()
    fn, types = dali.fn, dali.types

    def pipe() -> tuple[Any, Any]:
        inputs = shard.read(dali, random_shuffle=True, initial_fill=shuffle)
        images = fn.decoders.image_random_crop(
            inputs["image/encoded"],
            device=shard.decoder,
            output_type=types.RGB,
            random_area=[min_area, 1.0],
            random_aspect_ratio=[3 / 4, 4 / 3],
            num_attempts=10,
        )
        images = _resize(dali, images, shard.image_size)
        images = fn.flip(images, horizontal=fn.random.coin_flip(probability=0.5))
        return images, _labels(dali, inputs, shard.label_offset, shard.device_id)

    return shard.build(dali, pipe, seed)


def eval_pipeline(shard: Shard) -> Any:
    """The evaluation pipeline: the shard in order, the last batch padded with its last record (the caller
    drops the padding), centre crop of 7/8 of the shorter side, resize."""
    dali = _dali()
    fn, types = dali.fn, dali.types
    num, den = EVAL_CROP

    def pipe() -> tuple[Any, Any]:
        inputs = shard.read(dali, random_shuffle=False, pad_last_batch=True, stick_to_shard=True)
        jpegs = inputs["image/encoded"]
        shape = fn.cast(fn.peek_image_shape(jpegs), dtype=types.INT32)  # from the JPEG header, on the CPU
        h, w = shape[0], shape[1]
        side = dali.math.min(h, w) * num // den
        anchor = fn.stack((h - side) // 2, (w - side) // 2)
        images = fn.decoders.image(jpegs, device=shard.decoder, output_type=types.RGB)
        images = fn.slice(images, anchor, fn.stack(side, side), axes=[0, 1])
        images = _resize(dali, images, shard.image_size)
        return images, _labels(dali, inputs, shard.label_offset, shard.device_id)

    return shard.build(dali, pipe, 0)


def _host_batches(pipe: Any, batches: int | None, last: int) -> Iterator[tuple[Any, Any]]:
    """The pipeline's outputs as numpy arrays, `batches` of them (None: endless), the last cut to `last`."""
    pipe.build()
    done = 0
    while batches is None or done < batches:
        images, labels = pipe.run()
        if hasattr(images, "as_cpu"):
            images = images.as_cpu()
        x, y = images.as_array(), labels.as_array()
        done += 1
        if batches is not None and done == batches:
            x, y = x[:last], y[:last]
        yield x, y


def to_tensorflow(tf: Any, pipe: Any, *, batch: int, image_size: int, batches: int | None, last: int) -> Any:
    """The pipeline as a tf.data.Dataset of (uint8 [B, S, S, 3], int32 [B]): DALI's plugin when it loads (its
    batches stay on the GPU when the pipeline decodes there), else a generator over host copies."""
    shapes = ((batch, image_size, image_size, 3), (batch,))
    dtypes = (tf.uint8, tf.int32)
    if plugin_available():
        import nvidia.dali.plugin.tf as dali_tf

        device = "/gpu:0" if pipe.device_id is not None else "/cpu:0"
        with tf.device(device):
            ds = dali_tf.DALIDataset(
                pipeline=pipe, batch_size=batch, output_shapes=shapes, output_dtypes=dtypes, device_id=pipe.device_id
            )
        if batches is None:
            return ds
        ds = ds.take(batches)
        if last == batch:
            return ds
        return ds.enumerate().map(
            lambda i, xy: (
                xy[0][: tf.where(i == batches - 1, last, batch)],
                xy[1][: tf.where(i == batches - 1, last, batch)],
            )
        )
    out = (
        tf.TensorSpec((None, image_size, image_size, 3), tf.uint8),
        tf.TensorSpec((None,), tf.int32),
    )
    return tf.data.Dataset.from_generator(lambda: _host_batches(pipe, batches, last), output_signature=out)


def train_dataset(
    tf: Any, args: Any, files: list[str], rank: int, size: int, seed: int, threads: int, device_id: int | None
) -> Any:
    """data.train_dataset's batches, decoded by DALI: endless, this rank's shard, reshuffled each pass."""
    shard = Shard(
        files, index_files(files), rank, size, args.batch_size, args.image_size, args.label_offset, threads, device_id
    )
    pipe = train_pipeline(shard, min_area=args.min_crop_area, shuffle=args.shuffle_buffer, seed=seed % (2**31))
    return to_tensorflow(tf, pipe, batch=args.batch_size, image_size=args.image_size, batches=None, last=0)


def eval_dataset(
    tf: Any, args: Any, files: list[str], rank: int, size: int, threads: int, device_id: int | None
) -> Any:
    """data.eval_dataset's batches, decoded by DALI: every record of this rank's shard once, in order."""
    indexes = index_files(files)
    start, end = shard_range(count_indexed(indexes), rank, size)
    mine, batch = end - start, args.eval_batch_size
    pipe = eval_pipeline(
        Shard(files, indexes, rank, size, batch, args.image_size, args.label_offset, threads, device_id)
    )
    batches = -(-mine // batch)
    last = mine - (batches - 1) * batch
    return to_tensorflow(tf, pipe, batch=batch, image_size=args.image_size, batches=batches, last=last)
