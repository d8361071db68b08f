"""`repair`: the cluster's lost nodes found and replaced (or, with --drop, removed from the cluster).

    plan:  the provider's lost nodes (terminated, missing; a namespace gone) + ssh probes of the rest, spread over
           a window (--unreachable-for): a node that runs is never lost by a probe. A stopped one (its disks kept)
           or a running one that does not answer over the whole window is reported and kept as it is (held), and
           nothing is carried out while one is, unless the user names it (--node): then it is replaced
    carry out (replace):
        provider.replace_nodes (like their peers, the launch code of `up`) -> wait for ssh -> host keys from an
        authenticated source (provider.host_keys / Launched.host_keys; never first contact) -> every node's
        known_hosts, the cluster key to the new nodes -> the node runtime (runtime/install.py, the relay) ->
        every dataset of the record (ClusterFacts.datasets: what `sync` verified) and every --data DST, from a
        peer that holds it complete (data/sync.py, verified; on a provider whose nodes share folders with this
        machine, only those in a node's own folders) -> every node's hosts file and the leader-to-member proof
        (provision.setup_nodes) -> the leader's live-hosts file -> ./hosts, the ssh config entry, the record ->
        what is left of the lost nodes removed (provider.retire_nodes), only now.
    A replacement that fails a check is removed and never enters the record or any hosts file; the record is
    written last, so a failed repair leaves the cluster as it found it (plus known_hosts lines of the removed
    replacements on the nodes, which name no live node).
    carry out (drop): the lost nodes out of the record, hosts files, ssh config and live-hosts; the next live node
    becomes the leader when the leader is lost.

The live-hosts file (cluster/live_hosts.py, `host:slots` lines) on the leader lists the nodes that answer ssh with the runtime
and the datasets in place: what a Horovod host-discovery script prints (`cat ~/.clusterctl/live-hosts`), so an
elastic job picks a repaired node up. `repair` runs on the operator's machine (it holds the cloud credentials,
which never go to the nodes); a spot cluster's keep-repairing loop is `repair --yes` run again there.
"""

from __future__ import annotations

import dataclasses
import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from clusterctl.cluster import live_hosts, provision, reach, sshentry
from clusterctl.errors import HostKeyError, ProvisionError, StateError, UnreachableError, UsageError, within
from clusterctl.hostsfile import HostsFile
from clusterctl.providers.base import ClusterKeys, LostNode, Provider
from clusterctl.remote import sshkeys
from clusterctl.remote.ssh import SshPool
from clusterctl.remote.targets import SshTarget
from clusterctl.state import Record, StateStore, atomic_write
from clusterctl.types import Cluster, Node
from clusterctl.units import duration

Report = Callable[[str], None]
REPAIR_WORK = ".clusterctl/repair"  # a repair's files on the peer and the new nodes (removed at the end)
PROBE = "true"
UNREACHABLE_FOR = 180.0  # seconds a running node must not answer ssh before it is reported (never replaced unnamed)
PROBES = 4  # ssh probes spread over that window: at its start, its end and evenly between


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


@dataclass(frozen=True)
class Probing:
    """How long a running node must not answer ssh before it is reported, and the probes spread over that."""

    window: float = UNREACHABLE_FOR
    probes: int = PROBES

    def __post_init__(self) -> None:
        within("--unreachable-for", self.window, above=0)
        within("probes", self.probes, 2)

    @property
    def timeout(self) -> float:
        """Each probe's connect timeout: 10 s, less in a short window, never under 2 s (a busy node's handshake)."""
        return min(10.0, max(2.0, self.window / self.probes))


def lost_nodes(store: StateStore, provider: Provider, cluster: Cluster, probe_timeout: float = 10.0) -> list[LostNode]:
    """`status`'s view: the provider's lost nodes, then the others that answer neither of two ssh probes within
    `probe_timeout`, in the cluster's order (repair itself holds those: plan)."""
    lost = list(provider.lost_nodes(cluster))
    gone = {x.node.name for x in lost}
    rest = [n for n in cluster.nodes if n.name not in gone]
    silent = _silent(store, cluster, rest, Probing(window=probe_timeout, probes=2), lambda _: None)
    lost += [LostNode(n, f"no ssh answer ({silent[n.name]})", billed=True) for n in rest if n.name in silent]
    order = {n.name: i for i, n in enumerate(cluster.nodes)}
    return sorted(lost, key=lambda x: order[x.node.name])


