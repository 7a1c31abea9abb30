"""Laws of the gates, graphs, gate updater, pruning and connectivity that the other test files leave open:
tie orders are uniform, the order of a graph's edges is immaterial, renormalising gives the sampled
distribution, a fixed net keeps its connectivity, the fused engine agrees with the reference on partial reads,
and a block's wrong output shape is named in every module."""

import math

import pytest
import torch
from conftest import tiny
from hypothesis import given
from hypothesis import strategies as st

import connlearn
from connlearn.gates import active_masks, gumbel_topk, random_tie_order, topk_mask
from connlearn.graph import BranchGraph
from connlearn.prune import prune_dead_blocks
from connlearn.updater import GateUpdater, drop_gate_group, param_groups


# A tie order is a uniformly random permutation in each row, drawn for each row on its own: every input wins a tie
# equally often, and two rows share their order about as often as two independent permutations do (1/cols!).
@given(rows=st.integers(1, 4), cols=st.integers(2, 5))
def test_a_random_tie_order_ranks_every_input_first_equally_often(rows, cols):
    g = torch.Generator().manual_seed(rows * 10 + cols)  # fixed: the bounds below hold for these draws (4 sigma)
    n = 400
    first, same = torch.zeros(rows, cols), 0
    for _ in range(n):
        order = random_tie_order(rows, cols, g)
        assert torch.equal(order.sort(dim=-1).values, torch.arange(cols).expand(rows, cols))  # ranks 0..cols-1
        first += order == cols - 1  # the input that wins a tie
        same += rows > 1 and torch.equal(order[0], order[1])
    assert ((first / n - 1 / cols).abs() < 0.1).all()
    assert same / n < 1 / math.factorial(cols) + 0.1


# Renormalising makes every row of every gate sum to 1, also the rows of a dense topology's gates (more columns than
# rows) and an emptied row, which becomes uniform.
@given(topology=st.sampled_from(["resnext", "dense"]), seed=st.integers(0, 100), empty=st.booleans())
def test_renormalized_rows_of_every_gate_sum_to_one(topology, seed, empty):
    net = connlearn.build(topology, **tiny(M=9, C=3, K=2, seed=seed, gate_init="uniform"))  # dense: [3, 6] gates
    if empty:
        with torch.no_grad():
            for p in net.gate_parameters():
                p[0] = 0.0
    GateUpdater(net, grad_mode="renormalized").renormalize()
    for p in net.gate_parameters():
        torch.testing.assert_close(p.detach().sum(dim=-1), torch.ones(p.shape[0]))
        if empty:
            torch.testing.assert_close(p.detach()[0], torch.full((p.shape[1],), 1 / p.shape[1]))


# The report's saving is the share of the parameters that pruning removes (the paper's Params-Train against Params-
# Test).
@given(seed=st.integers(0, 10**6), C=st.integers(1, 4), topology=st.sampled_from(["resnext", "dense"]))
def test_the_saving_is_the_share_of_parameters_pruning_removes(seed, C, topology):
    net = connlearn.build(topology, **tiny(C=C, K=1, M=6, seed=seed, gate="random"))
    pruned, report = prune_dead_blocks(net)
    assert report.params_before == net.num_parameters() and report.params_after == pruned.num_parameters()
    assert 0.0 <= report.saving < 1.0
    assert report.saving == pytest.approx((net.num_parameters() - pruned.num_parameters()) / net.num_parameters())
    assert (report.saving > 0) == (report.blocks_after < report.blocks_before)


# A `full` ResNeXt compiled to one stream still gives its all-ones connectivity, which the Trainer reads each epoch
# and `freeze(connectivity)` compares.
@pytest.mark.parametrize("C", [1, 4])
def test_a_single_stream_net_gives_its_full_connectivity(C):
    net = connlearn.build(**tiny(gate="full", C=C, K=C))
    assert net.engine == "single-stream"
    conn = net.connectivity()
    graph = net.graph()
    gated = [m for m in graph.modules() if graph.candidates(m)]
    assert isinstance(conn, dict) and sorted(conn) == gated
    for m in gated:
        assert conn[m].dtype == torch.bool and conn[m].shape == (C, C) and conn[m].all()
    assert net.freeze(conn) is net  # its own connectivity is accepted as the fixed one it is


# The order in which a graph's edges were added (a plug-in topology, a hand-edited document) does not change the
# network it describes.
@given(seed=st.integers(0, 10**6), topology=st.sampled_from(["resnext", "dense"]),
       gate=st.sampled_from(["topk", "random"]))
