"""`repair` on EC2: which of a cluster's instances are lost, and new ones in their place, like their peers.

A replacement copies a live instance of the cluster (the leader when it lives): its type, AZ, subnet, placement
group, instance profile, security group, key pair, image, root volume (size, type, IOPS; encrypted), market (spot or
not) and user data (cloud-init: the cluster key, the watchdog), and is tagged with the cluster's identity; the
RunInstances request is built by instances.run_params, the same as `up`'s (IMDSv2 required, shutdown terminates).
Everything it launched is terminated again if a later step of it fails.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any, Sequence

from clusterctl.errors import CapacityError, ProvisionError
from clusterctl.providers.aws import catalog, instances, machine, teardown
from clusterctl.providers.aws.api import Api, _tagdict, _tags
from clusterctl.providers.aws.discovery import TAG_INDEX, TAG_ROLE, TAG_SLOTS, TAG_USER, Scope, instances_of
from clusterctl.providers.aws.options import AwsOptions
from clusterctl.providers.base import Found, LostNode
from clusterctl.types import Cluster, ClusterSpec, Node

ALL_STATES = ["pending", "running", "shutting-down", "terminated", "stopping", "stopped"]


def lost(api: Api, scope: Scope, cluster: Cluster) -> list[LostNode]:
    """The record's instances that are missing (by id, among the scope's) or not pending/running; a stopped or
    stopping one (its disks intact) is marked disks_kept."""
    found = {i["InstanceId"]: i for i in instances_of(api, scope, ALL_STATES)}
    out = []
    for node in cluster.nodes:
        inst = found.get(node.instance_id or "")
        if inst is None:
            out.append(LostNode(node, "missing (no instance of this id and tags)"))
            continue
        state = inst["State"]["Name"]
        if state not in ("pending", "running"):
            reason = inst.get("StateReason", {}).get("Message", "")
            stopped = state in ("stopping", "stopped")  # its disks survive: never replaced unless named
            out.append(LostNode(node, state + (f" ({reason})" if reason else ""), billed=stopped, disks_kept=stopped))
    return out


def _template(api: Api, scope: Scope, cluster: Cluster, lost_ids: set[str]) -> dict[str, Any]:
    live = {i["InstanceId"]: i for i in instances_of(api, scope, ["running"]) if i["InstanceId"] not in lost_ids}
    for node in cluster.nodes:  # the leader first, when it lives
        if node.instance_id in live:
            return live[node.instance_id]
    raise ProvisionError(
        f"cluster {cluster.name} has no running instance to copy settings from",
        f"bring it down and up again: `clusterctl down {cluster.name} --yes`, then `clusterctl up`",
    )


def _context(api: Api, cluster: Cluster, peer: dict[str, Any], count: int) -> machine.Context:
    """up's Context for `count` nodes like the peer, from what EC2 says of it (not what the record guesses)."""
    root = peer.get("RootDeviceName", "/dev/sda1")
    vol_id = next(
        (b["Ebs"]["VolumeId"] for b in peer.get("BlockDeviceMappings", []) if b.get("DeviceName") == root), None
    )
    vol = api.call("ec2", "describe_volumes", VolumeIds=[vol_id])["Volumes"][0] if vol_id else {}
    tags = _tagdict(peer)
    info = machine.type_info(api, peer["InstanceType"])
    opts = AwsOptions(
        volume_size=int(vol.get("Size") or AwsOptions.volume_size),
        volume_type=str(vol.get("VolumeType") or AwsOptions.volume_type),
        iops=int(vol["Iops"]) if vol.get("Iops") and vol.get("VolumeType") in ("io1", "io2", "gp3") else None,
        spot=peer.get("InstanceLifecycle") == "spot",
        private_ips=not peer.get("PublicIpAddress") and not cluster.extra.get("elastic_ip"),
        placement=bool(cluster.extra.get("placement_group")),
    )
    spec = ClusterSpec(
        cluster.name,
        "aws",
        count,
        slots=int(tags.get(TAG_SLOTS) or 1),
        instance_type=peer["InstanceType"],
        region=cluster.region,
        autostop=cluster.facts.autostop,  # its idle action is the instances' shutdown behaviour
    )
    image = machine.Image(
        peer["ImageId"], cluster.extra.get("image_name", ""), tags.get(TAG_USER) or "ubuntu", root, "the cluster's"
    )
    price = catalog.price(peer["InstanceType"], opts.volume_type, opts.volume_size, opts.effective_iops)
    return machine.Context(spec, opts, cluster.region, info, image, spec.slots or 1, price)


def _security_group(peer: dict[str, Any]) -> str:
    """The peer's security group: on the instance, else on its primary interface (where launches by interface put it)."""
    groups: list[dict[str, Any]] = peer.get("SecurityGroups") or next(
        (
            e.get("Groups", [])
            for e in peer.get("NetworkInterfaces", [])
            if e.get("Attachment", {}).get("DeviceIndex") == 0
        ),
        [],
    )
    return str(groups[0]["GroupId"]) if groups else ""


