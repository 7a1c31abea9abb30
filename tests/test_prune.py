"""Pruning laws: same eval outputs, parameters = live blocks + the rest, idempotence, chains removed."""

import copy

import pytest
import torch
from conftest import tiny
from hypothesis import given
from hypothesis import strategies as st

import connlearn
from connlearn.blocks import RESIDUAL_INITS
from connlearn.compile import FusedModule
from connlearn.errors import ConfigError, ConfigTypeError
from connlearn.prune import (
    active_branches,
    dead_blocks,
    input_overlap,
    live_blocks,
    prune_dead_blocks,
    random_overlap,
)

X = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(0))


def _randomise_bn(net):
    g = torch.Generator().manual_seed(1)
    for m in net.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean = torch.randn(m.running_mean.shape, generator=g) * 0.1
            m.running_var = torch.rand(m.running_var.shape, generator=g) + 0.5


def _non_block_params(net):
    return sum(p.numel() for n, p in net.named_parameters() if ".block." not in n and ".blocks." not in n)


@st.composite
def fixed_nets(draw):
    C = draw(st.integers(1, 6))
    topology = draw(st.sampled_from(["resnext", "dense"]))
    opts = tiny(C=C, K=draw(st.integers(1, C)), M=draw(st.sampled_from([3, 6])), seed=draw(st.integers(0, 10**6)),
                block=draw(st.sampled_from(["bottleneck", "basic"])),
                residual_init=draw(st.sampled_from(RESIDUAL_INITS)))
    how = draw(st.sampled_from(["random", "frozen"]))
    if how == "random":
        net = connlearn.build(topology, gate="random", **opts)
    else:
        net = connlearn.build(topology, gate="topk", gate_init="uniform", **opts).freeze()
    if draw(st.booleans()):
        net = net.to_engine("reference")
    return net


@given(fixed_nets())
def test_pruned_net_computes_the_same_eval_outputs_with_the_live_blocks_parameters(net):
    _randomise_bn(net)
    net.eval()
    pruned, report = prune_dead_blocks(net)
    torch.testing.assert_close(pruned.eval()(X), net(X), atol=1e-5, rtol=1e-5)
    live = live_blocks(net.graph())
    per_block = {}
    for stage, module in zip(net.stages, net.module_ids, strict=True):
        nodes = net.graph().branches(module)
        if isinstance(stage, FusedModule):
            size = sum(p.numel() for p in stage.block.parameters()) // stage.branches
            per_block.update(dict.fromkeys(nodes, size))
        else:
            for n, b in zip(nodes, stage.blocks, strict=True):
                per_block[n] = sum(p.numel() for p in b.parameters())
    expected = _non_block_params(net) + sum(per_block[n] for n in live)
    assert report.params_after == pruned.num_parameters() == expected
    assert report.params_before == net.num_parameters()
    assert report.blocks_after == len(live)


@given(fixed_nets())
def test_pruning_twice_changes_nothing(net):
    once, _ = prune_dead_blocks(net)
    twice, report = prune_dead_blocks(once)
    assert report.params_after == report.params_before and not any(report.removed.values())
    assert twice.graph().block_nodes() == once.graph().block_nodes()


def test_a_connectivity_without_dead_blocks_prunes_nothing():
    net = connlearn.build(**tiny(gate="full", K=4, block="basic"))
    _, report = prune_dead_blocks(net)
    assert report.params_after == report.params_before and report.blocks_after == report.blocks_before


def test_chains_dead_only_because_their_consumers_are_dead_are_removed():
    """m1.b1 feeds only m2.b1, which feeds nothing: both go, although m1.b1 has an active out-edge."""
    net = connlearn.build(**tiny(gate="random", C=3, K=1, M=3))
    graph = net.graph()
    rows = {"m2.b1": "m1.b1", "m2.b2": "m1.b2", "m2.b3": "m1.b2", "m3.b1": "m2.b2", "m3.b2": "m2.b3",
            "m3.b3": "m2.b2"}
    for dst, src in rows.items():
        for u, _, d in graph.gate_edges(dst):
            d["active"] = u == src
    fixed = connlearn.from_graph(graph)
    assert dead_blocks(fixed.graph()) == {"m1.b1", "m2.b1", "m1.b3"}
    pruned, report = prune_dead_blocks(fixed)
    assert report.removed == {1: ["m1.b1", "m1.b3"], 2: ["m2.b1"], 3: []}
    fixed.eval()
    torch.testing.assert_close(pruned.eval()(X), fixed(X))


