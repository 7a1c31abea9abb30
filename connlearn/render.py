"""Pictures of a BranchGraph's connectivity, after the paper's Figure 3.

The stem and the head are circles; each module is a row of squares, one per block, from the stem at the top
to the head at the bottom; an arrow joins two nodes for every connection the function reads. Dead blocks
(what the pruner removes) are hollow and dashed, or hidden. Where the function weights its inputs by their
gates (unfrozen ``real`` gates) the edges are weighted. :func:`save` always writes the DOT source; it renders
``.svg``/``.png``/``.pdf`` with Graphviz's ``dot`` where it is installed, and with matplotlib (the layout is
a grid and needs no layout engine) where it is not.

    >>> connlearn.render.save(net.graph(), "connectivity.svg", beside_resnext=True)
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import graphviz

from connlearn.errors import ConfigError, check_choice
from connlearn.files import path_of, write_atomic, write_text
from connlearn.graph import BranchGraph, live_blocks

DEAD_STYLES = ("hollow", "hide")
SUFFIXES = (".dot", ".svg", ".png", ".pdf")
#: A graph that reads more edges is drawn as a matrix of its edges (a node graph's thousands).
MAX_ARROWS = 2000
_RED, _GREEN, _GREY, _BLUE = ("#d9534f", "#a02622"), ("#5cb85c", "#2d6a2d"), "#999999", "#3b4cc0"
KEY = "circles: the stem (top) and the head (bottom); squares: blocks, one row per module; hollow: dead (pruned)"


def pruned(graph: BranchGraph) -> bool:
    """Whether pruning took blocks or modules from ``graph`` (against the C and depth it was built with)."""
    options = graph.graph.get("options", {})
    return len(graph.modules()) < (options.get("depth", 2) - 2) // 3 or any(
        len(graph.branches(m)) < options.get("C", 0) for m in graph.modules())


def resnext_of(graph: BranchGraph) -> BranchGraph:
    """ResNeXt's connectivity on ``graph``'s blocks: every gate edge active with gate 1."""
    if graph.graph.get("node_graph"):
        raise ConfigError("a node graph has no ResNeXt form to draw beside it (every node would read every earlier "
                          "one): leave out side-by-side")
    if pruned(graph):
        raise ConfigError("this connectivity was pruned, so ResNeXt cannot be derived from it: draw the unpruned "
                          "network (the run's last.pt), or pass the reference graph")
    full = graph.copy()
    full.graph.pop("weighted_inputs", None)
    for *_, d in full.edges(data=True):
        if d.get("kind") == "gate":
            d.update(gate=1.0, active=True)
    full.graph.update(gate="full", K=max((len(full.gate_edges(n)) for n in full.block_nodes()), default=graph.K))
    return full


def to_dot(graph: BranchGraph, *, weighted: bool | None = None, dead: str = "hollow",
           title: str | None = None) -> graphviz.Digraph:
    """``graph`` as a ``graphviz.Digraph`` (``.source`` is DOT), node names those of the IR. ``weighted``:
    edge width follows the gate value over its row's largest (default: where the function weights so)."""
    dot = graphviz.Digraph(name="connectivity")
    dot.attr(label=f"{_legend(graph, title)}\n{KEY}", labelloc="t", fontsize="12")
    _draw_dot(dot, graph, "", weighted, check_choice("dead-block style", dead, DEAD_STYLES))
    return dot


def side_by_side(learned: BranchGraph, reference: BranchGraph | None = None, *, weighted: bool | None = None,
                 dead: str = "hollow", title: str | None = None) -> graphviz.Digraph:
    """ResNeXt (``reference``, by default :func:`resnext_of` ``learned``) beside the learned connectivity, as
    the clusters ``cluster_resnext`` and ``cluster_learned`` (node names prefixed ``resnext/`` and ``learned/``)."""
    reference = resnext_of(learned) if reference is None else reference
    dot = graphviz.Digraph(name="connectivity")
    dot.attr(remincross="false", label=f"{title}\n{KEY}" if title else KEY, labelloc="b", fontsize="11")
    for name, graph in (("resnext", reference), ("learned", learned)):
        with dot.subgraph(name=f"cluster_{name}") as cluster:
            cluster.attr(label=_legend(graph, "ResNeXt" if name == "resnext" else "learned"), color="gray80")
            _draw_dot(cluster, graph, f"{name}/", weighted, check_choice("dead-block style", dead, DEAD_STYLES))
    return dot


