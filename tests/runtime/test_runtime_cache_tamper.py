"""A runtime cache whose pack and runtime.json were both replaced (whoever saw a presigned PUT URL within its hour
could): `up` on moto's EC2 and S3, namespace-backed instances, refuses it in one line naming the file and both
digests, before any node unpacks it; the cluster is rolled back and the bucket and this machine's digests are left
as they were. The planted pack is a working one (its bin/python passes the installer's check), so without the
digest this machine holds the nodes would run it."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import tarfile

import pytest

from clusterctl.runtime import spec as rt
from conftest import Forward

pytestmark = pytest.mark.integration

BUCKET = "cc-runtime-tamper"


def _node_rid() -> str:
    """The runtime id `up` will compute for these nodes: their base OS is this machine's, /usr/local theirs (empty)."""
    out = subprocess.run(
        ["env", "-i", "PATH=/usr/sbin:/usr/bin:/sbin:/bin", "sh", "-c", rt.PLATFORM_PROBE],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    platform = rt.parse_platform(out)
    assert platform is not None
    return rt.runtime_id(rt.RuntimeSpec(gpu=platform.gpu), platform)


def _planted_pack(rid: str) -> tuple[bytes, bytes]:
    """A pack the installer takes (one file, its count and bytes in runtime.json, a bin/python that 'imports')."""
    script = b"#!/bin/sh\necho planted > /root/planted\nexit 0\n"
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        info = tarfile.TarInfo(f"opt/clusterctl-runtime/{rid}/bin/python")
        info.size, info.mode = len(script), 0o755
        tar.addfile(info, io.BytesIO(script))
    pack = subprocess.run(["zstd", "-q", "-c"], input=raw.getvalue(), capture_output=True, check=True).stdout
    meta = json.dumps({"id": rid, "files": 1, "bytes": len(script)}, sort_keys=True).encode()
    return pack, meta


def test_a_cache_replaced_through_its_urls_is_refused_in_one_line(aws, aws_cli):
    port = int(aws.endpoint.rsplit(":", 1)[1].strip("/"))
    s3_for_nodes = Forward((aws.mirror_address, 0), ("127.0.0.1", port))
    try:
        s3 = aws.client("s3")
        s3.create_bucket(Bucket=BUCKET)
        rid = _node_rid()
        # what this machine cached at that id earlier: its digests, held in CLUSTERCTL_HOME
        genuine = {rt.PACK: hashlib.sha256(b"genuine pack").hexdigest(), rt.INFO: hashlib.sha256(b"{}").hexdigest()}
        url = f"s3://{BUCKET}/runtimes/{rid}/"
        held = aws_cli.cli.home / "runtime-cache.json"
        held.parent.mkdir(parents=True, exist_ok=True)
        held.write_text(json.dumps({url: genuine}))
        os.chmod(held, 0o600)
        # both files replaced since, consistent with each other
        pack, meta = _planted_pack(rid)
        s3.put_object(Bucket=BUCKET, Key=f"runtimes/{rid}/{rt.PACK}", Body=pack)
        s3.put_object(Bucket=BUCKET, Key=f"runtimes/{rid}/{rt.INFO}", Body=meta)

        proc = aws_cli(
            *aws_cli.up_args("rtt", 1, "--type", "c5.xlarge", "--runtime", "install"),
            "--runtime-cache",
            f"s3://{BUCKET}/runtimes",
            env={"AWS_ENDPOINT_URL": f"http://{aws.mirror_address}:{s3_for_nodes.port}"},
            timeout=600,
        )
        assert f"node runtime {rid}:" in proc.stderr, proc.stderr  # the id predicted here is the one `up` used
        errors = [line for line in proc.stderr.splitlines() if line.startswith("Error:")]
        assert proc.returncode == 4 and len(errors) == 1, proc.stdout + proc.stderr
        planted = hashlib.sha256(pack).hexdigest()
        assert f"the cache {url} is not what this machine put there: " in errors[0], errors
        assert f"{rt.PACK} has sha256 {planted}, not {genuine[rt.PACK]} as when it was cached" in errors[0], errors
        assert "relay" not in proc.stderr and "unpacked" not in proc.stderr  # no node got it
        assert aws.sweep("rtt") == []  # rolled back
        # the bucket as it was (nothing rebuilt over it), the digests held as they were
        got = {n: s3.get_object(Bucket=BUCKET, Key=f"runtimes/{rid}/{n}")["Body"].read() for n in (rt.PACK, rt.INFO)}
        assert got == {rt.PACK: pack, rt.INFO: meta}
        assert json.loads(held.read_text()) == {url: genuine}
    finally:
        s3_for_nodes.close()
