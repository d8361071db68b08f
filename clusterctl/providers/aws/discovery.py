"""What exists, found by tags alone: a cluster's identity (Scope), the ONE table of the EC2 kinds a cluster may
own (KINDS: listed by `find`/`ls`/`status`/`down`/`gc` here, removed in its dependency order by teardown.py),
its instances and its IAM names; every resource of a scope is resources.py's, a cluster's status status.py's.

Everything a cluster owns carries the tag `clusterctl:cluster=NAME` (and `clusterctl:id=ID`) from the moment it
is created, so it is found with or without the local record, even after a Ctrl-C between any two calls.
EC2's filters read `*` and `?` as wildcards: every answer is checked again against its tags exactly.
"""

from __future__ import annotations

import re
import time
import uuid
from dataclasses import dataclass
from typing import Any, Mapping

from clusterctl.providers.aws.api import LIVE_STATES, Api, _epoch, _tagdict
from clusterctl.providers.base import NodeFacts
from clusterctl.types import Cluster, Node, node_names

TAG = "clusterctl:cluster"
TAG_ROLE = "clusterctl:role"
TAG_INDEX = "clusterctl:index"
TAG_SLOTS = "clusterctl:slots"
TAG_USER = "clusterctl:ssh-user"
TAG_REGION = "clusterctl:region"
TAG_OWNER = "clusterctl:owner"  # the ARN of the AWS identity that made it: whose it is (`down`, `gc`, `ls`)
TAG_LABEL = "clusterctl:owner-label"  # user@host that made it: a label for people, never a test of ownership
TAG_ID = "clusterctl:id"  # the random id of the cluster, made at its creation: with the name, its identity
IAM_PATH = "/clusterctl/"
_ID = "[0-9a-f]{12}"
CLUSTER_ID = re.compile(rf"^{_ID}$")

_CALLERS: dict[int, str] = {}  # id(Api) -> its caller's ARN (asked once per Api)


def caller(api: Api) -> str:
    """Who asks: the ARN of the credentials' AWS identity (STS GetCallerIdentity, which needs no permission). Two
    people on one machine with their own profiles are two owners; a login name (LOGNAME) changes nothing."""
    if id(api) not in _CALLERS:
        _CALLERS[id(api)] = str(api.call("sts", "get_caller_identity")["Arn"])
    return _CALLERS[id(api)]


def owner_label() -> str:
    """user@host of this machine, kept beside the owner for people to read."""
    from clusterctl.proc import owner

    return owner()


def legacy_owner() -> str:
    """What `clusterctl:owner` said of this machine's user before it held the AWS identity: user@host. The user is
    the login of the real uid (its passwd entry), not $LOGNAME, which anyone may set to another's name."""
    import os
    import pwd
    import socket

    try:
        user = pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}"[:200]


def new_cluster_id() -> str:
    return uuid.uuid4().hex[:12]


# ---- IAM names (IAM is global: one name scheme, read back by the same pattern) --------------------------------
def iam_name(cluster: str, region: str) -> str:
    return f"clusterctl-{cluster}-{region}"  # IAM is global: the region keeps two regions' clusters apart


def iam_pattern(region: str) -> re.Pattern[str]:
    """The names clusterctl gives IAM entities in this region: `clusterctl-ID` (group `id`), or before ids
    iam_name's `clusterctl-CLUSTER-REGION` (group `cluster`)."""
    return re.compile(rf"^clusterctl-(?:(?P<id>{_ID})|(?P<cluster>.+)-{re.escape(region)})$")


@dataclass(frozen=True)
class Scope:
    """Which resources are one cluster's. Its identity is its name plus the random id made when it was created
    (tagged `clusterctl:id` on everything, and in the record); for a cluster made before ids existed, its name
    plus its owner tag (and no id tag). `every`: any identity of the name (for display only, never to change)."""

    name: str
    id: str = ""
    owner: str = ""  # the ARN of whoever made it (before owner ARNs: user@host)
    every: bool = False

    def filters(self) -> list[dict[str, Any]]:
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
        return {
            TAG: self.name,
            **({TAG_ID: self.id} if self.id else {}),
            TAG_REGION: region,
            TAG_OWNER: self.owner,
            TAG_LABEL: owner_label(),
        }

    def label(self) -> str:
        return (
            f"id {self.id}, owner {self.owner or 'unknown'}" if self.id else f"owner {self.owner or 'unknown'}, no id"
        )


