"""The AWS provider's fabric: EFA interfaces per network card, the leader's Elastic IP, the VPC's S3 gateway
endpoint, and what the plan reads before anything is created: the quotas and the current spot prices.

Part of the AWS provider (boto3 answers stay inside it): the functions that call AWS take its Api (api.py), so
errors, retries and the one-line messages are the provider's own; nothing here imports provider.py.

Why the shapes (docs/ARCHITECTURE.md, "The whole fabric"):
  * one EFA interface per network card, up to the type's EFA maximum; device index 0 on card 0 and 1 on
    every other card (EC2's rule for EFA on multi-card types);
  * EC2 auto-assigns no public IPv4 address to an instance launched with several interfaces, so the leader
    gets an Elastic IP (tagged like everything else the cluster owns) and members are reached through it
    (ProxyJump, both hops' host keys pinned);
  * nodes without public addresses still reach S3 through the VPC's gateway endpoint (free).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from clusterctl.errors import ClusterctlError, ProvisionError
from clusterctl.providers.aws import catalog
from clusterctl.providers.aws.api import LIVE_STATES, Api, _tagdict, _tags
from clusterctl.providers.aws.discovery import KIND, Scope, find_one
from clusterctl.providers.aws.machine import Context, TypeInfo, type_info


# ---- EFA ---------------------------------------------------------------------------------------------------
def efa_count(info: TypeInfo) -> int:
    """EFA interfaces per node: one per network card, at most the type's EFA maximum; 0 without EFA."""
    if not info.efa:
        return 0
    return max(1, min(info.network_cards or 1, info.max_efa or 1))


def interface_count(info: TypeInfo) -> int:
    return max(1, efa_count(info))


def network_interfaces(
    info: TypeInfo, *, subnet: str | None, security_group: str | None, public: bool
) -> list[dict[str, Any]]:
    """RunInstances' NetworkInterfaces: EFA on every card (device index 0 on card 0, 1 elsewhere), all in the
    cluster's subnet and security group. A public address is asked for only with a single interface: EC2
    refuses AssociatePublicIpAddress with several (the leader gets an Elastic IP instead)."""
    count = efa_count(info)
    nics: list[dict[str, Any]] = []
    for card in range(max(1, count)):
        nic: dict[str, Any] = {"DeviceIndex": 0 if card == 0 else 1, "DeleteOnTermination": True}
        if count > 1:
            nic["NetworkCardIndex"] = card
        if count:
            nic["InterfaceType"] = "efa"
        if subnet:
            nic["SubnetId"] = subnet
        if security_group:
            nic["Groups"] = [security_group]
        nics.append(nic)
    if len(nics) == 1:
        nics[0]["AssociatePublicIpAddress"] = public
    return nics


def needs_elastic_ip(info: TypeInfo, private_ips: bool) -> bool:
    return interface_count(info) > 1 and not private_ips


# ---- quotas ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class QuotaCheck:
    quota: catalog.Quota | None
    need: int
    used: int = 0
    value: float | None = None  # None: not known
    source: str = ""  # where the value came from, or why it was not checked

    @property
    def over(self) -> bool:
        return self.value is not None and self.used + self.need > self.value

    def line(self) -> str:
        if self.quota is None:
            return f"not checked ({self.source})"
        head = f"{self.quota.name} ({self.quota.code})"
        if self.value is None:
            return f"{head}: not checked ({self.source}); this cluster needs {self.need} {self.quota.unit}"
        return (
            f"{head}: {self.value:g} {self.quota.unit}, {self.used} in use, this cluster needs {self.need} "
            f"(from {self.source})"
        )


def _quota_value(api: Api, quota: catalog.Quota) -> tuple[float | None, str]:
    """The applied value from Service Quotas, else (for Elastic IPs) EC2's account attribute."""
    from botocore.exceptions import ClientError

    try:
        resp = api.call("service-quotas", "get_service_quota", ServiceCode="ec2", QuotaCode=quota.code)
        return float(resp["Quota"]["Value"]), "Service Quotas"
    except (ClientError, ProvisionError, KeyError) as exc:
        why = (
            getattr(exc, "response", {}).get("Error", {}).get("Code", "")
            if isinstance(exc, ClientError)
            else (exc.message if isinstance(exc, ClusterctlError) else "no value")
        )
    if quota is catalog.EIP_QUOTA:
        attrs = api.api("ec2", "describe_account_attributes", AttributeNames=["vpc-max-elastic-ips"])
        for attr in attrs.get("AccountAttributes", []):
            if attr.get("AttributeName") != "vpc-max-elastic-ips":
                continue
            for v in attr.get("AttributeValues", []):
                try:
                    return float(v["AttributeValue"]), "EC2 DescribeAccountAttributes vpc-max-elastic-ips"
                except (KeyError, ValueError):
                    pass
    # EC2's own "max-instances" attribute is documented as no longer reflecting the vCPU limit: no fallback.
    return None, f"Service Quotas unavailable: {why or 'error'}"[:160]


