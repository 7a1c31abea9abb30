"""Training-step speed and memory: every gate kind against Fixed-Random, Fixed-Full against a plain ResNeXt.

A step is forward + backward + SGD step at ``--batch`` on random data, timed as the median of ``--repeats`` steps
after ``--warmup``, every configuration in one run so that ratios compare like with like. On CUDA: bf16 autocast
and cuDNN autotuning, as the Trainer. The plain ResNeXt is the tests' oracle (``tests/plain_resnext.py``).
``--compile`` adds topk and full under ``torch.compile``; ``--memory`` their peak memory of a step above what was
allocated before it (activations and gradients), with and without activation checkpointing, and its time; every
run ends with eval-mode inference of a Fixed-Random K=1 network before and after pruning its dead blocks.

    python benchmarks/speed.py                                        # CPU (or --device cuda)
    python benchmarks/speed.py --archs cifar-20-4-8 --gates topk random gumbel simple imle score magnitude
    python benchmarks/speed.py --archs cifar-20-4-8 --compile reduce-overhead --json speed.json
    python benchmarks/speed.py --archs cifar-20-4-8 cifar-29-8-8 --memory --batch 64

Targets (GPU): topk <= 1.03x random; full <= 1.05x the plain ResNeXt. Results go in BENCHMARKS.md with the
device, date, command and number of runs.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import platform
import statistics
import time
from datetime import date
from pathlib import Path

import torch

import connlearn
from connlearn.prune import prune_dead_blocks
from connlearn.topologies import PRESETS
from connlearn.train.options import COMPILE_MODES

ORACLE = Path(__file__).resolve().parent.parent / "tests" / "plain_resnext.py"


def plain_resnext(preset: str) -> torch.nn.Module:
    """The tests' plainly written CIFAR ResNeXt of ``preset``."""
    spec = importlib.util.spec_from_file_location("plain_resnext", ORACLE)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    p = PRESETS[preset]
    base, stem = (256, 64) if p["width"] >= 64 else (64, 16)
    return module.PlainResNeXt(p["C"], p["width"], (p["depth"] - 2) // 9, stem, base, 100)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> None:
    """Forward (bf16 autocast on CUDA), backward, optimizer step; not synchronised."""
    cast = torch.autocast("cuda", dtype=torch.bfloat16) if x.is_cuda else contextlib.nullcontext()
    with cast:
        loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


def median_time(step, device: torch.device, warmup: int, repeats: int) -> float:
    """Median seconds of ``step()`` over ``repeats`` calls after ``warmup``."""
    times = []
    for i in range(warmup + repeats):
        _sync(device)
        t0 = time.perf_counter()
        step()
        _sync(device)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def peak_bytes(step, device: torch.device) -> int:
    """The peak memory allocated during ``step()`` above what was allocated before it: CUDA's counter, or on the
    CPU the largest running sum of the allocations and frees that ``torch.profiler`` records."""
    _sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        step()
        _sync(device)
        return torch.cuda.max_memory_allocated(device) - before
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    held = peak = 0
    for _, change in sorted((e.time_range.start, e.self_cpu_memory_usage) for e in prof.events()
                            if e.self_cpu_memory_usage):
        held += change
        peak = max(peak, held)
    return peak


def measure(model: torch.nn.Module, args: argparse.Namespace, memory: bool = False) -> dict[str, float]:
    """Step time (and with ``memory`` the step's peak MB) of ``model`` at ``args.batch``."""
    model = model.to(args.device).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(args.batch, 3, 32, 32, device=args.device)
    y = torch.randint(0, 10, (args.batch,), device=args.device)

    def step() -> None:
        train_step(model, opt, x, y)

    row = {"step_s": median_time(step, torch.device(args.device), args.warmup, args.repeats)}
    if memory:  # after the timed steps: the optimizer's state exists, as in training
        row["peak_mb"] = peak_bytes(step, torch.device(args.device)) / 2**20
    return row


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--archs", nargs="+", default=["cifar-20-4-8", "cifar-29-8-8"], choices=sorted(PRESETS))
    parser.add_argument("--gates", nargs="+", default=["topk", "random"], help="gate kinds timed at K=4")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--compile", nargs="?", const="default", choices=COMPILE_MODES, metavar="MODE")
    parser.add_argument("--memory", action="store_true", help="also topk and full with activation checkpointing")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)
    torch.backends.cudnn.benchmark = True
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else (
        f"CPU ({platform.machine()}, {torch.get_num_threads()} threads)")
    results: dict[str, dict[str, dict[str, float]]] = {}
    for arch in args.archs:
        configs = {gate: lambda g=gate, a=arch: connlearn.build(preset=a, gate=g, K=4, num_classes=10)
                   for gate in args.gates}
        configs["full"] = lambda a=arch: connlearn.build(preset=a, gate="full", num_classes=10)
        configs["plain ResNeXt"] = lambda a=arch: plain_resnext(a)
        for label in ("topk", "full") if args.compile else ():
            configs[f"{label}, compiled"] = lambda make=configs[label]: torch.compile(make(), mode=args.compile)
        row = results[arch] = {label: measure(make(), args, args.memory and label in ("topk", "full"))
                               for label, make in configs.items()}
        for label in ("topk", "full") if args.memory else ():
            net = configs[label]()
            net.activation_checkpointing = True
            row[f"{label}, checkpointed"] = measure(net, args, memory=True)
        for label, r in row.items():
            print(f"{arch:14s} {label:24s} " + "  ".join(f"{k} {v:.4g}" for k, v in r.items()), flush=True)
    net = connlearn.build(preset=args.archs[-1], gate="random", K=1, seed=0, num_classes=10)
    pruned, report = prune_dead_blocks(net)
    net, pruned = net.to(device).eval(), pruned.to(device).eval()
    x = torch.randn(args.batch, 3, 32, 32, device=device)
    with torch.no_grad():
        inference = {label: median_time(lambda m=m: m(x), device, args.warmup, args.repeats)
                     for label, m in (("unpruned", net), ("pruned", pruned))}
    print(f"\n{name}, {date.today()}, batch {args.batch}, median of {args.repeats} steps after {args.warmup}\n")
    print("| arch | " + " | ".join(results[args.archs[0]]) + " | topk/random | full/plain |")
    print("| --- " * (len(results[args.archs[0]]) + 3) + "|")
    for arch, row in results.items():
        ratios = [row["topk"]["step_s"] / row["random"]["step_s"] if {"topk", "random"} <= row.keys() else None,
                  row["full"]["step_s"] / row["plain ResNeXt"]["step_s"]]
        print(f"| {arch} | " + " | ".join(f"{1000 * r['step_s']:.1f} ms" + (
            f", {r['peak_mb']:.0f} MB" if "peak_mb" in r else "") for r in row.values()) + " | " +
            " | ".join("-" if v is None else f"{v:.3f}" for v in ratios) + " |")
    print(f"\npruned K=1 Fixed-Random {args.archs[-1]} ({report}): inference "
          f"{inference['unpruned'] / inference['pruned']:.2f}x faster")
    out = {"device": name, "date": str(date.today()), "batch": args.batch, "repeats": args.repeats,
           "warmup": args.warmup, "compile": args.compile, "train_step": results, "inference_s": inference}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