# ---- the one table of tagged EC2 kinds ----------------------------------------------------------------------
@dataclass(frozen=True)
class Kind:
    """One kind of EC2 resource a cluster may own, found by its tag (instances and IAM have their own steps)."""

    name: str  # as listed and removed: "security group"
    describe: str  # the describe call, its response key, the item's id key, its creation-time key
    key: str
    id_key: str
    created_key: str | None = None
    removal: int = 0  # its place in teardown's dependency order (after the instances)
    delete: str = ""  # the delete call, one per id, and the id's parameter ("": teardown.py has a step for it)
    param: str = ""
    as_list: bool = False  # the parameter takes a list
    id_filter: str = ""  # the describe filter by id, for the kinds removed only in a state (`ready`)
    ready: tuple[str, str] = ("", "")  # (field, value): removed only when it says so (the rest goes with others)
    gone_states: tuple[str, ...] = ()  # deleted ones some describes still list for a while
    label: str = ""  # in the removal line, when not the name

    def gone(self, item: Mapping[str, Any]) -> bool:
        return str(item.get("State") or "").lower() in self.gone_states


_DELETED = ("deleted", "deleting")
KINDS = (  # in the order they are listed; `removal` orders teardown
    Kind(
        "placement group",
        "describe_placement_groups",
        "PlacementGroups",
        "GroupName",
        None,
        1,
        "delete_placement_group",
        "GroupName",
    ),
    Kind("key pair", "describe_key_pairs", "KeyPairs", "KeyName", "CreateTime", 2, "delete_key_pair", "KeyName"),
    Kind("Elastic IP", "describe_addresses", "Addresses", "AllocationId", None, 0),  # fabric.release_elastic_ips
    Kind(
        "security group",
        "describe_security_groups",
        "SecurityGroups",
        "GroupId",
        None,
        6,
        "delete_security_group",
        "GroupId",
    ),
    Kind(
        "network interface",
        "describe_network_interfaces",
        "NetworkInterfaces",
        "NetworkInterfaceId",
        None,
        3,
        "delete_network_interface",
        "NetworkInterfaceId",
        id_filter="network-interface-id",
        ready=("Status", "available"),
    ),
    Kind(
        "volume",
        "describe_volumes",
        "Volumes",
        "VolumeId",
        "CreateTime",
        4,
        "delete_volume",
        "VolumeId",
        id_filter="volume-id",
        ready=("State", "available"),
        gone_states=_DELETED,
    ),
    Kind(
        "VPC endpoint",
        "describe_vpc_endpoints",
        "VpcEndpoints",
        "VpcEndpointId",
        "CreationTimestamp",
        5,
        "delete_vpc_endpoints",
        "VpcEndpointIds",
        as_list=True,
        gone_states=_DELETED,
        label="S3 gateway endpoint",
    ),
    Kind("subnet", "describe_subnets", "Subnets", "SubnetId", None, 7, "delete_subnet", "SubnetId"),
    Kind(
        "internet gateway",
        "describe_internet_gateways",
        "InternetGateways",
        "InternetGatewayId",
        None,
        8,
        id_filter="internet-gateway-id",
    ),  # detached first: teardown.py
    Kind("VPC", "describe_vpcs", "Vpcs", "VpcId", None, 9, "delete_vpc", "VpcId"),
)
KIND = {k.name: k for k in KINDS}


