"""Commands that put data on the nodes: sync, data."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional

import typer

from clusterctl.cli.shared import CURRENT_CLUSTER, DEFAULT_SSH, LOGIN, Ssh, _resolve_hosts, _store, ssh_options, within
from clusterctl.errors import UsageError

if TYPE_CHECKING:
    from clusterctl.node.dataset.tfrecords import DatasetInfo

app = typer.Typer()  # its commands are merged into cli/app.py's app (see COMMANDS there)


# ---- the dataset on every node ---------------------------------------------------------------------------
@app.command()
@ssh_options("connect_timeout", *LOGIN)
def sync(
    args: List[str] = typer.Argument(
        ...,
        metavar="[HOSTS] SRC DST",
        help="A hosts file (optional); SRC: a local folder, leader:PATH or "
        "s3://bucket/prefix; DST: the folder on every node. Put -- before "
        "paths that start with '-'.",
    ),
    cluster: Optional[str] = CURRENT_CLUSTER,
    strategy: str = typer.Option("chain", "--strategy", help="chain (pipelined relay), tree, parallel or sequential."),
    fanout: str = typer.Option(
        "auto",
        "--fanout",
        metavar="K|auto",
        help="chain: split the nodes after the first into K chains; auto: K measured first "
        "(a few seconds: the sender's streams to several nodes at once against one hop's rate).",
    ),
    plan: bool = typer.Option(False, "--plan", help="Print who sends to whom, and copy nothing."),
    delete: bool = typer.Option(False, "--delete", help="Mirror: remove files on the nodes that SRC does not have."),
    endpoint_url: Optional[str] = typer.Option(
        None, "--endpoint-url", help="S3 endpoint the nodes use (e.g. a test server)."
    ),
    stall_timeout: float = typer.Option(
        120.0,
        "--stall-timeout",
        help="chain: seconds with no data moving before the "
        "node that stopped taking it is reported failed and cut out (the rest finish).",
    ),
    verify: str = typer.Option(
        "stream",
        "--verify",
        help="stream: a chain node's copy is proved by the sha256 of "
        "every file as it was written (no second read); disk: every file read back and hashed.",
    ),
    ssh: Ssh = DEFAULT_SSH,
) -> None:
    """Put a dataset on every node: fast, verified, resumable.

    A pipelined relay by default, a sha256 manifest checked on every node.
    """
    from clusterctl.cli import display, tables
    from clusterctl.cluster import sync_run

    if len(args) not in (2, 3):
        raise UsageError("expected [HOSTS] SRC DST", "e.g. clusterctl sync hosts ~/imagenet_data ~/imagenet_data")
    hosts_path, src, dst = (args[0], args[1], args[2]) if len(args) == 3 else (None, args[0], args[1])
    opts = sync_run.options(src, dst, strategy, fanout, delete, endpoint_url, stall_timeout, verify)
    inv = _resolve_hosts(hosts_path, cluster, ssh)
    if plan:
        for line in sync_run.plan_lines(inv, opts):
            sys.stdout.write(line + "\n")
        return
    with display.SyncProgress([t.label for t in inv.targets]) as events:
        report = sync_run.run(inv, _store(), opts, events, display.warn)
    tables.sync_table(report)
    err = report.error()
    if err is not None:
        raise err


# ---- datasets --------------------------------------------------------------------------------------------
data_app = typer.Typer(
    no_args_is_help=True,
    short_help="Make ImageNet-format TFRecord datasets.",
    help="Make ImageNet-format TFRecord datasets (to rehearse before ImageNet).",
)
app.add_typer(data_app, name="data")


def _data_report(info: DatasetInfo) -> None:
    from clusterctl.cli import display

    parts = ", ".join(f"{s.examples} {s.name} image(s) in {len(s.shards)} shard(s)" for s in info.splits.values())
    display.info(
        f"{info.path}: {parts}, {info.num_classes} class(es), {info.bytes / 1e6:.1f} MB "
        f"in {info.seconds:.1f}s; labels.txt and dataset.json written"
    )
    if info.reencoded:
        display.info(f"{info.reencoded} image(s) were PNG or not RGB and were re-encoded as RGB JPEG")
    for path, why in info.skipped[:10]:
        display.warn(f"skipped {path}: {why}")
    if len(info.skipped) > 10:
        display.warn(f"... and {len(info.skipped) - 10} more unreadable image(s)")


@data_app.command("tfrecords")
def data_tfrecords(
    src: str = typer.Argument(
        ...,
        help="A folder of class sub-folders of JPEG/PNG images (or train/ and validation/ holding them); with --on leader a folder there or s3://bucket/prefix.",
    ),
    dst: str = typer.Argument(
        ...,
        help="Folder to write train-*, validation-*, labels.txt, dataset.json into (with --on leader: on the leader).",
    ),
    validation_fraction: float = typer.Option(
        0.1, "--validation-fraction", help="Share of each class held out (when SRC has no validation/)."
    ),
    train_shards: Optional[int] = typer.Option(
        None, "--train-shards", help="Default: 1024 for ImageNet's size, fewer for small sets."
    ),
    validation_shards: Optional[int] = typer.Option(
        None, "--validation-shards", help="Default: 128 for ImageNet's size, fewer for small sets."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the split and the shuffle."),
    force: bool = typer.Option(False, "--force", help="Replace a dataset already in DST."),
    resize: Optional[int] = typer.Option(
        None,
        "--resize",
        metavar="SIDE",
        help="Scale images whose shorter side is longer down to SIDE pixels (e.g. 256): less to decode per image in training.",
    ),
    val_labels: Optional[Path] = typer.Option(
        None,
        "--val-labels",
        metavar="FILE",
        help="Classes of a flat val/ folder (ImageNet's 50,000 images without class sub-folders): LOC_val_solution.csv, or the devkit's ground truth with --val-synsets.",
    ),
    val_synsets: Optional[Path] = typer.Option(
        None,
        "--val-synsets",
        metavar="FILE",
        help="The devkit's synset list for --val-labels ground truth (line N: the synset of class ID N).",
    ),
    on: Optional[str] = typer.Option(
        None,
        "--on",
        metavar="leader",
        help="Convert on the cluster's leader (SRC and DST there; SRC may be s3://), with the node runtime's Python.",
    ),
    endpoint_url: Optional[str] = typer.Option(
        None, "--endpoint-url", help="S3 endpoint the leader uses for an s3:// SRC (e.g. a test server)."
    ),
    cluster: Optional[str] = typer.Option(
        None, "--cluster", "-c", help="With --on leader: a cluster by name (default: the current)."
    ),
) -> None:
    """Image folders to ImageNet-format TFRecords.

    Class sub-folders of JPEG/PNG images (the flowers layout, or train/ and validation/ holding them)
    become train-*/validation-* TFRecord shards with labels.txt and dataset.json. ImageNet's flat val/
    needs --val-labels. --on leader converts where the data is (then `clusterctl sync leader:DST DST`)."""
    from clusterctl.cli import display
    from clusterctl.workloads import tfrecords_run

    conversion = tfrecords_run.Conversion(  # every option checked here, before anything runs
        src=src,
        dst=dst,
        validation_fraction=validation_fraction,
        train_shards=train_shards,
        validation_shards=validation_shards,
        seed=seed,
        force=force,
        val_labels=val_labels,
        val_synsets=val_synsets,
        on=on,
        endpoint_url=endpoint_url,
        resize=resize,
    )
    leader = lambda: _resolve_hosts(None, cluster)  # noqa: E731  # resolved only for --on leader
    _data_report(tfrecords_run.convert(conversion, leader, _store(), display.info, display.warn))


@data_app.command("synthetic")
def data_synthetic(
    dst: Path = typer.Argument(..., help="Folder to write the dataset into."),
    images: int = typer.Option(..., "--images", help="Training images."),
    classes: int = typer.Option(..., "--classes", help="Classes (balanced)."),
    validation_images: Optional[int] = typer.Option(None, "--validation-images", help="Default: a fifth of --images."),
    image_size: int = typer.Option(64, "--image-size", help="Side of the square images, in pixels."),
    train_shards: Optional[int] = typer.Option(None, "--train-shards"),
    validation_shards: Optional[int] = typer.Option(None, "--validation-shards"),
    seed: int = typer.Option(0, "--seed"),
    force: bool = typer.Option(False, "--force", help="Replace a dataset already in DST."),
) -> None:
    """A small generated set, same format.

    Generated images a small CNN can learn (a hue and stripes per class, noise), in the same
    ImageNet TFRecord format, for smoke tests and rehearsals."""
    from clusterctl.data import tfrecords as data

    within("--train-shards", train_shards, 1)
    within("--validation-shards", validation_shards, 1)
    _data_report(
        data.write_synthetic(
            dst,
            images=images,
            classes=classes,
            validation_images=validation_images,
            image_size=image_size,
            train_shards=train_shards,
            validation_shards=validation_shards,
            seed=seed,
            force=force,
        )
    )
