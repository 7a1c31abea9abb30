"""The gate kinds' tuning budget, declared before any run: the same number of configurations for every kind
(``benchmarks/studies/tuning_k{1,2,4}/KIND.toml``: arms ``KIND_0`` ... ``KIND_7``, drawn from one search space
with a fixed seed: the gates' optimizer and lr, SGD at 0.2 or Adam at 1e-3 to 1e-1; the sampling temperature's
end; a warm-up of 0 or 2 epochs; the gates' steps on 5,000 held-out images or on the training batches), each
trained on validation seeds 0 and 1. Random search over connectivities gets as many runs: the ceiling's first
Fixed-Random connectivities (``benchmarks/ceiling.py``).

    connlearn compare --arms benchmarks/studies/tuning_k4/gumbel.toml --seeds 0 1 \\
        --out benchmarks/studies/tuning_k4/results --parallel 2
    python benchmarks/tuning.py analyse benchmarks/studies/tuning_k4/results benchmarks/studies/ceiling/results

``analyse`` prints every configuration's validation top-1 minus the mean of the connectivities random search
tried (on the same seeds), each kind's best, and random search's best: every winner is the best of
:data:`CONFIGS` tries on the same seeds, so each carries the same optimism of picking a maximum.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from connlearn.train.compare import collect
from connlearn.train.options import GATE_TRAINING, OPTIONS, names

KINDS = ("topk", "gumbel", "simple", "imle", "magnitude")
CONFIGS = 8
SEEDS = (0, 1)  # the validation seeds


def analyse(folders: list[Path]) -> str:
    found, _ = collect(folders)
    done = {a: runs for a, runs in found.items() if set(SEEDS) <= set(runs)}
    top1 = {a: np.array([runs[s]["test_top1"] for s in SEEDS]) for a, runs in done.items()}
    tried = [f"r{i:02d}" for i in range(CONFIGS)]  # random search's tries: the ceiling's first connectivities
    missing = [a for a in tried if a not in top1]
    if missing:
        return f"random search is not done on seeds {list(SEEDS)}: {', '.join(missing)} missing"
    random = np.mean([top1[a] for a in tried], axis=0)  # per seed
    lines = [f"validation top-1, seeds {list(SEEDS)}; minus: the mean of random search's {CONFIGS} connectivities "
             f"on the same seeds ({random.mean():.2f})", "", "| arm | knobs | " +
             " | ".join(f"seed {s}" for s in SEEDS) + " | mean | minus random |", "| --- " * (len(SEEDS) + 4) + "|"]
    best: dict[str, tuple[str, int]] = {}  # kind -> its best arm, how many it tried
    for kind in (*KINDS, "random search"):
        arms = tried if kind == "random search" else sorted(a for a in top1 if a.rsplit("_", 1)[0] == kind)
        for arm in arms:
            run = done[arm][SEEDS[0]]["run"]  # the knobs a configuration sets: where it leaves the paper's
            knobs = ", ".join(f"{k[5:]} {run[k]}" for k in names(GATE_TRAINING) if run[k] != OPTIONS[k].default)
            lines.append(f"| {arm} | {knobs or '-'} | " + " | ".join(f"{v:.2f}" for v in top1[arm]) +
                         f" | {top1[arm].mean():.2f} | {(top1[arm] - random).mean():+.2f} |")
        if arms:
            best[kind] = max(arms, key=lambda a: top1[a].mean()), len(arms)
    lines += ["", "| kind | configurations done | best | mean | minus random |", "| --- | --- | --- | --- | --- |"]
    for kind, (arm, n) in best.items():
        lines.append(f"| {kind} | {n} of {CONFIGS} | {arm} | {top1[arm].mean():.2f} | "
                     f"{(top1[arm] - random).mean():+.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("analyse", help="the configurations' results against random search's").add_argument(
        "folders", type=Path, nargs="+", help="the tuning's results and the ceiling's")
    print(analyse(parser.parse_args(argv).folders))


if __name__ == "__main__":
    main()
