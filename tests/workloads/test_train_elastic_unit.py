"""`train --elastic`'s pure parts: its options' checks, horovodrun's elastic argv, the live-hosts file and its
discovery script's reading of it, and the `world_size` lines read back (the line when too few nodes are left:
tests/node/test_horovodrun.py)."""

from __future__ import annotations

import shlex
import subprocess

import pytest

from clusterctl.cluster import live_hosts
from clusterctl.errors import UsageError
from clusterctl.hostsfile import HostsFile
from clusterctl.node import live_hosts as node_live_hosts
from clusterctl.workloads import horovod, launch
from clusterctl.workloads.train import (
    log as train_log,
    options as train_options,
    plan as train_plan,
    status as train_status,
)
from clusterctl.workloads.train.options import TrainOptions
from conftest import node_pyz


def test_elastic_options_checked_one_by_one_and_together():
    opts = TrainOptions(synthetic=True, elastic=True, min_np=2, max_np=4, commit_every=25, elastic_timeout=60)
    argv = train_options.trainer_argv("py", "t.py", opts)
    # the trainer gets --elastic and --commit-every; --min-np/--max-np/--elastic-timeout are horovodrun's
    assert argv[-3:] == ["25", "--synthetic", "--elastic"] and "--commit-every" in argv
    assert not {"--min-np", "--max-np", "--elastic-timeout"} & set(argv)
    for bad, message in (
        (dict(min_np=0), "--min-np must be at least 1"),
        (dict(max_np=0), "--max-np must be at least 1"),
        (dict(commit_every=0), "--commit-every must be at least 1"),
        (dict(elastic_timeout=0), "--elastic-timeout must be at least 1"),
        (dict(min_np=3, max_np=2), "--min-np 3 is more than --max-np 2"),
        (dict(eval_every=1), "--eval-every and --eval-only do not apply"),
    ):
        with pytest.raises(UsageError, match=message):
            TrainOptions(synthetic=True, elastic=True, **bad)
    with pytest.raises(UsageError, match="--min-np, --commit-every: for elastic runs only") as err:
        TrainOptions(synthetic=True, min_np=2, commit_every=5)
    assert err.value.hint == "add --elastic"


def test_trainer_parses_the_elastic_flags():
    from clusterctl.node.train import options as mod

    args = mod.parse_args(["--synthetic", "--elastic", "--commit-every", "7"])
    assert args.elastic and args.commit_every == 7
    assert mod.parse_args(["--synthetic"]).commit_every == 50 and not mod.parse_args(["--synthetic"]).elastic
    with pytest.raises(SystemExit):
        mod.parse_args(["--synthetic", "--elastic", "--expect-size", "3"])
    with pytest.raises(SystemExit):
        mod.parse_args(["--synthetic", "--commit-every", "0"])


def test_horovodrun_elastic_argv():
    el = horovod.Elastic(2, 4, "/opt/py /job/live_hosts.py /job/hosts", 60)
    argv = horovod.horovodrun_argv(3, HostsFile.parse("a slots=1\nb slots=2\n"), ["python", "t.py"], elastic=el)
    assert argv[:3] == ["horovodrun", "-np", "3"] and "-H" not in argv and "--hostfile" not in argv
    at = argv.index("--min-np")
    assert argv[at : at + 11] == [
        "--min-np",
        "2",
        "--max-np",
        "4",
        "--host-discovery-script",
        "/opt/py /job/live_hosts.py /job/hosts",
        "--elastic-timeout",
        "60",
        "--blacklist-cooldown-range",
        *map(str, horovod.ELASTIC_COOLDOWN_S),
    ]
    assert argv[-2:] == ["python", "t.py"]
    with pytest.raises(ValueError, match="min_np <= np <= max_np"):
        horovod.horovodrun_argv(5, HostsFile.parse("a slots=1\n"), ["python"], elastic=el)
    job = launch.JobFolder("train-x", "/home/u")
    cmd = launch.leader_command(job, 3, ["/opt/py", "t.py"], "/opt/py", {}, elastic=el)
    assert "--host-discovery-script '/opt/py /job/live_hosts.py /job/hosts'" in cmd


def test_elastic_args_defaults_and_refusal():
    opts = TrainOptions(synthetic=True, elastic=True)
    el = train_plan.elastic_args(opts, 3, "/opt/py", "/home/u/clusterctl-jobs/train-x", "/home/u/n.pyz")
    assert (el.min_np, el.max_np, el.timeout_s) == (1, 3, train_options.ELASTIC_TIMEOUT_S)
    assert shlex.split(el.discovery) == [
        "/opt/py",
        "/home/u/n.pyz",
        "live_hosts",
        "/home/u/clusterctl-jobs/train-x/hosts",
    ]
    with pytest.raises(UsageError, match="--min-np 4 is more than the 3 process"):
        train_plan.elastic_args(TrainOptions(synthetic=True, elastic=True, min_np=4), 3, "/opt/py", "/j", "/p")


