"""The verdict's primary comparisons (BENCHMARKS.md, declared before their runs): the best tuned arm against
Fixed-Random of the same K, learned in place and its connectivity retrained from scratch, on the reduced
network and again with unlike branches (middle kernels 1, 3, 5 cycling over each module's branches), on fresh
seeds, read on CIFAR-10's test set.

    python benchmarks/verdict.py write benchmarks/studies/tuning_k4/gumbel.toml gumbel_3 \
        --out benchmarks/studies/verdict
    connlearn compare --arms benchmarks/studies/verdict/alike.toml --seeds 100 101 102 103 104 105 106 107 \
        108 109 --out benchmarks/studies/verdict/results_alike --parallel 2

    python benchmarks/verdict.py analyse benchmarks/studies/verdict
    python benchmarks/verdict.py kernels benchmarks/studies/verdict/results_unlike

``write`` writes ``alike.toml`` and ``unlike.toml``, each with the arms ``random``, ``learned`` (ARM's options
in FILE) and ``retrained`` (``retrain = "learned"``), baseline ``random``, on the ceiling's options
(``benchmarks/ceiling.py``'s :data:`COMMON`) without its validation split: the test set, never tuned on.
``analyse`` reads ``results_alike`` and ``results_unlike`` and prints the four comparisons with their
p-values Holm-corrected across all four, as declared. While a comparison has not run (fewer than two
pairs), it counts as p = 1 in the correction, which can only raise the others' corrected p-values. ``kernels`` (not a
declared comparison) reads each run's ``last.pt`` and says from branches of which middle kernel its live blocks
read their inputs, against the share of those branches among the candidates: did learning prefer some?
"""

from __future__ import annotations

import argparse
import statistics
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from budget import against, tuned
from ceiling import COMMON, arms_toml

SEEDS = tuple(range(100, 110))
DECLARED = 4  # learned in place and retrained, branches alike and unlike


def write(file: Path, arm: str, out: Path) -> None:
    learned, random = tuned(file, arm)
    common = {k: v for k, v in COMMON.items() if k != "val_split"} | {"baseline": "random"}
    out.mkdir(parents=True, exist_ok=True)
    for name, kernels in (("alike", {}), ("unlike", {"kernels": [1, 3, 5]})):
        study = {"random": random | kernels, "learned": learned | kernels, "retrained": {"retrain": "learned"}}
        (out / f"{name}.toml").write_text(arms_toml(
            f"the verdict (benchmarks/verdict.py): {arm} of {file} against Fixed-Random, branches {name}, "
            f"test set, seeds {SEEDS[0]} to {SEEDS[-1]}", common, study))
    print(f"wrote alike.toml and unlike.toml to {out}")


def analyse(root: Path, margin: float = 1.0) -> str:
    from connlearn.train.compare import holm, markdown, verdict

    arms: dict[str, Any] = {}
    tests: dict[str, Any] = {}
    for name in ("alike", "unlike"):
        result = against(root / f"results_{name}", margin)[0]
        if result is not None:
            arms |= {f"{name}: {arm}": a for arm, a in result["arms"].items()}
            tests |= {f"{name}: {arm}": t for arm, t in result["against"].items() if "p" in t}
    left = DECLARED - len(tests)
    for test, p in zip(tests.values(), holm([t["p"] for t in tests.values()] + [1.0] * left)[:len(tests)],
                       strict=True):
        test["p_holm"] = p
        test["verdict"] = verdict(test, margin)
    note = f"{left} of the {DECLARED} comparisons have not run: Holm counts them as p = 1\n" if left else ""
    return note + markdown({"baseline": "random", "margin": margin, "arms": arms, "against": tests})


def source_kernels(graph: Any, active: bool = True) -> Counter[int]:
    """How many gate inputs of ``graph``'s live blocks come from branches of each middle kernel: the active
    ones, or (``active=False``) every candidate."""
    from connlearn.graph import live_blocks

    return Counter(graph.nodes[u]["params"].get("kernel") for n in live_blocks(graph)
                   for u, _, d in graph.gate_edges(n) if d.get("active") or not active)


def kernels(folder: Path) -> str:
    """Per arm, the mean ± sd over its runs of the share of live blocks' inputs read from each kernel's
    branches, below the candidates' shares (what a uniform choice gives)."""
    from connlearn.graph import BranchGraph
    from connlearn.train.checkpoint import load_checkpoint

    shares: dict[str, list[dict[int, float]]] = defaultdict(list)
    candidates: Counter[int] = Counter()
    for path in sorted(folder.glob("*-s*/last.pt")):
        graph = BranchGraph.from_json(load_checkpoint(path)["graph"])
        read = source_kernels(graph)
        candidates += source_kernels(graph, active=False)
        shares[path.parent.name.rsplit("-s", 1)[0]].append({k: n / read.total() for k, n in read.items()})
    sizes = sorted(candidates)
    lines = ["| arm | runs | " + " | ".join(f"kernel {k}" for k in sizes) + " |",
             "| --- | --- | " + " | ".join("---" for _ in sizes) + " |",
             "| candidates | | " + " | ".join(f"{candidates[k] / sum(candidates.values()):.3f}" for k in sizes) + " |"]
    for arm, runs in shares.items():
        cells = [[r.get(k, 0.0) for r in runs] for k in sizes]
        lines.append(f"| {arm} | {len(runs)} | " + " | ".join(
            f"{statistics.mean(c):.3f} ± {statistics.stdev(c) if len(c) > 1 else 0:.3f}" for c in cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("write", help="the arms files of the primary comparisons")
    p.add_argument("file", type=Path, help="an arms file holding the tuned configuration")
    p.add_argument("arm", help="its name in FILE")
    p.add_argument("--out", type=Path, required=True)
    p = sub.add_parser("analyse", help="the four comparisons, Holm across them")
    p.add_argument("root", type=Path, help="the folder holding results_alike and results_unlike")
    p = sub.add_parser("kernels", help="from which kernels' branches each arm's blocks read")
    p.add_argument("folder", type=Path, help="a study's folder of runs (their last.pt)")
    args = parser.parse_args()
    if args.command == "write":
        write(args.file, args.arm, args.out)
    else:
        print(analyse(args.root) if args.command == "analyse" else kernels(args.folder), end="")


if __name__ == "__main__":
    main()