def plan(
    store: StateStore,
    provider: Provider,
    name: str,
    drop: bool,
    *,
    named: Sequence[str] = (),
    probing: Probing = Probing(),
    report: Report = lambda _: None,
) -> RepairPlan:
    """The lost nodes: the provider's word (gone, not running), and the nodes the user names. A stopped node (its
    disks kept) and a running one that answers no ssh probe over the whole window are held: reported, kept."""
    record = store.load(name)
    if record.status != "up":
        raise StateError(
            f"cluster {name} is {record.status}, not up",
            f"start it with `clusterctl start {name}` first"
            if record.disks_kept
            else f"bring it up with `clusterctl up --name {name}` first",
        )
    cluster = record.cluster
    unknown = [x for x in named if x not in {n.name for n in cluster.nodes}]
    if unknown:
        raise UsageError(
            f"--node {unknown[0]}: cluster {name} has no such node",
            f"name one of {', '.join(n.name for n in cluster.nodes)}",
        )
    said = provider.lost_nodes(cluster)
    lost = [x for x in said if not x.disks_kept or x.node.name in named]
    held = [x for x in said if x not in lost]
    gone = {x.node.name for x in said}
    rest = [n for n in cluster.nodes if n.name not in gone]
    lost += [LostNode(n, "named (--node), though it runs", billed=True) for n in rest if n.name in named]
    silent = _silent(store, cluster, [n for n in rest if n.name not in named], probing, report)
    held += [
        LostNode(n, f"runs, but answered no ssh probe over {duration(probing.window)} ({why})", billed=True)
        for n in rest
        if n.name in silent
        for why in [silent[n.name]]
    ]
    order = {n.name: i for i, n in enumerate(cluster.nodes)}
    lost.sort(key=lambda x: order[x.node.name])
    held.sort(key=lambda x: order[x.node.name])
    if lost and len(lost) == len(cluster.nodes):
        raise ProvisionError(
            f"every node of cluster {name} is lost: no peer to copy the runtime and data from",
            f"bring it down and up again: `clusterctl down {name} --yes`, then `clusterctl up`",
        )
    price = None
    if lost:
        st = provider.status(name)
        prices = [s.hourly_usd for s in (st.nodes if st else ()) if s.hourly_usd is not None]
        price = prices[0] if prices else None
    return RepairPlan(cluster, tuple(lost), drop, price, tuple(held))


def _silent(
    store: StateStore, cluster: Cluster, nodes: Sequence[Node], probing: Probing, report: Report
) -> dict[str, str]:
    """The nodes that answer none of the ssh probes spread over the window (fresh connections each time), with the
    last probe's error. Every node that answers the first probe is done at once."""
    pending = {n.name: n for n in nodes}
    why: dict[str, str] = {}
    start = time.monotonic()
    for k in range(probing.probes):
        if k:
            report(
                f"{', '.join(pending)}: no ssh answer; probe {k + 1} of {probing.probes} "
                f"({duration(probing.window)} in all) before it is reported"
            )
            time.sleep(max(0.0, start + probing.window * k / (probing.probes - 1) - time.monotonic()))
        targets = {t.label: t for t in reach.ssh_targets(cluster, store)}
        with SshPool(reach.ssh_settings(cluster, store, connect_timeout=probing.timeout)) as pool:
            results = pool.run([targets[n.ssh_host] for n in pending.values()], PROBE, timeout=probing.timeout * 2)
        for n, r in zip(list(pending.values()), results):
            if r.ok:
                del pending[n.name]
            else:
                why[n.name] = (r.error or r.stderr.strip() or f"exit {r.exit_code}").splitlines()[-1][:120]
        if not pending:
            break
    return {name: why[name] for name in pending}


def check(p: RepairPlan) -> None:
    """Raises when the plan holds a node it keeps as it is: it cannot take part in a repair (its hosts file and
    keys), and nothing of it is touched unless the user names it."""
    if p.held:
        names = ", ".join(x.node.name for x in p.held)
        flags = " ".join(f"--node {x.node.name}" for x in p.held)
        raise UnreachableError(
            f"cluster {p.cluster.name}: {names} not lost but not answering; nothing "
            + ("repaired while it is" if p.lost else "to repair"),
            f"start it or wait until it answers, or replace it too: `clusterctl repair {p.cluster.name} {flags}`",
        )


def carry_out(
    store: StateStore,
    provider: Provider,
    p: RepairPlan,
    *,
    report: Report = lambda _: None,
    data: Sequence[str] = (),
    hosts_out: Path | None = Path("hosts"),
    ssh_timeout: float = 300.0,
) -> Cluster:
    """Replace (or drop) the plan's lost nodes; the cluster as the record now says."""
    name = p.cluster.name
    check(p)
    with store.lock(name):
        _unchanged(store, p.cluster)
        if not p.lost:
            return p.cluster
        if p.drop:
            return _drop(store, provider, p, report, hosts_out)
        return _replace(store, provider, p, report, data, hosts_out, ssh_timeout)


