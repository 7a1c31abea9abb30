"""Topologies: functions of keyword options that emit a :class:`~connlearn.graph.BranchGraph`, one file per
kind (``resnext``, ``dense``, ``neural-graph``), registered in :data:`TOPOLOGIES`."""

from __future__ import annotations

from typing import Any

from connlearn.errors import ConfigError
from connlearn.graph import CONV_INITS, RESIDUAL_INITS
from connlearn.registry import Registry
from connlearn.topologies.dense import dense
from connlearn.topologies.neural_graph import neural_graph
from connlearn.topologies.resnext import LAYOUTS, PRESETS, resnext

__all__ = ["CONV_INITS", "LAYOUTS", "PRESETS", "RESIDUAL_INITS", "TOPOLOGIES", "dense", "neural_graph",
           "resnext"]


def _check_topology(name: str, fn: Any) -> None:
    if not callable(fn):
        raise ConfigError(f"topology {name!r} must be a function of keyword options returning a BranchGraph")


TOPOLOGIES: Registry[Any] = Registry("topology", "connlearn.topologies", check=_check_topology)
TOPOLOGIES.register("resnext", resnext)
TOPOLOGIES.register("dense", dense)
TOPOLOGIES.register("neural-graph", neural_graph)
