"""clusterctl.workloads.horovod without running anything: argv golden strings, the scrubbed environment, the parser
against a log captured from a real 2-process horovodrun run (tests/data/bench_tiny_np2.log)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from clusterctl.hostsfile import HostsFile
from clusterctl.types import Cluster, Node
from clusterctl.workloads.horovod import (
    BenchHost,
    BenchInterval,
    DeviceReport,
    device_problems,
    gpus_per_node,
    horovodrun_argv,
    is_secret_env,
    parse_bench_output,
    parse_devices,
    scrubbed_env,
)
from conftest import FIXTURES, REPO

PY = "/opt/clusterctl/venv/bin/python"
SCRIPT = [PY, "bench_synthetic.py", "--model", "tiny", "--expect-size", "4"]


# ---- argv ------------------------------------------------------------------------------------------
def test_argv_hostfile_path_golden():
    argv = horovodrun_argv(4, Path("/tmp/job/hosts"), SCRIPT)
    assert " ".join(argv) == (
        "horovodrun -np 4 --hostfile /tmp/job/hosts --gloo --disable-cache --start-timeout 60 "
        "/opt/clusterctl/venv/bin/python bench_synthetic.py --model tiny --expect-size 4"
    )


def test_argv_hostsfile_object_and_every_option_golden():
    hosts = HostsFile.parse("10.0.0.4 slots=2\n10.0.0.5 slots=2\n")
    argv = horovodrun_argv(
        4,
        hosts,
        SCRIPT,
        gloo=False,
        network_interface=["eth0", "eth1"],
        extra_env={"NCCL_DEBUG": "INFO", "FI_PROVIDER": "efa"},
        disable_cache=False,
        ssh_port=2222,
        ssh_identity_file=Path("/root/.clusterctl/keys/c1"),
        start_timeout=90,
        horovodrun="/opt/clusterctl/venv/bin/horovodrun",
    )
    assert argv == [
        "env",
        "NCCL_DEBUG=INFO",
        "FI_PROVIDER=efa",
        "/opt/clusterctl/venv/bin/horovodrun",
        "-np",
        "4",
        "-H",
        "10.0.0.4:2,10.0.0.5:2",
        "--mpi",
        "--network-interfaces",
        "eth0,eth1",
        "-p",
        "2222",
        "--ssh-identity-file",
        "/root/.clusterctl/keys/c1",
        "--start-timeout",
        "90",
        *SCRIPT,
    ]


def test_argv_h_string_golden():
    argv = horovodrun_argv(2, "localhost:2", ["python", "x.py"], network_interface="lo")
    assert argv == [
        "horovodrun",
        "-np",
        "2",
        "-H",
        "localhost:2",
        "--gloo",
        "--disable-cache",
        "--network-interfaces",
        "lo",
        "--start-timeout",
        "60",
        "python",
        "x.py",
    ]


@pytest.mark.parametrize(
    "hosts, message",
    [
        ("hosts.txt", "is not HOST:SLOTS"),  # a str is never taken for a path
        ("a:2,-oProxyCommand=x:1", "starts with '-'"),
        ("a;id:2", "shell metacharacter"),
        ("a:0", "is not HOST:SLOTS"),
    ],
)
def test_argv_rejects_bad_h_strings(hosts, message):
    with pytest.raises(ValueError, match=message):
        horovodrun_argv(2, hosts, ["python", "x.py"])


def test_argv_refuses_secrets_in_extra_env_and_bad_input():
    with pytest.raises(ValueError, match="AWS_SECRET_ACCESS_KEY looks like a credential"):
        horovodrun_argv(1, "a:1", ["p"], extra_env={"AWS_SECRET_ACCESS_KEY": "x"})
    with pytest.raises(ValueError, match="not a valid environment variable name"):
        horovodrun_argv(1, "a:1", ["p"], extra_env={"A B": "x"})
    with pytest.raises(ValueError, match="script_argv is empty"):
        horovodrun_argv(1, "a:1", [])
    with pytest.raises(ValueError, match="not the option"):
        horovodrun_argv(1, "a:1", ["--verbose", "p"])
    with pytest.raises(ValueError, match="positive whole number"):
        horovodrun_argv(0, "a:1", ["p"])


# ---- environment -----------------------------------------------------------------------------------
def test_scrubbed_env_drops_credentials_keeps_what_ranks_need():
    env = {
        "PATH": "/opt/clusterctl/venv/bin:/usr/bin",
        "HOME": "/root",
        "LANG": "C.UTF-8",
        "PYTHONPATH": "/srv/lib",
        "PWD": "/srv/job",
        "NCCL_SOCKET_IFNAME": "eth0",
        "TOKENIZERS_PARALLELISM": "false",
        "CUDA_VISIBLE_DEVICES": "0,1",
        "AWS_ACCESS_KEY_ID": "AKIAIOSFODNN7EXAMPLE",
        "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        "AWS_SESSION_TOKEN": "x",
        "AWS_PROFILE": "prod",
        "GITHUB_TOKEN": "x",
        "HF_TOKEN": "x",
        "MY_SECRET_THING": "x",
        "DB_PASSWORD": "x",
        "OPENAI_API_KEY": "x",
        "SSH_AUTH_SOCK": "/tmp/ssh-xyz/agent.1",
        "GOOGLE_APPLICATION_CREDENTIALS": "/k.json",
        "DATABASE_URL": "postgres://user:hunter2@db:5432/x",
        "INNOCENT_NAME": "AKIAIOSFODNN7EXAMPLE",
        "DEPLOY_PEM": "-----BEGIN OPENSSH PRIVATE KEY-----\nabc",
        "GHTOKEN": "x",
    }
    assert scrubbed_env(env) == {
        "PATH": "/opt/clusterctl/venv/bin:/usr/bin",
        "HOME": "/root",
        "LANG": "C.UTF-8",
        "PYTHONPATH": "/srv/lib",
        "PWD": "/srv/job",
        "NCCL_SOCKET_IFNAME": "eth0",
        "TOKENIZERS_PARALLELISM": "false",
        "CUDA_VISIBLE_DEVICES": "0,1",
    }


def test_is_secret_env_by_value_alone():
    assert is_secret_env("X", "ghp_" + "a" * 36)
    assert is_secret_env("X", "https://bob:pw@example.com/repo.git")
    assert not is_secret_env("X", "https://example.com/repo.git")
    assert not is_secret_env("HOROVOD_GLOO_TIMEOUT_SECONDS", "30")


# ---- parser ----------------------------------------------------------------------------------------
def test_parse_captured_real_run():
    text = (FIXTURES / "bench_tiny_np2.log").read_text()
    run = parse_bench_output(text)
    assert run.size == 2
    assert run.model == "tiny" and run.batch == 32
    assert run.img_per_sec > 0
    assert run.img_per_sec_per_proc == pytest.approx(run.img_per_sec / 2, rel=0.01)
    assert [i.step for i in run.intervals] == [10, 20]
    assert all(isinstance(i, BenchInterval) and i.size == 2 and i.img_per_sec > 0 for i in run.intervals)
    assert [h.rank for h in run.hosts] == [0, 1]
    assert [h.local_rank for h in run.hosts] == [0, 1]
    assert all(isinstance(h, BenchHost) and h.name and h.img_per_sec > 0 for h in run.hosts)
    assert sum(h.img_per_sec for h in run.hosts) == pytest.approx(run.img_per_sec, rel=0.01)
    assert list(run.per_node().values()) == [pytest.approx(run.img_per_sec, rel=0.01)]


def test_parse_tolerates_prefixes_and_noise():
    text = "\n".join(
        [
            "2024-01-01 12:00:00.1: W tensorflow/core/foo.cc:1] noise",
            "[1,0]<stdout>:CLUSTERCTL-BENCH interval step=10 img_per_sec=100.50 size=2",
            "Mon Jan  1 12:00:01 2024[0]<stdout>:CLUSTERCTL-BENCH host rank=0 name=n-0 local_rank=0 img_per_sec=50.25",
            "[0]<stdout>:CLUSTERCTL-BENCH host rank=1 name=n-1 local_rank=0 img_per_sec=50.25\r",
            "[0]<stderr>:something else",
            "CLUSTERCTL-BENCH result size=2 img_per_sec=100.50 img_per_sec_per_proc=50.25 model=resnet50 batch=64",
        ]
    )
    run = parse_bench_output(text)
    assert run.intervals == (BenchInterval(step=10, img_per_sec=100.5, size=2),)
    assert run.hosts[1] == BenchHost(rank=1, name="n-1", local_rank=0, img_per_sec=50.25)
    assert (run.size, run.model, run.batch) == (2, "resnet50", 64)
    assert run.per_node() == {"n-0": 50.25, "n-1": 50.25}


def test_parse_errors_are_clear():
    with pytest.raises(ValueError, match="no 'CLUSTERCTL-BENCH result' line"):
        parse_bench_output("Traceback (most recent call last):\n  garbage\n")
    with pytest.raises(ValueError, match="reported an error and no result: kind=size_mismatch size=2 expected=4"):
        parse_bench_output("[0]<stdout>:CLUSTERCTL-BENCH error kind=size_mismatch size=2 expected=4\n")
    with pytest.raises(ValueError, match="line 1: img_per_sec='fast' is not a float"):
        parse_bench_output("CLUSTERCTL-BENCH interval step=1 img_per_sec=fast size=2\n")
    with pytest.raises(ValueError, match="line 2: result line has no batch="):
        parse_bench_output("x\nCLUSTERCTL-BENCH result size=2 img_per_sec=1 img_per_sec_per_proc=1 model=m\n")
    line = "CLUSTERCTL-BENCH result size=1 img_per_sec=1 img_per_sec_per_proc=1 model=m batch=1\n"
    with pytest.raises(ValueError, match="a second result line"):
        parse_bench_output(line + line)


def test_import_stays_cheap():
    # `clusterctl --help` imports this module: it must not pull in TensorFlow or Horovod.
    code = "import sys, clusterctl.workloads.horovod; print(sorted(m for m in ('tensorflow', 'horovod') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]"


# ---- which GPU each rank used (templates' `device` lines) --------------------------------------------


def _devices(*rows: str, mark: str = "CLUSTERCTL-BENCH") -> str:
    return "".join(f"[0]<stdout>:{mark} device {row}\n" for row in rows)


GOOD_2x2 = _devices(
    "rank=0 host=node-0 local_rank=0 gpus=0 logical=1",
    "rank=1 host=node-0 local_rank=1 gpus=1 logical=1",
    "rank=2 host=node-1 local_rank=0 gpus=0 logical=1",
    "rank=3 host=node-1 local_rank=1 gpus=1 logical=1",
)


def test_parse_devices_reads_every_rank_past_any_prefix():
    reps = parse_devices("TF noise\n" + GOOD_2x2)
    assert reps == (
        DeviceReport(0, "node-0", 0, ("0",), 1),
        DeviceReport(1, "node-0", 1, ("1",), 1),
        DeviceReport(2, "node-1", 0, ("0",), 1),
        DeviceReport(3, "node-1", 1, ("1",), 1),
    )


def test_parse_devices_cpu_uuid_quoted_and_last_launch_only():
    first = _devices("rank=0 host=a local_rank=0 gpus=0 logical=1", mark="CLUSTERCTL-TRAIN")
    second = _devices(
        "rank=0 host=a local_rank=0 gpus=none logical=0",
        "rank=1 host=a local_rank=1 gpus='GPU-1a2b,GPU-3c4d' logical=2",
        mark="CLUSTERCTL-TRAIN",
    )
    reps = parse_devices(first + "CLUSTERCTL-TRAIN done step=1\n" + second, "CLUSTERCTL-TRAIN")
    assert reps == (DeviceReport(0, "a", 0, (), 0), DeviceReport(1, "a", 1, ("GPU-1a2b", "GPU-3c4d"), 2))
    assert parse_devices(GOOD_2x2, "CLUSTERCTL-TRAIN") == ()  # another template's mark is not read


def test_parse_devices_malformed_lines_raise():
    with pytest.raises(ValueError, match="device line has no logical="):
        parse_devices(_devices("rank=0 host=a local_rank=0 gpus=0"))
    with pytest.raises(ValueError, match="not a number"):
        parse_devices(_devices("rank=zero host=a local_rank=0 gpus=0 logical=1"))
    with pytest.raises(ValueError, match="malformed device line"):
        parse_devices(_devices("rank=0 host=a local_rank=0 gpus=0 logical=1 oops"))


def test_judge_passes_one_gpu_per_rank_and_never_fires_without_gpus():
    assert device_problems(parse_devices(GOOD_2x2), 4, 8) == []
    cpu_only = parse_devices(
        GOOD_2x2.replace("gpus=0 logical=1", "gpus=none logical=0").replace("gpus=1 logical=1", "gpus=none logical=0")
    )
    assert device_problems(cpu_only, 4, 0) == []  # local nodes, CPU types: nothing to prove


def test_judge_names_the_node_and_ranks_on_the_cpu():
    text = GOOD_2x2.replace(
        "rank=3 host=node-1 local_rank=1 gpus=1 logical=1", "rank=3 host=node-1 local_rank=1 gpus=none logical=0"
    )
    problems = device_problems(parse_devices(text), 4, 8)
    assert len(problems) == 1 and problems[0].startswith("node-1: rank(s) 3 ran on the CPU")


def test_judge_names_ranks_sharing_a_gpu_and_the_slots_hint():
    text = GOOD_2x2.replace("rank=1 host=node-0 local_rank=1 gpus=1", "rank=1 host=node-0 local_rank=1 gpus=0")
    assert device_problems(parse_devices(text), 4, 8) == ["node-0: ranks 0, 1 share GPU 0"]
    # more processes than the node has GPUs: the template wraps round, and the hint says why
    assert device_problems(parse_devices(text), 4, 1) == [
        "node-0: ranks 0, 1 share GPU 0; 2 processes on a node with 1 GPU(s): give it at most 1 slots"
    ]
    # the same GPU number on two nodes is two GPUs
    assert device_problems(parse_devices(GOOD_2x2), 4, 2) == []


def test_judge_missing_ranks_and_a_logical_count_of_zero():
    reps = parse_devices(GOOD_2x2)[:3]
    assert device_problems(reps, 4, 8) == ["rank(s) 3 of 4 reported no device (a template older than clusterctl?)"]
    odd = (DeviceReport(0, "n", 0, ("0",), 0),)
    assert device_problems(odd, 1, 8)[0].startswith("n: rank(s) 0 ran on the CPU")


def test_bench_output_carries_the_device_lines():
    text = (
        GOOD_2x2 + "[0]<stdout>:CLUSTERCTL-BENCH result size=4 img_per_sec=100.0 img_per_sec_per_proc=25.0 "
        "model=tiny batch=32\n"
    )
    run = parse_bench_output(text)
    assert len(run.devices) == 4 and device_problems(run.devices, run.size, 8) == []


def test_gpus_per_node_by_cluster_type():
    node = (Node("n0", "10.0.0.4", 8, "leader"),)
    assert gpus_per_node(None) == 0
    assert gpus_per_node(Cluster("l", "local", node)) == 0
    assert gpus_per_node(Cluster("a", "aws", node, instance_type="p3.16xlarge")) == 8
    assert gpus_per_node(Cluster("a", "aws", node, instance_type="g4dn.12xlarge")) == 4
    assert gpus_per_node(Cluster("a", "aws", node, instance_type="c5.xlarge")) == 0
    assert gpus_per_node(Cluster("a", "aws", node, instance_type="c5.xlarge", extra={"gpus": "2"})) == 2
