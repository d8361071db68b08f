"""The AWS provider: the only module that talks to EC2 (and to IAM and SSM for what EC2 needs).

boto3 response dicts never leave this module: everything returned is a typed value (Cluster, Plan,
ClusterStatus, Teardown). Everything a cluster owns carries the tag `clusterctl:cluster=NAME` from
the moment it is created (TagSpecifications / Tags on the create call itself), so `down` finds it by
tags alone, with or without the local record, even after a Ctrl-C between any two calls.

`up` (launch) is a list of idempotent steps, each of which first looks for what an earlier run made:
    network (VPC, internet gateway, one subnet per AZ; or --vpc/--subnet) -> security group ->
    placement group -> key pair (the operator key, imported) -> IAM role + instance profile ->
    one RunInstances with MinCount = MaxCount = N (all or nothing) per AZ tried, with a ClientToken
    saved before the call -> wait until running -> name the nodes.
botocore runs in standard retry mode (throttling and 5xx are retried with backoff, and a retried
RunInstances carries the same ClientToken, so a lost response never doubles the cluster).
"""

from __future__ import annotations

import base64
import ipaddress
import json
import os
import re
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from clusterctl import resources
from clusterctl.errors import CapacityError, ClusterctlError, ConfigError, ProvisionError, WaitTimeout
from clusterctl.providers.aws import catalog
from clusterctl.providers.aws import fabric
from clusterctl.providers.base import ClusterKeys, ClusterStatus, Found, Launched, NodeFacts, NodeStatus, Plan, Teardown
from clusterctl.cluster.state import StateStore, atomic_write
from clusterctl.types import Autostop, Cluster, ClusterSpec, Node
from clusterctl.units import money

TAG = "clusterctl:cluster"
TAG_ROLE = "clusterctl:role"
TAG_INDEX = "clusterctl:index"
TAG_SLOTS = "clusterctl:slots"
TAG_USER = "clusterctl:ssh-user"
TAG_REGION = "clusterctl:region"
TAG_OWNER = "clusterctl:owner"  # user@host that made it (shown by `gc`)
TAG_ID = "clusterctl:id"  # the random id of the cluster, made at its creation: with the name, its identity
IMAGE_USER_TAG = "clusterctl:ssh-user"  # an image may say which user logs in (custom AMIs)

DEFAULT_AMI_PARAMETER = catalog.DLAMI_SSM_PARAMETERS[0]
DEFAULT_CIDR = "10.0.0.0/16"
CHECKIP_URL = "https://checkip.amazonaws.com"
IAM_PATH = "/clusterctl/"

LIVE_STATES = ["pending", "running", "stopping", "stopped", "shutting-down"]
CAPACITY_CODES = {
    "InsufficientInstanceCapacity", "InsufficientCapacity", "InsufficientHostCapacity",
    "InsufficientCapacityOnHost", "Unsupported", "SpotMaxPriceTooLow", "InsufficientFreeAddressesInSubnet",
}
QUOTA_CODES = {"InstanceLimitExceeded", "VcpuLimitExceeded", "MaxSpotInstanceCountExceeded", "VolumeLimitExceeded"}
DEPENDENCY_CODES = {"DependencyViolation", "InvalidPlacementGroup.InUse", "DeleteConflict", "ResourceInUse",
                    "InvalidNetworkInterface.InUse", "VolumeInUse"}
NOT_FOUND = re.compile(r"(NotFound|NoSuchEntity|\.Malformed|InvalidPlacementGroup\.Unknown|InvalidKeyPair\.NotFound)")

Report = Callable[[str], None]
CLUSTER_ID = re.compile(r"^[0-9a-f]{12}$")
# How long `up` reads the consoles for cloud-init's host keys. Without Latest=True (Xen types) EC2 posts console
# output only every few minutes after boot, so this is generous; with it (Nitro) the keys show within seconds.
CONSOLE_WAIT = 600.0
_SETTLING = re.compile(r"^Invalid(Vpc|Subnet|Group|InternetGateway|RouteTable|PlacementGroup|KeyPair)(ID)?\.NotFound$")


def _no_report(_: str) -> None:
    pass


def _autostop_extra(spec: ClusterSpec) -> dict[str, str]:
    from clusterctl.autostop import settings as autostop

    return autostop.extra(spec.autostop)


_OWNER: dict[str, str] = {}


def _owner() -> str:
    if "v" not in _OWNER:
        from clusterctl.proc import owner

        _OWNER["v"] = owner()
    return _OWNER["v"]


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
        o = dict(spec.options or {})
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
        if iops and self.volume_type in IOPS_PER_GB and iops > IOPS_PER_GB[self.volume_type] * self.volume_size \
                and not (self.volume_type == "gp3" and iops == 3000):
            raise ConfigError(f"{iops} IOPS needs at least {-(-iops // IOPS_PER_GB[self.volume_type])} GB of "
                              f"{self.volume_type} ({IOPS_PER_GB[self.volume_type]} IOPS per GB)",
                              "raise --volume-size or lower --iops")
        if self.ssh_cidr is not None:
            try:
                net = ipaddress.ip_network(self.ssh_cidr, strict=False)
            except ValueError:
                raise ConfigError(f"--ssh-cidr {self.ssh_cidr!r} is not an address range",
                                  "give one like 203.0.113.7/32") from None
            if net.version != 4:
                raise ConfigError("--ssh-cidr must be IPv4 for now")
        try:
            net = ipaddress.ip_network(self.cidr)
        except ValueError:
            raise ConfigError(f"--cidr {self.cidr!r} is not a network", "give one like 10.0.0.0/16") from None
        if net.version != 4 or not net.is_private or not 16 <= net.prefixlen <= 24:
            raise ConfigError(f"--cidr {self.cidr} must be a private IPv4 network of /16 to /24")
        for s in self.s3_read:
            parse_s3(s)
        if self.private_ips and not (self.vpc or self.subnets):
            raise ConfigError("--private-ips needs --vpc or --subnet",
                              "a VPC clusterctl creates has no way in but public addresses")
        if self.ami and not re.match(r"^ami-[0-9a-f]{8,17}$", self.ami):
            raise ConfigError(f"--ami {self.ami!r} is not an image id", "give one like ami-0123456789abcdef0")
        if self.ssh_user and not re.match(r"^[a-z_][a-z0-9_-]{0,31}$", self.ssh_user):
            raise ConfigError(f"--ssh-user {self.ssh_user!r} is not a login name")
        if self.vpc and not re.match(r"^vpc-[0-9a-f]+$", self.vpc):
            raise ConfigError(f"--vpc {self.vpc!r} is not a VPC id")
        for s in self.subnets:
            if not re.match(r"^subnet-[0-9a-f]+$", s):
                raise ConfigError(f"--subnet {s!r} is not a subnet id")


def parse_s3(uri: str) -> tuple[str, str]:
    """'s3://bucket/some/prefix' (or 'bucket/prefix') -> (bucket, 'some/prefix/'); '' for the whole bucket."""
    rest = uri[5:] if uri.startswith("s3://") else uri
    bucket, _, prefix = rest.partition("/")
    if not re.match(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", bucket) or "*" in prefix or "?" in prefix:
        raise ConfigError(f"--s3-read {uri!r} is not an S3 location", "give one like s3://my-bucket/imagenet/")
    # A prefix is a folder: s3://b/imagenet grants b/imagenet/..., never b/imagenet-private/...
    return bucket, (prefix.rstrip("/") + "/") if prefix.strip("/") else ""


def s3_read_policy(locations: Iterable[str]) -> dict:
    """Read-only access to exactly the given prefixes (and listing them), nothing else."""
    objects, lists = [], []
    for uri in locations:
        bucket, prefix = parse_s3(uri)
        objects.append(f"arn:aws:s3:::{bucket}/{prefix}*")
        lists.append({
            "Effect": "Allow", "Action": ["s3:ListBucket"], "Resource": f"arn:aws:s3:::{bucket}",
            **({"Condition": {"StringLike": {"s3:prefix": [f"{prefix}*"]}}} if prefix else {}),
        })
    return {"Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": ["s3:GetObject"], "Resource": objects}, *lists]}


def s3_checkpoint_policy(uri: str) -> dict:
    """Checkpoints under one prefix: write, read back, delete the old ones, list that prefix; nothing else."""
    bucket, prefix = parse_s3(uri)
    prefix = prefix.strip("/") + "/"  # a folder: b/run1 grants b/run1/..., never b/run10/...
    return {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": ["s3:PutObject", "s3:GetObject", "s3:DeleteObject", "s3:AbortMultipartUpload"],
         "Resource": [f"arn:aws:s3:::{bucket}/{prefix}*"]},
        {"Effect": "Allow", "Action": ["s3:ListBucket"], "Resource": f"arn:aws:s3:::{bucket}",
         "Condition": {"StringLike": {"s3:prefix": [f"{prefix}*"]}}}]}


