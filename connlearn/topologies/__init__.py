"""Topologies: functions that emit a :class:`~connlearn.graph.BranchGraph`.

``register_topology(name, fn)`` adds one; packages can add them through the entry-point group
``connlearn.topologies``. A topology takes keyword arguments and returns a validated BranchGraph.
"""

from __future__ import annotations

from connlearn.registry import Registry
from connlearn.topologies.resnext import LAYOUTS, PRESETS, dense, resnext

TOPOLOGIES: Registry = Registry("topology", "connlearn.topologies")
TOPOLOGIES.register("resnext", resnext)
TOPOLOGIES.register("dense", dense)

__all__ = ["LAYOUTS", "PRESETS", "TOPOLOGIES", "dense", "resnext"]
