"""What a cluster's nodes stand in, each found by its tags (or name) before it is created: the network (VPC,
internet gateway, one subnet per AZ and the S3 endpoint; or --vpc/--subnet), the security group (ssh from
exactly this run's range), the placement group and the key pair (the operator key, imported); the IAM role
and instance profile are iam.py's. Every step is idempotent: `up` re-run after an interruption finds what
the earlier run made.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from typing import Any

from clusterctl.errors import ClusterctlError, ConfigError, ProvisionError
from clusterctl.providers.aws import fabric
from clusterctl.providers.aws.api import NOT_FOUND, Api, _code, _tagdict, _tags
from clusterctl.providers.aws.discovery import KIND, Scope, find_one
from clusterctl.providers.aws.machine import Context
from clusterctl.types import Cluster

CHECKIP_URL = "https://checkip.amazonaws.com"


@dataclass(frozen=True)
class Network:
    vpc: str
    subnets: tuple[tuple[str, str], ...]  # (subnet id, AZ) in the order to try
    created: bool  # made by clusterctl (and removed by `down`)


def detect_public_cidr(timeout: float = 5.0) -> str:
    """The caller's public IPv4 address as a /32, from checkip (CLUSTERCTL_CHECKIP_URL overrides)."""
    import urllib.request

    url = os.environ.get("CLUSTERCTL_CHECKIP_URL") or CHECKIP_URL
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            text = resp.read(64).decode().strip()
        addr = ipaddress.ip_address(text)
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"could not detect your public IP address from {url} ({exc.__class__.__name__})",
            "pass --ssh-cidr with the address range you connect from, e.g. 203.0.113.7/32",
        ) from None
    if addr.version != 4:
        raise ConfigError(f"your public address {addr} is IPv6", "pass --ssh-cidr with an IPv4 range")
    return f"{addr}/32"


def available_zones(api: Api) -> list[str]:
    zones = api.api("ec2", "describe_availability_zones", Filters=[{"Name": "state", "Values": ["available"]}]).get(
        "AvailabilityZones", []
    )
    return sorted(z["ZoneName"] for z in zones if z.get("ZoneType", "availability-zone") == "availability-zone")


def zones_for(api: Api, ctx: Context, zones: list[str]) -> list[str]:
    """The AZs that offer the type, in order; all of them when the API has no offerings for it."""
    offers = api.paginate(
        "ec2",
        "describe_instance_type_offerings",
        "InstanceTypeOfferings",
        LocationType="availability-zone",
        Filters=[{"Name": "instance-type", "Values": [ctx.spec.instance_type]}],
    )
    offered = {o["Location"] for o in offers}
    if not offered:
        return zones
    return [z for z in zones if z in offered]


