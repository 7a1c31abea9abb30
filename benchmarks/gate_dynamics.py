"""How the real gates move during phase 1: a report of runs' gate snapshots (``--snapshot-every``).

Writes ``OUT/dynamics.md`` (the gate statistics at the last snapshot, how far the gates moved, split into each
row's mean and the within-row structure, and the eval top-1) and ``OUT/gate_dynamics.png`` (their course).
Runs are ordinary ``connlearn train`` or ``connlearn compare`` runs, e.g. the gate rules side by side:

    connlearn compare --arm "plain gate=topk" --arm "centered gate=topk gate_rule=centered" --dataset cifar10 \
        --phases 5 1 1 1 --val-split 5000 --train-subset 5000 --snapshot-every 50 --seeds 0 --out runs/rules
    python benchmarks/gate_dynamics.py runs/rules/plain-s0 runs/rules/centered-s0 --out runs/gates

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

import numpy as np
from matplotlib.figure import Figure

from connlearn.files import read_jsonl
from connlearn.plots import gate_statistics
from connlearn.train.checkpoint import net_from_checkpoint


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
    held = list(itertools.takewhile(lambda record: record["final_topk_share"] >= 1, reversed(stats)))
    settled = held[-1]["epoch"]  # the earliest snapshot from which on every block's top-K is the last one's
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
    between two regular snapshots). "top-K final since epoch" is the earliest snapshot from which on every
    top-K is the last one's ("never": it changed up to the last snapshot)."""
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
    """The report of runs: their gates.jsonl, log.jsonl and K (from
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR", help="finished or partial runs with gate snapshots")
    parser.add_argument("--out", type=Path, default=Path("runs/gates"))
    args = parser.parse_args(argv)
    from_runs(args.runs, args.out)


if __name__ == "__main__":
    main()
