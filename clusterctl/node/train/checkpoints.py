"""Checkpoints that outlive the leader: their manifests, and their copies on a second node and S3.

A TensorFlow checkpoint `ckpt-N` is an index (`ckpt-N.index`) and data shards (`ckpt-N.data-0000i-of-0000K`),
N the images the run has trained on when it was saved (every rank's batches summed over every step, whatever
the number of processes was then): a resume on another number of processes rescales the steps, never the
images, so N orders checkpoints across resizes and two are never given one name. The manifest records N
(`images`) beside the step and the global batch of the moment. It is complete when `ckpt-N.manifest.json`
exists, names the index and all K shards with their sizes, and every one of those files is present with that
size. The manifest is written last, wherever the checkpoint goes (the leader's disk, the copy on a second
node, S3): a copy cut off half-way has no manifest, or files of the wrong size, and is never taken.

Copies (rank 0, in one background thread, so training does not wait for the network):
- a second node, over the leader's own ssh to it (the keys and pinned host keys horovodrun uses), into
  the same folder there. Chosen over a Horovod broadcast (it would stall every rank for the transfer,
  and gloo broadcasts go to all ranks, not one node) and over the operator relaying it (the operator's
  laptop may be closed for days).
- S3 (`--checkpoint-to s3://bucket/prefix`), with boto3 and the instance's own credentials (its IAM
  instance profile, allowed to write that prefix only).
Each copy keeps the same number of checkpoints as the leader.

`newest()` looks in all three and takes the checkpoint that has seen the most images and is complete where it
lies, fetching it to the leader's folder first when it is elsewhere; each copy keeps its newest by images.
A manifest without `images` (an older trainer's, ordered by step) is never taken: it is reported as incomplete.

Stdlib only; boto3 is imported for S3 alone (the node runtime has it); the ssh is the node package's (ssh.py).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from typing import IO, Any, Protocol

from clusterctl.node import ssh

MANIFEST = ".manifest.json"
FORMAT = "clusterctl-checkpoint"
VERSION = 2  # 2: named and ordered by images seen (1: by step)
_NAME = re.compile(r"^ckpt-(\d+)$")
_DATA = re.compile(r"^(ckpt-\d+)\.data-(\d+)-of-(\d+)$")
SSH = ssh.argv(20)  # the leader's ssh to its nodes: pinned host keys, no prompt
Manifest = dict[str, Any]  # a checkpoint's manifest, as JSON holds it
Report = Callable[..., None]  # (event, **fields): the trainer's emit


# ---- manifests -------------------------------------------------------------------------------------------
def number_of(name: str) -> int | None:
    """N of `ckpt-N`: the images seen."""
    m = _NAME.match(name)
    return int(m.group(1)) if m else None


def images_of(manifest: Manifest) -> int | None:
    """The images a manifest's checkpoint had seen; None when it does not say (or its name says otherwise)."""
    images = manifest.get("images")
    if isinstance(images, int) and not isinstance(images, bool) and number_of(manifest.get("name", "")) == images:
        return images
    return None


def checkpoint_files(names: Iterable[str]) -> dict[str, list[str]]:
    """checkpoint name -> its files, among `names` (file names of one folder)."""
    out: dict[str, list[str]] = {}
    for n in names:
        data = _DATA.match(n)
        base = n[: -len(".index")] if n.endswith(".index") else (data.group(1) if data else None)
        if base and number_of(base) is not None:
            out.setdefault(base, []).append(n)
    return out


def make_manifest(folder: str, name: str, step: int, images: int, global_batch: int) -> Manifest:
    files = checkpoint_files(os.listdir(folder)).get(name, [])
    return {
        "format": FORMAT,
        "version": VERSION,
        "name": name,
        "images": int(images),
        "step": int(step),
        "global_batch": int(global_batch),
        "time": time.time(),
        "files": {f: os.path.getsize(os.path.join(folder, f)) for f in sorted(files)},
    }


def missing(manifest: Manifest, sizes: dict[str, int]) -> list[str]:
    """What keeps `manifest` from being complete, given the sizes of the files where it lies ([]: complete).
    The manifest itself must name the index and every shard 0..K-1 of its data."""
    name = manifest.get("name", "")
    files = manifest.get("files") or {}
    if number_of(name) is None or manifest.get("format") != FORMAT:
        return ["not a checkpoint manifest"]
    if images_of(manifest) is None:
        return ["no images count (an older trainer's checkpoint, ordered by step)"]
    want = {f"{name}.index"}
    counts = {int(m.group(3)) for m in (_DATA.match(f) for f in files) if m}
    if len(counts) != 1:
        return [f"{name}.data-*"]
    k = counts.pop()
    want |= {f"{name}.data-{i:05d}-of-{k:05d}" for i in range(k)}
    problems = sorted(want - set(files))
    for f, size in sorted(files.items()):
        if sizes.get(f) != size:
            problems.append(f if f not in sizes else f"{f} ({sizes[f]} bytes, not {size})")
    return problems


