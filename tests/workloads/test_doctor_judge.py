"""The doctor's pure half (workloads/doctor/judge.py) and the --fabric command lines: no nodes here."""

from __future__ import annotations

import dataclasses
import shlex

import pytest

from clusterctl.workloads.doctor import judge as doctor_judge, preflight as doctor


def test_judge_flags_version_skew_and_clock():
    base = {
        "python": "3.11.2",
        "tensorflow": "2.15.1",
        "horovod": "0.28.1",
        "nccl": "n/a",
        "cuda_driver": "n/a",
        "gpus": "n/a",
        "disk_free_pct": "50",
        "mem_free_gb": "20",
        "stale": "0",
        "gpu_procs": "n/a",
        "time": "100.0",
    }
    facts = {"a": dict(base), "b": dict(base), "c": {**base, "horovod": "0.27.0", "time": "105.0"}}
    report = doctor_judge.judge(facts, {"a": 8, "b": 8, "c": 8}, {h: (100.0, 100.5) for h in facts}, {})
    cells = {n.host: n.cells for n in report.nodes}
    assert cells["a"]["versions"].status == "ok" and cells["c"]["versions"].why == "horovod 0.27.0 != 0.28.1"
    assert cells["c"]["clock"].status == "fail" and cells["c"]["clock"].why == "+4.50s from this machine"
    assert cells["a"]["gpus"].status == "n/a" and not report.ok


def test_judge_gpus_against_slots_and_cloud_placement():
    base = {
        "python": "3",
        "tensorflow": "2",
        "horovod": "0",
        "nccl": "2.18",
        "cuda_driver": "535",
        "gpus": "8",
        "disk_free_pct": "50",
        "mem_free_gb": "20",
        "stale": "0",
        "gpu_procs": "0",
        "time": "1.0",
    }
    cloud = {
        "a": {"type": "p3.16xlarge", "zone": "us-east-1a", "placement": "pg"},
        "b": {"type": "p3.16xlarge", "zone": "us-east-1a", "placement": "pg"},
        "c": {"type": "p3.16xlarge", "zone": "us-east-1b", "placement": "pg"},
    }
    facts = {"a": dict(base), "b": {**base, "gpus": "7"}, "c": dict(base)}
    report = doctor_judge.judge(facts, {"a": 8, "b": 8, "c": 8}, {h: (0.5, 1.5) for h in facts}, {}, cloud)
    cells = {n.host: n.cells for n in report.nodes}
    assert cells["b"]["gpus"].why == "nvidia-smi sees 7 GPUs, slots=8"
    assert cells["c"]["same-type"].why == "zone us-east-1b != us-east-1a" and cells["a"]["same-type"].status == "ok"


def test_ring_rounds_never_put_a_node_in_two_pairs_at_once():
    assert doctor_judge.ring_rounds(1) == [] and doctor_judge.ring_rounds(2) == [[(0, 1)]]
    assert doctor_judge.ring_rounds(3) == [[(0, 1)], [(1, 2)], [(2, 0)]]
    assert doctor_judge.ring_rounds(4) == [[(0, 1), (2, 3)], [(1, 2), (3, 0)]]
    for n in range(3, 12):
        rounds = doctor_judge.ring_rounds(n)
        assert sorted(e for r in rounds for e in r) == sorted((i, (i + 1) % n) for i in range(n))
        assert all(len({x for e in r for x in e}) == 2 * len(r) for r in rounds)