def ensure_network(api: Api, ctx: Context, scope: Scope) -> Network:
    name, o = ctx.spec.name, ctx.opts
    base = scope.tags(ctx.region)
    vpc = find_one(api, KIND["VPC"], scope)
    if vpc is None:
        vpc = api.api(
            "ec2",
            "create_vpc",
            CidrBlock=o.cidr,
            TagSpecifications=[{"ResourceType": "vpc", "Tags": _tags({**base, "Name": f"clusterctl-{name}"})}],
        )["Vpc"]
        api.report(f"created VPC {vpc['VpcId']} ({o.cidr})")
        api.settled("ec2", "modify_vpc_attribute", VpcId=vpc["VpcId"], EnableDnsSupport={"Value": True})
        api.settled("ec2", "modify_vpc_attribute", VpcId=vpc["VpcId"], EnableDnsHostnames={"Value": True})
    vpc_id = vpc["VpcId"]
    cidr = ipaddress.ip_network(vpc.get("CidrBlock") or o.cidr)
    if not o.private_ips:
        igw = find_one(api, KIND["internet gateway"], scope)
        if igw is None:
            igw = api.api(
                "ec2",
                "create_internet_gateway",
                TagSpecifications=[
                    {"ResourceType": "internet-gateway", "Tags": _tags({**base, "Name": f"clusterctl-{name}"})}
                ],
            )["InternetGateway"]
            api.report(f"created internet gateway {igw['InternetGatewayId']}")
        if not any(a.get("VpcId") == vpc_id for a in igw.get("Attachments", [])):
            api.settled("ec2", "attach_internet_gateway", InternetGatewayId=igw["InternetGatewayId"], VpcId=vpc_id)
        main = api.api(
            "ec2",
            "describe_route_tables",
            Filters=[{"Name": "vpc-id", "Values": [vpc_id]}, {"Name": "association.main", "Values": ["true"]}],
        ).get("RouteTables", [])
        if main and not any(r.get("DestinationCidrBlock") == "0.0.0.0/0" for r in main[0].get("Routes", [])):
            api.settled(
                "ec2",
                "create_route",
                RouteTableId=main[0]["RouteTableId"],
                DestinationCidrBlock="0.0.0.0/0",
                GatewayId=igw["InternetGatewayId"],
            )
    zones = available_zones(api)
    have = {
        s["AvailabilityZone"]: s
        for s in api.api(
            "ec2", "describe_subnets", Filters=[*scope.filters(), {"Name": "vpc-id", "Values": [vpc_id]}]
        ).get("Subnets", [])
        if scope.holds(_tagdict(s))
    }
    blocks = list(cidr.subnets(new_prefix=min(28, cidr.prefixlen + 4)))
    subnets = []
    for index, az in enumerate(zones[: len(blocks)]):
        sub = have.get(az)
        if sub is None:
            sub = api.settled(
                "ec2",
                "create_subnet",
                VpcId=vpc_id,
                AvailabilityZone=az,
                CidrBlock=str(blocks[index]),
                TagSpecifications=[
                    {"ResourceType": "subnet", "Tags": _tags({**base, "Name": f"clusterctl-{name}-{az}"})}
                ],
            )["Subnet"]
            api.report(f"created subnet {sub['SubnetId']} ({blocks[index]}, {az})")
        subnets.append((sub["SubnetId"], az))
    fabric.ensure_s3_endpoint(api, ctx, scope, vpc_id)
    order = zones_for(api, ctx, [az for _, az in subnets])
    by_az = dict((az, s) for s, az in subnets)
    return Network(vpc_id, tuple((by_az[az], az) for az in order), True)


def existing_network(api: Api, ctx: Context, create: bool) -> Network:
    o = ctx.opts
    if o.subnets:
        subs = api.api("ec2", "describe_subnets", SubnetIds=list(o.subnets)).get("Subnets", [])
        by_id = {s["SubnetId"]: s for s in subs}
        ordered = [by_id[s] for s in o.subnets if s in by_id]
    else:
        ordered = sorted(
            api.api("ec2", "describe_subnets", Filters=[{"Name": "vpc-id", "Values": [o.vpc]}]).get("Subnets", []),
            key=lambda s: s["AvailabilityZone"],
        )
    if not ordered:
        raise ConfigError(
            f"no subnets found for {'--subnet ' + ', '.join(o.subnets) if o.subnets else '--vpc ' + str(o.vpc)}",
            "check the ids and the region",
        )
    vpcs = {s["VpcId"] for s in ordered}
    if len(vpcs) != 1 or (o.vpc and o.vpc not in vpcs):
        raise ConfigError("the --subnet(s) must all be in one VPC (the --vpc, when given)")
    order = zones_for(api, ctx, [s["AvailabilityZone"] for s in ordered])
    pairs = tuple((s["SubnetId"], s["AvailabilityZone"]) for s in ordered if s["AvailabilityZone"] in order)
    if not pairs:
        raise ConfigError(f"{ctx.spec.instance_type} is not offered in the AZs of the given subnets")
    return Network(vpcs.pop(), pairs, False)


