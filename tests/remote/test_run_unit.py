"""The text clusterctl sends to nodes, checked without nodes: quoting, validation, parsing, exit codes."""

from __future__ import annotations

import os
import shlex
import subprocess
import time

import pytest

from clusterctl.cluster import clean
from clusterctl.cluster.clean_run import CleanSpec
from clusterctl.errors import HostsFileError, UsageError
from clusterctl.hostsfile import HostsFile
from clusterctl.proc import alive
from clusterctl.remote import jobfolder, session, tmux as jobs
from clusterctl.remote.targets import SshTarget
from clusterctl.types import HostResult, RunReport

HOSTILE = [
    "$(touch /tmp/pwned)",
    "`touch /tmp/pwned`",
    "a'; touch /tmp/pwned; '",
    'x" ; touch /tmp/pwned ; "',
    "-oProxyCommand=touch /tmp/pwned",
    "a\nb",
    "a;b|c&d>e<f",
]


def sh(script: str, cwd, env: dict | None = None, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["/bin/sh", "-c", script],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={"PATH": os.environ["PATH"], "HOME": str(cwd), "SHELL": "/bin/sh", **(env or {})},
    )


@pytest.mark.parametrize("cmd", HOSTILE + ["echo 'a b'  \"c\"", ""])
def test_wrapper_runs_the_command_exactly_and_reports_its_session(tmp_path, cmd):
    script = session.wrap_command(f"printf '%s' {shlex.quote(cmd)}")
    proc = subprocess.run(
        ["setsid", "/bin/sh", "-c", script + "; exit 0"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": os.environ["PATH"], "SHELL": "/bin/sh"},
    )
    assert proc.stdout == cmd  # the user's text arrives as one word, byte for byte
    mark, _, rest = proc.stderr.partition("\n")
    assert mark.startswith(session.SID_MARK) and int(mark[len(session.SID_MARK) :]) > 1 and rest == ""
    assert not os.path.exists("/tmp/pwned")


def test_kill_command_kills_session_and_escaped_descendants(tmp_path):
    # a session with a child that left it (setsid), as horovodrun's launcher does: both must die
    n = 3000 + os.getpid() % 1000
    leader = subprocess.Popen(
        ["setsid", "/bin/sh", "-c", f"setsid sleep {n}.1 & sleep {n}.2 & echo $$; wait"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        sid = int(leader.stdout.readline())
        pattern = f"^sleep {n}[.][12]$"
        deadline = time.monotonic() + 10
        while len(_pids_of(pattern)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        victims = _pids_of(pattern)
        assert len(victims) == 2
        proc = sh(session.kill_command(sid), tmp_path)
        assert proc.returncode == 0, proc.stderr
        leader.wait(timeout=10)
        assert not [p for p in victims if alive(p)]
    finally:
        leader.kill()
        for p in _pids_of(f"^sleep {n}[.][12]$"):
            os.kill(p, 9)


def _pids_of(pattern: str) -> list[int]:
    out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


@pytest.mark.parametrize("name", ["", "-x", "a b", "a;b", "$(id)", "a.b", "a:b", "x" * 64, "a\nb", "é"])
def test_job_names_are_validated(name):
    with pytest.raises(UsageError):
        jobs.detach_command(name, "true")
    with pytest.raises(UsageError):
        jobs.logs_command(name)
    with pytest.raises(UsageError):
        jobs.kill_job_command(name)


@pytest.mark.parametrize("cmd", HOSTILE)
def test_job_scripts_quote_every_value_and_parse(cmd):
    for script in (
        jobs.detach_command("train-1", cmd),
        jobs.logs_command("train-1", True),
        jobs.kill_job_command("train-1"),
        clean.kill_command(),
        clean.logs_command("~/logs"),
        clean.logs_command("/data/run 1", force=True),
        clean.DISK_COMMAND,
        clean.REBOOT_COMMAND,
        session.kill_command(1234, grace=2),
    ):
        assert subprocess.run(["/bin/sh", "-n", "-c", script], capture_output=True).returncode == 0, script
    # the user's command reaches tmux as one argument that, unquoted twice, is the command again
    argv = shlex.split(
        jobs.detach_command("train-1", cmd).split("tmux new-session -d -s train-1 ", 1)[1].split(" || exit 1")[0]
    )
    inner = argv[-1]
    assert shlex.split(inner.split('"${SHELL:-/bin/sh}" -c ', 1)[1].split("; rc=$?")[0]) == [cmd]


def test_detached_job_logs_and_exit_status_without_tmux_server(tmp_path):
    # logs of a finished job: its output and its exit status; no job: exit 3 with a message
    d = tmp_path / ".clusterctl" / "jobs"
    d.mkdir(parents=True)
    (d / "j1.log").write_text("one\ntwo\n")
    (d / "j1.exit").write_text("7\n")
    proc = sh(jobs.logs_command("j1"), tmp_path)
    assert (proc.returncode, proc.stdout) == (7, "one\ntwo\n")
    proc = sh(jobs.logs_command("nope"), tmp_path)
    assert proc.returncode == 3 and "no job nope on this host" in proc.stderr


@pytest.mark.parametrize(
    "path, why",
    [
        ("", "empty path"),
        ("   ", "empty path"),
        ("/", "remove /"),
        ("//", "remove /"),
        ("/./", "remove /"),
        ("~", "home itself"),
        ("~/", "home itself"),
        (".", "home itself"),
        ("$HOME", "home itself"),
        ("a/../..", "climbs"),
        ("logs\n/", "control character"),
    ],
)
def test_logs_refusals_before_any_connection(path, why):
    with pytest.raises(UsageError, match=why):
        clean.check_logs_path(path)


def test_logs_removal_resolves_on_the_node(tmp_path):
    home = tmp_path / "home"
    (home / "logs" / "a").mkdir(parents=True)
    (home / "keep").mkdir()
    outside = tmp_path / "outside" / "ckpt"
    outside.mkdir(parents=True)
    (home / "link").symlink_to(home)  # ~/link resolves to the home itself
    (home / "up").symlink_to(tmp_path / "outside")

    def run(path, force=False):
        return subprocess.run(
            ["/bin/sh", "-c", clean.logs_command(path, force)],
            cwd=home,
            capture_output=True,
            text=True,
            env={"PATH": os.environ["PATH"], "HOME": str(home)},
        )

    assert run("~/link").returncode == 3 and "home itself" in run("~/link").stderr
    r = run(str(outside))
    assert r.returncode == 3 and "outside the login user's home" in r.stderr and outside.exists()
    r = run("up/ckpt")
    assert r.returncode == 3 and outside.exists()  # a symlink does not smuggle a path out of the home
    r = run(str(outside), force=True)
    assert r.returncode == 0 and not outside.exists()
    r = run("~/logs")
    assert r.returncode == 0 and r.stdout.strip() == f"removed {home / 'logs'}" and not (home / "logs").exists()
    assert (home / "keep").exists()
    assert run("logs").stdout.strip().startswith("nothing at")


def test_logs_never_removes_through_a_symlink_nor_a_dataset_or_a_checkpoint_without_force(tmp_path):
    home = tmp_path / "home"
    data = home / "imagenet"
    (data / ".clusterctl-sync").mkdir(parents=True)
    (data / ".clusterctl-sync" / "COMPLETE").write_text("{}")
    (data / "train-00000").write_text("x")
    (home / "runs").mkdir()
    (home / "runs" / "logs").symlink_to(data)  # the reproduction: logs is a link to the verified dataset
    ckpt = home / "run1" / "ckpt"
    ckpt.mkdir(parents=True)
    (ckpt / "ckpt-512.manifest.json").write_text("{}")

    def run(path, force=False, check_only=False):
        return subprocess.run(
            ["/bin/sh", "-c", clean.logs_command(path, force, check_only)],
            cwd=home,
            capture_output=True,
            text=True,
            env={"PATH": os.environ["PATH"], "HOME": str(home)},
        )

    for path, force in (("~/runs/logs", False), ("runs/logs/", False), ("~/runs/logs//", True)):
        r = run(path, force)
        assert r.returncode == 3 and "is a symbolic link to " + str(data) in r.stderr, (path, r.stderr)
        assert (data / "train-00000").exists() and (home / "runs" / "logs").is_symlink()
    r = run("~/imagenet")
    assert r.returncode == 3 and "holds a verified dataset or a checkpoint" in r.stderr and data.exists()
    r = run("run1")
    assert r.returncode == 3 and "ckpt-512.manifest.json" in r.stderr and ckpt.exists()
    # the confirmation's check: every refusal, and the resolved folder, nothing changed
    r = run("~/run1/", force=True, check_only=True)
    assert (r.returncode, r.stdout.strip()) == (0, f"would remove {home / 'run1'}") and ckpt.exists()
    assert clean.would_remove(r.stdout) == str(home / "run1") and clean.would_remove("nothing at /x\n") is None
    assert run("~/run1", force=True).returncode == 0 and not (home / "run1").exists()
    assert run("~/imagenet", force=True).returncode == 0 and not data.exists()


def test_clean_asks_about_the_resolved_folder():
    spec = CleanSpec(logs_dir="~/runs/logs")
    assert spec.questions("2 node(s)", 0, ["/root/runs/logs", "/root/runs/logs"]) == [
        "Remove /root/runs/logs (given as ~/runs/logs) on 2 node(s)?"
    ]
    assert spec.questions("2 node(s)", 0, []) == []  # nothing there on any node: nothing to ask
    assert "would remove" in spec.logs_check_command() and "rm -rf" not in spec.logs_check_command()


def test_disk_parse_and_low_flag():
    rows = clean.parse_disk("h1", "/ 1000 950 50\n/tmp 2000 100 1900\ngarbage line\n")
    assert [(r.mount, r.low) for r in rows] == [("/", True), ("/tmp", False)]
    assert rows[0].free_fraction == pytest.approx(0.05)


def test_disk_command_reports_this_machine(tmp_path):
    proc = sh(clean.DISK_COMMAND, tmp_path)
    rows = clean.parse_disk("me", proc.stdout)
    assert proc.returncode == 0 and "/" in [r.mount for r in rows] and all(r.size_kb > 0 for r in rows)


def test_exit_code_precedence():
    ok = HostResult("a", 0)
    failed = HostResult("b", 200, stderr="boom")
    unreachable = HostResult("c", None, error="refused")
    timed_out = HostResult("d", None, error="timed out", timed_out=True)
    assert RunReport((ok,)).exit_code == 0
    assert RunReport((ok, failed)).exit_code == 123  # capped below 124
    assert RunReport((ok, HostResult("b", 7))).exit_code == 7
    assert RunReport((failed, unreachable)).exit_code == 5
    assert RunReport((failed, unreachable, timed_out)).exit_code == 124


@pytest.mark.parametrize(
    "entry",
    [
        "-oProxyCommand=touch${IFS}/tmp/pwned",
        "a;id",
        "$(id)",
        "`id`",
        "a|b",
        "host\x0bname",
        "a\rb",
        "a\x1b[31m",
        "a,b",
        "[::1]x",
    ],
)
def test_hostile_host_tokens_are_refused(entry):
    with pytest.raises(HostsFileError):
        HostsFile.parse(f"10.0.0.1 slots=1\n{entry} slots=1\n")


def test_agent_socket_path_is_short_and_private(tmp_path):
    from clusterctl.remote import agent

    short = agent.socket_path(tmp_path)
    assert short == tmp_path / "agent.sock"
    deep = tmp_path / ("x" * 120)
    long = agent.socket_path(deep)
    assert len(str(long)) < 108 and long.parent.stat().st_mode & 0o077 == 0
    assert long == agent.socket_path(deep)  # the same home always finds the same agent


def test_targets_carry_absolute_paths_through_the_agent(tmp_path, monkeypatch):
    from clusterctl.remote import agent

    monkeypatch.chdir(tmp_path)
    jump = SshTarget("b", "10.0.0.1", 22, "u", ("key",))
    t = SshTarget("h", "10.0.0.2", 2222, "root", ("k1",), jump)
    back = agent.target_from_dict(agent.target_to_dict(t))
    assert back.identity_files == (str(tmp_path / "k1"),) and back.proxy_jump.identity_files == (str(tmp_path / "key"),)
    assert (back.hostname, back.port, back.user, back.proxy_jump.hostname) == ("10.0.0.2", 2222, "root", "10.0.0.1")


def test_disk_table_flags_nodes_under_ten_percent(capsys):
    from clusterctl.cli.fanout import disk_table

    disk_table(
        clean.parse_disk("10.0.0.2", "/ 1000000 950000 50000\n")
        + clean.parse_disk("10.0.0.3", "/ 1000000 100000 900000\n")
    )
    out, err = capsys.readouterr()
    rows = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert "LOW" in rows["10.0.0.2"] and "5%" in rows["10.0.0.2"]
    assert "LOW" not in rows["10.0.0.3"] and "90%" in rows["10.0.0.3"]
    assert "under 10% free on 10.0.0.2" in err


def test_node_path():
    assert jobfolder.node_path("~/imagenet_data", "/home/ubuntu") == "/home/ubuntu/imagenet_data"
    assert jobfolder.node_path("~", "/root") == "/root"
    assert jobfolder.node_path("data/x", "/root") == "/root/data/x"
    assert jobfolder.node_path("/mnt/data", "/root") == "/mnt/data"
    for bad in ("~other/x", "", "a\nb"):
        with pytest.raises(ValueError):
            jobfolder.node_path(bad, "/root")
