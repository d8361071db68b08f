"""`sync --fanout auto` (the default): the chain's fan-out chosen from a short measurement, on the nodes.

With K chains the sender (the leader for a leader:PATH source, else the chain's head, which the source
here feeds one stream) sends K copies at once. The probe measures, through the chain's own ssh hop (its
key, pinned known_hosts and cipher): one node-to-node stream between two other nodes (a hop's rate),
then k = 2, 3, ... streams from the sender to k different nodes at once, for PROBE_SECONDS each, the
bytes thrown away on arrival (the node package's `sync probe` and `sync sink`). From 4 receivers on, the
hop and the sender's 2 streams are measured at the same time, over links that do not meet. Past that,
the sender is not measured when the stream, at the hop's rate, is too short for that to pay
(plan.too_short_to_probe; --plan always is).
plan.choose_fanout turns the figures into K and the line that says why. No probe (one chain) with
fewer than 3 nodes taking the stream or under PROBE_MIN_BYTES to send. A probe that fails never fails
the sync: one chain, and the reason. A hop's measured rate is kept for HOP_RATE_TTL (the operator's sync
cache, per node set and its host keys): a later stream it shows too short to probe is one chain with no
probe at all (the hop's measurement was ~0.9 s of a 14 s sync of 200 MB to 8 nodes at 150 Mbit/s,
bench/sync_bench.py)."""

from __future__ import annotations

import hashlib
import json
import shlex
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Sequence

from clusterctl import state
from clusterctl.data.plan import (
    FANOUT_CAP,
    PROBE_SECONDS,
    SHARE,
    FanoutChoice,
    choose_fanout,
    too_short_to_probe,
)
from clusterctl.data.session import SyncNode, SyncSession, mb
from clusterctl.remote.openssh import node_ssh

PROBE_MIN_BYTES = 16_000_000  # less to stream: one chain, unmeasured (the probe would cost more than it saves)
HOP_RATE_TTL = 3600.0  # seconds a hop's measured rate stands in for a new measurement (a short stream's only)


class ProbeFailed(Exception):
    pass


def _rate(s: SyncSession, sender: SyncNode, receivers: Sequence[SyncNode]) -> float:
    """Bytes/s of `sender`'s streams to `receivers` at once, together: k times the slowest one's (k chains
    all go at the pace of the slowest), each as its receiver saw it, from its first read to its last."""
    hop = node_ssh(s.leader.target.user, s.leader.target.port, s.managed)
    data, r = s.agent(
        sender,
        "probe",
        "--seconds",
        str(PROBE_SECONDS),
        "--hop",
        json.dumps(hop),
        "--remote",
        s.py("sink"),
        "--",
        *(n.address for n in receivers),
        timeout=PROBE_SECONDS + 90,
    )
    if r.exit_code != 0 or not data or not isinstance(data.get("streams"), list):
        why = (data or {}).get("error") or r.error or r.stderr.strip()[-200:] or f"exit {r.exit_code}"
        raise ProbeFailed(f"{sender.label}: {' '.join(str(why).split())}")
    took = [(int(st["bytes"]), float(st["seconds"])) for st in data["streams"]]
    if len(took) != len(receivers) or not all(n > 0 and seconds > 0 for n, seconds in took):
        raise ProbeFailed(f"{sender.label}: a stream moved too little to time")
    return len(took) * min(n / seconds for n, seconds in took)


