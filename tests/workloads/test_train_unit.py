"""The training job's modules (train_options, train_nodes, train_job, train_tensorboard) without running
anything: the trainer's argv, the nodes chosen, the job's record, and its log read back into typed values,
against logs captured from real runs of the trainer (clusterctl/node/train/; tests/fixtures/train_*.log): horovodrun -np 2
--gloo on localhost, the tiny model on `clusterctl data synthetic` (640 images, 10 classes, 32 px); rank 1
SIGKILLed after the step-60 checkpoint (killed), the same command again (resumed), then --eval-only on one
process (eval_only), and --eval-only on an empty model dir (no_checkpoint)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from clusterctl.errors import UsageError
from clusterctl.s3uri import S3Uri
from clusterctl.workloads.train import (
    job as train,
    log as train_log,
    nodes,
    options as train_options,
    status as train_status,
    tensorboard as train_tensorboard,
)
from clusterctl.workloads.train.log import CheckpointSaved, TrainRow
from clusterctl.workloads.train.options import TrainOptions
from conftest import FIXTURES

KILLED = (FIXTURES / "train_tiny_np2_killed.log").read_text()
RESUMED = (FIXTURES / "train_tiny_np2_resumed.log").read_text()
EVAL_ONLY = (FIXTURES / "train_tiny_eval_only.log").read_text()
NO_CHECKPOINT = (FIXTURES / "train_no_checkpoint.log").read_text()


# ---- the killed run -----------------------------------------------------------------------------------
def test_killed_run_parsed():
    log = train_log.parse_train_log(KILLED)
    assert len(log.runs) == 1
    run = log.current
    s = run.start
    assert (s.size, s.model, s.batch, s.global_batch, s.train_examples) == (2, "tiny", 16, 32, 640)
    assert (s.steps_per_epoch, s.epochs, s.total_steps, s.stop_step, s.start_step) == (20, 12.0, 240, 240, 0)
    assert s.peak_lr == 0.25 and s.fields["schedule"] == "cosine" and s.fields["validation_files"] == "2"
    assert run.rows[0] == TrainRow(1, 0.05, 5.5, 2.2511, 2.2533, 0.0125, 14.2)
    assert run.rows[-1] == TrainRow(60, 3.0, 859.6, 1.3317, 1.3379, 0.231111, 16.0)
    assert [r.step for r in run.rows] == [1, 10, 20, 30, 40, 50, 60]
    assert run.checkpoints == (
        CheckpointSaved(20, 1, "/tmp/m4/checkpoints/ckpt-20"),
        CheckpointSaved(40, 2, "/tmp/m4/checkpoints/ckpt-40"),
        CheckpointSaved(60, 3, "/tmp/m4/checkpoints/ckpt-60"),
    )
    assert run.done is None and run.eval is None and run.resumed_from is None and run.errors == ()
    # horovodrun's own verdict, read from its RuntimeError
    assert run.failure == "process 1 exited 137 (killed: SIGKILL or out of memory)"


def test_killed_run_status():
    st = train_status.status(train_log.parse_train_log(KILLED), running=False)
    assert st.state == "failed" and st.reason == "process 1 exited 137 (killed: SIGKILL or out of memory)"
    assert (st.step, st.epoch, st.stop_step, st.size, st.restarts) == (60, 3.0, 240, 2, 0)
    assert st.last_checkpoint == CheckpointSaved(60, 3, "/tmp/m4/checkpoints/ckpt-60")
    assert st.eta_s is None and st.result is None
    assert (st.loss, st.lr, st.elapsed_s) == (1.3317, 0.231111, 16.0)
    # The rate: the last 5 rows, leaving out step 1 (graph tracing)
    assert st.img_per_sec == pytest.approx((1713.9 + 756.3 + 1491.0 + 936.6 + 859.6) / 5)


# ---- the resumed run ----------------------------------------------------------------------------------
def test_resumed_run_continues_from_the_checkpoint_and_evaluates():
    run = train_log.parse_train_log(RESUMED).current
    assert run.start.start_step == 60
    assert run.resumed_from == CheckpointSaved(60, 3, "/tmp/m4/checkpoints/ckpt-60")
    assert run.rows[0].step == 61 and run.rows[-1] == TrainRow(240, 12.0, 1528.5, 1.0745, 1.0828, 0.000013, 19.4)
    assert [c.step for c in run.checkpoints] == list(range(80, 241, 20))
    assert run.done == train_log.TrainDone(240, 12.0, True, 19.4214, 502.293)
    ev = run.eval
    assert (ev.step, ev.epoch, ev.top1, ev.top5, ev.examples, ev.size) == (240, 12.0, 68.75, 100.0, 128, 2)
    assert ev.loss == 0.73982 and ev.checkpoint == "/tmp/m4/checkpoints/ckpt-240"
    assert ev.time == "2026-11-21T22:59:49Z"
    assert train_log.parse_eval(RESUMED) == ev


def test_status_of_the_whole_job_across_the_restart():
    log = train_log.parse_train_log(KILLED + RESUMED)
    assert len(log.runs) == 2 and log.runs[0].failure and log.runs[1].resumed_from.step == 60
    st = train_status.status(log, running=False)
    assert st.state == "finished" and st.reason is None
    assert (st.step, st.epoch, st.epochs, st.restarts, st.resumed_from_step) == (240, 12.0, 12.0, 1, 60)
    assert st.eta_s == 0.0 and st.result.top1 == 68.75
    assert st.elapsed_s == 19.4214 and st.total_elapsed_s == pytest.approx(16.0 + 19.4214)
    assert st.last_checkpoint.step == 240


def test_status_of_a_live_log_cut_mid_line():
    """What `clusterctl status` sees while the job runs: the log up to the step-150 row, then half a line."""
    cut = RESUMED.index("CLUSTERCTL-TRAIN     160")
    live = RESUMED[:cut] + "CLUSTERCTL-TRAIN     16"  # horovodrun's prefix was written, the row was not
    st = train_status.status(train_log.parse_train_log(live), running=True)
    assert st.state == "running" and st.reason is None
    assert (st.step, st.epoch, st.loss, st.lr) == (150, 7.5, 1.245, 0.0915)
    rate = (1991.7 + 1822.4 + 1894.1 + 2044.1 + 1431.9) / 5  # rows 110-150
    assert st.img_per_sec == pytest.approx(rate)
    assert st.eta_s == pytest.approx((240 - 150) * 32 / rate)
    assert st.cost_to_finish(24.48 * 4) == pytest.approx(24.48 * 4 * st.eta_s / 3600)
    assert st.last_checkpoint.step == 140
    # the process gone without a `done` line: stopped, with no ETA
    gone = train_status.status(train_log.parse_train_log(live), running=False)
    assert gone.state == "stopped" and gone.eta_s is None and "without finishing" in gone.reason
    # finished training, evaluation still running
    done_only = RESUMED[: RESUMED.index("[0]<stdout>:CLUSTERCTL-TRAIN eval")]
    assert train_status.status(train_log.parse_train_log(done_only), running=True).state == "evaluating"
    # nothing marked yet: horovodrun and TensorFlow still starting
    noise = KILLED[: KILLED.index("[0]<stdout>:CLUSTERCTL-TRAIN start")]
    assert train_status.status(train_log.parse_train_log(noise), running=True).state == "starting"
    gone = train_status.status(train_log.parse_train_log(noise), running=False)
    assert (gone.state, gone.reason, gone.step, gone.img_per_sec, gone.last_checkpoint) == (
        "stopped",
        "no training output",
        0,
        None,
        None,
    )
    header_only = RESUMED[: RESUMED.index("CLUSTERCTL-TRAIN      61") - len("[0]<stdout>:")]
    st = train_status.status(train_log.parse_train_log(header_only), running=True)
    assert st.state == "starting" and st.step == 60 and st.eta_s is None


# ---- evaluation alone ---------------------------------------------------------------------------------
def test_eval_only_output():
    ev = train_log.parse_eval(EVAL_ONLY)
    assert (ev.step, ev.epoch, ev.top1, ev.top5, ev.examples, ev.size) == (240, 12.0, 68.75, 100.0, 128, 1)
    # the same checkpoint as the 2-process evaluation at the end of training, the same numbers
    assert (ev.top1, ev.top5, ev.loss, ev.checkpoint) == (68.75, 100.0, 0.73982, "/tmp/m4/checkpoints/ckpt-240")
    log = train_log.parse_train_log(RESUMED + EVAL_ONLY)
    assert len(log.runs) == 2 and log.runs[1].start is None and log.eval.size == 1
    assert train_status.status(log, running=False).state == "finished"


def test_eval_only_without_checkpoint():
    with pytest.raises(ValueError, match=r"^no evaluation: the trainer reported no_checkpoint$"):
        train_log.parse_eval(NO_CHECKPOINT)
    st = train_status.status(train_log.parse_train_log(NO_CHECKPOINT), running=False)
    assert st.state == "failed" and st.reason == "no_checkpoint"
    with pytest.raises(ValueError, match="no evaluation: process 1 exited 137"):
        train_log.parse_eval(KILLED)
    with pytest.raises(ValueError, match="no 'CLUSTERCTL-TRAIN eval' line"):
        train_log.parse_eval("just noise\n")


# ---- robustness ---------------------------------------------------------------------------------------
def test_any_prefix_and_carriage_returns():
    plain = train_log.parse_train_log(RESUMED)
    stamped = "".join(
        line.replace("[0]<stdout>:", "Sat Nov 21 22:59:30 2026[0]<stdout>:") for line in RESUMED.splitlines(True)
    )
    tmux = RESUMED.replace("\n", "\r\n")
    assert train_log.parse_train_log(stamped) == plain == train_log.parse_train_log(tmux)


def test_malformed_marked_lines_name_their_line():
    with pytest.raises(ValueError, match="line 2: a table row needs 7 columns"):
        train_log.parse_train_log("noise\nCLUSTERCTL-TRAIN 10 0.5 1.0\n")
    with pytest.raises(ValueError, match="line 1: table header"):
        train_log.parse_train_log("CLUSTERCTL-TRAIN Step Epoch Speed Loss FinLoss LR\n")
    with pytest.raises(ValueError, match="line 1: start line has no size="):
        train_log.parse_train_log("CLUSTERCTL-TRAIN start model=tiny\n")
    with pytest.raises(ValueError, match=r"line 1: top1='high' is not a float"):
        train_log.parse_train_log("CLUSTERCTL-TRAIN eval step=1 epoch=1 top1=high top5=2 loss=1 examples=3\n")
    with pytest.raises(ValueError, match="'junk' is not key=value"):
        train_log.parse_train_log("CLUSTERCTL-TRAIN checkpoint junk\n")
    # values with spaces are shell-quoted by the trainer and read back whole
    run = train_log.parse_train_log("CLUSTERCTL-TRAIN checkpoint step=5 epoch=0 path='/data/my run/ckpt-5'\n").current
    assert run.checkpoints == (CheckpointSaved(5, 0, "/data/my run/ckpt-5"),)
    # each field read as its record's annotation says: `images` (int | None) when given, whole counts from "12.0"
    text = "CLUSTERCTL-TRAIN resume step=12.0 epoch=1 checkpoint=/m/ckpt-96 images=96\n"
    assert train_log.parse_train_log(text).current.resumed_from == CheckpointSaved(12, 1, "/m/ckpt-96", 96)
    with pytest.raises(ValueError, match=r"line 1: images='many' is not a int"):
        train_log.parse_train_log("CLUSTERCTL-TRAIN checkpoint step=5 epoch=0 path=/m/c images=many\n")
    done = train_log.parse_train_log(
        "CLUSTERCTL-TRAIN done step=9 epoch=1.5 complete=false elapsed=3 img_per_sec=7.5\n"
    ).current.done
    assert done == train_log.TrainDone(9, 1.5, False, 3.0, 7.5)


# ---- the command line ---------------------------------------------------------------------------------
def test_trainer_argv_golden():
    opts = TrainOptions(
        data="/data/imagenet",
        epochs=90,
        batch_size=256,
        model_dir="/home/u/job/model",
        checkpoint_every=500,
        log_every=50,
        mixed_precision=True,
        xla=True,
        expect_size=256,
    )
    assert train_options.trainer_argv("/opt/venv/bin/python", "/home/u/.clusterctl/node/node-x.pyz", opts) == [
        "/opt/venv/bin/python",
        "/home/u/.clusterctl/node/node-x.pyz",
        "train",
        "--data",
        "/data/imagenet",
        "--model",
        "resnet50",
        "--epochs",
        "90",
        "--batch-size",
        "256",
        "--model-dir",
        "/home/u/job/model",
        "--checkpoint-every",
        "500",
        "--log-every",
        "50",
        "--expect-size",
        "256",
        "--mixed-precision",
        "--xla",
    ]
    synth = TrainOptions(synthetic=True, model="tiny", epochs=0.5, max_steps=30, no_eval=True, extra=("--seed", "7"))
    assert train_options.trainer_argv("python3", "t.pyz", synth) == [
        "python3",
        "t.pyz",
        "train",
        "--model",
        "tiny",
        "--epochs",
        "0.5",
        "--max-steps",
        "30",
        "--synthetic",
        "--no-eval",
        "--seed",
        "7",
    ]
    with pytest.raises(UsageError, match="give --data DIR or --synthetic"):
        train_options.trainer_argv("python3", "t.py", TrainOptions())
    with pytest.raises(UsageError, match="may not start with '-'"):
        TrainOptions(data="--evil")
    with pytest.raises(UsageError, match="unknown model 'vgg'"):
        TrainOptions(data="/d", model="vgg")


def test_trainer_accepts_every_flag_the_argv_builder_writes():
    """The builder's flags exist in the trainer's parser (it is imported, TensorFlow is not)."""
    from clusterctl.node.train import options

    every = TrainOptions(
        data="/d",
        model="tiny",
        epochs=2,
        batch_size=8,
        model_dir="/m",
        image_size=32,
        max_steps=9,
        base_lr=0.2,
        warmup_epochs=1,
        checkpoint_every=5,
        keep_checkpoints=2,
        log_every=3,
        mixed_precision=True,
        xla=True,
        no_eval=True,
        no_gpu=True,
        expect_size=4,
    )
    args = options.parse_args(train_options.trainer_argv("py", "t.pyz", every)[3:])
    assert (args.data, args.model, args.epochs, args.batch_size, args.model_dir, args.max_steps) == (
        "/d",
        "tiny",
        2.0,
        8,
        "/m",
        9,
    )
    assert (args.checkpoint_every, args.keep_checkpoints, args.log_every, args.expect_size) == (5, 2, 3, 4)
    assert args.precision == "mixed" and args.xla and args.no_eval and args.no_gpu and not args.eval_only
    assert options.parse_args(["--synthetic", "--lr", "0.4"]).base_lr == 0.4  # --lr: clusterctl sweep's name for it


def test_learning_rate_schedule_of_the_trainer():
    from clusterctl.node.train.options import learning_rate as lr

    # warm-up: linear to the peak over the warm-up steps, then the decays
    assert lr(0, 1.0, 100, 1000, "cosine") == pytest.approx(0.01)
    assert lr(99, 1.0, 100, 1000, "cosine") == pytest.approx(1.0)
    assert lr(100, 1.0, 100, 1000, "cosine") == pytest.approx(1.0)
    assert lr(550, 1.0, 100, 1000, "cosine") == pytest.approx(0.5)
    assert lr(1000, 1.0, 100, 1000, "cosine") == pytest.approx(0.0)
    assert lr(550, 1.0, 100, 1000, "poly") == pytest.approx(0.25)
    assert [lr(s, 1.0, 100, 900, "step") for s in (200, 300, 600, 800)] == pytest.approx([1.0, 0.1, 0.01, 0.001])


# ---- the job on a cluster: the pure parts -------------------------------------------------------------
def test_a_killed_log_followed_by_its_restart_and_a_cut_line():
    """The history `status` reads: a launch killed mid-line, then the launch that resumed it."""
    cut = KILLED.index("CLUSTERCTL-TRAIN      60") + len("CLUSTERCTL-TRAIN      6")
    torn = KILLED[:cut] + "\n" + RESUMED  # history_command adds the newline after an earlier log
    with pytest.raises(ValueError, match="a table row needs 7 columns"):
        train_log.parse_train_log(torn)
    log = train_log.parse_train_log(torn, strict=False)
    assert len(log.runs) == 2 and log.runs[0].rows[-1].step == 50 and log.runs[1].resumed_from.step == 60
    # two lines run together: the last mark on the line wins
    joined = KILLED[:cut] + RESUMED
    assert train_log.parse_train_log(joined, strict=False).runs[1].start.start_step == 60


def test_train_job_record_and_history_command():
    job = train.TrainJob(
        key="c1",
        job="train-20261121-230757-15810",
        job_dir="/root/clusterctl-jobs/train-x",
        home="/root",
        leader="10.0.0.2",
        model_dir="/root/runs/tiny",
        np=4,
        python="/opt/v/bin/python",
        options=TrainOptions(data="/root/ds", model="tiny", extra=("--seed", "1")),
        started_at=1.5,
        previous=("train-20261121-230653-11508",),
    )
    back = train.TrainJob.from_json(job.to_json())
    assert back == job and back.options == TrainOptions(data="/root/ds", model="tiny", extra=("--seed", "1"))
    # train.json as it always was: the options one JSON object of every field, extra a list
    on_disk = json.loads(job.to_json())
    assert list(on_disk) == [
        "key",
        "job",
        "job_dir",
        "home",
        "leader",
        "model_dir",
        "np",
        "python",
        "options",
        "started_at",
        "previous",
        "hosts",
    ]
    assert on_disk["options"]["extra"] == ["--seed", "1"] and on_disk["options"]["data"] == "/root/ds"
    assert list(on_disk["options"]) == list(TrainOptions.__dataclass_fields__)
    # a record whose options this version does not know (another version wrote it) still reads
    on_disk["options"]["gone_option"] = 1
    del on_disk["options"]["xla"]
    assert train.TrainJob.from_json(json.dumps(on_disk)) == job
    assert job.log_path == "/root/.clusterctl/jobs/train-20261121-230757-15810.log"
    assert train.history_command(job) == (
        'cat "$HOME/.clusterctl/jobs/train-20261121-230653-11508.log" 2>/dev/null && echo; '
        'cat "$HOME/.clusterctl/jobs/train-20261121-230757-15810.log" 2>/dev/null; true'
    )

    with pytest.raises(UsageError):
        train.history_command(train.TrainJob(**{**job.__dict__, "job": "x; rm -rf ~"}))
    tb = train_tensorboard.tensorboard_command(job, 6006)
    assert "--host 127.0.0.1 --port 6006" in tb and "--logdir /root/runs/tiny/tensorboard" in tb


# ---- the trainer's `device` lines (which GPU each rank has) ---------------------------------------------
def test_device_lines_before_start_open_no_run_of_their_own():
    from clusterctl.workloads import horovod

    def with_devices(log: str, gpus: str) -> str:
        lines = [
            f"[0]<stdout>:CLUSTERCTL-TRAIN device rank={r} host=node-0 local_rank={r} gpus={gpus} logical=0\n"
            for r in range(2)
        ]
        return "".join(lines) + log

    both = with_devices(KILLED, "none") + with_devices(RESUMED, "none")
    plain = train_log.parse_train_log(KILLED + RESUMED)
    log = train_log.parse_train_log(both)
    assert len(log.runs) == 2 and log == plain
    assert train_status.status(log, running=False) == train_status.status(plain, running=False)
    reports = horovod.parse_devices(both, train_log.MARK)
    assert [(r.rank, r.gpus) for r in reports] == [(0, ()), (1, ())]
    assert horovod.device_problems(reports, 2, 0) == []  # local nodes: no GPU to prove
    assert horovod.device_problems(reports, 2, 8) == [
        "node-0: rank(s) 0, 1 ran on the CPU (TensorFlow found no "
        "usable GPU: a CPU-only TensorFlow, or CUDA/the driver failed "
        "to load)"
    ]


# ---- issue 15: precision, recipes, labels, periodic evaluations, Horovod's tuning ----------------------
def test_precision_auto_is_float16_only_on_tensor_core_gpus():
    from clusterctl.node.train import model as t  # the one choice of the trainer and the benchmark
    from clusterctl.node.train.options import parse_args

    assert t.choose_precision("auto", []) == "float32"  # CPU
    assert t.choose_precision("auto", [(7, 0)]) == "mixed_float16"  # V100
    assert t.choose_precision("auto", [(8, 0)]) == "mixed_float16"  # A100
    assert t.choose_precision("auto", [(6, 1)]) == "float32"  # P100-era: no tensor cores
    assert t.choose_precision("auto", [None]) == "float32"  # capability unknown: do not guess
    assert t.choose_precision("fp32", [(8, 0)]) == "float32"
    assert t.choose_precision("float16", []) == "mixed_float16"  # forced, even on a CPU (tests, old GPUs)
    assert t.choose_precision("bfloat16", [(8, 0)]) == "mixed_bfloat16"
    assert (
        t.choose_precision("mixed", []) == "mixed_bfloat16" and t.choose_precision("mixed", [(7, 5)]) == "mixed_float16"
    )
    assert parse_args(["--synthetic"]).precision == "auto"
    assert parse_args(["--synthetic", "--fp32"]).precision == "fp32"
    assert parse_args(["--synthetic", "--mixed-precision"]).precision == "mixed"


def test_recipes_fill_only_what_is_not_given():
    from clusterctl.node.train import options as t

    # NVIDIA's TensorFlow ResNet-50 v1.5 scripts (resnet50v1.5/training/DGX1_RN50_AMP_90E.sh:28-32, README:97)
    d = t.parse_args(["--synthetic"])
    nvidia = (d.recipe, d.base_lr, d.momentum, d.weight_decay, d.warmup_epochs, d.lr_schedule, d.label_smoothing)
    assert nvidia == ("nvidia", 0.256, 0.875, 3.0517578125e-05, 8.0, "cosine", 0.1)
    assert d.min_crop_area == 0.08
    assert t.RECIPE_MODEL["nvidia"] == t.ModelRecipe(
        fan="fan_in", he_classifier=True, zero_last_gamma=False, decay_all_but_bn=True
    )
    g = t.parse_args(["--synthetic", "--recipe", "goyal"])
    goyal = (g.base_lr, g.momentum, g.weight_decay, g.warmup_epochs, g.lr_schedule, g.label_smoothing)
    assert goyal == (0.1, 0.9, 1e-4, 5.0, "step", 0.0)
    assert t.RECIPE_MODEL["goyal"].zero_last_gamma and t.RECIPE_MODEL["goyal"].fan == "fan_out"
    mine = t.parse_args(["--synthetic", "--recipe", "goyal", "--label-smoothing", "0.2", "--momentum", "0.8"])
    assert (mine.label_smoothing, mine.momentum, mine.lr_schedule) == (0.2, 0.8, "step")
    assert t.parse_args(["--synthetic", "--weight-decay", "0", "--lr", "0.5"]).weight_decay == 0.0
    # the operator's choices are the trainer's
    from clusterctl.workloads.train import options as train_options

    assert train_options.RECIPES == ("nvidia", "goyal")
    # the step schedule is Goyal's: /10 at epochs 30, 60 and 80 of 90
    peak, spe = 1.0, 100
    lr = [t.learning_rate(e * spe, peak, 5 * spe, 90 * spe, "step") for e in (29, 30, 59, 60, 79, 80, 89)]
    assert lr == pytest.approx([1, 0.1, 0.1, 0.01, 0.01, 0.001, 0.001])


def test_label_range_from_dataset_json():
    from clusterctl.node.train import data as t

    meta = {"label_base": 1, "num_classes": 10}
    assert t.label_problem(meta, 1, 10) is None
    msg = t.label_problem(meta, 0, 10)
    assert "1..10 minus --label-offset 0 are 1..10, outside 0..9" in msg and "use --label-offset 1" in msg
    assert t.label_problem({"label_base": 0, "num_classes": 1000}, 1, 1000).startswith("labels 0..999")
    assert t.label_problem({}, 0, 10) is None  # no metadata: the input pipeline checks each record


def test_sweep_trials_get_their_own_model_dir_and_input_threads_share_the_cpus():
    from clusterctl.node.train import data, model, options

    assert options.default_model_dir({}) == "train_out"
    assert (
        options.default_model_dir({"CLUSTERCTL_SWEEP": "sweep-20260101-000000-ab12", "CLUSTERCTL_TRIAL": "3"})
        == "train_out/sweep-20260101-000000-ab12/trial-3"
    )
    assert options.parse_args(["--synthetic"]).model_dir in ("train_out",) or os.environ.get("CLUSTERCTL_TRIAL")
    assert (model.input_threads(96, 8), model.input_threads(2, 4), model.input_threads(None, 1)) == (12, 1, 1)
    assert data.data_seed(1, 0, 0) != data.data_seed(1, 1, 0) != data.data_seed(1, 0, 100)


def test_hparams_json_refuses_a_resume_under_other_values(tmp_path):
    from clusterctl.node.train import resume as t

    path = str(tmp_path / "hparams.json")
    hp = {"base_lr": 0.1, "batch_size": 64}
    assert t.check_hparams(path, hp, has_checkpoint=False) is None
    assert json.loads(Path(path).read_text()) == hp
    assert t.check_hparams(path, dict(hp), has_checkpoint=True) is None
    why = t.check_hparams(path, {**hp, "base_lr": 0.4}, has_checkpoint=True)
    assert "base_lr 0.1 -> 0.4" in why and "another --model-dir" in why
    # no checkpoint yet (a run that died before its first save): the new values are recorded instead
    assert t.check_hparams(path, {**hp, "base_lr": 0.4}, has_checkpoint=False) is None
    assert json.loads(Path(path).read_text())["base_lr"] == 0.4


def test_periodic_evaluations_stay_in_their_run():
    start = (
        "CLUSTERCTL-TRAIN start size=4 model=tiny batch=8 global_batch=32 train_examples=640 steps_per_epoch=20 "
        "epochs=2 total_steps=40 stop_step=40 start_step=0 peak_lr=0.125\n"
    )
    ev = (
        "CLUSTERCTL-TRAIN eval step={s} epoch={e} top1={t} top5=90 loss=1.5 examples=128 k=5 checkpoint=c "
        "time=T seconds=1 size=4 final={f}\n"
    )
    text = (
        start + ev.format(s=20, e=1, t=40, f=0) + "CLUSTERCTL-TRAIN done step=40 epoch=2 complete=1 elapsed=9 "
        "img_per_sec=5\n" + ev.format(s=40, e=2, t=55, f=1)
    )
    log = train_log.parse_train_log(text)
    assert len(log.runs) == 1
    run = log.current
    assert [(e.step, e.top1) for e in run.evals] == [(20, 40.0)] and run.eval.top1 == 55.0
    assert train_log.parse_eval(text).step == 40
    # `status` shows the latest one while the job trains, the final result once there is one
    mid = train_status.status(train_log.parse_train_log(start + ev.format(s=20, e=1, t=40, f=0)), running=True)
    assert mid.state == "starting" and mid.validation.top1 == 40.0 and mid.result is None
    assert train_status.status(log, running=False).result.top1 == 55.0
    # an older trainer's eval line (no final=) is the final one, as before
    assert (
        train_log.parse_train_log(start + ev.format(s=40, e=2, t=55, f=1).replace(" final=1", "")).current.eval.step
        == 40
    )


def test_train_options_reach_the_trainer_and_horovod():
    argv = train_options.trainer_argv(
        "py",
        "t.py",
        TrainOptions(synthetic=True, precision="float16", recipe="goyal", eval_every=2, fp16_allreduce=True),
    )
    assert argv[argv.index("--precision") + 1] == "float16" and argv[argv.index("--recipe") + 1] == "goyal"
    assert argv[argv.index("--eval-every") + 1] == "2" and "--fp16-allreduce" in argv
    with pytest.raises(UsageError, match="unknown precision 'half'"):
        TrainOptions(synthetic=True, precision="half")
    assert train_options.horovod_env(TrainOptions()) == {
        "HOROVOD_FUSION_THRESHOLD": str(64 * 1024 * 1024),
        "HOROVOD_CYCLE_TIME": "1",
    }
    assert train_options.horovod_env(TrainOptions(fusion_threshold_mb=0, cycle_time_ms=3.5)) == {
        "HOROVOD_FUSION_THRESHOLD": "0",
        "HOROVOD_CYCLE_TIME": "3.5",
    }


def test_checkpoint_to_is_a_bucket_and_a_prefix():
    from clusterctl.errors import ExitCode, UsageError

    loc = train_options.check_s3_uri("s3://my-bucket/runs/r1/")
    assert loc == S3Uri("my-bucket", "runs/r1/")
    for bad, why in (("s3://my-bucket", "needs a prefix"), ("/tmp/x", "is not an S3 location")):
        with pytest.raises(UsageError, match=why) as exc:
            train_options.check_s3_uri(bad)
        assert exc.value.exit_code == ExitCode.USAGE


# ---- which nodes a launch runs on (a spot node may be gone) ----------------------------------------------
LABELS = ("10.0.0.1", "10.0.0.2", "10.0.0.3")


def test_every_node_answered_all_are_kept_the_first_leads():
    for spot in (True, False):
        assert nodes.choose_nodes(LABELS, [None, None, None], spot=spot, np_given=False) == nodes.NodeChoice((0, 1, 2))


def test_a_spot_cluster_leaves_out_the_unreachable_and_the_next_node_leads():
    choice = nodes.choose_nodes(LABELS, ["timed out", None, None], spot=True, np_given=False)
    assert choice == nodes.NodeChoice((1, 2), (nodes.LeftOut(0, "timed out"),))
    line = nodes.left_out_line(LABELS, choice)
    assert line == (
        "spot cluster: left out 10.0.0.1 (timed out), unreachable (an interrupted instance?); "
        "training on 2 of 3 node(s), leader 10.0.0.2"
    )
    choice = nodes.choose_nodes(LABELS, [None, "refused\nby host", "gone"], spot=True, np_given=False)
    assert choice.keep == (0,) and [n.index for n in choice.left_out] == [1, 2]
    assert "left out 10.0.0.2 (refused by host), 10.0.0.3 (gone)" in nodes.left_out_line(LABELS, choice)


def test_an_unreachable_node_is_an_error_off_spot_with_np_or_when_none_answers():
    from clusterctl.errors import ExitCode, UnreachableError

    cases = [
        (
            dict(spot=False, np_given=False),
            [None, "timed out", None],
            "1 of 3 node(s) did not answer (10.0.0.2: timed out): bring them back",
        ),
        (
            dict(spot=True, np_given=True),
            [None, "timed out", None],
            "1 of 3 spot node(s) did not answer (10.0.0.2: timed out) and --np asks for a fixed number of processes: "
            "run the same command without --np",
        ),
        (dict(spot=True, np_given=False), ["a", "b", "c"], "no node of the cluster answered (10.0.0.1: a; 10.0.0.2: b"),
    ]
    for kw, errors, start in cases:
        with pytest.raises(UnreachableError) as exc:
            nodes.choose_nodes(LABELS, errors, **kw)
        assert exc.value.exit_code == ExitCode.UNREACHABLE and exc.value.one_line().startswith(start), (
            exc.value.one_line()
        )
    with pytest.raises(ValueError):
        nodes.choose_nodes(LABELS, [None], spot=True, np_given=False)


def test_the_inventory_keeps_the_chosen_nodes_and_later_commands_find_the_jobs_leader():
    from clusterctl.cluster.inventory import Inventory
    from clusterctl.hostsfile import HostsFile
    from clusterctl.remote.targets import SshSettings, SshTarget

    hosts = HostsFile.parse("10.0.0.1 slots=2\n10.0.0.2 slots=2\n10.0.0.3 slots=1\n")
    inv = Inventory(hosts, tuple(SshTarget(h, h) for h in LABELS), SshSettings("/kh"))
    kept = nodes.keep_nodes(inv, (1, 2))
    assert [e.host for e in kept.hosts.entries] == ["10.0.0.2", "10.0.0.3"] and kept.hosts.total_slots == 3
    assert [t.label for t in kept.targets] == ["10.0.0.2", "10.0.0.3"] and kept.settings == inv.settings
    job = train.TrainJob(
        key="c",
        job="train-1",
        job_dir="/d",
        home="/root",
        leader="10.0.0.2",
        model_dir="/m",
        np=3,
        python="/p",
        options=TrainOptions(),
        started_at=0.0,
        hosts=("10.0.0.2", "10.0.0.3"),
    )
    assert train.TrainJob.from_json(job.to_json()) == job
    assert train.job_inventory(inv, job).targets[0].label == "10.0.0.2"
    old = json.loads(job.to_json())
    del old["hosts"]  # a record from before: the hosts' first node leads
    assert train.job_inventory(inv, train.TrainJob.from_json(json.dumps(old))) is inv


def test_rank_0s_tools_follow_whichever_process_is_rank_0():
    """node/train/elastic.py's Chief: made when a process becomes rank 0 after a reset, given up (copies
    finished) when it stops being rank 0, made again if it becomes rank 0 once more; the first rank 0 keeps the
    tools main made."""
    from clusterctl.node.train import checkpoints, elastic

    made: list[str] = []

    def make():
        made.append("made")
        return None, f"manager-{len(made)}", checkpoints.Copier([], 1, lambda *a, **k: None)

    first = elastic.Chief(make=make, manager="main's", held=True)
    assert first.follow(True) is False and first.manager == "main's" and made == []
    other = elastic.Chief(make=make)
    assert other.follow(False) is False and other.manager is None and made == []
    assert other.follow(True) is True and other.manager == "manager-1" and other.copier is not None
    assert other.follow(True) is False and made == ["made"]  # still rank 0: nothing made again
    assert other.follow(False) is False and (other.manager, other.copier, other.held) == (None, None, False)
    assert first.follow(False) is False and first.manager is None
    assert other.follow(True) is True and other.manager == "manager-2"
