"""The verdict's primary comparisons (BENCHMARKS.md, declared before their runs): the best tuned arm against
Fixed-Random of the same K, learned in place and its connectivity retrained from scratch, on the reduced
network and again with unlike branches (middle kernels 1, 3, 5 cycling over each module's branches), on fresh
seeds, read on CIFAR-10's test set.

    connlearn compare --arms benchmarks/studies/verdict/alike.toml --seeds 100 101 102 103 104 105 106 107 \
        108 109 --out benchmarks/studies/verdict/results_alike --parallel 2        # and unlike.toml
    python benchmarks/verdict.py analyse benchmarks/studies/verdict
    python benchmarks/verdict.py kernels benchmarks/studies/verdict/results_unlike

``alike.toml`` and ``unlike.toml`` each hold the arms ``random``, ``learned`` (the tuning's best configuration)
and ``retrained`` (``retrain = "learned"``), baseline ``random``, evaluated on the test set, never tuned on.
``analyse`` reads ``results_alike`` and ``results_unlike`` and prints the four comparisons with their
p-values Holm-corrected across all four, as declared. While a comparison has not run (fewer than two
pairs), it counts as p = 1 in the correction, which can only raise the others' corrected p-values. ``kernels``
(not a declared comparison) reads each run's ``last.pt`` and says from branches of which middle kernel its live
blocks read their inputs, against the share of those branches among the candidates: did learning prefer some?
"""

from __future__ import annotations

import argparse
import statistics
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from connlearn.graph import BranchGraph, live_blocks
from connlearn.train.checkpoint import load_checkpoint
from connlearn.train.compare import collect, holm, markdown, report, verdict

DECLARED = 4  # learned in place and retrained, branches alike and unlike


def analyse(root: Path, margin: float = 1.0) -> str:
    arms: dict[str, Any] = {}
    tests: dict[str, Any] = {}
    for name in ("alike", "unlike"):
        runs = collect([root / f"results_{name}"])[0] if (root / f"results_{name}").is_dir() else {}
        if "random" in runs:
            result = report(runs, "random", margin)
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
    return Counter(graph.nodes[u]["params"].get("kernel") for n in live_blocks(graph)
                   for u, _, d in graph.gate_edges(n) if d.get("active") or not active)


def kernels(folder: Path) -> str:
    """Per arm, the mean ± sd over its runs of the share of live blocks' inputs read from each kernel's
    branches, below the candidates' shares (what a uniform choice gives)."""
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("analyse", help="the four comparisons, Holm across them").add_argument(
        "root", type=Path, help="the folder holding results_alike and results_unlike")
    sub.add_parser("kernels", help="from which kernels' branches each arm's blocks read").add_argument(
        "folder", type=Path, help="a study's folder of runs (their last.pt)")
    args = parser.parse_args(argv)
    print(analyse(args.root) if args.command == "analyse" else kernels(args.folder), end="")


if __name__ == "__main__":
    main()
