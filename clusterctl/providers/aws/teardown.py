"""Removing exactly the resources listed (resources.resources_of, or what `gc` listed and the operator
confirmed), by their ids, in dependency order: the instances (terminated, then botocore's waiter), the
tagged kinds in the order of discovery.KINDS' `removal`, then the IAM profile and role. Dependency errors
are waited through (bounded, api.delete); nothing is looked up by a name or a tag value."""

from __future__ import annotations

import time
from typing import Any, Iterable

from clusterctl.providers.aws import fabric
from clusterctl.providers.aws.api import Api, _tagdict
from clusterctl.providers.aws.discovery import KINDS, Kind, ordered
from clusterctl.providers.aws.resources import IAM_KINDS, iam_get
from clusterctl.providers.base import Found


def remove(api: Api, items: Iterable[Found], timeout: float) -> list[str]:
    """One line per resource removed."""
    by: dict[str, list[str]] = {}
    for f in items:
        if f.id not in by.setdefault(f.kind, []):
            by[f.kind].append(f.id)
    deadline = time.monotonic() + timeout
    removed = _instances(api, by.get("instance", []), deadline)
    for kind in sorted(KINDS, key=lambda k: k.removal):
        ids = by.get(kind.name, [])
        if not ids:
            continue
        if kind.name == "Elastic IP":
            removed += fabric.release_elastic_ips(api, ids, deadline)
        elif kind.name == "internet gateway":
            removed += _internet_gateways(api, kind, ids, deadline)
        else:
            removed += _each(api, kind, ids, deadline)
    for iam_kind, get, *_ in IAM_KINDS:  # the instance profile first: a role in a profile cannot go
        delete = _delete_profile if get == "get_instance_profile" else _delete_role
        removed += [f"{iam_kind} {iname}" for iname in by.get(iam_kind, []) if delete(api, iname, deadline)]
    return removed


def _instances(api: Api, ids: list[str], deadline: float) -> list[str]:
    if not ids:
        return []
    instances = [
        i
        for r in api.paginate(
            "ec2", "describe_instances", "Reservations", Filters=[{"Name": "instance-id", "Values": ids}]
        )
        for i in r.get("Instances", [])
        if i["InstanceId"] in ids
    ]
    live = [i for i in instances if i["State"]["Name"] != "terminated"]
    stop = [i["InstanceId"] for i in live if i["State"]["Name"] != "shutting-down"]
    if stop:
        api.api("ec2", "terminate_instances", InstanceIds=stop)
    if not live:
        return []
    api.wait_terminated([i["InstanceId"] for i in live], deadline)
    return [f"instance {i['InstanceId']} ({_tagdict(i).get('Name', '')})" for i in ordered(live)]


def _described(api: Api, kind: Kind, ids: list[str]) -> list[dict[str, Any]]:
    """These resources as they are now (ENIs and volumes are removed only when detached)."""
    got = api.api("ec2", kind.describe, Filters=[{"Name": kind.id_filter, "Values": ids}]).get(kind.key, [])
    return [i for i in got if i.get(kind.id_key) in ids]


def _each(api: Api, kind: Kind, ids: list[str], deadline: float) -> list[str]:
    """One delete call per id; a kind that is removed only in a state (`ready`) is described first."""
    field, value = kind.ready
    if field:
        ids = [i[kind.id_key] for i in _described(api, kind, ids) if i.get(field) == value]
    return [
        f"{kind.label or kind.name} {rid}"
        for rid in ids
        if api.delete(deadline, "ec2", kind.delete, **{kind.param: [rid] if kind.as_list else rid})
    ]


def _internet_gateways(api: Api, kind: Kind, ids: list[str], deadline: float) -> list[str]:
    removed = []
    for igw in _described(api, kind, ids):
        for att in igw.get("Attachments", []):
            api.delete(
                deadline,
                "ec2",
                "detach_internet_gateway",
                InternetGatewayId=igw["InternetGatewayId"],
                VpcId=att["VpcId"],
            )
        if api.delete(deadline, "ec2", "delete_internet_gateway", InternetGatewayId=igw["InternetGatewayId"]):
            removed.append(f"{kind.name} {igw['InternetGatewayId']}")
    return removed


def _delete_profile(api: Api, iname: str, deadline: float) -> bool:
    prof = iam_get(api, "get_instance_profile", iname)
    if prof is None:
        return False
    for role in prof.get("Roles", []):
        api.delete(
            deadline, "iam", "remove_role_from_instance_profile", InstanceProfileName=iname, RoleName=role["RoleName"]
        )
    return api.delete(deadline, "iam", "delete_instance_profile", InstanceProfileName=iname)


def _delete_role(api: Api, iname: str, deadline: float) -> bool:
    if iam_get(api, "get_role", iname) is None:
        return False
    for policy in api.paginate("iam", "list_role_policies", "PolicyNames", RoleName=iname):
        api.delete(deadline, "iam", "delete_role_policy", RoleName=iname, PolicyName=policy)
    for attached in api.paginate("iam", "list_attached_role_policies", "AttachedPolicies", RoleName=iname):
        api.delete(deadline, "iam", "detach_role_policy", RoleName=iname, PolicyArn=attached["PolicyArn"])
    return api.delete(deadline, "iam", "delete_role", RoleName=iname)
