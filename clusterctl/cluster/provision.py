"""`up`, `down`, `stop` and `start` as idempotent steps, the same for every provider after launch (or start):

    keys -> launch (provider) -> wait for ssh -> pin host keys -> hand out the cluster key,
    known_hosts and hosts file -> prove leader-to-member ssh -> GPUs -> the node runtime
    (runtime/install.py) -> write ./hosts and the record.

A failed or interrupted `up` removes what it created (found by tags/names) and says what it removed.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from clusterctl.cluster import gpu_check, hosts_out as hosts_out_mod, live_hosts, node_setup, sshentry
from clusterctl.cluster.reach import hosts_file, paths, ssh_settings, ssh_targets
from clusterctl.errors import ClusterctlError, HostKeyError, ProvisionError, StateError
from clusterctl.providers.base import ClusterKeys, Launched, Provider, Teardown
from clusterctl.remote import sshkeys
from clusterctl.remote.ssh import SshPool
from clusterctl.runtime.install import RuntimeRequest, install as install_runtime
from clusterctl.runtime.s3cache import S3Cache
from clusterctl.state import Record, StateStore, atomic_write
from clusterctl.types import Cluster, ClusterSpec, OnStep, Step, step_lines

Report = Callable[[str], None]


# ---- up ---------------------------------------------------------------------------------------------
def up(
    spec: ClusterSpec,
    store: StateStore,
    provider: Provider,
    *,
    hosts_out: Path | None = Path("hosts"),
    report: Report = lambda _: None,
    ssh_timeout: float = 300.0,
    runtime: RuntimeRequest = RuntimeRequest("none"),
    runtime_cache: S3Cache | None = None,
    trust_first_contact: bool = False,
    on_step: OnStep | None = None,
    matches: str = "",  # what an up cluster was found to match (" and matches cluster.yaml"), said when it is
) -> Cluster:
    with store.lock(spec.name):
        found = None
        stopped: dict[str, tuple[str, ...]] | None = None  # a stopped cluster's pinned keys, by node name
        if store.exists(spec.name):
            record = store.load(spec.name)
            live = provider.find(spec.name)
            stopped = _stopped_keys(store, provider, record, live)
            if record.status == "up" and live is not None and stopped is None:
                provider.refresh_access(spec, record.cluster)  # AWS: the ssh rule becomes this run's
                report(f"cluster {spec.name} is already up ({len(live.nodes)} nodes){matches}; nothing to do")
                store.set_current(spec.name)
                return live
        else:
            found = provider.find(spec.name)
        if found is not None:
            # Never adopt (nor, on failure, remove) a cluster this machine holds no keys for.
            owner = found.facts.owner
            raise ProvisionError(
                f"cluster {spec.name} already exists ({provider.name}"
                + (f", owner {owner}" if owner else "")
                + ") but this machine has no record "
                "of it (nor its keys)",
                f"choose another --name (that one is {owner}'s)"
                if owner and owner != provider.me()
                else f"remove it with `clusterctl down {spec.name} --yes`, or choose another --name",
            )
        if hosts_out is not None:
            hosts_out_mod.check(hosts_out)  # the user's ./hosts (an inventory, /etc/hosts) is never replaced
        keys = _keys(store, spec.name)
        try:
            if stopped is not None:
                report(f"cluster {spec.name} was stopped: starting it again")
            report(f"launching {spec.nodes} node(s) with the {provider.name} provider")
            launched = provider.launch(spec, keys)
            store.save(Record(launched.cluster, "creating", time.time()))
            return _ready(
                launched,
                stopped or {},
                store,
                provider,
                report=report,
                ssh_timeout=ssh_timeout,
                runtime=runtime,
                runtime_cache=runtime_cache,
                trust_first_contact=trust_first_contact,
                hosts_out=hosts_out,
                on_step=on_step,
            )
        except BaseException as exc:  # Ctrl-C included: leave nothing behind
            if stopped is not None:  # never remove a stopped cluster's disks because its start failed
                report(
                    f"up failed ({_why(exc)}); the stopped cluster is left as it is: run `clusterctl up` again, "
                    f"or remove it with `clusterctl down {spec.name} --yes`"
                )
                raise
            report(f"up failed ({_why(exc)}); removing what it created")
            teardown = provider.terminate(spec.name)
            for line in teardown.removed:
                report(f"  removed {line}")
            if teardown.clean:
                store.delete(spec.name)
            else:
                report(f"  still present: {'; '.join(teardown.left)} (run `clusterctl down {spec.name} --yes`)")
            raise


def _keys(store: StateStore, name: str) -> ClusterKeys:
    """The cluster's operator and internal keys, made once (a stopped cluster's are the ones its nodes hold)."""
    p = paths(store, name)
    store.ensure_dir(name)
    operator = sshkeys.ensure_keypair(p.operator_key, f"clusterctl-{name}-operator")
    internal = sshkeys.ensure_keypair(p.internal_key, f"clusterctl-{name}-internal")
    return ClusterKeys(operator.public_line, internal.public_line, str(p.operator_key))


def _ready(
    launched: Launched,
    was: dict[str, tuple[str, ...]],
    store: StateStore,
    provider: Provider,
    *,
    report: Report,
    ssh_timeout: float,
    runtime: RuntimeRequest,
    runtime_cache: S3Cache | None,
    trust_first_contact: bool,
    hosts_out: Path | None,
    on_step: OnStep | None = None,
) -> Cluster:
    """After the provider launched or started the nodes, the same for `up` and `start`: ssh answers, host keys
    pinned (`was`: the keys pinned before, by node name), the cluster key and hosts file handed out, the GPUs
    and the runtime checked, the files here and the record written; the cluster as recorded."""
    cluster = launched.cluster
    p = paths(store, cluster.name)
    steps = on_step or step_lines(report)
    steps(Step("waiting for ssh on every node"))
    node_setup.wait_for_ssh(cluster, ssh_timeout)
    steps(Step("waiting for ssh on every node", "end", detail=f"{len(cluster.nodes)} node(s) answer"))
    # a restarted node keeps its disk, so its host key: the one pinned at its creation, by node name
    # (its address may have changed; cloud-init prints keys to the console at the first boot only)
    known = {n.ssh_host: was[n.name] for n in cluster.nodes if n.name in was}
    if len(known) < len(cluster.nodes):
        known.update(provider.host_keys(cluster))
    known.update(launched.host_keys)
    unverified = [n for n in cluster.nodes if n.ssh_host not in known]
    if unverified and not trust_first_contact:
        # Fail closed: the cluster's private key goes only to nodes whose key came from an authenticated
        # source (the provider's API), unless the operator accepts first contact.
        raise HostKeyError(
            f"no host key for {len(unverified)} node(s) ({', '.join(n.name for n in unverified)}) "
            "from an authenticated source (their console output); clusterctl does not trust "
            "first contact",
            "check that the image runs cloud-init, or pass "
            "--trust-first-contact to accept the keys they show (the cluster key is then sent "
            "to them)",
        )
    if unverified:
        report(
            f"trusting first contact for {len(unverified)} node(s) (--trust-first-contact): "
            + ", ".join(n.name for n in unverified)
        )
    pinned = node_setup.pin_host_keys(cluster, known, p.known_hosts)
    report(f"host keys pinned for {len(pinned)} node(s) in {p.known_hosts}")
    hf = hosts_file(cluster)
    with SshPool(ssh_settings(cluster, store)) as pool:
        node_setup.setup_nodes(cluster, pool, ssh_targets(cluster, store), pinned, p, hf)
        report("the leader reaches every member over ssh with host keys checked")
        for warning in gpu_check.check_gpus(cluster, pool, ssh_targets(cluster, store)):
            report(f"warning: {warning}")
        # The nodes' training environment; the record says which (jobfolder.node_python reads it).
        node_runtime = install_runtime(
            cluster,
            pool,
            ssh_targets(cluster, store),
            hf.hosts,
            str(p.known_hosts),
            runtime,
            report,
            s3=runtime_cache,
            build_here=provider.builds_runtime_locally,
            on_step=on_step,
        )
        live_hosts.write(pool, ssh_targets(cluster, store)[0], hosts_file(cluster))
    cluster = cluster.with_runtime(node_runtime)
    atomic_write(p.hosts, hf.render(), mode=0o644)
    if hosts_out is not None and not hosts_out_mod.write(hosts_out, hf.render(), cluster.name):
        report(
            f"warning: {hosts_out} appeared while up ran and is not clusterctl's: left alone; the hosts file is {p.hosts}"
        )
    store.save(Record(cluster, "up", time.time()))
    store.set_current(cluster.name)
    return cluster


def _stopped_keys(
    store: StateStore, provider: Provider, record: Record, live: Cluster | None
) -> dict[str, tuple[str, ...]] | None:
    """A stopped cluster (`stop`, or autostop's --idle-action stop: a record saying so, or instances the provider
    sees stopped): the host keys pinned for its nodes, by node name. None for any other cluster."""
    if record.status != "stopped" and live is None:
        return None
    return _pinned(store, record.cluster) if stopped(record, provider) else None


def stopped(record: Record, provider: Provider, every: bool = False) -> bool:
    """The cluster is stopped with its disks kept: its record says so, or (autostop on a cloud stops the
    instances without a word to this machine) the provider sees a node of it stopped (`every`: all of them)."""
    if record.status == "stopped":
        return record.disks_kept
    st = provider.status(record.cluster.name)
    if st is None:
        return False
    return st.stopped if every else any(n.state in ("stopped", "stopping") for n in st.nodes)


def _pinned(store: StateStore, cluster: Cluster) -> dict[str, tuple[str, ...]]:
    """The host keys pinned for the cluster's nodes (its known_hosts here), by node name."""
    pinned: dict[str, list[str]] = {}
    try:
        text = paths(store, cluster.name).known_hosts.read_text()
    except OSError:
        text = ""
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 3:
            host = parts[0][1:].rsplit("]:", 1)[0] if parts[0].startswith("[") else parts[0]
            pinned.setdefault(host, []).append(f"{parts[1]} {parts[2]}")
    return {n.name: tuple(pinned[n.ssh_host]) for n in cluster.nodes if n.ssh_host in pinned}


