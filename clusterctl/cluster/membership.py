"""A cluster's members changed: lost ones replaced or dropped (`repair`), members added or removed (`up`'s resize).

    replace: provider.replace_nodes (like their peers, the launch code of `up`) -> wait for ssh -> host keys from an
        authenticated source (provider.host_keys / Launched.host_keys; never first contact) -> every node's
        known_hosts, the cluster key to the new nodes -> the node runtime and every dataset of the record from a peer
        (cluster/peer_copy.py, verified) -> every node's hosts file and the leader-to-member proof
        (node_setup.setup_nodes) -> the leader's live-hosts file -> ./hosts, the ssh config entry, the record ->
        what is left of the lost nodes removed (provider.retire_nodes), only now.
    A replacement that fails a check is removed and never enters the record or any hosts file; the record is
    written last, so a failed repair leaves the cluster as it found it (plus known_hosts lines of the removed
    replacements on the nodes, which name no live node).
    drop: the lost nodes out of the record, hosts files, ssh config and live-hosts; the next live node becomes the
    leader when the leader is lost.
grow adds members through the same replace steps, shrink drops the newest as a drop does. RepairPlan is the change
both carry out: which nodes go (or come), and what it costs.
"""

from __future__ import annotations

import dataclasses
import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from clusterctl.cluster import live_hosts, node_setup, peer_copy, provision, reach, sshentry
from clusterctl.errors import HostKeyError, ProvisionError, StateError, UsageError
from clusterctl.hostsfile import HostsFile
from clusterctl.providers.base import ClusterKeys, LostNode, Provider
from clusterctl.remote import sshkeys
from clusterctl.remote.ssh import SshPool
from clusterctl.remote.targets import SshTarget
from clusterctl.state import Record, StateStore, atomic_write
from clusterctl.types import Cluster, Node

Report = Callable[[str], None]


@dataclass(frozen=True)
class RepairPlan:
    cluster: Cluster
    lost: tuple[LostNode, ...]
    drop: bool
    node_hourly_usd: float | None  # one node's price now (None: unknown)
    held: tuple[LostNode, ...] = ()  # stopped (disks kept) or running without an ssh answer: reported, kept as is

    @property
    def live(self) -> tuple[Node, ...]:
        gone = {x.node.name for x in self.lost}
        return tuple(n for n in self.cluster.nodes if n.name not in gone)

    @property
    def new_leader(self) -> Node | None:
        """With --drop, the live node that becomes the leader when the leader is lost."""
        if self.drop and self.lost and self.cluster.leader.name in {x.node.name for x in self.lost} and self.live:
            return self.live[0]
        return None

    @property
    def hourly_change_usd(self) -> float | None:
        """+ a node's price per replacement of a node that no longer costs; - per dropped node that still costs."""
        if self.node_hourly_usd is None:
            return None
        if self.drop:
            return -self.node_hourly_usd * sum(1 for x in self.lost if x.billed)
        return self.node_hourly_usd * sum(1 for x in self.lost if not x.billed)

    def lines(self) -> list[str]:
        c = self.cluster
        if not self.lost and not self.held:
            return [f"cluster {c.name}: all {len(c.nodes)} node(s) answer; nothing to repair"]
        out = [
            f"cluster {c.name}: {len(self.lost)} of {len(c.nodes)} node(s) lost"
            + (f", {len(self.held)} not lost but not answering (kept as they are)" if self.held else "")
        ]
        for x in self.held:
            out.append(f"  {x.node.name} ({x.node.private_ip}): {x.why}; not replaced: {_advice(c, x)}")
        if not self.lost:
            return out
        for x in self.lost:
            what = (
                "dropped from the cluster"
                if self.drop
                else f"replaced by a new {c.instance_type} node of the same name and settings"
            )
            out.append(
                f"  {x.node.name} ({x.node.private_ip}): {x.why}; {what}"
                + ("; the old one is removed" if x.billed else "")
            )
        if self.new_leader is not None:
            out.append(
                f"  the leader is lost: {self.new_leader.name} ({self.new_leader.private_ip}) becomes the leader"
            )
        change = self.hourly_change_usd
        out.append(
            "cost: unknown change per hour"
            if change is None
            else f"cost: {'+' if change >= 0 else '-'}${abs(change):.2f}/hour"
        )
        return out


