"""Dataset distribution: put one folder (or S3 prefix) on every node, fast, and prove every copy whole.

    source manifest -> pre-check every node (marker removed first) -> transport -> check -> repair
    -> check -> completion marker (written last, only on a node whose copy matched the manifest)

A local source is listed first and hashed in the background; a node whose DST is empty lacks everything
without a lookup, and when every node is such, the data flows while the manifest is still being made and
sent (the check after waits for it).

Transports (`--strategy`), each a module of its own, taking the run's session (session.py):
  chain       the default: a pipelined relay, one tar stream extracted and forwarded by every node (chain.py).
  tree        rounds of whole-copy rsync hops: every node that has the data sends to one more (rsync_hops.py).
  parallel    every node rsyncs from the source at once.
  sequential  one node after another (the recipe's copyclust loop).
  S3 sources: every node pulls its copy itself, in parallel, with its own credentials (s3_round.py).

Whatever the transport, a node whose copy is short or wrong after it gets an rsync of just the bad
files (`-I`: size and time are not trusted) from a verified neighbour, or from the source, so a
broken link costs a re-copy of that node only. rsync keeps partial files in a private partial dir,
so a killed transfer resumes, and a re-run copies only what is missing or wrong.

Node-to-node hops use the node's own key and pinned known_hosts (StrictHostKeyChecking=yes). The
scripts a node runs are uploaded as files and every path in them is shlex-quoted.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Sequence

from clusterctl.data import chain, rsync_hops, s3_round
from clusterctl.data.lease import Leases
from clusterctl.data.outcome import SyncIncomplete, SyncReport
from clusterctl.data.session import ManifestUnreadable, SyncNode, SyncSession, Wire, mb
from clusterctl.errors import ConfigError, ExitCode
from clusterctl.node.sync import guard, scan
from clusterctl.node.sync.manifest import EXIT_INPUT, ManifestEntry, path_problem
from clusterctl.node.sync.tarstream import stream_digest

CACHE = ".clusterctl/sync-manifests"  # a leader source's manifest kept for the next run (beside WORK, not in it)


class Syncer(SyncSession):
    """The run: manifest, pre-check, transport, check, repair, check, mark (the order above)."""

    def run(self) -> SyncReport:
        self.start = time.monotonic()
        self._tmp = tempfile.TemporaryDirectory(prefix="clusterctl-sync-")
        self._background = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sync-manifest")
        self._hashed: Future[None] = Future()
        self.leases = Leases(self)
        try:
            self._run()
        except BaseException:
            self.interrupt()
            raise
        finally:
            self.leases.release()
            self._background.shutdown(wait=True, cancel_futures=True)
            self._tmp.cleanup()
        for n in self.nodes:
            if n.alive:
                n.outcome.verified = True
            self.events.finished(n.outcome)
        total = sum(e.nbytes for e in self.entries)
        files = sum(1 for e in self.entries if e.is_file)
        return SyncReport([n.outcome for n in self.nodes], total, time.monotonic() - self.start, self.strategy, files)

    def _run(self) -> None:
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="sync-ship") as ex:
            # a local source is listed while the node package goes out (the nodes need nothing of it yet)
            shipping = ex.submit(self.ship_all, self.nodes) if self.source.kind == "local" else None
            self._manifest()
            if shipping is None:
                self.ship_all(self.nodes)
            else:
                shipping.result()
        self.events.phase(f"taking the lease on {self.dst} on {len(self.live())} node(s): one sync writes there")
        self.leases.take(self.live())
        sending = self._precheck()
        for n in self.live():
            if n.is_source and n.bad:  # nothing is ever written into the source: the run is to be made again
                self.fail(n, "failed", f"DST is SRC here, changed since its manifest, e.g. {n.bad[0]!r}: run it again")
        todo = [n for n in self.live() if n.bad]
        for n in todo:
            n.outcome.bytes = n.bad_bytes
        if todo:
            if self.source.kind == "s3":  # a pull reads the manifest on its node (sizes, S3's checksums)
                sending.result()
            self._transport(todo)
            sending.result()  # the manifest every node checks against (sent while the data flowed)
            self.events.phase(
                "verifying every copy against the manifest"
                + (" (read back: --verify disk)" if self.verify == "disk" else "")
            )
            self._check_all(todo, reset=False, received=self.verify == "stream" and self.strategy == "chain")
            for attempt in range(2):
                broken = [n for n in self.live(todo) if n.bad]
                if not broken:
                    break
                for n in broken:
                    if n.last_error:
                        self.events.phase(f"{n.label}: {n.last_error}")
                        n.last_error = ""
                where = "a verified neighbour" if attempt == 0 else "the source"
                self.events.phase(f"repairing {len(broken)} node(s): the bad files only, from {where}")
                rsync_hops.repair(self, broken, from_source=attempt > 0)
                self._check_all(broken, reset=False)
            for n in self.live(todo):
                if n.bad:
                    self.fail(
                        n,
                        "failed",
                        f"{len(n.bad)} file(s) still differ from the manifest, e.g. {n.bad[0]!r}"
                        + (f" ({n.last_error})" if n.last_error else ""),
                    )
        self._cleanup()

    # ---- manifest ----------------------------------------------------------------------------------
    def _manifest(self) -> None:
        """self.entries: every path, kind and size. A local source is listed now; the last run's manifest is
        read and its changed files are hashed in the background (self._hashed), while the nodes are checked
        and, on a first sync, while the data already flows; the other sources' manifests come whole."""
        src = self.source
        if src.kind == "local":
            self.events.phase(f"listing {src.path} (sha256 of every file changed since the last run follows)")
            self.src_root = src.path
            real = os.path.realpath(src.path)  # every node on this kernel judges its DST against it
            self.src_judge = ("--src", real, "--src-id", guard.folder_id(real), "--src-boot", guard.boot_id())
            wire, keys = scan.walk(src.path)
            self.entries = [ManifestEntry.from_wire(e) for e in wire]  # no sha256 yet: _hash_local's
            self._check_paths()
            self._hashed = self._background.submit(self._hash_local, wire, keys)
            return
        else:
            self.events.phase(
                "making the manifest on the leader"
                if src.kind == "leader"
                else f"listing {src.describe()} from the leader"
            )
            r = self.ship(self.leader)
            if not r.ok:
                raise SyncIncomplete(
                    f"cannot reach the leader {self.leader.label}: {r.error}", "check the cluster", ExitCode.UNREACHABLE
                )
            if src.kind == "leader":
                leader_cache = f"{CACHE}/{hashlib.sha256(os.fsencode(src.path)).hexdigest()[:16]}.json"
                data, r = self.agent(self.leader, "manifest", "--cache", leader_cache, "--", src.path)
            else:
                args = ["s3list"] + (["--endpoint-url", self.endpoint_url] if self.endpoint_url else [])
                data, r = self.agent(self.leader, *args, "--", src.bucket, src.prefix)
            if r.exit_code is None:
                raise SyncIncomplete(
                    f"the leader {self.leader.label} is unreachable: {r.error}",
                    "check the cluster",
                    ExitCode.UNREACHABLE,
                )
            if r.exit_code != 0 or not data or "entries" not in data:
                why = (data or {}).get("error") or r.stderr.strip()[-300:] or f"exit {r.exit_code}"
                if r.exit_code == EXIT_INPUT:
                    raise ConfigError(f"SRC {src.describe()}: {why}")
                raise SyncIncomplete(
                    f"could not read SRC {src.describe()} on the leader: {why}",
                    "see the message",
                    ExitCode.REMOTE_FAILED,
                )
            try:  # one line at a time, as the leader wrote them
                self.entries = [ManifestEntry.from_wire(e) for e in data["entries"]]
            except (ManifestUnreadable, KeyError) as exc:
                raise SyncIncomplete(
                    f"the leader's manifest of {src.describe()} is unreadable: {exc}",
                    "see the message",
                    ExitCode.REMOTE_FAILED,
                ) from None
            self.src_root = data.get("root", "")
            if src.kind == "leader":  # every node judges its DST against it; on the leader DST may be SRC
                real, fid, boot = data.get("real", self.src_root), data.get("id", ""), data.get("boot", "")
                self.src_judge = ("--src", real, "--src-id", fid, "--src-boot", boot, "--src-may-be-dst")
                self._said_hashed(int(data.get("hashed", 0)))
        self._check_paths()
        self.encode_manifest()
        self._hashed.set_result(None)

    def _check_paths(self) -> None:
        for e in self.entries:
            problem = path_problem(e.path)
            if problem:
                raise ConfigError(f"SRC {self.source.describe()}: {problem}")

    def _hash_local(self, wire: list[Wire], keys: dict[str, str]) -> None:
        """(in the background) The last run's sha256 of every unchanged file taken, the others hashed, the
        manifest made whole and encoded, the cache kept."""
        cache = self.cache_dir / f"{hashlib.sha256(os.fsencode(self.src_root)).hexdigest()[:16]}.json"
        known = scan.load_scan_cache(str(cache), self.src_root)
        todo = scan.reuse_known(wire, keys, known)
        if todo:
            self.events.phase(f"hashing {len(todo)} file(s) changed since the last run, in the background")
        for i in range(0, len(todo), 256):  # a run that ends (Ctrl-C, an error) stops hashing too
            if self.pool.cancel.is_set():
                raise SyncIncomplete(
                    "stopped while the source was hashed", "run the same sync again", ExitCode.INTERRUPTED
                )
            scan.hash_files(self.src_root, todo[i : i + 256], workers=min(4, os.cpu_count() or 1))
        self.entries = [ManifestEntry.from_wire(e) for e in wire]
        try:
            if todo or len(keys) != len(known):  # else the kept manifest is still the one (not rebuilt)
                scan.save_scan_cache(str(cache), self.src_root, scan.known_after(wire, keys))
        except OSError as exc:  # only the next run's speed depends on it
            self.events.phase(f"cannot keep the manifest for the next run in {cache}: {exc.strerror}")
        self._said_hashed(len(todo))
        self.encode_manifest()

    def _said_hashed(self, hashed: int) -> None:
        files = sum(1 for e in self.entries if e.is_file)
        self.events.phase(
            f"manifest: {hashed} file(s) hashed, {files - hashed} unchanged since the last run "
            "(size, mtime, ctime and inode as then: their sha256 kept)"
        )

    def _send_manifest(self) -> None:
        """Once the manifest is whole: to every live node (gzipped JSON Lines: 9 MB for 200,000 files)."""
        self._hashed.result()

        def one(n: SyncNode) -> None:
            r = self.pool.put_one(n.target, {self.manifest_path: (self.manifest_bytes, 0o600)})
            if not r.ok:
                self.fail(n, "unreachable", r.error or "upload failed")

        self.events.phase(f"sending the manifest ({len(self.entries)} entries) to {len(self.live())} node(s)")
        self.fan(self.live(), one)

    def _precheck(self) -> Future[None]:
        """What every node lacks (n.bad), its marker removed first. A node whose DST holds nothing yet lacks
        everything: it is told so without a manifest (agent `fresh`). The others are checked against the
        whole manifest, sent first. When every node is fresh, the manifest is made and sent while the data
        flows: the returned future is done once every node has it."""
        fresh: list[SyncNode] = []

        def probe(n: SyncNode) -> None:
            delete = ["--delete"] if self.delete else []
            data, r = self.agent(n, "fresh", "--dst", self.dst, *delete, *self.src_judge)
            if r.exit_code != 0 or not data or "fresh" not in data:
                if r.exit_code == 2:
                    raise self.refused(n, data)
                self.failed_result(n, r, data, "check")
            elif data.get("source"):
                n.root, n.is_source = data["root"], True
            elif data["fresh"] and self.entries:
                n.root, n.free, n.fresh = data["root"], data["free"], True
                n.bad, n.bad_bytes = [e.path for e in self.entries], sum(e.nbytes for e in self.entries)
                if not self._lacks_space(n):
                    fresh.append(n)

        # every node judges DST before any check deletes (an empty manifest: the check marks the copy complete)
        self.fan(self.live(), probe)
        if fresh:
            self.events.phase(f"{len(fresh)} node(s) have nothing at {self.dst} yet: they get all of it")
        rest = [n for n in self.live() if n not in fresh]
        if not rest:
            return self._background.submit(self._send_manifest)
        self._send_manifest()
        self.events.phase(f"checking {len(rest)} node(s) against the manifest")
        self._check_all(rest, reset=True)
        done: Future[None] = Future()
        done.set_result(None)
        return done

    def _check_all(self, nodes: Sequence[SyncNode] | None = None, reset: bool = False, received: bool = False) -> None:
        """Check (and mark) every node's copy. With `received`, a chain node's files whose sha256 as written
        (recv, on the stream) matches the manifest are taken without being read back; a node that was fresh
        got every entry in manifest order (the chain streams the union of what the nodes lack), so the
        stream's digest alone can prove its copy (tarstream.stream_digest)."""
        total = sum(e.nbytes for e in self.entries)
        timeout = self.timeout or 600 + total / 20e6
        counts = {"streamed": 0, "reread": 0, "by_stream": 0}
        fresh = received and any(n.fresh for n in self.live(nodes))
        stream = stream_digest(self.entries) if fresh else None  # only a fresh node is given it

        def one(n: SyncNode) -> None:
            args = [
                "check",
                "--dst",
                self.dst,
                "--manifest",
                self.manifest_path,
                "--mark",
                self.source.describe(),
                "--lease",
                self.token,
                "--workers",
                "4",
            ]
            if reset:
                args.append("--reset")
            if received:
                args += ["--received", f"{self.work}/recv.json"]
                if stream and n.fresh:
                    args += ["--stream-digest", stream]
            if self.delete:
                args.append("--delete")
            data, r = self.agent(n, *args, *self.src_judge, timeout=timeout)
            if r.exit_code != 0 or not data or "bad" not in data:
                if r.exit_code == 2:
                    raise self.refused(n, data)
                self.failed_result(n, r, data, "check")
                return
            n.root, n.bad, n.bad_bytes, n.free = data["root"], data["bad"], data["bad_bytes"], data["free"]
            n.is_source = bool(data.get("source"))
            counts["streamed"] += int(data.get("streamed", 0))
            counts["reread"] += int(data.get("reread", 0))
            counts["by_stream"] += bool(data.get("by_stream"))
            if reset and self._lacks_space(n):
                return
            if not n.bad and not n.outcome.seconds:
                n.outcome.seconds = time.monotonic() - self.start
                self.events.progress(n.label, n.outcome.bytes)

        self.fan(self.live(nodes), one)
        if not reset:
            whole = f" ({counts['by_stream']} node(s) by the stream's digest)" if counts["by_stream"] else ""
            self.events.phase(
                f"verified: {counts['streamed']} file(s) by their sha256 as written{whole}, {counts['reread']} read back"
            )

    def _lacks_space(self, n: SyncNode) -> bool:
        if n.bad_bytes <= n.free:
            return False
        self.fail(n, "failed", f"not enough space at {n.root}: needs {mb(n.bad_bytes)}, has {mb(n.free)} free")
        return True

    def _cleanup(self) -> None:
        self.fan(
            self.nodes,
            lambda n: (
                self.pool.run_one(n.target, f"rm -rf -- {shlex.quote(self.work)}", timeout=30)
                if n.outcome.status != "unreachable"
                else None
            ),
        )

    # ---- transport ---------------------------------------------------------------------------------
    def _transport(self, todo: list[SyncNode]) -> None:
        for n in todo:
            self.events.need(n.label, n.bad_bytes)
        if self.source.kind == "s3":
            s3_round.pull_all(self, todo)
            return
        if self.strategy == "chain":
            union: set[str] = set()
            for n in todo:
                union.update(n.bad)
            sizes = {e.path: e.nbytes for e in self.entries}
            union_bytes = sum(sizes[p] for p in union)
            relay = [n for n in todo if n.bad_bytes * 2 >= union_bytes]  # the nearly complete get rsync instead
            if len(relay) < len(todo):
                union = set().union(*(set(n.bad) for n in relay)) if relay else set()
                union_bytes = sum(sizes[p] for p in union)
            for n in relay:
                n.outcome.bytes = union_bytes
                self.events.need(n.label, union_bytes)
            self.events.phase(f"streaming {mb(union_bytes)} down a chain of {len(relay)} node(s)")
            chain.stream(self, relay, [e.path for e in self.entries if e.path in union])
            rest = [n for n in todo if n not in relay]
            if rest:
                rsync_hops.repair(self, rest)
            return
        if self.strategy == "tree":
            rsync_hops.tree(self, todo)
        elif self.strategy == "parallel":
            self.events.phase(f"{len(todo)} rsync(s) from the source at once")
            self.fan(todo, lambda n: rsync_hops.rsync(self, None, n, n.bad))
        else:
            self.events.phase(f"{len(todo)} rsync(s) from the source, one after another")
            for n in todo:
                if n.alive:
                    rsync_hops.rsync(self, None, n, n.bad)
