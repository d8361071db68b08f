"""A runtime pack from the S3 cache is taken only with the sha256 this machine recorded when it cached it: the
leader's fetch (runtime/s3cache.fetch_command) run here by a real shell and curl on file:// URLs, and the digests
kept in CLUSTERCTL_HOME (S3Cache.held). On a cluster: tests/runtime/test_runtime_aws.py."""

from __future__ import annotations

import hashlib
import subprocess

from clusterctl.runtime import spec as rt
from clusterctl.runtime.s3cache import MISMATCH_EXIT, S3Cache, digest_command, fetch_command, parse_digests


def _served(tmp_path, pack: bytes, info: bytes) -> dict[str, str]:
    src = tmp_path / "bucket"
    src.mkdir(exist_ok=True)
    (src / rt.PACK).write_bytes(pack)
    (src / rt.INFO).write_bytes(info)
    return {n: f"file://{src / n}" for n in (rt.PACK, rt.INFO)}


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_the_fetch_keeps_the_files_whose_digests_were_recorded(tmp_path):
    urls = _served(tmp_path, b"pack", b'{"id": "x"}')
    out = tmp_path / "in coming"
    want = {rt.PACK: _sha(b"pack"), rt.INFO: _sha(b'{"id": "x"}')}
    proc = subprocess.run(["sh", "-c", fetch_command(urls, str(out), want)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert (out / rt.PACK).read_bytes() == b"pack" and (out / rt.INFO).read_bytes() == b'{"id": "x"}'
    sums = subprocess.run(["sh", "-c", digest_command(str(out))], capture_output=True, text=True, check=True)
    assert parse_digests(sums.stdout) == want


def test_a_replaced_pack_and_info_are_refused_in_one_line_and_not_kept(tmp_path):
    want = {rt.PACK: _sha(b"genuine pack"), rt.INFO: _sha(b'{"id": "x", "files": 9}')}
    urls = _served(tmp_path, b"planted pack", b'{"id": "x", "files": 1}')  # both replaced, consistent together
    out = tmp_path / "in"
    proc = subprocess.run(["sh", "-c", fetch_command(urls, str(out), want)], capture_output=True, text=True)
    assert proc.returncode == MISMATCH_EXIT
    assert proc.stderr.splitlines() == [
        f"runtime: {rt.PACK} has sha256 {_sha(b'planted pack')}, not {want[rt.PACK]} as when it was cached"
    ]
    assert sorted(p.name for p in out.iterdir()) == []  # nothing of it left for the unpacking to find


def test_the_digests_held_are_per_cache_location_and_only_whole(tmp_path):
    held = tmp_path / "home" / "runtime-cache.json"
    a, b = S3Cache("s3://bkt/runtimes", None, held), S3Cache("s3://other/runtimes", None, held)
    assert a.held_digests("r1") is None
    a.hold("r1", {rt.PACK: "1" * 64, rt.INFO: "2" * 64})
    assert a.held_digests("r1") == {rt.PACK: "1" * 64, rt.INFO: "2" * 64}
    assert b.held_digests("r1") is None and a.held_digests("r2") is None
    assert oct(held.stat().st_mode & 0o777) == "0o600"
    assert parse_digests(f"{'1' * 64}  {rt.PACK}\n") == {}  # the info's digest missing: nothing vouched for
