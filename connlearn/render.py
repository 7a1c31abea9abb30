"""Drawings of a BranchGraph's connectivity, after the paper's Figure 3.

The stem (``input``) and the head (``output``) are circles; each module is one row of squares, one per
residual block, rows stacked from the stem at the top to the head at the bottom; an arrow joins two nodes
for every active connection. Inactive gate edges are not drawn. Dead blocks (no active path to the head,
what the pruner removes) are drawn hollow and dashed grey, with their edges, or left out. A network whose
function weights every input by its gate value (``real`` gates before ``freeze()``:
``graph.weights_inputs()``) is drawn as it computes: every input of non-zero gate, weighted.

The DOT node names are the IR's node names (``input``, ``m{i}.b{j}``, ``output``), so a drawing can be
matched to its graph one to one; :func:`side_by_side` prefixes them with ``resnext/`` and ``learned/``.
Within a row, invisible edges (``style=invis``) between neighbouring branches keep the squares in branch
order; they are layout aids, not connections.

    >>> from connlearn import render
    >>> render.save(net.graph(), "connectivity.svg")          # writes connectivity.dot and connectivity.svg
"""

from __future__ import annotations

import inspect
import itertools
import os
import shutil
import warnings
from pathlib import Path
from typing import Any

import graphviz

from connlearn.errors import ConfigError, ConfigTypeError, check_bool, check_name, check_path, check_title
from connlearn.files import write_bytes_atomic
from connlearn.graph import BranchGraph, check_graph
from connlearn.prune import dead_blocks

#: How dead blocks are drawn: ``hollow`` (dashed grey outline, edges dashed grey) or ``hide`` (left out).
DEAD_STYLES = ("hollow", "hide")
#: File suffixes :func:`save` writes; ``.dot`` is always written, the others are rendered by Graphviz.
SUFFIXES = (".dot", ".svg", ".png", ".pdf")

_CIRCLE = {"shape": "circle", "style": "filled", "fillcolor": "#d9534f", "color": "#a02622", "width": "0.35"}
_BLOCK = {"shape": "square", "style": "filled", "fillcolor": "#5cb85c", "color": "#2d6a2d", "width": "0.3"}
_DEAD_BLOCK = {"shape": "square", "style": "dashed", "fillcolor": "none", "color": "gray60", "width": "0.3"}
_DEAD_EDGE = {"style": "dashed", "color": "gray60"}
_MIN_PEN, _MAX_PEN = 0.3, 2.0  # pen widths (points) of the weakest and strongest edge when weighted


def to_dot(
    graph: BranchGraph, *, weighted: bool | None = None, dead: str = "hollow", title: str | None = None
) -> graphviz.Digraph:
    """Draw ``graph`` like the paper's Figure 3, as a ``graphviz.Digraph`` (its ``.source`` is DOT).

    Args:
        graph: the connectivity, e.g. ``net.graph()``.
        weighted: if True, an edge's pen width and darkness follow its real gate value ``gate``, divided by
            the largest gate value of the receiving block's row (fixed edges count as 1). ``None`` (the
            default): only where the graph's function weights its inputs so (``graph.weights_inputs()``).
        dead: ``"hollow"`` draws dead blocks and their active edges dashed grey; ``"hide"`` leaves them out.
        title: a first line above the legend ``gate=topk K=4, 60/72 blocks live``.
    """
    _check_graph(graph, "to_dot")
    _check_dead(dead)
    check_title(title)
    dot = graphviz.Digraph(name="connectivity")
    dot.attr(label=_legend(graph, title), labelloc="t", fontsize="12")
    _draw(dot, graph, prefix="", weighted=weighted, dead=dead)
    return dot


