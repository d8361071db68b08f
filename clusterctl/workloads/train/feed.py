"""Can a node's CPUs feed its GPUs? The arithmetic, pure. Supply is what the trainer's own input pipeline delivered
on the node with every rank's pipeline running at once (node/input_rate.py: all hardware threads busy, as in
training), or for a type not measured, its physical cores times a per-core rate measured that way; demand is its
GPUs at the speed NVIDIA publishes for ResNet-50 v1.5. `train` prints one line before a run with real records
(`input: tf.data on 32 cores, 14,200 img/s for 10,160 needed`) and warns when supply is short;
bench/input_pipeline.py prints the table for every type.

The input path is named in every line (`tf.data`: the CPU pipeline, the only one measured here); a second path
(GPU decoding) fits in as another name for Probe.path and INPUT_PATHS.
"""

from __future__ import annotations

from dataclasses import dataclass

# Training img/s of ONE GPU, ResNet-50 v1.5 in TensorFlow, mixed precision with XLA at NVIDIA's per-GPU batch
# (256), rounded: NVIDIA DeepLearningExamples, TensorFlow/Classification/ConvNets/resnet50v1.5/README.md,
# "Training performance results" (1-GPU rows). GPUs that README has no row for carry an estimate, named as one.
_README = "NVIDIA DeepLearningExamples TensorFlow resnet50v1.5 README, training performance, 1 GPU, AMP + XLA"

TFDATA = "tf.data"  # the trainer's CPU pipeline (node/train/data.py)
INPUT_PATHS = (TFDATA,)


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
    "augmentation, or pick a type with more cores per GPU (bench/input_pipeline.py shows the rates)"
)


@dataclass(frozen=True)
class Probe:
    """node/input_rate.py's line: what the pipelines of `ranks` ranks delivered together on a node."""

    images_per_sec: float  # all ranks together
    ranks: int
    threads: int  # input threads per rank (as training gives each)
    cores: int  # physical cores of the node
    cpus: int  # logical CPUs (hardware threads)
    path: str = TFDATA

    @property
    def per_core(self) -> float:
        """Per physical core, with both hardware threads busy: what scales to another type's cores."""
        return self.images_per_sec / max(1, self.cores)


@dataclass(frozen=True)
class Feed:
    """One node: the images its input pipeline delivers against what its GPUs consume."""

    cores: int  # physical cores
    supply: float  # img/s decoded and augmented, every rank's pipeline at once
    gpus: int
    gpu: str  # "V100", ...
    per_gpu: float  # img/s one GPU trains at
    path: str = TFDATA

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
            f"{self.path} on {_cores(self.cores)}, {self.supply:,.0f} img/s for {self.demand:,.0f} needed "
            f"({self.gpus} {self.gpu} x {self.per_gpu:,.0f} img/s)"
        )


def gpu_to_feed(gpus: int, gpu: str, precision: str, data: str | None) -> str:
    """The GPU (train/config.py's type of the nodes) whose rate `train` checks the feed against, or "" when there is
    no rate to judge by: no GPUs (local nodes, CPU types, a plain hosts file), synthetic images (nothing
    decoded), a GPU without an expected rate, or float32 (the rates are mixed precision's)."""
    if gpus <= 0 or not data or precision == "fp32":
        return ""
    return gpu if gpu in EXPECTED else ""


def feed(cores: int, supply: float, gpus: int, gpu: str, path: str = TFDATA) -> Feed | None:
    """The node's Feed, or None when its GPU has no expected rate (a CPU node, an unknown GPU)."""
    expected = EXPECTED.get(gpu)
    if expected is None or gpus <= 0 or cores <= 0 or supply <= 0:
        return None
    return Feed(cores, supply, gpus, gpu, expected.per_gpu, path)


def _cores(n: int) -> str:
    return f"{n} core" if n == 1 else f"{n} cores"


def input_line(probe: Probe, f: Feed | None) -> str:
    """`train`'s line at start: `input: tf.data on 32 cores, 14,200 img/s for 10,160 needed`; with no GPU rate
    to judge by (CPU nodes, fp32, an unknown GPU) what was measured, and why nothing is compared."""
    if f is not None:
        return f"input: {f.path} on {_cores(f.cores)}, {f.supply:,.0f} img/s for {f.demand:,.0f} needed"
    return (
        f"input: {probe.path} on {_cores(probe.cores)}, {probe.images_per_sec:,.0f} img/s "
        f"({probe.ranks} rank(s) here; no GPU rate to compare with)"
    )


def warning(f: Feed) -> str | None:
    """`train`'s line when the pipeline cannot feed the GPUs; None when it can."""
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


def parse_probe(text: str) -> Probe | None:
    """node/input_rate.py's line `input-rate images_per_sec=R ranks=N threads=T cores=C cpus=L ...`; None
    without one."""
    for line in text.splitlines():
        if line.startswith("input-rate "):
            fields = dict(kv.split("=", 1) for kv in line.split()[1:] if "=" in kv)
            try:
                return Probe(
                    float(fields["images_per_sec"]),
                    int(fields["ranks"]),
                    int(fields["threads"]),
                    int(fields["cores"]),
                    int(fields["cpus"]),
                    fields.get("path", TFDATA),
                )
            except (KeyError, ValueError):
                return None
    return None
