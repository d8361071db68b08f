"""The ladder's arithmetic, the rung hosts files, and the leader's command line (golden strings)."""

from __future__ import annotations

import pytest

from clusterctl.errors import UsageError
from clusterctl.hostsfile import HostsFile
from clusterctl.workloads import bench, launch
from clusterctl.workloads.horovod import BenchHost, BenchRun

HOSTS = HostsFile.parse("10.0.0.2 slots=8\n10.0.0.3 slots=8\n10.0.0.4 slots=8\n10.0.0.5 slots=8\n")


def run(size: int, ips: float, per_host: dict[str, float] | None = None, conf: float = 0.0) -> BenchRun:
    hosts = tuple(BenchHost(i, name, 0, v) for i, (name, v) in enumerate((per_host or {}).items()))
    return BenchRun(size, ips, ips / size, "resnet50", 64, (), hosts, conf=conf)


def rungs_of(hosts: HostsFile, ips: dict[int, float], conf: float = 0.0, per_node: dict | None = None):
    return [
        (
            n,
            len(launch.rung_hosts(hosts, n).entries),
            run(n, ips[n], (per_node or {}).get(n), conf * ips[n]),
            1.0,
            f"r{n}",
        )
        for n in sorted(ips)
    ]


def test_default_ladder_is_one_gpu_one_node_all():
    assert bench.default_ladder(HOSTS) == [1, 8, 32]
    assert bench.default_ladder(HostsFile.parse("a slots=1")) == [1]


def test_parse_ladder_checks_bounds_and_always_holds_a_full_node():
    assert bench.parse_ladder("16, 1,8,32", HOSTS) == [1, 8, 16, 32]
    assert bench.parse_ladder("1,16,32", HOSTS) == [1, 8, 16, 32]  # the full node it is judged against
    assert bench.parse_ladder("1,8,20", HOSTS) == [1, 8, 20]
    for bad in ("0,8", "1,64", "x", ""):
        with pytest.raises(UsageError):
            bench.parse_ladder(bad, HOSTS)


def test_ladder_1_16_32_with_16_gpus_at_twice_one_gpu_fails():
    # Issue 15: judged against the 1-GPU rung as "one node", this read PASS 100%.
    rungs = bench.parse_ladder("1,16,32", HOSTS)
    ladder = bench.analyze(
        rungs_of(HOSTS, dict(zip(rungs, (400.0, 3100.0, 800.0, 1600.0)))), 0.9, bench.full_node_np(HOSTS)
    )
    assert not ladder.passed and ladder.status == "FAIL"
    assert ladder.verdict.startswith(
        "FAIL: at 16 processes on 2 nodes each process gives 13% +- 0% of a process on "
        "one full node (8 processes; threshold 90%)"
    )
    with pytest.raises(ValueError, match="needs a full-node rung"):
        bench.analyze(rungs_of(HOSTS, {1: 400.0, 16: 800.0}), 0.9, 8)


def test_ladder_1_8_20_with_perfect_scaling_passes_and_names_no_node():
    # Issue 15: 20 processes on 8+8+4 slots read FAIL 83% (against 3 whole nodes) and named the half-full node.
    per_node = {20: {"n0": 2400.0, "n1": 2400.0, "n2": 1200.0}}
    ladder = bench.analyze(rungs_of(HOSTS, {1: 300.0, 8: 2400.0, 20: 6000.0}, per_node=per_node), 0.9, 8)
    assert ladder.passed and ladder.status == "PASS" and ladder.slow_nodes == ()
    assert ladder.rungs[-1].node_scaling == pytest.approx(1.0)
    assert "slow" not in ladder.verdict and "each process gives 100% +- 0%" in ladder.verdict


