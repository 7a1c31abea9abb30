"""Block kinds: the residual functions F_j of the branches, batched across branches.

``register_block(name, kind)`` adds a kind: a :class:`BranchBlock` subclass, a :class:`Looped` adapter, or
any callable ``(in_ch, out_ch, stride, branches, **params)`` that returns an ``nn.Module`` following the
block protocol of :mod:`connlearn.blocks.base` (``select``/``merge`` are needed for pruning and
``to_engine`` only). Packages can add kinds through the entry-point group ``connlearn.blocks``.
"""

from __future__ import annotations

from connlearn.blocks.base import (
    CONV_INITS,
    DEFAULT_CONV_INIT,
    DEFAULT_RESIDUAL_INIT,
    RESIDUAL_INITS,
    BranchBlock,
    Looped,
    LoopedBlock,
    block_parameters,
    build_or_explain,
    check_block_kind,
    check_conv_init,
    check_residual_init,
    conv,
    device_and_dtype,
    init_conv_scale,
    init_residual_scale,
    make_block,
    require_block_method,
    residual_scale,
    scales_residual,
    starts_of,
)
from connlearn.blocks.basic import Basic
from connlearn.blocks.bottleneck import Bottleneck, ResNeXtBottleneck
from connlearn.registry import Registry

BLOCKS: Registry = Registry("block", "connlearn.blocks", check=check_block_kind)
BLOCKS.register("bottleneck", Bottleneck)
BLOCKS.register("basic", Basic)

__all__ = [
    "BLOCKS", "CONV_INITS", "DEFAULT_CONV_INIT", "DEFAULT_RESIDUAL_INIT", "RESIDUAL_INITS", "Basic", "Bottleneck",
    "BranchBlock", "Looped", "LoopedBlock", "ResNeXtBottleneck", "block_parameters", "build_or_explain",
    "check_block_kind",
    "check_conv_init", "check_residual_init", "conv", "device_and_dtype", "init_conv_scale", "init_residual_scale",
    "make_block", "require_block_method", "residual_scale", "scales_residual", "starts_of",
]