def test_judge_fabric_names_the_node_whose_every_pair_is_slow():
    A = doctor_judge.Allreduce
    pairs = [A(("a", "b"), 0.80, 0.02), A(("b", "c"), 0.21, 0.01), A(("c", "d"), 0.19, 0.01), A(("d", "a"), 0.78, 0.03)]
    fab = doctor_judge.judge_fabric(["a", "b", "c", "d"], A(("a", "b", "c", "d"), 0.3), pairs)
    assert fab.slow == ("c",) and fab.best == {"a": 0.80, "b": 0.80, "c": 0.21, "d": 0.78}
    assert fab.why["c"] == "best pair 0.21 Gbit/s < 50% of the median node's 0.79 Gbit/s"
    # against the instance type's floor when there is one: every node under it is named
    floor = doctor_judge.FABRIC_FLOORS["p4d.24xlarge"]
    assert "single-flow limit" in floor[1]
    fab = doctor_judge.judge_fabric(["a", "b", "c", "d"], A(("a",)), pairs, floor)
    assert fab.slow == ("a", "b", "c", "d") and fab.reference.startswith("floor 5 Gbit/s busbw per pair")
    # two nodes: one pair, nobody to blame without a floor; a failed pair names its nodes
    assert doctor_judge.judge_fabric(["a", "b"], A(("a", "b")), [A(("a", "b"), 0.1)]).slow == ()
    failed = doctor_judge.judge_fabric(
        ["a", "b", "c"],
        A(("a",)),
        [A(("a", "b"), 0.8), A(("b", "c"), error="no result"), A(("c", "a"), error="no result")],
    )
    assert failed.slow == ("c",) and failed.why["c"] == "no pair allreduce finished: no result"


# ---- nccl-tests' all_reduce_perf where the image has it (no GPUs here: the parser, the argv, the choice) ------
# all_reduce_perf's output as nccl-tests 2.x prints it (src/common.cu: the header, one row per size with the
# root column, "Out of bounds values", "Avg bus bandwidth" with printf %g), 2 nodes x 8 GPUs
NCCL_2X = """# nThread 1 nGpus 1 minBytes 8 maxBytes 67108864 step: 2(factor) warmup iters: 5 iters: 10 agg iters: 1 validation: 1 graph: 0
#
# Using devices
#  Rank  0 Group  0 Pid  41234 on ip-10-0-1-11 device  0 [0x10] NVIDIA A100-SXM4-40GB
#  Rank  8 Group  0 Pid  39876 on ip-10-0-1-12 device  0 [0x10] NVIDIA A100-SXM4-40GB
#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
           8             2     float     sum      -1    61.93    0.00    0.00      0    60.88    0.00    0.00      0
        1024           256     float     sum      -1    64.17    0.02    0.03      0    63.90    0.02    0.03      0
     1048576        262144     float     sum      -1    291.4    3.60    6.75      0    290.8    3.61    6.76      0
    16777216       4194304     float     sum      -1   1203.5   13.94   26.14      0   1201.9   13.96   26.17      0
    67108864      16777216     float     sum      -1    16195    4.14    7.77      0    16203    4.14    7.77      0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 8.13801
#
"""
# an older build: no root column, the largest error instead of a count
NCCL_OLD = """#                                                     out-of-place                       in-place
#       size         count    type   redop     time   algbw   busbw  error     time   algbw   busbw  error
#        (B)    (elements)                     (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
           8             2   float     sum    163.4    0.00    0.00  2e-07    164.4    0.00    0.00  1e-07
   536870912     134217728   float     sum    68411    7.85   14.72  5e-07    68398    7.85   14.72  5e-07
  1073741824     268435456   float     sum   136720    7.85   14.73  5e-07   136705    7.85   14.73  5e-07
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 4.9e+00
"""


