"""`python PYZ tfrecords SRC DST [options]`: `clusterctl data tfrecords --on leader`, the conversion run on the
leader, where the images are.

Run by data/tfrecords_leader.py in a job folder on the leader with the node runtime's Python (TensorFlow,
boto3). SRC is a folder on the leader, or s3://bucket/prefix read with the instance's own credentials (its
IAM instance profile): the objects are pulled to a hidden folder beside DST first, and removed once the
shards are written.

Output: progress lines, then one line `CLUSTERCTL-DATA {json}` with what was written; an error is one line
`CLUSTERCTL-DATA-ERROR {json}` ({"message", "hint", "exit"}) and that exit status (errors.EXIT).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from clusterctl.node.dataset import tfrecords as data
from clusterctl.node.dataset.errors import EXIT, DatasetError

DESCRIPTION = (
    "Image folders to ImageNet-format TFRecords, on the node that has the images (data tfrecords --on leader)."
)


def pull_s3(uri: str, dst: str, endpoint_url: str | None) -> int:
    """Every object under the prefix, to the same relative path under dst (parallel); how many."""
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

    rest = uri[5:]
    bucket, _, prefix = rest.partition("/")
    prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
    client = boto3.client("s3", endpoint_url=endpoint_url or None)
    keys: list[str] = []
    try:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            keys += [o["Key"] for o in page.get("Contents", []) if not o["Key"].endswith("/")]
    except NoCredentialsError:
        raise DatasetError(
            "no AWS credentials on the leader", "give the cluster's nodes read access to it (`up --s3-read`)"
        ) from None
    except (ClientError, BotoCoreError) as exc:
        raise DatasetError(f"{uri}: {exc}") from None
    if not keys:
        raise DatasetError(f"{uri}: no objects under this prefix")
    root = os.path.realpath(dst)

    def one(key: str) -> None:
        rel = key[len(prefix) :]
        path = os.path.realpath(os.path.join(root, rel))
        if not path.startswith(root + os.sep):
            raise DatasetError(f"{uri}: object {key!r} would land outside the folder")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        client.download_file(bucket, key, path + ".part")
        os.replace(path + ".part", path)

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(one, keys))
    return len(keys)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="tfrecords", description=DESCRIPTION)
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("--validation-fraction", type=float, default=0.1)
    p.add_argument("--train-shards", type=int)
    p.add_argument("--validation-shards", type=int)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--force", action="store_true")
    p.add_argument("--val-labels")
    p.add_argument("--val-synsets")
    p.add_argument("--endpoint-url")
    p.add_argument("--resize", type=int)
    a = p.parse_args(argv)
    t0 = time.monotonic()
    staging: str | None = None
    try:
        src = a.src
        if src.startswith("s3://"):
            dst = os.path.abspath(a.dst)
            data.check_dst(Path(dst), a.force)  # before pulling anything
            staging = os.path.join(os.path.dirname(dst), f".{os.path.basename(dst)}.source")
            n = pull_s3(src, staging, a.endpoint_url)
            print(f"pulled {n} object(s) from {src} in {time.monotonic() - t0:.1f}s", flush=True)
            src = staging
        last = [0.0]

        def progress(split: str, done: int, total: int) -> None:
            if time.monotonic() - last[0] > 10 or done == total:
                last[0] = time.monotonic()
                print(f"{split}: {done}/{total} image(s)", flush=True)

        info = data.convert_folder(
            src,
            a.dst,
            train_shards=a.train_shards,
            validation_shards=a.validation_shards,
            validation_fraction=a.validation_fraction,
            seed=a.seed,
            force=a.force,
            progress=progress,
            val_labels=a.val_labels,
            val_synsets=a.val_synsets,
            resize=a.resize,
        )
    except DatasetError as exc:
        print(
            "CLUSTERCTL-DATA-ERROR " + json.dumps({"message": exc.message, "hint": exc.hint, "exit": EXIT}), flush=True
        )
        return EXIT
    finally:
        if staging:
            shutil.rmtree(staging, ignore_errors=True)
    print(
        "CLUSTERCTL-DATA "
        + json.dumps(
            {
                "path": str(info.path),
                "classes": list(info.classes),
                "reencoded": info.reencoded,
                "bytes": info.bytes,
                "seconds": time.monotonic() - t0,
                "skipped": [list(s) for s in info.skipped],
                "splits": {k: {"examples": v.examples, "shards": list(v.shards)} for k, v in info.splits.items()},
            }
        ),
        flush=True,
    )
    return 0
