"""``residual_init``: how each branch's output scale starts. Laws: every branch starts at
``residual_scale(init, n)`` with n the fan-in of the mean that reads it, on both engines and every block kind
that names its last norm; Fixed-Full's single stream is untouched; blocks without the hook are refused by name."""

import math

import pytest
import torch
from conftest import PlainBlock, tiny
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

import connlearn
from connlearn.blocks import BLOCKS, RESIDUAL_INITS, Looped, residual_scale, scales_residual
from connlearn.compile import FusedModule
from connlearn.errors import ConfigError, UnknownNameError


def _last_norm_weights(net):
    """Per module: the weight of every branch's last norm, one tensor (branch-major)."""
    weights = []
    for stage in net.stages:
        blocks = [stage.block] if isinstance(stage, FusedModule) else list(stage.blocks)
        weights.append(torch.cat([getattr(b, b.residual_norm).weight.detach() for b in blocks]))
    return weights


def test_residual_scale_values_and_bad_names():
    assert residual_scale("auto", 4) == 2.0
    assert residual_scale("one", 4) is None
    assert residual_scale("sqrt_k", 4) == 2.0
    assert residual_scale("zero", 4) == 0.0
    with pytest.raises(UnknownNameError, match="did you mean 'sqrt_k'"):
        residual_scale("sqrtk", 4)
    with pytest.raises(ConfigError, match="fan_in"):
        residual_scale("sqrt_k", 0)


@given(
    C=st.integers(1, 5), data=st.data(), init=st.sampled_from(RESIDUAL_INITS),
    block=st.sampled_from(["bottleneck", "basic"]), topology=st.sampled_from(["resnext", "dense"]),
    engine=st.sampled_from(["fused", "reference"]), gate=st.sampled_from(["topk", "random", "real"]),
)
def test_every_branch_starts_at_the_scale_of_the_mean_that_reads_it(C, data, init, block, topology, engine, gate):
    K = data.draw(st.integers(1, C))
    net = connlearn.build(topology, engine=engine, **tiny(C=C, K=K, block=block, gate=gate, residual_init=init))
    weights = _last_norm_weights(net)
    for pos, w in enumerate(weights):
        n = C if pos == len(weights) - 1 else K  # the head reads the last module through a mean of C
        expected = {"one": 1.0, "sqrt_k": math.sqrt(n), "auto": math.sqrt(n), "zero": 0.0}[init]
        torch.testing.assert_close(w, torch.full_like(w, expected))


def test_sqrt_k_scales_each_gated_residual_by_exactly_sqrt_n_in_training_mode():
    """From the same seed, the two inits differ only in the last BN's scale, so in training mode (batch
    statistics) every block output is sqrt(n) times larger: the mean of K outputs, whose scale at
    initialisation is about 1/sqrt(K) of one branch's, starts near one branch's scale."""
    opts = tiny(C=4, K=2)
    one, scaled = (connlearn.build(**opts, residual_init=init).train() for init in ("one", "sqrt_k"))
    for pos, n in ((0, 2), (1, 2), (2, 4)):
        a, b = one.stages[pos].block, scaled.stages[pos].block
        x = torch.randn(6, a.branches * a.in_ch, 8, 8, generator=torch.Generator().manual_seed(pos))
        torch.testing.assert_close(b(x), math.sqrt(n) * a(x), atol=1e-5, rtol=1e-5)


def test_zero_makes_every_block_start_as_its_shortcut(images):
    net = connlearn.build(**tiny(residual_init="zero")).train()
    for stage in net.stages:
        block = stage.block
        x = torch.randn(2, block.branches * block.in_ch, 8, 8)
        assert torch.count_nonzero(block(x)) == 0


def test_fixed_full_single_stream_is_unchanged():
    """ResNeXt has one BN of the summed branches: nothing to rescale, the same weights whatever the option."""
    one = connlearn.build(**tiny(gate="full", K=None, residual_init="one"))
    scaled = connlearn.build(**tiny(gate="full", K=None, residual_init="sqrt_k"))
    assert one.engine == scaled.engine == "single-stream"
    for (k, a), b in zip(one.state_dict().items(), scaled.state_dict().values(), strict=True):
        if not k.endswith("_extra_state"):
            torch.testing.assert_close(a, b)


def test_the_default_is_auto_and_a_graph_written_before_the_option_means_one():
    net = connlearn.build(**tiny(C=4, K=2))
    graph = net.graph()
    assert graph.graph["residual_init"] == "auto"
    assert [float(w[0]) for w in _last_norm_weights(net)] == pytest.approx([2**0.5, 2**0.5, 2.0])
    del graph.graph["residual_init"]
    old = connlearn.from_graph(graph)
    assert all(bool((w == 1).all()) for w in _last_norm_weights(old))


