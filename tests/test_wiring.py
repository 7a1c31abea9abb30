"""The laws of edge weights under a budget (DNW) and of rewiring: the budget is kept exactly, every edge gets
its dense gradient (none where not kept, in the ablation), the fair random graph is uniform over the candidate
edges, rewiring keeps every degree, freezing and pruning keep the function."""

import collections
import copy
import importlib.util
import itertools
from pathlib import Path

import pytest
import torch
from conftest import batch, built, tiny
from hypothesis import example, given, settings
from hypothesis import strategies as st
from oracle import Oracle

import connlearn
from connlearn.export import export
from connlearn.prune import prune_dead_blocks
from connlearn.topologies import TOPOLOGIES
from connlearn.train import RunConfig, make_checkpoint
from connlearn.train.checkpoint import save_checkpoint
from connlearn.train.data import synthetic
from connlearn.train.protocol import build_net
from connlearn.updater import param_groups
from connlearn.wiring import edge_counts, gate_edges, generated, rewire, shuffle

ROOT = Path(__file__).resolve().parent.parent


#: A small node graph: 2 stem nodes, stages of 3 and 4 nodes, the last 2 the features, 8x8 images (2x2 nodes).
TOPOLOGIES_WITH_GATES = ("resnext", "dense", "neural-graph")
SMALL_GRAPH = {"nodes": [3, 4], "stem_nodes": 2, "features": 2, "image_size": 8}


def _budgeted(gate, density, topology="resnext", **options):
    if topology == "neural-graph":
        return built(topology, gate=gate, density=density, seed=options.get("seed", 0), **SMALL_GRAPH)
    return built(topology, **tiny(K=None, gate=gate, density=density, **options))


def _kept_edges(graph):
    """The kept gate edges of ``graph``, in the order of its gate matrices."""
    return [e for e in gate_edges(graph) if graph.edges[e]["active"]]


def _masked_graph():
    spec = importlib.util.spec_from_file_location("benchmarks_wiring", ROOT / "benchmarks" / "wiring.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.MaskedGraph


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 10**6), gate=st.sampled_from(["dnw", "dnw_masked", "random", "topk"]),
       density=st.sampled_from([None, 0.05, 0.3, 1.0]), nodes=st.lists(st.integers(1, 5), min_size=1, max_size=3),
       stem=st.integers(1, 3), train=st.booleans())
def test_the_compiled_node_graph_computes_dnws_masked_convolutions_and_its_oracle(seed, gate, density, nodes, stem,
                                                                                  train):
    budget = {"density": density} if density and gate != "topk" else {"K": 1}
    net = built("neural-graph", gate=gate, nodes=nodes, stem_nodes=stem, features=nodes[-1], image_size=8,
                 seed=seed, **budget).train(train).double()
    x, target = batch(net, 3, dtype=torch.float64), torch.randn(3, 10, dtype=torch.float64)
    out = net(x)
    (out * target).sum().backward()
    grads = {n: p.grad.clone() for n, p in net.named_parameters()}
    drawn = net.training and net.stochastic  # DNW's formulation reads the kept edges, not a training draw
    for reference in (Oracle(net),) if drawn else (_masked_graph()(net), Oracle(net)):
        net.zero_grad()
        (out_ref := reference(x, net.last_draw) if isinstance(reference, Oracle) else reference(x))
        torch.testing.assert_close(out_ref, out)
        (out_ref * target).sum().backward()
        for name, p in net.named_parameters():
            got = reference.grad_of(net, name) if isinstance(reference, Oracle) else p.grad
            torch.testing.assert_close(got, grads[name], atol=1e-9 * max(1.0, grads[name].abs().max().item()),
                                       rtol=1e-7)


def _kept(net):
    return sum(int(m.sum()) for m in net.connectivity().values())


@pytest.mark.parametrize("gate", ["dnw", "dnw_masked", "random", "magnitude"])
@pytest.mark.parametrize("topology", ["resnext", "dense", "neural-graph"])
def test_exactly_the_budget_is_kept_over_the_network_in_training_and_evaluation(gate, topology):
    net = _budgeted(gate, 0.3, topology, M=6, seed=3)
    candidates = len(gate_edges(net.graph()))
    budget = round(0.3 * candidates)
    assert _kept(net) == budget == edge_counts(net.graph())[0] and edge_counts(net.graph())[1] == candidates
    for step in range(3):  # the weights move: the kept edges may change, their number does not
        net(batch(net))
        assert _kept(net) == budget
        with torch.no_grad():
            for p in net.gate_parameters() or [g.weight for _, g in net.gates()]:
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(step)))
    before = net.eval()(batch(net))
    assert _kept(net.freeze()) == budget
    torch.testing.assert_close(net(batch(net)), before)


