"""Detached jobs (run --detach, logs, kill) and clean (kill, logs, disk, reboot) on a real local cluster."""

from __future__ import annotations

import signal
import time

import pytest

from clusterctl.providers.local import netns

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def c(module_cluster_factory):
    return module_cluster_factory(2, 1)


def on_nodes(c, *argv: str) -> list[str]:
    return [c.node_exec(i, *argv, check=False).stdout for i in range(len(c.hosts))]


def running(c, pattern: str) -> list[bool]:
    return [c.node_exec(i, "pgrep", "-f", pattern, check=False).returncode == 0 for i in range(len(c.hosts))]


def test_detached_job_logs_follow_and_exit_status(c):
    proc = c.cli(
        "run", "--detach", "steps", "hosts", "for i in 1 2 3; do echo step $i on $(hostname); sleep 0.4; done; exit 3"
    )
    assert proc.returncode == 0, proc.stderr
    for h in c.hosts:
        assert f"{h}: started job steps; log: /root/.clusterctl/jobs/steps.log" in proc.stdout
    again = c.cli("run", "--detach", "steps", "hosts", "true")
    assert again.returncode == 3 and "job steps is still running here: clusterctl kill steps" in again.stderr
    follow = c.cli("logs", "-f", "steps", timeout=60)
    assert follow.returncode == 3, follow.stderr  # the job's own exit status, once it ended everywhere
    for i, h in enumerate(c.hosts):
        name = f"{c.name}-leader" if i == 0 else f"{c.name}-member-{i}"
        assert [line for line in follow.stdout.splitlines() if line.startswith(h + ": ")] == [
            f"{h}: step {n} on {name}" for n in (1, 2, 3)
        ]
    assert on_nodes(c, "tmux", "ls") == ["", ""]  # the session ended with the job
    again = c.cli("logs", "steps")
    assert again.returncode == 3 and sorted(again.stdout.splitlines()) == sorted(follow.stdout.splitlines())
    missing = c.cli("logs", "nosuchjob")
    assert missing.returncode == 3 and "no job nosuchjob on this host" in missing.stderr


def test_jobs_lists_every_detached_job_from_the_nodes_and_logs_and_kill_take_its_id(c):
    import json

    assert c.cli("run", "--detach", "quick", "hosts", "echo done; exit 2").returncode == 0
    assert c.cli("run", "--detach", "slow", "hosts", "sleep 7351").returncode == 0
    c.node_exec(0, "sh", "-c", "echo from before ids > /root/.clusterctl/jobs/olden.log")  # no .job file
    deadline = time.monotonic() + 20
    while True:
        proc = c.cli("jobs", "--json")
        assert proc.returncode == 0, proc.stderr
        listed = {j["name"]: j for j in json.loads(proc.stdout)}
        if listed.get("quick", {}).get("state") == "failed" or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    quick, slow, olden = listed["quick"], listed["slow"], listed["olden"]
    assert set(quick) == {
        "id",
        "name",
        "kind",
        "state",
        "started",
        "ended",
        "duration_s",
        "nodes",
        "hosts",
        "exit_status",
    }
    assert (quick["kind"], quick["state"], quick["exit_status"], quick["nodes"]) == ("run", "failed", 2, 2)
    assert sorted(quick["hosts"]) == sorted(c.hosts) and quick["ended"] >= quick["started"] > time.time() - 300
    assert (slow["state"], slow["exit_status"], slow["ended"]) == ("running", None, None)
    assert len(slow["id"]) == 6 and slow["id"] != quick["id"]  # one id for the job on every host
    assert (olden["id"], olden["kind"], olden["state"], olden["hosts"]) == ("-", "-", "ended", [c.hosts[0]])
    table = c.cli("jobs", env={"COLUMNS": "100"})
    assert table.returncode == 0
    row = next(line.split() for line in table.stdout.splitlines() if " slow " in line)
    assert row[:4] == [slow["id"], "slow", "run", "running"]
    # logs and kill by id
    logs = c.cli("logs", quick["id"])
    assert logs.returncode == 2 and sorted(logs.stdout.splitlines()) == sorted(f"{h}: done" for h in c.hosts)
    assert c.cli("kill", slow["id"]).returncode == 0
    assert not any(running(c, "^sleep 7351$"))
    after = {j["name"]: j for j in json.loads(c.cli("jobs", "--json").stdout)}
    assert after["slow"]["state"] == "failed" and after["slow"]["exit_status"] == 137
    missing = c.cli("logs", "abcdef")
    assert missing.returncode == 2, missing.stderr
    assert "Error: no job named or with id 'abcdef' on these nodes: `clusterctl jobs` lists them" in missing.stderr
    for i in range(len(c.hosts)):
        c.node_exec(
            i,
            "sh",
            "-c",
            "rm -f /root/.clusterctl/jobs/quick.* /root/.clusterctl/jobs/slow.* /root/.clusterctl/jobs/olden.*",
        )


