"""The gate laws: K distinct ones per sampled row, the law of K draws without replacement, gradients to
every real gate, determinism in eval mode and under a seed."""

import itertools
import math

import pytest
import torch
from conftest import tiny
from hypothesis import given
from hypothesis import strategies as st

import connlearn
from connlearn.errors import ConfigError, ConfigTypeError, GraphError, ShapeError
from connlearn.gates import active_masks, draw_generator, gumbel_topk, topk_mask
from connlearn.topologies.resnext import resnext


@given(
    rows=st.integers(1, 20), cols=st.integers(1, 10), data=st.data(), seed=st.integers(0, 2**31 - 1),
    zero_rows=st.booleans(),
)
def test_every_sampled_row_has_exactly_k_distinct_ones(rows, cols, data, seed, zero_rows):
    K = data.draw(st.integers(1, cols))
    g = torch.Generator().manual_seed(seed)
    weights = torch.rand(rows, cols, generator=g) * (torch.rand(rows, cols, generator=g) > 0.3)
    if zero_rows:
        weights[0] = 0
    hard = gumbel_topk([weights], K, g)[0]
    assert set(hard.unique().tolist()) <= {0.0, 1.0}
    assert (hard.sum(dim=1) == K).all()


@given(count=st.integers(2, 5), rows=st.integers(1, 6), cols=st.integers(1, 6), data=st.data(),
       seed=st.integers(0, 2**31 - 1), temperature=st.sampled_from([1.0, 0.5, 3.0]))
def test_matrices_alike_are_drawn_in_one_stack_as_in_the_padded_batch(count, rows, cols, data, seed, temperature):
    # gates of one shape (ResNeXt's) skip the padding of a batch of several shapes: the same draws, bit for bit
    K = data.draw(st.integers(1, cols))
    g = torch.Generator().manual_seed(seed)
    probs = [torch.rand(rows, cols, generator=g) * (torch.rand(rows, cols, generator=g) > 0.4) for _ in range(count)]
    probs[0][0] = 0  # an all-zero row
    stacked = gumbel_topk(probs, K, torch.Generator().manual_seed(seed), temperature)
    padded = gumbel_topk([probs[0].double(), *probs[1:]], K, torch.Generator().manual_seed(seed), temperature)
    assert all(torch.equal(a.double(), b.double()) for a, b in zip(stacked, padded, strict=True))


@pytest.mark.parametrize("saturated", [False, True])
def test_the_active_inputs_of_gates_alike_taken_together_are_each_gates_own(saturated):
    net = _saturated(5) if saturated else connlearn.build(**tiny(C=8, K=2, seed=5, gate_init="uniform"))
    gates = [gate for _, gate in net.gates()]
    together = active_masks(gates)
    assert len(together) == len(gates) > 1
    assert all(torch.equal(a, g.active()) for a, g in zip(together, gates, strict=True))


def _inclusion_probabilities(p, K):
    """Exact P(k is among K draws without replacement from p), by enumerating ordered draws."""
    incl = [0.0] * len(p)
    for seq in itertools.permutations(range(len(p)), K):
        prob, left = 1.0, 1.0
        for a in seq:
            prob *= p[a] / left
            left -= p[a]
        for a in seq:
            incl[a] += prob
    return incl


def test_inclusion_frequencies_match_draws_without_replacement():
    """60,000 draws with a fixed seed; the standard error of each frequency is below 0.002, and the
    tolerance 0.008 is four of them."""
    weights = torch.tensor([0.05, 0.1, 0.15, 0.3, 0.4, 0.0])
    K, n = 3, 60_000
    hard = gumbel_topk([weights.expand(n, -1)], K, torch.Generator().manual_seed(0))[0]
    freq = hard.mean(dim=0).tolist()
    exact = _inclusion_probabilities((weights / weights.sum()).tolist(), K)
    for f, e in zip(freq, exact, strict=True):
        assert abs(f - e) < 0.008, (freq, exact)


