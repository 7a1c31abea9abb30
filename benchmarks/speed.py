"""Training-step speed: fused vs reference engine, topk vs random vs full, and a plain ResNeXt.

A step is forward + backward + SGD step at batch 128 on random data; each configuration is timed as the
median of ``--repeats`` steps after ``--warmup`` steps, all in one run so that ratios compare like with
like. On CUDA it uses bf16 autocast and cuDNN autotuning (``cudnn.benchmark``, as the Trainer does), in
contiguous memory format unless ``--channels-last``. It also times eval-mode inference of a K=1
Fixed-Random {29,8,8} net before and after pruning its dead blocks.

    python benchmarks/speed.py                          # CPU (or --device cuda)
    python benchmarks/speed.py --archs cifar-20-4-8 --repeats 5 --json speed.json
    python benchmarks/speed.py --archs cifar-20-4-8 --skip-reference --compile reduce-overhead
    python benchmarks/speed.py --archs cifar-20-4-8 --dims 1 0       # also signals and vectors: fused vs reference
    python benchmarks/speed.py --archs cifar-20-4-8 --kernels 1 3 5  # also unlike branches: fused vs reference

Targets (GPU): fused >= 4x faster than reference; topk <= 1.03x random; full <= 1.05x the plain ResNeXt.
``--dims`` adds the same network over signals (3 channels of length 1,024) and vectors (3,072 features), the
same numbers per example as a 3x32x32 image, and ``--kernels`` the same network with unlike branches (their
middle kernels cycling over the list): the fused engine must stay at least as fast as the reference.
Results go in BENCHMARKS.md with the device, date, command and number of runs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import statistics
import time
from datetime import date

import torch
from plain_resnext import PlainResNeXt

import connlearn
from connlearn.prune import prune_dead_blocks
from connlearn.topologies import PRESETS
from connlearn.train.trainer import COMPILE_MODES


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _autocast(device: torch.device):
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext()


def profile_train_step(model: torch.nn.Module, device: torch.device, batch: int,
                       memory: torch.memory_format = torch.contiguous_format, steps: int = 5) -> str:
    """torch.profiler's table of ``steps`` training steps (after 3 warm-up steps), by self device time."""
    from torch.profiler import ProfilerActivity, profile

    time_train_step(model, device, batch, 3, 1, memory)  # builds the optimizer state, autotunes
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        time_train_step(model, device, batch, 0, steps, memory)
    key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=key, row_limit=16, max_name_column_width=60)


def train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> None:
    """One training step: forward (bf16 autocast on CUDA), backward, optimizer step; not synchronised."""
    with _autocast(x.device):
        loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


def time_train_step(model: torch.nn.Module, device: torch.device, batch: int, warmup: int, repeats: int,
                    memory: torch.memory_format = torch.contiguous_format) -> float:
    """Median seconds of a training step."""
    model = model.to(device, memory_format=memory).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(batch, *_example(model), device=device)
    x = x.contiguous(memory_format=memory) if x.dim() == 4 else x
    y = torch.randint(0, 100, (batch,), device=device)
    times = []
    for i in range(warmup + repeats):
        _sync(device)
        t0 = time.perf_counter()
        train_step(model, opt, x, y)
        _sync(device)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


@torch.no_grad()
def time_inference(model: torch.nn.Module, device: torch.device, batch: int, warmup: int, repeats: int,
                   memory: torch.memory_format = torch.contiguous_format) -> float:
    model = model.to(device, memory_format=memory).eval()
    x = torch.randn(batch, 3, 32, 32, device=device).contiguous(memory_format=memory)
    times = []
    for i in range(warmup + repeats):
        _sync(device)
        t0 = time.perf_counter()
        with _autocast(device):
            model(x)
        _sync(device)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _example(model: torch.nn.Module) -> tuple[int, ...]:
    """One example's shape: the network's own (signals, vectors), else a 3x32x32 image."""
    return (model.in_channels, *model.input_size) if hasattr(model, "input_size") else (3, 32, 32)


#: --dims: the build options of each input (as many numbers per example as a 3x32x32 image)
SHAPES = {1: {"in_channels": 3, "input_size": (1024,)}, 0: {"in_channels": 3072, "input_size": ()}}


