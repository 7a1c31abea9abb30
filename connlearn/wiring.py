"""Wiring on the graph: edge weights under one budget, rewiring that keeps every degree, shuffling that keeps
the count between every two modules, and RandWire's random graph generators.

A graph of edge weights (attribute ``edge_weights``) compiles its gate kind through ``weighting()`` (see
:mod:`connlearn.gates`): its gate values are signed weights on the kept (``active``) edges. ``density``, where
present, is the share of the network's candidate gate edges that one budget keeps, ``round(density · M)``
(spent by the kind's edge-weight form, or by a kind that spends it itself: ``magnitude``'s binary gates);
each block then keeps whatever part of it falls to it (a block no path of kept edges reaches from the stem is
switched off: see :class:`~connlearn.net.ConnectivityNet`).
"""

from __future__ import annotations

import math
import random
from typing import Any

import networkx as nx
import torch

from connlearn.errors import ConfigError, GraphError, check_choice, check_float
from connlearn.gates import GATES, Budgeted, FrozenGate, Gate, LearnedGate, random_tie_order, tie_generator
from connlearn.graph import BranchGraph, live_blocks


def gate_class(graph: BranchGraph) -> type[Gate]:
    """The class that compiles ``graph``'s gates: its kind's, or on a graph of edge weights its weighted form."""
    kind = GATES.get(graph.gate_kind)
    if not graph.graph.get("edge_weights"):
        return kind
    weighted = kind.weighting()
    if weighted is None:
        raise GraphError(f"gate kind {graph.gate_kind!r} has no form with edge weights (graph attribute edge_weights)")
    return weighted


def spender(kind: type[Gate]) -> type[Gate] | None:
    """The class that spends one budget for gate ``kind``: the kind itself where it ``spends`` (its own
    scores select the edges), else its form with edge weights (``weighting()``); None: it cannot (``frozen``
    keeps the edges it is given)."""
    weighted = kind if kind.spends else kind.weighting()
    return weighted if weighted is not None and weighted.spends and not issubclass(kind, FrozenGate) else None


def check_density(gate: str, K: int | None, density: Any, C: int) -> int:
    """``density`` checked where it enters (with ``gate`` and ``K``); returns a fan-in of C inputs for the
    builders' first draws (:func:`spend` then sets the graph's K: the mean number of edges a block keeps)."""
    if K is not None:
        raise ConfigError(f"give K (each block's fan-in) or density (one budget over the network), not both: K={K}, "
                          f"density={density}")
    density = check_float("density", density)
    if not 0 < density <= 1:
        raise ConfigError(f"density must be in (0, 1] (the share of the candidate edges kept), got {density}")
    if spender(GATES.get(gate)) is None:
        spenders = [n for n in GATES.names() if spender(GATES.get(n))]
        raise ConfigError(f"gate {gate!r} cannot spend one budget over the network (density); these can: "
                          f"{', '.join(spenders)}")
    return max(1, round(density * C))


def weighting_attributes(gate: str, density: float | None) -> dict[str, Any]:
    """The graph attributes of a kind built with ``density``, or of a kind whose values are edge weights: a
    kind that spends a budget in its own averaged form keeps it (``magnitude``), the others weight edges."""
    kind = GATES.get(gate)
    attrs: dict[str, Any] = {"edge_weights": True} if not kind.averaged or (density and not kind.spends) else {}
    if density is not None:
        attrs["density"] = float(density)
    return attrs


def gate_edges(graph: BranchGraph) -> list[tuple[str, str]]:
    """Every gate edge of the network, in the order of the modules' gate matrices (module, row, column)."""
    return [(u, v) for m in graph.modules() for v in graph.branches(m) for u, _, _ in graph.gate_edges(v)]


def budget(graph: BranchGraph) -> int | None:
    """How many gate edges ``graph``'s one budget keeps (None: each block its K)."""
    density = graph.graph.get("density")
    return None if density is None else round(float(density) * len(gate_edges(graph)))


