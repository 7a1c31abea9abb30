"""How many parameters does pruning remove from a random K=1 connectivity? The baseline of the paper's
parameter savings.

The paper prunes the blocks that no block of the next module reads and reports, for learned K=1 on
CIFAR-100, {29,8,8} 0.86M -> 0.65M and {29,64,8} 34.4M -> 20.5M (40% fewer). Any K=1 connectivity leaves
branches unread (each of C blocks reads one of C branches), and pruning cascades: a block whose only
readers were pruned is pruned too. This builds Fixed-Random K=1 networks, one per seed, prunes them with
``connlearn.prune.prune_dead_blocks`` and prints Params-Train, Params-Test and the blocks left, next to
the paper's learned numbers. No training: the counts depend only on the connectivity.

    python benchmarks/k1_pruning.py --presets cifar-29-8-8 cifar-29-64-8 --seeds 0 1 2 3 4
"""

from __future__ import annotations

import argparse
import statistics

import connlearn
from connlearn.prune import prune_dead_blocks
from connlearn.topologies import PRESETS

#: The paper's CIFAR-100 table, learned K=1: Params-Train, Params-Test (millions).
PAPER_K1 = {"cifar-29-8-8": (0.86, 0.65), "cifar-29-64-8": (34.4, 20.5)}


def prune_counts(preset: str, seed: int, K: int = 1) -> tuple[int, int, int, int]:
    """Params-Train, Params-Test, blocks before and blocks after pruning of a Fixed-Random net."""
    net = connlearn.build(preset=preset, gate="random", K=K, seed=seed)
    _, report = prune_dead_blocks(net)
    return report.params_before, report.params_after, report.blocks_before, report.blocks_after


def main(argv: list[str] | None = None) -> list[str]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", nargs="+", default=list(PAPER_K1), choices=sorted(PRESETS), metavar="PRESET")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    parser.add_argument("--K", type=int, default=1)
    args = parser.parse_args(argv)
    lines = ["| preset | K | seeds | Params-Train | Params-Test, mean (min–max) | kept | blocks left, mean "
             "| paper, learned K=1 |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for preset in args.presets:
        rows = [prune_counts(preset, seed, args.K) for seed in args.seeds]
        train, tests = rows[0][0], [r[1] for r in rows]
        paper = PAPER_K1.get(preset) if args.K == 1 else None
        paper_text = f"{paper[0]}M → {paper[1]}M ({paper[1] / paper[0]:.0%})" if paper else ""
        lines.append(
            f"| {preset} | {args.K} | {len(rows)} | {train / 1e6:.3f}M | {statistics.mean(tests) / 1e6:.3f}M "
            f"({min(tests) / 1e6:.3f}–{max(tests) / 1e6:.3f}) | {statistics.mean(tests) / train:.0%} | "
            f"{statistics.mean(r[3] for r in rows):.1f} of {rows[0][2]} | {paper_text} |")
    print("\n".join(lines))
    return lines


if __name__ == "__main__":
    main()