# ---- stop and start: the nodes powered off and on, their disks kept ----------------------------------------
def stop(name: str, store: StateStore, provider: Provider, report: Report = lambda _: None) -> Record | None:
    """The cluster's nodes stopped through the provider (the same stop as autostop's), the connection agent's
    connections to them closed, and the record saying who stopped it and when; None when it was stopped already.
    A node that would not stop fails it (the record unchanged: `stop` again)."""
    from clusterctl.proc import owner
    from clusterctl.remote import agent

    with store.lock(name):
        record = store.load(name)
        refuse_unfinished(record)
        if record.status == "stopped" or stopped(record, provider, every=True):
            return None
        agent.stop(store.root)
        teardown = provider.stop_nodes(record.cluster)
        for line in teardown.removed:
            report(f"stopped {line}")
        if not teardown.clean:
            raise ProvisionError(
                f"cluster {name} did not stop whole: {'; '.join(teardown.left)}", f"run `clusterctl stop {name}` again"
            )
        when = time.strftime("%Y-%m-%d %H:%M:%S %Z")
        kept = "the nodes' homes kept" if provider.shares_this_machine else "the nodes' disks kept"
        note = f"stopped by {owner()} at {when} (`clusterctl stop`; {kept}: `clusterctl start {name}` starts it again)"
        done = Record(record.cluster, "stopped", time.time(), note)
        store.save(done)
        return done