def _advice(cluster: Cluster, x: LostNode) -> str:
    """What to do about a node repair keeps as it is."""
    name = f"`clusterctl repair {cluster.name} --node {x.node.name}`"
    if x.disks_kept:
        start = f"`aws ec2 start-instances --instance-ids {x.node.instance_id}`" if x.node.instance_id else "it"
        return f"its disks hold its data: start {start}, or {name} replaces it (they go once the new node is verified)"
    return f"it may only be slow: wait, or {name} replaces it (it goes once the new node is verified)"


# ---- a cluster resized (`up` asked for more or fewer nodes) ---------------------------------------------------
def grow(
    store: StateStore,
    provider: Provider,
    cluster: Cluster,
    count: int,
    *,
    report: Report = lambda _: None,
    hosts_out: Path | None = Path("hosts"),
    ssh_timeout: float = 300.0,
) -> Cluster:
    """`count` more members, added as a repair adds replacements (the provider's replace_nodes, keys pinned from an
    authenticated source, the runtime and the record's datasets from a peer, verified, then every hosts file and
    the record); all or nothing. The cluster as the record now says."""
    new = provider.new_nodes(cluster, count)
    whole = dataclasses.replace(cluster, nodes=(*cluster.nodes, *new))
    p = RepairPlan(whole, tuple(LostNode(n, "new") for n in new), drop=False, node_hourly_usd=None)
    with store.lock(cluster.name):
        unchanged(store, cluster)
        return replace(store, provider, p, report, (), hosts_out, ssh_timeout, adding=True)


def shrink(
    store: StateStore,
    provider: Provider,
    cluster: Cluster,
    remove: Sequence[Node],
    *,
    report: Report = lambda _: None,
    hosts_out: Path | None = Path("hosts"),
) -> Cluster:
    """These members out of the cluster as `repair --drop` drops lost ones (hosts files, live-hosts, record), then
    removed by the provider. The leader is never one of them."""
    if any(n.role == "leader" for n in remove):
        raise UsageError(f"cluster {cluster.name}: the leader is not removed to shrink it", "keep at least one node")
    p = RepairPlan(cluster, tuple(LostNode(n, "removed") for n in remove), drop=True, node_hourly_usd=None)
    with store.lock(cluster.name):
        unchanged(store, cluster)
        return drop(store, provider, p, report, hosts_out)


def unchanged(store: StateStore, cluster: Cluster) -> None:
    if store.load(cluster.name).cluster != cluster:
        raise StateError(f"the record of cluster {cluster.name} changed since the plan", "run the command again")


# ---- drop ---------------------------------------------------------------------------------------------------
def drop(store: StateStore, provider: Provider, p: RepairPlan, report: Report, hosts_out: Path | None) -> Cluster:
    live = list(p.live)
    if p.new_leader is not None:
        live[0] = dataclasses.replace(live[0], role="leader")
        report(f"{live[0].name} ({live[0].private_ip}) is the leader now")
    cluster = dataclasses.replace(p.cluster, nodes=tuple(live))
    hf = reach.hosts_file(cluster)
    targets = reach.ssh_targets(cluster, store)
    with SshPool(reach.ssh_settings(cluster, store)) as pool:
        r = pool.put(targets, {"hosts": (hf.render().encode(), 0o644)})
        if not r.all_ok:
            bad = "; ".join(f"{x.host}: {x.error}" for x in r.failed)
            raise ProvisionError(f"could not write the hosts file on every live node: {bad}", "run `repair` again")
        live_hosts.write(pool, targets[0], reach.hosts_file(cluster))
    _save(store, cluster, hf, hosts_out, report)
    for line in provider.remove_nodes(p.cluster, [x.node for x in p.lost]):
        report(f"removed {line}")
    report(f"dropped {len(p.lost)} node(s): {', '.join(x.node.name for x in p.lost)}; {len(live)} node(s) left")
    return cluster


