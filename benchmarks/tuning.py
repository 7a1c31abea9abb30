"""The gate kinds' tuning budget, declared before any run: the same number of configurations for every kind,
drawn from one search space with a fixed seed, each trained on the same validation seeds. Random search over
connectivities gets as many runs: the Fixed-Random connectivities of ``benchmarks/ceiling.py``.

    python benchmarks/tuning.py write --K 4 --out benchmarks/studies/tuning_k4
    connlearn compare --arms benchmarks/studies/tuning_k4/gumbel.toml --seeds 0 1 \
        --out benchmarks/studies/tuning_k4/results --parallel 2
    python benchmarks/tuning.py analyse benchmarks/studies/tuning_k4/results benchmarks/studies/ceiling/results

writes one arms file per kind (``KIND.toml``: :data:`CONFIGS` configurations, arms ``KIND_0`` ...), on the
options of ``benchmarks/ceiling.py``'s :data:`COMMON` (the reduced {20,4,8}, 5,000 training images, 16 epochs,
the 10,000-image validation split evaluated once at the end) and ``NETWORK``. The space (:func:`configuration`):
the gates' optimizer and learning rate (the paper's SGD at 0.2, or Adam at 1e-3 to 1e-1, log-uniform), the
sampling temperature's end (none, or 0.1 to 0.5 for the kinds that draw), a warm-up of 0 or 2 epochs before
the gates learn, and the gates' steps on held-out batches (5,000 images apart from the training subset) or on
the training batches. The best configuration of each kind on the validation split goes on to the verdict.

``analyse`` prints every configuration's validation top-1 on seeds 0 and 1 minus the mean of the random
connectivities that random search tried (the first :data:`CONFIGS` of the ceiling's, on the same seeds), each
kind's best, and random search's best: every winner is the best of :data:`CONFIGS` tries on the same seeds, so
each carries the same optimism of picking a maximum.
"""

from __future__ import annotations

import argparse
import math
import random
from pathlib import Path

import numpy as np
from ceiling import COMMON, NETWORK, arms_toml

KINDS = ("topk", "gumbel", "simple", "imle", "magnitude")
CONFIGS = 8
SEEDS = (0, 1)  # the validation seeds
DRAWS = ("topk", "gumbel", "simple", "imle")  # the kinds whose phase 1 samples, so a temperature matters


def configuration(kind: str, rng: random.Random) -> dict[str, object]:
    """One draw from the search space for ``kind``."""
    adam = rng.random() < 0.75
    options: dict[str, object] = {"gate_optimizer": "adam", "gate_lr": round(10 ** rng.uniform(-3, -1), 5)} if adam \
        else {"gate_lr": 0.2}
    if kind in DRAWS and rng.random() < 0.5:
        options["gate_temperature_end"] = round(math.exp(rng.uniform(math.log(0.1), math.log(0.5))), 3)
    if kind == "topk":
        options["gate_rule"] = "centered"  # the paper's plain rule saturates (BENCHMARKS.md, the gate rules)
    if rng.random() < 0.5:
        options["gate_warmup"] = 2
    if rng.random() < 0.5:
        options["gate_holdout"] = 5000
    return options


def write(K: int, out: Path, seed: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    network = {k: v for k, v in NETWORK.items() if k != "num_classes"} | {"K": K}
    for kind in KINDS:
        rng = random.Random(f"{seed}-{kind}")
        arms = {f"{kind}_{i}": {**network, "gate": kind, **configuration(kind, rng)} for i in range(CONFIGS)}
        (out / f"{kind}.toml").write_text(arms_toml(f"{kind}, K={K}: {CONFIGS} configurations drawn with seed {seed} "
                                                    "(benchmarks/tuning.py)", COMMON, arms))
    print(f"wrote {len(KINDS)} arms files of {CONFIGS} configurations to {out}")


def analyse(folders: list[Path]) -> str:
    from connlearn.train.compare import collect
    from connlearn.train.options import GATE_TRAINING, defaults, names

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
            knobs = ", ".join(f"{k[5:]} {run[k]}" for k in names(GATE_TRAINING) if run[k] != defaults()[k])
            lines.append(f"| {arm} | {knobs or '-'} | " + " | ".join(f"{v:.2f}" for v in top1[arm]) +
                         f" | {top1[arm].mean():.2f} | {(top1[arm] - random).mean():+.2f} |")
        if arms:
            best[kind] = max(arms, key=lambda a: top1[a].mean()), len(arms)
    lines += ["", "| kind | configurations done | best | mean | minus random |", "| --- | --- | --- | --- | --- |"]
    for kind, (arm, n) in best.items():
        lines.append(f"| {kind} | {n} of {CONFIGS} | {arm} | {top1[arm].mean():.2f} | "
                     f"{(top1[arm] - random).mean():+.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("write", help="the arms files of the declared configurations")
    p.add_argument("--K", type=int, default=4)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--seed", type=int, default=0)
    p = sub.add_parser("analyse", help="the configurations' results against random search's")
    p.add_argument("folders", type=Path, nargs="+", help="the tuning's results and the ceiling's")
    args = parser.parse_args()
    if args.command == "write":
        write(args.K, args.out, args.seed)
    else:
        print(analyse(args.folders))


if __name__ == "__main__":
    main()
