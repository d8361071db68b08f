"""Built-in facts about EC2 instance types that the API does not give (prices) or may lack (GPU counts).

Pure data and lookups: no boto3. The price table is for the plan's "$/hour" line and for `ls`/`status`
"cost so far"; it is a dated estimate, not a bill. Prices are us-east-1, Linux, on-demand; other
regions differ by a few to ~30 percent, and the plan says so.
"""

from __future__ import annotations

from dataclasses import dataclass

PRICES_DATE = "2024-06-01"
PRICES_REGION = "us-east-1"
HOURS_PER_MONTH = 730.0

# USD per instance-hour, Linux on-demand, us-east-1, as published on PRICES_DATE.
ON_DEMAND_USD_PER_HOUR: dict[str, float] = {
    # V100
    "p3.2xlarge": 3.06,
    "p3.8xlarge": 12.24,
    "p3.16xlarge": 24.48,
    "p3dn.24xlarge": 31.212,
    # A100 / H100
    "p4d.24xlarge": 32.7726,
    "p4de.24xlarge": 40.9657,
    "p5.48xlarge": 98.32,
    # A10G
    "g5.xlarge": 1.006,
    "g5.2xlarge": 1.212,
    "g5.4xlarge": 1.624,
    "g5.8xlarge": 2.448,
    "g5.12xlarge": 5.672,
    "g5.16xlarge": 4.096,
    "g5.24xlarge": 8.144,
    "g5.48xlarge": 16.288,
    # T4
    "g4dn.xlarge": 0.526,
    "g4dn.2xlarge": 0.752,
    "g4dn.4xlarge": 1.204,
    "g4dn.8xlarge": 2.176,
    "g4dn.12xlarge": 3.912,
    "g4dn.16xlarge": 4.352,
    "g4dn.metal": 7.824,
    # CPU types people use for trying things out
    "t3.micro": 0.0104,
    "t3.medium": 0.0416,
    "m5.large": 0.096,
    "m5.xlarge": 0.192,
    "c5.xlarge": 0.17,
    "c5n.18xlarge": 3.888,
}

# EBS, USD per month (us-east-1): per GB provisioned, per provisioned IOPS above what the type includes.
EBS_USD_PER_GB_MONTH = {"gp3": 0.08, "gp2": 0.10, "io1": 0.125, "io2": 0.125}
EBS_USD_PER_IOPS_MONTH = {"gp3": 0.005, "io1": 0.065, "io2": 0.065}
EBS_FREE_IOPS = {"gp3": 3000, "io1": 0, "io2": 0}

# GPUs per instance, for when DescribeInstanceTypes does not know the type (or lacks GpuInfo).
GPUS: dict[str, int] = {
    "p3.2xlarge": 1,
    "p3.8xlarge": 4,
    "p3.16xlarge": 8,
    "p3dn.24xlarge": 8,
    "p4d.24xlarge": 8,
    "p4de.24xlarge": 8,
    "p5.48xlarge": 8,
    "p5e.48xlarge": 8,
    "g5.xlarge": 1,
    "g5.2xlarge": 1,
    "g5.4xlarge": 1,
    "g5.8xlarge": 1,
    "g5.16xlarge": 1,
    "g5.12xlarge": 4,
    "g5.24xlarge": 4,
    "g5.48xlarge": 8,
    "g4dn.xlarge": 1,
    "g4dn.2xlarge": 1,
    "g4dn.4xlarge": 1,
    "g4dn.8xlarge": 1,
    "g4dn.16xlarge": 1,
    "g4dn.12xlarge": 4,
    "g4dn.metal": 8,
    "g6.xlarge": 1,
    "g6.12xlarge": 4,
    "g6.48xlarge": 8,
}


@dataclass(frozen=True)
class Cpus:
    """A type's CPUs as DescribeInstanceTypes' VCpuInfo gives them (DefaultVCpus, DefaultCores,
    DefaultThreadsPerCore): what feeds the GPUs' input pipelines is the physical cores (a core's second hardware
    thread adds far less to JPEG decoding than a core)."""

    vcpus: int
    cores: int
    threads_per_core: int


