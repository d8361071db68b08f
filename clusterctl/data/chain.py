"""The chain transport (`--strategy chain`, the default): a pipelined relay. The source streams one tar to the
first node, which extracts it and, at the same moment, forwards the same bytes to the next node (tee into that
hop's ssh), and so on down the chain: every link carries the data once and all links run at once. `--fanout K`
splits the nodes after the first into K chains (plan.plan_relay); `--fanout auto` (the default) has K
measured first (probe.py). A node that takes no data for
--stall-timeout is cut out (stall.StallWatch); the nodes after it are repaired from verified neighbours."""

from __future__ import annotations

import re
import shlex
import threading
import time

from clusterctl.data import probe
from clusterctl.data.node_scripts import TAR_CHECKPOINT, preconnect_script, relay_script, source_script
from clusterctl.data.pipes import run_pipeline
from clusterctl.data.plan import SOURCE, plan_relay
from clusterctl.data.session import SyncNode, SyncSession
from clusterctl.data.stall import StallWatch
from clusterctl.remote.openssh import node_ssh, operator_ssh


def stream(s: SyncSession, relay: list[SyncNode], paths: list[str]) -> None:  # noqa: C901 (the relay's setup, its progress lines and its stall handling share one session's state)
    """Stream `paths` from the source down the relay nodes (one or --fanout chains) and extract on each."""
    if not relay:
        return
    by_label = {n.label: n for n in s.nodes}
    leader_src = s.source.kind == "leader"
    fanout = s.fanout
    if fanout is None:
        wanted = set(paths)
        chosen = probe.auto_fanout(s, relay, sum(e.nbytes for e in s.entries if e.path in wanted))
        s.events.phase(chosen.line())
        fanout = chosen.k
    plan = plan_relay([n.label for n in relay], fanout, s.leader.label if leader_src else None)
    hop = node_ssh(s.leader.target.user, s.leader.target.port, s.managed)
    extract = {n.label for n in relay}
    scripts: dict[str, bytes] = {}
    # Hops pre-connected at once (bench/sync_bench: a chain's relays otherwise start one after another,
    # ~0.4 s a hop of which ~0.3 s is ssh's key exchange and login: 3-4 s of an 8-node chain's 15 s at
    # 150 Mbit/s); not worth its round trip below two node-to-node hops.
    mux = len(relay) >= 3
    preconnect: dict[str, str] = {}
    for n in relay + ([s.leader] if leader_src else []):
        kids = plan.children.get(SOURCE if (leader_src and n is s.leader) else n.label, ())
        root = n.root if n.label in extract else None
        if mux and kids:
            preconnect[n.label] = preconnect_script([by_label[c].address for c in kids], hop, s.work)
        scripts[n.label] = relay_script(
            n.index,
            root,
            [by_label[c].address for c in kids],
            hop,
            s.work,
            s.python,
            hash_stream=s.verify == "stream",
            mux=mux,
        )
    lst = s.write_list(paths)
    uploads = {label: {f"{s.work}/relay.sh": (body, 0o700)} for label, body in scripts.items()}
    if leader_src:
        uploads[s.leader.label][f"{s.work}/relay.list"] = (lst, 0o600)
        uploads[s.leader.label][f"{s.work}/source.sh"] = (source_script(s.src_root, s.work), 0o700)

    def put(label: str) -> None:
        r = s.pool.put_one(by_label[label].target, uploads[label])
        if not r.ok:
            s.fail(by_label[label], "unreachable", r.error or "upload failed")
        elif label in preconnect:  # best effort: a hop without its master connects directly
            s.pool.run_one(by_label[label].target, preconnect[label], timeout=30)

    s.fan(list(uploads), lambda label: put(label))
    by_index = {n.index: n for n in s.nodes}
    done_at: dict[int, int] = {}
    cancel = threading.Event()  # a leader source's command, when its own relay stalled
    watch = StallWatch(plan, s.stall_timeout) if s.stall_timeout else None

    def on_stderr(line: str) -> None:
        rc = re.search(r"CCSYNC-RC (\d+) ", line)
        if rc and int(rc.group(1)) in by_index:
            by_index[int(rc.group(1))].outcome.seconds = time.monotonic() - s.start
            if watch:
                watch.moved()
        m = re.search(r"CCSYNC-TAR (\d+) (\d+)", line)
        if m:
            idx, ck = int(m.group(1)), int(m.group(2))
            if idx in by_index:
                done_at[idx] = ck * TAR_CHECKPOINT * 10240
                s.events.progress(by_index[idx].label, min(done_at[idx], by_index[idx].outcome.bytes))
                if watch:
                    watch.moved(by_index[idx].label)
        h = re.search(r"CCSYNC-HOP (\d+) (in|hop|ext) (\d+)", line)
        if h and watch and int(h.group(1)) in by_index:
            watch.report(by_index[int(h.group(1))].label, h.group(2), float(h.group(3)))

    def stalled(label: str | None) -> None:
        assert watch is not None  # only the watch calls this
        if label is None:  # nothing moves and no node can be named: end the relay, repair decides
            s.events.phase(f"the relay moved no data for {2 * watch.limit:g}s; ending it (repair follows)")
            _end_relay(s, leader_src, cancel)
            s.fan([by_label[x] for x in watch.below(SOURCE) if x in by_label], lambda n: _kill_relay(s, n))
            return
        _cut_stalled(s, by_label[label], watch, by_label, leader_src, cancel)

    if leader_src:
        if not s.leader.alive:
            return
        if watch:
            watch.start(stalled)
        try:
            s.pool.run_one(
                s.leader.target,
                f"bash {shlex.quote(s.work + '/source.sh')}",
                timeout=s.timeout,
                on_line=lambda _h, stream, line: on_stderr(line),
                cancel=cancel,
            )
        finally:
            if watch:
                watch.stop()
        return
    head = by_label[plan.children[SOURCE][0]]
    if not head.alive:
        return
    list_path = s.scratch / "relay.list"
    list_path.write_bytes(lst)
    tar = [
        "tar",
        "-C",
        s.src_root,
        "--null",
        "--verbatim-files-from",
        "--no-recursion",
        "-T",
        str(list_path),
        "-cf",
        "-",
    ]
    ssh = operator_ssh(head.target, s.known_hosts, s.managed) + [
        "--",
        head.target.hostname,
        f"bash {shlex.quote(s.work + '/relay.sh')}",
    ]
    if watch:
        watch.start(stalled)
    try:
        run_pipeline(s.children, tar, ssh, on_stderr, s.timeout)
    finally:
        if watch:
            watch.stop()


