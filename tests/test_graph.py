"""The IR: JSON round trips rebuild the same network; validate() names each fault."""

import copy
import json

import networkx as nx
import numpy as np
import pytest
import torch
from conftest import PlainBlock, tiny
from hypothesis import given, settings
from hypothesis import strategies as st

import connlearn
from connlearn.errors import ConfigError, ConfigTypeError, ConnlearnError, GraphError
from connlearn.graph import BranchGraph


def test_json_round_trip_rebuilds_a_network_with_identical_outputs(images):
    net = connlearn.build(**tiny(gate_init="uniform", gate="topk")).eval()
    graph = BranchGraph.from_json(net.graph().to_json())
    assert nx.utils.graphs_equal(graph, net.graph())
    rebuilt = connlearn.from_graph(graph)
    rebuilt.load_state_dict(net.state_dict())
    rebuilt.eval()
    torch.testing.assert_close(rebuilt(images), net(images))


def test_compiling_the_graph_again_gives_the_same_network(images):
    net = connlearn.build("dense", **tiny(gate="random", M=6)).eval()
    again = connlearn.from_graph(net.graph().to_json()).eval()
    assert [n for n, _ in again.named_parameters()] == [n for n, _ in net.named_parameters()]
    torch.testing.assert_close(again(images), net(images))


def test_graph_carries_the_current_gate_values():
    net = connlearn.build(**tiny())
    with torch.no_grad():
        for _, gate in net.gates():
            gate.real.copy_(torch.linspace(0, 1, gate.real.numel()).reshape(gate.real.shape))
    g = net.graph()
    values, active = g.gate_matrix(2)
    assert values[0] == pytest.approx(torch.linspace(0, 1, 16)[:4].tolist())
    assert [sum(row) for row in active] == [2, 2, 2, 2]


def test_schema_nodes_and_edges():
    g = connlearn.build(**tiny(C=3, M=3)).graph()
    assert {d["kind"] for _, d in g.nodes(data=True)} == {"input", "block", "output"}
    assert g.branches(2) == ["m2.b1", "m2.b2", "m2.b3"]
    assert all(d["kind"] == "fixed" for _, _, d in g.out_edges("input", data=True))
    assert len(g.gate_edges("m3.b1")) == 3
    assert g.candidates(3) == ["m2.b1", "m2.b2", "m2.b3"]


def test_dense_topology_offers_every_earlier_module_of_the_stage():
    g = connlearn.build("dense", **tiny(M=9, C=2)).graph()
    # modules 1-3 are stage 0: module 3 may read modules 1 and 2; module 4 starts stage 1
    assert g.candidates(3) == ["m1.b1", "m1.b2", "m2.b1", "m2.b2"]
    assert g.candidates(4) == ["m3.b1", "m3.b2"]


def _graph():
    return connlearn.build(**tiny(C=3, K=2, M=3)).graph()


def test_validate_rejects_a_cycle():
    g = _graph()
    g.add_edge("m3.b1", "m2.b1", kind="fixed", active=True)
    with pytest.raises(GraphError, match="cycle"):
        g.validate()


def test_validate_rejects_a_channel_mismatch():
    g = _graph()
    g.nodes["m3.b1"]["in_channels"] = 99
    with pytest.raises(GraphError, match="channels"):
        g.validate()


def test_validate_rejects_a_resolution_mismatch():
    g = _graph()
    for n in g.branches(3):
        g.nodes[n]["resolution"] = 5
    with pytest.raises(GraphError, match="resolution"):
        g.validate()


def test_validate_rejects_a_block_without_input():
    g = _graph()
    g.remove_edges_from(list(g.in_edges("m2.b2")))
    g.remove_edges_from(list(g.out_edges("m1.b1")))
    with pytest.raises(GraphError, match=r"no input|candidate"):
        g.validate()
    h = _graph()
    h.add_node("m9.b1", **{**h.nodes["m3.b1"], "module": 9, "branch": 1})
    with pytest.raises(GraphError, match=r"m9\.b1 has no input"):
        h.validate()


def test_validate_rejects_a_fan_in_larger_than_the_inputs():
    g = _graph()
    g.graph["K"] = 4
    with pytest.raises(GraphError, match="fan-in K=4 is larger than the 3 possible inputs"):
        g.validate()


