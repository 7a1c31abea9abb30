"""connlearn.render: DOT drawings of a BranchGraph, matched to the IR one to one."""

import json
import shutil
import subprocess

import pytest
import torch
from conftest import needs_dot, tiny
from hypothesis import given
from hypothesis import strategies as st

import connlearn
from connlearn import render
from connlearn.errors import ConfigError, ConfigTypeError, UnknownNameError
from connlearn.prune import dead_blocks, live_blocks, prune_dead_blocks


def _graph(**overrides):
    return connlearn.build(**tiny(**overrides)).graph()


@pytest.fixture
def sparse():
    """A K=1 random connectivity with dead blocks."""
    g = _graph(M=6, C=4, K=1, gate="random", seed=0)
    assert dead_blocks(g), "the fixture needs dead blocks"
    return g


def _layout(dot):
    """Lay ``dot`` out with Graphviz: its nodes by name, its drawn (not invisible) edges by (tail, head) and its
    subgraphs by name as (rank, member node names)."""
    out = subprocess.run(["dot", "-Tjson0"], input=dot.source, capture_output=True, text=True, check=True)
    doc = json.loads(out.stdout)
    objects = doc["objects"]
    n_sub = doc.get("_subgraph_cnt", 0)
    nodes = {o["name"]: o for o in objects[n_sub:]}
    subgraphs = {o["name"]: (o.get("rank"), {objects[i]["name"] for i in o.get("nodes", [])}) for o in objects[:n_sub]}
    edges = {(objects[e["tail"]]["name"], objects[e["head"]]["name"]): e
             for e in doc.get("edges", []) if e.get("style") != "invis"}
    return nodes, edges, subgraphs


def _drawn_edges_of(graph, keep):
    return {(u, v) for u, v in graph.active_edges() if u in keep and v in keep}


# ---------------------------------------------------------------------------- one to one with the IR
@needs_dot
def test_hollow_drawing_has_one_node_per_ir_node_dead_ones_included(sparse):
    nodes, _, _ = _layout(render.to_dot(sparse, dead="hollow"))
    assert set(nodes) == set(sparse.nodes)


@needs_dot
def test_hollow_drawing_has_one_arrow_per_active_edge(sparse):
    _, edges, _ = _layout(render.to_dot(sparse, dead="hollow"))
    assert set(edges) == set(sparse.active_edges())
    assert len(edges) < sparse.number_of_edges()  # inactive gate edges are not drawn


@needs_dot
def test_hide_leaves_out_dead_blocks_and_their_edges(sparse):
    nodes, edges, _ = _layout(render.to_dot(sparse, dead="hide"))
    keep = set(sparse.nodes) - dead_blocks(sparse)
    assert set(nodes) == keep
    assert set(edges) == _drawn_edges_of(sparse, keep)


@needs_dot
@given(
    C=st.integers(1, 6),
    K_fraction=st.floats(0, 1),
    seed=st.integers(0, 10_000),
    gate=st.sampled_from(["random", "topk"]),
    dead=st.sampled_from(render.DEAD_STYLES),
)
def test_drawing_matches_any_connectivity_one_to_one(C, K_fraction, seed, gate, dead):
    K = 1 + round(K_fraction * (C - 1))
    g = _graph(M=3, C=C, K=K, gate=gate, gate_init="uniform", seed=seed)
    keep = set(g.nodes) - (dead_blocks(g) if dead == "hide" else set())
    nodes, edges, _ = _layout(render.to_dot(g, dead=dead))
    assert set(nodes) == keep
    assert set(edges) == _drawn_edges_of(g, keep)


# ---------------------------------------------------------------------------- looks like Figure 3
@needs_dot
def test_stem_and_head_are_circles_and_blocks_squares(sparse):
    nodes, _, _ = _layout(render.to_dot(sparse))
    assert nodes["input"]["shape"] == nodes["output"]["shape"] == "circle"
    assert {nodes[n]["shape"] for n in sparse.block_nodes()} == {"square"}


@needs_dot
def test_each_module_is_one_row_stacked_from_stem_to_head(sparse):
    nodes, _, subgraphs = _layout(render.to_dot(sparse))
    rows = [members for rank, members in subgraphs.values() if rank == "same"]
    assert sorted(rows, key=sorted) == sorted((set(sparse.branches(m)) for m in sparse.modules()), key=sorted)

    def height(node):
        return float(nodes[node]["pos"].split(",")[1])

    row_heights = [{height(n) for n in sparse.branches(m)} for m in sparse.modules()]
    assert all(len(h) == 1 for h in row_heights)
    column = [height("input"), *(h.pop() for h in row_heights), height("output")]
    assert column == sorted(column, reverse=True)  # Graphviz's y grows upwards


@needs_dot
def test_dead_blocks_are_drawn_hollow_and_dashed(sparse):
    nodes, edges, _ = _layout(render.to_dot(sparse, dead="hollow"))
    dead = dead_blocks(sparse)
    assert all("dashed" in nodes[n]["style"] and "filled" not in nodes[n]["style"] for n in dead)
    assert all("filled" in nodes[n]["style"] for n in live_blocks(sparse))
    assert all(edges[u, v].get("style") == "dashed" for u, v in edges if u in dead or v in dead)