def test_all_reduce_perf_output_read_back():
    res = doctor_judge.parse_all_reduce_perf(NCCL_2X)
    assert len(res.rows) == 5 and res.avg_busbw_gbyte == 8.13801 and res.out_of_bounds == 0 and res.wrong == 0
    assert res.rows[2] == doctor_judge.NcclRow(
        1048576, 262144, "float", "sum", 291.4, 3.60, 6.75, "0", 290.8, 3.61, 6.76, "0"
    )
    assert res.rows[-1].time_us == 16195 and res.peak_busbw_gbyte == 7.77  # the largest size, not the best one
    # mpirun --tag-output (and srun -l) put the rank in front of every line
    tagged = "".join(f"[1,0]<stdout>:{line}\n" for line in NCCL_2X.splitlines())
    assert doctor_judge.parse_all_reduce_perf(tagged) == res
    assert doctor_judge.parse_all_reduce_perf("".join(f"0: {line}\n" for line in NCCL_2X.splitlines())) == res
    old = doctor_judge.parse_all_reduce_perf(NCCL_OLD)
    assert [r.size_bytes for r in old.rows] == [8, 536870912, 1073741824] and old.avg_busbw_gbyte == 4.9
    assert old.rows[0].wrong == "2e-07" and old.wrong == 0 and old.peak_busbw_gbyte == 14.73
    # a wrong result counts; a run that died before its summary is no result
    bad = NCCL_2X.replace("26.14      0", "26.14      3").replace("values : 0 OK", "values : 3 FAILED")
    got, parsed = doctor_judge.nccl_allreduce(bad, ("a", "b"))
    assert parsed.wrong == 3 and parsed.out_of_bounds == 3 and got.error == "all_reduce_perf found 3 wrong result(s)"
    cut = (
        NCCL_2X.split("# Out of bounds")[0]
        + "ip-10-0-1-12: Test NCCL failure common.cu:1012 'unhandled system error'\n"
    )
    with pytest.raises(ValueError, match="no all_reduce_perf result .*unhandled system error"):
        doctor_judge.parse_all_reduce_perf(cut)
    got, parsed = doctor_judge.nccl_allreduce(NCCL_2X, ("a", "b"))
    assert parsed is not None and got == doctor_judge.Allreduce(
        ("a", "b"), 7.77 * 8
    )  # GB/s -> Gbit/s, like the gloo test


def test_all_reduce_perf_argv_and_hostfile_from_the_hosts_file():
    from clusterctl.hostsfile import HostsFile

    tool = doctor_judge.FabricTool(
        "nccl-tests", "", "/usr/local/cuda-12.4/efa/test-cuda-12.4/all_reduce_perf", "/opt/amazon/openmpi/bin/mpirun"
    )
    argv = doctor.all_reduce_perf_argv(
        tool, 2, 8, "/home/ubuntu/clusterctl-jobs/fabric-1/mpi_hosts", max_bytes=64 * 2**20, iters=10
    )
    assert argv == [
        "/opt/amazon/openmpi/bin/mpirun",
        "--prefix",
        "/opt/amazon/openmpi",
        "-np",
        "16",
        "--hostfile",
        "/home/ubuntu/clusterctl-jobs/fabric-1/mpi_hosts",
        "--map-by",
        "ppr:8:node",
        "--bind-to",
        "none",
        "-x",
        "LD_LIBRARY_PATH",
        "-x",
        "NCCL_DEBUG=INFO",
        "-x",
        "NCCL_DEBUG_SUBSYS=INIT,NET",
        "/usr/local/cuda-12.4/efa/test-cuda-12.4/all_reduce_perf",
        "-b",
        "8",
        "-e",
        "67108864",
        "-f",
        "2",
        "-g",
        "1",
        "-n",
        "10",
    ]
    root = doctor.all_reduce_perf_argv(
        doctor_judge.FabricTool("nccl-tests", "", "/x y/all_reduce_perf", "mpirun"),
        1,
        1,
        "/tmp/h",
        max_bytes=8,
        iters=1,
        as_root=True,
    )
    assert root[:2] == ["mpirun", "--allow-run-as-root"] and "--prefix" not in root
    assert "'/x y/all_reduce_perf'" in shlex.join(root)  # a path with a space stays one word on the leader
    with pytest.raises(ValueError):
        doctor.all_reduce_perf_argv(tool, 2, 0, "/tmp/h", max_bytes=8, iters=1)
    hosts = HostsFile.parse("10.0.1.11 slots=1\n10.0.1.12 slots=1\n")
    assert doctor.mpi_hostfile(hosts, 8) == "10.0.1.11 slots=8 max_slots=8\n10.0.1.12 slots=8 max_slots=8\n"