def watch(
    store: StateStore,
    provider: Provider,
    name: str,
    *,
    drop: bool,
    interval: float,
    report: Report = lambda _: None,
    data: Sequence[str] = (),
    named: Sequence[str] = (),
    probing: Probing = Probing(),
    rounds: int | None = None,
) -> None:
    """plan + carry_out every `interval` seconds until Ctrl-C (or `rounds` rounds): a spot cluster kept whole from the
    operator's machine, where the cloud credentials are. The same rule as one repair: a node held (stopped, or
    running without an answer) is reported each round and kept. A round that fails is reported and the next one
    tries again (its launches already removed by carry_out)."""
    from clusterctl.errors import ClusterctlError, UsageError

    if interval < 1:
        raise UsageError(f"--watch {interval:g} is too short", "give the seconds between checks, e.g. --watch 300")
    done = 0
    while rounds is None or done < rounds:
        done += 1
        try:
            p = plan(store, provider, name, drop, named=named, probing=probing, report=report)
            if p.lost or p.held:
                for line in p.lines():
                    report(line)
                carry_out(store, provider, p, report=report, data=data)
        except ClusterctlError as exc:
            report(f"repair failed: {exc.message}; trying again in {interval:.0f}s")
        if rounds is None or done < rounds:
            time.sleep(interval)


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
        _unchanged(store, cluster)
        return _replace(store, provider, p, report, (), hosts_out, ssh_timeout, adding=True)


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
        _unchanged(store, cluster)
        return _drop(store, provider, p, report, hosts_out)


def _unchanged(store: StateStore, cluster: Cluster) -> None:
    if store.load(cluster.name).cluster != cluster:
        raise StateError(f"the record of cluster {cluster.name} changed since the plan", "run the command again")


