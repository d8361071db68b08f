"""The ladder's arithmetic, the rung hosts files, and the leader's command line (golden strings)."""

from __future__ import annotations

import dataclasses
import json
import math
import random
import re
import statistics

import pytest

from clusterctl.errors import UsageError
from clusterctl.hostsfile import HostsFile
from clusterctl.remote import jobfolder, nodepkg
from clusterctl.workloads import launch
from clusterctl.workloads.bench import ladder as bench, stats, verdict as bench_verdict
from clusterctl.workloads.horovod import BenchHost, BenchInterval, BenchRun, parse_bench_output

HOSTS = HostsFile.parse("10.0.0.2 slots=8\n10.0.0.3 slots=8\n10.0.0.4 slots=8\n10.0.0.5 slots=8\n")


def run(size: int, rates: list[float], per_host: dict[str, float] | None = None, start: dict | None = None) -> BenchRun:
    """A parsed run whose timed batches had these img/s (all processes together)."""
    hosts = tuple(BenchHost(i, name, 0, v) for i, (name, v) in enumerate((per_host or {}).items()))
    intervals = tuple(BenchInterval((i + 1) * 10, r, size) for i, r in enumerate(rates))
    mean = sum(rates) / len(rates)
    return BenchRun(size, mean, mean / size, "resnet50", 64, intervals, hosts, start=start or {})


def steady(ips: float, noise: float = 0.0, n: int = 10) -> list[float]:
    """n batches whose mean is exactly ips and whose sample sd is exactly noise x ips (+-, alternating)."""
    if not noise:
        return [ips] * n
    devs = [(-1) ** i for i in range(n)] if n % 2 == 0 else [*((-1) ** i for i in range(n - 1)), 0]
    scale = noise * ips * ((n - 1) / sum(d * d for d in devs)) ** 0.5
    return [ips + scale * d for d in devs]


def noisy(rng: random.Random, ips: float, noise: float, n: int) -> list[float]:
    """The seeded stand-in for a real run: n batches, each ips with normal noise of sd noise x ips."""
    return [rng.gauss(ips, noise * ips) for _ in range(n)]


def rungs_of(hosts: HostsFile, ips: dict[int, float], noise: float = 0.0, per_node: dict | None = None, rng=None, n=10):
    return [
        (
            np_,
            len(launch.rung_hosts(hosts, np_).entries),
            run(np_, noisy(rng, ips[np_], noise, n) if rng else steady(ips[np_], noise), (per_node or {}).get(np_)),
            1.0,
            f"r{np_}",
        )
        for np_ in sorted(ips)
    ]


def check(ladder, kind: str, np_: int) -> bench_verdict.Check:
    (c,) = [c for c in ladder.checks if c.kind == kind and c.np == np_]
    return c


# ---- the statistics ---------------------------------------------------------------------------------
def test_t_quantile_matches_the_published_table():
    # Student's t, 0.975 (two-sided 95%), as every statistics table prints it
    for df, t in ((1, 12.706), (2, 4.303), (3, 3.182), (4, 2.776), (9, 2.262), (19, 2.093), (29, 2.045)):
        assert stats.t_quantile(0.975, df) == pytest.approx(t, abs=1e-3), df
    assert stats.t_quantile(0.975, 120) == pytest.approx(1.980, abs=1e-3)
    assert stats.t_quantile(0.975, math.inf) == pytest.approx(1.95996, abs=1e-5)
    assert stats.t_quantile(0.95, 10) == pytest.approx(1.812, abs=1e-3)
    assert 2.571 < stats.t_quantile(0.975, 4.5) < 2.776  # Welch's degrees of freedom are fractional


def test_t_quantile_inverts_the_tail_either_side_of_the_expansion():
    """Newton's steps below LARGE_DF, Fisher's expansion from it: each quantile gives back its tail."""
    from clusterctl.node import student_t

    for df in (1.0, 2.5, 37.3, 499.9, student_t.LARGE_DF, 1234.5, 1e5):
        for p in (0.6, 0.95, 0.975, 0.9995, 0.9999999):
            q = stats.t_quantile(p, df)
            assert stats.t_sf(q, df) == pytest.approx(1 - p, rel=1e-7), (p, df)