# ---- replace ------------------------------------------------------------------------------------------------
def replace(
    store: StateStore,
    provider: Provider,
    p: RepairPlan,
    report: Report,
    data: Sequence[str],
    hosts_out: Path | None,
    ssh_timeout: float,
    adding: bool = False,  # the "lost" nodes are new members (grow): the same steps, other words
) -> Cluster:
    name, paths = p.cluster.name, reach.paths(store, p.cluster.name)
    keys = ClusterKeys(
        sshkeys.public_line_of(paths.operator_key, f"clusterctl-{name}-operator"),
        sshkeys.public_line_of(paths.internal_key, f"clusterctl-{name}-internal"),
        str(paths.operator_key),
    )
    lost = [x.node for x in p.lost]
    if p.cluster.leader.name not in {n.name for n in lost}:  # a lost leader runs no job
        _offer_live_only(store, dataclasses.replace(p.cluster, nodes=p.live))
    peer = next(n for n in p.cluster.nodes if n.name not in {x.name for x in lost})
    with SshPool(reach.ssh_settings(p.cluster, store)) as pool:  # which datasets: settled before anything launches
        on_peer = next(t for t in reach.ssh_targets(p.cluster, store) if t.label == peer.ssh_host)
        dsts = peer_copy.which_datasets(p.cluster, provider, pool, on_peer, data, report)
    report(f"launching {len(lost)} {'new' if adding else 'replacement'} node(s) with the {provider.name} provider")
    launched = provider.replace_nodes(p.cluster, lost, keys)
    new = {n.name: n for n in launched.cluster.nodes}
    whole = dataclasses.replace(p.cluster, nodes=tuple(new.get(n.name, n) for n in p.cluster.nodes))
    fresh = [n for n in whole.nodes if n.name in new]
    known_before = paths.known_hosts.read_text() if paths.known_hosts.exists() else ""
    try:
        report("waiting for ssh on the new node(s)")
        node_setup.wait_for_ssh(
            dataclasses.replace(whole, nodes=(whole.leader, *[n for n in fresh if n.role != "leader"])), ssh_timeout
        )
        known = dict(provider.host_keys(launched.cluster))
        known.update(launched.host_keys)
        unverified = [n.name for n in fresh if n.ssh_host not in known]
        if unverified:
            raise HostKeyError(
                f"no host key for {', '.join(unverified)} from an authenticated source (their console output); "
                "repair does not trust first contact",
                "check that the image runs cloud-init, then run `clusterctl repair` again",
            )
        pinned_before = _read_known_hosts(known_before)
        pinned = {
            n.ssh_host: pinned_before.get(sshkeys.known_hosts_host(n.ssh_host, n.ssh_port), ()) for n in whole.nodes
        }
        pinned.update({n.ssh_host: tuple(known[n.ssh_host]) for n in fresh})
        missing = [n.name for n in whole.nodes if not pinned[n.ssh_host]]
        if missing:
            raise StateError(
                f"the cluster's known_hosts has no key for {', '.join(missing)}", "see `clusterctl status`"
            )
        pinned = node_setup.pin_host_keys(whole, pinned, paths.known_hosts)
        report(f"host keys of {len(fresh)} new node(s) pinned from an authenticated source")
        hf = reach.hosts_file(whole)
        targets = {t.label: t for t in reach.ssh_targets(whole, store)}
        with SshPool(reach.ssh_settings(whole, store)) as pool:
            # every node learns the new keys, the new nodes get the cluster key; the hosts files stay as they were
            # until the new nodes have passed every check
            _hand_keys(whole, fresh, pool, targets, pinned, paths)
            peer_copy.runtime(whole, provider, peer, fresh, pool, targets, str(paths.known_hosts), report)
            peer_copy.datasets(peer, fresh, pool, targets, str(paths.known_hosts), dsts, report)
            every = [targets[n.ssh_host] for n in whole.nodes]
            try:
                node_setup.setup_nodes(whole, pool, every, pinned, paths, hf)
            except ProvisionError:  # the leader's first ssh to a new node: retried while its network settles
                _leader_reaches(pool, every[0], [n for n in fresh if n.role != "leader"])
                node_setup.setup_nodes(whole, pool, every, pinned, paths, hf)
            report("the leader reaches every node over ssh with host keys checked; hosts files updated")
            live_hosts.write(pool, every[0], reach.hosts_file(whole))
    except BaseException as exc:  # Ctrl-C included: nothing launched is left, the record is untouched
        what = ("adding", "new") if adding else ("repair", "replacement")
        report(f"{what[0]} failed ({provision._why(exc)}); removing the {what[1]} node(s)")
        for line in provider.remove_nodes(whole, fresh):
            report(f"  removed {line}")
        atomic_write(paths.known_hosts, known_before, mode=0o600)
        raise
    _save(store, whole, hf, hosts_out, report)
    for line in provider.retire_nodes(p.cluster, p.lost):  # only now: the replacements passed every check
        report(f"removed the lost {line}")
    done = "added" if adding else "repaired"
    report(f"{done} {len(fresh)} node(s): {', '.join(f'{n.name} ({n.private_ip})' for n in fresh)}")
    return whole


