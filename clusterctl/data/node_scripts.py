"""The shell scripts a node runs during a chain relay, built operator-side and uploaded as files: the relay
(extract and forward the tar stream) and, when the leader is the source, the tar into its own relay. Every
value in them is shlex-quoted."""

from __future__ import annotations

import shlex
from typing import Sequence

from clusterctl.remote import nodepkg

TAR_CHECKPOINT = 100  # records of 10240 bytes: a progress line per ~1 MB per node
MUX_IDLE = 30  # seconds a pre-connected hop's ssh master waits for its relay (and lingers after it, if killed)


def mux_path(i: int) -> str:
    """The control socket of the hop to child i, in the node's work folder ($W in the scripts)."""
    return f'"$W/mux.{i}"'


def preconnect_script(children: Sequence[str], hop: Sequence[str], work: str) -> str:
    """Every hop of this node opened at once, before the stream (an ssh master per child, its socket in the
    work folder): a relay then opens its hop as a session on it (~20 ms) instead of a key exchange and login
    (~300 ms here), and those no longer add up down a chain, one node after another. Best effort: a hop
    whose master is missing (failed, or idle past MUX_IDLE) connects directly as before."""
    q = shlex.quote
    ssh = " ".join(q(a) for a in hop)
    lines = [f'W="$HOME"/{q(work)}']
    for i, address in enumerate(children):
        lines.append(
            f"{ssh} -M -S {mux_path(i)} -o ControlPersist={MUX_IDLE} -f -N -- {q(address)} "
            f'</dev/null >/dev/null 2>>"$W/mux.err" &'
        )
    lines.append("wait; true")
    return "\n".join(lines) + "\n"


def relay_script(
    index: int,
    root: str | None,
    children: Sequence[str],  # the addresses of the nodes this one forwards to
    hop: Sequence[str],
    work: str,
    python: str = "python3",
    hash_stream: bool = True,
    mux: bool = False,
    pyz: str | None = None,  # the node package as a shell word (default: this installation's, nodepkg)
) -> bytes:
    """The relay on one node: read the tar stream on stdin, forward it to every child's relay (tee into
    their ssh; a child that dies is dropped and the rest go on), and extract it into `root`. With one
    child (a chain), the agent's zero-copy relay (tee(2)/splice(2)) stands in for tee. With hash_stream,
    the agent's recv sits before tar: it passes every byte on and hashes each file as it goes by, and its
    hashes are kept (recv.json) only when recv and tar both exited 0, for the check to trust. With mux, every
    hop's ssh goes through the master preconnect_script opened (else it connects directly)."""
    q = shlex.quote
    w = f'"$HOME"/{q(work)}'
    lines = [
        "#!/bin/bash",
        f"# clusterctl sync relay of node {index}",
        "set -u",
        f"W={w}",
        f'P={q(python)}; [ -x "$P" ] || P=python3',
        f"A={pyz or nodepkg.package().shell_path}",
    ]
    fifos = []
    for i, address in enumerate(children):
        fifo = f'"$W/fifo.{i}"'
        fifos.append(fifo)
        remote = f"bash {q(work + '/relay.sh')}"
        ssh = " ".join(q(a) for a in hop) + (f" -S {mux_path(i)}" if mux else "")
        lines.append(f"rm -f {fifo}; mkfifo -m 600 {fifo} || exit 1")
        # ssh's stdout/stderr are pipes of its own: ssh makes its fds non-blocking, which must not leak
        lines.append(f"{{ {ssh} -- {q(address)} {q(remote)} < {fifo} 2>&1 >/dev/null | cat >&2; }} &")
    ck = f"--checkpoint={TAR_CHECKPOINT}", f"--checkpoint-action=echo=CCSYNC-TAR {index} %u"
    extract = ("tar -C " + q(root) + " -xf - " + " ".join(q(c) for c in ck)) if root is not None else None
    hashing = bool(extract) and hash_stream
    if hashing:
        extract = f'"$P" "$A" sync recv --hashes "$W/recv.part" | {extract}'
        lines.append('rm -f "$W/recv.json"')  # only this stream's, whole, is ever there
    if len(fifos) == 1 and extract:
        lines.append(f'"$P" "$A" sync relay --index {index} --out {fifos[0]} | {extract}')
    elif fifos:
        lines.append(f"tee -p {' '.join(fifos)} " + (f"| {extract}" if extract else ">/dev/null"))
    else:
        lines.append(extract or "cat >/dev/null")
    lines += [
        'st=("${PIPESTATUS[@]}"); rc="${st[*]}"',
        "wait",
        *(  # the masters go with the relay (one whose relay was killed ends MUX_IDLE s later)
            f"{' '.join(q(a) for a in hop)} -S {mux_path(i)} -O exit -- {q(a)} 2>/dev/null"
            for i, a in enumerate(children)
            if mux
        ),
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