def test_k1_random_connectivity_on_29_8_8_removes_blocks():
    net = connlearn.build(preset="cifar-29-8-8", gate="random", K=1)
    _, report = prune_dead_blocks(net)
    assert report.blocks_after < report.blocks_before and report.params_after < report.params_before


def test_learnable_gates_must_be_frozen_first():
    net = connlearn.build(**tiny())
    with pytest.raises(ConfigError, match="freeze"):
        prune_dead_blocks(net)
    pruned, _ = prune_dead_blocks(net, freeze=True)
    assert pruned.gate_kind == "frozen" and net.gate_kind == "topk"


def test_pruned_graph_compiles_again_to_the_same_network():
    net = connlearn.build(**tiny(gate="random", K=1, C=4, M=6)).eval()
    pruned, _ = prune_dead_blocks(net)
    again = connlearn.from_graph(pruned.graph())
    again.load_state_dict(pruned.state_dict())
    torch.testing.assert_close(again.eval()(X), net(X))


# ----------------------------------------------------------------------------- input overlap
@given(C=st.integers(1, 9), data=st.data())
def test_random_overlap_is_the_mean_over_every_pair_of_subsets(C, data):
    import itertools

    K = data.draw(st.integers(1, C))
    subsets = [set(s) for s in itertools.combinations(range(C), K)]
    exact = sum(len(a & b) / len(a | b) for a in subsets for b in subsets) / len(subsets) ** 2
    assert random_overlap(C, K) == pytest.approx(exact)


def test_random_overlap_refuses_k_above_c():
    with pytest.raises(ConfigError, match="K <= C"):
        random_overlap(4, 5)


def _with_rows(net, rows):
    """The frozen graph of ``net`` with every gated module's active inputs given by ``rows`` (column lists)."""
    graph = net.graph()
    for m in graph.modules():
        for node, cols in zip(graph.branches(m), rows, strict=True):
            for k, (_, _, d) in enumerate(graph.gate_edges(node)):
                d["active"] = k in cols
    return graph


def test_input_overlap_is_the_mean_jaccard_similarity_over_pairs_of_blocks():
    net = connlearn.build(gate="random", **tiny(C=4, K=2, M=3))
    assert list(input_overlap(_with_rows(net, [[0, 1]] * 4)).values()) == [1.0, 1.0]
    # two pairs read the same inputs (1 each), the four other pairs share nothing (0 each)
    assert list(input_overlap(_with_rows(net, [[0, 1], [2, 3], [0, 1], [2, 3]])).values()) == [2 / 6, 2 / 6]
    # {0,1} and {1,2} share one input of three
    assert input_overlap(_with_rows(net, [[0, 1], [1, 2]] * 2))[2] == pytest.approx((2 * 1 + 4 / 3) / 6)
    assert set(input_overlap(connlearn.build(gate="full", **tiny(C=4, K=4, M=3)).graph()).values()) == {1.0}


@given(seed=st.integers(0, 10**6))
def test_input_overlap_of_a_module_lies_in_0_1_and_covers_the_gated_modules(seed):
    graph = connlearn.build(gate="random", **tiny(C=5, K=2, M=3, seed=seed)).graph()
    overlap = input_overlap(graph)
    assert set(overlap) == {m for m in graph.modules() if graph.candidates(m)}
    assert all(0 <= v <= 1 for v in overlap.values())


def test_the_k1_pruning_baseline_counts_what_pruning_removes():
    from k1_pruning import prune_counts

    train, test, blocks, left = prune_counts("cifar-20-4-8", seed=0)
    assert test < train and left < blocks == 48  # any K=1 connectivity leaves branches unread
    train, test, blocks, left = prune_counts("cifar-20-4-8", seed=0, K=8)
    assert (test, left) == (train, blocks)  # every block reads every branch: nothing to prune


