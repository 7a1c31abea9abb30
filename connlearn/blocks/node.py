"""The node of a node graph: norm → ReLU → 3x3 convolution, batched over nodes."""

from __future__ import annotations

import torch
from torch import nn

from connlearn.blocks.base import BranchBlock, conv, init_branch_convs, norm


class Node(BranchBlock):
    """Batch norm → ReLU → 3x3 conv in→out (stride), every layer per node (one channel: a depthwise 3x3), as
    Discovering Neural Wirings' static graphs compute each node."""

    dims = (1, 2)

    def __init__(self, in_ch: int, out_ch: int, stride: int, branches: int, *, dims: int = 2) -> None:
        super().__init__(in_ch, out_ch, stride, branches, dims=dims)
        self.bn, self.relu = norm(branches * in_ch, dims), nn.ReLU(inplace=True)
        self.conv = conv(in_ch, out_ch, 3, branches, stride=stride, dims=dims)
        init_branch_convs(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(self.relu(self.bn(x)))
