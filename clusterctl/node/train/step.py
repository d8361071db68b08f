"""The training step, one copy for the trainer (main.py, elastic.py), the synthetic benchmark (node/bench.py)
and the overlap probe (node/overlap.py): the optimizer, the loss, and forward -> loss scaling -> gradients ->
Horovod's allreduce -> update.

Why the model is compiled in segments under XLA: `tf.function(model, jit_compile=True)` makes the model one
XLA op, and its gradient one op too (a `_XlaMustCompile` PartitionedCall whose 161 outputs, for ResNet-50,
all exist only when the whole backward pass is done), so Horovod gets every gradient at once, after the
backward pass, and the allreduce has no compute left to hide behind. Here the model is cut where one tensor
alone crosses from one layer to the rest (for ResNet-50: after the stem's conv, after its batch norm and
pool, after each of the 16 residual blocks, before the classifier: 19 segments), and each segment is its
own XLA function. The backward pass is then a chain of 19 XLA ops, and TensorFlow's executor hands each
segment's gradients to their allreduce ops as soon as that op ends, while the next segment's gradient computes
(Horovod's timeline shows the first gradients arriving at the backward pass's start: tests/workloads/
test_launch.py, bench/overlap.py). Compute speed stays XLA's: a cut falls where XLA has little to fuse across
(after a block's closing ReLU, where the next block's convolutions begin), and 38 op launches a step are nothing next
to the convolutions (bench/overlap.py times both designs in turn: docs/PERFORMANCE.md). Not chosen:
auto-clustering (TF_XLA_FLAGS=--tf_xla_auto_jit) leaves where clusters fall to TensorFlow's heuristics, and a
cluster over the backward pass hands its gradients over at its end again; Horovod's XLA ops
(HOROVOD_ENABLE_XLA_OPS) exist for GPUs only, so the CPU path would not be the GPU's.

Stdlib only at import: TensorFlow and Horovod are passed in.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from clusterctl.node.train.data import normalize
from clusterctl.node.train.model import decayed_variables

DESIGNS = ("blocks", "whole")  # XLA per segment (the step's), or the model as one XLA op (the design before)


def cut_points(model: Any) -> list[int]:
    """Indices in model.layers (topological order) after which the layer's output is the only tensor the later
    layers read: where a model can be cut into a chain. [] when the model is not a plain graph of layers
    called once (shared layers, several inputs or outputs): then it is not cut."""
    layers = list(model.layers)
    if len(model.inputs) != 1 or len(model.outputs) != 1 or any(len(layer._inbound_nodes) > 1 for layer in layers):
        return []
    index = {id(layer): i for i, layer in enumerate(layers)}
    last_read: dict[int, int] = {}  # layer -> the last layer that reads its output
    for i, layer in enumerate(layers):
        for parent in _parents(layer):
            j = index.get(id(parent))  # (a Sequential's InputLayer is not in model.layers)
            if j is not None:
                last_read[j] = max(last_read.get(j, -1), i)
    cuts: list[int] = []
    live: set[int] = set()
    for i in range(len(layers)):
        live = {j for j in live if last_read[j] > i}
        if last_read.get(i, -1) > i:
            live.add(i)
        if live == {i}:
            cuts.append(i)
    return cuts


def _parents(layer: Any) -> list[Any]:
    inbound = layer._inbound_nodes[0].inbound_layers if layer._inbound_nodes else []
    return list(inbound) if isinstance(inbound, (list, tuple)) else [inbound]


def segments(model: Any) -> list[tuple[int, int]]:
    """The chain's segments as (first, last) indices in model.layers: the pieces between cut points, a piece
    without weights joined to the one before (a ReLU or a pool is not worth an op of its own; its gradient
    has nothing to allreduce)."""
    layers = list(model.layers)
    pieces, start = [], 0
    for cut in cut_points(model):
        pieces.append((start, cut))
        start = cut + 1
    if start < len(layers):
        pieces.append((start, len(layers) - 1))
    merged: list[tuple[int, int, bool]] = []
    for first, last in pieces:
        weights = any(layers[i].trainable_weights for i in range(first, last + 1))
        if merged and not (weights and merged[-1][2]):
            merged[-1] = (merged[-1][0], last, merged[-1][2] or weights)
        else:
            merged.append((first, last, weights))
    return [(first, last) for first, last, _ in merged]


def segment_models(tf: Any, model: Any) -> list[Any]:
    """Keras models over the model's own layers (the same variables: checkpoints still see `model`), one per
    segment, each taking the one tensor the segment before hands on."""
    parts, inputs = [], model.inputs[0]
    spans = segments(model)
    for k, (_, last) in enumerate(spans):
        outputs = model.outputs[0] if k == len(spans) - 1 else model.layers[last].output
        parts.append(tf.keras.Model(inputs, outputs, name=f"{model.name}_segment{k}"))
        inputs = outputs
    return parts


def make_forward(tf: Any, model: Any, xla: bool, design: str = "blocks") -> Callable[[Any], Any]:
    """images (8-bit) -> logits, in training mode: cast and normalised on the device first. Without XLA, plain
    TensorFlow ops (each gradient reaches Horovod as it is made); with it, see the module's docstring."""
    if design not in DESIGNS:
        raise ValueError(f"unknown step design {design!r}: {' or '.join(DESIGNS)}")

    def whole(x: Any) -> Any:
        return model(normalize(tf, x), training=True)

    if not xla:
        return whole
    if design == "whole":
        return tf.function(whole, jit_compile=True, autograph=False)  # type: ignore[no-any-return]
    parts = segment_models(tf, model)
    first: Any = tf.function(lambda x: parts[0](normalize(tf, x), training=True), jit_compile=True, autograph=False)
    rest = [
        tf.function(lambda h, part=part: part(h, training=True), jit_compile=True, autograph=False)
        for part in parts[1:]
    ]

    def chain(x: Any) -> Any:
        h = first(x)
        for f in rest:
            h = f(h)
        return h

    return chain