@pytest.mark.parametrize("engine", ["fused", "reference"])
def test_a_module_none_of_whose_blocks_is_read_is_left_out(engine):
    """In a dense graph a whole module can go unread; pruning leaves it out, with the same outputs."""
    net = connlearn.build("dense", M=9, C=2, K=1, gate="random", width=1, base_channels=4, stem_channels=4,
                          num_classes=10, seed=0, engine=engine).eval()
    graph = net.graph()
    unread = [m for m in graph.modules() if set(graph.branches(m)) <= dead_blocks(graph)]
    assert unread  # this seed leaves module 2 unread
    pruned, report = prune_dead_blocks(net)
    assert not set(unread) & set(pruned.module_ids)
    assert report.blocks_after == len(graph.block_nodes()) - len(dead_blocks(graph))
    torch.testing.assert_close(pruned.eval()(X), net(X), atol=1e-5, rtol=1e-5)


def test_real_gates_are_not_frozen_to_their_top_k_behind_the_users_back():
    """``real`` gates weight every input by its value: their top-K is another function."""
    net = connlearn.build(**tiny(gate="real", gate_init="uniform", K=1, seed=1)).eval()
    with pytest.raises(ConfigError, match=r"'real' evaluates with its real gate values.*net.freeze\(\) first"):
        prune_dead_blocks(net, freeze=True)
    frozen = net.freeze()  # asked for explicitly: the top-K it is
    pruned, _ = prune_dead_blocks(frozen)
    torch.testing.assert_close(pruned.eval()(X), frozen(X), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("engine", ["fused", "reference"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_pruning_and_moving_engines_keep_the_dtype(engine, dtype):
    net = connlearn.build(**tiny(gate="random", K=1, seed=2), engine=engine).to(dtype).eval()
    x = X.to(dtype)
    pruned, report = prune_dead_blocks(net)
    assert report.blocks_after < report.blocks_before
    assert {p.dtype for p in pruned.parameters()} == {dtype}
    torch.testing.assert_close(pruned(x), net(x), atol=0, rtol=0)
    other = net.to_engine("reference" if engine == "fused" else "fused")
    assert {p.dtype for p in other.parameters()} == {dtype}
    if dtype == torch.float64:  # the weights arrive unrounded
        torch.testing.assert_close(other.eval()(x), net(x), atol=1e-12, rtol=1e-12)


def test_freezing_keeps_the_dtype_when_nothing_is_pruned():
    net = connlearn.build(**tiny(gate="topk", C=3, K=3)).double().eval()
    pruned, report = prune_dead_blocks(net, freeze=True)
    assert report.blocks_after == report.blocks_before
    assert {t.dtype for t in pruned.state_dict().values() if torch.is_tensor(t) and t.is_floating_point()} == {
        torch.float64}
    torch.testing.assert_close(pruned(X.double()), net(X.double()), atol=1e-12, rtol=1e-12)


def test_only_networks_are_pruned():
    with pytest.raises(ConfigTypeError, match="ConnectivityNet, got Sequential"):
        prune_dead_blocks(torch.nn.Sequential())


def test_unfrozen_real_gates_lose_only_the_blocks_that_no_gate_of_non_zero_value_reads():
    net = connlearn.build(**tiny(gate="real", K=2, gate_init="uniform", seed=3))
    with torch.no_grad():
        net.stages[2].gate.real_parameters()[0][:, 1] = 0.0  # module 3 reads no output of m2.b2
    graph = net.graph()
    assert dead_blocks(graph) == {"m2.b2"}  # not the blocks outside every top-2
    assert active_branches(graph) == {1: 4, 2: 3, 3: 4}
    assert len(graph.used_edges()) > len(graph.active_edges())
    frozen = copy.deepcopy(net).freeze().graph()  # the top-2 now: used edges are the active ones
    assert frozen.used_edges() == frozen.active_edges()
    net.eval()  # the law: what is dead does not change the outputs, and what is live does
    images = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    before = net(images)
    conv1 = net.stages[1].block.conv1.weight  # module 2's blocks, branch-major: m2.b2 is the second slice
    rows = conv1.shape[0] // 4
    with torch.no_grad():
        conv1[rows:2 * rows].normal_()
    torch.testing.assert_close(net(images), before, atol=0, rtol=0)
    with torch.no_grad():
        conv1[:rows].normal_()  # m2.b1, live
    assert not torch.allclose(net(images), before)


def _customised(engine):
    """A K=1 net with dead blocks whose modules were changed after they were made, as users do."""
    net = connlearn.build(**tiny(K=1, gate="random", engine=engine, seed=3))
    _randomise_bn(net)
    for m in net.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.eps, m.momentum = 0.1, 0.3
    for name, p in net.named_parameters():
        if "conv1" in name:
            p.requires_grad_(False)
    net = net.to(memory_format=torch.channels_last)
    net.stages[1].eval()  # a module kept in eval mode while the rest trains
    return net


def _settings(net):
    bns = [m for m in net.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    convs = [p for n, p in net.named_parameters() if p.dim() == 4]
    return ({(type(m).__name__, m.eps, m.momentum) for m in bns},
            {(n.rsplit(".", 2)[-2], p.requires_grad) for n, p in net.named_parameters() if "conv1" in n},
            all(p.is_contiguous(memory_format=torch.channels_last) for p in convs))


@pytest.mark.parametrize("engine", ["fused", "reference"])
def test_pruning_and_moving_engines_keep_what_was_set_on_the_modules_after_they_were_made(engine):
    net = _customised(engine)
    assert dead_blocks(net.graph())
    for changed in (prune_dead_blocks(net)[0], net.to_engine("reference" if engine == "fused" else "fused")):
        assert _settings(changed) == _settings(net) == ({("BatchNorm2d", 0.1, 0.3)}, {("conv1", False)}, True)
        in_eval = [n for n, m in changed.named_modules() if not m.training]  # every module of stage 1, no other
        assert in_eval and all(n == "stages.1" or n.startswith("stages.1.") for n in in_eval)
        assert len(in_eval) == len(list(changed.stages[1].modules()))
        net.eval(), changed.eval()
        torch.testing.assert_close(changed(X), net(X), rtol=0, atol=1e-6)
        net.train(), net.stages[1].eval()


def test_sync_batch_norms_stay_sync_batch_norms_and_a_replaced_submodule_is_named():
    net = torch.nn.SyncBatchNorm.convert_sync_batchnorm(connlearn.build(**tiny(K=1, gate="random", seed=3)))
    small = prune_dead_blocks(net)[0]
    assert {type(m) for m in small.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)} == {
        torch.nn.SyncBatchNorm}
    for part, replacement, made in (("relu", torch.nn.GELU(), "ReLU"),
                                    ("bn1", torch.nn.GroupNorm(1, 16), "BatchNorm2d")):
        net = connlearn.build(**tiny(K=1, gate="random", seed=3))
        setattr(net.stages[1].block, part, replacement)  # a part its kind does not make
        for change in (prune_dead_blocks, lambda n: n.to_engine("reference")):
            with pytest.raises(ConfigError, match=rf"submodule '{part}' is a {type(replacement).__name__}, but its "
                                                  rf"kind makes a {made}"):
                change(net)


def test_blocks_merged_into_one_must_agree_in_their_settings_and_hooks_never_stop_a_change_of_engine():
    import threading

    net = connlearn.build(**tiny(K=1, gate="random", seed=3, engine="reference"))
    lock = threading.Lock()  # a hook holding what cannot be copied
    net.stem.register_forward_hook(lambda module, args, out, lock=lock: None)
    fused = net.to_engine("fused")
    assert not fused.stem._forward_hooks  # hooks are not carried
    net.stages[1].blocks[2].bn1.eps = 0.5
    with pytest.raises(ConfigError, match=r"merge\(\): blocks 0 and 2 differ in what was set on them .*'bn1'"):
        net.to_engine("fused")
