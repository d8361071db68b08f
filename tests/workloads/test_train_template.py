"""The node package's trainer (`python3 PYZ train`) for real: horovodrun, gloo, 2 processes on localhost, the tiny model on a
generated TFRecord set. One job's whole life: train with checkpoints, lose a process in the middle (its
rank SIGKILLed, as when a node dies), start it again and see it resume from the checkpoint, finish,
evaluate; then evaluate the latest checkpoint alone with --eval-only.

Never skipped: without TensorFlow and Horovod in the training Python it fails and says how to get them.
CLUSTERCTL_TRAIN_PYTHON names that Python (default: the one running the tests).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from clusterctl.workloads.horovod import device_problems, horovodrun_argv, parse_devices, scrubbed_env
from clusterctl.workloads.train import log as train_log, options as train, status as train_status
from conftest import HOROVODRUN, REPO, TRAIN_PY as PY, node_pyz

pytestmark = [pytest.mark.integration, pytest.mark.horovod]

PYZ = node_pyz()

TIMEOUT_S = 240  # each launch; measured 10-20 s on 2 cores
KILL_AT = 60  # the checkpoint step after which rank 1 dies


@pytest.fixture(scope="module", autouse=True)
def _horovod(horovod_present):
    """Every test here runs real horovodrun: fail loudly, never skip, when it is missing."""


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                ppid = int(Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(d))
    return kids


def rank_pids(root: int, rank: int) -> list[int]:
    """The trainer processes of `rank` under horovodrun (pid `root`), found by HOROVOD_RANK in their env."""
    kids, todo, found = _children(), [root], []
    while todo:
        for pid in kids.get(todo.pop(), []):
            todo.append(pid)
            try:
                env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if f"HOROVOD_RANK={rank}".encode() in env and Path(PYZ).name.encode() in cmd:
                found.append(pid)
    return found


def processes_mentioning(text: str) -> list[str]:
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit() and int(d) != os.getpid():
            try:
                cmd = Path(f"/proc/{d}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if text in cmd:
                out.append(f"{d}: {cmd[:200]}")
    return out


class Job:
    def __init__(self, tmp: Path, data: Path):
        self.tmp, self.data, self.model_dir = tmp, data, tmp / "model"
        self.opts = train.TrainOptions(
            data=str(data),
            model="tiny",
            epochs=12,
            batch_size=16,
            model_dir=str(self.model_dir),
            base_lr=2.0,
            warmup_epochs=1,
            checkpoint_every=20,
            keep_checkpoints=3,
            log_every=10,
            extra=("--shuffle-buffer", "256"),
        )

    def argv(self) -> list[str]:
        script = train.trainer_argv(PY, PYZ, self.opts)
        return horovodrun_argv(2, "localhost:2", script, horovodrun=HOROVODRUN)

    def run(self, kill_rank1_after: str | None = None) -> tuple[int, str, float | None]:
        """Run to the end, or SIGKILL rank 1 once `kill_rank1_after` appears in the output; returns
        (exit status, output, seconds horovodrun took to exit after the kill)."""
        env = scrubbed_env({**os.environ, "AWS_SECRET_ACCESS_KEY": "planted-by-test"})
        proc = subprocess.Popen(
            self.argv(),
            cwd=self.tmp,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        lines: list[str] = []
        killed_at = None
        deadline = time.monotonic() + TIMEOUT_S
        try:
            for line in proc.stdout:
                lines.append(line)
                if kill_rank1_after and killed_at is None and kill_rank1_after in line:
                    victims = rank_pids(proc.pid, 1)
                    assert victims, "no rank 1 process found under horovodrun"
                    for pid in victims:
                        os.kill(pid, signal.SIGKILL)
                    killed_at = time.monotonic()
                if time.monotonic() > deadline:
                    raise TimeoutError
            code = proc.wait(timeout=max(1, deadline - time.monotonic()))
        except (TimeoutError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            pytest.fail(f"horovodrun did not finish in {TIMEOUT_S} s:\n{''.join(lines)[-4000:]}")
        return code, "".join(lines), (time.monotonic() - killed_at) if killed_at else None


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    """640 training and 128 validation images, 10 classes, 32 px, made by the real CLI."""
    tmp = tmp_path_factory.mktemp("trainset")
    env = {**os.environ, "PYTHONPATH": str(REPO), "CLUSTERCTL_HOME": str(tmp / "cchome")}
    proc = subprocess.run(
        [
            PY,
            "-m",
            "clusterctl",
            "data",
            "synthetic",
            str(tmp / "data"),
            "--images",
            "640",
            "--classes",
            "10",
            "--validation-images",
            "128",
            "--image-size",
            "32",
            "--train-shards",
            "4",
            "--validation-shards",
            "2",
        ],
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return tmp / "data"


def test_train_kill_resume_finish_evaluate(tmp_path, dataset):
    job = Job(tmp_path, dataset)

    # ---- 1: the job loses rank 1 right after the checkpoint at step 60
    code, out1, exit_after_kill = job.run(kill_rank1_after=f"checkpoint step={KILL_AT} ")
    assert code != 0, out1[-3000:]
    assert exit_after_kill is not None and exit_after_kill < 60, "horovodrun did not notice the dead rank"
    assert "network: gloo over TCP (CPU processes: NCCL is not used)" in out1  # named; on CPU nothing refused
    log1 = train_log.parse_train_log(out1)
    run1 = log1.current
    assert run1.start is not None and run1.start.size == 2 and run1.start.start_step == 0
    assert (run1.start.global_batch, run1.start.steps_per_epoch, run1.start.total_steps) == (32, 20, 240)
    assert run1.resumed_from is None and run1.done is None and run1.eval is None
    assert [c.step for c in run1.checkpoints][:3] == [20, 40, 60]
    # named by the images seen (global batch 32), which the log says beside the step
    assert [(c.images, c.path.rsplit("/", 1)[1]) for c in run1.checkpoints][:3] == [
        (640, "ckpt-640"),
        (1280, "ckpt-1280"),
        (1920, "ckpt-1920"),
    ]
    assert run1.rows[0].step == 1 and run1.rows[-1].step < 240
    st = train_status.status(log1, running=False)
    assert st.state == "failed" and st.reason == "process 1 exited 137 (killed: SIGKILL or out of memory)"
    assert st.last_checkpoint.step >= KILL_AT
    # Horovod has no fault tolerance: the job is gone everywhere, nothing of it left running.
    time.sleep(1)
    assert processes_mentioning(str(job.model_dir)) == []
    saved = sorted(
        int(p.name.split("-")[1].split(".")[0]) for p in (job.model_dir / "checkpoints").glob("ckpt-*.index")
    )
    assert saved[-1] == st.last_checkpoint.images == 32 * st.last_checkpoint.step and len(saved) <= 3

    # ---- 2: the same command again resumes from that checkpoint, finishes, evaluates
    code, out2, _ = job.run()
    assert code == 0, out2[-3000:]
    run2 = train_log.parse_train_log(out2).current
    resumed = saved[-1] // 32
    assert run2.start.start_step == resumed and run2.resumed_from.step == resumed
    assert run2.resumed_from.path.endswith(f"ckpt-{saved[-1]}") and run2.resumed_from.images == saved[-1]
    assert run2.rows[0].step == resumed + 1, "the step did not continue from the checkpoint"
    assert run2.done is not None and run2.done.complete and run2.done.step == 240
    assert run2.checkpoints[-1].step == 240 and run2.checkpoints[-1].epoch == 12
    ev = run2.eval
    assert ev is not None and ev.step == 240 and ev.examples == 128 and ev.size == 2
    assert ev.top1 >= 30.0, f"top-1 {ev.top1}% is near chance (10%): the model did not learn"
    assert ev.top5 >= ev.top1
    # the learning rate schedule went on where it was: warm-up done, then decayed to ~0 at the end
    assert run2.rows[0].lr < run2.start.peak_lr and run2.rows[-1].lr < 0.01 * run2.start.peak_lr
    assert run2.rows[-1].loss < run1.rows[0].loss
    # every rank said where it computes: on the CPU here, which only a node with GPUs would fail
    devices = parse_devices(out2, train_log.MARK)
    assert sorted((d.rank, d.local_rank, d.gpus, d.logical) for d in devices) == [(0, 0, (), 0), (1, 1, (), 0)]
    assert device_problems(devices, 2, 0) == [] and "ran on the CPU" in device_problems(devices, 2, 8)[0]

    # Both runs in one log (as `clusterctl logs` would show them): one restart, finished.
    both = train_log.parse_train_log(out1 + out2)
    st = train_status.status(both, running=False)
    assert len(both.runs) == 2 and st.restarts == 1 and st.state == "finished"
    assert (st.step, st.epoch, st.result) == (240, 12.0, ev) and st.eta_s == 0.0
    assert st.total_elapsed_s > st.elapsed_s > 0
    assert list((job.model_dir / "tensorboard").glob("events.out.tfevents.*"))

    # ---- 3: --eval-only on one process (as `clusterctl eval` does on the leader): same checkpoint, same result
    opts = train.TrainOptions(
        data=str(dataset), model="tiny", batch_size=16, model_dir=str(job.model_dir), eval_only=True, no_gpu=True
    )
    proc = subprocess.run(
        train.trainer_argv(PY, PYZ, opts),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=scrubbed_env(dict(os.environ)),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    alone = train_log.parse_eval(proc.stdout)
    assert alone.size == 1 and alone.step == 240 and alone.epoch == 12.0 and alone.examples == 128
    assert alone.checkpoint.endswith(f"ckpt-{240 * 32}")
    # rank 0's weights and batch-norm statistics everywhere: the number of processes does not change the result
    assert abs(alone.top1 - ev.top1) < 100 / 128 and abs(alone.top5 - ev.top5) < 100 / 128
    print(
        "\n"
        + "".join(
            line
            for line in (out1 + out2 + proc.stdout).splitlines(keepends=True)
            if train_log.MARK in line or "Validation:" in line
        )
    )


def test_a_resume_on_more_processes_then_a_restart_takes_the_newest_checkpoint_by_images(tmp_path, dataset):
    # 1 process (global batch 16) to step 60: 960 images. Then 2 processes (global batch 32) resume at step 30
    # and save at step 40: 1,280 images. Ordered by step, the restart would take the older step-60 one (and
    # a save at step 60 of the new batch would overwrite it); by images it takes ckpt-1280.
    def run(np: int, max_steps: int) -> train_log.TrainRun:
        opts = train.TrainOptions(
            data=str(dataset),
            model="tiny",
            epochs=12,
            batch_size=16,
            model_dir=str(tmp_path / "model"),
            max_steps=max_steps,
            base_lr=0.1,  # the figures below (any recipe's values would do)
            warmup_epochs=5.0,
            checkpoint_every=20,
            keep_checkpoints=3,
            log_every=10,
            no_eval=True,
            extra=("--shuffle-buffer", "64"),
        )
        argv = horovodrun_argv(np, f"localhost:{np}", train.trainer_argv(PY, PYZ, opts), horovodrun=HOROVODRUN)
        proc = subprocess.run(
            argv, cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT_S, env=scrubbed_env(dict(os.environ))
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
        assert "model tiny: 5,466 parameters" in proc.stdout
        return train_log.parse_train_log(proc.stdout).current

    folder = tmp_path / "model" / "checkpoints"

    def on_disk() -> list[int]:
        return sorted(int(p.name[5 : -len(".manifest.json")]) for p in folder.glob("ckpt-*.manifest.json"))

    first = run(1, 61)
    assert [(c.step, c.images) for c in first.checkpoints] == [(20, 320), (40, 640), (60, 960), (61, 976)]
    assert on_disk() == [640, 960, 976]  # --keep-checkpoints 3

    wider = run(2, 40)
    # 976 images are step 30.5 of batch 32: the run counts on from step 30, the schedule from 30.5
    assert wider.resumed_from.images == 976 and wider.start.start_step == 30
    assert [(c.step, c.images) for c in wider.checkpoints] == [(40, 1296)]
    peak = wider.start.peak_lr
    assert peak == 0.1 * 32 / 256 and wider.start.fields["start_images"] == "976"
    # in the 5-epoch warm-up (100 steps of batch 32): the rate at 30.5 steps, not at the rounded 30
    assert wider.rows[0].step == 31 and wider.rows[0].lr == pytest.approx(peak * 31.5 / 100, abs=1e-6)
    assert on_disk() == [960, 976, 1296]  # the one with the fewest images went, whatever its step
    manifest = json.loads((folder / "ckpt-1296.manifest.json").read_text())
    assert (manifest["images"], manifest["step"], manifest["global_batch"]) == (1296, 40, 32)

    again = run(2, 50)
    assert again.resumed_from.images == 1296 and again.resumed_from.path == str(folder / "ckpt-1296")
    assert again.start.start_step == 40 and [(c.step, c.images) for c in again.checkpoints] == [(50, 1616)]


def test_eval_only_without_a_checkpoint_fails_with_its_reason(tmp_path, dataset):
    opts = train.TrainOptions(data=str(dataset), model="tiny", model_dir=str(tmp_path / "empty"), eval_only=True)
    proc = subprocess.run(
        train.trainer_argv(PY, PYZ, opts), cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT_S
    )
    assert proc.returncode == train_log.EXIT_CHECKPOINT, proc.stderr[-2000:]
    with pytest.raises(ValueError, match="no evaluation: the trainer reported no_checkpoint"):
        train_log.parse_eval(proc.stdout)
    # one process, no horovodrun: it still says it runs on the CPU (rank 0, this machine's hostname)
    import socket

    assert [(d.rank, d.host, d.gpus, d.logical) for d in parse_devices(proc.stdout, train_log.MARK)] == [
        (0, socket.gethostname(), (), 0)
    ]


def _template_script(body: str, *args: str) -> str:
    """Run `body` in the training Python with the trainer's input pipeline imported from the node package as `t`
    (its flags as parse_args, and tf); its stdout."""
    head = (
        f"import sys\nsys.path.insert(0, {PYZ!r})\n"
        "from clusterctl.node.train import data as t\n"
        "from clusterctl.node.train.options import parse_args\n"
        "import tensorflow as tf\n"
    )
    proc = subprocess.run([PY, "-c", head + body, *args], capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_crops_and_flips_differ_by_rank_and_restart_and_repeat_for_the_same_ones(dataset):
    # One shard read in order by rank 0 and rank 1 (each given a copy of it), from step 0 and step 100: with
    # the global seed alone, every rank and every restart drew the same crops and flips.
    out = _template_script(
        "import hashlib\n"
        "args = parse_args(['--data', sys.argv[1], '--model', 'tiny', '--batch-size', '16', '--shuffle-buffer', '1'])\n"
        "files = t.data_files(sys.argv[1], 'train')[:1] * 2  # each rank of 2 reads the same shard\n"
        "for rank, start in ((0, 0), (1, 0), (0, 100), (0, 0)):\n"
        "    tf.random.set_seed(args.seed)\n"
        "    ds = t.train_dataset(tf, args, files, rank, 2, t.data_seed(args.seed, rank, start), 10, threads=1)\n"
        "    images, labels = next(iter(ds))\n"
        "    print(rank, start, hashlib.sha256(images.numpy().tobytes()).hexdigest(), labels.numpy().tolist())\n",
        str(dataset),
    )
    rows = [line.split(" ", 3) for line in out.splitlines()]
    (r0, s0, h0, l0), (r1, _, h1, l1), (_, _, h_restart, l_restart), (_, _, h_again, l_again) = rows
    assert l0 == l1 == l_restart == l_again, "the same images, in the same order, for every case"
    assert h0 != h1, "ranks 0 and 1 drew the same crops and flips"
    assert h0 != h_restart, "a restart drew the same crops and flips as the first start"
    assert h0 == h_again, "the same rank and start step must draw the same augmentation"


def _single(tmp_path, *argv: str) -> subprocess.CompletedProcess:
    """The trainer as one process without horovodrun (Horovod size 1)."""
    return subprocess.run(
        [PY, PYZ, "train", *argv],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=scrubbed_env(dict(os.environ)),
    )


def test_a_checkpoint_refuses_to_resume_under_other_hyperparameters(tmp_path):
    common = [
        "--synthetic",
        "--model",
        "tiny",
        "--batch-size",
        "8",
        "--no-eval",
        "--model-dir",
        "m",
        "--log-every",
        "1",
    ]
    first = _single(tmp_path, *common, "--lr", "0.1", "--max-steps", "2")
    assert first.returncode == 0, first.stderr[-3000:]
    saved = json.loads((tmp_path / "m" / "checkpoints" / "hparams.json").read_text())
    assert saved["base_lr"] == 0.1 and saved["batch_size"] == 8 and saved["recipe"] == "nvidia"

    other = _single(tmp_path, *common, "--lr", "0.4", "--max-steps", "4")
    assert other.returncode == train_log.EXIT_HPARAMS, other.stdout[-2000:] + other.stderr[-2000:]
    errors = [ln for ln in other.stderr.splitlines() if "Error:" in ln]
    assert len(errors) == 1 and "base_lr 0.1 -> 0.4" in errors[0] and "--model-dir" in errors[0], other.stderr[-2000:]
    run = train_log.parse_train_log(other.stdout).current
    assert run.errors[0].fields["kind"] == "hparams_mismatch" and run.rows == ()

    same = _single(tmp_path, *common, "--lr", "0.1", "--max-steps", "4")
    assert same.returncode == 0, same.stderr[-3000:]
    run = train_log.parse_train_log(same.stdout).current
    assert run.resumed_from.step == 2 and run.done.step == 4


def test_labels_out_of_range_stop_the_run_without_dataset_json(tmp_path, dataset):
    # Shards alone (no dataset.json to check against before the start): the input pipeline catches the
    # first label outside 0..classes-1 and the run stops with exit 6 instead of training on zero targets.
    bare = tmp_path / "bare"
    bare.mkdir()
    for f in dataset.glob("*-*-of-*"):
        (bare / f.name).write_bytes(f.read_bytes())
    proc = _single(
        tmp_path,
        "--data",
        str(bare),
        "--model",
        "tiny",
        "--batch-size",
        "16",
        "--num-classes",
        "10",
        "--label-offset",
        "0",
        "--train-examples",
        "640",
        "--max-steps",
        "40",
        "--no-eval",
        "--model-dir",
        "m",
    )
    assert proc.returncode == train_log.EXIT_BAD_LABELS, proc.stdout[-2000:] + proc.stderr[-2000:]
    run = train_log.parse_train_log(proc.stdout).current
    err = run.errors[0].fields
    assert err["kind"] == "bad_labels" and int(err["step"]) <= 5, err  # label 10 is 1 image in 10: soon
    assert "--label-offset" in err["message"]
    assert [ln for ln in proc.stderr.splitlines() if ln.startswith("train: Error:")]
