"""Issue 14 (data that can be destroyed, commands that do not stop, smaller holes) on real sshd nodes.

Each test here failed before its fix. The refusals of `sync --delete` are checked with decoys the test
makes itself (a tree holding .ssh, a top-level folder, a symlink to the login home), never by pointing
a sync at a real home or system folder: a regression must not be able to wipe this machine.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from conftest import Cli, LocalCluster, require_root

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def c(module_cluster_factory) -> LocalCluster:
    return module_cluster_factory(2, 1)


def _run(c: LocalCluster, *args: str, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    return c.cli("run", "--cluster", c.name, *args, timeout=timeout, **kw)


def _src(tmp_path: Path, files: int = 3, name_len: int = 8) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    for i in range(files):
        (src / f"{i:06d}-{'n' * name_len}.txt").write_text(f"file {i}\n")
    return src


def _sync(c: LocalCluster, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return c.cli("sync", "--cluster", c.name, *args, timeout=timeout)


# ---- sync --delete: DST resolved on the node, refused before anything is deleted --------------------------
# Nodes have their own /root and /tmp: the decoys are made inside each node.
def _on_nodes(c: LocalCluster, script: str) -> list[str]:
    return [c.node_exec(i, "sh", "-c", script).stdout for i in range(len(c.hosts))]


def test_sync_delete_refuses_a_symlinked_tree_that_holds_ssh(c, tmp_path):
    base = f"/tmp/cc-safe-{uuid.uuid4().hex[:8]}"
    _on_nodes(
        c,
        f"mkdir -p {base}/victim/u/.ssh && echo keep-me > {base}/victim/u/.ssh/authorized_keys && "
        f"echo keep > {base}/victim/notes.txt && ln -s {base}/victim {base}/link",
    )
    proc = _sync(c, "--delete", str(_src(tmp_path)), f"{base}/link")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert ".ssh" in proc.stderr and f"{base}/victim" in proc.stderr
    # nothing was deleted, and nothing written (no state folder, no copied file)
    assert (
        _on_nodes(c, f"cat {base}/victim/u/.ssh/authorized_keys; ls -A {base}/victim")
        == ["keep-me\nnotes.txt\nu\n"] * 2
    )


def test_sync_refuses_a_top_level_folder_with_delete_the_home_and_a_system_folder(c, tmp_path):
    top = Path(f"/cc-safe-{uuid.uuid4().hex[:8]}")  # / is shared with the nodes
    link = f"/tmp/cc-safe-home-{uuid.uuid4().hex[:8]}"
    var = Path(f"/var/tmp/cc-safe-{uuid.uuid4().hex[:8]}")  # /var/tmp is shared with the nodes
    src = _src(tmp_path)
    try:
        top.mkdir()
        (top / "other.bin").write_bytes(b"not in the manifest")
        proc = _sync(c, "--delete", str(src), str(top))
        assert proc.returncode == 2 and "top-level" in proc.stderr, proc.stderr
        assert (top / "other.bin").read_bytes() == b"not in the manifest"
        assert not (top / ".clusterctl-sync").exists()
        # without --delete a top-level folder is allowed: the copy lands and the extra file stays
        ok = _sync(c, str(src), str(top))
        assert ok.returncode == 0, ok.stderr
        assert (top / "other.bin").exists() and len(list(top.glob("*.txt"))) == 3
        # a symlink to the login home: refused even without --delete, nothing written there
        _on_nodes(c, f"ln -s /root {link}")
        home = _sync(c, str(src), link)
        assert home.returncode == 2 and "login home" in home.stderr, home.stderr
        assert all(".txt" not in out and ".clusterctl-sync" not in out for out in _on_nodes(c, "ls -A /root"))
        # a system folder (/var/tmp is shared with the nodes: a decoy harmless to write, even by mistake)
        system = _sync(c, str(src), str(var))
        assert system.returncode == 2 and "system folder" in system.stderr, system.stderr
        assert not var.exists()
    finally:
        shutil.rmtree(top, ignore_errors=True)
        shutil.rmtree(var, ignore_errors=True)


def test_clean_logs_refuses_system_folders_and_ssh_trees(c):
    base = f"/tmp/cc-safe-{uuid.uuid4().hex[:8]}"
    _on_nodes(c, f"mkdir -p {base}/ckpt/.ssh && echo keep > {base}/ckpt/.ssh/authorized_keys")
    var = Path(f"/var/tmp/cc-safe-{uuid.uuid4().hex[:8]}")  # shared with the nodes; a decoy
    (var / "ckpt").mkdir(parents=True)
    try:
        ssh_tree = c.cli("clean", "--cluster", c.name, "--logs", f"{base}/ckpt", "--force", "--yes")
        assert ssh_tree.returncode == 3 and "holds an .ssh folder" in ssh_tree.stderr, ssh_tree.stderr
        assert _on_nodes(c, f"cat {base}/ckpt/.ssh/authorized_keys") == ["keep\n"] * 2
        # inside /var, reached through a symlink: --force allowed it before (two levels deep)
        _on_nodes(c, f"ln -s {var} {base}/var")
        system = c.cli("clean", "--cluster", c.name, "--logs", f"{base}/var", "--force", "--yes")
        assert system.returncode == 3 and "system folder" in system.stderr, system.stderr
        assert (var / "ckpt").is_dir()
    finally:
        shutil.rmtree(var, ignore_errors=True)


def test_clean_logs_through_a_link_to_a_dataset_keeps_it_and_the_question_names_the_resolved_folder(c):
    tag = uuid.uuid4().hex[:8]
    ds, runs = f"cc-ds-{tag}", f"cc-runs-{tag}"
    _on_nodes(
        c,
        f"mkdir -p ~/{ds}/.clusterctl-sync ~/{runs} && echo {{}} > ~/{ds}/.clusterctl-sync/COMPLETE && "
        f"echo data > ~/{ds}/train-0 && ln -s ~/{ds} ~/{runs}/logs && mkdir -p ~/{runs}/old && echo x > ~/{runs}/old/f",
    )
    try:
        linked = c.cli("clean", "--cluster", c.name, "--logs", f"~/{runs}/logs", "--yes")
        assert linked.returncode == 3 and "is a symbolic link to /root/" + ds in linked.stderr, linked.stderr
        assert "removed" not in linked.stdout + linked.stderr
        assert _on_nodes(c, f"cat ~/{ds}/train-0 && test -L ~/{runs}/logs && echo link") == ["data\nlink\n"] * 2
        dataset = c.cli("clean", "--cluster", c.name, "--logs", f"~/{ds}", "--yes")
        assert dataset.returncode == 3 and "holds a verified dataset" in dataset.stderr, dataset.stderr
        asked = c.cli("clean", "--cluster", c.name, "--logs", f"{runs}/old/")  # no terminal: it names, then asks
        assert asked.returncode == 2 and f"would remove /root/{runs}/old" in asked.stderr, asked.stderr
        assert f"Remove /root/{runs}/old (given as {runs}/old/) on 2 node(s)? needs confirmation" in asked.stderr
        assert _on_nodes(c, f"cat ~/{runs}/old/f") == ["x\n"] * 2
    finally:
        _on_nodes(c, f"rm -rf ~/{ds} ~/{runs}")


# ---- many files: results come back by SFTP, never through the capped ssh output -------------------------
CAPPED = (
    "import sys, runpy; import clusterctl.remote.stream as r; r.MAX_CAPTURE = 1 << 16; "
    "sys.argv = ['clusterctl'] + sys.argv[1:]; runpy.run_module('clusterctl', run_name='__main__')"
)


def test_sync_result_larger_than_the_output_cap_still_verifies(c, tmp_path):
    src = _src(tmp_path, files=1500, name_len=80)  # the first check lists ~135 KB of missing paths
    dst = f"/tmp/cc-many-{uuid.uuid4().hex[:8]}"  # in the nodes' own /tmp
    proc = subprocess.run(
        [sys.executable, "-c", CAPPED, "sync", "--cluster", c.name, str(src), dst],
        cwd=c.cli.cwd,
        env=c.cli.env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    names = sorted(p.name for p in src.iterdir())
    for i in range(len(c.hosts)):
        got = c.node_exec(i, "ls", dst).stdout.split()
        assert sorted(got) == names
        assert json.loads(c.node_exec(i, "cat", f"{dst}/.clusterctl-sync/COMPLETE").stdout)["files"] == 1500


# ---- commands that do not stop ------------------------------------------------------------------------
def _no_yes_left(c: LocalCluster) -> bool:
    return all(c.node_exec(i, "pgrep", "-x", "yes", check=False).returncode == 1 for i in range(len(c.hosts)))


def test_timeout_stops_a_command_that_never_stops_printing(c):
    start = time.monotonic()
    proc = _run(c, "--timeout", "4", "yes $(head -c 2000 /dev/zero | tr '\\0' y)", timeout=90)
    assert proc.returncode == 124, proc.stderr[-500:]
    assert time.monotonic() - start < 40
    assert _no_yes_left(c)


def test_ctrl_c_stops_a_command_that_never_stops_printing(c):
    p = c.cli.popen("run", "--cluster", c.name, "yes $(head -c 2000 /dev/zero | tr '\\0' y)")
    os.set_blocking(p.stdout.fileno(), False)
    deadline = time.monotonic() + 30
    seen = b""
    while time.monotonic() < deadline and b"yyyy" not in seen:
        try:
            seen += os.read(p.stdout.fileno(), 65536) or b""
        except BlockingIOError:
            time.sleep(0.05)
    assert b"yyyy" in seen, "no output came"
    p.send_signal(signal.SIGINT)
    end = time.monotonic() + 30
    while p.poll() is None and time.monotonic() < end:
        try:
            os.read(p.stdout.fileno(), 1 << 20)  # keep the pipe drained
        except BlockingIOError:
            time.sleep(0.05)
    if p.poll() is None:
        p.kill()
        pytest.fail("run kept going 30 s after Ctrl-C")
    assert p.returncode == 130
    assert _no_yes_left(c)


def test_a_line_without_end_is_cut_at_64k(c):
    proc = _run(c, "head -c 300000 /dev/zero | tr '\\0' x")
    assert proc.returncode == 0, proc.stderr
    pieces = [line for line in proc.stdout.splitlines() if "xxxx" in line]
    assert len(pieces) >= 2 * 5  # two hosts, 300000 bytes in pieces of at most 64 KiB
    assert max(len(line) for line in pieces) < 64 * 1024 + 100
    assert sum(line.count("x") for line in pieces) == 2 * 300000


def test_output_after_the_exit_status_is_not_lost(c):
    # the shell exits at once; sshd sends its exit status while a child still holds stdout and prints later
    proc = _run(c, "echo first; (sleep 1; echo LAST-LINE) &")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("LAST-LINE") == len(c.hosts), proc.stdout


# ---- state: damaged record, keys, home mode ---------------------------------------------------------------
def test_a_damaged_record_does_not_break_ls_or_gc(c):
    broken = c.cli.home / "clusters" / "zz-broken"
    broken.mkdir(parents=True)
    (broken / "cluster.json").write_text("{not json")
    try:
        ls = c.cli("ls")
        assert ls.returncode == 0, ls.stderr
        assert c.name in ls.stdout and "zz-broken" in ls.stderr
        gc = c.cli("gc", "--provider", "local")  # no terminal: it lists, then asks for --yes
        assert "zz-broken" in gc.stderr and "damaged" in gc.stderr, gc.stderr
        assert c.name in gc.stdout  # the listing went on with the others
        assert gc.returncode == 2 and "needs confirmation" in gc.stderr
    finally:
        shutil.rmtree(broken)


def test_a_missing_public_key_never_replaces_the_private_key(c):
    from clusterctl.remote import sshkeys

    key = c.cli.home / "clusters" / c.name / "id_ed25519"
    private, public = key.read_bytes(), Path(f"{key}.pub").read_text()
    Path(f"{key}.pub").unlink()
    pair = sshkeys.ensure_keypair(key, "clusterctl-test-operator")
    assert key.read_bytes() == private
    assert pair.public_line.split()[:2] == public.split()[:2]
    proc = _run(c, "echo still-in")  # the nodes still take the key
    assert proc.returncode == 0 and proc.stdout.count("still-in") == len(c.hosts), proc.stderr


def test_an_open_clusterctl_home_is_made_private(c):
    os.chmod(c.cli.home, 0o755)
    proc = _run(c, "true")
    assert proc.returncode == 0, proc.stderr
    assert stat.S_IMODE(c.cli.home.stat().st_mode) == 0o700


IMPOSTOR = textwrap.dedent("""
    import socket, sys
    srv = socket.socket(fileno=int(sys.argv[1]))
    srv.listen(8)
    while True:
        conn, _ = srv.accept()
        line = conn.makefile("rb").readline()
        print("GOT", line.decode().strip()[:80], flush=True)
        conn.sendall(b'{"t": "pong", "pid": 1, "connections": 0, "idle": 1}\\n{"t": "started"}\\n{"t": "done"}\\n')
        conn.close()
