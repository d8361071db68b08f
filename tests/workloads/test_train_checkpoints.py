"""Checkpoints that outlive the leader, and spot interruptions, for real: a 2-node local cluster (2 slots each)
running the trainer (the node package's `train`) under horovodrun (gloo), a moto S3 server on this machine reached from the
leader through an ssh reverse tunnel to its loopback (credentials in the node's ~/.aws, as an instance profile
would give them on EC2), and an IMDSv2 stand-in (token PUT, then GET spot/instance-action) reached the same way
from the member node. Also the IAM grant `train --checkpoint-to` gives an AWS cluster's role, against moto."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from clusterctl.workloads.train import log as train_log
from conftest import free_port, node_pid, reverse_tunnel, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.horovod]

KEY_ID = "AKIACLUSTERCTLCKPT01"
SECRET = "ckpt-s3cr3t-9f8e7d6c5b4a"
BUCKET = "cc-ckpt"


class Imds:
    """IMDSv2 as EC2 serves it: PUT /latest/api/token (with a TTL header) gives a token; GET of
    spot/instance-action needs it (401 without), and answers 404 until `notice()`, then the JSON."""

    def __init__(self):
        self.token = "tok-" + str(time.time())
        self.noticed_at: float | None = None
        self.first_served: float | None = None
        self.puts = 0
        self.gets_with_token = 0
        self.gets_without_token = 0
        imds = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, code: int, body: bytes = b"") -> None:
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_PUT(self):
                if self.path != "/latest/api/token" or not self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                    return self._send(400)
                imds.puts += 1
                self._send(200, imds.token.encode())

            def do_GET(self):
                if self.headers.get("X-aws-ec2-metadata-token") != imds.token:
                    imds.gets_without_token += 1
                    return self._send(401)
                imds.gets_with_token += 1
                if self.path != "/latest/meta-data/spot/instance-action" or imds.noticed_at is None:
                    return self._send(404)
                if imds.first_served is None:
                    imds.first_served = time.time()
                when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(imds.noticed_at + 120))
                self._send(200, json.dumps({"action": "terminate", "time": when}).encode())

        self.port = free_port()
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def notice(self) -> None:
        self.noticed_at = time.time()


@pytest.fixture(scope="module")
def env(module_cluster_factory):
    import boto3
    from moto.server import ThreadedMotoServer

    s3_port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=s3_port, verbose=False)
    server.start()
    cluster = module_cluster_factory(2, 2, runtime=True)
    imds = Imds()
    tunnels = [reverse_tunnel(cluster, 0, s3_port), reverse_tunnel(cluster, 1, imds.port)]
    try:
        home = cluster.cli.home / "clusters" / cluster.name / "nodes" / "0" / "home"  # the leader's /root
        (home / ".aws").mkdir(mode=0o700)
        (home / ".aws" / "credentials").write_text(
            f"[default]\naws_access_key_id = {KEY_ID}\naws_secret_access_key = {SECRET}\n"
        )
        (home / ".aws" / "config").write_text("[default]\nregion = us-east-1\n")
        s3 = boto3.client(
            "s3",
            endpoint_url=f"http://127.0.0.1:{s3_port}",
            region_name="us-east-1",
            aws_access_key_id=KEY_ID,
            aws_secret_access_key=SECRET,
        )
        s3.create_bucket(Bucket=BUCKET)
        cli = cluster.cli
        proc = cli(
            "data",
            "synthetic",
            "ds",
            "--images",
            "320",
            "--classes",
            "10",
            "--image-size",
            "32",
            "--train-shards",
            "4",
            "--validation-shards",
            "2",
        )
        assert proc.returncode == 0, proc.stderr
        proc = cli("sync", str(cli.cwd / "ds"), "/root/ds", timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        for t in tunnels:
            assert t.poll() is None, t.stderr.read()
        yield cluster, s3, f"http://127.0.0.1:{s3_port}", imds
    finally:
        for t in tunnels:
            t.terminate()
            t.wait(timeout=10)
        imds.server.shutdown()
        server.stop()


def leader_log(cluster, job: str) -> str:
    return cluster.node_exec(0, "sh", "-c", f"cat ~/.clusterctl/jobs/{job}.log 2>/dev/null; true").stdout


def node_files(cluster, index: int, folder: str) -> dict[str, int]:
    out = cluster.node_exec(index, "sh", "-c", f"cd {folder} 2>/dev/null && stat -c '%n %s' ckpt-* ; true").stdout
    return {n: int(s) for n, s in (line.rsplit(" ", 1) for line in out.splitlines() if line.strip())}


def started(proc) -> str:
    assert proc.returncode == 0, proc.stderr
    return re.search(r"started training job (train-[\w-]+)", proc.stderr).group(1)


def test_checkpoints_are_copied_and_resumed_from_the_copy_when_the_leaders_are_gone(env):
    cluster, s3, endpoint, _ = env
    cli = cluster.cli
    member = cluster.hosts[1]
    folder = "/root/runs/ck/checkpoints"
    cmd = [
        "train",
        "--data",
        "/root/ds",
        "--model",
        "tiny",
        "--epochs",
        "60",
        "--batch-size",
        "8",
        "--checkpoint-every",
        "10",
        "--log-every",
        "10",
        "--model-dir",
        "~/runs/ck",
        "--warmup-epochs",
        "1",
        "--checkpoint-to",
        f"s3://{BUCKET}/ckpts/run1",
        f"--trainer-arg=--s3-endpoint-url={endpoint}",
    ]

    for uri in ("s3://Bad_Bucket/x", "s3://cc-ckpt"):
        bad = cli(*cmd[:-3], "--checkpoint-to", uri)
        assert bad.returncode == 2 and bad.stderr.startswith(f"Error: --checkpoint-to '{uri}' "), bad.stderr

    job1 = started(cli(*cmd))

    # 600 steps (60 epochs of 10): the run outlasts its first copies. At 200 a fast machine ended it first:
    # a checkpoint every 0.5 s, and the copier (newest first) lost its races with the leader's pruning.
    # Checkpoints are named by the images seen: 4 processes of 8, 32 a step.
    def copied_twice():  # a checkpoint at step >= 20 is on the member and in S3 (its images count)
        log = leader_log(cluster, job1)
        seen = {}
        for m in re.finditer(r"checkpoint_copy images=(\d+) step=(\d+) place=(\S+)", log):
            assert int(m.group(1)) == 32 * int(m.group(2)), m.group(0)
            seen.setdefault(int(m.group(1)), set()).add(m.group(3).split(":")[0])
        done = [n for n, places in seen.items() if n >= 20 * 32 and {member, "s3"} <= places]
        return max(done) if done else None

    saved = wait_for(copied_twice, 300, "a checkpoint copied to the member and to S3", interval=0.2)
    assert cli("train", "--stop").returncode == 0
    # The stop kills the copier's ssh client; a command it already handed to the member (a manifest's `cat`
    # and `mv`) may still finish there a moment later. Read the member once it has stopped changing.
    listings = [node_files(cluster, 1, folder)]

    def settled() -> bool:
        listings.append(node_files(cluster, 1, folder))
        return listings[-1] == listings[-2]

    wait_for(settled, 60, "the member's checkpoint folder to stop changing", interval=2)
    log1 = train_log.parse_train_log(leader_log(cluster, job1))
    assert log1.current.done is None, "the run finished before it was stopped"
    assert f"checkpoint_copy images={saved} step={saved // 32} place={member}:{folder} " in leader_log(cluster, job1)

    # the copy on the member: the files the leader's manifest names (the leader may have pruned them by now),
    # at their sizes, the manifest beside them; the same in S3
    member_files = node_files(cluster, 1, folder)
    manifest = json.loads(cluster.node_exec(1, "cat", f"{folder}/ckpt-{saved}.manifest.json").stdout)
    mine = manifest["files"]
    assert (manifest["images"], manifest["step"]) == (saved, saved // 32)
    assert sorted(mine) == [f"ckpt-{saved}.data-00000-of-00001", f"ckpt-{saved}.index"]
    assert all(member_files[n] == size for n, size in mine.items())
    # --keep-checkpoints 5 there too (beside them, perhaps, a copy the stop cut off before its manifest)
    assert len([n for n in member_files if n.endswith(".manifest.json")]) <= 5
    keys = {o["Key"]: o["Size"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix="ckpts/run1/")["Contents"]}
    assert f"ckpts/run1/ckpt-{saved}.manifest.json" in keys
    assert all(keys[f"ckpts/run1/{n}"] == size for n, size in mine.items())

    def newest(listing: dict[str, int]) -> int:
        return max(int(n[5 : -len(".manifest.json")]) for n in listing if n.endswith(".manifest.json"))

    member_max = newest(member_files)
    s3_max = newest({k.rsplit("/", 1)[1]: v for k, v in keys.items()})
    assert member_max >= s3_max >= saved  # the member is copied first

    # on the member, a newer checkpoint whose data shard is missing: its manifest says complete, the files do not
    cluster.node_exec(
        1,
        "sh",
        "-c",
        f"cd {folder} && cp ckpt-{saved}.index ckpt-99000.index && "
        f'sed \'s/ckpt-{saved}\\([."]\\)/ckpt-99000\\1/g; s/"images": {saved}/"images": 99000/\' '
        f"ckpt-{saved}.manifest.json > ckpt-99000.manifest.json",
    )
    fake = json.loads(cluster.node_exec(1, "cat", f"{folder}/ckpt-99000.manifest.json").stdout)
    assert fake["images"] == 99000 and "ckpt-99000.data-00000-of-00001" in fake["files"]
    # the leader's checkpoints are gone (a lost leader disk)
    cluster.node_exec(0, "rm", "-rf", "/root/runs/ck")

    # The resumed run goes 30 steps past the checkpoint it takes, not to step 600 (--max-steps is not one of
    # the hyperparameters a resume must match): what is checked below is where it starts and what it keeps.
    end = member_max // 32 + 30
    proc = cli(*cmd, "--max-steps", str(end), "--wait", timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    out = proc.stdout
    run2 = train_log.parse_train_log(out).current
    # reported as incomplete, not taken (beside it, perhaps, a copy the stop cut off before its manifest)
    assert re.search(rf"incomplete_checkpoint place={re.escape(member)}:{folder} checkpoints=\S*ckpt-99000", out), out
    fetched = rf"checkpoint_fetched images={member_max} step={member_max // 32} place={re.escape(member)}:{folder} "
    assert re.search(fetched, out), "\n".join(line for line in out.splitlines() if "checkpoint" in line)[-3000:]
    assert run2.resumed_from is not None and run2.resumed_from.images == member_max
    assert run2.start.start_step == member_max // 32 and not run2.done.complete and run2.done.step == end
    assert run2.eval is not None and run2.eval.step == end

    # S3 is the last place left: the member's copies and the leader's gone, `eval` finds the last step's there
    cluster.node_exec(0, "rm", "-rf", "/root/runs/ck")
    cluster.node_exec(1, "rm", "-rf", "/root/runs/ck")
    proc = cli("eval", timeout=300)
    assert proc.returncode == 0, proc.stderr
    row = proc.stdout.splitlines()[1].split()
    assert row[0] == str(end) and row[6] == f"ckpt-{end * 32}", proc.stdout
    assert f"ckpt-{end * 32}.manifest.json" in node_files(cluster, 0, folder)
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix="ckpts/run1/")["Contents"]]
    assert len([k for k in keys if k.endswith(".index")]) <= 5


def test_spot_notice_checkpoints_within_one_poll_and_stops_then_resumes(env):
    cluster, _, _, imds = env
    cli = cluster.cli
    poll = 2.0
    folder = "/root/runs/spot/checkpoints"
    cmd = [
        "train",
        "--data",
        "/root/ds",
        "--model",
        "tiny",
        "--epochs",
        "30",
        "--batch-size",
        "8",
        "--checkpoint-every",
        "1000",
        "--log-every",
        "5",
        "--model-dir",
        "~/runs/spot",
        "--max-steps",
        "400",  # the first run outlasts the notice (before step 200); the resumed one is given its own end
        f"--trainer-arg=--spot-poll={poll}",
        f"--trainer-arg=--imds-endpoint=http://127.0.0.1:{imds.port}",
    ]
    job1 = started(cli(*cmd))

    def training():
        rows = train_log.parse_train_log(leader_log(cluster, job1), strict=False).current
        return rows is not None and rows.rows and rows.rows[-1].step >= 20

    wait_for(training, 300, "training past step 20", interval=0.2)
    assert imds.puts >= 1 and imds.gets_with_token >= 1 and imds.gets_without_token == 0
    imds.notice()
    wait_for(
        lambda: (
            "gone"
            in cluster.node_exec(
                0, "sh", "-c", f"tmux has-session -t ={job1} 2>/dev/null && echo alive || echo gone"
            ).stdout
        ),
        180,
        "every rank to stop",
    )
    text = leader_log(cluster, job1)
    run = train_log.parse_train_log(text).current
    assert imds.first_served is not None and imds.first_served - imds.noticed_at <= poll + 0.5
    assert run.errors and run.errors[-1].fields["kind"] == "spot_interruption", text[-3000:]
    step = int(run.errors[-1].fields["step"])
    assert 20 <= step < 200 and run.done is None and run.rows[-1].step <= step
    # the checkpoint of that step: saved now (reason=spot), or at that very step's epoch end just before
    saved_now = re.findall(r"CLUSTERCTL-TRAIN checkpoint step=(\d+) .*reason=spot", text)
    assert saved_now in ([str(step)], []) and f"checkpoint step={step} " in text
    manifest = json.loads(cluster.node_exec(0, "cat", f"{folder}/ckpt-{32 * step}.manifest.json").stdout)
    # complete within one poll interval of the notice (plus the step in flight and the save itself)
    assert manifest["time"] - imds.noticed_at <= poll + 3.0, manifest["time"] - imds.noticed_at
    assert float(run.errors[-1].fields["at"]) >= manifest["time"]  # the stop after the checkpoint and its copies
    assert re.search(r"\[2\]<stdout>:CLUSTERCTL-TRAIN spot_notice rank=2 ", text)  # the member's first process saw it
    # copied to the member before anyone exited; rank 0 stopped by itself with status 8, the others with 0
    assert json.loads(cluster.node_exec(1, "cat", f"{folder}/ckpt-{32 * step}.manifest.json").stdout) == manifest
    assert cluster.node_exec(0, "cat", f"/root/.clusterctl/jobs/{job1}.exit").stdout.strip() != "0"
    codes = dict(re.findall(r"Process (\d+) exit with status code (-?\d+)", text))
    # (a rank still exiting when rank 0 is done may be ended by horovodrun: SIGTERM, or ssh's 255 for a member)
    assert codes.get("0") == "8" and set(codes.values()) <= {"8", "0", "143", "255"}, text[-2000:]
    st = cli("status")
    assert re.search(rf"training {job1}: failed \(spot_interruption", st.stdout), st.stdout

    # The member's instance is gone with the notice: its sshd stops answering (SIGSTOP: put back below, the
    # module's later tests use this cluster). The same command again: on a cluster not recorded as spot,
    # that node is an error (exit 5, nothing started); recorded as spot (as `up --spot` records it), it is
    # left out, named, and the run resumes on the leader alone from the spot checkpoint.
    imds.noticed_at = None
    member = cluster.hosts[1]
    sshd = node_pid(cluster.name, 1)
    record_path = cli.home / "clusters" / cluster.name / "cluster.json"
    record = record_path.read_text()
    os.kill(sshd, signal.SIGSTOP)
    try:
        refused = cli(*cmd, timeout=300)
        assert refused.returncode == 5, refused.stderr
        assert refused.stderr.strip().startswith(f"Error: 1 of 2 node(s) did not answer ({member}: "), refused.stderr
        assert "bring them back" in refused.stderr and "started training job" not in refused.stderr
        data = json.loads(record)
        data["cluster"]["extra"]["spot"] = "true"
        record_path.write_text(json.dumps(data))
        at = cmd.index("--max-steps") + 1  # 20 steps past where it resumes will do
        proc = cli(*cmd[:at], str(2 * step + 20), *cmd[at + 1 :], "--wait", timeout=900)
    finally:
        os.kill(sshd, signal.SIGCONT)
        record_path.write_text(record)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert re.search(
        rf"spot cluster: left out {re.escape(member)} \(.+\), unreachable .*training on 1 of 2 "
        rf"node\(s\), leader {re.escape(cluster.hosts[0])}",
        proc.stderr,
    ), proc.stderr
    run2 = train_log.parse_train_log(proc.stdout).current
    assert run2.start.size == 2 and run2.resumed_from.path == f"{folder}/ckpt-{32 * step}"  # the leader's 2 slots
    # half the global batch: the trainer carries on at the step that has seen as many images (not from scratch)
    changed = [
        {k: w.fields.get(k) for k in ("saved", "now", "step", "new_step")}
        for w in run2.warnings
        if w.fields.get("kind") == "global_batch_changed"
    ]
    assert changed == [{"saved": "32", "now": "16", "step": str(step), "new_step": str(2 * step)}], run2.warnings
    assert run2.start.start_step == run2.resumed_from.step == 2 * step and run2.done.step == 2 * step + 20
    assert "[2]<stdout>" not in proc.stdout  # no process on the member


def test_checkpoint_to_grants_the_nodes_role_write_on_that_prefix_only(monkeypatch):
    import boto3
    from moto.server import ThreadedMotoServer

    from clusterctl.providers.aws import iam as nodes_iam, provider as aws
    from clusterctl.types import Cluster

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        for k, v in (
            ("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}"),
            ("AWS_ACCESS_KEY_ID", KEY_ID),
            ("AWS_SECRET_ACCESS_KEY", SECRET),
            ("AWS_DEFAULT_REGION", "us-east-1"),
        ):
            monkeypatch.setenv(k, v)
        iam = boto3.client("iam")
        iam.create_role(RoleName="clusterctl-x-us-east-1", AssumeRolePolicyDocument=json.dumps(nodes_iam.EC2_TRUST))
        cluster = Cluster(
            name="x",
            provider="aws",
            nodes=(),
            region="us-east-1",
            instance_type="p3.2xlarge",
            created_at=0.0,
            extra={"instance_profile": "clusterctl-x-us-east-1"},
        )
        aws.AwsProvider(region="us-east-1").grant_checkpoint_write(cluster, "s3://ckpt-bucket/runs/r1")
        doc = iam.get_role_policy(RoleName="clusterctl-x-us-east-1", PolicyName="checkpoints-write")["PolicyDocument"]
        doc = json.loads(doc) if isinstance(doc, str) else doc
        assert doc["Statement"] == [
            {
                "Effect": "Allow",
                "Action": ["s3:PutObject", "s3:GetObject", "s3:DeleteObject", "s3:AbortMultipartUpload"],
                "Resource": ["arn:aws:s3:::ckpt-bucket/runs/r1/*"],
            },
            {
                "Effect": "Allow",
                "Action": ["s3:ListBucket"],
                "Resource": "arn:aws:s3:::ckpt-bucket",
                "Condition": {"StringLike": {"s3:prefix": ["runs/r1/*"]}},
            },
        ]
    finally:
        server.stop()


# ---- `data tfrecords --on leader`: where the images are -------------------------------------------------------
def test_data_tfrecords_on_the_leader_from_a_folder_there_or_s3(env, tmp_path):
    import os

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    from workload_support import imagenet_layout

    cluster, s3, endpoint, _ = env
    cli = cluster.cli
    leader_home = cluster.cli.home / "clusters" / cluster.name / "nodes" / "0" / "home"
    truth = imagenet_layout(leader_home / "imagenet", tf)  # on the leader only: never on this machine's disk
    csv = tmp_path / "LOC_val_solution.csv"
    csv.write_text("ImageId,PredictionString\n" + "".join(f"{k},{v} 1 2 3 4\n" for k, v in truth.items()))

    bad = cli("data", "tfrecords", "~/imagenet", "~/x", "--on", "member")
    assert bad.returncode == 2 and "only `--on leader`" in bad.stderr
    bad = cli("data", "tfrecords", f"s3://{BUCKET}/imgs", "x")
    assert bad.returncode == 2 and "needs --on leader" in bad.stderr
    # the flat val/ without labels: the leader's conversion says so in one line (exit 3), nothing written
    proc = cli("data", "tfrecords", "~/imagenet", "~/shards", "--on", "leader", timeout=600)
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("Error: /root/imagenet/val holds 7 images without class")

    proc = cli(
        "data",
        "tfrecords",
        "~/imagenet",
        "~/shards",
        "--on",
        "leader",
        "--val-labels",
        str(csv),
        "--train-shards",
        "2",
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    assert "/root/shards: 6 train image(s) in 2 shard(s), 7 validation image(s)" in proc.stderr, proc.stderr
    meta = json.loads(cluster.node_exec(0, "cat", "/root/shards/dataset.json").stdout)
    assert meta["splits"]["validation"]["examples"] == 7 and meta["num_classes"] == 3
    # ready for `sync leader:DIR DST`: every node gets it, verified
    proc = cli("sync", "leader:/root/shards", "/root/shards-all", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(cluster.node_exec(1, "cat", "/root/shards-all/dataset.json").stdout)["splits"] == meta["splits"]

    # from S3, through the leader's own credentials: the same dataset
    for p in (leader_home / "imagenet").rglob("*"):
        if p.is_file():
            s3.put_object(Bucket=BUCKET, Key=f"imgs/{p.relative_to(leader_home / 'imagenet')}", Body=p.read_bytes())
    proc = cli(
        "data",
        "tfrecords",
        f"s3://{BUCKET}/imgs",
        "~/shards3",
        "--on",
        "leader",
        "--val-labels",
        str(csv),
        "--train-shards",
        "2",
        "--endpoint-url",
        endpoint,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    assert "pulled 14 object(s)" in proc.stderr  # 6 train, 7 val, the LICENSE
    meta3 = json.loads(cluster.node_exec(0, "cat", "/root/shards3/dataset.json").stdout)
    assert meta3["splits"] == meta["splits"]
    left = cluster.node_exec(
        0, "sh", "-c", "ls -a /root | grep -c source; ls /root/clusterctl-jobs | grep -c data-; true"
    )
    assert left.stdout.split() == ["0", "0"], left.stdout  # the pulled objects and the job folder are gone


def test_on_a_spot_aws_cluster_train_grants_the_prefix_and_the_record_says_spot(aws, aws_cli):
    """End to end against moto: `up --spot` records it (train then polls the notice), and `train --checkpoint-to`
    gives the cluster's own role its policy before anything starts (here the data is missing, so nothing does)."""
    proc = aws_cli(*aws_cli.up_args("ckspot", 2, "--spot"))
    assert proc.returncode == 0, proc.stderr
    record = json.loads((aws_cli.cli.home / "clusters" / "ckspot" / "cluster.json").read_text())["cluster"]
    assert record["extra"]["spot"] == "true"
    role = record["extra"]["instance_profile"]
    proc = aws_cli("train", "--data", "/root/none", "--model", "tiny", "--checkpoint-to", "s3://ck-bucket/runs/a")
    assert proc.returncode == 3 and "the data /root/none is not ready on every node" in proc.stderr, proc.stderr
    doc = aws.client("iam").get_role_policy(RoleName=role, PolicyName="checkpoints-write")["PolicyDocument"]
    doc = json.loads(doc) if isinstance(doc, str) else doc
    assert doc["Statement"][0]["Resource"] == ["arn:aws:s3:::ck-bucket/runs/a/*"]
    assert doc["Statement"][1]["Condition"] == {"StringLike": {"s3:prefix": ["runs/a/*"]}}
    assert aws_cli("down", "ckspot", "--yes").returncode == 0
