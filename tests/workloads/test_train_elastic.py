"""`clusterctl train --elastic` for real: a local cluster of 3 nodes x 1 slot, the tiny model on synthetic images
under Elastic Horovod (gloo), launched by horovodrun on the leader with the node package's live_hosts as its host
discovery. Every process of a member's namespace is killed mid-run (the node is gone, sshd with it): the
run goes on at size 2 and ends with exit 0, every planned image trained once. Rank 0's own training process
on the leader is killed mid-run (the node and horovodrun stay): another process becomes rank 0, takes up the
writer and the checkpoints on its node, and the run ends with exit 0.

The module's tests share one cluster (its runtime bring-up is the slow part): each starts with all three nodes
up and no job left running, and trains into its own model folder."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest

from cgroup_support import cpu_group
from clusterctl.providers.local import boot, netns
from clusterctl.workloads.train import log as train_log
from conftest import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.horovod]

STEPS, BATCH, COMMIT = 450, 8, 20  # a node lost after step 200: the run goes on for 250 more
LOST = 2  # the member each test loses


def elastic(model_dir: str, steps: int = STEPS, min_np: int = 2) -> list[str]:
    """The `train --elastic` command line, checkpoints into ~/runs/<model_dir> (a folder of this test's own)."""
    return [
        "train",
        "--synthetic",
        "--model",
        "tiny",
        "--elastic",
        "--min-np",
        str(min_np),
        "--max-steps",
        str(steps),
        "--batch-size",
        str(BATCH),
        "--commit-every",
        str(COMMIT),
        "--log-every",
        "100",
        "--checkpoint-every",
        "200",
        "--model-dir",
        f"~/runs/{model_dir}",
    ]


def leader(cluster, command: str) -> str:
    return cluster.node_exec(0, "sh", "-c", command + "; true").stdout


def job_log(cluster, job: str) -> str:
    return leader(cluster, f"cat ~/.clusterctl/jobs/{job}.log 2>/dev/null")


def reach_step_200(cluster, job: str) -> None:
    try:
        wait_for(lambda: re.search(r"CLUSTERCTL-TRAIN +200 ", job_log(cluster, job)), 240, "step 200", interval=0.2)
    except BaseException:
        print(job_log(cluster, job)[-4000:])  # why it did not get there (shown with the failure)
        raise


def trainers(cluster) -> str:
    """The training processes left on the cluster's nodes (empty when none)."""
    out = [cluster.node_exec(i, "sh", "-c", "pgrep -af '[t]rain_imagenet|[h]orovodrun'; true").stdout for i in range(3)]
    return "".join(out)


def trainer_pids(cluster, index: int) -> list[int]:
    """The node package's `train` processes in node `index`'s namespace (host view), not horovodrun, not a shell."""
    found = []
    for pid in netns.netns_pids(netns.netns_name(cluster.name, index)):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [w.decode(errors="replace") for w in argv if w]
        if words and os.path.basename(words[0]).startswith("python") and "train" in words:
            if not any("horovodrun" in w for w in words):
                found.append(pid)
    return found


@pytest.fixture(scope="module")
def shared(module_cluster_factory, horovod_present):
    return module_cluster_factory(3, 1, runtime=True)


@pytest.fixture
def cluster(shared):
    """The shared cluster whole again: a member an earlier test lost is restarted as a local reboot does (the
    same address, host key and home, its runtime kept), and no training process of an earlier job is left."""
    if netns.node_alive(shared.name, LOST) is not None:
        node_dir = shared.cli.home / "clusters" / shared.name / "nodes" / str(LOST)
        boot.restart_node(
            netns.netns_name(shared.name, LOST), f"{shared.name}-member-{LOST}", shared.hosts[LOST], node_dir
        )
    if trainers(shared):  # an earlier test failed before its job ended
        shared.cli("train", "--stop", timeout=120)
    wait_for(lambda: trainers(shared) == "", 60, "an earlier job's processes to end")
    return shared


def test_elastic_run_goes_on_without_a_lost_node(cluster):
    cli = cluster.cli
    proc = cli(*elastic("lost"))
    assert proc.returncode == 0, proc.stderr
    job = re.search(r"started training job (train-[\w-]+): 3 process\(es\)", proc.stderr).group(1)
    assert "elastic: 3 process(es) to start, at least 2, at most 3" in proc.stderr, proc.stderr
    # the live hosts the discovery script reads, written on the leader at start
    assert leader(cluster, "cat ~/.clusterctl/live-hosts") == "".join(f"{h}:1\n" for h in cluster.hosts)

    # ---- a member's namespace dies whole (its sshd too) after a few hundred steps
    reach_step_200(cluster, job)
    assert not netns.kill_netns(netns.netns_name(cluster.name, 2), 30)
    wait_for(lambda: leader(cluster, f"cat ~/.clusterctl/jobs/{job}.exit 2>/dev/null").strip(), 240, "the job's end")
    assert leader(cluster, f"cat ~/.clusterctl/jobs/{job}.exit").strip() == "0", job_log(cluster, job)[-3000:]

    text = job_log(cluster, job)
    run = train_log.parse_train_log(text, strict=False).current
    assert f"world size 3 -> 2 (lost {cluster.hosts[2]})" in text, text[-3000:]
    assert len(run.resizes) == 1, run.resizes
    change = run.resizes[0]
    assert (change.was, change.size, change.lost) == (3, 2, (cluster.hosts[2],))
    # It went on from a commit made after step 200 at size 3: the images of the steps since were redone,
    # not counted (the count at a commit is a whole number of commit intervals of 3 x BATCH).
    assert change.images % (COMMIT * 3 * BATCH) == 0 and change.images >= 200 * 3 * BATCH, change
    # The plan is in images (STEPS at the starting size); the end is exactly there: none counted twice or lost.
    done = re.search(r"CLUSTERCTL-TRAIN done .*\bimages=(\d+) plan_images=(\d+)", text)
    assert done and int(done.group(1)) == int(done.group(2)) == STEPS * 3 * BATCH, text[-2000:]
    assert run.checkpoints[-1].images == STEPS * 3 * BATCH
    # The committed state was checkpointed when the node was lost (a run that could not go on keeps it).
    assert any(c.images == change.images for c in run.checkpoints), run.checkpoints

    st = cli("status")
    assert st.returncode == 5, st.stderr  # a node is lost (docs/exit-codes.md), and status says so
    assert "lost: " in st.stderr and cluster.hosts[2] in st.stderr, st.stderr
    assert f"elastic: world size 3 -> 2 (lost {cluster.hosts[2]})" in st.stdout, st.stdout
    assert re.search(r"\b2 process\(es\)", st.stdout), st.stdout


def test_elastic_run_with_too_few_nodes_stops_with_a_checkpoint_and_one_line(cluster):
    """--min-np 3 on 3 nodes, one lost: horovodrun waits --elastic-timeout for a third, then the job ends with
    status 9, the `too_few_nodes` line, and the last commit checkpointed."""
    cli = cluster.cli
    proc = cli(*elastic("too-few", min_np=3), "--elastic-timeout", "20")
    assert proc.returncode == 0, proc.stderr
    job = re.search(r"started training job (train-[\w-]+)", proc.stderr).group(1)
    reach_step_200(cluster, job)
    assert not netns.kill_netns(netns.netns_name(cluster.name, 2), 30)
    wait_for(lambda: leader(cluster, f"cat ~/.clusterctl/jobs/{job}.exit 2>/dev/null").strip(), 240, "the job's end")
    text = job_log(cluster, job)
    assert leader(cluster, f"cat ~/.clusterctl/jobs/{job}.exit").strip() == "9", text[-3000:]
    lines = [line for line in text.splitlines() if "too_few_nodes" in line]
    assert len(lines) == 1 and "fewer than --min-np 3 processes could run for 20 s" in lines[0], text[-3000:]
    run = train_log.parse_train_log(text, strict=False).current
    saved = [c for c in run.checkpoints if c.path.endswith(f"ckpt-{c.images}")]
    assert saved and saved[-1].images >= 200 * 3 * BATCH and saved[-1].images % (COMMIT * 3 * BATCH) == 0, saved
    assert f"ckpt-{saved[-1].images}.manifest.json" in leader(cluster, "ls ~/runs/too-few/checkpoints")
    st = cli("status")
    assert "failed (too_few_nodes: fewer than --min-np 3" in st.stdout, st.stdout
    # nothing of the job left on the nodes that remain
    left = leader(cluster, "pgrep -af '[t]rain_imagenet|[h]orovodrun'")
    assert left == "", left


def test_repair_brings_a_node_back_into_a_running_elastic_job(cluster):
    """A member lost mid-run, then `clusterctl repair --yes` as a user would run it: the replacement (the same
    address, a new host key pinned, the runtime installed, back in the leader's live hosts) is offered by the
    discovery script after Horovod's cooldown and joins at a commit; the run ends with exit 0, the plan whole.
    (A node back by itself, as a reboot brings it, joins the same way: the discovery script offers what the live
    hosts list and answers.) While the repair runs, the two ranks left are held to 0.3 of a CPU: the run must
    outlast the repair, and at full speed a loaded machine's repair outlasted 2000 steps."""
    cli = cluster.cli
    steps = 1500
    proc = cli(*elastic("repair", steps=steps))
    assert proc.returncode == 0, proc.stderr
    job = re.search(r"started training job (train-[\w-]+)", proc.stderr).group(1)
    reach_step_200(cluster, job)
    assert not netns.kill_netns(netns.netns_name(cluster.name, 2), 30)
    wait_for(lambda: "world size 3 -> 2" in job_log(cluster, job), 120, "size 3 -> 2")

    with cpu_group([*trainer_pids(cluster, 0), *trainer_pids(cluster, 1)], cores=0.3):
        fix = cli("repair", "--yes")
        assert fix.returncode == 0, fix.stderr
        assert f"{cluster.name}-member-2 ({cluster.hosts[2]})" in fix.stderr and "repaired 1 node(s)" in fix.stderr
        try:
            wait_for(lambda: "world size 2 -> 3" in job_log(cluster, job), 300, "size 2 -> 3", interval=1)
        except BaseException:
            print(job_log(cluster, job)[-4000:])  # why it did not join (shown with the failure)
            raise
    wait_for(lambda: leader(cluster, f"cat ~/.clusterctl/jobs/{job}.exit 2>/dev/null").strip(), 240, "the job's end")
    text = job_log(cluster, job)
    assert leader(cluster, f"cat ~/.clusterctl/jobs/{job}.exit").strip() == "0", text[-3000:]
    assert f"world size 3 -> 2 (lost {cluster.hosts[2]})" in text, text[-3000:]
    assert f"world size 2 -> 3 (joined {cluster.hosts[2]})" in text, text[-3000:]
    run = train_log.parse_train_log(text, strict=False).current
    assert [(c.was, c.size) for c in run.resizes] == [(3, 2), (2, 3)], run.resizes
    # Every planned image trained: the last step at size 3 may go past the plan (a commit at size 2 leaves a
    # remainder of 16-image steps), by less than one global batch.
    done = re.search(r"CLUSTERCTL-TRAIN done .*\bimages=(\d+) plan_images=(\d+)", text)
    assert done and int(done.group(2)) == steps * 3 * BATCH, text[-2000:]
    assert 0 <= int(done.group(1)) - steps * 3 * BATCH < 3 * BATCH, done.group(0)


def test_elastic_run_goes_on_when_rank_0s_process_is_lost(cluster):
    """Rank 0's training process on the leader is killed (horovodrun and the node stay): the run goes on at size 2,
    the new rank 0 (on a member) saves the committed state at once, keeps checkpointing into its own --model-dir
    and writes TensorBoard there, and the job ends with exit 0, the plan whole."""
    cli = cluster.cli
    proc = cli(*elastic("chief"))
    assert proc.returncode == 0, proc.stderr
    job = re.search(r"started training job (train-[\w-]+)", proc.stderr).group(1)
    reach_step_200(cluster, job)
    pids = trainer_pids(cluster, 0)
    assert len(pids) == 1, pids
    os.kill(pids[0], signal.SIGKILL)
    wait_for(lambda: leader(cluster, f"cat ~/.clusterctl/jobs/{job}.exit 2>/dev/null").strip(), 240, "the job's end")
    text = job_log(cluster, job)
    assert leader(cluster, f"cat ~/.clusterctl/jobs/{job}.exit").strip() == "0", text[-3000:]
    run = train_log.parse_train_log(text, strict=False).current
    change = run.resizes[0]
    assert (change.was, change.size, change.lost) == (3, 2, (cluster.hosts[0],)), run.resizes
    # the leader's host is offered again after Horovod's blacklist cooldown: it may join back, as a new rank
    assert all(c.joined == (cluster.hosts[0],) and not c.lost for c in run.resizes[1:]), run.resizes
    plan = STEPS * 3 * BATCH
    done = re.search(r"CLUSTERCTL-TRAIN done .*\bimages=(\d+) plan_images=(\d+)", text)
    assert done and int(done.group(2)) == plan <= int(done.group(1)) < plan + 3 * BATCH, text[-2000:]
    # checkpoints keep coming from the new rank 0: the commit it went on from at once, the periodic ones, the end
    after = sorted(c.images for c in run.checkpoints if c.images is not None and c.images >= change.images)
    assert after[0] == change.images and after[-1] == int(done.group(1)) and len(after) >= 3, run.checkpoints
    assert re.search(rf"CLUSTERCTL-TRAIN checkpoint .*images={change.images} .*reason=membership", text), text[-3000:]
    # ... on its own node's disk, with its TensorBoard events; the copies to the --checkpoint-copy node (the
    # second, by default) go on from it, or stop when it is that node: its folder is the copy
    assert "checkpoint_copy_failed" not in text, text[-3000:]
    copy = cluster.node_exec(1, "sh", "-c", "ls ~/runs/chief/checkpoints; true").stdout
    assert f"ckpt-{after[-1]}.manifest.json" in copy, copy
    events = [cluster.node_exec(i, "sh", "-c", "ls ~/runs/chief/tensorboard; true").stdout for i in (1, 2)]
    assert any("events.out.tfevents" in e for e in events), events
