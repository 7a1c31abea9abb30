"""Registries: every registered kind builds and runs; user blocks plug in and train."""

from typing import ClassVar

import pytest
import torch
from conftest import RandomLoader, tiny
from torch import nn

import connlearn
from connlearn.blocks import BranchBlock, Looped, conv
from connlearn.gates import TopKGate
from connlearn.recipe import Phase, Recipe
from connlearn.train import Trainer


def _train_one_step(net):
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    x, y = torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,))
    before = [p.detach().clone() for p in net.parameters()]
    loss = nn.functional.cross_entropy(net(x), y)
    loss.backward()
    opt.step()
    assert torch.isfinite(loss)
    assert any(not torch.equal(b, p) for b, p in zip(before, net.parameters(), strict=True))


# every registered kind, except the combinations that build() refuses by design: 'frozen' comes from
# freeze(), and 'full' is ResNeXt's connectivity, defined for the resnext topology only
KINDS = [
    (topology, block, gate)
    for topology in connlearn.list_topologies()
    for block in connlearn.list_blocks()
    for gate in connlearn.list_gates()
    if gate != "frozen" and not (topology == "dense" and gate == "full")
]


@pytest.mark.parametrize("topology, block, gate", KINDS)
def test_every_registered_kind_builds_and_runs_without_nan(topology, block, gate):
    net = connlearn.build(topology, **tiny(block=block, gate=gate, K=4 if gate == "full" else 2))
    for mode in (True, False):
        out = net.train(mode)(torch.randn(2, 3, 32, 32))
        assert out.shape == (2, 10) and torch.isfinite(out).all()


class Depthwise(BranchBlock):
    """A user block: depthwise 3x3 then pointwise, batched across branches."""

    params = ("width",)

    def __init__(self, in_ch, out_ch, stride, branches, *, width):
        super().__init__(in_ch, out_ch, stride, branches, width=width)
        self.dw = nn.Conv2d(branches * in_ch, branches * in_ch, 3, stride, 1, groups=branches * in_ch, bias=False)
        self.pw = conv(in_ch, out_ch, 1, branches)
        self.bn = nn.BatchNorm2d(branches * out_ch)

    def forward(self, x):
        return self.bn(self.pw(self.dw(x)))


def test_a_user_registered_block_builds_a_net_that_trains(clean_registries):
    connlearn.register_block("depthwise", Depthwise)
    assert "depthwise" in connlearn.list_blocks()
    net = connlearn.build(**tiny(block="depthwise"))
    _train_one_step(net)
    ref = net.to_engine("reference").eval()
    net.eval()
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(net(x), ref(x), atol=1e-5, rtol=1e-4)


def _plain_branch(in_ch, out_ch, stride, *, width):
    return nn.Sequential(
        nn.Conv2d(in_ch, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
        nn.Conv2d(width, out_ch, 1, bias=False), nn.BatchNorm2d(out_ch),
    )


def test_a_looped_single_branch_block_builds_a_net_that_trains(clean_registries):
    connlearn.register_block("plain", Looped(_plain_branch))
    for engine in ("fused", "reference"):
        _train_one_step(connlearn.build(**tiny(block="plain"), engine=engine))


def test_looped_blocks_select_and_merge_their_branches(clean_registries):
    block = Looped(_plain_branch)(4, 6, 1, 3, width=2).eval()
    x = torch.randn(2, 12, 8, 8)
    full = block(x)
    part = block.select([2, 0])(torch.cat([x[:, 8:12], x[:, 0:4]], dim=1))
    torch.testing.assert_close(part, torch.cat([full[:, 12:18], full[:, 0:6]], dim=1))
    merged = type(block).merge([block.select([0]), block.select([1, 2])])
    torch.testing.assert_close(merged(x), full)


def test_registering_a_taken_name_needs_overwrite(clean_registries):
    with pytest.raises(connlearn.ConfigError, match="already registered"):
        connlearn.register_block("bottleneck", Depthwise)
    connlearn.register_block("bottleneck", Depthwise, overwrite=True)


def test_list_functions_filter_by_pattern():
    assert connlearn.list_presets("imagenet-*") == ["imagenet-101-4-32", "imagenet-101-4-64", "imagenet-50-4-32"]
    assert connlearn.list_gates("t*") == ["topk"]


class FirstK(TopKGate):
    """A user gate kind written before sampling temperatures: its draw takes no ``temperature``."""

    kind = "firstk"

    @classmethod
    def draw(cls, gates, generator):
        return [torch.zeros(g.shape).index_fill_(1, torch.arange(g.K), 1.0) for g in gates]


def test_a_user_gate_without_a_temperature_trains_at_the_default_and_refuses_another(clean_registries, tmp_path):
    connlearn.register_gate("firstk", FirstK)
    net = connlearn.build(**tiny(gate="firstk"))
    _train_one_step(net)  # the default temperature is not passed to its draw
    assert all((m[:, :2] > 0).all() and (m[:, 2:] == 0).all() for m in net.train().gate_matrices()[1:])
    with pytest.raises(connlearn.ConfigError, match="'firstk' draws without a temperature"):
        net.sample_temperature = 0.5
    recipe = Recipe("r", [Phase(1, 0.1, gate_lr=0.2, temperature_end=0.1)], batch_size=4)
    with pytest.raises(connlearn.ConfigError, match="the recipe's temperature must stay 1"):
        Trainer(net, RandomLoader(), None, recipe, out_dir=tmp_path, progress=False)  # refused when built, not mid-run


class FirstKWithOptions(FirstK):
    """A user gate kind whose draw takes further options as keyword arguments: it is given the temperature."""

    kind = "firstk-options"
    seen: ClassVar[list] = []

    @classmethod
    def draw(cls, gates, generator, **options):
        cls.seen.append(options)
        return FirstK.draw.__func__(cls, gates, generator)


def test_a_user_gate_taking_keyword_options_receives_the_temperature(clean_registries):
    connlearn.register_gate("firstk-options", FirstKWithOptions)
    net = connlearn.build(**tiny(gate="firstk-options")).train()
    net.gate_matrices()
    net.sample_temperature = 0.5
    net.gate_matrices()
    assert FirstKWithOptions.seen == [{}, {"temperature": 0.5}]
