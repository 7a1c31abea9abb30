"""BranchGraph: the intermediate representation of a multi-branch network, and the queries on it.

The IR is the single source of truth for connectivity: topologies emit it, :class:`~connlearn.net.ConnectivityNet`
is compiled from it and returns it with the current gates (``net.graph()``), pruning and rendering read it.

A ``networkx.DiGraph`` with

- node ``"input"`` (the stem): ``kind="input"``, ``in_channels``, ``out_channels``, the input's spatial shape
  (``image_size`` for square images; ``input_size``, a list, for signals ``[L]`` and vectors ``[]``),
  ``resolution`` (after the stem; 1 for vectors), ``stem`` (``{"kernel", "stride", "maxpool"}``);
- one node ``"m{i}.b{j}"`` per residual block (module i = 1..M, branch j = 1..C_i): ``kind="block"``,
  ``module``, ``branch``, ``block`` (block kind), ``in_channels``, ``out_channels``, ``stride``,
  ``resolution`` (of its output) and ``params`` (the block kind's keyword parameters);
- node ``"output"`` (the head): ``kind="output"``, ``in_channels``, ``num_classes``;
- gate edges ``m{s}.b{k} → m{i}.b{j}`` (``kind="gate"``): the real gate value ``gate``, ``active`` (used at
  evaluation) and, for learned gates, ``tie`` (the rank among equal gates: the larger enters the top-K first;
  where an edge has none, the seed ranks them);
- fixed edges ``input → m1.b*`` and ``m{M}.b* → output`` (``kind="fixed"``), always read.

Graph attributes: ``gate`` (gate kind), ``K`` (fan-in; under a ``density``, the mean kept fan-in, rounded),
``edge_weights`` (the gate values are signed weights on the kept edges) and ``density`` (one budget of
``round(density · candidate gate edges)`` over the network; see :mod:`connlearn.wiring`), ``seed``,
``residual_init`` and ``conv_init`` (how the branches start; where absent ``"one"`` and each block's own),
``topology`` and ``options`` (how it was made); ``node_graph`` (the blocks are the one-channel nodes of a node
graph: no shortcut, no ReLU before a block, the first module's node j reading the stem's channel j, the head
reading the last module's nodes side by side; see :mod:`connlearn.topologies.neural_graph`);
``weighted_inputs`` (unfrozen ``real`` gates: the function weights every input by its gate) and, once
frozen, ``frozen_from`` (the gate kind that learned it).
"""

from __future__ import annotations

import copy
import itertools
import json
import math
from typing import Any, NamedTuple

import networkx as nx

from connlearn.blocks import BLOCKS
from connlearn.errors import GraphError, check_choice
from connlearn.gates import GATES, FrozenGate

FORMAT, VERSION = "connlearn.BranchGraph", 1
RESIDUAL_INITS = ("auto", "sqrt_k", "one", "zero")
CONV_INITS = ("branch", "resnext")
#: Attributes each node kind must have, every one an integer >= 1.
_SIZES = {"input": ("in_channels", "out_channels", "resolution"),
          "block": ("module", "branch", "in_channels", "out_channels", "stride", "resolution"),
          "output": ("in_channels", "num_classes")}


def input_shape(node: dict[str, Any]) -> tuple[int, ...]:
    """The spatial shape of the input node's data: ``input_size`` where it says (``(L,)``, ``()``), else square
    images of ``image_size``."""
    return tuple(node["input_size"]) if "input_size" in node else (node["image_size"],) * 2


class ModulePlan(NamedTuple):
    """One module as the compiler reads it: its ``module`` number, its blocks' node attributes (by branch),
    its ``sources`` (per source module: its position and the branches read, None: all; none: the stem), its
    ``gates`` (values and active flags, rows its blocks; None without gate edges), their ``ties`` (None if
    an edge has none) and ``read_by``: the fan-in of the mean that reads its outputs (K, or the head's C)."""

    module: int
    nodes: list[dict[str, Any]]
    sources: list[tuple[int, list[int] | None]]
    gates: tuple[list[list[float]], list[list[bool]]] | None
    ties: list[list[int]] | None
    read_by: int


