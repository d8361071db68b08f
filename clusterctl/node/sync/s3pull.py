"""S3 on the node, with the node's own credentials (instance profile or ~/.aws): `sync s3list`, a manifest
from a bucket's listing, and `sync s3pull`, objects pulled and each checked against what S3 vouches for."""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from clusterctl.node.sync.check import etag_matches
from clusterctl.node.sync.guard import safe_root
from clusterctl.node.sync.manifest import (
    CHUNK,
    EXIT_INPUT,
    PARTIAL_DIR,
    AgentError,
    Args,
    ManifestReader,
    Wire,
    path_problem,
)


# ---- S3 ---------------------------------------------------------------------------------------------
def _s3(args: Args) -> Any:  # a boto3 S3 client
    try:
        import boto3
        from botocore.config import Config
    except ImportError:
        raise AgentError("boto3 is not installed on this node (pip install boto3)", EXIT_INPUT) from None
    cfg = Config(retries={"max_attempts": 5, "mode": "standard"}, max_pool_connections=16)
    return boto3.client("s3", endpoint_url=args.get("endpoint_url") or None, config=cfg)


def _s3_error(exc: Exception) -> AgentError:
    name = exc.__class__.__name__
    if name in ("NoCredentialsError", "PartialCredentialsError"):
        return AgentError("no AWS credentials on this node: give it an instance profile (or ~/.aws config)", EXIT_INPUT)
    code = getattr(exc, "response", {}).get("Error", {}).get("Code") if hasattr(exc, "response") else None
    if code in ("NoSuchBucket", "AccessDenied", "403", "404"):
        return AgentError(f"S3: {code}: {exc}", EXIT_INPUT)
    return AgentError(f"S3: {name}: {exc}"[:300])


def cmd_s3list(args: Args) -> Wire:
    s3 = _s3(args)
    bucket, prefix = args["bucket"], args["prefix"]
    entries: dict[str, Wire] = {}
    try:
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for obj in page.get("Contents", []):
                key = obj["Key"]
                rel = key[len(prefix) :]
                folder = rel.endswith("/")  # a console "folder": an empty directory on the nodes
                rel = rel.rstrip("/")
                if rel == "":
                    continue  # the prefix itself
                problem = path_problem(rel)
                if problem:
                    raise AgentError(f"S3 key {key!r} cannot be a file under DST: {problem}", EXIT_INPUT)
                if folder:
                    rel += "/_"  # only its parents (itself included) become directories
                e = {"p": rel, "t": "f", "s": int(obj["Size"]), "etag": obj["ETag"].strip('"')}
                if "SHA256" in (obj.get("ChecksumAlgorithm") or []):
                    head = s3.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
                    value = head.get("ChecksumSHA256") or ""
                    if value and "-" not in value:
                        e["sha256b64"] = value
                if not folder:
                    if rel in entries:
                        raise AgentError(f"S3 keys clash at {rel!r} (a file and a folder)", EXIT_INPUT)
                    entries[rel] = e
                parts = rel.split("/")[:-1]
                for i in range(1, len(parts) + 1):
                    d = "/".join(parts[:i])
                    if d in entries and entries[d]["t"] != "d":
                        raise AgentError(f"S3 keys {d!r} and {rel!r} clash (a file and a folder)", EXIT_INPUT)
                    entries.setdefault(d, {"p": d, "t": "d"})
    except AgentError:
        raise
    except Exception as exc:
        raise _s3_error(exc) from None
    return {"entries": sorted(entries.values(), key=lambda e: e["p"].split("/"))}


class _Progress:
    def __init__(self) -> None:
        self.done = 0
        self.lock = threading.Lock()
        self.last = 0.0

    def add(self, n: int) -> None:
        with self.lock:
            self.done += n
            now = time.monotonic()
            if now - self.last >= 0.5:
                self.last = now
                sys.stderr.write(f"CCSYNC-BYTES {self.done}\n")
                sys.stderr.flush()