def test_the_interval_is_the_means_and_ratios_propagate_first_order():
    rates = [100.0, 104.0, 96.0, 102.0, 98.0]
    est = stats.Estimate.of(rates)
    s = statistics.stdev(rates)
    assert est.value == 100.0 and est.se() == pytest.approx(s / 5**0.5)
    assert est.half_width() == pytest.approx(2.776 * s / 5**0.5, rel=1e-3)  # t(0.975, 4) x s / sqrt(n)
    assert stats.spread(rates) == pytest.approx(1.96 * statistics.pstdev(rates))  # Horovod's +-: not judged
    other = stats.Estimate.of([200.0, 210.0, 190.0, 200.0, 200.0])
    ratio = est.over(other)
    rel_a, rel_b = est.se() / 100, other.se() / 200
    assert ratio.value == 0.5 and ratio.se() == pytest.approx(0.5 * math.hypot(rel_a, rel_b))
    # Welch-Satterthwaite: between one mean's n-1 and both together's
    assert 4 < ratio.df() <= 8
    assert est.times(1 / 4).half_width() == pytest.approx(est.half_width() / 4)
    with pytest.raises(ValueError, match="at least two timed batches"):
        stats.Estimate.of([100.0])


def test_judged_interval_narrows_as_sqrt_of_iters_and_the_spread_does_not():
    """Seeded stand-in: per-batch rates with 3% noise; the efficiency's interval at k x the iters."""
    hosts = HostsFile.parse("a slots=8\nb slots=8\n")
    for k in (4, 9):
        ratios, spreads = [], []
        for seed in range(20):
            rng = random.Random(seed)
            few = bench_verdict.analyze(rungs_of(hosts, {1: 100.0, 8: 760.0}, 0.03, rng=rng, n=20), 0.9, 8)
            many = bench_verdict.analyze(rungs_of(hosts, {1: 100.0, 8: 760.0}, 0.03, rng=rng, n=20 * k), 0.9, 8)
            ratios.append(few.rungs[-1].efficiency_conf / many.rungs[-1].efficiency_conf)
            spreads.append(few.rungs[-1].spread / many.rungs[-1].spread)
        assert 0.85 * k**0.5 < statistics.mean(ratios) < 1.2 * k**0.5, (k, ratios)
        assert 0.85 < statistics.mean(spreads) < 1.15, spreads  # single batches stay as noisy


def _verdicts(true_efficiency: float, iters: int, seeds=range(20)) -> list[str]:
    hosts = HostsFile.parse("a slots=8\n")
    out = []
    for seed in seeds:
        rng = random.Random(seed)
        ladder = bench_verdict.analyze(
            rungs_of(hosts, {1: 100.0, 8: 800.0 * true_efficiency}, 0.03, rng=rng, n=iters), 0.9
        )
        out.append(ladder.status)
    return out


def test_95_percent_passes_and_80_percent_fails_within_100_iters_at_3_percent_noise():
    assert set(_verdicts(0.95, 100)) == {"PASS"}
    assert set(_verdicts(0.80, 100)) == {"FAIL"}
    assert set(_verdicts(0.95, 20)) == {"PASS"}  # already at 20 batches: 95% +- ~2%
    assert set(_verdicts(0.80, 5)) == {"FAIL"}


def test_inconclusive_names_the_iters_that_decide_it_and_they_do():
    """92% against 90% with 3% noise per batch, at the default 10 batches: mostly undecided. The advised
    --iters, followed with fresh batches, decides it (PASS) in nearly every run (the advice aims at 90%
    power; the first run's own estimates are noisy), and following the advice again decides the rest,
    unless a run measures the figure on the threshold itself, which the verdict then says."""
    hosts = HostsFile.parse("a slots=8\n")

    def ladder_of(rng, n):
        return bench_verdict.analyze(rungs_of(hosts, {1: 100.0, 8: 736.0}, 0.03, rng=rng, n=n), 0.9)

    first_rerun, on_threshold = [], 0
    for seed in range(40):
        rng = random.Random(seed)
        ladder, reruns = ladder_of(rng, 10), 0
        while ladder.status == "INCONCLUSIVE" and ladder.iters_needed is not None and reruns < 3:
            m = re.search(r"rerun with --iters (\d+) \(estimated from the measured variance\)", ladder.verdict)
            assert m and int(m.group(1)) == ladder.iters_needed > 10, ladder.verdict
            ladder, reruns = ladder_of(rng, ladder.iters_needed), reruns + 1
        if ladder.status == "INCONCLUSIVE":
            assert ladder.iters_needed is None, (seed, ladder.verdict)  # never three reruns in vain
            assert "no --iters up to 100,000 would decide it: the figure sits on the threshold" in ladder.verdict
            on_threshold += 1
            continue
        assert ladder.status == "PASS", (seed, ladder.verdict)
        if reruns:
            first_rerun.append(reruns == 1)
    assert len(first_rerun) >= 20 and on_threshold <= 3, (first_rerun, on_threshold)
    assert sum(first_rerun) >= 0.85 * len(first_rerun), first_rerun


