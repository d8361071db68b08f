"""Cluster state: atomic 0600 records, exclusive locks naming the holder, damaged files refused."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest

from clusterctl.errors import ConfigError, StateError
from clusterctl.state import FORMAT, Record, StateStore
from clusterctl.types import Autostop, NodeRuntime
from state_support import sample


def test_save_load_round_trip_mode_0600(tmp_path):
    store = StateStore(tmp_path / "h")
    store.save(Record(sample(), "up", 1.0))
    path = store.record_path("alpha")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "h").stat().st_mode) == 0o700
    record = store.load("alpha")
    assert record.cluster == sample()
    assert record.cluster.leader.private_ip == "10.9.0.2" and record.status == "up"
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".cluster.json.")]  # no temp file left


def test_a_record_written_before_the_typed_fields_loads_and_reads_typed(tmp_path):
    """A cluster.json as `up` wrote it with string keys in extra: the typed reads see the same facts, and
    writing the typed values back gives the same strings."""
    old = {
        "format": FORMAT,
        "status": "up",
        "updated_at": 1.0,
        "note": "",
        "cluster": {
            **sample().to_dict(),
            "extra": {
                "bridge": "ccbx",
                "runtime": "own",
                "python": "/opt/conda/bin/python",
                "autostop_idle_stop": "600",
                "autostop_max_lifetime": "",  # and no autostop_idle_action: from before --idle-action
            },
        },
    }
    store = StateStore(tmp_path / "h")
    store.ensure_dir("alpha")
    store.record_path("alpha").write_text(json.dumps(old))
    cluster = store.load("alpha").cluster
    assert cluster.facts.autostop == Autostop(600, None, "terminate")
    assert (cluster.facts.runtime, cluster.facts.python) == ("own", "/opt/conda/bin/python")
    again = cluster.with_runtime(NodeRuntime("own", "/opt/conda/bin/python"))
    assert again.extra == old["cluster"]["extra"]
    assert Autostop(600, None, "terminate").extra() == {
        "autostop_idle_stop": "600",
        "autostop_max_lifetime": "",
        "autostop_idle_action": "terminate",
    }


def test_current_cluster_is_the_default(tmp_path):
    store = StateStore(tmp_path)
    with pytest.raises(StateError, match="no cluster given and none is current"):
        store.resolve(None)
    store.save(Record(sample("alpha"), "up", 1.0))
    store.save(Record(sample("beta"), "up", 1.0))
    store.set_current("beta")
    assert store.resolve(None).cluster.name == "beta"
    assert store.resolve("alpha").cluster.name == "alpha"
    assert [r.cluster.name for r in store.list()[0]] == ["alpha", "beta"]
    store.delete("beta")
    assert store.current() is None and not store.exists("beta")


@pytest.mark.parametrize("content", ['{"format": "clusterctl-state/1", "clus', '{"hello": 1}', "", "[]"])
def test_damaged_or_foreign_record_is_refused_and_kept(tmp_path, content):
    store = StateStore(tmp_path)
    store.ensure_dir("alpha")
    path = store.record_path("alpha")
    path.write_text(content)
    with pytest.raises(StateError) as info:
        store.load("alpha")
    assert str(path) in info.value.one_line() and "damaged or not clusterctl's" in info.value.one_line()
    assert path.read_text() == content  # nothing overwritten


def test_list_returns_the_damaged_records_and_prints_nothing(tmp_path, capfd):
    store = StateStore(tmp_path)
    store.save(Record(sample("alpha"), "stopped", 1.0, "stopped by autostop"))
    store.ensure_dir("beta")
    store.record_path("beta").write_text("{not json")
    records, damaged = store.list()
    assert [(r.cluster.name, r.status, r.note) for r in records] == [("alpha", "stopped", "stopped by autostop")]
    assert len(damaged) == 1 and damaged[0].startswith("skipped cluster 'beta': state file ")
    assert capfd.readouterr() == ("", "")  # the caller shows them: state does not reach up to the CLI


def test_a_status_never_written_is_refused(tmp_path):
    store = StateStore(tmp_path)
    store.save(Record(sample(), "up", 1.0))
    path = store.record_path("alpha")
    path.write_text(path.read_text().replace('"status": "up"', '"status": "stopping"'))
    with pytest.raises(StateError, match="damaged or not clusterctl's"):
        store.load("alpha")


def test_state_does_not_import_the_cli(tmp_path):
    StateStore(tmp_path).ensure_dir("beta")
    (tmp_path / "clusters" / "beta" / "cluster.json").write_text("[]")  # the branch that imported display
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from clusterctl.state import StateStore; "
            f"assert StateStore({str(tmp_path)!r}).list()[1]; "
            "print(sorted(m for m in sys.modules if m.startswith('clusterctl.cli')))",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    assert out.stdout.strip() == "[]", out.stderr


def test_lock_is_exclusive_and_names_the_holder(tmp_path):
    store = StateStore(tmp_path)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from clusterctl.state import StateStore\n"
            f"s = StateStore({str(tmp_path)!r})\n"
            "with s.lock('alpha'):\n    print('locked', flush=True); time.sleep(30)",
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(StateError, match=rf"busy: another clusterctl \(pid {holder.pid}\)"):
            with store.lock("alpha"):
                pass
    finally:
        holder.kill()
        holder.wait()
    with store.lock("alpha"):  # released when its holder died
        pass


@pytest.mark.parametrize("name", ["", "UPPER", "has space", "-x", "a" * 40, "../etc", "x;y"])
def test_bad_cluster_names_refused(tmp_path, name):
    with pytest.raises(ConfigError, match="invalid cluster name"):
        StateStore(tmp_path).cluster_dir(name)