# For when DescribeInstanceTypes cannot be asked (bench/input_pipeline.py, offline). VCpuInfo as moto's
# snapshot of DescribeInstanceTypes holds it (moto/ec2/resources/instance_types.json); the p3 types, absent
# there, from AWS's CPU options table (their Xeons: vCPUs = 2 x cores, as every type here).
CPUS: dict[str, Cpus] = {
    "p3.2xlarge": Cpus(8, 4, 2),
    "p3.8xlarge": Cpus(32, 16, 2),
    "p3.16xlarge": Cpus(64, 32, 2),
    "p3dn.24xlarge": Cpus(96, 48, 2),
    "p4d.24xlarge": Cpus(96, 48, 2),
    "p4de.24xlarge": Cpus(96, 48, 2),
    "p5.48xlarge": Cpus(192, 96, 2),
    "g4dn.xlarge": Cpus(4, 2, 2),
    "g4dn.12xlarge": Cpus(48, 24, 2),
    "g4dn.metal": Cpus(96, 48, 2),
    "g5.xlarge": Cpus(4, 2, 2),
    "g5.12xlarge": Cpus(48, 24, 2),
    "g5.48xlarge": Cpus(192, 96, 2),
    "g6.xlarge": Cpus(4, 2, 2),
    "g6.12xlarge": Cpus(48, 24, 2),
    "g6.48xlarge": Cpus(192, 96, 2),
}


