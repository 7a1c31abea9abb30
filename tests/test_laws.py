"""The laws of the core: the network computes its branch-by-branch oracle, K=C is ResNeXt, the straight-through
gradient, the law of the draws, K ones per training row, pruning keeps the outputs, the paper's parameter counts,
the starts and the gate rules."""

import copy
import itertools
import math

import pytest
import torch
from conftest import SHAPES, batch, built, shaped, tiny
from hypothesis import given, settings
from hypothesis import strategies as st
from oracle import Oracle
from plain_resnext import PlainResNeXt
from torch import nn

import connlearn
from connlearn.gates import GATES, gumbel_topk, random_tie_order, topk_mask
from connlearn.graph import BranchGraph, dead_blocks
from connlearn.net import FusedModule, SingleStreamModule, mix_branches
from connlearn.prune import prune_dead_blocks
from connlearn.updater import GateUpdater, drop_gate_group, param_groups
from connlearn.wiring import spender


@st.composite
def configs(draw):
    C = draw(st.integers(1, 6))
    topology = draw(st.sampled_from(["resnext", "dense"]))
    gate = draw(st.sampled_from([g for g in GATES.names() if g != "frozen" and (g != "full" or topology == "resnext")]))
    dims = draw(st.sampled_from([2, 1, 0]))
    block = "vector" if dims == 0 else draw(st.sampled_from(["bottleneck", "basic"]))
    budget = {"density": draw(st.sampled_from([0.05, 0.3, 1.0])), "K": None} if spender(GATES.get(gate)) and draw(
        st.booleans()) else {"K": C if gate == "full" else draw(st.integers(1, C))}  # one budget, or K a block
    return topology, shaped(dims, C=C, **budget, gate=gate,
                            M=draw(st.sampled_from([3, 6])), block=block,
                            seed=draw(st.integers(0, 100)), gate_init=draw(st.sampled_from([0.5, "uniform"])),
                            residual_init=draw(st.sampled_from(["auto", "sqrt_k", "one", "zero"])),
                            kernels=draw(st.sampled_from([None, (1, 3, 5)])) if block == "bottleneck" else None), draw(
        st.booleans())


@given(configs())
def test_the_network_computes_its_oracle_outputs_and_gradients(config):
    topology, options, train = config
    net = built(topology, **options).train(train).double()  # float64: a ReLU input within rounding
    x = batch(net, 4, dtype=torch.float64)                  # of 0 falls alike in both
    out = net(x)
    oracle = Oracle(net)  # after the pass: the gates' last perturbations (gumbel, imle) are the draw's
    torch.testing.assert_close(oracle(x, net.last_draw), out)
    target = torch.randn(4, 10, dtype=torch.float64)
    (out * target).sum().backward()
    (oracle(x, net.last_draw) * target).sum().backward()
    for name, p in net.named_parameters():
        expected = oracle.grad_of(net, name)
        if p.grad is None:  # a score-function gate learns from the loss itself, not through the outputs
            assert expected is None
            continue
        torch.testing.assert_close(p.grad, expected, atol=1e-9 * max(1.0, expected.abs().max().item()), rtol=1e-7)


def test_a_module_that_reads_part_of_the_previous_one_computes_its_oracle():
    graph = connlearn.build(**tiny(C=4, K=2)).graph()
    for block in graph.branches(2):
        graph.remove_edge("m1.b4", block)
    net = connlearn.from_graph(graph).eval()
    oracle = Oracle(net)
    for size in (3, 0):
        x = torch.randn(size, 3, 32, 32)
        torch.testing.assert_close(net(x), oracle(x))


def _randomise_bn(net):
    g = torch.Generator().manual_seed(3)
    for m in net.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.weight.data = torch.rand(m.weight.shape, generator=g) + 0.5
            m.bias.data = torch.randn(m.bias.shape, generator=g) * 0.1
            m.running_mean = torch.randn(m.running_mean.shape, generator=g) * 0.1
            m.running_var = torch.rand(m.running_var.shape, generator=g) + 0.5


def test_full_is_a_plainly_written_resnext(images):
    net = connlearn.build(**tiny(M=6, K=None, gate="full"))
    assert all(isinstance(s, SingleStreamModule) for s in net.stages)
    _randomise_bn(net)
    plain = PlainResNeXt(4, 2, 2, 4, 8, 10)
    src = [v for k, v in net.state_dict().items() if not k.endswith("_extra_state")]
    plain.load_state_dict(dict(zip(plain.state_dict(), src, strict=True)))
    for mode in (True, False):
        torch.testing.assert_close(net.train(mode)(images), plain.train(mode)(images), atol=1e-5, rtol=1e-5)


