"""One sync's state, shared by its phases (sync.py) and its transports (chain.py, rsync_hops.py, s3_round.py):
the options checked, the nodes with what each lacks, and the helpers they all use: the agent (node/sync/,
`python3 PYZ sync ...`) run on a node with its JSON result fetched by SFTP, a node's failure recorded once, a bounded fan-out that
Ctrl-C stops."""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import shlex
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Callable, Iterator, Protocol, Sequence, TypeVar

from clusterctl.data.outcome import CopyStatus, Events, NodeOutcome, Silent
from clusterctl.data.pipes import Children
from clusterctl.data.plan import STRATEGIES, Source, check_dst
from clusterctl.errors import UsageError
from clusterctl.hostsfile import HostsFile
from clusterctl.node.sync.manifest import ManifestEntry, manifest_header
from clusterctl.remote import nodepkg
from clusterctl.remote.ssh import SshPool
from clusterctl.remote.targets import SshSettings, SshTarget
from clusterctl.types import Cluster, HostResult

Wire = dict[str, Any]  # one JSON object as the node agent writes it (its keys: node/sync/manifest.py)

_T = TypeVar("_T")
_S = TypeVar("_S", bound="SyncSession")

STALL_TIMEOUT = 120.0  # sync --stall-timeout: seconds a chain may move no data before the node that stopped is cut out
WORK = ".clusterctl/sync"  # under the login home of every node
MANIFEST = (
    "manifest.jsonl.gz"  # in the run's work folder on every node: JSON Lines (node/sync/manifest.py ManifestReader)
)
VERIFY = ("stream", "disk")  # sync --verify: the chain's hashes as written, or every file read back


@dataclass
class SyncNode:
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
    fresh: bool = False  # DST held nothing before this run (agent `fresh`): it lacked every entry
    is_source: bool = False  # DST is SRC itself here (a leader source): checked, no data written

    @property
    def label(self) -> str:
        return self.target.label


class Reach(Protocol):
    """The nodes a run goes to, as cluster/inventory.Inventory holds them (named by shape: that module sits
    above this one)."""

    @property
    def hosts(self) -> HostsFile: ...
    @property
    def targets(self) -> Sequence[SshTarget]: ...
    @property
    def settings(self) -> SshSettings: ...
    @property
    def cluster(self) -> Cluster | None: ...