def test_advice_that_would_outlast_the_timeout_raises_it_too():
    """The advised --iters must fit in each rung's --timeout, or following it would end in a timeout."""
    rates = {1: steady(100.0, 0.03), 8: steady(736.0, 0.03)}

    def per_batch(n: int) -> float:  # batch 64 x 50 steps at the rung's rate: 32 s (1), 35 s (8)
        return 50 * 64 * n / (sum(rates[n]) / 10)

    runs = [
        (n, 1, dataclasses.replace(run(n, r), start={"steps": "50"}), 20.0 + 10 * per_batch(n), f"r{n}")
        for n, r in rates.items()
    ]
    roomy = bench_verdict.analyze(runs, 0.9, timeout=1e6)
    needed = roomy.iters_needed
    assert needed and f"rerun with --iters {needed} (estimated" in roomy.verdict
    longest = bench_verdict.rung_seconds(runs, needed)  # 20 s to launch and warm up, then the batches
    assert longest == pytest.approx(20.0 + needed * per_batch(8)) and longest > 900
    tight = bench_verdict.analyze(runs, 0.9, timeout=900.0)
    expected = math.ceil(1.5 * longest / 60) * 60
    assert f"rerun with --iters {needed} --timeout {expected} (estimated from the measured variance)" in tight.verdict


def test_iters_to_clear_follows_from_the_variance():
    # 92% with a relative se of 2% at 10 batches: the gap of 2 points needs t x se <= 2% / (1 + power margin)
    est = stats.Estimate(0.92, (stats.Part(0.02**2 * 10, 10),))
    n = est.iters_to_clear(0.9)
    assert n is not None and n > 10
    z = statistics.NormalDist().inv_cdf(stats.POWER)
    assert (stats.t_quantile(0.975, est.df(n)) + z) * est.se(n) <= 0.02
    assert (stats.t_quantile(0.975, est.df(n - 1)) + z) * est.se(n - 1) > 0.02
    assert stats.Estimate(0.9, est.parts).iters_to_clear(0.9) is None  # on the threshold: nothing decides it


# ---- the ladder -------------------------------------------------------------------------------------
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
    ladder = bench_verdict.analyze(
        rungs_of(HOSTS, dict(zip(rungs, (400.0, 3100.0, 800.0, 1600.0)))), 0.9, bench.full_node_np(HOSTS)
    )
    assert not ladder.passed and ladder.status == "FAIL"
    assert ladder.verdict.startswith(
        "FAIL: 16 processes on 2 nodes give 12% +- 0% of linear scaling over 1 (threshold 90%); checks: "
    )
    assert check(ladder, "node_scaling", 16).text == (
        "at 16 processes on 2 nodes each process gives 13% +- 0% of a process on one full node (8 processes; "
        "threshold 90%)"
    )
    assert [(c.kind, c.np, c.status) for c in ladder.checks] == [
        ("efficiency", 8, "PASS"),
        ("efficiency", 16, "FAIL"),
        ("node_scaling", 16, "FAIL"),
        ("efficiency", 32, "FAIL"),
        ("node_scaling", 32, "FAIL"),
    ]
    assert ladder.verdict.endswith("; checks: 4 FAIL, 1 PASS")
    with pytest.raises(ValueError, match="needs a full-node rung"):
        bench_verdict.analyze(rungs_of(HOSTS, {1: 400.0, 16: 800.0}), 0.9, 8)