EC2_TRUST = {"Version": "2012-10-17", "Statement": [
    {"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}]}


# ---- small typed facts ----------------------------------------------------------------------------
@dataclass(frozen=True)
class TypeInfo:
    name: str
    gpus: int  # 0 for CPU types
    efa: bool
    cluster_placement: bool
    source: str  # "DescribeInstanceTypes" or "built-in table"
    gpu_model: str = ""
    vcpus: int = 0  # 0: unknown
    network_cards: int = 1
    max_efa: int = 0  # EFA interfaces the type takes (0 without EFA)
    efa_rdma: bool = False  # its EFA does device RDMA (aws_catalog.EFA_RDMA_FAMILIES)
    nitro: bool = False  # Nitro (or bare metal): GetConsoleOutput takes Latest=True

    @property
    def volta(self) -> bool:
        return bool(self.gpus) and catalog.is_volta(self.name, self.gpu_model)


@dataclass(frozen=True)
class Image:
    id: str
    name: str
    ssh_user: str
    root_device: str
    source: str
    release: catalog.DlamiRelease | None = None  # the DLAMI table's row for it (driver branch, CUDA)

    def describe(self) -> str:
        """Name, driver branch and CUDA as the plan shows them."""
        r = self.release
        facts = (f"NVIDIA driver R{r.driver_branch} ({r.driver}), CUDA {r.cuda} (driver and CUDA from the DLAMI "
                 f"table of {catalog.DLAMI_TABLE_DATE})" if r else "driver branch and CUDA not in clusterctl's DLAMI "
                 f"table of {catalog.DLAMI_TABLE_DATE}")
        return f"{self.id} {self.name}; {facts}"


@dataclass(frozen=True)
class Network:
    vpc: str
    subnets: tuple[tuple[str, str], ...]  # (subnet id, AZ) in the order to try
    created: bool  # made by clusterctl (and removed by `down`)


@dataclass(frozen=True)
class Resource:
    kind: str
    id: str
    label: str = ""

    def line(self) -> str:
        return f"{self.kind} {self.id}" + (f" ({self.label})" if self.label else "")


@dataclass(frozen=True)
class Scope:
    """Which resources are one cluster's. Its identity is its name plus the random id made when it was created
    (tagged `clusterctl:id` on everything, and in the record); for a cluster made before ids existed, its name
    plus its owner tag (and no id tag). `every`: any identity of the name (for display only, never to change)."""

    name: str
    id: str = ""
    owner: str = ""
    every: bool = False

    def filters(self) -> list[dict]:
        """Server-side narrowing only: EC2 reads `*` and `?` in filter values as wildcards, so every answer is
        checked again with holds(). The name and id are validated and hold neither."""
        flt = [{"Name": f"tag:{TAG}", "Values": [self.name]}]
        if self.id:
            flt.append({"Name": f"tag:{TAG_ID}", "Values": [self.id]})
        return flt

    def holds(self, tags: Mapping[str, str]) -> bool:
        if tags.get(TAG) != self.name:
            return False
        if self.every:
            return True
        if self.id:
            return tags.get(TAG_ID) == self.id
        return TAG_ID not in tags and tags.get(TAG_OWNER, "") == self.owner

    @property
    def group(self) -> str:
        """The name of its placement group, key pair and security group (names EC2 keeps unique per region)."""
        return f"clusterctl-{self.name}-{self.id}" if self.id else f"clusterctl-{self.name}"

    def iam(self, region: str) -> str:
        """Its IAM role and instance profile (IAM is global; at most 64 characters: by the id)."""
        return f"clusterctl-{self.id}" if self.id else iam_name(self.name, region)

    def tags(self, region: str) -> dict[str, str]:
        return {TAG: self.name, **({TAG_ID: self.id} if self.id else {}), TAG_REGION: region,
                TAG_OWNER: self.owner or _owner()}

    def label(self) -> str:
        return f"id {self.id}, owner {self.owner or 'unknown'}" if self.id else f"owner {self.owner or 'unknown'}, no id"


def new_cluster_id() -> str:
    return uuid.uuid4().hex[:12]


@dataclass
class _Context:
    spec: ClusterSpec
    opts: AwsOptions
    region: str
    type: TypeInfo
    image: Image
    slots: int
    price: catalog.Price
    notes: list[str] = field(default_factory=list)


def ssh_user_for_image(name: str, tags: Mapping[str, str]) -> str | None:
    """The login user of an image: its `clusterctl:ssh-user` tag, else from the OS family in its name."""
    if tags.get(IMAGE_USER_TAG):
        return tags[IMAGE_USER_TAG]
    n = (name or "").lower()
    if "amazon linux" in n or "al2023" in n or n.startswith("amzn"):
        return "ec2-user"
    if "ubuntu" in n:
        return "ubuntu"  # every Deep Learning AMI (Ubuntu ...) included
    if "debian" in n:
        return "admin"
    if "rocky" in n:
        return "rocky"
    if "centos" in n:
        return "centos"
    if "rhel" in n or "red hat" in n:
        return "ec2-user"
    return None


_KEYS_BLOCK = re.compile(r"-----BEGIN SSH HOST KEY KEYS-----(.*?)-----END SSH HOST KEY KEYS-----", re.S)
_KEY = re.compile(r"\b(ssh-ed25519|ecdsa-sha2-nistp(?:256|384|521)|ssh-rsa)\s+([A-Za-z0-9+/]+={0,3})")
_CLOUD_INIT_DONE = re.compile(r"Cloud-init v\. \S+ finished at")
_KEY_ORDER = {"ssh-ed25519": 0, "ecdsa-sha2-nistp256": 1, "ecdsa-sha2-nistp384": 1, "ecdsa-sha2-nistp521": 1, "ssh-rsa": 2}


def host_keys_from_console(text: str) -> tuple[str, ...]:
    """The host keys cloud-init printed (its last "SSH HOST KEY KEYS" block), ed25519 first."""
    blocks = _KEYS_BLOCK.findall(text or "")
    if not blocks:
        return ()
    keys = {f"{m.group(1)} {m.group(2)}" for m in _KEY.finditer(blocks[-1])}
    return tuple(sorted(keys, key=lambda k: (_KEY_ORDER.get(k.split()[0], 9), k)))


def detect_public_cidr(timeout: float = 5.0) -> str:
    """The caller's public IPv4 address as a /32, from checkip (CLUSTERCTL_CHECKIP_URL overrides)."""
    import urllib.request

    url = os.environ.get("CLUSTERCTL_CHECKIP_URL") or CHECKIP_URL
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 (fixed https URL or an override)
            text = resp.read(64).decode().strip()
        addr = ipaddress.ip_address(text)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"could not detect your public IP address from {url} ({exc.__class__.__name__})",
                          "pass --ssh-cidr with the address range you connect from, e.g. 203.0.113.7/32") from None
    if addr.version != 4:
        raise ConfigError(f"your public address {addr} is IPv6", "pass --ssh-cidr with an IPv4 range")
    return f"{addr}/32"


def render_user_data(cluster: str, region: str, ssh_user: str, slots: int, internal_public_key: str,
                     autostop: Autostop | None = None) -> str:
    import jinja2

    from clusterctl.autostop import watchdog as autostop_lib

    text = resources.template_path("cloud-init.yaml.j2").read_text()
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False)
    node = {"cluster": cluster, "region": region, "ssh_user": ssh_user, "slots": slots}
    watchdog = autostop_lib.cloud_init(cluster, autostop, ssh_user) if autostop is not None else None
    return env.from_string(text).render(cluster=cluster, internal_public_key=internal_public_key,
                                        node_json=json.dumps(node, sort_keys=True) + "\n", autostop=watchdog)




def configured_region() -> str | None:
    """The region boto3 would use (AWS_REGION, AWS_DEFAULT_REGION, the profile's), or None."""
    import boto3

    return boto3.session.Session().region_name or None


def _token(name: str, attempt: int) -> str:
    return f"{name}-{attempt}-{uuid.uuid4().hex[:20]}"  # at most 64 ASCII characters


def node_names(cluster: str, count: int) -> list[str]:
    return [f"{cluster}-leader"] + [f"{cluster}-member-{i}" for i in range(1, count)]


def iam_name(cluster: str, region: str) -> str:
    return f"clusterctl-{cluster}-{region}"  # IAM is global: the region keeps two regions' clusters apart


def _tags(pairs: Mapping[str, str]) -> list[dict]:
    return [{"Key": k, "Value": v} for k, v in pairs.items()]


def _tagdict(resource: Mapping) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in resource.get("Tags", []) or []}


def _code(exc: BaseException) -> str:
    return getattr(exc, "response", {}).get("Error", {}).get("Code", "") if hasattr(exc, "response") else ""


def _message(exc: BaseException) -> str:
    return getattr(exc, "response", {}).get("Error", {}).get("Message", "") if hasattr(exc, "response") else str(exc)


