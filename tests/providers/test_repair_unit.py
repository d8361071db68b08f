"""repair's plan (lines, the cost change, who leads after --drop) and the lost line of `status`/`ls`: pure parts."""

from __future__ import annotations

import dataclasses

import pytest

from clusterctl.cluster.membership import RepairPlan
from clusterctl.cluster.overview import disagreements
from clusterctl.providers.base import ClusterStatus, LostNode, NodeStatus
from clusterctl.state import Record
from clusterctl.types import Cluster, Node

NODES = tuple(
    Node(f"c-{role}", f"10.0.0.{i + 4}", 8, "leader" if i == 0 else "member", instance_id=f"i-{i}")
    for i, role in enumerate(("leader", "member-1", "member-2"))
)
CLUSTER = Cluster("c", "aws", NODES, "us-east-1", "p3.16xlarge")


def test_replacing_adds_a_node_price_per_node_that_no_longer_costs_and_dropping_takes_off_the_billed_ones():
    lost = (LostNode(NODES[2], "terminated"), LostNode(NODES[1], "no ssh answer (timed out)", billed=True))
    replace = RepairPlan(CLUSTER, lost, drop=False, node_hourly_usd=25.4)
    assert replace.hourly_change_usd == 25.4 and replace.lines()[-1] == "cost: +$25.40/hour"
    assert replace.new_leader is None and [n.name for n in replace.live] == ["c-leader"]
    assert "c-member-1 (10.0.0.5): no ssh answer (timed out); replaced by a new p3.16xlarge node" in "\n".join(
        replace.lines()
    )
    drop = RepairPlan(CLUSTER, lost, drop=True, node_hourly_usd=25.4)
    assert drop.hourly_change_usd == -25.4 and drop.lines()[-1] == "cost: -$25.40/hour"
    assert RepairPlan(CLUSTER, lost, drop=False, node_hourly_usd=None).lines()[-1] == "cost: unknown change per hour"


def test_dropping_a_lost_leader_names_the_next_live_node():
    plan = RepairPlan(CLUSTER, (LostNode(NODES[0], "terminated"),), drop=True, node_hourly_usd=0.0)
    assert plan.new_leader == NODES[1]
    assert "  the leader is lost: c-member-1 (10.0.0.5) becomes the leader" in plan.lines()
    assert RepairPlan(CLUSTER, (LostNode(NODES[0], "terminated"),), drop=False, node_hourly_usd=0.0).new_leader is None
    assert RepairPlan(CLUSTER, (), drop=False, node_hourly_usd=0.0).lines() == [
        "cluster c: all 3 node(s) answer; nothing to repair"
    ]


def test_status_names_the_nodes_the_cloud_no_longer_runs_as_lost():
    st = ClusterStatus("c", "aws", "us-east-1", "p3.16xlarge", tuple(NodeStatus(n, "running") for n in NODES[:2]))
    notes = disagreements(Record(CLUSTER, "up", 0.0), st)
    assert "lost: c-member-2 (`clusterctl repair c` replaces them, --drop removes them)" in notes
    whole = dataclasses.replace(st, nodes=tuple(NodeStatus(n, "running") for n in NODES))
    assert not [n for n in disagreements(Record(CLUSTER, "up", 0.0), whole) if n.startswith("lost")]


def test_a_lost_leader_whose_elastic_ip_carries_the_members_is_refused_before_any_aws_call(tmp_path):
    from clusterctl.errors import ProvisionError
    from clusterctl.providers.aws import replace

    eip = dataclasses.replace(CLUSTER, extra={"elastic_ip": "198.18.0.9"})
    with pytest.raises(ProvisionError, match="reached through its Elastic IP"):
        replace.replace(None, None, eip, [NODES[0]], "", tmp_path / "launch.json", 1.0)  # type: ignore[arg-type]


def test_a_stopped_node_and_a_silent_running_one_are_reported_kept_and_block_the_repair_until_named():
    from clusterctl.cluster.repair import Probing, check
    from clusterctl.errors import UnreachableError, UsageError

    held = (
        LostNode(NODES[1], "stopped (User initiated)", billed=True, disks_kept=True),
        LostNode(NODES[2], "runs, but answered no ssh probe over 3m00s (timed out)", billed=True),
    )
    only_held = RepairPlan(CLUSTER, (), drop=False, node_hourly_usd=25.4, held=held)
    lines = only_held.lines()
    assert lines[0] == "cluster c: 0 of 3 node(s) lost, 2 not lost but not answering (kept as they are)"
    assert lines[1] == (
        "  c-member-1 (10.0.0.5): stopped (User initiated); not replaced: its disks hold its data: start "
        "`aws ec2 start-instances --instance-ids i-1`, or `clusterctl repair c --node c-member-1` replaces it "
        "(they go once the new node is verified)"
    )
    assert lines[2].endswith(
        "it may only be slow: wait, or `clusterctl repair c --node c-member-2` replaces it "
        "(it goes once the new node is verified)"
    )
    assert len(lines) == 3  # nothing lost: no cost line
    with pytest.raises(UnreachableError) as raised:
        check(only_held)
    assert raised.value.one_line() == (
        "cluster c: c-member-1, c-member-2 not lost but not answering; nothing to repair: start it or wait until it "
        "answers, or replace it too: `clusterctl repair c --node c-member-1 --node c-member-2`"
    )
    both = RepairPlan(CLUSTER, (LostNode(NODES[0], "terminated"),), drop=False, node_hourly_usd=25.4, held=held[1:])
    with pytest.raises(UnreachableError, match="repaired while it is"):
        check(both)
    check(RepairPlan(CLUSTER, (LostNode(NODES[0], "terminated"),), drop=False, node_hourly_usd=25.4))
    assert Probing(8.0).timeout == 2.0 and Probing().timeout == 10.0 and Probing(60.0).timeout == 10.0
    with pytest.raises(UsageError, match="--unreachable-for must be positive"):
        Probing(0.0)


def test_sync_records_its_dst_in_the_cluster_s_record_which_is_what_repair_copies(tmp_path):
    from clusterctl.cluster import sync_run
    from clusterctl.state import StateStore

    store = StateStore(tmp_path / "home")
    store.save(Record(CLUSTER, "up", 1.0))
    warned: list[str] = []
    for dst in ("~/imagenet", "/data/x/", "imagenet"):
        sync_run.remember(store, "c", sync_run.plan_dst(dst), warned.append)
    saved = store.load("c")
    assert saved.cluster.facts.datasets == ("imagenet", "/data/x") and saved.updated_at == 1.0 and not warned
    assert saved.cluster.nodes == CLUSTER.nodes and CLUSTER.facts.datasets == ()
    with store.lock("c"):  # another command changing the record: the sync says how to do without
        sync_run.remember(store, "c", "/data/y", warned.append, tries=2)
    assert warned == [
        "cluster c's record was busy: /data/y is not among its datasets; `repair --data /data/y` copies it"
    ]