def test_the_order_in_which_edges_were_added_does_not_matter(seed, topology, gate):
    graph = connlearn.build(topology, **tiny(M=6, C=3, K=2, seed=seed, gate=gate)).graph()
    shuffled = BranchGraph()
    shuffled.graph.update(graph.graph)
    shuffled.add_nodes_from(graph.nodes(data=True))
    shuffled.add_edges_from(reversed(list(graph.edges(data=True))))
    shuffled.validate()
    for node in graph.block_nodes():
        assert [u for u, _, _ in shuffled.gate_edges(node)] == [u for u, _, _ in graph.gate_edges(node)]
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(seed))
    a, b = connlearn.compile_graph(graph).eval(), connlearn.compile_graph(shuffled).eval()
    b.load_state_dict(a.state_dict())
    torch.testing.assert_close(a(x), b(x))


# Sampling reads negative gates as 0 (a GateUpdater with low < 0, or gates set by hand), so renormalising gives the
# distribution that is sampled: non-negative rows summing to 1.
@given(seed=st.integers(0, 10**6), low=st.sampled_from([-1.0, -0.5]))
def test_renormalized_rows_are_the_sampled_distribution_when_gates_are_negative(seed, low):
    net = connlearn.build(**tiny(seed=seed, gate_init="uniform"))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in net.gate_parameters():
            p.copy_(torch.rand(p.shape, generator=g) * (1 - low) + low)  # in [low, 1]
            p[:, 0] = low  # at least one negative gate per row
    expected = []
    for p in net.gate_parameters():
        w = p.detach().clamp(min=0)
        total = w.sum(-1, keepdim=True)
        expected.append(torch.where(total > 0, w / total.clamp(min=1e-30), 1 / w.shape[-1]))  # no positive: uniform
    GateUpdater(net, grad_mode="renormalized", low=low).renormalize()
    for p, e in zip(net.gate_parameters(), expected, strict=True):
        assert (p >= 0).all()
        torch.testing.assert_close(p.detach(), e)


# A fixed net accepts its own connectivity (and returns itself, unchanged) and refuses another one, instead of
# ignoring it.
@given(seed=st.integers(0, 10**6), gate=st.sampled_from(["random", "frozen"]), data=st.data())
def test_a_fixed_net_accepts_its_own_connectivity_and_refuses_another(seed, gate, data):
    net = connlearn.build(**tiny(seed=seed, gate="topk" if gate == "frozen" else gate, gate_init="uniform"))
    if gate == "frozen":
        net.freeze()
    own = net.connectivity()
    assert net.freeze({m: c.clone() for m, c in own.items()}) is net
    assert all(torch.equal(a, b) for a, b in zip(net.connectivity().values(), own.values(), strict=True))
    m = data.draw(st.sampled_from(sorted(own)))
    other = {k: c.clone() for k, c in own.items()}
    other[m] = other[m].roll(1, dims=1)  # still K per row, another connectivity
    if torch.equal(other[m], own[m]):
        other[m] = ~other[m]
    with pytest.raises(connlearn.errors.ConfigError, match="fixed already"):
        net.freeze(other)
    with pytest.raises(connlearn.errors.ConfigError, match="fixed already"):
        net.freeze({k: c for k, c in own.items() if k != m})  # a module left out
    assert all(torch.equal(a, b) for a, b in zip(net.connectivity().values(), own.values(), strict=True))


# Renormalising is invariant to scaling a row and idempotent: a row of small gates, and every row after the first
# renormalisation (which sums to 1), keeps its ratios and does not become uniform.
@given(seed=st.integers(0, 10**6), scale=st.sampled_from([1e-3, 0.1, 0.3, 1.0]))
def test_renormalizing_is_scale_invariant_and_idempotent(seed, scale):
    net = connlearn.build(**tiny(seed=seed, gate_init="uniform"))
    updater = GateUpdater(net, grad_mode="renormalized")
    with torch.no_grad():
        for p in net.gate_parameters():
            p.mul_(scale)
    expected = [p.detach() / p.detach().sum(-1, keepdim=True) for p in net.gate_parameters()]
    updater.renormalize()
    once = [p.detach().clone() for p in net.gate_parameters()]
    updater.renormalize()
    for e, a, p in zip(expected, once, net.gate_parameters(), strict=True):
        torch.testing.assert_close(a, e)
        torch.testing.assert_close(p.detach(), a)


