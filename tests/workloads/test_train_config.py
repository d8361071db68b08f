"""train/config.py: one configuration per GPU type, the same for `bench` and `train`, the user's flags over it."""

from __future__ import annotations

import pytest

from clusterctl.types import Cluster, Node
from clusterctl.workloads.bench import ladder as bench
from clusterctl.workloads.train import config as tc, options as train_options
from clusterctl.workloads.train.options import TrainOptions


def _aws(instance_type: str, **extra: str) -> Cluster:
    return Cluster("c", "aws", (Node("n0", "10.0.0.1", 8, "leader"),), "us-east-1", instance_type, extra=extra)


@pytest.mark.parametrize(
    "instance_type, extra, gpu",
    [
        ("p3.16xlarge", {}, "V100"),  # the family's GPU, as the AWS provider settles it (catalog.gpu_model_of)
        ("p3dn.24xlarge", {}, "V100"),
        ("g4dn.12xlarge", {}, "T4"),
        ("g5.48xlarge", {}, "A10G"),
        ("g6.12xlarge", {}, "L4"),
        ("p4d.24xlarge", {}, "A100"),
        ("p4de.24xlarge", {}, "A100"),
        ("p5.48xlarge", {}, "H100"),
        ("c5.xlarge", {}, "CPU"),
        ("x9.big", {"gpus": "4", "gpu_model": "A10G"}, "A10G"),  # as DescribeInstanceTypes names it
    ],
)
def test_the_gpu_type_comes_from_the_reported_model_or_the_instance_family(instance_type, extra, gpu):
    assert tc.gpu_type_of(_aws(instance_type, **extra)) == gpu


@pytest.mark.parametrize(
    "reported, gpu",
    [("Tesla V100-SXM2-16GB", "V100"), ("NVIDIA A100-SXM4-40GB", "A100"), ("A10G", "A10G"), ("H200", "H100")],
)
def test_a_reported_model_names_its_row(reported, gpu):  # as nvidia-smi or EC2 say it
    assert tc.gpu_type(reported) == gpu
    assert tc.gpu_type("") == tc.UNKNOWN


def test_a_cluster_s_row():
    assert tc.gpu_type_of(None) == tc.UNKNOWN  # a plain hosts file
    assert tc.gpu_type_of(Cluster("l", "local", ())) == tc.CPU
    assert tc.gpu_type_of(_aws("p3.16xlarge", gpus="8")) == "V100"
    assert tc.gpu_type_of(_aws("p4d.24xlarge", gpus="8", gpu_model="A100")) == "A100"
    assert tc.gpu_type_of(_aws("m5.large", gpus="0")) == tc.CPU


def test_the_table_is_fast_on_every_gpu_and_plain_on_cpus():
    for gpu in ("V100", "T4", "A10G", "L4", "A100", "H100"):
        row = tc.DEFAULTS[gpu]
        assert (row.model, row.precision, row.xla, row.fp16_allreduce) == ("resnet50", "float16", True, True), gpu
        assert row.batch_size == 256 and row.source.startswith("NVIDIA DeepLearningExamples"), gpu
        assert tc.gpu_env(row)["TF_GPU_THREAD_MODE"] == "gpu_private"
    assert tc.DEFAULTS["V100"].fp32_batch_size == 128 and tc.DEFAULTS["A100"].fp32_batch_size == 256
    cpu = tc.DEFAULTS[tc.CPU]
    assert (cpu.precision, cpu.batch_size, cpu.xla, cpu.fp16_allreduce) == ("fp32", 32, False, False)
    assert tc.gpu_env(cpu) == {}
    assert tc.horovod_env(cpu) == train_options.horovod_env(TrainOptions())


