"""Node graphs: one-channel nodes in stages, every node a candidate input of every node of a later stage.

The default is Discovering Neural Wirings' static graph for CIFAR-10 (Wortsman et al. 2019): a stem to 32
channels at 8x8 (a stride-2 3x3 convolution and a max-pool), whose channels are the first stage's 32 nodes, then
four stages of 192 nodes, 800 nodes in all; the last 100 nodes are the features. Every node computes
norm → ReLU → 3x3 convolution of the weighted sum of its inputs (block kind ``node``; no shortcut). The
features form the last stage (they read every other node, the rest of their stage among them, as DNW's feature
nodes gather from every layer), and the head pools them side by side into a linear classifier.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import torch

from connlearn import wiring
from connlearn.errors import ConfigError, check_int
from connlearn.gates import GATES
from connlearn.graph import BranchGraph, block_name
from connlearn.topologies.resnext import _fan_in, _gated

#: DNW's static graph: the stages' nodes after the stem's, the stem's nodes, the features.
NODES, STEM_NODES, FEATURES = (192, 192, 192, 192), 32, 100


def stage_sizes(nodes: tuple[int, ...] | list[int], stem_nodes: int, features: int) -> list[int]:
    """The node count of every module, checked: the stem's, the stages', the last one's split off as the
    features (a stage left empty by the split is dropped)."""
    stages = [check_int("stem_nodes", stem_nodes, 1), *(check_int("nodes", n, 1) for n in nodes)]
    if not nodes or not 1 <= check_int("features", features, 1) <= stages[-1]:
        raise ConfigError(f"features must be 1 to the last stage's nodes, {stages[-1]}; got {features} "
                          f"(nodes={list(nodes)})")
    return [n for n in (*stages[:-1], stages[-1] - features, features) if n]


def candidate_edges(stages: list[int]) -> int:
    """The candidate edges of modules of ``stages`` nodes: every node to every node of a later module."""
    return sum(n * sum(stages[:i]) for i, n in enumerate(stages))


def neural_graph(*, nodes: tuple[int, ...] | list[int] = NODES, stem_nodes: int = STEM_NODES,
                 features: int = FEATURES, channels: int = 1, gate: str = "dnw", density: float | None = None,
                 K: int | None = None, num_classes: int = 10, in_channels: int = 3, image_size: int = 32,
                 seed: int = 0, gate_init: float | str = 0.5, gate_options: dict[str, Any] | None = None,
                 block: str = "node") -> BranchGraph:
    """The BranchGraph of a node graph; by default DNW's static graph, its edges under one budget of 5%.

    Args:
        nodes: the nodes of each stage after the stem's. stem_nodes: the stem's output nodes (its channels /
            ``channels``). features: the last nodes, which the head reads (at most the last stage's).
        channels: each node's channels. block: the node's block kind (``node``: norm → ReLU → 3x3 conv).
        gate: gate kind (``dnw``: learned edge weights; ``random``: the fixed random graph). density: the share
            of the candidate edges kept by one budget over the network (default 0.05 where K is not given and
            the kind spends one).
            K: instead, each node's fan-in.
        num_classes, in_channels, image_size: the data's. seed: the weights, the initial edges and draws.
        gate_init, gate_options: as for :func:`~connlearn.topologies.resnext`.
    """
    stages = stage_sizes(nodes, stem_nodes, features)
    ch = check_int("channels", channels, 1)
    density = 0.05 if density is None and K is None and wiring.spender(GATES.get(gate)) else density
    # at most the first gated stage's inputs, the stem's nodes (under a density, wiring.spend sets the mean kept)
    K = _fan_in(gate, K, stages[0], density)
    g = BranchGraph(gate=gate, K=K, seed=check_int("seed", seed, 0, 2**64 - 1), topology="neural-graph",
                    node_graph=True, **_gated(gate, gate_options, density),
                    options={"nodes": list(nodes), "stem_nodes": stem_nodes, "features": features, "channels": ch})
    size = check_int("image_size", image_size, 1)
    g.add_node("input", kind="input", in_channels=check_int("in_channels", in_channels, 1), out_channels=stages[0] * ch,
               image_size=size, resolution=math.ceil(math.ceil(size / 2) / 2),
               stem={"kernel": 3, "stride": 2, "maxpool": True})
    res, kind, rng = g.nodes["input"]["resolution"], wiring.gate_class(g), torch.Generator().manual_seed(g.seed)
    for m, count in enumerate(stages, 1):
        g.add_nodes_from((block_name(m, j), {"kind": "block", "module": m, "branch": j, "block": block,
                                             "in_channels": ch, "out_channels": ch, "stride": 1, "resolution": res,
                                             "params": {}}) for j in range(1, count + 1))
        if m == 1:
            g.add_edges_from((("input", block_name(1, j)) for j in range(1, count + 1)), kind="fixed", active=True)
            continue
        cols = [block_name(s, k) for s in range(1, m) for k in range(1, stages[s - 1] + 1)]
        values, active = kind.initial(count, len(cols), K, gate_init, rng)
        g.add_edges_from((cols[c], block_name(m, j + 1), {"kind": "gate", "gate": float(values[j, c]),
                                                          "active": bool(active[j, c])})
                         for j, c in itertools.product(range(count), range(len(cols))))
    g.add_node("output", kind="output", in_channels=features * ch,
               num_classes=check_int("num_classes", num_classes, 1))
    g.add_edges_from(((block_name(len(stages), j), "output") for j in range(1, features + 1)), kind="fixed",
                     active=True)
    return wiring.spend(g)