def cmd_s3pull(args: Args) -> Wire:  # noqa: C901 (each object checked as S3 allows (ETag, SHA256, recorded), in one pass)
    root = safe_root({"dst": args["dst"]})[0]
    with open(args["only"], "rb") as f:
        wanted = [p for p in f.read().decode("utf-8", "surrogateescape").split("\0") if p]
    only = set(wanted)  # of the manifest, only the entries pulled are held
    entries = {e["p"]: e for e in ManifestReader(args["manifest"]) if e["p"] in only}
    missing = only.difference(entries)
    if missing:
        raise AgentError(f"--only names {min(missing)!r}, which the manifest does not", EXIT_INPUT)
    s3 = _s3(args)
    bucket, prefix = args["bucket"], args["prefix"]
    progress = _Progress()
    for p in wanted:
        if entries[p]["t"] == "d":
            os.makedirs(os.path.join(root, p), exist_ok=True)

    record = bool(args.get("record"))
    recorded: dict[str, str] = {}

    def one(p: str) -> str | None:
        e = entries[p]
        if e["t"] != "f":
            return None
        full = os.path.join(root, p)
        pdir = os.path.join(os.path.dirname(full), PARTIAL_DIR)
        part = os.path.join(pdir, os.path.basename(full))
        try:
            os.makedirs(pdir, exist_ok=True)
            have = os.path.getsize(part) if os.path.exists(part) else 0
            if have > e["s"]:
                os.unlink(part)
                have = 0
            sha, md5, kms = hashlib.sha256(), hashlib.md5(), False  # streamed: the data is read once
            if have:
                with open(part, "rb", buffering=0) as f:
                    while b := f.read(CHUNK):
                        sha.update(b)
                        md5.update(b)
            if have < e["s"] or e["s"] == 0:
                kw = {"Bucket": bucket, "Key": prefix + p, "IfMatch": '"' + e["etag"] + '"'}
                if have:
                    kw["Range"] = f"bytes={have}-"
                resp = s3.get_object(**kw)
                # SSE-KMS (and SSE-C): the ETag is not the MD5 of the data, S3 vouches for nothing we can check
                kms = resp.get("ServerSideEncryption") in ("aws:kms", "aws:kms:dsse") or bool(
                    resp.get("SSECustomerAlgorithm")
                )
                body = resp["Body"]
                with open(part, "ab" if have else "wb") as f:
                    for chunk in iter(lambda: body.read(CHUNK), b""):
                        f.write(chunk)
                        sha.update(chunk)
                        md5.update(chunk)
                        progress.add(len(chunk))
            problem = None
            if os.path.getsize(part) != e["s"]:
                problem = "content does not match S3's checksum"
            elif "h" in e or e.get("sha256b64"):  # S3's SHA256, or the one the first node recorded
                if not (
                    sha.hexdigest() == e["h"] if "h" in e else base64.b64encode(sha.digest()).decode() == e["sha256b64"]
                ):
                    problem = "content does not match " + (
                        "the sha256 recorded by the first node" if "h" in e else "S3's checksum"
                    )
            elif not kms and "-" not in e["etag"]:
                if md5.hexdigest() != e["etag"]:
                    problem = "content does not match S3's checksum"
            elif kms or not etag_matches(part, e["etag"], e["s"]):  # a multipart ETag of unknown part size
                if record:
                    with recorded_lock:
                        recorded[p] = sha.hexdigest()
                else:
                    problem = (
                        "S3 gives no checksum for it (SSE-KMS or a multipart ETag) and no node recorded one "
                        "to check it against"
                    )
            if problem:
                os.unlink(part)
                return f"{p}: {problem}"
            if os.path.lexists(full) and os.path.isdir(full) and not os.path.islink(full):
                shutil.rmtree(full)
            os.replace(part, full)
            return None
        except OSError as exc:
            return f"{p}: {exc.strerror or exc}"
        except Exception as exc:
            return f"{p}: {_s3_error(exc)}"

    recorded_lock = threading.Lock()
    with ThreadPoolExecutor(max_workers=int(args.get("workers", 8))) as pool:
        errors = [r for r in pool.map(one, wanted) if r]
    for pdir in {os.path.join(os.path.dirname(os.path.join(root, p)), PARTIAL_DIR) for p in wanted}:
        try:
            os.rmdir(pdir)  # only once every pull is over: the threads share these folders
        except OSError:
            pass
    sys.stderr.write(f"CCSYNC-BYTES {progress.done}\n")
    if errors:
        raise AgentError(f"{len(errors)} object(s) failed, first: {errors[0]}")
    return {"root": root, "bytes": progress.done, "recorded": recorded}
