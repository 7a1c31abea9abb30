"""BranchGraph: the intermediate representation of a multi-branch network's connectivity.

The IR is the single source of truth for connectivity: topologies emit it, ``compile`` turns it into a
network, ``ConnectivityNet.graph()`` returns it with the current gate values, and the pruner and the
renderer work on it.

Schema (a ``networkx.DiGraph``):

- node ``"input"`` (the stem): ``kind="input"``, ``in_channels`` (image channels), ``out_channels``,
  ``image_size``, ``resolution`` (after the stem), ``stem`` (dict: ``kernel``, ``stride``, ``maxpool``);
- one node per residual block, ``"m{i}.b{j}"`` (module i = 1..M, branch j = 1..C_i): ``kind="block"``,
  ``module``, ``branch``, ``block`` (block kind name), ``in_channels``, ``out_channels``, ``stride``,
  ``resolution`` (of its output) and ``params`` (the block kind's keyword parameters, e.g. ``width``);
- node ``"output"`` (the head): ``kind="output"``, ``in_channels``, ``num_classes``;
- gate edges ``m{s}.b{k} → m{i}.b{j}`` (``kind="gate"``) with the real gate value ``gate``, ``active``
  (whether the connection is used: the sampled-free, evaluation-time connectivity) and, for learnable
  gates, ``tie`` (an integer rank: among equal gates the larger enters the top-K first);
- fixed edges ``input → m1.b*`` and ``m{M}.b* → output`` (``kind="fixed"``, ``active`` true or left out: the
  network always reads them): the blocks
  of a module without gate edges read the stem, and the head averages every block of the last module.

Sizes (channels, resolutions, strides, ``module``, ``branch``, ``num_classes``, the stem's ``kernel`` and
``stride``) are integers >= 1; :meth:`BranchGraph.validate` names any attribute that is missing or of
another type, so a hand-edited or foreign graph is refused before anything is built from it.

Graph attributes: ``gate`` (gate kind), ``K`` (fan-in), ``seed``, ``residual_init`` (how the branches'
output scale starts when compiled; ``"one"`` if absent), ``conv_init`` (how the convolutions inside each
branch start; ``"branch"`` if absent), ``topology`` and ``options`` (free-form description of how it was
made, e.g. the preset). A network's graph also carries ``weighted_inputs`` (True while unfrozen ``real``
gates mix every input, weighted) and, once frozen (``gate="frozen"``), ``frozen_from`` (the gate kind that
learned the connectivity).
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Iterable
from typing import Any

import networkx as nx

from connlearn.errors import ConfigTypeError, ConnlearnError, GraphError, unknown_name

FORMAT = "connlearn.BranchGraph"
VERSION = 1

#: The attributes that every node of a kind must have, each an integer >= 1.
_NODE_FIELDS = {
    "input": ("in_channels", "out_channels", "image_size", "resolution"),
    "block": ("module", "branch", "in_channels", "out_channels", "stride", "resolution"),
    "output": ("in_channels", "num_classes"),
}


class _Missing:
    def __repr__(self) -> str:
        return "(missing)"


_MISSING = _Missing()


#: The largest size (channels, resolution, classes, ...) a graph may name: far beyond any real network, and
#: within what torch takes for a dimension.
_MAX_SIZE = 2**31 - 1


def _check_count(where: str, key: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 1 <= int(value) <= _MAX_SIZE:
        found = "it is missing" if value is _MISSING else f"got {value!r}"
        raise GraphError(f"{where} needs {key}, an integer from 1 to {_MAX_SIZE}; {found}")


def _scalar(value: object) -> object:
    """A 0-d tensor or NumPy scalar as the Python number or bool it holds (a plug-in topology may write
    those); anything else as it is."""
    if hasattr(value, "item") and getattr(value, "ndim", None) == 0:
        try:
            return value.item()
        except (RuntimeError, ValueError, TypeError):  # e.g. a tensor on the meta device: refused as it is
            return value
    return value


def check_graph(obj: object, what: str = "graph") -> BranchGraph:
    """``obj`` if it is a :class:`BranchGraph`; else a clear error (for a network: pass ``net.graph()``)."""
    if isinstance(obj, BranchGraph):
        return obj
    hint = "; pass net.graph()" if callable(getattr(obj, "graph", None)) else ""
    raise ConfigTypeError(f"{what} must be a connlearn BranchGraph, got {type(obj).__name__}{hint}")


def check_finite_gates(graph: BranchGraph, what: str) -> None:
    """A clear error unless every gate value of ``graph`` is finite. A network built from the graph starts its
    gates at those values, and one infinite or NaN gate makes every output NaN. (A graph may hold them, as
    ``net.graph()`` of a diverged run does: its checkpoint still loads, for a look at what went wrong.)"""
    for u, v, d in graph.edges(data=True):
        gate = _scalar(d.get("gate", 0.0))
        if isinstance(gate, numbers.Real) and not math.isfinite(gate):  # what is no number, validate() refuses
            raise GraphError(f"{what}: edge {u} → {v} has gate {gate!r}; a network built from a graph starts from "
                             "its gate values, which must be finite (one NaN or infinite gate makes every output "
                             "NaN; the graph of a diverged run? its checkpoint still loads, as it was)")


def block_name(module: int, branch: int) -> str:
    """The node name of branch ``branch`` of module ``module`` (both 1-based)."""
    return f"m{module}.b{branch}"


class BranchGraph(nx.DiGraph):
    """A network's connectivity as a ``networkx.DiGraph`` with the node and edge schema above."""

    # ----------------------------------------------------------------- queries
    def block_nodes(self) -> list[str]:
        """Every block node, ordered by (module, branch)."""
        blocks = [n for n, d in self.nodes(data=True) if d.get("kind") == "block"]
        return sorted(blocks, key=lambda n: (self.nodes[n]["module"], self.nodes[n]["branch"]))

    def modules(self) -> list[int]:
        """The module indices present, ascending."""
        return sorted({self.nodes[n]["module"] for n in self.block_nodes()})

    def branches(self, module: int) -> list[str]:
        """The block nodes of ``module``, ordered by branch."""
        return [n for n in self.block_nodes() if self.nodes[n]["module"] == module]

    def gate_edges(self, node: str) -> list[tuple[str, str, dict[str, Any]]]:
        """The gate edges into ``node``, ordered by source (module, branch)."""
        edges = [(u, v, d) for u, v, d in self.in_edges(node, data=True) if d.get("kind") == "gate"]
        return sorted(edges, key=lambda e: (self.nodes[e[0]]["module"], self.nodes[e[0]]["branch"]))

    def active_edges(self) -> list[tuple[str, str]]:
        """Every active edge: the active gate edges and every fixed edge (the network always reads those; an
        edge without ``active`` is active if fixed, inactive if a gate)."""
        return [(u, v) for u, v, d in self.edges(data=True) if d.get("active", d.get("kind") == "fixed")]

    def weights_inputs(self) -> bool:
        """Whether the network's function weights every input by its gate value: the graph says so
        (``graph["weighted_inputs"]``, set by ``ConnectivityNet.graph()`` for ``real`` gates before freezing)
        and its gate kind is a learned one (a fixed connectivity reads its active edges, whatever it says)."""
        from connlearn.gates import GATES

        kind = self.graph.get("gate")
        return bool(self.graph.get("weighted_inputs")) and kind in GATES and GATES.get(kind).learnable

    def used_edges(self) -> list[tuple[str, str]]:
        """The edges the network's function reads: its active edges or, where it weights every input by its
        gate value (:meth:`weights_inputs`), every active fixed edge and every gate edge of non-zero value."""
        if not self.weights_inputs():
            return self.active_edges()
        return [(u, v) for u, v, d in self.edges(data=True)
                if (d.get("kind") == "gate" and float(d.get("gate", 0.0)) != 0.0)
                or (d.get("kind") == "fixed" and d.get("active", True))]

    def candidates(self, module: int) -> list[str]:
        """The source blocks that may feed ``module`` through gates: the columns of its gate matrix."""
        sources: set[str] = set()
        for node in self.branches(module):
            sources.update(u for u, _, _ in self.gate_edges(node))
        return sorted(sources, key=lambda n: (self.nodes[n]["module"], self.nodes[n]["branch"]))

    def _edge_matrix(self, module: int, key: str, default: Any) -> list[list[Any]]:
        """Attribute ``key`` of ``module``'s gate edges (``default`` where an edge lacks it, or where there is
        no edge): rows are its branches, columns ``candidates``."""
        cols = self.candidates(module)
        index = {c: k for k, c in enumerate(cols)}
        rows = []
        for node in self.branches(module):
            row = [default] * len(cols)
            for u, _, d in self.gate_edges(node):
                row[index[u]] = d.get(key, default)
            rows.append(row)
        return rows

    def gate_matrix(self, module: int) -> tuple[list[list[float]], list[list[bool]]]:
        """Real gate values and active flags of ``module``: rows are its branches, columns ``candidates``."""
        values = [[float(v) for v in row] for row in self._edge_matrix(module, "gate", 0.0)]
        active = [[bool(a) for a in row] for row in self._edge_matrix(module, "active", False)]
        return values, active

    def tie_matrix(self, module: int) -> list[list[int]] | None:
        """The ``tie`` ranks of ``module``'s gate edges (rows and columns as in :meth:`gate_matrix`): the
        order in which equal gates enter the top-K, the larger first; ``None`` if an edge has none."""
        ties = self._edge_matrix(module, "tie", None)
        return None if any(t is None for row in ties for t in row) else [[int(t) for t in row] for row in ties]

    @property
    def K(self) -> int:  # noqa: N802 - the paper's name for the fan-in
        return int(self.graph["K"])

    @property
    def seed(self) -> int:
        """The seed of the weights, the draws and the tie orders (0 if the graph has none)."""
        seed = self.graph.get("seed", 0)
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not -(2**63) <= int(seed) < 2**64:
            raise GraphError(f"the graph's seed must be an integer (a 64-bit seed), got {seed!r}")
        return int(seed)

    @property
    def gate_kind(self) -> str:
        return str(self.graph["gate"])

    def gate_label(self) -> str:
        """The gate kind for titles: a frozen connectivity names what learned it (``frozen from topk``)."""
        kind, learned = self.graph.get("gate", "?"), self.graph.get("frozen_from")
        return f"{kind} from {learned}" if kind == "frozen" and learned else str(kind)

    # -------------------------------------------------------------- validation
    def validate(self, known_blocks: Iterable[str] | None = None) -> BranchGraph:
        """Check that the graph describes a network; raise one :class:`GraphError` naming the first fault.

        Faults: a missing ``input``/``output`` node, a node or edge of another kind, an attribute of the
        schema missing or of the wrong type (sizes are integers >= 1, ``active`` a bool, gate values numbers,
        ``tie`` ranks integers), two nodes for one (module, branch), an input resolution that the stem does
        not make, a cycle, an unknown block kind, an edge whose channels or resolution do not match, a fixed
        edge other than ``input`` → block or block → ``output``, a block reading both, a block with no
        input, an ``output`` that does not read exactly the last module's blocks, blocks of one module that
        disagree in channels, stride or candidate inputs, a fan-in K larger than a block's possible inputs,
        and (for fixed connectivity) a block whose number of active inputs is not K. ``known_blocks``: the
        block kinds to accept; by default the registered ones, and then the gate kind must be registered too.
        Returns ``self``.
        """
        registry = known_blocks is None
        if known_blocks is None:
            from connlearn.blocks import BLOCKS

            known_blocks = BLOCKS.names()
        known_blocks = set(known_blocks)
        self._check_schema()
        self._check_attributes(registry)
        if not nx.is_directed_acyclic_graph(self):
            cycle = nx.find_cycle(self)
            path = " → ".join([u for u, _ in cycle] + [cycle[0][0]])
            raise GraphError(f"the graph has a cycle: {path}")
        for node in self.block_nodes():
            kind = self.nodes[node].get("block")
            if kind not in known_blocks:
                if registry:  # the registry's own error also names a plug-in that failed to load
                    try:
                        BLOCKS.get(kind)
                    except ConnlearnError as exc:
                        raise GraphError(f"{exc} (at node {node})") from None
                raise GraphError(f"{unknown_name('block', kind, known_blocks)} (at node {node})")
        for u, v, d in self.edges(data=True):
            self._check_edge(u, v, d)
        for node in self.block_nodes():
            if self.in_degree(node) == 0:
                raise GraphError(f"block {node} has no input: give it a gate edge or a fixed edge from 'input'")
        self._check_output()
        for module in self.modules():
            self._check_module(module)
        return self

    def _check_schema(self) -> None:
        """Every node and edge has the attributes of its kind, of the right types (before anything sorts
        or reads them): a hand-edited or foreign graph fails here, naming the node and the attribute."""
        for name in ("input", "output"):
            if name not in self or self.nodes[name].get("kind") != name:
                raise GraphError(f"the graph has no {name!r} node (a node named {name!r} with kind={name!r})")
        seen: dict[tuple[int, int], str] = {}
        for node, d in self.nodes(data=True):
            kind = d.get("kind")
            if not isinstance(kind, str) or kind not in _NODE_FIELDS or (kind != "block" and node != kind):
                raise GraphError(f"node {node!r} has kind {kind!r}; allowed: 'block', and 'input' and 'output' for "
                                 "the nodes of those names")
            for key in _NODE_FIELDS[kind]:
                _check_count(f"node {node!r}", key, d.get(key, _MISSING))
            if kind == "input":
                self._check_stem(d)
            elif kind == "block":
                if not isinstance(d.get("block"), str):
                    raise GraphError(f"node {node!r} has block {d.get('block', _MISSING)!r}; it must be the name "
                                     "of a block kind, e.g. 'bottleneck'")
                place = (d["module"], d["branch"])
                if place in seen:
                    raise GraphError(f"nodes {seen[place]!r} and {node!r} are both branch {place[1]} of module "
                                     f"{place[0]}")
                seen[place] = node
        for u, v, d in self.edges(data=True):
            where = f"edge {u} → {v}"
            if d.get("kind") not in ("gate", "fixed"):
                raise GraphError(f"{where} has kind {d.get('kind', _MISSING)!r}; allowed: 'gate', 'fixed'")
            if "active" in d and not isinstance(_scalar(d["active"]), bool):
                raise GraphError(f"{where} has active {d['active']!r}; it must be true or false")
            if d["kind"] == "fixed" and _scalar(d.get("active", True)) is not True:
                raise GraphError(f"{where} is a fixed edge with active false; the network always reads a fixed edge "
                                 "(set active true, or leave it out)")
            gate = _scalar(d.get("gate", 0.0))  # a gate edge without one: 0, as gate_matrix() reads it
            if isinstance(gate, bool) or not isinstance(gate, numbers.Real):  # NaN too: a diverged run's gates
                raise GraphError(f"{where} has gate {d['gate']!r}; a gate value must be a number")
            tie = _scalar(d.get("tie", 0))
            if isinstance(tie, bool) or not isinstance(tie, numbers.Integral) or not -(2**63) <= int(tie) < 2**63:
                raise GraphError(f"{where} has tie {d['tie']!r}; it must be an integer rank (64-bit)")

    def _check_stem(self, d: dict[str, Any]) -> None:
        stem = d.get("stem", _MISSING)
        if not isinstance(stem, dict):
            raise GraphError(f"node 'input' has stem {stem!r}; it must be a dict of kernel, stride and maxpool")
        for key in ("kernel", "stride"):
            _check_count("node 'input'", f"stem {key}", stem.get(key, _MISSING))
        if not isinstance(stem.get("maxpool"), bool):
            raise GraphError(f"node 'input' has stem maxpool {stem.get('maxpool', _MISSING)!r}; it must be true or "
                             "false")
        kernel, stride = stem["kernel"], stem["stride"]
        expected = (d["image_size"] + 2 * (kernel // 2) - kernel) // stride + 1  # the stem's padding is kernel // 2
        expected = (expected - 1) // 2 + 1 if stem["maxpool"] else expected  # 3x3 max-pool, stride 2, padding 1
        if d["resolution"] != expected:
            raise GraphError(f"node 'input' has resolution {d['resolution']}, but its stem (stride {stem['stride']}"
                             f"{', max-pool' if stem['maxpool'] else ''}) makes {expected} of images of size "
                             f"{d['image_size']}")

    def _check_output(self) -> None:
        """The head averages every branch of the last module: 'output' reads exactly those, by fixed edges."""
        modules = self.modules()
        if not modules:
            raise GraphError("the graph has no block nodes")
        last = set(self.branches(modules[-1]))
        sources = {u for u, _ in self.in_edges("output")}
        if sources != last:
            wrong, missing = sorted(sources - last), sorted(last - sources)
            detail = f"it also reads {wrong}" if wrong else f"it does not read {missing}"
            raise GraphError(f"the 'output' node must read every block of the last module, {modules[-1]}, and only "
                             f"those (the head averages them): {detail}")

    def _check_attributes(self, registry: bool) -> None:
        for key, what in (("gate", "the gate kind, e.g. 'topk'"), ("K", "the fan-in, an integer >= 1")):
            if key not in self.graph:
                raise GraphError(f"the graph has no {key!r} attribute: set graph.graph[{key!r}] to {what}")
        K = self.graph["K"]
        if isinstance(K, bool) or not isinstance(K, numbers.Integral) or K < 1:
            raise GraphError(f"the graph's K must be an integer >= 1, got {K!r}")
        self.seed  # noqa: B018 - the property checks it
        weighted = self.graph.get("weighted_inputs", False)
        if not isinstance(weighted, bool):
            raise GraphError(f"the graph's weighted_inputs must be true or false, got {weighted!r}")
        from connlearn.blocks.base import check_conv_init, check_residual_init

        for key, check in (("residual_init", check_residual_init), ("conv_init", check_conv_init)):
            if key in self.graph:
                try:
                    check(self.graph[key])
                except ConnlearnError as exc:  # keeps its type: an UnknownNameError, a ConfigTypeError
                    raise type(exc)(f"{exc} (graph[{key!r}])") from None
        if registry:
            from connlearn.gates import GATES

            try:
                GATES.get(self.graph["gate"])
            except ConnlearnError as exc:
                raise GraphError(f"{exc} (graph['gate'])") from None
        for node in self.block_nodes():
            params = self.nodes[node].get("params", {})
            if not isinstance(params, dict) or not all(isinstance(k, str) for k in params):
                raise GraphError(f"block {node} has params {params!r}; they must be a dict of keyword parameters")

    def _check_edge(self, u: str, v: str, d: dict[str, Any]) -> None:
        if d.get("kind") not in ("gate", "fixed"):
            raise GraphError(f"edge {u} → {v} has kind {d.get('kind')!r}; allowed: 'gate', 'fixed'")
        src, dst = self.nodes[u], self.nodes[v]
        if d["kind"] == "gate" and (src.get("kind") != "block" or dst.get("kind") != "block"):
            raise GraphError(f"gate edge {u} → {v} must join two blocks")
        if d["kind"] == "gate" and src["module"] >= dst["module"]:
            raise GraphError(f"gate edge {u} → {v} must go from an earlier module to a later one")
        if d["kind"] == "fixed" and not (
            (u == "input" and dst["kind"] == "block") or (src["kind"] == "block" and v == "output")
        ):
            raise GraphError(f"fixed edge {u} → {v} must go from 'input' to a block or from a block to 'output'; "
                             "blocks read each other through gate edges")
        if u == "input" and self.gate_edges(v):
            raise GraphError(f"block {v} reads both 'input' and gate edges; a block reads one or the other")
        if src["out_channels"] != dst["in_channels"]:
            raise GraphError(
                f"edge {u} → {v} joins {src['out_channels']} output channels to a node that takes "
                f"{dst['in_channels']}"
            )
        if dst.get("kind") == "block":
            expected = math.ceil(src["resolution"] / dst["stride"])
            if expected != dst["resolution"]:
                raise GraphError(
                    f"edge {u} → {v} joins resolution {src['resolution']} to a block of stride "
                    f"{dst['stride']} and output resolution {dst['resolution']} (expected {expected})"
                )

    def _check_module(self, module: int) -> None:
        nodes = self.branches(module)
        first = self.nodes[nodes[0]]
        for node in nodes[1:]:
            d = self.nodes[node]
            for key in ("in_channels", "out_channels", "stride", "resolution"):
                if d[key] != first[key]:
                    raise GraphError(
                        f"blocks of module {module} disagree in {key}: {nodes[0]} has {first[key]}, "
                        f"{node} has {d[key]} (a module's branches share one projection shortcut)"
                    )
        gated = [bool(self.gate_edges(n)) for n in nodes]
        if not any(gated):
            return
        if not all(gated):
            raise GraphError(f"module {module} mixes gated and fixed inputs; give every block gate edges")
        cols = self.candidates(module)
        K = self.K
        for node in nodes:
            sources = [u for u, _, _ in self.gate_edges(node)]
            if sources != cols:
                raise GraphError(
                    f"block {node} has candidate inputs {sources}, but its module's other blocks have {cols}; "
                    "the blocks of a module must share their candidate inputs"
                )
            if len(sources) < K:
                raise GraphError(f"fan-in K={K} is larger than the {len(sources)} possible inputs of block {node}")
        if self.gate_kind == "full":
            for node in nodes:
                inactive = [u for u, _, d in self.gate_edges(node) if not d.get("active")]
                if inactive:
                    raise GraphError(f"block {node} has inactive inputs {inactive}; a 'full' connectivity has "
                                     "every input active (use 'random' or 'frozen' for a fixed subset)")
            if len(cols) != K:
                raise GraphError(f"module {module} has {len(cols)} inputs per block and K={K}; a 'full' "
                                 "connectivity averages every input, so K must equal their number")
        if self.gate_kind in ("frozen", "random"):
            for node in nodes:
                n_active = sum(bool(d.get("active")) for _, _, d in self.gate_edges(node))
                if n_active != K:
                    raise GraphError(
                        f"block {node} has {n_active} active inputs; a {self.gate_kind!r} connectivity needs "
                        f"exactly K={K}"
                    )

    # --------------------------------------------------------------- (de)serialise
    def to_json(self, indent: int | None = None) -> str:
        """The graph as a JSON string (``from_json`` rebuilds it exactly)."""
        doc = {
            "format": FORMAT,
            "version": VERSION,
            "graph": dict(self.graph),
            "nodes": [{"id": n, **d} for n, d in self.nodes(data=True)],
            "edges": [{"source": u, "target": v, **d} for u, v, d in self.edges(data=True)],
        }
        return json.dumps(doc, indent=indent, sort_keys=False)

    @classmethod
    def from_json(cls, text: str) -> BranchGraph:
        """Rebuild a graph written by :meth:`to_json`."""
        if not isinstance(text, (str, bytes, bytearray)):
            raise GraphError(f"a BranchGraph JSON document is a string, got {type(text).__name__}")
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise GraphError(f"not a BranchGraph JSON document: {exc}") from None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise GraphError(f"not a BranchGraph JSON document (expected format {FORMAT!r})")
        if doc.get("version") != VERSION:
            raise GraphError(f"BranchGraph JSON version {doc.get('version')!r} is not supported (this is {VERSION})")
        for key, kind in (("graph", dict), ("nodes", list), ("edges", list)):
            if not isinstance(doc.get(key), kind):
                found = "missing" if key not in doc else f"a {type(doc[key]).__name__}"
                raise GraphError(f"a BranchGraph JSON document needs {key!r}, a {kind.__name__}; it is {found}")
        g = cls()
        g.graph.update(doc["graph"])
        for k, node in enumerate(doc["nodes"]):
            if not isinstance(node, dict) or not isinstance(node.get("id"), str):
                raise GraphError(f"node {k} of the document is {node!r}; each node is an object with a string 'id'")
            node = dict(node)
            name = node.pop("id")
            if name in g:
                raise GraphError(f"the document lists node {name!r} twice")
            g.add_node(name, **node)
        for k, edge in enumerate(doc["edges"]):
            ends = (edge.get("source"), edge.get("target")) if isinstance(edge, dict) else (None, None)
            if not all(isinstance(end, str) and end in g for end in ends):
                raise GraphError(f"edge {k} of the document is {edge!r}; each edge is an object whose 'source' and "
                                 "'target' name nodes of the document")
            if g.has_edge(*ends):
                raise GraphError(f"the document lists edge {ends[0]} → {ends[1]} twice")
            edge = dict(edge)
            g.add_edge(edge.pop("source"), edge.pop("target"), **edge)
        return g