def test_ladder_1_8_20_with_perfect_scaling_passes_and_names_no_node():
    # Issue 15: 20 processes on 8+8+4 slots read FAIL 83% (against 3 whole nodes) and named the half-full node.
    per_node = {20: {"n0": 2400.0, "n1": 2400.0, "n2": 1200.0}}
    ladder = bench_verdict.analyze(rungs_of(HOSTS, {1: 300.0, 8: 2400.0, 20: 6000.0}, per_node=per_node), 0.9, 8)
    assert ladder.passed and ladder.status == "PASS" and ladder.slow_nodes == ()
    assert ladder.rungs[-1].node_scaling == pytest.approx(1.0)
    assert ladder.verdict.startswith("PASS: ") and "slow" not in ladder.verdict
    assert "each process gives 100% +- 0%" in check(ladder, "node_scaling", 20).text


def test_every_ratio_carries_both_rungs_intervals():
    hosts = HostsFile.parse("a slots=8\nb slots=8\n")
    # 92% of a full node's per-process rate, each rung's batches 5% apart over 10 batches
    ladder = bench_verdict.analyze(rungs_of(hosts, {1: 400.0, 8: 3000.0, 16: 5520.0}, noise=0.05), 0.9, 8)
    full, top = ladder.rungs[1], ladder.rungs[2]
    t18 = stats.t_quantile(0.975, 18)  # two 10-batch means of equal relative variance: Welch gives 18
    assert full.conf == pytest.approx(stats.t_quantile(0.975, 9) * 0.05 * 3000 / 10**0.5)
    assert top.node_scaling == pytest.approx(0.92)
    assert top.node_scaling_conf == pytest.approx(t18 * 0.92 * (2 * 0.05**2 / 10) ** 0.5)
    assert top.efficiency == pytest.approx(5520 / (16 * 400))
    assert top.efficiency_conf == pytest.approx(t18 * top.efficiency * (2 * 0.05**2 / 10) ** 0.5)
    assert top.speedup == pytest.approx(13.8) and top.speedup_conf == pytest.approx(16 * top.efficiency_conf)
    assert ladder.status == "INCONCLUSIVE" and not ladder.passed
    # the deciding check: the furthest below the threshold, 1 -> 16 at 86%; per process against a full node 92%
    assert ladder.verdict.startswith(
        "INCONCLUSIVE: 16 processes on 2 nodes give 86% +- 4% of linear scaling over 1 (threshold 90%): the "
        "interval straddles the threshold; rerun with --iters "
    )
    assert re.search(
        r"rerun with --iters \d+ \(estimated from the measured variance\); checks: 3 INCONCLUSIVE$", ladder.verdict
    )
    assert "each process gives 92% +- 4% of a process on one full node" in check(ladder, "node_scaling", 16).text
    # every undecided check is decided at the advised count
    assert ladder.iters_needed == max(c.iters_needed for c in ladder.checks if c.status == "INCONCLUSIVE")
    tight = bench_verdict.analyze(rungs_of(hosts, {1: 400.0, 8: 3000.0, 16: 5920.0}, noise=0.005), 0.9, 8)
    assert tight.status == "PASS" and tight.passed
    low = bench_verdict.analyze(rungs_of(hosts, {1: 400.0, 8: 3000.0, 16: 4800.0}, noise=0.02), 0.9, 8)
    assert low.status == "FAIL"  # 80% +- 2%


def test_one_node_cluster_judges_per_process_efficiency():
    ladder = bench_verdict.analyze(
        [(1, 1, run(1, steady(100.0)), 1.0, "a"), (4, 1, run(4, steady(380.0)), 1.0, "b")], 0.9
    )
    assert (
        ladder.passed and ladder.verdict == "PASS: 4 processes give 95% +- 0% of linear scaling over 1 (threshold 90%)"
    )
    one = bench_verdict.analyze([(4, 1, run(4, steady(380.0)), 1.0, "b")], 0.9)
    assert one.passed and one.checks == () and "nothing to compare" in one.verdict


def _alone(rates: dict[str, list[float]], np_: int = 2):
    ests = [stats.Estimate.of(r).times(1 / np_) for r in rates.values()]
    alone = [bench_verdict.NodeAlone(n, n, np_, e.value, e.half_width()) for n, e in zip(rates, ests)]
    return bench_verdict.judge_nodes(alone, ests)