def find_one(api: Api, kind: Kind, scope: Scope, **filters: str) -> dict[str, Any] | None:
    """The scope's one resource of a kind (bootstrap finds what an earlier run made before creating)."""
    flt = scope.filters() + [{"Name": k, "Values": [v]} for k, v in filters.items()]
    items = [
        i
        for i in api.api("ec2", kind.describe, Filters=flt).get(kind.key, [])
        if scope.holds(_tagdict(i)) and not kind.gone(i)
    ]
    return items[0] if items else None


# ---- instances -----------------------------------------------------------------------------------------------
def instances_of(api: Api, scope: Scope | None, states: list[str] | None = None) -> list[dict[str, Any]]:
    """The scope's instances (every clusterctl instance with None), each checked against its tags."""
    flt = [{"Name": "instance-state-name", "Values": states or ["pending", "running", "stopping", "stopped"]}]
    flt += scope.filters() if scope is not None else [{"Name": "tag-key", "Values": [TAG]}]
    reservations = api.paginate("ec2", "describe_instances", "Reservations", Filters=flt)
    return [
        i
        for r in reservations
        for i in r.get("Instances", [])
        if (scope.holds(_tagdict(i)) if scope is not None else TAG in _tagdict(i))
    ]


def ordered(instances: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Leader first, then members: by the index tag when named, else by launch index, then id."""

    def key(i: dict[str, Any]) -> tuple[int, int, int, str]:
        tags = _tagdict(i)
        index = tags.get(TAG_INDEX)
        return (
            0 if index is not None else 1,
            int(index) if index and index.isdigit() else 0,
            int(i.get("AmiLaunchIndex", 0)),
            i["InstanceId"],
        )

    return sorted(instances, key=key)


def cluster_of(
    region: str, name: str, instances: list[dict[str, Any]], extra: Mapping[str, str] | None = None
) -> Cluster:
    """The typed cluster its instances (and their tags) describe."""
    inorder = ordered(instances)
    nodes = []
    for index, inst in enumerate(inorder):
        tags = _tagdict(inst)
        nodes.append(
            Node(
                name=tags.get("Name") or node_names(name, len(inorder))[index],
                private_ip=inst.get("PrivateIpAddress", ""),
                slots=int(tags.get(TAG_SLOTS) or 1),
                role="leader" if index == 0 else "member",
                ssh_user=tags.get(TAG_USER) or "ubuntu",
                public_ip=inst.get("PublicIpAddress") or None,
                instance_id=inst["InstanceId"],
            )
        )
    first = inorder[0] if inorder else {}
    facts = {
        "az": first.get("Placement", {}).get("AvailabilityZone", ""),
        "subnet": first.get("SubnetId", ""),
        **(extra or {}),
    }
    launched = min((_epoch(i.get("LaunchTime")) for i in inorder), default=time.time())
    return Cluster(
        name=name,
        provider="aws",
        nodes=tuple(nodes),
        region=region,
        instance_type=first.get("InstanceType", ""),
        created_at=launched,
        extra={k: str(v) for k, v in facts.items()},
    )


def find(api: Api, scope: Scope) -> Cluster | None:
    instances = instances_of(api, scope)
    if not instances:
        return None
    tags = _tagdict(ordered(instances)[0])
    return cluster_of(
        api.region,
        scope.name,
        instances,
        extra={
            "cluster_id": tags.get(TAG_ID, ""),
            "owner": tags.get(TAG_OWNER, ""),
            "owner_label": tags.get(TAG_LABEL, ""),
        },
    )


def node_facts(api: Api, scope: Scope, cluster: Cluster) -> dict[str, NodeFacts]:
    """Type, AZ and placement group of each node now, by node name (one DescribeInstances)."""
    by_id = {i["InstanceId"]: i for i in instances_of(api, scope, LIVE_STATES)}
    out = {}
    for n in cluster.nodes:
        inst = by_id.get(n.instance_id or "")
        if inst is not None:
            placement = inst.get("Placement", {})
            out[n.name] = NodeFacts(
                inst.get("InstanceType", ""), placement.get("AvailabilityZone", ""), placement.get("GroupName", "")
            )
    return out