def _vcpus_in_use(api: Api, quota: catalog.Quota, spot: bool) -> int:
    """vCPUs of the region's live instances that count against the same quota."""
    flt = [{"Name": "instance-state-name", "Values": [s for s in LIVE_STATES if s not in ("stopped", "shutting-down")]}]
    insts = [
        i
        for r in api.paginate("ec2", "describe_instances", "Reservations", Filters=flt)
        for i in r.get("Instances", [])
    ]
    total = 0
    for inst in insts:
        itype = inst.get("InstanceType", "")
        if (inst.get("InstanceLifecycle") == "spot") != spot or catalog.vcpu_quota(itype, spot) != quota:
            continue
        cpu = inst.get("CpuOptions") or {}
        if cpu.get("CoreCount") and cpu.get("ThreadsPerCore"):
            total += int(cpu["CoreCount"]) * int(cpu["ThreadsPerCore"])
        else:
            total += type_info(api, itype).vcpus
    return total


def check_quotas(api: Api, ctx: Context) -> list[QuotaCheck]:
    """The quotas that would stop this launch; raises a ProvisionError naming the first one exceeded."""
    spec, info = ctx.spec, ctx.type
    checks: list[QuotaCheck] = []
    quota = catalog.vcpu_quota(spec.instance_type, ctx.opts.spot)
    need = spec.nodes * info.vcpus
    if quota is None:
        checks.append(QuotaCheck(None, need, source=f"no vCPU quota class known for {spec.instance_type}"))
    elif not info.vcpus:
        checks.append(QuotaCheck(quota, 0, source=f"vCPUs of {spec.instance_type} unknown"))
    else:
        value, source = _quota_value(api, quota)
        used = _vcpus_in_use(api, quota, ctx.opts.spot) if value is not None else 0
        checks.append(QuotaCheck(quota, need, used, value, source))
    if needs_elastic_ip(info, ctx.opts.private_ips):
        value, source = _quota_value(api, catalog.EIP_QUOTA)
        used = len(api.api("ec2", "describe_addresses").get("Addresses", [])) if value is not None else 0
        checks.append(QuotaCheck(catalog.EIP_QUOTA, 1, used, value, source))
    for c in checks:
        if c.over and c.quota is not None:
            raise ProvisionError(
                f"the {c.quota.name} quota ({c.quota.code}) in {ctx.region} is {c.value:g} {c.quota.unit} with "
                f"{c.used} in use; {spec.nodes} x {spec.instance_type} need {c.need} more",
                "ask for an increase in the Service Quotas console (or `aws service-quotas "
                f"request-service-quota-increase --service-code ec2 --quota-code {c.quota.code}`), or ask for "
                "fewer or smaller nodes; nothing was created",
            )
    return checks


# ---- spot prices -------------------------------------------------------------------------------------------
def spot_prices(api: Api, instance_type: str, zones: list[str]) -> dict[str, float]:
    """EC2's spot price of the type in each of the zones now (Linux/UNIX, $/hour): the newest entry of the spot
    price history per AZ, asked from now on so EC2 gives the price in effect. Zones with no entry are left out;
    a refusal (no ec2:DescribeSpotPriceHistory) gives none, and the plan then says the price is not known."""
    from datetime import datetime, timezone

    from botocore.exceptions import ClientError

    try:
        history = api.call(
            "ec2",
            "describe_spot_price_history",
            InstanceTypes=[instance_type],
            ProductDescriptions=["Linux/UNIX"],
            StartTime=datetime.now(timezone.utc),
        ).get("SpotPriceHistory", [])
    except ClientError:
        return {}
    newest: dict[str, tuple[str, float]] = {}
    for entry in history:
        az, stamp = entry.get("AvailabilityZone", ""), str(entry.get("Timestamp", ""))
        if az in zones and (az not in newest or stamp > newest[az][0]):
            newest[az] = (stamp, float(entry["SpotPrice"]))
    return {az: newest[az][1] for az in zones if az in newest}