def test_validate_rejects_an_unknown_block_kind_with_a_suggestion():
    g = _graph()
    g.nodes["m2.b1"]["block"] = "bottlenek"
    with pytest.raises(GraphError, match="did you mean 'bottleneck'"):
        g.validate()


def test_validate_rejects_a_fixed_connectivity_without_k_inputs():
    g = connlearn.build(**tiny(gate="random", C=3, K=2)).graph()
    g.edges["m1.b1", "m2.b1"]["active"] = not g.edges["m1.b1", "m2.b1"]["active"]
    with pytest.raises(GraphError, match="exactly K=2"):
        g.validate()


def test_from_json_rejects_foreign_documents():
    with pytest.raises(GraphError, match="not a BranchGraph"):
        BranchGraph.from_json('{"nodes": []}')
    with pytest.raises(GraphError, match="not a BranchGraph"):
        BranchGraph.from_json("{")


def test_graph_is_plain_networkx():
    g = _graph()
    assert isinstance(g, nx.DiGraph)
    assert nx.has_path(g, "input", "output")
    assert isinstance(copy.deepcopy(g), BranchGraph)


# ------------------------------------------------------------------ damaged documents and foreign graphs
def _doc(**overrides):
    return json.loads(connlearn.build(**tiny(**overrides)).graph().to_json())


def _compiles_or_names_the_fault(text):
    """A document either compiles to a network that runs in both modes, or is refused by a ConnlearnError."""
    try:
        net = connlearn.from_graph(text)
    except ConnlearnError:
        return
    net.eval()(torch.randn(2, 3, 32, 32))
    net.train()(torch.randn(2, 3, 32, 32)).sum().backward()


def _leaves(doc, path=()):
    """The paths of every value in a JSON document (containers included)."""
    if path:
        yield path
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for key, value in items:
        yield from _leaves(value, (*path, key))


_DOCS = {gate: _doc(gate=gate, K=4 if gate == "full" else 2) for gate in ("topk", "full", "real", "random")}
_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-3, 70), st.sampled_from([1.5, float("nan"), -0.5]),
                    st.sampled_from(["", "x", "input", "output", "m1.b1", "block", "gate", "fixed", "topk"]),
                    st.just([]), st.just([1]), st.just({}), st.just({"a": 1}))


@settings(max_examples=300, deadline=None)
@given(gate=st.sampled_from(sorted(_DOCS)), data=st.data())
def test_a_damaged_document_compiles_or_is_refused_by_name(gate, data):
    """Law: one or two values of a graph's JSON changed, deleted or replaced by a value of another type
    never crash deep inside torch or networkx."""
    doc = copy.deepcopy(_DOCS[gate])
    for _ in range(data.draw(st.integers(1, 2))):
        path = data.draw(st.sampled_from(list(_leaves(doc))))
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        if data.draw(st.booleans()) and isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent[path[-1]] = data.draw(_VALUES)
    _compiles_or_names_the_fault(json.dumps(doc))


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: d.pop("nodes"), "needs 'nodes', a list; it is missing"),
    (lambda d: d.update(graph=[]), "needs 'graph', a dict; it is a list"),
    (lambda d: d["nodes"].insert(1, 3), "node 1 of the document is 3"),
    (lambda d: d["nodes"].append(dict(d["nodes"][1])), "lists node 'm1.b1' twice"),
    (lambda d: d["edges"].append({"source": "m1.b1", "target": "m9.b9"}), "name nodes of the document"),
    (lambda d: d["edges"].append(dict(d["edges"][0])), "lists edge input → m1.b1 twice"),
])
def test_from_json_names_a_broken_structure(edit, message):
    doc = _doc()
    edit(doc)
    with pytest.raises(GraphError, match=message):
        BranchGraph.from_json(json.dumps(doc))