# ---- the provider -----------------------------------------------------------------------------------
class AwsProvider:
    name = "aws"
    builds_runtime_locally = False  # the leader builds the node runtime (the DLAMI is not this machine's OS)

    def __init__(self, store: StateStore | None = None, region: str | None = None, report: Report | None = None,
                 poll_interval: float = 2.0, wait_timeout: float = 900.0, console_wait: float = CONSOLE_WAIT,
                 delete_timeout: float = 600.0, force: bool = False):
        self.store = store or StateStore()
        self._region = region or None
        self.report = report or _no_report
        self.poll_interval = poll_interval
        self.wait_timeout = wait_timeout
        self.console_wait = console_wait
        self.delete_timeout = delete_timeout
        self._clients: dict[str, Any] = {}
        self._ctx: _Context | None = None
        self.force = force  # down/gc may remove another owner's cluster
        self._scopes: dict[str, Scope] = {}  # the clusters this process launches (or found in their record)
        self._launching: set[str] = set()

    # ---- clients ----------------------------------------------------------------------------------
    @property
    def region(self) -> str:
        if not self._region:
            import boto3

            self._region = boto3.session.Session().region_name
            if not self._region:
                raise ConfigError("no AWS region given", "pass --region or set AWS_REGION (or a region in ~/.aws/config)")
        return self._region

    def client(self, service: str):
        if service not in self._clients:
            import boto3
            from botocore.config import Config

            attempts = int(os.environ.get("AWS_MAX_ATTEMPTS") or 8)
            cfg = Config(retries={"mode": "standard", "total_max_attempts": max(1, attempts)}, connect_timeout=10,
                         read_timeout=60, user_agent_extra="clusterctl")
            self._clients[service] = boto3.session.Session(region_name=self.region).client(service, config=cfg)
        return self._clients[service]

    @property
    def ec2(self):
        return self.client("ec2")

    @property
    def iam(self):
        return self.client("iam")

    def _call(self, service: str, op: str, **kwargs) -> dict:
        """One API call; AWS errors become one-line ClusterctlErrors (4), missing credentials 3."""
        from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, NoRegionError

        try:
            return getattr(self.client(service), op)(**kwargs)
        except NoCredentialsError:
            raise ConfigError("no AWS credentials found",
                              "configure them (aws configure, AWS_PROFILE or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY)") from None
        except NoRegionError:
            raise ConfigError("no AWS region given", "pass --region or set AWS_REGION") from None
        except ClientError:
            raise
        except BotoCoreError as exc:
            raise ProvisionError(f"AWS {op}: {exc}") from None

    def _api(self, service: str, op: str, **kwargs) -> dict:
        """Like _call, but any AWS error is a ProvisionError naming the call."""
        from botocore.exceptions import ClientError

        try:
            return self._call(service, op, **kwargs)
        except ClientError as exc:
            raise self._error(op, exc) from None

    def _settled(self, service: str, op: str, **kwargs) -> dict:
        """A call about something this run just created: EC2 is eventually consistent, so "<Thing>.NotFound"
        right after the create is waited through (bounded), then it is an error like any other."""
        from botocore.exceptions import ClientError

        from clusterctl.retry import backoff

        deadline = time.monotonic() + 60
        delays = backoff(0.2, 5.0)
        while True:
            try:
                return self._call(service, op, **kwargs)
            except ClientError as exc:
                if not _SETTLING.match(_code(exc)) or time.monotonic() > deadline:
                    raise self._error(op, exc) from None
                delay = next(delays)
                self.report(f"{op}: {_code(exc)} right after creating it; waiting {delay:.1f}s")
                time.sleep(delay)

    def _error(self, op: str, exc: BaseException) -> ClusterctlError:
        code, msg = _code(exc), _message(exc)
        if code in ("AuthFailure", "UnauthorizedOperation", "AccessDenied", "AccessDeniedException",
                    "InvalidClientTokenId", "SignatureDoesNotMatch", "ExpiredToken"):
            return ProvisionError(f"AWS refused {op} ({code}): {msg}", "check the credentials' permissions")
        if code in QUOTA_CODES:
            return ProvisionError(f"AWS {op}: {code}: {msg}", "request a quota increase, or ask for fewer/smaller nodes")
        if code in ("RequestLimitExceeded", "Throttling", "ThrottlingException"):
            return ProvisionError(f"AWS kept throttling {op} after retries ({code})", "wait a minute and run it again")
        return ProvisionError(f"AWS {op} failed: {code}: {msg}")

    def _paginate(self, service: str, op: str, key: str, **kwargs) -> list[dict]:
        from botocore.exceptions import ClientError

        out: list[dict] = []
        try:
            for page in self.client(service).get_paginator(op).paginate(**kwargs):
                out.extend(page.get(key, []))
        except ClientError as exc:
            raise self._error(op, exc) from None
        return out

    # ---- identity: which resources are this cluster's ---------------------------------------------------
    def _id_file(self, name: str) -> Path:
        return self.store.cluster_dir(name) / "aws-id"

    def known_scope(self, name: str) -> Scope | None:
        """The cluster's identity from this machine: the record's id (a record made before ids: name + this
        machine's owner tag), else the id an interrupted `up` saved before creating anything."""
        if name in self._scopes:
            return self._scopes[name]
        from clusterctl.errors import StateError

        scope = None
        if self.store.exists(name):
            cluster = self.store.load(name).cluster
            if cluster.provider == self.name:
                cid = cluster.extra.get("cluster_id", "")
                scope = Scope(name, cid, cluster.extra.get("owner") or _owner())
        if scope is None and self._id_file(name).is_file():
            scope = Scope(name, self._id_file(name).read_text().strip(), _owner())
        if scope is not None and scope.id and not CLUSTER_ID.match(scope.id):
            raise StateError(f"the record of cluster {name} holds a bad cluster id {scope.id!r}",
                             "move its folder aside; `clusterctl down NAME` still finds it by tags")
        if scope is not None:
            self._scopes[name] = scope
        return scope

    def _launch_scope(self, name: str) -> Scope:
        """The identity `up` creates under: the known one, else a new random id, saved before anything is made."""
        scope = self.known_scope(name)
        if scope is None:
            scope = Scope(name, new_cluster_id(), _owner())
            atomic_write(self.store.ensure_dir(name) / "aws-id", scope.id + "\n")
            self._scopes[name] = scope
        return scope

    def identities(self, name: str) -> list[Scope]:
        """Every identity that holds resources tagged with this name (by id; before ids, by owner)."""
        found: dict[tuple[str, str], Scope] = {}
        for f in self._listing(Scope(name, every=True)):
            key = (f.cluster_id, "" if f.cluster_id else f.owner)
            found.setdefault(key, Scope(name, f.cluster_id, f.owner))
        return sorted(found.values(), key=lambda s: (s.owner, s.id))

    def _scopes_for(self, name: str) -> list[Scope]:
        """What `down NAME` removes: the identity this machine knows, else every identity of the name that is this
        owner's; another owner's only with force (a UsageError naming the owner otherwise, before any change)."""
        if name in self._launching:  # the rollback of this process's own `up`: only its own identity
            scope = self.known_scope(name)
            return [scope] if scope is not None else []
        known = self.known_scope(name)
        if known is not None:
            return [known]
        found = self.identities(name)
        foreign = [s for s in found if s.owner != _owner()]
        if foreign and not self.force:
            from clusterctl.errors import UsageError

            raise UsageError(f"cluster {name} in {self.region} belongs to another owner "
                             f"({'; '.join(s.label() for s in foreign)}) and this machine has no record of it",
                             "pass --force to remove it anyway")
        return found

    def owners(self, name: str) -> list[str]:
        """The owners of what `down NAME` would remove (for the confirmation prompt)."""
        return sorted({s.owner or "unknown" for s in self._scopes_for(name)})

    # ---- facts: type, image, price ---------------------------------------------------------------
    def type_info(self, instance_type: str) -> TypeInfo:
        from botocore.exceptions import ClientError

        try:
            found = self._call("ec2", "describe_instance_types", InstanceTypes=[instance_type]).get("InstanceTypes", [])
        except ClientError as exc:
            if _code(exc) not in ("InvalidInstanceType", "InvalidParameterValue"):
                raise self._error("DescribeInstanceTypes", exc) from None
            found = []
        if found:
            t = found[0]
            gpus = sum(int(g.get("Count", 0)) for g in t.get("GpuInfo", {}).get("Gpus", []))
            model = ", ".join(sorted({g.get("Name", "") for g in t.get("GpuInfo", {}).get("Gpus", [])}))
            if not gpus and catalog.gpus(instance_type):
                gpus, model = catalog.gpus(instance_type) or 0, model
            strategies = t.get("PlacementGroupInfo", {}).get("SupportedStrategies", ["cluster"])
            net = t.get("NetworkInfo", {})
            efa = bool(net.get("EfaSupported", False))
            return TypeInfo(instance_type, gpus, efa, "cluster" in strategies, "DescribeInstanceTypes", model,
                            vcpus=int(t.get("VCpuInfo", {}).get("DefaultVCpus", 0) or 0),
                            network_cards=int(net.get("MaximumNetworkCards", 1) or 1),
                            max_efa=int(net.get("EfaInfo", {}).get("MaximumEfaInterfaces", 1 if efa else 0) or 0),
                            efa_rdma=efa and catalog.efa_rdma(instance_type),
                            nitro=t.get("Hypervisor") == "nitro" or bool(t.get("BareMetal")))
        gpus = catalog.gpus(instance_type)
        if gpus is None and catalog.instance_price(instance_type) is None:
            raise ConfigError(f"instance type {instance_type!r} is unknown in {self.region}",
                              "check the spelling, or pick a type offered in this region")
        efa = catalog.efa(instance_type)
        return TypeInfo(instance_type, gpus or 0, efa, True, "built-in table", max_efa=1 if efa else 0,
                        efa_rdma=efa and catalog.efa_rdma(instance_type))

    def image(self, opts: AwsOptions, info: TypeInfo | None = None) -> Image:
        """--ami, else --ami-parameter, else by GPU generation: a Volta type gets the newest DLAMI release of
        the table whose driver branch still drives Volta (found by name and owner), any other type the
        current Base OSS Nvidia Driver DLAMI (SSM)."""
        from botocore.exceptions import ClientError

        if opts.ami:
            ami, source = opts.ami, "--ami"
        elif opts.ami_parameter:
            ami, source = self._ssm_image(opts.ami_parameter), f"SSM {opts.ami_parameter}"
        elif info is not None and info.volta:
            return self._volta_image(opts, info)
        else:
            ami = source = ""
            for i, name in enumerate(catalog.DLAMI_SSM_PARAMETERS):
                try:
                    ami, source = self._ssm_image(name), f"SSM {name}"
                    break
                except ConfigError:
                    if i == len(catalog.DLAMI_SSM_PARAMETERS) - 1:
                        raise
        try:
            images = self._call("ec2", "describe_images", ImageIds=[ami]).get("Images", [])
        except ClientError as exc:
            if NOT_FOUND.search(_code(exc)):
                images = []
            else:
                raise self._error("DescribeImages", exc) from None
        if not images:
            raise ConfigError(f"image {ami} ({source}) does not exist in {self.region}", "pass another --ami")
        return self._image_value(opts, images[0], source)

    def _image_value(self, opts: AwsOptions, img: dict, source: str) -> Image:
        ami = img["ImageId"]
        name = img.get("Name") or ami
        user = opts.ssh_user or ssh_user_for_image(name, _tagdict(img))
        if not user:
            raise ConfigError(f"cannot tell the login user of image {ami} ({name})", "pass --ssh-user")
        return Image(ami, name, user, img.get("RootDeviceName") or "/dev/sda1", source, catalog.dlami_release(name))

    def _ssm_image(self, parameter: str) -> str:
        from botocore.exceptions import ClientError

        try:
            return self._call("ssm", "get_parameter", Name=parameter)["Parameter"]["Value"]
        except ClientError as exc:
            if _code(exc) == "ParameterNotFound":
                raise ConfigError(f"SSM parameter {parameter} does not exist in {self.region}",
                                  "pass --ami ami-..., or --ami-parameter with the image's public parameter") from None
            raise self._error("ssm GetParameter", exc) from None

    def _volta_image(self, opts: AwsOptions, info: TypeInfo) -> Image:
        rows = catalog.volta_releases()
        images = self._api("ec2", "describe_images", Owners=[catalog.DLAMI_OWNER], Filters=[
            {"Name": "name", "Values": [r.name_pattern for r in rows]},
            {"Name": "architecture", "Values": ["x86_64"]}, {"Name": "state", "Values": ["available"]}]).get("Images", [])
        images = [i for i in images if i.get("OwnerId", catalog.DLAMI_OWNER) == catalog.DLAMI_OWNER
                  and (catalog.dlami_release(i.get("Name", "")) or rows[0]).volta]
        if not images:
            raise ConfigError(f"no Deep Learning AMI with an NVIDIA driver of R{catalog.VOLTA_LAST_BRANCH} or older "
                              f"(the last for Volta) found in {self.region} for {info.name}",
                              "pass --ami with an image whose driver drives V100 GPUs")
        newest = max(images, key=lambda i: (i.get("CreationDate") or "", i.get("Name") or ""))
        return self._image_value(opts, newest, f"DLAMI table: Volta ({info.gpu_model or 'V100'}) needs NVIDIA driver "
                                 f"R{catalog.VOLTA_LAST_BRANCH} or older; newest such release of owner {catalog.DLAMI_OWNER}")

    def context(self, spec: ClusterSpec) -> _Context:
        if self._ctx is not None and self._ctx.spec == spec:
            return self._ctx
        opts = AwsOptions.from_spec(spec)
        if spec.region:
            self._region = spec.region
        info = self.type_info(spec.instance_type)
        image = self.image(opts, info)
        slots = spec.slots or info.gpus or 1
        ctx = _Context(spec, opts, self.region, info, image, slots,
                       catalog.price(spec.instance_type, opts.volume_type, opts.volume_size, opts.effective_iops))
        self._ctx = ctx
        return ctx

    # ---- plan / dry run ------------------------------------------------------------------------------
    def plan(self, spec: ClusterSpec) -> Plan:
        ctx = self.context(spec)
        o, n, t = ctx.opts, spec.nodes, ctx.type
        names = node_names(spec.name, n)
        lines = [f"{n} x {t.name} in {ctx.region}, one Availability Zone, all or nothing: "
                 f"{names[0]}" + (f", {names[1]} .. {names[-1]}" if n > 2 else (f", {names[1]}" if n == 2 else ""))]
        gpu = (f"{t.gpus} GPU(s)" + (f" ({t.gpu_model})" if t.gpu_model else "") + " per node") if t.gpus else "no GPUs"
        lines.append(f"slots: {ctx.slots} per node, {ctx.slots * n} in all ({gpu}, from {t.source}"
                     + (", overridden by --slots" if spec.slots else "") + ")")
        lines.append(f"image: {ctx.image.describe()} (from {ctx.image.source}); login user {ctx.image.ssh_user}")
        iops = o.effective_iops
        lines.append(f"disk: {o.volume_size} GB {o.volume_type}" + (f" at {iops} IOPS" if iops else "")
                     + ", encrypted, deleted with the node")
        net = self._plan_network(ctx)
        lines.append(net)
        cidr = o.ssh_cidr or "your public IP /32 (detected at launch)"
        lines.append(f"security group: all traffic within the cluster (in and out), ssh (22) from {cidr}")
        if o.ssh_cidr and ipaddress.ip_network(o.ssh_cidr, strict=False).prefixlen == 0:
            lines.append("WARNING: ssh is open to the whole internet (--ssh-cidr 0.0.0.0/0 was asked for)")
        scope = self.known_scope(spec.name)
        group = scope.group if scope else f"clusterctl-{spec.name}-<id>"
        lines.append("identity: " + (f"id {scope.id} (from this machine's record)" if scope and scope.id else
                                     f"name and owner {scope.owner} (made before cluster ids)" if scope else
                                     "a new random id, tagged clusterctl:id on everything (rollback, down and gc "
                                     "touch only what carries it)"))
        if o.placement and t.cluster_placement:
            lines.append(f"placement group {group} (cluster strategy)")
        lines.append(self._plan_interfaces(ctx))
        lines.append(f"key pair {group} (this machine's per-cluster key; private half stays here)")
        reads = ("reads " + ", ".join(f"s3://{b}/{p}" for b, p in map(parse_s3, o.s3_read))) if o.s3_read \
            else "no S3 access"
        lines.append(f"IAM instance profile {scope.iam(ctx.region) if scope else 'clusterctl-<id>'}: {reads}; "
                     "no AWS keys on nodes")
        lines.append("IMDSv2 required; instance-initiated shutdown terminates"
                     + ("; spot (one-time, terminated on interruption)" if o.spot else ""))
        existing = self._instances(scope or Scope(spec.name, every=True))
        if existing and len(existing) != n:  # said here, before `up` starts (whose failures clean up)
            raise ProvisionError(f"cluster {spec.name} already has {len(existing)} instance(s) in {ctx.region}, not {n}",
                                 f"use --nodes {len(existing)}, another --name, or bring it down first")
        if existing:
            lines.append(f"cluster {spec.name} already has {len(existing)} instance(s) in {ctx.region}: up reuses them")
        else:  # before anything is created: a launch over a quota stops here (one Error: line)
            for check in fabric.check_quotas(self, ctx):
                lines.append(f"quota: {check.line()}")
        per_node = ctx.price.per_node
        hourly = None if per_node is None else per_node * n
        if per_node is None:
            lines.append(f"cost: unknown ({t.name} is not in the built-in price table of {catalog.PRICES_DATE}); "
                         f"disks {money(ctx.price.volume_usd_per_hour * n)}/hour")
        else:
            kind = "spot: less than the on-demand " if o.spot else ""
            lines.append(f"cost: {kind}{money(hourly)}/hour for the cluster "
                         f"({n} x {money(ctx.price.instance_usd_per_hour)} instance + "
                         f"{money(ctx.price.volume_usd_per_hour)} disk; {catalog.PRICES_REGION} on-demand "
                         f"prices of {catalog.PRICES_DATE}, other regions differ)")
        return Plan(tuple(lines), hourly, catalog.PRICES_DATE)

    def _plan_interfaces(self, ctx: _Context) -> str:
        t, o = ctx.type, ctx.opts
        count = fabric.efa_count(t)
        if not count:
            nics = "network interface: ENA (no EFA on this type)"
        else:
            nics = (f"network interfaces: {count} EFA (one per network card" + (", device index 0 on card 0 and 1 on "
                    "the others" if count > 1 else "") + "); " + ("RDMA on (FI_EFA_USE_DEVICE_RDMA=1)" if t.efa_rdma
                                                              else "no device RDMA on this type"))
        if o.private_ips:
            return nics + "; private addresses only"
        if fabric.needs_elastic_ip(t, o.private_ips):
            return (nics + "; several interfaces get no automatic public address: the leader gets an Elastic IP "
                    "(tagged, released by down), members are reached through the leader (ProxyJump, host keys pinned)")
        return nics + "; a public address each for ssh"

    def _plan_network(self, ctx: _Context) -> str:
        o = ctx.opts
        if o.subnets or o.vpc:
            net = self._existing_network(ctx, create=False)
            azs = ", ".join(az for _, az in net.subnets)
            return f"network: existing VPC {net.vpc}, subnet(s) in {azs} (not created, not deleted)"
        scope = self.known_scope(ctx.spec.name)
        vpc = self._find_one("describe_vpcs", "Vpcs", scope) if scope else None
        zones = self._zones_for(ctx, [z for z in self._zones()])
        state = f"existing {vpc['VpcId']}" if vpc else "a new VPC"
        return (f"network: {state} {o.cidr} with a subnet in each AZ and an S3 gateway endpoint (free); trying "
                f"{', '.join(zones)} in that order on insufficient capacity")

    def dry_run(self, spec: ClusterSpec) -> list[str]:
        """EC2's DryRun on the mutating calls that have it; nothing else that mutates is called."""
        from botocore.exceptions import ClientError

        ctx = self.context(spec)
        o = ctx.opts
        lines = []

        def check(what: str, op: str, **kwargs) -> None:
            try:
                self._call("ec2", op, DryRun=True, **kwargs)
                lines.append(f"{what}: the call returned without DryRun (unexpected)")
            except ClientError as exc:
                code = _code(exc)
                if code == "DryRunOperation":
                    lines.append(f"{what}: allowed (EC2 DryRun)")
                elif code == "UnauthorizedOperation":
                    raise ProvisionError(f"dry run: not permitted to {op} ({_message(exc)[:200]})",
                                         "grant the credentials EC2 permissions") from None
                else:
                    raise self._error(f"{op} (DryRun)", exc) from None

        scope = self.known_scope(spec.name) or Scope(spec.name, new_cluster_id(), _owner())  # not saved: nothing is made
        tags = [{"ResourceType": "placement-group", "Tags": _tags(scope.tags(ctx.region))}]
        if o.placement and ctx.type.cluster_placement:
            check("placement group", "create_placement_group", GroupName=scope.group,
                  Strategy="cluster", TagSpecifications=tags)
        params = self._run_params(ctx, scope, subnet=o.subnets[0] if o.subnets else None, security_group=None,
                                  placement_group=None, key_name=None, profile=None, token=None, internal_key="")
        check(f"launch {spec.nodes} x {spec.instance_type}", "run_instances", **params)
        lines.append("VPC, subnets, security group, key pair and IAM profile: not checked (no DryRun that creates nothing)")
        return lines

    # ---- launch -----------------------------------------------------------------------------------------
    def launch(self, spec: ClusterSpec, keys: ClusterKeys) -> Launched:
        self._launching.add(spec.name)
        ctx = self.context(spec)
        name = spec.name
        scope = self._launch_scope(name)
        existing = self._instances(scope)
        if existing and len(existing) != spec.nodes:
            raise ProvisionError(f"cluster {name} already has {len(existing)} instance(s) in {ctx.region}, not {spec.nodes}",
                                 f"bring it down first: clusterctl down {name} --yes")
        ssh_cidr = ctx.opts.ssh_cidr or detect_public_cidr()  # this run's range, and only it (the rest is revoked)
        net = self._existing_network(ctx, create=True) if (ctx.opts.vpc or ctx.opts.subnets) else self._ensure_network(ctx, scope)
        sg = self._ensure_security_group(ctx, scope, net, ssh_cidr)
        pg = self._ensure_placement_group(ctx, scope) if ctx.opts.placement and ctx.type.cluster_placement else None
        key = self._ensure_key_pair(ctx, scope, keys.operator_public)
        profile = self._ensure_instance_profile(ctx, scope)
        if existing:
            bad = [i["InstanceId"] for i in existing if i["State"]["Name"] not in ("pending", "running")]
            if bad:
                raise ProvisionError(f"cluster {name} has instance(s) that are not running: {', '.join(bad)}",
                                     f"bring it down first: clusterctl down {name} --yes")
            self.report(f"found {len(existing)} running instance(s) of {name} by tags: reusing them")
            ids = [i["InstanceId"] for i in existing]
        else:
            internal = keys.internal_public
            ids = self._run_with_fallback(ctx, scope, net, sg, pg, key, profile, internal)
        instances = self._wait_running(ids)
        instances = self._name_instances(name, instances)
        extra = {"vpc": net.vpc, "security_group": sg, "placement_group": pg or "", "key_pair": key,
                 "instance_profile": profile, "image": ctx.image.id, "image_name": ctx.image.name,
                 "network_created": "yes" if net.created else "no", "cluster_id": scope.id, "owner": scope.owner,
                 **self._fabric_extra(ctx), **_autostop_extra(spec)}
        extra["spot"] = "true" if ctx.opts.spot else "false"  # train polls spot nodes' interruption notice
        if fabric.needs_elastic_ip(ctx.type, ctx.opts.private_ips):
            leader = _ordered(instances)[0]
            address = fabric.ensure_elastic_ip(self, ctx, scope, leader)
            instances = [{**i, "PublicIpAddress": address} if i is leader else {**i, "PublicIpAddress": None}
                         for i in instances]
            extra.update({"elastic_ip": address, "ssh_jump": "leader"})
        return Launched(self._cluster(name, instances, extra=extra), {})

    @staticmethod
    def _fabric_extra(ctx: _Context) -> dict[str, str]:
        """What the launch needs to know of the node's fabric and image (launch.job_env, doctor)."""
        t, r = ctx.type, ctx.image.release
        return {"efa": "true" if fabric.efa_count(t) else "false", "efa_interfaces": str(fabric.efa_count(t)),
                "efa_rdma": "true" if fabric.efa_count(t) and t.efa_rdma else "false", "gpus": str(t.gpus),
                "driver_branch": str(r.driver_branch) if r else "", "cuda": r.cuda if r else ""}

    def _run_params(self, ctx: _Context, scope: Scope, *, subnet: str | None, security_group: str | None, placement_group: str | None,
                    key_name: str | None, profile: str | None, token: str | None, internal_key: str) -> dict:
        o, spec = ctx.opts, ctx.spec
        ebs: dict[str, Any] = {"VolumeSize": o.volume_size, "VolumeType": o.volume_type, "Encrypted": True,
                               "DeleteOnTermination": True}
        if o.effective_iops and o.volume_type in ("io1", "io2", "gp3"):
            ebs["Iops"] = o.effective_iops
        base_tags = scope.tags(ctx.region)
        inst_tags = {**base_tags, "Name": f"{spec.name}-node", TAG_SLOTS: str(ctx.slots), TAG_USER: ctx.image.ssh_user}
        tag_specs = [{"ResourceType": "instance", "Tags": _tags(inst_tags)},
                     {"ResourceType": "volume", "Tags": _tags(base_tags)},
                     {"ResourceType": "network-interface", "Tags": _tags(base_tags)}]
        if o.spot:
            tag_specs.append({"ResourceType": "spot-instances-request", "Tags": _tags(base_tags)})
        nics = fabric.network_interfaces(ctx.type, subnet=subnet, security_group=security_group, public=not o.private_ips)
        params: dict[str, Any] = {
            "ImageId": ctx.image.id, "InstanceType": spec.instance_type, "MinCount": spec.nodes, "MaxCount": spec.nodes,
            "NetworkInterfaces": nics,
            "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled", "HttpPutResponseHopLimit": 1},
            "BlockDeviceMappings": [{"DeviceName": ctx.image.root_device, "Ebs": ebs}],
            "InstanceInitiatedShutdownBehavior": "terminate",
            "TagSpecifications": tag_specs,
            "UserData": render_user_data(spec.name, ctx.region, ctx.image.ssh_user, ctx.slots, internal_key,
                                         autostop=spec.autostop),
        }
        if key_name:
            params["KeyName"] = key_name
        if token:
            params["ClientToken"] = token
        if placement_group:
            params["Placement"] = {"GroupName": placement_group}
        if profile:
            params["IamInstanceProfile"] = {"Name": profile}
        if o.spot:
            params["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": {
                "SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}}
        return params

    def _launch_file(self, name: str) -> Path:
        return self.store.ensure_dir(name) / "aws-launch.json"

    def _run_with_fallback(self, ctx: _Context, scope: Scope, net: Network, sg: str, pg: str | None, key: str,
                           profile: str, internal_key: str) -> list[str]:
        """One all-or-nothing RunInstances per AZ until one has capacity. The ClientToken of each attempt
        is saved before the call; botocore's retries of that call reuse it, and so does a later `up` whose
        predecessor never saw the answer, so EC2 returns that launch instead of making a second one."""
        name = ctx.spec.name
        path = self._launch_file(name)
        try:
            saved = json.loads(path.read_text()) if path.exists() else {}
        except ValueError:
            saved = {}
        tried: list[str] = []
        for attempt, (subnet, az) in enumerate(net.subnets, start=1):
            reuse = saved.get("state") == "sent" and saved.get("subnet") == subnet
            token = saved["token"] if reuse else _token(name, attempt)
            params = self._run_params(ctx, scope, subnet=subnet, security_group=sg, placement_group=pg, key_name=key,
                                      profile=profile, token=token, internal_key=internal_key)
            self.report(f"launching {ctx.spec.nodes} x {ctx.spec.instance_type} in {az}")
            outcome, detail = self._run_once(path, params, subnet, az, attempt)
            if outcome == "capacity":
                tried.append(f"{az} ({detail})")
                self.report(f"no capacity for {ctx.spec.nodes} x {ctx.spec.instance_type} in {az} ({detail}); "
                            + ("trying the next AZ" if attempt < len(net.subnets) else "no AZ left"))
                continue
            ids = list(detail)
            if len(ids) != ctx.spec.nodes:
                raise ProvisionError(f"EC2 launched {len(ids)} instance(s), not {ctx.spec.nodes}")
            return ids
        raise CapacityError(
            f"no capacity for {ctx.spec.nodes} x {ctx.spec.instance_type} in {ctx.region}: tried {', '.join(tried)}",
            "try later, another region (--region) or type (--type), or fewer nodes; nothing was left running")

    def _run_once(self, path: Path, params: dict, subnet: str, az: str, attempt: int) -> tuple[str, Any]:
        from botocore.exceptions import ClientError

        def save(state: str, **more) -> None:
            atomic_write(path, json.dumps({"token": params["ClientToken"], "subnet": subnet, "az": az,
                                           "state": state, "at": time.time(), **more}) + "\n")

        save("sent")
        profile_deadline = time.monotonic() + 120
        while True:
            try:
                resp = self._call("ec2", "run_instances", **params)
            except ClientError as exc:
                code, msg = _code(exc), _message(exc)
                if code == "InvalidParameterValue" and "iamInstanceProfile" in msg and time.monotonic() < profile_deadline:
                    self.report("the new instance profile is not visible to EC2 yet; retrying")
                    time.sleep(min(5.0, max(0.2, self.poll_interval)))
                    continue
                if code == "IdempotentParameterMismatch":  # an old token with other settings: start afresh
                    params["ClientToken"] = _token(str(params["ClientToken"]).rsplit("-", 2)[0], attempt)
                    save("sent")
                    continue
                if code in CAPACITY_CODES:
                    save("failed", error=code)
                    return "capacity", code
                raise self._error("RunInstances", exc) from None
            ids = [i["InstanceId"] for i in resp.get("Instances", [])]
            save("launched", instances=ids)
            return "launched", ids

    def _wait_running(self, ids: list[str]) -> list[dict]:
        """Bounded polling until every instance runs with its addresses; fails fast if one dies."""
        from botocore.exceptions import ClientError

        deadline = time.monotonic() + self.wait_timeout
        self.report(f"waiting for {len(ids)} instance(s) to run")
        while True:
            try:
                found = [i for r in self._call("ec2", "describe_instances", InstanceIds=ids)["Reservations"]
                         for i in r["Instances"]]
            except ClientError as exc:
                if _code(exc) != "InvalidInstanceID.NotFound":  # not visible yet right after launch
                    raise self._error("DescribeInstances", exc) from None
                found = []
            dead = [i for i in found if i["State"]["Name"] in ("shutting-down", "terminated", "stopping", "stopped")]
            if dead:
                why = "; ".join(f"{i['InstanceId']}: {i['State']['Name']} ({i.get('StateReason', {}).get('Message', '')})"
                                for i in dead)
                raise ProvisionError(f"instance(s) stopped while starting: {why}")
            ready = [i for i in found if i["State"]["Name"] == "running" and i.get("PrivateIpAddress")
                     and (i.get("PublicIpAddress") or not self._public_at_launch())]
            if len(ready) == len(ids):
                return ready
            if time.monotonic() > deadline:
                raise WaitTimeout(f"{len(ids) - len(ready)} of {len(ids)} instance(s) not running after "
                                  f"{self.wait_timeout:.0f}s", "see the EC2 console; `clusterctl down` removes them")
            time.sleep(self.poll_interval)

    def _public_at_launch(self) -> bool:
        """EC2 gives each node a public address at launch: not with --private-ips, nor with several
        interfaces (the leader's Elastic IP comes after)."""
        ctx = self._ctx
        return not (ctx and (ctx.opts.private_ips or fabric.interface_count(ctx.type) > 1))

    def _name_instances(self, name: str, instances: list[dict]) -> list[dict]:
        ordered = _ordered(instances)
        names = node_names(name, len(ordered))
        out = []
        for index, (inst, node_name) in enumerate(zip(ordered, names)):
            tags = _tagdict(inst)
            want = {"Name": node_name, TAG_ROLE: "leader" if index == 0 else "member", TAG_INDEX: str(index)}
            if any(tags.get(k) != v for k, v in want.items()):
                self._api("ec2", "create_tags", Resources=[inst["InstanceId"]], Tags=_tags(want))
            out.append({**inst, "Tags": _tags({**tags, **want})})
        return out

    def _cluster(self, name: str, instances: list[dict], extra: Mapping[str, str] | None = None) -> Cluster:
        ordered = _ordered(instances)
        nodes = []
        for index, inst in enumerate(ordered):
            tags = _tagdict(inst)
            nodes.append(Node(
                name=tags.get("Name") or node_names(name, len(ordered))[index],
                private_ip=inst.get("PrivateIpAddress", ""),
                slots=int(tags.get(TAG_SLOTS) or 1),
                role="leader" if index == 0 else "member",
                ssh_user=tags.get(TAG_USER) or "ubuntu",
                public_ip=inst.get("PublicIpAddress") or None,
                instance_id=inst["InstanceId"],
            ))
        first = ordered[0] if ordered else {}
        facts = {"az": first.get("Placement", {}).get("AvailabilityZone", ""),
                 "subnet": first.get("SubnetId", ""), **(extra or {})}
        launched = min((_epoch(i.get("LaunchTime")) for i in ordered), default=time.time())
        return Cluster(name=name, provider=self.name, nodes=tuple(nodes), region=self.region,
                       instance_type=first.get("InstanceType", ""), created_at=launched,
                       extra={k: str(v) for k, v in facts.items()})

    # ---- shared resources (each step finds what an earlier run made before creating) ------------------
    def _find_one(self, op: str, key: str, scope: Scope, **filters) -> dict | None:
        flt = scope.filters() + [{"Name": k, "Values": [v]} for k, v in filters.items()]
        items = [i for i in self._api("ec2", op, Filters=flt).get(key, []) if scope.holds(_tagdict(i))]
        return items[0] if items else None

    def _zones(self) -> list[str]:
        zones = self._api("ec2", "describe_availability_zones",
                          Filters=[{"Name": "state", "Values": ["available"]}]).get("AvailabilityZones", [])
        return sorted(z["ZoneName"] for z in zones if z.get("ZoneType", "availability-zone") == "availability-zone")

    def _zones_for(self, ctx: _Context, zones: list[str]) -> list[str]:
        """The AZs that offer the type, in order; all of them when the API has no offerings for it."""
        offers = self._paginate("ec2", "describe_instance_type_offerings", "InstanceTypeOfferings",
                                LocationType="availability-zone",
                                Filters=[{"Name": "instance-type", "Values": [ctx.spec.instance_type]}])
        offered = {o["Location"] for o in offers}
        if not offered:
            return zones
        return [z for z in zones if z in offered]

    def _ensure_network(self, ctx: _Context, scope: Scope) -> Network:
        name, o = ctx.spec.name, ctx.opts
        base = scope.tags(ctx.region)
        vpc = self._find_one("describe_vpcs", "Vpcs", scope)
        if vpc is None:
            vpc = self._api("ec2", "create_vpc", CidrBlock=o.cidr, TagSpecifications=[
                {"ResourceType": "vpc", "Tags": _tags({**base, "Name": f"clusterctl-{name}"})}])["Vpc"]
            self.report(f"created VPC {vpc['VpcId']} ({o.cidr})")
            self._settled("ec2", "modify_vpc_attribute", VpcId=vpc["VpcId"], EnableDnsSupport={"Value": True})
            self._settled("ec2", "modify_vpc_attribute", VpcId=vpc["VpcId"], EnableDnsHostnames={"Value": True})
        vpc_id = vpc["VpcId"]
        cidr = ipaddress.ip_network(vpc.get("CidrBlock") or o.cidr)
        if not o.private_ips:
            igw = self._find_one("describe_internet_gateways", "InternetGateways", scope)
            if igw is None:
                igw = self._api("ec2", "create_internet_gateway", TagSpecifications=[
                    {"ResourceType": "internet-gateway", "Tags": _tags({**base, "Name": f"clusterctl-{name}"})}]
                )["InternetGateway"]
                self.report(f"created internet gateway {igw['InternetGatewayId']}")
            if not any(a.get("VpcId") == vpc_id for a in igw.get("Attachments", [])):
                self._settled("ec2", "attach_internet_gateway", InternetGatewayId=igw["InternetGatewayId"], VpcId=vpc_id)
            main = self._api("ec2", "describe_route_tables", Filters=[
                {"Name": "vpc-id", "Values": [vpc_id]}, {"Name": "association.main", "Values": ["true"]}]
            ).get("RouteTables", [])
            if main and not any(r.get("DestinationCidrBlock") == "0.0.0.0/0" for r in main[0].get("Routes", [])):
                self._settled("ec2", "create_route", RouteTableId=main[0]["RouteTableId"],
                          DestinationCidrBlock="0.0.0.0/0", GatewayId=igw["InternetGatewayId"])
        zones = self._zones()
        have = {s["AvailabilityZone"]: s for s in self._api("ec2", "describe_subnets", Filters=[
            *scope.filters(), {"Name": "vpc-id", "Values": [vpc_id]}]).get("Subnets", []) if scope.holds(_tagdict(s))}
        blocks = list(cidr.subnets(new_prefix=min(28, cidr.prefixlen + 4)))
        subnets = []
        for index, az in enumerate(zones[:len(blocks)]):
            sub = have.get(az)
            if sub is None:
                sub = self._settled("ec2", "create_subnet", VpcId=vpc_id, AvailabilityZone=az, CidrBlock=str(blocks[index]),
                                TagSpecifications=[{"ResourceType": "subnet", "Tags": _tags(
                                    {**base, "Name": f"clusterctl-{name}-{az}"})}])["Subnet"]
                self.report(f"created subnet {sub['SubnetId']} ({blocks[index]}, {az})")
            subnets.append((sub["SubnetId"], az))
        fabric.ensure_s3_endpoint(self, ctx, scope, vpc_id)
        order = self._zones_for(ctx, [az for _, az in subnets])
        by_az = dict((az, s) for s, az in subnets)
        return Network(vpc_id, tuple((by_az[az], az) for az in order), True)

    def _existing_network(self, ctx: _Context, create: bool) -> Network:
        o = ctx.opts
        if o.subnets:
            subs = self._api("ec2", "describe_subnets", SubnetIds=list(o.subnets)).get("Subnets", [])
            by_id = {s["SubnetId"]: s for s in subs}
            ordered = [by_id[s] for s in o.subnets if s in by_id]
        else:
            ordered = sorted(self._api("ec2", "describe_subnets", Filters=[{"Name": "vpc-id", "Values": [o.vpc]}]
                                       ).get("Subnets", []), key=lambda s: s["AvailabilityZone"])
        if not ordered:
            raise ConfigError(f"no subnets found for {'--subnet ' + ', '.join(o.subnets) if o.subnets else '--vpc ' + str(o.vpc)}",
                              "check the ids and the region")
        vpcs = {s["VpcId"] for s in ordered}
        if len(vpcs) != 1 or (o.vpc and o.vpc not in vpcs):
            raise ConfigError("the --subnet(s) must all be in one VPC (the --vpc, when given)")
        order = self._zones_for(ctx, [s["AvailabilityZone"] for s in ordered])
        pairs = tuple((s["SubnetId"], s["AvailabilityZone"]) for s in ordered if s["AvailabilityZone"] in order)
        if not pairs:
            raise ConfigError(f"{ctx.spec.instance_type} is not offered in the AZs of the given subnets")
        return Network(vpcs.pop(), pairs, False)

    def _ensure_security_group(self, ctx: _Context, scope: Scope, net: Network, ssh_cidr: str) -> str:
        name = ctx.spec.name
        sg = self._find_one("describe_security_groups", "SecurityGroups", scope, **{"vpc-id": net.vpc})
        if sg is None:
            sg_id = self._settled("ec2", "create_security_group", GroupName=scope.group, VpcId=net.vpc,
                              Description=f"clusterctl cluster {name}: all traffic within the cluster, ssh from one range",
                              TagSpecifications=[{"ResourceType": "security-group", "Tags": _tags(
                                  {**scope.tags(ctx.region), "Name": scope.group})}])["GroupId"]
            self.report(f"created security group {sg_id}")
            sg = {"GroupId": sg_id, "IpPermissions": [], "IpPermissionsEgress": []}
        sg_id = sg["GroupId"]
        self_rule = {"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": sg_id, "Description": "within the cluster"}]}
        wanted_in = [self_rule, _ssh_rule(ssh_cidr)]
        for op, rules, have in (("authorize_security_group_ingress", wanted_in, sg.get("IpPermissions", [])),
                                ("authorize_security_group_egress", [self_rule], sg.get("IpPermissionsEgress", []))):
            for rule in rules:
                if _has_rule(have, rule):
                    continue
                try:
                    self._settled("ec2", op, GroupId=sg_id, IpPermissions=[rule])
                except ClusterctlError as exc:
                    if "InvalidPermission.Duplicate" not in exc.message:
                        raise
        self._revoke_other_ssh(sg_id, sg.get("IpPermissions", []), ssh_cidr)
        return sg_id

    def _revoke_other_ssh(self, sg_id: str, have: list[dict], ssh_cidr: str) -> None:
        """Ingress that reaches port 22 from any range but this run's is revoked (after this run's rule is in, so
        there is no moment without it): an earlier run's /32 or a one-time 0.0.0.0/0 does not stay open."""
        stale = _stale_ssh(have, ssh_cidr)
        if stale:
            self._settled("ec2", "revoke_security_group_ingress", GroupId=sg_id, IpPermissions=stale)
            self.report(f"revoked ssh from {', '.join(_ranges(stale))} (this run allows {ssh_cidr} only)")

    def refresh_access(self, spec: ClusterSpec, cluster: Cluster) -> None:
        """`up` of a cluster that is already up: its ssh rule becomes exactly this run's range."""
        sg_id = cluster.extra.get("security_group", "")
        if not sg_id:
            return
        ctx = self.context(spec)
        ssh_cidr = ctx.opts.ssh_cidr or detect_public_cidr()
        groups = self._api("ec2", "describe_security_groups", GroupIds=[sg_id]).get("SecurityGroups", [])
        if not groups:
            return
        have = groups[0].get("IpPermissions", [])
        if not _has_rule(have, _ssh_rule(ssh_cidr)):
            self._settled("ec2", "authorize_security_group_ingress", GroupId=sg_id, IpPermissions=[_ssh_rule(ssh_cidr)])
            self.report(f"ssh (22) allowed from {ssh_cidr}")
        self._revoke_other_ssh(sg_id, have, ssh_cidr)

    def _ensure_placement_group(self, ctx: _Context, scope: Scope) -> str:
        from botocore.exceptions import ClientError

        name = ctx.spec.name
        group = scope.group
        try:
            found = self._call("ec2", "describe_placement_groups", GroupNames=[group]).get("PlacementGroups", [])
        except ClientError as exc:
            if not NOT_FOUND.search(_code(exc)):
                raise self._error("DescribePlacementGroups", exc) from None
            found = []
        if found:
            if not scope.holds(_tagdict(found[0])):
                raise ConfigError(f"placement group {group} exists but is not this cluster {name}'s ({scope.label()})",
                                  "choose another --name")
            return group
        self._api("ec2", "create_placement_group", GroupName=group, Strategy="cluster", TagSpecifications=[
            {"ResourceType": "placement-group", "Tags": _tags(scope.tags(ctx.region))}])
        self.report(f"created placement group {group}")
        return group

    def _ensure_key_pair(self, ctx: _Context, scope: Scope, public_key: str) -> str:
        from botocore.exceptions import ClientError

        name = ctx.spec.name
        key_name = scope.group
        try:
            found = self._call("ec2", "describe_key_pairs", KeyNames=[key_name], IncludePublicKey=True).get("KeyPairs", [])
        except ClientError as exc:
            if not NOT_FOUND.search(_code(exc)):
                raise self._error("DescribeKeyPairs", exc) from None
            found = []
        material = " ".join(public_key.split()[:2])
        if found:
            theirs = " ".join((found[0].get("PublicKey") or "").split()[:2])
            if (theirs and theirs != material) or not scope.holds(_tagdict(found[0])):
                raise ProvisionError(
                    f"key pair {key_name} in {ctx.region} holds another key than this machine's for cluster {name}",
                    f"the local state was lost or belongs elsewhere: `clusterctl down {name} --yes`, then up again")
            return key_name
        self._api("ec2", "import_key_pair", KeyName=key_name, PublicKeyMaterial=material.encode(), TagSpecifications=[
            {"ResourceType": "key-pair", "Tags": _tags(scope.tags(ctx.region))}])
        self.report(f"imported key pair {key_name}")
        return key_name

    def _ensure_instance_profile(self, ctx: _Context, scope: Scope) -> str:
        """The cluster's own role and profile, named by its id; one that exists under that name but carries
        another identity's tags is never reused (nor its policy rewritten)."""
        from botocore.exceptions import ClientError

        name = ctx.spec.name
        iname = scope.iam(ctx.region)
        tags = _tags(scope.tags(ctx.region))
        try:
            role = self._call("iam", "get_role", RoleName=iname)["Role"]
            if not scope.holds(_tagdict(role)):
                raise ProvisionError(f"IAM role {iname} exists but is not this cluster {name}'s ({scope.label()})",
                                     "choose another --name, or bring the other cluster down")
        except ClientError as exc:
            if _code(exc) != "NoSuchEntity":
                raise self._error("iam GetRole", exc) from None
            self._api("iam", "create_role", RoleName=iname, Path=IAM_PATH, AssumeRolePolicyDocument=json.dumps(EC2_TRUST),
                      Description=f"clusterctl cluster {name} in {ctx.region}: nodes' own identity", Tags=tags,
                      MaxSessionDuration=3600)
            self.report(f"created IAM role {iname}")
        if ctx.opts.s3_read:
            self._api("iam", "put_role_policy", RoleName=iname, PolicyName="s3-read",
                      PolicyDocument=json.dumps(s3_read_policy(ctx.opts.s3_read)))
        try:
            prof = self._call("iam", "get_instance_profile", InstanceProfileName=iname)["InstanceProfile"]
            if not scope.holds(_tagdict(prof)):
                raise ProvisionError(f"IAM instance profile {iname} exists but is not this cluster {name}'s",
                                     "choose another --name, or bring the other cluster down")
        except ClientError as exc:
            if _code(exc) != "NoSuchEntity":
                raise self._error("iam GetInstanceProfile", exc) from None
            prof = self._api("iam", "create_instance_profile", InstanceProfileName=iname, Path=IAM_PATH,
                             Tags=tags)["InstanceProfile"]
            self.report(f"created IAM instance profile {iname}")
        if not any(r.get("RoleName") == iname for r in prof.get("Roles", [])):
            self._api("iam", "add_role_to_instance_profile", InstanceProfileName=iname, RoleName=iname)
        return iname

    def grant_checkpoint_write(self, cluster: Cluster, uri: str) -> None:
        """`train --checkpoint-to`: the nodes' role may write checkpoints under `uri` only (its own inline
        policy, replaced by the next --checkpoint-to)."""
        role = cluster.extra.get("instance_profile", "")  # the role has the instance profile's name
        if not role:
            raise ConfigError(f"cluster {cluster.name} has no instance profile on record",
                              "bring it up again with this clusterctl, or give the nodes S3 access yourself")
        self._api("iam", "put_role_policy", RoleName=role, PolicyName="checkpoints-write",
                  PolicyDocument=json.dumps(s3_checkpoint_policy(uri)))
        self.report(f"IAM role {role} may write s3 checkpoints under {uri} (and nothing else)")

    # ---- after launch: host keys from the console -----------------------------------------------------
    def host_keys(self, cluster: Cluster) -> dict[str, tuple[str, ...]]:
        """Host keys cloud-init printed to each node's console: an authenticated source (EC2's API, signed and
        over TLS). Read with Latest=True where the type takes it (Nitro: the console as it is now; other types
        get what EC2 posted, some minutes after boot), polled for at most console_wait (CONSOLE_WAIT, 10
        minutes) or until cloud-init says it finished without printing keys. A node missing here fails `up`
        unless the operator accepts first contact (provision.pin_host_keys)."""
        from botocore.exceptions import ClientError

        found: dict[str, tuple[str, ...]] = {}
        pending = {n.instance_id: n for n in cluster.nodes if n.instance_id}
        ctx = self._ctx
        info = ctx.type if ctx is not None and ctx.type.name == cluster.instance_type else \
            self.type_info(cluster.instance_type) if cluster.instance_type else None
        latest = bool(info and info.nitro)
        deadline = time.monotonic() + self.console_wait
        while pending:
            for iid, node in list(pending.items()):
                try:
                    out = self._call("ec2", "get_console_output", InstanceId=iid,
                                     **({"Latest": True} if latest else {})).get("Output") or ""
                except ClientError as exc:
                    if latest and _code(exc) in ("UnsupportedOperation", "InvalidParameterCombination"):
                        latest = False  # the type said Nitro, EC2 disagrees: the posted console, then
                        continue
                    raise self._error("GetConsoleOutput", exc) from None
                text = _decode_console(out)
                keys = host_keys_from_console(text)
                if keys:
                    found[node.ssh_host] = keys
                    del pending[iid]
                elif _CLOUD_INIT_DONE.search(text):
                    del pending[iid]  # cloud-init is done and printed no keys: they will not come
            if not pending or time.monotonic() > deadline:
                break
            time.sleep(self.poll_interval)
        if found:
            self.report(f"host keys of {len(found)} node(s) read from their console output (cloud-init"
                        + (", GetConsoleOutput Latest=True)" if latest else ")"))
        missing = [n.ssh_host for n in cluster.nodes if n.ssh_host not in found]
        if missing:
            self.report(f"no host keys in the console output of {len(missing)} node(s) after "
                        f"{self.console_wait:.0f}s at most: {', '.join(missing)}")
        return found

    # ---- find / status / ls ---------------------------------------------------------------------------
    def _instances(self, scope: Scope | None, states: list[str] | None = None) -> list[dict]:
        """The scope's instances (every clusterctl instance with None), each checked against its tags."""
        flt = [{"Name": "instance-state-name", "Values": states or ["pending", "running", "stopping", "stopped"]}]
        flt += scope.filters() if scope is not None else [{"Name": "tag-key", "Values": [TAG]}]
        reservations = self._paginate("ec2", "describe_instances", "Reservations", Filters=flt)
        return [i for r in reservations for i in r.get("Instances", [])
                if (scope.holds(_tagdict(i)) if scope is not None else TAG in _tagdict(i))]

    def _view(self, name: str) -> Scope:
        """What `ls`/`status`/`find` show for a name: the identity this machine knows, else every one."""
        return self.known_scope(name) or Scope(name, every=True)

    def find(self, name: str) -> Cluster | None:
        instances = self._instances(self._view(name))
        if not instances:
            return None
        tags = _tagdict(_ordered(instances)[0])
        return self._cluster(name, instances, extra={"cluster_id": tags.get(TAG_ID, ""), "owner": tags.get(TAG_OWNER, "")})

    def status(self, name: str) -> ClusterStatus | None:
        return self._statuses(name).get(name)

    def node_facts(self, cluster: Cluster) -> dict[str, NodeFacts]:
        """Type, AZ and placement group of each node now, by node name (one DescribeInstances)."""
        by_id = {i["InstanceId"]: i for i in self._instances(self._view(cluster.name), LIVE_STATES)}
        out = {}
        for n in cluster.nodes:
            inst = by_id.get(n.instance_id or "")
            if inst is not None:
                placement = inst.get("Placement", {})
                out[n.name] = NodeFacts(inst.get("InstanceType", ""), placement.get("AvailabilityZone", ""),
                                        placement.get("GroupName", ""))
        return out

    def reboot(self, cluster: Cluster, hosts: Iterable[str], timeout: float = 60.0) -> None:
        return None  # an instance has its own kernel: the caller reboots it over ssh and waits for its new boot id

    def statuses(self) -> dict[str, ClusterStatus]:
        """Every cluster of this account and region, in one DescribeInstances (plus the sweep of names)."""
        out = self._statuses(None)
        for name in self.all_clusters():
            if name not in out:
                out[name] = ClusterStatus(name, self.name, self.region, "", (),
                                          tuple(f.line() for f in self._listing(self._view(name))))
        return dict(sorted(out.items()))

    def _statuses(self, name: str | None) -> dict[str, ClusterStatus]:
        by_cluster: dict[str, list[dict]] = {}
        for inst in self._instances(self._view(name) if name else None, LIVE_STATES):
            by_cluster.setdefault(_tagdict(inst).get(TAG, ""), []).append(inst)
        out = {}
        volumes = self._volume_prices(name) if by_cluster else {}
        for cname, instances in by_cluster.items():
            cluster = self._cluster(cname, instances)
            by_id = {i["InstanceId"]: i for i in instances}
            nodes = []
            for n in cluster.nodes:
                inst = by_id[n.instance_id]
                vol = volumes.get(n.instance_id or "", 0.0)
                inst_price = catalog.instance_price(inst.get("InstanceType", ""))
                nodes.append(NodeStatus(n, inst["State"]["Name"], inst.get("Placement", {}).get("AvailabilityZone", ""),
                                        _epoch(inst.get("LaunchTime")), None if inst_price is None else inst_price + vol))
            out[cname] = ClusterStatus(cname, self.name, self.region, cluster.instance_type, tuple(nodes))
        if name is not None and name not in out:
            left = self._listing(self._view(name))
            if left:
                out[name] = ClusterStatus(name, self.name, self.region, "", (), tuple(f.line() for f in left))
        return out

    def _volume_prices(self, name: str | None) -> dict[str, float]:
        """USD/hour of the tagged volumes attached to each instance (one DescribeVolumes)."""
        flt = [{"Name": f"tag:{TAG}", "Values": [name]} if name else {"Name": "tag-key", "Values": [TAG]}]
        out: dict[str, float] = {}
        for vol in self._paginate("ec2", "describe_volumes", "Volumes", Filters=flt):
            if name and _tagdict(vol).get(TAG) != name:
                continue
            for att in vol.get("Attachments", []):
                out[att["InstanceId"]] = out.get(att["InstanceId"], 0.0) + catalog.volume_price(
                    vol.get("VolumeType", "gp3"), int(vol.get("Size", 0)), vol.get("Iops"))
        return out

    def all_clusters(self) -> list[str]:
        """The names (valid ones: anything else is reachable by `gc`, by resource id, only) of every cluster here."""
        from clusterctl.cluster.state import validate_name

        names = set()
        for f in self._listing(None):
            try:
                names.add(validate_name(f.cluster))
            except ConfigError:
                pass
        return sorted(names)

    def inventory(self) -> list[Found]:
        """Everything of this account and region (and its IAM entities) that carries clusterctl's tag, with
        when it was made, by whom and under which cluster id, whatever cluster it belongs to and whether or not a
        record of it exists anywhere (for `gc`, which removes exactly these by id: remove())."""
        return self._listing(None)

    def _listing(self, scope: Scope | None) -> list[Found]:
        """Every resource of the scope (every clusterctl resource with None) that still exists: instances, the
        tagged kinds, the IAM role and instance profile; each checked against its tags exactly (EC2's filters
        take `*` and `?` as wildcards)."""
        flt = scope.filters() if scope is not None else [{"Name": "tag-key", "Values": [TAG]}]
        out: list[Found] = []

        def add(item: dict, kind: str, rid: str, created: Any = None, state: str = "") -> None:
            tags = _tagdict(item)
            if TAG in tags and (scope is None or scope.holds(tags)):
                out.append(Found(tags[TAG], kind, rid, _epoch(created) if created else None,
                                 tags.get(TAG_OWNER, ""), state, tags.get(TAG_ID, "")))

        for inst in _ordered(self._instances(scope, LIVE_STATES)):
            add(inst, "instance", inst["InstanceId"], inst.get("LaunchTime"), inst["State"]["Name"])
        for op, key_name, kind, id_key, time_key in TAGGED_KINDS:
            for item in self._api("ec2", op, Filters=flt).get(key_name, []):
                if not _gone(kind, item):
                    add(item, kind, item[id_key], item.get(time_key) if time_key else None,
                        item.get("State") or item.get("Status") or "")
        return out + self._iam_listing(scope)

    def _iam_listing(self, scope: Scope | None) -> list[Found]:
        """The scope's IAM instance profile and role: by name (the id's, or before ids name + region), else every
        one under /clusterctl/ of this region, with their tags (IAM lists no tags: one Get each)."""
        legacy = re.compile(rf"^clusterctl-(.+)-{re.escape(self.region)}$")
        out: list[Found] = []
        for kind, get, listing, key, name_key in (
                ("IAM instance profile", "get_instance_profile", "list_instance_profiles", "InstanceProfiles",
                 "InstanceProfileName"), ("IAM role", "get_role", "list_roles", "Roles", "RoleName")):
            if scope is not None and not scope.every:
                names = [scope.iam(self.region)]
            else:
                names = [i[name_key] for i in self._paginate("iam", listing, key, PathPrefix=IAM_PATH)
                         if legacy.match(i[name_key]) or re.match(r"^clusterctl-[0-9a-f]{12}$", i[name_key])]
            for iname in names:
                item = self._iam_get(get, iname)
                if item is None:
                    continue
                tags = _tagdict(item)
                if tags.get(TAG_REGION, self.region) != self.region:
                    continue  # IAM is global: another region's cluster
                if TAG not in tags and legacy.match(iname):
                    tags = {TAG: legacy.match(iname).group(1)}  # type: ignore[union-attr]  # matched just above
                if TAG in tags and (scope is None or scope.holds(tags)):
                    out.append(Found(tags[TAG], kind, iname, _epoch(item.get("CreateDate")), tags.get(TAG_OWNER, ""),
                                     "", tags.get(TAG_ID, "")))
        return out

    def _iam_get(self, op: str, iname: str) -> dict | None:
        from botocore.exceptions import ClientError

        kw, key = ({"RoleName": iname}, "Role") if op == "get_role" else ({"InstanceProfileName": iname}, "InstanceProfile")
        try:
            return self._call("iam", op, **kw)[key]
        except ClientError as exc:
            if _code(exc) != "NoSuchEntity":
                raise self._error(f"iam {op}", exc) from None
            return None

    # ---- down ---------------------------------------------------------------------------------------
    def resources(self, name: str) -> list[str]:
        return [f.line() for s in self._scopes_for(name) for f in self._listing(s)]

    def terminate(self, name: str) -> Teardown:
        """Remove everything of the cluster's identity (see _scopes_for), by id, in dependency order, waiting
        through dependency errors (bounded), then prove by a fresh listing that nothing of it is left."""
        scopes = self._scopes_for(name)
        removed = self._remove([f for s in scopes for f in self._listing(s)])
        return Teardown(tuple(removed), tuple(f.line() for s in scopes for f in self._listing(s)))

    def remove(self, found: Iterable[Found]) -> Teardown:
        """Exactly these resources (what `gc` listed and the operator confirmed), by their ids; then which of
        them are still there. Nothing is looked up by a name or a tag value."""
        items = list(found)
        removed = self._remove(items)
        wanted = {(f.kind, f.id) for f in items}
        return Teardown(tuple(removed), tuple(f.line() for f in self._listing(None) if (f.kind, f.id) in wanted))

    def _remove(self, items: list[Found]) -> list[str]:
        by: dict[str, list[str]] = {}
        for f in items:
            if f.id not in by.setdefault(f.kind, []):
                by[f.kind].append(f.id)
        removed: list[str] = []
        deadline = time.monotonic() + self.delete_timeout

        def described(op: str, key: str, id_filter: str, ids: list[str]) -> list[dict]:
            if not ids:
                return []
            got = self._api("ec2", op, Filters=[{"Name": id_filter, "Values": ids}]).get(key, [])
            return [i for i in got if any(i.get(k) in ids for k in ("NetworkInterfaceId", "VolumeId", "InternetGatewayId"))]

        ids = by.get("instance", [])
        if ids:
            instances = [i for r in self._paginate("ec2", "describe_instances", "Reservations",
                                                   Filters=[{"Name": "instance-id", "Values": ids}])
                         for i in r.get("Instances", []) if i["InstanceId"] in ids]
            live = [i for i in instances if i["State"]["Name"] != "terminated"]
            stop = [i["InstanceId"] for i in live if i["State"]["Name"] != "shutting-down"]
            if stop:
                self._api("ec2", "terminate_instances", InstanceIds=stop)
            if live:
                self._wait_terminated([i["InstanceId"] for i in live], deadline)
                removed += [f"instance {i['InstanceId']} ({_tagdict(i).get('Name', '')})" for i in _ordered(live)]
        removed += fabric.release_elastic_ips(self, by.get("Elastic IP", []), deadline)
        def each(kind: str, op: str, param: str, label: str | None = None, as_list: bool = False) -> None:
            """The kinds removed by one call per id (in the order the calls below make them)."""
            for rid in by.get(kind, []):
                if self._delete(deadline, "ec2", op, **{param: [rid] if as_list else rid}):
                    removed.append(f"{label or kind} {rid}")

        each("placement group", "delete_placement_group", "GroupName")
        each("key pair", "delete_key_pair", "KeyName")
        for eni in described("describe_network_interfaces", "NetworkInterfaces", "network-interface-id",
                             by.get("network interface", [])):
            if eni.get("Status") == "available" and self._delete(
                    deadline, "ec2", "delete_network_interface", NetworkInterfaceId=eni["NetworkInterfaceId"]):
                removed.append(f"network interface {eni['NetworkInterfaceId']}")
        for vol in described("describe_volumes", "Volumes", "volume-id", by.get("volume", [])):
            if vol.get("State") == "available" and self._delete(deadline, "ec2", "delete_volume", VolumeId=vol["VolumeId"]):
                removed.append(f"volume {vol['VolumeId']}")
        # VPC endpoints are listed live (deleted ones are left out of listings)
        each("VPC endpoint", "delete_vpc_endpoints", "VpcEndpointIds", "S3 gateway endpoint", as_list=True)
        each("security group", "delete_security_group", "GroupId")
        each("subnet", "delete_subnet", "SubnetId")
        for igw in described("describe_internet_gateways", "InternetGateways", "internet-gateway-id",
                             by.get("internet gateway", [])):
            for att in igw.get("Attachments", []):
                self._delete(deadline, "ec2", "detach_internet_gateway", InternetGatewayId=igw["InternetGatewayId"],
                             VpcId=att["VpcId"])
            if self._delete(deadline, "ec2", "delete_internet_gateway", InternetGatewayId=igw["InternetGatewayId"]):
                removed.append(f"internet gateway {igw['InternetGatewayId']}")
        each("VPC", "delete_vpc", "VpcId")
        for iname in by.get("IAM instance profile", []):
            if self._delete_profile(iname, deadline):
                removed.append(f"IAM instance profile {iname}")
        for iname in by.get("IAM role", []):
            if self._delete_role(iname, deadline):
                removed.append(f"IAM role {iname}")
        return removed

    def _wait_terminated(self, ids: list[str], deadline: float) -> None:
        self.report(f"waiting for {len(ids)} instance(s) to terminate")
        while True:
            found = [i for r in self._api("ec2", "describe_instances", InstanceIds=ids)["Reservations"] for i in r["Instances"]]
            if all(i["State"]["Name"] == "terminated" for i in found):
                return
            if time.monotonic() > deadline:
                return  # the final sweep names what is left
            time.sleep(self.poll_interval)

    def _delete(self, deadline: float, service: str, op: str, **kwargs) -> bool:
        """One delete, retried through dependency errors until the deadline. Already gone counts as done."""
        from botocore.exceptions import ClientError

        from clusterctl.retry import backoff

        delays = backoff(min(0.5, self.poll_interval), 10.0)
        while True:
            try:
                self._call(service, op, **kwargs)
                return True
            except ClientError as exc:
                code = _code(exc)
                if NOT_FOUND.search(code) or code == "Gateway.NotAttached":
                    return op.startswith("detach")
                if code not in DEPENDENCY_CODES or time.monotonic() > deadline:
                    if code in DEPENDENCY_CODES:
                        self.report(f"gave up on {op} {kwargs}: {code}")
                        return False
                    raise self._error(op, exc) from None
                delay = next(delays)
                self.report(f"{op}: {code}, waiting {delay:.1f}s")
                time.sleep(delay)

    def _delete_profile(self, iname: str, deadline: float) -> bool:
        prof = self._iam_get("get_instance_profile", iname)
        if prof is None:
            return False
        for role in prof.get("Roles", []):
            self._delete(deadline, "iam", "remove_role_from_instance_profile", InstanceProfileName=iname,
                         RoleName=role["RoleName"])
        return self._delete(deadline, "iam", "delete_instance_profile", InstanceProfileName=iname)

    def _delete_role(self, iname: str, deadline: float) -> bool:
        if self._iam_get("get_role", iname) is None:
            return False
        for policy in self._paginate("iam", "list_role_policies", "PolicyNames", RoleName=iname):
            self._delete(deadline, "iam", "delete_role_policy", RoleName=iname, PolicyName=policy)
        for attached in self._paginate("iam", "list_attached_role_policies", "AttachedPolicies", RoleName=iname):
            self._delete(deadline, "iam", "detach_role_policy", RoleName=iname, PolicyArn=attached["PolicyArn"])
        return self._delete(deadline, "iam", "delete_role", RoleName=iname)


