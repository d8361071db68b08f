"""NCCL's report of its network, read from its NCCL_DEBUG=INFO lines as NCCL and aws-ofi-nccl print them (the
format strings of NCCL 2.16.5-2.30.7's src/debug.cc, init.cc, net.cc / plugin/*.cc, transport/net_socket.cc and
aws-ofi-nccl 1.7-1.19's nccl_ofi_net.c(pp)), the one `network:` line, and the verdict on an EFA type."""

from __future__ import annotations

import os

import pytest

from clusterctl.node import nccl_report as nr

H = "ip-10-0-0-4:23817:23817 [0]"  # NCCL's prefix: host:pid:tid [cuda device]
T = "ip-10-0-0-4:23817:23901 [0]"  # the same process, its init thread

EFA_4 = f"""{H} NCCL INFO Bootstrap : Using ens32:10.0.0.4<0>
{H} NCCL INFO NCCL version 2.30.7+cuda12.9
{T} NCCL INFO NET/OFI Initializing aws-ofi-nccl 1.19.0
{T} NCCL INFO NET/OFI Using Libfabric version 2.1
{T} NCCL INFO NET/OFI Using CUDA driver version 12080 with runtime 12090
{T} NCCL INFO NET/OFI Selected provider is efa, fabric is efa-direct (found 4 nics)
{T} NCCL INFO Successfully loaded external network plugin /opt/amazon/ofi-nccl/lib/libnccl-net.so
{T} NCCL INFO Initialized NET plugin Libfabric
{T} NCCL INFO Assigned NET plugin Libfabric to comm
{T} NCCL INFO Using network Libfabric
{T} NCCL INFO comm 0x55d0c8a0 rank 0 nRanks 16 nNodes 2 localRanks 8 localRank 0 MNNVL 0
"""

# An older pair (NCCL 2.18.3, aws-ofi-nccl 1.7.4), on a type with one EFA, as horovodrun tags rank 0's output.
EFA_1 = "\n".join(
    f"[1,0]<stdout>:{line}"
    for line in (
        f"{H} NCCL INFO NCCL version 2.18.3+cuda12.2",
        f"{T} NCCL INFO NET/Plugin: Failed to find ncclNetPlugin_v7 symbol.",
        f"{T} NCCL INFO NET/Plugin: Loaded net plugin AWS Libfabric (v6)",
        f"{T} NCCL INFO NET/OFI Selected Provider is efa (found 1 nics)",
        f"{T} NCCL INFO Using network AWS Libfabric",
    )
)

# NCCL 2.23.4 where no plugin is on the library path: the socket transport on one interface.
SOCKET = f"""{H} NCCL INFO NCCL version 2.23.4+cuda12.6
{T} NCCL INFO NET/Plugin: Could not find: libnccl-net.so. Using internal network plugin.
{T} NCCL INFO NET/IB : No device found.
{T} NCCL INFO NET/Socket : Using [0]ens32:10.0.0.4<0>
{T} NCCL INFO Using network Socket
"""

# TensorFlow's NCCL 2.16.5 with a plugin that offers none of the API versions it knows (v4-v6).
MISMATCH = f"""{H} NCCL INFO NCCL version 2.16.5+cuda11.8
{T} NCCL INFO NET/Plugin: Failed to find ncclNetPlugin_v6 symbol.
{T} NCCL INFO NET/Plugin: Failed to find ncclNetPlugin symbol (v4 or v5).
{T} NCCL INFO NET/IB : No device found.
{T} NCCL INFO NET/Socket : Using [0]ens32:10.0.0.4<0> [1]ens65:10.0.1.4<0>
{T} NCCL INFO Using network Socket
"""

# NCCL 2.30.7's words for the same (its plugin loader names the library it rejected).
MISMATCH_NEW = f"""{H} NCCL INFO NCCL version 2.30.7+cuda12.9
{T} NCCL INFO External network plugin /opt/amazon/ofi-nccl/lib/libnccl-net.so is unsupported
{T} NCCL INFO NET/Socket : Using [0]ens32:10.0.0.4<0>
{T} NCCL INFO Using network Socket
"""

# NCCL 2.16.5 alone (no plugin anywhere): its own words for it.
NO_PLUGIN = f"""{H} NCCL INFO NCCL version 2.16.5+cuda11.8
{T} NCCL INFO NET/Plugin : No plugin found (libnccl-net.so), using internal implementation
{T} NCCL INFO NET/IB : No device found.
{T} NCCL INFO NET/Socket : Using [0]ens32:10.0.0.4<0>
{T} NCCL INFO Using network Socket
"""

# The plugin loads, but libfabric finds no EFA device and offers TCP.
OFI_TCP = f"""{H} NCCL INFO NCCL version 2.30.7+cuda12.9
{T} NCCL INFO NET/OFI Selected provider is tcp, fabric is 10.0.0.0/24 (found 1 nics)
{T} NCCL INFO Successfully loaded external network plugin /opt/amazon/ofi-nccl/lib/libnccl-net.so
{T} NCCL INFO Using network Libfabric
"""