def make_optimizer(tf: Any, learning_rate: float, momentum: float, loss_scaling: bool) -> tuple[Any, Any]:
    """SGD with momentum, wrapped for dynamic loss scaling under float16. Returns (the optimizer to step,
    the SGD inside it: its learning rate and slots)."""
    inner = tf.keras.optimizers.SGD(learning_rate=learning_rate, momentum=momentum)
    return (tf.keras.mixed_precision.LossScaleOptimizer(inner) if loss_scaling else inner), inner


def make_objective(
    tf: Any, model: Any, classes: int, label_smoothing: float, weight_decay: float, recipe: str
) -> Callable[[Any, Any], tuple[Any, Any]]:
    """(float32 logits, integer labels) -> (cross-entropy, cross-entropy + L2 on the variables the recipe
    decays: model.decayed_variables)."""
    loss_fn = tf.keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=label_smoothing)
    decay_vars = decayed_variables(tf, model, recipe)

    def objective(logits: Any, labels: Any) -> tuple[Any, Any]:
        loss = loss_fn(tf.one_hot(labels, classes), logits)
        total = loss + weight_decay * tf.add_n([tf.nn.l2_loss(tf.cast(v, tf.float32)) for v in decay_vars])
        return loss, total

    return objective


def make_step(
    tf: Any,
    hvd: Any,
    model: Any,
    opt: Any,
    objective: Callable[[Any, Any], tuple[Any, Any]],
    forward: Callable[[Any], Any],
    *,
    loss_scaling: bool,
    compression: Any,
    allreduce: bool = True,
) -> Callable[[Any, Any], tuple[Any, Any]]:
    """(images, labels) -> (loss, total loss): one training step over make_forward's `forward`, for the caller
    to trace inside its own tf.function (Horovod's collectives have no XLA kernels on CPU: only the model is
    compiled). allreduce=False: the same step with no allreduce (compute alone, as one process trains)."""

    def step(images: Any, labels: Any) -> tuple[Any, Any]:
        with tf.GradientTape() as tape:
            logits = tf.cast(forward(images), tf.float32)
            loss, total = objective(logits, labels)
            scaled = opt.get_scaled_loss(total) if loss_scaling else total
        if allreduce:
            tape = hvd.DistributedGradientTape(tape, compression=compression)
        grads = tape.gradient(scaled, model.trainable_variables)
        if loss_scaling:
            grads = opt.get_unscaled_gradients(grads)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss, total

    return step


def broadcast_from_rank0(tf: Any, hvd: Any, variables: list[Any]) -> None:
    """Rank 0's values into every rank's `variables`: Horovod's broadcast_variables, traced without AutoGraph
    (its own tf.function converts the loop, ~1.3 CPU-s a process at every start with the tiny model)."""

    def group() -> None:
        for v in variables:
            v.assign(hvd.broadcast(v, root_rank=0))

    tf.function(group, autograph=False)()
