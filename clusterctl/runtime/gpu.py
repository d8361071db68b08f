"""Which CUDA toolkit Horovod's GPU build uses, for which GPUs, and with which NCCL. Pure: the node's facts
come from spec.platform_probe (or, before launch, from the provider's ImageFacts), the choice is made here.

TensorFlow 2.15.1 brings its own CUDA 12.2 libraries (the `and-cuda` wheels), and Horovod must be compiled
with a CUDA 12 toolkit beside them: CUDA 13 (the default /usr/local/cuda of the 2026 Deep Learning AMIs)
no longer compiles for Volta (sm_70) and would bring a second major CUDA runtime. Those images keep CUDA 12
toolkits side by side (/usr/local/cuda-12.8, -12.9); the build takes one, compiles kernels for the nodes'
GPUs only, and links a current NCCL (the nvidia-nccl-cu12 wheel, installed over TensorFlow's older pin, so the
process holds one NCCL: the one the EFA plugin accepts).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from clusterctl.errors import ProvisionError
from clusterctl.node.nccl_report import NCCL_FLOOR

# TensorFlow 2.15.1's METADATA, extra `and-cuda`: nvidia-cuda-runtime-cu12==12.2.140, nvidia-nccl-cu12==2.16.5.
TF_CUDA = (12, 2)
TF_NCCL = "2.16.5"  # too old for the EFA plugin: replaced in the runtime by NCCL below (TF's collectives are unused)
# The EFA plugin's floor (NCCL 2.17.1) is node/nccl_report.py's NCCL_FLOOR, with its source.
# The NCCL the runtime installs (nvidia-nccl-cu12 on PyPI), for every GPU generation a CUDA 12 toolkit builds for:
# NVIDIA's redist of NCCL 2.30.7 (developer.download.nvidia.com/compute/redist/nccl/v2.30.7/) is built with CUDA
# 12.9 and 13.3, and its makefiles/common.mk (github.com/NVIDIA/nccl, tag v2.30.7-1) compiles sm_70 (Volta) into
# every CUDA 12.x build (only CUDA 13 builds start at sm_75). A CUDA 12.x build runs on any CUDA 12 driver (R525
# and later: the R535, R550 and R580 DLAMIs) by CUDA's minor version compatibility (CUDA Compatibility guide).
NCCL = "2.30.7"
NCCL_WHEEL = "nvidia-nccl-cu12"
# TensorFlow 2.15.1's wheels on PyPI are cp39, cp310 and cp311 (none for 3.12: Ubuntu 24.04's python3).
TF_PYTHONS = ((3, 9), (3, 10), (3, 11))
# What a CUDA 12.x nvcc compiles for: sm_50 and up from 12.0 (CUDA 12.0 release notes dropped Kepler), and
# Blackwell (sm_100, sm_120) from 12.8 (CUDA 12.8 release notes). CUDA 13.0 dropped sm_50-sm_72 (Volta).
CC_MIN = 50
CC_NEEDS = {100: (12, 8), 101: (12, 8), 120: (12, 8)}

# The way out, said once for every refusal of an image.
IMAGE_WAY_OUT = (
    "use an Ubuntu 22.04 Deep Learning Base OSS Nvidia Driver AMI (the default; it keeps /usr/local/cuda-12.8 and "
    "-12.9 beside CUDA 13), or --runtime none / --python PATH with your own TensorFlow and Horovod"
)


@dataclass(frozen=True)
class CudaBuild:
    """The GPU half of the runtime's spec: it goes into the runtime's id."""

    cuda: str  # the toolkit's version, e.g. "12.8"
    home: str  # its folder, e.g. /usr/local/cuda-12.8
    cc: tuple[int, ...]  # compute capabilities to compile for, e.g. (70,) for V100
    nccl: str = NCCL  # the NCCL installed and linked (nvidia-nccl-cu12): at or above NCCL_FLOOR

    def __post_init__(self) -> None:
        if version(self.nccl)[:3] < NCCL_FLOOR:
            floor = ".".join(str(p) for p in NCCL_FLOOR)
            raise ProvisionError(
                f"NCCL {self.nccl} is older than {floor}, the oldest the EFA plugin (aws-ofi-nccl) supports",
                f"build the runtime with NCCL {NCCL} (the default)",
            )

    @property
    def nccl_requirement(self) -> str:
        return f"{NCCL_WHEEL}=={self.nccl}"

    def describe(self) -> str:
        arch = ", ".join(f"sm_{c}" for c in self.cc)
        return f"Horovod built with CUDA {self.cuda} ({self.home}) for {arch}, NCCL {self.nccl} ({NCCL_WHEEL})"


def version(text: str) -> tuple[int, ...]:
    """ "12.8" -> (12, 8); anything unreadable -> ()."""
    try:
        return tuple(int(p) for p in text.strip().split("."))
    except ValueError:
        return ()


def toolkit_version(home: str) -> str:
    """/usr/local/cuda-12.8 -> "12.8" (the DLAMI's folder names; "" when the name carries no version)."""
    name = home.rstrip("/").rsplit("/", 1)[-1]
    return name[len("cuda-") :] if name.startswith("cuda-") and version(name[len("cuda-") :]) else ""


def cc_list(compute_caps: Sequence[str]) -> tuple[int, ...]:
    """nvidia-smi's compute_cap values ("7.0", "8.6") as Horovod's HOROVOD_BUILD_CUDA_CC_LIST numbers, once each."""
    out = set()
    for cap in compute_caps:
        v = version(cap)
        if len(v) != 2:
            raise ProvisionError(
                f"nvidia-smi reported a compute capability {cap!r} that is not MAJOR.MINOR",
                "check the NVIDIA driver: `clusterctl run NAME -- nvidia-smi --query-gpu=compute_cap --format=csv`",
            )
        out.add(v[0] * 10 + v[1])
    return tuple(sorted(out))


def check_python(python: str) -> None:
    """Refuse a python3 TensorFlow 2.15.1 has no wheel for (3.12 on Ubuntu 24.04 images)."""
    if version(python)[:2] not in TF_PYTHONS:
        supported = ", ".join(f"{a}.{b}" for a, b in TF_PYTHONS)
        raise ProvisionError(
            f"the image's python3 is {python}: TensorFlow 2.15.1 (the newest Horovod 0.28.1 runs with) has wheels "
            f"for Python {supported} only",
            IMAGE_WAY_OUT,
        )


def choose(toolkits: Sequence[str], compute_caps: Sequence[str]) -> CudaBuild:
    """The toolkit folder to build with and the CC list, or a refusal that says the way out.

    Among the CUDA 12 toolkits found, the oldest at or above TensorFlow's own CUDA (12.2) is taken: the
    closest to the runtime TF loads; failing that, the newest below it. Every GPU's compute capability must
    be one that toolkit compiles for."""
    cc = cc_list(compute_caps)
    if not cc:
        raise ProvisionError(
            "nvidia-smi did not report the GPUs' compute capability, which Horovod's GPU build is compiled for",
            "check the NVIDIA driver (`nvidia-smi --query-gpu=compute_cap --format=csv` on a node), or --runtime none",
        )
    found = {v: home for home in toolkits if (v := toolkit_version(home))}
    twelve = sorted((version(v), v) for v in found if version(v)[:1] == (12,))
    usable = [(vt, v) for vt, v in twelve if all(vt >= CC_NEEDS.get(c, (12, 0)) for c in cc)]
    if min(cc) < CC_MIN or not usable:
        seen = ", ".join(f"{v} ({found[v]})" for v in sorted(found, key=version)) or "none"
        why = (
            f"GPUs of compute capability {', '.join(str(c) for c in cc)}"
            if twelve
            else "TensorFlow 2.15.1's CUDA 12 libraries (CUDA 13 compiles no Volta code and is another runtime)"
        )
        raise ProvisionError(
            f"the image has no CUDA 12 toolkit that can build Horovod for {why}; found: {seen}", IMAGE_WAY_OUT
        )
    at_or_above = [u for u in usable if u[0] >= TF_CUDA]
    _, chosen = at_or_above[0] if at_or_above else usable[-1]
    return CudaBuild(chosen, found[chosen], cc)


def horovod_env(build: CudaBuild, nccl_home: str) -> dict[str, str]:
    """Horovod 0.28.1's build variables (its setup.py / CMakeLists.txt / cmake/build_utils.py read them):
    nvcc and the toolkit from HOROVOD_CUDA_HOME, the kernels' architectures from HOROVOD_BUILD_CUDA_CC_LIST
    (comma-separated, e.g. 70,80), NCCL from HOROVOD_NCCL_HOME linked shared, found at run time through the
    rpath (CMake takes LDFLAGS as its linker flags), so Horovod loads the runtime's libnccl.so.2 (the wheel
    installed over TensorFlow's pin: the venv holds one). An old-style DT_RPATH (--disable-new-dtags) is
    searched before LD_LIBRARY_PATH, where an image's own NCCL of another CUDA may sit."""
    return {
        "HOROVOD_GPU_OPERATIONS": "NCCL",
        "HOROVOD_CUDA_HOME": build.home,
        "HOROVOD_BUILD_CUDA_CC_LIST": ",".join(str(c) for c in build.cc),
        "HOROVOD_NCCL_HOME": nccl_home,
        "HOROVOD_NCCL_LINK": "SHARED",
        "LDFLAGS": f"-Wl,--disable-new-dtags,-rpath,{nccl_home}/lib",
    }


def planned(python: str, toolkits: Sequence[str], default_cuda: str, compute_caps: Sequence[str]) -> str:
    """The plan's words for the GPU build before launch, from the provider's tables (versions, not folders), or
    the refusal `up` would meet on the nodes. Unknown facts ("" / ()) are left to the probe at `up`."""
    if python:
        check_python(python)
    if not compute_caps:
        return ""
    if not toolkits:
        return "; GPU build: a CUDA 12 toolkit (/usr/local/cuda-12.*) and the GPUs' compute capability read at `up`"
    build = choose([f"{CUDA_ROOT}/cuda-{v}" for v in toolkits], compute_caps)
    default = f", not the image's default CUDA {default_cuda}" if default_cuda and default_cuda != build.cuda else ""
    return f"; {build.describe()}{default}"


CUDA_ROOT = "/usr/local"  # where images keep their toolkits: cuda-12.8/, cuda-13.0/, cuda -> one of them