@pytest.mark.parametrize(
    "log, version, transport, nics, plugin, line",
    [
        (EFA_4, "2.30.7", "EFA", 4, nr.PLUGIN_LOADED, "network: NCCL 2.30.7 over EFA, 4 NICs per node"),
        (EFA_1, "2.18.3", "EFA", 1, nr.PLUGIN_LOADED, "network: NCCL 2.18.3 over EFA, 1 NIC per node"),
        (SOCKET, "2.23.4", "Socket", 1, nr.PLUGIN_MISSING, "network: NCCL 2.23.4 over sockets (TCP), 1 interface "
         "per node (EFA plugin: missing)"),
        (MISMATCH, "2.16.5", "Socket", 2, nr.PLUGIN_UNSUPPORTED, "network: NCCL 2.16.5 over sockets (TCP), "
         "2 interfaces per node (EFA plugin: version mismatch)"),
        (MISMATCH_NEW, "2.30.7", "Socket", 1, nr.PLUGIN_UNSUPPORTED, "network: NCCL 2.30.7 over sockets (TCP), "
         "1 interface per node (EFA plugin: version mismatch)"),
        (NO_PLUGIN, "2.16.5", "Socket", 1, nr.PLUGIN_MISSING, "network: NCCL 2.16.5 over sockets (TCP), "
         "1 interface per node (EFA plugin: missing)"),
        (OFI_TCP, "2.30.7", "OFI/tcp", 1, nr.PLUGIN_LOADED, "network: NCCL 2.30.7 over libfabric's tcp provider, "
         "1 NIC per node"),
    ],
)  # fmt: skip
def test_each_report_as_nccl_prints_it_gives_its_network_line(log, version, transport, nics, plugin, line):
    r = nr.parse(log.splitlines())
    assert (r.version, r.transport, r.nics, r.plugin) == (version, transport, nics, plugin)
    assert r.line() == line


def test_on_an_efa_type_only_efa_passes_and_each_fallback_names_its_cause_and_fix():
    assert nr.refusal(nr.parse(EFA_4.splitlines()), efa_expected=True) == ""
    assert nr.refusal(nr.parse(EFA_1.splitlines()), efa_expected=True) == ""
    causes = {
        SOCKET: ("found no EFA plugin", "Deep Learning Base AMI"),
        NO_PLUGIN: ("found no EFA plugin", "/opt/amazon/ofi-nccl/lib"),
        MISMATCH: ("does not support NCCL 2.16.5", "NCCL is 2.17.1 or newer"),
        MISMATCH_NEW: ("does not support NCCL 2.30.7", "2.17.1 or newer"),
        OFI_TCP: ("chose libfabric's tcp provider", "fi_info -p efa"),
        "": ("printed no report", "NCCL_DEBUG"),
    }
    for log, (cause, fix) in causes.items():
        why = nr.refusal(nr.parse(log.splitlines()), efa_expected=True)
        assert why.startswith("NCCL ") and "is not using EFA on an EFA instance type" in why, why
        assert cause in why and "Fix: " in why and fix in why and nr.ALLOW_FLAG in why, why
        assert "\n" not in why
    # NCCL's own line is quoted, so the log need not be read to see it
    assert "(NCCL: NET/Plugin: Failed to find ncclNetPlugin symbol (v4 or v5).)" in nr.refusal(
        nr.parse(MISMATCH.splitlines()), efa_expected=True
    )
    # Where the nodes have no EFA, sockets are what there is: nothing refused.
    for log in (SOCKET, MISMATCH, NO_PLUGIN, ""):
        assert nr.refusal(nr.parse(log.splitlines()), efa_expected=False) == ""


def test_the_debug_file_is_this_processes_own(tmp_path):
    env = {"NCCL_DEBUG": "INFO"}
    nr.capture(env, str(tmp_path))
    assert env["NCCL_DEBUG_FILE"] == f"{tmp_path}/nccl-debug.%h.%p.log"
    (tmp_path / "nccl-debug.ip-10-0-0-4.23817.log").write_text(EFA_4)
    (tmp_path / "nccl-debug.ip-10-0-0-4.23818.log").write_text(SOCKET)  # another rank of the node
    assert nr.parse(nr.own_lines(env, pid=23817)).transport == "EFA"
    assert nr.parse(nr.own_lines(env, pid=23818)).transport == "Socket"
    assert nr.own_lines(env, pid=1) == []
    kept = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_FILE": "/x/%h"}
    nr.capture(kept, str(tmp_path))
    assert kept["NCCL_DEBUG_FILE"] == "/x/%h" and nr.own_lines(kept) == []  # the user's file is left alone
    quiet: dict[str, str] = {}
    nr.capture(quiet, str(tmp_path))
    assert quiet == {}  # no NCCL_DEBUG (CPU jobs): nothing asked


