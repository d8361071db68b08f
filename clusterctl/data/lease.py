"""A sync's lease on DST on every node (node/sync/lease.py): taken before anything is written there, held for
the whole run by one node-side process per node on an ssh channel kept open, with a heartbeat line every few
seconds; let go when the run ends, by Ctrl-C too (closing the channel ends that process, and the kernel drops
its lock), or on its own when this machine goes silent. A second run into the same DST is refused, naming
the first."""

from __future__ import annotations

import getpass
import json
import os
import socket
import threading
import time
from typing import IO, TYPE_CHECKING, Any

from clusterctl.errors import ClusterctlError, ConfigError
from clusterctl.node.sync.lease import EXIT_BUSY

if TYPE_CHECKING:
    from clusterctl.data.session import SyncNode, SyncSession

HEARTBEAT = 5.0  # seconds between heartbeat lines (the node lets go after node/sync/lease.HEARTBEAT_TIMEOUT)
TAKE_TIMEOUT = 60.0  # seconds for a node to say whether it took the lease
RELEASE_WAIT = 10.0  # seconds, at most, for the nodes to let go when the run ends


class DstBusy(ConfigError):
    """Another run holds DST on a node: nothing was written."""


class Leases:
    """The run's leases, one open channel per node."""

    def __init__(self, session: SyncSession):
        self.session = session
        self.holder = json.dumps(
            {"id": session.token, "user": _user(), "host": socket.gethostname(), "pid": os.getpid()}, sort_keys=True
        )
        self._channels: list[Any] = []  # paramiko channels, one per node holding (or sharing) the lease
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._refusals: list[ClusterctlError] = []
        self._beat = threading.Thread(target=self._heartbeat, name="sync-lease", daemon=True)

    def take(self, nodes: list[SyncNode]) -> None:
        """The lease on every node (an unreachable one is failed), in two steps: DST judged on every node, then
        taken on every node once none refused it. DstBusy, or a node's refusal of DST (exit 2), when one says
        no; release() lets go of the others."""
        s = self.session
        delete = ["--delete"] if s.delete else []
        command = s.py("lease", "--dst", s.dst, "--holder", self.holder, *delete, *s.src_judge)
        open_: dict[int, tuple[Any, IO[bytes]]] = {}

        def judge(n: SyncNode) -> None:
            try:
                chan = s.pool.client(n.target).get_transport().open_session(timeout=TAKE_TIMEOUT)
                with self._lock:
                    self._channels.append(chan)
                chan.settimeout(TAKE_TIMEOUT)
                chan.exec_command(command)
                out = chan.makefile("rb")
                if self._said(n, chan, out.readline(), "judged"):
                    open_[n.index] = (chan, out)
            except Exception as exc:  # unreachable, or silent for a minute
                s.fail(n, "unreachable", f"cannot take the lease on DST: {exc}"[:300])

        def lock(n: SyncNode) -> None:
            chan, out = open_[n.index]
            try:
                chan.sendall(b"take\n")
                self._said(n, chan, out.readline(), "held")
            except Exception as exc:
                s.fail(n, "unreachable", f"cannot take the lease on DST: {exc}"[:300])

        s.fan(nodes, judge)
        judged = [n for n in nodes if n.index in open_ and n.alive]
        # the first node first: two runs to the same nodes meet there, and one goes on (not both refused)
        for step in (judged[:1], judged[1:]):
            if not self._refusals:
                s.fan(step, lock)
        if not self._beat.is_alive() and not self._stop.is_set():
            self._beat.start()
        if self._refusals:
            raise self._refusals[0]

    def _said(self, n: SyncNode, chan: Any, line: bytes, want: str) -> bool:
        """Whether the node's line is `want`; else its refusal kept (busy, or DST refused) or the node failed."""
        try:
            data = json.loads(line)
        except ValueError:
            data = None
        if isinstance(data, dict) and want in data:
            return True
        data = data if isinstance(data, dict) else {}
        code = chan.recv_exit_status()
        if code == EXIT_BUSY:
            self._refusals.append(DstBusy(f"on {n.label}: {data.get('error')}", data.get("hint") or None))
        elif code == 2:
            self._refusals.append(self.session.refused(n, data))
        else:
            err = chan.recv_stderr(4096).decode(errors="replace").strip()
            why = data.get("error") or err[-200:] or f"exit {code}"
            self.session.fail(n, "failed", f"cannot take the lease on DST: {why}")
        return False

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT):
            with self._lock:
                channels = list(self._channels)
            for chan in channels:
                try:
                    chan.sendall(b"\n")
                except Exception:
                    pass  # that node's lease lapses; its check before COMPLETE says so

    def release(self) -> None:
        """Let go of every lease: each node's process sees its stdin end and exits."""
        self._stop.set()
        with self._lock:
            channels, self._channels = self._channels, []
        for chan in channels:
            try:
                chan.shutdown_write()
            except Exception:
                pass
        deadline = time.monotonic() + RELEASE_WAIT
        for chan in channels:  # gone before the run returns: a next sync right after finds DST free
            chan.status_event.wait(max(0.0, deadline - time.monotonic()))
            try:
                chan.close()
            except Exception:
                pass


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:
        return "?"
