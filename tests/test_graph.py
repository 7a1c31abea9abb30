"""The IR: JSON round trips rebuild the same network; validate() names each fault."""

import copy

import networkx as nx
import pytest
import torch
from conftest import tiny

import connlearn
from connlearn.errors import GraphError
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