def block_name(module: int, branch: int) -> str:
    """The node name of branch ``branch`` of module ``module`` (both from 1)."""
    return f"m{module}.b{branch}"


class BranchGraph(nx.DiGraph):
    """A network's connectivity as a ``networkx.DiGraph`` with the schema of this module."""

    def block_nodes(self) -> list[str]:
        """Every block node, by (module, branch)."""
        return sorted((n for n, d in self.nodes(data=True) if d.get("kind") == "block"), key=self._place)

    def _place(self, node: str) -> tuple[int, int]:
        d = self._node[node]
        return d["module"], d["branch"]

    def modules(self) -> list[int]:
        return sorted({self.nodes[n]["module"] for n in self.block_nodes()})

    def branches(self, module: int) -> list[str]:
        """The block nodes of ``module``, by branch."""
        return [n for n in self.block_nodes() if self.nodes[n]["module"] == module]

    def gate_edges(self, node: str) -> list[tuple[str, str, dict[str, Any]]]:
        """The gate edges into ``node``, by source."""
        edges = [(u, node, d) for u, d in self.pred[node].items() if d.get("kind") == "gate"]
        return sorted(edges, key=lambda e: self._place(e[0]))

    def candidates(self, module: int) -> list[str]:
        """The blocks that may feed ``module`` through gates: the columns of its gate matrix."""
        sources = {u for n in self.branches(module) for u, d in self.pred[n].items() if d.get("kind") == "gate"}
        return sorted(sources, key=self._place)

    def __deepcopy__(self, memo: dict[int, Any]) -> BranchGraph:
        """A copy sharing nothing with ``self``; fast for large graphs, as an edge's attributes are plain values."""
        g = type(self)()
        g.graph.update(copy.deepcopy(self.graph, memo))
        g.add_nodes_from((n, copy.deepcopy(d, memo)) for n, d in self.nodes(data=True))
        g.add_edges_from((u, v, dict(d)) for u, v, d in self.edges(data=True))
        return g

    def _matrix(self, module: int, key: str, default: Any) -> list[list[Any]]:
        index = {c: k for k, c in enumerate(self.candidates(module))}
        rows = []
        for node in self.branches(module):
            row = [default] * len(index)
            for u, _, d in self.gate_edges(node):
                row[index[u]] = d.get(key, default)
            rows.append(row)
        return rows

    def gate_matrix(self, module: int) -> tuple[list[list[float]], list[list[bool]]]:
        """Real gate values and active flags of ``module``: rows its blocks, columns its candidates."""
        values = [[float(v) for v in row] for row in self._matrix(module, "gate", 0.0)]
        return values, [[bool(a) for a in row] for row in self._matrix(module, "active", False)]

    def plan(self) -> list[ModulePlan]:
        """What compiling each module needs, in module order (see :class:`ModulePlan`)."""
        position = {m: p for p, m in enumerate(self.modules())}
        head = len(self.in_edges("output"))
        plans = []
        for m in self.modules():
            nodes, cols = self.branches(m), set(self.candidates(m))
            sources = []
            for src in sorted({self.nodes[c]["module"] for c in cols}):
                chosen = [i for i, n in enumerate(self.branches(src)) if n in cols]
                sources.append((position[src], None if len(chosen) == len(self.branches(src)) else chosen))
            ties = self._matrix(m, "tie", None)
            gated = any(d.get("kind") == "gate" for n in nodes for *_, d in self.out_edges(n, data=True))
            plans.append(ModulePlan(m, [self.nodes[n] for n in nodes], sources, self.gate_matrix(m) if cols else None,
                                    None if any(t is None for row in ties for t in row) else ties,
                                    self.K if gated else head))
        return plans

    @property
    def K(self) -> int:  # noqa: N802 - the paper's name
        return int(self.graph["K"])

    @property
    def seed(self) -> int:
        return int(self.graph.get("seed", 0))

    @property
    def gate_kind(self) -> str:
        return str(self.graph["gate"])

    def gate_label(self) -> str:
        """The gate kind for titles: ``frozen from topk`` for a learned connectivity that was frozen."""
        learned = self.graph.get("frozen_from")
        return f"frozen from {learned}" if learned else self.gate_kind

    def gate_words(self) -> str:
        """The gate and its budget for titles: ``gate=topk K=4``, or ``gate=dnw density=0.2`` under one budget over
        the network (where K is only the mean fan-in)."""
        budget = f"density={self.graph['density']:g}" if "density" in self.graph else f"K={self.K}"
        return f"gate={self.gate_label()} {budget}"

    def used_edges(self) -> list[tuple[str, str]]:
        """The edges the network's function reads: the active ones, or where it weights its inputs by their
        gates (``weighted_inputs``), every fixed edge and every gate edge of non-zero value."""
        weighted = bool(self.graph.get("weighted_inputs"))
        return [(u, v) for u, v, d in self.edges(data=True)
                if d.get("kind") == "fixed" or (float(d.get("gate", 0.0)) != 0 if weighted else d.get("active"))]

    # -------------------------------------------------------------------------------------------- validation
    def validate(self) -> BranchGraph:
        """Raise a GraphError naming the first fault, else return ``self``."""
        for name in ("input", "output"):
            if self.nodes.get(name, {}).get("kind") != name:
                raise GraphError(f"the graph has no {name!r} node (a node named {name!r} of kind {name!r})")
        for key in ("gate", "K"):
            if key not in self.graph:
                raise GraphError(f"the graph has no {key!r} attribute")
        _count("the graph's K", self.graph["K"])
        check_choice("gate kind", self.gate_kind, GATES.names(), GraphError)
        kind = GATES.get(self.gate_kind)
        weighted = kind.weighting() if self.graph.get("edge_weights") else kind
        if weighted is None:
            raise GraphError(f"gate kind {self.gate_kind!r} has no form with edge weights (edge_weights)")
        spent = weighted.spends or issubclass(kind, FrozenGate)  # a frozen graph keeps what its budget kept
        if "density" in self.graph and not (spent and 0 < self.graph["density"] <= 1):
            raise GraphError(f"graph density {self.graph['density']!r}: a share in (0, 1] of the gate edges, spent "
                             f"by a gate kind that spends one budget (or frozen); the graph's gate "
                             f"{self.gate_kind!r}{' with edge_weights' if self.graph.get('edge_weights') else ''} "
                             "does not")
        if "density" in self.graph and not any(d.get("kind") == "gate" for *_, d in self.edges(data=True)):
            raise GraphError(f"density {self.graph['density']} keeps a share of the candidate gate edges, and this "
                             f"graph ({self.graph.get('topology', 'of its own')}) has none: leave density out")
        for key, known in (("residual_init", RESIDUAL_INITS), ("conv_init", CONV_INITS)):
            check_choice(f"graph {key}", self.graph.get(key, known[0]), known, GraphError)
        places: set[tuple[int, int]] = set()
        for node, d in self.nodes(data=True):
            kind = d.get("kind")
            if kind not in _SIZES or (kind != "block" and node != kind):
                raise GraphError(f"node {node!r} has kind {kind!r}; allowed: block, input, output (by that name)")
            for key in _SIZES[kind]:
                _count(f"node {node!r}'s {key}", d.get(key))
            if kind == "block":
                check_choice("block kind", d.get("block"), BLOCKS.names(), GraphError)
                if self._place(node) in places:
                    raise GraphError(f"two nodes are branch {d['branch']} of module {d['module']}")
                places.add(self._place(node))
        self._check_stem(self.nodes["input"])
        if not nx.is_directed_acyclic_graph(self):
            raise GraphError(f"the graph has a cycle: {' → '.join(u for u, _ in nx.find_cycle(self))}")
        for u, v, d in self.edges(data=True):
            self._check_edge(u, v, d)
        if not self.modules():
            raise GraphError("the graph has no block nodes")
        if {u for u, _ in self.in_edges("output")} != set(self.branches(self.modules()[-1])):
            raise GraphError(f"'output' must read every block of the last module, {self.modules()[-1]}, and only them")
        for module in self.modules():
            self._check_module(module)
        if self.graph.get("node_graph"):  # the first nodes share the stem's channels; the head reads the last's
            first, last = self.branches(self.modules()[0]), self.branches(self.modules()[-1])
            for node, key, ends, other in (("input", "out_channels", first, "in_channels"),
                                           ("output", "in_channels", last, "out_channels")):
                if self.nodes[node][key] != sum(self.nodes[n][other] for n in ends):
                    raise GraphError(f"node {node!r} of a node graph has {self.nodes[node][key]} channels; its "
                                     f"nodes {ends[0]}..{ends[-1]} take {sum(self.nodes[n][other] for n in ends)}")
        return self

    def _check_stem(self, d: dict[str, Any]) -> None:
        stem, shape = d["stem"], input_shape(d)
        if not shape and (stem["kernel"], stem["stride"], stem["maxpool"]) != (1, 1, False):
            raise GraphError(f"node 'input' takes vectors: its stem is a linear map (kernel 1, stride 1, no "
                             f"max-pool), not {stem}")
        size = (shape[0] + 2 * (stem["kernel"] // 2) - stem["kernel"]) // stem["stride"] + 1 if shape else 1
        size = (size - 1) // 2 + 1 if stem["maxpool"] else size
        if d["resolution"] != size:
            raise GraphError(f"node 'input' has resolution {d['resolution']}; its stem makes {size}")

    def _check_edge(self, u: str, v: str, d: dict[str, Any]) -> None:
        src, dst, kind = self.nodes[u], self.nodes[v], d.get("kind")
        where = f"edge {u} → {v}"
        if kind == "gate" and (src["kind"] != "block" or dst["kind"] != "block" or src["module"] >= dst["module"]):
            raise GraphError(f"{where}: a gate edge joins a block to one of a later module")
        if kind == "fixed" and not ((u == "input" and dst["kind"] == "block") or (src["kind"] == "block"
                                                                                  and v == "output")):
            raise GraphError(f"{where}: a fixed edge goes from 'input' to a block or from a block to 'output'")
        if kind not in ("gate", "fixed"):
            raise GraphError(f"{where} has kind {kind!r}; allowed: gate, fixed")
        if u == "input" and self.gate_edges(v):
            raise GraphError(f"block {v} reads both 'input' and gate edges")
        if src["out_channels"] != dst["in_channels"] and not (kind == "fixed" and self.graph.get("node_graph")):
            raise GraphError(f"{where} joins {src['out_channels']} channels to a node that takes {dst['in_channels']}")
        if dst["kind"] == "block" and math.ceil(src["resolution"] / dst["stride"]) != dst["resolution"]:
            raise GraphError(f"{where} joins resolution {src['resolution']} to a block of stride {dst['stride']} "
                             f"and resolution {dst['resolution']}")

    def _check_module(self, module: int) -> None:
        nodes, cols, kind = self.branches(module), self.candidates(module), GATES.get(self.gate_kind)
        for node in nodes:
            if self.in_degree(node) == 0:
                raise GraphError(f"block {node} has no input")
            for key in ("in_channels", "out_channels", "stride", "resolution"):
                if self.nodes[node][key] != self.nodes[nodes[0]][key]:
                    raise GraphError(f"the blocks of module {module} disagree in {key} ({nodes[0]}, {node})")
            if not cols:
                continue
            sources = [u for u, _, _ in self.gate_edges(node)]
            if sources != cols:
                raise GraphError(f"block {node} reads {sources}, its module's other blocks {cols}: the blocks of a "
                                 "module share their candidate inputs")
            if len(sources) < self.K and "density" not in self.graph:  # under a density K is a mean
                raise GraphError(f"fan-in K={self.K} is larger than the {len(sources)} inputs of block {node}")
            active, kept = sum(bool(d.get("active")) for _, _, d in self.gate_edges(node)), kind.kept(self.K, len(cols))
            if not (kind.learnable or kind.stochastic or "density" in self.graph) and active != kept:  # as it keeps
                raise GraphError(f"block {node} has {active} active inputs; a {self.gate_kind} connectivity has {kept}")

    # ------------------------------------------------------------------------------------------------ JSON
    def to_json(self, indent: int | None = None) -> str:
        """The graph as JSON; :meth:`from_json` rebuilds it exactly."""
        return json.dumps({"format": FORMAT, "version": VERSION, "graph": dict(self.graph),
                           "nodes": [{"id": n, **d} for n, d in self.nodes(data=True)],
                           "edges": [{"source": u, "target": v, **d} for u, v, d in self.edges(data=True)]},
                          indent=indent)

    @classmethod
    def from_json(cls, text: str | bytes) -> BranchGraph:
        """The graph of :meth:`to_json`'s document (checked for its shape; :meth:`validate` checks the rest)."""
        try:
            doc = json.loads(text)
        except (TypeError, ValueError) as exc:
            raise GraphError(f"not a BranchGraph JSON document: {exc}") from None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("version") != VERSION:
            raise GraphError(f"not a BranchGraph JSON document of version {VERSION} (format {FORMAT!r})")
        g = cls()
        try:
            g.graph.update(doc["graph"])
            for node in doc["nodes"]:
                g.add_node(node.pop("id"), **node)
            for edge in doc["edges"]:
                u, v = edge.pop("source"), edge.pop("target")
                if u not in g or v not in g:
                    raise GraphError(f"the document's edge {u} → {v} names a node it does not list")
                g.add_edge(u, v, **edge)
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise GraphError(f"a BranchGraph JSON document with a malformed entry ({type(exc).__name__}: "
                             f"{exc})") from None
        return g


def _count(what: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise GraphError(f"{what} must be an integer >= 1, got {value!r}")


def check_finite_gates(graph: BranchGraph, what: str) -> None:
    """A GraphError unless every gate value is finite: a network starts from its graph's gates, and one NaN
    makes every output NaN. (A diverged run's graph holds them; its checkpoint still loads.)"""
    for u, v, d in graph.edges(data=True):
        if not math.isfinite(float(d.get("gate", 0.0))):
            raise GraphError(f"{what}: edge {u} → {v} has gate {d['gate']!r}; a network needs finite gates")


# ------------------------------------------------------------------------------------------ liveness queries
def live_blocks(graph: BranchGraph) -> set[str]:
    """Blocks on a path from the stem to the head along the edges the function reads (a block that no such
    path reaches from the stem reads nothing: the network switches it off)."""
    used = nx.DiGraph(graph.used_edges())
    used.add_nodes_from(("input", "output"))
    return {n for n in nx.ancestors(used, "output") & nx.descendants(used, "input")
            if graph.nodes[n].get("kind") == "block"}


def dead_blocks(graph: BranchGraph) -> set[str]:
    """Blocks that are not live: what the pruner removes (none where no block is live: such a network computes
    a constant, and stays as it is). The last module's blocks stay: the head averages all of them (a node
    graph's reads each as one feature), switched off or not; so do a node graph's first nodes, which read one
    channel of the stem each."""
    live = live_blocks(graph)
    if not live:
        return set()
    ends = (graph.modules()[0], graph.modules()[-1]) if graph.graph.get("node_graph") else (graph.modules()[-1],)
    kept = {n for m in ends for n in graph.branches(m)}
    return set(graph.block_nodes()) - live - kept


def active_branches(graph: BranchGraph) -> dict[int, int]:
    """Module → number of live blocks (the paper's 'active branches', Figures 4-5)."""
    live = live_blocks(graph)
    return {m: sum(n in live for n in graph.branches(m)) for m in graph.modules()}


def input_overlap(graph: BranchGraph) -> dict[int, float]:
    """Module → the mean Jaccard similarity of its blocks' sets of active gate inputs over every pair (1: all
    read the same inputs); modules of fewer than two gated blocks are left out. Independent uniform draws of
    K of C give :func:`random_overlap`."""
    overlap = {}
    for m in graph.modules():
        sets = [{u for u, _, d in graph.gate_edges(n) if d.get("active")} for n in graph.branches(m)]
        pairs = [(a, b) for a, b in itertools.combinations(sets, 2) if a | b]
        if pairs:
            overlap[m] = sum(len(a & b) / len(a | b) for a, b in pairs) / len(pairs)
    return overlap


def random_overlap(C: int, K: int) -> float:
    """The expected :func:`input_overlap` of blocks that each draw K of C inputs independently."""
    return sum(math.comb(K, i) * math.comb(C - K, K - i) * i / (2 * K - i)
               for i in range(max(1, 2 * K - C), K + 1)) / math.comb(C, K)
