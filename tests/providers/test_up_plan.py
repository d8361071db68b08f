"""`up` before anything is made (cluster/up_plan.py): the request checked against the provider's option schema
into one spec, the runtime asked for, the plan lines reported in order, and when to ask before launching.
A stand-in provider instance: nothing is planned remotely."""

from __future__ import annotations

import pytest

from clusterctl.cluster import up_plan
from clusterctl.errors import UsageError
from clusterctl.providers.base import Plan
from clusterctl.runtime.install import plan_line
from clusterctl.state import StateStore


class Stand:
    def __init__(self, builds_here: bool, hourly: float | None = 0.0):
        self.builds_runtime_locally, self.hourly, self.planned = builds_here, hourly, []
        self.live = None  # what find() answers

    def find(self, name):
        return self.live

    def plan(self, spec):
        self.planned.append(spec)
        return Plan((f"{spec.nodes} x {spec.instance_type}",), self.hourly)


def _prepare(tmp_path, request: up_plan.UpRequest, stand: Stand, lines: list[str]) -> up_plan.UpPlan:
    made = []

    def make(kind, region):
        made.append((kind, region))
        return stand

    up = up_plan.prepare(request, StateStore(tmp_path / "home"), make, lines.append)
    assert made == [(request.provider, request.region)]
    return up


def test_the_provider_s_schema_decides_the_type_and_keeps_or_drops_its_own_options(tmp_path):
    lines: list[str] = []
    options = {"spot": True, "volume_size": 100, "subnets": ["s-1"]}
    aws = up_plan.UpRequest("aws", 3, "p3.2xlarge", region="r1", options=options, idle_action="terminate")
    up = _prepare(tmp_path, aws, Stand(builds_here=False, hourly=9.0), lines)
    assert (up.spec.name, up.spec.instance_type, up.spec.region, up.spec.nodes) == ("cluster", "p3.2xlarge", "r1", 3)
    assert up.spec.options == options and up.spec.autostop is not None
    assert lines[0] == "3 x p3.2xlarge" and lines[1].startswith("autostop: ")
    assert lines[2].startswith("node runtime: TensorFlow")
    assert up.question(50.0) is None and up.question(5.0) == "Launch 3 x p3.2xlarge at $9.00/hour?"

    lines.clear()
    local = up_plan.UpRequest("local", 2, "p3.16xlarge", options=options, runtime="none")
    up = _prepare(tmp_path, local, Stand(builds_here=True), lines)
    # a provider without options of its own: no instance type of it, its defaults' options dropped
    assert (up.spec.name, up.spec.instance_type, dict(up.spec.options)) == ("local", "local", {})
    assert lines[0] == "2 x local" and lines[2].startswith("node runtime: none")


def test_the_request_is_refused_before_the_provider_is_asked(tmp_path):
    stand = Stand(builds_here=True)
    with pytest.raises(UsageError, match="--spot is for AWS clusters"):
        _prepare(tmp_path, up_plan.UpRequest("local", given=("--spot",)), stand, [])
    with pytest.raises(UsageError, match="--nodes"):
        _prepare(tmp_path, up_plan.UpRequest("local", nodes=0), stand, [])
    assert stand.planned == []


@pytest.mark.parametrize(
    "given, refused",
    [
        (dict(runtime="conda"), "unknown --runtime 'conda'"),
        (dict(runtime="none", python="/usr/bin/python3"), "--python and --runtime none together"),
        (dict(runtime="dali", python="/usr/bin/python3"), "--python and --runtime dali together"),
        (dict(runtime_cache="s3://b/p"), "--runtime-cache and --runtime-wheels are for AWS clusters"),
    ],
)
def test_the_runtime_asked_for_is_checked(given, refused):
    with pytest.raises(UsageError, match=refused.replace("(", r"\(")):
        up_plan.runtime_request(up_plan.UpRequest("local", **given), builds_here=True)


def test_the_runtime_asked_for():
    own = up_plan.runtime_request(up_plan.UpRequest("aws", python="/opt/py/bin/python"), builds_here=False)
    assert (own.mode, own.python) == ("own", "/opt/py/bin/python")
    cached = up_plan.runtime_request(up_plan.UpRequest("aws", runtime_cache="s3://my-bucket/rt"), builds_here=False)
    assert (cached.mode, cached.cache, cached.wheels) == ("install", "s3://my-bucket/rt", "")
    assert not cached.dali
    # --runtime dali: the runtime with NVIDIA DALI on CPU nodes too (`train --input dali` on its CPU backend)
    dali = up_plan.runtime_request(up_plan.UpRequest("local", runtime="dali"), builds_here=True)
    assert (dali.mode, dali.dali) == ("install", True)
    assert "+ DALI 2.4.0 at" in plan_line(dali, None) and "DALI" not in plan_line(cached, None)


