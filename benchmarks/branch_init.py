"""Train with ResNeXt's initial scale of the first two convolutions of every bottleneck branch.

A gated bottleneck initialises each branch's 1x1 and 3x3 convolution like a separate layer (Kaiming,
fan-out of one branch: w·k²), as C separate blocks would be. ResNeXt initialises the same layers as one
layer of C·w outputs (fan-out C·w·k²), so its weights start √C times smaller. With every input active
(K = C) the two networks differ in these layers only by that factor, and each of the layers is followed by
a batch norm, so the function is the same at any scale but plain SGD moves the larger weights by a smaller
angle: the gated layers start with about 1/C of ResNeXt's effective learning rate.

This runs ``connlearn train`` with one of the two laws swapped, after the usual initialisation (the same
draws, so a run pairs with the unchanged run of its seed), and records it in ``branch_init.json`` in the
run's folder:

- ``--law resnext``: the gated bottleneck's two layers divided by √C (ResNeXt's scale). The library's
  ``conv_init="resnext"`` (``--conv-init resnext``) is the same law; it multiplies by 1/√C instead of
  dividing, so the weights can differ in the last bit;
- ``--law branch``: ResNeXt's (``gate="full"``) two layers multiplied by √C (the gated scale), which no
  option of the library does: Fixed-Full is ResNeXt's own.

A resumed run applies the same scaling before loading its checkpoint, which overwrites it.

    python benchmarks/branch_init.py --law resnext --dataset cifar10 --gate random --K 8 --seed 3 --out runs/x ...
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import torch

from connlearn.blocks import Bottleneck, ResNeXtBottleneck
from connlearn.cli import build_parser
from connlearn.cli import main as connlearn_main

LAWS = {
    "resnext": (Bottleneck, -0.5, "gated conv1, conv2: ResNeXt's fan-out (C·w·k²), the per-branch draw / sqrt(C)"),
    "branch": (ResNeXtBottleneck, 0.5, "ResNeXt's conv1, conv2: one branch's fan-out (w·k²), its draw * sqrt(C)"),
}


def scale_first_two(cls: type, power: float) -> None:
    """Make ``cls`` multiply its conv1 and conv2 weights by C**power after its own initialisation."""
    original = cls.__init__

    def init(self, in_ch: int, out_ch: int, stride: int, branches: int, **params) -> None:
        original(self, in_ch, out_ch, stride, branches, **params)
        with torch.no_grad():
            for layer in (self.conv1, self.conv2):
                layer.weight.mul_(math.pow(branches, power))

    cls.__init__ = init


def main(argv: list[str]) -> int:
    if argv[:1] in (["-h"], ["--help"]):
        print(__doc__.strip() + "\n\nEvery other option is connlearn train's (connlearn train --help).")
        return 0
    if "--law" not in argv or "--out" not in argv:
        sys.exit(f"branch_init.py: give --law ({' or '.join(LAWS)}) and --out, the run's folder")
    i = argv.index("--law")
    law, argv = argv[i + 1], argv[:i] + argv[i + 2:]
    if law not in LAWS:
        sys.exit(f"branch_init.py: --law is {' or '.join(LAWS)}, not {law!r}")
    cls, power, text = LAWS[law]
    build_parser().parse_args(["train", *argv])  # a bad option fails before anything is written or changed
    out = Path(argv[argv.index("--out") + 1])
    out.mkdir(parents=True, exist_ok=True)
    (out / "branch_init.json").write_text(json.dumps({"law": law, "what": text}) + "\n")
    scale_first_two(cls, power)
    return connlearn_main(["train", *argv])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
