"""The trainer's checkpoints (clusterctl/node/train/checkpoints.py) alone: what makes a checkpoint complete, the S3
copy against moto's S3 server (boto3 for real), the newest complete checkpoint found wherever it is, and the IMDSv2
spot watch against a stand-in HTTP server. The whole thing on a cluster: test_train_checkpoints.py."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from clusterctl.node.train import checkpoints as ck, spot
from conftest import free_port

pytestmark = pytest.mark.integration


def fake_checkpoint(folder: Path, images: int, shards: int = 2, step: int | None = None, batch: int = 1) -> dict:
    """A checkpoint's files as TensorFlow names them (ckpt-<images>; contents do not matter here), sealed with
    its manifest."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"ckpt-{images}.index").write_bytes(os.urandom(100 + images % 1000))
    for i in range(shards):
        (folder / f"ckpt-{images}.data-{i:05d}-of-{shards:05d}").write_bytes(os.urandom(1000 + i))
    m = ck.make_manifest(str(folder), f"ckpt-{images}", images // batch if step is None else step, images, batch)
    ck.write_manifest(str(folder), m)
    return m


def test_complete_means_manifest_last_and_every_shard_at_its_size(tmp_path):
    m = fake_checkpoint(tmp_path, 10)
    assert sorted(m["files"]) == ["ckpt-10.data-00000-of-00002", "ckpt-10.data-00001-of-00002", "ckpt-10.index"]
    fake_checkpoint(tmp_path, 20)
    fake_checkpoint(tmp_path, 30)
    (tmp_path / "ckpt-30.data-00001-of-00002").unlink()  # a shard lost
    with open(tmp_path / "ckpt-20.data-00000-of-00002", "ab") as f:
        f.write(b"x")  # a shard of another size (a copy cut off, or written again)
    (tmp_path / "ckpt-40.index").write_bytes(b"i")  # files, no manifest (a save cut off)
    (tmp_path / "ckpt-40.data-00000-of-00001").write_bytes(b"d")
    complete, bad = ck.scan_listing(*ck.local_listing(str(tmp_path)))
    assert list(complete) == [10] and bad == ["ckpt-20", "ckpt-30", "ckpt-40"]
    # a manifest that does not name every shard of its own data is not complete either
    short = dict(m, files={k: v for k, v in m["files"].items() if "00001-of" not in k})
    assert ck.missing(short, {k: v for k, v in m["files"].items()}) == ["ckpt-10.data-00001-of-00002"]
    path, place, got = ck.newest(str(tmp_path), [])
    assert (path, place, got["images"]) == (str(tmp_path / "ckpt-10"), "local", 10)


@pytest.fixture
def s3(monkeypatch):
    import boto3
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    for k, v in (
        ("AWS_ACCESS_KEY_ID", "AKIATEST"),
        ("AWS_SECRET_ACCESS_KEY", "secret"),
        ("AWS_DEFAULT_REGION", "us-east-1"),
    ):
        monkeypatch.setenv(k, v)
    url = f"http://127.0.0.1:{port}"
    client = boto3.client("s3", endpoint_url=url)
    client.create_bucket(Bucket="ckb")
    yield url, client
    server.stop()


def test_s3_copy_keeps_the_newest_and_a_lost_leader_folder_resumes_from_it(tmp_path, s3):
    url, client = s3
    leader = tmp_path / "leader"
    copy = ck.S3Copy("s3://ckb/runs/r1", url)
    for step in (10, 20, 30, 40):
        copy.push(str(leader), fake_checkpoint(leader, step), keep=2)
    keys = sorted(o["Key"] for o in client.list_objects_v2(Bucket="ckb")["Contents"])
    assert keys == sorted(
        f"runs/r1/ckpt-{s}{x}"
        for s in (30, 40)
        for x in (".index", ".data-00000-of-00002", ".data-00001-of-00002", ".manifest.json")
    )
    # a newer upload cut off before its manifest: never taken
    client.put_object(Bucket="ckb", Key="runs/r1/ckpt-50.index", Body=b"half")
    want = {n: (leader / n).read_bytes() for n in os.listdir(leader) if n.startswith("ckpt-40.")}
    for p in leader.iterdir():
        p.unlink()
    events = []
    path, place, m = ck.newest(str(leader), [copy], lambda event, **f: events.append((event, f)))
    assert (path, place, m["images"]) == (str(leader / "ckpt-40"), "s3://ckb/runs/r1/", 40)
    assert {n: (leader / n).read_bytes() for n in want} == want  # fetched byte for byte, manifest last
    assert (
        "warning",
        {"kind": "incomplete_checkpoint", "place": "s3://ckb/runs/r1/", "checkpoints": "ckpt-50"},
    ) in events


def test_checkpoints_are_ordered_by_images_not_steps_everywhere(tmp_path, s3):
    """After a resume on twice the processes the steps halve: step 40 of batch 32 (1,280 images) is newer than
    step 60 of batch 16 (960). The copies keep, and newest() takes, the most images; a manifest without an
    images count (an older trainer's, named by step) is never taken."""
    url, client = s3
    leader = tmp_path / "leader"
    copy = ck.S3Copy("s3://ckb/runs/r2", url)
    old = fake_checkpoint(leader, 960, step=60, batch=16)
    new = fake_checkpoint(leader, 1280, step=40, batch=32)
    assert (new["version"], new["images"], new["step"], new["global_batch"]) == (2, 1280, 40, 32)
    copy.push(str(leader), new, keep=1)
    copy.push(str(leader), old, keep=1)  # a late copy of the older one: pruned at once, the newer kept
    keys = sorted(o["Key"] for o in client.list_objects_v2(Bucket="ckb", Prefix="runs/r2/")["Contents"])
    assert [k for k in keys if k.endswith(".manifest.json")] == ["runs/r2/ckpt-1280.manifest.json"]
    # an older trainer's checkpoint named by its step 5000: complete files, but no images count
    legacy = fake_checkpoint(leader, 5000, step=5000)
    del legacy["images"]
    legacy["version"] = 1
    ck.write_manifest(str(leader), legacy)
    complete, bad = ck.scan_listing(*ck.local_listing(str(leader)))
    assert sorted(complete) == [960, 1280] and bad == ["ckpt-5000"]
    assert ck.missing(legacy, {}) == ["no images count (an older trainer's checkpoint, ordered by step)"]
    # a manifest whose name says other images than its count is not taken either
    assert ck.missing(dict(new, images=1281), {}) != []
    path, place, m = ck.newest(str(leader), [copy])
    assert (path, place, m["images"]) == (str(leader / "ckpt-1280"), "local", 1280)
    # the leader's folder lost: S3's (the newest by images) is fetched
    for p in leader.iterdir():
        p.unlink()
    path, place, m = ck.newest(str(leader), [copy])
    assert (path, place, m["step"], m["images"]) == (str(leader / "ckpt-1280"), "s3://ckb/runs/r2/", 40, 1280)


def test_spot_watch_speaks_imdsv2_and_sees_the_notice_within_one_poll():
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    state = {"notice": False, "calls": []}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def _send(self, code, body=b""):
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_PUT(self):
            state["calls"].append(("PUT", self.path, self.headers.get("X-aws-ec2-metadata-token-ttl-seconds")))
            self._send(200, b"T0K")

        def do_GET(self):
            state["calls"].append(("GET", self.path, self.headers.get("X-aws-ec2-metadata-token")))
            if self.headers.get("X-aws-ec2-metadata-token") != "T0K":
                return self._send(401)
            if not state["notice"]:
                return self._send(404)
            self._send(200, json.dumps({"action": "terminate", "time": "2026-11-23T00:02:00Z"}).encode())

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        watch = spot.SpotWatch(f"http://127.0.0.1:{server.server_address[1]}", interval=0.5).start()
        time.sleep(1.2)
        assert watch.notice is None
        assert state["calls"][0] == ("PUT", "/latest/api/token", "21600")
        assert state["calls"][1] == ("GET", "/latest/meta-data/spot/instance-action", "T0K")
        assert sum(c[0] == "PUT" for c in state["calls"]) == 1  # the token is reused
        flipped = time.time()
        state["notice"] = True
        deadline = time.time() + 5
        while watch.notice is None and time.time() < deadline:
            time.sleep(0.02)
        assert watch.notice == {"action": "terminate", "time": "2026-11-23T00:02:00Z"}
        assert watch.seen_at - flipped <= 0.5 + 0.3
        # no IMDS at all (not on EC2): no notice, no error
        quiet = spot.SpotWatch("http://127.0.0.1:9", interval=0.1).start()
        time.sleep(0.5)
        assert quiet.notice is None
        quiet.stop()
    finally:
        server.shutdown()
