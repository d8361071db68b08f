"""The network verdict among real ranks: horovodrun, gloo, 2 processes on localhost. NCCL does not run here, so
each rank writes the lines NCCL prints on a socket fallback into its own debug file (the file `capture` named),
and the job counts as spanning nodes; the rest is real: Horovod's allreduce and broadcast, the exit."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from clusterctl.node import nccl_report
from clusterctl.workloads.horovod import horovodrun_argv, scrubbed_env
from conftest import HOROVODRUN, REPO, TRAIN_PY

pytestmark = [pytest.mark.integration, pytest.mark.horovod]

SCRIPT = """
import os, sys
sys.path.insert(0, {repo!r})
from clusterctl.node import nccl_report
nccl_report.capture()
import horovod.tensorflow as real
import tensorflow as tf
real.init()

class Hvd:  # the real Horovod, with the ranks counted as on two nodes
    def __getattr__(self, name):
        return getattr(real, name)
    def local_size(self):
        return 1

pattern = os.environ["NCCL_DEBUG_FILE"]
with open(pattern.replace("%h", "host").replace("%p", str(os.getpid())), "w") as f:
    f.write({log!r})  # as NCCL 2.23.4 writes it when no EFA plugin is found
nccl_report.check(tf, Hvd(), ["GPU:0"], lambda kind, /, **f: print("EVENT", kind, f, flush=True))
print("rank", real.rank(), "went on", flush=True)
"""

SOCKET = (
    "h:1:1 [0] NCCL INFO NCCL version 2.23.4+cuda12.6\n"
    "h:1:2 [0] NCCL INFO NET/Plugin: Could not find: libnccl-net.so. Using internal network plugin.\n"
    "h:1:2 [0] NCCL INFO NET/Socket : Using [0]ens32:10.0.0.4<0>\n"
    "h:1:2 [0] NCCL INFO Using network Socket\n"
)


def _run(tmp_path, expect: dict[str, str]) -> tuple[int, str, float]:
    (tmp_path / "net.py").write_text(SCRIPT.format(repo=str(REPO), log=SOCKET))
    env = {**nccl_report.DEBUG_ENV, **expect, "PYTHONUNBUFFERED": "1"}
    argv = horovodrun_argv(2, "localhost:2", [TRAIN_PY, "net.py"], extra_env=env, horovodrun=HOROVODRUN)
    began = time.monotonic()
    proc = subprocess.run(
        argv, cwd=tmp_path, capture_output=True, text=True, timeout=240, env=scrubbed_env(dict(os.environ))
    )
    return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - began


@pytest.fixture(scope="module", autouse=True)
def _horovod(horovod_present):
    """Real horovodrun: fail loudly, never skip, when it is missing."""


def test_every_rank_stops_on_a_socket_fallback_on_an_efa_type_and_goes_on_when_allowed(tmp_path):
    code, out, seconds = _run(tmp_path, {nccl_report.EXPECT_ENV: nccl_report.EFA})
    assert code != 0 and "went on" not in out, out[-3000:]  # no rank trains on
    assert out.count("Error: NCCL 2.23.4 is not using EFA on an EFA instance type") == 1, out[-3000:]
    assert "network: NCCL 2.23.4 over sockets (TCP), 1 interface per node (EFA plugin: missing)" in out
    assert "EVENT error {'kind': 'network', 'transport': 'Socket'}" in out
    assert f"Exit code: {nccl_report.EXIT_NETWORK}" in out, out[-3000:]  # horovodrun's words for the failed rank
    assert seconds < 60, seconds  # within the first minute, no rank left waiting in a collective
    # --allow-socket-transport: launch does not ask for EFA; the line is still printed, the run goes on
    code, out, _ = _run(tmp_path, {})
    assert code == 0 and out.count("went on") == 2, out[-3000:]
    assert "network: NCCL 2.23.4 over sockets (TCP)" in out and "Error:" not in out
