"""The AWS provider's options (`up --volume-type ...`, ClusterSpec.options): parsed and validated before any call."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Any

from clusterctl import s3uri
from clusterctl.errors import ConfigError
from clusterctl.types import ClusterSpec

DEFAULT_CIDR = "10.0.0.0/16"
# ---- options ----------------------------------------------------------------------------------------
VOLUME_TYPES = ("io2", "io1", "gp3", "gp2")
IOPS_RANGE = {"io2": (100, 256000), "io1": (100, 64000), "gp3": (3000, 16000)}
IOPS_PER_GB = {"io2": 1000, "io1": 50, "gp3": 500}


@dataclass(frozen=True)
class AwsOptions:
    ami: str | None = None
    ami_parameter: str | None = None  # None: the DLAMI for the type's GPU generation (aws_catalog)
    ssh_user: str | None = None
    volume_size: int = 200
    volume_type: str = "io2"
    iops: int | None = None  # None: 10000 for io1/io2, the included 3000 for gp3
    spot: bool = False
    vpc: str | None = None
    subnets: tuple[str, ...] = ()
    cidr: str = DEFAULT_CIDR
    ssh_cidr: str | None = None  # None: the caller's public address /32, detected
    s3_read: tuple[str, ...] = ()  # s3://bucket/prefix the nodes may read
    private_ips: bool = False  # no public addresses; the operator reaches the private ones (VPN, same VPC)
    placement: bool = True

    @classmethod
    def from_spec(cls, spec: ClusterSpec) -> "AwsOptions":
        o: dict[str, Any] = dict(spec.options or {})
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(o) - known)
        if unknown:
            raise ConfigError(f"unknown AWS option(s): {', '.join(unknown)}")
        o = {k: v for k, v in o.items() if v is not None}
        for k in ("subnets", "s3_read"):
            if k in o:
                o[k] = tuple(o[k])
        opts = cls(**o)
        opts.validate()
        if opts.spot and spec.autostop is not None and spec.autostop.idle_action == "stop":
            # EC2 stops no one-time spot instance: its shutdown behaviour can only be terminate
            raise ConfigError(
                "--spot instances cannot be stopped by autostop (EC2 only terminates one-time spot instances)",
                "add --idle-action terminate (what they hold is lost when autostop fires), or drop --spot",
            )
        return opts

    @property
    def effective_iops(self) -> int | None:
        if self.volume_type in ("io1", "io2"):
            return self.iops or 10000
        if self.volume_type == "gp3":
            return self.iops or 3000
        return None

    def validate(self) -> None:
        if self.volume_type not in VOLUME_TYPES:
            raise ConfigError(f"--volume-type must be one of {', '.join(VOLUME_TYPES)}, not {self.volume_type!r}")
        if not 8 <= int(self.volume_size) <= 16384:
            raise ConfigError(f"--volume-size must be 8..16384 GB, not {self.volume_size}")
        if self.iops is not None:
            if self.volume_type not in IOPS_RANGE:
                raise ConfigError(f"--iops does not apply to {self.volume_type} volumes", "use io2, io1 or gp3")
            lo, hi = IOPS_RANGE[self.volume_type]
            if not lo <= self.iops <= hi:
                raise ConfigError(f"--iops for {self.volume_type} must be {lo}..{hi}, not {self.iops}")
        iops = self.effective_iops
        if (
            iops
            and self.volume_type in IOPS_PER_GB
            and iops > IOPS_PER_GB[self.volume_type] * self.volume_size
            and not (self.volume_type == "gp3" and iops == 3000)
        ):
            raise ConfigError(
                f"{iops} IOPS needs at least {-(-iops // IOPS_PER_GB[self.volume_type])} GB of "
                f"{self.volume_type} ({IOPS_PER_GB[self.volume_type]} IOPS per GB)",
                "raise --volume-size or lower --iops",
            )
        if self.ssh_cidr is not None:
            try:
                net = ipaddress.ip_network(self.ssh_cidr, strict=False)
            except ValueError:
                raise ConfigError(
                    f"--ssh-cidr {self.ssh_cidr!r} is not an address range", "give one like 203.0.113.7/32"
                ) from None
            if net.version != 4:
                raise ConfigError("--ssh-cidr must be IPv4 for now")
        try:
            net = ipaddress.ip_network(self.cidr)
        except ValueError:
            raise ConfigError(f"--cidr {self.cidr!r} is not a network", "give one like 10.0.0.0/16") from None
        if net.version != 4 or not net.is_private or not 16 <= net.prefixlen <= 24:
            raise ConfigError(f"--cidr {self.cidr} must be a private IPv4 network of /16 to /24")
        for s in self.s3_read:
            parse_s3_read(s)
        if self.private_ips and not (self.vpc or self.subnets):
            raise ConfigError(
                "--private-ips needs --vpc or --subnet", "a VPC clusterctl creates has no way in but public addresses"
            )
        if self.ami and not re.match(r"^ami-[0-9a-f]{8,17}$", self.ami):
            raise ConfigError(f"--ami {self.ami!r} is not an image id", "give one like ami-0123456789abcdef0")
        if self.ssh_user and not re.match(r"^[a-z_][a-z0-9_-]{0,31}$", self.ssh_user):
            raise ConfigError(f"--ssh-user {self.ssh_user!r} is not a login name")
        if self.vpc and not re.match(r"^vpc-[0-9a-f]+$", self.vpc):
            raise ConfigError(f"--vpc {self.vpc!r} is not a VPC id")
        for s in self.subnets:
            if not re.match(r"^subnet-[0-9a-f]+$", s):
                raise ConfigError(f"--subnet {s!r} is not a subnet id")


def parse_s3_read(uri: str) -> s3uri.S3Uri:
    """An --s3-read location: 's3://bucket/some/prefix' or 'bucket/prefix' ('' prefix: the whole bucket)."""
    try:
        return s3uri.parse(uri, scheme_optional=True)
    except ValueError as exc:
        raise ConfigError(
            f"--s3-read {uri!r} is not an S3 location ({exc})", "give one like s3://my-bucket/imagenet/"
        ) from None