def save(graph: BranchGraph, path: str | os.PathLike, *, beside_resnext: bool = False,
         reference: BranchGraph | None = None, weighted: bool | None = None, dead: str = "hollow",
         title: str | None = None) -> list[Path]:
    """Draw ``graph`` (with ResNeXt beside it where ``beside_resnext``) to ``path``; returns the files written:
    ``<stem>.dot`` always, and ``path`` itself for ``.svg``/``.png``/``.pdf``, by Graphviz's ``dot`` where it
    is installed and by matplotlib where not."""
    path = path_of(path)
    suffix = check_choice("drawing suffix", path.suffix.lower(), SUFFIXES)
    graphs = [resnext_of(graph) if reference is None else reference, graph] if beside_resnext else [graph]
    options: dict[str, Any] = {"weighted": weighted, "dead": dead, "title": title}
    dot = side_by_side(graphs[1], graphs[0], **options) if beside_resnext else to_dot(graph, **options)
    path.parent.mkdir(parents=True, exist_ok=True)
    files = [write_text(path.with_suffix(".dot"), dot.source)]
    if suffix == ".dot":
        return files
    if any(len(g.used_edges()) > MAX_ARROWS for g in graphs):  # no layout engine draws this many arrows in time
        return [*files, _draw_matrix(graph, path, title)]
    if shutil.which("dot") is not None:
        try:
            data = dot.pipe(format=suffix[1:])
        except (graphviz.CalledProcessError, subprocess.SubprocessError, OSError):
            data = None  # a Graphviz built without this format: matplotlib draws it
        if data:
            return [*files, write_atomic(path, lambda f: f.write(data))]
    return [*files, _draw_matplotlib(graphs, path, weighted, dead, title)]


def _legend(graph: BranchGraph, title: str | None) -> str:
    blocks = graph.block_nodes()
    reads = " (every input, weighted by its gate)" if graph.graph.get("weighted_inputs") else ""
    legend = (f"{graph.gate_words()}{reads}, "
              f"{len(live_blocks(graph) & set(blocks))}/{len(blocks)} blocks live")
    return f"{title}\n{legend}" if title else legend


def _strength(graph: BranchGraph, weighted: bool | None) -> dict[tuple[str, str], float]:
    """Each used edge's gate over the largest |gate| of its row, in [-1, 1] (1 for every edge when not weighted):
    the drawing's width and opacity follow its size, a negative edge weight is blue."""
    weighted = bool(graph.graph.get("weighted_inputs")) if weighted is None else weighted
    strength, tops = {}, {}
    for u, v in graph.used_edges():
        d = graph.edges[u, v]
        if v not in tops:
            tops[v] = max((abs(float(e.get("gate", 0.0))) for *_, e in graph.gate_edges(v)), default=0.0)
        top = tops[v]
        if weighted and d.get("kind") == "gate" and top > 0:
            strength[u, v] = max(-1.0, min(float(d.get("gate", 0.0)) / top, 1.0))
        else:
            strength[u, v] = 1.0
    return strength


def _draw_dot(dot: graphviz.Digraph, graph: BranchGraph, prefix: str, weighted: bool | None, dead: str) -> None:
    weighted = bool(graph.graph.get("weighted_inputs")) if weighted is None else weighted
    dead_set = set(graph.block_nodes()) - live_blocks(graph)
    hidden = dead_set if dead == "hide" else set()
    circle = {"shape": "circle", "style": "filled", "fillcolor": _RED[0], "color": _RED[1], "width": "0.35"}
    dot.node(prefix + "input", label="", tooltip="input (stem)", **circle)
    above: dict[int, str] = {}
    for module in graph.modules():
        kept = [n for n in graph.branches(module) if n not in hidden]
        with dot.subgraph(name=f"{prefix}m{module}") as row:
            row.attr(rank="same")
            for node in kept:
                style = ({"style": "dashed", "fillcolor": "none", "color": _GREY} if node in dead_set else
                         {"style": "filled", "fillcolor": _GREEN[0], "color": _GREEN[1]})
                row.node(prefix + node, label="", tooltip=node, shape="square", width="0.3", **style)
            for left, right in itertools.pairwise(kept):  # keeps the squares of a row in branch order
                row.edge(prefix + left, prefix + right, style="invis")
        for node in kept:  # heavy invisible edges down each column keep the rows a grid
            branch = graph.nodes[node]["branch"]
            if branch in above:
                dot.edge(prefix + above[branch], prefix + node, style="invis", weight="10")
            above[branch] = node
    dot.node(prefix + "output", label="", tooltip="output (head)", **circle)
    for (u, v), s in _strength(graph, weighted).items():
        if u in hidden or v in hidden:
            continue
        attrs = {"arrowsize": "0.4"}
        if weighted:
            colour = _BLUE if s < 0 else "#000000"
            attrs.update(penwidth=f"{0.3 + 1.7 * abs(s):.2f}", color=f"{colour}{round(64 + 191 * abs(s)):02x}")
        if u in dead_set or v in dead_set:
            attrs.update(style="dashed", color=_GREY)
        dot.edge(prefix + u, prefix + v, **attrs)