# Leaving a gate edge's `gate` value or `active` flag out is the same as writing their defaults, 0 and false
# (validate() accepts such graphs).
@given(seed=st.integers(0, 10**6), gate=st.sampled_from(["topk", "real", "random"]), data=st.data())
def test_an_edge_without_gate_or_active_reads_as_gate_0_and_inactive(seed, gate, data):
    net = connlearn.build(**tiny(seed=seed, gate=gate, gate_init="uniform"))
    written, left_out = net.graph(), net.graph()
    edges = [(u, v) for u, v, d in written.edges(data=True) if d["kind"] == "gate"]
    picked = data.draw(st.lists(st.sampled_from(edges), min_size=1, max_size=6, unique=True))
    for u, v in picked:
        written.edges[u, v]["gate"] = 0.0
        left_out.edges[u, v].pop("gate")
    for u, v in edges:
        if not written.edges[u, v]["active"]:
            left_out.edges[u, v].pop("active")
    for m in written.modules():
        assert left_out.gate_matrix(m) == written.gate_matrix(m)
    assert sorted(left_out.used_edges()) == sorted(written.used_edges())
    a, b = connlearn.compile_graph(written), connlearn.compile_graph(left_out)
    assert all(torch.equal(x, y) for x, y in zip(a.connectivity().values(), b.connectivity().values(), strict=True))
    assert all(torch.equal(x.values(), y.values()) for (_, x), (_, y) in zip(a.gates(), b.gates(), strict=True))


# drop_gate_group trims the schedulers a SequentialLR or ChainedScheduler holds too: torch's zip would hide their
# extra entry from the learning rate, not from get_last_lr() or a state dict.
@pytest.mark.parametrize("kind", ["sequential", "chained"])
def test_drop_gate_group_trims_the_schedulers_held_by_the_one_passed(kind):
    net = connlearn.build(**tiny())
    opt = torch.optim.SGD(param_groups(net, 0.1, 5e-4, 0.2), lr=0.1, momentum=0.9)
    inner = [torch.optim.lr_scheduler.LambdaLR(opt, lambda e: 0.5), torch.optim.lr_scheduler.ExponentialLR(opt, 0.9)]
    outer = (torch.optim.lr_scheduler.SequentialLR(opt, inner, milestones=[2]) if kind == "sequential"
             else torch.optim.lr_scheduler.ChainedScheduler(inner))
    net.freeze()
    drop_gate_group(opt, outer)
    for _ in range(3):
        opt.step()
        outer.step()
    assert len(opt.param_groups) == 1
    for s in [outer, *inner]:
        assert len(s.get_last_lr()) == 1
    for s in inner:
        assert len(s.base_lrs) == 1


# A dense topology's gates differ in shape: their batched active masks are each gate's own, and recording the draws of
# such a net works.
@given(seed=st.integers(0, 10**6), M=st.sampled_from([9, 12]))
def test_the_active_masks_of_gates_of_several_shapes_are_each_gates_own(seed, M):
    net = connlearn.build("dense", **tiny(M=M, C=3, K=2, seed=seed, gate_init="uniform"))
    gates = [g for _, g in net.gates()]
    assert len({g.shape for g in gates}) > 1
    assert all(torch.equal(a, g.active()) for a, g in zip(active_masks(gates), gates, strict=True))
    net.train().record_draws()
    net(torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(seed)))
    stats = net.draw_statistics()
    assert stats["drawn_distinct"] == 1.0 and 0.0 <= stats["drawn_topk_share"] <= 1.0


# A `topk` net compiled from a `real` net's graph evaluates its top-K, so its graph must not say that it weights every
# input (the pruner's liveness reads that flag).
def test_a_graph_says_weighted_inputs_only_for_the_gates_that_weight_them():
    real = connlearn.build(**tiny(gate="real", K=1, seed=3, gate_init="uniform"))
    graph = real.graph()
    assert graph.graph["weighted_inputs"] is True
    graph.graph["gate"] = "topk"
    topk = connlearn.compile_graph(graph)
    assert "weighted_inputs" not in topk.graph().graph
    assert sorted(topk.graph().used_edges()) == sorted(topk.graph().active_edges())
    assert "weighted_inputs" not in real.freeze().graph().graph


# A frozen net's graph keeps no tie ranks of the learned gates it no longer has.
def test_a_frozen_nets_graph_has_no_tie_ranks():
    net = connlearn.build(**tiny(gate_init="uniform"))
    assert all("tie" in d for _, _, d in net.graph().edges(data=True) if d["kind"] == "gate")
    frozen = net.freeze().graph()
    assert not any("tie" in d for _, _, d in frozen.edges(data=True))
    assert all(frozen.tie_matrix(m) is None for m in frozen.modules() if frozen.candidates(m))


