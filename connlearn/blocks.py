"""Block kinds: the residual functions F_j of a module's branches, batched across branches.

A block kind is called as ``kind(in_ch, out_ch, stride, branches, **params)`` and returns an ``nn.Module``
mapping ``[B, branches·in_ch, H, W]`` to ``[B, branches·out_ch, H/stride, W/stride]`` (branch-major
channels), with ``select(indices)`` (a copy holding those branches: pruning) and the classmethod
``merge(blocks)`` (one block of all their branches: changing engines). A kind that works on other inputs than
images says so in ``dims`` (0: vectors ``[B, C]``, 1: signals ``[B, C, L]``, 2: images) and is given the
network's as the keyword ``dims`` where it is not 2. Optional: ``init_residual_scale(s)``
(start every branch's output at ``s`` times its scale) and ``init_conv_scale(s)`` (scale the convolutions
before each branch's last one). :class:`BranchBlock` gives all four to blocks whose parameters are stacked
branch-major along dim 0; :class:`Looped` adapts any one-branch module.
"""

from __future__ import annotations

import copy
import inspect
import math
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, cast

import torch
from torch import nn

from connlearn.errors import ConfigError
from connlearn.registry import Registry


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
    C branches in one layer start from the law of C separate layers (the reference engine's)."""
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

    @classmethod
    def merge(cls, blocks: Sequence[BranchBlock]) -> BranchBlock:
        """One block holding the branches of ``blocks``, in order."""
        new = blocks[0]._new(sum(b.branches for b in blocks))
        states = [b.state_dict() for b in blocks]
        new.load_state_dict({k: v.clone() if v.dim() == 0 else torch.cat([s[k] for s in states])
                             for k, v in states[0].items()})
        return new.train(blocks[0].training)

    def _new(self, branches: int) -> BranchBlock:
        first = next(self.parameters(), None)
        with torch.random.fork_rng(devices=[]):  # its weights are overwritten: the global RNG is left alone
            dims = {"dims": self.data_dims} if self.data_dims != 2 else {}
            new = type(self)(self.in_ch, self.out_ch, self.stride, branches, **dims, **self.block_params)
        return new if first is None else new.to(first.device, first.dtype)

    def extra_repr(self) -> str:
        extra = "".join(f", {k}={v}" for k, v in self.block_params.items())
        return f"in_ch={self.in_ch}, out_ch={self.out_ch}, stride={self.stride}, branches={self.branches}{extra}"


class Bottleneck(BranchBlock):
    """1x1 conv → BN → ReLU → kxk conv (stride) → BN → ReLU → 1x1 conv → BN, every BN per branch; ``width``
    is one branch's bottleneck width, ``kernel`` the middle convolution's (3: He et al. 2016). The module adds
    the shortcut."""

    params = ("width", "kernel")
    residual_norm = "bn3"
    inner_convs = ("conv1", "conv2")
    dims = (1, 2)

    def __init__(self, in_ch: int, out_ch: int, stride: int, branches: int, *, width: int, kernel: int = 3,
                 dims: int = 2) -> None:
        super().__init__(in_ch, out_ch, stride, branches, dims=dims, width=width, kernel=kernel)
        c = branches
        self.conv1, self.bn1 = conv(in_ch, width, 1, c, dims=dims), norm(c * width, dims)
        self.conv2, self.bn2 = conv(width, width, kernel, c, stride=stride, dims=dims), norm(c * width, dims)
        self.conv3, self.bn3 = conv(width, out_ch, 1, c, dims=dims), norm(c * out_ch, dims)
        self.relu = nn.ReLU(inplace=True)
        init_branch_convs(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.relu(self.bn2(self.conv2(x)))
        return self.bn3(self.conv3(x))

    @staticmethod
    def single_stream(in_ch: int, out_ch: int, stride: int, branches: int, *, width: int,
                      kernel: int = 3, dims: int = 2) -> nn.Module:
        """ResNeXt's own form of ``branches`` bottlenecks: one stream with a grouped kxk convolution."""
        return ResNeXtBottleneck(in_ch, out_ch, stride, branches, width=width, kernel=kernel, dims=dims)


class ResNeXtBottleneck(nn.Module):
    """ResNeXt's aggregated bottleneck (Xie et al. 2017, form (c)): 1x1 in→C·w, grouped kxk (groups C; 3x3 in
    the paper), 1x1 C·w→out, one BN per layer (over signals where ``dims`` is 1)."""

    def __init__(self, in_ch: int, out_ch: int, stride: int, branches: int, *, width: int, kernel: int = 3,
                 dims: int = 2) -> None:
        super().__init__()
        inner, Conv = branches * width, nn.Conv1d if dims == 1 else nn.Conv2d
        self.conv1, self.bn1 = Conv(in_ch, inner, 1, bias=False), norm(inner, dims)
        self.conv2 = Conv(inner, inner, kernel, stride=stride, padding=kernel // 2, groups=branches, bias=False)
        self.bn2 = norm(inner, dims)
        self.conv3, self.bn3 = Conv(inner, out_ch, 1, bias=False), norm(out_ch, dims)
        self.relu = nn.ReLU(inplace=True)
        for layer in (self.conv1, self.conv2, self.conv3):
            nn.init.kaiming_normal_(layer.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.relu(self.bn2(self.conv2(x)))
        return self.bn3(self.conv3(x))


class Basic(BranchBlock):
    """3x3 conv (stride) in→width → BN → ReLU → 3x3 conv width→out → BN, every BN per branch."""

    params = ("width",)
    residual_norm = "bn2"
    inner_convs = ("conv1",)
    dims = (1, 2)

    def __init__(self, in_ch: int, out_ch: int, stride: int, branches: int, *, width: int, dims: int = 2) -> None:
        super().__init__(in_ch, out_ch, stride, branches, dims=dims, width=width)
        c = branches
        self.conv1, self.bn1 = conv(in_ch, width, 3, c, stride=stride, dims=dims), norm(c * width, dims)
        self.conv2, self.bn2 = conv(width, out_ch, 3, c, dims=dims), norm(c * out_ch, dims)
        self.relu = nn.ReLU(inplace=True)
        init_branch_convs(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x)))))


