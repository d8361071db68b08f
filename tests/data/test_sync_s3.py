"""`clusterctl sync s3://...`: every node pulls its own copy with its own credentials (here a config file
in the node's home, as an instance profile would be on EC2), against moto's S3 server on this machine's
loopback, which each node reaches through an ssh reverse tunnel to its own loopback."""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from pathlib import Path

import pytest

from conftest import free_port, reverse_tunnel
from sync_support import down_cluster, first_error_line, marker, node_sha256, sync, table_rows, up_cluster

pytestmark = pytest.mark.integration

KEY_ID = "AKIACLUSTERCTLTEST01"
SECRET = "s3cr3t-clusterctl-test-9f8e7d6c5b4a"
BUCKET = "cc-data"


@pytest.fixture(scope="module")
def s3env(tmp_path_factory):
    import boto3
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    cluster = up_cluster(tmp_path_factory.mktemp("syncs3"), 3, runtime=True)  # the nodes pull with boto3
    tunnels = []
    try:
        cdir = cluster.cli.home / "clusters" / cluster.name
        for i in range(len(cluster.hosts)):
            home = cdir / "nodes" / str(i) / "home"  # the node's /root, seen from this machine
            (home / ".aws").mkdir(mode=0o700)
            (home / ".aws" / "credentials").write_text(
                f"[default]\naws_access_key_id = {KEY_ID}\naws_secret_access_key = {SECRET}\n"
            )
            (home / ".aws" / "config").write_text("[default]\nregion = us-east-1\n")
            tunnels.append(reverse_tunnel(cluster, i, port))
        client = boto3.client(
            "s3",
            endpoint_url=f"http://127.0.0.1:{port}",
            region_name="us-east-1",
            aws_access_key_id=KEY_ID,
            aws_secret_access_key=SECRET,
        )
        client.create_bucket(Bucket=BUCKET)
        objects = {
            "one.bin": os.urandom(100_000),
            'dir with space/it\'s $x "q".bin': os.urandom(3_000),
            "deep/a/b/c.txt": b"deep" * 100,
        }
        for rel, data in objects.items():
            client.put_object(Bucket=BUCKET, Key=f"data/{rel}", Body=data)
        sha = os.urandom(50_000)
        client.put_object(Bucket=BUCKET, Key="data/sha.bin", Body=sha, ChecksumAlgorithm="SHA256")
        objects["sha.bin"] = sha
        multi = os.urandom(5 * 1024 * 1024 + 4321)  # two parts: a multipart ETag
        up = client.create_multipart_upload(Bucket=BUCKET, Key="data/multi.bin")
        parts = []
        for n, chunk in enumerate((multi[: 5 * 1024 * 1024], multi[5 * 1024 * 1024 :]), 1):
            r = client.upload_part(
                Bucket=BUCKET, Key="data/multi.bin", UploadId=up["UploadId"], PartNumber=n, Body=chunk
            )
            parts.append({"PartNumber": n, "ETag": r["ETag"]})
        client.complete_multipart_upload(
            Bucket=BUCKET, Key="data/multi.bin", UploadId=up["UploadId"], MultipartUpload={"Parts": parts}
        )
        objects["multi.bin"] = multi
        client.put_object(Bucket=BUCKET, Key="data/empty/", Body=b"")  # a console "folder"
        client.put_object(Bucket=BUCKET, Key="evil/../../escape", Body=b"x")
        for t in tunnels:
            assert t.poll() is None, t.stderr.read()
        sums = {k: hashlib.sha256(v).hexdigest() for k, v in objects.items()}
        yield cluster, f"http://127.0.0.1:{port}", sums, client
    finally:
        for t in tunnels:
            t.terminate()
            t.wait(timeout=10)
        down_cluster(cluster)
        server.stop()


class CommandLineWatch:
    """Reads every process's command line on this machine (the nodes' included) while a sync runs."""

    def __init__(self, needles: tuple[str, ...]):
        self.needles = [n.encode() for n in needles]
        self.seen: list[str] = []
        self.scans = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for d in os.listdir("/proc"):
                if d.isdigit():
                    try:
                        cmd = Path(f"/proc/{d}/cmdline").read_bytes()
                    except OSError:
                        continue
                    if any(n in cmd for n in self.needles):
                        self.seen.append(cmd.replace(b"\0", b" ").decode(errors="replace"))
            self.scans += 1

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join(timeout=10)