def test_zero_probability_inputs_are_never_drawn_while_others_remain():
    weights = torch.tensor([[0.0, 0.2, 0.0, 0.7]]).expand(500, -1)
    hard = gumbel_topk([weights], 2, torch.Generator().manual_seed(0))[0]
    assert (hard[:, [1, 3]] == 1).all()


def test_an_all_zero_row_samples_uniformly():
    hard = gumbel_topk([torch.zeros(40_000, 4)], 1, torch.Generator().manual_seed(0))[0]
    assert torch.allclose(hard.mean(dim=0), torch.full((4,), 0.25), atol=0.01)


def test_matrices_without_columns_or_rows_draw_empty_matrices():
    for shapes in ([(3, 0)], [(3, 0), (3, 0)], [(0, 4), (0, 4)], [(3, 0), (2, 0)]):
        drawn = gumbel_topk([torch.ones(shape) for shape in shapes], 0, torch.Generator().manual_seed(0))
        assert [tuple(d.shape) for d in drawn] == shapes


def test_gates_are_never_nan_under_negative_or_zero_values():
    hard = gumbel_topk([torch.tensor([[-1.0, 0.0, 2.0], [0.0, 0.0, 0.0]])], 2, torch.Generator())[0]
    assert not hard.isnan().any() and (hard.sum(1) == 2).all()


def test_every_real_gate_receives_a_gradient_drawn_or_not(images):
    net = connlearn.build(**tiny(C=4, K=1)).train()
    net(images).square().sum().backward()
    for _, gate in net.gates():
        grad = gate.real.grad
        assert grad is not None
        assert (grad != 0).float().mean() > 0.9  # K=1 of 4: most entries were not drawn


def test_straight_through_gradient_is_the_gated_sum_gradient_times_input_over_k():
    """∂ℓ/∂ĝ_jk = ⟨∂ℓ/∂s_j, y_k⟩ / K, checked on the reference engine's first gated module."""
    net = connlearn.build(**tiny(C=3, K=2)).to_engine("reference").train()
    stage = net.stages[1]
    captured = {}
    original = stage.gated_sums

    def capture(inputs, mix):
        sums = original(inputs, mix)
        captured["inputs"], captured["sums"] = inputs, sums
        return sums

    stage.gated_sums = capture
    out = net(torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0)))
    ys, sums = captured["inputs"], captured["sums"]
    *dsums, dgate = torch.autograd.grad(out.square().sum(), [*sums, stage.gate.real])
    expected = torch.stack([torch.stack([(dsums[j] * y).sum() / 2 for y in ys]) for j in range(3)])
    torch.testing.assert_close(dgate, expected, atol=1e-5, rtol=1e-4)