def _cut_stalled(
    s: SyncSession,
    node: SyncNode,
    watch: StallWatch,
    by_label: dict[str, SyncNode],
    leader_src: bool,
    cancel: threading.Event,
) -> None:
    """A relay node took no data for --stall-timeout: report it, cut its hop (the rest of the chain goes on;
    the nodes after it are repaired from verified neighbours), kill its relay and those below it."""
    s.fail(node, "failed", f"stalled: took no data for {watch.limit:g}s (sync --stall-timeout); cut out of the chain")
    s.events.phase(f"{node.label}: took no data for {watch.limit:g}s; cut out of the chain")
    parent = watch.parent.get(node.label, SOURCE)
    if parent == SOURCE:
        _end_relay(s, leader_src, cancel)
    else:  # the parent drops that hop: its ssh into the node dies, its relay goes on with its own copy
        pattern = f"-- {re.escape(node.address)} bash {re.escape(s.work)}/relay[.]sh"
        s.pool.run_one(by_label[parent].target, f"pkill -KILL -f -- {shlex.quote(pattern)}; true", timeout=15)
    s.fan([node] + [by_label[x] for x in watch.below(node.label) if x in by_label], lambda n: _kill_relay(s, n))


def _end_relay(s: SyncSession, leader_src: bool, cancel: threading.Event) -> None:
    if leader_src:
        cancel.set()  # ends the leader's source command (its remote session is killed)
    else:
        s.children.kill_all()  # the local tar | ssh into the head


def _kill_relay(s: SyncSession, n: SyncNode) -> None:
    """This sync's relay processes on node n (its tar too, stopped or not), best effort and bounded."""
    w = re.escape(s.work)
    pattern = (
        f"{w}/relay[.]sh|{w}/agent[.]py (relay|recv)|{w}/mux[.]|echo=CCSYNC-TA[R] {n.index} "  # [R]: not this shell
    )
    s.pool.run_one(n.target, f"pkill -KILL -f -- {shlex.quote(pattern)}; true", timeout=15)
