"""`python3 PYZ sync COMMAND ...`: the node side of `clusterctl sync` (standard library; boto3 only for S3).

clusterctl ships the node package (remote/nodepkg.py) to every node it syncs (and to the source, when the
source is the leader) and runs this there with arguments it quotes itself. It never receives credentials:
S3 pulls use the node's own (instance profile, or ~/.aws config). Sub-commands print one JSON object:

    manifest ROOT [--cache C]           the source's manifest (relative path, type, size, sha256); with
                                        --cache, a file whose size, mtime, ctime and inode are those of
                                        the last run keeps its sha256 (not read again)
    check --dst DST --manifest M [...]  verify DST against M; --reset removes the completion marker
                                        first; --delete removes what M does not list; --mark writes
                                        the marker, last, when everything matched; --received H takes
                                        a file whose sha256 as written (recv) matches M, and whose size
                                        and mtime are still tar's, as proved without reading it back;
                                        with --stream-digest D too, a DST that was empty and whose stream
                                        had D as its digest (recv) is whole without a lookup (below)
    fresh --dst DST                     whether DST holds nothing yet (then its marker goes; see cmd_fresh)
    lease --dst DST --holder JSON       the run's lease on DST (lease.py): one JSON line ({held} or {error}:
                                        exit 4, another run holds it), then held until stdin ends or is
                                        silent for --heartbeat-timeout seconds; check --lease ID marks
                                        COMPLETE only while run ID holds it
    check and fresh first resolve DST on the node (realpath) and refuse it (exit 2, nothing touched): a
                                        system folder, the home, clusterctl's own folders; with --src S
                                        --src-id DEV:INO --src-boot B (the source folder resolved where
                                        it is), a DST that holds SRC, lies inside it, or is SRC unless
                                        --src-may-be-dst (then only checked: no data written or deleted)
    recv --hashes H                     stdin to stdout (into tar -x) unchanged, hashing every tar
                                        member's bytes on the way: H gets a first line {stream, files,
                                        bytes}, then {path: [sha256, size, mtime]}
    relay --out FIFO [--index I]        stdin to stdout and FIFO at once (the chain's zero-copy tee)
    probe --hop SSH --remote CMD [--seconds S] -- ADDRESS...   the fan-out probe (sync --fanout auto):
                                        a stream of throwaway bytes to every ADDRESS at once, through
                                        the chain's own ssh (SSH: its argv as JSON) into CMD there (sink),
                                        for S seconds; each stream's bytes and seconds as the sink saw them
    sink                                the probe's receiver: "ready", then stdin read and thrown away,
                                        then {bytes, seconds} from its first read to its last
    s3list BUCKET PREFIX                a manifest made from the bucket's listing (size, ETag/SHA256)
    s3pull --dst DST --manifest M --bucket B --prefix P --only LIST [--record]   pull the listed objects,
                                        each checked against S3's checksum (MD5 ETag, ChecksumSHA256) or
                                        the sha256 in M; where S3 gives nothing checkable (SSE-KMS, a
                                        multipart ETag of unknown part size) --record takes the object as
                                        pulled and returns its streamed sha256 ("recorded"), else it fails

A manifest is JSON Lines (read one line at a time: 1.28M entries never become one document): a header
{"v": 2, "source": ...}, then one entry per line, a compact dict whose one-letter keys ManifestEntry
documents (the one place they are written down); its digest is the sha256 of the file's bytes. Paths
are relative, '/'-separated, never absolute, never with '.' or '..' components: a manifest that has one
is refused (exit 3) at that line, before anything is deleted. manifest and s3list write the same lines
into --out after a first line with their other results and "lines": the number of entries.

The stream's digest (stream_digest, recv) is the sha256 of one record per tar member, in stream order:
kind, path, then a file's size and sha256 or a link's target, every field NUL-ended (no path holds a
NUL: one way to read any record). The operator makes it from the manifest's entries in the order it
streamed them; when recv's is the same, the stream carried exactly the manifest, and tar, which exited 0,
wrote it all into a DST that held nothing: the copy is proved without reading the manifest on the node
or looking up 200,000 files. Any difference falls back to the entry-by-entry check.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Callable, NoReturn

from clusterctl.node.sync.manifest import EXIT_FAILED, AgentError, Args, Wire, write_lines


def _command(cmd: str) -> Callable[[Args], Any]:
    """The command's function, its module imported only now: a node starts this program for every step of a
    sync (relay and recv once per node per stream), and nothing in a zipapp is ever compiled ahead, so each
    start compiles what it imports (every command's modules: ~110 ms of CPU a start; relay's alone: ~60)."""
    if cmd in ("check", "fresh"):
        from clusterctl.node.sync import check

        return check.cmd_check if cmd == "check" else check.cmd_fresh
    if cmd in ("relay", "sink", "probe"):
        from clusterctl.node.sync import relay

        return {"relay": relay.cmd_relay, "sink": relay.cmd_sink, "probe": relay.cmd_probe}[cmd]
    if cmd in ("s3list", "s3pull"):
        from clusterctl.node.sync import s3pull

        return s3pull.cmd_s3list if cmd == "s3list" else s3pull.cmd_s3pull
    if cmd == "lease":
        from clusterctl.node.sync.lease import cmd_lease

        return cmd_lease
    if cmd == "recv":
        from clusterctl.node.sync.tarstream import cmd_recv

        return cmd_recv
    from clusterctl.node.sync.scan import cmd_manifest

    return cmd_manifest


# ---- main -------------------------------------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one JSON error and exit 2 (main's), not argparse's usage text and exit
        raise AgentError(message, 2)


SRC_OPTIONS = ("--src", "--src-id", "--src-boot")  # check, fresh: the source folder DST is judged against


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="sync", add_help=False)
    sub = parser.add_subparsers(dest="cmd", parser_class=_Parser)
    sub.required = True
    commands: dict[str, tuple[list[tuple[str, ...]], list[str], list[str]]] = {  # positional (name, nargs?)
        "manifest": ([("root",)], ["--workers", "--cache", "--out"], []),
        "check": (
            [],
            [
                "--dst",
                "--manifest",
                "--mark",
                "--lease",
                "--workers",
                "--received",
                "--stream-digest",
                "--out",
                *SRC_OPTIONS,
            ],
            ["--reset", "--delete", "--src-may-be-dst"],
        ),
        "fresh": ([], ["--dst", "--out", *SRC_OPTIONS], ["--delete", "--src-may-be-dst"]),
        "lease": ([], ["--dst", "--holder", "--heartbeat-timeout", *SRC_OPTIONS], ["--delete", "--src-may-be-dst"]),
        "s3list": ([("bucket",), ("prefix",)], ["--endpoint-url", "--out"], []),
        "s3pull": (
            [],
            ["--dst", "--manifest", "--bucket", "--prefix", "--only", "--endpoint-url", "--workers", "--out"],
            ["--record"],
        ),
        "relay": ([], ["--out", "--index"], []),
        "recv": ([], ["--hashes"], []),
        "probe": ([("addresses", "+")], ["--hop", "--remote", "--seconds", "--out"], []),
        "sink": ([], [], []),
    }
    for name, (positional, options, flags) in commands.items():
        p = sub.add_parser(name, add_help=False)
        for dest, *nargs in positional:
            p.add_argument(dest, nargs=nargs[0] if nargs else None)
        for opt in options:
            p.add_argument(
                opt,
                required=opt in ("--dst", "--manifest", "--hashes", "--hop", "--remote")
                or (name == "relay" and opt == "--out")
                or (name == "s3pull" and opt in ("--bucket", "--prefix", "--only")),
            )
        for flag in flags:
            p.add_argument(flag, action="store_true")
    return parser


def parse(argv: list[str]) -> tuple[str, Args]:
    """(command, its arguments). Values are taken whole, even when they start with '-' (a DST such as
    `-data`): every value option is joined to its value (`--dst=-data`) before argparse sees it, and
    positional values follow `--`."""
    if not argv:
        raise AgentError("no command", 2)
    takes_value = {
        "--workers",
        "--cache",
        "--out",
        "--dst",
        "--manifest",
        "--mark",
        "--lease",
        "--holder",
        "--heartbeat-timeout",
        "--received",
        "--stream-digest",
        "--endpoint-url",
        "--bucket",
        "--prefix",
        "--only",
        "--index",
        "--hashes",
        "--hop",
        "--remote",
        "--seconds",
        *SRC_OPTIONS,
    }
    joined, i = [], 0
    while i < len(argv):
        if argv[i] == "--":
            joined += argv[i:]
            break
        if argv[i] in takes_value and i + 1 < len(argv):
            joined.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
            continue
        joined.append(argv[i])
        i += 1
    ns = vars(_parser().parse_args(joined))
    cmd = ns.pop("cmd")
    return cmd, {k: v for k, v in ns.items() if v is not None and v is not False}


def main(argv: list[str]) -> int:
    args: Args = {}
    try:
        cmd, args = parse(argv)
        if cmd == "lease":
            return _lease(_command(cmd), args)
        if cmd in ("relay", "recv", "sink"):
            return _stream(_command(cmd), args)
        result = _command(cmd)(args)
        _emit(result, args.get("out"))
        return 0
    except AgentError as exc:
        _emit({"error": str(exc), **({"hint": exc.hint} if exc.hint else {})}, args.get("out"))
        return exc.code
    except OSError as exc:
        _emit({"error": f"{exc.strerror or exc}: {exc.filename or ''}".strip()}, args.get("out"))
        return EXIT_FAILED


def _lease(cmd_lease: Callable[[Args], Any], args: Args) -> int:
    """lease says its result (or refusal) on stdout as it is taken, then holds it: nothing more to print."""
    try:
        cmd_lease(args)
        return 0
    except AgentError as exc:
        return exc.code
    except OSError as exc:
        sys.stdout.write(json.dumps({"error": f"{exc.strerror or exc}: {exc.filename or ''}".strip()}) + "\n")
        return EXIT_FAILED


def _stream(fn: Callable[[Args], None | Wire], args: Args) -> int:
    """relay, recv and sink: stdout is the data (and relay's --out a fifo; sink's the probe's lines), so a
    failure is said on stderr."""
    try:
        fn(args)
        return 0
    except (AgentError, OSError) as exc:
        sys.stderr.write(f"clusterctl sync {fn.__name__[4:]}: {exc}\n")
        return getattr(exc, "code", EXIT_FAILED)


def _emit(result: Wire, out: str | None) -> None:
    """The result as one JSON line on stdout, or, with --out, into that file (fetched by SFTP: no cap on
    its size, where the ssh output of a command keeps only its last MiBs) and a short line on stdout.
    Into --out, a result's "entries" (manifest, s3list) go one per line after the first line, which
    says how many ("lines"): the operator reads them one at a time too."""
    if out:
        os.makedirs(os.path.dirname(out) or ".", mode=0o700, exist_ok=True)  # a run's work folder, first used here
        entries = result.get("entries")
        if entries is None:
            write_lines(out, result, ())
        else:
            head = {k: v for k, v in result.items() if k != "entries"}
            write_lines(out, {**head, "lines": len(entries)}, entries)
        result = {"out": out, **{k: result[k] for k in ("error", "hint") if k in result}}
    sys.stdout.write(json.dumps(result, ensure_ascii=True) + "\n")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
