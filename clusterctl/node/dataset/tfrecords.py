"""Datasets in the ImageNet TFRecord format: the layout, the records, and a folder of class sub-folders converted
(generated sets: synthetic.py).

The layout written to DST (flat, deterministic names, so a manifest of it is stable and a re-run with the
same input and seed writes the same bytes):

    DST/train-00000-of-00008 ... train-00007-of-00008        tf.train.Example records
    DST/validation-00000-of-00004 ... validation-00003-of-00004
    DST/labels.txt     line N is the class name of label N (labels are 1-based, as in ImageNet's records)
    DST/dataset.json   counts, classes, shards (each one's records and bytes); written last, so its presence
                       means the set is whole, and what a whole copy of it holds (train checks every node's)

Every shard is written under a hidden temporary name (`.train-00000-of-00008.tmp`) and renamed when
complete: an interrupted run leaves no half shard under a real name. Each record carries the features of
the standard ImageNet TFRecords (image/encoded as RGB JPEG, image/class/label, image/class/synset,
image/class/text, image/height, image/width, image/channels, image/colorspace, image/format,
image/filename); PNGs and grayscale/CMYK JPEGs are re-encoded as RGB JPEG, other JPEGs are kept byte for
byte. The trainer (node/train/data.py) reads this format.

TensorFlow and numpy are imported only inside the functions that encode or write (never at import time), so
`clusterctl --help` stays fast and the converter's `--help` runs with any python3.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence, TypeVar

from clusterctl.node.dataset.errors import DatasetError
from clusterctl.node.dataset.image_folder import LABEL_BASE, SPLITS, ImageItem, scan_folder

T = TypeVar("T")
TensorFlow = Any  # the tensorflow module, imported only when records are written: it has no types installed here

FORMAT = "imagenet-tfrecord"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class SplitInfo:
    name: str
    examples: int
    shards: tuple[str, ...]
    records: tuple[int, ...] = ()  # per shard, in the order of `shards` (empty in sets written before it was kept)


@dataclass(frozen=True)
class DatasetInfo:
    path: Path
    classes: tuple[str, ...]
    splits: dict[str, SplitInfo]
    skipped: tuple[tuple[str, str], ...] = ()  # (source file, why) for images that could not be read
    reencoded: int = 0
    seconds: float = 0.0
    bytes: int = 0

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def files(self) -> list[str]:
        return files_of(self.splits)


def files_of(splits: dict[str, "SplitInfo"]) -> list[str]:
    """Every file of the dataset, relative to its folder."""
    return [s for sp in splits.values() for s in sp.shards] + ["labels.txt", "dataset.json"]


# ---- pure helpers ----------------------------------------------------------------------------------
def shard_name(split: str, index: int, count: int) -> str:
    """The ImageNet scripts' names: train-00000-of-01024."""
    return f"{split}-{index:05d}-of-{count:05d}"


def default_shards(split: str, examples: int) -> int:
    """1024 train / 128 validation shards for ImageNet's 1.28M / 50k images; small sets still get a few
    shards, so several ranks can each read whole files."""
    if examples <= 0:
        return 0
    if split == "train":
        return min(1024, max(math.ceil(examples / 1250), min(8, examples)))
    return min(128, max(math.ceil(examples / 390), min(4, examples)))


def deal(items: Sequence[T], count: int) -> list[list[T]]:
    """Round-robin `items` into `count` shards (sizes differ by at most one)."""
    return [list(items[i::count]) for i in range(count)]


# ---- TensorFlow-side: encoding and writing ---------------------------------------------------------
def tensorflow() -> TensorFlow:
    try:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        import tensorflow as tf
    except ImportError as exc:
        raise DatasetError(f"writing TFRecords needs TensorFlow ({exc})", f"install it: {install_tf()}") from None
    return tf


def install_tf() -> str:
    """The command that installs the TensorFlow of clusterctl's `train` extra into this Python: right for a
    checkout and an installed wheel alike (no index has a `clusterctl` to take the extra from)."""
    import shlex
    import sys
    from importlib import metadata

    spec = "tensorflow-cpu"
    try:
        wanted = [r.split(";")[0].strip() for r in metadata.requires("clusterctl") or [] if "train" in r]
        spec = next((w for w in wanted if w.startswith("tensorflow")), spec)
    except metadata.PackageNotFoundError:  # the node runtime, shipped without its metadata
        pass
    return f"{shlex.quote(sys.executable)} -m pip install {shlex.quote(spec)}"


