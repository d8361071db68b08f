"""The networks the trainer and the benchmark (node/bench.py) build, written once, the device each rank computes
on (pin_device) and the device report both print.

ResNet-50 v1.5, as the references define it:
- torchvision's models/resnet.py (its Bottleneck "places the stride for downsampling at 3x3 convolution
  (self.conv2) while original implementation places the stride at the first 1x1 convolution ... also known as
  ResNet V1.5"), NVIDIA DeepLearningExamples' TensorFlow/Classification/ConvNets resnet50v1.5 and TF Model
  Garden's official/legacy/image_classification/resnet/resnet_model.py (`conv_block`: the stride on the 3x3
  conv '2b', use_bias=False);
- no conv biases (a batch norm follows every conv);
- conv kernels He-normal, truncated as NVIDIA's (`variance_scaling_initializer(scale=2.0,
  distribution='truncated_normal', mode=weight_init)`; Keras rescales a truncated normal so the variance is
  still 2 / fan), on the recipe's fan (options.RECIPE_MODEL): fan_in, variance 2 / (in channels x kh x kw),
  under --recipe nvidia (its training scripts pass `--weight_init=fan_in`); fan_out under --recipe goyal
  (torchvision's `kaiming_normal_(mode="fan_out", nonlinearity="relu")`);
- batch norm momentum 0.9, epsilon 1e-5 (torchvision's momentum 0.1 in PyTorch's convention, eps 1e-5;
  Model Garden's BATCH_NORM_DECAY 0.9, BATCH_NORM_EPSILON 1e-5);
- every gamma 1 under nvidia (its model/resnet.py's batch-norm gamma initializer 1.0); under goyal gamma 0 in
  the last batch norm of every residual block, so each block starts as the identity (Goyal et al. 2017,
  "Accurate, Large Minibatch SGD"; torchvision's zero_init_residual);
- the classifier's bias zero, its kernel He-normal on fan_in under nvidia (its dense layer takes the same
  initializer as the convs), N(0, 0.01) under goyal (Model Garden's resnet_model.py: RandomNormal(stddev=0.01));
- padding as torchvision's: symmetric (k - 1) / 2 before every strided conv, 1 before the 3x3/2 max pool.
25,557,032 trainable parameters at 1,000 classes (torchvision's count: it counts no batch-norm moving
statistics), of which the classifier is 2,049 per class. Keras' tf.keras.applications.ResNet50 is v1 (the
stride on the first 1x1 conv, conv biases, momentum 0.99): not this.

Stdlib only at import: TensorFlow is passed in (`tf`), as the programs import it after their argument checks.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from typing import Any

from clusterctl.node.train.options import DEFAULT_RECIPE, RECIPE_MODEL, ModelRecipe

BN_MOMENTUM = 0.9
BN_EPSILON = 1e-5
# (bottleneck width, blocks, stride of the stage's first block): ResNet-50's 3, 4, 6, 3 blocks
RESNET50_STAGES = ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2))
EXPANSION = 4  # a bottleneck's output is 4x its width
NAMES = {"resnet50": "resnet50 v1.5", "tiny": "tiny"}


def input_shape(name: str, image_size: int | None = None) -> tuple[int, int, int]:
    side = image_size or (224 if name == "resnet50" else 32)
    return side, side, 3


def build_model(tf: Any, name: str, size: int, classes: int, recipe: str = DEFAULT_RECIPE) -> Any:
    """Logits out (softmax inside the loss, so mixed precision keeps the loss in float32), initialised as
    `recipe` (options.RECIPE_MODEL) says."""
    if name == "resnet50":
        return resnet50_v15(tf, input_shape(name, size), classes, RECIPE_MODEL[recipe])
    if name == "tiny":
        return tiny(tf, input_shape(name, size), classes)
    raise ValueError(f"unknown model {name!r}: resnet50 or tiny")


def parameters(model: Any) -> int:
    """Trainable parameters, as torchvision and the papers count them (no batch-norm moving statistics)."""
    return int(sum(int(w.shape.num_elements()) for w in model.trainable_weights))


def describe(name: str, model: Any) -> str:
    """The line both programs print at start, e.g. `model resnet50 v1.5: 25,557,032 parameters`."""
    return f"model {NAMES.get(name, name)}: {parameters(model):,} parameters"


def zero_gamma_layers(tf: Any, model: Any) -> int:
    """Batch norms whose gamma is all zero (ResNet-50 v1.5 under goyal: the last of each of its 16 blocks)."""
    return sum(
        1
        for layer in model.layers
        if isinstance(layer, tf.keras.layers.BatchNormalization)
        and layer.gamma is not None
        and not bool(tf.reduce_any(tf.not_equal(layer.gamma, 0)))
    )


def decayed_variables(tf: Any, model: Any, recipe: str) -> list[Any]:
    """The variables weight decay applies to: every trainable one but batch norm's (nvidia), or the conv and
    dense kernels alone (goyal)."""
    if not RECIPE_MODEL[recipe].decay_all_but_bn:
        return [v for v in model.trainable_variables if "kernel" in v.name]
    bn = {
        v.ref()
        for layer in model.layers
        if isinstance(layer, tf.keras.layers.BatchNormalization)
        for v in layer.trainable_variables
    }
    return [v for v in model.trainable_variables if v.ref() not in bn]


def resnet50_v15(tf: Any, shape: tuple[int, int, int], classes: int, init: ModelRecipe) -> Any:
    layers = tf.keras.layers

    def he(scale: float = 2.0) -> Any:
        # one instance per layer: Keras 2.15's unseeded initializers repeat their values when reused
        return tf.keras.initializers.VarianceScaling(scale=scale, mode=init.fan, distribution="truncated_normal")

    def conv(x: Any, filters: int, kernel: int, stride: int, name: str) -> Any:
        if stride > 1 and kernel > 1:  # torchvision's symmetric padding (TF's 'same' pads more at the end)
            x = layers.ZeroPadding2D((kernel - 1) // 2, name=name + "_pad")(x)
        return layers.Conv2D(
            filters,
            kernel,
            strides=stride,
            padding="valid" if stride > 1 else "same",
            use_bias=False,
            kernel_initializer=he(),
            name=name,
        )(x)

    def bn(x: Any, name: str, zero_gamma: bool = False) -> Any:
        return layers.BatchNormalization(
            momentum=BN_MOMENTUM, epsilon=BN_EPSILON, gamma_initializer="zeros" if zero_gamma else "ones", name=name
        )(x)

    def bottleneck(x: Any, width: int, stride: int, name: str, project: bool) -> Any:
        shortcut = x
        if project:  # the first block of a stage: 1x1 conv (with the stage's stride) to 4x width
            shortcut = bn(conv(x, width * EXPANSION, 1, stride, name + "_0_conv"), name + "_0_bn")
        y = layers.ReLU(name=name + "_1_relu")(bn(conv(x, width, 1, 1, name + "_1_conv"), name + "_1_bn"))
        y = layers.ReLU(name=name + "_2_relu")(bn(conv(y, width, 3, stride, name + "_2_conv"), name + "_2_bn"))
        y = bn(conv(y, width * EXPANSION, 1, 1, name + "_3_conv"), name + "_3_bn", zero_gamma=init.zero_last_gamma)
        return layers.ReLU(name=name + "_out")(layers.Add(name=name + "_add")([shortcut, y]))

    inputs = layers.Input(shape)
    x = layers.ReLU(name="conv1_relu")(bn(conv(inputs, 64, 7, 2, "conv1_conv"), "conv1_bn"))
    x = layers.ZeroPadding2D(1, name="pool1_pad")(x)  # after a ReLU: zeros pad as -inf would
    x = layers.MaxPooling2D(3, strides=2, name="pool1_pool")(x)
    for stage, (width, blocks, stride) in enumerate(RESNET50_STAGES, start=2):
        for b in range(blocks):
            x = bottleneck(x, width, stride if b == 0 else 1, f"conv{stage}_block{b + 1}", project=b == 0)
    x = layers.GlobalAveragePooling2D(name="avg_pool")(x)
    x = layers.Dense(
        classes,
        kernel_initializer=he() if init.he_classifier else tf.keras.initializers.RandomNormal(stddev=0.01),
        bias_initializer="zeros",
        name="predictions",
    )(x)
    return tf.keras.Model(inputs, x, name="resnet50_v1_5")


def tiny(tf: Any, shape: tuple[int, int, int], classes: int) -> Any:
    """Two convs and a classifier: for tests and smoke runs on CPUs."""
    layers = tf.keras.layers
    return tf.keras.Sequential(
        [
            layers.Input(shape),
            layers.Conv2D(16, 3, padding="same", use_bias=False),
            layers.BatchNormalization(),
            layers.ReLU(),
            layers.MaxPooling2D(),
            layers.Conv2D(32, 3, padding="same", use_bias=False),
            layers.BatchNormalization(),
            layers.ReLU(),
            layers.GlobalAveragePooling2D(),
            layers.Dense(classes),
        ],
        name="tiny",
    )


def choose_precision(requested: str, gpu_capabilities: list[Any]) -> str:
    """The Keras policy: float32, mixed_float16 or mixed_bfloat16. auto is mixed_float16 on GPUs with
    tensor cores (compute capability 7.0 and up: V100 and later), float32 elsewhere."""
    if requested == "fp32":
        return "float32"
    if requested == "float16":
        return "mixed_float16"
    if requested == "bfloat16":
        return "mixed_bfloat16"
    if requested == "mixed":
        return "mixed_float16" if gpu_capabilities else "mixed_bfloat16"
    if gpu_capabilities and all(c is not None and tuple(c) >= (7, 0) for c in gpu_capabilities):
        return "mixed_float16"
    return "float32"


def input_threads(cpus: int | None, local_size: int) -> int:
    """The input pipeline's threads for one process: the node's CPUs shared by its processes."""
    return max(1, (cpus or 1) // max(1, local_size))


def pin_device(tf: Any, hvd: Any, hide_gpus: bool = False) -> tuple[list[Any], list[Any], int]:
    """One GPU per process (local rank k gets GPU k, its memory grown as needed so co-tenants on a GPU don't
    OOM), or on CPUs the host's cores shared between its processes instead of oversubscribed. Returns this
    process's GPUs ([] on the CPU), their compute capabilities, and its share of the host's cores (the
    input pipeline's threads). hide_gpus: the CPU even where there are GPUs."""
    gpus = tf.config.list_physical_devices("GPU")
    if hide_gpus and gpus:
        tf.config.set_visible_devices([], "GPU")
        gpus = []
    capabilities: list[Any] = []
    threads = input_threads(os.cpu_count(), hvd.local_size())
    if gpus:
        gpu = gpus[hvd.local_rank() % len(gpus)]
        tf.config.experimental.set_memory_growth(gpu, True)
        tf.config.set_visible_devices(gpu, "GPU")
        try:
            capabilities = [tf.config.experimental.get_device_details(gpu).get("compute_capability")]
        except (ValueError, RuntimeError):
            capabilities = [None]
    else:
        try:
            tf.config.threading.set_intra_op_parallelism_threads(threads)
            tf.config.threading.set_inter_op_parallelism_threads(threads)
        except RuntimeError:
            pass  # TF already initialised its runtime; its defaults still work
    return gpus, capabilities, threads


def device_report(tf: Any) -> tuple[str, int]:
    """The GPUs this process computes on, as its node numbers them (CUDA_VISIBLE_DEVICES mapped back), and
    how many GPU devices TensorFlow made: ("none", 0) when it runs on the CPU. clusterctl checks these
    against the node's slots: a GPU node's rank on the CPU, or two ranks on one GPU, fail the run."""
    logical = len(tf.config.list_logical_devices("GPU"))
    if not logical:
        return "none", 0
    order = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    ids = []
    for dev in tf.config.get_visible_devices("GPU"):
        i = int(dev.name.rsplit(":", 1)[1])
        ids.append(order[i] if i < len(order) else str(i))
    return ",".join(ids) or "none", logical


def report_devices(tf: Any, hvd: Any, emit: Callable[..., None]) -> None:
    """Every rank's device_report, gathered: rank 0 emits one `device` line per rank. A collective: every rank
    calls it (after pin_device: it starts TensorFlow's runtime)."""
    gpu_ids, logical = device_report(tf)
    devices = hvd.allgather_object((hvd.rank(), socket.gethostname(), hvd.local_rank(), gpu_ids, logical))
    if hvd.rank() == 0:
        for r, host, lrank, ids, n in devices:
            emit("device", rank=r, host=host, local_rank=lrank, gpus=ids, logical=n)
