"""The node runtime on an AWS cluster, end to end: moto's EC2 and S3 behind namespace instances whose base OS
has no TensorFlow. The leader builds the runtime (from a wheel mirror it reaches, as a VPC's nodes reach PyPI),
packs it, puts it in the S3 cache through presigned URLs, relays it to the members; a second cluster takes it
from the cache and builds nothing. Then doctor, the synthetic ladder across 2 nodes x 2 slots, and down.
"""

from __future__ import annotations

import functools
import hashlib
import json
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest

from clusterctl import paths
from conftest import Forward
from workload_support import HELPER, RANK_LINE, SCRIPT

pytestmark = [pytest.mark.integration, pytest.mark.horovod]

WHEELHOUSE = paths.wheelhouse()  # install.sh's
BUCKET = "cc-runtime-cache"


@pytest.fixture
def mirror(aws):
    """The wheelhouse over HTTP and S3 through a forwarder, both on the address every backed node routes to."""
    assert any(WHEELHOUSE.glob("horovod-*.whl")), "run ./install.sh deps: it builds the wheelhouse"
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(WHEELHOUSE))
    handler.log_message = lambda *a: None  # type: ignore[method-assign]  # quiet server
    http = ThreadingHTTPServer((aws.mirror_address, 0), handler)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    port = int(aws.endpoint.rsplit(":", 1)[1].strip("/"))
    s3 = Forward((aws.mirror_address, 0), ("127.0.0.1", port))
    aws.client("s3").create_bucket(Bucket=BUCKET)
    yield f"http://{aws.mirror_address}:{http.server_address[1]}/", f"http://{aws.mirror_address}:{s3.port}"
    http.shutdown()
    s3.close()


def _record(cli, name: str) -> dict:
    return json.loads((cli.home / "clusters" / name / "cluster.json").read_text())["cluster"]["extra"]


def test_leader_builds_caches_relays_and_a_second_cluster_reuses(aws, aws_cli, mirror):
    wheels, endpoint = mirror
    env = {"AWS_ENDPOINT_URL": endpoint}
    args = (
        "--type",
        "c5.xlarge",
        "--slots",
        "2",
        "--runtime",
        "install",
        "--runtime-wheels",
        wheels,
        "--runtime-cache",
        f"s3://{BUCKET}/runtimes",
    )
    # Each cluster in its own half of the test's range: the fixture's bridges for a subnet outlive its cluster.
    halves = list(aws.owned.subnets(new_prefix=17))
    first = aws_cli(*aws_cli.up_args("rta", 2, *args, "--cidr", str(halves[0])), env=env, timeout=1500)
    assert first.returncode == 0, first.stdout + first.stderr
    out = first.stderr
    assert "plan: node runtime: TensorFlow 2.15.1 + Horovod 0.28.1" in out
    assert "building on the leader" in out and f"with wheels from {wheels}" in out, out
    rid = _record(aws_cli.cli, "rta")["runtime"]
    assert f"cached at s3://{BUCKET}/runtimes/{rid}/" in out, out
    assert "unpacked and verified on 2 node(s)" in out
    keys = {o["Key"] for o in aws.client("s3").list_objects_v2(Bucket=BUCKET)["Contents"]}
    assert keys == {f"runtimes/{rid}/runtime.tar.zst", f"runtimes/{rid}/runtime.json"}
    # this machine holds the digests of what it cached (a later fetch must find exactly these)
    held = json.loads((aws_cli.cli.home / "runtime-cache.json").read_text())[f"s3://{BUCKET}/runtimes/{rid}/"]
    s3 = aws.client("s3")
    assert held == {
        n: hashlib.sha256(s3.get_object(Bucket=BUCKET, Key=f"runtimes/{rid}/{n}")["Body"].read()).hexdigest()
        for n in ("runtime.tar.zst", "runtime.json")
    }

    cli = aws_cli.cli
    doctor = cli("doctor", "--cluster", "rta", "--json", env=aws.env(**env))
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert {n["cells"]["runtime"]["why"] for n in json.loads(doctor.stdout)["nodes"]} == {rid}
    # the user's own TF2 Keras + Horovod script: 4 ranks on 2 nodes, each running the runtime's Python
    (cli.cwd / "my_train.py").write_text(SCRIPT)
    (cli.cwd / "helper.py").write_text(HELPER)
    launch = cli(
        "launch",
        "--cluster",
        "rta",
        "--file",
        "helper.py",
        "--name",
        "own",
        "--attach",
        "--",
        "python",
        "my_train.py",
        "--steps",
        "2",
        env=aws.env(**env),
        timeout=600,
    )
    assert launch.returncode == 0, launch.stdout[-3000:] + launch.stderr[-3000:]
    ranks = {int(m.group(1)): m.groups()[1:] for m in RANK_LINE.finditer(launch.stdout)}
    assert sorted(ranks) == [0, 1, 2, 3], launch.stdout[-3000:]
    assert len({host for _s, host, _p in ranks.values()}) == 2
    assert {py for _s, _h, py in ranks.values()} == {f"/opt/clusterctl-runtime/{rid}/bin/python"}

    down = aws_cli("down", "rta", "--yes", env=env, timeout=600)
    assert down.returncode == 0, down.stdout + down.stderr
    assert aws.sweep("rta") == []

    second = aws_cli(*aws_cli.up_args("rtb", 1, *args, "--cidr", str(halves[1])), env=env, timeout=900)
    assert second.returncode == 0, second.stdout + second.stderr
    assert f"fetching from the cache s3://{BUCKET}/runtimes/{rid}/" in second.stderr, second.stderr
    assert "building on the leader" not in second.stderr
    assert _record(cli, "rtb")["runtime"] == rid
    down = aws_cli("down", "rtb", "--yes", env=env, timeout=600)
    assert down.returncode == 0, down.stdout + down.stderr
    assert aws.sweep("rtb") == []


