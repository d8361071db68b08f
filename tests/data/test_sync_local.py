"""`clusterctl sync` end to end on real namespace nodes (sshd, rsync, tar): folder sources, every strategy,
verification, re-runs, hostile paths and refused input. One 3-node cluster for the whole module."""

from __future__ import annotations

import os

import pytest

from clusterctl.remote import nodepkg
from conftest import wait_for
from sync_support import (
    down_cluster,
    first_error_line,
    make_dataset,
    marker,
    node_sha256,
    random_files,
    ssh_masters,
    sync,
    table_rows,
    up_cluster,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def c3(tmp_path_factory):
    cluster = up_cluster(tmp_path_factory.mktemp("sync3"), 3)
    yield cluster
    down_cluster(cluster)


HOSTILE = {
    "plain.bin": os.urandom(70_000),
    'dir with space/it\'s "quoted" $HOME `x`.bin': os.urandom(5_000),
    "-leading dash/-f": b"dash",
    "new\nline/file\twith tab": b"nl",
    "deep/a/b/c/d/e.txt": b"deep" * 1000,
}


@pytest.fixture(scope="module")
def hostile_src(tmp_path_factory):
    root = tmp_path_factory.mktemp("src") / "-src dir 'q' $HOME \"dq\""
    sums = make_dataset(root, HOSTILE)
    (root / "empty dir").mkdir()
    os.symlink("plain.bin", root / "link to plain")
    return root, sums


def _all_verified(c3, root: str, sums: dict) -> None:
    for i in range(3):
        assert node_sha256(c3, i, root) == sums, f"node {i}"
        m = marker(c3, i, root)
        assert m is not None and m["files"] == len(sums), f"node {i} has no completion marker"


def test_chain_copies_hostile_paths_to_every_node_verified(c3, hostile_src):
    src, sums = hostile_src
    dst = "-dst 'q' $HOME \"dq\""  # relative: in each node's home; leading dash, quotes, $
    proc = sync(c3, "--", str(src), dst)
    assert proc.returncode == 0, proc.stderr
    root = f"/root/{dst}"
    _all_verified(c3, root, sums)
    for i in range(3):
        assert c3.node_exec(i, "readlink", f"{root}/link to plain").stdout.strip() == "plain.bin"
        assert c3.node_exec(i, "test", "-d", f"{root}/empty dir", check=False).returncode == 0
        left = c3.node_exec(i, "ls", "-A", "/root/.clusterctl/sync", check=False).stdout.strip()
        assert left == "", f"node {i} kept sync's work files: {left}"
        shipped = c3.node_exec(i, "ls", "-A", "/root/.clusterctl/node").stdout.split()
        name = nodepkg.package().name  # and the stamp of its checked digest (remote/nodepkg.py)
        assert shipped == [name, f"{name}.ok"], f"node {i}: the node package is {shipped}"
    # the relays ended their hops' masters (a leaked one would live ControlPersist's 30 s)
    wait_for(lambda: not any(ssh_masters(c3, i) for i in range(3)), 10, "the hops' ssh masters to end")
    rows = table_rows(proc.stdout)
    assert set(rows) == set(c3.hosts) and all(r.rstrip().endswith("yes") for r in rows.values())
    total = sum(len(v) for v in HOSTILE.values())
    assert f"{total:,}" in rows[c3.hosts[2]]
    assert "3 of 3 node(s) verified and marked complete" in proc.stderr
    bars = [line for line in proc.stderr.splitlines() if "MB" in line or "kB" in line]
    assert any(line.startswith("total") for line in bars)  # the progress: the total and one bar per node
    assert all(any(line.startswith(f"{h} verified") for line in bars) for h in c3.hosts), proc.stderr


def test_rerun_copies_nothing_and_a_flipped_byte_is_found_and_fixed(c3, tmp_path):
    src = tmp_path / "ds"
    sums = make_dataset(src, random_files(20, 50_000))
    assert sync(c3, str(src), "/tmp/flip").returncode == 0
    again = sync(c3, str(src), "/tmp/flip")
    assert again.returncode == 0
    assert all(" 0 " in row for row in table_rows(again.stdout).values()), again.stdout  # nothing copied

    # one byte flipped on node 2, size and mtime kept: only a content check can see it
    c3.node_exec(
        2,
        "python3",
        "-c",
        "import os,sys; p=sys.argv[1]; st=os.stat(p); b=bytearray(open(p,'rb').read()); b[777]^=1; "
        "open(p,'wb').write(b); os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))",
        "/tmp/flip/part-0007.bin",
    )
    assert node_sha256(c3, 2, "/tmp/flip")["part-0007.bin"] != sums["part-0007.bin"]
    fixed = sync(c3, str(src), "/tmp/flip")
    assert fixed.returncode == 0, fixed.stderr
    rows = table_rows(fixed.stdout)
    assert "50,000" in rows[c3.hosts[2]] and " 0 " in rows[c3.hosts[0]]  # only that file, only there
    _all_verified(c3, "/tmp/flip", sums)


def _line(stderr: str, start: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith(start)]


def test_chain_copies_are_proved_by_their_hashes_as_written_and_verify_disk_reads_back(c3, tmp_path):
    src = tmp_path / "ds"
    sums = make_dataset(src, random_files(6, 30_000, seed=7))
    proc = sync(c3, str(src), "/tmp/streamed")
    assert proc.returncode == 0, proc.stderr
    # a first sync: no node looked anything up, the source was hashed while the data flowed
    assert _line(proc.stderr, "3 node(s) have nothing at /tmp/streamed yet") != [], proc.stderr
    assert _line(proc.stderr, "checking ") == [], proc.stderr
    assert _line(proc.stderr, "manifest: 6 file(s) hashed, 0 unchanged") != [], proc.stderr
    # and every node, empty before, was proved by its stream's digest alone (no manifest read there)
    assert _line(proc.stderr, "verified: ") == [
        "verified: 18 file(s) by their sha256 as written (3 node(s) by the stream's digest), 0 read back"
    ]
    _all_verified(c3, "/tmp/streamed", sums)
    proc = sync(c3, "--verify", "disk", str(src), "/tmp/read-back")
    assert proc.returncode == 0, proc.stderr
    assert _line(proc.stderr, "verified: ") == ["verified: 0 file(s) by their sha256 as written, 18 read back"]
    _all_verified(c3, "/tmp/read-back", sums)
    proc = sync(c3, "--verify", "twice", str(src), "/tmp/x")
    assert proc.returncode == 2 and "unknown --verify 'twice'" in first_error_line(proc.stderr)


def test_a_file_changed_at_the_source_after_the_manifest_is_caught_without_the_read_back(c3, tmp_path):
    src = tmp_path / "ds"
    make_dataset(src, random_files(4, 200_000, seed=9))
    victim = src / "part-0002.bin"
    st = victim.stat()
    for i in range(3):  # not a first sync: the manifest is on every node before anything is streamed
        c3.node_exec(i, "sh", "-c", "mkdir -p /tmp/changed && echo kept > /tmp/changed/kept.txt")
    proc = c3.cli.popen("sync", "--cluster", c3.name, str(src), "/tmp/changed")
    for line in proc.stderr:
        if line.startswith("sending the manifest"):
            break
    data = bytearray(victim.read_bytes())
    data[150_000] ^= 1  # the same size and mtime: what tar sends is not what the manifest says
    victim.write_bytes(bytes(data))
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 1, err
    # every node's copy of it differs, found by its hash as written: no file read back in the first check
    assert _line(err, "verified: ")[0] == "verified: 12 file(s) by their sha256 as written, 0 read back", err
    assert "still differ from the manifest, e.g. 'part-0002.bin'" in err
    for i in range(3):
        assert marker(c3, i, "/tmp/changed") is None  # never marked complete


def test_a_second_run_reuses_the_manifest_of_unchanged_files_and_rehashes_a_touched_one(c3, tmp_path):
    src = tmp_path / "ds"
    make_dataset(src, random_files(5, 10_000, seed=11))
    first = sync(c3, str(src), "/tmp/reuse")
    assert first.returncode == 0 and _line(first.stderr, "manifest: ")[0].startswith(
        "manifest: 5 file(s) hashed, 0 unchanged since the last run"
    ), first.stderr
    again = sync(c3, str(src), "/tmp/reuse")
    assert again.returncode == 0 and _line(again.stderr, "manifest: ")[0].startswith(
        "manifest: 0 file(s) hashed, 5 unchanged since the last run"
    ), again.stderr
    os.utime(src / "part-0001.bin")  # touched: its mtime and ctime change, its content not
    touched = sync(c3, str(src), "/tmp/reuse")
    assert touched.returncode == 0 and _line(touched.stderr, "manifest: ")[0].startswith(
        "manifest: 1 file(s) hashed, 4 unchanged since the last run"
    ), touched.stderr


def test_changed_source_unmarks_until_verified_and_delete_mirrors(c3, tmp_path):
    src = tmp_path / "ds"
    make_dataset(src, random_files(5, 10_000))
    assert sync(c3, str(src), "/tmp/mirror").returncode == 0
    first = marker(c3, 1, "/tmp/mirror")["manifest_sha256"]
    (src / "part-0000.bin").unlink()
    sums = make_dataset(src, {"new.bin": b"n" * 999})
    sums.update(
        {p.name: __import__("hashlib").sha256(p.read_bytes()).hexdigest() for p in src.iterdir() if p.name != "new.bin"}
    )
    proc = sync(c3, str(src), "/tmp/mirror")
    assert proc.returncode == 0
    assert marker(c3, 1, "/tmp/mirror")["manifest_sha256"] != first
    assert "part-0000.bin" in node_sha256(c3, 1, "/tmp/mirror")  # kept without --delete
    proc = sync(c3, "--delete", str(src), "/tmp/mirror")
    assert proc.returncode == 0
    _all_verified(c3, "/tmp/mirror", sums)


@pytest.mark.parametrize("strategy", ["tree", "parallel", "sequential"])
def test_other_strategies_verify_the_same(c3, tmp_path, strategy):
    src = tmp_path / "ds"
    sums = make_dataset(src, random_files(12, 40_000, seed=3))
    dst = f"/tmp/s-{strategy}"
    proc = sync(c3, "--strategy", strategy, str(src), dst)
    assert proc.returncode == 0, proc.stderr
    _all_verified(c3, dst, sums)


def test_leader_source_with_fanout_and_tree(c3, tmp_path):
    src = tmp_path / "ds"
    sums = make_dataset(src, random_files(8, 30_000, seed=5))
    assert sync(c3, "--", str(src), "-on leader $x").returncode == 0  # now on every node, the leader included
    proc = sync(c3, "--fanout", "2", "leader:-on leader $x", "/tmp/from-leader")
    assert proc.returncode == 0, proc.stderr
    _all_verified(c3, "/tmp/from-leader", sums)
    proc = sync(c3, "--strategy", "tree", "leader:-on leader $x", "/tmp/from-leader-tree")
    assert proc.returncode == 0, proc.stderr
    _all_verified(c3, "/tmp/from-leader-tree", sums)
    # SRC and DST the same folder on the leader: it is already the copy; the others get theirs
    proc = sync(c3, "--", "leader:-on leader $x", "-on leader $x")
    assert proc.returncode == 0 and " 0 " in table_rows(proc.stdout)[c3.hosts[0]]


def test_plan_prints_who_sends_to_whom_without_copying(c3, tmp_path):
    src = tmp_path / "ds"
    make_dataset(src, {"a": b"a"})
    proc = sync(c3, "--plan", "--fanout", "2", str(src), "/tmp/planned")
    assert proc.returncode == 0
    h = c3.hosts
    assert proc.stdout.splitlines()[1:] == [f"  source ({src}) -> {h[0]}", f"  {h[0]} -> {h[1]}", f"  {h[0]} -> {h[2]}"]
    assert c3.node_exec(0, "test", "-e", "/tmp/planned", check=False).returncode == 1
    tree = sync(c3, "--plan", "--strategy", "tree", str(src), "/tmp/planned")
    assert f"round 2: source ({src}) -> {h[1]}, {h[0]} -> {h[2]}" in tree.stdout


def test_bad_input_is_one_error_line_with_its_exit_code(c3, tmp_path):
    for dst in ("/", "//", "/tmp/../"):
        proc = sync(c3, str(tmp_path), dst)
        assert proc.returncode == 2, (dst, proc.stderr)
        assert first_error_line(proc.stderr) == "Error: refusing to sync into / (DST must be a folder of its own)"
    proc = sync(c3, str(tmp_path / "no such"), "/tmp/x")
    assert proc.returncode == 3
    assert first_error_line(proc.stderr).startswith(f"Error: SRC {tmp_path / 'no such'} does not exist")
    proc = sync(c3, "leader:/no/such/dir", "/tmp/x")
    assert proc.returncode == 3
    assert first_error_line(proc.stderr) == "Error: SRC leader:/no/such/dir: no such directory: /no/such/dir"
    proc = sync(c3, "--strategy", "magic", str(tmp_path), "/tmp/x")
    assert proc.returncode == 2 and "unknown --strategy 'magic'" in first_error_line(proc.stderr)
    proc = sync(c3, str(tmp_path))
    assert proc.returncode == 2 and "expected [HOSTS] SRC DST" in first_error_line(proc.stderr)
    for i in range(3):
        assert c3.node_exec(i, "test", "-e", "/tmp/x", check=False).returncode == 1  # nothing was touched


def test_src_and_dst_inside_one_another_on_the_leader_is_refused_before_anything_is_touched(c3):
    c3.node_exec(0, "sh", "-c", "mkdir -p /root/ovl/sub && echo keep > /root/ovl/a && echo keep > /root/ovl/sub/b")
    for src, dst, said in (
        ("leader:ovl", "ovl/sub", "it resolves to /root/ovl/sub, inside SRC /root/ovl"),
        ("leader:/root/ovl/sub", "~/ovl", "it resolves to /root/ovl, which holds SRC /root/ovl/sub"),
        ("leader:ovl/", "/root/ovl/sub/x", "it resolves to /root/ovl/sub/x, inside SRC /root/ovl"),
    ):
        proc = sync(c3, "--delete", src, dst)
        assert proc.returncode == 2, (src, dst, proc.stderr)
        line = first_error_line(proc.stderr)
        assert line.startswith(f"Error: on {c3.hosts[0]}: refusing to sync into ") and said in line, line
    assert c3.node_exec(0, "cat", "/root/ovl/a", "/root/ovl/sub/b").stdout == "keep\nkeep\n"
    assert c3.node_exec(0, "ls", "-A", "/root/ovl/sub").stdout.split() == ["b"]
