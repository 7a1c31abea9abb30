"""The vector bottleneck: linear maps and batch norms per branch, for inputs without spatial axes."""

from __future__ import annotations

import torch
from torch import nn

from connlearn.blocks.base import BranchBlock, GroupedLinear, init_branch_convs


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