# ---- helpers ---------------------------------------------------------------------------------------
# Every kind of EC2 resource a cluster may own, found by its tag (instances and IAM apart): `down`, `gc`,
# `ls` and the sweeps all read this one list. (describe op, response key, kind, id key, creation-time key)
TAGGED_KINDS = (
    ("describe_placement_groups", "PlacementGroups", "placement group", "GroupName", None),
    ("describe_key_pairs", "KeyPairs", "key pair", "KeyName", "CreateTime"),
    ("describe_addresses", "Addresses", "Elastic IP", "AllocationId", None),
    ("describe_security_groups", "SecurityGroups", "security group", "GroupId", None),
    ("describe_network_interfaces", "NetworkInterfaces", "network interface", "NetworkInterfaceId", None),
    ("describe_volumes", "Volumes", "volume", "VolumeId", "CreateTime"),
    ("describe_vpc_endpoints", "VpcEndpoints", "VPC endpoint", "VpcEndpointId", "CreationTimestamp"),
    ("describe_subnets", "Subnets", "subnet", "SubnetId", None),
    ("describe_internet_gateways", "InternetGateways", "internet gateway", "InternetGatewayId", None),
    ("describe_vpcs", "Vpcs", "VPC", "VpcId", None),
)


def _gone(kind: str, item: Mapping) -> bool:
    """Deleted things some describes still list for a while."""
    state = str(item.get("State") or "").lower()
    return (kind == "volume" and state in ("deleted", "deleting")) or (
        kind == "VPC endpoint" and state in ("deleted", "deleting"))