def side_by_side(
    learned: BranchGraph,
    reference: BranchGraph | None = None,
    *,
    weighted: bool | None = None,
    dead: str = "hollow",
    title: str | None = None,
) -> graphviz.Digraph:
    """ResNeXt's fixed connectivity (left) next to the learned one (right), like the paper's Figure 3.

    The two drawings are the clusters ``cluster_resnext`` and ``cluster_learned``; their node names are the
    IR's names prefixed with ``resnext/`` and ``learned/``. Without ``reference``, ResNeXt is derived from
    ``learned``: the same nodes with every gate edge active (gate value 1).
    """
    _check_graph(learned, "side_by_side")
    _check_dead(dead)
    check_title(title)
    if reference is None:
        pruned = pruned_away(learned)
        if pruned:
            raise ConfigError(f"this connectivity was pruned ({pruned}), so ResNeXt cannot be derived from it: draw "
                              "the unpruned network (e.g. the run's last.pt) side by side (or, in Python, pass "
                              "side_by_side the graph to compare with as reference=)")
        reference = _full_connectivity(learned)
    _check_graph(reference, "side_by_side")
    dot = graphviz.Digraph(name="connectivity")
    # dot's last crossing reduction, run where a graph has clusters, would reorder the blocks of a row
    dot.attr(remincross="false")
    if title:
        dot.attr(label=title, labelloc="t", fontsize="14")
    for name, graph in (("resnext", reference), ("learned", learned)):
        with dot.subgraph(name=f"cluster_{name}") as cluster:
            cluster.attr(label=_legend(graph, "ResNeXt" if name == "resnext" else "learned"), color="gray80")
            _draw(cluster, graph, prefix=f"{name}/", weighted=weighted, dead=dead)
    return dot


def pruned_away(graph: BranchGraph) -> str | None:
    """What pruning took from ``graph``, measured against the modules and C its ``options`` record: whole
    modules, or blocks of a module; ``None`` if nothing."""
    options = graph.graph.get("options", {})
    C, depth = options.get("C"), options.get("depth")
    if isinstance(depth, int) and len(graph.modules()) < (depth - 2) // 3:
        return f"{(depth - 2) // 3 - len(graph.modules())} of its modules are gone"
    short = [m for m in graph.modules() if C and len(graph.branches(m)) < C]
    return f"module {short[0]} has {len(graph.branches(short[0]))} of C={C} blocks" if short else None


def _check_graph(graph: Any, caller: str) -> None:
    check_graph(graph, f"the graph that {caller}() draws")


def save(obj: BranchGraph | graphviz.Digraph, path: str | os.PathLike[str], **to_dot_kwargs: Any) -> list[Path]:
    """Write a drawing; return the paths written.

    ``<stem>.dot`` (the DOT source) is always written; if ``path`` ends in ``.svg``, ``.png`` or ``.pdf``
    that file is rendered too with Graphviz's ``dot`` program. Without ``dot`` installed, only the ``.dot``
    file is written and a warning says what to install. Files are replaced atomically. ``to_dot_kwargs``
    go to :func:`to_dot` when ``obj`` is a BranchGraph.
    """
    path = check_path("path", path)
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise ConfigError(
            f"cannot save a drawing as {str(path)!r}: unsupported suffix {suffix or '(none)'!r}; "
            f"allowed: {' '.join(SUFFIXES)}"
        )
    if isinstance(obj, BranchGraph):
        options = [p for p in inspect.signature(to_dot).parameters if p != "graph"]
        for key in to_dot_kwargs:
            check_name("to_dot option", key, options)
        dot = to_dot(obj, **to_dot_kwargs)
    elif isinstance(obj, graphviz.Digraph):
        if to_dot_kwargs:
            raise ConfigError(
                f"options {sorted(to_dot_kwargs)} apply only when saving a BranchGraph; this is already a drawing"
            )
        dot = obj
    else:
        raise ConfigTypeError(f"save() draws a BranchGraph or a graphviz.Digraph, got {type(obj).__name__}")

    path.parent.mkdir(parents=True, exist_ok=True)
    dot_path = path.with_suffix(".dot")
    write_bytes_atomic(dot_path, dot.source.encode("utf-8"))
    if suffix == ".dot":
        return [dot_path]
    if shutil.which("dot") is None:
        _warn_no_dot(path)
        return [dot_path]
    try:
        data = dot.pipe(format=suffix[1:])
    except graphviz.ExecutableNotFound:
        _warn_no_dot(path)
        return [dot_path]
    except (graphviz.CalledProcessError, OSError) as exc:  # e.g. a Graphviz built without this format
        said = getattr(exc, "stderr", None) or b""
        said = (said.decode("utf-8", "replace") if isinstance(said, bytes) else str(said)).strip() or str(exc)
        warnings.warn(f"cannot render {str(path)!r}: Graphviz's 'dot' failed: {said.splitlines()[0]}; the .dot file "
                      f"was written ({str(dot_path)!r})", stacklevel=2)
        return [dot_path]
    write_bytes_atomic(path, data)
    return [dot_path, path]


