"""`clusterctl sync` judges DST where it acts: on every node, after every symlink, against SRC resolved where
it is (a folder here, leader:PATH) and against clusterctl's own folders; a DST that holds SRC, lies inside it,
or is SRC (a folder here) is refused before anything is touched, with or without --delete. Local nodes share
this machine's files outside /root, /tmp and /opt: a source in /srv is the operator's own folder on every node.
One 2-node cluster for the whole module; every test checks the data itself, not only the exit code."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from sync_support import (
    agent_argv,
    down_cluster,
    first_error_line,
    make_dataset,
    marker,
    node_pyz,
    node_sha256,
    shape,
    sync,
    unshape,
    up_cluster,
)

pytestmark = pytest.mark.integration

FILES = {"train/part-0.bin": os.urandom(40_000), "train/part-1.bin": os.urandom(30_000), "val/v.bin": b"v" * 999}
NOTES = b"my notes, not part of any dataset\n"


_WRITE = (
    "import os,sys\n"
    "root=sys.argv[1]\n"
    "for i in range(2,len(sys.argv),2):\n"
    "  p=os.path.join(root,sys.argv[i]); os.makedirs(os.path.dirname(p),exist_ok=True)\n"
    "  open(p,'wb').write(bytes.fromhex(sys.argv[i+1]))\n"
)


def _hex_args(files: dict[str, bytes]) -> list[str]:
    return [x for rel, data in files.items() for x in (rel, data.hex())]


@pytest.fixture(scope="module")
def c2(tmp_path_factory):
    cluster = up_cluster(tmp_path_factory.mktemp("overlap"), 2)
    yield cluster
    down_cluster(cluster)


@pytest.fixture
def srv():
    """A folder of this machine that the local nodes see too (outside /root, /tmp and /opt)."""
    root = Path("/srv") / f"clusterctl-test-{uuid.uuid4().hex[:8]}"
    root.mkdir()
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _sums(files: dict[str, bytes]) -> dict[str, str]:
    return {p: hashlib.sha256(b).hexdigest() for p, b in files.items()}


def _proj_on_node(c2, i: int, proj: str) -> None:
    """PROJ/imagenet (the dataset), PROJ/notes.txt and PROJ/current -> PROJ on node i."""
    c2.node_exec(i, "python3", "-c", _WRITE, proj, *_hex_args({**{f"imagenet/{p}": b for p, b in FILES.items()}}))
    c2.node_exec(i, "python3", "-c", _WRITE, proj, "notes.txt", NOTES.hex())
    c2.node_exec(i, "ln", "-sfn", proj, f"{proj}/current")


def test_leader_source_into_a_symlink_to_its_parent_is_refused_and_nothing_is_lost(c2):
    """On the leader /root/proj/current -> /root/proj; `sync --delete leader:/root/proj/imagenet
    /root/proj/current` removed imagenet and notes.txt on both nodes: now the leader refuses it first."""
    for i in range(2):
        _proj_on_node(c2, i, "/root/proj")
    proc = sync(c2, "--delete", "leader:/root/proj/imagenet", "/root/proj/current")
    assert proc.returncode == 2, proc.stderr
    line = first_error_line(proc.stderr)
    assert line.startswith(f"Error: on {c2.hosts[0]}: refusing to sync into /root/proj/current: "), line
    assert "it resolves to /root/proj, which holds SRC /root/proj/imagenet" in line, line
    assert line.endswith("sync into a folder outside SRC that does not hold it (e.g. one beside it)"), line
    for i in range(2):
        assert node_sha256(c2, i, "/root/proj/imagenet") == _sums(FILES), f"node {i}"
        assert c2.node_exec(i, "cat", "/root/proj/notes.txt").stdout == NOTES.decode()
        assert c2.node_exec(i, "readlink", "/root/proj/current").stdout.strip() == "/root/proj"
        assert c2.node_exec(i, "test", "-e", "/root/proj/.clusterctl-sync", check=False).returncode == 1


def test_local_source_into_its_parent_on_nodes_that_share_this_machine_is_refused(c2, srv):
    """`sync --delete /srv/proj/imagenet /srv/proj` on a local cluster emptied /srv/proj on this machine."""
    proj = srv / "proj"
    sums = make_dataset(proj / "imagenet", FILES)
    (proj / "notes.txt").write_bytes(NOTES)
    proc = sync(c2, "--delete", str(proj / "imagenet"), str(proj))
    assert proc.returncode == 2, proc.stderr
    line = first_error_line(proc.stderr)
    assert f"refusing to sync into {proj}: it resolves to {proj}, which holds SRC {proj / 'imagenet'}" in line, line
    assert line.startswith(f"Error: on {c2.hosts[0]}: ") or line.startswith(f"Error: on {c2.hosts[1]}: "), line
    assert {str(p.relative_to(proj / "imagenet")) for p in (proj / "imagenet").rglob("*") if p.is_file()} == set(sums)
    assert all(hashlib.sha256((proj / "imagenet" / p).read_bytes()).hexdigest() == h for p, h in sums.items())
    assert (proj / "notes.txt").read_bytes() == NOTES
    assert sorted(os.listdir(proj)) == ["imagenet", "notes.txt"]  # no state folder written into it either


def test_dst_inside_a_local_source_is_refused_even_without_delete(c2, srv):
    """Without --delete, a DST inside SRC (or holding it) would have the stream write into its own source."""
    src = srv / "proj"
    sums = make_dataset(src, FILES)
    for dst in (src / "copy", srv):
        proc = sync(c2, str(src), str(dst))
        assert proc.returncode == 2, (dst, proc.stderr)
        line = first_error_line(proc.stderr)
        relation = "inside SRC" if dst != srv else "which holds SRC"
        assert f"refusing to sync into {dst}: it resolves to {dst}, {relation} {src}" in line, line
    assert not (src / "copy").exists()
    assert sorted(os.listdir(src)) == ["train", "val"] and sorted(os.listdir(srv)) == ["proj"]
    assert all(hashlib.sha256((src / p).read_bytes()).hexdigest() == h for p, h in sums.items())


def test_dst_that_is_a_local_source_through_a_symlink_is_refused(c2, srv):
    src = srv / "proj"
    sums = make_dataset(src, FILES)
    (srv / "link").symlink_to(src)
    proc = sync(c2, "--delete", str(src), str(srv / "link"))
    assert proc.returncode == 2, proc.stderr
    line = first_error_line(proc.stderr)
    assert f"refusing to sync into {srv / 'link'}: it resolves to {src}, which is SRC {src} itself" in line, line
    assert sorted(os.listdir(src)) == ["train", "val"]  # not even the completion marker was written there
    assert all(hashlib.sha256((src / p).read_bytes()).hexdigest() == h for p, h in sums.items())


def test_dst_inside_a_leader_source_through_a_symlink_is_refused(c2):
    for i in range(2):
        _proj_on_node(c2, i, "/root/inner")
        c2.node_exec(i, "ln", "-sfn", "/root/inner/imagenet/train", "/root/elsewhere")
    proc = sync(c2, "--delete", "leader:/root/inner/imagenet", "/root/elsewhere")
    assert proc.returncode == 2, proc.stderr
    line = first_error_line(proc.stderr)
    assert line.startswith(f"Error: on {c2.hosts[0]}: refusing to sync into /root/elsewhere: "), line
    assert "it resolves to /root/inner/imagenet/train, inside SRC /root/inner/imagenet" in line, line
    for i in range(2):
        assert node_sha256(c2, i, "/root/inner/imagenet") == _sums(FILES), f"node {i}"


def test_leader_source_that_is_dst_through_a_symlink_is_only_checked_there(c2):
    """leader:X into a DST that resolves to X on the leader: the leader's copy is the source (as for
    `sync leader:~/d ~/d`), checked and never written or deleted from, even with --delete (a FIFO, which no
    manifest lists, stays); the other node gets its copy through the same DST."""
    c2.node_exec(0, "mkdir", "-p", "/root/same")
    c2.node_exec(0, "python3", "-c", _WRITE, "/root/same/ds", *_hex_args(FILES))
    c2.node_exec(0, "mkfifo", "/root/same/ds/a-fifo")
    c2.node_exec(0, "ln", "-sfn", "/root/same/ds", "/root/same/link")
    proc = sync(c2, "--delete", "leader:/root/same/ds", "/root/same/link")
    assert proc.returncode == 0, proc.stderr
    assert node_sha256(c2, 0, "/root/same/ds") == _sums(FILES)
    assert c2.node_exec(0, "test", "-p", "/root/same/ds/a-fifo", check=False).returncode == 0  # still there
    assert node_sha256(c2, 1, "/root/same/link") == _sums(FILES)
    assert marker(c2, 1, "/root/same/link") is not None


def test_a_symlinked_dst_that_does_not_overlap_syncs_and_mirrors(c2, tmp_path, srv):
    """The legitimate case: DST a symlink to a folder of its own, from a folder here (in /tmp: the nodes'
    /tmp is their own; and in /srv: shared, but apart) and from the leader; --delete mirrors into the target."""
    src = tmp_path / "ds"
    make_dataset(src, FILES)
    shared = srv / "ds"
    make_dataset(shared, FILES)
    for i in range(2):
        c2.node_exec(
            i, "sh", "-c", "mkdir -p /root/target && echo old > /root/target/stale && ln -sfn /root/target /root/via"
        )
    for source in (str(src), str(shared)):
        proc = sync(c2, "--delete", source, "/root/via")
        assert proc.returncode == 0, proc.stderr
        for i in range(2):
            assert node_sha256(c2, i, "/root/target") == _sums(FILES), f"node {i}"
            assert c2.node_exec(i, "readlink", "/root/via").stdout.strip() == "/root/target"
    assert sorted(os.listdir(shared)) == ["train", "val"]
    proc = sync(c2, "--delete", "leader:/root/target", "/root/via-copy")
    assert proc.returncode == 0, proc.stderr
    assert node_sha256(c2, 1, "/root/via-copy") == _sums(FILES)


def test_dst_in_clusterctl_own_folders_is_refused_on_the_node(c2, tmp_path):
    """Whatever the source (an s3:// source has no folder to compare: these rules are what it meets): a DST
    that resolves into the node runtimes' folder or the home's .clusterctl is refused by the node's agent,
    before anything in it is touched; the runtime's own relay folder stays allowed."""
    src = tmp_path / "ds"
    make_dataset(src, FILES)
    c2.node_exec(1, "sh", "-c", "mkdir -p /opt/clusterctl-runtime/rt1 && echo py > /opt/clusterctl-runtime/rt1/python")
    c2.node_exec(1, "ln", "-sfn", "/opt/clusterctl-runtime/rt1", "/root/rt-link")
    proc = sync(c2, "--delete", str(src), "/root/rt-link")
    assert proc.returncode == 2, proc.stderr
    line = first_error_line(proc.stderr)
    assert line.startswith(f"Error: on {c2.hosts[1]}: refusing to sync into /root/rt-link: "), line
    assert "/opt/clusterctl-runtime/rt1 is in clusterctl's own folder /opt/clusterctl-runtime" in line, line
    assert c2.node_exec(1, "cat", "/opt/clusterctl-runtime/rt1/python").stdout == "py\n"
    proc = sync(c2, "--delete", str(src), ".clusterctl/mine")
    assert proc.returncode == 2 and "is in clusterctl's own folder /root/.clusterctl" in first_error_line(proc.stderr)
    # the node agent alone, as an s3:// source's check runs it (no --src: only the node's own rules)
    home = c2.cli.home / "clusters" / c2.name / "nodes" / "1" / "home"
    shutil.copy(node_pyz(), home / "node-copy.pyz")
    agent = ("python3", "/root/node-copy.pyz", "sync")
    got = c2.node_exec(1, *agent, "fresh", "--dst", "/root/rt-link", "--delete", check=False)
    assert got.returncode == 2 and "clusterctl's own folder /opt/clusterctl-runtime" in got.stdout, got.stdout
    got = c2.node_exec(1, *agent, "fresh", "--dst", "/opt/clusterctl-runtime/.incoming/r")
    assert '"fresh": true' in got.stdout
    assert c2.node_exec(1, "cat", "/opt/clusterctl-runtime/rt1/python").stdout == "py\n"


def test_a_sync_into_a_folder_another_sync_holds_is_refused_naming_it(c2, tmp_path, srv):
    """A run holds the lease on /srv/ds (shared by this machine and both nodes): a sync there is refused with one
    line naming it, nothing written; once it lets go, the sync runs (both nodes share the folder: one lease)."""
    src = tmp_path / "a"
    want = make_dataset(src, {"x.bin": os.urandom(5000)})
    dst = srv / "ds"
    holder = json.dumps({"id": "other-run", "user": "ana", "host": "laptop-7", "pid": 4242})
    lease = subprocess.Popen(
        agent_argv("lease", "--dst", str(dst), "--holder", holder), stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert "judged" in json.loads(lease.stdout.readline())
        lease.stdin.write(b"take\n")
        lease.stdin.flush()
        assert "held" in json.loads(lease.stdout.readline())
        proc = sync(c2, "--delete", str(src), str(dst))
        assert proc.returncode == 3, proc.stderr
        line = first_error_line(proc.stderr)
        assert f"{dst} is being written by another sync other-run from ana@laptop-7 (pid 4242) since " in line, line
        assert line.endswith(
            "wait for it to end and run this sync again (or stop that one first: Ctrl-C where it runs)"
        )
        assert sorted(os.listdir(dst)) == [".clusterctl-sync"]
    finally:
        lease.stdin.close()
        assert lease.wait(timeout=10) == 0
    proc = sync(c2, "--delete", str(src), str(dst))
    assert proc.returncode == 0, proc.stderr
    for i in range(2):
        assert node_sha256(c2, i, str(dst)) == want
        assert marker(c2, i, str(dst))["source"] == str(src)


def test_two_syncs_into_one_folder_started_together_never_leave_mixed_data_marked_complete(c2, tmp_path):
    """`sync --delete A DST` and `sync --delete B DST` at once both exited 0 and left B's files plus one only A
    had, with A's COMPLETE marker: now one waits its turn or is refused, and a marker always vouches for what is
    on disk."""
    a, b = tmp_path / "a", tmp_path / "b"
    sums = {
        str(a): make_dataset(a, {**{f"p-{i}.bin": os.urandom(400_000) for i in range(12)}, "only-a.bin": b"a"}),
        str(b): make_dataset(b, {f"p-{i}.bin": os.urandom(400_000) for i in range(12)}),
    }
    dst = "/root/mixed"
    runs = [c2.cli.popen("sync", "--cluster", c2.name, "--delete", s, dst) for s in (str(a), str(b))]
    outs = [p.communicate(timeout=240) for p in runs]
    codes = [p.returncode for p in runs]
    assert sorted(codes) in ([0, 0], [0, 3]), (codes, outs)
    for code, (_, err) in zip(codes, outs):
        if code == 3:
            assert "is being written by another sync " in first_error_line(err), err
    for i in range(2):
        m = marker(c2, i, dst)
        assert m is not None, f"node {i}: no marker"
        assert node_sha256(c2, i, dst) == sums[m["source"]], f"node {i}: the marker names {m['source']}"


def test_a_node_package_cut_short_is_replaced_before_it_runs_and_said(c2, tmp_path):
    """The node package cut short on a node (a full disk, a killed copy) made every later sync fail there with a
    SyntaxError: now the node's check of its digest finds it, it is shipped again, and the sync says so."""
    from clusterctl.remote import nodepkg

    pkg = nodepkg.package()
    src = tmp_path / "s"
    want = make_dataset(src, {"x.bin": os.urandom(3000)})
    assert sync(c2, str(src), "/root/pkgtest").returncode == 0  # the package on both nodes, checked
    c2.node_exec(1, "truncate", "-s", "2000", f"/root/{pkg.path}")
    proc = sync(c2, "--delete", str(src), "/root/pkgtest")
    assert proc.returncode == 0, proc.stderr
    assert nodepkg.replaced_line(pkg, c2.hosts[1]) in proc.stderr.splitlines(), proc.stderr
    assert nodepkg.replaced_line(pkg, c2.hosts[0]) not in proc.stderr
    assert c2.node_exec(1, "sha256sum", f"/root/{pkg.path}").stdout.split()[0] == pkg.digest
    assert node_sha256(c2, 1, "/root/pkgtest") == want


def test_ctrl_c_lets_go_of_the_lease_at_once(c2, tmp_path):
    """A sync interrupted mid-copy (SIGINT, as Ctrl-C sends) lets go of DST on every node before it exits: the
    next sync into that folder runs, not refused by a lease nobody holds."""
    src = tmp_path / "big"
    want = make_dataset(src, {f"p-{i}.bin": os.urandom(500_000) for i in range(8)})  # 4 MB at 4 Mbit/s: ~8 s
    dst = "/root/interrupted"
    shape(c2, 0, "4mbit")
    try:
        run = c2.cli.popen("sync", "--cluster", c2.name, "--delete", str(src), dst)
        for _ in range(300):  # until the run holds the lease on the leader
            held = c2.node_exec(0, "cat", f"{dst}/.clusterctl-sync/lease", check=False).stdout
            if held or run.poll() is not None:
                break
            time.sleep(0.1)
        assert held and run.poll() is None, run.communicate()
        run.send_signal(signal.SIGINT)
        _, err = run.communicate(timeout=60)
        assert run.returncode == 130, err
        for i in range(2):  # let go: no name left in it, and no process holds it
            assert c2.node_exec(i, "cat", f"{dst}/.clusterctl-sync/lease", check=False).stdout == "", f"node {i}"
    finally:
        unshape(c2, 0)
    proc = sync(c2, "--delete", str(src), dst)
    assert proc.returncode == 0, proc.stderr
    assert node_sha256(c2, 1, dst) == want