class _Hvd:
    """Horovod's calls `check` makes, for one rank; broadcast_object hands back rank 0's value."""

    def __init__(self, size: int = 16, local_size: int = 8):
        self._size, self._local_size, self.calls = size, local_size, []

    def rank(self) -> int:
        return 0

    def size(self) -> int:
        return self._size

    def local_size(self) -> int:
        return self._local_size

    def allreduce(self, x, name=""):
        self.calls.append(("allreduce", name))
        return x

    def broadcast_object(self, value, root_rank=0, name=""):
        self.calls.append(("broadcast_object", name))
        return value


class _Tf:
    float32 = "float32"

    class _T:
        def numpy(self):
            return 1.0

    def ones(self, shape, dtype):
        return self._T()


def _check(tmp_path, monkeypatch, capsys, log: str | None, expect: str | None, gpus=("GPU:0",), hvd=None):
    monkeypatch.delenv(nr.EXPECT_ENV, raising=False)
    if expect:
        monkeypatch.setenv(nr.EXPECT_ENV, expect)
    monkeypatch.setenv("NCCL_DEBUG_FILE", f"{tmp_path}/nccl-debug.%h.%p.log")
    if log is not None:
        (tmp_path / f"nccl-debug.host.{os.getpid()}.log").write_text(log)
    events: list[tuple[str, dict]] = []
    hvd = hvd or _Hvd()

    def emit(event: str, /, **fields: object) -> None:  # as bench's and the trainer's emit take them
        events.append((event, fields))

    try:
        nr.check(_Tf(), hvd, list(gpus), emit)
        code = 0
    except SystemExit as stop:
        code = int(stop.code or 0)
    out = capsys.readouterr()
    assert hvd.calls[0][0] == "allreduce" and hvd.calls[-1][0] == "broadcast_object"  # every rank learns it
    return code, out.out, out.err, events


def test_a_socket_fallback_on_an_efa_type_is_not_accepted_silently(tmp_path, monkeypatch, capsys):
    code, out, err, events = _check(tmp_path, monkeypatch, capsys, SOCKET, nr.EFA)
    assert code == nr.EXIT_NETWORK
    assert "network: NCCL 2.23.4 over sockets (TCP), 1 interface per node (EFA plugin: missing)" in out
    assert err.startswith("Error: NCCL 2.23.4 is not using EFA") and nr.ALLOW_FLAG in err
    assert ("error", {"kind": "network", "transport": "Socket"}) in events


def test_efa_passes_and_sockets_pass_where_accepted_or_where_there_is_no_efa(tmp_path, monkeypatch, capsys):
    code, out, err, events = _check(tmp_path, monkeypatch, capsys, EFA_4, nr.EFA)
    assert (code, err) == (0, "") and "network: NCCL 2.30.7 over EFA, 4 NICs per node" in out
    assert events == [("network", {"nccl": "2.30.7", "transport": "EFA", "nics": 4})]
    for expect in (None, "any"):  # no EFA on the type, or --allow-socket-transport
        code, out, err, _ = _check(tmp_path, monkeypatch, capsys, SOCKET, expect)
        assert (code, err) == (0, "") and "over sockets (TCP)" in out
    # all processes on one node (bench's first rungs): NCCL does not use the network between nodes
    code, out, err, _ = _check(tmp_path, monkeypatch, capsys, SOCKET, nr.EFA, hvd=_Hvd(size=8, local_size=8))
    assert (code, err) == (0, "") and "over sockets (TCP)" in out


def test_cpu_processes_say_gloo_and_nothing_is_refused(tmp_path, monkeypatch, capsys):
    code, out, err, events = _check(tmp_path, monkeypatch, capsys, None, nr.EFA, gpus=())
    assert (code, err, events) == (0, "", []) and out.strip() == nr.GLOO_LINE


def test_the_operator_finds_the_network_and_error_lines_in_horovodruns_output():
    text = (
        "[1,0]<stdout>:network: NCCL 2.23.4 over sockets (TCP), 1 interface per node\n"
        "[1,1]<stdout>:something else\n"
        "[1,0]<stderr>:Error: NCCL 2.23.4 is not using EFA on an EFA instance type: x. Fix: y\n"
    )
    assert nr.said(text) == (
        "network: NCCL 2.23.4 over sockets (TCP), 1 interface per node",
        "NCCL 2.23.4 is not using EFA on an EFA instance type: x. Fix: y",
    )
    assert nr.said("network: gloo over TCP (CPU processes: NCCL is not used)\n") == (nr.GLOO_LINE, "")
    assert nr.said("nothing\n") == ("", "")


def test_a_followed_job_gets_its_network_line_once_nccl_has_named_the_network():
    w = nr.Watch()
    out = [w.feed(line) for line in ["[1,0]<stdout>:step 1", *EFA_1.splitlines(), *SOCKET.splitlines()]]
    assert [o for o in out if o] == ["network: NCCL 2.18.3 over EFA, 1 NIC per node"]  # once, the first report
    assert out[-len(SOCKET.splitlines()) - 1] == "network: NCCL 2.18.3 over EFA, 1 NIC per node"
    assert w.report is not None and w.report.transport == "EFA"
