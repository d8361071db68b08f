"""Can a node's CPU cores feed its GPUs? The arithmetic, pure: the input pipeline's measured rate on one core
(node/input_rate.py: JPEG decode, crop, resize, flip as the trainer does them) times the node's vCPUs,
against what its GPUs consume at the speed NVIDIA publishes for ResNet-50 v1.5. `train` says so in one line
before a GPU run whose cores cannot keep up; bench/input_pipeline.py prints the table for every type.
"""

from __future__ import annotations

from dataclasses import dataclass

# Training img/s of ONE GPU, ResNet-50 v1.5 in TensorFlow, mixed precision with XLA at NVIDIA's per-GPU batch
# (256), rounded: NVIDIA DeepLearningExamples, TensorFlow/Classification/ConvNets/resnet50v1.5/README.md,
# "Training performance results" (1-GPU rows). GPUs that README has no row for carry an estimate, named as one.
_README = "NVIDIA DeepLearningExamples TensorFlow resnet50v1.5 README, training performance, 1 GPU, AMP + XLA"


@dataclass(frozen=True)
class Expected:
    per_gpu: float  # img/s one GPU trains at
    source: str


EXPECTED: dict[str, Expected] = {
    # Training performance, 1 GPU, mixed precision + XLA, batch 256 (TensorFlow 20.06 NGC container).
    "V100": Expected(1270.0, f"{_README} (DGX-1 V100 16GB, 1 GPU, AMP + XLA)"),
    "A100": Expected(2375.0, f"{_README} (DGX A100 40GB, 1 GPU, AMP + XLA)"),
    # No README row: estimates until measured (docs/REAL_HARDWARE.md has the command that measures them).
    "T4": Expected(500.0, "estimate (no README training row): about 40% of a V100"),
    "A10G": Expected(800.0, "estimate (no README row): between T4 and A100"),
    "L4": Expected(800.0, "estimate (no README row): between T4 and A100"),
    "H100": Expected(5000.0, "estimate (no README row): twice A100"),
}

# What to do when the cores fall short, said once for `train` and the bench table.
ADVICE = (
    "make the records from smaller images (`clusterctl data tfrecords SRC DST --resize 256`), lighten the "
    "augmentation, or pick a type with more vCPUs per GPU (bench/input_pipeline.py shows the rates)"
)


@dataclass(frozen=True)
class Feed:
    """One node: its cores' decoded images per second against what its GPUs consume."""

    vcpus: int
    per_core: float  # img/s one core decodes and augments
    gpus: int
    gpu: str  # "V100", ...
    per_gpu: float  # img/s one GPU trains at

    @property
    def supply(self) -> float:
        return self.vcpus * self.per_core

    @property
    def demand(self) -> float:
        return self.gpus * self.per_gpu

    @property
    def ratio(self) -> float:
        """Supply over demand: below 1 the GPUs wait for images (they run at most at this fraction)."""
        return self.supply / self.demand if self.demand else float("inf")

    @property
    def starves(self) -> bool:
        return self.ratio < 1.0

    def figures(self) -> str:
        return (
            f"{self.vcpus} vCPUs x {self.per_core:,.0f} img/s per core = {self.supply:,.0f} img/s decoded, "
            f"{self.gpus} {self.gpu} x {self.per_gpu:,.0f} img/s = {self.demand:,.0f} img/s needed"
        )


def gpu_to_feed(gpus: int, gpu: str, precision: str, data: str | None) -> str:
    """The GPU (train_config's type of the nodes) whose rate `train` checks the cores against before a run, or
    "" when there is nothing to check: no GPUs (local nodes, CPU types, a plain hosts file), synthetic images
    (nothing decoded), a GPU without an expected rate, or float32 (the rates are mixed precision's)."""
    if gpus <= 0 or not data or precision == "fp32":
        return ""
    return gpu if gpu in EXPECTED else ""


def feed(vcpus: int, per_core: float, gpus: int, gpu: str) -> Feed | None:
    """The node's Feed, or None when its GPU has no expected rate (a CPU node, an unknown GPU)."""
    expected = EXPECTED.get(gpu)
    if expected is None or gpus <= 0 or vcpus <= 0 or per_core <= 0:
        return None
    return Feed(vcpus, per_core, gpus, gpu, expected.per_gpu)


def warning(f: Feed) -> str | None:
    """`train`'s one line when the cores cannot feed the GPUs; None when they can."""
    if not f.starves:
        return None
    return (
        f"the input pipeline cannot feed the GPUs: {f.figures()} (NVIDIA's ResNet-50 v1.5 rate, "
        f"{EXPECTED[f.gpu].source}); they would run at most at {f.ratio:.0%} of their speed: {ADVICE}"
    )


@dataclass(frozen=True)
class InputChoice:
    """Who decodes the JPEGs in a run (the trainer's --input) and why, said in one line at start."""

    input: str  # tfdata | dali
    why: str

    def line(self) -> str:
        return f"input: {'DALI' if self.input == 'dali' else 'tf.data'} ({self.why})"


def choose_input(
    asked: str | None, f: Feed | None, gpus: int, data: str | None, dali_installed: bool = True
) -> InputChoice:
    """`--input auto` (None too): DALI when the nodes have GPUs and their CPUs' measured feed is below what
    the GPUs consume (DALI decodes on the GPUs then), else tf.data; tfdata and dali stand as given.
    dali_installed: the nodes run clusterctl's runtime (a GPU one carries DALI), not a Python of their own."""
    if asked in ("tfdata", "dali"):
        on = "on the GPUs" if gpus > 0 else "on DALI's CPU backend: the nodes have no GPUs"
        return InputChoice(asked, f"--input {asked}" + (f", decoding {on}" if asked == "dali" else ""))
    if not data:
        return InputChoice("tfdata", "synthetic images: nothing to decode")
    if gpus <= 0:
        return InputChoice("tfdata", "auto: no GPUs to decode on")
    if f is None:
        return InputChoice("tfdata", "auto: the CPUs' feed was not measured")
    rates = f"{f.supply:,.0f} img/s from the CPUs for {f.demand:,.0f} needed"
    if f.starves and not dali_installed:
        return InputChoice(
            "tfdata", f"auto: {rates}; DALI would decode on the GPUs, but the nodes' own Python has none"
        )
    if f.starves:
        return InputChoice("dali", f"auto: {rates}; DALI decodes on the GPUs")
    return InputChoice("tfdata", f"auto: {rates}")


def parse_probe(text: str) -> tuple[float, int] | None:
    """node/input_rate.py's line `input-rate per_core=R cpus=N images=M` -> (R, N); None without one."""
    for line in text.splitlines():
        if line.startswith("input-rate "):
            fields = dict(kv.split("=", 1) for kv in line.split()[1:] if "=" in kv)
            try:
                return float(fields["per_core"]), int(fields["cpus"])
            except (KeyError, ValueError):
                return None
    return None