@pytest.mark.parametrize("gate", ["dnw", "random", "magnitude"])  # magnitude: equal scores, by the tie ranks
@pytest.mark.parametrize("topology", TOPOLOGIES_WITH_GATES)
def test_a_budgets_graph_as_built_records_the_edges_its_network_keeps(gate, topology):
    options = SMALL_GRAPH if topology == "neural-graph" else tiny(K=None, M=6)
    graph = TOPOLOGIES.get(topology)(**{**options, "gate": gate, "density": 0.5, "K": None})
    assert _kept_edges(connlearn.from_graph(graph).graph()) == _kept_edges(graph)


def test_per_block_scope_keeps_each_blocks_k_top_edges_by_magnitude():
    net = connlearn.build(**tiny(C=5, K=2, gate="dnw", seed=1))
    for _, gate in net.gates():
        w = gate.values().abs()
        kept = gate.active()
        assert (kept.sum(1) == 2).all()
        assert (w[kept].view(-1, 2).amin(1) >= w.masked_fill(kept, -1).amax(1)).all()


@pytest.mark.parametrize("gate", ["dnw", "magnitude"])
def test_global_scope_keeps_the_largest_scores_of_the_whole_network_and_spreads_ties_over_rows(gate):
    net = _budgeted(gate, 0.4, M=6, seed=5, gate_init="uniform")
    score = type(next(iter(net.gates()))[1]).score  # |weight| for dnw, the score itself for magnitude
    w = torch.cat([score(g.values()).flatten() for _, g in net.gates()])
    kept = torch.cat([g.active().flatten() for _, g in net.gates()])
    assert w[kept].min() >= w[~kept].max()
    if gate == "magnitude":  # equal scores (a constant gate_init) go by each row's ranks from its top: every
        for topology in TOPOLOGIES_WITH_GATES:  # block reads some, and a path reaches it
            net = _budgeted(gate, 0.5, topology, M=6, seed=5)
            assert min(int(a.sum(1).min()) for a in net.connectivity().values()) >= 1
            assert all(bool(r.all()) for r in net._reached(net._mixes({})))


@pytest.mark.parametrize("gate", ["dnw", "dnw_masked"])
@pytest.mark.parametrize("density", [None, 0.3])
def test_every_edge_gets_the_dense_gradient_straight_through_and_the_ablation_none_where_not_kept(gate, density):
    net = (connlearn.build(**tiny(C=4, K=2, gate=gate, seed=2)) if density is None
           else _budgeted(gate, density, seed=2)).double()
    x, target = batch(net, 3, dtype=torch.float64), torch.randn(3, 10, dtype=torch.float64)
    masks = {m: g.active().clone() for m, g in net.gates()}
    dense_graph = net.graph()  # every edge kept, each weighted by what the budgeted forward pass uses
    dense_graph.graph.update(density=1.0, edge_weights=True)
    dense = connlearn.from_graph(dense_graph).double()
    state = {k: v for k, v in net.state_dict().items() if not k.endswith("_extra_state")}
    dense.load_state_dict({k: v * masks[int(net.module_ids[int(k.split(".")[1])])] if k.endswith("gate.weight")
                           else v for k, v in state.items()}, strict=False)
    (net(x) * target).sum().backward()
    (dense(x) * target).sum().backward()
    torch.testing.assert_close(net(x), dense(x))
    assert not net.gate_parameters()  # edge weights are weights: the weights' param group, its weight decay
    for (m, g), (_, d) in zip(net.gates(), dense.gates(), strict=True):
        expected = d.weight.grad if gate == "dnw" else d.weight.grad * masks[m]
        torch.testing.assert_close(g.weight.grad, expected)
        assert (g.weight.grad[~masks[m]] != 0).any() == (gate == "dnw")


def test_edge_weights_train_in_the_weights_group_with_its_weight_decay():
    net = _budgeted("dnw", 0.3)
    groups = param_groups(net, lr=0.1, weight_decay=5e-4, gate_lr=0.2)
    weights = {id(p) for g in groups if g["weight_decay"] > 0 for p in g["params"]}
    assert all(id(g.weight) in weights for _, g in net.gates()) and len(groups) == 1


def test_the_fair_random_graph_is_uniform_over_the_candidate_edges():
    """3 stem nodes read by 3 feature nodes: 9 candidate edges, density 0.25 keeps 2 (each a path from the stem to
    the head): each of the 36 pairs equally often over seeds."""
    seeds = 1800
    counts = collections.Counter()
    for seed in range(seeds):
        g = TOPOLOGIES.get("neural-graph")(nodes=[3], stem_nodes=3, features=3, image_size=8, gate="random",
                                           density=0.25, seed=seed)
        counts[tuple(_kept_edges(g))] += 1
    pairs = list(itertools.combinations(gate_edges(g), 2))
    assert set(counts) <= set(pairs) and len(pairs) == 36
    expected = seeds / len(pairs)
    chi2 = sum((counts[p] - expected) ** 2 / expected for p in pairs)
    assert chi2 < 66.6  # 35 degrees of freedom: P(chi2 > 66.6) = 0.001 under uniformity