def start(
    name: str, store: StateStore, provider: Provider, report: Report = lambda _: None, ssh_timeout: float = 300.0
) -> Cluster | None:
    """A stopped cluster's nodes started on their kept disks (provider.start_nodes), then what `up` does after its
    launch (_ready): host keys checked against the ones pinned at creation, the ssh config and hosts files at the
    nodes' addresses now, the recorded runtime found (or put back where the nodes' /opt did not keep it). None
    when it runs already. A failed start stops what it started again, so the record's "stopped" stays true."""
    from clusterctl.runtime.install import kept

    with store.lock(name):
        record = store.load(name)
        refuse_unfinished(record)
        if not stopped(record, provider):
            if record.status == "stopped":
                raise StateError(
                    f"cluster {name} cannot be started: {record.note}",
                    f"bring it up anew with `clusterctl up --name {name}` (after `clusterctl down {name} --yes`)",
                )
            return None
        report(f"starting cluster {name}: {len(record.cluster.nodes)} node(s) on their kept disks")
        try:
            launched = provider.start_nodes(record.cluster, _keys(store, name))
            cluster = _ready(
                launched,
                _pinned(store, record.cluster),
                store,
                provider,
                report=report,
                ssh_timeout=ssh_timeout,
                runtime=kept(record.cluster.facts),
                runtime_cache=None,
                trust_first_contact=False,
                hosts_out=None,
            )
        except BaseException as exc:  # Ctrl-C included
            report(f"start failed ({_why(exc)}); stopping its nodes again (their disks kept)")
            try:
                left = provider.stop_nodes(record.cluster).left
            except Exception as again:  # the start's own error is the one to raise
                left = (_why(again),)
            if left:
                report(
                    f"  not stopped: {'; '.join(left)} (`clusterctl start {name}` again, or `clusterctl down {name}`)"
                )
            store.save(record)
            raise
        if sshentry.config_path(name).exists():  # `ssh NAME` at the addresses the nodes have now
            sshentry.write(cluster, store)
        return cluster


def refuse_unfinished(record: Record) -> None:
    """`stop` and `start` act on a cluster `up` finished (or stopped), never on one being made."""
    if record.status == "creating":
        raise StateError(
            f"cluster {record.cluster.name} is being made, or an `up` of it did not finish",
            f"run the same `clusterctl up` again, or remove it: clusterctl down {record.cluster.name} --yes",
        )


def _why(exc: BaseException) -> str:
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted"
    if isinstance(exc, ClusterctlError):
        return exc.message
    return f"{exc.__class__.__name__}: {exc}"


# ---- down -------------------------------------------------------------------------------------------
def down(name: str, store: StateStore, provider: Provider, report: Report = lambda _: None) -> Teardown:
    with store.lock(name):
        teardown = provider.terminate(name)
        for line in teardown.removed:
            report(f"removed {line}")
        if teardown.clean:
            store.delete(name)
        return teardown
