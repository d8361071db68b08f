"""One writer per DST, the node side: `sync lease` holds a kernel lock on DST/.clusterctl-sync/lease while its
stdin is open (and heartbeats come), refuses a second run naming the first, takes over from a dead holder, and
`check --mark --lease ID` writes COMPLETE only while run ID holds the lease. Run here as a node runs them."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from clusterctl.node.sync import manifest as node_manifest, scan as node_scan
from sync_support import agent_argv


def _holder(run: str) -> str:
    return json.dumps({"id": run, "user": "ana", "host": "laptop-7", "pid": 4242})


def _take(dst: Path, run: str, *extra: str) -> subprocess.Popen:
    """A lease process, its first line read (it holds the lease until its stdin closes)."""
    proc = subprocess.Popen(
        agent_argv("lease", "--dst", str(dst), "--holder", _holder(run), *extra),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    judged = json.loads(proc.stdout.readline())
    assert judged == {"judged": str(dst)}, judged
    proc.stdin.write(b"take\n")
    proc.stdin.flush()
    proc.first = json.loads(proc.stdout.readline())  # type: ignore[attr-defined]
    return proc


def _let_go(proc: subprocess.Popen) -> int:
    proc.stdin.close()
    return proc.wait(timeout=10)


def test_a_second_run_is_refused_naming_the_first_until_the_first_lets_go(tmp_path):
    dst = tmp_path / "dst"
    a = _take(dst, "run-a")
    try:
        assert a.first == {"held": str(dst)}
        lease = json.loads((dst / ".clusterctl-sync" / "lease").read_text())
        assert lease["id"] == "run-a" and lease["node_pid"] == a.pid and lease["boot"]
        b = _take(dst, "run-b")
        assert b.wait(timeout=10) == 4
        assert b.first["error"].startswith(f"{dst} is being written by another sync run-a from ana@laptop-7 (pid 4242)")
        assert " since 20" in b.first["error"] and b.first["error"].endswith(" UTC")
        assert "wait for it to end" in b.first["hint"]
        a.stdin.write(b"\n")  # a heartbeat: still held
        a.stdin.flush()
        assert a.poll() is None
    finally:
        assert _let_go(a) == 0
    assert (dst / ".clusterctl-sync" / "lease").read_text() == ""  # let go: no name left in it
    c = _take(dst, "run-b")
    assert c.first == {"held": str(dst)}
    assert _let_go(c) == 0


def test_a_dead_holder_is_stale_and_a_run_sharing_the_folder_is_let_in(tmp_path):
    dst = tmp_path / "dst"
    (dst / ".clusterctl-sync").mkdir(parents=True)
    (dst / ".clusterctl-sync" / "lease").write_text(json.dumps({"id": "run-dead", "pid": 1, "since": 0}) + "\n")
    a = _take(dst, "run-a")  # its name is in the file, no process holds the lock: it is stale
    try:
        assert a.first["held"] == str(dst) and a.first["stale"].startswith("sync run-dead ")
        same = _take(dst, "run-a")  # another node of the same run, the folder shared with this one
        assert same.first == {"held": str(dst), "shared": True}
        assert _let_go(same) == 0
        assert a.poll() is None  # still held by the first
    finally:
        _let_go(a)


def test_a_silent_operator_loses_the_lease(tmp_path):
    a = _take(tmp_path / "dst", "run-a", "--heartbeat-timeout", "0.5")
    try:
        assert a.wait(timeout=10) == 0  # stdin still open, no heartbeat: let go on its own
    finally:
        a.stdin.close()
    b = _take(tmp_path / "dst", "run-b")
    assert "held" in b.first
    _let_go(b)


def test_complete_is_written_only_while_the_run_holds_the_lease(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    (src / "d").mkdir(parents=True)
    (src / "d" / "x.bin").write_bytes(b"x" * 100)
    m = tmp_path / "m.jsonl"
    m.write_bytes(
        node_manifest.manifest_header("t") + b"".join(node_manifest.manifest_line(e) for e in node_scan.scan(str(src)))
    )
    subprocess.run(["cp", "-a", f"{src}/.", str(dst)], check=True)
    marker = dst / ".clusterctl-sync" / "COMPLETE"

    def check(run: str) -> tuple[int, dict]:
        proc = subprocess.run(
            agent_argv("check", "--dst", str(dst), "--manifest", str(m), "--reset", "--mark", "t", "--lease", run),
            capture_output=True,
            text=True,
        )
        return proc.returncode, json.loads(proc.stdout.strip().splitlines()[-1])

    rc, out = check("run-a")  # nobody holds it: the run's own lease was lost
    assert rc == 1 and "the lease on" in out["error"] and "was lost" in out["error"] and not marker.exists()
    b = _take(dst, "run-b")
    try:
        rc, out = check("run-a")  # another run writes there now
        assert rc == 1 and "held by another sync run-b" in out["error"] and not marker.exists()
    finally:
        _let_go(b)
    a = _take(dst, "run-a")
    try:
        rc, out = check("run-a")
        assert rc == 0 and out["marked"] and marker.exists()
    finally:
        _let_go(a)


def test_lease_judges_dst_before_it_writes_there(tmp_path):
    proc = subprocess.run(
        agent_argv("lease", "--dst", "/etc", "--holder", _holder("x")), capture_output=True, text=True
    )
    assert proc.returncode == 2 and "system folder" in json.loads(proc.stdout)["error"]
    assert not Path("/etc/.clusterctl-sync").exists()


def test_nothing_is_made_in_dst_until_every_node_judged_it_and_the_operator_says_take(tmp_path):
    dst = tmp_path / "dst"
    proc = subprocess.Popen(
        agent_argv("lease", "--dst", str(dst), "--holder", _holder("x")), stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert json.loads(proc.stdout.readline()) == {"judged": str(dst)}
    assert _let_go(proc) == 0  # another node refused DST: the operator closes without `take`
    assert not dst.exists()