def test_a_random_graphs_edges_carry_trainable_signed_weights_and_stay_fixed():
    net = _budgeted("random", 0.3, seed=4)
    kept = net.connectivity()
    assert net.fixed_connectivity and not net.gate_parameters()
    assert all(g.weight.requires_grad and (g.values() < 0).any() for _, g in net.gates())
    net(batch(net)).sum().backward()
    assert all(torch.equal(kept[m], g.active()) for m, g in net.gates())


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10**6), density=st.sampled_from([0.1, 0.3, 0.6]),
       topology=st.sampled_from(["resnext", "dense", "neural-graph"]))
def test_rewiring_keeps_every_degree_and_the_budget(seed, density, topology):
    graph = _budgeted("dnw", density, topology, M=6, C=4, seed=seed).graph()

    def degrees(g):
        kept = _kept_edges(g)
        return collections.Counter(u for u, _ in kept), collections.Counter(v for _, v in kept), set(kept)

    out_before, in_before, before = degrees(graph)
    rewired = rewire(graph, seed=seed)
    out_after, in_after, after = degrees(rewired)
    assert (out_after, in_after, len(after)) == (out_before, in_before, len(before))
    assert sorted(d["gate"] for *_, d in rewired.edges(data=True) if d["kind"] == "gate") == sorted(
        d["gate"] for *_, d in graph.edges(data=True) if d["kind"] == "gate")
    connlearn.from_graph(rewired)  # still a network


@pytest.mark.parametrize("topology", ["dense", "neural-graph"])
def test_shuffling_keeps_the_count_between_every_two_modules_and_moves_edges(topology):
    graph = _budgeted("dnw", 0.3, topology, M=6, C=4, seed=2).graph()

    def between(g):
        kept = _kept_edges(g)
        return collections.Counter((g.nodes[u]["module"], g.nodes[v]["module"]) for u, v in kept), set(kept)

    (counts, kept), (shuffled_counts, shuffled) = between(graph), between(shuffle(graph, seed=1))
    assert shuffled_counts == counts and shuffled != kept
    connlearn.from_graph(shuffle(graph, seed=1))  # still a network


@pytest.mark.parametrize("generator", ["er", "ba", "ws"])
def test_randwire_generators_keep_the_node_count_and_the_edge_budget(generator):
    graph = connlearn.build("neural-graph", gate="random", density=0.2, nodes=[6, 6, 6], stem_nodes=4,
                            features=3, image_size=8).graph()
    made = generated(graph, generator, seed=3)
    assert edge_counts(made) == edge_counts(graph) and made.block_nodes() == graph.block_nodes()
    again = generated(graph, generator, seed=3)
    assert set(made.edges) == set(graph.edges) and _kept_edges(made) == _kept_edges(again)
    connlearn.from_graph(made)


@pytest.mark.parametrize("gate, options, control", [
    *((gate, {"density": 0.3}, control) for gate in ("dnw", "magnitude") for control in ("rewire", "shuffle", "er")),
    ("dnw", {"K": 2}, "rewire"), ("topk", {"K": 2}, "rewire")])  # shuffling and generating keep no per-block K
def test_a_rewired_learned_graph_compiles_to_a_network_that_reads_exactly_its_kept_edges(gate, options, control):
    graph = connlearn.build("neural-graph", gate=gate, **options, nodes=[6, 6], stem_nodes=4, features=3,
                            image_size=8).graph()
    made = {"rewire": rewire, "shuffle": shuffle}.get(control, lambda g, seed: generated(g, control, seed))(graph, 1)
    kept = _kept_edges(made)
    assert kept != _kept_edges(graph) and _kept_edges(connlearn.from_graph(made).graph()) == kept


def test_rewiring_moves_edges():
    graph = _budgeted("random", 0.5, M=6, C=4).graph()
    rewired = rewire(graph, seed=1)
    assert set(_kept_edges(graph)) != set(_kept_edges(rewired))


@settings(max_examples=10, deadline=None)
@example(seed=3, gate="dnw", density=0.2, topology="resnext")  # blocks of the last module switched off
@given(seed=st.integers(0, 10**6), gate=st.sampled_from(["dnw", "dnw_masked", "random", "magnitude"]),
       density=st.sampled_from([None, 0.05, 0.2]), topology=st.sampled_from(["resnext", "dense", "neural-graph"]))
