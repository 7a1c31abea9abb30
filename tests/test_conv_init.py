"""``conv_init``: how the convolutions before each branch's last one start. Laws: ``"resnext"`` is the
``"branch"`` draw times 1/sqrt(C) (C the module's branches) in exactly the layers ``inner_convs`` names,
on both engines, so the two engines still draw from one law; every other tensor is the same; ResNeXt's
single stream is untouched; the function in training mode (batch statistics) is unchanged; the option lives
in the graph; blocks that cannot do it are refused by name."""

import math

import pytest
import torch
from conftest import PlainBlock, tiny
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import connlearn
from connlearn.blocks import CONV_INITS, DEFAULT_CONV_INIT, Looped, check_conv_init
from connlearn.errors import ConfigError, UnknownNameError
from connlearn.experiment import CifarRun


def _pairs(a, b):
    for (name, p), (other, q) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        assert name == other
        yield name, p.detach(), q.detach()


@settings(max_examples=20, deadline=None)
@given(
    C=st.integers(1, 5), data=st.data(), block=st.sampled_from(["bottleneck", "basic"]),
    topology=st.sampled_from(["resnext", "dense"]), engine=st.sampled_from(["fused", "reference"]),
    gate=st.sampled_from(["topk", "random", "real"]),
)
def test_resnext_is_the_branch_draw_over_sqrt_c_in_the_inner_convolutions_only(C, data, block, topology, engine,
                                                                                gate):
    K = data.draw(st.integers(1, C))
    opts = tiny(C=C, K=K, block=block, gate=gate)
    branch = connlearn.build(topology, engine=engine, **opts)
    scaled = connlearn.build(topology, engine=engine, **opts, conv_init="resnext")
    inner = {"bottleneck": ("conv1", "conv2"), "basic": ("conv1",)}[block]
    for name, p, q in _pairs(branch, scaled):
        if any(f".{layer}." in name for layer in inner) and name.startswith("stages."):
            assert torch.equal(q, p * (1.0 / math.sqrt(C))), name
        else:
            assert torch.equal(p, q), name


def test_the_gated_inner_layers_start_at_resnexts_scale():
    """K = C: each inner layer of the gated form, with ``"resnext"``, has the spread of the same layer of
    Fixed-Full's single stream (one grouped layer of C·w outputs); with ``"branch"``, sqrt(C) times it."""
    opts = tiny(C=8, K=8, width=8, base_channels=32)
    full = connlearn.build(**{**opts, "gate": "full", "K": None})
    nets = {init: connlearn.build(**opts, gate="random", conv_init=init) for init in CONV_INITS}
    std = {init: float(net.stages[1].block.conv1.weight.detach().std()) for init, net in nets.items()}
    reference = float(full.stages[1].body.conv1.weight.detach().std())
    assert std["resnext"] / reference == pytest.approx(1.0, abs=0.1)
    assert std["branch"] / reference == pytest.approx(math.sqrt(8), rel=0.1)


