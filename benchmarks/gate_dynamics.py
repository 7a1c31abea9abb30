"""How the real gates move during phase 1, under each gate-gradient rule: a small controlled experiment.

Phase 1 only (weights lr 0.1, gates lr 0.2, SGD momentum 0.9, the paper's rule or a remedy), the same
network, seed, data order and augmentation for every rule; gate snapshots every ``--snapshot-every`` steps;
evaluated on a class-balanced validation split held out of the CIFAR-10 training set (never the test
set). Writes ``OUT/<rule>/`` (log, snapshots, checkpoints), ``OUT/dynamics.md`` (a table of the gate
statistics at the end of phase 1 and the validation top-1) and ``OUT/gate_dynamics.png``.

    python benchmarks/gate_dynamics.py --epochs 6 --train-subset 5000 --out runs/gates

Questions it answers: do the gates of a row drift together towards the clip bound (a flat sampling
distribution), how far does the within-row spread grow, how many blocks still change their top-K?
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from matplotlib.figure import Figure

import connlearn
from connlearn.data import load_dataset, make_loaders
from connlearn.plots import gate_statistics
from connlearn.recipe import Phase, Recipe
from connlearn.train import Trainer, read_jsonl
from connlearn.updater import GRAD_MODES


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", help="CIFAR-10 location (else $CONNLEARN_DATA, else download)")
    parser.add_argument("--rules", nargs="+", default=list(GRAD_MODES), choices=GRAD_MODES)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--train-subset", type=int, default=5000)
    parser.add_argument("--val-split", type=int, default=5000)
    parser.add_argument("--gate-lr", type=float, default=0.2)
    parser.add_argument("--snapshot-every", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--net", default="M=3,C=8,K=4,width=2,base_channels=16,stem_channels=16",
                        help="build() options of the network (default: a small {C=8, K=4} CPU-sized net)")
    parser.add_argument("--out", default="runs/gates")
    args = parser.parse_args()
    options = {k: int(v) for k, v in (kv.split("=") for kv in args.net.split(","))}
    train, _ = load_dataset("cifar10", args.data)
    train, val = train.split(args.val_split)
    train = train.subset(args.train_subset)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    recipe = Recipe("phase1", [Phase(args.epochs, 0.1, gate_lr=args.gate_lr)])
    out = Path(args.out)
    rows, stats = [], {}
    for rule in args.rules:
        loaders = make_loaders(train, val, recipe.batch_size, device=device, seed=args.seed)
        net = connlearn.build(preset="cifar-20-4-8", num_classes=10, seed=args.seed, **options)
        trainer = Trainer(net, *loaders, recipe, out_dir=out / rule, device=device, gate_grad=rule,
                          snapshot_every=args.snapshot_every, progress=False)
        history = trainer.fit()
        stats[rule] = gate_statistics(read_jsonl(out / rule / "gates.jsonl"), net.K)
        last, end = history[-1], stats[rule][-1]
        changed = [s["topk_changed"] for s in stats[rule][-5:] if s["topk_changed"] is not None]
        changed_share = sum(changed) / len(changed) if changed else float("nan")
        rows.append(f"| {rule} | {end['mean']:.3f} | {end['row_std']:.3f} | {end['frac_at_1']:.3f} | "
                    f"{end['frac_at_0']:.3f} | {last['gate_entropy']:.3f} | {changed_share:.3f} | "
                    f"{last['test_top1']:.2f} |")
    lines = [f"phase 1 only, {args.epochs} epochs of {len(train)} images, gate lr {args.gate_lr}, seed {args.seed}, "
             f"net {args.net}; validation split of {len(val)} training images; {device}", "",
             "| rule | gate mean | within-row std | at 1 | at 0 | sampling entropy (uniform: "
             f"{torch.log(torch.tensor(float(options.get('C', 8)))).item():.3f}) | top-K changed (last 5 snapshots) "
             "| val top-1 |", "| --- | --- | --- | --- | --- | --- | --- | --- |", *rows]
    (out / "dynamics.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    fig = Figure(figsize=(10, 7), layout="constrained")
    axes = fig.subplots(2, 2)
    for rule, series in stats.items():
        epochs = [s["epoch"] for s in series]
        for ax, key, title in zip(axes.flat, ("mean", "row_std", "frac_at_1", "topk_changed"),
                                  ("mean real gate", "mean within-row std", "share of gates at 1",
                                   "share of blocks whose top-K changed"), strict=True):
            ax.plot(epochs, [s[key] for s in series], label=rule)
            ax.set_title(title)
            ax.set_xlabel("epoch")
    axes.flat[0].legend()
    fig.savefig(out / "gate_dynamics.png", dpi=110)


if __name__ == "__main__":
    main()