def write_manifest(folder: str, manifest: Manifest) -> None:
    """Atomically, last: its presence is what makes the checkpoint complete."""
    path = os.path.join(folder, manifest["name"] + MANIFEST)
    tmp = os.path.join(folder, "." + manifest["name"] + MANIFEST + ".tmp")
    with open(tmp, "w") as f:
        f.write(json.dumps(manifest, sort_keys=True))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def scan_listing(sizes: dict[str, int], manifests: list[Manifest]) -> tuple[dict[int, Manifest], list[str]]:
    """(images seen -> manifest of each complete checkpoint, names of incomplete ones) of one place."""
    complete: dict[int, Manifest] = {}
    bad: list[str] = []
    described = set()
    for m in manifests:
        described.add(m.get("name"))
        if missing(m, sizes):
            bad.append(m.get("name", "?"))
        else:
            complete[int(m["images"])] = m  # complete: images_of said it is
    bad += [n for n in checkpoint_files(sizes) if n not in described]  # files but no manifest
    return complete, sorted(set(bad))


def local_listing(folder: str) -> tuple[dict[str, int], list[Manifest]]:
    sizes: dict[str, int] = {}
    manifests: list[Manifest] = []
    if not os.path.isdir(folder):
        return sizes, manifests
    for n in os.listdir(folder):
        p = os.path.join(folder, n)
        if not os.path.isfile(p):
            continue
        if n.endswith(MANIFEST) and not n.startswith("."):
            try:
                with open(p) as f:
                    manifests.append(json.load(f))
            except (OSError, ValueError):
                pass
        else:
            sizes[n] = os.path.getsize(p)
    return sizes, manifests


def prune_local(folder: str) -> None:
    """Manifests of checkpoints TensorFlow's CheckpointManager has deleted."""
    names = set(os.listdir(folder))
    for n in names:
        if n.endswith(MANIFEST) and f"{n[: -len(MANIFEST)]}.index" not in names:
            try:
                os.unlink(os.path.join(folder, n))
            except OSError:
                pass


def _names(sizes: dict[str, int], manifests: list[Manifest]) -> set[str]:
    """Every checkpoint name of a place: with files, or with a manifest alone."""
    return set(checkpoint_files(sizes)) | {
        m["name"] for m in manifests if number_of(str(m.get("name", ""))) is not None
    }


def _keep_names(complete: dict[int, Manifest], keep: int) -> set[str]:
    """The names of the `keep` complete checkpoints that have seen the most images: everything else of a copy
    goes (a checkpoint from before a resize that saw fewer images is older, whatever its step)."""
    return {complete[n]["name"] for n in sorted(complete)[-keep:]}


# ---- a second node, over ssh -------------------------------------------------------------------------------
class Copy(Protocol):
    """A place that keeps copies of the checkpoints."""

    label: str

    def listing(self) -> tuple[dict[str, int], list[Manifest]]: ...
    def push(self, folder: str, manifest: Manifest, keep: int) -> None: ...
    def fetch(self, manifest: Manifest, folder: str) -> None: ...