# ---- drop ---------------------------------------------------------------------------------------------------
def _drop(store: StateStore, provider: Provider, p: RepairPlan, report: Report, hosts_out: Path | None) -> Cluster:
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
def _replace(
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
        dsts = _which_datasets(p.cluster, provider, pool, on_peer, data, report)
    report(f"launching {len(lost)} {'new' if adding else 'replacement'} node(s) with the {provider.name} provider")
    launched = provider.replace_nodes(p.cluster, lost, keys)
    new = {n.name: n for n in launched.cluster.nodes}
    whole = dataclasses.replace(p.cluster, nodes=tuple(new.get(n.name, n) for n in p.cluster.nodes))
    fresh = [n for n in whole.nodes if n.name in new]
    known_before = paths.known_hosts.read_text() if paths.known_hosts.exists() else ""
    try:
        report("waiting for ssh on the new node(s)")
        provision.wait_for_ssh(
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
        pinned = provision.pin_host_keys(whole, pinned, paths.known_hosts)
        report(f"host keys of {len(fresh)} new node(s) pinned from an authenticated source")
        hf = reach.hosts_file(whole)
        targets = {t.label: t for t in reach.ssh_targets(whole, store)}
        with SshPool(reach.ssh_settings(whole, store)) as pool:
            # every node learns the new keys, the new nodes get the cluster key; the hosts files stay as they were
            # until the new nodes have passed every check
            _hand_keys(whole, fresh, pool, targets, pinned, paths)
            _runtime(whole, provider, peer, fresh, pool, targets, str(paths.known_hosts), report)
            _datasets(peer, fresh, pool, targets, str(paths.known_hosts), dsts, report)
            every = [targets[n.ssh_host] for n in whole.nodes]
            try:
                provision.setup_nodes(whole, pool, every, pinned, paths, hf)
            except ProvisionError:  # the leader's first ssh to a new node: retried while its network settles
                _leader_reaches(pool, every[0], [n for n in fresh if n.role != "leader"])
                provision.setup_nodes(whole, pool, every, pinned, paths, hf)
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


def _runtime(
    cluster: Cluster,
    provider: Provider,
    peer: Node,
    fresh: Sequence[Node],
    pool: SshPool,
    targets: dict[str, SshTarget],
    known_hosts: str,
    report: Report,
) -> None:
    """The record's runtime onto the new nodes: install.install over the peer and them (the peer has it, so only
    they are sent it: from this machine's cache for local clusters, else relayed from the peer), verified there."""
    from clusterctl.runtime import install, spec as rt

    rid, python = cluster.facts.runtime, cluster.facts.python
    if rid in ("", "none"):
        return
    nodes = [peer, *fresh]
    if rid != "own":
        sub = dataclasses.replace(cluster, nodes=tuple(nodes))
        got = install.install(
            sub,
            pool,
            [targets[n.ssh_host] for n in nodes],
            [n.private_ip for n in nodes],
            known_hosts,
            install.RuntimeRequest("install"),
            report,
            build_here=provider.builds_runtime_locally,
        )
        if got.id != rid:
            raise ProvisionError(
                f"the new node(s) would get runtime {got.id}, the cluster has {rid}",
                "the replacement differs from its peers (image or type): `clusterctl down` and `up` again",
            )
        python = rt.python_of(rid)
    check = f"test -x {shlex.quote(python)} && {shlex.quote(python)} -c 'import sys'"
    results = pool.run([targets[n.ssh_host] for n in fresh], check, timeout=120)
    bad = [
        f"{n.name}: {r.error or r.stderr.strip()[-120:] or f'exit {r.exit_code}'}"
        for n, r in zip(fresh, results)
        if not r.ok
    ]
    if bad:
        raise ProvisionError(f"the runtime's Python {python} does not run on {'; '.join(bad)}")
    report(f"node runtime {rid} verified on {len(fresh)} new node(s)")


def _which_datasets(
    cluster: Cluster, provider: Provider, pool: SshPool, peer: SshTarget, extra: Sequence[str], report: Report
) -> list[str]:
    """The record's datasets and --data's, as the peer resolves them (after symlinks): the ones to copy. A recorded
    one the peer does not hold complete, or one outside a node's own folders (local nodes share the rest with this
    machine and each other: every node already sees it), is skipped with a line; a --data one so is refused."""
    from clusterctl.node.sync import manifest

    wanted = list(dict.fromkeys([*cluster.facts.datasets, *extra]))
    if not wanted:
        return []
    roots = " ".join(r if r == "$HOME" else shlex.quote(r) for r in provider.node_own_roots)
    own = (
        f'own=0; for r in {roots}; do r=$(realpath -m -- "$r"); case "$real/" in "$r"/*) own=1;; esac; done; '
        if roots
        else "own=1; "
    )
    lines = "".join(
        f"d={shlex.quote(d)}; "
        'case "$d" in /*) ;; *) d="$HOME/$d";; esac; real=$(realpath -m -- "$d"); '
        + own
        + f'c=0; [ -f "$real/{manifest.STATE_DIR}/{manifest.MARKER}" ] && c=1; printf "%s %s %s\\n" "$own" "$c" "$real"; '
        for d in wanted
    )
    r = pool.run_one(peer, lines, timeout=120)
    rows = [line.split(" ", 2) for line in r.stdout.splitlines() if line.strip()]
    if not r.ok or len(rows) != len(wanted):
        raise ProvisionError(f"could not look at the datasets on {peer.label}: {r.error or r.stderr.strip()[-200:]}")
    out = []
    for d, (own_, complete, real) in zip(wanted, rows):
        given = d in extra
        if own_ != "1":
            why = f"dataset {d} ({real}) is outside the nodes' own folders: every node and this machine share it"
            if given:
                raise UsageError(why, "leave out --data for it: there is nothing to copy")
            report(f"{why}; nothing to copy")
        elif complete != "1":
            why = f"dataset {d} on {peer.label} has no completion marker"
            if given:
                raise ProvisionError(why, f"copy and verify it with `clusterctl sync SRC {d}` first")
            report(f"{why}: not copied (`clusterctl sync SRC {d}` puts it on every node)")
        else:
            out.append(real)
    return list(dict.fromkeys(out))


def _datasets(
    peer: Node,
    fresh: Sequence[Node],
    pool: SshPool,
    targets: dict[str, SshTarget],
    known_hosts: str,
    dsts: Sequence[str],
    report: Report,
) -> None:
    """These datasets (_which_datasets: the record's and --data's, never a search of the peer's folders), copied
    from the peer to the new nodes with sync's relay, then each new copy checked again, file by file, against the
    manifest the peer's own copy was verified against, and marked with it: every node's completion marker names
    one manifest, as `train` requires."""
    from clusterctl.data import plan as syncplan, sync as transfer
    from clusterctl.node.sync import manifest

    nodes = [peer, *fresh]
    src = targets[peer.ssh_host]
    for dst in dsts:
        report(f"copying dataset {dst} from {peer.name} to {len(fresh)} new node(s)")
        state = f"{dst.rstrip('/')}/{manifest.STATE_DIR}"
        marker, saved = f"{state}/{manifest.MARKER}", f"{state}/{manifest.SAVED}"
        # The relay from the peer checks the peer's copy against a listing made there and marks it with that: the
        # marker and manifest it was verified against are kept aside and put back (its data is never written).
        keep = (
            f"mkdir -p {REPAIR_WORK} && cp -p {shlex.quote(marker)} {REPAIR_WORK}/COMPLETE && "
            f"cp -p {shlex.quote(saved)} {REPAIR_WORK}/manifest.jsonl"
        )
        r = pool.run_one(src, keep, timeout=600)
        if not r.ok:
            raise ProvisionError(
                f"dataset {dst} on {peer.name} has no completion marker: {r.stderr.strip()[-200:] or r.error}",
                f"copy and verify it with `clusterctl sync SRC {dst}` first",
            )
        try:
            syncer = transfer.Syncer(
                [targets[n.ssh_host] for n in nodes],
                [n.private_ip for n in nodes],
                known_hosts,
                pool,
                syncplan.Source("leader", path=dst),
                dst,
                managed=True,
                node_python="python3",
            )
            err = syncer.run().error()
        finally:
            back = (
                f"cp -p {REPAIR_WORK}/manifest.jsonl {shlex.quote(saved)} && "
                f"cp -p {REPAIR_WORK}/COMPLETE {shlex.quote(marker)}"
            )
            restored = pool.run_one(src, back, timeout=600)
        if not restored.ok:
            raise ProvisionError(f"could not put back the completion marker of {dst} on {peer.name}")
        if err is not None:
            raise ProvisionError(f"dataset {dst} did not reach the new node(s) whole: {err.message}")
        _check_against_peer(pool, targets, peer, fresh, dst)
        report(f"dataset {dst} verified on {len(fresh)} new node(s)")
    pool.run([targets[n.ssh_host] for n in nodes], f"rm -rf {REPAIR_WORK}", timeout=60)


def _check_against_peer(
    pool: SshPool, targets: dict[str, SshTarget], peer: Node, fresh: Sequence[Node], dst: str
) -> None:
    """The peer's kept manifest (REPAIR_WORK) sent from it to each new node (host key checked), each new copy checked
    against it and marked with the peer's marker's source."""
    import json

    from clusterctl.remote import nodepkg

    r = pool.run_one(targets[peer.ssh_host], f"cat {REPAIR_WORK}/COMPLETE", timeout=60)
    try:
        source = str(json.loads(r.stdout)["source"]) if r.ok else ""
    except (ValueError, KeyError, TypeError):
        source = ""
    if not source:
        raise ProvisionError(f"cannot read the completion marker of {dst} on {peer.name}")
    sends = " ".join(
        f"scp -q -o BatchMode=yes -o StrictHostKeyChecking=yes {REPAIR_WORK}/manifest.jsonl "
        f"{shlex.quote(n.private_ip + ':' + REPAIR_WORK + '/manifest.jsonl')} || echo {shlex.quote(n.name)};"
        for n in fresh
    )
    fresh_targets = [targets[n.ssh_host] for n in fresh]
    pkg = nodepkg.package()
    for put in (nodepkg.ship(pool, fresh_targets, pkg), pool.run(fresh_targets, f"mkdir -p {REPAIR_WORK}", timeout=60)):
        if not put.all_ok:  # the manifest's folder made: scp puts it there
            raise ProvisionError(
                f"could not reach the new node(s): {'; '.join(f'{x.host}: {x.error}' for x in put.failed)}"
            )
    r = pool.run_one(targets[peer.ssh_host], sends, timeout=600)
    if not r.ok or r.stdout.strip():
        raise ProvisionError(
            f"{peer.name} could not send the manifest of {dst} to {r.stdout.strip() or r.stderr[-200:]}"
        )
    manifest = f"{REPAIR_WORK}/manifest.jsonl"
    check = pkg.command(
        "sync", "check", "--dst", dst, "--manifest", manifest, "--mark", source, "--reset", "--workers", "4"
    )
    for n, res in zip(fresh, pool.run(fresh_targets, check, timeout=3600)):
        try:
            got = json.loads(res.stdout.strip().splitlines()[-1]) if res.stdout.strip() else {}
        except ValueError:
            got = {}
        if not res.ok or got.get("bad") or not got.get("marked"):
            why = got.get("error") or (got.get("bad") or [""])[0] or res.error or res.stderr.strip()[-200:]
            raise ProvisionError(f"dataset {dst} on {n.name} does not match {peer.name}'s manifest: {why}")


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
