"""The nodes' own AWS identity: the cluster's IAM role and instance profile, named by its id and found by its tags
before either is made (one that carries another identity's tags is never reused), the --s3-read policy, and
`train --checkpoint-to`'s write policy on one prefix.
"""

from __future__ import annotations

import json
from typing import Any, Iterable

from clusterctl import s3uri
from clusterctl.errors import ConfigError, ProvisionError
from clusterctl.providers.aws.api import Api, _tagdict, _tags
from clusterctl.providers.aws.discovery import IAM_PATH, Scope
from clusterctl.providers.aws.machine import Context
from clusterctl.providers.aws.options import parse_s3_read
from clusterctl.providers.aws.resources import iam_get
from clusterctl.types import Cluster

EC2_TRUST = {
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}],
}


def _own_iam(api: Api, scope: Scope, op: str, iname: str, name: str) -> dict[str, Any] | None:
    """The IAM role or instance profile of that name (None: there is none); one that carries another
    identity's tags is never reused."""
    found = iam_get(api, op, iname)
    if found is not None and not scope.holds(_tagdict(found)):
        kind = "role" if op == "get_role" else "instance profile"
        raise ProvisionError(
            f"IAM {kind} {iname} exists but is not this cluster {name}'s ({scope.label()})",
            "choose another --name, or bring the other cluster down",
        )
    return found


def ensure_instance_profile(api: Api, ctx: Context, scope: Scope) -> str:
    """The cluster's own role and profile, named by its id; one that exists under that name but carries
    another identity's tags is never reused (nor its policy rewritten)."""
    name = ctx.spec.name
    iname = scope.iam(ctx.region)
    tags = _tags(scope.tags(ctx.region))
    if _own_iam(api, scope, "get_role", iname, name) is None:
        api.api(
            "iam",
            "create_role",
            RoleName=iname,
            Path=IAM_PATH,
            AssumeRolePolicyDocument=json.dumps(EC2_TRUST),
            Description=f"clusterctl cluster {name} in {ctx.region}: nodes' own identity",
            Tags=tags,
            MaxSessionDuration=3600,
        )
        api.report(f"created IAM role {iname}")
    if ctx.opts.s3_read:
        api.api(
            "iam",
            "put_role_policy",
            RoleName=iname,
            PolicyName="s3-read",
            PolicyDocument=json.dumps(s3_read_policy(ctx.opts.s3_read)),
        )
    prof = _own_iam(api, scope, "get_instance_profile", iname, name)
    if prof is None:
        prof = api.api("iam", "create_instance_profile", InstanceProfileName=iname, Path=IAM_PATH, Tags=tags)[
            "InstanceProfile"
        ]
        api.report(f"created IAM instance profile {iname}")
    if not any(r.get("RoleName") == iname for r in prof.get("Roles", [])):
        api.api("iam", "add_role_to_instance_profile", InstanceProfileName=iname, RoleName=iname)
    return iname


def grant_checkpoint_write(api: Api, cluster: Cluster, uri: str) -> None:
    """`train --checkpoint-to`: the nodes' role may write checkpoints under `uri` only (its own inline
    policy, replaced by the next --checkpoint-to)."""
    role = cluster.extra.get("instance_profile", "")  # the role has the instance profile's name
    if not role:
        raise ConfigError(
            f"cluster {cluster.name} has no instance profile on record",
            "bring it up again with this clusterctl, or give the nodes S3 access yourself",
        )
    api.api(
        "iam",
        "put_role_policy",
        RoleName=role,
        PolicyName="checkpoints-write",
        PolicyDocument=json.dumps(s3_checkpoint_policy(uri)),
    )
    api.report(f"IAM role {role} may write s3 checkpoints under {uri} (and nothing else)")


# ---- policies ----------------------------------------------------------------------------------------------
def s3_read_policy(locations: Iterable[str]) -> dict[str, Any]:
    """Read-only access to exactly the given prefixes (and listing them), nothing else."""
    objects, lists = [], []
    for uri in locations:
        loc = parse_s3_read(uri)
        bucket, prefix = loc.bucket, loc.prefix
        objects.append(f"arn:aws:s3:::{bucket}/{prefix}*")
        lists.append(
            {
                "Effect": "Allow",
                "Action": ["s3:ListBucket"],
                "Resource": f"arn:aws:s3:::{bucket}",
                **({"Condition": {"StringLike": {"s3:prefix": [f"{prefix}*"]}}} if prefix else {}),
            }
        )
    return {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Action": ["s3:GetObject"], "Resource": objects}, *lists],
    }


def s3_checkpoint_policy(uri: str) -> dict[str, Any]:
    """Checkpoints under one prefix: write, read back, delete the old ones, list that prefix; nothing else."""
    loc = s3uri.parse(uri)  # a folder: b/run1 grants b/run1/..., never b/run10/...
    if not loc.prefix:
        raise ValueError(f"{uri}: checkpoints go under a prefix, never the whole bucket")
    bucket, prefix = loc.bucket, loc.prefix
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Action": ["s3:PutObject", "s3:GetObject", "s3:DeleteObject", "s3:AbortMultipartUpload"],
                "Resource": [f"arn:aws:s3:::{bucket}/{prefix}*"],
            },
            {
                "Effect": "Allow",
                "Action": ["s3:ListBucket"],
                "Resource": f"arn:aws:s3:::{bucket}",
                "Condition": {"StringLike": {"s3:prefix": [f"{prefix}*"]}},
            },
        ],
    }