def _ordered(instances: list[dict]) -> list[dict]:
    """Leader first, then members: by the index tag when named, else by launch index, then id."""
    def key(i: dict):
        tags = _tagdict(i)
        index = tags.get(TAG_INDEX)
        return (0 if index is not None else 1, int(index) if index and index.isdigit() else 0,
                int(i.get("AmiLaunchIndex", 0)), i["InstanceId"])
    return sorted(instances, key=key)


def _has_rule(have: list[dict], rule: dict) -> bool:
    for h in have:
        if h.get("IpProtocol") != rule["IpProtocol"]:
            continue
        if rule["IpProtocol"] != "-1" and (h.get("FromPort"), h.get("ToPort")) != (rule.get("FromPort"), rule.get("ToPort")):
            continue
        if "UserIdGroupPairs" in rule and any(p.get("GroupId") == rule["UserIdGroupPairs"][0]["GroupId"]
                                              for p in h.get("UserIdGroupPairs", [])):
            return True
        if "IpRanges" in rule and any(r.get("CidrIp") == rule["IpRanges"][0]["CidrIp"] for r in h.get("IpRanges", [])):
            return True
    return False


def _ssh_rule(cidr: str) -> dict:
    return {"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22,
            "IpRanges": [{"CidrIp": cidr, "Description": "ssh from the operator"}]}


