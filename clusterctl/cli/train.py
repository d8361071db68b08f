"""Commands that train on the cluster: train eval tensorboard; the training job's part of logs and status."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, List, Optional

import typer

from clusterctl.cli.display import _esc, console, fitted_table
from clusterctl.cli.shared import (
    CLUSTER,
    DEFAULT_SSH,
    HOSTS,
    LOGIN,
    Ssh,
    _print_line,
    _resolve_hosts,
    _store,
    option_group,
    ssh_options,
    within,
)
from clusterctl.errors import ClusterctlError, ExitCode
from clusterctl.node.nccl_report import ALLOW_FLAG as ALLOW_SOCKET
from clusterctl.units import duration, money

if TYPE_CHECKING:
    from clusterctl.cluster.inventory import Inventory
    from clusterctl.workloads.train.job import TrainJob
    from clusterctl.workloads.train.log import EvalResult
    from clusterctl.workloads.train.status import TrainStatus

app = typer.Typer()  # its commands are merged into cli/app.py's app (see COMMANDS there)


# ---- training ------------------------------------------------------------------------------------------
def _train_inventory(hostsfile: str | None, cluster: str | None, connect_timeout: float = 10.0) -> Inventory:
    from clusterctl.cluster import inventory

    return inventory.resolve(hostsfile, cluster, _store(), inventory.SshOverrides(connect_timeout=connect_timeout))


TRAIN_FLAGS = dict(  # train's training options, declared once; train_run.options checks them as TrainOptions
    data=(
        Optional[str],
        typer.Option(
            None,
            "--data",
            help="Dataset folder on every node (ImageNet-format TFRecords, put there by `clusterctl sync`).",
        ),
    ),
    synthetic=(bool, typer.Option(False, "--synthetic", help="Random in-memory images instead of --data.")),
    model=(str, typer.Option("resnet50", "--model", help="resnet50, or tiny for CPU rehearsals.")),
    epochs=(float, typer.Option(90, "--epochs")),
    batch_size=(
        Optional[int],
        typer.Option(
            None,
            "--batch-size",
            help="Images per process per step (default: the GPU type's, as `bench`: 256 on GPUs in 16-bit, 32 on CPUs).",
        ),
    ),
    model_dir=(
        Optional[str],
        typer.Option(
            None,
            "--model-dir",
            help="Checkpoints and TensorBoard logs on the leader (default ~/clusterctl-train/model); a restart resumes from it.",
        ),
    ),
    checkpoint_every=(
        Optional[int],
        typer.Option(None, "--checkpoint-every", help="Steps between checkpoints (also at every epoch)."),
    ),
    log_every=(Optional[int], typer.Option(None, "--log-every", help="Steps between log lines.")),
    max_steps=(
        Optional[int],
        typer.Option(None, "--max-steps", help="Stop at this step (the schedule still spans --epochs)."),
    ),
    base_lr=(
        Optional[float],
        typer.Option(
            None,
            "--base-lr",
            help="Learning rate per 256 images, scaled with the global batch (default: the recipe's, nvidia 0.256, goyal 0.1).",
        ),
    ),
    warmup_epochs=(
        Optional[float],
        typer.Option(None, "--warmup-epochs", help="Linear warm-up (default: the recipe's, nvidia 8, goyal 5)."),
    ),
    mixed_precision=(
        bool,
        typer.Option(False, "--mixed-precision", help="float16 on GPUs, bfloat16 on CPUs (--precision mixed)."),
    ),
    precision=(
        Optional[str],
        typer.Option(
            None,
            "--precision",
            help="fp32, float16 (with loss scaling), bfloat16, mixed or auto (default: the GPU type's, as `bench`: float16 on GPUs, fp32 on CPUs; auto lets the trainer pick by compute capability).",
        ),
    ),
    fp32=(bool, typer.Option(False, "--fp32", help="No mixed precision, even on tensor-core GPUs (--precision fp32).")),
    allow_socket_transport=(
        bool,
        typer.Option(
            False, ALLOW_SOCKET, help="On an EFA type, train even when NCCL did not choose EFA (default: stop)."
        ),
    ),
    fp16_allreduce=(
        Optional[bool],
        typer.Option(
            None,
            "--fp16-allreduce/--no-fp16-allreduce",
            help="Compress gradients to float16 for the allreduce (default: on GPUs).",
        ),
    ),
    recipe=(
        Optional[str],
        typer.Option(
            None,
            "--recipe",
            help="nvidia (the default: NVIDIA DeepLearningExamples' TensorFlow ResNet-50 v1.5 scripts, resnet50v1.5/training/DGX1_RN50_AMP_90E.sh: lr 0.256 per 256 images, momentum 0.875, weight decay 3.0517578125e-05 on all but batch norm, 8 warm-up epochs, cosine decay, label smoothing 0.1, He fan_in, every batch-norm gamma 1, crops of 8-100% (its README); reported 77.0% top-1 after 90 epochs, its README's training accuracy results) or goyal (Goyal et al. 2017, arXiv:1706.02677: lr 0.1 per 256, momentum 0.9, weight decay 1e-4, 5 warm-up epochs, /10 at epochs 30, 60, 80 of 90, no label smoothing, last batch-norm gamma of each block 0; reported 76.3% top-1 at an 8k batch).",
        ),
    ),
    input=(
        Optional[str],
        typer.Option(
            None,
            "--input",
            help="Who decodes the JPEGs: auto (default: DALI on the GPUs when the CPUs measured before the run cannot feed them, else tf.data), tfdata (TensorFlow on the CPUs) or dali (NVIDIA DALI: on the GPUs, on its CPU backend where there are none).",
        ),
    ),
    eval_every=(
        Optional[int],
        typer.Option(
            None,
            "--eval-every",
            help="Also evaluate every N epochs during training (all processes, each validation image once).",
        ),
    ),
    fusion_threshold_mb=(
        float,
        typer.Option(
            64.0, "--fusion-threshold-mb", help="Horovod's tensor fusion buffer (HOROVOD_FUSION_THRESHOLD), MiB."
        ),
    ),
    cycle_time_ms=(float, typer.Option(1.0, "--cycle-time-ms", help="Horovod's cycle time (HOROVOD_CYCLE_TIME), ms.")),
    xla=(Optional[bool], typer.Option(None, "--xla/--no-xla", help="Compile the model with XLA (default: on GPUs).")),
    elastic=(
        bool,
        typer.Option(
            False,
            "--elastic",
            help="Elastic Horovod: a lost node is dropped and the run goes on at the new size; a node back (or new) joins at the next commit. The schedule stays in images.",
        ),
    ),
    min_np=(
        Optional[int],
        typer.Option(
            None,
            "--min-np",
            help="Elastic: fewest processes to go on with (default 1); fewer for --elastic-timeout stops the job.",
        ),
    ),
    max_np=(
        Optional[int],
        typer.Option(None, "--max-np", help="Elastic: most processes (default: the slots at launch)."),
    ),
    commit_every=(
        Optional[int],
        typer.Option(
            None,
            "--commit-every",
            help="Elastic: steps between commits of the state (default 50; a loss redoes at most these).",
        ),
    ),
    elastic_timeout=(
        Optional[int],
        typer.Option(
            None,
            "--elastic-timeout",
            help="Elastic: seconds to wait for --min-np processes' nodes before stopping (default 600).",
        ),
    ),
    trainer_arg=(
        List[str],
        typer.Option([], "--trainer-arg", help="One more argument for train_imagenet.py (repeatable)."),
    ),
)


@app.command()
@ssh_options(*LOGIN)
@option_group("flags", TRAIN_FLAGS, dict)
def train(
    hostsfile: Optional[str] = HOSTS,
    flags: dict[str, Any] = {},  # noqa: B006  # TRAIN_FLAGS in its place (option_group)
    np_: Optional[int] = typer.Option(None, "--np", help="Processes (default: every slot of the hosts)."),
    python: Optional[str] = typer.Option(None, "--python", help="Python on the nodes (default: the cluster's)."),
    wait: bool = typer.Option(False, "--wait", help="Follow the job to its end (exit status: the job's)."),
    force: bool = typer.Option(False, "--force", help="Stop a job still running first."),
    stop: bool = typer.Option(False, "--stop", help="Stop the training job everywhere, and start nothing."),
    no_verify_data: bool = typer.Option(
        False, "--no-verify-data", help="Skip the check that `clusterctl sync` verified the data on every node."
    ),
    checkpoint_to: Optional[str] = typer.Option(
        None,
        "--checkpoint-to",
        metavar="S3_URI",
        help="Also upload every checkpoint to s3://bucket/prefix (the nodes' instance profile; on AWS clusters clusterctl grants it write on that prefix only).",
    ),
    no_checkpoint_copy: bool = typer.Option(
        False, "--no-checkpoint-copy", help="Do not keep a copy of every checkpoint on the second node."
    ),
    cluster: Optional[str] = CLUSTER,
    ssh: Ssh = DEFAULT_SSH,
) -> None:
    """Start training on the leader, in tmux.

    Horovod over every slot, launched by horovodrun on the leader inside tmux; returns at once (--wait
    follows it). Refuses while a job runs (--force stops it first) or when the data is not verified on
    every node. Started again, the job resumes from the latest checkpoint in --model-dir."""
    from clusterctl.cli import display
    from clusterctl.workloads.train import run as train_run

    inv = _resolve_hosts(hostsfile, cluster, ssh)
    if stop:
        display.info(f"stopped {train_run.stop(inv, _store())} on every node")
        return
    started = train_run.start(
        inv,
        _store(),
        train_run.options(flags, checkpoint_to),
        np=np_,
        python=python,
        force=force,
        verify_data=not no_verify_data,
        checkpoint_copy=not no_checkpoint_copy,
        report=display.info,
    )
    display.info(started.line())
    display.info(started.estimate)
    if not wait:
        display.info("follow it: clusterctl logs -f; where it is: clusterctl status")
        return
    ended = train_run.follow(inv, started.job, _print_line)
    display.info(ended.cost)
    if ended.code != 0:
        raise typer.Exit(int(ExitCode.REMOTE_FAILED))


@app.command("eval")
def eval_(
    hostsfile: Optional[str] = HOSTS,
    cluster: Optional[str] = CLUSTER,
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show the evaluation's own output."),
    timeout: Optional[float] = typer.Option(None, "--timeout", help="Seconds the evaluation may take."),
) -> None:
    """Top-1/top-5 of the latest checkpoint.

    Evaluates the training job's latest checkpoint on the leader alone (GPUs hidden while it trains)."""
    from clusterctl.workloads.train import job as trainlib

    inv = _train_inventory(hostsfile, cluster)
    job = trainlib.require_job(_store(), inv)
    result = trainlib.evaluate(inv, job, on_line=_print_line if verbose else None, timeout=timeout)
    train_eval(result)