class SshCopy:
    def __init__(self, host: str, folder: str) -> None:
        self.host, self.folder = host, folder
        self.label = f"{host}:{folder}"

    def _ssh(
        self,
        command: str,
        stdin: int | IO[bytes] | None = subprocess.DEVNULL,
        stdout: int | IO[bytes] | None = subprocess.PIPE,
        timeout: float = 3600,
    ) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [*SSH, self.host, command], stdin=stdin, stdout=stdout, stderr=subprocess.PIPE, timeout=timeout
        )

    def listing(self) -> tuple[dict[str, int], list[Manifest]]:
        q = shlex.quote(self.folder)
        cmd = (
            f'cd {q} 2>/dev/null || exit 0; for f in ckpt-*; do [ -f "$f" ] || continue; '
            'case "$f" in *' + MANIFEST + ") printf 'M\\t'; tr -d '\\n' < \"$f\"; echo ;; "
            '*) printf \'F\\t%s\\t%s\\n\' "$f" "$(stat -c %s "$f")" ;; esac; done'
        )
        r = self._ssh(cmd, stdin=subprocess.DEVNULL, timeout=120)
        if r.returncode != 0:
            raise OSError(f"ssh {self.host}: exit {r.returncode}: {r.stderr.decode(errors='replace').strip()[-200:]}")
        sizes: dict[str, int] = {}
        manifests: list[Manifest] = []
        for line in r.stdout.decode(errors="replace").splitlines():
            kind, _, rest = line.partition("\t")
            if kind == "F":
                name, _, size = rest.rpartition("\t")
                sizes[name] = int(size)
            elif kind == "M":
                try:
                    manifests.append(json.loads(rest))
                except ValueError:
                    pass
        return sizes, manifests

    def push(self, folder: str, manifest: Manifest, keep: int) -> None:
        q = shlex.quote(self.folder)
        files = sorted(manifest["files"])
        # An old manifest of the same name goes first: until the new one lands, the copy is incomplete.
        tar = subprocess.Popen(
            ["tar", "-C", folder, "-cf", "-", "--", *files], stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        assert tar.stdout is not None and tar.stderr is not None  # both piped
        r = self._ssh(f"mkdir -p {q} && rm -f {q}/{manifest['name']}{MANIFEST} && tar -C {q} -xf -", stdin=tar.stdout)
        tar.stdout.close()
        terr = tar.stderr.read().decode(errors="replace")
        if tar.wait() != 0 or r.returncode != 0:
            raise OSError(f"copy to {self.host} failed: {(terr or r.stderr.decode(errors='replace')).strip()[-200:]}")
        sizes, manifests = self.listing()
        if missing(manifest, sizes):
            raise OSError(f"copy to {self.host} incomplete: {', '.join(missing(manifest, sizes))}")
        kept = _keep_names({**scan_listing(sizes, manifests)[0], int(manifest["images"]): manifest}, keep)
        drop = sorted(n for n in _names(sizes, manifests) if n not in kept)
        body = json.dumps(manifest, sort_keys=True).encode()
        mname = manifest["name"] + MANIFEST
        rm = "".join(f" {q}/{shlex.quote(n)}.*" for n in drop)
        r = subprocess.run(
            [
                *SSH,
                self.host,
                f"cat > {q}/.{mname}.tmp && mv -f {q}/.{mname}.tmp {q}/{mname}" + (f" && rm -f{rm}" if drop else ""),
            ],
            input=body,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            timeout=120,
        )
        if r.returncode != 0:
            raise OSError(f"manifest to {self.host} failed: {r.stderr.decode(errors='replace').strip()[-200:]}")

    def fetch(self, manifest: Manifest, folder: str) -> None:
        q = shlex.quote(self.folder)
        files = " ".join(shlex.quote(f) for f in sorted(manifest["files"]))
        with subprocess.Popen(
            ["tar", "-C", folder, "-xf", "-"], stdin=subprocess.PIPE, stderr=subprocess.PIPE
        ) as untar:
            assert untar.stdin is not None  # piped
            r = self._ssh(f"tar -C {q} -cf - -- {files}", stdout=untar.stdin)
            untar.stdin.close()
            if untar.wait() != 0 or r.returncode != 0:
                raise OSError(f"fetch from {self.host} failed: {r.stderr.decode(errors='replace').strip()[-200:]}")


# ---- S3 ------------------------------------------------------------------------------------------------------
def parse_s3(uri: str) -> tuple[str, str]:
    m = re.fullmatch(r"s3://([a-z0-9][a-z0-9.\-]{1,61}[a-z0-9])(?:/(.*))?", uri or "")
    if not m:
        raise ValueError(f"{uri!r} is not s3://bucket/prefix")
    prefix = (m.group(2) or "").strip("/")
    return m.group(1), (prefix + "/") if prefix else ""


class S3Copy:
    def __init__(self, uri: str, endpoint_url: str | None = None) -> None:
        self.bucket, self.prefix = parse_s3(uri)
        self.endpoint_url = endpoint_url
        self.label = f"s3://{self.bucket}/{self.prefix}"
        self._client: Any = None

    @property
    def client(self) -> Any:
        if self._client is None:
            import boto3  # the node runtime's; credentials from the instance profile (or ~/.aws)
            from botocore.config import Config

            self._client = boto3.client(
                "s3",
                endpoint_url=self.endpoint_url or None,
                config=Config(retries={"max_attempts": 8, "mode": "adaptive"}),
            )
        return self._client

    def listing(self) -> tuple[dict[str, int], list[Manifest]]:
        sizes: dict[str, int] = {}
        manifests: list[Manifest] = []
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self.prefix)
        for page in pages:
            for obj in page.get("Contents", []):
                name = obj["Key"][len(self.prefix) :]
                if "/" in name or not name.startswith("ckpt-"):
                    continue
                if name.endswith(MANIFEST):
                    body = self.client.get_object(Bucket=self.bucket, Key=obj["Key"])["Body"].read()
                    try:
                        manifests.append(json.loads(body))
                    except ValueError:
                        pass
                else:
                    sizes[name] = int(obj["Size"])
        return sizes, manifests

    def push(self, folder: str, manifest: Manifest, keep: int) -> None:
        mkey = self.prefix + manifest["name"] + MANIFEST
        self.client.delete_object(Bucket=self.bucket, Key=mkey)
        for f in sorted(manifest["files"]):
            self.client.upload_file(os.path.join(folder, f), self.bucket, self.prefix + f)
        self.client.put_object(Bucket=self.bucket, Key=mkey, Body=json.dumps(manifest, sort_keys=True).encode())
        sizes, manifests = self.listing()
        kept = _keep_names(scan_listing(sizes, manifests)[0], keep)
        files = checkpoint_files(sizes)
        for name in _names(sizes, manifests) - kept:
            for f in files.get(name, []) + [name + MANIFEST]:
                self.client.delete_object(Bucket=self.bucket, Key=self.prefix + f)

    def fetch(self, manifest: Manifest, folder: str) -> None:
        for f in sorted(manifest["files"]):
            tmp = os.path.join(folder, f".{f}.part")
            self.client.download_file(self.bucket, self.prefix + f, tmp)
            os.replace(tmp, os.path.join(folder, f))