def test_the_plan_shows_the_gpu_build_and_refuses_images_it_cannot_build_on(aws, aws_cli):
    """Dry runs only: the choice of toolkit and compute capabilities from the DLAMI table and the type's GPUs,
    and the images refused before anything is launched (CUDA 13 only; Ubuntu 24.04's python3 3.12)."""
    proc = aws_cli("up", "--nodes", "1", "--type", "p3.16xlarge", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert (
        "plan: node runtime: TensorFlow 2.15.1 + Horovod 0.28.1 + DALI 2.4.0 at /opt/clusterctl-runtime/<id> on every node; "
        "Horovod built with CUDA 12.8 (/usr/local/cuda-12.8) for sm_70, NCCL 2.30.7 (nvidia-nccl-cu12), "
        "not the image's default CUDA 13.0"
    ) in proc.stderr
    proc = aws_cli("up", "--nodes", "1", "--type", "p4d.24xlarge", "--dry-run")
    assert "for sm_80, NCCL 2.30.7 (nvidia-nccl-cu12), not the image's default CUDA 13.2" in proc.stderr
    proc = aws_cli("up", "--nodes", "1", "--type", "c5.xlarge", "--dry-run")
    assert proc.returncode == 0 and "plan: node runtime: TensorFlow" in proc.stderr and "sm_" not in proc.stderr

    ec2 = aws.client("ec2")
    noble = ec2.register_image(
        Name="Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 24.04) 20261008", RootDeviceName="/dev/sda1"
    )["ImageId"]
    launches = len(aws.actions("RunInstances"))  # the dry runs' above
    proc = aws_cli("up", "--nodes", "1", "--type", "p4d.24xlarge", "--ami", noble, "--dry-run")
    assert proc.returncode == 4, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("Error:")]
    assert errors == [
        "Error: the image's python3 is 3.12: TensorFlow 2.15.1 (the newest Horovod 0.28.1 runs with) has wheels for "
        "Python 3.9, 3.10, 3.11 only: use an Ubuntu 22.04 Deep Learning Base OSS Nvidia Driver AMI (the default; it "
        "keeps /usr/local/cuda-12.8 and -12.9 beside CUDA 13), or --runtime none / --python PATH with your own "
        "TensorFlow and Horovod"
    ], proc.stderr
    assert len(aws.actions("RunInstances")) == launches  # refused before the dry run's launch
    proc = aws_cli("up", "--nodes", "1", "--type", "p4d.24xlarge", "--ami", noble, "--runtime", "none", "--dry-run")
    assert proc.returncode == 0 and "plan: node runtime: none" in proc.stderr  # the way out works