def test_the_option_lives_in_the_graph_and_survives_json_and_pruning(images):
    net = connlearn.build(**tiny(C=4, K=1, gate="random", residual_init="sqrt_k"))
    graph = net.graph()
    assert graph.graph["residual_init"] == "sqrt_k"
    again = connlearn.from_graph(graph.to_json())
    for a, b in zip(_last_norm_weights(net), _last_norm_weights(again), strict=True):
        torch.testing.assert_close(a, b)
    pruned, _ = connlearn.prune.prune_dead_blocks(net)
    assert pruned.graph().graph["residual_init"] == "sqrt_k"
    net.eval()
    torch.testing.assert_close(pruned.eval()(images), net(images), atol=1e-5, rtol=1e-5)


def test_bad_value_is_named_at_build():
    with pytest.raises(UnknownNameError, match=r"residual_init 'sqrtk'.*did you mean 'sqrt_k'"):
        connlearn.build(**tiny(residual_init="sqrtk"))
    graph = connlearn.build(**tiny()).graph()
    graph.graph["residual_init"] = "half"
    with pytest.raises(UnknownNameError, match="residual_init 'half'"):
        connlearn.from_graph(graph)


class _Nested(PlainBlock):
    """A BranchBlock whose last norm sits inside a submodule: ``residual_norm`` may be a dotted name."""

    residual_norm = "tail.1"

    def __init__(self, in_ch, out_ch, stride, branches, *, width):
        super().__init__(in_ch, out_ch, stride, branches, width=width)
        self.tail = nn.Sequential(nn.ReLU(), nn.BatchNorm2d(branches * out_ch))

    def forward(self, x):
        return self.tail(self.conv(x))


class _Single(nn.Module):
    """A third-party single-branch block that opts in."""

    def __init__(self, in_ch, out_ch, stride, width):
        super().__init__()
        self.conv = nn.Conv2d(in_ch, out_ch, 3, stride, 1, bias=False)
        self.bn = nn.BatchNorm2d(out_ch)

    def forward(self, x):
        return self.bn(self.conv(x))

    def init_residual_scale(self, scale):
        nn.init.constant_(self.bn.weight, scale)


class _SingleWithout(_Single):
    init_residual_scale = None


@pytest.fixture
def plugin_blocks():
    saved = dict(BLOCKS._items)
    connlearn.register_block("test-nonorm", PlainBlock)
    connlearn.register_block("test-looped", Looped(_Single))
    connlearn.register_block("test-looped-without", Looped(_SingleWithout))
    yield
    BLOCKS._items.clear()
    BLOCKS._items.update(saved)


def _first_scales(net):
    return [float(m.bn.weight[0].detach()) for s in net.stages for m in s.block.branch_modules[:1]]


def test_third_party_blocks_opt_in_through_the_hook(plugin_blocks):
    for init in ("sqrt_k", "auto"):
        net = connlearn.build(**tiny(C=4, K=2, block="test-looped", residual_init=init))
        assert _first_scales(net) == pytest.approx([math.sqrt(2), math.sqrt(2), 2.0])


def test_blocks_without_the_hook_stay_as_built_by_default_and_are_refused_by_name(plugin_blocks):
    for block in ("test-nonorm", "test-looped-without"):
        for init in ("auto", "one"):  # neither needs the hook
            assert connlearn.build(**tiny(block=block, residual_init=init)).num_parameters() > 0
    assert _first_scales(connlearn.build(**tiny(block="test-looped-without"))) == [1.0, 1.0, 1.0]
    with pytest.raises(ConfigError, match=r"PlainBlock.residual_norm = None names no affine .*no such submodule"):
        connlearn.build(**tiny(block="test-nonorm", residual_init="zero"))
    with pytest.raises(ConfigError, match="residual_init='sqrt_k' with block kind 'test-looped-without' "
                                          r"\(module 1\): .*_SingleWithout has no init_residual_scale"):
        connlearn.build(**tiny(block="test-looped-without", residual_init="sqrt_k"))


def test_which_blocks_can_rescale():
    assert scales_residual(connlearn.build(**tiny()).stages[0].block)
    assert scales_residual(Looped(_Single)(4, 4, 1, 2, width=1))
    assert not scales_residual(Looped(_SingleWithout)(4, 4, 1, 2, width=1))
    assert not scales_residual(PlainBlock(4, 4, 1, 2, width=1))
    assert not scales_residual(nn.Conv2d(4, 4, 1))
    nested = _Nested(4, 4, 1, 2, width=1)
    assert scales_residual(nested)
    nested.init_residual_scale(3.0)
    assert bool((nested.tail[1].weight == 3.0).all())