def edge_counts(graph: BranchGraph) -> tuple[int, int]:
    """``(kept, candidates)``: the gate edges the evaluation connectivity reads, of all of them."""
    edges = gate_edges(graph)
    return sum(bool(graph.edges[e].get("active")) for e in edges), len(edges)


def spend(graph: BranchGraph) -> BranchGraph:
    """``graph`` with the initial kept edges of its budget, as its kind spends it (from the graph's seed; equal
    values of a learned kind by the tie ranks its network draws from the seed); without a budget, as it is.
    A budget that joins no path from the stem to the head is refused: that network computes a constant, and no
    gradient reaches its edges."""
    edges, count = gate_edges(graph), budget(graph)
    if count is None:
        return graph
    values, kind = torch.tensor([float(graph.edges[e]["gate"]) for e in edges]), gate_class(graph)
    generator = torch.Generator().manual_seed((graph.seed * 0x5851F42D4C957F2D + 0x14057B7EF767814F) % 2**63)
    if issubclass(kind, LearnedGate) and issubclass(kind, Budgeted):  # the tie ranks its network will draw
        ties = tie_generator(graph.seed)
        order = kind.row_ranks([random_tie_order(len(graph.branches(m)), len(graph.candidates(m)), ties)
                                for m in graph.modules() if graph.candidates(m)])
        kept = kind.spend(values, count, generator, order=order)
    else:
        kept = kind.spend(values, count, generator)
    for e, keep in zip(edges, kept.tolist(), strict=True):
        graph.edges[e]["active"] = bool(keep)
    if not live_blocks(graph):
        raise GraphError(f"one budget of {count} of the network's {len(edges)} candidate edges (density "
                         f"{graph.graph['density']:g}) joins no path from the stem to the head: the network would "
                         "compute a constant; give a larger density")
    graph.graph["K"] = max(1, round(count / max(1, len({v for _, v in edges}))))  # the mean kept fan-in
    return graph


def fixed(graph: BranchGraph) -> BranchGraph:
    """A copy of ``graph`` whose kept (``active``) edges are fixed as they stand: a learnable kind becomes
    ``frozen`` (``frozen_from`` names it; its knobs go), so the network compiled from it reads exactly those
    edges, whatever its gate values (a learnable kind would choose its top edges again from them)."""
    g = graph.copy()
    if GATES.get(g.gate_kind).learnable:
        g.graph.update(gate="frozen", frozen_from=g.gate_kind, weighted_inputs=False)
        g.graph.pop("gate_options", None)
    return g


def start_at_top(graph: BranchGraph) -> BranchGraph:
    """``graph`` (edge weights under a density d) with its kept edges started as ``dnw``'s kept edges start, at
    the top of uniform weights: ``|w| -> 1 - d + d|w|``, signs kept; the other edges as they are."""
    d = float(graph.graph["density"])
    for e in gate_edges(graph):
        if graph.edges[e]["active"]:
            w = float(graph.edges[e]["gate"])
            graph.edges[e]["gate"] = math.copysign(1 - d + d * abs(w), w)
    return graph


#: RandWire's generators (Xie et al. 2019), from networkx, by name, with its defaults: ``m`` the undirected edges
#: asked for and ``n`` the nodes.
GENERATORS = {
    "er": lambda n, m, rng: nx.gnm_random_graph(n, m, seed=rng),
    "ba": lambda n, m, rng: nx.barabasi_albert_graph(n, min(n - 1, max(1, round(m / n))), seed=rng),
    "ws": lambda n, m, rng: nx.watts_strogatz_graph(n, min(n - 1, max(2, 2 * round(m / n))), 0.75, seed=rng),
}