""")


def test_the_agent_client_refuses_a_socket_of_another_user(c):
    from clusterctl.remote import agent

    agent.stop(c.cli.home)
    path = agent.socket_path(c.cli.home)
    path.unlink(missing_ok=True)
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(path))  # bound by us, listening as nobody: its peer credentials say uid 65534
    imp = subprocess.Popen(
        [sys.executable, "-c", IMPOSTOR, str(srv.fileno())],
        pass_fds=[srv.fileno()],
        user=65534,
        group=65534,
        stdout=subprocess.PIPE,
        text=True,
        cwd="/",
    )
    try:
        time.sleep(0.5)
        assert agent.ping(c.cli.home) is None
        proc = _run(c, "echo real-$((6*7))")
        assert proc.returncode == 0 and proc.stdout.count("real-42") == len(c.hosts), proc.stdout + proc.stderr
    finally:
        imp.kill()
        out = imp.communicate(timeout=10)[0]
        srv.close()
    assert '"op": "run"' not in out, out


# ---- playbooks: variables quoted in run commands ----------------------------------------------------------
def test_playbook_variables_are_quoted_unless_raw(c, tmp_path):
    marker = f"/tmp/cc-pwned-{uuid.uuid4().hex[:8]}"
    book = tmp_path / "book.yaml"
    book.write_text(
        textwrap.dedent("""
        name: quoting
        vars: {msg: hello, cmd: "echo raw-ok", logs: "~/cc-logs-none"}
        steps:
          - name: say
            run: {command: "echo said: {{ msg }}"}
          - name: raw
            run: {command: "{{ cmd | raw }}"}
    """)
    )
    proc = c.cli("play", str(book), "--cluster", c.name, "--var", f"msg=x; touch {marker}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout + proc.stderr
    assert out.count(f"said: x; touch {marker}") == len(c.hosts) and out.count("raw-ok") == len(c.hosts)
    for i in range(len(c.hosts)):
        assert c.node_exec(i, "test", "-e", marker, check=False).returncode == 1


def test_playbook_logs_variable_set_to_tilde_does_not_kill(c, tmp_path):
    sleeper = "import time; time.sleep(3600)"
    for i in range(len(c.hosts)):
        pid = c.node_exec(i, "sh", "-c", f"python3 -c {sleeper!r} >/dev/null 2>&1 & echo $!").stdout.strip()
        assert pid.isdigit()
    book = tmp_path / "clean.yaml"
    book.write_text(
        textwrap.dedent("""
        name: tidy
        vars: {logs: "~/cc-logs-none"}
        steps:
          - name: tidy
            clean: {logs: "{{ logs }}"}
    """)
    )
    try:
        proc = c.cli("play", str(book), "--cluster", c.name, "--var", "logs=~")
        assert proc.returncode != 0 and "home" in (proc.stdout + proc.stderr)
        for i in range(len(c.hosts)):
            assert c.node_exec(i, "pgrep", "-f", "time.sleep\\(3600\\)", check=False).returncode == 0
    finally:
        for i in range(len(c.hosts)):
            c.node_exec(i, "pkill", "-f", "time.sleep\\(3600\\)", check=False)


# ---- netns.destroy: cluster a never touches cluster a-1 ---------------------------------------------------
def test_down_a_leaves_the_etc_netns_of_a_1(cli: Cli):
    require_root()
    from clusterctl.providers.local import netns

    a = "p" + uuid.uuid4().hex[:8]
    made = []
    try:
        for name in (a, f"{a}-1"):
            proc = cli(
                "up",
                "--provider",
                "local",
                "--name",
                name,
                "--nodes",
                "1",
                "--slots",
                "1",
                "--yes",
                "--runtime",
                "none",
                timeout=120,
            )
            made.append(name)
            assert proc.returncode == 0, proc.stderr
        other = Path("/etc/netns") / netns.netns_name(f"{a}-1", 0)
        assert other.is_dir()
        assert cli("down", a, "--yes", timeout=120).returncode == 0
        made.remove(a)
        assert other.is_dir() and (other / "hosts").exists()
        assert netns.leftovers(a).empty
        proc = cli("run", "--cluster", f"{a}-1", "hostname", timeout=60)
        assert proc.returncode == 0, proc.stderr
    finally:
        for name in made:
            cli("down", name, "--yes", timeout=120)
        for name in (a, f"{a}-1"):
            assert netns.leftovers(name).empty


# ---- a lost connection is re-dialled with backoff, not cached for ever ------------------------------------
def test_sweep_attach_redials_a_leader_that_comes_back(c):
    """The leader refuses ssh from outside for 8 s (its own loopback, where the scheduler reaches the leader's
    trials, stays open; established connections get a reset too): --attach gave up after 5 s before."""
    from clusterctl.providers.local import netns

    start = c.cli(
        "sweep",
        "run",
        "--cluster",
        c.name,
        "--detach",
        "--metric",
        r"score: (\S+)",
        "--grid",
        "x=1,2",
        "--",
        "sh",
        "-c",
        "sleep 6; echo score: {x}",
        timeout=120,
    )
    assert start.returncode == 0, start.stderr
    sid = start.stderr.split("sweep ", 1)[1].split(":", 1)[0]
    ns = netns.netns_name(c.name, 0)
    rule = ["INPUT", "!", "-i", "lo", "-p", "tcp", "--dport", "22", "-j", "REJECT", "--reject-with", "tcp-reset"]
    attach = c.cli.popen("sweep", "attach", "--cluster", c.name, "--id", sid)
    try:
        time.sleep(2)
        subprocess.run(["ip", "netns", "exec", ns, "iptables", "-I", *rule], check=True)
        blocked = time.monotonic()
        time.sleep(8)
        assert attach.poll() is None, f"attach gave up while the leader was away: {attach.communicate()}"
    finally:
        subprocess.run(["ip", "netns", "exec", ns, "iptables", "-D", *rule], capture_output=True)
    out, err = attach.communicate(timeout=120)
    assert attach.returncode == 0, out + err
    assert time.monotonic() - blocked < 60
    assert "2 done" in err or "done" in err, err


def test_syncs_openssh_jump_hop_of_a_cluster_gets_the_pinned_known_hosts_and_strict_checking(tmp_path):
    """operator_ssh through the leader (AWS members without a public address): `-J` starts the jump's own ssh
    with `-F` alone, so the config file must carry the pinned known_hosts and strict checking for that hop.
    OpenSSH itself (`ssh -G` with that file, for the leader) is the judge."""
    from clusterctl.remote import openssh
    from clusterctl.remote.targets import SshTarget

    kh = tmp_path / "known_hosts"
    kh.write_text("")
    key = str(tmp_path / "id_ed25519")
    leader = SshTarget("leader", "198.18.0.9", 22, "ubuntu", (key,))
    member = SshTarget("member-1", "10.0.0.5", 22, "ubuntu", (key,), proxy_jump=leader)
    argv = openssh.operator_ssh(member, str(kh), managed=True)
    assert argv[argv.index("-J") + 1] == "ubuntu@198.18.0.9:22" and "-F" in argv
    out = subprocess.run(
        ["ssh", "-G", "-F", argv[argv.index("-F") + 1], "-l", "ubuntu", "198.18.0.9"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    got = dict(line.split(" ", 1) for line in out.splitlines() if " " in line)
    assert got["stricthostkeychecking"] == "true" and got["userknownhostsfile"] == str(kh)
    assert got["globalknownhostsfile"] == "/dev/null" and got["identityfile"] == key
    assert got["identitiesonly"] == "yes" and got["batchmode"] == "yes"
