"""The node runtime's S3 cache (`up --runtime-cache`): where a built runtime is kept under s3://bucket/prefix/<id>/,
reached by the leader through presigned URLs (no node needs S3 write access, nothing is listed by pattern), and
the sha256 of each file this machine put there, kept in CLUSTERCTL_HOME: a later fetch takes only those bytes.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Mapping

from clusterctl import s3uri, state
from clusterctl.errors import ProvisionError
from clusterctl.providers.base import ObjectStore
from clusterctl.runtime import spec as rt

MISMATCH_EXIT = 86  # fetch_command: a file from the cache is not the one this machine cached
HELD = "runtime-cache.json"  # in CLUSTERCTL_HOME: cache location -> {file: sha256} of what this machine cached


class S3Cache:
    """A runtime cache under s3://bucket/prefix/<id>/: the operator checks it and hands the leader presigned
    URLs (GET to fetch, PUT to fill), so no node needs S3 write access and nothing is listed by pattern."""

    def __init__(self, url: str, objects: ObjectStore | None, held: Path | None = None):
        loc = s3uri.parse(url)  # checked by RuntimeRequest
        self.bucket, self.prefix, self._objects = loc.bucket, loc.prefix.rstrip("/"), objects
        self.held = held or state.home() / HELD  # what this machine cached there, by sha256

    def _held(self) -> dict[str, dict[str, str]]:
        import json

        try:
            found = json.loads(self.held.read_text())
        except (OSError, ValueError):
            return {}
        return found if isinstance(found, dict) else {}

    def held_digests(self, rid: str) -> dict[str, str] | None:
        """The sha256 of the pack and runtime.json this machine put at this id, or None (it put none there)."""
        got = self._held().get(self.url(rid))
        if isinstance(got, dict) and all(isinstance(got.get(n), str) for n in (rt.PACK, rt.INFO)):
            return {n: got[n] for n in (rt.PACK, rt.INFO)}
        return None

    def hold(self, rid: str, digests: Mapping[str, str]) -> None:
        import json

        held = {**self._held(), self.url(rid): dict(digests)}
        self.held.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        state.atomic_write(self.held, json.dumps(held, indent=1, sort_keys=True) + "\n")

    def key(self, rid: str, name: str) -> str:
        return "/".join(p for p in (self.prefix, rid, name) if p)

    def url(self, rid: str) -> str:
        return f"s3://{self.bucket}/{self.key(rid, '')}/"

    @property
    def objects(self) -> ObjectStore:
        if self._objects is None:
            raise ProvisionError(f"no object store to reach the runtime cache {self.url('')}")
        return self._objects

    def has(self, rid: str) -> bool:
        try:
            return self.objects.exists(self.bucket, self.key(rid, rt.INFO))
        except ProvisionError as exc:
            raise ProvisionError(f"cannot read the runtime cache {self.url(rid)}: {exc}") from None

    def get_urls(self, rid: str) -> dict[str, str]:  # presigned for an hour
        return {n: self.objects.presigned_get(self.bucket, self.key(rid, n)) for n in (rt.PACK, rt.INFO)}

    def put_urls(self, rid: str) -> dict[str, str]:
        return {n: self.objects.presigned_put(self.bucket, self.key(rid, n)) for n in (rt.PACK, rt.INFO)}


def fetch_command(urls: Mapping[str, str], out: str, want: Mapping[str, str]) -> str:
    """curl the pack, then runtime.json (last, so a cut download never looks complete), each kept only when its
    sha256 is `want`'s (else one `runtime: NAME ...` line and exit MISMATCH_EXIT, the file removed)."""
    o = shlex.quote(out)
    steps = [f"mkdir -p {o}", f"rm -f {o}/{rt.INFO}"]
    for name in (rt.PACK, rt.INFO):
        part, sha = f"{o}/{name}.partial", shlex.quote(want[name])
        steps.append(f"curl -fsS --retry 3 -o {part} {shlex.quote(urls[name])}")
        steps.append(
            f'{{ got=$(sha256sum {part} | cut -d" " -f1); [ "$got" = {sha} ] || {{ rm -f {part}; '
            f'echo "runtime: {name} has sha256 $got, not "{sha}" as when it was cached" >&2; exit {MISMATCH_EXIT}; }}; }}'
        )
        steps.append(f"mv {part} {o}/{name}")
    return " && ".join(steps)


def digest_command(out: str) -> str:
    """`SHA256  NAME` of the pack and runtime.json the leader built (sha256sum's lines)."""
    o = shlex.quote(out)
    return f"cd {o} && sha256sum {rt.PACK} {rt.INFO}"


def parse_digests(text: str) -> dict[str, str]:
    """digest_command's output as {name: sha256}; {} unless it names both files with well-formed digests."""
    found = {}
    for line in text.splitlines():
        m = re.fullmatch(r"([0-9a-f]{64}) [ *](\S+)", line.strip())
        if m:
            found[m.group(2)] = m.group(1)
    return found if set(found) == {rt.PACK, rt.INFO} else {}


def put_command(urls: Mapping[str, str], out: str) -> str:
    """Upload with presigned PUT URLs: the nodes need no S3 write permission; runtime.json goes last."""
    o = shlex.quote(out)
    return " && ".join(
        f"curl -fsS --retry 3 -X PUT -T {o}/{name} {shlex.quote(urls[name])}" for name in (rt.PACK, rt.INFO)
    )