def test_every_node_pulls_verified_with_no_key_on_any_command_line(s3env):
    cluster, endpoint, sums, _ = s3env
    with CommandLineWatch((SECRET, KEY_ID)) as watch:
        proc = sync(cluster, "--endpoint-url", endpoint, f"s3://{BUCKET}/data", "/tmp/s3data")
    assert proc.returncode == 0, proc.stderr
    assert "will retry" not in proc.stderr  # every pull went through the first time
    assert watch.scans > 3 and watch.seen == []
    assert SECRET not in proc.stdout + proc.stderr and KEY_ID not in proc.stdout + proc.stderr
    for i in range(3):
        assert node_sha256(cluster, i, "/tmp/s3data") == sums
        m = marker(cluster, i, "/tmp/s3data")
        assert m is not None and m["files"] == len(sums) and m["source"] == f"s3://{BUCKET}/data/"
        assert cluster.node_exec(i, "test", "-d", "/tmp/s3data/empty").returncode == 0
    assert all(r.rstrip().endswith("yes") for r in table_rows(proc.stdout).values())


def test_rerun_pulls_only_the_corrupted_object_and_resumes_partials(s3env):
    cluster, endpoint, sums, client = s3env
    dst = "/tmp/s3fix"
    assert sync(cluster, "--endpoint-url", endpoint, f"s3://{BUCKET}/data/", dst).returncode == 0
    cluster.node_exec(
        1,
        "python3",
        "-c",
        "import os,sys; p=sys.argv[1]; st=os.stat(p); b=bytearray(open(p,'rb').read()); b[10]^=1; "
        "open(p,'wb').write(b); os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))",
        f"{dst}/multi.bin",
    )
    proc = sync(cluster, "--endpoint-url", endpoint, f"s3://{BUCKET}/data/", dst)
    assert proc.returncode == 0, proc.stderr
    rows = table_rows(proc.stdout)
    assert f"{5 * 1024 * 1024 + 4321:,}" in rows[cluster.hosts[1]]
    assert " 0 " in rows[cluster.hosts[0]] and " 0 " in rows[cluster.hosts[2]]
    assert node_sha256(cluster, 1, dst) == sums

    # cut off in the middle of one.bin: on node 2 a partial that is right (the pull resumes from it), on
    # node 0 one that is wrong (the checksum catches it; the object is pulled again whole)
    one = client.get_object(Bucket=BUCKET, Key="data/one.bin")["Body"].read()
    for i, partial in ((2, one[:60_000]), (0, b"\0" * 60_000)):
        cluster.node_exec(i, "rm", f"{dst}/one.bin")
        cluster.node_exec(i, "mkdir", f"{dst}/.clusterctl-partial")
        cluster.node_exec(
            i,
            "python3",
            "-c",
            "import sys; open(sys.argv[1],'wb').write(bytes.fromhex(sys.argv[2]))",
            f"{dst}/.clusterctl-partial/one.bin",
            partial.hex(),
        )
    proc = sync(cluster, "--endpoint-url", endpoint, f"s3://{BUCKET}/data/", dst)
    assert proc.returncode == 0, proc.stderr
    assert f"{cluster.hosts[0]}: s3: 1 object(s) failed, first: one.bin: content does not match" in proc.stderr
    assert f"{cluster.hosts[2]}: s3:" not in proc.stderr
    for i in range(3):
        assert node_sha256(cluster, i, dst) == sums and marker(cluster, i, dst) is not None
        assert cluster.node_exec(i, "test", "-e", f"{dst}/.clusterctl-partial", check=False).returncode == 1


def test_s3_bad_input(s3env):
    cluster, endpoint, _, _ = s3env
    proc = sync(cluster, "--endpoint-url", endpoint, f"s3://{BUCKET}/evil", "/tmp/evil")
    assert proc.returncode == 3
    assert "cannot be a file under DST" in first_error_line(proc.stderr)
    assert cluster.node_exec(0, "test", "-e", "/escape", check=False).returncode == 1
    proc = sync(cluster, "--endpoint-url", endpoint, "s3://no-such-bucket/x", "/tmp/nob")
    assert proc.returncode == 3 and "NoSuchBucket" in first_error_line(proc.stderr)
    proc = sync(cluster, "--endpoint-url", "file:///etc", f"s3://{BUCKET}/data", "/tmp/x")
    assert proc.returncode == 2 and "is not an http(s) URL" in first_error_line(proc.stderr)


