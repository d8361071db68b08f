"""`python PYZ horovodrun ARGS...`: horovodrun, with host keys checked, run with the node runtime's Python on the
node that launches a Horovod job (workloads/launch.py's leader command).

horovodrun 0.28.1 turns host key checking off in every ssh it runs, so a node presenting a changed key would
still get the job. This is the same horovodrun with its ssh prefix replaced by the node package's (ssh.PINNED:
the login user's pinned known_hosts, never a prompt). Horovod builds every ssh command line in this process
(its driver threads); the processes it spawns (multiprocessing's spawn, safe_shell_exec's middlemen) are
handed the finished command and import nothing of this module.

An elastic job (--min-np) that cannot gather --min-np processes within --elastic-timeout ends with one line
saying so, `<CLUSTERCTL_EVENT_MARK> error kind=too_few_nodes ...`, and exit status 9 (EXIT_TOO_FEW).
"""

from __future__ import annotations

import os
import shlex
import sys
import threading
from typing import Any

from clusterctl.node import ssh

EXIT_TOO_FEW = 9
SSH_PREFIX = " ".join(["ssh", *ssh.PINNED])  # horovod appends the host, port, key and ConnectTimeout


class _Launch:
    """What the patched driver saw: whether it gave up waiting for --min-np, the hosts of the last discovery."""

    def __init__(self) -> None:
        self.too_few = threading.Event()
        self.discovered: list[str] = []  # in the discovery script's order


def check_host_keys() -> None:
    """Every ssh horovodrun runs from here on checks the host's key (horovod.runner.util.remote's prefix)."""
    import horovod.runner.util.remote as remote  # the node runtime's

    remote.SSH_COMMAND_PREFIX = SSH_PREFIX


def _watch_min_np(launch: _Launch) -> None:
    """Remember when the elastic driver gives up waiting for --min-np processes (horovodrun itself only logs
    it in a thread, then ends the job as if a process had failed)."""
    from horovod.runner.common.util.timeout import TimeoutException
    from horovod.runner.elastic.driver import ElasticDriver

    wait = ElasticDriver.wait_for_available_slots

    def wait_for_available_slots(self: Any, min_num_proc: int, min_hosts: int = 1) -> Any:
        try:
            return wait(self, min_num_proc, min_hosts)
        except TimeoutException:
            launch.too_few.set()
            raise

    ElasticDriver.wait_for_available_slots = wait_for_available_slots


def _discovery_in_order(launch: _Launch) -> None:
    """Hosts in the discovery script's line order (horovodrun 0.28.1 reads them into a set): the first line is
    the leader's, so rank 0, which checkpoints into the leader's --model-dir, starts there; Horovod keeps the
    oldest hosts on the lowest ranks afterwards."""
    from horovod.runner.elastic.discovery import HostDiscoveryScript, HostManager

    def find_available_hosts_and_slots(self: Any) -> dict[str, int]:
        host_slots: dict[str, int] = {}
        for line in self._execute_discovery_script().splitlines():
            host, sep, slots = line.strip().rpartition(":")
            host = host if sep else slots
            if host and host not in host_slots:
                host_slots[host] = int(slots) if sep else self._default_slots
        launch.discovered[:] = list(host_slots)
        return host_slots

    def order_available_hosts(available_hosts: Any, prev_host_assignment_order: list[str]) -> list[str]:
        order = [h for h in prev_host_assignment_order if h in available_hosts]
        order += [h for h in launch.discovered if h in available_hosts and h not in order]
        return order + sorted(h for h in available_hosts if h not in order)

    HostDiscoveryScript.find_available_hosts_and_slots = find_available_hosts_and_slots
    HostManager.order_available_hosts = staticmethod(order_available_hosts)


def remember_gloo_build(root: str | None = None) -> None:
    """horovodrun asks whether Horovod was built with Gloo at every launch by importing each framework's extension
    in a new process: TensorFlow's import, ~3 CPU-s and seconds before any rank starts. The answer is the installed
    extensions' (`root`: Horovod's package folder): a yes is kept in the login home, keyed by their files' paths,
    sizes and times, and asked again when they change (a reinstall)."""
    import glob

    import horovod.runner.launch as launch

    if root is None:
        import horovod

        root = os.path.dirname(horovod.__file__)
    files = sorted(glob.glob(os.path.join(root, "*", "mpi_lib*.so")))
    if not files:
        return
    key = "\n".join(f"{f} {os.stat(f).st_size} {os.stat(f).st_mtime_ns}" for f in files) + "\n"
    path = os.path.expanduser("~/.clusterctl/horovod-gloo-built")
    ask = launch.gloo_built

    def gloo_built(verbose: bool = False) -> Any:
        try:
            with open(path) as f:
                if f.read() == key:
                    return True
        except OSError:
            pass
        built = ask(verbose=verbose)
        if built:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(f"{path}.{os.getpid()}", "w") as f:
                f.write(key)
            os.replace(f"{path}.{os.getpid()}", path)
        return built

    launch.gloo_built = gloo_built


def too_few_line(argv: list[str]) -> str:
    """The line an elastic job ends with when fewer than --min-np processes could run (argv: horovodrun's)."""

    def flag(name: str, default: str) -> str:
        return argv[argv.index(name) + 1] if name in argv[:-1] else default

    min_np, timeout = flag("--min-np", "?"), flag("--elastic-timeout", "600")
    message = (
        f"fewer than --min-np {min_np} processes could run for {timeout} s (too few nodes answered): the job stopped "
        "(its last commit is checkpointed); bring nodes back (`clusterctl repair`) and start it again"
    )
    mark = os.environ.get("CLUSTERCTL_EVENT_MARK", "CLUSTERCTL-HOROVOD")
    return f"{mark} error kind=too_few_nodes min_np={min_np} timeout={timeout} message={shlex.quote(message)}"


def main(argv: list[str]) -> int:
    from horovod.runner.launch import run_commandline

    sys.argv = ["horovodrun", *argv]  # horovodrun reads its own command line
    launch = _Launch()
    check_host_keys()
    remember_gloo_build()
    _watch_min_np(launch)
    _discovery_in_order(launch)
    try:
        run_commandline()
    except BaseException:
        if not launch.too_few.is_set():
            raise
    if launch.too_few.is_set():
        print(too_few_line(argv), flush=True)
        return EXIT_TOO_FEW
    return 0
