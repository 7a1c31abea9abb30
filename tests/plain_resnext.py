"""A plainly written CIFAR ResNeXt (Xie et al. 2017), independent of connlearn.

It serves as the oracle that ``gate="full"`` must equal (tests/test_laws.py) and as the baseline of
the speed benchmark. Its parameters are registered in the same order as connlearn's single-stream
ResNeXt, so a state dict can be copied across by position.
"""

from __future__ import annotations

import torch
from torch import nn


class PlainBottleneck(nn.Module):
    """ResNeXt CIFAR bottleneck as published: reduce, grouped conv, expand, projection shortcut."""

    def __init__(self, cin: int, cout: int, stride: int, cardinality: int, width: int) -> None:
        super().__init__()
        d = cardinality * width
        self.conv_reduce = nn.Conv2d(cin, d, 1, bias=False)
        self.bn_reduce = nn.BatchNorm2d(d)
        self.conv_conv = nn.Conv2d(d, d, 3, stride, 1, groups=cardinality, bias=False)
        self.bn = nn.BatchNorm2d(d)
        self.conv_expand = nn.Conv2d(d, cout, 1, bias=False)
        self.bn_expand = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if cin != cout or stride != 1:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = torch.relu(self.bn_reduce(self.conv_reduce(x)))
        b = torch.relu(self.bn(self.conv_conv(b)))
        b = self.bn_expand(self.conv_expand(b))
        return torch.relu(self.shortcut(x) + b)


class PlainResNeXt(nn.Module):
    """Three stages of ``blocks_per_stage`` bottlenecks; stage s outputs ``base·2^s`` channels with
    bottleneck width ``width·2^s`` per group."""

    def __init__(self, cardinality: int, width: int, blocks_per_stage: int, stem: int, base: int,
                 classes: int) -> None:
        super().__init__()
        self.conv_1_3x3 = nn.Conv2d(3, stem, 3, 1, 1, bias=False)
        self.bn_1 = nn.BatchNorm2d(stem)
        layers, cin = [], stem
        for s in range(3):
            for p in range(blocks_per_stage):
                layers.append(PlainBottleneck(cin, base * 2**s, 2 if s and not p else 1, cardinality, width * 2**s))
                cin = base * 2**s
        self.stages = nn.Sequential(*layers)
        self.classifier = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn_1(self.conv_1_3x3(x)))
        x = self.stages(x)
        return self.classifier(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))
