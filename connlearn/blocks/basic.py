"""The basic residual block (two 3x3 convolutions), batched across branches."""

from __future__ import annotations

import torch
from torch import nn

from connlearn.blocks.base import BranchBlock, conv, init_branch_conv
from connlearn.errors import check_int


class Basic(BranchBlock):
    """3x3 conv (stride) in→width → BN → ReLU → 3x3 conv width→out → BN, every BN per branch.

    Maps ``[B, branches·in_ch, H, W]`` to ``[B, branches·out_ch, H/stride, W/stride]``.
    It has no single-stream form, so ``gate="full"`` runs it as the multi-branch net with all gates on.
    """

    params = ("width",)
    residual_norm = "bn2"
    inner_convs = ("conv1",)

    def __init__(self, in_ch: int, out_ch: int, stride: int, branches: int, *, width: int) -> None:
        super().__init__(in_ch, out_ch, stride, branches, width=check_int("width", width, minimum=1))
        c = branches
        self.conv1 = conv(in_ch, width, 3, c, stride=stride)
        self.bn1 = nn.BatchNorm2d(c * width)
        self.conv2 = conv(width, out_ch, 3, c)
        self.bn2 = nn.BatchNorm2d(c * out_ch)
        self.relu = nn.ReLU(inplace=True)
        for layer in (self.conv1, self.conv2):
            init_branch_conv(layer, c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x)))))