def test_behind_a_projection_the_drawn_gate_gradients_sum_to_zero():
    """Where a module's shortcut is the projection (conv + BN), its training-mode output does not change when
    all of its blocks' inputs are scaled together (every path starts with conv + BN; ReLU is positively
    homogeneous), so the gradients of the drawn gates sum to zero over the module: a common drift of the real
    gates can only come from the straight-through gradients of the entries that were not drawn."""
    net = connlearn.build(**tiny(C=4, K=2)).double().train()
    images = torch.randn(8, 3, 32, 32, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    state = net.generator.get_state()
    drawn = [m != 0 for m in net.gate_matrices() if m is not None]
    net.generator.set_state(state)  # the forward pass draws the same connectivity
    torch.nn.functional.cross_entropy(net(images), torch.arange(8) % 10).backward()
    gated = [stage for stage in net.stages if stage.gate is not None]
    assert all(stage.proj is not None for stage in gated)  # tiny(): every gated module changes the shape
    for stage, mask in zip(gated, drawn, strict=True):
        grad = stage.gate.real.grad
        assert grad[mask].sum().abs() < 1e-3 * grad[mask].abs().sum()  # not exactly 0: the eps of BN
        assert grad[~mask].abs().sum() > 0


def test_eval_mode_is_deterministic_and_uses_top_k(images):
    net = connlearn.build(**tiny(gate_init="uniform")).eval()
    state = net.generator.get_state()
    torch.testing.assert_close(net(images), net(images))
    assert torch.equal(net.generator.get_state(), state)
    for matrix, (_, gate) in zip(net.gate_matrices()[1:], net.gates(), strict=True):
        assert torch.equal(matrix > 0, topk_mask(gate.real, net.K))


def test_the_first_draws_are_not_the_initial_top_k_nor_the_fixed_random_connectivity_of_the_seed():
    # the draws come from a stream of their own: from the topology's (the seed itself), the first draw would
    # reuse the uniforms of uniformly initialised gates, and be their top-K every time (chance: 1/70 per row)
    same_top_k, same_random = 0, 0
    for seed in range(10):
        net = connlearn.build(**tiny(C=8, K=4, seed=seed, gate_init="uniform")).train()
        first = [m.bool() for m in net._draw().values()]
        same_top_k += all(torch.equal(d, g.active()) for d, (_, g) in zip(first, net.gates(), strict=True))
        fixed = connlearn.build(**tiny(C=8, K=4, seed=seed, gate="random"))
        drawn = [m.bool() for m in connlearn.build(**tiny(C=8, K=4, seed=seed)).train()._draw().values()]
        same_random += all(torch.equal(d, s.gate.active()) for d, s in zip(drawn, fixed.stages[1:], strict=True))
    assert same_top_k == 0 and same_random == 0


def test_the_same_seed_gives_the_same_draws():
    a = connlearn.build(**tiny(seed=5)).train()
    b = connlearn.build(**tiny(seed=5)).train()
    c = connlearn.build(**tiny(seed=6)).train()
    draws = [[m for m in n.gate_matrices() if m is not None] for n in (a, b, c) for _ in range(3)]
    assert all(torch.equal(x, y) for x, y in zip(draws[0], draws[3], strict=True))
    assert not all(torch.equal(x, y) for x, y in zip(draws[0], draws[6], strict=True))


def test_a_step_draws_all_modules_at_once_from_the_generator():
    net = connlearn.build(**tiny(M=6)).train()
    before = net.generator.get_state()
    net.gate_matrices()
    after_one = net.generator.get_state()
    net.generator.set_state(before)
    torch.rand(5 * 4, 4, generator=net.generator)  # one draw: all rows of all 5 gated modules
    assert torch.equal(net.generator.get_state(), after_one)


def test_draw_statistics_of_uniform_gates_follow_uniform_sampling():
    net = connlearn.build(**tiny()).train()  # equal gates, C=4, K=2: binom(4, 2) = 6 input sets
    net.record_draws()
    for _ in range(600):
        net.gate_matrices()
    stats = net.draw_statistics()
    assert stats["drawn_distinct"] == 6  # every set is drawn
    assert stats["drawn_topk_share"] == pytest.approx(1 / 6, abs=0.03)


def test_draw_statistics_of_peaked_gates_show_sampling_follows_the_gates():
    net = connlearn.build(**tiny()).train()
    with torch.no_grad():
        for _, g in net.gates():
            g.real.copy_(torch.tensor([0.9, 0.0, 0.8, 0.0]).expand_as(g.real))
    net.record_draws()
    for _ in range(20):
        net.gate_matrices()
    assert net.draw_statistics() == {"drawn_distinct": 1.0, "drawn_topk_share": 1.0}
    assert net.draw_statistics() == {"drawn_distinct": None, "drawn_topk_share": None}  # restarted
    net.record_draws(False)
    net.gate_matrices()
    assert net.draw_statistics()["drawn_distinct"] is None


def test_draw_statistics_cover_the_last_limit_steps():
    net = connlearn.build(**tiny()).train()
    net.record_draws(limit=3)
    net.gate_matrices()  # equal gates: a uniform draw, rarely the top-K
    with torch.no_grad():
        for _, g in net.gates():
            g.real.copy_(torch.tensor([0.9, 0.0, 0.8, 0.0]).expand_as(g.real))
    for _ in range(3):
        net.gate_matrices()  # peaked gates: always the top-K
    assert net.draw_statistics() == {"drawn_distinct": 1.0, "drawn_topk_share": 1.0}
    with pytest.raises(connlearn.ConnlearnError, match="limit"):
        net.record_draws(limit=0)


def test_a_frozen_net_records_no_draws():
    net = connlearn.build(**tiny()).train()
    net.freeze()
    net.record_draws()
    net.gate_matrices()
    assert net.draw_statistics() == {"drawn_distinct": None, "drawn_topk_share": None}


@pytest.mark.parametrize("gate", ["random", "full", "frozen"])
def test_fixed_kinds_have_no_learnable_gates(gate):
    if gate == "frozen":
        net = connlearn.build(**tiny(gate="topk")).freeze()
    else:
        net = connlearn.build(**tiny(gate=gate, K=4 if gate == "full" else 2))
    assert net.gate_parameters() == []


def test_random_connectivity_has_k_inputs_per_block_and_depends_on_the_seed():
    a = connlearn.build(**tiny(gate="random", C=6, K=2, seed=1)).connectivity()
    b = connlearn.build(**tiny(gate="random", C=6, K=2, seed=2)).connectivity()
    assert all((m.sum(1) == 2).all() for m in a.values())
    assert any(not torch.equal(a[k], b[k]) for k in a)


def test_freeze_keeps_the_top_k_of_the_real_gates():
    net = connlearn.build(**tiny(gate_init="uniform", C=5, K=2))
    expected = {m: topk_mask(g.real, 2) for m, g in net.gates()}
    net.freeze()
    assert net.gate_kind == "frozen" and net.graph().gate_kind == "frozen"
    assert all(torch.equal(net.connectivity()[m], expected[m]) for m in expected)
    assert math.isclose(sum(m.sum().item() for m in expected.values()), 2 * 5 * 2)


# ---------------------------------------------------------------------------------------------- temperature
@given(rows=st.integers(1, 12), cols=st.integers(1, 10), data=st.data(), seed=st.integers(0, 2**31 - 1),
       temperature=st.floats(1e-4, 1e4))
def test_every_sampled_row_has_exactly_k_ones_at_any_temperature(rows, cols, data, seed, temperature):
    K = data.draw(st.integers(1, cols))
    g = torch.Generator().manual_seed(seed)
    weights = torch.rand(rows, cols, generator=g) * (torch.rand(rows, cols, generator=g) > 0.3)
    weights[0] = 0
    hard = gumbel_topk([weights], K, g, temperature)[0]
    assert set(hard.unique().tolist()) <= {0.0, 1.0}
    assert (hard.sum(dim=1) == K).all()


def test_temperature_one_is_the_default_draw():
    weights = torch.rand(50, 8, generator=torch.Generator().manual_seed(3))
    default = gumbel_topk([weights], 3, torch.Generator().manual_seed(0))[0]
    assert torch.equal(gumbel_topk([weights], 3, torch.Generator().manual_seed(0), 1.0)[0], default)


def test_inclusion_frequencies_follow_the_gates_to_the_power_one_over_temperature():
    """The law of the draw at temperature τ is that of the weights w^(1/τ) at temperature 1; tolerance as in
    the test at temperature 1."""
    weights = torch.tensor([0.05, 0.1, 0.15, 0.3, 0.4, 0.0])
    K, n = 2, 60_000
    for temperature in (0.5, 2.0):
        hard = gumbel_topk([weights.expand(n, -1)], K, torch.Generator().manual_seed(0), temperature)[0]
        sharpened = weights ** (1 / temperature)
        exact = _inclusion_probabilities((sharpened / sharpened.sum()).tolist(), K)
        for f, e in zip(hard.mean(dim=0).tolist(), exact, strict=True):
            assert abs(f - e) < 0.008, (temperature, f, e)


@pytest.mark.parametrize("temperature", [1e-2, 1e-3, 1e-4])  # 1e-4: the smallest allowed
def test_a_small_temperature_draws_the_top_k_and_never_a_zero_entry(temperature):
    weights = torch.tensor([[0.9, 0.5, 0.45, 0.0, 0.4, 0.3, 0.1], [1e-20, 0, 0, 0, 0, 0, 0],
                            [1e3, 999.0, 0, 0, 0, 0, 1e-25]]).repeat(300, 1)
    hard = gumbel_topk([weights], 2, torch.Generator().manual_seed(0), temperature)[0]
    assert torch.equal(hard[::3].bool(), topk_mask(weights[::3], 2))
    assert torch.equal(hard[2::3].bool(), topk_mask(weights[2::3], 2))  # unnormalised rows too
    assert (hard[1::3, 0] == 1).all()  # the one positive entry, however small, comes before the zeros
    tiny = gumbel_topk([weights[1::3]], 3, torch.Generator().manual_seed(0), temperature)[0]
    assert (tiny[:, 1:].sum(0) > 0).sum() >= 4  # and the zeros fill the rest in random order


def test_sample_temperature_reaches_the_draws_and_survives_state_dict():
    net = connlearn.build(**tiny()).train()
    with torch.no_grad():
        for _, g in net.gates():
            g.real.copy_(torch.tensor([0.52, 0.5, 0.49, 0.51]).expand_as(g.real))
    net.sample_temperature = 1e-3  # draws follow the gates: always the top-K
    net.record_draws()
    for _ in range(20):
        net.gate_matrices()
    assert net.draw_statistics()["drawn_topk_share"] == 1.0
    copy = connlearn.build(**tiny())
    copy.load_state_dict(net.state_dict())
    assert copy.sample_temperature == 1e-3
    state = net.state_dict()
    state["_extra_state"].pop("temperature")  # a checkpoint from before the temperature
    copy.load_state_dict(state)
    assert copy.sample_temperature == 1.0


@pytest.mark.parametrize("bad", [0, -1.0, 1e-5, 1e5, float("inf"), float("nan"), "0.5", True, None])
def test_a_bad_sample_temperature_is_refused(bad):
    net = connlearn.build(**tiny())
    with pytest.raises(connlearn.ConnlearnError, match="sample_temperature"):
        net.sample_temperature = bad
    assert net.sample_temperature == 1.0


# ---------------------------------------------------------------------------- ties in the top-K


@given(rows=st.integers(1, 6), cols=st.integers(1, 8), data=st.data())
def test_topk_mask_takes_the_k_largest_and_ranks_equal_values_by_order(rows, cols, data):
    K = data.draw(st.integers(1, cols))
    level = st.sampled_from([0.0, 0.25, 0.5, 1.0])  # few levels: many ties
    values = torch.tensor(data.draw(st.lists(st.lists(level, min_size=cols, max_size=cols), min_size=rows,
                                             max_size=rows)))
    order = torch.tensor(data.draw(st.lists(st.permutations(list(range(cols))), min_size=rows,
                                            max_size=rows)), dtype=torch.float32)
    by_index = -torch.arange(cols, dtype=torch.float32).expand(rows, cols)  # the default: lower index first
    for rank, mask in ((order, topk_mask(values, K, order)), (by_index, topk_mask(values, K))):
        for r in range(rows):
            wanted = sorted(range(cols), key=lambda c, r=r: (-values[r, c].item(), -rank[r, c].item()))[:K]
            assert set(mask[r].nonzero().flatten().tolist()) == set(wanted)


def _saturated(seed, kind="topk"):
    net = connlearn.build(**tiny(C=8, K=2, seed=seed, gate=kind))
    with torch.no_grad():
        for _, gate in net.gates():
            gate.real.fill_(1.0)  # every gate at the clip bound, as the paper's rule leaves many rows
    return net


def _orders(net):
    return [g.tie_order for _, g in net.gates()]


def test_gates_tied_at_the_clip_bound_freeze_to_the_seeded_tie_order_not_the_lowest_inputs():
    net = _saturated(3)
    active = [g.active() for _, g in net.gates()]
    for mask, (_, gate) in zip(active, net.gates(), strict=True):
        assert torch.equal(mask, topk_mask(gate.real, 2, gate.tie_order))
        assert (mask.sum(dim=1) == 2).all()
    assert not all(bool(mask[:, :2].all()) for mask in active)  # index order: inputs 0 and 1 of every block
    frozen = [stage.gate.mask for stage in net.freeze().stages if stage.gate is not None]
    assert all(torch.equal(f, a) for f, a in zip(frozen, active, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(_orders(_saturated(3)), _orders(_saturated(3)), strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(_orders(_saturated(3)), _orders(_saturated(4)), strict=True))


def test_the_tie_order_leaves_the_draws_generator_alone():
    net = connlearn.build(**tiny(seed=7))
    assert torch.equal(net.generator.get_state(), draw_generator(7).get_state())
    fixed = [connlearn.build(**tiny(seed=7, gate="random")).graph().gate_matrix(m) for m in (2, 3)]
    assert fixed == [resnext(**tiny(seed=7, gate="random")).gate_matrix(m) for m in (2, 3)]


def test_the_graph_carries_the_tie_order_so_a_rebuilt_net_has_the_same_top_k():
    net = _saturated(3)
    graph = net.graph()
    for module, gate in net.gates():
        assert graph.tie_matrix(module) == gate.tie_order.tolist()
        assert graph.gate_matrix(module)[1] == gate.active().tolist()
    graph.graph["seed"] = 11  # another seed: the ties still come from the graph
    rebuilt = connlearn.compile_graph(connlearn.BranchGraph.from_json(graph.to_json()))
    assert all(torch.equal(g.active(), h.active()) for (_, g), (_, h) in zip(net.gates(), rebuilt.gates(), strict=True))


def test_the_topology_draws_the_ties_so_its_graph_and_the_compiled_net_agree():
    graph = resnext(**tiny(C=8, K=2, seed=3))  # every gate starts at 0.5: all tied
    net = connlearn.compile_graph(graph)
    for module, gate in net.gates():
        assert graph.gate_matrix(module)[1] == gate.active().tolist()
        assert graph.tie_matrix(module) == gate.tie_order.tolist()
    assert not all(row[:2] == [True, True] for m, _ in net.gates() for row in graph.gate_matrix(m)[1])


def test_a_graph_without_ties_gets_them_from_its_seed():
    graph = resnext(**tiny(C=8, K=2, seed=3))
    for _, _, d in graph.edges(data=True):
        d.pop("tie", None)
    a, b = connlearn.compile_graph(graph), connlearn.compile_graph(graph)
    assert all(torch.equal(g.tie_order, h.tie_order) for (_, g), (_, h) in zip(a.gates(), b.gates(), strict=True))
    assert all(sorted(row) == list(range(8)) for _, g in a.gates() for row in g.tie_order.tolist())


def test_a_tie_that_is_not_an_integer_is_refused():
    graph = resnext(**tiny(seed=3))
    d = next(d for _, _, d in graph.edges(data=True) if d["kind"] == "gate")
    d["tie"] = 0.5
    with pytest.raises(GraphError, match="integer rank"):
        graph.validate()


def test_the_tie_order_survives_a_cast_to_bfloat16():
    net = _saturated(3)
    before = [g.active() for _, g in net.gates()]
    net.to(torch.bfloat16)
    assert all(torch.equal(b, g.active()) for b, (_, g) in zip(before, net.gates(), strict=True))


def test_real_gates_rank_ties_by_the_tie_order_too():
    net = _saturated(3, kind="real")
    assert not all(bool(g.active()[:, :2].all()) for _, g in net.gates())


def test_a_checkpoint_from_before_the_tie_order_loads_with_the_index_order_it_was_trained_with():
    net = _saturated(3)
    old = net.state_dict()
    for key in [k for k in old if k.endswith("tie_order")]:
        del old[key]
        old._metadata[key.rsplit(".", 1)[0]]["version"] = 1  # what the gates' state dicts were
    fresh = connlearn.build(**tiny(C=8, K=2, seed=3))
    fresh.load_state_dict(old)
    for _, gate in fresh.gates():
        assert torch.equal(gate.active(), topk_mask(gate.real, 2))  # ties to the lower index, as before
        assert gate.active()[:, :2].all()
    fresh.load_state_dict(net.state_dict())  # a new checkpoint brings its own order back
    assert all(torch.equal(g.active(), h.active()) for (_, g), (_, h) in zip(fresh.gates(), net.gates(), strict=True))
    partial = net.state_dict()  # with its metadata, which says the gates are of today's version
    for key in [k for k in partial if not k.endswith(".real")]:
        del partial[key]
    other = connlearn.build(**tiny(C=8, K=2, seed=4))
    orders = [g.tie_order.clone() for _, g in other.gates()]
    other.load_state_dict(partial, strict=False)  # a partial load of today's state leaves the order alone
    assert all(torch.equal(o, g.tie_order) for o, (_, g) in zip(orders, other.gates(), strict=True))


def test_a_checkpoint_file_from_before_the_tie_order_resumes_with_the_index_order(tmp_path):
    from connlearn.checkpoint import make_checkpoint, net_from_checkpoint, save_atomic

    ckpt = make_checkpoint(_saturated(3))  # its state dict is a plain dict: no module versions
    ckpt["model"] = {k: v for k, v in ckpt["model"].items() if not k.endswith("tie_order")}
    graph = connlearn.BranchGraph.from_json(ckpt["graph"])
    for _, _, d in graph.edges(data=True):
        d.pop("tie", None)
    ckpt["graph"] = graph.to_json()
    save_atomic(ckpt, tmp_path / "old.pt")
    for _, gate in net_from_checkpoint(tmp_path / "old.pt").gates():
        assert torch.equal(gate.active(), topk_mask(gate.real, 2))


def test_the_other_engine_keeps_the_tie_order():
    net = _saturated(3)
    other = net.to_engine("reference")
    assert all(torch.equal(g.active(), h.active()) for (_, g), (_, h) in zip(net.gates(), other.gates(), strict=True))


def test_an_averaged_copy_freezes_to_the_trained_nets_connectivity_and_keeps_averaging():
    net = connlearn.build(**tiny(gate_init="uniform"))
    ema = torch.optim.swa_utils.AveragedModel(net, multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn(0.9))
    with torch.no_grad():
        for p in net.gate_parameters():
            p.copy_(torch.rand(p.shape, generator=torch.Generator().manual_seed(3)))  # the EMA's gates lag behind
    ema.update_parameters(net)
    net.freeze()
    ema.module.freeze(net.connectivity())
    for (_, a), (_, b) in zip(ema.module.connectivity().items(), net.connectivity().items(), strict=True):
        assert torch.equal(a, b)
    ema.update_parameters(net)  # the parameters pair up again
    assert [p.shape for p in ema.module.parameters()] == [p.shape for p in net.parameters()]


def test_a_given_connectivity_of_the_wrong_form_is_named():
    net = connlearn.build(**tiny())
    good = net.connectivity()
    with pytest.raises(ConfigTypeError, match="connectivity must be a dict"):
        net.freeze([good[2]])
    with pytest.raises(ConfigError, match=r"names modules \[2\]; this network's gated modules are \[2, 3\]"):
        net.freeze({2: good[2]})
    with pytest.raises(ConfigTypeError, match=r"module 2 must be a boolean tensor, got torch\.float32"):
        net.freeze({**good, 2: good[2].float()})
    with pytest.raises(ShapeError, match=r"in module 3: the given connectivity gave \[4, 3\]"):
        net.freeze({**good, 3: good[3][:, :3]})
    with pytest.raises(ShapeError, match=r"in module 3: the given connectivity gives 4 active inputs in row 0"):
        net.freeze({**good, 3: torch.ones_like(good[3])})
    assert net.gate_kind == "topk"
