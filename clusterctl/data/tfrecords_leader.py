"""`data tfrecords --on leader`, the operator's side: the node package onto the leader (its `tfrecords` program,
node/dataset/convert.py), run there in a job folder, detached in tmux, with the node runtime's Python; its output
followed, its result line read back as a DatasetInfo."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from typing import Any, Callable, Protocol

from clusterctl import s3uri
from clusterctl.errors import ConfigError
from clusterctl.node.dataset.tfrecords import DatasetInfo, SplitInfo
from clusterctl.remote.jobfolder import Reachable
from clusterctl.types import Cluster


class LeaderInventory(Reachable, Protocol):
    """What a conversion on the leader needs of an inventory (cluster/inventory.py's Inventory)."""

    @property
    def cluster(self) -> Cluster | None: ...


CONVERTER = "tfrecords"  # the node package's program (node/dataset/convert.py)
_RESULT = "CLUSTERCTL-DATA "
_FAILED = "CLUSTERCTL-DATA-ERROR "


def leader_argv(
    python: str,
    pyz: str,
    src: str,
    dst: str,
    *,
    train_shards: int | None = None,
    validation_shards: int | None = None,
    validation_fraction: float = 0.1,
    seed: int = 0,
    force: bool = False,
    val_labels: bool = False,
    val_synsets: bool = False,
    endpoint_url: str | None = None,
    resize: int | None = None,
) -> list[str]:
    """The converter's command line on the leader (pyz: the node package's absolute path there; paths already as
    the leader reads them)."""
    argv = [python, pyz, CONVERTER, src, dst, "--validation-fraction", repr(validation_fraction), "--seed", str(seed)]
    for flag, value in (
        ("--train-shards", train_shards),
        ("--validation-shards", validation_shards),
        ("--endpoint-url", endpoint_url),
        ("--resize", resize),
    ):
        if value is not None:
            argv += [flag, str(value)]
    argv += (["--force"] if force else []) + (["--val-labels", "val_labels"] if val_labels else [])
    return argv + (["--val-synsets", "val_synsets"] if val_synsets else [])


def parse_leader_result(text: str) -> DatasetInfo:
    """The converter's last result line; its error line (a refusal of the input) raised as a ConfigError."""
    from clusterctl.errors import RemoteCommandError

    for line in reversed(text.splitlines()):
        if _FAILED in line:
            e = json.loads(line.split(_FAILED, 1)[1])
            raise ConfigError(e["message"], e.get("hint"))
        if _RESULT in line:
            r = json.loads(line.split(_RESULT, 1)[1])
            splits = {k: SplitInfo(k, int(v["examples"]), tuple(v["shards"])) for k, v in r["splits"].items()}
            return DatasetInfo(
                Path(r["path"]),
                tuple(r["classes"]),
                splits,
                tuple(tuple(s) for s in r["skipped"]),
                int(r["reencoded"]),
                float(r["seconds"]),
                int(r["bytes"]),
            )
    tail = [ln for ln in text.splitlines() if ln.strip()][-1:] or ["no output"]
    raise RemoteCommandError("the conversion on the leader failed", tail[0][:300])


def convert_on_leader(
    inv: LeaderInventory,
    src: str,
    dst: str,
    *,
    val_labels: str | os.PathLike[str] | None = None,
    val_synsets: str | os.PathLike[str] | None = None,
    on_line: Callable[[str], None] = lambda _l: None,
    **options: Any,  # leader_argv's keywords: the conversion's settings
) -> DatasetInfo:
    """`data tfrecords --on leader`: convert where the images are (a folder on the leader, or s3://... read
    with the nodes' instance profile), writing the shards on the leader, for `sync leader:DST ...`. Runs with
    the node runtime's Python, detached in tmux on the leader (a dropped connection loses nothing), the
    output followed here."""
    from clusterctl.errors import RemoteCommandError, UnreachableError, UsageError
    from clusterctl.remote import jobfolder, nodepkg, tmux as jobs
    from clusterctl.remote.ssh import SshPool

    if src.startswith("s3://"):
        try:
            s3uri.parse(src)
        except ValueError as exc:
            raise UsageError(
                f"{src!r} is not an S3 location ({exc})", "give one like s3://my-bucket/imagenet/"
            ) from None
    elif any(c in src for c in "\n\r\0") or not src:
        raise UsageError(f"bad source path {src!r}")
    labels = {}
    for name, path in (("val_labels", val_labels), ("val_synsets", val_synsets)):
        if path is not None:
            try:
                labels[name] = Path(path).read_bytes()
            except OSError as exc:
                raise ConfigError(f"--{name.replace('_', '-')} {path}: {exc.strerror or exc}") from None
    if "val_synsets" in labels and "val_labels" not in labels:
        raise ConfigError("--val-synsets goes with --val-labels (the devkit's ground truth)")
    python = jobfolder.node_python(inv.cluster)
    with SshPool(inv.settings) as pool:
        leader = inv.targets[0]
        job = jobfolder.new_job(pool, leader, "data")
        try:
            where_src = src if src.startswith("s3://") else jobfolder.node_path(src, job.home)
            where_dst = jobfolder.node_path(dst, job.home)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        files = {f"{job.dir}/{k}": (v, 0o644) for k, v in labels.items()}
        put = pool.put([leader], files)
        shipped = nodepkg.ship_one(pool, leader) if put.all_ok else put.failed[0]
        if not shipped.ok:
            why = shipped.error or shipped.stderr.strip()
            raise UnreachableError(f"cannot copy the converter to the leader {leader.label}: {why}")
        argv = leader_argv(
            python,
            nodepkg.package().at(job.home),
            where_src,
            where_dst,
            val_labels="val_labels" in labels,
            val_synsets="val_synsets" in labels,
            **options,
        )
        path = f"{os.path.dirname(python)}:{jobfolder.BASE_PATH}" if python.startswith("/") else jobfolder.BASE_PATH
        cmd = (
            f'mkdir -p {shlex.quote(job.dir)} && cd {shlex.quote(job.dir)} && exec env -i HOME="$HOME" '
            'USER="$(id -un)" LANG=C.UTF-8 '
            f"PATH={shlex.quote(path)} TF_CPP_MIN_LOG_LEVEL=2 PYTHONUNBUFFERED=1 {shlex.join(argv)}"
        )
        r = pool.run_one(leader, jobs.detach_command(job.name, cmd, kind="tfrecords"), timeout=60)
        if r.exit_code != 0:
            raise RemoteCommandError(
                f"could not start the conversion on {leader.label}",
                (r.error or r.stderr or r.stdout).strip()[-300:] or None,
            )
    lines: list[str] = []

    def line(text: str) -> None:
        lines.append(text)
        if not text.startswith((_RESULT, _FAILED)):
            on_line(text)

    jobfolder.follow(inv, job.name, line)
    try:
        return parse_leader_result("\n".join(lines))
    finally:
        with SshPool(inv.settings) as pool:
            jobfolder.remove_job(pool, [inv.targets[0]], job)
