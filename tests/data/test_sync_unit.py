"""`clusterctl sync` without nodes: plans, inputs, the node agent's manifest and checks, relay scripts."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from clusterctl.data import node_scripts, outcome, plan as syncplan
from clusterctl.errors import ConfigError, UsageError
from clusterctl.node.sync import (
    check as node_check,
    guard as node_guard,
    main as node_main,
    manifest as node_manifest,
    scan as node_scan,
    tarstream as node_tarstream,
)
from clusterctl.remote import nodepkg, openssh
from clusterctl.remote.targets import SshTarget
from sync_support import agent_argv, agent_shell


# ---- plans ------------------------------------------------------------------------------------------
def test_chain_plan_is_one_stream_per_link():
    plan = syncplan.plan_relay(["a", "b", "c", "d"])
    assert plan.edges() == [("source", "a"), ("a", "b"), ("b", "c"), ("c", "d")]


def test_fanout_splits_the_rest_into_k_chains_of_equal_length():
    plan = syncplan.plan_relay([f"n{i}" for i in range(8)], fanout=3)
    assert plan.children["source"] == ("n0",)
    assert plan.children["n0"] == ("n1", "n4", "n6")
    assert plan.edges()[-1] == ("n2", "n3")
    receivers = [b for _, b in plan.edges()]
    assert sorted(receivers) == sorted(f"n{i}" for i in range(8))  # every node exactly once


def test_leader_source_is_the_head_of_its_chains():
    plan = syncplan.plan_relay(["L", "a", "b", "c"], fanout=2, source_is="L")
    assert plan.children["source"] == ("a", "c")
    assert "L" not in [b for _, b in plan.edges()]


def test_tree_rounds_double_the_holders():
    rounds = syncplan.plan_tree([f"n{i}" for i in range(7)])
    assert [len(r) for r in rounds] == [1, 2, 4]
    assert rounds[1] == [("source", "n1"), ("n0", "n2")]


def test_render_plan_names_every_hop():
    src = syncplan.Source("local", path="/data")
    lines = syncplan.render_plan("chain", ["a", "b"], src, 1, "a")
    assert lines[1:] == ["  source (/data) -> a", "  a -> b"]
    assert "round 2" in "\n".join(syncplan.render_plan("tree", ["a", "b", "c"], src, 1, "a"))
    s3 = syncplan.render_plan("chain", ["a", "b"], syncplan.Source("s3", bucket="bk", prefix="p/"), 1, "a")
    assert s3[1:] == ["  s3://bk/p/ -> a", "  s3://bk/p/ -> b"]


# ---- fan-out chosen by the numbers ------------------------------------------------------------------
MB = 1e6


def test_an_uplink_bound_sender_gets_one_chain():
    # two streams share the hop's rate: half each, far below 90%
    got = syncplan.choose_fanout({2: 18.9 * MB}, 18.8 * MB, receivers=7, sender="n0")
    assert got.k == 1
    assert got.why == (
        "one chain: 2 streams from n0 at once make 18.9 MB/s (9.4 MB/s each), below 90% of a hop's 18.8 MB/s "
        "(the sender's uplink is the limit)"
    )
    assert got.line().startswith("fanout 1 (auto): one chain: ")


def test_a_sender_with_twice_a_hops_rate_gets_two_chains():
    got = syncplan.choose_fanout({2: 37.0 * MB, 3: 37.4 * MB}, 18.8 * MB, receivers=7, sender="n0")
    assert got.k == 2
    assert got.why == (
        "2 chains: 2 streams from n0 at once make 37.0 MB/s (18.5 MB/s each), at least 90% of a hop's 18.8 MB/s; "
        "3 streams from n0 at once make 37.4 MB/s (12.5 MB/s each), below"
    )


def test_a_fat_uplink_is_capped_by_the_nodes_and_by_what_was_measured():
    fat = {k: k * 20 * MB for k in range(2, 9)}
    assert syncplan.choose_fanout(fat, 20 * MB, receivers=3).k == 3
    assert "one chain per node after" in syncplan.choose_fanout(fat, 20 * MB, receivers=3).why
    got = syncplan.choose_fanout({2: 40 * MB, 3: 60 * MB}, 20 * MB, receivers=7)
    assert got.k == 3 and got.why.endswith("(measured up to 3 streams)")


@pytest.mark.parametrize("receivers", [0, 1])
def test_too_few_nodes_get_one_chain_without_a_probe(receivers):
    got = syncplan.choose_fanout({2: 100 * MB}, 10 * MB, receivers=receivers)
    assert got.k == 1 and "nothing to measure" in got.why


def test_noisy_figures():
    hop = 20 * MB
    # 2 streams at 92% each: within the noise, two chains
    assert syncplan.choose_fanout({2: 2 * 0.92 * hop}, hop, receivers=5).k == 2
    # 88%: short
    assert syncplan.choose_fanout({2: 2 * 0.88 * hop}, hop, receivers=5).k == 1
    # a pass after a miss is noise: the first miss ends the search
    assert syncplan.choose_fanout({2: 1.9 * hop, 3: 2.4 * hop, 4: 3.9 * hop}, hop, receivers=5).k == 2
    # a gap in the figures ends it too
    assert syncplan.choose_fanout({2: 2 * hop, 4: 4 * hop}, hop, receivers=5).k == 2
    # figures that are not positive numbers count as short
    for bad in (float("nan"), 0.0, -1.0):
        assert syncplan.choose_fanout({2: 2 * hop}, bad, receivers=5).k == 1
        assert syncplan.choose_fanout({2: bad}, hop, receivers=5).k == 1
    got = syncplan.choose_fanout({}, hop, receivers=5)
    assert got.k == 1 and "were not measured" in got.why


def test_render_plan_says_why_for_a_measured_fanout():
    src = syncplan.Source("local", path="/data")
    chosen = syncplan.FanoutChoice(2, "2 chains: because")
    lines = syncplan.render_plan("chain", ["a", "b", "c", "d"], src, 2, "a", chosen)
    assert lines[1] == "  fanout 2 (auto): 2 chains: because"
    assert lines[2:] == ["  source (/data) -> a", "  a -> b", "  a -> d", "  b -> c"]


def test_the_hop_and_the_senders_two_streams_are_measured_at_once_over_other_links(tmp_path, monkeypatch):
    """From 4 receivers on, a first sync's probe takes one measurement's time for the hop and 2 streams (they
    were two measurements one after the other): the hop between the chain's last two nodes, the sender's streams
    to its first two."""
    import threading

    from clusterctl.data import probe, session

    targets = [SshTarget(f"10.9.0.{i}", f"10.9.0.{i}") for i in range(8)]
    s = session.SyncSession(
        targets, [t.hostname for t in targets], "", None, syncplan.Source("local", path="/d"), "d", cache_dir=tmp_path
    )
    both = threading.Barrier(2, timeout=5)  # broken (and the test failed) unless the first two run at once
    calls: list[tuple[str, list[str]]] = []

    def rate(s, sender, receivers):
        calls.append((sender.label, [n.label for n in receivers]))
        if len(calls) <= 2:
            both.wait()
        return 18e6  # a hop's rate, and the sender's uplink: two streams at half of it each

    monkeypatch.setattr(probe, "_rate", rate)
    got = probe.auto_fanout(s, s.nodes, nbytes=10**10)
    assert sorted(calls[:2]) == [("10.9.0.0", ["10.9.0.1", "10.9.0.2"]), ("10.9.0.6", ["10.9.0.7"])]
    assert len(calls) == 2 and got.k == 1  # 2 streams at half a hop's rate each: the uplink is the limit
    assert got.why.startswith("one chain: 2 streams from 10.9.0.0 at once make 18.0 MB/s (9.0 MB/s each), below")


def test_auto_fanout_asks_no_node_when_there_is_nothing_to_measure(tmp_path):
    from clusterctl.data import probe, session

    targets = [SshTarget(f"10.9.0.{i}", f"10.9.0.{i}") for i in range(4)]
    s = session.SyncSession(
        targets,
        [t.hostname for t in targets],
        "",
        None,
        syncplan.Source("local", path="/d"),
        "d",
        fanout=None,
        cache_dir=tmp_path,
    )  # no pool: any ssh would raise
    got = probe.auto_fanout(s, s.nodes, nbytes=probe.PROBE_MIN_BYTES - 1)
    assert got == syncplan.FanoutChoice(1, "one chain: 16.0 MB to stream, too little to be worth a probe")
    got = probe.auto_fanout(s, s.nodes[:2], nbytes=10**12)
    assert got.k == 1 and got.why == "2 node(s) take the stream: one chain, nothing to measure"
    # a hop's rate measured within the hour: a stream it shows too short to probe asks no node either
    probe._keep_hop(s, 18e6)
    got = probe.auto_fanout(s, s.nodes, nbytes=200_000_000)
    assert got.k == 1 and got.why.startswith("one chain: 200.0 MB at a hop's 18.0 MB/s is 11.1 s of streaming")
    assert got.why.endswith("more than it saves (a hop's rate as measured 0 s ago)"), got.why
    # ... a long one, or a rate kept too long ago, is measured (here: no pool, so the probe fails)
    for nbytes, at in ((10**10, time.time()), (200_000_000, time.time() - probe.HOP_RATE_TTL - 1)):
        probe._hop_file(s).write_text(json.dumps({"hop": 18e6, "at": at}))
        got = probe.auto_fanout(s, s.nodes, nbytes=nbytes)
        assert got.k == 1 and got.why.startswith("one chain: the probe failed ("), got.why
    other = session.SyncSession(
        targets[1:],
        [t.hostname for t in targets[1:]],
        "",
        None,
        syncplan.Source("local", path="/d"),
        "d",
        cache_dir=tmp_path,
    )
    assert probe._hop_file(other) != probe._hop_file(s)  # another node set: another cluster's rate
    pinned = tmp_path / "known_hosts"
    pinned.write_text("10.9.0.0 ssh-ed25519 AAAAold\n")
    s.known_hosts = str(pinned)
    before = probe._hop_file(s)
    assert probe._hop_file(s) == before
    pinned.write_text("10.9.0.0 ssh-ed25519 AAAAnew\n")  # a new cluster at the old addresses: new host keys
    assert probe._hop_file(s) != before


def test_probe_times_every_stream_as_its_sink_saw_it(tmp_path):
    """The node package's probe and sink, with a local hop in place of ssh (run the remote command here)."""
    hop = [sys.executable, "-c", "import os, sys; os.execvp('sh', ['sh', '-c', sys.argv[3]])"]
    sink = f"{agent_shell()} sink"
    args = ["probe", "--seconds", "0.3", "--hop", json.dumps(hop), "--remote", sink, "--", "a", "-b"]
    proc = subprocess.run(agent_argv(*args), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    streams = json.loads(proc.stdout)["streams"]
    assert [st["address"] for st in streams] == ["a", "-b"]
    for st in streams:
        assert st["bytes"] > 0 and 0.1 < st["seconds"] < 5
    args[args.index(sink)] = "exit 7"  # a sink that never starts: one JSON error, exit 1
    proc = subprocess.run(agent_argv(*args), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "the probe's sink did not start" in json.loads(proc.stdout)["error"]


# ---- inputs -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("dst", ["/", "//", "/./", "/tmp/..", "/../..", "~", "~/", ".", "..", "../x", "", "a\nb"])
def test_dangerous_or_broken_dst_is_refused(dst):
    with pytest.raises(UsageError):
        syncplan.check_dst(dst)


@pytest.mark.parametrize("dst, expect", [("~/data", "data"), ("/tmp/x/", "/tmp/x"), ("-d 'q' $H", "-d 'q' $H")])
def test_dst_is_normalised(dst, expect):
    assert syncplan.check_dst(dst) == expect


def test_sources(tmp_path):
    assert syncplan.parse_source("s3://my-bucket/a/b") == syncplan.Source("s3", bucket="my-bucket", prefix="a/b/")
    assert syncplan.parse_source("s3://my-bucket") == syncplan.Source("s3", bucket="my-bucket", prefix="")
    assert syncplan.parse_source("leader:~/x y") == syncplan.Source("leader", path="~/x y")
    assert syncplan.parse_source(str(tmp_path)).path == str(tmp_path)
    with pytest.raises(ConfigError, match="does not exist"):
        syncplan.parse_source(str(tmp_path / "missing"))
    (tmp_path / "f").write_text("x")
    with pytest.raises(ConfigError, match="is not a folder"):
        syncplan.parse_source(str(tmp_path / "f"))
    with pytest.raises(UsageError):
        syncplan.parse_source("s3://Bad_Bucket/x")
    with pytest.raises(UsageError):
        syncplan.parse_source("leader:")


# ---- the agent --------------------------------------------------------------------------------------
def _tree(root: Path) -> None:
    (root / "a b").mkdir(parents=True)
    (root / "a b" / "it's $x").write_bytes(b"hello")
    (root / "-lead").write_bytes(b"x" * 3000)
    (root / "empty").mkdir()
    (root / "new\nline").write_bytes(b"nl")
    os.symlink("-lead", root / "link")
    (root / ".clusterctl-sync").mkdir()
    (root / ".clusterctl-sync" / "COMPLETE").write_text("{}")
    (root / "a b" / ".clusterctl-partial").mkdir()
    (root / "a b" / ".clusterctl-partial" / "junk").write_text("half")


def test_scan_lists_dirs_files_links_with_sha256_and_leaves_out_its_own(tmp_path):
    _tree(tmp_path)
    entries = {e["p"]: e for e in node_scan.scan(str(tmp_path))}
    assert set(entries) == {"a b", "a b/it's $x", "-lead", "empty", "new\nline", "link"}
    assert entries["a b/it's $x"] == {"p": "a b/it's $x", "t": "f", "s": 5, "h": hashlib.sha256(b"hello").hexdigest()}
    assert entries["link"] == {"p": "link", "t": "l", "l": "-lead"}
    assert entries["empty"]["t"] == "d"


def test_manifest_entries_are_read_once_into_a_typed_value_and_written_back_unchanged(tmp_path):
    """The operator reads every manifest entry into node/sync/manifest.py's ManifestEntry and sends the nodes its wire form:
    the same dicts, key order included (what scan and s3list wrote), so the bytes the nodes check are as before."""
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f.bin").write_bytes(b"abc")
    (tmp_path / "link").symlink_to("d/f.bin")
    wire = node_scan.scan(str(tmp_path)) + [
        {"p": "o", "t": "f", "s": 5, "etag": "e" * 32},
        {"p": "k", "t": "f", "s": 5, "etag": "e" * 32 + "-2", "sha256b64": "c2hh", "h": "ab" * 32},
    ]
    entries = [node_manifest.ManifestEntry.from_wire(e) for e in wire]
    assert [e.kind for e in entries[:3]] == ["d", "f", "l"] and entries[1].path == "d/f.bin"
    assert entries[1].sha256 == hashlib.sha256(b"abc").hexdigest() and entries[2].link == "d/f.bin"
    assert [e.nbytes for e in entries] == [0, 3, 0, 5, 5] and entries[3].sha256 is None
    assert json.dumps([e.to_wire() for e in entries]) == json.dumps(wire)
    adopted = entries[3]._replace(sha256="cd" * 32)  # the S3 round's recorded sha256 goes last, as before
    assert list(adopted.to_wire()) == ["p", "t", "s", "etag", "h"]


def _agent(*args: str) -> tuple[int, dict]:
    proc = subprocess.run(agent_argv(*args), capture_output=True, text=True)
    return proc.returncode, json.loads(proc.stdout.strip().splitlines()[-1])


def _lines(m: Path, entries: list[dict]) -> Path:
    """A manifest as the operator writes it: JSON Lines, the header first."""
    m.write_bytes(node_manifest.manifest_header("test") + b"".join(node_manifest.manifest_line(e) for e in entries))
    return m


def _manifest(tmp_path: Path, src: Path) -> Path:
    return _lines(tmp_path / "m.jsonl", node_scan.scan(str(src)))


def test_check_finds_a_flipped_byte_with_size_and_mtime_kept_and_marks_only_a_whole_copy(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    _tree(src)
    m = _manifest(tmp_path, src)
    subprocess.run(["cp", "-a", f"{src}/.", str(dst)], check=True)
    rc, out = _agent("check", "--dst", str(dst), "--manifest", str(m), "--reset", "--mark", "test")
    assert rc == 0 and out["bad"] == [] and out["marked"]
    marker = json.loads((dst / ".clusterctl-sync" / "COMPLETE").read_text())
    assert marker["manifest_sha256"] == out["digest"] == hashlib.sha256(m.read_bytes()).hexdigest()
    assert marker["files"] == 3 and marker["bytes"] == 3007
    assert (dst / ".clusterctl-sync" / "manifest.jsonl").read_bytes() == m.read_bytes()

    f = dst / "-lead"
    st = f.stat()
    data = bytearray(f.read_bytes())
    data[1234] ^= 0x01
    f.write_bytes(bytes(data))
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    rc, out = _agent("check", "--dst", str(dst), "--manifest", str(m), "--reset", "--mark", "test")
    assert rc == 0 and out["bad"] == ["-lead"] and out["bad_bytes"] == 3000 and not out["marked"]
    assert not (dst / ".clusterctl-sync" / "COMPLETE").exists()  # removed first, not written again


def test_fresh_says_an_empty_dst_lacks_everything_without_a_manifest_and_touches_nothing_else(tmp_path):
    rc, out = _agent("fresh", "--dst", str(tmp_path / "new"))  # missing: made, with its state folder
    assert rc == 0 and out["fresh"] and out["root"] == str(tmp_path / "new") and out["free"] > 0
    assert (tmp_path / "new" / ".clusterctl-sync").is_dir()
    state = tmp_path / "was" / ".clusterctl-sync"  # a copy whose data is gone: only its state is left
    state.mkdir(parents=True)
    (state / "COMPLETE").write_text("{}")
    rc, out = _agent("fresh", "--dst", str(tmp_path / "was"), "--delete")
    assert rc == 0 and out["fresh"] and not (state / "COMPLETE").exists()  # not complete until verified
    full = tmp_path / "full"
    (full / ".clusterctl-sync").mkdir(parents=True)
    (full / ".clusterctl-sync" / "COMPLETE").write_text("{}")
    (full / "a.bin").write_bytes(b"a")
    rc, out = _agent("fresh", "--dst", str(full))
    assert rc == 0 and out == {"root": str(full), "fresh": False}
    assert (full / ".clusterctl-sync" / "COMPLETE").exists()  # left for the check, which reads the manifest
    (tmp_path / "file").write_bytes(b"x")
    rc, out = _agent("fresh", "--dst", str(tmp_path / "file"))
    assert rc == 0 and not out["fresh"]
    rc, out = _agent("fresh", "--dst", "/")
    assert rc == 2 and "refusing to sync into /" in out["error"]


def _judge(src: Path, boot: str | None = None) -> list[str]:
    """The agent's --src options for a folder of this machine, as data.sync passes them."""
    real = os.path.realpath(src)
    boot = node_guard.boot_id() if boot is None else boot
    return ["--src", real, "--src-id", node_guard.folder_id(real), "--src-boot", boot]


def test_dst_is_judged_against_src_after_every_symlink_before_anything_is_touched(tmp_path):
    proj = tmp_path / "proj"
    (proj / "imagenet").mkdir(parents=True)
    (proj / "imagenet" / "a.bin").write_bytes(b"a")
    (proj / "notes.txt").write_text("mine")
    os.symlink(proj, proj / "current")  # DST holds SRC through it
    os.symlink(proj / "imagenet" / ".", tmp_path / "same")  # DST is SRC through it
    os.symlink(proj / "imagenet", tmp_path / "into")  # DST inside SRC through it: into/sub
    m = _manifest(tmp_path, proj / "imagenet")
    judge = _judge(proj / "imagenet")
    for dst, said in (
        (proj / "current", f"it resolves to {proj}, which holds SRC {proj / 'imagenet'}"),
        (tmp_path / "into" / "sub", f"it resolves to {proj / 'imagenet' / 'sub'}, inside SRC {proj / 'imagenet'}"),
        (tmp_path / "same", f"it resolves to {proj / 'imagenet'}, which is SRC {proj / 'imagenet'} itself"),
    ):
        for cmd in (["fresh"], ["check", "--manifest", str(m), "--reset", "--mark", "t"]):
            rc, out = _agent(*cmd, "--dst", str(dst), "--delete", *judge)
            assert rc == 2 and out["error"] == f"refusing to sync into {dst}: {said}", out
            assert out["hint"] == "sync into a folder outside SRC that does not hold it (e.g. one beside it)"
        rc, out = _agent("fresh", "--dst", str(dst), *judge)  # without --delete too: tar would write into SRC
        assert rc == 2, out
    assert sorted(os.listdir(proj)) == ["current", "imagenet", "notes.txt"]
    assert os.listdir(proj / "imagenet") == ["a.bin"]  # no state folder, no marker, nothing removed
    # SRC itself with --src-may-be-dst (a leader source): only checked, nothing deleted (the fifo is no data)
    os.mkfifo(proj / "imagenet" / "fifo")
    rc, out = _agent(
        "check", "--dst", str(tmp_path / "same"), "--manifest", str(m), "--delete", *judge, "--src-may-be-dst"
    )
    assert rc == 0 and out["source"] and out["bad"] == [] and (proj / "imagenet" / "fifo").exists()
    rc, out = _agent("fresh", "--dst", str(tmp_path / "same"), "--delete", *judge, "--src-may-be-dst")
    assert rc == 0 and out == {"root": str(proj / "imagenet"), "fresh": False, "source": True}
    # another kernel (boot id), or another folder at SRC's path (a node's own /root): no overlap to judge
    rc, out = _agent("fresh", "--dst", str(proj / "current"), *_judge(proj / "imagenet", boot="another-kernel"))
    assert rc == 0 and not out["fresh"]
    other = ["--src", str(proj / "imagenet"), "--src-id", "1:2", "--src-boot", node_guard.boot_id()]
    rc, out = _agent("fresh", "--dst", str(proj / "current"), *other)
    assert rc == 0
    # a folder beside SRC, and a symlink to one: fine
    os.symlink(tmp_path / "beside", tmp_path / "via")
    for dst in (tmp_path / "beside", tmp_path / "via"):
        rc, out = _agent("check", "--dst", str(dst), "--manifest", str(m), "--delete", *judge, "--mark", "t")
        assert rc == 0 and out["bad"] == ["a.bin"] and not out["source"] and out["root"] == str(tmp_path / "beside")


def test_src_seen_under_another_path_is_found_above_dst():
    """SRC's identity (device:inode) is what counts: a DST whose resolved folder, or one above it, is SRC
    seen under another path (a bind mount) lies inside it. Here: SRC given under a path this machine has not."""
    real = os.path.realpath(os.path.dirname(node_guard.__file__))
    fid = node_guard.folder_id(real)
    got = node_guard.source_relation(f"{real}/sub/x", "/no/such/path", fid, node_guard.boot_id())
    assert got == ("inside", real)
    assert node_guard.source_relation(real, "/no/such/path", fid, node_guard.boot_id()) == ("is", real)
    assert node_guard.source_relation(real, "/no/such/path", fid, "") == ("", "")


def test_clusterctl_own_folders_are_never_a_dst():
    home = "/home/u"
    for real in (
        "/opt/clusterctl-runtime",
        "/opt/clusterctl-runtime/abc/lib",
        "/opt/clusterctl/x",
        "/home/u/.clusterctl",
    ):
        assert "clusterctl's own folder" in (node_guard.dst_problem(real, home, False) or ""), real
    assert node_guard.dst_problem("/opt/clusterctl-runtime/.incoming/abc", home, True) is None  # the runtime relay
    assert node_guard.dst_problem("/opt/clusterctl-data", home, True) is None
    assert "holds clusterctl's own folder" in (node_guard.dst_problem("/opt", home, True) or "")


def test_the_agents_own_folders_are_those_the_runtime_and_the_watchdog_use():
    """The node package imports nothing of the rest of clusterctl: its copies of these paths are held to the
    modules that own them."""
    from clusterctl.autostop import watchdog
    from clusterctl.data import session
    from clusterctl.runtime import install, spec

    assert spec.ROOT in node_guard.TOOL_TREES and install.INCOMING == node_guard.RUNTIME_INCOMING
    assert os.path.dirname(watchdog.AWS_PROGRAM) in node_guard.TOOL_TREES
    for work in (session.WORK, install.WORK):
        assert work.split("/")[0] == node_guard.TOOL_HOME


def test_check_replaces_wrong_types_and_delete_mirrors(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    _tree(src)
    m = _manifest(tmp_path, src)
    (dst / "empty").mkdir(parents=True)
    (dst / "-lead").mkdir()  # a folder where a file belongs
    (dst / "extra").write_text("not in the source")
    os.symlink("/etc", dst / "a b")  # a link where a folder belongs: never followed
    rc, out = _agent("check", "--dst", str(dst), "--manifest", str(m), "--reset")
    assert rc == 0
    assert set(out["bad"]) == {"a b", "a b/it's $x", "-lead", "new\nline", "link"}
    assert not (dst / "-lead").exists() and not (dst / "a b").exists()
    assert (dst / "extra").exists()
    rc, out = _agent("check", "--dst", str(dst), "--manifest", str(m), "--delete")
    assert not (dst / "extra").exists() and (dst / ".clusterctl-sync").is_dir()


def _stream_into(tmp_path: Path, src: Path, dst: Path, tamper=None) -> Path:
    """src as GNU tar streams it (the chain's way), through the agent's recv into tar -x at dst; tamper(bytes)
    may change the stream on the way. The hashes recv kept, as the relay keeps them."""
    names = [e["p"] for e in node_scan.scan(str(src))]
    stream = subprocess.run(
        ["tar", "-C", str(src), "--null", "--no-recursion", "-T", "-", "-cf", "-"],
        input=b"".join(os.fsencode(n) + b"\0" for n in names),
        capture_output=True,
        check=True,
    ).stdout
    if tamper:
        stream = tamper(stream)
    dst.mkdir(exist_ok=True)
    hashes = tmp_path / "recv.json"
    proc = subprocess.run(
        [
            "bash",
            "-c",
            f"{agent_shell()} recv --hashes "
            f"{shlex.quote(str(hashes))} | tar -C {shlex.quote(str(dst))} -xf -; "
            'echo "${PIPESTATUS[*]}"',
        ],
        input=stream,
        capture_output=True,
        check=True,
    )
    assert proc.stdout.split() == [b"0", b"0"], proc.stderr
    return hashes


def test_a_copy_hashed_as_written_is_verified_without_reading_it_back(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    _tree(src)
    os.link(src / "-lead", src / "hard")  # tar sends it as a link: it gets its target's hash
    m = _manifest(tmp_path, src)
    hashes = _stream_into(tmp_path, src, dst)
    rc, out = _agent(
        "check", "--dst", str(dst), "--manifest", str(m), "--reset", "--mark", "t", "--received", str(hashes)
    )
    assert rc == 0 and out["bad"] == [] and out["marked"]
    assert out["reread"] == 0 and out["streamed"] == 4  # no file read back
    # a byte flipped on disk after tar wrote it, size and mtime kept: the hashes as written do not see it,
    # the read-back does (what --verify disk, resumed and repaired files get)
    f = dst / "-lead"
    st = f.stat()
    data = bytearray(f.read_bytes())
    data[5] ^= 1
    f.write_bytes(bytes(data))
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    rc, out = _agent("check", "--dst", str(dst), "--manifest", str(m), "--reset", "--mark", "t")
    assert out["bad"] == ["-lead", "hard"] and out["reread"] == 4 and not out["marked"]


def test_a_fresh_copy_whose_stream_was_the_manifest_is_proved_by_its_digest_and_any_other_is_checked(tmp_path):
    """An empty DST that got the manifest's whole stream (recv's digest is the operator's) is marked without
    the manifest being read or a file looked up; the marker is the one the entry-by-entry check writes. A
    stream that left something out, or the digest of another manifest, falls back to that check."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    _odd_tree(src)
    m = _manifest(tmp_path, src)
    wire = node_scan.scan(str(src))
    digest = node_tarstream.stream_digest([node_manifest.ManifestEntry.from_wire(e) for e in wire])
    assert digest
    hashes = _stream_into(tmp_path, src, dst)
    head = json.loads(hashes.read_bytes().split(b"\n", 1)[0])
    files = [e for e in wire if e["t"] == "f"]
    assert head == {"stream": digest, "files": len(files), "bytes": sum(e["s"] for e in files)}

    def check(into: Path, received: Path, *digest: str) -> tuple[int, dict]:
        args = ["--dst", str(into), "--manifest", str(m), "--mark", "t", "--received", str(received)]
        return _agent("check", *args, *(["--stream-digest", *digest] if digest else []))

    rc, out = check(dst, hashes, digest)
    assert rc == 0 and out["by_stream"] and out["marked"] and out["bad"] == [] and out["reread"] == 0
    assert out["streamed"] == len(files) and out["digest"] == hashlib.sha256(m.read_bytes()).hexdigest()
    fast = json.loads((dst / ".clusterctl-sync" / "COMPLETE").read_text())
    assert (dst / ".clusterctl-sync" / "manifest.jsonl").read_bytes() == m.read_bytes()
    rc, slow = check(dst, hashes)  # entry by entry, from the same hashes as written: the same marker
    assert rc == 0 and not slow["by_stream"] and slow["marked"] and slow["streamed"] == len(files)
    again = json.loads((dst / ".clusterctl-sync" / "COMPLETE").read_text())
    assert {k: v for k, v in again.items() if k != "verified_at"} == {
        k: v for k, v in fast.items() if k != "verified_at"
    }
    # a stream of all but one file, into another empty DST: not the manifest's digest, so every entry is
    # looked up and the missing one found; the copy is not marked
    part = tmp_path / "part"
    gone = files[3]["p"]
    (src / gone).rename(tmp_path / "aside")
    hashes = _stream_into(tmp_path, src, part)
    (tmp_path / "aside").rename(src / gone)
    rc, out = check(part, hashes, digest)
    assert not out["by_stream"] and out["bad"] == [gone] and not out["marked"]
    assert not (part / ".clusterctl-sync" / "COMPLETE").exists()
    # the manifest's stream, but the operator's digest of another: checked entry by entry (and right)
    other = tmp_path / "other"
    hashes = _stream_into(tmp_path, src, other)
    rc, out = check(other, hashes, "0" * 64)
    assert rc == 0 and not out["by_stream"] and out["marked"] and out["reread"] == 0


def test_a_byte_changed_on_the_wire_is_caught_without_the_read_back(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    _tree(src)
    m = _manifest(tmp_path, src)
    body = (src / "-lead").read_bytes()

    def flip(stream: bytes) -> bytes:  # one byte of -lead's data, in the middle of the stream
        at = stream.index(body[:64]) + 1000
        return stream[:at] + bytes([stream[at] ^ 1]) + stream[at + 1 :]

    hashes = _stream_into(tmp_path, src, dst, flip)
    rc, out = _agent(
        "check", "--dst", str(dst), "--manifest", str(m), "--reset", "--mark", "t", "--received", str(hashes)
    )
    assert out["bad"] == ["-lead"] and out["bad_bytes"] == 3000 and not out["marked"]
    assert out["reread"] == 0  # caught by its hash as written, not by reading it back
    assert not (dst / ".clusterctl-sync" / "COMPLETE").exists()


def test_recv_passes_a_stream_it_cannot_follow_through_whole_and_keeps_no_hashes(tmp_path):
    data = os.urandom(200_000)
    out = tmp_path / "h.json"
    proc = subprocess.run(agent_argv("recv", "--hashes", str(out)), input=data, capture_output=True)
    assert proc.stdout == data and proc.returncode == 1 and not out.exists()
    assert b"cannot follow the tar stream" in proc.stderr


@pytest.mark.parametrize("fmt", ["gnu", "pax"])
def test_tar_follower_hashes_long_names_and_links_fed_in_odd_pieces(tmp_path, fmt):
    src = tmp_path / "src"
    long = "x" * 150 + "/" + "y" * 120 + ".bin"  # past ustar's 100 characters: a GNU long name or a pax path
    files = {long: os.urandom(70_001), "small": b"s", "empty": b""}
    for rel, data in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    os.link(src / long, src / "hard")
    stream = subprocess.run(
        ["tar", "-C", str(src), f"--format={fmt}", "-cf", "-", "."], capture_output=True, check=True
    ).stdout
    follower = node_tarstream.TarFollower()
    view, i, step = memoryview(stream), 0, 1
    while i < len(view):  # pieces of 1, 2, 3 ... bytes: headers and data split anywhere
        follower.feed(view[i : i + step])
        i, step = i + step, step % 997 + 1
    assert follower.done
    got = {k.removeprefix("./"): v[:2] for k, v in follower.hashes.items()}
    want = {k: [hashlib.sha256(v).hexdigest(), len(v)] for k, v in files.items()}
    want["hard"] = want[long]
    assert got == want


def _odd_tree(src: Path) -> dict[str, bytes]:
    """Files for the follower's paths: many small ones (whole in a piece), sizes around a block, one big
    one (across pieces), a long name, odd names, and a file dated past GNU's 11 octal digits (base-256)."""
    files = {f"d{i % 3}/f{i:03d}": os.urandom(i * 37 % 3001) for i in range(300)}
    files.update({f"sizes/{n}": os.urandom(n) for n in (0, 1, 511, 512, 513, 1024, 7777)})
    files["big"] = os.urandom(70_001)
    files["x" * 120 + "/" + "y" * 90] = b"long"  # a GNU long-name member (or pax path) before its file
    files["new\nline"] = b"nl"
    files[os.fsdecode(b"bad-\xff name")] = b"not utf-8"
    files["far"] = b"dated 2286"
    for rel, data in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    os.utime(src / "far", (10**10, 10**10))  # 8^11 s and beyond: GNU tar writes mtime base-256 (pax: a record)
    os.link(src / "d0/f000", src / "hard")
    os.symlink("big", src / "link")
    return files


def _tar(src: Path, fmt: str) -> bytes:
    """src as the chain streams it: tar -C SRC --null --no-recursion -T LIST -cf - (format fmt)."""
    names = [e["p"] for e in node_scan.scan(str(src))]
    return subprocess.run(
        ["tar", "-C", str(src), f"--format={fmt}", "--null", "--no-recursion", "-T", "-", "-cf", "-"],
        input=b"".join(os.fsencode(n) + b"\0" for n in names),
        capture_output=True,
        check=True,
    ).stdout


def _follow(stream: bytes, piece: int) -> node_tarstream.TarFollower:
    follower = node_tarstream.TarFollower()
    view = memoryview(stream)
    for i in range(0, len(view), piece):
        follower.feed(view[i : i + piece])
    return follower


@pytest.mark.parametrize("fmt", ["gnu", "pax"])
def test_tar_follower_fast_and_slow_paths_give_hashlibs_hashes_in_any_piece_size(tmp_path, fmt):
    """A real tar stream fed in pieces of 1, 511, 513, 7777 bytes and 1 MiB: members whole in a piece (the
    fast path: a plain file in one step; a long-name or pax member and its file), headers and data split
    across pieces (the state machine), base-256 mtimes, hard links: every hash is hashlib's of the file."""
    src = tmp_path / "src"
    files = _odd_tree(src)
    stream = _tar(src, fmt)
    want = {k: [hashlib.sha256(v).hexdigest(), len(v), int((src / k).stat().st_mtime)] for k, v in files.items()}
    want["hard"] = want["d0/f000"][:2] + [int((src / "hard").stat().st_mtime)]
    assert want["far"][2] == 10**10
    # the stream's digest is the one the operator makes of the manifest's entries in the order it streamed
    entries = [node_manifest.ManifestEntry.from_wire(e) for e in node_scan.scan(str(src))]
    digest = node_tarstream.stream_digest(entries)
    assert digest and {e.kind for e in entries} == {"d", "f", "l"}
    for piece in (1, 511, 513, 7777, 1 << 20):
        follower = _follow(stream, piece)
        assert follower.done and follower.hashes == want, piece
        assert follower.stream.hexdigest() == digest, piece
        assert (follower.files, follower.bytes) == (len(want), sum(w[1] for w in want.values()))
    # one entry changed, missing, or in another order: another digest
    f = next(i for i, e in enumerate(entries) if e.kind == "f")
    assert node_tarstream.stream_digest(entries[:f] + [entries[f]._replace(size=1)] + entries[f + 1 :]) != digest
    assert node_tarstream.stream_digest(entries[1:]) != digest and node_tarstream.stream_digest(entries[::-1]) != digest
    assert node_tarstream.stream_digest([entries[f]._replace(sha256=None)]) is None  # S3's, not yet recorded


def test_tar_follower_takes_a_base256_size_and_still_checks_every_header_checksum(tmp_path):
    """A size in GNU base-256 (as tar writes 8 GiB and more; here put into a real stream's header, the checksum
    made again) leaves the fast path and is read right; a byte changed in a header, whole in a piece or split
    across pieces, is caught by its checksum."""
    src = tmp_path / "src"
    src.mkdir()
    data = os.urandom(5000)
    (src / "one").write_bytes(data)
    (src / "two").write_bytes(b"2")
    stream = bytearray(_tar(src, "gnu"))
    assert stream[:3] == b"one" and stream[156:157] == b"0"
    stream[124:136] = b"\x80" + len(data).to_bytes(11, "big")
    stream[148:156] = b"%06o\0 " % (sum(stream[:148]) + 256 + sum(stream[156:512]))
    want = {"one": hashlib.sha256(data).hexdigest(), "two": hashlib.sha256(b"2").hexdigest()}
    for piece in (1, 511, 513, 7777, 1 << 20):
        follower = _follow(bytes(stream), piece)
        assert follower.done and {k: v[0] for k, v in follower.hashes.items()} == want, piece
    clean = _tar(src, "gnu")
    second = clean.index(b"two\0")  # the second member's header: a plain file, fast path when whole
    for at in (0, second + 1, second + 130):  # base-256 header's name, a plain header's name, its size field
        bad = bytearray(stream if at == 0 else clean)
        bad[at] ^= 1
        for piece in (511, 1 << 20):
            with pytest.raises(node_tarstream.TarStreamError):
                _follow(bytes(bad), piece)


def test_manifest_cache_rehashes_only_what_changed(tmp_path):
    src = tmp_path / "src"
    _tree(src)
    cache = tmp_path / "state" / "m.json"
    rc, first = _agent("manifest", "--cache", str(cache), "--", str(src))
    assert rc == 0 and first["hashed"] == 3
    rc, again = _agent("manifest", "--cache", str(cache), "--", str(src))
    assert again["hashed"] == 0 and again["entries"] == first["entries"]
    f = src / "-lead"
    st = f.stat()
    f.write_bytes(b"y" * 3000)  # same size, mtime set back: the ctime still says it changed
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    rc, third = _agent("manifest", "--cache", str(cache), "--", str(src))
    assert third["hashed"] == 1
    assert {e["p"]: e.get("h") for e in third["entries"]}["-lead"] == hashlib.sha256(b"y" * 3000).hexdigest()
    want = hashlib.sha256(b"hello").hexdigest()
    text = cache.read_bytes()
    assert text.count(want.encode()) == 1
    cache.write_bytes(text.replace(want.encode(), b"0" * 64))  # not what was written: not used
    rc, fourth = _agent("manifest", "--cache", str(cache), "--", str(src))
    assert fourth["hashed"] == 3 and fourth["entries"] == third["entries"]
    rc, fifth = _agent("manifest", "--cache", str(cache), "--", str(src))
    assert fifth["hashed"] == 0  # written again whole by the fourth
    # an older version's cache (a [key, sha256] list per file), sealed as it was: not taken, all hashed again
    files = json.loads(cache.read_bytes().partition(b"\n")[2])["files"]
    old = {p: [[int(x) for x in v[:-65].split()], v[-64:]] for p, v in files.items()}
    body = json.dumps({"root": str(src), "files": old}).encode()
    cache.write_bytes(hashlib.sha256(body).hexdigest().encode() + b"\n" + body)
    rc, sixth = _agent("manifest", "--cache", str(cache), "--", str(src))
    assert sixth["hashed"] == 3 and sixth["entries"] == third["entries"]


def test_agent_argv_takes_values_that_start_with_a_dash():
    cmd, args = node_main.parse(["check", "--dst", "-data", "--manifest", "m", "--reset", "--received", "-r"])
    assert cmd == "check" and args == {"dst": "-data", "manifest": "m", "reset": True, "received": "-r"}
    assert node_main.parse(["manifest", "--out", "o", "--", "-src"]) == ("manifest", {"root": "-src", "out": "o"})
    assert node_main.parse(["s3list", "--", "b", "-p/"])[1] == {"bucket": "b", "prefix": "-p/"}
    for bad in (["check", "--manifest", "m"], ["nope"], ["relay"], ["check", "--dst", "d", "--manifest", "m", "--x"]):
        with pytest.raises(node_manifest.AgentError) as exc:
            node_main.parse(bad)
        assert exc.value.code == 2


def test_hostile_manifest_paths_are_refused(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "extra").write_text("x")
    ok = {"p": "fine", "t": "d"}
    for bad in ["../x", "/etc/passwd", "a/../../x", "a//b", ".clusterctl-sync/COMPLETE", "a/.clusterctl-partial/x"]:
        m = _lines(tmp_path / "m.jsonl", [ok, {"p": bad, "t": "f", "s": 1, "h": "0" * 64}])
        rc, out = _agent("check", "--dst", str(tmp_path / "d"), "--manifest", str(m), "--delete")
        assert rc == node_manifest.EXIT_INPUT and "manifest refused" in out["error"], bad
        assert (tmp_path / "d" / "extra").exists()  # --delete never ran on a manifest read only in part
    # the reader searches every path once for anything suspect before asking path_problem: a superset
    names = ["", "a", "a/b", "/a", "a//b", "a/", "./a", "a/.", "..", "a/../b", "a\0b", "...", "a..b", ".a/..b/c."]
    names += [".clusterctl-sync", ".clusterctl-sync/x", "x/.clusterctl-sync", ".clusterctl-syncx"]
    names += ["a/.clusterctl-partial/b", ".clusterctl-partial", "x/.clusterctl-partialy", "new\nline", "\udcff"]
    for name in names:
        assert node_manifest.path_problem(name) is None or node_manifest._SUSPECT.search(name), name
    assert sum(node_manifest.path_problem(n) is not None for n in names) == 13
    # not JSON Lines of this version (an older version's one document, a broken line): refused too
    (tmp_path / "old.json").write_text(json.dumps({"entries": [ok]}))
    _lines(tmp_path / "broken.jsonl", [ok]).write_bytes((tmp_path / "broken.jsonl").read_bytes() + b"{nope\n")
    for m in ("old.json", "broken.jsonl"):
        rc, out = _agent("check", "--dst", str(tmp_path / "d"), "--manifest", str(tmp_path / m))
        assert rc == node_manifest.EXIT_INPUT and "manifest refused" in out["error"], m


def test_manifest_lines_round_trip_odd_names_and_the_digest_is_the_files_sha256(tmp_path):
    """Newlines, quotes and undecodable bytes in names (os.fsdecode's surrogateescape) survive the lines; the
    reader yields the same dicts and its digest is the sha256 of the bytes it read."""
    src = tmp_path / "src"
    _tree(src)
    (src / os.fsdecode(b"bad-\xff\xfe utf8")).write_bytes(b"raw")
    (src / 'q"\\\t').write_bytes(b"q")
    entries = node_scan.scan(str(src))
    m = _manifest(tmp_path, src)
    text = m.read_bytes()
    assert text.count(b"\n") == len(entries) + 1 and text.isascii()  # one line each, the header first
    assert json.loads(text.splitlines()[0]) == {"v": 2, "source": "test"}
    reader = node_manifest.ManifestReader(str(m))
    assert reader.digest == "" and list(reader) == entries
    assert reader.digest == hashlib.sha256(text).hexdigest()
    # the agent's --out: its other results on the first line, then the same entry lines
    out = tmp_path / "work" / "out.jsonl"  # its folder made: a run's work folder is first used here
    assert node_main.main(["manifest", "--out", str(out), "--", str(src)]) == 0
    first, *rest = out.read_bytes().split(b"\n")[:-1]
    head = json.loads(first)
    assert head["lines"] == len(entries) and head["hashed"] == 5 and "entries" not in head
    assert [json.loads(line) for line in rest] == entries
    assert os.fsencode(next(e["p"] for e in entries if e["p"].startswith("bad-"))) == b"bad-\xff\xfe utf8"
    # the typed entry's own line (the operator's fast path) is the same bytes, whatever it holds
    odd = [
        {"p": "a\nb", "t": "f", "s": 0, "h": "0" * 64},
        {"p": "s3/x", "t": "f", "s": 5, "etag": '"abc"', "sha256b64": "q=="},
        {"p": "s3/y", "t": "f", "s": 5, "etag": '"abc"', "h": "1" * 64},
        {"p": "no-hash-yet", "t": "f", "s": 7},
        {"p": "f", "t": "f", "s": 1.5, "h": 'odd"\\'},  # not ours, still written as json.dumps would
        {"p": "l", "t": "l", "l": "../\u00e9"},
    ]
    for e in entries + odd:
        typed = node_manifest.ManifestEntry.from_wire(e)
        assert typed.line() == node_manifest.manifest_line(e), e


def test_the_manifest_goes_gzipped_reads_the_same_and_is_kept_unzipped(tmp_path):
    from clusterctl.data.plan import parse_source
    from clusterctl.data.session import MANIFEST, SyncSession

    src, dst = tmp_path / "src", tmp_path / "dst"
    _tree(src)
    no_pool: Any = None  # encoding the manifest connects to nothing
    s = SyncSession([], [], "", no_pool, parse_source(str(src)), "/tmp/x", cache_dir=tmp_path)
    wire = node_scan.scan(str(src))
    s.entries = [node_manifest.ManifestEntry.from_wire(e) for e in wire]
    s.encode_manifest()
    plain = tmp_path / "m.jsonl"
    plain.write_bytes(node_manifest.manifest_header(str(src)) + b"".join(node_manifest.manifest_line(e) for e in wire))
    assert MANIFEST.endswith(".gz") and gzip.decompress(s.manifest_bytes) == plain.read_bytes()
    sent = tmp_path / MANIFEST
    sent.write_bytes(s.manifest_bytes)
    a, b = node_manifest.ManifestReader(str(sent)), node_manifest.ManifestReader(str(plain))
    assert list(a) == list(b) and a.digest == b.digest == hashlib.sha256(plain.read_bytes()).hexdigest()
    subprocess.run(["cp", "-a", f"{src}/.", str(dst)], check=True)
    rc, out = _agent("check", "--dst", str(dst), "--manifest", str(sent), "--reset", "--mark", "test")
    assert rc == 0 and out["marked"] and out["digest"] == a.digest
    assert (dst / ".clusterctl-sync" / "manifest.jsonl").read_bytes() == plain.read_bytes()
    # cut short on the way, or damaged: refused in one line, nothing marked
    whole = s.manifest_bytes
    damaged = whole[:200] + bytes(b ^ 0xFF for b in whole[200:260]) + whole[260:]
    (dst / ".clusterctl-sync" / "COMPLETE").unlink()
    for bad in (whole[: len(whole) // 2], damaged, b"not gzip at all\n"):
        sent.write_bytes(bad)
        for reset in ([], ["--reset"]):  # read as entries, or first kept unzipped
            rc, out = _agent("check", "--dst", str(dst), "--manifest", str(sent), *reset, "--mark", "test")
            assert rc == node_manifest.EXIT_INPUT and out["error"].startswith("manifest refused"), (out, reset)
            assert os.listdir(dst / ".clusterctl-sync") == ["manifest.jsonl"]  # no marker, nothing half-kept
            assert (dst / ".clusterctl-sync" / "manifest.jsonl").read_bytes() == plain.read_bytes()


def test_writes_of_nodes_sharing_a_file_system_with_the_same_pid_do_not_collide(tmp_path, monkeypatch):
    # Two nodes on one NFS/EFS folder (or local nodes on the shared /) in PID namespaces of their own: the
    # other node's half-written file with "our" pid must survive our atomic writes untouched.
    monkeypatch.setattr(os, "getpid", lambda: 4242)
    target = tmp_path / "manifest.jsonl"
    theirs = tmp_path / "manifest.jsonl.tmp4242"
    theirs.write_bytes(b"the other node's, half written")
    node_manifest.atomic_write(str(target), b"ours\n")
    node_manifest.write_lines(str(tmp_path / "other.jsonl"), {"v": 2}, [{"p": "a"}])
    src = tmp_path / "m.jsonl"
    src.write_bytes(node_manifest.manifest_header("/src"))
    node_check.keep_manifest(str(src), str(target))
    assert theirs.read_bytes() == b"the other node's, half written"
    assert target.read_bytes() == src.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([target.name, theirs.name, "other.jsonl", src.name])


def test_a_marker_of_an_older_version_is_not_taken_and_the_copy_is_checked_again(tmp_path):
    """A DST marked by a version before JSON Lines (its manifest.json, its digest of the entries' JSON): the
    copy is read back whole, the marker written again with this version's digest, the old file gone."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    _tree(src)
    subprocess.run(["cp", "-a", f"{src}/.", str(dst)], check=True)
    state = dst / ".clusterctl-sync"
    entries = node_scan.scan(str(src))
    old_digest = hashlib.sha256(
        json.dumps(entries, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()
    ).hexdigest()
    (state / "manifest.json").write_text(json.dumps({"entries": entries, "source": "test"}))
    (state / "COMPLETE").write_text(json.dumps({"manifest_sha256": old_digest, "files": 3, "source": "test"}))
    m = _manifest(tmp_path, src)
    rc, out = _agent("check", "--dst", str(dst), "--manifest", str(m), "--reset", "--mark", "test")
    assert rc == 0 and out["bad"] == [] and out["marked"] and out["reread"] == 3  # checked again, by content
    marker = json.loads((state / "COMPLETE").read_text())
    assert marker["manifest_sha256"] == hashlib.sha256(m.read_bytes()).hexdigest() != old_digest
    assert marker["manifest_version"] == 2
    assert not (state / "manifest.json").exists() and (state / "manifest.jsonl").read_bytes() == m.read_bytes()


def test_agent_refuses_root_and_missing_source(tmp_path):
    rc, out = _agent("check", "--dst", "/", "--manifest", "x")
    assert rc == 2 and "refusing" in out["error"]
    rc, out = _agent("manifest", "--", str(tmp_path / "nope"))
    assert rc == node_manifest.EXIT_INPUT and "no such directory" in out["error"]


def test_s3_etags_single_and_multipart(tmp_path):
    data = os.urandom(3 * 1024 * 1024 + 17)
    f = tmp_path / "obj"
    f.write_bytes(data)
    assert node_check.etag_matches(str(f), hashlib.md5(data).hexdigest(), len(data))
    part = 1024 * 1024
    digests = b"".join(hashlib.md5(data[i : i + part]).digest() for i in range(0, len(data), part))
    etag = f"{hashlib.md5(digests).hexdigest()}-4"
    assert node_check.etag_matches(str(f), etag, len(data))
    assert not node_check.etag_matches(str(f), etag.replace("-4", "-3"), len(data))
    assert not node_check.etag_matches(str(f), "0" * 32, len(data))


# ---- relay scripts and ssh lines --------------------------------------------------------------------
def test_relay_script_quotes_every_path_and_pins_host_keys(tmp_path):
    child = "10.0.0.3"  # the child's address, as the other nodes reach it
    hop = openssh.node_ssh("root", 22, managed=True)
    root = "/data/-x 'q' $HOME \"d\""
    text = node_scripts.relay_script(0, root, [child], hop, ".clusterctl/sync/abc").decode()
    assert "StrictHostKeyChecking=yes" in text and "UserKnownHostsFile=~/.ssh/known_hosts" in text
    assert "aes128-gcm@openssh.com" in text and "Compression=no" in text
    assert f"tar -C {shlex.quote(root)} -xf -" in text
    assert f"\nA={nodepkg.package().shell_path}\n" in text  # the node package, as shipped
    recv = '"$P" "$A" sync recv --hashes "$W/recv.part" | tar'  # every file hashed as it goes into tar
    assert f'"$P" "$A" sync relay --index 0 --out "$W/fifo.0" | {recv}' in text  # a chain: the zero-copy relay
    assert 'mv -f "$W/recv.part" "$W/recv.json"' in text  # kept only when recv and tar both exited 0
    subprocess.run(["bash", "-n"], input=text, text=True, check=True)  # it parses
    two = node_scripts.relay_script(0, root, [child, child], hop, ".clusterctl/sync/abc").decode()
    assert f'tee -p "$W/fifo.0" "$W/fifo.1" | {recv}' in two  # fan-out: tee
    subprocess.run(["bash", "-n"], input=two, text=True, check=True)
    disk = node_scripts.relay_script(0, root, [], hop, ".clusterctl/sync/abc", hash_stream=False).decode()
    assert "recv" not in disk and f"tar -C {shlex.quote(root)} -xf -" in disk  # --verify disk: read back instead


@pytest.mark.parametrize("case", ["both", "hop dies", "tar dies"])
def test_zero_copy_relay_gives_both_outputs_every_byte_and_survives_either_dying(tmp_path, case):
    data = os.urandom(3_000_000)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    hop_reader = "head -c 1000 >/dev/null" if case == "hop dies" else "sha256sum"
    tar_reader = "head -c 1000 >/dev/null" if case == "tar dies" else "sha256sum"
    script = (
        f"{hop_reader} < {shlex.quote(str(fifo))} > {tmp_path}/hop.out & "
        f"{agent_shell()} relay --out {shlex.quote(str(fifo))} | {tar_reader} "
        f"> {tmp_path}/tar.out; wait"
    )
    proc = subprocess.run(["bash", "-c", script], input=data, capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    want = hashlib.sha256(data).hexdigest()
    if case != "hop dies":
        assert (tmp_path / "hop.out").read_text().split()[0] == want
    if case != "tar dies":
        assert (tmp_path / "tar.out").read_text().split()[0] == want


def test_operator_ssh_uses_the_clusters_key_and_known_hosts_only():
    t = SshTarget("n", "10.0.0.2", 2222, "root", ("/k/id",))
    argv = openssh.operator_ssh(t, "/k/known_hosts", managed=True)
    joined = " ".join(argv)
    assert argv[:3] == ["ssh", "-F", "/dev/null"]
    assert "-i /k/id" in joined and "UserKnownHostsFile=/k/known_hosts" in joined
    assert "StrictHostKeyChecking=yes" in joined and "-p 2222" in joined and "BatchMode=yes" in joined


def test_sync_report_exit_codes():
    o = [outcome.NodeOutcome("a"), outcome.NodeOutcome("b", status="failed", detail="disk")]
    rep = outcome.SyncReport(o, 10, 1.0, "chain", 1)
    assert rep.exit_code == 1 and "1 of 2 node(s) not verified" in rep.error().message
    o.append(outcome.NodeOutcome("c", status="unreachable"))
    assert rep.exit_code == 5 and int(rep.error().exit_code) == 5
    assert outcome.SyncReport([outcome.NodeOutcome("a")], 0, 0, "chain", 0).error() is None


def test_map_by_size_keeps_order_and_pools_only_big_files():
    """Small files are hashed in the calling thread (a pool's hand-off costs more than a 4 kB hash),
    big ones in the pool; the results come back in the entries' order whatever ran where."""
    import threading

    entries = [{"p": str(i), "s": s} for i, s in enumerate([10, node_scan.POOL_FROM, 0, 5 << 20, 4000])]
    where: dict[str, str] = {}

    def fn(e: dict) -> str:
        where[e["p"]] = threading.current_thread().name
        return e["p"] * 2

    assert node_scan.map_by_size(fn, entries, 2) == ["00", "11", "22", "33", "44"]
    here = threading.current_thread().name
    assert [where[p] == here for p in "01234"] == [True, False, True, False, True]


def test_the_probe_measures_the_sender_only_when_the_stream_is_long_enough_to_pay():
    hop = 17.9 * MB  # 150 Mbit/s
    short = syncplan.too_short_to_probe(200_000_000, hop)
    assert short == syncplan.FanoutChoice(
        1,
        "one chain: 200.0 MB at a hop's 17.9 MB/s is 11.2 s of streaming, under 15x a measurement (~1 s): "
        "measuring the sender would cost more than it saves",
    )
    assert syncplan.too_short_to_probe(269_000_000, hop) is None  # 15.03 s >= 15 x 1 s
    assert syncplan.too_short_to_probe(268_000_000, hop) is not None  # 14.97 s
    assert syncplan.too_short_to_probe(150 * 10**9, 1e9) is None  # ImageNet at 1 GB/s: 150 s
    assert syncplan.too_short_to_probe(2 * 10**9, 1e9) is not None  # 2 s at 1 GB/s
    for bad in (0.0, float("nan"), -1.0):  # nothing measured: choose_fanout says so, not this
        assert syncplan.too_short_to_probe(10**6, bad) is None