class Vector(BranchBlock):
    """The bottleneck of vectors ``[B, in]``: Linear in→width → BN → ReLU → Linear width→width → BN → ReLU
    → Linear width→out → BN, every layer per branch (the 0-D form, for tabular data and embeddings)."""

    params = ("width",)
    residual_norm = "bn3"
    inner_convs = ("fc1", "fc2")
    dims = (0,)

    def __init__(self, in_ch: int, out_ch: int, stride: int, branches: int, *, width: int, dims: int = 0) -> None:
        super().__init__(in_ch, out_ch, stride, branches, dims=dims, width=width)
        c = branches
        self.fc1, self.bn1 = GroupedLinear(c * in_ch, c * width, c), nn.BatchNorm1d(c * width)
        self.fc2, self.bn2 = GroupedLinear(c * width, c * width, c), nn.BatchNorm1d(c * width)
        self.fc3, self.bn3 = GroupedLinear(c * width, c * out_ch, c), nn.BatchNorm1d(c * out_ch)
        self.relu = nn.ReLU(inplace=True)
        init_branch_convs(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.bn1(self.fc1(x)))
        x = self.relu(self.bn2(self.fc2(x)))
        return self.bn3(self.fc3(x))


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
        return LoopedBlock([copy.deepcopy(self.branch_modules[i]) for i in indices])

    @classmethod
    def merge(cls, blocks: Sequence[LoopedBlock]) -> LoopedBlock:
        return LoopedBlock([copy.deepcopy(m) for b in blocks for m in b.branch_modules])


def has_start(block: nn.Module, hook: str) -> bool:
    """Whether ``block`` has the start ``hook`` (``init_residual_scale`` or ``init_conv_scale``) to call."""
    if isinstance(block, LoopedBlock):
        return all(has_start(m, hook) for m in block.branch_modules)
    if isinstance(block, BranchBlock):
        return bool(block.residual_norm if hook == "init_residual_scale" else block.inner_convs)
    return callable(getattr(block, hook, None))


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


def block_dims(kind: Any) -> tuple[int, ...]:
    """The input dimensionalities a block kind works on (a kind that does not say: images, 2)."""
    return tuple(getattr(kind, "dims", (2,)))
