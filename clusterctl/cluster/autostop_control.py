"""What the operator changes on a cluster's watchdogs: `keep`, `autostop --off/--on`, and the leases that
keep a cluster up while a long operation (sync, data, launch) runs. A local node's files are edited from this
machine; a cloud node's through the watchdog's own command over ssh."""

from __future__ import annotations

import os
import re
import threading
import time
import uuid
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from clusterctl import providers
from clusterctl.autostop.watchdog import edit_local, local_dir, remote_command
from clusterctl.node.watchdog.leases import release_lease, take_lease
from clusterctl.proc import owner
from clusterctl.state import Record, StateStore
from clusterctl.types import Cluster


def change(store: StateStore, record: Record, action: str, **values: Any) -> list[str]:
    """keep / off / on on every node of the cluster; returns one line per node that did not take it.
    values: seconds (keep), idle_stop / max_lifetime (on: seconds, or None to clear)."""
    c = record.cluster
    if action == "keep":
        changes: dict[str, Any] = {"keep_until": time.time() + float(values["seconds"])}
        args: tuple[str, ...] = ("--for", str(int(values["seconds"])))
    else:
        changes = {"enabled": action == "on"}
        args = ()
        for key, flag in (("idle_stop", "--idle-stop"), ("max_lifetime", "--max-lifetime")):
            if key in values:
                changes[key] = values[key]
                args += (flag, "none" if values[key] is None else str(int(values[key])))
    if providers.shares_this_machine(c):
        if not (local_dir(store, c.name) / "config.json").exists():
            return [f"{c.name}: no autostop watchdog on this cluster (it was brought up without one)"]
        edit_local(store, c.name, len(c.nodes), **changes)
        return []
    return _on_nodes(store, c, remote_command(action, *args))


def _on_nodes(store: StateStore, cluster: Cluster, command: str) -> list[str]:
    """`command` on every node of a cloud cluster; one line per node where it failed."""
    from clusterctl.cluster import reach
    from clusterctl.remote.ssh import SshPool

    with SshPool(reach.ssh_settings(cluster, store, connect_timeout=10.0)) as pool:
        report = pool.run(reach.ssh_targets(cluster, store), command, timeout=60)
    return [
        f"{r.host}: {r.error or (r.stderr.strip() or r.stdout.strip())[-200:] or f'exit {r.exit_code}'}"
        for r in report
        if not r.ok
    ]


# ---- leases: long operations keep the cluster up while they run --------------------------------------------
LEASE_TTL = 600.0  # a lease outlives its operator by at most this (a laptop closed mid-sync); renewed every third


@contextmanager
def lease(
    store: StateStore,
    cluster: Cluster | None,
    what: str,
    ttl: float = LEASE_TTL,
    warn: Callable[[str], None] | None = None,
) -> Iterator[str | None]:
    """Hold an autostop lease on `cluster` (a Cluster of a record, or None for a plain hosts file: nothing to
    hold) while the block runs: the watchdog counts it as activity. Renewed in the background, released at the
    end whatever happens; a node that does not take it is a warning, never a failure of the operation."""
    if cluster is None or cluster.facts.autostop is None:
        yield None
        return
    lease_id = f"{re.sub(r'[^A-Za-z0-9_.-]', '-', what)[:20]}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    text = f"clusterctl {what} from {owner()}"
    stop = threading.Event()

    def hold(take: bool) -> None:
        try:
            failed = _lease_all(store, cluster, lease_id, ttl if take else None, text)
        except Exception as exc:  # unreachable leader, keys gone: the operation goes on
            failed = [f"{cluster.name}: {exc}"]
        if failed and warn is not None:
            warn(f"autostop lease for this {what} not {'taken' if take else 'released'} on: {'; '.join(failed)[:300]}")

    def renew() -> None:
        while not stop.wait(ttl / 3):
            hold(True)

    hold(True)
    renewer = threading.Thread(target=renew, name="autostop-lease", daemon=True)
    renewer.start()
    try:
        yield lease_id
    finally:
        stop.set()
        renewer.join(30)
        hold(False)


def _lease_all(store: StateStore, cluster: Cluster, lease_id: str, seconds: float | None, what: str) -> list[str]:
    """Take (seconds) or release (None) a lease on every node's watchdog; one line per node that did not."""
    if providers.shares_this_machine(cluster):
        for i in range(len(cluster.nodes)):
            d = str(local_dir(store, cluster.name, i))
            if not os.path.exists(os.path.join(d, "config.json")):
                continue
            if seconds is None:
                release_lease(d, lease_id)
            else:
                take_lease(d, lease_id, seconds, what)
        return []
    args = ("--id", lease_id) + (("--for", str(int(seconds)), "--what", what) if seconds is not None else ())
    return _on_nodes(store, cluster, remote_command("lease" if seconds is not None else "release", *args))
