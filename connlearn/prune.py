"""Dead-block analysis and pruning.

A block is dead when none of its outputs is used: no active edge leads from it to a live block or to the
head (for unfrozen ``real`` gates: no edge its function reads, :meth:`BranchGraph.used_edges`). Dead
blocks are found by reverse reachability from ``output`` along those edges, which is the fixed point of
removing dead blocks repeatedly.
"""

from __future__ import annotations

import copy
import itertools
import math
from typing import cast

import attrs
import networkx as nx
import torch

from connlearn.blocks import device_and_dtype, require_block_method
from connlearn.compile import ConnectivityNet, FusedModule, ReferenceModule, check_net
from connlearn.errors import ConfigError, check_bool, check_int
from connlearn.graph import BranchGraph, check_graph


def live_blocks(graph: BranchGraph) -> set[str]:
    """Blocks with a path to the head along the edges the function reads (the active ones)."""
    check_graph(graph)
    active = nx.DiGraph()
    active.add_nodes_from(graph.nodes)
    active.add_edges_from(graph.used_edges())
    return {n for n in nx.ancestors(active, "output") if graph.nodes[n].get("kind") == "block"}


def dead_blocks(graph: BranchGraph) -> set[str]:
    """Blocks without an active path to the head (what the pruner removes)."""
    live = live_blocks(graph)  # checks that it is a graph
    return set(graph.block_nodes()) - live


def active_branches(graph: BranchGraph) -> dict[int, int]:
    """Module index → number of live blocks (the paper's 'active branches', Figures 4-5). For ``real`` gates
    before freezing, a block is live when an input of non-zero gate value reaches the head from it (what the
    function reads), so the count drops to the top-K's when phase 2 freezes them; :func:`input_overlap`
    compares the top-K sets throughout."""
    live = live_blocks(graph)
    return {m: sum(n in live for n in graph.branches(m)) for m in graph.modules()}


def input_overlap(graph: BranchGraph) -> dict[int, float]:
    """Module index → how alike its blocks' inputs are: the mean Jaccard similarity |A ∩ B| / |A ∪ B| of
    the sets of active gate inputs, over every pair of the module's blocks (dead ones included), for each
    module with at least two blocks that have gate inputs (a module of one block has no pairs and is left
    out). 1 when every block reads the same inputs (Fixed-Full always),
    0 when no two share one. Independent uniform draws of K of C inputs give :func:`random_overlap`;
    a learned connectivity far above it has its blocks crowding onto the same few branches. Unfrozen
    ``real`` gates weight every input; their active inputs are the top-K that ``net.freeze()`` keeps."""
    check_graph(graph)
    overlap = {}
    for m in graph.modules():
        sets = [{u for u, _, d in graph.gate_edges(n) if d.get("active", False)} for n in graph.branches(m)]
        pairs = [(a, b) for a, b in itertools.combinations(sets, 2) if a | b]
        if pairs:
            overlap[m] = sum(len(a & b) / len(a | b) for a, b in pairs) / len(pairs)
    return overlap


def random_overlap(C: int, K: int) -> float:
    """The expected :func:`input_overlap` of two blocks that each draw K of C inputs uniformly and
    independently (Fixed-Random): the hypergeometric mean of i / (2K - i) over the shared count i."""
    C, K = check_int("C", C, minimum=1), check_int("K", K, minimum=1)
    if K > C:
        raise ConfigError(f"random_overlap needs 1 <= K <= C, got C={C}, K={K}")
    return sum(math.comb(K, i) * math.comb(C - K, K - i) * i / (2 * K - i)
               for i in range(max(0, 2 * K - C), K + 1)) / math.comb(C, K)


@attrs.frozen
class PruneReport:
    """What pruning removed: the paper's Params-Train (``params_before``) and Params-Test (``params_after``)."""

    params_before: int
    params_after: int
    blocks_before: int
    blocks_after: int
    removed: dict[int, list[str]]  # module index -> removed block nodes

    @property
    def saving(self) -> float:
        """Share of parameters removed."""
        return 1 - self.params_after / self.params_before

    def __str__(self) -> str:
        per_module = ", ".join(f"m{m}: -{len(r)}" for m, r in self.removed.items() if r) or "none"
        return (f"params {self.params_before / 1e6:.3f}M -> {self.params_after / 1e6:.3f}M "
                f"({100 * self.saving:.1f}% fewer); blocks {self.blocks_before} -> {self.blocks_after} "
                f"(removed per module: {per_module})")


