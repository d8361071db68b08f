"""What a new member gets from a live peer: the record's node runtime and datasets, copied and verified on it.

`repair`'s replacements and `up`'s added members (cluster/membership.py) take both from the first live node, never
from this machine's view: the datasets are the ones `sync` verified there, each new copy checked against the manifest
the peer's own copy was verified against.
"""

from __future__ import annotations

import dataclasses
import shlex
from typing import Callable, Sequence

from clusterctl.errors import ProvisionError, UsageError
from clusterctl.providers.base import Provider
from clusterctl.remote.ssh import SshPool
from clusterctl.remote.targets import SshTarget
from clusterctl.types import Cluster, Node

Report = Callable[[str], None]
REPAIR_WORK = ".clusterctl/repair"  # a repair's files on the peer and the new nodes (removed at the end)


def runtime(
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


def which_datasets(
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


def datasets(
    peer: Node,
    fresh: Sequence[Node],
    pool: SshPool,
    targets: dict[str, SshTarget],
    known_hosts: str,
    dsts: Sequence[str],
    report: Report,
) -> None:
    """These datasets (which_datasets: the record's and --data's, never a search of the peer's folders), copied
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