def test_stragglers_each_node_against_the_median_of_the_others():
    # two nodes: the other node is the median; a node at half the other's rate is slow, and only it
    two = _alone({"n0": steady(100.0, 0.03), "n1": steady(50.0, 0.03)})
    assert bench_verdict.stragglers(two) == ("n1",)
    assert two[1].vs_others == pytest.approx(0.5) and two[0].vs_others == pytest.approx(2.0)
    assert [a.status for a in two] == ["ok", "slow"]
    # within its interval of the bar: undecided, not named
    near = _alone({"n0": steady(100.0, 0.1, 4), "n1": steady(78.0, 0.1, 4)})
    assert bench_verdict.stragglers(near) == () and near[1].status == "undecided"
    # one fast node among four makes no other node slow (against the best node it would make three)
    four = _alone(
        {"n0": steady(100.0, 0.02), "n1": steady(98.0, 0.02), "n2": steady(101.0, 0.02), "n3": steady(140.0, 0.02)}
    )
    assert bench_verdict.stragglers(four) == () and {a.status for a in four} == {"ok"}
    three = _alone({"n0": steady(100.0, 0.02), "n1": steady(98.0, 0.02), "n2": steady(40.0, 0.02)})
    assert bench_verdict.stragglers(three) == ("n2",)
    lone = _alone({"n0": steady(100.0, 0.02)})
    assert bench_verdict.stragglers(lone) == () and lone[0].vs_others is None and lone[0].status == ""


def test_results_json_keeps_every_figure_its_interval_and_the_configuration():
    text = "\n".join(
        [
            "CLUSTERCTL-BENCH start size=2 model=tiny batch=32 warmup_steps=10 steps=5 iters=4 max_seconds=300.00 "
            "threshold=0.90 against=1 gpus=0 mixed_precision=1 xla=1 precision=mixed_bfloat16 compression=none",
            *(f"CLUSTERCTL-BENCH interval step={5 * i} img_per_sec={100 + i}.00 size=2" for i in range(1, 5)),
            "CLUSTERCTL-BENCH stop reason=decided batches=4 seconds=2.25",
            "CLUSTERCTL-BENCH result size=2 img_per_sec=102.50 img_per_sec_per_proc=51.25 model=tiny batch=32 conf=2.2",
        ]
    )
    parsed = parse_bench_output(text)
    hosts = HostsFile.parse("10.0.0.2 slots=2\n10.0.0.3 slots=2\n")
    config = bench.run_config(parsed, hosts, [1, 2, 4])
    assert {k: v for k, v in config.items() if k != "start_line"} == {
        "model": "tiny",
        "precision": "mixed_bfloat16",
        "batch_per_process": 32,
        "xla": True,
        "compression": "none",
        "warmup_steps": 10,
        "steps_per_batch": 5,
        "iters": 4,
        "max_seconds": 300.0,
        "gpus_per_process": 0,
        "nodes": [{"node": "10.0.0.2", "slots": 2}, {"node": "10.0.0.3", "slots": 2}],
        "processes": [1, 2, 4],
    }
    ladder = bench_verdict.analyze([(1, 1, run(1, steady(60.0, 0.02)), 1.0, "a"), (2, 1, parsed, 1.0, "b")], 0.9)
    doc = json.loads(dataclasses.replace(ladder, ran=config).to_json())
    assert doc["ran"]["precision"] == "mixed_bfloat16"
    (c,) = doc["checks"]
    assert c["kind"] == "efficiency" and c["value"] == pytest.approx(102.5 / 120) and c["conf"] > 0
    for r in doc["rungs"]:
        assert r["conf"] > 0 and r["spread"] > 0 and r["iters"] in (10, 4)
    assert doc["rungs"][1]["spread"] == pytest.approx(stats.spread([101.0, 102.0, 103.0, 104.0]))
    assert [r["stop"] for r in doc["rungs"]] == ["", "decided"]  # why each rung timed no more batches