@app.command()
def tensorboard(
    hostsfile: Optional[str] = HOSTS,
    cluster: Optional[str] = CLUSTER,
    port: int = typer.Option(6006, "--port", help="Local port of the tunnel (127.0.0.1 only)."),
    remote_port: int = typer.Option(6006, "--remote-port", help="TensorBoard's port on the leader (127.0.0.1 only)."),
) -> None:
    """TensorBoard on the leader, via ssh tunnel.

    TensorBoard bound to the leader's 127.0.0.1 (never an open port), reached through an ssh tunnel to
    local --port; Ctrl-C ends both."""
    from clusterctl.cli import display
    from clusterctl.workloads.train import job as trainlib, tensorboard as train_tensorboard

    for flag, value in (("--port", port), ("--remote-port", remote_port)):
        within(flag, value, 1, 65535)
    inv = _train_inventory(hostsfile, cluster)
    job = trainlib.require_job(_store(), inv)
    with train_tensorboard.tensorboard_tunnel(inv, job, port, remote_port) as tunnel:
        display.info(f"TensorBoard of {job.job}: http://127.0.0.1:{port}/ (Ctrl-C to stop)")
        code = tunnel.wait()
        raise ClusterctlError(f"the ssh tunnel ended (exit {code})", "run `clusterctl tensorboard` again")