def ensure_security_group(api: Api, ctx: Context, scope: Scope, net: Network, ssh_cidr: str) -> str:
    name = ctx.spec.name
    sg = find_one(api, KIND["security group"], scope, **{"vpc-id": net.vpc})
    if sg is None:
        sg_id: str = api.settled(
            "ec2",
            "create_security_group",
            GroupName=scope.group,
            VpcId=net.vpc,
            Description=f"clusterctl cluster {name}: all traffic within the cluster, ssh from one range",
            TagSpecifications=[
                {"ResourceType": "security-group", "Tags": _tags({**scope.tags(ctx.region), "Name": scope.group})}
            ],
        )["GroupId"]
        api.report(f"created security group {sg_id}")
        sg = {"GroupId": sg_id, "IpPermissions": [], "IpPermissionsEgress": []}
    sg_id = sg["GroupId"]
    self_rule = {"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": sg_id, "Description": "within the cluster"}]}
    wanted_in = [self_rule, _ssh_rule(ssh_cidr)]
    for op, rules, have in (
        ("authorize_security_group_ingress", wanted_in, sg.get("IpPermissions", [])),
        ("authorize_security_group_egress", [self_rule], sg.get("IpPermissionsEgress", [])),
    ):
        for rule in rules:
            if _has_rule(have, rule):
                continue
            try:
                api.settled("ec2", op, GroupId=sg_id, IpPermissions=[rule])
            except ClusterctlError as exc:
                if "InvalidPermission.Duplicate" not in exc.message:
                    raise
    revoke_other_ssh(api, sg_id, sg.get("IpPermissions", []), ssh_cidr)
    return sg_id


def revoke_other_ssh(api: Api, sg_id: str, have: list[dict[str, Any]], ssh_cidr: str) -> None:
    """Ingress that reaches port 22 from any range but this run's is revoked (after this run's rule is in, so
    there is no moment without it): an earlier run's /32 or a one-time 0.0.0.0/0 does not stay open."""
    stale = _stale_ssh(have, ssh_cidr)
    if stale:
        api.settled("ec2", "revoke_security_group_ingress", GroupId=sg_id, IpPermissions=stale)
        api.report(f"revoked ssh from {', '.join(_ranges(stale))} (this run allows {ssh_cidr} only)")


def refresh_access(api: Api, cluster: Cluster, ssh_cidr: str | None) -> None:
    """`up` of a cluster that is already up: its ssh rule becomes exactly this run's range (--ssh-cidr, else
    the detected address)."""
    sg_id = cluster.extra.get("security_group", "")
    if not sg_id:
        return
    ssh_cidr = ssh_cidr or detect_public_cidr()
    groups = api.api("ec2", "describe_security_groups", GroupIds=[sg_id]).get("SecurityGroups", [])
    if not groups:
        return
    have = groups[0].get("IpPermissions", [])
    if not _has_rule(have, _ssh_rule(ssh_cidr)):
        api.settled("ec2", "authorize_security_group_ingress", GroupId=sg_id, IpPermissions=[_ssh_rule(ssh_cidr)])
        api.report(f"ssh (22) allowed from {ssh_cidr}")
    revoke_other_ssh(api, sg_id, have, ssh_cidr)


def ensure_placement_group(api: Api, ctx: Context, scope: Scope) -> str:
    from botocore.exceptions import ClientError

    name = ctx.spec.name
    group = scope.group
    try:
        found = api.call("ec2", "describe_placement_groups", GroupNames=[group]).get("PlacementGroups", [])
    except ClientError as exc:
        if not NOT_FOUND.search(_code(exc)):
            raise api.error("DescribePlacementGroups", exc) from None
        found = []
    if found:
        if not scope.holds(_tagdict(found[0])):
            raise ConfigError(
                f"placement group {group} exists but is not this cluster {name}'s ({scope.label()})",
                "choose another --name",
            )
        return group
    api.api(
        "ec2",
        "create_placement_group",
        GroupName=group,
        Strategy="cluster",
        TagSpecifications=[{"ResourceType": "placement-group", "Tags": _tags(scope.tags(ctx.region))}],
    )
    api.report(f"created placement group {group}")
    return group


