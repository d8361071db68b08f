"""Horovod's GPU build: which CUDA toolkit and compute capabilities (pure), the probe on a stand-in image layout
(CUDA 12.8 and 13.0 side by side, a stand-in nvidia-smi), and the real build script run against that layout with
stand-ins for python and pip that record the build's environment and command lines."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from clusterctl import resources
from clusterctl.errors import ProvisionError
from clusterctl.providers.base import ImageFacts
from clusterctl.runtime import gpu, spec as rt
from clusterctl.runtime.install import RuntimeRequest, plan_line

DLAMI_2026 = ["/usr/local/cuda-12.8", "/usr/local/cuda-12.9", "/usr/local/cuda-13.0", "/usr/local/cuda-13.2"]


def test_the_toolkit_is_cuda_12_closest_to_tensorflows_and_never_13():
    b = gpu.choose(DLAMI_2026, ["7.0"] * 8)
    assert (b.cuda, b.home, b.cc, b.nccl) == ("12.8", "/usr/local/cuda-12.8", (70,), gpu.NCCL)
    assert gpu.choose(["/usr/local/cuda-12.1", "/usr/local/cuda-12.4", "/usr/local/cuda-12.9"], ["8.0"]).cuda == "12.4"
    assert gpu.choose(["/usr/local/cuda-12.0", "/usr/local/cuda-12.1"], ["8.6"]).cuda == "12.1"  # newest below 12.2
    assert gpu.choose(DLAMI_2026, ["8.0", "7.0", "9.0", "8.0"]).cc == (70, 80, 90)
    assert gpu.choose(["/usr/local/cuda-12.4", "/usr/local/cuda-12.8"], ["10.0"]).cuda == "12.8"  # Blackwell: 12.8+
    assert gpu.choose(["/opt/x/cuda-12.8", "/usr/local/cuda", "/usr/local/cuda-x"], ["7.5"]).home == "/opt/x/cuda-12.8"


@pytest.mark.parametrize(
    "toolkits, caps, words",
    [
        (["/usr/local/cuda-13.0", "/usr/local/cuda-13.2"], ["7.0"], "no CUDA 12 toolkit"),
        ([], ["8.0"], "found: none"),
        (["/usr/local/cuda-12.4"], ["10.0"], "compute capability 100"),
        (["/usr/local/cuda-12.8"], ["3.7"], "compute capability 37"),
        (["/usr/local/cuda-12.8"], [], "did not report"),
        (["/usr/local/cuda-12.8"], ["7"], "not MAJOR.MINOR"),
    ],
)
def test_images_it_cannot_build_on_are_refused_with_the_way_out(toolkits, caps, words):
    with pytest.raises(ProvisionError) as err:
        gpu.choose(toolkits, caps)
    assert words in err.value.message and err.value.hint
    if caps and "." in caps[0]:
        assert err.value.hint == gpu.IMAGE_WAY_OUT and "--runtime none" in err.value.hint


def test_python_without_tensorflow_wheels_is_refused():
    for ok in ("3.9.18", "3.10.12", "3.11.2"):
        gpu.check_python(ok)
    with pytest.raises(ProvisionError) as err:
        gpu.check_python("3.12.3")
    assert "3.12.3" in err.value.message and "3.9, 3.10, 3.11" in err.value.message
    assert "Ubuntu 22.04" in err.value.hint


def test_horovod_build_environment_field_by_field():
    env = gpu.horovod_env(gpu.CudaBuild("12.8", "/usr/local/cuda-12.8", (70, 80)), "/v/nvidia/nccl")
    assert env == {
        "HOROVOD_GPU_OPERATIONS": "NCCL",
        "HOROVOD_CUDA_HOME": "/usr/local/cuda-12.8",
        "HOROVOD_BUILD_CUDA_CC_LIST": "70,80",
        "HOROVOD_NCCL_HOME": "/v/nvidia/nccl",
        "HOROVOD_NCCL_LINK": "SHARED",
        "LDFLAGS": "-Wl,--disable-new-dtags,-rpath,/v/nvidia/nccl/lib",
    }


def test_the_plan_shows_the_choice_or_refuses_before_launch():
    install = RuntimeRequest()
    v100 = ImageFacts("3.10", ("12.8", "12.9", "13.0", "13.2"), "13.2", ("7.0",), "V100")
    line = plan_line(install, v100)
    assert f"Horovod built with CUDA 12.8 (/usr/local/cuda-12.8) for sm_70, NCCL {gpu.NCCL} (nvidia-nccl-cu12)" in line
    assert "not the image's default CUDA 13.2" in line
    assert "CUDA" not in plan_line(install, ImageFacts("3.10", ("12.8",), "12.8", (), ""))  # a CPU type
    assert "read at `up`" in plan_line(install, ImageFacts("", (), "", ("8.0",), "A100"))  # a custom AMI
    assert "CUDA" not in plan_line(install, None)  # local nodes
    for bad in (ImageFacts("3.12", ("12.8",), "13.2", ("7.0",)), ImageFacts("3.10", ("13.0",), "13.0", ("7.0",))):
        with pytest.raises(ProvisionError):
            plan_line(install, bad)
    assert plan_line(RuntimeRequest("none"), ImageFacts("3.12")).startswith("none")  # nothing built: no refusal


def _exe(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def stand_in_image(root: Path) -> tuple[Path, Path]:
    """A DLAMI-like layout under root: cuda-12.8 and cuda-13.0 with an nvcc each, cuda-12.9 without one
    (half-installed: not a toolkit), cuda -> cuda-13.0, and bin/nvidia-smi for 8 V100s. (cuda root, bin)."""
    cuda = root / "usr-local"
    for v in ("12.8", "13.0"):
        _exe(cuda / f"cuda-{v}/bin/nvcc", f"#!/bin/sh\necho 'Cuda compilation tools, release {v}'\n")
        _exe(cuda / f"cuda-{v}/bin/ptxas", f"#!/bin/sh\necho 'ptxas: Cuda compilation tools, release {v}'\n")
        (cuda / f"cuda-{v}/nvvm/libdevice").mkdir(parents=True)
        (cuda / f"cuda-{v}/nvvm/libdevice/libdevice.10.bc").write_text(v)
    (cuda / "cuda-12.9/lib64").mkdir(parents=True)
    (cuda / "cuda").symlink_to(cuda / "cuda-13.0")
    smi = (
        "#!/bin/sh\n"
        'case "$*" in\n'
        '  *compute_cap*) for i in 0 1 2 3 4 5 6 7; do echo "7.0"; done ;;\n'
        '  "") echo "| NVIDIA-SMI 580.105.08   Driver Version: 580.105.08   CUDA Version: 13.0 |" ;;\n'
        "  *) exit 2 ;;\n"
        "esac\n"
    )
    _exe(root / "bin/nvidia-smi", smi)
    return cuda, root / "bin"


def test_the_probe_on_a_stand_in_image_reads_gpus_and_toolkits(tmp_path):
    cuda, bin_ = stand_in_image(tmp_path)
    out = subprocess.run(
        ["sh", "-c", rt.platform_probe(str(cuda))],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": f"{bin_}:/usr/bin:/bin"},
    ).stdout
    p = rt.parse_platform(out)
    assert p is not None and p.cuda == "13.0" and p.gpu
    assert p.compute_caps == ("7.0",) * 8
    assert p.toolkits == (f"{cuda}/cuda-12.8", f"{cuda}/cuda-13.0")  # 12.9 has no nvcc; `cuda` is no version
    s = rt.RuntimeSpec.for_platform(p)
    assert s.gpu and s.cuda_build == gpu.CudaBuild("12.8", f"{cuda}/cuda-12.8", (70,))
    # The choice is in the id: another toolkit or other GPUs make another runtime.
    a100 = rt.RuntimeSpec(gpu=True, cuda_build=gpu.CudaBuild("12.8", f"{cuda}/cuda-12.8", (80,)))
    assert rt.runtime_id(s, p) != rt.runtime_id(a100, p)
    # A driver too old for the compute_cap field prints its complaint on stdout: no capability is read from it,
    # and the spec is refused with the way out.
    _exe(
        bin_ / "nvidia-smi",
        '#!/bin/sh\ncase "$*" in *compute_cap*) echo \'Field "compute_cap" is not a valid field to query.\'; exit 2 ;;\n'
        '*) echo "| CUDA Version: 12.2 |" ;; esac\n',
    )
    old = rt.parse_platform(
        subprocess.run(
            ["sh", "-c", rt.platform_probe(str(cuda))],
            capture_output=True,
            text=True,
            env={"PATH": f"{bin_}:/usr/bin:/bin"},
        ).stdout
    )
    assert old is not None and old.cuda == "12.2" and old.compute_caps == ()
    with pytest.raises(ProvisionError, match="did not report the GPUs' compute capability"):
        rt.RuntimeSpec.for_platform(old)
    # A node without nvidia-smi says so and nothing else about GPUs (the CPU id stays as it was).
    cpu = rt.parse_platform(
        subprocess.run(
            ["sh", "-c", rt.platform_probe(str(cuda))], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"}
        ).stdout
    )
    assert cpu is not None and cpu.compute_caps is None and cpu.toolkits is None and not cpu.gpu


PIP = r"""#!/usr/bin/python3.11
# Stand-in for the venv's pip: records its argv and the build's environment, and installs the NCCL folder of
# nvidia-nccl-cu12 (include/nccl.h and lib/libnccl.so.2 only; the file holds the version): TensorFlow's extra
# brings 2.16.5, the runtime's own step the version it names.
import json, os, shutil, sys
prefix = os.path.dirname(os.path.dirname(os.path.abspath(sys.argv[0])))
nccl = os.path.join(prefix, "lib/python3.11/site-packages/nvidia/nccl")
wheel = {a.split("==")[1] for a in sys.argv if a.startswith("nvidia-nccl-cu12==")}
if any(a.startswith("tensorflow[and-cuda]") for a in sys.argv):
    wheel = {"2.16.5"}
