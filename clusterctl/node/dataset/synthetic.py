"""Generated datasets in the ImageNet TFRecord format (tfrecords.py's layout and records): images a small CNN can
learn to tell apart by class, the same bytes for the same seed whatever the thread order.
"""

from __future__ import annotations

import math
import os
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterator

from clusterctl.node.dataset.errors import DatasetError
from clusterctl.node.dataset.image_folder import LABEL_BASE
from clusterctl.node.dataset.tfrecords import (
    DatasetInfo,
    Progress,
    SplitInfo,
    check_dst,
    deal,
    default_shards,
    example_bytes,
    files_of,
    finish,
    prepare_dst,
    shard_name,
    shard_workers,
    size_of,
    tensorflow,
    write_shard,
)

Rng = Any  # a numpy.random.Generator (numpy, like tensorflow, is imported late and untyped here)


def synthetic_pixels(label: int, classes: int, size: int, rng: Rng) -> Any:
    """A generated RGB image (numpy uint8, size x size x 3) that a small CNN can learn to tell apart by
    class: a hue per class, stripes whose direction and frequency depend on the class, and noise."""
    import numpy as np

    k = label - LABEL_BASE
    # golden-ratio steps: neighbouring classes get distant hues; each image's hue, brightness and noise
    # vary, so the classes overlap a little and accuracy is informative rather than 100%.
    hue = (k * 0.61803398875 + rng.normal(0, 0.035)) % 1.0
    h6 = hue * 6
    i = int(h6) % 6
    f = h6 - int(h6)
    rgb = [(1, f, 0), (1 - f, 1, 0), (0, 1, f), (0, 1 - f, 1), (f, 0, 1), (1, 0, 1 - f)][i]
    base = (np.array(rgb, dtype=np.float32) * 180 + 40) * rng.uniform(0.6, 1.25)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / size
    angle = math.pi * ((k * 0.381966) % 1.0)
    freq = 2 + (k % 5)
    phase = rng.uniform(0, 2 * math.pi)
    stripes = np.sin(2 * math.pi * freq * (xx * math.cos(angle) + yy * math.sin(angle)) + phase)
    img = base[None, None, :] * (0.75 + 0.25 * stripes[..., None])
    img = img + rng.normal(0, 40, size=(size, size, 3))
    return np.clip(img, 0, 255).astype(np.uint8)


def write_synthetic(
    dst: str | os.PathLike[str],
    *,
    images: int,
    classes: int,
    validation_images: int | None = None,
    image_size: int = 64,
    train_shards: int | None = None,
    validation_shards: int | None = None,
    seed: int = 0,
    force: bool = False,
    workers: int | None = None,
    progress: Progress | None = None,
) -> DatasetInfo:
    """`images` generated training images (and `validation_images`, default a fifth of that, at least one
    per class) of `classes` balanced classes, in the same format as convert_folder."""
    if classes < 1:
        raise DatasetError(f"--classes must be at least 1, not {classes}")
    if images < classes:
        raise DatasetError(f"--images {images} is fewer than --classes {classes}", "give every class an image")
    if not 8 <= image_size <= 1024:
        raise DatasetError(f"--image-size must be 8..1024, not {image_size}")
    if validation_images is None:
        validation_images = max(classes, images // 5)
    if validation_images < 0:
        raise DatasetError(f"--validation-images must not be negative, not {validation_images}")
    t0 = time.monotonic()
    dst = Path(dst)
    check_dst(dst, force)
    tf = tensorflow()
    import numpy as np

    prepare_dst(dst, force)
    width = len(str(max(classes - 1, 1)))
    names_of_classes = tuple(f"class_{k:0{max(3, width)}d}" for k in range(classes))
    splits: dict[str, SplitInfo] = {}
    for split, n, wanted, offset in (
        ("train", images, train_shards, 0),
        ("validation", validation_images, validation_shards, images),
    ):
        count = min(n, wanted) if wanted else default_shards(split, n)
        if count == 0:
            splits[split] = SplitInfo(split, 0, ())
            continue
        names = [shard_name(split, i, count) for i in range(count)]
        done = [0]

        lock = threading.Lock()

        def records(
            indices: list[int], split: str = split, n: int = n, done: list[int] = done, lock: threading.Lock = lock
        ) -> Iterator[bytes]:
            for idx in indices:
                label = idx % classes + LABEL_BASE
                # One generator per image, seeded by its index: the same bytes whatever the thread order.
                rng = np.random.default_rng([seed, idx])
                pixels = synthetic_pixels(label, classes, image_size, rng)
                encoded = tf.io.encode_jpeg(pixels, quality=90).numpy()
                with lock:
                    done[0] += 1
                    n_done = done[0]
                if progress:
                    progress(split, n_done, n)
                cls = names_of_classes[label - LABEL_BASE]
                yield example_bytes(
                    tf,
                    encoded=encoded,
                    label=label,
                    synset=cls,
                    text=cls,
                    filename=f"synthetic_{idx:08d}.JPEG",
                    height=image_size,
                    width=image_size,
                )

        indices = list(range(offset, offset + n))
        if split == "train":
            random.Random(seed).shuffle(indices)
        parts = deal(indices, count)
        with ThreadPoolExecutor(shard_workers(workers, count)) as pool:
            written = tuple(
                pool.map(lambda nm_part: write_shard(tf, dst / nm_part[0], records(nm_part[1])), zip(names, parts))
            )
        splits[split] = SplitInfo(split, sum(written), tuple(names), written)
    finish(dst, names_of_classes, splits, "synthetic", extra={"image_size": image_size, "seed": seed})
    return DatasetInfo(dst, names_of_classes, splits, (), 0, time.monotonic() - t0, size_of(dst, files_of(splits)))
