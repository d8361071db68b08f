"""`gc`'s words and its removal (cluster/gc.py): what a scan says it keeps and asks, and collect() stopping the
connection agent before it removes, with an error naming what is left. Stand-in providers: nothing remote."""

from __future__ import annotations

import pytest

from clusterctl.cluster import gc
from clusterctl.errors import ProvisionError
from clusterctl.providers.base import Found, Teardown
from clusterctl.remote import agent
from clusterctl.state import StateStore


def _leftover(name: str, owner: str = "", mine: bool = True, n: int = 1) -> gc.Leftover:
    found = tuple(Found(name, "namespace", f"{name}-{i}", owner=owner) for i in range(n))
    return gc.Leftover(name, "local", "local", found, "", mine=mine)


def _scan(chosen: tuple[gc.Leftover, ...], others: tuple[gc.Leftover, ...] = ()) -> gc.Scan:
    return gc.Scan(chosen + others, chosen, others, ())


def test_a_scan_names_what_it_keeps_and_asks_about_what_it_removes():
    ours, theirs = _leftover("a", n=2), _leftover("b", owner="bob@elsewhere", mine=False)
    assert _scan((ours,), (theirs,)).notes("2h") == [
        "kept: 1 cluster(s) of other owners (b of bob@elsewhere); --force removes them"
    ]
    assert _scan((ours, theirs)).question() == "Remove 3 resource(s) of 2 cluster(s) (a, b (owner bob@elsewhere))?"
    # nothing chosen: why, by whether an age limit or another owner kept it
    assert _scan(()).notes("2h") == ["nothing is older than 2h"]
    assert _scan(()).notes(None) == ["nothing of yours to remove"]
    assert _scan((), (theirs,)).notes("2h")[1:] == ["nothing of yours to remove"]


class _Removes:
    def __init__(self, left: tuple[str, ...]):
        self.left, self.calls = left, []

    def get(self, kind, region):
        return self

    def remove(self, found):
        self.calls.append([f.id for f in found])
        return Teardown(tuple(f.line() for f in found), self.left)


def test_collect_stops_the_agent_first_and_names_what_is_left(tmp_path, monkeypatch):
    order: list[str] = []
    monkeypatch.setattr(agent, "stop", lambda root: order.append("agent stopped") or False)
    store = StateStore(tmp_path / "home")
    removes = _Removes(left=())
    gc.collect(store, removes, [_leftover("a")], order.append)
    assert order == ["agent stopped", "removed namespace a-0", "cluster a (local) is gone: nothing of it is left"]

    with pytest.raises(ProvisionError, match=r"some resources remain \(a: namespace a-0\)") as raised:
        gc.collect(store, _Removes(left=("namespace a-0",)), [_leftover("a")], order.append)
    assert "run `clusterctl gc` again" in raised.value.one_line()


class _Cloud:
    """A stand-in AWS provider: what everything_made() finds and whose owner tags owns() takes as the caller's."""

    lists_from_cloud = True
    region = "us-east-1"

    def __init__(self, found: list[Found], mine: set[str]):
        self.found, self.mine = found, mine

    def get(self, kind, region):
        return self

    def everything_made(self):
        return self.found

    def owns(self, owner):
        return owner in self.mine


def test_without_older_than_a_young_cluster_this_machine_has_no_record_of_is_listed_and_kept(tmp_path):
    from clusterctl.state import Record
    from clusterctl.types import Cluster

    now = 1_000_000.0
    store = StateStore(tmp_path / "home")
    store.save(Record(Cluster("ours", "aws", (), "us-east-1"), "up", now))
    cloud = _Cloud(
        [
            Found("fresh", "instance", "i-1", now - 60, "arn:me"),  # made a minute ago on another machine
            Found("aged", "instance", "i-2", now - 2 * 3600, "arn:me"),
            Found("ours", "instance", "i-3", now - 60, "arn:me"),  # young, but this machine's record says so
            Found("unknown", "VPC", "vpc-1", None, "arn:me"),
            Found("carols", "instance", "i-4", now - 30, "arn:carol"),
        ],
        {"arn:me"},
    )
    for force in (False, True):  # --force is about owners, never about age
        scan = gc.scan(store, cloud, "aws", None, None, force, lambda line: None, now)
        assert sorted(c.name for c in scan.chosen) == ["aged", "ours"]
        assert sorted(c.name for c in scan.young) == ["carols", "fresh", "unknown"]
        assert scan.notes(None)[0] == (
            "kept: 3 cluster(s) this machine has no record of, younger than 1h or of unknown age "
            "(carols of arn:carol, fresh, unknown): they may be in use elsewhere; --older-than AGE removes those "
            "at least that old"
        )
    # an age the user gives is the rule: a minute-old cluster goes, one of unknown age still never does
    scan = gc.scan(store, cloud, "aws", None, 30.0, False, lambda line: None, now)
    assert sorted(c.name for c in scan.chosen) == ["aged", "fresh", "ours"] and scan.young == ()
    assert [c.name for c in scan.others] == ["carols"]


def test_aws_owns_its_identity_and_this_machine_s_user_as_tagged_before_identities(tmp_path, monkeypatch):
    from clusterctl.providers.aws import discovery
    from clusterctl.providers.aws.provider import AwsProvider

    aws = AwsProvider("us-east-1", StateStore(tmp_path / "home"))
    monkeypatch.setattr(aws, "me", lambda: "arn:aws:iam::123456789012:user/ann")
    monkeypatch.setenv("LOGNAME", "carol")  # a login name anyone may set says nothing of who calls
    monkeypatch.setenv("USER", "carol")
    legacy = discovery.legacy_owner()
    assert not legacy.startswith("carol@") and legacy.endswith("@" + __import__("socket").gethostname())
    assert aws.owns("arn:aws:iam::123456789012:user/ann") and aws.owns(legacy)
    assert not aws.owns("carol@" + legacy.split("@", 1)[1]) and not aws.owns("ann@elsewhere") and not aws.owns("")
