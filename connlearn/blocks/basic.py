"""The basic residual block (two 3x3 convolutions) batched over branches."""

from __future__ import annotations

import torch
from torch import nn

from connlearn.blocks.base import BranchBlock, conv, init_branch_convs, norm


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
