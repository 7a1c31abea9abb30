"""What block kinds share: branch-batched convolutions and norms over 0, 1 or 2 dimensions, the Kaiming start
of one branch, and :class:`BranchBlock`, the base of blocks that stack their branches along dim 0."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar, cast

import torch
from torch import nn


def conv(in_ch: int, out_ch: int, kernel: int, branches: int, stride: int = 1, dims: int = 2) -> nn.Module:
    """A bias-free convolution applied to each branch separately (``groups = branches``) over ``dims``
    (1: signals ``[B, C, L]``, 2: images; 0: vectors ``[B, C]``, a grouped linear map)."""
    if dims == 0:
        return GroupedLinear(branches * in_ch, branches * out_ch, branches)
    layer = nn.Conv1d if dims == 1 else nn.Conv2d
    return layer(branches * in_ch, branches * out_ch, kernel, stride=stride, padding=kernel // 2, groups=branches,
                 bias=False)


def norm(channels: int, dims: int = 2) -> nn.Module:
    """The batch norm of ``dims``-dimensional activations."""
    return nn.BatchNorm2d(channels) if dims == 2 else nn.BatchNorm1d(channels)


class GroupedLinear(nn.Conv1d):
    """``groups`` bias-free linear maps side by side, ``[B, in] → [B, out]``: a 1-tap grouped Conv1d (its weight
    ``[out, in / groups, 1]`` branch-major, as every block stacks its branches)."""

    def __init__(self, in_features: int, out_features: int, groups: int) -> None:
        super().__init__(in_features, out_features, 1, groups=groups, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.unsqueeze(-1)).squeeze(-1)


def init_branch_convs(block: nn.Module) -> None:
    """Kaiming-normal (fan-out, ReLU) with ONE branch's fan-out for every grouped convolution of ``block``:
    C branches in one layer start from the law of C separate layers."""
    for layer in block.modules():
        if isinstance(layer, nn.Conv1d | nn.Conv2d):
            fan_out = layer.out_channels // layer.groups * math.prod(layer.kernel_size)
            nn.init.normal_(layer.weight, 0.0, math.sqrt(2.0 / fan_out))


class BranchBlock(nn.Module):
    """Base of blocks whose every parameter and buffer holds its branches one after another along dim 0."""

    #: Keyword parameters besides (in_ch, out_ch, stride, branches).
    params: ClassVar[tuple[str, ...]] = ()
    #: The last normalisation, whose weight scales each branch's output (``init_residual_scale``).
    residual_norm: ClassVar[str | None] = None
    #: The convolutions before each branch's last one (``init_conv_scale``).
    inner_convs: ClassVar[tuple[str, ...]] = ()
    #: The input dimensionalities it works on (0: vectors, 1: signals, 2: images), passed as ``dims``.
    dims: ClassVar[tuple[int, ...]] = (2,)

    def __init__(self, in_ch: int, out_ch: int, stride: int, branches: int, *, dims: int = 2, **params: Any) -> None:
        super().__init__()
        self.in_ch, self.out_ch, self.stride, self.branches, self.data_dims = in_ch, out_ch, stride, branches, dims
        self.block_params = params

    def init_residual_scale(self, scale: float) -> None:
        with torch.no_grad():
            cast(torch.Tensor, self.get_submodule(str(self.residual_norm)).weight).fill_(scale)

    def init_conv_scale(self, scale: float) -> None:
        with torch.no_grad():
            for name in self.inner_convs:
                cast(torch.Tensor, self.get_submodule(name).weight).mul_(scale)

    def select(self, indices: Sequence[int]) -> BranchBlock:
        """A copy holding only the branches ``indices`` (from 0, in that order)."""
        new = self._new(len(indices))
        state = {k: v.clone() if v.dim() == 0 else torch.cat([v.chunk(self.branches)[i] for i in indices])
                 for k, v in self.state_dict().items()}
        new.load_state_dict(state)
        return new.train(self.training)

    def _new(self, branches: int) -> BranchBlock:
        first = next(self.parameters(), None)
        with torch.random.fork_rng(devices=[]):  # its weights are overwritten: the global RNG is left alone
            dims = {"dims": self.data_dims} if self.data_dims != 2 else {}
            new = type(self)(self.in_ch, self.out_ch, self.stride, branches, **dims, **self.block_params)
        return new if first is None else new.to(first.device, first.dtype)

    def extra_repr(self) -> str:
        extra = "".join(f", {k}={v}" for k, v in self.block_params.items())
        return f"in_ch={self.in_ch}, out_ch={self.out_ch}, stride={self.stride}, branches={self.branches}{extra}"
