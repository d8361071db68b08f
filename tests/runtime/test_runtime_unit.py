"""The node runtime's pure parts: its id, the platform probe's parser, the scripts' argv, the S3 cache commands."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from clusterctl.errors import UsageError
from clusterctl.runtime import spec as rt
from clusterctl.runtime.install import RuntimeRequest, record
from clusterctl.runtime.s3cache import fetch_command, put_command

DEBIAN = rt.Platform(os="debian 12", arch="x86_64", python="3.11.2", python_path="/usr/bin/python3.11")
DLAMI = rt.Platform(
    os="ubuntu 22.04",
    arch="x86_64",
    python="3.10.12",
    python_path="/usr/bin/python3.10",
    cuda="13.0",
    compute_caps=("7.0", "7.0"),
    toolkits=("/usr/local/cuda-12.8", "/usr/local/cuda-13.0"),
)


def test_id_is_stable_and_changes_with_every_input():
    rid = rt.runtime_id(rt.RuntimeSpec(), DEBIAN)
    assert rid == rt.runtime_id(rt.RuntimeSpec(), dataclasses.replace(DEBIAN))
    assert len(rid) == 16 and int(rid, 16) >= 0
    variants = [
        rt.runtime_id(rt.RuntimeSpec(gpu=True), DEBIAN),
        rt.runtime_id(rt.RuntimeSpec(horovod="0.28.0"), DEBIAN),
        rt.runtime_id(rt.RuntimeSpec(recipe=rt.RECIPE + 1), DEBIAN),
        *(
            rt.runtime_id(rt.RuntimeSpec(), dataclasses.replace(DEBIAN, **{k: v}))
            for k, v in (
                ("os", "debian 13"),
                ("arch", "aarch64"),
                ("python", "3.11.9"),
                ("cuda", "12.2"),
                ("python_path", "/usr/local/bin/python3.11"),
            )
        ),
    ]
    assert rid not in variants and len(set(variants)) == len(variants)


def test_gpu_and_cpu_builds():
    cpu, gpu = rt.RuntimeSpec.for_platform(DEBIAN), rt.RuntimeSpec.for_platform(DLAMI)
    assert cpu.requirements[0] == "tensorflow-cpu==2.15.1"
    assert gpu.requirements[0] == "tensorflow[and-cuda]==2.15.1"
    assert cpu.horovod_requirement == gpu.horovod_requirement == "horovod==0.28.1"
    cpu_env = {
        "HOROVOD_WITH_TENSORFLOW": "1",
        "HOROVOD_WITH_GLOO": "1",
        "HOROVOD_WITHOUT_PYTORCH": "1",
        "HOROVOD_WITHOUT_MXNET": "1",
        "HOROVOD_WITHOUT_MPI": "1",
    }
    assert cpu == rt.RuntimeSpec() and cpu.cuda_build is None
    env = rt.Build("r", gpu, DLAMI, "out").horovod_env
    assert env["HOROVOD_GPU_OPERATIONS"] == "NCCL" and env["HOROVOD_WITH_GLOO"] == "1"
    assert env["HOROVOD_CUDA_HOME"] == "/usr/local/cuda-12.8" and env["HOROVOD_BUILD_CUDA_CC_LIST"] == "70"
    assert env["HOROVOD_NCCL_HOME"] == "/opt/clusterctl-runtime/r/lib/python3.10/site-packages/nvidia/nccl"
    assert rt.Build("r", cpu, DEBIAN, "out").horovod_env == cpu_env
    assert any(r.startswith("boto3==") for r in cpu.requirements)
    assert not DEBIAN.gpu and DLAMI.gpu


def test_platform_probe_parses_what_the_shell_prints():
    out = subprocess.run(["sh", "-c", rt.PLATFORM_PROBE], capture_output=True, text=True, check=True).stdout
    p = rt.parse_platform(out)
    assert p is not None and p.arch and p.os and p.python.count(".") == 2 and p.python_path.startswith("/")
    assert p.cuda == "none"  # no nvidia-smi here
    assert (
        rt.parse_platform(
            "os=ubuntu 22.04\narch=x86_64\npython_path=/usr/bin/python3.10\npython=3.10.12\ncuda=13.0\n"
            "compute_cap=7.0\ntoolkit=/usr/local/cuda-13.0\ncompute_cap=7.0\ntoolkit=/usr/local/cuda-12.8\n"
        )
        == DLAMI
    )
    assert rt.parse_platform("os=debian 12\narch=x86_64\ncuda=none\n") is None  # no python3: no runtime


def test_build_argv_golden():
    b = rt.Build(
        "abcdef0123456789",
        rt.RuntimeSpec(),
        DEBIAN,
        ".clusterctl/runtime/incoming/abcdef0123456789",
        find_links="http://10.0.0.1:8000/wheels/",
        no_index=False,
    )
    argv = rt.build_argv("S.sh", b)
    assert argv[:8] == [
        "bash",
        "S.sh",
        "abcdef0123456789",
        "/usr/bin/python3.11",
        ".clusterctl/runtime/incoming/abcdef0123456789",
        "tensorflow-cpu==2.15.1 boto3==1.44.5 setuptools==80.10.2 wheel==0.48.0",
        "horovod==0.28.1",
        "HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITHOUT_PYTORCH=1 "
        "HOROVOD_WITH_GLOO=1 HOROVOD_WITH_TENSORFLOW=1",
    ]
    assert argv[8:10] == ["http://10.0.0.1:8000/wheels/", "0"]
    info = json.loads(argv[10])
    assert info["id"] == "abcdef0123456789" and info["python"] == "/opt/clusterctl-runtime/abcdef0123456789/bin/python"
    assert info["platform"]["python_path"] == "/usr/bin/python3.11" and info["spec"]["gpu"] is False
    gpu = rt.build_argv("S.sh", dataclasses.replace(b, spec=rt.RuntimeSpec.for_platform(DLAMI), platform=DLAMI))
    assert gpu[5].startswith("tensorflow[and-cuda]==2.15.1 ") and "HOROVOD_GPU_OPERATIONS=NCCL" in gpu[7]
    # DALI in the GPU runtime (and so in its id); its TensorFlow plugin is the last step, the CPU runtime has none.
    assert "nvidia-dali-cuda120==2.4.0" in gpu[5] and "nvidia-cuda-nvcc" not in gpu[5]
    assert gpu[11].startswith("nvidia-nccl-cu12==") and argv[11] == ""  # NCCL on GPU nodes only
    assert gpu[12] == "nvidia-dali-tf-plugin-cuda120==2.4.0" and argv[12] == ""
    dali_cpu = rt.RuntimeSpec.for_platform(DEBIAN, dali=True)
    assert dali_cpu.requirements[-3:] == (
        "nvidia-dali-cuda120==2.4.0",
        "nvidia-cuda-runtime-cu12==12.2.140",
        "nvidia-cuda-nvcc-cu12==12.2.140",
    )
    ids = {rt.runtime_id(s, DEBIAN) for s in (rt.RuntimeSpec(), dali_cpu)}
    assert len(ids) == 2 and rt.runtime_id(rt.RuntimeSpec.for_platform(DEBIAN), DEBIAN) in ids
    assert rt.shell(rt.install_argv("i.sh", "abcdef0123456789", "in dir")) == "bash i.sh abcdef0123456789 'in dir'"


def test_requests_and_records():
    assert record(RuntimeRequest("none")).extra() == {"runtime": "none"}
    assert record(RuntimeRequest("own", python="/opt/conda/bin/python")).extra() == {
        "runtime": "own",
        "python": "/opt/conda/bin/python",
    }
    with pytest.raises(UsageError):
        RuntimeRequest("own", python="python3")
    with pytest.raises(UsageError):
        RuntimeRequest("install", cache="https://bucket/x")


def test_cache_commands_quote_and_finish_with_the_info():
    urls = {
        rt.PACK: "http://127.0.0.1:5000/b/p/r/runtime.tar.zst?X-Amz-Signature=a&b=c",
        rt.INFO: "http://127.0.0.1:5000/b/p/r/runtime.json?X-Amz-Signature=d",
    }
    fetch = fetch_command(urls, "out dir", {rt.PACK: "a" * 64, rt.INFO: "b" * 64})
    assert fetch.index("runtime.tar.zst.partial") < fetch.index("runtime.json.partial")  # the info last
    assert "'http://127.0.0.1:5000/b/p/r/runtime.tar.zst?X-Amz-Signature=a&b=c'" in fetch and "'out dir'" in fetch
    put = put_command(urls, "out")
    assert put.index(rt.PACK) < put.index(rt.INFO) and "-X PUT -T out/runtime.json" in put


def test_requirements_entry_point_lists_horovod_last():
    out = subprocess.run(
        [sys.executable, "-m", "clusterctl.runtime", "requirements"], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out[0] == "tensorflow-cpu==2.15.1" and out[-1] == "horovod==0.28.1"
    gpu = subprocess.run(
        [sys.executable, "-m", "clusterctl.runtime", "requirements", "--gpu"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert gpu[0] == "tensorflow[and-cuda]==2.15.1"
    bad = subprocess.run([sys.executable, "-m", "clusterctl.runtime", "nonsense"], capture_output=True, text=True)
    assert bad.returncode == 2 and "usage" in bad.stderr