if wheel:
    os.makedirs(nccl + "/include", exist_ok=True); os.makedirs(nccl + "/lib", exist_ok=True)
    open(nccl + "/include/nccl.h", "w").close()
    with open(nccl + "/lib/libnccl.so.2", "w") as f:
        f.write(wheel.pop())
link = nccl + "/lib/libnccl.so"
record = {
    "argv": sys.argv[1:],
    "env": {k: v for k, v in os.environ.items() if k.startswith("HOROVOD_") or k in ("LDFLAGS", "CUDA_HOME")},
    "path0": os.environ["PATH"].split(":")[0],
    "nvcc": shutil.which("nvcc"),
    "libnccl.so": os.readlink(link) if os.path.islink(link) else None,
    "nccl": open(link).read() if os.path.exists(link) else None,
}
with open(os.environ["STANDIN_LOG"], "a") as f:
    f.write(json.dumps(record) + "\n")
"""

# Stand-in for the venv's python: records each `-c` program; the check of Horovod's NCCL runs for real, with a
# stand-in horovod.tensorflow whose nccl_built() is the NCCL_VERSION_CODE the test gives.
VENV_PYTHON = """#!/bin/sh
here=$(dirname "$STANDIN_PIP")
echo "$2" >> "$here/checks"
case "$2" in *nccl_built*) exec env PYTHONPATH="$here/fakehvd" /usr/bin/python3.11 "$@" ;; esac
exit 0
"""

COMMON = [  # every pip call's options, as runtime_build.sh passes them for an offline build
    "install",
    "-q",
    "--no-cache-dir",
    "--disable-pip-version-check",
    "--progress-bar",
    "off",
    "--find-links",
    "/wheels",
    "--no-index",
]
CPU_ENV = {
    "HOROVOD_WITH_TENSORFLOW": "1",
    "HOROVOD_WITH_GLOO": "1",
    "HOROVOD_WITHOUT_PYTORCH": "1",
    "HOROVOD_WITHOUT_MXNET": "1",
    "HOROVOD_WITHOUT_MPI": "1",
}


def stand_in_build(tmp_path: Path, gpu: bool, nccl_wheel: bool = True, nccl_built: int = 23007):
    """runtime_build.sh itself, in a private mount namespace whose /opt is a tmpfs (as runtime/cache.py builds),
    on the stand-in image, with a stand-in python whose venv's pip records each call (PIP) and whose venv python
    records each `-c` check (tmp_path/checks; hvd.nccl_built() returns `nccl_built`). The login PATH
    puts CUDA 13's bin first, as an image's profile may (/usr/local/cuda/bin). Returns (result, calls, spec, rid,
    cuda)."""
    cuda, bin_ = stand_in_image(tmp_path)
    _exe(bin_ / "apt-get", "#!/bin/sh\necho 'apt-get must not run in this test' >&2\nexit 1\n")
    pip = PIP if nccl_wheel else PIP.replace("if wheel:", "if False:")
    _exe(tmp_path / "venv-python", VENV_PYTHON)
    (tmp_path / "fakehvd/horovod").mkdir(parents=True)
    (tmp_path / "fakehvd/horovod/__init__.py").write_text("")
    (tmp_path / "fakehvd/horovod/tensorflow.py").write_text(f"def nccl_built():\n    return {nccl_built}\n")
    _exe(tmp_path / "pip", pip)
    python = _exe(
        tmp_path / "python3",
        "#!/bin/sh\n"
        'if [ "$1" = -m ] && [ "$2" = venv ]; then\n'
        '  mkdir -p "$3/bin" && cp "$STANDIN_PIP" "$3/bin/pip" && cp "$(dirname "$STANDIN_PIP")/venv-python" "$3/bin/python"\n'
        '  chmod +x "$3/bin/pip" "$3/bin/python"; exit 0\n'
        "fi\n"
        'exec /usr/bin/python3.11 "$@"\n',
    )
    gpus = ("13.0", ("7.0",) * 8, (f"{cuda}/cuda-12.8", f"{cuda}/cuda-13.0")) if gpu else ("none", None, None)
    platform = rt.Platform("ubuntu 22.04", "x86_64", "3.11.2", str(python), *gpus)
    spec = rt.RuntimeSpec.for_platform(platform)
    rid = rt.runtime_id(spec, platform)
    build = rt.Build(rid, spec, platform, str(tmp_path / "out"), find_links="/wheels", no_index=True)
    argv = rt.build_argv(str(resources.template_path("runtime_build.sh")), build)
    inner = f"mount -t tmpfs -o mode=0755 standin /opt && mkdir -p {rt.ROOT} && exec {rt.shell(argv)}"
    log = tmp_path / "pip.log"
    env = {
        "PATH": f"{cuda}/cuda-13.0/bin:{bin_}:/usr/bin:/bin",
        "STANDIN_LOG": str(log),
        "STANDIN_PIP": str(tmp_path / "pip"),
        "HOME": str(tmp_path),
    }
    assert shutil.which("unshare") and os.geteuid() == 0  # what these tests need (as runtime/cache.py does)
    r = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", inner],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return r, calls, spec, rid, cuda


def test_the_build_script_builds_horovod_with_the_chosen_toolkit_and_the_runtimes_nccl(tmp_path):
    r, calls, spec, rid, cuda = stand_in_build(tmp_path, gpu=True)
    assert r.returncode == 0, r.stderr
    first, nccl_step, horovod, dali_plugin = calls
    assert "nvidia-dali-cuda120==2.4.0" in spec.requirements
    # DALI's TensorFlow plugin last, compiled against the TensorFlow installed, with the chosen toolkit's headers.
    assert dali_plugin["argv"] == COMMON + ["--no-build-isolation", "nvidia-dali-tf-plugin-cuda120==2.4.0"]
    assert dali_plugin["env"]["CUDA_HOME"] == f"{cuda}/cuda-12.8"
    assert first["argv"] == COMMON + list(spec.requirements) and spec.requirements[0] == "tensorflow[and-cuda]==2.15.1"
    assert first["env"] == {}  # TensorFlow is installed without Horovod's variables
    # NCCL over TensorFlow's pin, on its own (TF's pin would make one resolver run refuse it).
    assert nccl_step["argv"] == COMMON + ["--no-deps", f"nvidia-nccl-cu12=={gpu.NCCL}"] and nccl_step["env"] == {}
    assert horovod["argv"] == COMMON + ["--no-build-isolation", "horovod==0.28.1"]
    nccl = f"{rt.prefix(rid)}/lib/python3.11/site-packages/nvidia/nccl"
    assert horovod["env"] == {
        **CPU_ENV,
        "HOROVOD_GPU_OPERATIONS": "NCCL",
        "HOROVOD_CUDA_HOME": f"{cuda}/cuda-12.8",
        "HOROVOD_BUILD_CUDA_CC_LIST": "70",
        "HOROVOD_NCCL_HOME": nccl,
        "HOROVOD_NCCL_LINK": "SHARED",
        "LDFLAGS": f"-Wl,--disable-new-dtags,-rpath,{nccl}/lib",
    }
    # Horovod's build_utils asks `nvcc` on PATH first: it is 12.8's, not the login PATH's CUDA 13.
    assert horovod["path0"] == f"{cuda}/cuda-12.8/bin" and horovod["nvcc"] == f"{cuda}/cuda-12.8/bin/nvcc"
    assert horovod["libnccl.so"] == "libnccl.so.2"  # what CMake's find_library(nccl) looks for
    assert horovod["nccl"] == gpu.NCCL  # Horovod compiles against the runtime's NCCL, not TensorFlow's 2.16.5
    checks = (tmp_path / "checks").read_text().splitlines()
    assert any("hvd.nccl_built()" in c for c in checks), checks  # the builder proves NCCL is in Horovod
    info = json.loads((tmp_path / "out" / rt.INFO).read_text())
    assert info["id"] == rid and info["spec"]["cuda_build"] == {
        "cuda": "12.8",
        "home": f"{cuda}/cuda-12.8",
        "cc": [70],
        "nccl": gpu.NCCL,
    }
    assert (tmp_path / "out" / rt.PACK).stat().st_size > 0


def test_the_gpu_spec_names_nccl_at_or_above_the_efa_plugins_floor():
    """aws-ofi-nccl 1.16-1.19 support NCCL 2.17.1 and later: the runtime's NCCL is never below, and a build
    that asked for an older one is refused before anything is installed."""
    b = gpu.choose(DLAMI_2026, ["7.0"])
    assert gpu.version(b.nccl)[:3] >= (2, 17, 1) and gpu.NCCL_FLOOR == (2, 17, 1)
    s = rt.RuntimeSpec(gpu=True, cuda_build=b)
    assert s.nccl_requirement == f"nvidia-nccl-cu12=={b.nccl}" and gpu.version(gpu.TF_NCCL) < gpu.NCCL_FLOOR
    assert rt.RuntimeSpec().nccl_requirement == ""  # CPU runtimes: no NCCL step
    for old in ("2.16.5", "2.17.0", "2.9.9"):
        with pytest.raises(ProvisionError, match="older than 2.17.1"):
            gpu.CudaBuild("12.8", "/usr/local/cuda-12.8", (70,), nccl=old)
    gpu.CudaBuild("12.8", "/usr/local/cuda-12.8", (70,), nccl="2.17.1")
    # The NCCL version is in the runtime's id: another NCCL is another runtime.
    p = rt.Platform("ubuntu 22.04", "x86_64", "3.10.12", "/usr/bin/python3.10", "12.2", ("7.0",), (b.home,))
    other = rt.RuntimeSpec(gpu=True, cuda_build=gpu.CudaBuild(b.cuda, b.home, b.cc, nccl="2.27.7"))
    assert rt.runtime_id(s, p) != rt.runtime_id(other, p)


def test_the_build_script_stops_when_horovod_has_no_nccl(tmp_path):
    """hvd.nccl_built() is the NCCL_VERSION_CODE Horovod compiled against: none (0), or TensorFlow's 2.16.5
    (21605) instead of the runtime's, stops the build and leaves no pack."""
    for code in (0, 21605):
        where = tmp_path / str(code)
        where.mkdir()
        r, calls, *_ = stand_in_build(where, gpu=True, nccl_built=code)
        assert r.returncode == 1 and f"was not built with nvidia-nccl-cu12=={gpu.NCCL}" in r.stderr, r.stderr
        assert len(calls) == 3 and not (where / "out" / rt.INFO).exists()


