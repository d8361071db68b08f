"""rsync hops: the `tree`, `parallel` and `sequential` transports, and the repair of every transport. A hop
copies a list of paths (a node's bad files) from the source or a verified node; `-I` (size and time are not
trusted) and a private partial dir, so a killed transfer resumes and a re-run copies only what is wrong."""

from __future__ import annotations

import re
import shlex
import time

from clusterctl.data import s3_round
from clusterctl.data.pipes import rsync_bytes, run_rsync
from clusterctl.data.plan import plan_tree
from clusterctl.data.session import SyncNode, SyncSession
from clusterctl.node.sync.manifest import PARTIAL_DIR
from clusterctl.remote.openssh import bracketed, node_ssh, operator_ssh

RSYNC_BASE = (
    "rsync",
    "-a",
    "-s",
    "-I",
    "--from0",
    "--partial-dir=" + PARTIAL_DIR,
    "--timeout=60",
    "--info=progress2",
    "--no-inc-recursive",
)


def rsync(s: SyncSession, sender: SyncNode | None, receiver: SyncNode, paths: list[str]) -> bool:
    """Copy `paths` (the bad ones) to `receiver` from the source (None) or a verified node. True if rsync
    exited 0 (the check after it is what counts)."""
    if not receiver.alive:
        return False
    lst = s.write_list(paths)
    dest = f"{receiver.target.user}@{bracketed(receiver.address)}:{receiver.root}/"

    def progress(done: int) -> None:
        s.events.progress(receiver.label, min(done, receiver.outcome.bytes))

    from_leader = sender is None and s.source.kind == "leader"
    if sender is None and not from_leader:
        list_path = s.scratch / f"rsync-{receiver.index}.list"
        list_path.write_bytes(lst)
        wrapper = s.scratch / f"ssh-{receiver.index}"
        full = operator_ssh(receiver.target, s.known_hosts, s.managed)
        ssh = [a for i, a in enumerate(full) if a != "-l" and full[i - 1] != "-l"]  # rsync passes the user
        wrapper.write_text("#!/bin/sh\nexec " + shlex.join(ssh) + ' "$@"\n')
        wrapper.chmod(0o700)
        dest = f"{receiver.target.user}@{bracketed(receiver.target.hostname)}:{receiver.root}/"
        argv = [*RSYNC_BASE, "-e", str(wrapper), f"--files-from={list_path}", s.src_root.rstrip("/") + "/", dest]
        rc, err = run_rsync(s.children, argv, progress, s.timeout)
        ok = rc == 0
        if not ok:
            receiver.last_error = "rsync from the source: " + _why_rsync(err, f"exit {rc}")
        receiver.outcome.seconds = time.monotonic() - s.start
        return ok
    node = sender if sender is not None else s.leader  # no sender and not from the leader: done above
    src_dir = s.src_root if from_leader else node.root
    if not node.alive:
        return False
    name = f"{s.work}/rsync-{receiver.index}.list"
    r = s.pool.put_one(node.target, {name: (lst, 0o600)})
    if not r.ok:
        return False
    e = shlex.join(node_ssh(receiver.target.user, receiver.target.port, s.managed))
    cmd = shlex.join([*RSYNC_BASE, "-e", e, f"--files-from={name}", src_dir.rstrip("/") + "/", dest])
    cmd = f"set -o pipefail; {cmd} | stdbuf -oL tr '\\r' '\\n'"

    def on_line(_h: str, stream: str, line: str) -> None:
        done = rsync_bytes(line)
        if done is not None:
            progress(done)

    r = s.pool.run_one(node.target, f"bash -c {shlex.quote(cmd)}", timeout=s.timeout, on_line=on_line)
    receiver.outcome.seconds = time.monotonic() - s.start
    if not r.ok:
        receiver.last_error = f"rsync from {node.label}: " + _why_rsync(r.stderr, r.error or f"exit {r.exit_code}")
    return r.ok


def tree(s: SyncSession, todo: list[SyncNode]) -> None:
    leader_src = s.source.kind == "leader"
    by_label = {n.label: n for n in s.nodes}
    rounds = plan_tree([n.label for n in todo], s.leader.label if leader_src else None)
    holders: list[SyncNode | None] = [None]  # None: the source
    pending = [by_label[b] for hops in rounds for _, b in hops]
    # the leader's own copy, when it is the source: a local hop in the first round, using no link
    extra = [s.leader] if leader_src and s.leader in todo else []
    r = 0
    while pending or extra:
        r += 1
        hops: list[tuple[SyncNode | None, SyncNode]] = [(None, x) for x in extra]
        extra = []
        for h in list(holders):
            if pending:
                hops.append((h, pending.pop(0)))
        s.events.phase(f"tree round {r}: {len(hops)} rsync hop(s)")
        results: dict[int, bool] = {}

        def hop(pair: tuple[SyncNode | None, SyncNode]) -> None:
            a, b = pair
            results[b.index] = rsync(s, a, b, b.bad)  # noqa: B023 (_fan runs it within this round)

        s.fan(hops, hop)
        holders += [b for _, b in hops if results.get(b.index) and not (leader_src and b is s.leader)]


def repair(s: SyncSession, broken: list[SyncNode], from_source: bool = False) -> None:
    """rsync only the bad files, from verified nodes (spread over them) or else from the source."""
    good = [] if from_source else [n for n in s.live() if not n.bad and n not in broken and n.root]
    if not good and s.source.kind == "s3":
        s3_round.pull_all(s, broken)
        return
    jobs = []
    for i, n in enumerate(broken):
        sender = good[i % len(good)] if good else None
        jobs.append((sender, n))
    s.fan(jobs, lambda job: rsync(s, job[0], job[1], job[1].bad))


def _why_rsync(stderr: str, default: str) -> str:
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    for pattern in (
        r"Host key verification failed",
        r"Permission denied|No space|connect to host|Connection (refused|timed)",
    ):
        for ln in lines:
            if re.search(pattern, ln):
                return ln[:200]
    tail = [ln for ln in lines if ln.startswith("rsync")][-1:]
    return tail[0][:200] if tail else default
