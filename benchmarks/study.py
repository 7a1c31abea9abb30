"""The table of a small study: arms of single runs, one run per seed, paired by seed with a reference arm.

The CPU studies of BENCHMARKS.md train each arm and seed in its own folder (arms that differ in gate rule
or sampling temperature cannot share a sweep folder). This gathers them into one markdown table: each
seed's last top-1, the mean ± std over seeds, the difference to the reference arm paired by seed (the
same data order, so the seed-to-seed spread both share drops out), and the measures that say what the
gates did: top-1 at the end of phase 1, Params-Test after pruning (and the share it keeps), the final
input overlap (``connlearn.graph.input_overlap``; independent random draws in brackets), how often a
draw equalled the block's top-K in phase 1's last epoch, and the real gates then.

    python benchmarks/study.py --reference "Fixed-Random K=1" \\
        "Fixed-Random K=1=runs/k1_cpu/random/random1-s*" "Learned K=1=runs/k1_cpu/plain/topk1-s*" \\
        --png runs/k1_cpu/study.png > runs/k1_cpu/study.md

A folder may be a run (it holds ``summary.json``) or hold one (an accuracy.py sweep folder of one run);
a run's folder name ends in ``-s<seed>``. Unfinished runs are left out.
"""

from __future__ import annotations

import argparse
import glob
import json
import re
import statistics
from pathlib import Path
from typing import Any

from accuracy import mean_curve

from connlearn import plots
from connlearn.errors import ConfigError, ConnlearnError
from connlearn.files import read_jsonl

SEED = re.compile(r"-s(\d+)$")


def find_runs(pattern: str) -> dict[int, Path]:
    """Seed -> run folder for the folders matching ``pattern`` that hold a finished run."""
    runs: dict[int, Path] = {}
    for name in sorted(glob.glob(pattern)):
        folder = Path(name)
        if not folder.is_dir() or not SEED.search(folder.name):
            continue
        if (folder / "summary.json").exists():
            run = folder
        else:  # a sweep folder of one run, finished or not
            inner = sorted(p for p in folder.iterdir() if p.is_dir() and SEED.search(p.name))
            if len(inner) > 1:
                raise ConfigError(f"{folder} holds {len(inner)} runs ({', '.join(p.name for p in inner)}): "
                                  "give a pattern that matches one run per folder")
            if not inner or not (inner[0] / "summary.json").exists():
                continue  # not finished
            run = inner[0]
            if SEED.search(run.name)[1] != SEED.search(folder.name)[1]:
                raise ConfigError(f"{run}: its seed differs from its folder's ({folder.name})")
        seed = int(SEED.search(run.name)[1])
        if seed in runs:
            raise ConfigError(f"{pattern!r} matches two runs of seed {seed}: {runs[seed]} and {run}")
        runs[seed] = run
    if not runs:
        raise ConfigError(f"no finished run (a folder ending in -s<seed> with a summary.json) matches {pattern!r}")
    return runs


def measures(run: Path) -> dict[str, Any]:
    """What the table shows of one run."""
    summary = json.loads((run / "summary.json").read_text())
    log = read_jsonl(run / "log.jsonl")
    phase1 = [r for r in log if r.get("phase") == 1]
    end1 = phase1[-1] if phase1 else {}
    overlaps = list(summary["input_overlap"].values())
    chances = list(summary["input_overlap_chance"].values())
    full = summary["gate"] == "full"
    return {
        "top1": summary["test_top1"],
        "phase1_top1": end1.get("test_top1"),
        "params_train": summary["params_train"],
        "params_test": summary["params_test"],
        "overlap": statistics.mean(overlaps) if overlaps and not full else None,
        "chance": statistics.mean(chances) if chances else None,
        "share": end1.get("drawn_topk_share"),
        "gates": (end1.get("gate_mean"), end1.get("gate_row_std"), end1.get("gate_at_1")),
        "log": log,
        "eval_set": "validation" if summary["run"]["val_split"] else "test",
    }


def _ms(values: list[float | None], sign: str = "") -> str:
    """Mean ± std (the value alone for one); ``sign="+"`` writes the sign of the mean, with a true minus."""
    values = [v for v in values if v is not None]
    if not values:
        return ""
    mean = f"{statistics.mean(values):{sign}.2f}".replace("-", "−")
    return mean if len(values) == 1 else f"{mean} ± {statistics.stdev(values):.2f}"


