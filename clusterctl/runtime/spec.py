"""What the node runtime is, and its id: pure values and the command lines built from them.

The runtime is one Python environment (a venv on the image's own python3) with TensorFlow, Horovod built
against it, boto3 and what the templates import. It lives at ROOT/<id> on every node, outside the login
home, so horovodrun's remote ranks (which run the driver's interpreter path) find it everywhere.

Its id hashes the spec and the platform it was built for (OS, Python, CUDA, architecture, and on GPU nodes
the toolkit and compute capabilities Horovod was compiled for): a runtime is only ever reused where it was
built for, and a cache entry is found again by id alone.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from dataclasses import asdict, dataclass, replace

from clusterctl.runtime import gpu as cuda

ROOT = "/opt/clusterctl-runtime"
MARKER = ".clusterctl-runtime.json"  # inside ROOT/<id>, written last: the runtime is complete and verified
PACK = "runtime.tar.zst"  # what a builder makes and what the relay carries
INFO = "runtime.json"  # beside PACK: id, spec, platform, files, bytes (the tree's size after unpacking)
RECIPE = 1  # bump when the build steps change in a way the spec fields do not show

# NVIDIA DALI for `train --input dali` (GPU JPEG decoding): its CUDA 12 wheel, and its TensorFlow plugin, an
# sdist built against the runtime's TensorFlow (no prebuilt plugin for TF 2.15: its wheel has 2.20 and 2.21
# only). The plugin's build includes cuda_runtime_api.h and crt/host_defines.h: on CPU nodes they come from
# these two wheels, the versions TensorFlow 2.15.1's [and-cuda] extra pins (GPU runtimes get them from it).
DALI_VERSION = "2.4.0"
CUDA_HEADER_WHEELS = ("nvidia-cuda-runtime-cu12==12.2.140", "nvidia-cuda-nvcc-cu12==12.2.140")

HOROVOD_CPU_ENV = {
    "HOROVOD_WITH_TENSORFLOW": "1",
    "HOROVOD_WITH_GLOO": "1",
    "HOROVOD_WITHOUT_PYTORCH": "1",
    "HOROVOD_WITHOUT_MXNET": "1",
    "HOROVOD_WITHOUT_MPI": "1",
}


@dataclass(frozen=True)
class RuntimeSpec:
    """The pinned packages. Horovod is installed in a second step, built against the TensorFlow installed
    in the first (it only loads into the exact TF it was built against)."""

    gpu: bool = False
    tensorflow: str = "2.15.1"  # the newest TF that Horovod 0.28.1 runs with (Keras 3 breaks it)
    horovod: str = "0.28.1"
    # boto3: S3 pulls of `sync` and checkpoint uploads; setuptools<81: TensorBoard 2.15 imports pkg_resources.
    extras: tuple[str, ...] = ("boto3==1.44.5", "setuptools==80.10.2", "wheel==0.48.0")
    recipe: int = RECIPE
    cuda_build: cuda.CudaBuild | None = None  # GPU nodes: the toolkit and compute capabilities (gpu.choose)
    dali: str | None = None  # DALI's version: always on GPU nodes, on CPU nodes with `up --runtime dali`

    @classmethod
    def for_platform(cls, platform: Platform, dali: bool = False) -> RuntimeSpec:
        """The spec for these nodes, or a refusal with the way out (a python3 without TF wheels; on GPU nodes
        no CUDA 12 toolkit for their GPUs). GPU runtimes carry DALI; CPU ones when asked (DALI's CPU backend)."""
        cuda.check_python(platform.python)
        if not platform.gpu:
            return cls(dali=DALI_VERSION if dali else None)
        caps = cuda.choose(platform.toolkits or (), platform.compute_caps or ())
        return cls(gpu=True, cuda_build=caps, dali=DALI_VERSION)

    @property
    def tensorflow_requirement(self) -> str:
        # The GPU build brings CUDA 12.2/cuDNN wheels matched to this TF; Horovod is compiled with a CUDA 12
        # toolkit of the image beside them (gpu.py).
        return f"tensorflow[and-cuda]=={self.tensorflow}" if self.gpu else f"tensorflow-cpu=={self.tensorflow}"

    @property
    def requirements(self) -> tuple[str, ...]:
        """First install step (everything but Horovod)."""
        if not self.dali:
            return (self.tensorflow_requirement, *self.extras)
        headers = () if self.gpu else CUDA_HEADER_WHEELS
        return (self.tensorflow_requirement, *self.extras, f"nvidia-dali-cuda120=={self.dali}", *headers)

    @property
    def dali_plugin_requirement(self) -> str:
        """Last install step, built against the installed TensorFlow like Horovod ("" without DALI)."""
        return f"nvidia-dali-tf-plugin-cuda120=={self.dali}" if self.dali else ""

    @property
    def nccl_requirement(self) -> str:
        """Second install step on GPU nodes ("" elsewhere): NCCL, without its dependencies, over the older one
        TensorFlow's `and-cuda` extra pins (pip says TF asked for another; TF's collectives are not used)."""
        return self.cuda_build.nccl_requirement if self.cuda_build else ""

    @property
    def horovod_requirement(self) -> str:
        return f"horovod=={self.horovod}"

    def describe(self) -> str:
        base = f"TensorFlow {self.tensorflow} ({'GPU' if self.gpu else 'CPU'}), Horovod {self.horovod}"
        base += f", DALI {self.dali}" if self.dali else ""
        return base + (f"; {self.cuda_build.describe()}" if self.cuda_build else "")


@dataclass(frozen=True)
class Platform:
    """What a node is, as far as a built environment cares."""

    os: str  # "debian 12", "ubuntu 22.04"
    arch: str  # uname -m
    python: str  # the image's python3 version, e.g. "3.11.2"
    python_path: str  # its real path, e.g. /usr/bin/python3.11 (the venv's base interpreter)
    cuda: str = "none"  # the CUDA version nvidia-smi reports (the driver's), or none
    # GPU nodes only (None elsewhere, so a CPU platform's id is what it was before these existed):
    compute_caps: tuple[str, ...] | None = None  # nvidia-smi --query-gpu=compute_cap, e.g. ("7.0",)
    toolkits: tuple[str, ...] | None = None  # the image's versioned toolkit folders, e.g. /usr/local/cuda-12.8

    @property
    def gpu(self) -> bool:
        return self.cuda != "none"


def platform_probe(cuda_root: str = cuda.CUDA_ROOT) -> str:
    """One shell line per fact; read-only; run on every node so a mixed cluster is caught before anything is
    built. On GPU nodes: each GPU's compute capability and each versioned toolkit folder holding an nvcc."""
    root = shlex.quote(cuda_root.rstrip("/") or "/")
    return (
        '. /etc/os-release 2>/dev/null; echo "os=$ID $VERSION_ID"; echo "arch=$(uname -m)"; '
        'P=$(command -v python3 || true); if [ -n "$P" ]; then P=$(readlink -f "$P"); echo "python_path=$P"; '
        '"$P" -c "import platform; print(\'python=\' + platform.python_version())"; fi; '
        "if command -v nvidia-smi >/dev/null 2>&1; then "
        'echo "cuda=$(timeout 20 nvidia-smi 2>/dev/null | sed -n "s/.*CUDA Version: *\\([0-9.]*\\).*/\\1/p" | head -n1)"; '
        "timeout 20 nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null "
        "| sed -n 's/^ *\\([0-9][0-9]*\\.[0-9][0-9]*\\) *$/compute_cap=\\1/p'; "
        f'for d in {root}/cuda-*; do if [ -x "$d/bin/nvcc" ]; then echo "toolkit=$d"; fi; done; '
        'else echo "cuda=none"; fi'
    )


PLATFORM_PROBE = platform_probe()


def parse_platform(text: str) -> Platform | None:
    """The probe's output, or None when the node has no python3 (the runtime needs the image's python3)."""
    pairs = [line.split("=", 1) for line in text.splitlines() if "=" in line]
    facts = dict(pairs)
    if not facts.get("python_path") or not facts.get("python"):
        return None
    p = Platform(
        os=facts.get("os", "?").strip(),
        arch=facts.get("arch", "?").strip(),
        python=facts["python"].strip(),
        python_path=facts["python_path"].strip(),
        cuda=(facts.get("cuda") or "none").strip() or "none",
    )
    if not p.gpu:
        return p
    caps = tuple(sorted(v.strip() for k, v in pairs if k == "compute_cap" and v.strip()))
    return replace(p, compute_caps=caps, toolkits=tuple(sorted(v.strip() for k, v in pairs if k == "toolkit")))


def runtime_id(spec: RuntimeSpec, platform: Platform) -> str:
    """sha256 of the spec and the platform, 16 hex digits: the same inputs give the same id anywhere."""
    # Fields that are None are left out, so adding an optional field keeps the ids made before it.
    facts = [{k: v for k, v in asdict(x).items() if v is not None} for x in (spec, platform)]
    text = json.dumps({"spec": facts[0], "platform": facts[1]}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def prefix(rid: str) -> str:
    return f"{ROOT}/{rid}"


def python_of(rid: str) -> str:
    return f"{prefix(rid)}/bin/python"


@dataclass(frozen=True)
class Build:
    """Everything the build script needs, as values (rendered into its argv by `build_argv`)."""

    rid: str
    spec: RuntimeSpec
    platform: Platform
    out_dir: str  # where PACK and INFO are written
    find_links: str = ""  # a wheel folder or URL to install from instead of the index (offline builds)
    no_index: bool = False

    @property
    def horovod_env(self) -> dict[str, str]:
        """Horovod's build environment: gloo and TensorFlow everywhere; on GPU nodes NCCL from the
        nvidia-nccl-cu12 wheel installed into this venv (spec.nccl_requirement), and the CUDA 12 toolkit and CC list of the spec."""
        env = dict(HOROVOD_CPU_ENV)
        if self.spec.cuda_build is not None:
            env.update(cuda.horovod_env(self.spec.cuda_build, nccl_home(self.rid, self.platform.python)))
        return env


def nccl_home(rid: str, python: str) -> str:
    """The NCCL folder of the nvidia-nccl-cu12 wheel inside the runtime's venv."""
    major_minor = ".".join(python.split(".")[:2])
    return f"{prefix(rid)}/lib/python{major_minor}/site-packages/nvidia/nccl"


def build_argv(script: str, build: Build) -> list[str]:
    """`bash SCRIPT ...` with every value its own argument (the script never evals them)."""
    env = " ".join(f"{k}={v}" for k, v in sorted(build.horovod_env.items()))
    return [
        "bash",
        script,
        build.rid,
        build.platform.python_path,
        build.out_dir,
        " ".join(build.spec.requirements),
        build.spec.horovod_requirement,
        env,
        build.find_links,
        "1" if build.no_index else "0",
        json.dumps(info(build), sort_keys=True),
        build.spec.nccl_requirement,
        build.spec.dali_plugin_requirement,
    ]


def info(build: Build) -> dict[str, object]:
    return {
        "id": build.rid,
        "spec": asdict(build.spec),
        "platform": asdict(build.platform),
        "python": python_of(build.rid),
    }


def install_argv(script: str, rid: str, incoming: str) -> list[str]:
    """`bash SCRIPT ID INCOMING`: unpack INCOMING/PACK to ROOT/ID, verify it against INFO, mark it complete."""
    return ["bash", script, rid, incoming]


def shell(argv: list[str]) -> str:
    return shlex.join(argv)