class SyncSession:
    """One sync's options, nodes and state, and the helpers every phase and transport uses (the agent on a
    node, uploads, failures, a bounded fan-out). Syncer runs it; the transports take it."""

    @classmethod
    def over(cls: type[_S], reach: Reach, pool: SshPool, source: Source, dst: str, **options: Any) -> _S:
        """A run to an inventory's nodes: its targets at their hosts-file addresses, its trusted host keys,
        and between nodes the cluster's own key and known_hosts when the hosts are a cluster's."""
        addresses = [e.address for e in reach.hosts.entries]
        managed = reach.cluster is not None
        return cls(reach.targets, addresses, reach.settings.known_hosts, pool, source, dst, managed=managed, **options)

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
        fanout: int | None = 1,  # None: --fanout auto, chosen by the probe (probe.py) when the chain starts
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
        if fanout is not None and fanout < 1:
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
        self.events = events or Silent()
        self.python = node_python or "python3"  # the record's runtime Python where the caller has one
        self.timeout = timeout
        self.stall_timeout = stall_timeout
        self.verify = verify
        if cache_dir is None:
            from clusterctl import state

            cache_dir = state.home() / "sync-manifests"
        # what the next run reuses (the operator's state folder): a local source's manifest, a hop's rate (probe)
        self.cache_dir = cache_dir
        self.token = uuid.uuid4().hex[:12]
        self.work = f"{WORK}/{self.token}"
        self.manifest_path = f"{self.work}/{MANIFEST}"
        self.package = nodepkg.package()  # what every node runs its side of the sync from
        self.nodes = [SyncNode(i, t, a, NodeOutcome(t.label)) for i, (t, a) in enumerate(zip(targets, addresses))]
        self.start = 0.0
        self.entries: list[ManifestEntry] = []  # read from the wire once (node/sync/manifest.py ManifestEntry)
        self.manifest_bytes = b""
        self.src_root = ""  # the source folder, resolved where it is
        self.src_judge: tuple[str, ...] = ()  # the agent's --src options: every node judges DST against SRC
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self.children = Children()

    @property
    def leader(self) -> SyncNode:
        return self.nodes[0]

    def py(self, *args: str) -> str:
        """A shell command running `sync ARGS` of the node package (ship() put it there) with the node's Python."""
        py = shlex.quote(self.python)
        return f'P={py}; [ -x "$P" ] || P=python3; "$P" {self.package.shell_path} sync ' + " ".join(
            shlex.quote(a) for a in args
        )

    def ship(self, node: SyncNode) -> HostResult:
        """The node package onto the node, unless it has it already."""
        return nodepkg.ship_one(self.pool, node.target, self.package)

    def ship_all(self, nodes: Sequence[SyncNode]) -> None:
        """The node package onto every node that lacks it, one session each, all at once; a node it could not
        be put on is failed."""

        def one(n: SyncNode) -> None:
            r = self.ship(n)
            if not r.ok:
                self.fail(n, "unreachable", r.error or "upload failed")

        self.fan(nodes, one)

    def agent(
        self,
        node: SyncNode,
        *args: str,
        timeout: float | None = None,
        on_line: Callable[[str, str, str], None] | None = None,
    ) -> tuple[Wire | None, HostResult]:
        out = f"{self.work}/out-{uuid.uuid4().hex[:8]}.json"  # the result comes back by SFTP: no output cap
        r = self.pool.run_one(node.target, self.py(args[0], "--out", out, *args[1:]), timeout=timeout, on_line=on_line)
        data = None
        for line in reversed(r.stdout.strip().splitlines()):
            try:
                data = json.loads(line)
                break
            except ValueError:
                continue
        if isinstance(data, dict) and data.get("out") == out:
            try:
                local = self.fetch(node, out)
            except OSError as exc:
                return {"error": f"cannot read the agent's result {out}: {exc}"}, r
            try:
                data = json.loads(local.readline())
            except ValueError as exc:
                data = {"error": f"cannot read the agent's result {out}: {exc}"}
            if isinstance(data, dict) and "lines" in data:  # manifest, s3list: one entry a line follows
                data["entries"] = _entry_lines(local, int(data["lines"]), f"{node.label}:{out}")
            else:
                local.close()
        return data, r

    def fetch(self, node: SyncNode, path: str) -> IO[bytes]:
        """A file of the node (relative to the login home) by SFTP into a local temporary file (read from
        its start; gone once closed), then removed there."""
        client = self.pool.client(node.target)
        sftp = client.open_sftp()
        local = tempfile.TemporaryFile()
        try:
            sftp.getfo(path, local)
            sftp.remove(path)
            local.seek(0)
            return local
        except BaseException:
            local.close()
            raise
        finally:
            sftp.close()

    def refused(self, node: SyncNode, data: Wire | None) -> UsageError:
        """The agent's refusal of DST on a node (exit 2), as one line naming the node."""
        why = (data or {}).get("error") or f"refusing to sync into {self.dst}"
        return UsageError(f"on {node.label}: {why}", (data or {}).get("hint") or None)

    def fail(self, node: SyncNode, status: CopyStatus, detail: str) -> None:
        if node.outcome.status == "ok" or status == "unreachable":
            node.outcome.status = status
            node.outcome.detail = " ".join(detail.split())[:300]
        node.outcome.seconds = time.monotonic() - self.start
        node.alive = False

    def failed_result(self, node: SyncNode, r: HostResult, data: Wire | None, what: str) -> None:
        if r.exit_code is None:
            self.fail(node, "unreachable", r.error or "unreachable")
        else:
            why = (data or {}).get("error") or r.stderr.strip()[-200:] or f"exit {r.exit_code}"
            self.fail(node, "failed", f"{what}: {why}")

    @property
    def scratch(self) -> Path:
        """This machine's scratch folder for the run (lists, ssh wrappers): run() makes it."""
        assert self._tmp is not None, "outside run()"
        return Path(self._tmp.name)

    def live(self, nodes: Sequence[SyncNode] | None = None) -> list[SyncNode]:
        return [n for n in (self.nodes if nodes is None else nodes) if n.alive]

    def fan(self, items: Sequence[_T], fn: Callable[[_T], object], parallel: int = 64) -> None:
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

    def encode_manifest(self) -> None:
        """The manifest as the nodes read it, from the typed entries: JSON Lines, a header then one wire
        dict a line, written line by line (never one document; ManifestEntry.line), gzipped (level 1: 24 MB of
        200,000 lines is 9 MB, in 0.1 s). Kept as bytes: every node is sent them."""
        buf = io.BytesIO()
        with gzip.GzipFile(fileobj=buf, mode="wb", compresslevel=1, mtime=0) as z:
            z.write(manifest_header(self.source.describe()))
            for i in range(0, len(self.entries), 4096):  # a write per line costs more than the zlib work
                z.write(b"".join(e.line() for e in self.entries[i : i + 4096]))
        self.manifest_bytes = buf.getvalue()

    def write_list(self, paths: Sequence[str]) -> bytes:
        return b"".join(os.fsencode(p) + b"\0" for p in paths)


class ManifestUnreadable(Exception):
    pass


def _entry_lines(f: IO[bytes], count: int, where: str) -> Iterator[Wire]:
    """The wire dicts of an agent's result file, parsed one line at a time; the file is closed at the end.
    Fewer lines than the header said (a result cut short) or one that is not a JSON object: ManifestUnreadable."""
    with f:
        n = 0
        for line in f:
            try:
                e = json.loads(line)
            except ValueError:
                e = None
            if not isinstance(e, dict):
                raise ManifestUnreadable(f"{where}: line {n + 2} is not a JSON object")
            n += 1
            yield e
        if n != count:
            raise ManifestUnreadable(f"{where}: {n} entries, the first line said {count}")


def mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"
