"""Pruning dead blocks: a smaller network that computes the same eval outputs.

A block is dead when no edge the function reads leads from it to a live block or the head
(:func:`connlearn.graph.dead_blocks`); the pruner removes them from the IR, compiles the pruned IR and
copies the surviving weights through the blocks' ``select()``.
"""

from __future__ import annotations

import copy
from typing import Any, cast

import attrs
import torch

from connlearn.errors import ConfigError
from connlearn.graph import active_branches, dead_blocks
from connlearn.net import ConnectivityNet, SingleStreamModule
from connlearn.wiring import edge_counts


@attrs.frozen
class PruneReport:
    """What pruning removed: the paper's Params-Train (``params_before``) and Params-Test (``params_after``)."""

    params_before: int
    params_after: int
    blocks_before: int
    blocks_after: int
    removed: dict[int, list[str]]  # module -> removed blocks

    @property
    def saving(self) -> float:
        """The share of parameters removed."""
        return 1 - self.params_after / self.params_before

    def __str__(self) -> str:
        per_module = ", ".join(f"m{m}: -{len(r)}" for m, r in self.removed.items() if r) or "none"
        return (f"params {self.params_before / 1e6:.3f}M -> {self.params_after / 1e6:.3f}M ({100 * self.saving:.1f}% "
                f"fewer); blocks {self.blocks_before} -> {self.blocks_after} (removed per module: {per_module})")


def freezing_changes_outputs(net: ConnectivityNet) -> bool:
    """Whether freezing ``net`` to its top-K would change its eval outputs (unfrozen ``real`` gates)."""
    return not net.fixed_connectivity and net.weighted


def prune_dead_blocks(net: ConnectivityNet, *, freeze: bool = False) -> tuple[ConnectivityNet, PruneReport]:
    """A copy of ``net`` without its dead blocks, with the same eval outputs, and a report. ``net`` must have a
    fixed connectivity; ``freeze=True`` freezes a copy first where that keeps the eval outputs."""
    before = net.num_parameters()  # as it trains: every edge weight of a dnw network
    if not net.fixed_connectivity:
        if not freeze or freezing_changes_outputs(net):
            raise ConfigError(f"prune_dead_blocks needs a fixed connectivity; the gates are {net.gate_kind!r}: "
                              + ("call net.freeze() first, or pass freeze=True" if not freeze else
                                 "they evaluate with their real values, which freezing would change"))
        net = copy.deepcopy(net).freeze()
    graph = net.graph()
    dead = dead_blocks(graph)
    removed = {m: [n for n in graph.branches(m) if n in dead] for m in graph.modules()}
    pruned = copy.deepcopy(net)
    if dead:
        kept = graph.copy()
        kept.remove_nodes_from(dead)
        with torch.random.fork_rng(devices=[]):  # its weights are copied over
            pruned = ConnectivityNet(kept)
        pruned.stem, pruned.head = copy.deepcopy(net.stem), copy.deepcopy(net.head)
        stage_of = dict(zip(pruned.module_ids, pruned.stages, strict=True))
        for module, old in zip(net.module_ids, net.stages, strict=True):
            keep = [j for j, n in enumerate(graph.branches(module)) if n not in dead]
            if not keep:  # no block of the module is read (a dense graph): the module goes
                continue
            new = cast(Any, stage_of[module])  # a net with dead blocks is gated: its modules are FusedModules
            new.proj, block = copy.deepcopy(old.proj), cast(Any, old).block
            new.block = block.select(keep) if len(keep) < old.branches else copy.deepcopy(block)
        pruned.generator.set_state(net.generator.get_state())
        param = next(net.parameters())
        pruned = pruned.to(param.device, param.dtype).train(net.training)
        pruned.activation_checkpointing = net.activation_checkpointing
    report = PruneReport(before, pruned.num_parameters(), len(graph.block_nodes()),
                         len(graph.block_nodes()) - len(dead), removed)
    return pruned, report


def summary(net: ConnectivityNet) -> str:
    """A compact description of ``net``: one line per module (blocks, live blocks, inputs per block) and the
    parameters before and after pruning its dead blocks."""
    graph = net.graph()
    live = active_branches(graph)
    form = ", ResNeXt's single stream" if isinstance(net.stages[0], SingleStreamModule) else ""
    kept, candidates = edge_counts(graph)
    lines = [f"ConnectivityNet: {graph.gate_words()}, {len(net.module_ids)} modules{form}, "
             f"{'x'.join(map(str, (net.in_channels, *net.input_size)))} in, {net.num_classes} out, "
             f"{kept} of {candidates} candidate edges kept"]
    for m in net.module_ids:
        d = graph.nodes[graph.branches(m)[0]]
        fan_in = sorted({sum(bool(e.get("active")) for *_, e in graph.gate_edges(n)) for n in graph.branches(m)})
        reads = (f"{'-'.join(map(str, dict.fromkeys((fan_in[0], fan_in[-1]))))} of {len(graph.candidates(m))} inputs"
                 if graph.candidates(m) else "the stem")
        at = f" at {d['resolution']}" if net.dims else ""  # a vector has no resolution
        lines.append(f"  module {m:>2}: {len(graph.branches(m))} x {d['block']} {d['in_channels']}->"
                     f"{d['out_channels']}{at}, {live[m]} live, each reads {reads}")
    if freezing_changes_outputs(net):
        lines.append(f"  parameters: {net.num_parameters() / 1e6:.3f}M (real gates: nothing to prune until frozen)")
    else:
        report = prune_dead_blocks(net, freeze=True)[1]
        lines.append(f"  parameters: {report.params_before / 1e6:.3f}M, {report.params_after / 1e6:.3f}M after "
                     f"pruning {report.blocks_before - report.blocks_after} dead blocks")
    return "\n".join(lines)