def _train_logs(hostsfile: str | None, cluster: str | None, follow: bool, connect_timeout: float) -> None:
    """`clusterctl logs` without a job name: the training job's log, from the leader."""
    from clusterctl.remote import jobfolder
    from clusterctl.workloads.train import job as trainlib

    inv = _train_inventory(hostsfile, cluster, connect_timeout)
    job = trainlib.require_job(_store(), inv)
    if follow:
        code = jobfolder.follow(trainlib.job_inventory(inv, job), job.job, _print_line)
        raise typer.Exit(0 if code == 0 else int(ExitCode.REMOTE_FAILED))
    text = trainlib.read_log(inv, job).text
    sys.stdout.write(text)


# ---- `eval`'s table, and the training job under `status` ---------------------------------------------------
def train_eval(result: EvalResult) -> None:
    """`clusterctl eval`: the recipe's evaluation line, top-1/top-5 in percent."""
    row = [
        str(result.step),
        f"{result.epoch:.1f}",
        f"{result.top1:.2f}%",
        f"{result.top5:.2f}%",
        f"{result.loss:.3f}",
        str(result.examples),
        _esc(result.checkpoint.rsplit("/", 1)[-1] or "-"),
        _esc(result.time or "-"),
    ]
    fitted_table(("STEP", "EPOCH", "TOP-1", "TOP-5", "LOSS", "IMAGES", "CHECKPOINT", "TIME (UTC)"), [row])


