"""`sync --fanout auto` on real namespace nodes: the sender's uplink shaped with htb above one hop's rate
and at it, the probe's choice and its figures in `--plan` and in the run, a sync with the measured fan-out
complete and verified, a short stream whose probe stops after the hop, an explicit --fanout that skips
the probe, and a failed probe that is only one chain.
One 4-node cluster; every node receives at HOP, node 0 (the sender) sends at what each test sets."""

from __future__ import annotations

import re

import pytest

from sync_support import (
    down_cluster,
    htb,
    make_dataset,
    marker,
    netns_of,
    node_sha256,
    random_files,
    shape,
    sync,
    unshape,
    up_cluster,
)

pytestmark = pytest.mark.integration

HOP = "40mbit"  # ~4.8 MB/s of payload into every node
WHY = re.compile(
    r"^  fanout (\d) \(auto\): .*?(\d) streams from (\S+) at once make ([\d.]+) MB/s \(([\d.]+) MB/s each\), "
    r"(?:at least|below) 90% of a hop's ([\d.]+) MB/s"
)


@pytest.fixture(scope="module")
def c4(tmp_path_factory):
    cluster = up_cluster(tmp_path_factory.mktemp("fanout4"), 4)
    for i in range(4):
        shape(cluster, i, HOP)
    yield cluster
    uplink(cluster, 0, None)
    for i in range(4):
        unshape(cluster, i)
    down_cluster(cluster)


def uplink(cluster, index: int, rate: str | None) -> None:
    """htb inside the node, on its eth0: what the node sends goes at `rate` (None: unshaped)."""
    htb("eth0", rate, netns_of(cluster, index))


def _verified(c4, root: str, sums: dict) -> None:
    for i in range(4):
        assert node_sha256(c4, i, root) == sums, f"node {i}"
        assert marker(c4, i, root) is not None, f"node {i} has no completion marker"


def _no_work_left(c4) -> None:
    for i in range(4):
        left = c4.node_exec(i, "sh", "-c", "ls -A /root/.clusterctl/sync 2>/dev/null; true").stdout
        assert left == "", f"node {i} kept {left!r}"


def test_an_uplink_of_twice_a_hop_gets_two_chains(c4, tmp_path):
    h = c4.hosts
    src = tmp_path / "ds"
    sums = make_dataset(src, random_files(18, 1_000_000, seed=41))  # 18 MB: above the probe's 16 MB
    uplink(c4, 0, "90mbit")  # 2 streams at a hop's rate fit (80), 3 do not (30 each)
    short = (
        r"fanout 1 \(auto\): one chain: 18\.0 MB at a hop's [\d.]+ MB/s is [\d.]+ s of streaming, under 15x a "
        r"measurement \(~1 s\): measuring the sender would cost more than it saves"
    )
    try:
        # 18 MB at a hop's ~4.8 MB/s: the plan, as the run, stops after the hop (the sender is not measured)
        plan = sync(c4, "--plan", str(src), "/tmp/fan2")
        assert plan.returncode == 0, plan.stderr
        lines = plan.stdout.splitlines()
        assert lines[0] == "chain (fanout 1): one tar stream per link, every node writes and forwards at once"
        assert re.fullmatch("  " + short, lines[1]), lines[1]
        assert lines[2:] == [
            f"  source ({src}) -> {h[0]}",
            f"  {h[0]} -> {h[1]}",
            f"  {h[1]} -> {h[2]}",
            f"  {h[2]} -> {h[3]}",
        ]
        assert c4.node_exec(0, "test", "-e", "/tmp/fan2", check=False).returncode == 1  # nothing copied
        _no_work_left(c4)

        kept = list((c4.cli.home / "sync-manifests").glob("hop-*.json"))
        assert len(kept) == 1  # the plan's measured hop, kept for the next run
        kept[0].unlink()
        run = sync(c4, str(src), "/tmp/fan2")
        assert run.returncode == 0, run.stderr
        assert re.search(short + "$", run.stderr, re.M), run.stderr  # what the plan said
        _verified(c4, "/tmp/fan2", sums)
        # the next short stream: the hop's rate just measured stands, no probe at all
        run = sync(c4, str(src), "/tmp/fan2c")
        assert run.returncode == 0, run.stderr
        assert re.search(short + r" \(a hop's rate as measured \d+ s ago\)$", run.stderr, re.M), run.stderr
        _verified(c4, "/tmp/fan2c", sums)

        big = tmp_path / "big"  # ~31 s at a hop's rate: worth measuring the sender, in the plan and the run
        sums = make_dataset(big, random_files(6, 25_000_000, seed=42))
        plan = sync(c4, "--plan", str(big), "/tmp/fan2b")
        assert plan.returncode == 0, plan.stderr
        lines = plan.stdout.splitlines()
        assert lines[0] == "chain (fanout 2): one tar stream per link, every node writes and forwards at once"
        m = WHY.match(lines[1])
        assert m, lines[1]
        assert (m.group(1), m.group(2), m.group(3)) == ("2", "2", h[0])
        hop = float(m.group(6))
        assert 3.5 < hop < 5.2, lines[1]  # a hop into a node shaped at 40 Mbit/s
        assert float(m.group(5)) >= 0.9 * hop
        assert re.search(r"; 3 streams from \S+ at once make [\d.]+ MB/s \([\d.]+ MB/s each\), below$", lines[1])
        assert lines[2:] == [
            f"  source ({big}) -> {h[0]}",
            f"  {h[0]} -> {h[1]}",
            f"  {h[0]} -> {h[3]}",
            f"  {h[1]} -> {h[2]}",
        ]
        run = sync(c4, str(big), "/tmp/fan2b")
        assert run.returncode == 0, run.stderr
        said = [line for line in run.stderr.splitlines() if "fanout" in line]
        assert f"fanout 2 (auto): 2 chains: 2 streams from {h[0]} at once" in run.stderr, said
        _verified(c4, "/tmp/fan2b", sums)
    finally:
        uplink(c4, 0, None)