# ---------------------------------------------------------------------------- drawing
def _draw(container: graphviz.Digraph, graph: BranchGraph, *, prefix: str, weighted: bool | None,
          dead: str) -> None:
    weighted = graph.weights_inputs() if weighted is None else check_bool("weighted", weighted)
    dead_set = dead_blocks(graph)
    hidden = dead_set if dead == "hide" else set()
    container.node(prefix + "input", label="", tooltip="input (stem)", **_CIRCLE)
    above: dict[int, str] = {}
    for module in graph.modules():
        kept = [n for n in graph.branches(module) if n not in hidden]
        with container.subgraph(name=f"{prefix}m{module}") as row:
            row.attr(rank="same")
            for node in kept:
                row.node(prefix + node, label="", tooltip=node, **(_DEAD_BLOCK if node in dead_set else _BLOCK))
            for left, right in itertools.pairwise(kept):
                row.edge(prefix + left, prefix + right, style="invis")
        # heavy invisible edges down each branch column keep the rows aligned as a grid
        for node in kept:
            branch = graph.nodes[node]["branch"]
            if branch in above:
                container.edge(prefix + above[branch], prefix + node, style="invis", weight="10")
            above[branch] = node
    container.node(prefix + "output", label="", tooltip="output (head)", **_CIRCLE)

    strength = _edge_strength(graph) if weighted else {}
    for u, v in graph.used_edges():  # the active edges, or every input a real gate weights
        if u in hidden or v in hidden:
            continue
        attrs = dict(arrowsize="0.4")
        if weighted:
            s = strength[u, v]
            alpha = round(64 + 191 * s)
            attrs.update(penwidth=f"{_MIN_PEN + (_MAX_PEN - _MIN_PEN) * s:.2f}", color=f"#000000{alpha:02x}")
        if u in dead_set or v in dead_set:
            attrs.update(_DEAD_EDGE)
        container.edge(prefix + u, prefix + v, **attrs)


def _edge_strength(graph: BranchGraph) -> dict[tuple[str, str], float]:
    """Every active edge's gate value divided by the largest gate of its receiving block's row, in [0, 1]."""
    strength: dict[tuple[str, str], float] = {}
    for u, v, d in graph.edges(data=True):
        if d.get("kind") != "gate":
            strength[u, v] = 1.0
            continue
        row_max = max(float(e.get("gate", 0.0)) for _, _, e in graph.gate_edges(v))
        value = float(d.get("gate", 0.0))
        strength[u, v] = min(max(value / row_max, 0.0), 1.0) if row_max > 0 else 1.0
    return strength


def _legend(graph: BranchGraph, title: str | None) -> str:
    blocks = graph.block_nodes()
    live = len(blocks) - len(dead_blocks(graph))
    reads = " (every input, weighted by its gate)" if graph.weights_inputs() else ""
    legend = (f"gate={graph.gate_label()} K={graph.graph.get('K', '?')}{reads}, "
              f"{live}/{len(blocks)} blocks live")
    return f"{title}\n{legend}" if title else legend


def _full_connectivity(graph: BranchGraph) -> BranchGraph:
    """ResNeXt's connectivity on ``graph``'s nodes: every gate edge active with gate value 1."""
    full = graph.copy()
    full.graph.pop("weighted_inputs", None)
    for _, _, d in full.edges(data=True):
        if d.get("kind") == "gate":
            d.update(gate=1.0, active=True)
    fan_in = [len(full.gate_edges(n)) for n in full.block_nodes()]
    full.graph.update(gate="full", K=max(fan_in, default=graph.graph.get("K")))
    return full


def _check_dead(dead: str) -> None:
    check_name("dead-block style", dead, DEAD_STYLES)


# ---------------------------------------------------------------------------- messages
def _warn_no_dot(path: Path) -> None:
    warnings.warn(
        f"cannot render {str(path)!r}: Graphviz's 'dot' program was not found. To render drawings, install "
        "Graphviz: apt-get install graphviz / brew install graphviz / conda install graphviz; "
        f"the .dot file was written ({str(path.with_suffix('.dot'))!r})",
        stacklevel=3,
    )