def test_nccl_tests_only_when_every_node_has_it_and_gpus():
    arp, mpi = "/opt/nccl-tests/build/all_reduce_perf", "/opt/amazon/openmpi/bin/mpirun"
    both = {"all_reduce_perf": arp, "mpirun": mpi}
    tool = doctor_judge.choose_fabric_tool({"a": both, "b": both}, gpus=8)
    assert tool == doctor_judge.FabricTool(
        "nccl-tests", f"all_reduce_perf on every node ({arp}) through mpirun", arp, mpi
    )
    for found, gpus, why in (
        ({"a": both, "b": both}, 0, "no GPUs on these nodes"),
        ({"a": both, "b": {"mpirun": mpi}}, 8, "all_reduce_perf not found on b"),
        ({"a": both, "b": None}, 8, "all_reduce_perf not found on b"),  # the probe failed there
        ({"a": {"all_reduce_perf": arp}, "b": both}, 8, "mpirun not found on a"),
        (
            {"a": both, "b": {**both, "all_reduce_perf": "/usr/local/cuda/efa/test-cuda-12.4/all_reduce_perf"}},
            8,
            "all_reduce_perf at different paths",
        ),
    ):
        tool = doctor_judge.choose_fabric_tool(found, gpus)
        assert tool.name == "gloo" and tool.why.startswith(why) and tool.why.endswith("Horovod's allreduce over gloo")
    assert doctor_judge.parse_tools(f"all_reduce_perf {arp}\nmpirun {mpi}\nnoise\n") == both


def test_doctor_fabric_fails_a_socket_fallback_on_an_efa_type():
    """all_reduce_perf's output holds NCCL's INFO lines (mpirun-tagged); on an EFA type, sockets fail every
    node's fabric check with the cause and the fix, and the network line says what was used."""
    from clusterctl.workloads.doctor.judge import Allreduce, Cell, DoctorReport, NodeReport

    socket = (
        "[1,0]<stdout>:ip-10-0-0-4:23817:23817 [0] NCCL INFO NCCL version 2.16.5+cuda11.8\n"
        "[1,0]<stdout>:ip-10-0-0-4:23817:23901 [0] NCCL INFO NET/Plugin : No plugin found (libnccl-net.so), "
        "using internal implementation\n"
        "[1,0]<stdout>:ip-10-0-0-4:23817:23901 [0] NCCL INFO NET/Socket : Using [0]ens32:10.0.0.4<0>\n"
        "[1,0]<stdout>:ip-10-0-0-4:23817:23901 [0] NCCL INFO Using network Socket\n"
        "#  Avg bus bandwidth    : 1.2\n"
    )
    line, error = doctor.network_of(socket, "nccl-tests", efa=True)
    assert line == "network: NCCL 2.16.5 over sockets (TCP), 1 interface per node (EFA plugin: missing)"
    assert "found no EFA plugin" in error and "--allow-socket-transport" in error
    assert doctor.network_of(socket, "nccl-tests", efa=False)[1] == ""  # no EFA on the type: sockets it is
    efa = (
        socket.replace("Using network Socket", "Using network Libfabric")
        .replace(
            "NET/Plugin : No plugin found (libnccl-net.so), using internal implementation",
            "NET/Plugin: Loaded net plugin Libfabric (v6)",
        )
        .replace(
            "NET/Socket : Using [0]ens32:10.0.0.4<0>", "NET/OFI Selected provider is efa, fabric is efa (found 4 nics)"
        )
    )
    assert doctor.network_of(efa, "nccl-tests", efa=True) == ("network: NCCL 2.16.5 over EFA, 4 NICs per node", "")
    # the fabric program (Horovod) prints the line itself on rank 0
    assert doctor.network_of("[1,0]<stdout>:network: gloo over TCP (CPU processes: NCCL is not used)\n", "gloo", True)[
        0
    ].startswith("network: gloo over TCP")

    fab = doctor_judge.judge_fabric(["a", "b"], Allreduce(("a", "b"), 1.0), [Allreduce(("a", "b"), 1.0)])
    report = DoctorReport((NodeReport("a", "", {"reachable": Cell("ok", "")}, {}),), ("reachable",))
    bad = doctor.with_fabric(report, dataclasses.replace(fab, network=line, network_error=error))
    assert bad.nodes[0].cells["fabric"] == Cell("fail", error) and not bad.ok
    assert doctor.with_fabric(report, fab).nodes[0].cells["fabric"].status == "ok"