def freezing_changes_outputs(net: ConnectivityNet) -> bool:
    """Whether freezing ``net`` to its top-K (as pruning does) would change its eval outputs: its gates are
    learned and evaluated by their values, not by their top-K (``real`` gates before phase 2)."""
    check_net(net)
    return not net.fixed_connectivity and not net.evaluates_top_k()


def prune_dead_blocks(net: ConnectivityNet, *, freeze: bool = False) -> tuple[ConnectivityNet, PruneReport]:
    """A copy of ``net`` without its dead blocks, computing the same eval outputs, and a report.

    ``net`` must have a fixed connectivity (``frozen``, ``random``, ``full``); ``freeze=True`` first
    freezes a copy of a net with learnable gates (top-K of the real gates), where that keeps its eval
    outputs (not for ``real`` gates, which weight every input: freeze those yourself if the top-K is what
    you want). The pruned IR is compiled on the same engine (modules may now have fewer branches than C,
    and a module none of whose blocks is read is left out) and the surviving weights are copied through the
    blocks' ``select()``, on the net's device and dtype. ``net`` itself is left unchanged.
    """
    check_net(net)
    freeze = check_bool("freeze", freeze)
    if not net.fixed_connectivity:
        if not freeze:
            raise ConfigError(
                f"prune_dead_blocks needs a fixed connectivity, but the gates are {net.gate_kind!r}: "
                "call net.freeze() first, or pass freeze=True"
            )
        if freezing_changes_outputs(net):
            raise ConfigError(
                f"gate kind {net.gate_kind!r} evaluates with its real gate values, not with their top-K, so "
                "freezing it to prune would change the outputs; call net.freeze() first to keep the top-K (as "
                "the Trainer does from phase 2 on), or keep the net unpruned"
            )
        net = copy.deepcopy(net).freeze()
    graph = net.graph()
    dead = dead_blocks(graph)
    removed = {m: [n for n in graph.branches(m) if n in dead] for m in graph.modules()}
    before = net.num_parameters()
    if not dead:
        pruned = copy.deepcopy(net)
    else:
        pruned_graph = graph.copy()
        pruned_graph.remove_nodes_from(dead)
        with torch.random.fork_rng(devices=[]):
            pruned = ConnectivityNet(pruned_graph, engine=net.engine).train(net.training)
        pruned.stem = copy.deepcopy(net.stem)
        pruned.head = copy.deepcopy(net.head)
        stage_of = dict(zip(pruned.module_ids, pruned.stages, strict=True))
        for old, module in zip(net.stages, net.module_ids, strict=True):
            keep = [j for j, n in enumerate(graph.branches(module)) if n not in dead]
            if not keep:  # no block of the module is read (a dense graph): the module goes
                continue
            new = stage_of[module]
            new.training, new.proj = old.training, copy.deepcopy(old.proj)
            if new.gate is not None and old.gate is not None:  # the pruned graph's gate, made afresh
                new.gate.training = old.gate.training
            if isinstance(old, FusedModule) and len(keep) == old.branches:
                new.block = copy.deepcopy(old.block)
            elif isinstance(old, FusedModule):
                require_block_method(old.block, "select", "pruning dead blocks")
                new.block = old.block.select(keep)  # type: ignore[operator]  # a block kind's method, checked above
            else:
                old_blocks = cast(ReferenceModule, old).blocks
                new.blocks = torch.nn.ModuleList(copy.deepcopy(old_blocks[j]) for j in keep)
                new.blocks.training = old_blocks.training
        pruned.generator.set_state(net.generator.get_state())
    pruned = pruned.to(**device_and_dtype(net))  # the modules taken over keep their own training modes
    pruned.activation_checkpointing = net.activation_checkpointing
    report = PruneReport(
        params_before=before, params_after=pruned.num_parameters(),
        blocks_before=len(graph.block_nodes()), blocks_after=len(graph.block_nodes()) - len(dead), removed=removed,
    )
    return pruned, report
