"""TensorBoard of the training job: started on the leader (tmux session clusterctl-tensorboard, bound to its
127.0.0.1 only) and reached through an ssh tunnel from this machine, host key checked. tensorboard_tunnel
owns both and stops both however its block is left."""

from __future__ import annotations

import contextlib
import shlex
from typing import TYPE_CHECKING, Iterator

from clusterctl.workloads.train.job import TrainJob, job_inventory

if TYPE_CHECKING:
    import subprocess

    from clusterctl.cluster.inventory import Inventory

TENSORBOARD_SESSION = "clusterctl-tensorboard"


def tensorboard_command(job: TrainJob, port: int) -> str:
    """TensorBoard on the leader, bound to 127.0.0.1 only (reached through an ssh tunnel, never a port)."""
    logdir = f"{job.model_dir}/tensorboard"
    return (
        f'exec env -i HOME="$HOME" LANG=C.UTF-8 PATH={shlex.quote(job.python.rsplit("/", 1)[0] + ":" + "/usr/bin:/bin")} '
        f"{shlex.quote(job.python)} -m tensorboard.main --logdir {shlex.quote(logdir)} --host 127.0.0.1 "
        f"--port {int(port)} 2>&1"
    )


@contextlib.contextmanager
def tensorboard_tunnel(
    inv: Inventory, job: TrainJob, local_port: int, remote_port: int = 6006, wait_s: float = 120.0
) -> Iterator[subprocess.Popen[str]]:
    """TensorBoard on the leader (tmux session clusterctl-tensorboard, 127.0.0.1 only; an existing one is
    reused) reached through an ssh tunnel 127.0.0.1:local_port -> leader's 127.0.0.1:remote_port, host key
    checked. Yields the tunnel process (subprocess.Popen). However the block is left (a failure while
    opening, Ctrl-C at any moment, the tunnel ending), the tunnel and the session are both stopped: a Ctrl-C
    that landed between starting TensorBoard and returning the tunnel once left both running."""
    _require_free(local_port)  # else the tunnel's readiness check would talk to whatever listens there
    inv = job_inventory(inv, job)
    tunnel = None
    try:
        _start_tensorboard(inv, job, remote_port, wait_s)
        tunnel = _open_tunnel(inv, local_port, remote_port)
        yield tunnel
    finally:
        _close_tensorboard(inv, tunnel)


def _require_free(port: int) -> None:
    import socket

    from clusterctl.errors import ConfigError

    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError as exc:
            raise ConfigError(
                f"local port {port} is not free on this machine ({exc.strerror})", "pick another with --port"
            ) from None


def _start_tensorboard(inv: Inventory, job: TrainJob, remote_port: int, wait_s: float) -> None:
    import time as _time

    from clusterctl.errors import RemoteCommandError
    from clusterctl.remote import tmux as jobs
    from clusterctl.remote.ssh import SshPool

    leader = inv.targets[0]
    with SshPool(inv.settings) as pool:
        r = pool.run_one(
            leader,
            jobs.detach_command(TENSORBOARD_SESSION, tensorboard_command(job, remote_port), kind="tensorboard"),
            timeout=60,
        )
        if r.exit_code not in (0, 3):  # 3: already running, reuse it
            raise RemoteCommandError(
                f"could not start TensorBoard on {leader.label}: {(r.error or r.stderr or r.stdout).strip()[-300:]}"
            )
        probe = (
            f'{shlex.quote(job.python)} -c \'import socket,sys; socket.create_connection(("127.0.0.1", '
            f"{int(remote_port)}), 2)' 2>/dev/null"
        )
        deadline = _time.monotonic() + wait_s
        alive = jobs.alive_command(TENSORBOARD_SESSION)
        while True:
            if pool.run_one(leader, probe, timeout=30).exit_code == 0:
                return
            gone = pool.run_one(leader, alive, timeout=30).stdout.strip() == "gone"
            if gone or _time.monotonic() > deadline:
                log = pool.run_one(leader, jobs.logs_command(TENSORBOARD_SESSION), timeout=30).stdout
                why = "exited" if gone else f"did not answer within {wait_s:.0f}s"
                raise RemoteCommandError(
                    f"TensorBoard {why} on {leader.label}", log.strip().splitlines()[-1][:300] if log.strip() else None
                )
            _time.sleep(1)


def _open_tunnel(inv: Inventory, local_port: int, remote_port: int) -> subprocess.Popen[str]:
    import socket
    import subprocess
    import time as _time

    from clusterctl.errors import UnreachableError
    from clusterctl.remote import openssh

    leader = inv.targets[0]
    argv = openssh.operator_ssh(leader, inv.settings.known_hosts, inv.cluster is not None)
    argv += [
        "-N",
        "-o",
        "ExitOnForwardFailure=yes",
        "-L",
        f"127.0.0.1:{int(local_port)}:127.0.0.1:{int(remote_port)}",
        leader.hostname,
    ]
    tunnel = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = _time.monotonic() + 30
        while _time.monotonic() < deadline:
            if tunnel.poll() is not None:
                why = tunnel.stderr.read().strip()[-300:] if tunnel.stderr is not None else ""
                raise UnreachableError(f"the ssh tunnel to {leader.label} failed: {why}")
            try:
                socket.create_connection(("127.0.0.1", local_port), 1).close()
                return tunnel
            except OSError:
                _time.sleep(0.2)
        raise UnreachableError(f"the ssh tunnel to {leader.label} did not open local port {local_port}")
    except BaseException:
        _end(tunnel)
        raise


def _end(tunnel: subprocess.Popen[str]) -> None:
    if tunnel.poll() is None:
        tunnel.terminate()
        try:
            tunnel.wait(5)
        except Exception:
            tunnel.kill()
            tunnel.wait()


def _close_tensorboard(inv: Inventory, tunnel: subprocess.Popen[str] | None) -> None:
    from clusterctl.errors import RemoteCommandError
    from clusterctl.remote import tmux as jobs
    from clusterctl.remote.ssh import SshPool

    if tunnel is not None:
        _end(tunnel)
    with SshPool(inv.settings) as pool:
        r = pool.run_one(inv.targets[0], jobs.kill_job_command(TENSORBOARD_SESSION, 2.0), timeout=60)
    if not r.ok:  # never leave it running silently
        raise RemoteCommandError(
            f"TensorBoard may still run on {inv.targets[0].label}: {(r.error or r.stderr or r.stdout).strip()[-200:]}",
            f"stop it: clusterctl kill {TENSORBOARD_SESSION}",
        )
