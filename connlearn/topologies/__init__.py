"""Topologies: functions that emit a :class:`~connlearn.graph.BranchGraph`.

``register_topology(name, fn)`` adds one; packages can add them through the entry-point group
``connlearn.topologies``. A topology takes keyword arguments and returns a validated BranchGraph.
"""

from __future__ import annotations

import inspect
from typing import Any

from connlearn.errors import ConfigTypeError
from connlearn.registry import Registry
from connlearn.topologies.resnext import LAYOUTS, PRESETS, dense, resnext


def check_topology(name: str, fn: Any) -> Any:
    """``fn`` if it can be the topology ``name`` (a callable); else a clear error."""
    if not callable(fn):
        raise ConfigTypeError(f"topology {name!r}: {fn!r} is not callable; a topology is a function of keyword "
                              "arguments that returns a connlearn.graph.BranchGraph")
    try:
        inspect.signature(fn)
    except (TypeError, ValueError):
        raise ConfigTypeError(f"topology {name!r}: {fn!r} has no signature to read its options from; a topology "
                              "is a function of keyword arguments that returns a connlearn.graph.BranchGraph") from None
    return fn


TOPOLOGIES: Registry = Registry("topology", "connlearn.topologies", check=check_topology)
TOPOLOGIES.register("resnext", resnext)
TOPOLOGIES.register("dense", dense)

__all__ = ["LAYOUTS", "PRESETS", "TOPOLOGIES", "check_topology", "dense", "resnext"]
