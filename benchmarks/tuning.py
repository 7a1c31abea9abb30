"""The gate kinds' tuning budget, declared before any run: the same number of configurations for every kind,
drawn from one search space with a fixed seed, each trained on the same validation seeds. Random search over
connectivities gets as many runs: the Fixed-Random connectivities of ``benchmarks/ceiling.py``.

    python benchmarks/tuning.py --K 4 --out benchmarks/studies/tuning_k4
    connlearn compare --arms benchmarks/studies/tuning_k4/gumbel.toml --seeds 0 1 \
        --out benchmarks/studies/tuning_k4/results --parallel 2

writes one arms file per kind (``KIND.toml``: :data:`CONFIGS` configurations, arms ``KIND_0`` ...), on the
options of ``benchmarks/ceiling.py``'s :data:`COMMON` (the reduced {20,4,8}, 5,000 training images, 16 epochs,
the 10,000-image validation split evaluated once at the end) and ``NETWORK``. The space (:func:`configuration`):
the gates' optimizer and learning rate (the paper's SGD at 0.2, or Adam at 1e-3 to 1e-1, log-uniform), the
sampling temperature's end (none, or 0.1 to 0.5 for the kinds that draw), a warm-up of 0 or 2 epochs before
the gates learn, and the gates' steps on held-out batches (5,000 images apart from the training subset) or on
the training batches. The best configuration of each kind on the validation split goes on to the verdict.
"""

from __future__ import annotations

import argparse
import math
import random
from pathlib import Path

from ceiling import COMMON, NETWORK, arms_toml

KINDS = ("topk", "gumbel", "simple", "imle", "magnitude")
CONFIGS = 8
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--K", type=int, default=4)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    write(args.K, args.out, args.seed)


if __name__ == "__main__":
    main()