def auto_fanout(s: SyncSession, relay: Sequence[SyncNode], nbytes: int | None = None) -> FanoutChoice:
    """K for the chain over `relay` (the nodes that take the stream, in plan_relay's order) that will
    carry `nbytes` (None: not known, as for --plan)."""
    sender = s.leader if s.source.kind == "leader" else relay[0]
    receivers = [n for n in relay if n is not sender and n.alive]
    if len(receivers) < 2:
        return choose_fanout({}, 0.0, len(receivers), sender.label)
    if not sender.alive:
        return FanoutChoice(1, f"one chain: the sender {sender.label} is down")
    if nbytes is not None and nbytes < PROBE_MIN_BYTES:
        return FanoutChoice(1, f"one chain: {mb(nbytes)} to stream, too little to be worth a probe")
    kept = _kept_hop(s)
    if kept and nbytes is not None:
        short = too_short_to_probe(nbytes, kept[0])
        if short:
            return FanoutChoice(1, f"{short.why} (a hop's rate as measured {kept[1]:.0f} s ago)")
    aggregate: dict[int, float] = {}
    try:
        hop, two = _hop_and_two(s, sender, receivers)
        _keep_hop(s, hop)
        short = too_short_to_probe(nbytes, hop) if nbytes is not None else None
        if short:
            return short
        for k in range(2, min(FANOUT_CAP, len(receivers)) + 1):
            aggregate[k] = two if k == 2 and two is not None else _rate(s, sender, receivers[:k])
            if not aggregate[k] / k >= SHARE * hop:  # fewer each with more streams: no need to try more
                break
    except Exception as exc:  # the probe only advises: nothing in it fails the sync (Ctrl-C still stops it)
        why = str(exc) if isinstance(exc, ProbeFailed) else f"{type(exc).__name__}: {exc}"
        return FanoutChoice(1, f"one chain: the probe failed ({why})")
    return choose_fanout(aggregate, hop, len(receivers), sender.label)


def _hop_and_two(s: SyncSession, sender: SyncNode, receivers: Sequence[SyncNode]) -> tuple[float, float | None]:
    """A hop's rate and, from 4 receivers on, the sender's 2 streams measured at the same time over other links:
    the hop between the chain's last two nodes, the sender's streams to its first two (one measurement's
    wall time, ~1.5 s of a first sync at 150 Mbit/s, instead of two one after the other). With fewer, the hop
    alone (None: the sender's streams not measured yet)."""
    if len(receivers) < 4:
        return _rate(s, receivers[0], receivers[1:2]), None
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="sync-probe") as ex:
        two = ex.submit(_rate, s, sender, receivers[:2])
        return _rate(s, receivers[-2], receivers[-1:]), two.result()


def _local_bytes(root: str) -> int:
    """What a first copy of the folder `root` here streams: its files' sizes, listed as the run lists them."""
    from clusterctl.node.sync import scan
    from clusterctl.node.sync.manifest import ManifestEntry

    wire, _ = scan.walk(root)
    return sum(ManifestEntry.from_wire(e).nbytes for e in wire)


def _hop_file(s: SyncSession) -> Path:
    """Where this node set's last measured hop rate is kept: the same addresses with the same trusted host
    keys (a new cluster that reuses an old one's addresses has new keys, so it is measured anew)."""
    key = hashlib.sha256("\0".join(sorted(n.address for n in s.nodes)).encode())
    try:
        key.update(Path(s.known_hosts).read_bytes() if s.known_hosts else b"")
    except OSError:
        pass
    return s.cache_dir / f"hop-{key.hexdigest()[:16]}.json"


def _kept_hop(s: SyncSession) -> tuple[float, float] | None:
    """(bytes/s, its age in s) of the hop rate measured within HOP_RATE_TTL, else None."""
    try:
        data = json.loads(_hop_file(s).read_text())
        rate, age = float(data["hop"]), time.time() - float(data["at"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return (rate, age) if rate > 0 and 0 <= age < HOP_RATE_TTL else None


def _keep_hop(s: SyncSession, rate: float) -> None:
    path = _hop_file(s)
    try:  # only a later sync's speed depends on it
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        state.atomic_write(path, json.dumps({"hop": rate, "at": time.time()}) + "\n")
    except OSError:
        pass


def for_plan(s: SyncSession) -> FanoutChoice:
    """`sync --plan` with --fanout auto: the probe over every node as a first copy would stream (a folder
    here: its whole size, as the run counts it; a leader's folder: its size is not known here, so measured as
    a long stream), with the node package shipped where it is missing and this run's work folder removed after."""
    nbytes = _local_bytes(s.source.path) if s.source.kind == "local" else None
    if len(s.nodes) < 3:
        return auto_fanout(s, s.nodes, nbytes)  # too few to measure: no ssh at all

    try:
        s.ship_all(s.nodes)
        down = [n.label for n in s.nodes if not n.alive]
        if down:
            return FanoutChoice(1, f"one chain: the probe failed ({', '.join(down)} unreachable)")
        return auto_fanout(s, s.nodes, nbytes)
    finally:
        s.fan(
            [n for n in s.nodes if n.alive],
            lambda n: s.pool.run_one(n.target, f"rm -rf -- {shlex.quote(s.work)}", timeout=30),
        )
