"""The Provider contract's listing capability (providers/base.py: lists_from_cloud), without a cloud: every
registered provider declares it, and `ls` / `down --all` (cluster/overview.py) follow it without naming a
provider, so with no cloud record and no flag no cloud is asked (here: no AWS region or credentials at all)."""

from __future__ import annotations

import inspect

import pytest

from clusterctl import providers
from clusterctl.cluster import overview
from clusterctl.providers.base import Provider
from clusterctl.state import Record, StateStore
from clusterctl.types import Cluster, Node


@pytest.fixture
def no_aws(monkeypatch, tmp_path):
    """No region, no credentials: asking AWS anything would fail with a ConfigError."""
    for var in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))


def _made(store: StateStore, made: list[tuple[str, str | None]]) -> overview.Providers:
    def make(kind: str, region: str | None) -> Provider:
        made.append((kind, region))
        return providers.get(kind, store=store, region=region)

    return overview.Providers(make)


def _record(store: StateStore, name: str) -> None:
    node = Node(f"{name}-leader", "10.250.0.2", 1, "leader")
    store.save(Record(Cluster(name, "local", (node,), created_at=1000.0), "up", 1000.0))


def test_every_provider_says_where_its_clusters_are_listed_from(tmp_path):
    store = StateStore(tmp_path / "home")
    for name in providers.names():
        assert isinstance(providers.get(name, store=store).lists_from_cloud, bool), name
    found = _made(store, [])
    assert found.split() == (["aws"], ["local"]) and found.split(["local", "no-such"]) == ([], ["local"])


def test_ls_and_down_all_ask_no_cloud_without_a_cloud_record_or_a_flag(tmp_path, no_aws):
    store = StateStore(tmp_path / "home")
    _record(store, "zz-contract-here")
    made: list[tuple[str, str | None]] = []
    listing = overview.listing(store, _made(store, made), None, None, warn=pytest.fail, now=4600.0)
    (row,) = [r for r in listing.rows if r.name == "zz-contract-here"]
    # this machine's cluster: the record's state, priced at nothing
    assert (row.provider, row.state, row.priced, row.hourly_usd, row.uptime_s) == ("local", "up", True, 0.0, 3600.0)
    assert [r.name for r in listing.rows] == ["zz-contract-here"]
    assert made == [("local", None)]  # no cloud record, no flag: the cloud provider is not even loaded
    made.clear()
    targets = overview.down_targets(store, _made(store, made), None, True, None, None, warn=pytest.fail)
    assert overview.Target("zz-contract-here", "local", None) in targets
    assert {t.provider for t in targets} == {"local"}
    # down --all reads every provider's capability; the cloud one is made with no region and never asked
    assert sorted(made) == [("aws", None), ("local", None)]


def test_a_cluster_without_a_record_is_the_cloud_s_only_when_a_cloud_can_be_asked(no_aws):
    assert overview.guess_provider("zz-contract-nowhere", None) == "local"  # no region anywhere: nothing to ask
    assert overview.guess_provider("zz-contract-nowhere", "eu-west-1") == "aws"


def test_ls_and_down_name_no_provider():
    # the choice is the providers' capability: no provider's name is written in overview.py
    source = inspect.getsource(overview)
    for name in providers.names():
        assert f'"{name}"' not in source and f"'{name}'" not in source, name


def test_down_lists_each_cluster_once_and_keeps_another_owner_s_unless_forced(tmp_path, no_aws):
    from clusterctl.errors import UsageError

    store = StateStore(tmp_path / "home")
    mine, theirs = "zz-contract-mine", "zz-contract-theirs"
    _record(store, mine)
    _record(store, theirs)
    asked: list[str] = []

    def make(kind: str, region: str | None) -> Provider:
        impl = providers.get(kind, store=store, region=region)
        listed = impl.resources

        def resources(name: str) -> list[str]:  # as AWS answers for a cluster another owner made
            asked.append(name)
            if name == theirs and not impl.force:
                raise UsageError(f"cluster {theirs} is bob@elsewhere's")
            return listed(name)

        impl.resources = resources  # type: ignore[method-assign]
        return impl

    def plan_down(name: str | None, force: bool = False) -> overview.DownPlan:
        found = overview.Providers(make, force=force)
        return overview.plan_down(
            overview.down_targets(store, found, name, name is None, None, None, pytest.fail), found, name is None
        )

    plan = plan_down(None)
    assert mine in [r.target.name for r in plan.removals]
    # (other homes' local clusters of this machine, other tests', are kept too: not ours)
    ours = tuple((t, why) for t, why in plan.kept if t.name.startswith("zz-contract-"))
    assert ours == ((overview.Target(theirs, "local", None), f"cluster {theirs} is bob@elsewhere's"),)
    assert all("belongs to another owner" in why for t, why in plan.kept if (t, why) not in ours)
    assert asked.count(mine) == 1 and asked.count(theirs) == 1  # found once: the listing is the check
    with pytest.raises(UsageError, match="bob@elsewhere"):  # by name, the refusal is the answer
        plan_down(theirs)
    forced = plan_down(None, force=True)
    assert {mine, theirs} <= {r.target.name for r in forced.removals} and forced.kept == ()
    (r,) = [r for r in forced.removals if r.target.name == mine]
    # no namespace of it on this machine; made before owner marks, it is ours by its record here
    assert r.found == () and r.owners == (providers.get("local", store=store).me(),)