@pytest.mark.parametrize(("edit", "message"), [
    (lambda g: g.nodes["m2.b1"].update(module=[2]), r"node 'm2.b1' needs module, an integer from 1 to .*; got \[2\]"),
    (lambda g: g.nodes["m2.b1"].pop("stride"), "node 'm2.b1' needs stride, an integer from 1 to .*; it is missing"),
    (lambda g: g.nodes["m2.b1"].update(block=None), "node 'm2.b1' has block None"),
    (lambda g: g.nodes["m2.b2"].update(branch=1), "nodes 'm2.b1' and 'm2.b2' are both branch 1 of module 2"),
    (lambda g: g.nodes["output"].update(num_classes=0), "node 'output' needs num_classes, an integer from 1 to"),
    (lambda g: g.nodes["input"]["stem"].update(kernel=2.5), "node 'input' needs stem kernel"),
    (lambda g: g.nodes["input"]["stem"].update(maxpool=1), "stem maxpool 1; it must be true or false"),
    (lambda g: g.nodes["input"].update(resolution=16), "resolution 16, but its stem .* makes 32"),
    (lambda g: g.add_node("extra", kind="shortcut"), "node 'extra' has kind 'shortcut'"),
    (lambda g: g.edges["m1.b1", "m2.b1"].update(gate="0.5"), "gate '0.5'; a gate value must be a number"),
    (lambda g: g.edges["m1.b1", "m2.b1"].update(tie=10**30), "it must be an integer rank"),
    (lambda g: g.nodes["output"].update(num_classes=10**30), r"num_classes, an integer from 1 to 2147483647"),
    (lambda g: g.edges["m1.b1", "m2.b1"].update(active="yes"), "active 'yes'; it must be true or false"),
    (lambda g: g.graph.update(seed=[1]), r"seed must be an integer \(a 64-bit seed\), got \[1\]"),
    (lambda g: g.graph.update(weighted_inputs="no"), "weighted_inputs must be true or false"),
    (lambda g: g.add_edge("m1.b1", "m2.b1", kind="fixed", active=True), "fixed edge m1.b1 → m2.b1 must go from"),
    (lambda g: g.add_edge("input", "m2.b1", kind="fixed", active=True), "reads both 'input' and gate edges"),
    (lambda g: g.remove_edge("m3.b1", "output"), r"it does not read \['m3.b1'\]"),
])
def test_validate_names_the_node_and_the_attribute(edit, message):
    g = _graph()
    edit(g)
    with pytest.raises(GraphError, match=message):
        g.validate()
    with pytest.raises(GraphError, match=message):
        connlearn.from_graph(g.to_json())


def test_the_output_reads_the_last_module_only():
    g = connlearn.build(**tiny(M=6)).graph()  # modules 5 and 6 share their channels
    g.add_edge("m5.b1", "output", kind="fixed", active=True)
    with pytest.raises(GraphError, match=r"every block of the last module, 6, and only those .*: it also reads "
                                         r"\['m5.b1'\]"):
        g.validate()


class _Fussy(PlainBlock):
    """A plug-in block kind that cannot be built at stride 2."""

    def __init__(self, in_ch, out_ch, stride, branches, *, width):
        if stride != 1:
            raise ValueError("fussy blocks keep the resolution")
        super().__init__(in_ch, out_ch, stride, branches, width=width)


def test_a_block_kind_that_fails_to_build_is_named_with_its_arguments(clean_registries):
    connlearn.blocks.BLOCKS.register("fussy", _Fussy)
    with pytest.raises(ConfigError, match=r"block kind 'fussy' .* failed to build a module of 4 branches from 8 to "
                                          r"16 channels at stride 2 with the parameters \{'width': 4\}: ValueError: "
                                          "fussy blocks keep the resolution"):
        connlearn.build(**tiny(block="fussy"))
    full = connlearn.build(**tiny(gate="full", K=4)).graph()
    for node in full.block_nodes():
        full.nodes[node]["params"] = {}
    with pytest.raises(ConfigError, match="the single stream of block kind 'bottleneck' failed to build"):
        connlearn.from_graph(full)


@pytest.mark.parametrize("value", [[2, 1], {"a": 1}, 3])
def test_a_name_that_is_not_a_string_is_a_type_error_listing_the_names(value):
    with pytest.raises(ConfigTypeError, match=r"preset must be a name .*known presets: cifar-"):
        connlearn.build(**tiny(preset=value))
    with pytest.raises(ConfigTypeError, match=r"gate kind must be a name .*known gate kinds: .*topk"):
        connlearn.build(**tiny(gate=value))
    with pytest.raises(ConfigTypeError, match="topology must be a name"):
        connlearn.build(value)


