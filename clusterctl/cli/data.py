"""Commands that put data on the nodes: sync (its live bars and its table), data."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional, Sequence

import typer

from clusterctl.cli.display import _esc, console, fitted_table
from clusterctl.cli.shared import CURRENT_CLUSTER, DEFAULT_SSH, LOGIN, Ssh, _resolve_hosts, _store, ssh_options, within
from clusterctl.errors import UsageError

if TYPE_CHECKING:
    from types import TracebackType

    from rich.console import JustifyMethod

    from clusterctl.data.outcome import NodeOutcome, SyncReport
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
    from clusterctl.cli import display
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
    with SyncProgress([t.label for t in inv.targets]) as events:
        report = sync_run.run(inv, _store(), opts, events, display.warn)
    sync_table(report)
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


def sync_table(report: SyncReport) -> None:
    """The final table: node, bytes, seconds, MB/s, verified; and one summary line."""
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("NODE", "left"),
        ("BYTES", "right"),
        ("SECONDS", "right"),
        ("MB/S", "right"),
        ("VERIFIED", "left"),
    )
    rows = [
        [
            _esc(o.host),
            f"{o.bytes:,}",
            f"{o.seconds:.1f}",
            f"{o.bytes / o.seconds / 1e6:.1f}" if o.seconds > 0 and o.bytes else "-",
            "yes" if o.verified else _esc(f"no: {o.status}: {o.detail}"),
        ]
        for o in report.outcomes
    ]
    fitted_table(columns, rows, prose=("VERIFIED",))
    ok = sum(1 for o in report.outcomes if o.verified)
    style = "green" if ok == len(report.outcomes) else "red"
    console(stderr=True).print(
        f"[{style}]{ok} of {len(report.outcomes)} node(s) verified and marked complete: "
        f"{report.files} file(s), {report.total_bytes:,} bytes, {report.strategy}, "
        f"{report.seconds:.1f}s[/]"
    )


# ---- sync ----------------------------------------------------------------------------------------------
class SyncProgress:
    """sync's Events (data/outcome.py) drawn with rich: one bar per node (bytes, rate) plus the total, on stderr."""

    def __init__(self, hosts: Sequence[str]):
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TransferSpeedColumn,
        )

        self.bars = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeElapsedColumn(),
            console=console(stderr=True),
            transient=False,
            refresh_per_second=4,
        )
        width = max((len(h) for h in hosts), default=5)
        self.width = max(width, 5)
        self.total = self.bars.add_task("total".ljust(self.width), total=0, start=False)
        self.tasks = {h: self.bars.add_task(_esc(h.ljust(self.width)), total=0, start=False) for h in hosts}
        self.needs: dict[str, int] = {}
        self.done: dict[str, int] = {}
        self._lock = threading.Lock()

    def __enter__(self) -> "SyncProgress":
        self.bars.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.bars.stop()

    def phase(self, text: str) -> None:
        self.bars.console.print(f"[dim]{_esc(text)}[/]")

    def need(self, host: str, total: int) -> None:
        with self._lock:
            self.needs[host] = total
            self.done[host] = 0
            self.bars.start_task(self.tasks[host])
            self.bars.update(self.tasks[host], total=total, completed=0)
            self.bars.start_task(self.total)
            self.bars.update(self.total, total=sum(self.needs.values()), completed=sum(self.done.values()))

    def progress(self, host: str, done: int) -> None:
        with self._lock:
            if host not in self.tasks or done < self.done.get(host, 0):
                return
            self.done[host] = done
            self.bars.update(self.tasks[host], completed=done)
            self.bars.update(self.total, completed=sum(self.done.values()))

    def finished(self, outcome: NodeOutcome) -> None:
        mark = "[green]verified[/]" if outcome.verified else f"[red]{outcome.status}[/]"
        with self._lock:
            if outcome.host in self.tasks:
                if outcome.verified:
                    self.done[outcome.host] = self.needs.get(outcome.host, 0)
                    self.bars.update(self.tasks[outcome.host], completed=self.done[outcome.host])
                self.bars.update(self.tasks[outcome.host], description=f"{_esc(outcome.host.ljust(self.width))} {mark}")
                self.bars.update(self.total, completed=sum(self.done.values()))
