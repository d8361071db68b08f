"""What `up` would create and what it costs, said before anything is created (read-only calls only), and
EC2's DryRun of the mutating calls that have one."""

from __future__ import annotations

import ipaddress
from typing import Any

from clusterctl.errors import ProvisionError
from clusterctl.providers.aws import bootstrap, catalog, fabric
from clusterctl.providers.aws.api import Api, _code, _message, _tagdict, _tags
from clusterctl.providers.aws.discovery import (
    KIND,
    TAG_OWNER,
    Scope,
    caller,
    find_one,
    instances_of,
    new_cluster_id,
)
from clusterctl.providers.aws.instances import run_params, shutdown_behavior
from clusterctl.providers.aws.machine import Context
from clusterctl.providers.aws.options import parse_s3_read
from clusterctl.providers.base import ImageFacts, Plan
from clusterctl.types import node_names
from clusterctl.units import money


def plan(api: Api, ctx: Context, scope: Scope | None) -> Plan:
    """`scope`: the identity this machine knows for the name (None: `up` makes a new one)."""
    spec = ctx.spec
    o, n, t = ctx.opts, spec.nodes, ctx.type
    names = node_names(spec.name, n)
    lines = [
        f"{n} x {t.name} in {ctx.region}, one Availability Zone, all or nothing: "
        f"{names[0]}" + (f", {names[1]} .. {names[-1]}" if n > 2 else (f", {names[1]}" if n == 2 else ""))
    ]
    gpu = (f"{t.gpus} GPU(s)" + (f" ({t.gpu_model})" if t.gpu_model else "") + " per node") if t.gpus else "no GPUs"
    lines.append(
        f"slots: {ctx.slots} per node, {ctx.slots * n} in all ({gpu}, from {t.source}"
        + (", overridden by --slots" if spec.slots else "")
        + ")"
    )
    lines.append(f"image: {ctx.image.describe()} (from {ctx.image.source}); login user {ctx.image.ssh_user}")
    iops = o.effective_iops
    lines.append(
        f"disk: {o.volume_size} GB {o.volume_type}"
        + (f" at {iops} IOPS" if iops else "")
        + ", encrypted, deleted with the node"
    )
    net, zones = _network(api, ctx, scope)
    lines.append(net)
    cidr = o.ssh_cidr or "your public IP /32 (detected at launch)"
    lines.append(f"security group: all traffic within the cluster (in and out), ssh (22) from {cidr}")
    if o.ssh_cidr and ipaddress.ip_network(o.ssh_cidr, strict=False).prefixlen == 0:
        lines.append("WARNING: ssh is open to the whole internet (--ssh-cidr 0.0.0.0/0 was asked for)")
    group = scope.group if scope else f"clusterctl-{spec.name}-<id>"
    lines.append(
        "identity: "
        + (
            f"id {scope.id} (from this machine's record)"
            if scope and scope.id
            else f"name and owner {scope.owner} (made before cluster ids)"
            if scope
            else "a new random id, tagged clusterctl:id on everything (rollback, down and gc "
            "touch only what carries it)"
        )
    )
    if o.placement and t.cluster_placement:
        lines.append(f"placement group {group} (cluster strategy)")
    lines.append(_interfaces(ctx))
    lines.append(f"key pair {group} (this machine's per-cluster key; private half stays here)")
    reads = ("reads " + ", ".join(str(parse_s3_read(s)) for s in o.s3_read)) if o.s3_read else "no S3 access"
    lines.append(
        f"IAM instance profile {scope.iam(ctx.region) if scope else 'clusterctl-<id>'}: {reads}; no AWS keys on nodes"
    )
    lines.append(
        "IMDSv2 required; instance-initiated shutdown (autostop's power-off) "
        + ("stops the instances (disks kept)" if shutdown_behavior(spec) == "stop" else "terminates the instances")
        + ("; spot (one-time, terminated on interruption)" if o.spot else "")
    )
    existing = instances_of(api, scope or Scope(spec.name, every=True))
    others = sorted({_tagdict(i).get(TAG_OWNER, "") for i in existing} - {caller(api)}) if scope is None else []
    if others:  # another owner's cluster of this name is running: never adopted, never this owner's to remove
        owner = ", ".join(o or "unknown" for o in others)
        raise ProvisionError(
            f"cluster {spec.name} already exists (aws, owner {owner}) but this machine has no record of it "
            "(nor its keys)",
            "choose another --name" + ("" if "" in others else f" (that one is {owner}'s)"),
        )
    if existing and len(existing) != n:  # said here, before `up` starts (whose failures clean up)
        raise ProvisionError(
            f"cluster {spec.name} already has {len(existing)} instance(s) in {ctx.region}, not {n}",
            f"use --nodes {len(existing)}, another --name, or bring it down first",
        )
    if existing:
        lines.append(f"cluster {spec.name} already has {len(existing)} instance(s) in {ctx.region}: up reuses them")
    else:  # before anything is created: a launch over a quota stops here (one Error: line)
        for check in fabric.check_quotas(api, ctx):
            lines.append(f"quota: {check.line()}")
    per_node = ctx.price.per_node
    hourly = None if per_node is None else per_node * n
    spot = fabric.spot_prices(api, t.name, zones) if o.spot else {}
    if spot:
        lines.append(_spot_cost(ctx, spot))
        hourly = (spot[next(iter(spot))] + ctx.price.volume_usd_per_hour) * n
    elif per_node is None:
        lines.append(
            f"cost: unknown ({t.name} is not in the built-in price table of {catalog.PRICES_DATE}); "
            f"disks {money(ctx.price.volume_usd_per_hour * n)}/hour"
        )
    else:
        kind = "spot (EC2 gave no current spot price): at most the on-demand " if o.spot else ""
        lines.append(
            f"cost: {kind}{money(hourly)}/hour for the cluster "
            f"({n} x {money(ctx.price.instance_usd_per_hour)} instance + "
            f"{money(ctx.price.volume_usd_per_hour)} disk; {catalog.PRICES_REGION} on-demand "
            f"prices of {catalog.PRICES_DATE}, other regions differ)"
        )
    return Plan(tuple(lines), hourly, catalog.PRICES_DATE, image_facts(ctx))