def test_a_plug_in_topology_may_write_numpy_and_tensor_scalars():
    g = _graph()
    for _, _, d in g.edges(data=True):
        if d["kind"] == "gate":
            d.update(active=np.bool_(d["active"]), gate=torch.tensor(d["gate"]), tie=np.int64(d.get("tie", 0)))
    net = connlearn.from_graph(g)
    assert all(isinstance(d["active"], bool) for _, _, d in net.graph().edges(data=True))


def test_a_network_whose_gates_diverged_still_checkpoints_and_loads():
    """A run whose loss went to NaN keeps what it trained: its checkpoint loads, its engine moves."""
    from connlearn.checkpoint import make_checkpoint, net_from_checkpoint

    net = connlearn.build(**tiny())
    with torch.no_grad():
        next(iter(net.gate_parameters()))[0, 0] = float("nan")
    again = net_from_checkpoint(make_checkpoint(net))
    assert torch.isnan(next(iter(again.gate_parameters()))[0, 0])
    net.to_engine("reference")


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_graph_with_a_gate_that_is_not_finite_builds_no_network(tmp_path, bad, clean_registries):
    """Every output of such a network would be NaN: from_graph, build and --connectivity name the edge."""
    from connlearn.experiment import CifarRun, _net_of_connectivity

    doc = json.loads(connlearn.build(**tiny()).graph().to_json())
    hand_edited = next(e for e in doc["edges"] if (e["source"], e["target"]) == ("m1.b2", "m2.b3"))
    hand_edited["gate"] = bad
    text = json.dumps(doc)  # Python's json writes and reads NaN and Infinity
    edge = rf"edge m1\.b2 → m2\.b3 has gate {bad!r}; .* must be finite"
    with pytest.raises(GraphError, match=rf"^from_graph's graph: {edge}"):
        connlearn.from_graph(text)
    connlearn.register_topology("hand_made", lambda **options: BranchGraph.from_json(text))
    with pytest.raises(GraphError, match=rf"^topology 'hand_made''s graph: {edge}"):
        connlearn.build("hand_made")
    (tmp_path / "g.json").write_text(text)
    run = CifarRun(dataset="cifar10", connectivity=str(tmp_path / "g.json"), out=str(tmp_path / "run"))
    with pytest.raises(GraphError, match=rf"^connectivity: .*g\.json: {edge}"):
        _net_of_connectivity(run, 10)
    hand_edited["gate"] = 0.5
    assert connlearn.from_graph(json.dumps(doc)).K == 2  # the same graph with a finite gate builds


@pytest.mark.parametrize(("kernel", "stride", "maxpool"), [(3, 1, False), (2, 2, False), (4, 1, True), (7, 2, True)])
def test_the_stem_resolution_is_what_its_convolution_makes(kernel, stride, maxpool):
    net = connlearn.build(**tiny())
    stem = torch.nn.Sequential(torch.nn.Conv2d(3, 4, kernel, stride, kernel // 2),
                               torch.nn.MaxPool2d(3, 2, 1) if maxpool else torch.nn.Identity())
    made = stem(torch.randn(1, 3, 32, 32)).shape[-1]
    g = net.graph()
    g.nodes["input"].update(stem={"kernel": kernel, "stride": stride, "maxpool": maxpool}, resolution=made)
    g._check_stem(g.nodes["input"])
    g.nodes["input"].update(resolution=made + 1)
    with pytest.raises(GraphError, match=f"makes {made} of images of size 32"):
        g._check_stem(g.nodes["input"])


@pytest.mark.parametrize("branch", [1, 2])
def test_validate_rejects_a_last_module_branch_that_keeps_its_resolution_where_the_others_halve_it(branch):
    """A block's stride and resolution consistent with its inputs, but not with its module's other blocks:
    only the module's own check sees it in the last module, whose edges into the output check no resolution."""
    g = _graph()
    node = g.branches(3)[branch]
    assert g.nodes[node]["stride"] == 2
    g.nodes[node].update(stride=1, resolution=g.nodes[node]["resolution"] * 2)
    with pytest.raises(GraphError, match=rf"blocks of module 3 disagree in stride: m3\.b1 has 2, {node} has 1"):
        g.validate()