def test_unknown_dead_style_is_an_error_naming_the_styles(sparse):
    with pytest.raises(UnknownNameError, match="hollow"):
        render.to_dot(sparse, dead="hidden")


def test_legend_says_gate_kind_fan_in_and_live_blocks(sparse):
    live, total = len(live_blocks(sparse)), len(sparse.block_nodes())
    assert f"gate=random K=1, {live}/{total} blocks live" in render.to_dot(sparse).source


def test_the_legend_of_a_frozen_connectivity_names_what_learned_it():
    frozen = connlearn.build(**tiny()).freeze().graph()
    assert "gate=frozen from topk K=2, " in render.to_dot(frozen).source
    assert frozen.gate_label() == "frozen from topk" and _graph(gate="random").gate_label() == "random"


def test_title_is_the_legend_first_line(sparse):
    dot = render.to_dot(sparse, title="CIFAR-100 run 3")
    assert "CIFAR-100 run 3\ngate=random K=1" in dot.source.replace("\\n", "\n")


@needs_dot
def test_weighted_pen_width_follows_the_gate_value_within_its_row():
    g = _graph(C=4, K=4, gate="topk", gate_init="uniform", seed=3)
    _, plain, _ = _layout(render.to_dot(g))
    _, weighted, _ = _layout(render.to_dot(g, weighted=True))
    assert {e.get("penwidth") for e in plain.values()} == {None}
    block = "m2.b1"
    row = {u: d["gate"] for u, _, d in g.gate_edges(block)}
    widths = {u: float(weighted[u, block]["penwidth"]) for u in row}
    assert sorted(widths, key=widths.get) == sorted(row, key=row.get)
    assert widths[max(row, key=row.get)] == max(float(e["penwidth"]) for e in weighted.values())


@needs_dot
def test_unfrozen_real_gates_are_drawn_as_their_function_reads_every_input_weighted():
    net = connlearn.build(**tiny(gate="real", K=2, gate_init="uniform", seed=3))
    values = net.stages[2].gate.real_parameters()[0]
    with torch.no_grad():
        values[:, 1] = 0.0  # no block of module 3 reads branch 2 of module 2: it is dead there
    g = net.graph()
    assert g.graph["weighted_inputs"] is True
    _, edges, _ = _layout(render.to_dot(g))
    read = {(u, v) for u, v, d in g.edges(data=True) if d["kind"] != "gate" or d["gate"] != 0.0}
    assert set(edges) == read  # not only the top-K that graph() marks active
    assert len(read) > len(g.active_edges())
    assert {e.get("penwidth") is not None for e in edges.values()} == {True}  # weighted unless told not to
    assert {e.get("penwidth") for e in _layout(render.to_dot(g, weighted=False))[1].values()} == {None}
    assert "(every input, weighted by its gate), 11/12 blocks live" in render.to_dot(g).source
    net.freeze()  # now the top-K is what it computes, and what is drawn
    frozen = net.graph()
    assert "weighted_inputs" not in frozen.graph
    assert set(_layout(render.to_dot(frozen))[1]) == set(frozen.active_edges())
    assert "weighted_inputs" not in _graph(gate="topk").graph
    left, right = render.side_by_side(g).source.split("subgraph cluster_learned")
    assert "penwidth" not in left and "(every input" not in left  # ResNeXt's half: every input, unweighted
    assert "penwidth" in right and "(every input, weighted by its gate), 11/12 blocks live" in right


def test_a_fixed_connectivity_reads_its_active_edges_whatever_its_graph_says():
    g = _graph(gate="random")
    g.graph["weighted_inputs"] = True  # e.g. a real net's graph relabelled frozen, the flag left behind
    assert not g.weights_inputs() and g.used_edges() == g.active_edges()
    assert "(every input" not in render.to_dot(g).source


# ---------------------------------------------------------------------------- side by side
@needs_dot
def test_side_by_side_draws_resnext_and_the_learned_net_as_two_clusters(sparse):
    nodes, _, subgraphs = _layout(render.side_by_side(sparse))
    resnext, learned = subgraphs["cluster_resnext"][1], subgraphs["cluster_learned"][1]
    assert resnext == {f"resnext/{n}" for n in sparse.nodes}
    assert learned == {f"learned/{n}" for n in sparse.nodes}
    assert set(nodes) == resnext | learned


@needs_dot
def test_side_by_side_derives_resnext_with_every_gate_edge_active(sparse):
    _, edges, _ = _layout(render.side_by_side(sparse))
    assert {(u, v) for u, v in edges if u.startswith("resnext/")} == {
        (f"resnext/{u}", f"resnext/{v}") for u, v in sparse.edges
    }
    assert {(u, v) for u, v in edges if u.startswith("learned/")} == {
        (f"learned/{u}", f"learned/{v}") for u, v in sparse.active_edges()
    }


