"""`clusterctl train / status / logs / eval / tensorboard` for real, on a 2-node local cluster, 2 slots each:
a generated TFRecord set synced to both nodes, the tiny model trained by 4 Horovod (gloo) ranks launched by
horovodrun on the leader inside tmux; the ranks on the member killed mid-run; the job started again and
resumed from the leader's checkpoint; evaluated on the leader alone; TensorBoard through an ssh tunnel (refused
at once when its local port is taken); nothing left running anywhere at the end."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import urllib.request

import pytest

from clusterctl.workloads.train import log as train_log
from conftest import free_port, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.horovod]

TRAIN = [
    "train",
    "--data",
    "/root/ds",
    "--model",
    "tiny",
    "--epochs",
    "20",
    "--batch-size",
    "8",
    "--checkpoint-every",
    "20",
    "--log-every",
    "20",
    "--base-lr",
    "2",
    "--warmup-epochs",
    "1",
    "--model-dir",
    "~/runs/tiny",
]


def leader_log(cluster, job: str) -> str:
    return cluster.node_exec(0, "sh", "-c", f"cat ~/.clusterctl/jobs/{job}.log 2>/dev/null; true").stdout


def test_train_kill_a_node_resume_eval_tensorboard(local_cluster_factory, tmp_path):
    cluster = local_cluster_factory(2, 2, runtime=True)
    cli = cluster.cli
    proc = cli(
        "data",
        "synthetic",
        "ds",
        "--images",
        "640",
        "--classes",
        "10",
        "--image-size",
        "32",
        "--train-shards",
        "4",
        "--validation-shards",
        "2",
    )
    assert proc.returncode == 0, proc.stderr

    # ---- refused: the data is not on the nodes yet (nor verified there)
    proc = cli(*TRAIN)
    assert proc.returncode == 3, proc.stderr
    assert "the data /root/ds is not ready on every node" in proc.stderr and "no such folder" in proc.stderr
    assert "clusterctl sync" in proc.stderr

    proc = cli("sync", str(cli.cwd / "ds"), "/root/ds", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    # ---- start: returns at once with the job's name; a second start is refused while it runs
    proc = cli(*TRAIN)
    assert proc.returncode == 0, proc.stderr
    job1 = re.search(r"started training job (train-[\w-]+): 4 process\(es\)", proc.stderr).group(1)
    # local nodes run train/config.py's CPU row, --batch-size over it; no bench of that configuration yet
    key = "tiny 32px fp32 batch 8 xla off allreduce fp32"
    assert f"configuration for CPU: {key}" in proc.stderr, proc.stderr
    assert f"no img/s measured on this cluster for this configuration ({key})" in proc.stderr, proc.stderr
    # no GPU rate to judge the feed by: nothing timed, the input named and why
    assert "input: tf.data (auto: no GPUs to decode on)" in proc.stderr and "img/s (" not in proc.stderr, proc.stderr
    again = cli(*TRAIN)
    assert again.returncode == 3 and f"training job {job1} is still running" in again.stderr
    assert "--force" in again.stderr

    # ---- a checkpoint, then `status` sees it running
    wait_for(lambda: "checkpoint step=20 " in leader_log(cluster, job1), 240, "the first checkpoint")
    # the network is named and counted at the start (the node package's train/model.py)
    assert "[0]<stdout>:model tiny: 5,466 parameters\n" in leader_log(cluster, job1)
    st = cli("status")
    assert st.returncode == 0, st.stderr
    assert re.search(rf"training {job1}: running", st.stdout), st.stdout
    assert re.search(r"step \d+/400  epoch \d+\.\d\d/20 ", st.stdout), st.stdout

    # ---- the member's ranks die (as when a node is lost) after a later checkpoint
    def checkpoint_at_40_or_later():
        steps = [int(s) for s in re.findall(r"checkpoint step=(\d+) ", leader_log(cluster, job1))]
        return steps and max(steps) >= 40

    wait_for(checkpoint_at_40_or_later, 120, "the step-40 checkpoint", interval=0.1)
    cluster.node_exec(1, "pkill", "-KILL", "-f", r"node-[0-9a-f]+\.pyz train ")
    wait_for(
        lambda: (
            "gone"
            in cluster.node_exec(
                0, "sh", "-c", f"tmux has-session -t ={job1} 2>/dev/null && echo alive || echo gone"
            ).stdout
        ),
        120,
        "horovodrun on the leader to give up",
    )
    log1 = train_log.parse_train_log(leader_log(cluster, job1))
    assert log1.current.done is None and log1.current.failure, "the job was not killed mid-run"
    saved = log1.current.checkpoints[-1].step
    assert 40 <= saved < 400
    st = cli("status")
    assert re.search(rf"training {job1}: failed \(process \d exited", st.stdout), st.stdout
    assert f"last checkpoint: step {saved} " in st.stdout

    # ---- the same command again: resumes from the checkpoint, runs to the end, evaluates (--wait follows it)
    proc = cli(*TRAIN, "--wait", timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    run2 = train_log.parse_train_log(proc.stdout).current
    assert run2.resumed_from is not None and run2.resumed_from.step == saved
    assert run2.start.start_step == saved and run2.rows[0].step == saved + 1
    assert run2.start.size == 4 and run2.done.complete and run2.done.step == 400
    ev = run2.eval
    assert ev.step == 400 and ev.size == 4 and ev.examples == 128
    assert ev.top1 > 30, f"top-1 {ev.top1}% is near chance (10%)"
    print("\n" + "".join(line for line in proc.stdout.splitlines(True) if train_log.MARK in line))

    st = cli("status")
    assert re.search(r"training train-[\w-]+: finished, restarted 1x", st.stdout), st.stdout
    assert "step 400/400  epoch 20.00/20" in st.stdout
    assert f"evaluation: top-1 {ev.top1:.2f}%  top-5 {ev.top5:.2f}%  at step 400 (128 images)" in st.stdout
    # `logs` without a name: the job's whole history (the killed launch, then the resumed one) from the leader
    logs = cli("logs")
    assert logs.returncode == 0, logs.stderr
    assert len(train_log.parse_train_log(logs.stdout).runs) == 2

    # ---- eval on the leader alone: the latest checkpoint, the same numbers as the 4-process evaluation
    proc = cli("eval", timeout=300)
    assert proc.returncode == 0, proc.stderr
    row = proc.stdout.splitlines()[1].split()
    # named by the images seen: 400 steps of 4 processes x 8
    assert row[:4] == ["400", "20.0", f"{ev.top1:.2f}%", f"{ev.top5:.2f}%"] and row[6] == f"ckpt-{400 * 32}"

    # ---- a local port already taken: one Error line before anything starts on the leader
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = cli("tensorboard", "--port", str(port), timeout=300)
    assert proc.returncode == 3, proc.stderr
    assert (
        proc.stderr == f"Error: local port {port} is not free on this machine (Address already in use): "
        "pick another with --port\n"
    )
    assert cluster.node_exec(0, "sh", "-c", "tmux ls 2>/dev/null; pgrep -af '[t]ensorboard'; true").stdout == ""

    # ---- TensorBoard on the leader's 127.0.0.1, through an ssh tunnel to a local port
    port = free_port()
    tb = subprocess.Popen(
        [sys.executable, "-m", "clusterctl", "tensorboard", "--port", str(port)],
        cwd=cli.cwd,
        env=cli.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        def tags():
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/data/plugin/scalars/tags", timeout=5) as r:
                    return json.loads(r.read())
            except OSError:
                assert tb.poll() is None, tb.stderr.read()
                return None

        found = wait_for(tags, 180, "TensorBoard through the tunnel", interval=1)
        assert {"train/loss", "train/learning_rate", "eval/top1", "eval/top5"} <= set(found["."])
        listening = cluster.node_exec(0, "sh", "-c", "ss -ltnH").stdout
        assert "127.0.0.1:6006" in listening and "0.0.0.0:6006" not in listening and "*:6006" not in listening
    finally:
        tb.send_signal(signal.SIGINT)
        out, err = tb.communicate(timeout=120)
    assert tb.returncode == 130, err

    # ---- nothing of the job, its evaluation or TensorBoard left on any node
    left = cli("run", "--json", "pgrep -af '[t]rain_imagenet|[h]orovod|[t]ensorboard'; tmux ls 2>/dev/null; true")
    for line in left.stdout.splitlines():
        r = json.loads(line)
        assert r["stdout"].strip() == "", f"left on {r['host']}: {r['stdout']}\n(clusterctl tensorboard said: {err})"
