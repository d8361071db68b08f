"""Every resource of a scope that still exists, found by its tags: instances, the tagged kinds of discovery.KINDS,
the IAM role and instance profile (IAM lists no tags: one Get each); the identities that hold a name, the names
of every cluster in the region.
"""

from __future__ import annotations

from typing import Any

from clusterctl.errors import ConfigError
from clusterctl.providers.aws.api import LIVE_STATES, Api, _code, _epoch, _tagdict
from clusterctl.providers.aws.discovery import (
    IAM_PATH,
    KINDS,
    TAG,
    TAG_ID,
    TAG_OWNER,
    TAG_REGION,
    Scope,
    iam_pattern,
    instances_of,
    ordered,
)
from clusterctl.providers.base import Found


def resources_of(api: Api, scope: Scope | None) -> list[Found]:
    """Every resource of the scope (every clusterctl resource with None) that still exists: instances, the
    tagged kinds, the IAM role and instance profile; each checked against its tags exactly (EC2's filters
    take `*` and `?` as wildcards)."""
    flt = scope.filters() if scope is not None else [{"Name": "tag-key", "Values": [TAG]}]
    out: list[Found] = []

    def add(item: dict[str, Any], kind: str, rid: str, created: Any = None, state: str = "") -> None:
        tags = _tagdict(item)
        if TAG in tags and (scope is None or scope.holds(tags)):
            out.append(
                Found(
                    tags[TAG],
                    kind,
                    rid,
                    _epoch(created) if created else None,
                    tags.get(TAG_OWNER, ""),
                    state,
                    tags.get(TAG_ID, ""),
                )
            )

    for inst in ordered(instances_of(api, scope, LIVE_STATES)):
        add(inst, "instance", inst["InstanceId"], inst.get("LaunchTime"), inst["State"]["Name"])
    for kind in KINDS:
        for item in api.api("ec2", kind.describe, Filters=flt).get(kind.key, []):
            if not kind.gone(item):
                add(
                    item,
                    kind.name,
                    item[kind.id_key],
                    item.get(kind.created_key) if kind.created_key else None,
                    item.get("State") or item.get("Status") or "",
                )
    return out + _iam_resources(api, scope)


IAM_KINDS = (  # (kind, get call, list call, list key, name key)
    (
        "IAM instance profile",
        "get_instance_profile",
        "list_instance_profiles",
        "InstanceProfiles",
        "InstanceProfileName",
    ),
    ("IAM role", "get_role", "list_roles", "Roles", "RoleName"),
)


def _iam_resources(api: Api, scope: Scope | None) -> list[Found]:
    """The scope's IAM instance profile and role: by name (the id's, or before ids name + region), else every
    one under /clusterctl/ of this region, with their tags (IAM lists no tags: one Get each)."""
    region = api.region
    names_here = iam_pattern(region)
    out: list[Found] = []
    for kind, get, listing, key, name_key in IAM_KINDS:
        if scope is not None and not scope.every:
            names = [scope.iam(region)]
        else:
            names = [
                i[name_key]
                for i in api.paginate("iam", listing, key, PathPrefix=IAM_PATH)
                if names_here.match(i[name_key])
            ]
        for iname in names:
            item = iam_get(api, get, iname)
            if item is None:
                continue
            tags = _tagdict(item)
            if tags.get(TAG_REGION, region) != region:
                continue  # IAM is global: another region's cluster
            named = names_here.match(iname)
            if TAG not in tags and named and named.group("cluster"):
                tags = {TAG: named.group("cluster")}
            if TAG in tags and (scope is None or scope.holds(tags)):
                out.append(
                    Found(
                        tags[TAG],
                        kind,
                        iname,
                        _epoch(item.get("CreateDate")),
                        tags.get(TAG_OWNER, ""),
                        "",
                        tags.get(TAG_ID, ""),
                    )
                )
    return out


def iam_get(api: Api, op: str, iname: str) -> dict[str, Any] | None:
    from botocore.exceptions import ClientError

    kw, key = ({"RoleName": iname}, "Role") if op == "get_role" else ({"InstanceProfileName": iname}, "InstanceProfile")
    try:
        found: dict[str, Any] = api.call("iam", op, **kw)[key]
        return found
    except ClientError as exc:
        if _code(exc) != "NoSuchEntity":
            raise api.error(f"iam {op}", exc) from None
        return None


def identities(api: Api, name: str) -> list[Scope]:
    """Every identity that holds resources tagged with this name (by id; before ids, by owner)."""
    found: dict[tuple[str, str], Scope] = {}
    for f in resources_of(api, Scope(name, every=True)):
        key = (f.cluster_id, "" if f.cluster_id else f.owner)
        found.setdefault(key, Scope(name, f.cluster_id, f.owner))
    return sorted(found.values(), key=lambda s: (s.owner, s.id))


def all_clusters(api: Api) -> list[str]:
    """The names (valid ones: anything else is reachable by `gc`, by resource id, only) of every cluster here."""
    from clusterctl.state import validate_name

    names = set()
    for f in resources_of(api, None):
        try:
            names.add(validate_name(f.cluster))
        except ConfigError:
            pass
    return sorted(names)