def test_no_credentials_on_the_nodes_is_one_clear_error(s3env):
    cluster, endpoint, _, _ = s3env
    cdir = cluster.cli.home / "clusters" / cluster.name / "nodes"
    for i in range(3):
        (cdir / str(i) / "home" / ".aws" / "credentials").rename(cdir / str(i) / "home" / ".aws" / "moved")
    try:
        proc = sync(cluster, "--endpoint-url", endpoint, f"s3://{BUCKET}/data", "/tmp/nocreds")
        assert proc.returncode == 3
        assert "no AWS credentials on this node" in first_error_line(proc.stderr)
    finally:
        for i in range(3):
            (cdir / str(i) / "home" / ".aws" / "moved").rename(cdir / str(i) / "home" / ".aws" / "credentials")


def test_sse_kms_and_multipart_objects_are_checked_against_the_sha256_the_first_node_recorded(
    s3env, tmp_path, monkeypatch
):
    """Issue 14: an SSE-KMS object's ETag is not an MD5, and a multipart ETag of a part size that is not a
    whole MiB cannot be recomputed: neither ever verified, so such a sync failed on every node, every time."""
    from clusterctl.node.sync import main as node_main, manifest as node_manifest
    from motoaws import opaque_kms_etags

    cluster, endpoint, _, client = s3env
    opaque_kms_etags()  # as on S3 (moto gives such an object its MD5)
    kms = os.urandom(200_000)
    client.put_object(Bucket=BUCKET, Key="kms/secret.bin", Body=kms, ServerSideEncryption="aws:kms")
    assert client.head_object(Bucket=BUCKET, Key="kms/secret.bin")["ETag"].strip('"') != hashlib.md5(kms).hexdigest()
    part = 5 * 1024 * 1024 + 1000  # not a whole MiB
    odd = os.urandom(part + 77_777)
    up = client.create_multipart_upload(Bucket=BUCKET, Key="kms/odd.bin")
    parts = [
        {
            "PartNumber": n,
            "ETag": client.upload_part(
                Bucket=BUCKET, Key="kms/odd.bin", UploadId=up["UploadId"], PartNumber=n, Body=chunk
            )["ETag"],
        }
        for n, chunk in enumerate((odd[:part], odd[part:]), 1)
    ]
    client.complete_multipart_upload(
        Bucket=BUCKET, Key="kms/odd.bin", UploadId=up["UploadId"], MultipartUpload={"Parts": parts}
    )
    assert client.head_object(Bucket=BUCKET, Key="kms/odd.bin")["ETag"].strip('"').endswith("-2")
    client.put_object(Bucket=BUCKET, Key="kms/plain.txt", Body=b"plain")  # an MD5 ETag: S3's own check
    want = {
        "secret.bin": hashlib.sha256(kms).hexdigest(),
        "odd.bin": hashlib.sha256(odd).hexdigest(),
        "plain.txt": hashlib.sha256(b"plain").hexdigest(),
    }

    proc = sync(cluster, "--endpoint-url", endpoint, f"s3://{BUCKET}/kms", "/tmp/s3kms")
    assert proc.returncode == 0, proc.stderr
    assert (
        f"2 object(s) have no checksum S3 vouches for (SSE-KMS, or a multipart ETag of unknown part size): "
        f"their sha256 as pulled by {cluster.hosts[0]} is recorded, and every other node's copy is checked "
        "against it"
    ) in " ".join(proc.stderr.split()), proc.stderr
    for i in range(3):
        assert node_sha256(cluster, i, "/tmp/s3kms") == want
        assert marker(cluster, i, "/tmp/s3kms") is not None
        # the manifest every copy was verified against carries the recorded sha256 of those two
        saved = cluster.node_exec(i, "cat", f"/tmp/s3kms/{node_manifest.STATE_DIR}/{node_manifest.SAVED}").stdout
        hashes = {e["p"]: e.get("h") for e in map(json.loads, saved.splitlines()[1:])}
        assert hashes == {"secret.bin": want["secret.bin"], "odd.bin": want["odd.bin"], "plain.txt": None}

    # the node side: a pull whose data differs from the recorded sha256 is refused, and without a recorded one
    # (and without --record) such an object is never taken on trust
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    listing = tmp_path / "s3list.json"
    assert node_main.main(["s3list", BUCKET, "kms/", "--endpoint-url", endpoint, "--out", str(listing)]) == 0
    entries = [json.loads(line) for line in listing.read_text().splitlines()[1:]]  # after the result's line
    only = tmp_path / "only"
    only.write_bytes(b"secret.bin\0")
    for h, expect in (
        (None, "S3 gives no checksum for it (SSE-KMS or a multipart ETag) and no node recorded one"),
        ("0" * 64, "content does not match the sha256 recorded by the first node"),
    ):
        manifest = tmp_path / "m.jsonl"
        manifest.write_bytes(
            node_manifest.manifest_header("test")
            + b"".join(node_manifest.manifest_line({**e, **({"h": h} if h else {})}) for e in entries)
        )
        out = tmp_path / "out.json"
        rc = node_main.main(
            [
                "s3pull",
                "--dst",
                str(tmp_path / "dst"),
                "--manifest",
                str(manifest),
                "--bucket",
                BUCKET,
                "--prefix",
                "kms/",
                "--only",
                str(only),
                "--endpoint-url",
                endpoint,
                "--out",
                str(out),
            ]
        )
        assert rc != 0 and expect in json.loads(out.read_text())["error"]
        assert not (tmp_path / "dst" / "secret.bin").exists()