def example_bytes(
    tf: TensorFlow, *, encoded: bytes, label: int, synset: str, text: str, filename: str, height: int, width: int
) -> bytes:
    """One serialized tf.train.Example with the standard ImageNet features."""

    def b(v: str | bytes) -> Any:
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[v.encode() if isinstance(v, str) else v]))

    def i(v: int) -> Any:
        return tf.train.Feature(int64_list=tf.train.Int64List(value=[v]))

    feats = {
        "image/height": i(height),
        "image/width": i(width),
        "image/colorspace": b("RGB"),
        "image/channels": i(3),
        "image/class/label": i(label),
        "image/class/synset": b(synset),
        "image/class/text": b(text),
        "image/format": b("JPEG"),
        "image/filename": b(filename),
        "image/encoded": b(encoded),
    }
    serialized: bytes = tf.train.Example(features=tf.train.Features(feature=feats)).SerializeToString()
    return serialized


def _is_jpeg(data: bytes) -> bool:
    return data[:3] == b"\xff\xd8\xff"


def to_rgb_jpeg(tf: TensorFlow, data: bytes, resize: int | None = None) -> tuple[bytes, int, int, bool]:
    """(JPEG bytes, height, width, re-encoded?). RGB JPEGs are kept as they are; PNGs and grayscale or
    CMYK JPEGs are decoded and written again as RGB JPEG (quality 95). With `resize`, an image whose shorter
    side is longer is scaled down to that shorter side (aspect kept, antialiased) and written again: the
    trainer then decodes fewer pixels per image. Raises ValueError if unreadable."""
    try:
        if _is_jpeg(data):
            h, w, c = (int(x) for x in tf.image.extract_jpeg_shape(data).numpy())
            if c == 3 and not (resize and min(h, w) > resize):
                tf.io.decode_jpeg(data, channels=3)  # a truncated or corrupt file fails here, not in training
                return data, h, w, False
        image = tf.io.decode_image(data, channels=3, expand_animations=False)
    except tf.errors.OpError as exc:
        raise ValueError(" ".join(str(exc).split())[:200]) from None
    h, w = int(image.shape[0]), int(image.shape[1])
    if resize and min(h, w) > resize:
        h, w = (resize, max(1, round(w * resize / h))) if h <= w else (max(1, round(h * resize / w)), resize)
        image = tf.cast(tf.clip_by_value(tf.round(tf.image.resize(image, [h, w], antialias=True)), 0, 255), tf.uint8)
    return tf.io.encode_jpeg(image, quality=95).numpy(), h, w, True


def _ours(dst: Path) -> list[Path]:
    """Files of a dataset this module wrote (or left half-written) in dst; nothing else is touched."""
    if not dst.is_dir():
        return []
    return [
        p
        for p in sorted(dst.iterdir())
        if p.name in ("labels.txt", "dataset.json", ".dataset.json.tmp")
        or p.name.startswith(tuple(f"{s}-" for s in SPLITS))
        or p.name.startswith(tuple(f".{s}-" for s in SPLITS))
    ]


def check_dst(dst: Path, force: bool) -> None:
    """Refuse early (before TensorFlow loads) a destination that is a file or already holds a dataset."""
    if dst.exists() and not dst.is_dir():
        raise DatasetError(f"{dst} exists and is not a folder")
    ours = _ours(dst)
    if ours and not force:
        raise DatasetError(f"{dst} already holds a dataset ({ours[0].name} ...)", "pass --force to replace it")


def prepare_dst(dst: Path, force: bool) -> None:
    check_dst(dst, force)
    dst.mkdir(parents=True, exist_ok=True)
    for p in _ours(dst):
        p.unlink()


def write_shard(tf: TensorFlow, path: Path, records: Iterable[bytes]) -> int:
    tmp = path.with_name(f".{path.name}.tmp")
    n = 0
    try:
        with tf.io.TFRecordWriter(str(tmp)) as w:
            for rec in records:
                w.write(rec)
                n += 1
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return n


def shard_workers(n: int | None, shards: int) -> int:
    return max(1, min(shards, n or os.cpu_count() or 1))


def finish(
    dst: Path, classes: Sequence[str], splits: dict[str, SplitInfo], source: str, *, extra: dict[str, object]
) -> None:
    (dst / "labels.txt").write_text("".join(f"{c}\n" for c in classes))
    meta = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "label_base": LABEL_BASE,
        "num_classes": len(classes),
        "source": source,
        **extra,
        "splits": {
            s.name: {
                "examples": s.examples,
                "shards": list(s.shards),
                "records": list(s.records),
                "bytes": [(dst / n).stat().st_size for n in s.shards],
            }
            for s in splits.values()
        },
    }
    tmp = dst / ".dataset.json.tmp"
    tmp.write_text(json.dumps(meta, indent=2, sort_keys=False) + "\n")
    os.replace(tmp, dst / "dataset.json")


def size_of(dst: Path, names: Iterable[str]) -> int:
    return sum((dst / n).stat().st_size for n in names)


