"""Activation checkpointing and held draws: the same training, with less memory or over micro-batches."""

import copy
import pickle
import warnings

import pytest
import torch
import torch.nn.functional as F
from conftest import tiny
from torch.utils.checkpoint import checkpoint

import connlearn
from connlearn import compile as compile_module
from connlearn.blocks import BranchBlock
from connlearn.errors import ConfigError, ConfigTypeError
from connlearn.prune import prune_dead_blocks


@pytest.fixture(autouse=True)
def _fresh_compiler():
    """Compiled here with other settings, the forward pass would count as recompiled in later tests (and be
    compiled for dynamic shapes): each test leaves the compiler's caches as it found them."""
    yield
    torch._dynamo.reset()


def _net(gate="topk", engine="fused", **overrides):
    overrides.setdefault("K", 4 if gate == "full" else 2)
    return connlearn.build(**tiny(gate=gate, engine=engine, **overrides)).train()


def _step(net, x, y, steps=2):
    """Two SGD steps; the losses, and afterwards the gradients, parameters and buffers are what is compared."""
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = F.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return losses


def _assert_same_training(a, b, losses_a, losses_b):
    torch.testing.assert_close(losses_a, losses_b, atol=1e-6, rtol=1e-6)
    for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-6, rtol=1e-6, msg=name)
        torch.testing.assert_close(p, q, atol=1e-6, rtol=1e-6, msg=name)
    for (name, p), q in zip(a.named_buffers(), b.buffers(), strict=True):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=1e-6, msg=name)  # running statistics counted once
    assert torch.equal(a.generator.get_state(), b.generator.get_state())  # one draw per forward pass


@pytest.mark.parametrize("engine", ["fused", "reference"])
@pytest.mark.parametrize("gate", ["topk", "real", "random", "full"])
def test_activation_checkpointing_trains_as_without_it(images, engine, gate):
    plain = _net(gate, engine)
    checkpointed = copy.deepcopy(plain)
    checkpointed.activation_checkpointing = True
    y = torch.arange(len(images)) % 10
    _assert_same_training(plain, checkpointed, _step(plain, images, y), _step(checkpointed, images, y))