def test_k_equals_c_gating_computes_resnext_from_converted_weights(images):
    """All C inputs on: x' = ReLU(P(x) + mean_j F_j(x)), ResNeXt up to each branch's own last BN: give each
    branch C times its slice of ResNeXt's last conv and a copy of its last BN."""
    full = connlearn.build(**tiny(M=6, K=None, gate="full"))
    _randomise_bn(full)
    gated = connlearn.build(**tiny(M=6, K=4, gate="topk"))
    state, fs = gated.state_dict(), full.state_dict()
    state.update({k: v for k, v in fs.items() if k.startswith(("stem.", "head.")) or ".proj." in k})
    for pos, stage in enumerate(gated.stages):
        c, f, g = stage.branches, f"stages.{pos}.body.", f"stages.{pos}.block."
        state.update({g + k[len(f):]: v for k, v in fs.items() if k.startswith((f + "conv1", f + "conv2", f + "bn1",
                                                                                 f + "bn2"))})
        state[g + "conv3.weight"] = torch.cat([c * p for p in fs[f + "conv3.weight"].chunk(c, dim=1)])
        for attr in ("weight", "bias", "running_mean", "running_var"):
            state[g + "bn3." + attr] = fs[f + "bn3." + attr].repeat(c)
    gated.load_state_dict(state)
    torch.testing.assert_close(gated.eval()(images), full.eval()(images), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("gate", ["topk", "real"])
@pytest.mark.parametrize("topology", ["resnext", "dense"])
def test_every_gate_gets_the_loss_derivative_at_the_drawn_matrix(gate, topology):
    """Straight-through: forward with the draw G, and every gate, drawn or not, gets dl/dG_jk (1/K included):
    the loss's derivative with G a free variable, by central differences in float64."""
    net = connlearn.build(topology, **tiny(C=3, K=2, M=3 if topology == "resnext" else 6, gate=gate, width=1,
                                           num_classes=3, stem_channels=3, base_channels=4, gate_init="uniform"))
    net = net.double().train()
    x, target = torch.randn(3, 3, 6, 6, dtype=torch.float64), torch.randn(3, 3, dtype=torch.float64)
    state = net.generator.get_state()
    (net(x) * target).sum().backward()
    gates = dict(net.gates())
    drawn = {m: net.last_draw[i] if gate == "topk" else g.real.detach().clone()
             for i, (m, g) in enumerate(gates.items(), start=1)}
    net.generator.set_state(state)
    for m, g in gates.items():
        g.matrix = (lambda fixed: lambda drawn=None: fixed)(drawn[m])  # the forward pass's matrices, as variables
    for m, g in gates.items():
        numeric = torch.zeros_like(drawn[m])
        for j, k in itertools.product(*map(range, drawn[m].shape)):
            losses = []
            for step in (1e-6, -1e-6):
                moved = drawn[m].clone()
                moved[j, k] += step
                g.matrix = (lambda fixed: lambda drawn=None: fixed)(moved)
                with torch.no_grad():
                    losses.append((net(x) * target).sum().item())
            numeric[j, k] = (losses[0] - losses[1]) / 2e-6
        g.matrix = (lambda fixed: lambda drawn=None: fixed)(drawn[m])
        torch.testing.assert_close(g.real.grad, numeric, atol=1e-5 * max(1.0, numeric.abs().max().item()), rtol=1e-4)
        if gate == "topk":
            assert (g.real.grad[drawn[m] == 0] != 0).any()  # the undrawn gates learn too


def _law_of_sets(p, K):
    """The probability of each K-set under K successive draws without replacement from ``p``."""
    law = {}
    for order in itertools.permutations(range(len(p)), K):
        chance, left = 1.0, 1.0
        for i in order:
            chance, left = (chance * p[i] / left, left - p[i]) if left > 1e-15 else (0.0, left)
        law[frozenset(order)] = law.get(frozenset(order), 0.0) + chance
    return law


def test_draws_follow_k_successive_draws_without_replacement():
    """Algorithm 1: K distinct samples from w^(1/T) / Σ, on the law of whole K-sets, for random gates with
    zeros among them at three temperatures; where K exceeds the positive gates, the rest uniformly."""
    g, n = torch.Generator().manual_seed(0), 20_000
    for trial in range(24):
        C = int(torch.randint(1, 6, (1,), generator=g))
        K = int(torch.randint(1, C + 1, (1,), generator=g))
        w, T = torch.rand(C, generator=g) * (torch.rand(C, generator=g) > 0.25), (1.0, 0.5, 2.0)[trial % 3]
        p = w ** (1 / T) / (w ** (1 / T)).sum() if w.sum() > 0 else torch.full((C,), 1 / C)
        counts: dict = {}
        for row in gumbel_topk([w.expand(n, C)], K, torch.Generator().manual_seed(trial), temperature=T)[0].bool():
            key = frozenset(row.nonzero().flatten().tolist())
            counts[key] = counts.get(key, 0) + 1
        positive, zeros = [i for i in range(C) if p[i] > 0], [i for i in range(C) if p[i] == 0]
        law = _law_of_sets(p.tolist(), K) if len(positive) >= K else {
            frozenset(positive) | frozenset(c): 1 / math.comb(len(zeros), K - len(positive))
            for c in itertools.combinations(zeros, K - len(positive))}
        for key in set(law) | set(counts):
            expected, seen = law.get(key, 0.0), counts.get(key, 0) / n
            assert (seen == 0) if expected == 0 else abs(seen - expected) < 5.5 * math.sqrt(
                expected * (1 - expected) / n + 1e-12), (trial, sorted(key), expected, seen)


@pytest.mark.parametrize("gate", [g for g in GATES.names() if g != "frozen"])
def test_every_training_row_has_k_ones_and_eval_is_the_top_k(gate):
    net = connlearn.build(**tiny(C=5, K=5 if gate == "full" else 2, gate=gate, gate_init="uniform")).train()
    x = torch.randn(2, 3, 32, 32)
    for _ in range(3):
        net(x)
        matrices = list(net.last_draw.values()) or [g.matrix(None).detach() if g.averaged else g.active().double()
                                                    for _, g in net.gates() if not g.weighted]  # real: every input
        for drawn in matrices:  # a draw of each module, or one per example ([B, 5, 5])
            assert drawn.shape[-2:] == (5, 5) and set(drawn.unique().tolist()) <= {0.0, 1.0}
            assert (drawn.sum(-1) == net.K).all()
    net.eval()
    for _, g in net.gates():
        assert (g.active().sum(1) == net.K).all()
        if g.learnable:  # edge weights: the top-K of their magnitudes
            assert torch.equal(g.active(), topk_mask(g.values() if g.averaged else g.values().abs(), net.K, g.ties()))
    assert torch.equal(net(x), net(x))


@settings(max_examples=10)
@given(seed=st.integers(0, 10**6), topology=st.sampled_from(["resnext", "dense"]), K=st.integers(1, 2),
       shape=st.sampled_from([(2, None), (2, (1, 3, 5)), (1, None), (1, (1, 3, 5)), (0, None)]))
def test_pruning_keeps_the_eval_outputs_and_reports_what_it_removed(seed, topology, K, shape):
    dims, kernels = shape
    net = connlearn.build(topology, kernels=kernels,
                          **shaped(dims, C=4, K=K, M=6, seed=seed, gate_init="uniform")).freeze().eval()
    x = batch(net, 3)
    pruned, report = prune_dead_blocks(net)
    torch.testing.assert_close(pruned.eval()(x), net(x), atol=1e-5, rtol=1e-5)
    assert report.blocks_before - report.blocks_after == len(dead_blocks(net.graph()))
    assert report.params_after == pruned.num_parameters() and 0 <= report.saving < 1
    assert not dead_blocks(pruned.graph())


@pytest.mark.parametrize(("preset", "millions"), [("cifar-20-4-8", 0.28), ("cifar-29-8-8", 0.86)])
def test_gated_parameter_counts_are_the_papers(preset, millions):
    assert round(connlearn.build(preset=preset).num_parameters() / 1e6, 2) == millions


@pytest.mark.parametrize(("preset", "classes", "millions"), [("cifar-29-64-8", 10, 34.4), ("imagenet-50-4-32", 1000,
                                                                                             25.0)])
def test_full_has_resnexts_published_parameter_counts(preset, classes, millions):
    with torch.device("meta"):
        net = connlearn.build(preset=preset, gate="full", num_classes=classes)
    assert round(net.num_parameters() / 1e6, 1) == millions


def test_unlike_branches_get_their_kernels_in_every_module():
    net = connlearn.build(kernels=(1, 3, 5), **tiny(C=4))
    for stage in net.stages:
        assert [b.conv2.kernel_size[0] for b in stage.block.branch_modules] == [1, 3, 5, 1]
    alike = connlearn.build(gate="full", kernels=(3,), **tiny(C=4, K=4))  # alike: ResNeXt
    assert all(isinstance(s, SingleStreamModule) for s in alike.stages)


def test_the_default_is_figure_3s_model_and_gates_count_only_when_asked():
    net = connlearn.build()
    assert (net.K, len(net.module_ids), net.num_classes) == (4, 9, 100)
    assert net.num_parameters(gates=True) - net.num_parameters() == 8 * 8 * 8


@given(seed=st.integers(0, 10**6), gate=st.sampled_from(["topk", "real", "random"]),
       shape=st.sampled_from([(2, None), (2, (1, 3, 5)), (1, None), (0, None)]))
def test_a_graph_compiles_to_the_network_it_came_from(seed, gate, shape):
    dims, kernels = shape
    net = connlearn.build("dense", kernels=kernels,
                          **shaped(dims, seed=seed, gate=gate, M=6, gate_init="uniform")).eval()
    graph = BranchGraph.from_json(net.graph().to_json())
    assert graph.graph == net.graph().graph and list(graph.edges(data=True)) == list(net.graph().edges(data=True))
    assert list(graph.nodes(data=True)) == list(net.graph().nodes(data=True))
    again = connlearn.from_graph(graph).eval()
    again.load_state_dict(net.state_dict())
    x = batch(net)
    torch.testing.assert_close(again(x), net(x))
    assert all(torch.equal(a, b) for a, b in zip(again.connectivity().values(), net.connectivity().values(),
                                                            strict=True))


def test_freezing_keeps_the_top_k_and_its_outputs():
    net = connlearn.build(**tiny(gate_init="uniform")).eval()
    x, before = torch.randn(2, 3, 32, 32), net.connectivity()
    out = net(x)
    net.freeze()
    assert net.gate_kind == "frozen" and net.graph().gate_label() == "frozen from topk" and not net.gate_parameters()
    torch.testing.assert_close(net(x), out)
    assert all(torch.equal(before[m], after) for m, after in net.connectivity().items())


@given(rows=st.integers(1, 4), cols=st.integers(2, 5))
def test_a_random_tie_order_ranks_every_input_first_equally_often(rows, cols):
    firsts = topk_mask(torch.ones(4000, rows, cols), 1, random_tie_order(4000 * rows, cols, torch.Generator()
                                                                         .manual_seed(0)).view(4000, rows, cols))
    share = firsts.float().mean(dim=(0, 1))
    assert (share - 1 / cols).abs().max() < 5 * math.sqrt(1 / cols / (4000 * rows))


@given(seed=st.integers(0, 10**6), K=st.integers(1, 4))
def test_topk_mask_is_a_sort_of_value_then_tie_rank(seed, K):
    g = torch.Generator().manual_seed(seed)
    values, order = torch.randint(0, 3, (3, 6), generator=g).float(), random_tie_order(3, 6, g)
    expected = torch.zeros(3, 6, dtype=torch.bool)
    for r in range(3):
        best = sorted(range(6), key=lambda c: (-values[r, c].item(), -order[r, c].item()))[:K]
        expected[r, best] = True
    assert torch.equal(topk_mask(values, K, order), expected)


def _stepped(net, grad_mode, gate_momentum=None):
    opt = torch.optim.SGD(param_groups(net, 0.1, 5e-4, 5.0, gate_momentum), lr=0.1, momentum=0.9)
    GateUpdater(net, grad_mode=grad_mode).attach(opt)
    return opt


@pytest.mark.parametrize("mode", ["plain", "centered", "renormalized"])
def test_gate_rules_keep_the_gates_in_0_1_and_do_what_they_promise(mode):
    net = connlearn.build(**tiny(gate_init="uniform"))
    opt, x = _stepped(net, mode), torch.randn(4, 3, 32, 32)
    seen = []
    opt.register_step_pre_hook(lambda *_: seen.append([p.grad.clone() for p in net.gate_parameters()]))
    for _ in range(3):
        opt.zero_grad()
        net(x).square().sum().backward()
        opt.step()
    for gate, grad in zip(net.gate_parameters(), seen[-1], strict=True):
        assert gate.min() >= 0 and gate.max() <= 1
        if mode == "centered":
            torch.testing.assert_close(grad.mean(dim=1), torch.zeros(grad.shape[0]), atol=1e-6, rtol=0)


def test_renormalizing_divides_each_row_by_its_sum_and_keeps_the_draws():
    net = connlearn.build(**tiny(gate_init="uniform"))
    gates = [p.detach().clone() for p in net.gate_parameters()]
    GateUpdater(net, grad_mode="renormalized").renormalize()
    for before, after in zip(gates, net.gate_parameters(), strict=True):
        torch.testing.assert_close(after.sum(dim=1), torch.ones(after.shape[0]))
        torch.testing.assert_close(after * before.sum(dim=1, keepdim=True), before)


def test_a_step_the_grad_scaler_skips_leaves_the_gates_alone():
    net = connlearn.build(**tiny())
    opt = _stepped(net, "plain")
    scaler = torch.amp.GradScaler("cpu")
    with torch.no_grad():
        net.gate_parameters()[0][0, 0] = 1.5  # a clip would move it: the updater does not run either
    before = [p.detach().clone() for p in net.gate_parameters()]
    scaler.scale(net(torch.randn(2, 3, 32, 32)).sum() * float("inf")).backward()
    scaler.step(opt)
    assert all(torch.equal(a, b) for a, b in zip(before, net.gate_parameters(), strict=True))


@pytest.mark.parametrize("kind", ["plain", "sequential"])
def test_drop_gate_group_takes_the_gates_from_the_optimizer_and_its_schedulers(kind):
    net = connlearn.build(**tiny())
    opt = _stepped(net, "plain")
    inner = torch.optim.lr_scheduler.StepLR(opt, 1)
    sched = inner if kind == "plain" else torch.optim.lr_scheduler.SequentialLR(opt, [inner], milestones=[])
    net.freeze()
    assert len(drop_gate_group(opt, sched)) == len(dict(net.gates())) and len(opt.param_groups) == 1
    opt.step()
    sched.step()
    assert len(inner.get_last_lr()) == 1


def test_a_held_draw_is_used_by_every_pass_and_checkpointing_changes_nothing():
    net = connlearn.build(**tiny())
    x = torch.randn(4, 3, 32, 32)
    with net.hold_draw():
        net(x)
        first = dict(net.last_draw)
        net(x)
        assert all(torch.equal(first[i], d) for i, d in net.last_draw.items())
    twin = copy.deepcopy(net)
    twin.activation_checkpointing = True
    net(x).sum().backward()
    twin(x).sum().backward()
    for (name, p), q in zip(net.named_parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, msg=name)
    for a, b in zip(net.buffers(), twin.buffers(), strict=True):  # each batch counted once in the BN statistics
        torch.testing.assert_close(a, b)
    whole = torch.utils.checkpoint.checkpoint(net, x, use_reentrant=False)
    with pytest.raises(connlearn.ConfigError, match="hold_draw"):
        whole.sum().backward()


@given(seed=st.integers(0, 1000), n=st.integers(1, 3), c=st.integers(1, 4))
def test_the_gate_mix_keeps_channels_last_and_its_values(seed, n, c):
    g = torch.Generator().manual_seed(seed)
    inputs = [torch.randn(2, c * 3, 5, 5, generator=g) for _ in range(n)]
    mix = torch.rand(c, n * c, generator=g)
    last = mix_branches([t.contiguous(memory_format=torch.channels_last) for t in inputs], mix, 3)
    assert last.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(last, mix_branches(inputs, mix, 3))


def test_a_state_dict_carries_the_draws_and_refuses_another_fan_in():
    net, twin = connlearn.build(**tiny(seed=1)), connlearn.build(**tiny(seed=2))
    net(torch.randn(2, 3, 32, 32))
    twin.load_state_dict(net.state_dict())
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(twin(x), net(x))
    with pytest.raises(connlearn.CheckpointError, match="K=2"):
        connlearn.build(**tiny(K=3)).load_state_dict(net.state_dict())


def test_the_starts_scale_the_last_norms_and_inner_convolutions():
    one, sqrt_k = connlearn.build(**tiny(residual_init="one")), connlearn.build(**tiny(residual_init="sqrt_k"))
    resnext = connlearn.build(**tiny(conv_init="resnext"))
    assert torch.all(sqrt_k.stages[0].block.bn3.weight == math.sqrt(2))
    assert torch.all(one.stages[0].block.bn3.weight == 1)
    assert torch.all(sqrt_k.stages[-1].block.bn3.weight == math.sqrt(4))  # the head averages all C
    torch.testing.assert_close(resnext.stages[1].block.conv1.weight, sqrt_k.stages[1].block.conv1.weight / 2)
    assert isinstance(one.stages[0], FusedModule)


def test_conv_init_scales_the_gated_blocks_and_leaves_resnext_its_own_start():
    """``resnext`` divides a gated block's conv1 and conv2 by sqrt(C) (ResNeXt's scale for those layers);
    ``branch`` and leaving it out keep the gated blocks' own; Fixed-Full's single stream keeps ResNeXt's own
    start whatever it says (the same weights from the same seed)."""
    full = {init: connlearn.build(**tiny(M=6, K=None, gate="full", conv_init=init)) for init in (None, "branch",
                                                                                                  "resnext")}
    gated = {init: connlearn.build(**tiny(M=6, conv_init=init)) for init in (None, "branch", "resnext")}
    for pos, stage in enumerate(full[None].stages):
        for layer in ("conv1", "conv2", "conv3"):
            own = getattr(stage.body, layer).weight
            assert all(torch.equal(getattr(full[i].stages[pos].body, layer).weight, own) for i in ("branch", "resnext"))
        for layer in ("conv1", "conv2"):
            own = getattr(gated[None].stages[pos].block, layer).weight
            torch.testing.assert_close(getattr(gated["resnext"].stages[pos].block, layer).weight, own / 2)  # sqrt(4)
            assert torch.equal(getattr(gated["branch"].stages[pos].block, layer).weight, own)


def test_a_meta_device_network_gives_its_graph():
    with torch.device("meta"):
        net = connlearn.build(**tiny(gate="real"))
    assert net.graph().graph["weighted_inputs"] and net.graph().gate_matrix(2) == net._graph.gate_matrix(2)


def test_a_checkpoint_saved_on_the_per_branch_engine_loads_with_its_function():
    """The per-branch engine connlearn once had saved each module's blocks as ``stages.{i}.blocks.{j}.*``, as
    the oracle holds them."""
    from connlearn.train import make_checkpoint, net_from_checkpoint

    net = connlearn.build(**tiny(gate_init="uniform")).eval()
    branched = {k: v for k, v in Oracle(net).state_dict().items() if ".blocks." in k}
    state = {**{k: v for k, v in net.state_dict().items() if ".block." not in k}, **branched}
    loaded = net_from_checkpoint({**make_checkpoint(net), "engine": "reference", "model": state}).eval()
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(loaded(x), net(x))


def test_torch_compile_captures_a_training_pass_in_one_graph_with_the_same_outputs():
    """The draw runs eagerly, first: the rest of a training forward pass is one graph (CUDA graphs capture it)."""
    net, x = connlearn.build(**tiny()), torch.randn(4, 3, 32, 32)
    assert torch._dynamo.explain(net)(x).graph_count == 1
    twin = copy.deepcopy(net)
    compiled = torch.compile(twin, backend="aot_eager")
    torch.testing.assert_close(compiled(x), net(x))
    torch.testing.assert_close(compiled.eval()(x), net.eval()(x))


@pytest.mark.parametrize("dims", [2, 1, 0])
def test_a_pruned_network_exports_to_what_it_computes_at_every_dimensionality(dims, tmp_path):
    from connlearn.export import export

    net = connlearn.build(**shaped(dims, K=1, gate_init="uniform")).freeze().eval()
    pruned = prune_dead_blocks(net)[0].eval()
    x = batch(net, 3)
    files = export(pruned, tmp_path / "m.ts", "torchscript") + export(pruned, tmp_path / "m.pt2", "export")
    torch.testing.assert_close(torch.jit.load(str(files[0]))(x), net(x), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.export.load(str(files[1])).module()(x), net(x), atol=1e-5, rtol=1e-5)
    if dims < 2:  # the network's own shapes: a signal network takes signals, a vector one vectors
        assert pruned.input_size == SHAPES[dims][0]["input_size"]