def test_an_up_cluster_asked_another_shape_refuses_what_up_cannot_change_and_resizes_the_rest(tmp_path):
    from clusterctl.errors import ConfigError
    from clusterctl.state import Record
    from clusterctl.types import Cluster, Node

    store = StateStore(tmp_path / "home")
    names = ["x-leader", "x-member-1", "x-member-2"]
    nodes = tuple(Node(n, f"10.0.0.{i + 2}", 1, "leader" if i == 0 else "member") for i, n in enumerate(names))
    store.save(Record(Cluster("x", "local", nodes), "up", 0.0))
    stand = Stand(builds_here=True)

    def again(**asked):
        return _prepare(tmp_path, up_plan.UpRequest("local", name="x", runtime="none", **asked), stand, [])

    with pytest.raises(ConfigError) as refused:
        again(nodes=4, slots=2, given=("--nodes", "--slots"))
    assert refused.value.one_line() == (
        "cluster x is up and `up` does not change its --slots 2 (it has 1): use it as it is (drop those "
        "settings), `clusterctl down x --yes` first to make it anew, or choose another --name"
    )
    assert stand.planned == []
    # the same shape asked again, or no shape flags at all (--nodes' default is not asked for): its own shape
    same = again(nodes=3, slots=1, given=("--nodes", "--slots"))
    assert (same.spec.nodes, same.existing, same.resize) == (3, True, None)
    assert again(nodes=2).spec.nodes == 3 and [s.nodes for s in stand.planned] == [3, 3]
    # up and found: nothing is launched, nothing asked at any price; recorded up but not found: asked
    stand.hourly = 90.0
    dear = again()
    stand.live = Cluster("x", "local", nodes)
    assert dear.question(5.0) is None
    stand.live = None
    assert (dear.question(5.0) or "").startswith("Launch 3 x ")
    stand.hourly = 0.0
    # more nodes: the spec at the new size, the record's nodes kept, two to add; the provider plans the cluster
    # as it is (AWS's plan refuses a count other than the instances there)
    lines: list[str] = []
    more = _prepare(tmp_path, up_plan.UpRequest("local", 5, name="x", runtime="none", given=("--nodes",)), stand, lines)
    assert more.spec.nodes == 5 and more.resize is not None and more.resize.add == 2 and more.resize.remove == ()
    assert stand.planned[-1].nodes == 3
    assert lines[-1] == "cluster x is up: nodes 3 -> 5" and more.resize.question() is None
    stand.region = "here"  # `up --dry-run --json` says it too
    assert up_plan.plan_json(more, [])["resize"] == {"nodes": 3, "to": 5, "add": 2, "remove": []}
    # fewer: the highest-index members, asked first; never the leader
    fewer = again(nodes=1, given=("--nodes",)).resize
    assert up_plan.plan_json(again(nodes=1, given=("--nodes",)), [])["resize"]["remove"] == ["x-member-2", "x-member-1"]
    assert fewer is not None and fewer.add == 0 and [n.name for n in fewer.remove] == ["x-member-2", "x-member-1"]
    assert fewer.question() == "Remove x-member-2, x-member-1 from cluster x (what they hold is lost)?"
    assert up_plan.plan_json(again(), [])["resize"] is None


def test_members_added_to_an_up_cluster_are_named_after_its_highest_index_and_local_ones_get_free_addresses(tmp_path):
    from clusterctl.providers.aws.provider import AwsProvider
    from clusterctl.providers.local.provider import LocalProvider
    from clusterctl.types import Cluster, Node, next_members, node_index

    nodes = (
        Node("x-leader", "10.9.0.2", 2, "leader", "ubuntu", 22, "3.3.3.3", "i-1"),
        Node("x-member-3", "10.9.0.5", 2, "member", "ubuntu"),  # 1 and 2 dropped by `repair --drop`
    )
    cluster = Cluster("x", "local", nodes, extra={"subnet": "10.9.0.0/29", "gateway": "10.9.0.1"})
    assert [node_index("x", n) for n in ("x-leader", "x-member-3", "x-member-", "y-member-1", "x-member-a")] == [
        0,
        3,
        None,
        None,
        None,
    ]
    assert next_members(cluster, 2) == ["x-member-4", "x-member-5"]  # a gap is never reused: a name is one machine
    aws = AwsProvider.new_nodes(AwsProvider.__new__(AwsProvider), cluster, 1)
    assert aws == [Node("x-member-4", "", 2, "member", "ubuntu", 22, None, None)]  # EC2 gives the address
    local = LocalProvider(StateStore(tmp_path / "home"))
    assert [(n.name, n.private_ip) for n in local.new_nodes(cluster, 2)] == [
        ("x-member-4", "10.9.0.3"),
        ("x-member-5", "10.9.0.4"),
    ]
    with pytest.raises(Exception, match="subnet 10.9.0.0/29 has room for 3 more node"):
        local.new_nodes(cluster, 4)