def test_detached_job_survives_disconnect_and_kill_ends_its_whole_tree(c):
    cmd = (
        'python3 -c \'import subprocess, time; subprocess.Popen(["setsid", "sleep", "7341"]); '
        'print("ready", flush=True); time.sleep(7342)\''
    )
    assert c.cli("run", "--detach", "train", "hosts", cmd).returncode == 0
    deadline = time.monotonic() + 20
    while not all(running(c, "^sleep 7341$")):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    # every connection closes (the laptop goes away): the job keeps running
    assert c.cli("agent", "stop").returncode == 0
    time.sleep(0.5)
    assert all(running(c, "time.sleep.7342")) and all(running(c, "^sleep 7341$"))
    logs = c.cli("logs", "train")
    assert logs.returncode == 0 and all(f"{h}: ready" in logs.stdout for h in c.hosts)
    # Ctrl-C on `logs -f` stops the following, never the job
    follow = c.cli.popen("logs", "-f", "train")
    try:
        seen = [follow.stdout.readline() for _ in c.hosts]
        assert sorted(seen) == sorted(f"{h}: ready\n" for h in c.hosts)
        follow.send_signal(signal.SIGINT)
        assert follow.wait(timeout=30) == 130
    finally:
        follow.kill()
    assert all(running(c, "time.sleep.7342")) and all(running(c, "^sleep 7341$"))
    assert running(c, "tail -n") == [False, False]

    kill = c.cli("kill", "--grace", "0.5", "train")
    assert kill.returncode == 0, kill.stderr
    assert all(f"{h}: killed job train" in kill.stdout for h in c.hosts)
    assert running(c, "time.sleep.7342") == [False, False]
    assert running(c, "^sleep 7341$") == [False, False]  # it left the session (setsid): the tree still caught it
    assert on_nodes(c, "tmux", "ls") == ["", ""]
    after = c.cli("logs", "train")
    assert after.returncode == 123 and "exit 137" in after.stderr  # killed: 128+9, capped for the tool
    again = c.cli("kill", "train")
    assert again.returncode == 0 and all(f"{h}: job train is not running here" in again.stdout for h in c.hosts)


def test_clean_all_user_processes_kills_python_trees_only_and_verifies(c):
    start = (
        'setsid nohup python3 -c \'import subprocess; subprocess.run(["sleep", "7351"])\' >/dev/null 2>&1 & '
        "setsid nohup sleep 7352 >/dev/null 2>&1 & echo started"
    )
    assert c.cli("run", "hosts", start).returncode == 0
    deadline = time.monotonic() + 20
    while not all(running(c, "^sleep 7351$")):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    proc = c.cli("clean", "--all-user-processes", "--yes", "hosts")
    assert proc.returncode == 0, proc.stderr
    for h in c.hosts:
        line = next(x for x in proc.stdout.splitlines() if x.startswith(h + ": killed"))
        assert "killed 2 process(es): " in line and "python3[" in line and "sleep[" in line
    assert running(c, "^sleep 7351$") == [False, False] and running(c, "python3 -c") == [False, False]
    assert running(c, "^sleep 7352$") == [True, True]  # not a python tree: left alone
    again = c.cli("clean", "--kill", "--all-user-processes", "--yes", "hosts")
    assert again.returncode == 0 and again.stdout.count(": nothing to kill") == 2
    for i in range(len(c.hosts)):
        c.node_exec(i, "pkill", "-f", "^sleep 7352$", check=False)


