"""clusterctl/node/train/model.py: the ResNet-50 the trainer and the benchmark build is v1.5 as torchvision, NVIDIA's
reference and TF Model Garden define it, checked layer by layer against a table written here from those
definitions (not from the module), on the CPU (built, never trained)."""

from __future__ import annotations

import json
import subprocess

import pytest

from conftest import REPO, TRAIN_PY as PY, node_pyz

pytestmark = pytest.mark.integration

DUMP = """
import json, os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
sys.path.insert(0, sys.argv[1])
import numpy as np
import tensorflow as tf
from clusterctl.node.train import model as train_model

out = {}
for name, size, classes, recipe in (("resnet50", 224, 1000, "nvidia"), ("resnet50", 224, 1000, "goyal"),
                                   ("resnet50", 64, 10, "nvidia"), ("tiny", 32, 10, "nvidia")):
    tf.random.set_seed(1)
    m = train_model.build_model(tf, name, size, classes, recipe)
    layers = []
    for l in m.layers:
        d = {"name": l.name, "type": type(l).__name__, "out": list(l.output_shape[1:])}
        if isinstance(l, tf.keras.layers.Conv2D):
            k = l.kernel.numpy()
            d.update(kernel=list(l.kernel_size), strides=list(l.strides), padding=l.padding, bias=l.use_bias,
                     filters=l.filters, in_channels=int(l.kernel.shape[2]), init=l.kernel_initializer.get_config(), std=float(k.std()))
        if isinstance(l, tf.keras.layers.BatchNormalization):
            d.update(momentum=l.momentum, epsilon=l.epsilon, gamma=sorted({float(v) for v in l.gamma.numpy()}),
                     beta=sorted({float(v) for v in l.beta.numpy()}))
        if isinstance(l, tf.keras.layers.ZeroPadding2D):
            d.update(pad=[list(p) for p in l.padding])
        if isinstance(l, tf.keras.layers.MaxPooling2D):
            d.update(pool=list(l.pool_size), strides=list(l.strides), padding=l.padding)
        if isinstance(l, tf.keras.layers.Dense):
            d.update(std=float(l.kernel.numpy().std()), bias=sorted({float(v) for v in l.bias.numpy()}),
                     fan_in=int(l.kernel.shape[0]))
        layers.append(d)
    decayed = train_model.decayed_variables(tf, m, recipe)
    out[f"{name}/{classes}" + ("/goyal" if recipe == "goyal" else "")] = {
        "layers": layers, "line": train_model.describe(name, m),
        "trainable": int(sum(np.prod(w.shape) for w in m.trainable_weights)),
        "zero_gamma": train_model.zero_gamma_layers(tf, m),
        "decayed": sorted(v.name.split("/")[-1].split(":")[0] for v in decayed)}
print("DUMP " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def built() -> dict:
    proc = subprocess.run([PY, "-c", DUMP, node_pyz()], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.split("DUMP ", 1)[1])


def expected_blocks():
    """ResNet-50 v1.5's bottlenecks: (name, width, stride of its 3x3, projection shortcut?), from the papers'
    table (3, 4, 6, 3 blocks of widths 64..512; stages 3-5 halve the resolution in their first block)."""
    for stage, (width, blocks) in enumerate(((64, 3), (128, 4), (256, 6), (512, 3)), start=2):
        for b in range(1, blocks + 1):
            yield f"conv{stage}_block{b}", width, (2 if stage > 2 and b == 1 else 1), b == 1


def check_init(net: dict, fan: str, zero_last_gamma: bool) -> None:
    """No conv biases; He-normal on `fan` (variance 2 / (kh * kw * channels on that side)), truncated as
    NVIDIA's; batch norms momentum 0.9, epsilon 1e-5, beta 0, gamma 1 (or 0 in each block's last)."""
    convs = [d for d in net["layers"] if d["type"] == "Conv2D"]
    bns = [d for d in net["layers"] if d["type"] == "BatchNormalization"]
    assert len(convs) == 53 and len(bns) == 53  # 1 stem + 16 x 3 + 4 projections
    by = {d["name"]: d for d in net["layers"]}
    for c in convs:
        assert c["bias"] is False, c["name"]
        assert (c["init"]["scale"], c["init"]["mode"], c["init"]["distribution"]) == (2.0, fan, "truncated_normal"), c
        # channels in: the output of the layer before it (the stem's image: 3)
        side = c["filters"] if fan == "fan_out" else c["in_channels"]
        # the sample's std within 10% of the target (53 kernels of >= 4,096 weights; the stem's 9,408)
        assert abs(c["std"] / (2.0 / (c["kernel"][0] * c["kernel"][1] * side)) ** 0.5 - 1) < 0.1, c
    last = {f"{n}_3_bn" for n, *_ in expected_blocks()}
    assert len(last) == 16
    for b in bns:
        assert (b["momentum"], b["epsilon"], b["beta"]) == (0.9, 1e-5, [0.0]), b
        assert b["gamma"] == ([0.0] if zero_last_gamma and b["name"] in last else [1.0]), b
    assert net["zero_gamma"] == (16 if zero_last_gamma else 0)
    assert by["predictions"]["bias"] == [0.0]


def test_recipes_initialise_and_decay_as_their_sources(built):
    """nvidia: --weight_init=fan_in for convs and classifier, every gamma 1, L2 on all but batch norm
    (DGX1_RN50_AMP_90E.sh:32, model/resnet.py:83-99, 283-293); goyal: fan_out, zero last gamma, L2 on kernels."""
    nvidia, goyal = built["resnet50/1000"], built["resnet50/1000/goyal"]
    check_init(nvidia, "fan_in", zero_last_gamma=False)
    check_init(goyal, "fan_out", zero_last_gamma=True)
    head = {d["name"]: d for d in nvidia["layers"]}["predictions"]
    assert abs(head["std"] / (2.0 / head["fan_in"]) ** 0.5 - 1) < 0.1, head  # He fan_in: 2 / 2048
    assert abs({d["name"]: d for d in goyal["layers"]}["predictions"]["std"] - 0.01) < 0.001
    # 53 conv kernels + the classifier's kernel, and under nvidia its bias too; never a gamma or beta
    assert nvidia["decayed"] == sorted(["kernel"] * 54 + ["bias"])
    assert goyal["decayed"] == ["kernel"] * 54


def test_resnet50_is_v15_layer_by_layer(built):
    net = built["resnet50/1000"]
    by = {d["name"]: d for d in net["layers"]}
    convs = [d for d in net["layers"] if d["type"] == "Conv2D"]

    # the stem: 7x7/2 conv (symmetric padding 3), BN, ReLU, 3x3/2 max pool -> 56x56x64
    assert (by["conv1_conv"]["kernel"], by["conv1_conv"]["strides"], by["conv1_conv"]["filters"]) == (
        [7, 7],
        [2, 2],
        64,
    )
    assert by["conv1_conv_pad"]["pad"] == [[3, 3], [3, 3]] and by["conv1_conv"]["out"] == [112, 112, 64]
    assert (by["pool1_pool"]["pool"], by["pool1_pool"]["strides"]) == ([3, 3], [2, 2])
    assert by["pool1_pool"]["out"] == [56, 56, 64]

    side = 56
    for name, width, stride, project in expected_blocks():
        one, three, out = by[f"{name}_1_conv"], by[f"{name}_2_conv"], by[f"{name}_3_conv"]
        # v1.5: the 1x1 reducing conv never strides; the 3x3 carries the block's stride
        assert (one["kernel"], one["strides"], one["filters"]) == ([1, 1], [1, 1], width), one
        assert (three["kernel"], three["strides"], three["filters"]) == ([3, 3], [stride, stride], width), three
        assert (out["kernel"], out["strides"], out["filters"]) == ([1, 1], [1, 1], 4 * width), out
        if stride == 2:
            assert by[f"{name}_2_conv_pad"]["pad"] == [[1, 1], [1, 1]]  # torchvision's padding=1
            side //= 2
        assert three["out"] == [side, side, width] and by[f"{name}_out"]["out"] == [side, side, 4 * width]
        if project:  # the projection shortcut: 1x1 with the stage's stride to 4x width, then BN
            sc = by[f"{name}_0_conv"]
            assert (sc["kernel"], sc["strides"], sc["filters"]) == ([1, 1], [stride, stride], 4 * width), sc
            assert f"{name}_0_bn" in by
        else:
            assert f"{name}_0_conv" not in by
    assert side == 7

    assert by["predictions"]["out"] == [1000]
    # the references' count (torchvision's resnet50: 25,557,032), and 2,049 per class for the classifier
    assert net["trainable"] == 25_557_032
    assert net["line"] == "model resnet50 v1.5: 25,557,032 parameters"
    assert built["resnet50/10"]["trainable"] == 25_557_032 - 990 * 2049
    # not Keras' ResNet50 (v1: 25,636,712 with its batch-norm statistics, conv biases, stride on the 1x1)
    assert not any(d["name"].endswith("_2_conv") and d["strides"] == [2, 2] and d["kernel"] == [1, 1] for d in convs)


def test_tiny_is_named_and_counted(built):
    tiny = built["tiny/10"]
    assert tiny["line"] == f"model tiny: {tiny['trainable']:,} parameters" and tiny["trainable"] == 5466
    assert tiny["zero_gamma"] == 0
