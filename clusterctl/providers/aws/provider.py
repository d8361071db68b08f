"""The AWS provider: the Provider contract (providers/base.py) for EC2, delegating to the package's modules.

    api.py        clients, calls, one-line errors, retries (retry.py's backoff), botocore's waiters, paging
    options.py    AwsOptions: parsed and validated before any call
    machine.py    the type's facts, the image, the price: the Context every step shares
    discovery.py  identity (Scope), the ONE table of tagged kinds, instances, IAM names
    resources.py  every resource of a scope (the tagged kinds, IAM role and profile), identities, all clusters
    status.py     `status`/`ls`: nodes, states, zones, prices, the disks' monthly cost
    bootstrap.py  network, security group, placement group, key pair
    iam.py        the nodes' IAM role and instance profile, the --s3-read and checkpoint policies
    instances.py  `up`'s steps: RunInstances per AZ, wait, name
    console.py    host keys from the console output (cloud-init's block)
    replace.py    `repair`: lost instances, and new ones like their peers through instances.py's launch code
    cloud_init.py the nodes' user data
    fabric.py     EFA interfaces, the leader's Elastic IP, the S3 endpoint, quotas
    plan.py       what `up` would make and cost; EC2 DryRun
    teardown.py   removing exactly the listed resources, in dependency order
    catalog.py    prices, GPUs, DLAMI releases (no AWS calls)

boto3 response dicts never leave this package: everything returned here is a typed value (Cluster, Plan,
ClusterStatus, Found, Teardown). This class keeps what is per process: the local store (the cluster's
identity on this machine), the resolved Context of the spec at hand, and `force`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Sequence

from clusterctl.errors import ConfigError
from clusterctl.providers.aws import (
    bootstrap,
    catalog,
    console,
    discovery,
    iam,
    instances,
    machine,
    plan as planning,
    replace,
    resources,
    status,
    teardown,
)
from clusterctl.providers.aws.api import Api, Report
from clusterctl.providers.aws.console import CONSOLE_WAIT
from clusterctl.providers.aws.discovery import CLUSTER_ID, Scope, caller, new_cluster_id
from clusterctl.providers.aws.machine import Context, Image, TypeInfo
from clusterctl.providers.aws.options import AwsOptions
from clusterctl.providers.base import (
    ClusterKeys,
    ClusterStatus,
    Found,
    Launched,
    LostNode,
    NodeFacts,
    ObjectStore,
    Plan,
    Provider,
    Teardown,
)
from clusterctl.state import StateStore, atomic_write, validate_name
from clusterctl.types import Cluster, ClusterSpec, Node


class AwsProvider(Provider):
    name = "aws"
    builds_runtime_locally = False  # the leader builds the node runtime (the DLAMI is not this machine's OS)
    lists_from_cloud = True  # `ls` / `down --all` ask EC2 in every region a record names (or --region)
    shares_this_machine = False
    # `up`'s flags only an AWS cluster has (the option schema): with --provider local they are refused.
    up_flags = frozenset(
        {
            "--type", "--region", "--ami", "--ami-parameter", "--ssh-user", "--volume-size", "--volume-type",
            "--iops", "--spot", "--vpc", "--subnet", "--cidr", "--ssh-cidr", "--s3-read", "--private-ips",
            "--trust-first-contact",
        }
    )  # fmt: skip
    title = "AWS"
    about = "EC2 instances"
    default_cluster = "cluster"
    max_nodes = 1000

    def __init__(
        self,
        store: StateStore | None = None,
        region: str | None = None,
        report: Report | None = None,
        poll_interval: float = 2.0,
        wait_timeout: float = 900.0,
        console_wait: float = CONSOLE_WAIT,
        delete_timeout: float = 600.0,
        force: bool = False,
    ):
        self.store = store or StateStore()
        self.api = Api(region, report, poll_interval)
        self.wait_timeout = wait_timeout
        self.console_wait = console_wait
        self.delete_timeout = delete_timeout
        self.force = force  # down/gc may remove another owner's cluster
        self._ctx: Context | None = None
        self._scopes: dict[str, Scope] = {}  # the clusters this process launches (or found in their record)
        self._launching: set[str] = set()

    @property
    def region(self) -> str:
        return self.api.region

    @property
    def report(self) -> Report:
        return self.api.report

    @report.setter
    def report(self, value: Report) -> None:
        self.api.report = value

    def client(self, service: str) -> Any:
        return self.api.client(service)

    # ---- identity: which resources are this cluster's -----------------------------------------------------
    def _id_file(self, name: str) -> Path:
        return self.store.cluster_dir(name) / "aws-id"

    def known_scope(self, name: str) -> Scope | None:
        """The cluster's identity from this machine: the record's id (a record made before ids: name + this
        machine's owner tag), else the id an interrupted `up` saved before creating anything."""
        if name in self._scopes:
            return self._scopes[name]
        from clusterctl.errors import StateError

        scope = None
        if self.store.exists(name):
            cluster = self.store.load(name).cluster
            if cluster.provider == self.name:
                cid = cluster.facts.cluster_id
                scope = Scope(name, cid, cluster.facts.owner or self.me())
        if scope is None and self._id_file(name).is_file():
            scope = Scope(name, self._id_file(name).read_text().strip(), self.me())
        if scope is not None and scope.id and not CLUSTER_ID.match(scope.id):
            raise StateError(
                f"the record of cluster {name} holds a bad cluster id {scope.id!r}",
                "move its folder aside; `clusterctl down NAME` still finds it by tags",
            )
        if scope is not None:
            self._scopes[name] = scope
        return scope

    def _recorded_scope(self, name: str) -> Scope | None:
        """known_scope of a name as tagged on an instance: a tag that is no valid name has no record here."""
        try:
            validate_name(name)
        except ConfigError:
            return None
        return self.known_scope(name)

    def _launch_scope(self, name: str) -> Scope:
        """The identity `up` creates under: the known one, else a new random id, saved before anything is made."""
        scope = self.known_scope(name)
        if scope is None:
            scope = Scope(name, new_cluster_id(), self.me())
            atomic_write(self.store.ensure_dir(name) / "aws-id", scope.id + "\n")
            self._scopes[name] = scope
        return scope

    def identities(self, name: str) -> list[Scope]:
        """Every identity that holds resources tagged with this name (by id; before ids, by owner)."""
        return resources.identities(self.api, name)

    def _scopes_for(self, name: str) -> list[Scope]:
        """What `down NAME` removes: the identity this machine knows, else every identity of the name that is this
        owner's; another owner's only with force (a UsageError naming the owner otherwise, before any change)."""
        if name in self._launching:  # the rollback of this process's own `up`: only its own identity
            scope = self.known_scope(name)
            return [scope] if scope is not None else []
        known = self.known_scope(name)
        if known is not None:
            return [known]
        found = self.identities(name)
        foreign = [s for s in found if not self.owns(s.owner)]
        if foreign and not self.force:
            from clusterctl.errors import UsageError

            raise UsageError(
                f"cluster {name} in {self.region} belongs to another owner "
                f"({'; '.join(s.label() for s in foreign)}) and this machine has no record of it",
                "pass --force to remove it anyway",
            )
        return found

    def me(self) -> str:
        """The caller identity's ARN (discovery.caller): what `clusterctl:owner` says of what it makes."""
        return caller(self.api)

    def owns(self, owner: str) -> bool:
        """The caller identity's ARN, or this machine's user as `clusterctl:owner` said before it held identities
        (user@host: discovery.legacy_owner)."""
        return bool(owner) and owner in (self.me(), discovery.legacy_owner())

    def owners(self, name: str) -> list[str]:
        """The owners of what `down NAME` would remove (for the confirmation prompt)."""
        return sorted({s.owner or "unknown" for s in self._scopes_for(name)})

    def _view(self, name: str) -> Scope:
        """What `ls`/`status`/`find` show for a name: the identity this machine knows, else every one."""
        return self.known_scope(name) or Scope(name, every=True)

    # ---- facts: type, image, the spec resolved --------------------------------------------------------------
    def type_info(self, instance_type: str) -> TypeInfo:
        return machine.type_info(self.api, instance_type)

    def image(self, opts: AwsOptions, info: TypeInfo | None = None) -> Image:
        return machine.image(self.api, opts, info)

    def context(self, spec: ClusterSpec) -> Context:
        if self._ctx is None or self._ctx.spec != spec:
            self._ctx = machine.resolve(self.api, spec)
        return self._ctx

    # ---- plan / dry run / launch ----------------------------------------------------------------------------
    def plan(self, spec: ClusterSpec) -> Plan:
        return planning.plan(self.api, self.context(spec), self.known_scope(spec.name))

    def dry_run(self, spec: ClusterSpec) -> list[str]:
        """EC2's DryRun on the mutating calls that have it; nothing else that mutates is called."""
        return planning.dry_run(self.api, self.context(spec), self.known_scope(spec.name))

    def launch(self, spec: ClusterSpec, keys: ClusterKeys) -> Launched:
        self._launching.add(spec.name)
        ctx = self.context(spec)
        scope = self._launch_scope(spec.name)
        cluster = instances.launch(
            self.api, ctx, scope, keys, self.store.ensure_dir(spec.name) / "aws-launch.json", self.wait_timeout
        )
        return Launched(cluster, {})

    def host_keys(self, cluster: Cluster) -> dict[str, tuple[str, ...]]:
        """Host keys cloud-init printed to each node's console (console.host_keys), read with Latest=True on
        Nitro types; for at most console_wait (CONSOLE_WAIT, 10 minutes)."""
        ctx = self._ctx
        info = (
            ctx.type
            if ctx is not None and ctx.type.name == cluster.instance_type
            else self.type_info(cluster.instance_type)
            if cluster.instance_type
            else None
        )
        return console.host_keys(self.api, cluster, bool(info and info.nitro), self.console_wait)

    def refresh_access(self, spec: ClusterSpec, cluster: Cluster) -> None:
        """`up` of a cluster that is already up: its ssh rule becomes exactly this run's range."""
        if cluster.extra.get("security_group", ""):
            bootstrap.refresh_access(self.api, cluster, self.context(spec).opts.ssh_cidr)

    def grant_checkpoint_write(self, cluster: Cluster, uri: str) -> None:
        """`train --checkpoint-to`: the nodes' role may write checkpoints under `uri` only."""
        iam.grant_checkpoint_write(self.api, cluster, uri)

    # ---- repair (cluster/repair.py) ---------------------------------------------------------------------------
    def _own_scope(self, cluster: Cluster) -> Scope:
        scope = self.known_scope(cluster.name)
        if scope is None:
            from clusterctl.errors import StateError

            raise StateError(f"no identity of cluster {cluster.name} on this machine", "see `clusterctl status`")
        return scope

    def lost_nodes(self, cluster: Cluster) -> list[LostNode]:
        """The record's instances that are terminated, stopped or missing (by id, among its identity's)."""
        return replace.lost(self.api, self._own_scope(cluster), cluster)

    def replace_nodes(self, cluster: Cluster, lost: Sequence[Node], keys: ClusterKeys) -> Launched:
        """New instances like a live peer's (replace.py), through `up`'s RunInstances parameters; all or none."""
        nodes = replace.replace(
            self.api,
            self._own_scope(cluster),
            cluster,
            lost,
            keys.internal_public,
            self.store.ensure_dir(cluster.name) / "aws-repair.json",
            self.wait_timeout,
        )
        return Launched(Cluster(cluster.name, self.name, tuple(nodes), cluster.region, cluster.instance_type), {})

    def remove_nodes(self, cluster: Cluster, nodes: Sequence[Node]) -> list[str]:
        return replace.remove(self.api, self._own_scope(cluster), cluster, nodes, self.delete_timeout)

    # ---- stop / start (cluster/provision.py) ------------------------------------------------------------------
    def stop_nodes(self, cluster: Cluster) -> Teardown:
        """StopInstances on the record's instances, by id among its identity's (instances.stop); a one-time spot
        instance cannot be stopped (EC2 only terminates it): refused before any call."""
        if cluster.facts.spot:
            from clusterctl.errors import UsageError

            raise UsageError(
                f"cluster {cluster.name} runs on one-time spot instances, which EC2 cannot stop",
                f"`clusterctl down {cluster.name}` removes it (what its disks hold is lost)",
            )
        stopped, left = instances.stop(self.api, self._own_scope(cluster), cluster, self.wait_timeout)
        return Teardown(tuple(stopped), tuple(left))

    def start_nodes(self, cluster: Cluster, keys: ClusterKeys) -> Launched:
        """StartInstances on the record's stopped instances (instances.start); the watchdog is a systemd unit on
        their disks and starts with them. Host keys: the ones pinned at creation (cloud-init prints them at the
        first boot only)."""
        return Launched(instances.start(self.api, self._own_scope(cluster), cluster, self.wait_timeout), {})

    # ---- find / status / ls / gc ------------------------------------------------------------------------------
    def find(self, name: str) -> Cluster | None:
        return discovery.find(self.api, self._view(name))

    def status(self, name: str) -> ClusterStatus | None:
        found = status.statuses(self.api, self._view(name), self._recorded_scope)
        if len(found) < 2:
            return found[0] if found else None
        # no record here: every identity of the name, shown as one (their owners listed)
        return ClusterStatus(
            name,
            self.name,
            self.region,
            found[0].instance_type,
            tuple(n for st in found for n in st.nodes),
            tuple(line for st in found for line in st.other),
            ", ".join(sorted({st.owner for st in found if st.owner})),
        )

    def statuses(self) -> list[ClusterStatus]:
        """Every cluster of this account and region, in one DescribeInstances (plus the listing of names)."""
        out = status.statuses(self.api, None, self._recorded_scope)
        for name in self.all_clusters():  # names with resources but no instances (of this machine's identity)
            known = self.known_scope(name)
            if any(st.name == name and (st.recorded or known is None) for st in out):
                continue
            view = known or self._view(name)
            left = tuple(f.line() for f in resources.resources_of(self.api, view))
            if left:
                out.append(ClusterStatus(name, self.name, self.region, "", (), left, view.owner, known is not None))
        return sorted(out, key=lambda st: (st.name, not st.recorded, st.owner))

    def node_facts(self, cluster: Cluster) -> dict[str, NodeFacts]:
        """Type, AZ and placement group of each node now, by node name (one DescribeInstances)."""
        return discovery.node_facts(self.api, self._view(cluster.name), cluster)

    def reboot(self, cluster: Cluster, hosts: Iterable[str], timeout: float = 60.0) -> None:
        return None  # an instance has its own kernel: the caller reboots it over ssh and waits for its new boot id

    def all_clusters(self) -> list[str]:
        return resources.all_clusters(self.api)

    def everything_made(self) -> list[Found]:
        """Everything of this account and region (and its IAM entities) that carries clusterctl's tag, with
        when it was made, by whom and under which cluster id, whatever cluster it belongs to and whether or not a
        record of it exists anywhere (for `gc`, which removes exactly these by id: remove())."""
        return resources.resources_of(self.api, None)

    # ---- down ---------------------------------------------------------------------------------------------------
    def resources(self, name: str) -> list[str]:
        return [f.line() for s in self._scopes_for(name) for f in resources.resources_of(self.api, s)]

    def terminate(self, name: str) -> Teardown:
        """Remove everything of the cluster's identity (see _scopes_for), by id, in dependency order, waiting
        through dependency errors (bounded), then prove by a fresh listing that nothing of it is left."""
        scopes = self._scopes_for(name)
        removed = teardown.remove(
            self.api, [f for s in scopes for f in resources.resources_of(self.api, s)], self.delete_timeout
        )
        return Teardown(tuple(removed), tuple(f.line() for s in scopes for f in resources.resources_of(self.api, s)))

    def remove(self, found: Iterable[Found]) -> Teardown:
        """Exactly these resources (what `gc` listed and the operator confirmed), by their ids; then which of
        them are still there. Nothing is looked up by a name or a tag value."""
        items = list(found)
        removed = teardown.remove(self.api, items, self.delete_timeout)
        wanted = {(f.kind, f.id) for f in items}
        return Teardown(
            tuple(removed), tuple(f.line() for f in resources.resources_of(self.api, None) if (f.kind, f.id) in wanted)
        )

    # ---- a recorded cluster's facts (no API call) -------------------------------------------------------
    def hourly_price(self, cluster: Cluster) -> float | None:
        """Instances at the built-in dated on-demand table (catalog.py): an estimate, not a bill."""
        each = catalog.instance_price(cluster.instance_type)
        return None if each is None else each * len(cluster.nodes)

    def gpus_per_node(self, cluster: Cluster) -> int:
        recorded = cluster.facts.gpus
        return recorded if recorded is not None else catalog.gpus(cluster.instance_type) or 0

    def gpu_model(self, cluster: Cluster) -> str:
        return catalog.gpu_model_of(cluster.instance_type, cluster.facts.gpu_model, self.gpus_per_node(cluster))

    def watchdog_running(self, cluster: Cluster) -> bool | None:
        return None  # only the leader can say (autostop_status asks it over ssh)

    def object_store(self) -> ObjectStore:
        from clusterctl.providers.aws.objects import S3Objects

        return S3Objects(self.client("s3"))