def test_the_table_shows_the_judged_interval_and_the_spread_apart(capsys, monkeypatch):
    from clusterctl.cli import display
    from clusterctl.cli.bench import ladder_table

    monkeypatch.setenv("COLUMNS", "200")  # the table's width follows the terminal's: one line a rung here
    monkeypatch.setattr(display, "_consoles", {})  # made again at this width

    hosts = HostsFile.parse("a slots=8\nb slots=8\n")
    ladder = bench_verdict.analyze(rungs_of(hosts, {1: 400.0, 8: 3000.0, 16: 5520.0}, noise=0.05), 0.9, 8)
    alone = _alone({"a": steady(3000.0, 0.03), "b": steady(2950.0, 0.03)}, 8)
    stops = ("precise", "decided", "time-cap")  # how many batches each rung timed, and why no more
    rungs = tuple(dataclasses.replace(r, stop=why) for r, why in zip(ladder.rungs, stops))
    ladder_table(dataclasses.replace(ladder, rungs=rungs, alone=tuple(alone), model="tiny", batch_size=32))
    out = capsys.readouterr().out
    assert re.search(r"┃ +batches ┃", out) and re.search(r"│ +10 time-cap │", out), out
    flat = " ".join(out.split())
    assert "+-: 95% confidence interval of the mean over 10 timed batches (judged)" in flat
    assert "batch spread: 1.96 sd of single batches (not judged)" in flat
    assert "92.0% +- 4.3% INCONCLUSIVE" in out  # per process vs one node, as the verdict judges it
    assert re.search(r"INCONCLUSIVE: .* 86% \+- 4% .*rerun with --iters \d+", " ".join(out.split()))


def test_costs_of_the_tiny_model_are_a_lower_bound():
    ladder = bench_verdict.analyze(
        [(1, 1, run(1, steady(100.0)), 60.0, "a"), (4, 1, run(4, steady(380.0)), 60.0, "b")], 0.9
    )
    tiny = bench.cost_lines(ladder, 3.0, "tiny")
    assert tiny[0] == "cost: this ladder ran 2m on a $3.00/hour cluster: about $0.10"
    assert tiny[1].startswith("cost: lower bound only: the tiny model at 380 img/s would train 90 ImageNet epochs")
    assert "ResNet-50 is far slower" in tiny[1] and "90 epochs about" not in tiny[1]
    real = bench.cost_lines(ladder, 3.0, "resnet50")
    assert real[1].startswith("cost: at 380 img/s, one ImageNet epoch") and "90 epochs about $" in real[1]


