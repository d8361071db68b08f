"""Dataset distribution: put one folder (or S3 prefix) on every node, fast, and prove every copy whole.

    source manifest -> pre-check every node (marker removed first) -> transport -> check -> repair
    -> check -> completion marker (written last, only on a node whose copy matched the manifest)

Transports (`--strategy`):
  chain       the default: a pipelined relay. The source streams one tar to the first node, which
              extracts it and, at the same moment, forwards the same bytes to the next node (tee into
              that hop's ssh), and so on down the chain: every link carries the data once and all
              links run at once. `--fanout K` splits the nodes after the first into K chains.
  tree        rounds of whole-copy rsync hops: every node that has the data sends to one more.
  parallel    every node rsyncs from the source at once.
  sequential  one node after another (the recipe's copyclust loop).
  S3 sources: every node pulls its copy itself, in parallel, with its own credentials.

Whatever the transport, a node whose copy is short or wrong after it gets an rsync of just the bad
files (`-I`: size and time are not trusted) from a verified neighbour, or from the source, so a
broken link costs a re-copy of that node only. rsync keeps partial files in a private partial dir,
so a killed transfer resumes, and a re-run copies only what is missing or wrong.

Node-to-node hops use the node's own key and pinned known_hosts (StrictHostKeyChecking=yes). The
scripts a node runs are uploaded as files and every path in them is shlex-quoted.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import re
import shlex
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Literal, Protocol, Sequence, TypeVar

from clusterctl.data import node_side as sync_agent
from clusterctl.data.pipes import Children, rsync_bytes, run_pipeline, run_rsync
from clusterctl.data.plan import SOURCE, STRATEGIES, Source, check_dst, plan_relay, plan_tree
from clusterctl.data.stall import StallWatch
from clusterctl.errors import ClusterctlError, ConfigError, ExitCode, UsageError
from clusterctl.remote.openssh import bracketed, node_ssh, operator_ssh
from clusterctl.remote.ssh import SshPool
from clusterctl.remote.targets import SshTarget
from clusterctl.types import HostResult

_T = TypeVar("_T")

RSYNC_BASE = (
    "rsync",
    "-a",
    "-s",
    "-I",
    "--from0",
    "--partial-dir=" + sync_agent.PARTIAL_DIR,
    "--timeout=60",
    "--info=progress2",
    "--no-inc-recursive",
)
STALL_TIMEOUT = 120.0  # sync --stall-timeout: seconds a chain may move no data before the node that stopped is cut out
TAR_CHECKPOINT = 100  # records of 10240 bytes: a progress line per ~1 MB per node
WORK = ".clusterctl/sync"  # under the login home of every node
CACHE = ".clusterctl/sync-manifests"  # a leader source's manifest kept for the next run (beside WORK, not in it)
VERIFY = ("stream", "disk")  # sync --verify: the chain's hashes as written, or every file read back


# ---- results ----------------------------------------------------------------------------------------
CopyStatus = Literal["ok", "failed", "unreachable"]


@dataclass
class NodeOutcome:
    host: str
    status: CopyStatus = "ok"
    bytes: int = 0  # bytes this sync had to put on the node
    seconds: float = 0.0  # from the start until the node was verified (or given up)
    verified: bool = False
    detail: str = ""


class SyncIncomplete(ClusterctlError):
    def __init__(self, message: str, hint: str, code: ExitCode):
        super().__init__(message, hint)
        self.exit_code = code


@dataclass
class SyncReport:
    outcomes: list[NodeOutcome]
    total_bytes: int  # size of the dataset
    seconds: float
    strategy: str
    files: int

    @property
    def exit_code(self) -> int:
        if any(o.status == "unreachable" for o in self.outcomes):
            return int(ExitCode.UNREACHABLE)
        if any(o.status != "ok" for o in self.outcomes):
            return int(ExitCode.REMOTE_FAILED)
        return 0

    def error(self) -> SyncIncomplete | None:
        bad = [o for o in self.outcomes if o.status != "ok"]
        if not bad:
            return None
        first = "; ".join(f"{o.host}: {o.status}: {o.detail}" for o in bad[:3])
        return SyncIncomplete(
            f"{len(bad)} of {len(self.outcomes)} node(s) not verified, not marked complete ({first})",
            "fix them and run the same `clusterctl sync` again: it copies only what is missing",
            ExitCode(self.exit_code),
        )


class Events(Protocol):
    """What the library tells the display: any object with these methods (the CLI's draws them); a subclass
    inherits these, which say nothing. Tests may pass none."""

    def phase(self, text: str) -> None:
        return None

    def need(self, host: str, total: int) -> None:  # this node will receive `total` bytes
        return None

    def progress(self, host: str, done: int) -> None:  # bytes received so far (monotonic per phase)
        return None

    def finished(self, outcome: NodeOutcome) -> None:
        return None


class _Silent(Events):
    """The default: says nothing."""


# ---- the sync -------------------------------------------------------------------------------------------
@dataclass
class _Node:
    index: int
    target: SshTarget  # how the operator reaches it
    address: str  # how the other nodes reach it (hosts-file token)
    outcome: NodeOutcome
    root: str = ""  # DST resolved on the node
    bad: list[str] = field(default_factory=list)
    bad_bytes: int = 0
    free: int = 0
    alive: bool = True
    last_error: str = ""  # why its last copy attempt failed, when the copy said so

    @property
    def label(self) -> str:
        return self.target.label


class Syncer:
    def __init__(
        self,
        targets: Sequence[SshTarget],
        addresses: Sequence[str],
        known_hosts: str,
        pool: SshPool,
        source: Source,
        dst: str,
        *,
        strategy: str = "chain",
        fanout: int = 1,
        delete: bool = False,
        endpoint_url: str | None = None,
        managed: bool = True,
        events: Events | None = None,
        node_python: str | None = None,
        timeout: float | None = None,
        stall_timeout: float | None = STALL_TIMEOUT,
        verify: str = "stream",
        cache_dir: Path | None = None,
    ):
        if strategy not in STRATEGIES:
            raise UsageError(f"unknown --strategy {strategy!r}", f"use one of {', '.join(STRATEGIES)}")
        if fanout < 1:
            raise UsageError("--fanout must be at least 1")
        if verify not in VERIFY:
            raise UsageError(f"unknown --verify {verify!r}", "use stream (the default) or disk")
        if stall_timeout is not None and not stall_timeout > 0:
            raise UsageError(f"--stall-timeout must be positive, not {stall_timeout:g}")
        if endpoint_url is not None and not re.match(r"^https?://[^\s'\"]+$", endpoint_url):
            raise UsageError(f"--endpoint-url {endpoint_url!r} is not an http(s) URL")
        self.pool, self.source, self.dst = pool, source, check_dst(dst)
        self.strategy, self.fanout, self.delete, self.endpoint_url = strategy, fanout, delete, endpoint_url
        self.known_hosts, self.managed = known_hosts, managed
        self.events = events or _Silent()
        self.python = node_python or "python3"  # the record's runtime Python where the caller has one
        self.timeout = timeout
        self.stall_timeout = stall_timeout
        self.verify = verify
        if cache_dir is None:
            from clusterctl import state

            cache_dir = state.home() / "sync-manifests"
        self.cache_dir = cache_dir  # a local source's manifest kept for the next run (the operator's state folder)
        self.token = uuid.uuid4().hex[:12]
        self.work = f"{WORK}/{self.token}"
        self.nodes = [_Node(i, t, a, NodeOutcome(t.label)) for i, (t, a) in enumerate(zip(targets, addresses))]
        self.start = 0.0
        self.entries: list[dict] = []
        self.manifest_bytes = b""
        self.src_root = ""  # the source folder, resolved where it is
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self.children = Children()

    # ---- helpers ---------------------------------------------------------------------------------------
    @property
    def leader(self) -> _Node:
        return self.nodes[0]

    def _py(self, script: str, *args: str) -> str:
        py = shlex.quote(self.python)
        return f'P={py}; [ -x "$P" ] || P=python3; "$P" {shlex.quote(f"{self.work}/{script}")} ' + " ".join(
            shlex.quote(a) for a in args
        )

    def _agent(
        self,
        node: _Node,
        *args: str,
        timeout: float | None = None,
        on_line: Callable[[str, str, str], None] | None = None,
    ) -> tuple[dict | None, HostResult]:
        out = f"{self.work}/out-{uuid.uuid4().hex[:8]}.json"  # the result comes back by SFTP: no output cap
        r = self.pool.run_one(
            node.target, self._py("agent.py", args[0], "--out", out, *args[1:]), timeout=timeout, on_line=on_line
        )
        data = None
        for line in reversed(r.stdout.strip().splitlines()):
            try:
                data = json.loads(line)
                break
            except ValueError:
                continue
        if isinstance(data, dict) and data.get("out") == out:
            try:
                data = json.loads(self._fetch(node, out))
            except (OSError, ValueError) as exc:
                data = {"error": f"cannot read the agent's result {out}: {exc}"}
        return data, r

    def _fetch(self, node: _Node, path: str) -> bytes:
        """A file of the node (relative to the login home) by SFTP, then removed there."""
        client = self.pool.client(node.target)
        sftp = client.open_sftp()
        try:
            with sftp.open(path, "rb") as f:
                f.prefetch()
                data = f.read()
            sftp.remove(path)
            return data
        finally:
            sftp.close()

    def _fail(self, node: _Node, status: CopyStatus, detail: str) -> None:
        if node.outcome.status == "ok" or status == "unreachable":
            node.outcome.status = status
            node.outcome.detail = " ".join(detail.split())[:300]
        node.outcome.seconds = time.monotonic() - self.start
        node.alive = False

    def _failed_result(self, node: _Node, r: HostResult, data: dict | None, what: str) -> None:
        if r.exit_code is None:
            self._fail(node, "unreachable", r.error or "unreachable")
        else:
            why = (data or {}).get("error") or r.stderr.strip()[-200:] or f"exit {r.exit_code}"
            self._fail(node, "failed", f"{what}: {why}")

    @property
    def _scratch(self) -> Path:
        """This machine's scratch folder for the run (lists, ssh wrappers): run() makes it."""
        assert self._tmp is not None, "outside run()"
        return Path(self._tmp.name)

    def _live(self, nodes: Sequence[_Node] | None = None) -> list[_Node]:
        return [n for n in (self.nodes if nodes is None else nodes) if n.alive]

    def _fan(self, items: Sequence[_T], fn: Callable[[_T], object], parallel: int = 64) -> None:
        """fn over items on a bounded pool. Ctrl-C stops local children and remote commands, then re-raises."""
        if not items:
            return
        ex = ThreadPoolExecutor(max_workers=max(1, min(parallel, len(items))))
        futures = [ex.submit(fn, it) for it in items]
        try:
            for f in futures:
                f.result()
        except BaseException:
            self.interrupt()
            ex.shutdown(wait=False, cancel_futures=True)
            raise
        ex.shutdown(wait=True)

    def interrupt(self) -> None:
        self.pool.cancel.set()
        self.children.kill_all()

    def _write_list(self, paths: Sequence[str]) -> bytes:
        return b"".join(os.fsencode(p) + b"\0" for p in paths)

    # ---- the run -----------------------------------------------------------------------------------
    def run(self) -> SyncReport:
        self.start = time.monotonic()
        self._tmp = tempfile.TemporaryDirectory(prefix="clusterctl-sync-")
        try:
            self._run()
        except BaseException:
            self.interrupt()
            raise
        finally:
            self._tmp.cleanup()
        for n in self.nodes:
            if n.alive:
                n.outcome.verified = True
            self.events.finished(n.outcome)
        total = sum(e.get("s", 0) for e in self.entries)
        files = sum(1 for e in self.entries if e["t"] == "f")
        return SyncReport([n.outcome for n in self.nodes], total, time.monotonic() - self.start, self.strategy, files)

    def _run(self) -> None:
        self._manifest()
        self._upload()
        self.events.phase(f"checking {len(self._live())} node(s) against the manifest")
        self._check_all(reset=True)
        todo = [n for n in self._live() if n.bad]
        for n in todo:
            n.outcome.bytes = n.bad_bytes
        if todo:
            self._transport(todo)
            self.events.phase(
                "verifying every copy against the manifest"
                + (" (read back: --verify disk)" if self.verify == "disk" else "")
            )
            self._check_all(todo, reset=False, received=self.verify == "stream" and self.strategy == "chain")
            for attempt in range(2):
                broken = [n for n in self._live(todo) if n.bad]
                if not broken:
                    break
                for n in broken:
                    if n.last_error:
                        self.events.phase(f"{n.label}: {n.last_error}")
                        n.last_error = ""
                where = "a verified neighbour" if attempt == 0 else "the source"
                self.events.phase(f"repairing {len(broken)} node(s): the bad files only, from {where}")
                self._repair(broken, from_source=attempt > 0)
                self._check_all(broken, reset=False)
            for n in self._live(todo):
                if n.bad:
                    self._fail(
                        n,
                        "failed",
                        f"{len(n.bad)} file(s) still differ from the manifest, e.g. {n.bad[0]!r}"
                        + (f" ({n.last_error})" if n.last_error else ""),
                    )
        self._cleanup()

    # ---- manifest ----------------------------------------------------------------------------------
    def _manifest(self) -> None:
        src = self.source
        if src.kind == "local":
            self.events.phase(f"making the manifest of {src.path} (sha256 of every file changed since the last run)")
            self.src_root = src.path
            cache = self.cache_dir / f"{hashlib.sha256(os.fsencode(src.path)).hexdigest()[:16]}.json"
            known = sync_agent.load_scan_cache(str(cache), src.path)
            before = len(known)
            self.entries, known, hashed = sync_agent.scan_reusing(src.path, known, workers=min(4, os.cpu_count() or 1))
            try:
                if hashed or len(known) != before:  # else the kept manifest is still the one
                    sync_agent.save_scan_cache(str(cache), src.path, known)
            except OSError as exc:  # only the next run's speed depends on it
                self.events.phase(f"cannot keep the manifest for the next run in {cache}: {exc.strerror}")
            self._said_hashed(hashed)
        else:
            self.events.phase(
                "making the manifest on the leader"
                if src.kind == "leader"
                else f"listing {src.describe()} from the leader"
            )
            r = self.pool.put_one(self.leader.target, {f"{self.work}/agent.py": (self._agent_bytes(), 0o600)})
            if not r.ok:
                raise SyncIncomplete(
                    f"cannot reach the leader {self.leader.label}: {r.error}", "check the cluster", ExitCode.UNREACHABLE
                )
            if src.kind == "leader":
                leader_cache = f"{CACHE}/{hashlib.sha256(os.fsencode(src.path)).hexdigest()[:16]}.json"
                data, r = self._agent(self.leader, "manifest", "--cache", leader_cache, "--", src.path)
            else:
                args = ["s3list"] + (["--endpoint-url", self.endpoint_url] if self.endpoint_url else [])
                data, r = self._agent(self.leader, *args, "--", src.bucket, src.prefix)
            if r.exit_code is None:
                raise SyncIncomplete(
                    f"the leader {self.leader.label} is unreachable: {r.error}",
                    "check the cluster",
                    ExitCode.UNREACHABLE,
                )
            if r.exit_code != 0 or not data or "entries" not in data:
                why = (data or {}).get("error") or r.stderr.strip()[-300:] or f"exit {r.exit_code}"
                if r.exit_code == sync_agent.EXIT_INPUT:
                    raise ConfigError(f"SRC {src.describe()}: {why}")
                raise SyncIncomplete(
                    f"could not read SRC {src.describe()} on the leader: {why}",
                    "see the message",
                    ExitCode.REMOTE_FAILED,
                )
            self.entries = data["entries"]
            self.src_root = data.get("root", "")
            if src.kind == "leader":
                self._check_overlap(data)
                self._said_hashed(int(data.get("hashed", 0)))
        for e in self.entries:
            problem = sync_agent.path_problem(e["p"])
            if problem:
                raise ConfigError(f"SRC {src.describe()}: {problem}")
        self.manifest_bytes = json.dumps(
            {"entries": self.entries, "source": src.describe()}, ensure_ascii=True
        ).encode()

    def _said_hashed(self, hashed: int) -> None:
        files = sum(1 for e in self.entries if e["t"] == "f")
        self.events.phase(
            f"manifest: {hashed} file(s) hashed, {files - hashed} unchanged since the last run "
            "(size, mtime, ctime and inode as then: their sha256 kept)"
        )

    @staticmethod
    def _agent_bytes() -> bytes:
        return Path(sync_agent.__file__).read_bytes()

    def _upload(self) -> None:
        files = {
            f"{self.work}/agent.py": (self._agent_bytes(), 0o600),
            f"{self.work}/manifest.json": (self.manifest_bytes, 0o600),
        }

        def one(n: _Node) -> None:
            r = self.pool.put_one(n.target, files)
            if not r.ok:
                self._fail(n, "unreachable", r.error or "upload failed")

        self.events.phase(f"sending the manifest ({len(self.entries)} entries) to {len(self.nodes)} node(s)")
        self._fan(self.nodes, one)

    def _check_all(self, nodes: Sequence[_Node] | None = None, reset: bool = False, received: bool = False) -> None:
        """Check (and mark) every node's copy. With `received`, a chain node's files whose sha256 as written
        (recv, on the stream) matches the manifest are taken without being read back."""
        total = sum(e.get("s", 0) for e in self.entries)
        timeout = self.timeout or 600 + total / 20e6
        counts = {"streamed": 0, "reread": 0}

        def one(n: _Node) -> None:
            args = [
                "check",
                "--dst",
                self.dst,
                "--manifest",
                f"{self.work}/manifest.json",
                "--mark",
                self.source.describe(),
                "--workers",
                "4",
            ]
            if reset:
                args.append("--reset")
            if received:
                args += ["--received", f"{self.work}/recv.json"]
            if self.delete:
                args.append("--delete")
            data, r = self._agent(n, *args, timeout=timeout)
            if r.exit_code != 0 or not data or "bad" not in data:
                if r.exit_code == 2:
                    raise UsageError(f"DST {self.dst!r}: {(data or {}).get('error', 'refused')}")
                self._failed_result(n, r, data, "check")
                return
            n.root, n.bad, n.bad_bytes, n.free = data["root"], data["bad"], data["bad_bytes"], data["free"]
            counts["streamed"] += int(data.get("streamed", 0))
            counts["reread"] += int(data.get("reread", 0))
            if reset and n.bad_bytes > n.free:
                self._fail(
                    n, "failed", f"not enough space at {n.root}: needs {_mb(n.bad_bytes)}, has {_mb(n.free)} free"
                )
            elif not n.bad and not n.outcome.seconds:
                n.outcome.seconds = time.monotonic() - self.start
                self.events.progress(n.label, n.outcome.bytes)

        self._fan(self._live(nodes), one)
        if not reset:
            self.events.phase(
                f"verified: {counts['streamed']} file(s) by their sha256 as written, {counts['reread']} read back"
            )

    def _check_overlap(self, data: dict) -> None:
        """Before anything is touched: on the leader, DST inside SRC (or SRC inside DST) is refused; the
        check of DST (with --delete) would otherwise remove parts of the source."""
        dst = self.dst if self.dst.startswith("/") else posixpath.join(data.get("home", "/root"), self.dst)
        dst = posixpath.normpath(dst).rstrip("/") + "/"
        for src in {self.src_root, data.get("real", self.src_root)}:
            a = src.rstrip("/") + "/"
            if a != dst and (a.startswith(dst) or dst.startswith(a)):
                raise UsageError(
                    f"on the leader, SRC {src} and DST {dst.rstrip('/')} are inside one another",
                    "sync into a folder of its own",
                )

    def _cleanup(self) -> None:
        self._fan(
            self.nodes,
            lambda n: (
                self.pool.run_one(n.target, f"rm -rf -- {shlex.quote(self.work)}", timeout=30)
                if n.outcome.status != "unreachable"
                else None
            ),
        )

    # ---- transport ---------------------------------------------------------------------------------
    def _transport(self, todo: list[_Node]) -> None:
        for n in todo:
            self.events.need(n.label, n.bad_bytes)
        if self.source.kind == "s3":
            self._s3_round(todo)
            return
        if self.strategy == "chain":
            union: set[str] = set()
            for n in todo:
                union.update(n.bad)
            sizes = {e["p"]: e.get("s", 0) for e in self.entries}
            union_bytes = sum(sizes[p] for p in union)
            relay = [n for n in todo if n.bad_bytes * 2 >= union_bytes]  # the nearly complete get rsync instead
            if len(relay) < len(todo):
                union = set().union(*(set(n.bad) for n in relay)) if relay else set()
                union_bytes = sum(sizes[p] for p in union)
            for n in relay:
                n.outcome.bytes = union_bytes
                self.events.need(n.label, union_bytes)
            self.events.phase(f"streaming {_mb(union_bytes)} down a chain of {len(relay)} node(s)")
            self._relay(relay, [e["p"] for e in self.entries if e["p"] in union])
            rest = [n for n in todo if n not in relay]
            if rest:
                self._repair(rest)
            return
        if self.strategy == "tree":
            self._tree(todo)
        elif self.strategy == "parallel":
            self.events.phase(f"{len(todo)} rsync(s) from the source at once")
            self._fan(todo, lambda n: self._rsync(None, n, n.bad))
        else:
            self.events.phase(f"{len(todo)} rsync(s) from the source, one after another")
            for n in todo:
                if n.alive:
                    self._rsync(None, n, n.bad)

    # ---- chain relay -----------------------------------------------------------------------------
    def _relay(self, relay: list[_Node], paths: list[str]) -> None:
        if not relay:
            return
        by_label = {n.label: n for n in self.nodes}
        leader_src = self.source.kind == "leader"
        plan = plan_relay([n.label for n in relay], self.fanout, self.leader.label if leader_src else None)
        hop = node_ssh(self.leader.target.user, self.leader.target.port, self.managed)
        extract = {n.label for n in relay}
        scripts: dict[str, bytes] = {}
        for n in relay + ([self.leader] if leader_src else []):
            kids = plan.children.get(SOURCE if (leader_src and n is self.leader) else n.label, ())
            root = n.root if n.label in extract else None
            scripts[n.label] = relay_script(
                n.index,
                root,
                [by_label[c] for c in kids],
                hop,
                self.work,
                self.python,
                hash_stream=self.verify == "stream",
            )
        lst = self._write_list(paths)
        uploads = {label: {f"{self.work}/relay.sh": (body, 0o700)} for label, body in scripts.items()}
        if leader_src:
            uploads[self.leader.label][f"{self.work}/relay.list"] = (lst, 0o600)
            uploads[self.leader.label][f"{self.work}/source.sh"] = (source_script(self.src_root, self.work), 0o700)

        def put(label: str) -> None:
            r = self.pool.put_one(by_label[label].target, uploads[label])
            if not r.ok:
                self._fail(by_label[label], "unreachable", r.error or "upload failed")

        self._fan(list(uploads), lambda label: put(label))
        by_index = {n.index: n for n in self.nodes}
        done_at: dict[int, int] = {}
        cancel = threading.Event()  # a leader source's command, when its own relay stalled
        watch = StallWatch(plan, self.stall_timeout) if self.stall_timeout else None

        def on_stderr(line: str) -> None:
            rc = re.search(r"CCSYNC-RC (\d+) ", line)
            if rc and int(rc.group(1)) in by_index:
                by_index[int(rc.group(1))].outcome.seconds = time.monotonic() - self.start
                if watch:
                    watch.moved()
            m = re.search(r"CCSYNC-TAR (\d+) (\d+)", line)
            if m:
                idx, ck = int(m.group(1)), int(m.group(2))
                if idx in by_index:
                    done_at[idx] = ck * TAR_CHECKPOINT * 10240
                    self.events.progress(by_index[idx].label, min(done_at[idx], by_index[idx].outcome.bytes))
                    if watch:
                        watch.moved(by_index[idx].label)
            h = re.search(r"CCSYNC-HOP (\d+) (in|hop|ext) (\d+)", line)
            if h and watch and int(h.group(1)) in by_index:
                watch.report(by_index[int(h.group(1))].label, h.group(2), float(h.group(3)))

        def stalled(label: str | None) -> None:
            assert watch is not None  # only the watch calls this
            if label is None:  # nothing moves and no node can be named: end the relay, repair decides
                self.events.phase(f"the relay moved no data for {2 * watch.limit:g}s; ending it (repair follows)")
                self._end_relay(leader_src, cancel)
                self._fan([by_label[x] for x in watch.below(SOURCE) if x in by_label], self._kill_relay)
                return
            self._cut_stalled(by_label[label], watch, by_label, leader_src, cancel)

        if leader_src:
            if not self.leader.alive:
                return
            if watch:
                watch.start(stalled)
            try:
                self.pool.run_one(
                    self.leader.target,
                    f"bash {shlex.quote(self.work + '/source.sh')}",
                    timeout=self.timeout,
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
        list_path = self._scratch / "relay.list"
        list_path.write_bytes(lst)
        tar = [
            "tar",
            "-C",
            self.src_root,
            "--null",
            "--verbatim-files-from",
            "--no-recursion",
            "-T",
            str(list_path),
            "-cf",
            "-",
        ]
        ssh = operator_ssh(head.target, self.known_hosts, self.managed) + [
            "--",
            head.target.hostname,
            f"bash {shlex.quote(self.work + '/relay.sh')}",
        ]
        if watch:
            watch.start(stalled)
        try:
            run_pipeline(self.children, tar, ssh, on_stderr, self.timeout)
        finally:
            if watch:
                watch.stop()

    def _cut_stalled(
        self, node: _Node, watch: "StallWatch", by_label: dict, leader_src: bool, cancel: threading.Event
    ) -> None:
        """A relay node took no data for --stall-timeout: report it, cut its hop (the rest of the chain goes on;
        the nodes after it are repaired from verified neighbours), kill its relay and those below it."""
        self._fail(
            node, "failed", f"stalled: took no data for {watch.limit:g}s (sync --stall-timeout); cut out of the chain"
        )
        self.events.phase(f"{node.label}: took no data for {watch.limit:g}s; cut out of the chain")
        parent = watch.parent.get(node.label, SOURCE)
        if parent == SOURCE:
            self._end_relay(leader_src, cancel)
        else:  # the parent drops that hop: its ssh into the node dies, its relay goes on with its own copy
            pattern = f"-- {re.escape(node.address)} bash {re.escape(self.work)}/relay[.]sh"
            self.pool.run_one(by_label[parent].target, f"pkill -KILL -f -- {shlex.quote(pattern)}; true", timeout=15)
        self._fan([node] + [by_label[x] for x in watch.below(node.label) if x in by_label], self._kill_relay)

    def _end_relay(self, leader_src: bool, cancel: threading.Event) -> None:
        if leader_src:
            cancel.set()  # ends the leader's source command (its remote session is killed)
        else:
            self.children.kill_all()  # the local tar | ssh into the head

    def _kill_relay(self, n: _Node) -> None:
        """This sync's relay processes on node n (its tar too, stopped or not), best effort and bounded."""
        w = re.escape(self.work)
        pattern = f"{w}/relay[.]sh|{w}/agent[.]py (relay|recv)|echo=CCSYNC-TA[R] {n.index} "  # [R]: not this shell
        self.pool.run_one(n.target, f"pkill -KILL -f -- {shlex.quote(pattern)}; true", timeout=15)

    # ---- rsync hops ------------------------------------------------------------------------------
    def _rsync(self, sender: _Node | None, receiver: _Node, paths: list[str]) -> bool:
        """Copy `paths` (the bad ones) to `receiver` from the source (None) or a verified node. True if rsync
        exited 0 (the check after it is what counts)."""
        if not receiver.alive:
            return False
        lst = self._write_list(paths)
        dest = f"{receiver.target.user}@{bracketed(receiver.address)}:{receiver.root}/"
        progress = lambda done: self.events.progress(receiver.label, min(done, receiver.outcome.bytes))  # noqa: E731
        from_leader = sender is None and self.source.kind == "leader"
        if sender is None and not from_leader:
            list_path = self._scratch / f"rsync-{receiver.index}.list"
            list_path.write_bytes(lst)
            wrapper = self._scratch / f"ssh-{receiver.index}"
            full = operator_ssh(receiver.target, self.known_hosts, self.managed)
            ssh = [a for i, a in enumerate(full) if a != "-l" and full[i - 1] != "-l"]  # rsync passes the user
            wrapper.write_text("#!/bin/sh\nexec " + shlex.join(ssh) + ' "$@"\n')
            wrapper.chmod(0o700)
            dest = f"{receiver.target.user}@{bracketed(receiver.target.hostname)}:{receiver.root}/"
            argv = [*RSYNC_BASE, "-e", str(wrapper), f"--files-from={list_path}", self.src_root.rstrip("/") + "/", dest]
            rc, err = run_rsync(self.children, argv, progress, self.timeout)
            ok = rc == 0
            if not ok:
                receiver.last_error = "rsync from the source: " + _why_rsync(err, f"exit {rc}")
            receiver.outcome.seconds = time.monotonic() - self.start
            return ok
        node = sender if sender is not None else self.leader  # no sender and not from the leader: done above
        src_dir = self.src_root if from_leader else node.root
        if not node.alive:
            return False
        name = f"{self.work}/rsync-{receiver.index}.list"
        r = self.pool.put_one(node.target, {name: (lst, 0o600)})
        if not r.ok:
            return False
        e = shlex.join(node_ssh(receiver.target.user, receiver.target.port, self.managed))
        cmd = shlex.join([*RSYNC_BASE, "-e", e, f"--files-from={name}", src_dir.rstrip("/") + "/", dest])
        cmd = f"set -o pipefail; {cmd} | stdbuf -oL tr '\\r' '\\n'"

        def on_line(_h: str, stream: str, line: str) -> None:
            done = rsync_bytes(line)
            if done is not None:
                progress(done)

        r = self.pool.run_one(node.target, f"bash -c {shlex.quote(cmd)}", timeout=self.timeout, on_line=on_line)
        receiver.outcome.seconds = time.monotonic() - self.start
        if not r.ok:
            receiver.last_error = f"rsync from {node.label}: " + _why_rsync(r.stderr, r.error or f"exit {r.exit_code}")
        return r.ok

    def _tree(self, todo: list[_Node]) -> None:
        leader_src = self.source.kind == "leader"
        by_label = {n.label: n for n in self.nodes}
        rounds = plan_tree([n.label for n in todo], self.leader.label if leader_src else None)
        holders: list[_Node | None] = [None]  # None: the source
        pending = [by_label[b] for hops in rounds for _, b in hops]
        # the leader's own copy, when it is the source: a local hop in the first round, using no link
        extra = [self.leader] if leader_src and self.leader in todo else []
        r = 0
        while pending or extra:
            r += 1
            hops: list[tuple[_Node | None, _Node]] = [(None, x) for x in extra]
            extra = []
            for h in list(holders):
                if pending:
                    hops.append((h, pending.pop(0)))
            self.events.phase(f"tree round {r}: {len(hops)} rsync hop(s)")
            results: dict[int, bool] = {}

            def hop(pair):
                a, b = pair
                results[b.index] = self._rsync(a, b, b.bad)  # noqa: B023 (_fan runs it within this round)

            self._fan(hops, hop)
            holders += [b for _, b in hops if results.get(b.index) and not (leader_src and b is self.leader)]

    def _repair(self, broken: list[_Node], from_source: bool = False) -> None:
        """rsync only the bad files, from verified nodes (spread over them) or else from the source."""
        good = [] if from_source else [n for n in self._live() if not n.bad and n not in broken and n.root]
        if not good and self.source.kind == "s3":
            self._s3_round(broken)
            return
        jobs = []
        for i, n in enumerate(broken):
            sender = good[i % len(good)] if good else None
            jobs.append((sender, n))
        self._fan(jobs, lambda job: self._rsync(job[0], job[1], job[1].bad))

    # ---- S3 --------------------------------------------------------------------------------------
    def _s3_round(self, nodes: list[_Node]) -> None:
        """Every node pulls its own copy, all at once. Objects S3 gives no checkable checksum for (SSE-KMS, a
        multipart ETag of unknown part size) are taken as pulled (--record) and their streamed sha256 returned;
        the first node in host order that pulled one gives the sha256 that goes into the manifest, and every
        node's copy is then checked against it (the check after the pulls; a copy that differs is repaired)."""
        nodes = self._live(nodes)
        if not nodes:
            return
        self.events.phase(f"{len(nodes)} node(s) pulling from {self.source.describe()} at once")
        recorded: dict[int, dict[str, str]] = {}

        def one(n: _Node) -> None:
            got = self._s3_pull(n, record=True)
            if got:
                recorded[n.index] = got

        self._fan(nodes, one)
        reference: dict[str, tuple[str, str]] = {}
        for n in sorted(nodes, key=lambda x: x.index):
            for path, digest in recorded.get(n.index, {}).items():
                reference.setdefault(path, (digest, n.label))
        if reference:
            self._adopt_recorded(reference)

    def _adopt_recorded(self, reference: dict[str, tuple[str, str]]) -> None:
        adopted: dict[str, str] = {}
        for e in self.entries:
            if e["p"] in reference and "h" not in e and not e.get("sha256b64"):
                e["h"], adopted[e["p"]] = reference[e["p"]]
        if not adopted:
            return
        self.manifest_bytes = json.dumps(
            {"entries": self.entries, "source": self.source.describe()}, ensure_ascii=True
        ).encode()
        by = ", ".join(sorted(set(adopted.values())))
        self.events.phase(
            f"{len(adopted)} object(s) have no checksum S3 vouches for (SSE-KMS, or a multipart ETag "
            f"of unknown part size): their sha256 as pulled by {by} is recorded, and every other "
            "node's copy is checked against it"
        )

        def put(n: _Node) -> None:
            r = self.pool.put_one(n.target, {f"{self.work}/manifest.json": (self.manifest_bytes, 0o600)})
            if not r.ok:
                self._fail(n, "unreachable", r.error or "upload failed")

        self._fan(self._live(), put)

    def _s3_pull(self, n: _Node, record: bool = False) -> dict[str, str] | None:
        """Pull n's bad objects; with `record`, what it recorded (None when the pull did not succeed)."""
        r = self.pool.put_one(n.target, {f"{self.work}/s3.list": (self._write_list(n.bad), 0o600)})
        if not r.ok:
            self._fail(n, "unreachable", r.error or "upload failed")
            return None
        args = [
            "s3pull",
            "--dst",
            self.dst,
            "--manifest",
            f"{self.work}/manifest.json",
            "--bucket",
            self.source.bucket,
            "--prefix",
            self.source.prefix,
            "--only",
            f"{self.work}/s3.list",
        ]
        if self.endpoint_url:
            args += ["--endpoint-url", self.endpoint_url]
        if record:
            args.append("--record")

        def on_line(_h: str, stream: str, line: str) -> None:
            m = re.match(r"CCSYNC-BYTES (\d+)", line)
            if m:
                self.events.progress(n.label, min(int(m.group(1)), n.outcome.bytes))

        data, r = self._agent(n, *args, timeout=self.timeout, on_line=on_line)
        if r.exit_code is None:
            self._fail(n, "unreachable", r.error or "unreachable")
        elif r.exit_code == sync_agent.EXIT_INPUT:
            self._failed_result(n, r, data, "s3")
        elif r.exit_code != 0:  # the check that follows finds what is missing; the node is retried
            n.last_error = "s3: " + str((data or {}).get("error") or r.stderr.strip()[-200:])
            self.events.phase(f"{n.label}: {n.last_error} (will retry what is missing)")
        else:
            return dict((data or {}).get("recorded") or {})
        return None


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


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


# ---- scripts the nodes run --------------------------------------------------------------------------
def relay_script(
    index: int,
    root: str | None,
    children: Sequence[_Node],
    hop: Sequence[str],
    work: str,
    python: str = "python3",
    hash_stream: bool = True,
) -> bytes:
    """The relay on one node: read the tar stream on stdin, forward it to every child's relay (tee into
    their ssh; a child that dies is dropped and the rest go on), and extract it into `root`. With one
    child (a chain), the agent's zero-copy relay (tee(2)/splice(2)) stands in for tee. With hash_stream,
    the agent's recv sits before tar: it passes every byte on and hashes each file as it goes by, and its
    hashes are kept (recv.json) only when recv and tar both exited 0, for the check to trust."""
    q = shlex.quote
    w = f'"$HOME"/{q(work)}'
    lines = [
        "#!/bin/bash",
        f"# clusterctl sync relay of node {index}",
        "set -u",
        f"W={w}",
        f'P={q(python)}; [ -x "$P" ] || P=python3',
    ]
    fifos = []
    for i, child in enumerate(children):
        fifo = f'"$W/fifo.{i}"'
        fifos.append(fifo)
        remote = f"bash {q(work + '/relay.sh')}"
        ssh = " ".join(q(a) for a in hop)
        lines.append(f"rm -f {fifo}; mkfifo -m 600 {fifo} || exit 1")
        # ssh's stdout/stderr are pipes of its own: ssh makes its fds non-blocking, which must not leak
        lines.append(f"{{ {ssh} -- {q(child.address)} {q(remote)} < {fifo} 2>&1 >/dev/null | cat >&2; }} &")
    ck = f"--checkpoint={TAR_CHECKPOINT}", f"--checkpoint-action=echo=CCSYNC-TAR {index} %u"
    extract = ("tar -C " + q(root) + " -xf - " + " ".join(q(c) for c in ck)) if root is not None else None
    hashing = bool(extract) and hash_stream
    if hashing:
        extract = f'"$P" "$W/agent.py" recv --hashes "$W/recv.part" | {extract}'
    if len(fifos) == 1 and extract:
        lines.append(f'"$P" "$W/agent.py" relay --index {index} --out {fifos[0]} | {extract}')
    elif fifos:
        lines.append(f"tee -p {' '.join(fifos)} " + (f"| {extract}" if extract else ">/dev/null"))
    else:
        lines.append(extract or "cat >/dev/null")
    lines += [
        'st=("${PIPESTATUS[@]}"); rc="${st[*]}"',
        "wait",
        f'echo "CCSYNC-RC {index} $rc" >&2',
        "rm -f " + " ".join(fifos) if fifos else "true",
    ]
    if hashing:  # recv and tar, the pipeline's last two, both whole: the hashes are those of what tar wrote
        lines.append('[ "${st[-1]}" = 0 ] && [ "${st[-2]}" = 0 ] && mv -f "$W/recv.part" "$W/recv.json"; true')
    return ("\n".join(lines) + "\n").encode()


def source_script(src_root: str, work: str) -> bytes:
    """On the leader, when it is the source: the tar of the listed paths, into its own relay."""
    q = shlex.quote
    return (
        f'#!/bin/bash\nset -o pipefail\ncd "$HOME" || exit 1\n'
        f"tar -C {q(src_root)} --null --verbatim-files-from --no-recursion -T {q(work + '/relay.list')} -cf - "
        f"| bash {q(work + '/relay.sh')}\n"
    ).encode()