Progress = Callable[[str, int, int], None]  # (split, images done, images in split)


def convert_folder(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    train_shards: int | None = None,
    validation_shards: int | None = None,
    validation_fraction: float = 0.1,
    seed: int = 0,
    force: bool = False,
    workers: int | None = None,
    progress: Progress | None = None,
    val_labels: str | os.PathLike[str] | None = None,
    val_synsets: str | os.PathLike[str] | None = None,
    resize: int | None = None,
) -> DatasetInfo:
    """A folder of class sub-folders of JPEG/PNG images -> ImageNet-format TFRecord shards in `dst`.
    Unreadable images are skipped and reported in DatasetInfo.skipped; if none can be read, DatasetError.
    A flat val/ folder takes its classes from `val_labels` (see read_val_labels). `resize`: images whose
    shorter side is longer are scaled down to it (see to_rgb_jpeg)."""
    if resize is not None and not 32 <= resize <= 4096:
        raise DatasetError(f"--resize must be 32..4096 pixels, not {resize}", "e.g. --resize 256")
    t0 = time.monotonic()
    scan = scan_folder(
        src, validation_fraction=validation_fraction, seed=seed, val_labels=val_labels, val_synsets=val_synsets
    )
    dst = Path(dst)
    check_dst(dst, force)
    tf = tensorflow()
    prepare_dst(dst, force)
    skipped: list[tuple[str, str]] = []
    counts = {"reencoded": 0}
    lock = threading.Lock()
    splits: dict[str, SplitInfo] = {}
    for split in SPLITS:
        items = scan.splits[split]
        wanted = train_shards if split == "train" else validation_shards
        count = min(len(items), wanted) if wanted else default_shards(split, len(items))
        if count == 0:
            splits[split] = SplitInfo(split, 0, ())
            continue
        names = [shard_name(split, i, count) for i in range(count)]
        done = [0]

        def records(
            part: list[ImageItem], split: str = split, items: Sequence[ImageItem] = items, done: list[int] = done
        ) -> Iterator[bytes]:
            for item in part:
                try:
                    encoded, h, w, again = to_rgb_jpeg(tf, item.path.read_bytes(), resize)
                except (OSError, ValueError) as exc:
                    with lock:
                        skipped.append((str(item.path), str(exc)))
                    continue
                with lock:
                    counts["reencoded"] += again
                    done[0] += 1
                    n_done = done[0]
                if progress:
                    progress(split, n_done, len(items))
                yield example_bytes(
                    tf,
                    encoded=encoded,
                    label=item.label,
                    synset=item.synset,
                    text=item.synset,
                    filename=item.filename,
                    height=h,
                    width=w,
                )

        parts = deal(items, count)
        with ThreadPoolExecutor(shard_workers(workers, count)) as pool:
            written = tuple(
                pool.map(lambda nm_part: write_shard(tf, dst / nm_part[0], records(nm_part[1])), zip(names, parts))
            )
        splits[split] = SplitInfo(split, sum(written), tuple(names), written)
    if splits["train"].examples == 0:
        raise DatasetError(
            f"{src}: none of the {len(scan.splits['train'])} training images could be read",
            f"first problem: {skipped[0][0]}: {skipped[0][1]}" if skipped else None,
        )
    finish(
        dst,
        scan.classes,
        splits,
        str(Path(src).resolve()),
        extra={
            "presplit": scan.presplit,
            "validation_fraction": None if scan.presplit else validation_fraction,
            "seed": seed,
        },
    )
    return DatasetInfo(
        dst,
        scan.classes,
        splits,
        tuple(sorted(skipped)),
        counts["reencoded"],
        time.monotonic() - t0,
        size_of(dst, files_of(splits)),
    )


def read_info(path: str | os.PathLike[str]) -> DatasetInfo:
    """The DatasetInfo of a folder written by this module (from its dataset.json and labels.txt)."""
    root = Path(path)
    meta_path = root / "dataset.json"
    try:
        meta = json.loads(meta_path.read_text())
    except FileNotFoundError:
        raise DatasetError(f"{root}: no dataset.json", "write the dataset with `clusterctl data`") from None
    except json.JSONDecodeError as exc:
        raise DatasetError(f"{meta_path}: not JSON ({exc})") from None
    if meta.get("format") != FORMAT:
        raise DatasetError(f"{meta_path}: format {meta.get('format')!r}, expected {FORMAT!r}")
    classes = tuple(line for line in (root / "labels.txt").read_text().splitlines() if line)
    splits = {
        s: SplitInfo(s, int(v["examples"]), tuple(v["shards"]), tuple(v.get("records", ())))
        for s, v in meta["splits"].items()
    }
    return DatasetInfo(root, classes, splits, bytes=size_of(root, files_of(splits)))