def test_leader_command_golden():
    job = jobfolder.JobFolder("bench-x", "/root")
    cmd = launch.leader_command(
        job,
        4,
        ["/opt/v/bin/python", "/root/.clusterctl/node/node-x.pyz", "bench", "--model", "tiny"],
        "/opt/v/bin/python",
        {"TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    assert cmd == (
        "L=; for d in /opt/amazon/efa/lib /opt/amazon/ofi-nccl/lib /usr/local/cuda/lib64; do "
        '[ -d "$d" ] && L="${L:+$L:}$d"; done; '
        'cd /root/clusterctl-jobs/bench-x && exec env -i HOME="$HOME" USER="$(id -un)" LANG=C.UTF-8 '
        'PATH=/opt/v/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin ${L:+LD_LIBRARY_PATH="$L"} '
        f"env TF_CPP_MIN_LOG_LEVEL=2 /opt/v/bin/python /root/.clusterctl/node/{nodepkg.package().name} horovodrun "
        "-np 4 --hostfile hosts --gloo --disable-cache --start-timeout 60 "
        "/opt/v/bin/python /root/.clusterctl/node/node-x.pyz bench --model tiny 2>&1"
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


def test_gpu_jobs_ask_nccl_for_its_report_and_efa_types_refuse_other_transports_unless_allowed():
    from clusterctl.node import nccl_report
    from clusterctl.types import Cluster, Node

    nodes = (Node("c-leader", "10.0.0.2", 8, "leader"),)
    p4d = Cluster("c", "aws", nodes, instance_type="p4d.24xlarge", extra={"efa": "true", "gpus": "8"})
    env = launch.job_env(p4d, "/usr/bin/python3")
    assert (env["NCCL_DEBUG"], env["NCCL_DEBUG_SUBSYS"]) == ("INFO", "INIT,NET")
    assert env[nccl_report.EXPECT_ENV] == "efa"  # the node programs stop a fallback to sockets
    assert nccl_report.EXPECT_ENV not in launch.job_env(p4d, "/usr/bin/python3", allow_socket=True)
    g5 = Cluster("c", "aws", nodes, instance_type="g5.xlarge", extra={"gpus": "1"})  # a GPU type without EFA
    assert "NCCL_DEBUG" in launch.job_env(g5, "/x") and nccl_report.EXPECT_ENV not in launch.job_env(g5, "/x")
    cpu = Cluster("c", "aws", nodes, instance_type="c5.xlarge", extra={"gpus": "0"})
    local = Cluster("l", "local", nodes)
    for c in (cpu, local, None):  # gloo: no NCCL to ask
        assert "NCCL_DEBUG" not in launch.job_env(c, "/x") and nccl_report.EXPECT_ENV not in launch.job_env(c, "/x")


def test_max_seconds_leaves_the_timeout_room_and_reaches_the_nodes_with_the_references():
    with pytest.raises(UsageError, match=r"--max-seconds 900 leaves no time of --timeout 900") as exc:
        bench.BenchOptions(max_seconds=900)
    assert exc.value.one_line().endswith("give --max-seconds below --timeout, e.g. --timeout 1800")
    bench.BenchOptions(max_seconds=900, timeout=1800)  # the advice, followed
    opts = bench.BenchOptions(max_seconds=120, threshold=0.85, iters=5)
    runs = rungs_of(HOSTS, {1: 100.0, 8: 780.0}, noise=0.02)
    refs = bench_verdict.references(runs, 16, 2, 8)  # 16 processes on 2 nodes: the base and the full node
    assert [r.scale for r in refs] == [16.0, 2.0] and [r.n for r in refs] == [10, 10]
    assert refs[0].mean == pytest.approx(100.0) and refs[0].sd == pytest.approx(2.0)
    args = opts.script_args(16, refs)
    at = args.index("--max-seconds")
    assert args[at : at + 4] == ["--max-seconds", "120", "--threshold", "0.85"]
    assert [args[i + 1] for i, a in enumerate(args) if a == "--against"] == [r.arg() for r in refs]
    assert args[args.index("--iters") + 1] == "5"
    fixed = opts.script_args(8, fixed=True)  # each node alone: exactly --iters batches
    assert fixed[fixed.index("--max-seconds") + 1] == "0" and "--against" not in fixed
    assert bench_verdict.references([], 1, 1) == () and bench_verdict.references(runs[:1], 16, 1) == refs[:1]
    assert (
        "at most 120s of batches" in opts.stopping()
        and "times 5 batches" in dataclasses.replace(opts, max_seconds=0).stopping()
    )


def test_bad_timing_and_fabric_flags_are_one_line_usage_errors(cli):
    for args, message in (
        (("bench", "--synthetic", "--warmup-steps", "3"), "--warmup-steps must be at least 10"),
        (("bench", "--synthetic", "--iters", "2"), "--iters must be at least 3, not 2"),
        (("bench", "--synthetic", "--max-seconds", "-1"), "--max-seconds must be at least 0, not -1.0"),
        (("doctor", "--fabric", "--fabric-mb", "0"), "--fabric-mb must be in (0, 4096], not 0.0"),
    ):
        proc = cli(*args)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        (line,) = proc.stderr.strip().splitlines()
        assert line.startswith("Error: ") and message in line, line


def test_a_rung_whose_nccl_fell_back_to_sockets_on_an_efa_type_fails_with_the_nodes_error(tmp_path):
    """The benchmark's rank 0 stops at its first allreduce and says why (node/nccl_report.py); the ladder
    stops with that error, not with "no result"."""
    from clusterctl.node import nccl_report
    from clusterctl.types import HostResult
    from clusterctl.workloads.bench import ladder as benchlib

    report = nccl_report.parse(
        [
            "ip-10-0-0-4:23817:23817 [0] NCCL INFO NCCL version 2.16.5+cuda11.8",
            "ip-10-0-0-4:23817:23901 [0] NCCL INFO NET/Plugin : No plugin found (libnccl-net.so), using internal "
            "implementation",
            "ip-10-0-0-4:23817:23901 [0] NCCL INFO Using network Socket",
        ]
    )
    why = nccl_report.refusal(report, efa_expected=True)
    out = (
        f"[1,0]<stdout>:{report.line()}\n"
        "[1,0]<stdout>:CLUSTERCTL-BENCH error kind=network transport=Socket\n"
        f"[1,0]<stderr>:Error: {why}\n"
    )
    with pytest.raises(benchlib.BenchFailed) as err:
        benchlib._checked_run(HostResult("leader", 10, out), 8, "rung of 8 processes", tmp_path / "r.log", 900, 8)
    assert err.value.message == why and "--allow-socket-transport" in err.value.one_line()
    assert err.value.hint == f"see {tmp_path / 'r.log'}"


def test_allow_socket_transport_reaches_the_job_environment_and_not_the_trainers_flags():
    from clusterctl.node import nccl_report
    from clusterctl.types import Cluster, Node
    from clusterctl.workloads.train import options as train_options

    opts = train_options.TrainOptions(synthetic=True, allow_socket_transport=True)
    assert nccl_report.ALLOW_FLAG not in train_options.trainer_argv("/p", "/x.pyz", opts)
    p4d = Cluster("c", "aws", (Node("c-leader", "10.0.0.2", 8, "leader"),), extra={"efa": "true", "gpus": "8"})
    assert nccl_report.EXPECT_ENV not in launch.job_env(p4d, "/p", opts.allow_socket_transport)
    assert (
        launch.job_env(p4d, "/p", train_options.TrainOptions(synthetic=True).allow_socket_transport)[
            nccl_report.EXPECT_ENV
        ]
        == nccl_report.EFA
    )


def test_launch_attach_prints_the_network_line_once_after_nccls_own_lines():
    lines = [
        "[1,0]<stdout>:ip-10-0-0-4:1:1 [0] NCCL INFO NCCL version 2.30.7+cuda12.9",
        "[1,0]<stdout>:ip-10-0-0-4:1:2 [0] NCCL INFO NET/OFI Selected provider is efa, fabric is efa (found 4 nics)",
        "[1,0]<stdout>:ip-10-0-0-4:1:2 [0] NCCL INFO Using network Libfabric",
        "[1,1]<stdout>:ip-10-0-0-4:2:2 [1] NCCL INFO Using network Libfabric",
        "[1,0]<stdout>:epoch 1",
    ]
    shown: list[str] = []
    follow = launch.with_network_line(shown.append)
    for line in lines:
        follow(line)
    assert shown == [*lines[:3], "network: NCCL 2.30.7 over EFA, 4 NICs per node", *lines[3:]]


def test_the_ladder_and_nodes_alone_tables_at_80_columns(capsys, monkeypatch):
    """Wrapped into blocks at a narrow terminal (display.fitted_table): no header or figure cut short."""
    from clusterctl.cli import display
    from clusterctl.cli.bench import ladder_table
    from table_support import fits

    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setattr(display, "_consoles", {})  # made again at this width
    hosts = HostsFile.parse("a slots=8\nb slots=8\n")
    ladder = bench_verdict.analyze(rungs_of(hosts, {1: 400.0, 8: 3000.0, 16: 5520.0}, noise=0.05), 0.9, 8)
    alone = _alone({"10.0.1.17": steady(3000.0, 0.03), "10.0.1.18": steady(1450.0, 0.03)}, 8)
    rungs = tuple(dataclasses.replace(r, stop=s) for r, s in zip(ladder.rungs, ("precise", "decided", "time-cap")))
    ladder_table(dataclasses.replace(ladder, rungs=rungs, alone=tuple(alone), model="tiny", batch_size=32))
    out = capsys.readouterr().out.split("INCONCLUSIVE: 16 processes")[0]  # the tables; the verdict is a line of prose
    headers = ["processes", "nodes", "img/s", "batch spread", "speedup", "efficiency 1->N", "per process vs 1 node"]
    figures = [f"{r.img_per_sec:.1f}" for r in rungs] + ["10 time-cap", "92.0% +- 4.3% INCONCLUSIVE"]
    alone_cells = ["10.0.1.17", "img/s per process", "vs the others' median", "slow", "timed batches", "(not judged)"]
    fits(out, [*headers, "batches", *figures, *alone_cells])
    assert "92.0% +- 4.3% INCONCLUSIVE" in out  # a cell within its width stays on one line