# connectivity() is the top-K of the current gates, not of the graph the net was compiled from.
@given(seed=st.integers(0, 10**6), engine=st.sampled_from(["fused", "reference"]),
       gate=st.sampled_from(["topk", "real"]))
def test_the_connectivity_is_the_top_k_of_the_current_gates(seed, engine, gate):
    net = connlearn.build(**tiny(seed=seed, gate=gate, gate_init="uniform"), engine=engine)
    g = torch.Generator().manual_seed(seed + 1)  # not the seed: that would redraw the initial gates themselves
    with torch.no_grad():
        for p in net.gate_parameters():
            p.copy_(torch.rand(p.shape, generator=g))
    conn = net.connectivity()
    assert sorted(conn) == [m for m, _ in net.gates()]
    for m, gate_module in net.gates():
        assert torch.equal(conn[m], gate_module.active().cpu())
        assert torch.equal(conn[m], torch.tensor(net.graph().gate_matrix(m)[1]))


# Under weighted inputs (unfrozen `real` gates) a gate edge is read exactly when its value is not 0, whatever its
# active flag.
@given(seed=st.integers(0, 10**6), data=st.data())
def test_under_weighted_inputs_a_gate_edge_is_read_exactly_when_its_value_is_not_0(seed, data):
    net = connlearn.build(**tiny(seed=seed, gate="real", K=2, gate_init="uniform"))
    with torch.no_grad():
        for p in net.gate_parameters():  # zero some gates, active ones among them
            p.mul_((torch.rand(p.shape, generator=torch.Generator().manual_seed(seed)) > 0.5).float())
    graph = net.graph()
    assert graph.weights_inputs()
    used = set(graph.used_edges())
    for u, v, d in graph.edges(data=True):
        if d["kind"] == "gate":
            assert ((u, v) in used) == (d["gate"] != 0.0)
        else:
            assert (u, v) in used


# A module that reads only some branches of another (a plug-in topology's graph) computes the same on the fused
# engine, which picks them, as on the reference engine.
@given(seed=st.integers(0, 10**6), drop=st.integers(1, 3))
def test_a_module_reading_some_branches_of_another_computes_the_same_on_both_engines(seed, drop):
    graph = connlearn.build(**tiny(C=4, K=1, seed=seed, gate="random")).graph()
    src = graph.branches(2)
    for node in src[-drop:]:  # module 3 reads only the first branches of module 2
        for v in graph.branches(3):
            graph.remove_edge(node, v)
    for v in graph.branches(3):  # every block keeps K = 1 active input
        edges = graph.gate_edges(v)
        for k, (_, _, d) in enumerate(edges):
            d["active"] = k == 0
    assert len(graph.candidates(3)) == 4 - drop
    fused = connlearn.compile_graph(graph, engine="fused").eval()
    reference = fused.to_engine("reference").eval()
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(seed))
    torch.testing.assert_close(fused(x), reference(x))


# Every positive weight, however small, is drawn before a zero one, down to the lowest temperature.
@given(temperature=st.sampled_from([1e-4, 1e-3, 0.005, 0.5, 1.0, 3.0]), seed=st.integers(0, 2**31 - 1),
       tiny_weight=st.sampled_from([1e-35, 1e-31, 1e-20]))
def test_every_positive_weight_however_small_is_drawn_before_a_zero_one(temperature, seed, tiny_weight):
    weights = torch.tensor([[1.0, tiny_weight, 0.0, 0.0, 0.0]] * 8)
    hard = gumbel_topk([weights], 2, torch.Generator().manual_seed(seed), temperature)[0]
    assert torch.equal(hard, (weights > 0).float())


