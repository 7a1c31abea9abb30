"""How the real gates move during phase 1, under each gate-gradient rule: a small controlled experiment.

Phase 1 only (weights lr 0.1, gates lr 0.2, SGD momentum 0.9, the paper's rule or a remedy), the same
network, seed, data order and augmentation for every rule; gate snapshots every ``--snapshot-every`` steps;
evaluated on a class-balanced validation split held out of the CIFAR-10 training set (never the test
set). Writes ``OUT/<rule>/`` (log, snapshots, checkpoints), ``OUT/dynamics.md`` (a table of the gate
statistics at the end of phase 1 and the validation top-1) and ``OUT/gate_dynamics.png``.

    python benchmarks/gate_dynamics.py --epochs 6 --train-subset 5000 --out runs/gates
    python benchmarks/gate_dynamics.py --runs runs/sweep30/topk4-s0 runs/sweep30/topk1-s0 --out runs/dyn

Questions it answers: do the gates of a row drift together towards the clip bound (a flat sampling
distribution), how far does the within-row spread grow, how many blocks still change their top-K, and from
which epoch on is the top-K the one phase 1 ends with?
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
from pathlib import Path

import attrs
import numpy as np
import torch
from matplotlib.figure import Figure

import connlearn
from connlearn.files import read_jsonl
from connlearn.plots import gate_statistics, settled_epoch
from connlearn.topologies import RESIDUAL_INITS
from connlearn.train.checkpoint import net_from_checkpoint
from connlearn.train.data import load_dataset
from connlearn.train.loaders import BatchLoader, make_loaders
from connlearn.train.recipe import Phase, Recipe
from connlearn.train.trainer import Trainer
from connlearn.updater import GRAD_MODES


def movement(snapshots: list[dict]) -> dict[str, float]:
    """How the gates moved from the first snapshot to the last, split into the mean of each row (a block's
    gates rising or falling together, which sampling ignores) and the deviations from it (the within-row
    structure that sampling follows).

    ``drift`` and ``structure`` are the mean absolute net moves per gate entry of the two parts;
    ``drift_persistence`` and ``structure_persistence`` divide a net move by the path travelled between
    consecutive snapshots: 1 when every step went the same way, near 0 for a random walk (NaN when nothing
    moved).
    """
    parts: dict[str, list[np.ndarray]] = {"drift": [], "structure": []}
    for r in snapshots:
        mean_parts, dev_parts = [], []
        for m in sorted(r["gates"], key=int):
            a = np.asarray(r["gates"][m], dtype=float)
            row_mean = np.broadcast_to(a.mean(axis=1, keepdims=True), a.shape)
            mean_parts.append(row_mean.ravel())
            dev_parts.append((a - row_mean).ravel())
        parts["drift"].append(np.concatenate(mean_parts))
        parts["structure"].append(np.concatenate(dev_parts))
    result = {}
    for name, values in parts.items():
        path = np.stack(values)
        net = np.abs(path[-1] - path[0])
        travelled = np.abs(np.diff(path, axis=0)).sum()
        result[name] = float(net.mean())
        result[f"{name}_persistence"] = float(net.sum() / travelled) if travelled > 0 else float("nan")
    return result


def _row(label: str, stats: list[dict], last: dict, moved: dict[str, float]) -> str:
    end = stats[-1]
    changed = [s["topk_changed"] for s in stats[-5:] if s["topk_changed"] is not None]
    changed_share = sum(changed) / len(changed) if changed else float("nan")
    return (f"| {label} | {end['epoch']:.1f} | {end['mean']:.3f} | {end['row_std']:.3f} | {end['frac_at_1']:.3f} | "
            f"{end['frac_at_0']:.3f} | {moved['drift']:.3f} ({moved['drift_persistence']:.2f}) | "
            f"{moved['structure']:.3f} ({moved['structure_persistence']:.2f}) | {last['gate_entropy']:.3f} | "
            f"{_share(last.get('drawn_topk_share'))} | {changed_share:.3f} | {_settled(stats)} | "
            f"{last['test_top1']:.2f} |")


def _settled(stats: list[dict]) -> str:
    """The epoch from which on the top-K is the last snapshot's; "never" when it changed up to the last."""
    if len(stats) < 2:
        return "-"
    settled = settled_epoch(stats)
    return "never" if settled == stats[-1]["epoch"] else f"{settled:.2f}"


