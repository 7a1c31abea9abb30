"""The bottleneck (He et al. 2016) batched over branches, and ResNeXt's aggregated form of it."""

from __future__ import annotations

import torch
from torch import nn

from connlearn.blocks.base import BranchBlock, conv, init_branch_convs, norm


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