def image_facts(ctx: Context) -> ImageFacts:
    """What the node runtime's build will find on these nodes, as far as the tables know before launch."""
    release, t = ctx.image.release, ctx.type
    model = catalog.gpu_model_of(t.name, t.gpu_model, t.gpus)
    cc = catalog.compute_capability(t.name, model) if t.gpus else ""
    return ImageFacts(
        python=catalog.image_python(ctx.image.name),
        cuda_toolkits=release.toolkits if release else (),
        default_cuda=release.cuda if release else "",
        compute_caps=(cc,) if cc else (),
        gpu_model=model,
    )


def _interfaces(ctx: Context) -> str:
    t, o = ctx.type, ctx.opts
    count = fabric.efa_count(t)
    if not count:
        nics = "network interface: ENA (no EFA on this type)"
    else:
        nics = (
            f"network interfaces: {count} EFA (one per network card"
            + (", device index 0 on card 0 and 1 on the others" if count > 1 else "")
            + "); "
            + ("RDMA on (FI_EFA_USE_DEVICE_RDMA=1)" if t.efa_rdma else "no device RDMA on this type")
        )
    if o.private_ips:
        return nics + "; private addresses only"
    if fabric.needs_elastic_ip(t, o.private_ips):
        return (
            nics + "; several interfaces get no automatic public address: the leader gets an Elastic IP "
            "(tagged, released by down), members are reached through the leader (ProxyJump, host keys pinned)"
        )
    return nics + "; a public address each for ssh"


def _spot_cost(ctx: Context, spot: dict[str, float]) -> str:
    """The spot cost line: the first AZ's price now (where the launch tries first), every AZ's, on-demand's."""
    n, disk = ctx.spec.nodes, ctx.price.volume_usd_per_hour
    first, price = next(iter(spot.items()))
    each = ", ".join(f"{az} {money(p)}" for az, p in spot.items())
    on_demand = ctx.price.instance_usd_per_hour
    return (
        f"cost: spot {money((price + disk) * n)}/hour for the cluster in {first} now ({n} x {money(price)} instance"
        f" + {money(disk)} disk; EC2's current spot price per AZ: {each}"
        + (f"; on-demand {money(on_demand)} per instance" if on_demand is not None else "")
        + "; spot prices move, and an interruption terminates the node)"
    )


def _network(api: Api, ctx: Context, scope: Scope | None) -> tuple[str, list[str]]:
    """The network line, and the AZs the launch would try, in order."""
    o = ctx.opts
    if o.subnets or o.vpc:
        net = bootstrap.existing_network(api, ctx, create=False)
        azs = [az for _, az in net.subnets]
        return f"network: existing VPC {net.vpc}, subnet(s) in {', '.join(azs)} (not created, not deleted)", azs
    vpc = find_one(api, KIND["VPC"], scope) if scope else None
    zones = bootstrap.zones_for(api, ctx, [z for z in bootstrap.available_zones(api)])
    state = f"existing {vpc['VpcId']}" if vpc else "a new VPC"
    return (
        f"network: {state} {o.cidr} with a subnet in each AZ and an S3 gateway endpoint (free); trying "
        f"{', '.join(zones)} in that order on insufficient capacity"
    ), zones


def dry_run(api: Api, ctx: Context, scope: Scope | None) -> list[str]:
    """EC2's DryRun on the mutating calls that have it; nothing else that mutates is called."""
    from botocore.exceptions import ClientError

    spec, o = ctx.spec, ctx.opts
    lines = []

    def check(what: str, op: str, **kwargs: Any) -> None:
        try:
            api.call("ec2", op, DryRun=True, **kwargs)
            lines.append(f"{what}: the call returned without DryRun (unexpected)")
        except ClientError as exc:
            code = _code(exc)
            if code == "DryRunOperation":
                lines.append(f"{what}: allowed (EC2 DryRun)")
            elif code == "UnauthorizedOperation":
                raise ProvisionError(
                    f"dry run: not permitted to {op} ({_message(exc)[:200]})", "grant the credentials EC2 permissions"
                ) from None
            else:
                raise api.error(f"{op} (DryRun)", exc) from None

    scope = scope or Scope(spec.name, new_cluster_id(), caller(api))  # not saved: nothing is made
    tags = [{"ResourceType": "placement-group", "Tags": _tags(scope.tags(ctx.region))}]
    if o.placement and ctx.type.cluster_placement:
        check(
            "placement group",
            "create_placement_group",
            GroupName=scope.group,
            Strategy="cluster",
            TagSpecifications=tags,
        )
    params = run_params(
        ctx,
        scope,
        subnet=o.subnets[0] if o.subnets else None,
        security_group=None,
        placement_group=None,
        key_name=None,
        profile=None,
        token=None,
        internal_key="",
    )
    check(f"launch {spec.nodes} x {spec.instance_type}", "run_instances", **params)
    lines.append("VPC, subnets, security group, key pair and IAM profile: not checked (no DryRun that creates nothing)")
    return lines