def test_bare_clean_names_what_it_kills_asks_and_kills_only_the_jobs_clusterctl_started(c):
    # The user's own python on every node, started without clusterctl (as a login shell would).
    mine = "cd /root && setsid nohup python3 -c 'import time; time.sleep(7361)' >/dev/null 2>&1 &"
    for i in range(len(c.hosts)):
        c.node_exec(i, "env", "-i", "PATH=/usr/bin:/bin", "HOME=/root", "sh", "-c", mine)
    job = c.cli("run", "--detach", "cjob", "hosts", "python3 -c 'import time; time.sleep(7362)'; sleep 7363")
    assert job.returncode == 0, job.stderr
    deadline = time.monotonic() + 20
    while not (all(running(c, "time.sleep.7361")) and all(running(c, "time.sleep.7362"))):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    try:
        asked = c.cli("clean", "hosts")  # no terminal, no --yes: it names them and asks, and kills nothing
        assert asked.returncode == 2, asked.stderr
        assert "needs confirmation: pass --yes" in asked.stderr.splitlines()[-1]
        named = [x for x in asked.stderr.splitlines() if "would kill" in x]
        for h in c.hosts:
            assert any(x.startswith(f"{h}: would kill") and "time.sleep(7362)" in x for x in named), asked.stderr
        assert not any("7361" in x for x in named), named
        assert running(c, "time.sleep.7362") == [True, True] and running(c, "time.sleep.7361") == [True, True]
        proc = c.cli("clean", "--yes", "hosts")
        assert proc.returncode == 0, proc.stderr
        assert all(f"{h}: killed" in proc.stdout for h in c.hosts), proc.stdout
        assert running(c, "time.sleep.7362") == [False, False] and running(c, "^sleep 7363$") == [False, False]
        assert running(c, "time.sleep.7361") == [True, True]  # the user's own: alive
        assert on_nodes(c, "tmux", "ls") == ["", ""]
        again = c.cli("clean", "hosts")  # nothing of clusterctl's left: nothing to ask about
        assert again.returncode == 0 and "no processes of jobs clusterctl started to kill on 2 node(s)" in again.stderr
        assert running(c, "time.sleep.7361") == [True, True]
    finally:
        for i in range(len(c.hosts)):
            c.node_exec(i, "pkill", "-f", "time.sleep.736[123]", check=False)


def test_clean_logs_folder_with_refusals(c):
    assert c.cli("run", "hosts", "mkdir -p ~/logs/run1 /tmp/ckpt/run1 && touch ~/logs/run1/x ~/keep").returncode == 0
    no_yes = c.cli("clean", "--logs", "~/logs")
    assert no_yes.returncode == 2 and "needs confirmation: pass --yes" in no_yes.stderr
    assert on_nodes(c, "ls", "/root/logs") == ["run1\n", "run1\n"]

    outside = c.cli("clean", "--logs", "/tmp/ckpt", "--yes")
    assert outside.returncode == 3
    assert outside.stderr.count("refused: /tmp/ckpt is outside the login user's home /root (--force to allow)") >= 2
    assert on_nodes(c, "ls", "/tmp/ckpt") == ["run1\n", "run1\n"]
    top = c.cli("clean", "--logs", "/tmp", "--force", "--yes")
    assert top.returncode == 3 and "refused: /tmp is a top-level folder (even with --force)" in top.stderr
    for bad, why in (("/", "refuses to remove /"), ("~", "home itself"), ("", "not an empty path")):
        proc = c.cli("clean", "--logs", bad, "--yes")
        assert proc.returncode == 2 and why in proc.stderr and proc.stdout == ""

    ok = c.cli("clean", "--logs", "~/logs", "--yes")
    assert ok.returncode == 0, ok.stderr
    assert all(f"{h}: removed /root/logs" in ok.stdout for h in c.hosts)
    forced = c.cli("clean", "--logs", "/tmp/ckpt", "--force", "--yes")
    assert forced.returncode == 0 and all(f"{h}: removed /tmp/ckpt" in forced.stdout for h in c.hosts)
    assert all("keep" in out and "logs" not in out for out in on_nodes(c, "ls", "/root"))
    assert all("ckpt" not in out for out in on_nodes(c, "ls", "/tmp"))


def test_clean_disk_table(c):
    proc = c.cli("clean", "--disk")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["HOST", "MOUNT", "SIZE", "USED", "FREE", "FREE%"]
    for h in c.hosts:
        mounts = [line.split()[1] for line in lines[1:] if line.split()[0] == h]
        assert "/" in mounts and "/tmp" in mounts  # each node's own /tmp is its own file system


def test_clean_reboot_restarts_every_node(c):
    assert c.cli("run", "hosts", "touch /tmp/before-reboot ~/survives").returncode == 0
    pids = [netns.netns_pids(netns.netns_name(c.name, i)) for i in range(len(c.hosts))]
    proc = c.cli("clean", "--reboot", "--yes")
    assert proc.returncode == 0, proc.stderr
    assert "2 node(s) rebooted and answering ssh" in proc.stderr
    after = [netns.netns_pids(netns.netns_name(c.name, i)) for i in range(len(c.hosts))]
    assert all(not set(a) & set(b) for a, b in zip(pids, after))  # every old process is gone
    check = c.cli("run", "hosts", "ls /tmp; ls ~")
    assert check.returncode == 0
    assert "before-reboot" not in check.stdout and check.stdout.count("survives") == 2