def _offer_live_only(store: StateStore, live: Cluster) -> None:
    """The leader's live-hosts without the lost nodes, before their replacements boot: a running elastic job's
    discovery offers a listed host the moment it answers ssh, and a replacement without the runtime yet would
    fail its rank and end the job. The last step of a repair lists them again."""
    with SshPool(reach.ssh_settings(live, store)) as pool:
        live_hosts.write(pool, reach.ssh_targets(live, store)[0], reach.hosts_file(live))


def _read_known_hosts(text: str) -> dict[str, tuple[str, ...]]:
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 3:
            out.setdefault(parts[0], []).append(f"{parts[1]} {parts[2]}")
    return {k: tuple(v) for k, v in out.items()}


def _hand_keys(
    cluster: Cluster,
    fresh: Sequence[Node],
    pool: SshPool,
    targets: dict[str, SshTarget],
    pinned: dict[str, tuple[str, ...]],
    paths: reach.ClusterPaths,
) -> None:
    view = {}
    for n in cluster.nodes:
        view[n.private_ip] = list(pinned[n.ssh_host])
        view[n.name] = list(pinned[n.ssh_host])
    known = (sshkeys.render_known_hosts(view).encode(), 0o644)
    pub = paths.internal_key.with_name(paths.internal_key.name + ".pub")
    new = {
        ".ssh/id_ed25519": (paths.internal_key.read_bytes(), 0o600),
        ".ssh/id_ed25519.pub": (pub.read_bytes(), 0o644),
        ".ssh/known_hosts": known,
    }
    names = {n.name for n in fresh}
    for n in cluster.nodes:
        r = pool.put_one(targets[n.ssh_host], new if n.name in names else {".ssh/known_hosts": known})
        if not r.ok:
            raise ProvisionError(f"could not hand the cluster's keys to {n.name}: {r.error}", "run `repair` again")


def _leader_reaches(pool: SshPool, leader: SshTarget, fresh: Sequence[Node], timeout: float = 60.0) -> None:
    """The leader's ssh to each new member, host key checked, retried while the network learns the new node."""
    deadline = time.monotonic() + timeout
    for n in fresh:
        probe = (
            f"ssh -o BatchMode=yes -o StrictHostKeyChecking=yes -o ConnectTimeout=10 {shlex.quote(n.private_ip)} true"
        )
        while True:
            r = pool.run_one(leader, probe, timeout=30)
            if r.ok:
                break
            if time.monotonic() > deadline:
                why = (r.error or r.stderr.strip() or f"exit {r.exit_code}").splitlines()[-1][:200]
                raise ProvisionError(f"the leader cannot ssh to the new node {n.name} ({n.private_ip}): {why}")
            time.sleep(2.0)


def _save(store: StateStore, cluster: Cluster, hf: HostsFile, hosts_out: Path | None, report: Report) -> None:
    """The cluster's hosts file, ./hosts where it is this cluster's (what `up` wrote for it, unchanged since), the ssh
    config entry where `up` made one, then the record."""
    from clusterctl.cluster import hosts_out as hosts_out_mod

    paths = reach.paths(store, cluster.name)
    before = paths.hosts.read_text() if paths.hosts.exists() else None
    atomic_write(paths.hosts, hf.render(), mode=0o644)
    if hosts_out is not None and hosts_out.exists():
        ours = before is not None and hosts_out.read_text() == before
        if not (ours and hosts_out_mod.write(hosts_out, hf.render(), cluster.name)):
            report(f"{hosts_out} is not this cluster's hosts file: left alone; the cluster's is {paths.hosts}")
    if sshentry.config_path(cluster.name).exists():
        sshentry.write(cluster, store)
    store.save(Record(cluster, "up", time.time()))