def _saved_bytes(net, x):
    saved = []

    def pack(t):
        saved.append(t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        net(x).sum()
    return sum(saved)


@pytest.mark.parametrize("engine", ["fused", "reference"])
def test_activation_checkpointing_keeps_less_for_the_backward_pass(images, engine):
    net = _net(engine=engine, C=8, K=4)
    plain = _saved_bytes(net, images)
    net.activation_checkpointing = True
    assert _saved_bytes(net, images) < plain / 2
    with torch.no_grad():  # nothing recorded, nothing checkpointed
        net(images)


@pytest.mark.parametrize(("gate", "engine"), [("topk", "fused"), ("random", "reference")])
@pytest.mark.parametrize("in_graph", [True, False])
def test_activation_checkpointing_compiled_trains_as_eager(images, monkeypatch, in_graph, gate, engine):
    # in the compiled graph where torch keeps the running statistics as eager training does (2.9 and later),
    # else run eagerly between compiled pieces, with a warning
    if in_graph and not compile_module._COMPILES_CHECKPOINTS:
        pytest.skip(f"PyTorch {torch.__version__} runs checkpointed modules eagerly under torch.compile")
    monkeypatch.setattr(compile_module, "_COMPILES_CHECKPOINTS", in_graph)
    net = _net(gate, engine)
    net.activation_checkpointing = True
    eager = copy.deepcopy(net)
    y = torch.arange(len(images)) % 10
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        graphs = torch._dynamo.explain(copy.deepcopy(net))(images).graph_count
        torch._dynamo.reset()
        losses = _step(torch.compile(net, backend="aot_eager"), images, y)
    assert graphs == 1 if in_graph else graphs > 1
    assert any("runs each checkpointed module eagerly" in str(w.message) for w in caught) is not in_graph
    _assert_same_training(eager, net, _step(eager, images, y), losses)


class _BreakingBlock(BranchBlock):
    """A block kind the compiler cannot trace whole: a graph break before its batch norm."""

    params = ("width",)

    def __init__(self, in_ch, out_ch, stride, branches, *, width):
        super().__init__(in_ch, out_ch, stride, branches, width=width)
        self.conv = torch.nn.Conv2d(branches * in_ch, branches * out_ch, 3, stride, 1, groups=branches, bias=False)
        self.bn = torch.nn.BatchNorm2d(branches * out_ch)

    def forward(self, x):
        h = self.conv(x)
        torch._dynamo.graph_break()
        return self.bn(h)


def test_a_compiled_module_that_breaks_the_graph_is_checkpointed_eagerly_and_counts_each_batch_once(
        images, clean_registries):
    connlearn.register_block("breaking", _BreakingBlock)
    net = _net(block="breaking")
    net.activation_checkpointing = True
    eager = copy.deepcopy(net)
    y = torch.arange(len(images)) % 10
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the graph breaks, and before PyTorch 2.9 the eager checkpoints
        losses = _step(torch.compile(net, backend="aot_eager"), images, y)
    _assert_same_training(eager, net, _step(eager, images, y), losses)


@pytest.mark.parametrize("reentrant", [False, True])
def test_checkpointing_the_whole_network_is_refused_unless_the_draw_is_held(images, reentrant):
    # its recomputation runs the forward pass again, which would draw another connectivity: wrong gradients
    net = _net()
    with pytest.raises(ConfigError, match="hold_draw"):
        checkpoint(net, images.clone().requires_grad_(reentrant), use_reentrant=reentrant).sum().backward()


def test_a_hold_opened_after_the_forward_pass_does_not_let_the_recomputation_draw_anew(images):
    net = _net()
    out = checkpoint(net, images, use_reentrant=False)  # drawn outside any hold
    with net.hold_draw(), pytest.raises(ConfigError, match="hold_draw"):
        out.sum().backward()


@pytest.mark.parametrize("reentrant", [False, True])
def test_checkpointing_the_whole_network_inside_hold_draw_trains_as_without_it(images, reentrant):
    plain = _net()
    held = copy.deepcopy(plain)
    y = torch.arange(len(images)) % 10
    F.cross_entropy(plain(images), y).backward()
    with held.hold_draw():
        F.cross_entropy(checkpoint(held, images.clone().requires_grad_(reentrant), use_reentrant=reentrant),
                        y).backward()
    for p, q in zip(plain.parameters(), held.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-6, rtol=1e-6)
    assert torch.equal(plain.generator.get_state(), held.generator.get_state())


def test_hold_draw_gives_every_micro_batch_the_connectivity_of_one_draw(images):
    net, once = _net(), _net()
    net.record_draws()
    with net.hold_draw() as held:
        assert held is net
        first = net.gate_matrices()
        for part in images.split(2):
            net(part).sum().backward()
        with net.hold_draw():  # an inner block holds the outer block's draw
            net(images)
        assert all(torch.equal(a, b) for a, b in zip(first, net.gate_matrices(), strict=True) if a is not None)
    assert net.draw_statistics()["drawn_distinct"] == 1.0
    once.gate_matrices()
    assert torch.equal(net.generator.get_state(), once.generator.get_state())  # the generator moved once
    net(images)  # released: the next forward pass draws anew
    once.gate_matrices()
    assert torch.equal(net.generator.get_state(), once.generator.get_state())


def test_a_held_draw_stays_with_its_block_not_with_copies(images):
    net = _net()
    with net.hold_draw():
        net(images)
        for other in (copy.deepcopy(net), pickle.loads(pickle.dumps(net))):
            assert other._hold is None
            before = other.generator.get_state()
            other(images)
            assert not torch.equal(before, other.generator.get_state())  # it draws


def test_the_setting_is_checked_and_kept_by_copies_engines_and_pruning():
    net = _net(gate="random", C=8, K=1)
    with pytest.raises(ConfigTypeError, match="activation_checkpointing"):
        net.activation_checkpointing = "yes"
    net.activation_checkpointing = True
    assert "activation_checkpointing" not in str(list(net.state_dict()))
    for other in (copy.deepcopy(net), pickle.loads(pickle.dumps(net)), net.to_engine("reference"),
                  prune_dead_blocks(net)[0]):
        assert other.activation_checkpointing is True
    assert _net().activation_checkpointing is False
