"""connlearn: learn how the branches of a multi-branch network connect, jointly with the weights.

GateConnect (Ahmed & Torresani, "Connectivity Learning in Multi-Branch Networks"): ResNeXt-style modules of C
parallel residual blocks, each block averaging K of the previous module's branch outputs, chosen by binary
gates drawn from learned real-valued gates. The data path: a topology emits a :class:`BranchGraph` (the IR),
:func:`from_graph` compiles it into a :class:`ConnectivityNet`, which trains in any loop (with
:class:`~connlearn.updater.GateUpdater`) or in :mod:`connlearn.train`; ``net.freeze()`` fixes each block's
top-K, :func:`~connlearn.prune.prune_dead_blocks` removes the blocks nothing reads, :mod:`connlearn.render`
draws the result.

    >>> net = connlearn.build("resnext", C=8, M=9, gate="topk", K=1)
"""

from __future__ import annotations

from typing import Any

import torch

from connlearn import estimators, prune, render, updater
from connlearn.blocks import BLOCKS, BranchBlock, Looped
from connlearn.errors import CheckpointError, ConfigError, ConnlearnError, DataError, DivergenceError, GraphError
from connlearn.gates import GATES, Gate
from connlearn.graph import BranchGraph, check_finite_gates
from connlearn.net import ConnectivityNet
from connlearn.prune import prune_dead_blocks, summary
from connlearn.topologies import PRESETS, TOPOLOGIES

__version__ = "0.2.0"


def build(topology: str = "resnext", *, C: int | None = None, M: int | None = None, K: int | None = None,
          gate: str | None = None, width: int | None = None, depth: int | None = None, preset: str | None = None,
          num_classes: int | None = None, seed: int | None = None, **options: Any) -> ConnectivityNet:
    """Build a network: ``topology`` (``list_topologies()``) emits the BranchGraph, which is compiled.

    Args:
        C: branches per module. M, or depth = 2 + 3M: modules. K: each block's fan-in (default C // 2).
        gate: ``topk`` (GateConnect, the default), ``real``, ``random`` (Fixed-Random), ``full`` (ResNeXt:
            compiled to its single stream) or another of ``list_gates()``.
        width: a branch's bottleneck width in the first stage. preset: e.g. ``cifar-29-8-8``
            (``list_presets()``). num_classes: outputs. seed: weights, gates and draws.
        **options: the topology's other options; for ``resnext`` and ``dense``: ``layout``, ``block``,
            ``block_params``, ``gate_init``, ``gate_options`` (the gate kind's knobs), ``stem_channels``,
            ``base_channels``, ``in_channels``, ``image_size``, ``residual_init``, ``conv_init``
            (``help(connlearn.topologies.resnext)``).

    Without options: the paper's Figure 3 model {D=29, w=8, C=8} for CIFAR-100. The global RNG is left alone.
    """
    given = {"C": C, "M": M, "K": K, "gate": gate, "width": width, "depth": depth, "preset": preset,
             "num_classes": num_classes, "seed": seed}
    with torch.device("cpu"):  # a graph holds plain values: none of its making runs on another device
        graph = TOPOLOGIES.get(topology)(**{k: v for k, v in given.items() if v is not None}, **options)
    return from_graph(graph)


def from_graph(graph: BranchGraph | str, *, seed: int | None = None) -> ConnectivityNet:
    """Compile a BranchGraph (or its JSON) into a network, weights from ``seed`` (default: the graph's own,
    which gives the weights ``build`` gave it). The global RNG is left alone."""
    graph = BranchGraph.from_json(graph) if isinstance(graph, str) else graph
    if not isinstance(graph, BranchGraph):
        raise ConfigError(f"from_graph takes a BranchGraph or its JSON, got {type(graph).__name__}")
    check_finite_gates(graph.validate(), "from_graph's graph")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(graph.seed if seed is None else seed)
        return ConnectivityNet(graph)


def register_block(name: str, kind: Any = None, *, overwrite: bool = False) -> Any:
    """Register a block kind: a BranchBlock subclass, a ``Looped(factory)``, or a callable ``(in_ch, out_ch,
    stride, branches, **params)`` returning a module (see :mod:`connlearn.blocks`). Without ``kind``, a
    decorator."""
    return BLOCKS.register(name, kind, overwrite=overwrite)


def register_topology(name: str, fn: Any = None, *, overwrite: bool = False) -> Any:
    """Register a topology: a function of keyword options returning a BranchGraph."""
    return TOPOLOGIES.register(name, fn, overwrite=overwrite)


def register_gate(name: str, cls: Any = None, *, overwrite: bool = False) -> Any:
    """Register a gate kind: a :class:`Gate` subclass (see :mod:`connlearn.gates`)."""
    return GATES.register(name, cls, overwrite=overwrite)


def list_blocks(pattern: str = "*") -> list[str]:
    return BLOCKS.names(pattern)


def list_topologies(pattern: str = "*") -> list[str]:
    return TOPOLOGIES.names(pattern)


def list_gates(pattern: str = "*") -> list[str]:
    return GATES.names(pattern)


def list_presets(pattern: str = "*") -> list[str]:
    import fnmatch

    return sorted(p for p in PRESETS if fnmatch.fnmatchcase(p, pattern))


__all__ = [
    "BranchBlock", "BranchGraph", "CheckpointError", "ConfigError", "ConnectivityNet", "ConnlearnError", "DataError",
    "DivergenceError", "Gate", "GraphError", "Looped", "__version__", "build", "estimators", "from_graph",
    "list_blocks", "list_gates", "list_presets", "list_topologies", "prune", "prune_dead_blocks", "register_block",
    "register_gate", "register_topology", "render", "summary", "updater",
]
