"""The connection agent itself (remote/agent.py is its client and says what it is for): one process per
user serving fan-out requests over a Unix socket with kept SshPool connections, until it is idle, stopped,
or sent SIGTERM. Started by the client as `python -m clusterctl.remote.agent_server --socket PATH`."""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import sys
import threading
import time
from pathlib import Path
from typing import Any, BinaryIO, Sequence

from clusterctl.remote.agent import DEFAULT_IDLE, build_id, target_from_dict
from clusterctl.remote.ssh import SshPool
from clusterctl.remote.targets import SshSettings


# -------------------------------------------------------------------------------------------------------
class Agent:
    def __init__(self, path: Path, idle: float):
        self.path = path
        self.idle = idle
        self.build = build_id()
        self.pools: dict[tuple[str, float, bool], SshPool] = {}
        self.lock = threading.Lock()
        self.active = 0
        self.last = time.monotonic()
        self.stopping = threading.Event()

    def pool(self, settings: SshSettings) -> SshPool:
        key = (settings.known_hosts, settings.connect_timeout, settings.allow_agent)
        with self.lock:
            if key not in self.pools:
                self.pools[key] = SshPool(settings)
            return self.pools[key]

    def connections(self) -> int:
        with self.lock:
            pools = list(self.pools.values())
        return sum(len(p) for p in pools)

    def serve(self) -> None:
        old = os.umask(0o177)
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            srv.bind(str(self.path))
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)
        inode = self.path.stat().st_ino
        srv.listen(64)
        srv.settimeout(0.5)
        threading.Thread(target=_warm_imports, daemon=True).start()
        try:
            while not self.stopping.is_set():
                with self.lock:
                    idle = self.active == 0 and time.monotonic() - self.last > self.idle
                if idle:
                    break
                try:
                    conn, _ = srv.accept()
                except socket.timeout:
                    continue
                threading.Thread(target=self._client, args=(conn,), daemon=True).start()
        finally:
            srv.close()
            try:
                if self.path.stat().st_ino == inode:
                    self.path.unlink()
            except OSError:
                pass
            with self.lock:
                pools = list(self.pools.values())
            for p in pools:
                p.close()

    def _client(self, conn: socket.socket) -> None:
        try:
            creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            _pid, uid, _gid = struct.unpack("3i", creds)
            if uid != os.getuid():
                return
            reader = conn.makefile("rb")
            line = reader.readline()
            if not line:
                return
            req = json.loads(line)
            op = req.get("op")
            if req.get("build") != self.build:
                _send(
                    conn,
                    {
                        "event": "error",
                        "stale": True,
                        "message": "agent of another clusterctl build",
                        "pid": os.getpid(),
                    },
                )
                if op == "stop":
                    self.stopping.set()
                return
            if op == "ping":
                _send(conn, {"event": "pong", "pid": os.getpid(), "connections": self.connections(), "idle": self.idle})
            elif op == "stop":
                self.stopping.set()
                _send(conn, {"event": "stopping", "pid": os.getpid()})
            elif op == "run":  # only runs count as activity (a status query does not keep it alive)
                with self.lock:
                    self.active += 1
                try:
                    self._run(conn, reader, req)
                finally:
                    with self.lock:
                        self.active -= 1
                        self.last = time.monotonic()
            else:
                _send(conn, {"event": "error", "message": f"unknown op {op!r}"})
        except Exception as exc:  # one bad client never takes the agent down
            try:
                _send(conn, {"event": "error", "message": f"{exc.__class__.__name__}: {exc}"})
            except OSError:
                pass
        finally:
            try:
                conn.close()
            except OSError:
                pass

    def _run(self, conn: socket.socket, reader: BinaryIO, req: dict[str, Any]) -> None:
        settings = SshSettings(**req["settings"])
        targets = [target_from_dict(d) for d in req["targets"]]
        pool = self.pool(settings)
        pool.recheck_host_keys()
        cancel = threading.Event()
        send_lock = threading.Lock()

        def send(event: dict[str, Any]) -> None:
            try:
                with send_lock:
                    _send(conn, event)
            except OSError:
                cancel.set()  # the client is gone: stop its commands

        def watch() -> None:
            try:
                for line in reader:
                    if json.loads(line).get("op") == "cancel":
                        break
            except (OSError, ValueError):
                pass
            cancel.set()  # cancel, or EOF (the client exited or was killed)

        def on_line(host: str, stream: str, text: str) -> None:
            send({"event": "line", "host": host, "stream": stream, "text": text})

        threading.Thread(target=watch, daemon=True).start()
        send({"event": "started"})
        report = pool.run(
            targets,
            req["command"],
            parallel=int(req.get("parallel") or 64),
            timeout=req.get("timeout"),
            on_line=on_line,
            cancel=cancel,
        )
        for r in report:
            send({"event": "result", "result": r.to_dict()})
        send({"event": "done"})


def _send(conn: socket.socket, event: dict[str, Any]) -> None:
    conn.sendall((json.dumps(event) + "\n").encode())


def _warm_imports() -> None:
    import paramiko  # noqa: F401  (the first request does not wait for this import)


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m clusterctl.remote.agent_server", description=__doc__.splitlines()[0])
    ap.add_argument("--socket", required=True)
    ap.add_argument("--idle", type=float, default=DEFAULT_IDLE)
    args = ap.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # only `stop`, SIGTERM or the idle timeout end it
    signal.signal(signal.SIGTERM, lambda *_: agent.stopping.set())
    agent = Agent(Path(args.socket), args.idle)
    agent.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
