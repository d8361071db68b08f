"""`status` and `ls` of AWS clusters: one entry per identity, its nodes' states, zones and prices (the instance's
and its tagged volumes'), what its disks cost a month; a name with no instances but other resources shows those.
"""

from __future__ import annotations

from typing import Any, Callable

from clusterctl.providers.aws import catalog
from clusterctl.providers.aws.api import LIVE_STATES, Api, _epoch, _tagdict
from clusterctl.providers.aws.discovery import TAG, TAG_ID, TAG_OWNER, Scope, cluster_of, instances_of
from clusterctl.providers.aws.resources import resources_of
from clusterctl.providers.base import ClusterStatus, NodeStatus


def statuses(
    api: Api, scope: Scope | None, known: Callable[[str], Scope | None] = lambda name: None
) -> list[ClusterStatus]:
    """The scope's cluster (every cluster's with None, in one DescribeInstances), one entry per identity (two
    owners' clusters of one name are two): nodes, states, zones, prices, the owner, and whether it is the one
    `known(name)` (this machine's record) names; a name with no instances but other resources shows those."""
    name = scope.name if scope is not None else None
    by_cluster: dict[Scope, list[dict[str, Any]]] = {}
    for inst in instances_of(api, scope, LIVE_STATES):
        tags = _tagdict(inst)
        by_cluster.setdefault(Scope(tags.get(TAG, ""), tags.get(TAG_ID, ""), tags.get(TAG_OWNER, "")), []).append(inst)
    out = []
    volumes = _volume_prices(api, name) if by_cluster else {}
    for ident, instances in by_cluster.items():
        cname, mine = ident.name, known(ident.name)
        cluster = cluster_of(api.region, cname, instances)
        by_id = {i["InstanceId"]: i for i in instances}
        nodes = []
        for n in cluster.nodes:
            inst = by_id[n.instance_id]
            vol = volumes.get(n.instance_id or "", 0.0)
            inst_price = catalog.instance_price(inst.get("InstanceType", ""))
            nodes.append(
                NodeStatus(
                    n,
                    inst["State"]["Name"],
                    inst.get("Placement", {}).get("AvailabilityZone", ""),
                    _epoch(inst.get("LaunchTime")),
                    None if inst_price is None else inst_price + vol,
                )
            )
        recorded = mine is not None and mine.holds(_tagdict(instances[0]))
        disks = sum(volumes.get(i, 0.0) for i in by_id) * catalog.HOURS_PER_MONTH
        out.append(
            ClusterStatus(
                cname,
                "aws",
                api.region,
                cluster.instance_type,
                tuple(nodes),
                owner=ident.owner,
                recorded=recorded,
                disks_monthly_usd=disks,
            )
        )
    if scope is not None and not any(st.name == scope.name for st in out):
        left = resources_of(api, scope)
        if left:
            lines = tuple(f.line() for f in left)
            out.append(
                ClusterStatus(scope.name, "aws", api.region, "", (), lines, scope.owner, known(scope.name) is not None)
            )
    return sorted(out, key=lambda st: (st.name, not st.recorded, st.owner))


def _volume_prices(api: Api, name: str | None) -> dict[str, float]:
    """USD/hour of the tagged volumes attached to each instance (one DescribeVolumes)."""
    flt = [{"Name": f"tag:{TAG}", "Values": [name]} if name else {"Name": "tag-key", "Values": [TAG]}]
    out: dict[str, float] = {}
    for vol in api.paginate("ec2", "describe_volumes", "Volumes", Filters=flt):
        if name and _tagdict(vol).get(TAG) != name:
            continue
        for att in vol.get("Attachments", []):
            out[att["InstanceId"]] = out.get(att["InstanceId"], 0.0) + catalog.volume_price(
                vol.get("VolumeType", "gp3"), int(vol.get("Size", 0)), vol.get("Iops")
            )
    return out
