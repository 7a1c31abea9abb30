"""Epoch time on CIFAR-10 per arm: the device-resident BatchLoader vs the torch DataLoader path.

For each architecture and arm of the accuracy sweep (``topk4`` by default, batch ``--batch``) it times a
training epoch through the trainer (bf16 on CUDA, optionally channels-last or ``torch.compile``), after
one that is not timed (it autotunes and compiles); ``--repeats N`` times N epochs and reports their
median. Each is timed once per loader path, beside the loaders alone (images/s without a model).
``--train-subset N`` times an epoch of N images and scales the time to the full 50,000 (reported as
extrapolated) for machines where a full epoch takes too long.

    python benchmarks/epoch.py --data ../shared/data/cifar10_jpeg.npz                 # full epochs
    python benchmarks/epoch.py --data ... --train-subset 2560 --archs cifar-20-4-8     # CPU: part of one
    python benchmarks/epoch.py --data ... --archs cifar-20-4-8 --arms full topk4 random4 real4 --paths resident

Target (H100): one epoch of {29,8,8} K=4 in at most 6 s.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from datetime import date

import torch

import connlearn
from connlearn.train.data import load_dataset, synthetic
from connlearn.train.loaders import make_loaders
from connlearn.train.options import COMPILE_MODES, RunConfig
from connlearn.train.recipe import Phase, Recipe
from connlearn.train.trainer import Trainer

FULL_EPOCH = 50_000
ARMS = {"full": ("full", None), "topk4": ("topk", 4), "random4": ("random", 4), "real4": ("real", 4),
        "topk1": ("topk", 1), "random1": ("random", 1)}


def loader_throughput(loader) -> float:
    """Images per second of iterating one epoch of ``loader`` (no model)."""
    t0, seen = time.perf_counter(), 0
    for x, _ in loader.epoch(0):
        seen += len(x)
    if x.is_cuda:
        torch.cuda.synchronize(x.device)
    return seen / (time.perf_counter() - t0)


def epoch_times(arch: str, arm: str, loader, device: torch.device, compile: str | None, channels_last: bool,
                repeats: int = 1) -> list[float]:
    """Seconds of ``repeats`` phase-1 training epochs (gates learning) of ``arm`` on ``arch`` with ``loader``,
    after one more that is not timed: it pays for cuDNN's autotuning and, with ``compile``, for compilation."""
    gate, K = ARMS[arm]
    net = connlearn.build(preset=arch, gate=gate, K=K, num_classes=10)
    recipe = Recipe("bench", [Phase(1 + repeats, 0.1, gate_lr=0.2)])
    with tempfile.TemporaryDirectory() as out:
        trainer = Trainer(net, loader, None, recipe, RunConfig(out=out, device=str(device), compile=compile or False,
                                                               channels_last=channels_last, snapshot_every=0,
                                                               progress=False))
        return [r["epoch_time"] for r in trainer.fit()[1:]]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", help="CIFAR-10 location (else $CONNLEARN_DATA, else download)")
    parser.add_argument("--synthetic", action="store_true", help="a generated stand-in of CIFAR-10 (a smoke run)")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--archs", nargs="+", default=["cifar-20-4-8", "cifar-29-8-8"])
    parser.add_argument("--arms", nargs="+", default=["topk4"], choices=list(ARMS))
    parser.add_argument("--paths", nargs="+", default=["resident", "dataloader"], choices=("resident", "dataloader"))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--train-subset", type=int, help="time an epoch of this many images and scale it")
    parser.add_argument("--workers", type=int, default=4, help="DataLoader workers")
    parser.add_argument("--compile", nargs="?", const="default", choices=COMPILE_MODES, metavar="MODE")
    parser.add_argument("--channels-last", action="store_true")
    parser.add_argument("--repeats", type=int, default=1, help="timed epochs per configuration (the median is "
                        "reported, every time in the JSON); default 1")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1, got {args.repeats}")
    device = torch.device(args.device)
    train, test = synthetic(10, 500, 100, 32, 0) if args.synthetic else load_dataset("cifar10", args.data)
    if args.train_subset:
        train = train.subset(args.train_subset)
    scale = FULL_EPOCH / len(train)
    cuda = device.type == "cuda"
    makers = {
        "resident": lambda: make_loaders(train, test, args.batch, device=device, channels_last=args.channels_last)[0],
        "dataloader": lambda: make_loaders(train, test, args.batch, device=device, path="dataloader",
                                           num_workers=args.workers, pin_memory=cuda,
                                           channels_last=args.channels_last)[0],
    }
    paths = {k: makers[k]() for k in args.paths}
    threads = torch.get_num_threads()
    name = torch.cuda.get_device_name(device) if cuda else f"CPU ({platform.machine()}, {threads} threads)"
    results = {"device": name, "date": str(date.today()), "images": len(train), "extrapolated": scale != 1,
               "loader_images_per_s": {k: loader_throughput(v) for k, v in paths.items()}, "repeats": args.repeats,
               "epoch_s": {}, "epoch_s_each": {}}
    for arch in args.archs:
        for arm in args.arms:
            each = {k: [t * scale for t in epoch_times(arch, arm, v, device, args.compile, args.channels_last,
                                                       args.repeats)] for k, v in paths.items()}
            row = {k: statistics.median(times) for k, times in each.items()}
            results["epoch_s"].setdefault(arch, {})[arm] = row
            results["epoch_s_each"].setdefault(arch, {})[arm] = each
            print(arch, arm, each, flush=True)
    note = f" (timed on {len(train)} images, scaled to 50,000)" if scale != 1 else ""
    note += f", median of {args.repeats} epochs" if args.repeats > 1 else ""
    options = f", torch.compile ({args.compile})" if args.compile else ""
    options += ", channels-last" if args.channels_last else ""
    print(f"\n{name}, {date.today()}, batch {args.batch}{options}{note}\n")
    both = len(paths) == 2
    header = " | ".join(f"{k} loader" for k in paths) + (" | DataLoader / resident |" if both else " |")
    print("| arch | arm | " + header)
    print("| --- | --- | " + " | ".join("---" for _ in paths) + (" | --- |" if both else " |"))
    for arch, arms in results["epoch_s"].items():
        for arm, row in arms.items():
            ratio = f" {row['dataloader'] / row['resident']:.2f} |" if both else ""
            print(f"| {arch} | {arm} | " + " | ".join(f"{t:.1f} s" for t in row.values()) + " |" + ratio)
    rates = ", ".join(f"{k} {v:.0f} img/s" for k, v in results["loader_images_per_s"].items())
    print(f"\nloaders alone: {rates}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
