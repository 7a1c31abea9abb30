"""The vector form on tabular data: scikit-learn's handwritten digits as 64-vectors, a gated ResNeXt of vector
bottlenecks (Fixed-Full, Fixed-Random, learned with ``magnitude``) against a plain MLP of the same parameters,
over paired seeds.

    pip install scikit-learn
    python examples/tabular.py --out runs/tabular --seeds 0 1 2 3 4

The 1,797 digits are split 80/20, stratified, with a fixed seed, and packed as arrays; every feature is
standardised by the training split's mean and std. ``connlearn compare`` trains the gated arms; the MLP
(two hidden ReLU layers with batch norm, sized to the Fixed-Random network's parameters) trains on the same
batches with the same schedule: SGD with momentum 0.9 and weight decay 5e-4 at the phases' learning rates.
The table goes to ``OUT/results.md``.
"""

import argparse
import json
import math
from pathlib import Path

import numpy as np
import torch
from torch import nn

import connlearn
from connlearn.cli import main as connlearn_command
from connlearn.train import get_recipe
from connlearn.train.data import ArrayDataset, load_packed, pack_arrays
from connlearn.train.loaders import make_loaders

ARMS = ("full gate=full", "random gate=random K=4", "learned gate=magnitude K=4")
NETWORK = {"M": 3, "C": 8, "width": 4, "base_channels": 16, "stem_channels": 16}
BATCH = 32


def digits(path: Path) -> None:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    train_x, test_x, train_y, test_y = train_test_split(x, y, test_size=0.2, stratify=y, random_state=0)
    names = [str(d) for d in range(10)]
    pack_arrays(path, ArrayDataset(train_x, train_y, names), ArrayDataset(test_x, test_y, names))


def mlp(features: int, classes: int, budget: int) -> nn.Module:
    """Two hidden ReLU layers of one width with batch norm, the widest whose parameters stay within ``budget``."""
    def build(h: int) -> nn.Module:
        return nn.Sequential(nn.Linear(features, h), nn.BatchNorm1d(h), nn.ReLU(), nn.Linear(h, h),
                             nn.BatchNorm1d(h), nn.ReLU(), nn.Linear(h, classes))

    def count(h: int) -> int:  # the parameters of build(h): two Linear+BN layers and the classifier
        return (features + 1) * h + 2 * h + (h + 1) * h + 2 * h + (h + 1) * classes

    return build(max(h for h in range(1, 4096) if count(h) <= budget))


def train_mlp(data: Path, seed: int, epochs: int, budget: int) -> tuple[float, int]:
    train, test = load_packed(data)
    loader, evaluation = make_loaders(train, test, BATCH, device="cpu", seed=seed)
    torch.manual_seed(seed)
    net = mlp(train.channels, train.num_classes, budget)
    recipe = get_recipe("cifar").scaled(epochs)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=recipe.weight_decay)
    for epoch in range(epochs):
        opt.param_groups[0]["lr"] = recipe.phase_at(epoch)[1].lr
        net.train()
        for x, y in loader.epoch(epoch):
            opt.zero_grad()
            nn.functional.cross_entropy(net(x), y).backward()
            opt.step()
    net.eval()
    with torch.no_grad():
        correct = sum(int((net(x).argmax(1) == y).sum()) for x, y in evaluation.epoch(0))
    return 100.0 * correct / len(test), sum(p.numel() for p in net.parameters())


def run(out: Path, seeds: list[str], epochs: int) -> None:
    data = out / "digits.npz"
    if not data.exists():
        digits(data)
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in NETWORK.items()]
    arms = [a for arm in ARMS for a in ("--arm", arm)]
    connlearn_command(["compare", *arms, "--baseline", "random", "--seeds", *seeds, "--dataset", "custom", "--data",
                       str(data), "--epochs", str(epochs), "--batch-size", str(BATCH), "--eval-every", str(epochs),
                       *flags, "--no-progress", "--out", str(out / "runs")])
    report = json.loads((out / "runs" / "report.json").read_text())
    budget = connlearn.build(gate="random", K=4, in_channels=64, input_size=(), num_classes=10,
                             **NETWORK).num_parameters()
    results = [train_mlp(data, int(s), epochs, budget) for s in seeds]
    top1 = [r[0] for r in results]
    random = report["arms"]["random"]["top1"]
    diffs = [t - r for t, r in zip(top1, random, strict=True)]
    mean, sd = float(np.mean(top1)), float(np.std(top1, ddof=1)) if len(top1) > 1 else 0.0
    rows = ["| arm | parameters | test top-1 (%), mean ± sd | against Fixed-Random, paired |",
            "| --- | --- | --- | --- |"]
    for name in ("full", "random", "learned"):
        arm, against = report["arms"][name], report["against"].get(name)
        paired = "" if against is None else f"{against['mean']:+.2f} ± {against.get('sd', 0):.2f}"
        params = json.loads((out / "runs" / f"{name}-s{seeds[0]}" / "summary.json").read_text())["params_train"]
        rows.append(f"| {name} | {params} | {arm['mean']:.2f} ± {arm['sd'] or 0:.2f} | {paired} |")
    rows.append(f"| MLP (2 hidden layers) | {results[0][1]} | {mean:.2f} ± {sd:.2f} | "
                f"{np.mean(diffs):+.2f} ± {np.std(diffs, ddof=1) if len(diffs) > 1 else math.nan:.2f} |")
    table = "\n".join(rows) + "\n"
    (out / "results.md").write_text(table)
    print(table)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/tabular"))
    parser.add_argument("--seeds", nargs="+", default=["0", "1", "2", "3", "4"])
    parser.add_argument("--epochs", type=int, default=64)
    args = parser.parse_args()
    run(args.out, args.seeds, args.epochs)