def _user_data(api: Api, peer: dict[str, Any]) -> bytes | None:
    value = (
        api.call("ec2", "describe_instance_attribute", InstanceId=peer["InstanceId"], Attribute="userData")
        .get("UserData", {})
        .get("Value")
    )
    return base64.b64decode(value) if value else None  # as given: gzip-compressed (cloud_init.py)


def replace(
    api: Api,
    scope: Scope,
    cluster: Cluster,
    lost_nodes: Sequence[Node],
    internal_key: str,
    launch_file: Path,
    wait_timeout: float,
) -> list[Node]:
    """New instances in place of these nodes, running and tagged with their names, roles and indexes."""
    if cluster.extra.get("elastic_ip") and any(n.role == "leader" for n in lost_nodes):
        raise ProvisionError(
            f"the leader of {cluster.name} is lost, and the members are reached through its Elastic IP",
            f"bring the cluster down and up again: `clusterctl down {cluster.name} --yes`, then `clusterctl up`",
        )
    peer = _template(api, scope, cluster, {n.instance_id for n in lost_nodes if n.instance_id})
    ctx = _context(api, cluster, peer, len(lost_nodes))
    subnet, az = peer["SubnetId"], peer["Placement"]["AvailabilityZone"]
    params = instances.run_params(
        ctx,
        scope,
        subnet=subnet,
        security_group=_security_group(peer) or cluster.extra.get("security_group") or None,
        placement_group=peer["Placement"].get("GroupName") or cluster.extra.get("placement_group") or None,
        key_name=peer.get("KeyName") or cluster.extra.get("key_pair") or None,
        profile=(
            peer.get("IamInstanceProfile", {}).get("Arn", "").rsplit("/", 1)[-1]
            or cluster.extra.get("instance_profile")
        )
        or None,
        token=instances._token(f"{cluster.name}-repair", 1),
        internal_key=internal_key,
    )
    behavior = (
        api.call(
            "ec2",
            "describe_instance_attribute",
            InstanceId=peer["InstanceId"],
            Attribute="instanceInitiatedShutdownBehavior",
        )
        .get("InstanceInitiatedShutdownBehavior", {})
        .get("Value")
    )
    if behavior in ("stop", "terminate"):
        params["InstanceInitiatedShutdownBehavior"] = behavior  # as the peer's, whatever the record says
    user_data = _user_data(api, peer)
    if user_data:
        params["UserData"] = user_data  # the peer's own cloud-init (its watchdog settings included)
    api.report(f"launching {len(lost_nodes)} x {ctx.spec.instance_type} in {az} (subnet {subnet})")
    outcome, detail = instances._run_once(api, launch_file, params, subnet, az, 1)
    if outcome == "capacity":
        raise CapacityError(
            f"no capacity for {len(lost_nodes)} x {ctx.spec.instance_type} in {az} ({detail})",
            "try `clusterctl repair` again later, or `clusterctl repair --drop` to go on without the lost node(s)",
        )
    ids = list(detail)
    try:
        if len(ids) != len(lost_nodes):
            raise ProvisionError(f"EC2 launched {len(ids)} instance(s), not {len(lost_nodes)}")
        running = {
            i["InstanceId"]: i for i in instances.wait_running(api, ids, instances.public_at_launch(ctx), wait_timeout)
        }
        index = {n.name: i for i, n in enumerate(cluster.nodes)}
        out = []
        for iid, node in zip(ids, lost_nodes):
            want = {"Name": node.name, TAG_ROLE: node.role, TAG_INDEX: str(_index(cluster, node, index))}
            api.api("ec2", "create_tags", Resources=[iid], Tags=_tags(want))
            inst = running[iid]
            out.append(
                Node(
                    node.name,
                    inst.get("PrivateIpAddress", ""),
                    node.slots,
                    node.role,
                    node.ssh_user,
                    node.ssh_port,
                    inst.get("PublicIpAddress") or None,
                    iid,
                )
            )
        return out
    except BaseException:
        api.report(f"removing the {len(ids)} instance(s) this repair launched")
        for line in teardown.remove(api, [Found(cluster.name, "instance", i) for i in ids], wait_timeout):
            api.report(f"  removed {line}")
        raise


def _index(cluster: Cluster, node: Node, position: dict[str, int]) -> int:
    """The node's index tag: from its name (NAME-leader 0, NAME-member-K K), else its place in the record."""
    if node.name == f"{cluster.name}-leader":
        return 0
    tail = node.name.rsplit("-member-", 1)[-1]
    return int(tail) if tail.isdigit() else position.get(node.name, 0)


def remove(api: Api, scope: Scope, cluster: Cluster, nodes: Sequence[Node], timeout: float) -> list[str]:
    """Exactly these nodes' instances, where they are the scope's (checked on their tags) and not terminated."""
    ids = {n.instance_id for n in nodes if n.instance_id}
    mine = [i["InstanceId"] for i in instances_of(api, scope, ALL_STATES) if i["InstanceId"] in ids]
    return teardown.remove(api, [Found(cluster.name, "instance", i) for i in mine], timeout) if mine else []
