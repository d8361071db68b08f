"""The S3 round: every node pulls its own copy from s3://bucket/prefix, in parallel, with its own credentials
(the node package's `sync s3pull`), and the sha256 of objects S3 gives no checkable checksum for is taken from the
first node that pulled them."""

from __future__ import annotations

import re

from clusterctl.data.session import SyncNode, SyncSession
from clusterctl.node.sync.manifest import EXIT_INPUT


def pull_all(s: SyncSession, nodes: list[SyncNode]) -> None:
    """Every node pulls its own copy, all at once. Objects S3 gives no checkable checksum for (SSE-KMS, a
    multipart ETag of unknown part size) are taken as pulled (--record) and their streamed sha256 returned;
    the first node in host order that pulled one gives the sha256 that goes into the manifest, and every
    node's copy is then checked against it (the check after the pulls; a copy that differs is repaired)."""
    nodes = s.live(nodes)
    if not nodes:
        return
    s.events.phase(f"{len(nodes)} node(s) pulling from {s.source.describe()} at once")
    recorded: dict[int, dict[str, str]] = {}

    def one(n: SyncNode) -> None:
        got = _pull(s, n, record=True)
        if got:
            recorded[n.index] = got

    s.fan(nodes, one)
    reference: dict[str, tuple[str, str]] = {}
    for n in sorted(nodes, key=lambda x: x.index):
        for path, digest in recorded.get(n.index, {}).items():
            reference.setdefault(path, (digest, n.label))
    if reference:
        _adopt_recorded(s, reference)


def _adopt_recorded(s: SyncSession, reference: dict[str, tuple[str, str]]) -> None:
    adopted: dict[str, str] = {}
    for i, e in enumerate(s.entries):
        if e.path in reference and e.sha256 is None and not e.sha256b64:
            digest, adopted[e.path] = reference[e.path]
            s.entries[i] = e._replace(sha256=digest)
    if not adopted:
        return
    s.encode_manifest()
    by = ", ".join(sorted(set(adopted.values())))
    s.events.phase(
        f"{len(adopted)} object(s) have no checksum S3 vouches for (SSE-KMS, or a multipart ETag "
        f"of unknown part size): their sha256 as pulled by {by} is recorded, and every other "
        "node's copy is checked against it"
    )

    def put(n: SyncNode) -> None:
        r = s.pool.put_one(n.target, {s.manifest_path: (s.manifest_bytes, 0o600)})
        if not r.ok:
            s.fail(n, "unreachable", r.error or "upload failed")

    s.fan(s.live(), put)


def _pull(s: SyncSession, n: SyncNode, record: bool = False) -> dict[str, str] | None:
    """Pull n's bad objects; with `record`, what it recorded (None when the pull did not succeed)."""
    r = s.pool.put_one(n.target, {f"{s.work}/s3.list": (s.write_list(n.bad), 0o600)})
    if not r.ok:
        s.fail(n, "unreachable", r.error or "upload failed")
        return None
    args = [
        "s3pull",
        "--dst",
        s.dst,
        "--manifest",
        s.manifest_path,
        "--bucket",
        s.source.bucket,
        "--prefix",
        s.source.prefix,
        "--only",
        f"{s.work}/s3.list",
    ]
    if s.endpoint_url:
        args += ["--endpoint-url", s.endpoint_url]
    if record:
        args.append("--record")

    def on_line(_h: str, stream: str, line: str) -> None:
        m = re.match(r"CCSYNC-BYTES (\d+)", line)
        if m:
            s.events.progress(n.label, min(int(m.group(1)), n.outcome.bytes))

    data, r = s.agent(n, *args, timeout=s.timeout, on_line=on_line)
    if r.exit_code is None:
        s.fail(n, "unreachable", r.error or "unreachable")
    elif r.exit_code == EXIT_INPUT:
        s.failed_result(n, r, data, "s3")
    elif r.exit_code != 0:  # the check that follows finds what is missing; the node is retried
        n.last_error = "s3: " + str((data or {}).get("error") or r.stderr.strip()[-200:])
        s.events.phase(f"{n.label}: {n.last_error} (will retry what is missing)")
    else:
        return dict((data or {}).get("recorded") or {})
    return None