def eval_set(arms: dict[str, dict[int, dict[str, Any]]]) -> str:
    """The data every run of the study was evaluated on; runs evaluated on different data do not compare."""
    found: dict[str, list[str]] = {}
    for label, runs in arms.items():
        for m in runs.values():
            found.setdefault(m["eval_set"], []).append(label)
    if len(found) > 1:
        raise ConfigError("the arms were not evaluated on the same data: " + "; ".join(
            f"{name}: {', '.join(dict.fromkeys(labels))}" for name, labels in sorted(found.items())))
    return next(iter(found))


def table(arms: dict[str, dict[int, dict[str, Any]]], reference: str | None, evaluated_on: str) -> str:
    seeds = sorted({s for runs in arms.values() for s in runs})
    head = [f"arm ({evaluated_on} top-1 %, last epoch)", *(f"seed {s}" for s in seeds), "mean ± std"]
    if reference:
        head += [f"against {reference}, paired (common seeds)", "seeds above"]
    head += ["end of phase 1", "Params-Test (kept)", "input overlap (random)", "draws = top-K",
             "gate mean / row std / at 1, end of phase 1"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    ref = arms.get(reference, {}) if reference else {}
    for label, runs in arms.items():
        m = list(runs.values())
        row = [label, *(f"{runs[s]['top1']:.2f}" if s in runs else "" for s in seeds), _ms([r["top1"] for r in m])]
        if reference:
            diffs = [runs[s]["top1"] - ref[s]["top1"] for s in runs if s in ref]
            paired = label != reference and diffs
            row += [_ms(diffs, sign="+") if paired else "",
                    f"{sum(d > 0 for d in diffs)} of {len(diffs)}" if paired else ""]
        tested = [r["params_test"] for r in m]  # None: real gates never frozen, so never pruned
        kept = "n/a"
        if None not in tested:
            share = statistics.mean(r["params_test"] / r["params_train"] for r in m)
            kept = f"{statistics.mean(tested) / 1e6:.4f}M ({share:.0%})"
        overlap = _ms([r["overlap"] for r in m])
        chance = [r["chance"] for r in m if r["chance"] is not None]
        gates = [_ms([r["gates"][i] for r in m]) for i in range(3)]
        row += [_ms([r["phase1_top1"] for r in m]),
                kept,
                f"{overlap} ({statistics.mean(chance):.2f})" if overlap and chance else overlap,
                _ms([r["share"] for r in m]),
                " / ".join(gates) if any(gates) else ""]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def mean_curves(arms: dict[str, dict[int, dict[str, Any]]]) -> dict[str, list[dict[str, float]]]:
    """Per arm, top-1 after each epoch averaged over the seeds that evaluated it."""
    return {f"{label}, {len(runs)} seeds": mean_curve([run["log"] for run in runs.values()])
            for label, runs in arms.items()}


def _arm(text: str) -> tuple[str, str]:
    label, sep, pattern = text.rpartition("=")
    if not sep or not label:
        raise argparse.ArgumentTypeError(f"{text!r}: give an arm as LABEL=GLOB, e.g. 'Learned K=1=runs/k1/topk1-s*'")
    return label, pattern


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("arms", nargs="+", type=_arm, metavar="LABEL=GLOB", help="an arm and its run folders")
    parser.add_argument("--reference", help="the label of the arm to pair the others with, by seed")
    parser.add_argument("--png", type=Path, help="also plot each arm's mean top-1 over epochs here")
    args = parser.parse_args(argv)
    try:
        arms = {label: {s: measures(p) for s, p in find_runs(pattern).items()} for label, pattern in args.arms}
    except ConnlearnError as exc:
        parser.error(str(exc))
    if args.reference and args.reference not in arms:
        parser.error(f"--reference {args.reference!r} is not one of the arms: {', '.join(arms)}")
    try:
        evaluated_on = eval_set(arms)
        text = table(arms, args.reference, evaluated_on)
        if args.png:
            plots.plot_training_curves(mean_curves(arms), args.png, keys=("test_top1",), eval_set=evaluated_on)
    except ConnlearnError as exc:
        parser.error(str(exc))
    print(text, end="")
    return text


if __name__ == "__main__":
    main()