def plain_for(preset: str) -> PlainResNeXt:
    p = PRESETS[preset]
    base, stem = (256, 64) if p["width"] >= 64 else (64, 16)
    return PlainResNeXt(p["C"], p["width"], (p["depth"] - 2) // 9, stem, base, 100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--archs", nargs="+", default=["cifar-20-4-8", "cifar-29-8-8"])
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--warmup", type=int, default=None, help="default 3 on CUDA, 1 on CPU")
    parser.add_argument("--repeats", type=int, default=None, help="default 20 on CUDA, 3 on CPU")
    parser.add_argument("--skip-reference", action="store_true", help="leave out the (slow) reference engine")
    parser.add_argument("--channels-last", action="store_true", help="time in channels-last memory format")
    parser.add_argument("--profile", action="store_true",
                        help="also print torch.profiler's table of 5 steps of fused topk K=4 on the first arch")
    parser.add_argument("--compile", nargs="?", const="default", metavar="MODE",
                        choices=COMPILE_MODES,
                        help="also time fused topk K=4 and full under torch.compile (the warm-up compiles)")
    parser.add_argument("--dims", nargs="*", type=int, default=[], choices=(1, 0),
                        help="also time fused and reference topk K=4 over signals (1) and vectors (0)")
    parser.add_argument("--kernels", nargs="+", type=int, default=[],
                        help="also time fused and reference topk K=4 with these middle kernels (unlike branches)")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    device = torch.device(args.device)
    memory = torch.channels_last if args.channels_last else torch.contiguous_format
    torch.backends.cudnn.benchmark = True
    warmup = args.warmup if args.warmup is not None else (3 if device.type == "cuda" else 1)
    repeats = args.repeats if args.repeats is not None else (20 if device.type == "cuda" else 3)
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = f"CPU ({platform.machine()}, {torch.get_num_threads()} threads)"
    results: dict[str, dict[str, float]] = {}
    for arch in args.archs:
        row: dict[str, float] = {}
        configs = {
            "fused topk K=4": lambda a=arch: connlearn.build(preset=a, gate="topk", K=4),
            "fused random K=4": lambda a=arch: connlearn.build(preset=a, gate="random", K=4),
            "full (ResNeXt)": lambda a=arch: connlearn.build(preset=a, gate="full"),
            "plain ResNeXt": lambda a=arch: plain_for(a),
        }
        if not args.skip_reference:
            configs["reference topk K=4"] = lambda a=arch: connlearn.build(preset=a, gate="topk", K=4,
                                                                          engine="reference")
        for dims in args.dims:
            for engine in ("fused", "reference"):
                configs[f"{engine} topk K=4, {dims}-D"] = lambda a=arch, e=engine, d=dims: connlearn.build(
                    preset=a, gate="topk", K=4, engine=e, **SHAPES[d])
        if args.kernels:
            for engine in ("fused", "reference"):
                configs[f"{engine} topk K=4, unlike"] = lambda a=arch, e=engine: connlearn.build(
                    preset=a, gate="topk", K=4, engine=e, kernels=args.kernels)
        if args.compile:
            for label in ("fused topk K=4", "full (ResNeXt)"):
                configs[f"{label}, compiled"] = lambda make=configs[label]: torch.compile(make(), mode=args.compile)
        for label, make in configs.items():
            steps = max(warmup, 2) if label.endswith("compiled") else warmup
            row[label] = time_train_step(make(), device, args.batch, steps, repeats, memory)
            print(f"{arch:14s} {label:28s} {1000 * row[label]:10.1f} ms/step", flush=True)
        results[arch] = row
    if args.profile:
        print(f"\nprofile of 5 steps, fused topk K=4, {args.archs[0]}:")
        print(profile_train_step(connlearn.build(preset=args.archs[0], gate="topk", K=4), device, args.batch, memory))
    net = connlearn.build(preset="cifar-29-8-8", gate="random", K=1, seed=0)
    pruned, report = prune_dead_blocks(net)
    inference = {
        "unpruned": time_inference(net, device, args.batch, warmup, repeats, memory),
        "pruned": time_inference(pruned, device, args.batch, warmup, repeats, memory),
        "params_before": report.params_before, "params_after": report.params_after,
    }
    print(f"inference {{29,8,8}} K=1 random: unpruned {1000 * inference['unpruned']:.1f} ms, "
          f"pruned {1000 * inference['pruned']:.1f} ms ({report})")

    layout = "channels-last" if args.channels_last else "contiguous"
    print(f"\n{name}, {date.today()}, batch {args.batch}, {layout}, median of {repeats} steps after {warmup} warm-up\n")
    print("| arch | fused topk | fused random | reference topk | full | plain ResNeXt | reference/fused | "
          "topk/random | full/plain |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for arch, row in results.items():
        ref = row.get("reference topk K=4")
        cells = [row["fused topk K=4"], row["fused random K=4"], ref, row["full (ResNeXt)"], row["plain ResNeXt"]]
        ms = " | ".join("-" if c is None else f"{1000 * c:.1f} ms" for c in cells)
        speedup = "-" if ref is None else f"{ref / row['fused topk K=4']:.2f}x"
        print(f"| {arch} | {ms} | {speedup} | {row['fused topk K=4'] / row['fused random K=4']:.3f} | "
              f"{row['full (ResNeXt)'] / row['plain ResNeXt']:.3f} |")
    if args.dims:
        print("\n| arch | input | fused topk | reference topk | reference/fused |\n| --- | --- | --- | --- | --- |")
        for arch, row in results.items():
            for dims in args.dims:
                fused, ref = row[f"fused topk K=4, {dims}-D"], row[f"reference topk K=4, {dims}-D"]
                what = "signals 3x1024" if dims else "vectors of 3072"
                print(f"| {arch} | {what} | {1000 * fused:.1f} ms | {1000 * ref:.1f} ms | {ref / fused:.2f}x |")
    if args.kernels:
        kernels = " ".join(map(str, args.kernels))
        print("\n| arch | middle kernels | fused topk | reference topk | reference/fused |")
        print("| --- | --- | --- | --- | --- |")
        for arch, row in results.items():
            fused, ref = row["fused topk K=4, unlike"], row["reference topk K=4, unlike"]
            print(f"| {arch} | {kernels} | {1000 * fused:.1f} ms | {1000 * ref:.1f} ms | {ref / fused:.2f}x |")
    if args.compile:
        print(f"\ntorch.compile (mode {args.compile}), eager / compiled step time:")
        for arch, row in results.items():
            print(f"  {arch}: fused topk K=4 {row['fused topk K=4'] / row['fused topk K=4, compiled']:.2f}x, "
                  f"full {row['full (ResNeXt)'] / row['full (ResNeXt), compiled']:.2f}x")
    speedup = inference["unpruned"] / inference["pruned"]
    print(f"\npruned inference speed-up, {{29,8,8}} K=1 Fixed-Random: {speedup:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": name, "date": str(date.today()), "batch": args.batch,
                       "channels_last": args.channels_last, "compile": args.compile, "kernels": args.kernels,
                       "repeats": repeats, "warmup": warmup, "train_step_s": results, "inference_s": inference},
                      f, indent=2)


if __name__ == "__main__":
    main()
