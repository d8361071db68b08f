"""What a spec asks AWS for, resolved before anything is made: the instance type's facts, the image (and its
login user), the price, and the Context every launch step shares.

Apart from options.py because it asks AWS (DescribeInstanceTypes, DescribeImages, SSM), and apart from
instances.py because the fabric, the bootstrap and the plan need these facts too (instances.py needs them all).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from clusterctl.errors import ConfigError
from clusterctl.providers.aws import catalog
from clusterctl.providers.aws.api import NOT_FOUND, Api, _code, _tagdict
from clusterctl.providers.aws.options import AwsOptions
from clusterctl.types import ClusterSpec

IMAGE_USER_TAG = "clusterctl:ssh-user"  # an image may say which user logs in (custom AMIs)
DEFAULT_AMI_PARAMETER = catalog.DLAMI_SSM_PARAMETERS[0]


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
    cores: int = 0  # physical cores (VCpuInfo.DefaultCores, else the table's; 0: unknown)
    threads_per_core: int = 0  # hardware threads per core (0: unknown)
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
        facts = (
            f"NVIDIA driver R{r.driver_branch} ({r.driver}), CUDA {r.cuda} (driver and CUDA from the DLAMI "
            f"table of {catalog.DLAMI_TABLE_DATE})"
            if r
            else f"driver branch and CUDA not in clusterctl's DLAMI table of {catalog.DLAMI_TABLE_DATE}"
        )
        return f"{self.id} {self.name}; {facts}"


@dataclass
class Context:
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


# ---- facts: type, image, price ---------------------------------------------------------------
def type_info(api: Api, instance_type: str) -> TypeInfo:
    from botocore.exceptions import ClientError

    try:
        found = api.call("ec2", "describe_instance_types", InstanceTypes=[instance_type]).get("InstanceTypes", [])
    except ClientError as exc:
        if _code(exc) not in ("InvalidInstanceType", "InvalidParameterValue"):
            raise api.error("DescribeInstanceTypes", exc) from None
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
        cpus = catalog.cpus_of(t.get("VCpuInfo", {}), instance_type)
        return TypeInfo(
            instance_type,
            gpus,
            efa,
            "cluster" in strategies,
            "DescribeInstanceTypes",
            model,
            vcpus=int(t.get("VCpuInfo", {}).get("DefaultVCpus", 0) or 0),
            cores=cpus.cores if cpus else 0,
            threads_per_core=cpus.threads_per_core if cpus else 0,
            network_cards=int(net.get("MaximumNetworkCards", 1) or 1),
            max_efa=int(net.get("EfaInfo", {}).get("MaximumEfaInterfaces", 1 if efa else 0) or 0),
            efa_rdma=efa and catalog.efa_rdma(instance_type),
            nitro=t.get("Hypervisor") == "nitro" or bool(t.get("BareMetal")),
        )
    listed = catalog.gpus(instance_type)
    if listed is None and catalog.instance_price(instance_type) is None:
        raise ConfigError(
            f"instance type {instance_type!r} is unknown in {api.region}",
            "check the spelling, or pick a type offered in this region",
        )
    efa = catalog.efa(instance_type)
    cpus = catalog.CPUS.get(instance_type)
    return TypeInfo(
        instance_type,
        listed or 0,
        efa,
        True,
        "built-in table",
        cores=cpus.cores if cpus else 0,
        threads_per_core=cpus.threads_per_core if cpus else 0,
        max_efa=1 if efa else 0,
        efa_rdma=efa and catalog.efa_rdma(instance_type),
    )


def image(api: Api, opts: AwsOptions, info: TypeInfo | None = None) -> Image:
    """--ami, else --ami-parameter, else by GPU generation: a Volta type gets the newest DLAMI release of
    the table whose driver branch still drives Volta (found by name and owner), any other type the
    current Base OSS Nvidia Driver DLAMI (SSM)."""
    from botocore.exceptions import ClientError

    if opts.ami:
        ami, source = opts.ami, "--ami"
    elif opts.ami_parameter:
        ami, source = _ssm_image(api, opts.ami_parameter), f"SSM {opts.ami_parameter}"
    elif info is not None and info.volta:
        return _volta_image(api, opts, info)
    else:
        ami = source = ""
        for i, name in enumerate(catalog.DLAMI_SSM_PARAMETERS):
            try:
                ami, source = _ssm_image(api, name), f"SSM {name}"
                break
            except ConfigError:
                if i == len(catalog.DLAMI_SSM_PARAMETERS) - 1:
                    raise
    try:
        images = api.call("ec2", "describe_images", ImageIds=[ami]).get("Images", [])
    except ClientError as exc:
        if NOT_FOUND.search(_code(exc)):
            images = []
        else:
            raise api.error("DescribeImages", exc) from None
    if not images:
        raise ConfigError(f"image {ami} ({source}) does not exist in {api.region}", "pass another --ami")
    return _image_value(opts, images[0], source)


def _image_value(opts: AwsOptions, img: dict[str, Any], source: str) -> Image:
    ami = img["ImageId"]
    name = img.get("Name") or ami
    user = opts.ssh_user or ssh_user_for_image(name, _tagdict(img))
    if not user:
        raise ConfigError(f"cannot tell the login user of image {ami} ({name})", "pass --ssh-user")
    return Image(ami, name, user, img.get("RootDeviceName") or "/dev/sda1", source, catalog.dlami_release(name))


def _ssm_image(api: Api, parameter: str) -> str:
    from botocore.exceptions import ClientError

    try:
        value: str = api.call("ssm", "get_parameter", Name=parameter)["Parameter"]["Value"]
        return value
    except ClientError as exc:
        if _code(exc) == "ParameterNotFound":
            raise ConfigError(
                f"SSM parameter {parameter} does not exist in {api.region}",
                "pass --ami ami-..., or --ami-parameter with the image's public parameter",
            ) from None
        raise api.error("ssm GetParameter", exc) from None


def _volta_image(api: Api, opts: AwsOptions, info: TypeInfo) -> Image:
    rows = catalog.volta_releases()
    images = api.api(
        "ec2",
        "describe_images",
        Owners=[catalog.DLAMI_OWNER],
        Filters=[
            {"Name": "name", "Values": [r.name_pattern for r in rows]},
            {"Name": "architecture", "Values": ["x86_64"]},
            {"Name": "state", "Values": ["available"]},
        ],
    ).get("Images", [])
    images = [
        i
        for i in images
        if i.get("OwnerId", catalog.DLAMI_OWNER) == catalog.DLAMI_OWNER
        and (catalog.dlami_release(i.get("Name", "")) or rows[0]).volta
    ]
    if not images:
        raise ConfigError(
            f"no Deep Learning AMI with an NVIDIA driver of R{catalog.VOLTA_LAST_BRANCH} or older "
            f"(the last for Volta) found in {api.region} for {info.name}",
            "pass --ami with an image whose driver drives V100 GPUs",
        )
    newest = max(images, key=lambda i: (i.get("CreationDate") or "", i.get("Name") or ""))
    return _image_value(
        opts,
        newest,
        f"DLAMI table: Volta ({info.gpu_model or 'V100'}) needs NVIDIA driver "
        f"R{catalog.VOLTA_LAST_BRANCH} or older; newest such release of owner {catalog.DLAMI_OWNER}",
    )


def resolve(api: Api, spec: ClusterSpec) -> Context:
    """The spec's options, type, image, slots and price (the spec's region, when given, becomes the API's)."""
    opts = AwsOptions.from_spec(spec)
    if spec.region:
        api.region = spec.region
    info = type_info(api, spec.instance_type)
    img = image(api, opts, info)
    slots = spec.slots or info.gpus or 1
    return Context(
        spec,
        opts,
        api.region,
        info,
        img,
        slots,
        catalog.price(spec.instance_type, opts.volume_type, opts.volume_size, opts.effective_iops),
    )