@needs_dot
def test_side_by_side_uses_a_given_reference(sparse):
    reference = _graph(M=6, C=4, K=4, gate="full")
    dot = render.side_by_side(sparse, reference)
    _, edges, _ = _layout(dot)
    assert "gate=full K=4" in dot.source
    assert {(u, v) for u, v in edges if u.startswith("resnext/")} == {
        (f"resnext/{u}", f"resnext/{v}") for u, v in reference.active_edges()
    }


# ---------------------------------------------------------------------------- save
def test_save_dot_writes_only_the_dot_source(sparse, tmp_path):
    written = render.save(sparse, tmp_path / "net.dot")
    assert written == [tmp_path / "net.dot"]
    assert written[0].read_text() == render.to_dot(sparse).source
    assert sorted(p.name for p in tmp_path.iterdir()) == ["net.dot"]


@needs_dot
def test_save_svg_renders_the_drawing_next_to_its_dot_source(sparse, tmp_path):
    written = render.save(sparse, tmp_path / "net.svg", dead="hide")
    assert written == [tmp_path / "net.dot", tmp_path / "net.svg"]
    assert written[1].read_text().lstrip().startswith(("<?xml", "<svg"))
    assert written[0].read_text() == render.to_dot(sparse, dead="hide").source
    assert sorted(p.name for p in tmp_path.iterdir()) == ["net.dot", "net.svg"]  # no temporary files left


@needs_dot
@pytest.mark.parametrize("seed", [0, 1])
def test_every_row_keeps_its_blocks_in_branch_order_alone_and_side_by_side(seed):
    graph = connlearn.build(**tiny(M=9, C=8, K=4, width=1, seed=seed)).graph()  # the paper's Figure 3 size
    for dot, prefixes in ((render.to_dot(graph), [""]), (render.side_by_side(graph), ["resnext/", "learned/"])):
        nodes, _, _ = _layout(dot)
        for prefix in prefixes:
            for module in graph.modules():
                xs = [float(nodes[prefix + n]["pos"].split(",")[0]) for n in graph.branches(module)]
                assert xs == sorted(xs), (prefix, module)


@needs_dot
@pytest.mark.parametrize(("suffix", "magic"), [(".png", b"\x89PNG"), (".pdf", b"%PDF")])
def test_save_renders_png_and_pdf(sparse, tmp_path, suffix, magic):
    _, rendered = render.save(render.side_by_side(sparse), tmp_path / f"fig3{suffix}")
    assert rendered.read_bytes().startswith(magic)


def test_save_without_graphviz_writes_the_dot_file_and_warns(sparse, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.warns(UserWarning, match="install Graphviz: apt-get install graphviz"):
        written = render.save(sparse, tmp_path / "net.svg")
    assert written == [tmp_path / "net.dot"]
    assert not (tmp_path / "net.svg").exists()


def test_save_warns_when_graphviz_cannot_run_dot(sparse, tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: f"/found/{name}")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.warns(UserWarning, match="the .dot file was written"):
        written = render.save(sparse, tmp_path / "net.png")
    assert written == [tmp_path / "net.dot"]


def test_save_rejects_an_unsupported_suffix_listing_the_allowed_ones(sparse, tmp_path):
    with pytest.raises(ConfigError, match=r"\.dot \.svg \.png \.pdf"):
        render.save(sparse, tmp_path / "net.jpg")
    assert not list(tmp_path.iterdir())


def test_save_rejects_drawing_options_for_a_finished_drawing(sparse, tmp_path):
    with pytest.raises(ConfigError, match="weighted"):
        render.save(render.to_dot(sparse), tmp_path / "net.dot", weighted=True)



def test_a_network_or_a_pruned_graph_is_named_not_drawn_wrongly():
    net = connlearn.build(**tiny(gate="random", K=1, M=6))
    with pytest.raises(ConfigTypeError, match=r"the graph that to_dot\(\) draws must be a connlearn BranchGraph, got "
                                              r"ConnectivityNet; pass net.graph"):
        render.to_dot(net)
    with pytest.raises(ConfigTypeError, match=r"the graph that side_by_side\(\) draws must be a connlearn BranchGraph"):
        render.side_by_side(net.graph(), reference=net)
    pruned, _ = prune_dead_blocks(net)
    with pytest.raises(ConfigError, match=r"was pruned \(module \d+ has \d of C=4 blocks\)"):
        render.side_by_side(pruned.graph())
    render.side_by_side(pruned.graph(), reference=net.graph())  # an explicit reference is drawn
    graph = connlearn.build("dense", **tiny(gate="random", M=9, C=2, K=2)).graph()
    for block in graph.branches(3):  # nothing reads module 2: pruning removes it whole
        for source in graph.candidates(3):
            graph.edges[source, block]["active"] = source.startswith("m1.")
    whole, _ = prune_dead_blocks(connlearn.from_graph(graph))
    assert len(whole.module_ids) == 8
    with pytest.raises(ConfigError, match=r"was pruned \(1 of its modules are gone\)"):
        render.side_by_side(whole.graph())
