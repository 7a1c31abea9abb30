"""Any one-branch module as a block kind: one module per branch, run in a loop."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn


class Looped:
    """A block kind of one plain module per branch, run in a loop: ``factory(in_ch, out_ch, stride, **params)``
    returns a module mapping ``[B, in_ch, H, W]`` to ``[B, out_ch, H', W']``. ``register_block("name",
    Looped(factory))``."""

    def __init__(self, factory: Callable[..., nn.Module], dims: tuple[int, ...] = (2,)) -> None:
        self.factory, self.dims = factory, dims

    def __call__(self, in_ch: int, out_ch: int, stride: int, branches: int, *, dims: int = 2,
                 **params: Any) -> LoopedBlock:
        return LoopedBlock([self.factory(in_ch, out_ch, stride, **params) for _ in range(branches)])

    def __repr__(self) -> str:
        return f"Looped({getattr(self.factory, '__name__', self.factory)!r})"


class LoopedBlock(nn.Module):
    """A block of one module per branch (see :class:`Looped`)."""

    def __init__(self, modules: Sequence[nn.Module]) -> None:
        super().__init__()
        self.branch_modules = nn.ModuleList(modules)
        self.branches = len(modules)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = x.chunk(self.branches, dim=1)
        return torch.cat([m(p) for m, p in zip(self.branch_modules, parts, strict=True)], dim=1)

    def init_residual_scale(self, scale: float) -> None:
        for m in self.branch_modules:
            m.init_residual_scale(scale)  # type: ignore[operator]

    def init_conv_scale(self, scale: float) -> None:
        for m in self.branch_modules:
            m.init_conv_scale(scale)  # type: ignore[operator]

    def select(self, indices: Sequence[int]) -> LoopedBlock:
        return type(self)([copy.deepcopy(self.branch_modules[i]) for i in indices])
