"""`status`'s one value (workloads/cluster_view.py): which of the five sources are asked, for which cluster, and
what the value holds; with a stand-in provider, so nothing remote runs."""

from __future__ import annotations

import pytest

from clusterctl.cluster import autostop_status, overview
from clusterctl.errors import StateError
from clusterctl.providers.base import ClusterStatus, LostNode, NodeStatus
from clusterctl.state import Record, StateStore
from clusterctl.types import Cluster, Node
from clusterctl.workloads import cluster_view

LEADER = Node("zz-view-leader", "10.250.0.2", 1, "leader", instance_id="i-1")
MEMBER = Node("zz-view-member-1", "10.250.0.3", 1, "member", instance_id="i-2")


class Stand:
    """A provider: its record-or-cloud capability, its view of the cluster, the nodes it says are lost."""

    force = False

    def __init__(self, cloud: bool, status: ClusterStatus | None = None, lost: tuple[LostNode, ...] = ()):
        self.lists_from_cloud, self._status, self._lost = cloud, status, lost
        self.asked: list[str] = []

    def status(self, name: str) -> ClusterStatus | None:
        self.asked.append(name)
        return self._status

    def lost_nodes(self, cluster: Cluster) -> list[LostNode]:
        return list(self._lost)


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setattr(autostop_status, "status_lines", lambda store, record: [f"autostop of {record.cluster.name}"])
    return StateStore(tmp_path / "home")


def _save(store: StateStore, status: str, provider: str = "local") -> Record:
    record = Record(Cluster("zz-view", provider, (LEADER, MEMBER), "r1", "p3.2xlarge", 1000.0), status, 1000.0)
    store.save(record)
    return record


def _providers(stand: Stand, made: list[tuple[str, str | None]]) -> overview.Providers:
    def make(kind: str, region: str | None) -> Stand:
        made.append((kind, region))
        return stand

    return overview.Providers(make)  # type: ignore[arg-type]  # a stand-in with the calls status makes


def test_a_record_of_this_machine_is_the_whole_truth_and_a_stopped_one_asks_no_job(store):
    record = _save(store, "stopped")
    made: list[tuple[str, str | None]] = []
    stand = Stand(cloud=False, lost=(LostNode(MEMBER, "namespace gone"),))
    view = cluster_view.gather(store, _providers(stand, made), "zz-view", None, None)
    assert made == [("local", "r1")] and stand.asked == []  # the record's provider and region; no cloud asked
    assert view.nodes == record.cluster and view.cloud is None and view.notes == ()
    assert view.lost == ()  # lost nodes are those of a cluster that is up
    assert view.autostop == ("autostop of zz-view",) and view.runtime
    assert view.training is None and view.launches is None


def test_a_cloud_cluster_without_nodes_says_the_record_and_the_cloud_disagree(store):
    _save(store, "up", provider="aws")
    stand = Stand(cloud=True, status=None)
    view = cluster_view.gather(store, _providers(stand, []), "zz-view", None, None)
    assert stand.asked == ["zz-view"]
    assert view.cloud == ClusterStatus("zz-view", "aws", "r1", "p3.2xlarge", ())
    assert len(view.notes) == 1 and "the provider has nothing for it" in view.notes[0]
    # no nodes: neither lost nodes, autostop (the record is not stopped) nor launches are asked; training is
    assert (view.lost, view.autostop, view.launches) == ((), (), None)
    assert view.runtime and view.training is None  # no job recorded


def test_a_cloud_cluster_with_nodes_and_no_record_here(store):
    st = ClusterStatus("zz-view", "aws", "r2", "p3.2xlarge", (NodeStatus(LEADER, "running"),))
    stand = Stand(cloud=True, status=st, lost=(LostNode(MEMBER, "terminated"),))
    view = cluster_view.gather(store, _providers(stand, []), "zz-view", "aws", "r2")
    assert view.cloud == st and view.runtime is None and view.lost == () and view.training is None
    assert view.notes and "no local record" in view.notes[0]


def test_a_cluster_nowhere_is_an_error(store):
    with pytest.raises(StateError, match="no cluster named 'zz-view' here or in the cloud"):
        cluster_view.gather(store, _providers(Stand(cloud=True, status=None), []), "zz-view", "aws", "r1")
