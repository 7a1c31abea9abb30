"""Does the training budget change the verdict? A learned arm against Fixed-Random of the same K at 8, 16, 32
and 64 epochs (the recipe's 6/5/3/2 split scaled), and at the longest the sampling-only control: the learned
arm's draws with a gate learning rate of 0, so the gates never move, then the freeze. If the control matches
the learned arm, phase 1's gain is the regularisation of its sampling, not the connectivity it learns.

    connlearn compare --arms benchmarks/studies/budget/e64.toml --seeds 0 1 2 3 4 \
        --out benchmarks/studies/budget/results_e64 --parallel 2          # and e8, e16, e32
    python benchmarks/budget.py analyse benchmarks/studies/budget

``eE.toml`` holds a budget's arms (every run of one report shares its epochs): ``learned``, the tuning's best
configuration, ``random``, Fixed-Random with its network and K, and at the longest ``sampling``. ``analyse``
prints, per budget found (``results_eE``), each arm minus ``random`` (and ``learned`` minus ``sampling``), paired
by seed, and a line fitted to learned − random against log2 of the epochs: does learning pay more as training
grows longer?
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from scipy import stats

from connlearn.train.compare import collect, report

BUDGETS = (8, 16, 32, 64)


def against(folder: Path, margin: float, baseline: str = "random") -> tuple[dict[str, Any] | None, int]:
    """compare's report of a study folder against ``baseline`` (None while the folder or a finished run of the
    baseline is missing), and how many of the folder's runs are unfinished."""
    if not folder.is_dir():
        return None, 0
    runs, unfinished = collect([folder])
    return (report(runs, baseline, margin) if baseline in runs else None), len(unfinished)


def analyse(root: Path, margin: float = 1.0) -> str:
    """Each budget's arms against random, then the trend of learned − random per doubling of the epochs."""
    lines = ["| epochs | arm − random | pairs | mean ± sd | 95% interval | verdict |", "| --- " * 6 + "|"]
    doublings, diffs = [], []
    for epochs in BUDGETS:
        result, unfinished = against(root / f"results_e{epochs}", margin)
        if unfinished:
            lines.append(f"| {epochs} | unfinished runs: {unfinished} | | | | |")
        if result is not None:
            control = against(root / f"results_e{epochs}", margin, "sampling")[0]  # does learning add to sampling?
            rows = [*result["against"].items(), *([] if control is None else [
                ("learned − sampling", control["against"]["learned"])])]
            lines += [f"| {epochs} | {arm} | {t['n']} | {t['mean']:+.2f} ± {t['sd']:.2f} | [{t['ci'][0]:+.2f}, "
                      f"{t['ci'][1]:+.2f}] | {t['verdict']} |" for arm, t in rows if "p" in t]
            learned = result["against"].get("learned", {}).get("diffs", [])
            doublings += [math.log2(epochs)] * len(learned)
            diffs += learned
    if len(set(doublings)) > 1 and len(diffs) > 2:
        fit = stats.linregress(doublings, diffs)
        half = stats.t.ppf(0.975, len(diffs) - 2) * fit.stderr
        lines += ["", f"learned − random per doubling of the epochs: {fit.slope:+.2f} ± {fit.stderr:.2f} (95% interval "
                  f"[{fit.slope - half:+.2f}, {fit.slope + half:+.2f}], p {fit.pvalue:.2f}; a line through "
                  f"{len(diffs)} pairs at {len(set(doublings))} budgets)"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("analyse", help="each budget's arms against random").add_argument(
        "root", type=Path, help="the folder holding results_e8 ... results_e64")
    print(analyse(parser.parse_args(argv).root))


if __name__ == "__main__":
    main()