# ---- the leader's Elastic IP ----------------------------------------------------------------------------------
def primary_interface(instance: dict[str, Any]) -> str | None:
    for eni in instance.get("NetworkInterfaces", []) or []:
        att = eni.get("Attachment", {}) or {}
        if int(att.get("DeviceIndex", -1)) == 0 and int(att.get("NetworkCardIndex", 0) or 0) == 0:
            eni_id: str | None = eni.get("NetworkInterfaceId")
            return eni_id
    return None


def ensure_elastic_ip(api: Api, ctx: Context, scope: Scope, leader: dict[str, Any]) -> str:
    """The cluster's one Elastic IP (found by its identity's tags, else allocated with them), on the leader's
    primary interface. Returns the address."""
    name = ctx.spec.name
    found = [
        a
        for a in api.api("ec2", "describe_addresses", Filters=scope.filters()).get("Addresses", [])
        if scope.holds(_tagdict(a))
    ]
    if found:
        addr = found[0]
    else:
        addr = api.api(
            "ec2",
            "allocate_address",
            Domain="vpc",
            TagSpecifications=[
                {
                    "ResourceType": "elastic-ip",
                    "Tags": _tags({**scope.tags(ctx.region), "Name": f"clusterctl-{name}-leader"}),
                }
            ],
        )
        api.report(
            f"allocated Elastic IP {addr['PublicIp']} for the leader (several interfaces: no automatic public address)"
        )
    eni = primary_interface(leader)
    if addr.get("NetworkInterfaceId") != eni or not eni:
        kw = {"NetworkInterfaceId": eni} if eni else {"InstanceId": leader["InstanceId"]}
        api.settled("ec2", "associate_address", AllocationId=addr["AllocationId"], AllowReassociation=True, **kw)
    public_ip: str = addr["PublicIp"]
    return public_ip


def release_elastic_ips(api: Api, allocation_ids: list[str], deadline: float) -> list[str]:
    """Exactly these Elastic IPs (by allocation id): disassociated, then released."""
    if not allocation_ids:
        return []
    removed = []
    for addr in api.api(
        "ec2", "describe_addresses", Filters=[{"Name": "allocation-id", "Values": list(allocation_ids)}]
    ).get("Addresses", []):
        if addr.get("AllocationId") not in allocation_ids:
            continue
        if addr.get("AssociationId"):
            api.delete(deadline, "ec2", "disassociate_address", AssociationId=addr["AssociationId"])
        if api.delete(deadline, "ec2", "release_address", AllocationId=addr["AllocationId"]):
            removed.append(f"Elastic IP {addr['AllocationId']} ({addr.get('PublicIp', '')})")
    return removed


# ---- the VPC's S3 gateway endpoint ------------------------------------------------------------------------------
def s3_service(region: str) -> str:
    return f"com.amazonaws.{region}.s3"


def ensure_s3_endpoint(api: Api, ctx: Context, scope: Scope, vpc_id: str) -> str:
    name = ctx.spec.name
    found = find_one(api, KIND["VPC endpoint"], scope, **{"vpc-id": vpc_id})
    if found:
        found_id: str = found["VpcEndpointId"]
        return found_id
    tables = api.api("ec2", "describe_route_tables", Filters=[{"Name": "vpc-id", "Values": [vpc_id]}]).get(
        "RouteTables", []
    )
    ep = api.settled(
        "ec2",
        "create_vpc_endpoint",
        VpcEndpointType="Gateway",
        VpcId=vpc_id,
        ServiceName=s3_service(ctx.region),
        RouteTableIds=[t["RouteTableId"] for t in tables],
        TagSpecifications=[
            {"ResourceType": "vpc-endpoint", "Tags": _tags({**scope.tags(ctx.region), "Name": f"clusterctl-{name}-s3"})}
        ],
    )["VpcEndpoint"]
    api.report(f"created S3 gateway endpoint {ep['VpcEndpointId']} (free; S3 without public addresses)")
    ep_id: str = ep["VpcEndpointId"]
    return ep_id