def train_status(job: TrainJob, st: TrainStatus, dollars_per_hour: float | None) -> None:
    """The training job under `status`: state, step, epoch, img/s, loss, elapsed, ETA and its cost."""

    c = console()
    c.print(
        f"[bold]training[/] {_esc(job.job)}: {st.state}"
        + (f" ({_esc(st.reason)})" if st.reason else "")
        + (f", restarted {st.restarts}x" if st.restarts else "")
    )
    if st.stop_step:
        c.print(
            f"  step {st.step}/{st.stop_step}  epoch {st.epoch:.2f}/{st.epochs:g}  "
            f"{'-' if st.img_per_sec is None else f'{st.img_per_sec:,.1f}'} img/s  "
            f"loss {'-' if st.loss is None else f'{st.loss:.4f}'}  lr {'-' if st.lr is None else f'{st.lr:.6f}'}  "
            f"{st.size} process(es)"
        )
    cost = None if dollars_per_hour is None else st.cost_to_finish(dollars_per_hour)
    c.print(
        f"  elapsed {duration(st.elapsed_s)} (all runs {duration(st.total_elapsed_s)})  "
        f"ETA {duration(st.eta_s)}  cost to finish {money(cost)}"
    )
    if st.resized:
        c.print(f"  elastic: {_esc(st.resized)}")
    if st.last_checkpoint is not None:
        c.print(f"  last checkpoint: step {st.last_checkpoint.step} ({_esc(st.last_checkpoint.path)})")
    if st.result is not None:
        r = st.result
        c.print(f"  evaluation: top-1 {r.top1:.2f}%  top-5 {r.top5:.2f}%  at step {r.step} ({r.examples} images)")
    elif st.validation is not None:
        v = st.validation
        c.print(
            f"  validation during training: top-1 {v.top1:.2f}%  top-5 {v.top5:.2f}%  at epoch {v.epoch:g} "
            f"(step {v.step}, {v.examples} images)"
        )