def cpus_of(vcpu_info: dict[str, object], instance_type: str) -> Cpus | None:
    """DescribeInstanceTypes' VCpuInfo as Cpus; the table's when it lacks the cores; None when neither knows."""
    try:
        vcpus = int(str(vcpu_info.get("DefaultVCpus", 0) or 0))
        cores = int(str(vcpu_info.get("DefaultCores", 0) or 0))
        threads = int(str(vcpu_info.get("DefaultThreadsPerCore", 0) or 0))
    except ValueError:
        vcpus = cores = threads = 0
    if vcpus and cores:
        return Cpus(vcpus, cores, threads or max(1, vcpus // cores))
    return CPUS.get(instance_type)


# EFA support, same purpose (the API's NetworkInfo.EfaSupported wins when present).
EFA: dict[str, bool] = {
    "p3.2xlarge": False,
    "p3.8xlarge": False,
    "p3.16xlarge": False,
    "p3dn.24xlarge": True,
    "p4d.24xlarge": True,
    "p4de.24xlarge": True,
    "p5.48xlarge": True,
    "p5e.48xlarge": True,
    "g5.48xlarge": True,
    "g4dn.metal": True,
    "g4dn.12xlarge": True,
    "g4dn.16xlarge": True,
    "g4dn.8xlarge": True,
}


@dataclass(frozen=True)
class Price:
    instance_usd_per_hour: float | None  # None: not in the table
    volume_usd_per_hour: float

    @property
    def per_node(self) -> float | None:
        if self.instance_usd_per_hour is None:
            return None
        return self.instance_usd_per_hour + self.volume_usd_per_hour


def instance_price(instance_type: str) -> float | None:
    return ON_DEMAND_USD_PER_HOUR.get(instance_type)


def volume_price(volume_type: str, size_gb: int, iops: int | None) -> float:
    """USD per hour for one volume."""
    per_month = EBS_USD_PER_GB_MONTH.get(volume_type, 0.10) * size_gb
    if iops and volume_type in EBS_USD_PER_IOPS_MONTH:
        per_month += EBS_USD_PER_IOPS_MONTH[volume_type] * max(0, iops - EBS_FREE_IOPS.get(volume_type, 0))
    return per_month / HOURS_PER_MONTH


def price(instance_type: str, volume_type: str, size_gb: int, iops: int | None) -> Price:
    return Price(instance_price(instance_type), volume_price(volume_type, size_gb, iops))


def gpus(instance_type: str) -> int | None:
    return GPUS.get(instance_type)


def efa(instance_type: str) -> bool:
    return EFA.get(instance_type, False)


# ---- images: which Deep Learning AMI drives which GPU generation -------------------------------------
# DescribeImages carries no driver field, so the driver branch and CUDA of each DLAMI release come from
# AWS's release notes, kept here by name pattern (EC2 name filters: * and ? only). A Volta type (V100: p3,
# p3dn) needs a driver branch of R580 or older: NVIDIA's R580 is the last branch that supports Volta, and
# the Base OSS DLAMIs of 2026 ship R595. Checked on DLAMI_TABLE_DATE; add a row when AWS publishes one.
DLAMI_TABLE_DATE = "2026-10-08"
DLAMI_OWNER = "898082745236"  # amazon's Deep Learning AMI account (the owner of every DLAMI)
DLAMI_SSM_PARAMETERS = (  # the Base OSS Nvidia Driver GPU DLAMI, x86_64, Ubuntu 22.04; first found wins
    # "ami_type is the AMI's name without deep, learning and ami" (DLAMI guide, find-dlami-id): the release
    # notes' spelling; the same guide's own example omits "gpu", so that spelling is tried second.
    "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id",
    "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-ubuntu-22.04/latest/ami-id",
)
VOLTA_LAST_BRANCH = 580
VOLTA_FAMILIES = frozenset({"p3", "p3dn"})
_BASE_OSS = "Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04) "
_NOTES = "https://docs.aws.amazon.com/dlami/latest/devguide/"


@dataclass(frozen=True)
class DlamiRelease:
    name_pattern: str  # EC2 DescribeImages name filter
    driver_branch: int  # NVIDIA driver branch, e.g. 580
    driver: str  # the full driver version of the release notes
    cuda: str  # the default CUDA of the image (others may sit beside it)
    source: str  # the release note it was read from
    toolkits: tuple[str, ...] = ()  # every CUDA toolkit the release note lists (/usr/local/cuda-X.Y)

    @property
    def volta(self) -> bool:
        return self.driver_branch <= VOLTA_LAST_BRANCH


# Newest first; the first pattern an image name matches describes it. The x86_64 rows were read from the
# same-date Base OSS release notes of the family (x86_64 and ARM64 releases of one date carry one driver).
DLAMI_RELEASES: tuple[DlamiRelease, ...] = (
    DlamiRelease(
        _BASE_OSS + "20260[4-9]*",
        595,
        "595.58.03-595.91.07",
        "13.2",
        _NOTES + "aws-deep-learning-ami-gpubaseossarm64-ul2404-2026-04-30.html (595.58.03, CUDA 13.2)",
        ("12.8", "12.9", "13.0", "13.2"),
    ),
    DlamiRelease(
        _BASE_OSS + "20261*",
        595,
        "595.91.07",
        "13.2",
        _NOTES + "aws-deep-learning-ami-gpubaseossarm64-ul2204-2026-10-08.html (595.91.07, CUDA 13.2)",
        ("12.8", "12.9", "13.0", "13.2"),
    ),
    DlamiRelease(
        _BASE_OSS + "202601*",
        580,
        "580.105.08",
        "13.0",
        _NOTES + "aws-deep-learning-ami-gpubaseossarm64-ul2204-2026-01-08.html (580.105.08, CUDA 13.0)",
        ("12.8", "12.9", "13.0"),
    ),
    DlamiRelease(
        _BASE_OSS + "202512*",
        580,
        "580.105.08",
        "13.0",
        _NOTES + "aws-deep-learning-ami-gpubaseossarm64-ul2404-2025-12-10.html (580.105.08, CUDA 13.0)",
        ("12.8", "12.9", "13.0"),
    ),
    DlamiRelease(
        _BASE_OSS + "202510*",
        580,
        "580.95.05",
        "12.9",
        _NOTES + "aws-deep-learning-ami-gpubaseossarm64-ul2204-2025-11-10.html (release 20251031: "
        "580.95.05, CUDA 12.9)",
        ("12.9",),
    ),
)


# The image's python3 by its Ubuntu release (Ubuntu's python3 package: 20.04 ships 3.8, 22.04 3.10, 24.04 3.12).
UBUNTU_PYTHON = {"20.04": "3.8", "22.04": "3.10", "24.04": "3.12"}

# Compute capability per GPU model, as DescribeInstanceTypes names them (NVIDIA, developer.nvidia.com/cuda-gpus).
COMPUTE_CAPABILITY = {
    "V100": "7.0",
    "T4": "7.5",
    "A10G": "8.6",
    "L4": "8.9",
    "L40S": "8.9",
    "A100": "8.0",
    "H100": "9.0",
    "H200": "9.0",
}


def image_python(image_name: str) -> str:
    """The python3 an image's name implies ("Ubuntu 24.04" -> "3.12"), or "" when the name does not say."""
    import re

    m = re.search(r"ubuntu[ -]?(\d\d\.\d\d)", image_name or "", re.IGNORECASE)
    return UBUNTU_PYTHON.get(m.group(1), "") if m else ""


# The GPU of a family, for types the API does not describe (AWS's accelerated computing instance pages).
FAMILY_GPU = {
    "p3": "V100",
    "p3dn": "V100",
    "g4dn": "T4",
    "g5": "A10G",
    "g6": "L4",
    "g6e": "L40S",
    "gr6": "L4",
    "p4d": "A100",
    "p4de": "A100",
    "p5": "H100",
    "p5e": "H200",
    "p5en": "H200",
}


def gpu_model_of(instance_type: str, reported: str = "", gpus: int | None = None) -> str:
    """The one place a type's GPU model is settled: EC2's name for it, else its family's (FAMILY_GPU); "" for a
    type without GPUs. What the record's gpu_model holds (instances.fabric_extra) and the plan says."""
    if gpus == 0:
        return ""
    return reported or FAMILY_GPU.get(family(instance_type), "")


def compute_capability(instance_type: str, gpu_model: str = "") -> str:
    """The type's GPUs' compute capability ("NVIDIA V100" or a p3 type -> "7.0"); "" when not in the tables."""
    words = (gpu_model or FAMILY_GPU.get(family(instance_type), "")).replace(",", " ").split()
    return next((COMPUTE_CAPABILITY[w] for w in words if w in COMPUTE_CAPABILITY), "")


def dlami_release(image_name: str) -> DlamiRelease | None:
    """The table's row for an image name (EC2's * and ? wildcards, plus [..] ranges), or None."""
    import fnmatch

    return next((r for r in DLAMI_RELEASES if fnmatch.fnmatchcase(image_name or "", r.name_pattern)), None)


def volta_releases() -> tuple[DlamiRelease, ...]:
    return tuple(r for r in DLAMI_RELEASES if r.volta)


def family(instance_type: str) -> str:
    return instance_type.split(".", 1)[0].lower()


def is_volta(instance_type: str, gpu_model: str = "") -> bool:
    return family(instance_type) in VOLTA_FAMILIES or "V100" in (gpu_model or "")


# ---- EFA ------------------------------------------------------------------------------------------------
# Types whose EFA does RDMA (device RDMA for NCCL's aws-ofi-nccl, FI_EFA_USE_DEVICE_RDMA=1). p3dn and the
# g4dn/g5 EFA types have EFA without RDMA reads. DescribeInstanceTypes says nothing about it.
EFA_RDMA_FAMILIES = frozenset({"p4d", "p4de", "p5", "p5e", "p5en", "p6-b200", "p6-b300", "trn1", "trn1n", "trn2"})


def efa_rdma(instance_type: str) -> bool:
    return family(instance_type) in EFA_RDMA_FAMILIES


# ---- quotas -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Quota:
    code: str  # Service Quotas code (service "ec2")
    name: str
    unit: str  # "vCPUs" | "addresses"


_STANDARD = "Standard (A, C, D, H, I, M, R, T, Z)"
_VCPU_QUOTAS: dict[str, tuple[Quota, Quota]] = {  # letter class -> (on-demand, spot)
    "p": (
        Quota("L-417A185B", "Running On-Demand P instances", "vCPUs"),
        Quota("L-7212CCBC", "All P Spot Instance Requests", "vCPUs"),
    ),
    "g": (
        Quota("L-DB2E81BA", "Running On-Demand G and VT instances", "vCPUs"),
        Quota("L-3819A6DF", "All G and VT Spot Instance Requests", "vCPUs"),
    ),
    "standard": (
        Quota("L-1216C47A", f"Running On-Demand {_STANDARD} instances", "vCPUs"),
        Quota("L-34B43A08", f"All {_STANDARD} Spot Instance Requests", "vCPUs"),
    ),
}
EIP_QUOTA = Quota("L-0263D0A3", "EC2-VPC Elastic IPs", "addresses")


def vcpu_quota(instance_type: str, spot: bool) -> Quota | None:
    """The regional vCPU quota a type counts against; None for classes not in the table (F, X, Inf, ...)."""
    fam = family(instance_type)
    letters = "".join(ch for ch in fam.split("-")[0] if ch.isalpha())[:3]
    if fam.startswith("vt") or (fam[:1] == "g" and fam[1:2].isdigit()):
        key = "g"
    elif fam[:1] == "p" and fam[1:2].isdigit():
        key = "p"
    elif fam[:1] in "acdhimrtz" and not letters.startswith(("inf", "dl", "trn", "hpc")):  # own quotas
        key = "standard"
    else:
        return None
    return _VCPU_QUOTAS[key][1 if spot else 0]
