"""Dead-block analysis and pruning.

A block is dead when none of its outputs is used: no active edge leads from it to a live block or to the
head. Dead blocks are found by reverse reachability from ``output`` along active edges, which is the fixed
point of removing dead blocks repeatedly.
"""

from __future__ import annotations

import networkx as nx

from connlearn.graph import BranchGraph


def live_blocks(graph: BranchGraph) -> set[str]:
    """Blocks with an active path to the head."""
    active = nx.DiGraph()
    active.add_nodes_from(graph.nodes)
    active.add_edges_from(graph.active_edges())
    return {n for n in nx.ancestors(active, "output") if graph.nodes[n].get("kind") == "block"}


def dead_blocks(graph: BranchGraph) -> set[str]:
    """Blocks without an active path to the head (what the pruner removes)."""
    return set(graph.block_nodes()) - live_blocks(graph)


def active_branches(graph: BranchGraph) -> dict[int, int]:
    """Module index → number of live blocks (the paper's 'active branches', Figures 4-5)."""
    live = live_blocks(graph)
    return {m: sum(n in live for n in graph.branches(m)) for m in graph.modules()}