def _last_learning(log: list[dict]) -> dict:
    """The last epoch of ``log`` in which the gates still learned (phase 1; later the connectivity is frozen
    and the log has no gate statistics), the epoch that the last gate snapshot belongs to."""
    return [r for r in log if r.get("gate_entropy") is not None][-1]


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def write_report(out: Path, header: str, C: int, stats: dict[str, list[dict]], logs: dict[str, list[dict]],
                 moves: dict[str, dict[str, float]]) -> None:
    """``out/dynamics.md`` (the gate statistics at the last snapshot and the :func:`movement` of the gates,
    one row per run) and ``out/gate_dynamics.png`` (their course over training).

    "top-K changed (last 5 snapshots)" is the mean of the last snapshots' ``topk_changed``; in a run that
    snapshotted its gates at the freeze, the last interval is shorter than the others (the freeze falls
    between two regular snapshots). "top-K final since epoch" is :func:`connlearn.plots.settled_epoch`
    ("never": it changed up to the last snapshot)."""
    out.mkdir(parents=True, exist_ok=True)
    uniform = math.log(C)  # entropy of a uniform choice among C inputs
    lines = [header, "",
             f"| run | epoch | gate mean | within-row std | at 1 | at 0 | row-mean move (persistence) | "
             f"within-row move (persistence) | sampling entropy (uniform: "
             f"{uniform:.3f}) | draws equal to the top-K (last epoch) | "
             "top-K changed (last 5 snapshots) | top-K final since epoch | eval top-1 |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
             *(_row(label, stats[label], _last_learning(logs[label]), moves[label]) for label in stats)]
    (out / "dynamics.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    fig = Figure(figsize=(10, 13), layout="constrained")
    axes = fig.subplots(4, 2)
    axes.flat[7].set_axis_off()
    for label, series in stats.items():
        epochs = [s["epoch"] for s in series]
        for ax, key, title in zip(axes.flat[[0, 1, 2, 3, 6]],
                                  ("mean", "row_std", "frac_at_1", "topk_changed", "final_topk_share"),
                                  ("mean real gate", "mean within-row std", "share of gates at 1",
                                   "share of blocks whose top-K changed",
                                   "share of the last snapshot's top-K already in the top-K"), strict=True):
            ax.plot(epochs, [s[key] for s in series], label=label)
            ax.set_title(title)
        for ax, key, title in zip(axes.flat[4:6], ("gate_entropy", "drawn_topk_share"),
                                  (f"sampling entropy (uniform {uniform:.3f})",
                                   "share of draws equal to the top-K (per epoch)"), strict=True):
            points = [(r["epoch"], r[key]) for r in logs[label] if r.get(key) is not None]
            ax.plot([e for e, _ in points], [v for _, v in points], marker=".", label=label)
            ax.set_title(title)
    for ax in axes.flat[:7]:
        ax.set_xlabel("epoch")
    axes.flat[0].legend()
    fig.savefig(out / "gate_dynamics.png", dpi=110)


def from_runs(folders: list[str], out: Path) -> None:
    """The report of runs trained elsewhere (e.g. by accuracy.py): their gates.jsonl, log.jsonl and K (from
    summary.json, or from last.pt while a run is unfinished; a finished run needs no checkpoint)."""
    stats, logs, moves, widths = {}, {}, {}, set()
    paths = [Path(f) for f in folders]
    unique = len({p.name for p in paths}) == len(paths)
    for folder in paths:
        label = folder.name if unique else f"{folder.parent.name}/{folder.name}"
        summary = folder / "summary.json"
        K = json.loads(summary.read_text())["K"] if summary.exists() else net_from_checkpoint(folder / "last.pt").K
        snapshots = read_jsonl(folder / "gates.jsonl")
        stats[label], moves[label] = gate_statistics(snapshots, K), movement(snapshots)
        logs[label] = read_jsonl(folder / "log.jsonl")
        widths.add(max(len(rows[0]) for rows in snapshots[0]["gates"].values()))
    header = f"gate snapshots of {', '.join(folders)}; eval top-1 on each run's own evaluation set"
    write_report(out, header, max(widths), stats, logs, moves)


def gradient_split(net: connlearn.ConnectivityNet, batches) -> list[dict[str, float | int | str]]:
    """The raw gradient of the real gates (the paper's rule, before any remedy) of each sampled module of
    ``net``, summed per row over the entries drawn in that step and over those not drawn, averaged over the
    rows of the module and over ``batches`` (``(images, labels)`` pairs); also the mean within-row std and
    the module's mean gate.

    Gradient descent moves a row's gates by minus these sums: a negative ``undrawn`` raises the gates of the
    inputs a block did not use. Behind a projection shortcut ``drawn`` vanishes (scale invariance, see the
    tests), so a common drift there comes from the undrawn entries only. The weights are not updated (the
    batch norms' running statistics are: the forward passes run in training mode).
    """
    net.train()
    gated = [(i, stage) for i, stage in enumerate(net.stages) if stage.gate is not None and stage.gate.stochastic]
    if not gated:
        raise SystemExit(f"the network has gate kind {net.gate_kind!r} and no sampled gates: only a topk network "
                         "in phase 1 has them (a finished run's connectivity is frozen)")
    sums = {i: torch.zeros(3) for i, _ in gated}
    count = 0
    for images, labels in batches:
        net.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(net(images), labels).backward()
        for i, stage in gated:  # net.last_draw: the connectivity this forward pass drew, by stage position
            grad, drawn = stage.gate.real.grad.detach().float().cpu(), (net.last_draw[i] != 0).cpu()
            sums[i] += torch.stack([(grad * drawn).sum(1).mean(), (grad * ~drawn).sum(1).mean(),
                                    grad.std(1).mean()])
        count += 1
    if not count:
        raise SystemExit("no batches: nothing to average")
    return [{"module": net.module_ids[i], "shortcut": "projection" if stage.proj is not None else "identity",
             "drawn": float(sums[i][0] / count), "undrawn": float(sums[i][1] / count),
             "within_row_std": float(sums[i][2] / count), "gate_mean": float(stage.gate.real.detach().mean())}
            for i, stage in gated]


def gradients_of_runs(folders: list[str], data: str | None, batches: int, out: Path) -> None:
    """:func:`gradient_split` of each run's ``last.pt`` on ``batches`` training batches, as ``out/gradients.md``."""
    train, _ = load_dataset("cifar10", data)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    lines = [f"raw gate gradients, mean over {batches} augmented training batches of 128 (the sum over a row's "
             f"drawn / undrawn entries, mean over a module's rows); {device}",
             "", "| run | module | shortcut | gate mean | drawn | undrawn | within-row std |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for folder in folders:
        if not (Path(folder) / "last.pt").is_file():
            print(f"skipped {folder}: no last.pt")
            continue
        net = net_from_checkpoint(Path(folder) / "last.pt").to(device)
        loader = BatchLoader(train, 128, train=True, device=device, seed=0)
        rows = gradient_split(net, itertools.islice(loader.epoch(0), batches))
        lines += [f"| {folder} | {r['module']} | {r['shortcut']} | {r['gate_mean']:.3f} | {r['drawn']:+.2e} | "
                  f"{r['undrawn']:+.2e} | {r['within_row_std']:.2e} |" for r in rows]
    out.mkdir(parents=True, exist_ok=True)
    (out / "gradients.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", help="CIFAR-10 location (else $CONNLEARN_DATA, else download)")
    parser.add_argument("--rules", nargs="+", default=list(GRAD_MODES), choices=GRAD_MODES)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--train-subset", type=int, default=5000)
    parser.add_argument("--val-split", type=int, default=5000)
    parser.add_argument("--gate-lr", type=float, default=0.2)
    parser.add_argument("--gate-momentum", type=float,
                        help="the gates' own SGD momentum (default: the weights', 0.9; 0: Algorithm 1's plain step)")
    parser.add_argument("--gate-init", type=lambda v: v if v == "uniform" else float(v), default=0.5)
    parser.add_argument("--residual-init", choices=RESIDUAL_INITS, default="auto",
                        help="the branches' starting scale ('one' reproduces the studies made before the option)")
    parser.add_argument("--weight-decay", type=float, default=5e-4, help="of the weights (gates never decay)")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--snapshot-every", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--net", default="M=3,C=8,K=4,width=2,base_channels=16,stem_channels=16",
                        help="build() options of the network (default: a small {C=8, K=4} CPU-sized net)")
    parser.add_argument("--out", default="runs/gates")
    parser.add_argument("--runs", nargs="+", metavar="RUN_DIR",
                        help="train nothing: report the gate dynamics of these finished or partial runs")
    parser.add_argument("--gradients", nargs="+", metavar="RUN_DIR",
                        help="train nothing: split the raw gate gradients of these runs' last.pt (in phase 1) into "
                             "drawn and undrawn entries, over --batches training batches")
    parser.add_argument("--batches", type=int, default=50)
    args = parser.parse_args()
    if args.batches < 1:
        parser.error(f"--batches must be at least 1, got {args.batches}")
    if args.gradients:
        gradients_of_runs(args.gradients, args.data, args.batches, Path(args.out))
        return
    if args.runs:
        from_runs(args.runs, Path(args.out))
        return
    options = {k: int(v) for k, v in (kv.split("=") for kv in args.net.split(","))}
    train, _ = load_dataset("cifar10", args.data)
    train, val = train.split(args.val_split)
    train = train.subset(args.train_subset)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    recipe = Recipe("phase1", [Phase(args.epochs, 0.1, gate_lr=args.gate_lr)], batch_size=args.batch_size,
                    weight_decay=args.weight_decay, gate_momentum=args.gate_momentum)
    out = Path(args.out)
    stats, logs, moves = {}, {}, {}
    for rule in args.rules:
        loaders = make_loaders(train, val, recipe.batch_size, device=device, seed=args.seed)
        net = connlearn.build(preset="cifar-20-4-8", num_classes=10, seed=args.seed, gate_init=args.gate_init,
                              residual_init=args.residual_init,
                              **options)
        trainer = Trainer(net, *loaders, attrs.evolve(recipe, gate_rule=rule), out_dir=out / rule, device=device,
                          snapshot_every=args.snapshot_every, progress=False)
        logs[rule] = trainer.fit()
        snapshots = read_jsonl(out / rule / "gates.jsonl")
        stats[rule], moves[rule] = gate_statistics(snapshots, net.K), movement(snapshots)
    gate_momentum = recipe.momentum if args.gate_momentum is None else args.gate_momentum
    header = (f"phase 1 only, {args.epochs} epochs of {len(train)} images at batch {args.batch_size}, gate lr "
              f"{args.gate_lr}, gate momentum {gate_momentum}, gate init {args.gate_init}, residual init "
              f"{args.residual_init}, weight decay "
              f"{args.weight_decay}, seed {args.seed}, "
              f"net {args.net}; validation split of {len(val)} training images; {device}")
    write_report(out, header, options.get("C", 8), stats, logs, moves)


if __name__ == "__main__":
    main()
