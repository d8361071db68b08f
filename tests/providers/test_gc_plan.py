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