def test_the_pulls_start_once_every_node_has_the_manifest_they_read(s3env, monkeypatch, tmp_path):
    """A first copy sends the manifest in the background while the data flows; an S3 pull reads it on its
    node, so the pulls wait for it. Here its upload is slowed: before, each node's first pull failed on the
    missing file (CI once saw it on one node) and was retried."""
    from clusterctl.cluster import inventory
    from clusterctl.data import plan as syncplan, sync as transfer
    from clusterctl.data.outcome import Silent
    from clusterctl.remote import jobfolder
    from clusterctl.remote.ssh import SshPool
    from clusterctl.state import StateStore

    cluster, endpoint, sums, _ = s3env
    monkeypatch.setenv("CLUSTERCTL_HOME", str(cluster.cli.home))
    store = StateStore(cluster.cli.home)
    inv = inventory.resolve(None, cluster.name, store)

    class Phases(Silent):
        def __init__(self) -> None:
            self.lines: list[str] = []

        def phase(self, text: str) -> None:
            self.lines.append(text)

    send = transfer.Syncer._send_manifest

    def slow_send(self) -> None:
        time.sleep(3)
        send(self)

    monkeypatch.setattr(transfer.Syncer, "_send_manifest", slow_send)
    events = Phases()
    with SshPool(inv.settings) as pool:
        report = transfer.Syncer.over(
            inv,
            pool,
            syncplan.parse_source(f"s3://{BUCKET}/data"),
            "/tmp/s3slow",
            endpoint_url=endpoint,
            events=events,
            node_python=jobfolder.node_python(store.load(cluster.name).cluster),
            cache_dir=tmp_path,
        ).run()
    assert report.error() is None, events.lines
    assert any("have nothing at /tmp/s3slow yet" in line for line in events.lines), events.lines  # all fresh
    assert not [line for line in events.lines if "will retry" in line or "repairing" in line], events.lines
    for i in range(3):
        assert node_sha256(cluster, i, "/tmp/s3slow") == sums


def test_a_dst_that_resolves_into_the_node_runtime_is_refused_before_anything_is_pulled_or_deleted(s3env):
    """An S3 source has no folder on the nodes to overlap: its DST meets the node's own rules, judged on the
    node after every symlink. Here a link in the home to the node runtime (whose Python runs the agent)."""
    cluster, endpoint, _, _ = s3env
    rid = cluster.node_exec(1, "ls", "/opt/clusterctl-runtime").stdout.split()
    rid = [r for r in rid if not r.startswith(".")][0]
    runtime = f"/opt/clusterctl-runtime/{rid}"
    before = cluster.node_exec(1, "sh", "-c", f"find {runtime} | wc -l").stdout
    cluster.node_exec(1, "ln", "-sfn", runtime, "/root/rt")
    proc = sync(cluster, "--delete", "--endpoint-url", endpoint, f"s3://{BUCKET}/data", "/root/rt")
    assert proc.returncode == 2, proc.stderr
    line = first_error_line(proc.stderr)
    assert line == (
        f"Error: on {cluster.hosts[1]}: refusing to sync into /root/rt: {runtime} is in clusterctl's own folder "
        "/opt/clusterctl-runtime: name a folder of its own (not a system folder, the home, nor clusterctl's)"
    ), line
    assert cluster.node_exec(1, "sh", "-c", f"find {runtime} | wc -l").stdout == before
    assert cluster.node_exec(1, f"{runtime}/bin/python", "-c", "import boto3").returncode == 0
    for i in range(3):
        assert cluster.node_exec(i, "test", "-e", "/root/rt/one.bin", check=False).returncode == 1