def test_freezing_and_pruning_a_budgeted_or_edge_weight_network_keep_its_outputs(seed, gate, density, topology):
    if density is None and (gate in ("random", "magnitude") or topology == "neural-graph"):
        density = 0.1
    net = (connlearn.build(topology, **tiny(M=6, gate=gate, seed=seed)) if density is None
           else _budgeted(gate, density, topology, M=6, seed=seed)).eval()
    x = batch(net, 3)
    before = net(x)
    weights = [p for _, g in net.gates() for p in g.parameters()]
    frozen = copy.deepcopy(net).freeze() if not net.fixed_connectivity else net
    torch.testing.assert_close(frozen(x), before)
    pruned = prune_dead_blocks(net, freeze=True)[0]
    torch.testing.assert_close(pruned.eval()(x), before, atol=1e-5, rtol=1e-5)
    loaded = connlearn.from_graph(pruned.graph().to_json())  # the graph holds the weights of the kept edges
    loaded.load_state_dict(pruned.state_dict())
    torch.testing.assert_close(loaded.eval()(x), before, atol=1e-5, rtol=1e-5)
    if not net.fixed_connectivity and gate != "magnitude":  # an optimizer holding the edge weights goes on
        assert [g.weight for _, g in net.freeze().gates()] == weights


def test_a_pruned_node_graph_keeps_its_features_and_exports_to_what_it_computes(tmp_path):
    net = connlearn.build("neural-graph", gate="dnw", nodes=[6, 6], stem_nodes=4, features=3, density=0.2,
                          image_size=16).eval()
    pruned, report = prune_dead_blocks(net, freeze=True)
    assert report.blocks_after < report.blocks_before and len(pruned.graph().branches(4)) == 3
    x = batch(net, 2)
    export(pruned, tmp_path / "net.pt")
    torch.testing.assert_close(torch.jit.load(tmp_path / "net.pt")(x), net(x))


@pytest.mark.parametrize("options", [{"gate": "topk"}, {"gate": "full", "K": 4}, {"gate": "dnw"},
                                     {"gate": "random", "K": None, "density": 0.2}])
def test_the_summary_says_how_many_candidate_edges_are_kept_under_which_budget(options):
    net = connlearn.build(**tiny(**options))
    kept, candidates = edge_counts(net.graph())
    budget = f"density={options['density']}" if "density" in options else f"K={net.K}"  # a density's K is a mean
    assert f"gate={options['gate']} {budget}, " in connlearn.summary(net)
    assert f"{kept} of {candidates} candidate edges kept" in connlearn.summary(net)


def test_a_retrained_connectivity_rewinds_to_its_seeds_weights_unless_reinit_and_random_can_start_at_the_top(
        tmp_path):
    train, graph = synthetic(n_train=10, n_test=10)[0], {"dataset": "cifar10", "topology": "neural-graph",
                                                         "nodes": [3, 4], "features": 2, "density": 0.3, "seed": 7}
    learned = build_net(RunConfig(**graph, gate="dnw"), train)
    save_checkpoint(make_checkpoint(learned), tmp_path / "learned.pt")
    again, other = (build_net(RunConfig(dataset="cifar10", connectivity=str(tmp_path / "learned.pt"), seed=7,
                                        reinit=reinit), train) for reinit in (False, True))

    def weights(net):
        return torch.cat([g.values().flatten() for _, g in net.gates()])

    for net, same in ((again, True), (other, False)):  # the same seed draws the learning run's own weights
        assert torch.equal(weights(net), weights(learned)) == same
        assert torch.equal(net.stem.conv.weight, learned.stem.conv.weight) == same
    plain, top = (build_net(RunConfig(**graph, gate="random", edge_init=start), train) for start in (None, "top"))
    kept = torch.cat([m.flatten() for m in plain.connectivity().values()])
    assert torch.equal(kept, torch.cat([m.flatten() for m in top.connectivity().values()]))
    assert torch.equal(weights(top)[~kept], weights(plain)[~kept])  # the kept start as dnw's: |w| in [1 - d, 1]
    assert torch.equal(weights(top)[kept].sign(), weights(plain)[kept].sign())
    assert weights(top)[kept].abs().min() >= 1 - 0.3


def test_edge_weights_count_as_parameters_while_they_train_and_only_kept_once_fixed():
    net = _budgeted("dnw", 0.3, "neural-graph", seed=1)
    every, kept, edges = sum(p.numel() for p in net.weight_parameters()), _kept(net), len(gate_edges(net.graph()))
    assert net.num_parameters() == every  # every edge weight trains (straight-through)
    assert copy.deepcopy(net).freeze().num_parameters() == every - edges + kept
    assert _budgeted("random", 0.3, "neural-graph", seed=1).num_parameters() == every - edges + kept
