"""Does recomputing the batch norms' statistics for the final connectivity move a learned run's top-1?

For each finished run folder: its ``last.pt`` evaluated as trained (which must give the run's own
``test_top1``), then again after :func:`~connlearn.train.metrics.recalibrate_batch_norm` over ``--batches``
batches of the run's training loader, on the run's evaluation set; then the paired difference over the runs.
It is what ``connlearn train --recalibrate-bn N`` does at a run's end, measured on runs made without it.

    python benchmarks/recalibrate.py benchmarks/studies/verdict/results_alike/learned-s* --batches 100
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from connlearn.train.checkpoint import net_from_checkpoint
from connlearn.train.metrics import evaluate, recalibrate_batch_norm
from connlearn.train.protocol import RunConfig, load_data, run_loaders


def before_and_after(folder: Path, batches: int) -> tuple[float, float, float]:
    """The run's logged top-1, its checkpoint's top-1 as trained and after recalibration."""
    summary = json.loads((folder / "summary.json").read_text())
    config = RunConfig(**summary["run"])
    train, test, _, _ = load_data(config)
    train_loader, test_loader, _ = run_loaders(config, train, test, device=torch.device("cpu"))
    net = net_from_checkpoint(folder / "last.pt")
    before = evaluate(net, test_loader)["test_top1"]
    recalibrate_batch_norm(net, train_loader.epoch(0), batches)
    return summary["test_top1"], before, evaluate(net, test_loader)["test_top1"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="finished run folders")
    parser.add_argument("--batches", type=int, default=200, help="training batches to recompute them over")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("| run | logged | as trained | recalibrated | change |\n| --- | --- | --- | --- | --- |")
    changes = []
    for folder in args.runs:
        logged, before, after = before_and_after(folder, args.batches)
        changes.append(after - before)
        print(f"| {folder.name} | {logged:.2f} | {before:.2f} | {after:.2f} | {after - before:+.2f} |", flush=True)
    sd = statistics.stdev(changes) if len(changes) > 1 else float("nan")
    print(f"\nrecalibrated minus as trained, {len(changes)} runs, {args.batches} batches: "
          f"{statistics.mean(changes):+.2f} ± {sd:.2f} (sd)")


if __name__ == "__main__":
    main()