def ensure_key_pair(api: Api, ctx: Context, scope: Scope, public_key: str) -> str:
    from botocore.exceptions import ClientError

    name = ctx.spec.name
    key_name = scope.group
    try:
        found = api.call("ec2", "describe_key_pairs", KeyNames=[key_name], IncludePublicKey=True).get("KeyPairs", [])
    except ClientError as exc:
        if not NOT_FOUND.search(_code(exc)):
            raise api.error("DescribeKeyPairs", exc) from None
        found = []
    material = " ".join(public_key.split()[:2])
    if found:
        theirs = " ".join((found[0].get("PublicKey") or "").split()[:2])
        if (theirs and theirs != material) or not scope.holds(_tagdict(found[0])):
            raise ProvisionError(
                f"key pair {key_name} in {ctx.region} holds another key than this machine's for cluster {name}",
                f"the local state was lost or belongs elsewhere: `clusterctl down {name} --yes`, then up again",
            )
        return key_name
    api.api(
        "ec2",
        "import_key_pair",
        KeyName=key_name,
        PublicKeyMaterial=material.encode(),
        TagSpecifications=[{"ResourceType": "key-pair", "Tags": _tags(scope.tags(ctx.region))}],
    )
    api.report(f"imported key pair {key_name}")
    return key_name


# ---- security group rules ------------------------------------------------------------------------------
def _has_rule(have: list[dict[str, Any]], rule: dict[str, Any]) -> bool:
    for h in have:
        if h.get("IpProtocol") != rule["IpProtocol"]:
            continue
        if rule["IpProtocol"] != "-1" and (h.get("FromPort"), h.get("ToPort")) != (
            rule.get("FromPort"),
            rule.get("ToPort"),
        ):
            continue
        if "UserIdGroupPairs" in rule and any(
            p.get("GroupId") == rule["UserIdGroupPairs"][0]["GroupId"] for p in h.get("UserIdGroupPairs", [])
        ):
            return True
        if "IpRanges" in rule and any(r.get("CidrIp") == rule["IpRanges"][0]["CidrIp"] for r in h.get("IpRanges", [])):
            return True
    return False


def _ssh_rule(cidr: str) -> dict[str, Any]:
    return {
        "IpProtocol": "tcp",
        "FromPort": 22,
        "ToPort": 22,
        "IpRanges": [{"CidrIp": cidr, "Description": "ssh from the operator"}],
    }


def _stale_ssh(have: list[dict[str, Any]], cidr: str) -> list[dict[str, Any]]:
    """The ranges of the ingress rules that let port 22 in from anywhere but `cidr` (IPv6 and prefix lists
    included), each with its own rule's protocol and ports, as RevokeSecurityGroupIngress wants them."""
    out = []
    for h in have:
        proto = str(h.get("IpProtocol"))
        if proto not in ("tcp", "6", "-1"):
            continue
        if proto != "-1" and not int(h.get("FromPort", 0)) <= 22 <= int(h.get("ToPort", 65535)):
            continue
        ranges = [
            {"CidrIp": r["CidrIp"]}
            for r in h.get("IpRanges", [])
            if not (r.get("CidrIp") == cidr and (proto, h.get("FromPort"), h.get("ToPort")) == ("tcp", 22, 22))
        ]
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


def _ranges(rules: list[dict[str, Any]]) -> list[str]:
    return [
        r.get("CidrIp") or r.get("CidrIpv6") or r.get("PrefixListId")
        for rule in rules
        for k in ("IpRanges", "Ipv6Ranges", "PrefixListIds")
        for r in rule.get(k, [])
    ]
