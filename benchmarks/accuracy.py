"""Learned vs Fixed-Full vs Fixed-Random vs real-valued gates on CIFAR-10: the paper's central claim.

Trains, for one architecture, budget and list of seeds, the arms ``full`` (ResNeXt), ``topk`` K=4
(GateConnect), ``random`` K=4 (Fixed-Random), ``real`` K=4 (real-valued gates) and optionally ``topk``
K=1, all with the paper's four-phase schedule scaled to the budget, the same data order per seed and the
same augmentation. Each run lives in ``OUT/<arm>-s<seed>``; ``OUT/sweep.json`` holds every finished run
and ``OUT/results.md`` the table in the paper's format (best and mean ± std of top-1, Params-Train,
Params-Test after pruning dead blocks, time), next to the paper's numbers. Running the same command
again skips finished runs and resumes an unfinished one from its last checkpoint, so a long sweep can
be split into pieces with ``--time-limit``.

    python benchmarks/accuracy.py --preset cifar-20-4-8 --budget 30 --seeds 0 1 --out runs/sweep
    python benchmarks/accuracy.py --budget 320 --arms full topk4 --seeds 0 --time-limit 540   # repeat
    python benchmarks/accuracy.py ... --val-split 5000      # choose settings on a validation split

Do not tune on the test set: use ``--val-split`` for every choice, the test set for final settings only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from connlearn import plots
from connlearn.experiment import CIFAR_PRESETS, CifarRun, run_cifar
from connlearn.train import read_jsonl
from connlearn.updater import GRAD_MODES

ARMS: dict[str, dict[str, Any]] = {
    "full": {"gate": "full", "K": None, "label": "Fixed-Full (ResNeXt)"},
    "topk4": {"gate": "topk", "K": 4, "label": "Learned, K=4"},
    "random4": {"gate": "random", "K": 4, "label": "Fixed-Random, K=4"},
    "real4": {"gate": "real", "K": 4, "label": "Real-valued gates, K=4"},
    "topk1": {"gate": "topk", "K": 1, "label": "Learned, K=1"},
}

#: The paper's CIFAR-10 table (appendix): best (mean ± std) over 4 runs of 320 epochs.
PAPER_CIFAR10 = {
    "cifar-20-4-8": {"full": "91.39 (91.13±0.11)", "topk4": "92.85 (92.76±0.10)"},
    "cifar-29-4-8": {"full": "92.77 (92.65±0.09)", "topk4": "93.88 (93.76±0.12)"},
    "cifar-29-8-8": {"full": "93.26 (93.14±0.11)", "topk4": "95.11 (94.96±0.12)"},
    "cifar-29-64-8": {"full": "96.35 (96.23±0.12)", "topk4": "96.83 (96.73±0.11)"},
}

ARCHITECTURE_OPTIONS = ("M", "C", "width", "base_channels", "stem_channels")
OVERRIDES = ("M", "C", "width", "base_channels", "stem_channels", "train_subset", "test_subset", "val_split",
             "batch_size", "gate_grad", "gate_lr", "gate_init", "device", "amp", "compile", "data")


def sweep(args: argparse.Namespace) -> dict[str, Any]:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    state_path = out / "sweep.json"
    state = json.loads(state_path.read_text()) if state_path.exists() else {"runs": {}}
    started = time.perf_counter()
    options = {k: getattr(args, k) for k in OVERRIDES if getattr(args, k) is not None}
    for seed in args.seeds:
        for arm in args.arms:
            name = f"{arm}-s{seed}"
            if name in state["runs"]:
                continue
            left = None if args.time_limit is None else args.time_limit - (time.perf_counter() - started)
            if left is not None and left <= 0:
                print(f"time limit reached before {name}; run the same command again to continue", flush=True)
                return state
            spec = ARMS[arm]
            run = CifarRun(dataset="cifar10", preset=args.preset, gate=spec["gate"], K=spec["K"], epochs=args.budget,
                           seed=seed, out=str(out / name), progress=not args.no_progress, **options)
            summary = run_cifar(run, time_limit=left)
            if summary is None:
                return state
            summary["arm"], summary["seed"] = arm, seed
            state["runs"][name] = summary
            state["config"] = {"preset": args.preset, "budget": args.budget, **options}
            state_path.write_text(json.dumps(state, indent=2))
            write_table(out, state)
    return state


def _mean_std(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{max(values):.2f} ({statistics.mean(values):.2f}±{statistics.stdev(values):.2f})"


def write_table(out: Path, state: dict[str, Any]) -> Path:
    """``results.md``: one row per arm, the paper's format, and a plot of test accuracy over epochs."""
    config = state.get("config", {})
    preset = config.get("preset", "")
    by_arm: dict[str, list[dict[str, Any]]] = {}
    for summary in state["runs"].values():
        by_arm.setdefault(summary["arm"], []).append(summary)
    evaluated_on = "validation split" if config.get("val_split") else "test set"
    changed = {k: config[k] for k in ARCHITECTURE_OPTIONS if config.get(k) is not None}
    arch = preset + (" with " + ", ".join(f"{k}={v}" for k, v in changed.items()) if changed else "")
    data = f", {config['train_subset']} training images" if config.get("train_subset") else ""
    lines = [
        f"{arch}, budget {config.get('budget')} epochs{data}, {evaluated_on}; top-1 = best (mean ± std) over seeds",
        "",
        "| method | K | seeds | Params-Train | Params-Test | top-1 (%) | paper, 320 epochs | epoch time | wall time |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for arm in [a for a in ARMS if a in by_arm]:
        runs = by_arm[arm]
        top1 = [r["test_top1"] for r in runs]
        paper = "" if changed else PAPER_CIFAR10.get(preset, {}).get(arm, "")
        lines.append(
            f"| {ARMS[arm]['label']} | {runs[0]['K']} | {len(runs)} | {runs[0]['params_train'] / 1e6:.3f}M | "
            f"{statistics.mean(r['params_test'] for r in runs) / 1e6:.3f}M | {_mean_std(top1)} | {paper} | "
            f"{statistics.mean(r['epoch_time_s'] for r in runs):.1f} s | "
            f"{sum(r['wall_time_s'] for r in runs) / 60:.1f} min |"
        )
    path = out / "results.md"
    path.write_text("\n".join(lines) + "\n")
    logs = {f"{r['arm']}-s{r['seed']}": read_jsonl(out / f"{r['arm']}-s{r['seed']}" / "log.jsonl")
            for r in state["runs"].values()}
    if logs:
        plots.plot_training_curves(logs, out / "accuracy_curves.png", keys=("test_top1",))
    return path


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="cifar-20-4-8", choices=CIFAR_PRESETS)
    parser.add_argument("--budget", type=int, default=30, help="total epochs of each run (paper: 320)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--arms", nargs="+", default=["full", "topk4", "random4", "real4"], choices=list(ARMS))
    parser.add_argument("--out", default="runs/sweep")
    parser.add_argument("--time-limit", type=float, help="seconds; start no new epoch after it (resume later)")
    parser.add_argument("--no-progress", action="store_true")
    for name in ("M", "C", "width", "base-channels", "stem-channels", "train-subset", "test-subset", "val-split",
                 "batch-size"):
        parser.add_argument(f"--{name}", type=int)
    parser.add_argument("--gate-grad", choices=GRAD_MODES)
    parser.add_argument("--gate-lr", type=float)
    parser.add_argument("--gate-init", type=lambda v: v if v == "uniform" else float(v))
    parser.add_argument("--device")
    parser.add_argument("--amp", choices=("auto", "bf16", "fp16", "none"))
    parser.add_argument("--compile", action="store_true", default=None)
    parser.add_argument("--data", help="CIFAR-10 location (else $CONNLEARN_DATA, else download)")
    args = parser.parse_args(argv)
    state = sweep(args)
    if (Path(args.out) / "results.md").exists():
        print((Path(args.out) / "results.md").read_text())
    return state


if __name__ == "__main__":
    main()
