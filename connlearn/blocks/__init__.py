"""Block kinds: the residual functions F_j of a module's branches, batched across branches.

A block kind is called as ``kind(in_ch, out_ch, stride, branches, **params)`` and returns an ``nn.Module``
mapping ``[B, branches·in_ch, H, W]`` to ``[B, branches·out_ch, H/stride, W/stride]`` (branch-major
channels), with ``select(indices)`` (a copy holding those branches: pruning). A kind that works on other
inputs than images says so in ``dims`` (0: vectors ``[B, C]``, 1: signals ``[B, C, L]``, 2: images) and is
given the network's as the keyword ``dims`` where it is not 2. Optional: ``init_residual_scale(s)`` (start
every branch's output at ``s`` times its scale), ``init_conv_scale(s)`` (scale the convolutions before each
branch's last one) and ``single_stream(in_ch, out_ch, stride, branches, **params)`` (one module computing
all branches of one input as one stream, as ResNeXt does: what gate kind ``full`` compiles to).
:class:`BranchBlock` gives the first three to blocks whose parameters are stacked branch-major along dim 0;
:class:`Looped` adapts any one-branch module.
"""

from __future__ import annotations

import inspect
from typing import Any

from connlearn.blocks.base import BranchBlock, GroupedLinear, conv, init_branch_convs, norm
from connlearn.blocks.basic import Basic
from connlearn.blocks.bottleneck import Bottleneck, ResNeXtBottleneck
from connlearn.blocks.looped import Looped, LoopedBlock
from connlearn.blocks.node import Node
from connlearn.blocks.vector import Vector
from connlearn.errors import ConfigError
from connlearn.registry import Registry

__all__ = ["BLOCKS", "Basic", "Bottleneck", "BranchBlock", "GroupedLinear", "Looped", "LoopedBlock", "Node",
           "ResNeXtBottleneck", "Vector", "block_dims", "conv", "init_branch_convs", "norm", "takes"]


def takes(kind: Any, param: str) -> bool:
    """Whether the block kind ``kind`` takes the keyword parameter ``param`` (a topology passes ``width`` to
    the kinds that take it)."""
    if isinstance(kind, type) and issubclass(kind, BranchBlock):
        return param in kind.params
    target = kind.factory if isinstance(kind, Looped) else kind
    parameters = inspect.signature(target).parameters.values()
    return any(p.name == param or p.kind is p.VAR_KEYWORD for p in parameters)


def _check_kind(name: str, kind: Any) -> None:
    if not callable(kind):
        raise ConfigError(f"block kind {name!r} must be a BranchBlock subclass, a Looped(factory) or a callable "
                          f"(in_ch, out_ch, stride, branches, **params) returning an nn.Module; got {kind!r}")


BLOCKS: Registry[Any] = Registry("block kind", "connlearn.blocks", check=_check_kind)
BLOCKS.register("bottleneck", Bottleneck)
BLOCKS.register("basic", Basic)
BLOCKS.register("vector", Vector)
BLOCKS.register("node", Node)


def block_dims(kind: Any) -> tuple[int, ...]:
    """The input dimensionalities a block kind works on (a kind that does not say: images, 2)."""
    return tuple(getattr(kind, "dims", (2,)))
