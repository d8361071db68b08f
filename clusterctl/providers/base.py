"""The Provider protocol: what every place nodes come from (a cloud, this machine) must answer.

This is the whole contract: every method and attribute the CLI and the library call on a provider is
declared here, so nothing probes a provider with hasattr/getattr or branches on its name. Providers
return typed values only (the dataclasses below); their API responses never leave their module.
Everything after launch (waiting for ssh, pinning host keys, handing out the cluster key, the hosts
file) is common code in cluster/provision.py, the same for every provider.

Lifecycle, in the order `up` / `down` call it:
  plan -> dry_run (only with --dry-run) -> launch -> host_keys -> [refresh_access on a re-run]
  resources -> terminate                     (`down`)
Reading, never changing anything:
  find, status, statuses, all_clusters       (`ls`, `status`, `down --all`)
  everything_made, owners, me                (`gc`, `down --all`: what exists, by whom, who asks)
  node_facts                                 (`doctor`'s same-type / zone / placement check)
Stopping and starting (`stop`, `start`: cluster/provision.py), the disks kept:
  stop_nodes -> start_nodes -> host_keys
Changing a running cluster:
  remove (`gc`: exactly the listed ids), reboot (`clean --reboot`), grant_checkpoint_write
  (`train --checkpoint-to`).
  lost_nodes -> replace_nodes -> host_keys -> [remove_nodes] -> retire_nodes   (`repair`: cluster/repair.py)
Facts of a recorded cluster, for workloads (no call to the provider's API):
  hourly_price, gpus_per_node, gpu_model           (`train`'s estimate, the GPU check, train/config.py's row)
  watchdog_running                                  (`status`: does the autostop watchdog run)
  object_store                                      (`up --runtime-cache`: the bucket built runtimes are kept in)
Capabilities (plain attributes): region, builds_runtime_locally, lists_from_cloud, shares_this_machine,
node_own_roots (the folders a node has to itself), force,
and the option schema: up_flags (the `up` flags only this provider takes), title, about, default_cluster.

Every provider subclasses Provider (an ABC): mypy checks each method's signature against this class, and
the registry (providers/__init__.py) refuses a class that does not.

Where clusters are listed from (`ls`, `down --all`, and whose a cluster without a record is: cluster/
overview.py reads lists_from_cloud of the providers concerned and never names one):
  lists_from_cloud False   the clusters live on this machine and the records here are the whole list:
                           `ls` shows each record's own state (up, stopped by autostop ...) at no cost;
                           `down --all` also asks all_clusters() (what is left without a record).
  lists_from_cloud True    the clusters live in a cloud's regions: statuses() / all_clusters() are asked in
                           every region a record of this provider names, or the one --region gives (or the
                           default one with --provider), so a cluster without a record here is listed too
                           and a record the cloud no longer knows says so. Never asked with no record and
                           no flag: `ls` works without the cloud's credentials.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import ClassVar, Iterable, Mapping, Sequence

from clusterctl.errors import UsageError
from clusterctl.types import Cluster, ClusterSpec, Node


@dataclass(frozen=True)
class ClusterKeys:
    operator_public: str  # authorized on every node; its private half stays on the operator's machine
    internal_public: str  # authorized on every node; its private half is handed to every node
    operator_private_path: str


@dataclass(frozen=True)
class Launched:
    cluster: Cluster
    # Host keys known at creation, by address ("ssh-ed25519 AAAA..."). Hosts missing here are pinned at
    # first contact, recorded, and never re-accepted silently.
    host_keys: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class ImageFacts:
    """What the provider knows before launch about the image and GPUs the node runtime will be built for
    (runtime/install.plan_line judges it); empty values are unknown until `up` probes the nodes."""

    python: str = ""  # the image's python3, major.minor ("3.10")
    cuda_toolkits: tuple[str, ...] = ()  # toolkit versions the image keeps side by side ("12.8", "13.0")
    default_cuda: str = ""  # what /usr/local/cuda is
    compute_caps: tuple[str, ...] = ()  # the type's GPUs ("7.0"); () for CPU types or when unknown
    gpu_model: str = ""


@dataclass(frozen=True)
class Plan:
    """What `up` would create, said before anything is created (no mutating call)."""

    lines: tuple[str, ...]
    hourly_usd: float | None = 0.0  # the whole cluster; None when a price is unknown
    prices_date: str | None = None  # the date of the built-in price table, when prices come from it
    image: ImageFacts | None = None  # None: the nodes are this machine's OS (their runtime is built here)


@dataclass(frozen=True)
class NodeStatus:
    node: Node
    state: str  # "running", "pending", "stopped", ...
    zone: str = ""
    launched_at: float | None = None  # epoch seconds
    hourly_usd: float | None = None


@dataclass(frozen=True)
class ClusterStatus:
    """A cluster as the provider sees it now (for `ls` and `status`)."""

    name: str
    provider: str
    region: str
    instance_type: str
    nodes: tuple[NodeStatus, ...]
    other: tuple[str, ...] = ()  # resources without nodes (e.g. a VPC left by an interrupted `up`)
    owner: str = ""  # who made it (user@host), where the provider records it
    # The cluster this machine's record of the name describes; False for a cluster without a record here, and
    # for another of the same name (another owner's: a cloud account is shared, a name is not an identity).
    recorded: bool = False
    # What its disks cost per month, billed whether the nodes run or not (AWS: its EBS volumes at the built-in
    # prices); 0 for what is not billed (local homes); None when unknown.
    disks_monthly_usd: float | None = None

    @property
    def stopped(self) -> bool:
        """Every node stopped (or stopping): the cluster costs only its disks."""
        return bool(self.nodes) and all(n.state in ("stopped", "stopping") for n in self.nodes)

    @property
    def hourly_usd(self) -> float | None:
        running = [n for n in self.nodes if n.state in ("pending", "running")]
        if any(n.hourly_usd is None for n in running):
            return None
        return sum(n.hourly_usd or 0.0 for n in running)

    def cost_so_far(self, now: float) -> float | None:
        total = 0.0
        for n in self.nodes:
            if n.launched_at is None or n.hourly_usd is None:
                return None
            if n.state in ("pending", "running"):
                total += max(0.0, now - n.launched_at) / 3600.0 * n.hourly_usd
        return total


@dataclass(frozen=True)
class Found:
    """One resource a provider made for a cluster, found by its tag or name alone (for `gc`)."""

    cluster: str
    kind: str  # "instance", "VPC", "IAM role", "namespace" ...
    id: str
    created_at: float | None = None  # epoch seconds, where the provider says
    owner: str = ""  # who made it, where known (as me() says it)
    state: str = ""
    cluster_id: str = ""  # the cluster's random id (AWS `clusterctl:id`); "" for clusters made before ids

    def line(self) -> str:
        return f"{self.kind} {self.id}" + (f" ({self.state})" if self.state else "")


@dataclass(frozen=True)
class NodeFacts:
    """Where a node runs, as its provider knows it (`doctor` checks every node has the same)."""

    instance_type: str
    zone: str
    placement: str = ""  # the placement group (AWS), the bridge (local); "" when none


@dataclass(frozen=True)
class LostNode:
    """A node of the record the provider says is gone (for `repair` and `status`)."""

    node: Node
    why: str  # "terminated", "stopped", "missing", "namespace gone", "no ssh answer" ...
    billed: bool = False  # still costs money (a stopped or unreachable instance) until it is removed
    disks_kept: bool = False  # stopped or stopping: its disks hold what it had (`repair` replaces it only if named)


@dataclass(frozen=True)
class Teardown:
    removed: tuple[str, ...]  # one line per resource removed
    left: tuple[str, ...]  # what a final sweep still found (empty when all is gone)

    @property
    def clean(self) -> bool:
        return not self.left


class ObjectStore(ABC):
    """A provider's object store (S3 for AWS), as the runtime cache (runtime/s3cache.S3Cache) uses it: presigned
    URLs the nodes fetch and fill, so no node needs write access to it."""

    @abstractmethod
    def exists(self, bucket: str, key: str) -> bool:
        """Whether the object exists; raises ProvisionError (the store's one-line reason) when it cannot say."""

    @abstractmethod
    def presigned_get(self, bucket: str, key: str) -> str:
        """A URL that reads the object for an hour."""

    @abstractmethod
    def presigned_put(self, bucket: str, key: str) -> str:
        """A URL that writes the object for an hour."""


class Provider(ABC):
    name: ClassVar[str]  # "aws", "local": what Cluster.provider and --provider say
    # True when this machine builds the node runtime for the nodes (they share its OS); False when the
    # leader builds it (runtime/install.py).
    builds_runtime_locally: ClassVar[bool]
    # True when its clusters are asked of a cloud, region by region, beyond the records here (AWS); False
    # when the records here list them all (local). See "Where clusters are listed from" above.
    lists_from_cloud: ClassVar[bool]
    # Namespace nodes: one kernel, these cores, no GPUs, no instance type to judge against, the watchdog's
    # files on this machine (speed verdicts, GPU counts, NCCL settings, autostop's status and control).
    shares_this_machine: ClassVar[bool]
    # The folders a node has to itself ("$HOME" its login home); () when all of its file system is its own. What
    # lies elsewhere is this machine's and every node's at once (local nodes): `repair` copies nothing there.
    node_own_roots: ClassVar[tuple[str, ...]] = ()
    # `down`/`gc` may remove another owner's cluster (see me()); set by --force before any call.
    force: bool

    # The option schema of `up`: the flags only this provider takes (given with another provider they are
    # refused, never silently dropped: refuse_foreign_flags below), and how messages name it.
    up_flags: ClassVar[frozenset[str]] = frozenset()
    title: ClassVar[str]  # "AWS": "--ami is for AWS clusters"
    about: ClassVar[str]  # "namespace nodes on this machine": "drop it for --provider local (...)"
    default_cluster: ClassVar[str]  # `up`'s cluster name when --name is not given
    max_nodes: ClassVar[int | None] = None  # `up --nodes` above this is refused (None: the provider's plan says)

    @property
    @abstractmethod
    def region(self) -> str:
        """The region this instance works in ("local" for this machine); reading it may raise ConfigError when
        none is configured (AWS)."""

    @abstractmethod
    def plan(self, spec: ClusterSpec) -> Plan:
        """What `up` will create and what it costs per hour (read-only calls only)."""

    @abstractmethod
    def dry_run(self, spec: ClusterSpec) -> list[str]:
        """Ask the provider whether `up` would be allowed, without creating anything (EC2 DryRun)."""

    @abstractmethod
    def launch(self, spec: ClusterSpec, keys: ClusterKeys) -> Launched:
        """Create all nodes or none; found again by tags/names on re-run."""

    @abstractmethod
    def host_keys(self, cluster: Cluster) -> Mapping[str, tuple[str, ...]]:
        """Host keys learned out of band once the nodes answer ssh (e.g. cloud-init's console output),
        by ssh address. Nodes missing here are pinned at first contact."""

    @abstractmethod
    def refresh_access(self, spec: ClusterSpec, cluster: Cluster) -> None:
        """`up` of a cluster that is already up: bring who may reach it in line with this run's options
        (AWS: the ssh rule becomes this run's range; local: nothing to do)."""

    @abstractmethod
    def find(self, name: str) -> Cluster | None:
        """The cluster as the provider sees it, from tags/names alone (no local state needed)."""

    @abstractmethod
    def status(self, name: str) -> ClusterStatus | None:
        """Nodes, states, zones, launch times and prices, from the provider alone."""

    @abstractmethod
    def statuses(self) -> list[ClusterStatus]:
        """Every cluster of this provider (and region), as status() sees each, in name order (for `ls`); two
        clusters of one name (two owners') are two entries, and `recorded` says which one is this machine's."""

    @abstractmethod
    def node_facts(self, cluster: Cluster) -> dict[str, NodeFacts]:
        """Instance type, zone and placement of each node, by node name, as the provider sees them now
        (nodes it does not know are missing)."""

    @abstractmethod
    def resources(self, name: str) -> list[str]:
        """One line per resource the cluster holds (what `down` is about to remove). Raises UsageError for
        another owner's cluster unless `force` is set."""

    @abstractmethod
    def me(self) -> str:
        """The caller as this provider records owners (AWS: the caller identity's ARN; local: user@host:HOME): a
        cluster whose owner is this is the caller's, any other is kept by `down`/`gc` without --force."""

    def owns(self, owner: str) -> bool:
        """An owner tag or mark that is the caller's: me() (AWS also this machine's user as tagged before owners
        were AWS identities, `user@host`)."""
        return bool(owner) and owner == self.me()

    @abstractmethod
    def owners(self, name: str) -> list[str]:
        """Who made the cluster, where the provider records it; [] when unknown."""

    @abstractmethod
    def terminate(self, name: str) -> Teardown:
        """Remove everything the cluster created, found by tags/names, and prove it is gone."""

    @abstractmethod
    def all_clusters(self) -> list[str]:
        """Names of every cluster of this provider that still has resources."""

    @abstractmethod
    def everything_made(self) -> list[Found]:
        """Every resource this provider made for any cluster, with or without a local record (for `gc`)."""

    @abstractmethod
    def remove(self, found: Iterable[Found]) -> Teardown:
        """Remove exactly these resources (from everything_made(), confirmed by the user), never a search by name."""

    @abstractmethod
    def reboot(self, cluster: Cluster, hosts: Iterable[str], timeout: float = 60.0) -> dict[str, str | None] | None:
        """Restart the nodes at these ssh addresses by the provider's own means: address -> None, or why it
        failed. None when the provider has none (a cloud VM has its own kernel): the caller then runs
        `reboot` on the nodes over ssh."""

    @abstractmethod
    def grant_checkpoint_write(self, cluster: Cluster, uri: str) -> None:
        """Let the nodes write checkpoints under `uri` (AWS: the nodes' IAM role; local: nothing to grant,
        the nodes use whatever credentials they are given)."""

    @abstractmethod
    def stop_nodes(self, cluster: Cluster) -> Teardown:
        """Power the recorded nodes off, their disks kept (AWS: StopInstances on exactly the record's instances
        that are its identity's, waited until stopped; local: what autostop's stop does, the namespaces end and
        the homes stay). Teardown.removed: one line per node stopped; left: what still runs."""

    @abstractmethod
    def start_nodes(self, cluster: Cluster, keys: ClusterKeys) -> Launched:
        """Start the stopped nodes of the record again on their kept disks, each at its address where the
        provider keeps it (AWS: a new public IP unless an Elastic IP), with the autostop watchdog back as `up` gives
        it. Launched.cluster: the record's cluster with the nodes' addresses now; host_keys: the keys known from
        the disks (the ones pinned at creation are checked for the rest). A start that failed is started again."""

    @abstractmethod
    def lost_nodes(self, cluster: Cluster) -> list[LostNode]:
        """The record's nodes the provider knows to be gone (AWS: terminated, stopped or missing by id and tags;
        local: the node's namespace or its sshd gone), in record order. Read-only; an ssh probe is the caller's."""

    @abstractmethod
    def replace_nodes(self, cluster: Cluster, lost: Sequence[Node], keys: ClusterKeys) -> Launched:
        """Launch one node in place of each lost one, like its peers (AWS: type, AZ, subnet, placement group,
        profile, IMDSv2, volumes, security group, tags and user data of a live node, through the launch code
        of `up`; local: a fresh namespace node at the lost one's address). Launched.cluster holds only the
        replacements, each with its lost node's name and role, and running; host keys known at creation in
        Launched.host_keys. All or nothing: what it launched is removed before it raises."""

    @abstractmethod
    def remove_nodes(self, cluster: Cluster, nodes: Sequence[Node]) -> list[str]:
        """Remove exactly these nodes of the cluster (by id, never a search by name); one line per removal.
        A node already gone is skipped."""

    def new_nodes(self, cluster: Cluster, count: int) -> list[Node]:
        """`count` more members for `up` to add through replace_nodes (as `repair` launches replacements): named
        after the cluster's highest index, slots, login and port as the leader's. Here the address is the
        provider's to give at launch (""); a provider that places nodes itself gives it here."""
        from dataclasses import replace

        from clusterctl.types import next_members

        like = cluster.leader
        return [
            replace(like, name=name, private_ip="", role="member", public_ip=None, instance_id=None)
            for name in next_members(cluster, count)
        ]

    def retire_nodes(self, cluster: Cluster, lost: Sequence[LostNode]) -> list[str]:
        """What is left of these lost nodes, removed once `repair` has verified their replacements (never before);
        one line per removal. Here: the instances that still cost money."""
        return self.remove_nodes(cluster, [x.node for x in lost if x.billed and x.node.instance_id])

    @abstractmethod
    def hourly_price(self, cluster: Cluster) -> float | None:
        """The cluster's $/hour (instances; 0 for what is not billed); None when the price is unknown."""

    @abstractmethod
    def gpus_per_node(self, cluster: Cluster) -> int:
        """GPUs per node; 0 for nodes without GPUs or whose GPUs nothing checks (local nodes)."""

    @abstractmethod
    def gpu_model(self, cluster: Cluster) -> str:
        """The nodes' GPU model as the provider knows it ("V100", "NVIDIA A100"); "" for none or unknown."""

    @abstractmethod
    def watchdog_running(self, cluster: Cluster) -> bool | None:
        """Whether the autostop watchdog runs in the leader, seen from this machine; None when only the leader
        can say (over ssh)."""

    @abstractmethod
    def object_store(self) -> ObjectStore:
        """The provider's object store (the runtime cache); raises UsageError when it has none."""


def refuse_foreign_flags(chosen: type[Provider], given: Iterable[str], others: Iterable[type[Provider]]) -> None:
    """`up --provider local --type x`: the flags given that another provider's option schema holds and the chosen
    one's does not are refused with one line (UsageError, exit 2), never silently dropped."""
    foreign = {f: o for o in others if o is not chosen for f in o.up_flags if f not in chosen.up_flags}
    bad = [f for f in given if f in foreign]
    if not bad:
        return
    owner = foreign[bad[0]].title
    raise UsageError(
        f"{', '.join(bad)} {'is' if len(bad) == 1 else 'are'} for {owner} clusters",
        f"drop {'it' if len(bad) == 1 else 'them'} for --provider {chosen.name} ({chosen.about})",
    )
