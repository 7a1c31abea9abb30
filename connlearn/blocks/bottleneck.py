"""The reference residual bottleneck (He et al. 2016), batched across branches."""

from __future__ import annotations

import torch
from torch import nn

from connlearn.blocks.base import BranchBlock, conv, init_branch_conv
from connlearn.errors import check_int


class Bottleneck(BranchBlock):
    """1x1 conv → BN → ReLU → 3x3 conv (stride) → BN → ReLU → 1x1 conv → BN, every BN per branch.

    Maps ``[B, branches·in_ch, H, W]`` to ``[B, branches·out_ch, H/stride, W/stride]``; ``width`` is the
    bottleneck width w of one branch. The residual shortcut is added by the module, not here.
    """

    params = ("width",)
    residual_norm = "bn3"
    inner_convs = ("conv1", "conv2")

    def __init__(self, in_ch: int, out_ch: int, stride: int, branches: int, *, width: int) -> None:
        super().__init__(in_ch, out_ch, stride, branches, width=check_int("width", width, minimum=1))
        c = branches
        self.conv1 = conv(in_ch, width, 1, c)
        self.bn1 = nn.BatchNorm2d(c * width)
        self.conv2 = conv(width, width, 3, c, stride=stride)
        self.bn2 = nn.BatchNorm2d(c * width)
        self.conv3 = conv(width, out_ch, 1, c)
        self.bn3 = nn.BatchNorm2d(c * out_ch)
        self.relu = nn.ReLU(inplace=True)
        for layer in (self.conv1, self.conv2, self.conv3):
            init_branch_conv(layer, c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.relu(self.bn2(self.conv2(x)))
        return self.bn3(self.conv3(x))

    @staticmethod
    def single_stream(in_ch: int, out_ch: int, stride: int, branches: int, *, width: int) -> nn.Module:
        """The genuine ResNeXt residual function of ``branches`` bottlenecks: one stream, grouped 3x3."""
        return ResNeXtBottleneck(in_ch, out_ch, stride, branches, width=width)


class ResNeXtBottleneck(nn.Module):
    """ResNeXt's aggregated bottleneck (Xie et al. 2017, form (c)): 1x1 conv in→C·w, BN, ReLU, grouped 3x3
    conv (groups = C), BN, ReLU, 1x1 conv C·w→out, BN; one BN per layer."""

    def __init__(self, in_ch: int, out_ch: int, stride: int, branches: int, *, width: int) -> None:
        super().__init__()
        inner = branches * width
        self.conv1 = nn.Conv2d(in_ch, inner, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(inner)
        self.conv2 = nn.Conv2d(inner, inner, 3, stride=stride, padding=1, groups=branches, bias=False)
        self.bn2 = nn.BatchNorm2d(inner)
        self.conv3 = nn.Conv2d(inner, out_ch, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_ch)
        self.relu = nn.ReLU(inplace=True)
        for layer in (self.conv1, self.conv2, self.conv3):
            nn.init.kaiming_normal_(layer.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.relu(self.bn2(self.conv2(x)))
        return self.bn3(self.conv3(x))
