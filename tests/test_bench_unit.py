"""The ladder's arithmetic, the rung hosts files, and the leader's command line (golden strings)."""

from __future__ import annotations

import pytest

from clusterctl import bench, launch
from clusterctl.errors import UsageError
from clusterctl.horovod import BenchHost, BenchRun
from clusterctl.hostsfile import HostsFile

HOSTS = HostsFile.parse("10.0.0.2 slots=8\n10.0.0.3 slots=8\n10.0.0.4 slots=8\n10.0.0.5 slots=8\n")


def run(size: int, ips: float, per_host: dict[str, float] | None = None) -> BenchRun:
    hosts = tuple(BenchHost(i, name, 0, v) for i, (name, v) in enumerate((per_host or {}).items()))
    return BenchRun(size, ips, ips / size, "resnet50", 64, (), hosts)


def test_default_ladder_is_one_gpu_one_node_all():
    assert bench.default_ladder(HOSTS) == [1, 8, 32]
    assert bench.default_ladder(HostsFile.parse("a slots=1")) == [1]


def test_parse_ladder_checks_bounds():
    assert bench.parse_ladder("16, 1,8,32", HOSTS) == [1, 8, 16, 32]
    for bad in ("0,8", "1,64", "x", ""):
        with pytest.raises(UsageError):
            bench.parse_ladder(bad, HOSTS)


def test_rung_hosts_fill_the_leader_first():
    assert launch.rung_hosts(HOSTS, 1).render() == "10.0.0.2 slots=1\n"
    assert launch.rung_hosts(HOSTS, 8).render() == "10.0.0.2 slots=8\n"
    assert launch.rung_hosts(HOSTS, 12).render() == "10.0.0.2 slots=8\n10.0.0.3 slots=4\n"
    with pytest.raises(ValueError):
        launch.rung_hosts(HOSTS, 33)


def test_analyze_passes_near_linear_scaling_and_names_a_slow_node():
    per_node = {"n0": 2900.0, "n1": 2850.0, "n2": 2880.0, "n3": 1500.0}
    ladder = bench.analyze([(1, 1, run(1, 400.0), 1.0, "a"), (8, 1, run(8, 3000.0), 1.0, "b"),
                            (32, 4, run(32, 10800.0, per_node), 1.0, "c")], 0.9)
    one, node, full = ladder.rungs
    assert one.speedup == 1.0 and node.speedup == pytest.approx(7.5)
    assert node.efficiency == pytest.approx(7.5 / 8) and node.node_scaling is None
    assert full.node_scaling == pytest.approx(10800 / (4 * 3000))
    assert ladder.passed and ladder.verdict.startswith("PASS: 4 nodes give 90% of 4x")
    assert ladder.slow_nodes == ("n3",) and "slow node(s): n3" in ladder.verdict


def test_analyze_fails_poor_scaling():
    ladder = bench.analyze([(1, 1, run(1, 400.0), 1.0, "a"), (8, 1, run(8, 3000.0), 1.0, "b"),
                            (16, 2, run(16, 4000.0), 1.0, "c")], 0.9)
    assert not ladder.passed and ladder.verdict.startswith("FAIL: 2 nodes give 67% of 2x one node's img/s")


def test_analyze_one_node_cluster_judges_per_process_efficiency():
    ladder = bench.analyze([(1, 1, run(1, 100.0), 1.0, "a"), (4, 1, run(4, 380.0), 1.0, "b")], 0.9)
    assert ladder.passed and "4 processes give 95% of linear scaling" in ladder.verdict


def test_leader_command_golden():
    job = launch.Job("bench-x", "/root")
    cmd = launch.leader_command(job, 4, ["/opt/v/bin/python", "/root/clusterctl-jobs/bench-x/bench_synthetic.py",
                                         "--model", "tiny"], "/opt/v/bin/python", {"TF_CPP_MIN_LOG_LEVEL": "2"})
    assert cmd == (
        "L=; for d in /opt/amazon/efa/lib /opt/amazon/ofi-nccl/lib /usr/local/cuda/lib64; do "
        "[ -d \"$d\" ] && L=\"${L:+$L:}$d\"; done; "
        "cd /root/clusterctl-jobs/bench-x && exec env -i HOME=\"$HOME\" USER=\"$(id -un)\" LANG=C.UTF-8 "
        "PATH=/opt/v/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin ${L:+LD_LIBRARY_PATH=\"$L\"} "
        "env TF_CPP_MIN_LOG_LEVEL=2 /opt/v/bin/python /root/clusterctl-jobs/bench-x/hvd_launch.py -np 4 "
        "--hostfile hosts --gloo --disable-cache --start-timeout 60 "
        "/opt/v/bin/python /root/clusterctl-jobs/bench-x/bench_synthetic.py --model tiny 2>&1"
    )


def test_job_env_carries_no_secret_and_sets_efa_where_present():
    from clusterctl.types import Cluster, Node

    aws = Cluster("c", "aws", (Node("c-leader", "10.0.0.2", 8, "leader"),), extra={"efa": "true", "efa_rdma": "true"})
    env = launch.job_env(aws, "/usr/bin/python3")
    assert env["FI_PROVIDER"] == "efa" and env["NCCL_SOCKET_IFNAME"] == "^lo,docker"
    assert env["FI_EFA_USE_DEVICE_RDMA"] == "1"  # p4d/p5; p3dn's EFA has no device RDMA:
    p3dn = Cluster("c", "aws", aws.nodes, extra={"efa": "true", "efa_rdma": "false"})
    assert launch.job_env(p3dn, "/usr/bin/python3")["FI_PROVIDER"] == "efa"
    assert "FI_EFA_USE_DEVICE_RDMA" not in launch.job_env(p3dn, "/usr/bin/python3")
    assert not [k for k in env if k.startswith("AWS_")]
    local = Cluster("l", "local", (Node("l-leader", "10.0.0.2", 2, "leader"),))
    assert "FI_PROVIDER" not in launch.job_env(local, "/usr/bin/python3")