def test_an_uplink_at_a_hops_rate_gets_one_chain_with_the_leader_as_the_source(c4, tmp_path):
    h = c4.hosts
    src = tmp_path / "ds"
    sums = make_dataset(src, random_files(17, 1_000_000, seed=43))
    assert sync(c4, "--fanout", "1", str(src), "/tmp/fan1-src").returncode == 0  # the leader has it now
    uplink(c4, 0, HOP)
    try:
        plan = sync(c4, "--plan", "leader:/tmp/fan1-src", "/tmp/fan1")
        assert plan.returncode == 0, plan.stderr
        lines = plan.stdout.splitlines()
        assert lines[0].startswith("chain (fanout 1): ")
        m = WHY.match(lines[1])
        assert m and (m.group(1), m.group(2), m.group(3)) == ("1", "2", h[0]), lines[1]
        assert float(m.group(5)) < 0.75 * float(m.group(6)), lines[1]  # two streams share one hop's rate
        assert lines[1].endswith("(the sender's uplink is the limit)")
        assert lines[-3:] == [
            f"  source (leader {h[0]}: /tmp/fan1-src) -> {h[1]}",
            f"  {h[1]} -> {h[2]}",
            f"  {h[2]} -> {h[3]}",
        ]

        run = sync(c4, "leader:/tmp/fan1-src", "/tmp/fan1")  # 17 MB: too short to measure the sender
        assert run.returncode == 0, run.stderr
        assert "fanout 1 (auto): one chain: 17.0 MB at a hop's " in run.stderr
        _verified(c4, "/tmp/fan1", sums)
    finally:
        uplink(c4, 0, None)


def test_an_explicit_fanout_skips_the_probe_and_a_failed_probe_is_one_chain(c4, tmp_path):
    h = c4.hosts
    src = tmp_path / "ds"
    make_dataset(src, {"a": b"a"})
    plan = sync(c4, "--plan", "--fanout", "3", str(src), "/tmp/fanx")
    assert plan.returncode == 0
    assert plan.stdout.splitlines()[0].startswith("chain (fanout 3): ")
    assert "(auto)" not in plan.stdout and len(plan.stdout.splitlines()) == 5
    bad = sync(c4, "--plan", "--fanout", "two", str(src), "/tmp/fanx")
    assert bad.returncode == 2 and "Error: --fanout must be auto or a whole number, not 'two'" in bad.stderr
    # the sender cannot check the others' host keys: its streams never start; --plan still answers (a source on
    # the leader: the plan cannot know its size, so it probes)
    c4.node_exec(0, "sh", "-c", "mkdir -p /tmp/fansrc && echo a > /tmp/fansrc/a")
    kh = "/root/.ssh/known_hosts"
    c4.node_exec(0, "mv", kh, kh + ".away")
    try:
        plan = sync(c4, "--plan", "leader:/tmp/fansrc", "/tmp/fanx")
    finally:
        c4.node_exec(0, "mv", kh + ".away", kh)
    assert plan.returncode == 0, plan.stderr
    line = plan.stdout.splitlines()[1]
    assert line.startswith(f"  fanout 1 (auto): one chain: the probe failed ({h[0]}: "), line
    assert "Host key verification failed" in line, line
    _no_work_left(c4)
