"""horovodrun, with host keys checked.

horovodrun 0.28.1 turns host key checking off in every ssh it runs, so a node presenting a
changed key would still get the job. clusterctl launches it through this file instead: the same
horovodrun, with its ssh prefix replaced by one that checks host keys against the node's pinned
known_hosts and never prompts. The prefix is set at import time (not under __main__) because horovod
starts helper processes with multiprocessing's spawn, which re-imports this module.

An elastic job (--min-np) that cannot gather --min-np processes within --elastic-timeout ends with one
line saying so, `<CLUSTERCTL_EVENT_MARK> error kind=too_few_nodes ...`, and exit status 9 (EXIT_TOO_FEW).
"""

import os
import shlex
import sys
import threading

import horovod.runner.util.remote as _remote

_remote.SSH_COMMAND_PREFIX = (
    "ssh -o PasswordAuthentication=no -o BatchMode=yes -o StrictHostKeyChecking=yes -o ForwardAgent=no"
)

EXIT_TOO_FEW = 9
_too_few = threading.Event()
_discovered: list = []  # the hosts of the last discovery, in the script's order


def _watch_min_np() -> None:
    """Remember when the elastic driver gives up waiting for --min-np processes (horovodrun itself only
    logs it in a thread, then ends the job as if a process had failed)."""
    from horovod.runner.common.util.timeout import TimeoutException
    from horovod.runner.elastic.driver import ElasticDriver

    wait = ElasticDriver.wait_for_available_slots

    def wait_for_available_slots(self, min_num_proc, min_hosts=1):
        try:
            return wait(self, min_num_proc, min_hosts)
        except TimeoutException:
            _too_few.set()
            raise

    ElasticDriver.wait_for_available_slots = wait_for_available_slots


def _discovery_in_order() -> None:
    """Hosts in the discovery script's line order (horovodrun 0.28.1 reads them into a set): the first
    line is the leader's, so rank 0, which checkpoints into the leader's --model-dir, starts there; Horovod
    keeps the oldest hosts on the lowest ranks afterwards."""
    from horovod.runner.elastic.discovery import HostDiscoveryScript, HostManager

    def find_available_hosts_and_slots(self):
        host_slots = {}
        for line in self._execute_discovery_script().splitlines():
            host, sep, slots = line.strip().rpartition(":")
            host = host if sep else slots
            if host and host not in host_slots:
                host_slots[host] = int(slots) if sep else self._default_slots
        _discovered[:] = list(host_slots)
        return host_slots

    def order_available_hosts(available_hosts, prev_host_assignment_order):
        order = [h for h in prev_host_assignment_order if h in available_hosts]
        order += [h for h in _discovered if h in available_hosts and h not in order]
        return order + sorted(h for h in available_hosts if h not in order)

    HostDiscoveryScript.find_available_hosts_and_slots = find_available_hosts_and_slots
    HostManager.order_available_hosts = staticmethod(order_available_hosts)


def _too_few_line(argv: list) -> str:
    def flag(name: str, default: str) -> str:
        return argv[argv.index(name) + 1] if name in argv[:-1] else default

    min_np, timeout = flag("--min-np", "?"), flag("--elastic-timeout", "600")
    message = (
        f"fewer than --min-np {min_np} processes could run for {timeout} s (too few nodes answered): the job stopped "
        "(its last commit is checkpointed); bring nodes back (`clusterctl repair`) and start it again"
    )
    mark = os.environ.get("CLUSTERCTL_EVENT_MARK", "CLUSTERCTL-HOROVOD")
    return f"{mark} error kind=too_few_nodes min_np={min_np} timeout={timeout} message={shlex.quote(message)}"


if __name__ == "__main__":
    from horovod.runner.launch import run_commandline

    _watch_min_np()
    _discovery_in_order()
    try:
        run_commandline()
    except BaseException:
        if not _too_few.is_set():
            raise
    if _too_few.is_set():
        print(_too_few_line(sys.argv), flush=True)
        sys.exit(EXIT_TOO_FEW)