def _draw_matrix(graph: BranchGraph, path: Path, title: str | None) -> Path:
    """A graph of too many edges for arrows, drawn by matplotlib as the matrix of the edges its function reads:
    a row per reading block, a column per block read, both in (module, branch) order, lines between modules;
    edge weights in colour by sign where the graph has them."""
    import numpy as np
    from matplotlib.figure import Figure

    order = graph.block_nodes()
    index = {n: i for i, n in enumerate(order)}
    signed = bool(graph.graph.get("edge_weights"))
    image = np.full((len(order), len(order)), np.nan)
    for u, v in graph.used_edges():
        if u in index and v in index:
            image[index[v], index[u]] = float(graph.edges[u, v].get("gate", 1.0)) if signed else 1.0
    top = float(np.nanmax(np.abs(image))) if np.isfinite(image).any() else 1.0
    fig = Figure(figsize=(7.5, 7.0), layout="constrained")
    ax = fig.subplots()
    shown = ax.imshow(image, cmap="coolwarm" if signed else "Greys", vmin=-top if signed else 0, vmax=top,
                      interpolation="nearest")
    starts = [index[graph.branches(m)[0]] - 0.5 for m in graph.modules()[1:]]
    for at in starts:
        ax.axhline(at, color="0.6", lw=0.4)
        ax.axvline(at, color="0.6", lw=0.4)
    ax.set_xlabel("block read (module by module, from the stem's)")
    ax.set_ylabel("block reading it")
    ax.set_title(_legend(graph, title), fontsize=8)
    if signed:
        fig.colorbar(shown, ax=ax, shrink=0.6, label="edge weight")
    return write_atomic(path, lambda f: fig.savefig(f, format=path.suffix[1:], dpi=150))


def _draw_matplotlib(graphs: list[BranchGraph], path: Path, weighted: bool | None, dead: str,
                     title: str | None) -> Path:
    """The same picture on a grid, drawn by matplotlib (Agg, no pyplot) to ``path``."""
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    widths = [max(len(g.branches(m)) for m in g.modules()) for g in graphs]
    rows = max(len(g.modules()) for g in graphs) + 2
    fig = Figure(figsize=(max(6.4, sum(0.45 * w + 1.6 for w in widths)), 0.45 * rows + 1.6), layout="constrained")
    for ax, graph, width, name in zip(fig.subplots(1, len(graphs), squeeze=False)[0], graphs, widths,
                                      ["ResNeXt", "learned"][-len(graphs):], strict=True):
        dead_set = set(graph.block_nodes()) - live_blocks(graph)
        hidden = dead_set if dead == "hide" else set()
        thin = min(1.0, 3.0 / max((len(graph.candidates(m)) for m in graph.modules()), default=1))  # ResNeXt's many
        where = {"input": ((width - 1) / 2, 0.0), "output": ((width - 1) / 2, -(len(graph.modules()) + 1.0))}
        for row, module in enumerate(graph.modules(), 1):
            for node in graph.branches(module):
                where[node] = (graph.nodes[node]["branch"] - 1.0, -float(row))
            ax.text(-0.7, -float(row), f"m{module}", ha="right", va="center", fontsize=7, color="0.35")
        for node, label in (("input", "stem"), ("output", "head")):
            ax.text(where[node][0] + 0.5, where[node][1], label, ha="left", va="center", fontsize=7, color="0.35")
        for (u, v), s in _strength(graph, weighted).items():
            if u not in hidden and v not in hidden:
                grey = u in dead_set or v in dead_set
                ax.annotate("", xy=where[v], xytext=where[u], arrowprops={
                    "arrowstyle": "-|>", "lw": (0.3 + 1.2 * abs(s)) * thin, "alpha": 0.25 + 0.75 * abs(s),
                    "shrinkA": 5, "shrinkB": 5, "color": _GREY if grey else _BLUE if s < 0 else "black",
                    "linestyle": "--" if grey else "-", "mutation_scale": 6})
        for node, (x, y) in where.items():
            if node in ("input", "output"):
                ax.scatter([x], [y], s=160, c=_RED[0], edgecolors=_RED[1], zorder=3)
            elif node not in hidden:
                live = node not in dead_set
                ax.scatter([x], [y], s=90, marker="s", zorder=3, c=_GREEN[0] if live else "white",
                           edgecolors=_GREEN[1] if live else _GREY, linestyle="-" if live else "--")
        ax.set_title(_legend(graph, name if len(graphs) > 1 else title), fontsize=8)
        ax.set_axis_off()
        ax.margins(0.08)
    if title and len(graphs) > 1:
        fig.suptitle(title)
    marks = [("o", _RED[0], _RED[1], "-", "stem (top), head (bottom)"), ("s", _GREEN[0], _GREEN[1], "-", "block"),
             ("s", "white", _GREY, "--", "dead block (pruned)")]
    fig.legend(handles=[Line2D([], [], marker=m, color="none", markerfacecolor=face, markeredgecolor=edge,
                               linestyle="none", markersize=7, label=label) for m, face, edge, _, label in marks],
               loc="outside lower center", ncols=3, fontsize=7, frameon=False,
               title="rows: modules m1, m2, ... from the stem down; arrows: the inputs each block reads",
               title_fontsize=7)
    return write_atomic(path, lambda f: fig.savefig(f, format=path.suffix[1:], dpi=150))
