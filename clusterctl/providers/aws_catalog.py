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
    "p3.2xlarge": 1, "p3.8xlarge": 4, "p3.16xlarge": 8, "p3dn.24xlarge": 8,
    "p4d.24xlarge": 8, "p4de.24xlarge": 8, "p5.48xlarge": 8, "p5e.48xlarge": 8,
    "g5.xlarge": 1, "g5.2xlarge": 1, "g5.4xlarge": 1, "g5.8xlarge": 1, "g5.16xlarge": 1,
    "g5.12xlarge": 4, "g5.24xlarge": 4, "g5.48xlarge": 8,
    "g4dn.xlarge": 1, "g4dn.2xlarge": 1, "g4dn.4xlarge": 1, "g4dn.8xlarge": 1, "g4dn.16xlarge": 1,
    "g4dn.12xlarge": 4, "g4dn.metal": 8,
}

# EFA support, same purpose (the API's NetworkInfo.EfaSupported wins when present).
EFA: dict[str, bool] = {
    "p3.2xlarge": False, "p3.8xlarge": False, "p3.16xlarge": False, "p3dn.24xlarge": True,
    "p4d.24xlarge": True, "p4de.24xlarge": True, "p5.48xlarge": True, "p5e.48xlarge": True,
    "g5.48xlarge": True, "g4dn.metal": True, "g4dn.12xlarge": True, "g4dn.16xlarge": True, "g4dn.8xlarge": True,
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


def money(usd: float | None) -> str:
    if usd is None:
        return "unknown"
    return f"${usd:,.2f}"
