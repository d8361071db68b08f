"""One training configuration per GPU type, used by `bench` and `train` alike (pure: no I/O).

What runs on a node: the model, its precision, the images per GPU per step, XLA, the gradients' compression
for the allreduce, and Horovod's fusion settings, chosen once from the table below by the GPU type (from the
instance type, or the GPU model DescribeInstanceTypes reported; CPU for local nodes). A user's flag overrides
one field; everything else stays the table's. A measured img/s is kept under `TrainConfig.key()`, so `train`
estimates from a rate of exactly the configuration it runs (train/cost.py), never another one.

The figures follow NVIDIA's ResNet-50 v1.5 reference for TensorFlow (github.com/NVIDIA/DeepLearningExamples,
TensorFlow/Classification/ConvNets/resnet50v1.5/README.md and its training/ scripts): automatic mixed
precision (float16 with dynamic loss scaling, on every GPU it publishes, A100 included) with XLA, 256 images per
GPU in mixed precision (DGX-1 V100 16 GB, DGX A100), 128 in FP32 on 16 GB. Types it publishes nothing for get
the row of the GPU with the same memory, and say so.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from clusterctl.workloads.train import options as train_options
from clusterctl.workloads.train.options import CYCLE_TIME_MS, FUSION_THRESHOLD_MB, TrainOptions

if TYPE_CHECKING:
    from clusterctl.types import Cluster

CPU = "CPU"
UNKNOWN = "unknown"  # a plain hosts file: nothing says what its nodes have


@dataclass(frozen=True)
class TrainConfig:
    """What a node runs per step; the same for `bench --synthetic` and `train`."""

    gpu: str  # V100 | T4 | A10G | L4 | A100 | H100 | CPU | unknown
    model: str = "resnet50"
    precision: str = "fp32"  # fp32 | float16 (always with loss scaling) | bfloat16 | auto (the trainer decides)
    batch_size: int = 32  # images per process (one process per GPU) per step
    xla: bool = False  # the model compiled with XLA (jit_compile)
    fp16_allreduce: bool = False  # gradients compressed to float16 for the allreduce (hvd.Compression.fp16)
    fp32_batch_size: int = 32  # the batch when --fp32 overrides the precision (twice the memory per image)
    image_size: int | None = None  # None: the model's own (224 for resnet50, 32 for tiny)
    fusion_threshold_mb: float = FUSION_THRESHOLD_MB
    cycle_time_ms: float = CYCLE_TIME_MS
    source: str = ""  # where the row's figures come from, shown beside the configuration

    def key(self) -> str:
        """What a measured rate is stored under: everything that changes the cost of an image."""
        size = self.image_size or (224 if self.model == "resnet50" else 32)
        return (
            f"{self.model} {size}px {self.precision} batch {self.batch_size} "
            f"xla {'on' if self.xla else 'off'} allreduce {'fp16' if self.fp16_allreduce else 'fp32'}"
        )

    def describe(self) -> str:
        return f"{self.gpu}: {self.key()}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpu": self.gpu,
            "model": self.model,
            "precision": self.precision,
            "batch_size": self.batch_size,
            "xla": self.xla,
            "fp16_allreduce": self.fp16_allreduce,
            "image_size": self.image_size,
            "key": self.key(),
        }


_NVIDIA = "NVIDIA DeepLearningExamples TensorFlow/Classification/ConvNets/resnet50v1.5 README"


# Tensor-core GPUs: float16 with loss scaling (NVIDIA's AMP is float16 on V100, T4 and A100 alike, so its
# published img/s are float16's; bfloat16 stays a flag away on A100/H100/A10G/L4), XLA on (the reference's
# --use_xla), gradients allreduced in float16 (Horovod's hvd.Compression.fp16, its synthetic benchmark's
# --fp16-allreduce: half the bytes on the wire; the loss-scaled gradients come from float16 activations,
# so their precision loses little, and they are unscaled after the allreduce).
def _gpu(gpu: str, batch: int, fp32_batch: int, source: str) -> TrainConfig:
    return TrainConfig(
        gpu,
        precision="float16",
        batch_size=batch,
        xla=True,
        fp16_allreduce=True,
        fp32_batch_size=fp32_batch,
        source=source,
    )


DEFAULTS: dict[str, TrainConfig] = {
    # DGX-1 (8x V100 16 GB): batch 256 per GPU in mixed precision, 128 in FP32 (DGX1_RN50_AMP_90E.sh).
    "V100": _gpu("V100", 256, 128, f"{_NVIDIA}: DGX-1 V100 16GB"),
    # T4 16 GB: V100 16 GB's memory, so the DGX-1 batch.
    "T4": _gpu("T4", 256, 128, f"{_NVIDIA}: as V100 16GB (same memory)"),
    # A10G and L4, 24 GB: no reference row; the 16 GB batch fits with room to spare.
    "A10G": _gpu("A10G", 256, 128, f"{_NVIDIA}: as V100 16GB (A10G has 24GB)"),
    "L4": _gpu("L4", 256, 128, f"{_NVIDIA}: as V100 16GB (L4 has 24GB)"),
    # DGX A100: batch 256 per GPU in mixed precision and in TF32 (DGXA100_RN50_AMP_90E.sh, _TF32_90E.sh).
    "A100": _gpu("A100", 256, 256, f"{_NVIDIA}: DGX A100"),
    # H100 80 GB: no TensorFlow row (the TF1 examples end at A100); A100 80 GB's batch.
    "H100": _gpu("H100", 256, 256, f"{_NVIDIA}: as A100 80GB"),
    # CPU (local nodes, rehearsals): float32 (float16 has no fast CPU kernels), no XLA (slow to compile there,
    # and Horovod's ops have no XLA kernels), batch 32 as Horovod's tensorflow2_synthetic_benchmark.py.
    CPU: TrainConfig(CPU, source="Horovod examples/tensorflow2/tensorflow2_synthetic_benchmark.py (batch 32)"),
    # A plain hosts file: the trainer picks float16 on tensor-core GPUs, else float32 (--precision auto), at
    # the batch it always had; nothing else is assumed of GPUs nobody named.
    UNKNOWN: TrainConfig(UNKNOWN, precision="auto", batch_size=64, fp32_batch_size=64, source="nothing known"),
}

_REPORTED = ("V100", "A100", "H100", "A10G", "T4", "L4")  # names as nvidia-smi or DescribeInstanceTypes say them


def gpu_type(reported: str) -> str:
    """The table's row for a GPU model as the nodes, EC2 or the provider name it ("Tesla V100-SXM2-16GB", "A10G",
    "H200"); UNKNOWN when no row matches."""
    name = (reported or "").upper()
    for gpu in _REPORTED:
        if gpu in name:
            return gpu
    if "H200" in name:  # H200 (141 GB): at least H100's memory, the same batch
        return "H100"
    return UNKNOWN


def gpu_type_of(cluster: Cluster | None) -> str:
    """A cluster's row: its provider's GPU model (AWS: EC2's name, else the family's); CPU for local nodes, CPU
    types and GPUs no row names; UNKNOWN without a cluster (a hosts file)."""
    if cluster is None:
        return UNKNOWN
    from clusterctl import providers

    impl = providers.of(cluster)
    if impl.shares_this_machine or impl.gpus_per_node(cluster) == 0:
        return CPU
    row = gpu_type(impl.gpu_model(cluster))
    return CPU if row == UNKNOWN else row


def choose(
    gpu: str,
    *,
    model: str | None = None,
    precision: str | None = None,
    batch_size: int | None = None,
    xla: bool | None = None,
    fp16_allreduce: bool | None = None,
    image_size: int | None = None,
) -> TrainConfig:
    """The table's row for `gpu` with the user's overrides (None: the row's). --fp32 (or --precision fp32)
    without a batch takes the row's FP32 batch; `mixed` means the row's 16-bit type on GPUs, bfloat16 on CPU;
    the float16 allreduce is the row's only with float16 (loss-scaled) training."""
    row = DEFAULTS.get(gpu, DEFAULTS[UNKNOWN])
    if precision == "mixed":
        precision = (
            "bfloat16" if gpu == CPU else (row.precision if row.precision in ("float16", "bfloat16") else "mixed")
        )
    precision = precision or row.precision
    if fp16_allreduce is None:
        # float16 on the wire only under loss scaling: without it (fp32, bfloat16) small gradients would
        # underflow float16's range (below 6e-8) and be lost; a flag still asks for it.
        fp16_allreduce = row.fp16_allreduce and precision == "float16"
    chosen = replace(
        row,
        model=model or row.model,
        precision=precision,
        xla=row.xla if xla is None else xla,
        fp16_allreduce=fp16_allreduce,
        image_size=image_size,
    )
    if batch_size is None:
        batch_size = row.fp32_batch_size if chosen.precision == "fp32" else row.batch_size
    return replace(chosen, batch_size=batch_size)


def for_train(opts: TrainOptions, cluster: Cluster | None) -> tuple[TrainOptions, TrainConfig]:
    """`train`'s options with every field the table decides filled in (idempotent: the result gives the same
    configuration again), and that configuration."""
    precision = opts.precision or ("mixed" if opts.mixed_precision else None)
    cfg = choose(
        gpu_type_of(cluster),
        model=opts.model,
        precision=precision,
        batch_size=opts.batch_size,
        xla=opts.xla,
        fp16_allreduce=opts.fp16_allreduce,
        image_size=opts.image_size,
    )
    filled = replace(
        opts,
        precision=cfg.precision,
        mixed_precision=False,  # said by precision now
        batch_size=cfg.batch_size,
        xla=cfg.xla,
        fp16_allreduce=cfg.fp16_allreduce,
        fusion_threshold_mb=cfg.fusion_threshold_mb if opts.fusion_threshold_mb is None else opts.fusion_threshold_mb,
        cycle_time_ms=cfg.cycle_time_ms if opts.cycle_time_ms is None else opts.cycle_time_ms,
    )
    return filled, cfg


def horovod_env(config: TrainConfig) -> dict[str, str]:
    """Horovod's fusion buffer and cycle time for every rank, as `train` sets them (train_options.horovod_env)."""
    return train_options.horovod_env(
        TrainOptions(fusion_threshold_mb=config.fusion_threshold_mb, cycle_time_ms=config.cycle_time_ms)
    )


# TensorFlow's GPU settings of NVIDIA's reference (DeepLearningExamples TensorFlow/Classification/ConvNets
# runtime/runner.py sets these for every run): the GPU's kernel launches on their own threads, cuDNN's
# persistent batch-norm kernels, and the cuDNN algorithm chosen after two trials.
GPU_ENV = {
    "TF_GPU_THREAD_MODE": "gpu_private",
    "TF_GPU_THREAD_COUNT": "2",
    "TF_USE_CUDNN_BATCHNORM_SPATIAL_PERSISTENT": "1",
    "TF_AUTOTUNE_THRESHOLD": "2",
}


def gpu_env(config: TrainConfig) -> dict[str, str]:
    """GPU_ENV on the GPU types of the table; nothing on CPUs and unknown nodes."""
    return dict(GPU_ENV) if config.gpu not in (CPU, UNKNOWN) else {}