def test_flags_override_one_field_each():
    assert tc.choose("V100", precision="fp32").batch_size == 128  # --fp32 alone: NVIDIA's FP32 batch
    assert tc.choose("V100", precision="fp32", batch_size=96).batch_size == 96
    assert tc.choose("A100", precision="bfloat16").batch_size == 256
    # the float16 allreduce comes with float16's loss scaling only; asked for, it is had with any precision
    assert (
        not tc.choose("A100", precision="bfloat16").fp16_allreduce
        and not tc.choose("V100", precision="fp32").fp16_allreduce
    )
    assert tc.choose("A100", precision="bfloat16", fp16_allreduce=True).fp16_allreduce
    assert tc.choose("V100", precision="mixed").precision == "float16"
    assert tc.choose(tc.CPU, precision="mixed").precision == "bfloat16"
    off = tc.choose("H100", xla=False, fp16_allreduce=False)
    assert (off.xla, off.fp16_allreduce, off.precision, off.batch_size) == (False, False, "float16", 256)
    assert tc.choose("T4", model="tiny").key() == "tiny 32px float16 batch 256 xla on allreduce fp16"
    assert tc.choose("T4", image_size=160).key() != tc.choose("T4").key()


def test_bench_and_train_run_one_configuration():
    """No flags: the same configuration from both commands, on every kind of cluster; so a rate `bench`
    stored is the one `train` finds (and a flag on one side makes another key)."""
    for cluster in (_aws("p3.16xlarge", gpus="8"), _aws("g5.48xlarge"), Cluster("l", "local", ()), None):
        b = bench.BenchOptions().config(cluster)
        filled, t = tc.for_train(TrainOptions(synthetic=True), cluster)
        assert b == t and b.key() == t.key()
        assert tc.for_train(filled, cluster) == (filled, t)  # idempotent: the launched options give it again
    v100 = _aws("p3.16xlarge", gpus="8")
    filled, cfg = tc.for_train(TrainOptions(synthetic=True, precision="fp32", xla=False), v100)
    assert (filled.precision, filled.batch_size, filled.xla, filled.fp16_allreduce) == ("fp32", 128, False, False)
    assert bench.BenchOptions(precision="fp32", xla=False).config(v100) == cfg
    assert bench.BenchOptions(mixed_precision=True).config(Cluster("l", "local", ())).precision == "bfloat16"


def test_the_launched_argv_carries_the_configuration():
    v100 = _aws("p3.16xlarge", gpus="8")
    filled, _ = tc.for_train(TrainOptions(synthetic=True), v100)
    argv = train_options.trainer_argv("python3", "t.py", filled)
    assert argv[argv.index("--precision") + 1] == "float16" and argv[argv.index("--batch-size") + 1] == "256"
    assert "--xla" in argv and "--fp16-allreduce" in argv
    cpu, _ = tc.for_train(TrainOptions(synthetic=True), Cluster("l", "local", ()))
    argv = train_options.trainer_argv("python3", "t.py", cpu)
    assert argv[argv.index("--precision") + 1] == "fp32" and argv[argv.index("--batch-size") + 1] == "32"
    assert "--xla" not in argv and "--fp16-allreduce" not in argv
    args = bench.BenchOptions().resolved(v100).script_args(8)
    assert args[args.index("--precision") + 1] == "float16" and args[args.index("--batch-size") + 1] == "256"
    assert "--xla" in args and "--fp16-allreduce" in args


def test_bench_precision_flags_agree_or_fail_with_one_line():
    from clusterctl.errors import UsageError
    from clusterctl.workloads.train.run import precision_of as _precision  # train's and bench's alike

    assert _precision(None, False, False) is None  # the GPU type's
    assert _precision(None, True, False) == "fp32" and _precision("fp32", True, False) == "fp32"
    assert _precision(None, False, True) == "mixed" and _precision("bfloat16", False, False) == "bfloat16"
    for args, message in (
        (("float16", True, False), "--fp32 and --precision float16 say different things"),
        (("float16", False, True), "--mixed-precision and --precision/--fp32 say different things"),
    ):
        with pytest.raises(UsageError, match=message):
            _precision(*args)
    from clusterctl.workloads.bench.ladder import BenchOptions

    with pytest.raises(UsageError, match="unknown precision 'fp8'"):  # the CLI and a playbook's bench step alike
        BenchOptions(model="tiny", precision="fp8")