# GateUpdater takes any module with gate_parameters() (all its gates count as sampled when it has no gates()), and
# renormalises its gates.
def test_renormalizing_the_gates_of_a_module_without_gates_method():
    class Gated(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.g = torch.nn.Parameter(torch.tensor([[1.0, 3.0], [0.0, 0.0]]))

        def gate_parameters(self):
            return [self.g]

    module = Gated()
    GateUpdater(module, grad_mode="renormalized").renormalize()
    torch.testing.assert_close(module.g.detach(), torch.tensor([[0.25, 0.75], [0.5, 0.5]]))


# A block output of the wrong shape is named in a module without a projection too, where it would broadcast into the
# shortcut silently.
@pytest.mark.parametrize("engine", ["fused", "reference"])
def test_a_block_output_of_the_wrong_shape_is_named_in_a_module_without_projection(engine, clean_registries):
    from connlearn.blocks import BranchBlock
    from connlearn.errors import ShapeError

    class PooledWhereNoProjection(BranchBlock):
        params = ("width",)

        def __init__(self, in_ch, out_ch, stride, branches, *, width):
            super().__init__(in_ch, out_ch, stride, branches, width=width)
            self.pooled = in_ch == out_ch and stride == 1
            self.c = torch.nn.Conv2d(branches * in_ch, branches * out_ch, 3, stride, 1, groups=branches)

        def forward(self, x):
            out = self.c(x)
            return out.mean((2, 3), keepdim=True) if self.pooled else out  # [B, C·out, 1, 1]: broadcastable

    connlearn.register_block("pooled", PooledWhereNoProjection)
    net = connlearn.build(**tiny(M=6, block="pooled"), engine=engine)
    with pytest.raises(ShapeError, match=r"block kind 'pooled' in module 2 mapped an input .* expected"):
        net(torch.randn(2, 3, 32, 32))


@pytest.mark.parametrize("engine", ["fused", "reference"])
def test_a_fixed_edge_without_an_active_flag_is_read_and_one_marked_inactive_is_refused(engine):
    # the network reads every fixed edge (the stem into the first module, the last module into the head): a graph
    # that leaves their flag out prunes as the one that writes it, where it would have pruned every block
    net = connlearn.build(**tiny(gate="random", K=1), engine=engine)
    graph = net.graph()
    for _, _, d in graph.edges(data=True):
        if d["kind"] == "fixed":
            d.pop("active")
    graph.validate()
    assert sorted(graph.active_edges()) == sorted(net.graph().active_edges())
    left_out = connlearn.compile_graph(graph, engine=engine)
    left_out.load_state_dict(net.state_dict())
    (a, report_a), (b, report_b) = (connlearn.prune.prune_dead_blocks(n) for n in (net, left_out))
    assert str(report_a) == str(report_b)
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(a.eval()(x), b.eval()(x))
    u, v = next((u, v) for u, v, d in graph.edges(data=True) if d["kind"] == "fixed")
    graph.edges[u, v]["active"] = False
    with pytest.raises(connlearn.errors.GraphError, match=f"edge {u} → {v} is a fixed edge with active false"):
        graph.validate()


def _reference_topk(values, K, order):
    """The K largest entries of each row, equal values ranked by ``order`` (the larger first): a plain sort of
    (value, order) pairs, row by row."""
    mask = torch.zeros(values.shape, dtype=torch.bool)
    for r in range(values.shape[0]):
        ranked = sorted(range(values.shape[1]), key=lambda c: (-float(values[r, c]), -int(order[r, c])))
        mask[r, ranked[:K]] = True
    return mask


# With a tie order, topk_mask keeps the K largest values of each row and, among equal values, the larger ranks of the
# order: the same mask as a plain sort of (value, order) pairs, also for long rows full of ties (where an unstable
# sort reorders equal values).
@given(rows=st.integers(1, 3), cols=st.integers(17, 64), levels=st.integers(1, 3), seed=st.integers(0, 10**6),
       data=st.data())
def test_topk_mask_with_a_tie_order_is_a_sort_of_value_order_pairs(rows, cols, levels, seed, data):
    K = data.draw(st.integers(1, cols - 1))
    g = torch.Generator().manual_seed(seed)
    values = torch.randint(0, levels, (rows, cols), generator=g).float()
    order = torch.rand(rows, cols, generator=g).argsort(dim=-1).argsort(dim=-1)
    assert torch.equal(topk_mask(values, K, order), _reference_topk(values, K, order))


# topk_mask of a batch of matrices (no tie order) is the batch of each matrix's topk_mask: "each row" is each row of
# the last dimension, whatever the leading ones.
@given(batch=st.integers(1, 3), rows=st.integers(2, 4), cols=st.integers(2, 6), seed=st.integers(0, 10**6),
       data=st.data())
def test_topk_mask_of_a_batch_is_the_batch_of_masks(batch, rows, cols, seed, data):
    K = data.draw(st.integers(1, cols))
    values = torch.randn(batch, rows, cols, generator=torch.Generator().manual_seed(seed))
    got = topk_mask(values, K)
    assert torch.equal(got, torch.stack([topk_mask(v, K) for v in values]))
    assert (got.sum(dim=-1) == K).all()


# A topk net in training mode at the default temperature draws as gumbel_topk at temperature 1: the net leaves the
# default temperature unpassed (for gate kinds without one), so TopKGate.draw's own default must be 1.
@given(seed=st.integers(0, 1000))
def test_a_topk_net_at_the_default_temperature_draws_at_temperature_one(seed):
    from connlearn.gates import gumbel_topk

    net = connlearn.build(**tiny(seed=seed, gate_init="uniform")).train()
    with torch.no_grad():  # uneven gates, so the temperature changes the draw
        for _, gate in net.gates():
            gate.real.copy_(torch.rand(gate.real.shape, generator=torch.Generator().manual_seed(seed)) + 0.01)
    state = net.generator.get_state()
    mixes = [m for m in net.gate_matrices() if m is not None]
    g = torch.Generator().manual_seed(0)
    g.set_state(state)
    want = gumbel_topk([gate.real for _, gate in net.gates()], net.K, g, 1.0)
    assert len(mixes) == len(want)
    for mix, drawn in zip(mixes, want, strict=True):
        assert torch.equal((mix * net.K).detach().round(), drawn.to(mix.dtype))


# TopKGate.draw draws any number of gates, a single one too (a trainer or plugin may draw one module's gate alone):
# each draw has exactly K ones per row.
@given(seed=st.integers(0, 1000), K=st.integers(1, 3))
def test_topk_draw_of_a_single_gate_has_k_ones_per_row(seed, K):
    from connlearn.gates import TopKGate

    net = connlearn.build(**tiny(C=4, K=K, seed=seed))
    for _, gate in net.gates():
        (drawn,) = TopKGate.draw([gate], torch.Generator().manual_seed(seed))
        assert drawn.shape == gate.real.shape
        assert (drawn.sum(dim=1) == K).all()


# A fixed edge without an ``active`` flag is read (the network always reads fixed edges), also in the graph of
# unfrozen ``real`` gates, which weights every input: leaving the flag out of every fixed edge changes neither
# used_edges() nor the live blocks.
@given(seed=st.integers(0, 1000), topology=st.sampled_from(["resnext", "dense"]))
def test_a_fixed_edge_without_active_is_used_in_a_weighted_graph_too(seed, topology):
    from connlearn.prune import live_blocks

    graph = connlearn.build(topology, **tiny(M=6, C=3, K=2, seed=seed, gate="real")).graph()
    assert graph.weights_inputs()
    bare = graph.copy()
    fixed = [(u, v) for u, v, d in bare.edges(data=True) if d["kind"] == "fixed"]
    assert fixed
    for u, v in fixed:
        del bare.edges[u, v]["active"]
    assert sorted(bare.used_edges()) == sorted(graph.used_edges())
    assert set(fixed) <= set(bare.used_edges())
    assert live_blocks(bare) == live_blocks(graph)


# Renormalising is scale-free: a row whose positive entries are tiny (a sum far below float32's epsilon but a normal
# number, here 1e-29 .. 1e-25) still becomes a distribution summing to 1, proportional to its positive part.
@given(seed=st.integers(0, 100), exponent=st.integers(-29, -25))
def test_renormalizing_a_row_of_tiny_positive_gates_gives_a_distribution(seed, exponent):
    from connlearn.updater import GateUpdater

    net = connlearn.build(**tiny(seed=seed, gate_init="uniform"))
    with torch.no_grad():
        for p in net.gate_parameters():
            p[0] = torch.rand(p.shape[1], generator=torch.Generator().manual_seed(seed)) * 10.0 ** exponent + 1e-38
    before = [p.detach().clone() for p in net.gate_parameters()]
    GateUpdater(net, grad_mode="renormalized").renormalize()
    for p, b in zip(net.gate_parameters(), before, strict=True):
        torch.testing.assert_close(p.detach().sum(dim=-1), torch.ones(p.shape[0]))
        torch.testing.assert_close(p.detach()[0], b[0] / b[0].sum())


# A gate edge without an ``active`` flag is inactive (as active_edges() reads it), in input_overlap too: leaving the
# flag out of every inactive gate edge changes no module's overlap.
@given(seed=st.integers(0, 1000), topology=st.sampled_from(["resnext", "dense"]))
def test_input_overlap_reads_a_gate_edge_without_active_as_inactive(seed, topology):
    from connlearn.prune import input_overlap

    graph = connlearn.build(topology, **tiny(M=6, C=3, K=2, seed=seed)).graph()
    bare = graph.copy()
    off = [(u, v) for u, v, d in bare.edges(data=True) if d["kind"] == "gate" and not d["active"]]
    assert off
    for u, v in off:
        del bare.edges[u, v]["active"]
    assert sorted(bare.active_edges()) == sorted(graph.active_edges())
    assert input_overlap(bare) == input_overlap(graph)


# A row without a positive weight draws as the uniform row it stands for: for the same noise, gumbel_topk draws an
# all-zero row exactly as a row of ones (at any temperature).
@given(seed=st.integers(0, 10**6), cols=st.integers(8, 64), temperature=st.sampled_from([1.0, 0.5, 3.0]),
       data=st.data())
def test_gumbel_topk_draws_an_all_zero_row_as_a_uniform_row(seed, cols, temperature, data):
    from connlearn.gates import gumbel_topk

    K = data.draw(st.integers(1, cols - 1))
    rows = 64
    zero = gumbel_topk([torch.zeros(rows, cols)], K, torch.Generator().manual_seed(seed), temperature)[0]
    ones = gumbel_topk([torch.ones(rows, cols)], K, torch.Generator().manual_seed(seed), temperature)[0]
    assert torch.equal(zero, ones)


# At temperature 1 the draw follows the weights' ratio down to the 1e-30 floor of the log-weights: of the weights
# 2e-30 and 2e-28 (1 to 100) a single draw takes the larger about 100 times in 101.
@given(seed=st.integers(0, 10**6))
def test_gumbel_topk_at_temperature_one_follows_tiny_weights_ratio(seed):
    from connlearn.gates import gumbel_topk

    rows = 400
    weights = torch.tensor([[2e-30, 2e-28]]).expand(rows, 2)
    drawn = gumbel_topk([weights], 1, torch.Generator().manual_seed(seed))[0]
    assert drawn[:, 1].mean() > 0.9  # 100/101 expected; about 2/3 under the mutant


# mix_branches keeps the inputs' memory format: channels-last inputs give a channels-last output (the fused engine
# under torch.channels_last stays channels-last, without a copy per module), equal in value to the contiguous path.
@given(seed=st.integers(0, 1000), n_inputs=st.integers(1, 3), c=st.integers(1, 4), ch=st.integers(2, 4),
       hw=st.integers(2, 5))
def test_mix_branches_keeps_channels_last(seed, n_inputs, c, ch, hw):
    from connlearn.compile import mix_branches

    g = torch.Generator().manual_seed(seed)
    inputs = [torch.randn(2, 2 * ch, hw, hw, generator=g) for _ in range(n_inputs)]
    mix = torch.rand(c, 2 * n_inputs, generator=g)
    want = mix_branches(inputs, mix, ch)
    got = mix_branches([t.to(memory_format=torch.channels_last) for t in inputs], mix, ch)
    assert got.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(got, want)
    # strided NCHW inputs (every other channel of a wider tensor) come out in the NCHW format
    strided = [torch.cat([t, t], dim=1)[:, ::2] for t in inputs]
    assert not strided[0].is_contiguous()
    got = mix_branches(strided, mix, ch)
    if c * ch > 1 and hw > 1:
        assert got.is_contiguous()


# The "normalized" gradient is the chain rule through the row normalisation p = w / sum(w): the gradient of L(w /
# sum(w)) in w is (g - <p, g>) / sum(w), for rows of any positive scale, tiny ones too (a sum of 1e-11).
@given(seed=st.integers(0, 1000), scale=st.sampled_from([1.0, 1e-3, 1e-11]))
def test_normalized_gradient_is_the_chain_rule_through_the_normalisation(seed, scale):
    from connlearn.updater import GateUpdater

    net = connlearn.build(**tiny(seed=seed, gate_init="uniform"))
    gen = torch.Generator().manual_seed(seed)
    want = []
    with torch.no_grad():
        for p in net.gate_parameters():
            p.copy_((torch.rand(p.shape, generator=gen) + 0.1) * scale / p.shape[1])
            g = torch.randn(p.shape, generator=gen)
            w = p.detach().clone().requires_grad_()
            with torch.enable_grad():
                ((w / w.sum(dim=-1, keepdim=True)) * g).sum().backward()
            p.grad = g.clone()
            want.append(w.grad)
    GateUpdater(net, grad_mode="normalized").transform_grads()
    for p, w in zip(net.gate_parameters(), want, strict=True):
        torch.testing.assert_close(p.grad * scale, w * scale)


# Pruning keeps the network's draw generator where it was: the pruned net (built afresh when blocks die) continues the
# original's random stream, as a checkpoint of it records, instead of restarting from the seed.
@given(seed=st.integers(0, 1000), steps=st.integers(1, 3))
def test_pruning_keeps_the_draw_generator_state(seed, steps):
    from connlearn.prune import prune_dead_blocks

    net = connlearn.build(**tiny(M=6, C=4, K=1, seed=seed)).train()
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        for _ in range(steps):
            net(x)  # each training-mode pass draws, advancing the generator
    net.freeze()
    pruned, report = prune_dead_blocks(net)
    assert report.blocks_after < report.blocks_before  # K=1 of 4 inputs: some blocks are read by none
    assert torch.equal(pruned.generator.get_state(), net.generator.get_state())


# Pruning keeps activation checkpointing on: the pruned net (built afresh when blocks die) recomputes its activations
# as the original did.
@given(seed=st.integers(0, 1000))
def test_pruning_keeps_activation_checkpointing(seed):
    from connlearn.prune import prune_dead_blocks

    net = connlearn.build(**tiny(M=6, C=4, K=1, seed=seed))
    net.activation_checkpointing = True
    pruned, report = prune_dead_blocks(net.freeze())
    assert report.blocks_after < report.blocks_before
    assert pruned.activation_checkpointing


# A RuntimeError of the stem with the images and the network on the same device is the stem's own, raised as it is:
# only a device mismatch is renamed into a ConfigError about devices. Mutants: the condition's "and" as "or", or "!="
# as "==" (a same-device failure then reads "the images are on cpu and the network on cpu").
def test_a_stem_failure_on_one_device_is_not_named_a_device_mismatch():
    import pytest

    from connlearn.errors import ConfigError

    net = connlearn.build(**tiny())

    def fail(module, args):
        raise RuntimeError("the stem's own failure")

    net.stem.register_forward_pre_hook(fail)
    with pytest.raises(RuntimeError, match="the stem's own failure") as info:
        net(torch.randn(2, 3, 32, 32))
    assert not isinstance(info.value, ConfigError)


# hold_draw holds the draw for its block only: inside it every pass reuses the first draw, after it each training-mode
# pass draws anew.
@given(seed=st.integers(0, 1000))
def test_after_hold_draw_each_pass_draws_anew(seed):
    net = connlearn.build(**tiny(seed=seed, gate_init="uniform")).train()

    def draw():
        return [m.detach().clone() for m in net.gate_matrices() if m is not None]

    with net.hold_draw():
        held = draw()
        assert all(torch.equal(a, b) for a, b in zip(draw(), held, strict=True))
    later = [draw() for _ in range(6)]
    assert any(not all(torch.equal(a, b) for a, b in zip(d, held, strict=True)) for d in later)


# An empty stem weight (sharded by FSDP, which gathers it in a pre-hook of its own) is not checked against the images'
# dtype: a pass with float32 images and a bfloat16 empty placeholder runs once the hook brings the weight.
def test_an_empty_stem_weight_is_not_checked_against_the_images_dtype():
    net = connlearn.build(**tiny()).eval()
    conv = net.stem.conv
    real = conv.weight
    conv.weight = torch.nn.Parameter(torch.empty(0, dtype=torch.bfloat16))

    def gather(module, args):
        conv.weight = real

    net.stem.register_forward_pre_hook(gather)
    out = net(torch.randn(2, 3, 32, 32))
    assert out.shape == (2, 10)


# At a low temperature the draw is the top-K of the weights, however small the weights are relative to the row's
# largest (down to the 1e-30 floor of the relative log-weights): here weights 1, 0.1, 0.01 and 10^-28.5, 10^-29,
# 10^-29.5 times the row's scale.
@given(seed=st.integers(0, 10**6), K=st.integers(4, 5), scale=st.sampled_from([1.0, 1e-3, 1e3]))
def test_gumbel_topk_at_a_low_temperature_keeps_the_largest_weights_down_to_the_floor(seed, K, scale):
    from connlearn.gates import gumbel_topk

    exps = torch.tensor([0.0, 1.0, 2.0, 28.5, 29.0, 29.5])
    g = torch.Generator().manual_seed(seed)
    rows = 32
    perm = torch.rand(rows, len(exps), generator=g).argsort(dim=-1)
    weights = scale * 10.0 ** -exps[perm]
    drawn = gumbel_topk([weights], K, g, temperature=0.01)[0]
    assert torch.equal(drawn.bool(), topk_mask(weights, K))