def test_the_cpu_build_is_left_as_it_was(tmp_path):
    r, calls, spec, rid, cuda = stand_in_build(tmp_path, gpu=False)
    assert r.returncode == 0, r.stderr
    first, horovod = calls
    assert first["argv"] == COMMON + list(spec.requirements) and spec.requirements[0] == "tensorflow-cpu==2.15.1"
    assert horovod["env"] == CPU_ENV and horovod["argv"] == COMMON + ["--no-build-isolation", "horovod==0.28.1"]
    assert horovod["path0"] == f"{cuda}/cuda-13.0/bin" and horovod["libnccl.so"] is None  # PATH untouched
    assert not any("nccl_built" in c for c in (tmp_path / "checks").read_text().splitlines())  # no NCCL on CPU
    assert json.loads((tmp_path / "out" / rt.INFO).read_text())["spec"]["cuda_build"] is None


def test_the_build_script_stops_when_the_nccl_wheel_is_missing(tmp_path):
    """An NCCL wheel that left no NCCL folder stops the build before Horovod compiles, and leaves no pack."""
    r, calls, *_ = stand_in_build(tmp_path, gpu=True, nccl_wheel=False)
    assert r.returncode == 1 and f"the NCCL wheel (nvidia-nccl-cu12=={gpu.NCCL}) is not at" in r.stderr, r.stderr
    assert len(calls) == 2 and not (tmp_path / "out" / rt.INFO).exists()


