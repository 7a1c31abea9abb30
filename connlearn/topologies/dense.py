"""The DenseNet-style topology: a ResNeXt whose blocks may read every earlier module of their stage."""

from __future__ import annotations

from typing import Any

from connlearn.errors import ConfigError
from connlearn.gates import GATES
from connlearn.graph import BranchGraph
from connlearn.topologies.resnext import resnext


def dense(**options: Any) -> BranchGraph:
    """:func:`resnext` whose blocks may read every earlier module of their stage (same channels and
    resolution): the paper's proposed DenseNet-style skip connectivity. Takes :func:`resnext`'s options."""
    if GATES.get(options.get("gate", "topk")).single_stream:
        raise ConfigError(f"gate {options['gate']!r} is ResNeXt's connectivity: use the topology 'resnext'")
    return resnext(**options, dense=True)