def test_the_function_in_training_mode_is_the_same():
    """Every scaled layer feeds a batch norm, so with batch statistics the outputs agree."""
    opts = tiny(C=4, K=2, gate="random")
    a, b = (connlearn.build(**opts, conv_init=init).train() for init in CONV_INITS)
    x = torch.randn(8, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(b(x), a(x), atol=1e-4, rtol=1e-4)


def test_a_net_moved_to_the_other_engine_keeps_its_weights_and_function(images):
    """Building the moved net applies the option again; the copied weights must win."""
    fused = connlearn.build(**tiny(C=4, K=2, gate="random", conv_init="resnext"))
    moved = fused.to_engine("reference")
    assert moved.graph().graph["conv_init"] == "resnext"
    torch.testing.assert_close(moved.eval()(images), fused.eval()(images), atol=1e-5, rtol=1e-5)
    back = moved.to_engine("fused")
    for name, p, q in _pairs(fused, back):
        assert torch.equal(p, q), name


def test_fixed_full_single_stream_is_unchanged():
    a, b = (connlearn.build(**tiny(gate="full", K=None, conv_init=init)) for init in CONV_INITS)
    assert a.engine == b.engine == "single-stream"
    for name, p, q in _pairs(a, b):
        assert torch.equal(p, q), name


def test_the_default_is_branch_and_a_graph_written_before_the_option_means_branch():
    assert DEFAULT_CONV_INIT == "branch"
    net = connlearn.build(**tiny())
    graph = net.graph()
    assert graph.graph["conv_init"] == "branch"
    scaled = connlearn.build(**tiny(conv_init="resnext")).graph()
    del scaled.graph["conv_init"]
    for name, p, q in _pairs(net, connlearn.from_graph(scaled)):
        assert torch.equal(p, q), name


def test_the_option_lives_in_the_graph_and_survives_json_and_pruning(images):
    net = connlearn.build(**tiny(C=4, K=1, gate="random", conv_init="resnext"))
    graph = net.graph()
    assert graph.graph["conv_init"] == "resnext"
    for name, p, q in _pairs(net, connlearn.from_graph(graph.to_json())):
        assert torch.equal(p, q), name
    pruned, report = connlearn.prune.prune_dead_blocks(net)
    assert report.blocks_after < report.blocks_before
    assert pruned.graph().graph["conv_init"] == "resnext"
    net.eval()
    torch.testing.assert_close(pruned.eval()(images), net(images), atol=1e-5, rtol=1e-5)


def test_bad_values_are_named():
    with pytest.raises(UnknownNameError, match=r"conv_init 'resnxt'.*did you mean 'resnext'"):
        connlearn.build(**tiny(conv_init="resnxt"))
    with pytest.raises(UnknownNameError, match="conv_init 'layer'"):
        check_conv_init("layer")
    graph = connlearn.build(**tiny()).graph()
    graph.graph["conv_init"] = "half"
    with pytest.raises(UnknownNameError, match="conv_init 'half'"):
        connlearn.from_graph(graph)
    with pytest.raises(UnknownNameError, match="conv_init 'ResNeXt'"):
        CifarRun(conv_init="ResNeXt")


class _Misnamed(PlainBlock):
    inner_convs = ("conv", "missing")


class _Single(nn.Module):
    """A third-party single-branch block that opts in through the hook."""

    def __init__(self, in_ch, out_ch, stride, width):
        super().__init__()
        self.conv1 = nn.Conv2d(in_ch, width, 3, stride, 1, bias=False)
        self.conv2 = nn.Conv2d(width, out_ch, 3, 1, 1, bias=False)

    def forward(self, x):
        return self.conv2(self.conv1(x))

    def init_conv_scale(self, scale):
        with torch.no_grad():
            self.conv1.weight.mul_(scale)


def test_blocks_opt_in_and_those_that_cannot_are_refused_by_name(clean_registries):
    connlearn.register_block("test-noinner", PlainBlock)
    connlearn.register_block("test-misnamed", _Misnamed)
    connlearn.register_block("test-looped", Looped(_Single))
    connlearn.register_block("test-looped-plain", Looped(lambda i, o, s, width: nn.Conv2d(i, o, 3, s, 1)))
    for block in ("test-noinner", "test-looped-plain"):
        assert connlearn.build(**tiny(block=block)).num_parameters() > 0  # "branch" needs nothing
    with pytest.raises(ConfigError, match=r"PlainBlock.inner_convs names no convolutions"):
        connlearn.build(**tiny(block="test-noinner", conv_init="resnext"))
    with pytest.raises(ConfigError, match=r"_Misnamed.inner_convs names 'missing'"):
        connlearn.build(**tiny(block="test-misnamed", conv_init="resnext"))
    with pytest.raises(ConfigError, match=r"conv_init='resnext' with block kind 'test-looped-plain' \(module 1\): "
                                          "block Conv2d has no init_conv_scale"):
        connlearn.build(**tiny(block="test-looped-plain", conv_init="resnext"))
    a, b = (connlearn.build(**tiny(C=4, block="test-looped", conv_init=init)) for init in CONV_INITS)
    first = (s.block.branch_modules[0] for s in (a.stages[0], b.stages[0]))
    p, q = (m.conv1.weight for m in first)
    torch.testing.assert_close(q, p / 2, rtol=0, atol=0)