def test_verdict_needs_the_interval_clear_of_the_threshold():
    hosts = HostsFile.parse("a slots=8\nb slots=8\n")
    # 92% of a full node's per-process rate, each rate +- 5%: 92% +- 7% straddles 90%
    noisy = bench.analyze(rungs_of(hosts, {1: 400.0, 8: 3000.0, 16: 5520.0}, conf=0.05), 0.9, 8)
    assert noisy.status == "INCONCLUSIVE" and not noisy.passed
    assert noisy.verdict.startswith("INCONCLUSIVE: at 16 processes on 2 nodes each process gives 92% +- 7%")
    assert noisy.rungs[-1].node_scaling_conf == pytest.approx(0.92 * (2 * 0.05**2) ** 0.5)
    tight = bench.analyze(rungs_of(hosts, {1: 400.0, 8: 3000.0, 16: 5520.0}, conf=0.005), 0.9, 8)
    assert tight.status == "PASS" and tight.passed
    low = bench.analyze(rungs_of(hosts, {1: 400.0, 8: 3000.0, 16: 4800.0}, conf=0.02), 0.9, 8)
    assert low.status == "FAIL"  # 80% +- 2.3%


def test_one_node_cluster_judges_per_process_efficiency():
    ladder = bench.analyze([(1, 1, run(1, 100.0), 1.0, "a"), (4, 1, run(4, 380.0), 1.0, "b")], 0.9)
    assert ladder.passed and "4 processes give 95% +- 0% of linear scaling" in ladder.verdict


def test_stragglers_are_nodes_slow_on_their_own():
    alone = [
        bench.NodeAlone("n0", "h0", 2, 50.0, 2.0),
        bench.NodeAlone("n1", "h1", 2, 48.0, 2.0),
        bench.NodeAlone("n2", "h2", 1, 20.0, 3.0),
    ]
    assert bench.stragglers(alone) == ("n2",)
    assert bench.stragglers(alone[:2]) == ()
    # within its interval of the bar: not named
    assert bench.stragglers([*alone[:2], bench.NodeAlone("n2", "h2", 1, 36.0, 4.0)]) == ()
    assert bench.stragglers(alone[:1]) == ()


def test_costs_of_the_tiny_model_are_a_lower_bound():
    ladder = bench.analyze([(1, 1, run(1, 100.0), 60.0, "a"), (4, 1, run(4, 380.0), 60.0, "b")], 0.9)
    tiny = bench.cost_lines(ladder, 3.0, "tiny")
    assert tiny[0] == "cost: this ladder ran 2m on a $3.00/hour cluster: about $0.10"
    assert tiny[1].startswith("cost: lower bound only: the tiny model at 380 img/s would train 90 ImageNet epochs")
    assert "ResNet-50 is far slower" in tiny[1] and "90 epochs about" not in tiny[1]
    real = bench.cost_lines(ladder, 3.0, "resnet50")
    assert real[1].startswith("cost: at 380 img/s, one ImageNet epoch") and "90 epochs about $" in real[1]


def test_leader_command_golden():
    job = launch.JobFolder("bench-x", "/root")
    cmd = launch.leader_command(
        job,
        4,
        ["/opt/v/bin/python", "/root/clusterctl-jobs/bench-x/bench_synthetic.py", "--model", "tiny"],
        "/opt/v/bin/python",
        {"TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    assert cmd == (
        "L=; for d in /opt/amazon/efa/lib /opt/amazon/ofi-nccl/lib /usr/local/cuda/lib64; do "
        '[ -d "$d" ] && L="${L:+$L:}$d"; done; '
        'cd /root/clusterctl-jobs/bench-x && exec env -i HOME="$HOME" USER="$(id -un)" LANG=C.UTF-8 '
        'PATH=/opt/v/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin ${L:+LD_LIBRARY_PATH="$L"} '
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


def test_bad_timing_and_fabric_flags_are_one_line_usage_errors(cli):
    for args, message in (
        (("bench", "--synthetic", "--warmup-steps", "3"), "--warmup-steps must be at least 10"),
        (("bench", "--synthetic", "--iters", "2"), "--iters must be at least 3, not 2"),
        (("doctor", "--fabric", "--fabric-mb", "0"), "--fabric-mb must be in (0, 4096], not 0.0"),
    ):
        proc = cli(*args)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        (line,) = proc.stderr.strip().splitlines()
        assert line.startswith("Error: ") and message in line, line