def _stale_ssh(have: list[dict], cidr: str) -> list[dict]:
    """The ranges of the ingress rules that let port 22 in from anywhere but `cidr` (IPv6 and prefix lists
    included), each with its own rule's protocol and ports, as RevokeSecurityGroupIngress wants them."""
    out = []
    for h in have:
        proto = str(h.get("IpProtocol"))
        if proto not in ("tcp", "6", "-1"):
            continue
        if proto != "-1" and not int(h.get("FromPort", 0)) <= 22 <= int(h.get("ToPort", 65535)):
            continue
        ranges = [{"CidrIp": r["CidrIp"]} for r in h.get("IpRanges", [])
                  if not (r.get("CidrIp") == cidr and (proto, h.get("FromPort"), h.get("ToPort")) == ("tcp", 22, 22))]
        v6 = [{"CidrIpv6": r["CidrIpv6"]} for r in h.get("Ipv6Ranges", [])]
        lists = [{"PrefixListId": r["PrefixListId"]} for r in h.get("PrefixListIds", [])]
        if ranges or v6 or lists:
            rule: dict[str, Any] = {"IpProtocol": proto}
            if proto != "-1":
                rule.update(FromPort=h.get("FromPort"), ToPort=h.get("ToPort"))
            for k, v in (("IpRanges", ranges), ("Ipv6Ranges", v6), ("PrefixListIds", lists)):
                if v:
                    rule[k] = v
            out.append(rule)
    return out


def _ranges(rules: list[dict]) -> list[str]:
    return [r.get("CidrIp") or r.get("CidrIpv6") or r.get("PrefixListId") for rule in rules
            for k in ("IpRanges", "Ipv6Ranges", "PrefixListIds") for r in rule.get(k, [])]


def _epoch(value: Any) -> float:
    if value is None:
        return time.time()
    if hasattr(value, "timestamp"):
        return float(value.timestamp())
    try:
        from datetime import datetime

        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return time.time()


def _decode_console(output: str) -> str:
    """GetConsoleOutput's Output is base64 on the wire; boto3 hands it over as text, maybe still encoded."""
    if not output:
        return ""
    if "\n" in output or " " in output:
        return output
    try:
        return base64.b64decode(output, validate=True).decode(errors="replace")
    except ValueError:
        return output
