"""`clusterctl launch`: the user's own TF2 Keras + Horovod script (written here) across 2 nodes x 2 slots,
horovodrun on the leader in tmux; `logs`, `status` and `kill` by the job's name; bad input refused in one
line; the node package's overlap probe launched as a script, reading Horovod's timeline of the training step.
The pure parts of clusterctl.workloads.userjob (the command, the files, the shell text) first."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from subprocess import DEVNULL

import pytest

from clusterctl.errors import UsageError
from clusterctl.remote import nodepkg
from clusterctl.workloads import userjob
from conftest import node_pid, wait_for
from workload_support import HELPER, RANK_LINE, SCRIPT

# ---- pure: the command and the files ---------------------------------------------------------------------


def test_the_command_must_be_python_with_a_script():
    assert userjob.is_python("python") and userjob.is_python("python3.11") and userjob.is_python("/venv/bin/python3")
    assert not userjob.is_python("bash") and not userjob.is_python("pythonista") and not userjob.is_python("ipython")
    c = userjob.parse_command(["python3", "-u", "-W", "ignore", "train.py", "--lr", "0.1", "-u"])
    assert (c.python, c.options, c.script, c.args) == (
        "python3",
        ("-u", "-W", "ignore"),
        "train.py",
        ("--lr", "0.1", "-u"),
    )
    m = userjob.parse_command(["python", "-m", "horovod.examples", "--x"])
    assert (m.module, m.script, m.args) == ("horovod.examples", None, ("--x",))
    for bad, why in (
        (["bash", "run.sh"], "must start with python, not 'bash'"),
        ([], "no command given"),
        (["python"], "runs no script"),
        (["python", "-m"], "python -m needs a value"),
        (["python", "-"], "cannot run on the nodes"),
        (["python", "--version"], "runs no script"),
        ([" "], "no command given"),
    ):
        with pytest.raises(UsageError, match=re.escape(why)):
            userjob.parse_command(bad)


def test_hosts_file_before_the_command():
    assert userjob.split_hosts(["hosts", "python", "x.py"]) == ("hosts", ["python", "x.py"])
    assert userjob.split_hosts(["python", "x.py", "hosts"]) == (None, ["python", "x.py", "hosts"])
    assert userjob.split_hosts(["bash", "x.sh"]) == (None, ["bash", "x.sh"])


def test_plan_stages_the_script_and_files_by_name(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "train.py").write_text("print(1)\n")
    (tmp_path / "sub" / "helper.py").write_text("X = 1\n")
    p = userjob.plan(["python", "train.py", "--epochs", "2"], ["sub/helper.py"], tmp_path)
    assert p.files == {"helper.py": tmp_path / "sub" / "helper.py", "train.py": tmp_path / "train.py"}
    # the script by its absolute path in the job folder (what finds the job's processes on every node)
    assert p.rank_argv("/rt/bin/python", "/root/clusterctl-jobs/j1") == [
        "/rt/bin/python",
        "/root/clusterctl-jobs/j1/train.py",
        "--epochs",
        "2",
    ]
    # a script only given with --file, named by its base name
    p = userjob.plan(["python", "helper.py"], ["sub/helper.py"], tmp_path)
    assert p.script_name == "helper.py" and p.rank_argv("py", "/j") == ["py", "/j/helper.py"]
    # a script already on the nodes, and -m: the job folder rides along as -X so kill still finds the ranks
    p = userjob.plan(["python", "/opt/examples/keras_mnist.py"], [], tmp_path)
    assert p.remote_script == "/opt/examples/keras_mnist.py" and p.files == {}
    assert p.rank_argv("py", "/j") == ["py", "-X", "clusterctl_job=/j", "/opt/examples/keras_mnist.py"]
    assert userjob.plan(["python", "-m", "m"], [], tmp_path).rank_argv("py", "/j") == [
        "py",
        "-X",
        "clusterctl_job=/j",
        "-m",
        "m",
    ]


def test_plan_refuses_bad_files(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.py").write_text("")
    (tmp_path / "x.py").write_text("")
    (tmp_path / "hosts").write_text("")
    cases = (
        ((["python", "nope.py"], []), "script nope.py: no such file here"),
        ((["python", "x.py"], ["missing.txt"]), "--file missing.txt: no such file"),
        ((["python", "x.py"], ["a"]), "--file a is a folder"),
        ((["python", "x.py"], ["a/x.py"]), "two files named x.py"),
        ((["python", "x.py"], ["hosts"]), "the name hosts is clusterctl's own"),
    )
    for (cmd, files), why in cases:
        with pytest.raises(UsageError, match=re.escape(why)):
            userjob.plan(cmd, files, tmp_path)
    with pytest.raises(UsageError, match="--np 5: the cluster has only 4 slot"):
        userjob.check_np(5, 4)
    with pytest.raises(UsageError, match="at least 1"):
        userjob.check_np(0, 4)
    assert userjob.check_np(None, 4) == 4


def test_shell_text_quotes_everything():
    hostile = "/root/clusterctl-jobs/j'; rm -rf ~; '"
    script = userjob.leader_script("echo 'hi there'", ["10.0.0.5", "10.0.0.6"], hostile)
    words = shlex.split(script)  # well-formed shell text
    assert "rm" not in words and words[:2] == ["sh", "-c"] and words[2] == "echo 'hi there'"
    assert "StrictHostKeyChecking=yes" in script and "StrictHostKeyChecking=no" not in script
    assert userjob.job_pattern("/root/clusterctl-jobs/launch-1") == "/root/clusterctl-jobs/[l]aunch-1"
    with pytest.raises(UsageError):
        userjob.member_note_command("bad name", "leader")
    assert userjob.parse_states("a running\nb exited 137\nc gone\n") == {"a": "running", "b": "exited 137", "c": "gone"}


# ---- on a real cluster -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(module_cluster_factory):
    c = module_cluster_factory(2, 2, runtime=True)
    (c.cli.cwd / "my_train.py").write_text(SCRIPT)
    (c.cli.cwd / "helper.py").write_text(HELPER)
    return c


def recorded_python(cluster) -> str | None:
    record = json.loads((cluster.cli.home / "clusters" / cluster.name / "cluster.json").read_text())
    cl = record.get("cluster", record)
    return (cl.get("extra") or {}).get("python")


def job_processes(cluster, job: str) -> dict[int, str]:
    """What of the job runs on each node (ps lines naming its job folder), by node index."""
    out = {}
    for i in range(2):
        ps = cluster.node_exec(i, "ps", "-ww", "-eo", "pid,args", check=False).stdout  # -ww: whole lines
        out[i] = "\n".join(line for line in ps.splitlines() if f"clusterctl-jobs/{job}" in line)
    return out


@pytest.mark.integration
@pytest.mark.horovod
def test_own_keras_script_on_2_nodes_x_2_slots(cluster):
    cli = cluster.cli
    proc = cli(
        "launch",
        "--file",
        "helper.py",
        "--name",
        "kerasjob",
        "--attach",
        "--",
        "python",
        "my_train.py",
        "--steps",
        "3",
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "`python` runs as the node runtime's Python on every node" in proc.stderr
    assert "started job kerasjob: 4 process(es) on 2 node(s)" in proc.stderr
    ranks = {int(m.group(1)): m.groups()[1:] for m in RANK_LINE.finditer(proc.stdout)}
    assert sorted(ranks) == [0, 1, 2, 3], proc.stdout[-3000:]
    assert {size for size, _h, _p in ranks.values()} == {"4"}
    hosts = [h for _s, h, _p in ranks.values()]
    assert len(set(hosts)) == 2 and all(hosts.count(h) == 2 for h in hosts), hosts
    pythons = {p for _s, _h, p in ranks.values()}
    assert len(pythons) == 1
    assert pythons == {recorded_python(cluster)}, "the ranks did not run the cluster's node runtime Python"
    assert len(re.findall(r"DONE rank=\d loss=\d", proc.stdout)) == 4

    # `logs NAME`: the ranks' output from the leader, a note from the member; exit 0 (the job's status)
    logs = cli("logs", "kerasjob")
    assert logs.returncode == 0, logs.stdout + logs.stderr
    assert len(RANK_LINE.findall(logs.stdout)) == 4 and logs.stdout.count("DONE rank=") == 4
    assert "the ranks on this node print through horovodrun on the leader" in logs.stdout
    st = cli("status")
    assert re.search(r"launch kerasjob: exited 0, 4 process\(es\) on 2 node\(s\)", st.stdout), st.stdout
    # nothing of the job is left on either node
    assert wait_for(lambda: not any(job_processes(cluster, "kerasjob").values()), 20, "the job's processes to end")


@pytest.mark.integration
@pytest.mark.horovod
def test_kill_ends_a_long_running_launch_on_every_node(cluster):
    cli = cluster.cli
    proc = cli("launch", "--file", "helper.py", "--", "python", "my_train.py", "--forever", timeout=120)
    assert proc.returncode == 0, proc.stderr
    job = re.search(r"started job (launch-[\w-]+): 4 process", proc.stderr).group(1)
    assert f"clusterctl kill {job}" in proc.stderr

    wait_for(lambda: cli("logs", job).stdout.count("READY rank=") == 4, 240, "4 ranks ready")
    procs = job_processes(cluster, job)
    assert procs[0] and procs[1], procs  # ranks on both nodes
    st = cli("status")
    assert re.search(rf"launch {job}: running, 4 process\(es\)", st.stdout), st.stdout
    # the same name again while it runs: refused
    again = cli("launch", "--name", job, "--", "python", "my_train.py")
    assert again.returncode == 3 and f"job {job} is still running" in again.stderr, again.stderr

    killed = cli("kill", job)
    assert killed.returncode == 0, killed.stdout + killed.stderr
    assert f"killed job {job}" in killed.stdout
    # the member's ranks sleep without output or collectives: only the leader's sweep ends them
    left = wait_for(
        lambda: not any(job_processes(cluster, job).values()) or None, 30, "the job's processes to end on every node"
    )
    assert left
    st = cli("status")
    assert re.search(rf"launch {job}: exited 137 \(killed\)", st.stdout), st.stdout
    logs = cli("logs", job)
    assert logs.returncode != 0 and logs.stdout.count("READY rank=") == 4


@pytest.mark.integration
@pytest.mark.horovod
def test_the_steps_gradients_reach_horovod_during_its_backward_pass(cluster):
    """The node package's overlap probe (the trainer's step, node/train/step.py) launched on both nodes, one
    process each, with Horovod's timeline of real steps: with XLA per segment (the step's design) the first
    gradient is submitted early in the backward pass; with the whole model as one XLA op (the design before)
    all arrive together at its end. The tiny model: its 5 segments show what ResNet-50's 19 do
    (bench/overlap.py), in seconds instead of minutes."""
    cli = cluster.cli
    (cli.cwd / "hosts-1").write_text("".join(f"{h} slots=1\n" for h in cluster.hosts))
    pyz = cli.cwd / nodepkg.package().name
    pyz.write_bytes(nodepkg.package().data)
    # the timeline is what is judged here, not the step times: one round of two timed steps, one warm-up
    # 128x128: a backward pass of a few hundred ms, long next to a busy machine's scheduling delays
    probe = ("--model", "tiny", "--image-size", "128", "--batch-size", "16", "--modes", "both")
    probe += ("--rounds", "1", "--steps", "2", "--warmup-steps", "1")
    proc = cli(
        "launch", "hosts-1", "--attach", "--", "python", pyz.name, "overlap", *probe,
        "--trace-steps", "6", "--trace", "/tmp/overlap-test", timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "2 process(es) on 2 node(s)" in proc.stderr, proc.stderr
    lines = {
        f["design"]: f
        for f in (
            dict(kv.split("=", 1) for kv in m.group(1).split())
            for m in re.finditer(r"CLUSTERCTL-OVERLAP timeline (.*)", proc.stdout)
        )
    }
    assert set(lines) == {"blocks", "whole"}, proc.stdout[-3000:]
    blocks, whole = lines["blocks"], lines["whole"]
    print(f"\ntimeline blocks: {blocks}\ntimeline whole: {whole}")
    # every step on the timeline, with its 8 gradients (two convs, two batch norms, the classifier)
    assert blocks["steps"] == whole["steps"] == "6" and float(blocks["gradients"]) == float(whole["gradients"]) == 8
    # the first gradient before half the backward pass; the last one at its end, well after the first
    assert float(blocks["first"]) < 0.5, blocks
    assert float(blocks["last_s"]) - float(blocks["first_s"]) > 0.3 * (
        float(blocks["last_s"]) - float(blocks["forward_s"])
    )
    # the design before: all of them at once, when the backward pass is over
    assert float(whole["first"]) > 0.9 and float(whole["bound"]) > 0.9, whole
    # the file is rank 0's, on the leader
    trace = cluster.node_exec(0, "cat", "/tmp/overlap-test-blocks.json").stdout
    assert "NEGOTIATE_ALLREDUCE" in trace and "DistributedGradientTape" in trace


@pytest.mark.integration
def test_bad_input_is_one_line_error(cluster):
    cli = cluster.cli
    (cli.cwd / "afolder").mkdir(exist_ok=True)
    cases = (
        (("launch", "--", "python", "nope.py"), 2, "script nope.py: no such file here"),
        (("launch", "--file", "missing.txt", "--", "python", "my_train.py"), 2, "--file missing.txt: no such file"),
        (("launch", "--file", "afolder", "--", "python", "my_train.py"), 2, "is a folder"),
        (("launch", "--np", "5", "--", "python", "my_train.py"), 2, "--np 5: the cluster has only 4 slot(s)"),
        (("launch", "--"), 2, "no command given"),
        (("launch",), 2, "no command given"),
        (("launch", "--", "bash", "run.sh"), 2, "the command must start with python, not 'bash'"),
        (("launch", "--name", "no/such", "--", "python", "my_train.py"), 2, "invalid job name"),
        (("launch", "--", "python", "/nowhere/train.py"), 3, "script /nowhere/train.py is not on"),
    )
    for args, code, why in cases:
        proc = cli(*args)
        assert proc.returncode == code, (args, proc.returncode, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error: ") and why in lines[0], (args, proc.stderr)


@pytest.mark.integration
def test_kill_job_ends_the_jobs_processes_on_every_node_and_no_one_elses(local_cluster_factory):
    """What horovodrun leaves on a node: processes whose command line names the job's folder, and task services
    started with `cd <job folder>` whose command line holds no path of ours. Both end; another job's
    `horovod.runner` task service, in its own folder, keeps running (it once died with ours), and so does a job
    whose name starts with ours."""
    from clusterctl.cluster import inventory
    from clusterctl.remote import jobfolder
    from clusterctl.remote.ssh import SshPool
    from clusterctl.state import StateStore
    from clusterctl.workloads import launch

    c = local_cluster_factory(2, 1)
    job = jobfolder.JobFolder("bench-20261123-070000-1", "/root")
    other = jobfolder.JobFolder("train-20261123-060000-2", "/root")
    longer = jobfolder.JobFolder(job.name + "0", "/root")  # its name starts with ours

    def spawn(i: int, cwd: str, name: str) -> None:  # a process in node i, running in cwd, shown as name
        shell = f"cd {shlex.quote(cwd)} && exec -a {name} sleep 600"
        argv = ["nsenter", "-t", str(node_pid(c.name, i)), "-a", "bash", "-c", shell]
        subprocess.Popen(argv, stdin=DEVNULL, stdout=DEVNULL, stderr=DEVNULL, start_new_session=True)

    task = shlex.quote("python -m horovod.runner.task_fn 0 2 abc")
    for i in range(2):
        c.node_exec(i, "mkdir", "-p", job.dir, other.dir)
        spawn(i, "/", shlex.quote(f"python {job.dir}/my_train.py"))
        spawn(i, "/", shlex.quote(f"python {longer.dir}/my_train.py"))
        spawn(i, job.dir, task)
        spawn(i, other.dir, task)

    def running(i: int) -> list[str]:
        out = c.node_exec(
            i, "bash", "-c", "for p in $(pgrep -f '[m]y_train|[t]ask_fn'); do readlink /proc/$p/cwd; done"
        )
        return sorted(out.stdout.split())

    wait_for(lambda: running(0) == running(1) == sorted(["/", "/", job.dir, other.dir]), 30, "the processes to start")
    inv = inventory.resolve(None, c.name, StateStore(c.cli.home))
    with SshPool(inv.settings) as pool:
        report = launch.kill_job(pool, list(inv.targets), job)
    assert [r.exit_code for r in report] == [0, 0]
    assert running(0) == running(1) == ["/", other.dir]
    for i in range(2):
        c.node_exec(i, "pkill", "-KILL", "-f", "[t]ask_fn|[m]y_train")
