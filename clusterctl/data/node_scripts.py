"""The shell scripts a node runs during a chain relay, built operator-side and uploaded as files: the relay
(extract and forward the tar stream) and, when the leader is the source, the tar into its own relay. Every
value in them is shlex-quoted."""

from __future__ import annotations

import shlex
from typing import Sequence

TAR_CHECKPOINT = 100  # records of 10240 bytes: a progress line per ~1 MB per node


def relay_script(
    index: int,
    root: str | None,
    children: Sequence[str],  # the addresses of the nodes this one forwards to
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
    for i, address in enumerate(children):
        fifo = f'"$W/fifo.{i}"'
        fifos.append(fifo)
        remote = f"bash {q(work + '/relay.sh')}"
        ssh = " ".join(q(a) for a in hop)
        lines.append(f"rm -f {fifo}; mkfifo -m 600 {fifo} || exit 1")
        # ssh's stdout/stderr are pipes of its own: ssh makes its fds non-blocking, which must not leak
        lines.append(f"{{ {ssh} -- {q(address)} {q(remote)} < {fifo} 2>&1 >/dev/null | cat >&2; }} &")
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