# ---- finding the newest complete checkpoint ------------------------------------------------------------------
def _quiet(event: str, **fields: object) -> None:
    pass


def newest(folder: str, copies: Iterable[Copy], report: Report = _quiet) -> tuple[str | None, str, Manifest | None]:
    """(path prefix to restore, where it came from, its manifest), or (None, "", None). A checkpoint found
    only elsewhere is fetched into `folder` first (files, then the manifest). Incomplete checkpoints and
    places that cannot be read are reported and skipped."""
    places: list[tuple[str, Copy | None, tuple[dict[str, int], list[Manifest]]]] = [
        ("local", None, local_listing(folder))
    ]
    for c in copies:
        try:
            places.append((c.label, c, c.listing()))
        except Exception as exc:  # a copy that cannot be read is not a reason to start over
            report(
                "warning", kind="checkpoint_copy_unreadable", place=c.label, message=" ".join(str(exc).split())[:300]
            )
    best: tuple[int, str, Copy | None, Manifest] | None = None
    for label, copy, (sizes, manifests) in places:
        complete, bad = scan_listing(sizes, manifests)
        if bad:
            report("warning", kind="incomplete_checkpoint", place=label, checkpoints=",".join(bad))
        for images, m in complete.items():
            if best is None or images > best[0]:  # ties: the first place (local, then the copies in order)
                best = (images, label, copy, m)
    if best is None:
        return None, "", None
    _, label, copy, m = best
    if copy is not None:
        os.makedirs(folder, exist_ok=True)
        copy.fetch(m, folder)
        sizes, _ = local_listing(folder)
        gone = missing(m, sizes)
        if gone:
            raise OSError(f"fetched {m['name']} from {label} incomplete: {', '.join(gone)}")
        write_manifest(folder, m)
    return os.path.join(folder, m["name"]), label, m


class Copier:
    """Copies each saved checkpoint to every place, newest first, in one background thread. `submit` does not
    wait; `wait` does (before a spot shutdown and at the end)."""

    def __init__(self, copies: Iterable[Copy], keep: int, report: Report) -> None:
        self.copies, self.keep, self.report = list(copies), keep, report
        self._pending: tuple[str, Manifest] | None = None
        self._cond = threading.Condition()
        self._busy = False
        self._thread = threading.Thread(target=self._run, daemon=True, name="checkpoint-copy")
        if self.copies:
            self._thread.start()

    def submit(self, folder: str, manifest: Manifest) -> None:
        if not self.copies:
            return
        with self._cond:
            self._pending = (folder, manifest)  # a newer checkpoint replaces one not yet started
            self._cond.notify_all()

    def wait(self, timeout: float = 3600) -> None:
        deadline = time.monotonic() + timeout
        with self._cond:
            while (self._pending or self._busy) and time.monotonic() < deadline:
                self._cond.wait(1)

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._pending is None:
                    self._cond.wait()
                folder, manifest = self._pending
                self._pending, self._busy = None, True
            try:
                for c in self.copies:
                    t = time.time()
                    try:
                        c.push(folder, manifest, self.keep)
                        self.report(
                            "checkpoint_copy",
                            images=manifest["images"],
                            step=manifest["step"],
                            place=c.label,
                            seconds=time.time() - t,
                        )
                    except Exception as exc:  # reported; the next checkpoint tries again
                        self.report(
                            "warning",
                            kind="checkpoint_copy_failed",
                            place=c.label,
                            images=manifest["images"],
                            step=manifest["step"],
                            message=" ".join(str(exc).split())[:300],
                        )
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()
