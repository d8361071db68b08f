"""The cluster's instances: one all-or-nothing RunInstances per AZ tried (its ClientToken saved before the call),
waiting until they run, naming them leader and members (their host keys: console.py).

`launch` is `up`'s list of idempotent steps, each of which first looks for what an earlier run made:
    network -> security group -> placement group -> key pair -> IAM role + instance profile (bootstrap.py, iam.py) ->
    one RunInstances with MinCount = MaxCount = N per AZ tried -> wait until running -> name the nodes ->
    the leader's Elastic IP when it has several interfaces (fabric.py).
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

from clusterctl.errors import CapacityError, ProvisionError, WaitTimeout
from clusterctl.providers.aws import bootstrap, catalog, fabric, iam
from clusterctl.providers.aws.api import Api, _code, _message, _tagdict, _tags
from clusterctl.providers.aws.bootstrap import Network
from clusterctl.providers.aws.cloud_init import user_data
from clusterctl.providers.aws.discovery import (
    TAG_INDEX,
    TAG_OWNER,
    TAG_ROLE,
    TAG_SLOTS,
    TAG_USER,
    Scope,
    cluster_of,
    instances_of,
    ordered,
    owner_label,
)
from clusterctl.providers.aws.machine import Context
from clusterctl.providers.base import ClusterKeys
from clusterctl.state import atomic_write
from clusterctl.types import Cluster, ClusterSpec, node_names

CAPACITY_CODES = {
    "InsufficientInstanceCapacity",
    "InsufficientCapacity",
    "InsufficientHostCapacity",
    "InsufficientCapacityOnHost",
    "Unsupported",
    "SpotMaxPriceTooLow",
    "InsufficientFreeAddressesInSubnet",
}


def _token(name: str, attempt: int) -> str:
    return f"{name}-{attempt}-{uuid.uuid4().hex[:20]}"  # at most 64 ASCII characters


def launch(api: Api, ctx: Context, scope: Scope, keys: ClusterKeys, launch_file: Path, wait_timeout: float) -> Cluster:
    """Every step of `up` under the cluster's identity; the typed cluster (its record's extra facts included)."""
    spec, name = ctx.spec, ctx.spec.name
    existing = instances_of(api, scope)
    if existing and len(existing) != spec.nodes:
        raise ProvisionError(
            f"cluster {name} already has {len(existing)} instance(s) in {ctx.region}, not {spec.nodes}",
            f"bring it down first: clusterctl down {name} --yes",
        )
    ssh_cidr = (
        ctx.opts.ssh_cidr or bootstrap.detect_public_cidr()
    )  # this run's range, and only it (the rest is revoked)
    net = (
        bootstrap.existing_network(api, ctx, create=True)
        if (ctx.opts.vpc or ctx.opts.subnets)
        else bootstrap.ensure_network(api, ctx, scope)
    )
    sg = bootstrap.ensure_security_group(api, ctx, scope, net, ssh_cidr)
    pg = (
        bootstrap.ensure_placement_group(api, ctx, scope) if ctx.opts.placement and ctx.type.cluster_placement else None
    )
    key = bootstrap.ensure_key_pair(api, ctx, scope, keys.operator_public)
    profile = iam.ensure_instance_profile(api, ctx, scope)
    if existing:
        existing = start_stopped(api, name, existing, wait_timeout)
        api.report(f"found {len(existing)} running instance(s) of {name} by tags: reusing them")
        ids = [i["InstanceId"] for i in existing]
    else:
        internal = keys.internal_public
        ids = run_with_fallback(api, launch_file, ctx, scope, net, sg, pg, key, profile, internal)
    instances = wait_running(api, ids, public_at_launch(ctx), wait_timeout)
    instances = name_instances(api, name, instances)
    extra = {
        "vpc": net.vpc,
        "security_group": sg,
        "placement_group": pg or "",
        "key_pair": key,
        "instance_profile": profile,
        "image": ctx.image.id,
        "image_name": ctx.image.name,
        "network_created": "yes" if net.created else "no",
        "cluster_id": scope.id,
        "owner": scope.owner,
        "owner_label": owner_label(),
        **fabric_extra(ctx),
        **(spec.autostop.extra() if spec.autostop else {}),
    }
    extra["spot"] = "true" if ctx.opts.spot else "false"  # train polls spot nodes' interruption notice
    if fabric.needs_elastic_ip(ctx.type, ctx.opts.private_ips):
        address = fabric.ensure_elastic_ip(api, ctx, scope, ordered(instances)[0])
        instances = _behind_leader(instances, address)
        extra.update({"elastic_ip": address, "ssh_jump": "leader"})
    return cluster_of(ctx.region, name, instances, extra=extra)


def _behind_leader(instances: list[dict[str, Any]], address: str) -> list[dict[str, Any]]:
    """The leader reached at its Elastic IP, the members through it (no public address of their own)."""
    leader = ordered(instances)[0]
    return [{**i, "PublicIpAddress": address} if i is leader else {**i, "PublicIpAddress": None} for i in instances]


def _recorded(api: Api, scope: Scope, cluster: Cluster) -> list[dict[str, Any]]:
    """The record's instances, by id, among the identity's (its id tag, and its owner tag); any of the record's
    missing is refused before anything changes."""
    mine = {
        i["InstanceId"]: i
        for i in instances_of(api, scope)
        if not scope.owner or _tagdict(i).get(TAG_OWNER) == scope.owner
    }
    missing = [n.name for n in cluster.nodes if n.instance_id not in mine]
    if missing:
        raise ProvisionError(
            f"cluster {cluster.name} has no instance of its own for {', '.join(missing)} (terminated, or not "
            "tagged as this cluster's)",
            f"see `clusterctl status {cluster.name}`; `clusterctl repair {cluster.name}` replaces lost nodes",
        )
    return [mine[str(n.instance_id)] for n in cluster.nodes]


def stop(api: Api, scope: Scope, cluster: Cluster, wait_timeout: float) -> tuple[list[str], list[str]]:
    """`clusterctl stop`: StopInstances on exactly the record's running instances (by id, among its identity's),
    then waited for until stopped (bounded). (lines stopped, lines of what is not stopped yet)."""
    found = _recorded(api, scope, cluster)
    ids = [i["InstanceId"] for i in found]
    todo = [i["InstanceId"] for i in found if i["State"]["Name"] in ("pending", "running")]
    if todo:
        api.report(f"stopping {len(todo)} instance(s) of {cluster.name} (their disks kept)")
        api.api("ec2", "stop_instances", InstanceIds=todo)
    deadline = time.monotonic() + wait_timeout
    while True:
        states = {
            i["InstanceId"]: i["State"]["Name"]
            for r in api.call("ec2", "describe_instances", InstanceIds=ids)["Reservations"]
            for i in r["Instances"]
        }
        left = [f"instance {iid} ({states.get(iid, 'missing')})" for iid in ids if states.get(iid) != "stopped"]
        if not left or time.monotonic() > deadline:
            return [f"instance {iid} (stopped)" for iid in todo if states.get(iid) == "stopped"], left
        time.sleep(api.poll_interval)


def start(api: Api, scope: Scope, cluster: Cluster, wait_timeout: float) -> Cluster:
    """`clusterctl start`: the record's stopped instances started (start_stopped, as `up` does), waited for until
    they run with their addresses (new public IPs; the Elastic IP stays the leader's)."""
    found = start_stopped(api, cluster.name, _recorded(api, scope, cluster), wait_timeout)
    eip = cluster.extra.get("elastic_ip", "")
    public = not eip and any(n.public_ip for n in cluster.nodes)
    running = wait_running(api, [i["InstanceId"] for i in found], public, wait_timeout)
    return cluster_of(api.region, cluster.name, _behind_leader(running, eip) if eip else running, dict(cluster.extra))


def fabric_extra(ctx: Context) -> dict[str, str]:
    """What the launch needs to know of the node's fabric and image (launch.job_env, doctor)."""
    t, r = ctx.type, ctx.image.release
    return {
        "efa": "true" if fabric.efa_count(t) else "false",
        "efa_interfaces": str(fabric.efa_count(t)),
        "efa_rdma": "true" if fabric.efa_count(t) and t.efa_rdma else "false",
        "gpus": str(t.gpus),
        "gpu_model": catalog.gpu_model_of(t.name, t.gpu_model, t.gpus),  # workloads/train/config.py's row for the type
        "driver_branch": str(r.driver_branch) if r else "",
        "cuda": r.cuda if r else "",
    }


def start_stopped(api: Api, name: str, existing: list[dict[str, Any]], wait_timeout: float) -> list[dict[str, Any]]:
    """A stopped cluster (autostop's --idle-action stop, or `clusterctl stop`): its instances started again, their
    disks as they were left. One still stopping is waited for (bounded); any other state than pending/running/stopped is refused."""
    deadline = time.monotonic() + wait_timeout
    while any(i["State"]["Name"] == "stopping" for i in existing) and time.monotonic() < deadline:
        time.sleep(api.poll_interval)
        ids = [i["InstanceId"] for i in existing]
        existing = [
            i for r in api.call("ec2", "describe_instances", InstanceIds=ids)["Reservations"] for i in r["Instances"]
        ]
    bad = [i["InstanceId"] for i in existing if i["State"]["Name"] not in ("pending", "running", "stopped")]
    if bad:
        raise ProvisionError(
            f"cluster {name} has instance(s) that are neither running nor stopped: {', '.join(bad)}",
            f"wait a minute and run `clusterctl up` again, or remove it: clusterctl down {name} --yes",
        )
    stopped = [i["InstanceId"] for i in existing if i["State"]["Name"] == "stopped"]
    if stopped:
        api.report(f"starting {len(stopped)} stopped instance(s) of {name} (their disks as they were left)")
        api.api("ec2", "start_instances", InstanceIds=stopped)
    return existing


def shutdown_behavior(spec: ClusterSpec) -> str:
    """What a `shutdown` on the node (the autostop watchdog's power-off) does to the instance: the cluster's
    --idle-action, stop (its EBS disks kept, `up` starts it again) or terminate."""
    return spec.autostop.idle_action if spec.autostop is not None else "terminate"


def run_params(
    ctx: Context,
    scope: Scope,
    *,
    subnet: str | None,
    security_group: str | None,
    placement_group: str | None,
    key_name: str | None,
    profile: str | None,
    token: str | None,
    internal_key: str,
) -> dict[str, Any]:
    o, spec = ctx.opts, ctx.spec
    ebs: dict[str, Any] = {
        "VolumeSize": o.volume_size,
        "VolumeType": o.volume_type,
        "Encrypted": True,
        "DeleteOnTermination": True,
    }
    if o.effective_iops and o.volume_type in ("io1", "io2", "gp3"):
        ebs["Iops"] = o.effective_iops
    base_tags = scope.tags(ctx.region)
    inst_tags = {**base_tags, "Name": f"{spec.name}-node", TAG_SLOTS: str(ctx.slots), TAG_USER: ctx.image.ssh_user}
    tag_specs = [
        {"ResourceType": "instance", "Tags": _tags(inst_tags)},
        {"ResourceType": "volume", "Tags": _tags(base_tags)},
        {"ResourceType": "network-interface", "Tags": _tags(base_tags)},
    ]
    if o.spot:
        tag_specs.append({"ResourceType": "spot-instances-request", "Tags": _tags(base_tags)})
    nics = fabric.network_interfaces(ctx.type, subnet=subnet, security_group=security_group, public=not o.private_ips)
    params: dict[str, Any] = {
        "ImageId": ctx.image.id,
        "InstanceType": spec.instance_type,
        "MinCount": spec.nodes,
        "MaxCount": spec.nodes,
        "NetworkInterfaces": nics,
        "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled", "HttpPutResponseHopLimit": 1},
        "BlockDeviceMappings": [{"DeviceName": ctx.image.root_device, "Ebs": ebs}],
        "InstanceInitiatedShutdownBehavior": shutdown_behavior(spec),
        "TagSpecifications": tag_specs,
        "UserData": user_data(
            spec.name, ctx.region, ctx.image.ssh_user, ctx.slots, internal_key, autostop=spec.autostop
        ),
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
        params["InstanceMarketOptions"] = {
            "MarketType": "spot",
            "SpotOptions": {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"},
        }
    return params


def run_with_fallback(
    api: Api,
    path: Path,
    ctx: Context,
    scope: Scope,
    net: Network,
    sg: str,
    pg: str | None,
    key: str,
    profile: str,
    internal_key: str,
) -> list[str]:
    """One all-or-nothing RunInstances per AZ until one has capacity. The ClientToken of each attempt
    is saved before the call; botocore's retries of that call reuse it, and so does a later `up` whose
    predecessor never saw the answer, so EC2 returns that launch instead of making a second one."""
    name = ctx.spec.name
    try:
        saved = json.loads(path.read_text()) if path.exists() else {}
    except ValueError:
        saved = {}
    tried: list[str] = []
    for attempt, (subnet, az) in enumerate(net.subnets, start=1):
        reuse = saved.get("state") == "sent" and saved.get("subnet") == subnet
        token = saved["token"] if reuse else _token(name, attempt)
        params = run_params(
            ctx,
            scope,
            subnet=subnet,
            security_group=sg,
            placement_group=pg,
            key_name=key,
            profile=profile,
            token=token,
            internal_key=internal_key,
        )
        api.report(f"launching {ctx.spec.nodes} x {ctx.spec.instance_type} in {az}")
        outcome, detail = _run_once(api, path, params, subnet, az, attempt)
        if outcome == "capacity":
            tried.append(f"{az} ({detail})")
            api.report(
                f"no capacity for {ctx.spec.nodes} x {ctx.spec.instance_type} in {az} ({detail}); "
                + ("trying the next AZ" if attempt < len(net.subnets) else "no AZ left")
            )
            continue
        ids = list(detail)
        if len(ids) != ctx.spec.nodes:
            raise ProvisionError(f"EC2 launched {len(ids)} instance(s), not {ctx.spec.nodes}")
        return ids
    raise CapacityError(
        f"no capacity for {ctx.spec.nodes} x {ctx.spec.instance_type} in {ctx.region}: tried {', '.join(tried)}",
        "try later, another region (--region) or type (--type), or fewer nodes; nothing was left running",
    )


def _run_once(api: Api, path: Path, params: dict[str, Any], subnet: str, az: str, attempt: int) -> tuple[str, Any]:
    from botocore.exceptions import ClientError

    def save(state: str, **more: Any) -> None:
        atomic_write(
            path,
            json.dumps(
                {"token": params["ClientToken"], "subnet": subnet, "az": az, "state": state, "at": time.time(), **more}
            )
            + "\n",
        )

    save("sent")
    profile_deadline = time.monotonic() + 120
    while True:
        try:
            resp = api.call("ec2", "run_instances", **params)
        except ClientError as exc:
            code, msg = _code(exc), _message(exc)
            if code == "InvalidParameterValue" and "iamInstanceProfile" in msg and time.monotonic() < profile_deadline:
                api.report("the new instance profile is not visible to EC2 yet; retrying")
                time.sleep(min(5.0, max(0.2, api.poll_interval)))
                continue
            if code == "IdempotentParameterMismatch":  # an old token with other settings: start afresh
                params["ClientToken"] = _token(str(params["ClientToken"]).rsplit("-", 2)[0], attempt)
                save("sent")
                continue
            if code in CAPACITY_CODES:
                save("failed", error=code)
                return "capacity", code
            raise api.error("RunInstances", exc) from None
        ids = [i["InstanceId"] for i in resp.get("Instances", [])]
        save("launched", instances=ids)
        return "launched", ids


def wait_running(api: Api, ids: list[str], public: bool, wait_timeout: float) -> list[dict[str, Any]]:
    """Bounded polling until every instance runs with its addresses; fails fast if one dies."""
    from botocore.exceptions import ClientError

    deadline = time.monotonic() + wait_timeout
    api.report(f"waiting for {len(ids)} instance(s) to run")
    while True:
        try:
            found = [
                i
                for r in api.call("ec2", "describe_instances", InstanceIds=ids)["Reservations"]
                for i in r["Instances"]
            ]
        except ClientError as exc:
            if _code(exc) != "InvalidInstanceID.NotFound":  # not visible yet right after launch
                raise api.error("DescribeInstances", exc) from None
            found = []
        dead = [i for i in found if i["State"]["Name"] in ("shutting-down", "terminated", "stopping", "stopped")]
        if dead:
            why = "; ".join(
                f"{i['InstanceId']}: {i['State']['Name']} ({i.get('StateReason', {}).get('Message', '')})" for i in dead
            )
            raise ProvisionError(f"instance(s) stopped while starting: {why}")
        ready = [
            i
            for i in found
            if i["State"]["Name"] == "running"
            and i.get("PrivateIpAddress")
            and (i.get("PublicIpAddress") or not public)
        ]
        if len(ready) == len(ids):
            return ready
        if time.monotonic() > deadline:
            raise WaitTimeout(
                f"{len(ids) - len(ready)} of {len(ids)} instance(s) not running after {wait_timeout:.0f}s",
                "see the EC2 console; `clusterctl down` removes them",
            )
        time.sleep(api.poll_interval)


def public_at_launch(ctx: Context) -> bool:
    """EC2 gives each node a public address at launch: not with --private-ips, nor with several
    interfaces (the leader's Elastic IP comes after)."""
    return not (ctx.opts.private_ips or fabric.interface_count(ctx.type) > 1)


def name_instances(api: Api, name: str, instances: list[dict[str, Any]]) -> list[dict[str, Any]]:
    inorder = ordered(instances)
    names = node_names(name, len(inorder))
    out = []
    for index, (inst, node_name) in enumerate(zip(inorder, names)):
        tags = _tagdict(inst)
        want = {"Name": node_name, TAG_ROLE: "leader" if index == 0 else "member", TAG_INDEX: str(index)}
        if any(tags.get(k) != v for k, v in want.items()):
            api.api("ec2", "create_tags", Resources=[inst["InstanceId"]], Tags=_tags(want))
        out.append({**inst, "Tags": _tags({**tags, **want})})
    return out