def test_every_rank_runs_xla_on_the_runtimes_cuda_12_not_the_images_default_13(tmp_path):
    """The stand-in image: /usr/local/cuda -> cuda-13.0 (no sm_70), first on the login PATH. The runtime is built
    with 12.8, `up` records that toolkit, and every GPU job's ranks get its bin first on PATH and XLA pointed at
    it: the ptxas and libdevice a rank finds are 12.8's."""
    from clusterctl.types import Cluster, Node, NodeRuntime
    from clusterctl.workloads import horovod, launch

    r, _, spec, rid, cuda = stand_in_build(tmp_path, gpu=True)
    assert r.returncode == 0, r.stderr
    assert spec.cuda_build is not None and (cuda / "cuda").resolve() == cuda / "cuda-13.0"
    runtime = NodeRuntime(rid, rt.python_of(rid), spec.cuda_build.home)  # what install() records
    nodes = (Node("c-leader", "10.0.0.2", 8, "leader"),)
    p3 = Cluster("c", "aws", nodes, instance_type="p3.16xlarge", extra={"gpus": "8"}).with_runtime(runtime)
    env = launch.job_env(p3, rt.python_of(rid))
    home = f"{cuda}/cuda-12.8"
    assert env["XLA_FLAGS"] == f"--xla_gpu_cuda_data_dir={home}"
    assert env["PATH"] == f"{home}/bin:{launch.rank_path(rt.python_of(rid))}"
    # horovodrun copies its environment to every rank: these are set on its command line
    argv = horovod.horovodrun_argv(2, "h1:1,h2:1", ["python", "x"], extra_env=env)
    assert f"XLA_FLAGS=--xla_gpu_cuda_data_dir={home}" in argv and f"PATH={env['PATH']}" in argv
    # what a rank finds with that environment (the login PATH had CUDA 13's bin first)
    found = subprocess.run(
        ["env", "-i", f"PATH={env['PATH']}", "sh", "-c", 'command -v ptxas; ptxas; printf %s "$XLA_FLAGS"'],
        env={"XLA_FLAGS": env["XLA_FLAGS"]},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert found[0] == f"{home}/bin/ptxas" and found[1].endswith("release 12.8"), found
    data_dir = env["XLA_FLAGS"].split("=", 1)[1]
    assert (Path(data_dir) / "nvvm/libdevice/libdevice.10.bc").read_text() == "12.8"  # where XLA reads libdevice
    # a CPU runtime records no toolkit: nothing of CUDA is set
    cpu = Cluster("c", "local", nodes).with_runtime(NodeRuntime(rid, rt.python_of(rid)))
    assert "XLA_FLAGS" not in launch.job_env(cpu, rt.python_of(rid)) and "PATH" not in launch.job_env(cpu, "/x")
