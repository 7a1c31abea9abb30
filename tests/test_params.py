"""Parameter counts equal the paper's (gated) and ResNeXt's published ones (full); gates not counted."""

import pytest

import connlearn


@pytest.mark.parametrize(
    "preset, millions",
    [("cifar-20-4-8", 0.28), ("cifar-29-8-8", 0.86)],
)
def test_gated_cifar100_counts_round_to_the_paper(preset, millions):
    net = connlearn.build(preset=preset, gate="topk", K=4, num_classes=100)
    assert round(net.num_parameters() / 1e6, 2) == millions


def test_gated_29_64_8_is_within_one_percent_of_34_4m():
    net = connlearn.build(preset="cifar-29-64-8", gate="topk", K=4, num_classes=100)
    assert abs(net.num_parameters() / 34.4e6 - 1) < 0.01


@pytest.mark.parametrize(
    "preset, classes, millions",
    [
        ("cifar-29-64-8", 10, 34.4),
        ("imagenet-50-4-32", 1000, 25.0),
        ("imagenet-101-4-32", 1000, 44.2),
        ("imagenet-101-4-64", 1000, 83.5),
    ],
)
def test_full_matches_resnext_published_counts(preset, classes, millions):
    net = connlearn.build(preset=preset, gate="full", num_classes=classes)
    assert net.engine == "single-stream"
    assert abs(net.num_parameters() / (millions * 1e6) - 1) < 0.005


def test_gates_are_not_counted_unless_asked():
    net = connlearn.build(preset="cifar-20-4-8", K=4)
    n_gates = sum(p.numel() for p in net.gate_parameters())
    assert n_gates == 5 * 8 * 8
    assert net.num_parameters(gates=True) == net.num_parameters() + n_gates


def test_defaults_are_the_figure_3_model():
    net = connlearn.build()
    opts = net.graph().graph["options"]
    assert (opts["depth"], opts["width"], opts["C"]) == (29, 8, 8)
    assert net.num_classes == 100 and net.gate_kind == "topk"