def test_live_hosts_file_written_whole_and_read_by_the_discovery_script(tmp_path):
    hosts = HostsFile.parse("10.0.0.1 slots=2\n10.0.0.2 slots=2\n")
    assert live_hosts.render(hosts) == "10.0.0.1:2\n10.0.0.2:2\n"
    home = tmp_path / "home"
    home.mkdir()
    proc = subprocess.run(["sh", "-c", live_hosts.write_command(hosts)], env={"HOME": str(home)}, capture_output=True)
    assert proc.returncode == 0, proc.stderr
    assert (home / live_hosts.PATH).read_text() == "10.0.0.1:2\n10.0.0.2:2\n"
    assert oct((home / ".clusterctl").stat().st_mode & 0o777) == "0o700"
    assert [p.name for p in (home / ".clusterctl").iterdir()] == ["live-hosts"]  # no temporary file left
    with pytest.raises(UsageError):
        live_hosts.render(HostsFile.parse("10.0.0.1:2222 slots=1\n"))
    # both formats (live-hosts, the job's hosts file); a host that would be an ssh option is never used
    assert node_live_hosts.entries("a:2\n# note\n\nb slots=3\n-oProxyCommand=x:1\nc:0\n") == [("a", 2), ("b", 3)]


def test_discovery_script_prints_only_hosts_that_answer(tmp_path):
    """Through real ssh: a host nobody listens for is left out (the file is the one in HOME, else argv[1])."""
    home = tmp_path / "home"
    (home / ".clusterctl").mkdir(parents=True)
    (tmp_path / "hosts").write_text("127.0.0.1 slots=1\n")
    (home / ".clusterctl" / "live-hosts").write_text("127.0.0.9:1\n")
    env = {"HOME": str(home), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(
        ["python3", node_pyz(), "live_hosts", str(tmp_path / "hosts")], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0 and proc.stdout == "", proc.stdout + proc.stderr


def test_discovery_gives_a_replaced_node_the_job_folder_and_the_node_package(monkeypatch, tmp_path):
    """A node `repair` brought in mid-run has neither the job's folder nor the package its ranks run: both are
    copied to it before it is offered (a rank started there without them would end the whole job); a node
    that has both gets nothing."""
    archive = tmp_path / "node-x.pyz"
    archive.write_bytes(b"zip")
    calls: list[list[str]] = []
    probe = ["0 0\n"]  # what the node says: its folder's and its package's `test` statuses

    def run(argv, **_kw):
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 0, probe[0] if "echo" in argv[-1] else "", "")

    monkeypatch.setattr(node_live_hosts.subprocess, "run", run)
    for probe[0], copies in (("0 0\n", []), ("1 1\n", ["/job/", str(archive)]), ("0 1\n", [str(archive)])):
        calls.clear()
        assert node_live_hosts.answers("10.0.0.3", "/job", str(archive))
        rsyncs = [c for c in calls if c[0] == "rsync"]
        assert [c[-2] for c in rsyncs] == copies, calls
    assert rsyncs[0][-1] == f"10.0.0.3:{archive}"  # the same path there
    # run from a source tree (no archive): only the folder is asked about
    calls.clear()
    probe[0] = "0 0\n"
    assert node_live_hosts.answers("10.0.0.3", "/job", str(tmp_path / "tree"))
    assert "test -f" not in calls[0][-1]


def test_world_size_lines_read_back_and_shown_by_status():
    start = (
        "[0]<stdout>:CLUSTERCTL-TRAIN start size=3 model=tiny batch=8 global_batch=24 train_examples=1000 "
        "steps_per_epoch=41 epochs=90 total_steps=3690 stop_step=100 start_step=0 peak_lr=0.01\n"
    )
    change = (
        "[0]<stdout>:CLUSTERCTL-TRAIN world_size size=2 was=3 lost=10.0.0.3 joined='' step=60 images=1440 "
        "global_batch=16 peak_lr=0.00625 message='world size 3 -> 2 (lost 10.0.0.3)'\n"
    )
    log = train_log.parse_train_log(start + change)
    (resize,) = log.current.resizes
    assert resize == train_log.WorldSize(2, 3, ("10.0.0.3",), (), 1440, "world size 3 -> 2 (lost 10.0.0.3)")
    st = train_status.status(log, running=True)
    assert st.size == 2 and st.resized == "world size 3 -> 2 (lost 10.0.0.3)"
    too_few = "CLUSTERCTL-TRAIN error kind=too_few_nodes min_np=2 timeout=30 message='fewer than --min-np 2 ...'\n"
    st = train_status.status(train_log.parse_train_log(start + change + too_few), running=False)
    assert st.state == "failed" and st.reason.startswith("too_few_nodes: fewer than --min-np 2")


def test_size_line_names_lost_and_joined_hosts():
    from clusterctl.node.train import elastic as mod

    assert mod.size_line(["a", "b", "c"], ["a", "b"]) == (["c"], [], "world size 3 -> 2 (lost c)")
    assert mod.size_line(["a", "b"], ["a", "b", "d"]) == ([], ["d"], "world size 2 -> 3 (joined d)")
    assert mod.size_line(["a", "a", "b"], ["a", "c"])[2] == "world size 3 -> 2 (lost a, b; joined c)"
