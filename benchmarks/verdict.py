"""The verdict's primary comparisons (BENCHMARKS.md, declared before their runs): the best tuned arm against
Fixed-Random of the same K, learned in place and its connectivity retrained from scratch, on the reduced
network and again with unlike branches (middle kernels 1, 3, 5 cycling over each module's branches), on fresh
seeds, read on CIFAR-10's test set.

    python benchmarks/verdict.py benchmarks/studies/tuning_k4/gumbel.toml gumbel_3 --out benchmarks/studies/verdict
    connlearn compare --arms benchmarks/studies/verdict/alike.toml --seeds 100 101 102 103 104 105 106 107 \
        108 109 --out benchmarks/studies/verdict/results_alike --parallel 2

writes ``alike.toml`` and ``unlike.toml``, each with the arms ``random``, ``learned`` (ARM's options in FILE)
and ``retrained`` (``retrain = "learned"``), baseline ``random``, on the ceiling's options
(``benchmarks/ceiling.py``'s :data:`COMMON`) without its validation split: the test set, never tuned on.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from budget import tuned
from ceiling import COMMON, arms_toml

SEEDS = tuple(range(100, 110))


def write(file: Path, arm: str, out: Path) -> None:
    learned, random = tuned(file, arm)
    common = {k: v for k, v in COMMON.items() if k != "val_split"} | {"baseline": "random"}
    out.mkdir(parents=True, exist_ok=True)
    for name, kernels in (("alike", {}), ("unlike", {"kernels": [1, 3, 5]})):
        engine = {"engine": "reference"} if kernels else {}  # the fused engine batches only alike blocks
        study = {"random": random | kernels | engine, "learned": learned | kernels | engine,
                 "retrained": {"retrain": "learned"} | engine}
        (out / f"{name}.toml").write_text(arms_toml(
            f"the verdict (benchmarks/verdict.py): {arm} of {file} against Fixed-Random, branches {name}, "
            f"test set, seeds {SEEDS[0]} to {SEEDS[-1]}", common, study))
    print(f"wrote alike.toml and unlike.toml to {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("file", type=Path, help="an arms file holding the tuned configuration")
    parser.add_argument("arm", help="its name in FILE")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    write(args.file, args.arm, args.out)


if __name__ == "__main__":
    main()