def generated(graph: BranchGraph, generator: str, seed: int = 0) -> BranchGraph:
    """A copy of ``graph`` whose kept gate edges are a RandWire graph (``er``: Erdős–Rényi, ``ba``:
    Barabási–Albert, ``ws``: Watts–Strogatz with p 0.75) on its blocks, as many as it keeps now: the generator
    draws an undirected graph on the blocks in a random order, each edge points from the earlier module to the
    later, and edges within a module (no candidates) are dropped; then random drawn edges go, or random candidate
    edges come, until the count is the graph's. Gate values stay as they are; the copy is :func:`fixed`."""
    make = GENERATORS[check_choice("generator", generator, GENERATORS)]
    g, rng = fixed(_one_budget(graph, "generated")), random.Random(seed)
    edges, blocks = gate_edges(g), g.block_nodes()
    budget_now = sum(bool(g.edges[e].get("active")) for e in edges)
    pairs = len(blocks) * (len(blocks) - 1) // 2
    ask = min(pairs, round(budget_now * pairs / max(1, len(edges))))  # within-module pairs are dropped
    order = rng.sample(blocks, len(blocks))
    drawn = set()
    for a, b in make(len(blocks), ask, rng).edges():
        u, v = sorted((order[a], order[b]), key=lambda n: g.nodes[n]["module"])
        if g.has_edge(u, v) and g.edges[u, v].get("kind") == "gate":
            drawn.add((u, v))
    kept = rng.sample(sorted(drawn), min(len(drawn), budget_now))
    rest = sorted(set(edges) - drawn)
    kept += rng.sample(rest, budget_now - len(kept))
    for e in edges:
        g.edges[e]["active"] = False
    for e in kept:
        g.edges[e]["active"] = True
    return g


def _one_budget(graph: BranchGraph, name: str) -> BranchGraph:
    """``graph``, refused where it keeps K in every block: ``name`` moves edges between the blocks."""
    if "density" not in graph.graph:
        raise GraphError(f"{name} moves kept edges between the blocks of a module, and this graph keeps K={graph.K} "
                         "in every block: rewire it (degrees) instead, or build it with a density")
    return graph


def shuffle(graph: BranchGraph, seed: int = 0) -> BranchGraph:
    """A copy of ``graph`` whose kept gate edges are drawn anew, uniformly, within each (source module, target
    module) pair: as many edges between every two modules (stages of a node graph) as before, any of them. Each
    kept edge keeps its gate value, moved with it in a random order. The copy is :func:`fixed`; ``graph`` keeps one
    budget over the network (``density``): one that keeps K per block would lose that."""
    g = fixed(_one_budget(graph, "shuffle"))
    rng = random.Random(seed)
    pairs: dict[tuple[int, int], list[tuple[str, str]]] = {}
    for u, v in gate_edges(g):
        pairs.setdefault((g.nodes[u]["module"], g.nodes[v]["module"]), []).append((u, v))
    for edges in pairs.values():
        kept = [e for e in edges if g.edges[e].get("active")]
        values = [g.edges[e].get("gate") for e in kept]
        rng.shuffle(values)
        for e in edges:
            g.edges[e]["active"] = False
        for e, value in zip(rng.sample(edges, len(kept)), values, strict=True):
            g.edges[e].update(active=True, gate=value)
    return g


def rewire(graph: BranchGraph, seed: int = 0, swaps: int | None = None) -> BranchGraph:
    """A copy of ``graph`` whose kept gate edges are rewired by ``swaps`` tries (default 10 per kept edge) of
    a degree-preserving swap: kept ``a → b`` and ``c → d`` become ``a → d`` and ``c → b`` where both are
    candidate edges not yet kept. Every node keeps its in- and out-degree; each moved edge takes its gate
    value and attributes along (a source keeps its weights). The copy is :func:`fixed`."""
    g = fixed(graph)
    kept = [e for e in gate_edges(g) if g.edges[e].get("active")]
    rng = random.Random(seed)
    for _ in range(10 * len(kept) if swaps is None else swaps):
        if len(kept) < 2:
            break
        i, j = rng.sample(range(len(kept)), 2)
        (a, b), (c, d) = kept[i], kept[j]
        new = [(a, d), (c, b)]
        if any(not g.has_edge(*e) or g.edges[e].get("kind") != "gate" or g.edges[e].get("active") for e in new):
            continue
        for old, moved in zip(((a, b), (c, d)), new, strict=True):
            left, right = dict(g.edges[old]), dict(g.edges[moved])
            g.edges[old].update(right), g.edges[moved].update(left)
        kept[i], kept[j] = new
    return g
