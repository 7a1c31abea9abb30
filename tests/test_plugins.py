"""Every registered block kind, gate kind and topology builds, trains a step, freezes, prunes and draws; kinds of a
user's own plug in through the registries and entry points, through the same interface."""

from importlib import metadata

import pytest
import torch
from conftest import batch, shaped, tiny
from oracle import Oracle
from torch import nn

import connlearn
from connlearn.blocks import BLOCKS, BranchBlock, Looped, block_dims, conv
from connlearn.gates import GATES, LearnedGate
from connlearn.graph import BranchGraph, block_name
from connlearn.registry import Registry
from connlearn.updater import GateUpdater, param_groups


def _train_freeze_prune_draw(net, tmp_path):
    opt = torch.optim.SGD(param_groups(net, 0.1, 5e-4, 0.2), lr=0.1, momentum=0.9)
    GateUpdater(net).attach(opt)
    loss = net(batch(net, 4)).logsumexp(1).mean()
    loss.backward()
    opt.step()
    assert torch.isfinite(loss) and all(torch.isfinite(p).all() for p in net.parameters())
    if connlearn.prune.freezing_changes_outputs(net):
        net.freeze()
    pruned, _ = connlearn.prune_dead_blocks(net, freeze=True)
    x = batch(net)
    torch.testing.assert_close(pruned.eval()(x), net.freeze().eval()(x), atol=1e-5, rtol=1e-5)
    connlearn.render.save(net.graph(), tmp_path / "c.dot")


@pytest.mark.parametrize("gate", [g for g in GATES.names() if g != "frozen"])
@pytest.mark.parametrize("topology", connlearn.list_topologies())
def test_every_registered_gate_kind_and_topology_trains_freezes_prunes_and_draws(gate, topology, tmp_path):
    if gate == "full" and topology == "dense":
        pytest.skip("full is ResNeXt's connectivity")
    options = {"resnext": {"preset": "cifar-20-4-8", "num_classes": 10},  # {20,4,8}
               "neural-graph": {"nodes": [4, 4], "stem_nodes": 4, "features": 2, "image_size": 8}}.get(
        topology, tiny(M=6))
    C = 8 if topology == "resnext" else 4  # the neural graph's: its stem's nodes
    net = connlearn.build(topology, **{**options, "gate": gate, "K": C if gate == "full" else C // 2})
    _train_freeze_prune_draw(net, tmp_path)


@pytest.mark.parametrize("block", connlearn.list_blocks())
def test_every_registered_block_kind_runs_and_computes_its_oracle_at_every_dimensionality_it_takes(block, tmp_path):
    for dims in block_dims(BLOCKS.get(block)):
        net = connlearn.build(**shaped(dims, block=block)).eval()
        torch.testing.assert_close(Oracle(net)(batch(net)), net(batch(net)))
        _train_freeze_prune_draw(net.train(), tmp_path)


class PlainBlock(BranchBlock):
    """A user's block kind: one grouped 3x3 convolution, no norm (so residual_init 'auto' leaves it as built)."""

    params = ("width",)

    def __init__(self, in_ch, out_ch, stride, branches, *, width):
        super().__init__(in_ch, out_ch, stride, branches, width=width)
        self.conv = conv(in_ch, out_ch, 3, branches, stride)

    def forward(self, x):
        return self.conv(x)


def _one_branch(in_ch, out_ch, stride):
    return nn.Sequential(nn.Conv2d(in_ch, out_ch, 3, stride, 1), nn.BatchNorm2d(out_ch))


@pytest.mark.parametrize("kind", [PlainBlock, Looped(_one_branch)])
def test_a_users_block_kind_plugs_in_and_computes_its_oracle(kind, clean_registries, tmp_path):
    connlearn.register_block("mine", kind)
    net = connlearn.build(**tiny(block="mine")).eval()
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(Oracle(net)(x), net(x))
    _train_freeze_prune_draw(net, tmp_path)


class SharpGate(LearnedGate):
    """A user's gate kind: deterministic, the softmax of the gates weights every input (learned, not drawn)."""

    clipped, weighted = False, True

    def matrix(self, drawn=None):
        return self.K * self.real.softmax(dim=1)


def test_a_users_gate_kind_and_topology_plug_in(clean_registries, tmp_path):
    connlearn.register_gate("sharp", SharpGate)

    @connlearn.register_topology("chain")
    def chain(*, C=2, gate="topk", seed=0):
        g = BranchGraph(gate=gate, K=1, seed=seed)
        g.add_node("input", kind="input", in_channels=3, out_channels=4, image_size=32, resolution=32,
                   stem={"kernel": 3, "stride": 1, "maxpool": False})
        for m in (1, 2):
            for j in range(1, C + 1):
                g.add_node(block_name(m, j), kind="block", module=m, branch=j, block="basic", in_channels=4,
                           out_channels=4, stride=1, resolution=32, params={"width": 2})
        g.add_edges_from((("input", block_name(1, j)) for j in range(1, C + 1)), kind="fixed")
        g.add_edges_from(((block_name(1, k), block_name(2, j)) for j in range(1, C + 1) for k in range(1, C + 1)),
                         kind="gate", gate=0.5)
        g.add_edges_from(((block_name(2, j), "output") for j in range(1, C + 1)), kind="fixed")
        g.add_node("output", kind="output", in_channels=4, num_classes=3)
        return g

    net = connlearn.build("chain", gate="sharp", C=3)
    assert net.gate_parameters() and not GateUpdater(net).gates()  # learned, and not clipped
    assert connlearn.prune.freezing_changes_outputs(net)
    _train_freeze_prune_draw(net, tmp_path)


def test_plug_ins_load_from_entry_points_and_a_broken_one_says_why(monkeypatch):
    points = [metadata.EntryPoint("wide", "connlearn.blocks:Basic", "connlearn.blocks"),
              metadata.EntryPoint("broken", "no_such_module:Kind", "connlearn.blocks")]
    monkeypatch.setattr(metadata, "entry_points", lambda group: points if group == "connlearn.blocks" else [])
    registry = Registry("block kind", "connlearn.blocks")
    with pytest.warns(RuntimeWarning, match="broken"):
        assert registry.names() == ["wide"]
    with pytest.raises(connlearn.ConfigError, match="no_such_module"):
        registry.get("broken")
