"""The source folder of images, read before anything is decoded: class sub-folders of JPEG/PNG images (or
train/ and validation/ sub-folders of them, or a flat val/ folder labelled by the devkit's ground truth or a
LOC_val_solution.csv), dealt into the train and validation splits. Stdlib only."""

from __future__ import annotations

import os
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from clusterctl.node.dataset.errors import DatasetError

LABEL_BASE = 1  # image/class/label of the first class, as in the ImageNet TFRecords (0 = background)
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png")
SPLITS = ("train", "validation")
_VALIDATION_DIRS = ("validation", "val")


@dataclass(frozen=True)
class ImageItem:
    path: Path  # source file (absent for generated images)
    label: int  # 1-based
    synset: str  # class folder name
    filename: str  # stored as image/filename


@dataclass(frozen=True)
class FolderScan:
    """What a source folder holds, before anything is decoded."""

    classes: tuple[str, ...]
    splits: dict[str, tuple[ImageItem, ...]]  # train, validation
    ignored: tuple[str, ...]  # files that are not JPEG/PNG (LICENSE.txt ...)
    presplit: bool  # the folder had train/ and validation/ (or val/) sub-folders


def _class_dirs(folder: Path) -> list[Path]:
    return sorted((p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")), key=lambda p: p.name)


def _images(folder: Path) -> tuple[list[Path], list[Path]]:
    images: list[Path] = []
    other: list[Path] = []
    for p in sorted(folder.rglob("*")):
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(folder).parts):
            (images if p.suffix.lower() in IMAGE_EXTENSIONS else other).append(p)
    return images, other


_SYNSET_CSV_HEADER = "ImageId,PredictionString"
_VAL_NUMBER = re.compile(r"_(\d+)$")  # ILSVRC2012_val_00000001 -> 1


def read_val_labels(
    path: str | os.PathLike[str], synsets: str | os.PathLike[str] | None = None
) -> Callable[[str], str | None]:
    """The class (synset) of each image of a flat validation folder, from ImageNet's own files: the
    `LOC_val_solution.csv` style CSV (`ImageId,PredictionString`, the synset first in the string), or the
    devkit's ground truth (`ILSVRC2012_validation_ground_truth.txt`: line N is the class ID of image N,
    matched by the number at the end of its name) with `synsets`, the devkit's synset list (line N: the
    synset of class ID N, e.g. `n01440764 tench`). Returns image stem -> synset (None: not listed)."""
    try:
        lines = Path(path).read_text(encoding="utf-8-sig").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise DatasetError(f"--val-labels {path}: cannot read it ({exc})") from None
    body = [ln.strip() for ln in lines if ln.strip()]
    if body and body[0].replace(" ", "") == _SYNSET_CSV_HEADER:
        if synsets is not None:
            raise DatasetError(f"--val-synsets is for the devkit's ground truth, not the CSV {path}")
        table = {}
        for n, line in enumerate(body[1:], start=2):
            image, sep, rest = line.partition(",")
            if not sep or not image.strip() or not rest.split():
                raise DatasetError(f"--val-labels {path}:{n}: not `ImageId,synset ...`: {line[:80]!r}")
            table[image.strip()] = rest.split()[0]
        return table.get
    if body and all(ln.isdigit() for ln in body):
        if synsets is None:
            raise DatasetError(
                f"--val-labels {path} is the devkit's ground truth (class IDs): it needs the synset list",
                "give --val-synsets FILE too (line N: the synset of class ID N)",
            )
        try:
            ids = [ln.split()[0] for ln in Path(synsets).read_text(encoding="utf-8-sig").splitlines() if ln.strip()]
        except (OSError, UnicodeDecodeError) as exc:
            raise DatasetError(f"--val-synsets {synsets}: cannot read it ({exc})") from None
        truth = []
        for n, line in enumerate(body, start=1):
            k = int(line)
            if not 1 <= k <= len(ids):
                raise DatasetError(
                    f"--val-labels {path}:{n}: class ID {k} is not in --val-synsets {synsets} (1..{len(ids)})"
                )
            truth.append(ids[k - 1])

        def by_number(stem: str) -> str | None:
            m = _VAL_NUMBER.search(stem)
            i = int(m.group(1)) if m else 0
            return truth[i - 1] if 1 <= i <= len(truth) else None

        return by_number
    raise DatasetError(
        f"--val-labels {path}: neither a LOC_val_solution.csv-style CSV ({_SYNSET_CSV_HEADER}) nor "
        "the devkit's ground truth (one class ID per line)"
    )


def _flat_validation(
    folder: Path, labels: Callable[[str], str | None], label_file: str | os.PathLike[str] | None, classes: set[str]
) -> tuple[dict[str, list[Path]], list[str]]:
    """A validation folder of images without class sub-folders, sorted into classes by `labels`; an image
    without a label, or labelled with a class train/ does not have, stops the conversion (none is dropped)."""
    images: list[Path] = []
    other: list[Path] = []
    for p in sorted(folder.iterdir()):
        if p.is_file() and not p.name.startswith("."):
            (images if p.suffix.lower() in IMAGE_EXTENSIONS else other).append(p)
    per_class: dict[str, list[Path]] = {}
    unlabelled, unknown = [], []
    for p in images:
        synset = labels(p.stem)
        if synset is None:
            unlabelled.append(p.name)
        elif synset not in classes:
            unknown.append(f"{p.name} ({synset})")
        else:
            per_class.setdefault(synset, []).append(p)
    if unlabelled:
        raise DatasetError(
            f"{len(unlabelled)} of the {len(images)} images in {folder} have no class in "
            f"{label_file} (first: {unlabelled[0]})",
            "give the labels file of this validation set",
        )
    if unknown:
        raise DatasetError(
            f"{len(unknown)} images in {folder} are of a class train/ has no folder for (first: {unknown[0]})",
            "the labels file and train/ must name the same synsets",
        )
    return per_class, [str(p) for p in other]


def scan_folder(
    src: str | os.PathLike[str],
    *,
    validation_fraction: float = 0.1,
    seed: int = 0,
    val_labels: str | os.PathLike[str] | None = None,
    val_synsets: str | os.PathLike[str] | None = None,
) -> FolderScan:
    """Class sub-folders of images (the flowers layout), or train/ and validation/ (or val/) folders each
    holding the same class sub-folders. Classes are the sorted folder names; label N is the Nth (1-based).
    Without a split on disk, `validation_fraction` of each class (at least one image when the class has
    two or more) goes to validation, chosen with `seed`. ImageNet's flat val/ (images without class
    sub-folders) needs `val_labels` (read_val_labels); without it such a folder is an error, never skipped."""
    root = Path(src)
    if not root.is_dir():
        raise DatasetError(f"{src}: no such folder", "give a folder of class sub-folders of JPEG/PNG images")
    if not 0 <= validation_fraction < 1:
        raise DatasetError(f"validation fraction must be in [0, 1), not {validation_fraction}")
    if val_synsets is not None and val_labels is None:
        raise DatasetError("--val-synsets goes with --val-labels (the devkit's ground truth)")
    labels = read_val_labels(val_labels, val_synsets) if val_labels is not None else None
    names = {p.name for p in _class_dirs(root)}
    val_name = next((n for n in _VALIDATION_DIRS if n in names), None)
    presplit = "train" in names and val_name is not None
    if labels is not None and not presplit:
        raise DatasetError(
            f"--val-labels: {src} has no train/ and val/ (or validation/) folders",
            "lay it out as SRC/train/SYNSET/*.JPEG and SRC/val/*.JPEG",
        )
    per_split: dict[str, dict[str, list[Path]]] = {s: {} for s in SPLITS}
    ignored: list[str] = []
    if presplit and val_name is not None:  # presplit says val_name is set; this says it to mypy too
        val_folder = root / val_name
        flat = any(p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS for p in val_folder.iterdir())
        if flat and _class_dirs(val_folder):
            raise DatasetError(
                f"{val_folder} holds both images and class sub-folders",
                "keep one layout: class sub-folders, or a flat folder with --val-labels",
            )
        if flat and labels is None:
            n = sum(1 for p in val_folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS)
            raise DatasetError(
                f"{val_folder} holds {n} images without class sub-folders",
                "give their classes with --val-labels LOC_val_solution.csv (or the devkit's "
                "ground truth with --val-synsets)",
            )
        if labels is not None and not flat:
            raise DatasetError(
                f"--val-labels: {val_folder} has no images of its own (class sub-folders already say the classes)",
                "leave out --val-labels",
            )
        for d in _class_dirs(root / "train"):
            imgs, other = _images(d)
            per_split["train"][d.name] = imgs
            ignored += [str(p) for p in other]
        if flat and labels is not None:  # (flat without labels was refused above)
            per_split["validation"], other_files = _flat_validation(
                val_folder, labels, val_labels, {c for c, imgs in per_split["train"].items() if imgs}
            )
            ignored += other_files
        for d in [] if flat else _class_dirs(val_folder):
            imgs, other = _images(d)
            per_split["validation"][d.name] = imgs
            ignored += [str(p) for p in other]
        train_classes = set(per_split["train"])
        extra = sorted(set(per_split["validation"]) - train_classes)
        if extra:
            raise DatasetError(
                f"{src}: validation classes with no train folder: {', '.join(extra[:5])}",
                "give validation/ the same class folders as train/",
            )
    else:
        rng = random.Random(seed)
        for d in _class_dirs(root):
            imgs, other = _images(d)
            ignored += [str(p) for p in other]
            shuffled = list(imgs)
            rng.shuffle(shuffled)
            n_val = 0
            if validation_fraction > 0 and len(shuffled) >= 2:
                n_val = min(len(shuffled) - 1, max(1, round(len(shuffled) * validation_fraction)))
            val = set(shuffled[:n_val])
            per_split["train"][d.name] = [p for p in imgs if p not in val]
            per_split["validation"][d.name] = [p for p in imgs if p in val]
    classes = tuple(sorted(c for c in per_split["train"] if per_split["train"][c]))
    if not classes:
        raise DatasetError(
            f"{src}: no class sub-folders with JPEG or PNG images",
            "lay it out as SRC/CLASS/IMAGE.jpg, one folder per class",
        )
    label = {c: i + LABEL_BASE for i, c in enumerate(classes)}
    splits: dict[str, tuple[ImageItem, ...]] = {}
    for split in SPLITS:
        items = []
        for c in classes:
            for p in per_split[split].get(c, []):
                items.append(ImageItem(p, label[c], c, p.name))
        if split == "train":
            random.Random(seed + 1).shuffle(items)  # mixed classes in every shard, as ImageNet's own script does
        splits[split] = tuple(items)
    return FolderScan(classes, splits, tuple(ignored), presplit)