def _aws_cluster(instance_type: str, **extra: str) -> Cluster:
    nodes = (Node("c-leader", "10.0.0.1", 8, "leader"), Node("c-member-1", "10.0.0.2", 8, "member"))
    return Cluster("c", "aws", nodes, "us-east-1", instance_type, extra=extra)


def test_a_cluster_s_price_and_gpus_come_through_the_contract(no_aws):
    """Workloads ask providers.of(cluster) (costs, horovod, train_config): no AWS call, no region configured."""
    local = Cluster("l", "local", (Node("l-leader", "10.250.0.2", 1, "leader"),))
    assert providers.shares_this_machine(local) and not providers.shares_this_machine(_aws_cluster("p3.16xlarge"))
    here = providers.of(local)
    assert (here.hourly_price(local), here.gpus_per_node(local), here.gpu_model(local)) == (0.0, 0, "")
    p3 = _aws_cluster("p3.16xlarge")
    aws = providers.of(p3)
    assert aws.hourly_price(p3) == 2 * 24.48  # two nodes at the built-in on-demand table's price
    assert (aws.gpus_per_node(p3), aws.gpu_model(p3)) == (8, "V100")  # the family's GPU when EC2 named none
    named = _aws_cluster("x9.big", gpus="4", gpu_model="NVIDIA A10G")
    assert (aws.gpus_per_node(named), aws.gpu_model(named), aws.hourly_price(named)) == (4, "NVIDIA A10G", None)
    cpu = _aws_cluster("p3.16xlarge", gpus="0")  # the record's word wins over the table
    assert (aws.gpus_per_node(cpu), aws.gpu_model(cpu)) == (0, "")


def test_the_record_s_facts_are_typed():
    facts = _aws_cluster("p4d.24xlarge", gpus="8", efa="true", efa_rdma="false", spot="true", cluster_id="abc").facts
    assert (facts.gpus, facts.efa, facts.efa_rdma, facts.spot, facts.cluster_id) == (8, True, False, True, "abc")
    bare = _aws_cluster("m5.large").facts
    assert (bare.gpus, bare.gpu_model, bare.python, bare.runtime, bare.efa, bare.owner) == (None, "", "", "", False, "")


def test_up_s_flags_are_checked_against_the_provider_s_option_schema():
    """The library refuses what the CLI refused by a list of its own (cli/up.py): exit 2, one line."""
    from clusterctl.errors import UsageError

    providers.refuse_foreign_flags("aws", ["--type", "--spot", "--nodes"])  # AWS's own
    providers.refuse_foreign_flags("local", ["--nodes", "--name"])  # every provider's
    with pytest.raises(UsageError) as got:
        providers.refuse_foreign_flags("local", ["--nodes", "--spot", "--vpc"])
    assert got.value.exit_code == 2
    assert got.value.message == "--spot, --vpc are for AWS clusters"
    assert got.value.hint == "drop them for --provider local (namespace nodes on this machine)"


def test_ls_shows_a_recorded_cloud_cluster_the_cloud_no_longer_has(tmp_path, no_aws):
    store = StateStore(tmp_path / "home")
    node = Node("zz-contract-gone-leader", "10.250.0.2", 1, "leader")
    cluster = Cluster("zz-contract-gone", "aws", (node,), "eu-west-1", "g5.xlarge", 1000.0, {"az": "eu-west-1a"})
    store.save(Record(cluster, "up", 1000.0))

    def make(kind: str, region: str | None) -> Provider:
        impl = providers.get(kind, store=store, region=region)
        impl.statuses = lambda: []  # type: ignore[method-assign]  # the cloud answers: no cluster of that name
        return impl

    listing = overview.listing(store, overview.Providers(make), None, None, warn=pytest.fail, now=4600.0)
    (row,) = listing.rows
    assert (row.provider, row.region, row.instance_type, row.zones) == ("aws", "eu-west-1", "g5.xlarge", "eu-west-1a")
    assert (row.state, row.uptime_s, row.hourly_usd, row.so_far_usd, row.priced) == (
        "not in the cloud",
        None,
        None,
        None,
        False,
    )
    assert row.note == "; ".join(overview.disagreements(store.load("zz-contract-gone"), None)) != ""
