"""Block kinds: the residual functions F_j of the branches, batched across branches.

``register_block(name, kind)`` adds a kind (a :class:`BranchBlock` subclass, a :class:`Looped` adapter,
or any callable with the same signature); packages can add kinds through the entry-point group
``connlearn.blocks``.
"""

from __future__ import annotations

from connlearn.blocks.base import (
    DEFAULT_RESIDUAL_INIT,
    RESIDUAL_INITS,
    BranchBlock,
    Looped,
    LoopedBlock,
    check_residual_init,
    conv,
    init_residual_scale,
    residual_scale,
    scales_residual,
)
from connlearn.blocks.basic import Basic
from connlearn.blocks.bottleneck import Bottleneck, ResNeXtBottleneck
from connlearn.registry import Registry

BLOCKS: Registry = Registry("block", "connlearn.blocks")
BLOCKS.register("bottleneck", Bottleneck)
BLOCKS.register("basic", Basic)

__all__ = [
    "BLOCKS", "DEFAULT_RESIDUAL_INIT", "RESIDUAL_INITS", "Basic", "Bottleneck", "BranchBlock", "Looped",
    "LoopedBlock", "ResNeXtBottleneck", "check_residual_init", "conv", "init_residual_scale", "residual_scale",
    "scales_residual",
]
