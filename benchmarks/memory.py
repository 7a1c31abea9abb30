"""Memory of a training step, with and without ``activation_checkpointing``, and what it costs in time.

For each architecture and arm, one run measures the peak memory allocated during a training step
(forward + backward + SGD step at ``--batch`` on random data, above what was allocated before it: the
activations and gradients, not the weights or the optimizer's state) and the median step time (bf16
autocast on CUDA, as ``speed.py`` times it). On CUDA the peak is ``torch.cuda.max_memory_allocated``; on
the CPU, the largest running sum of the step's allocations and frees as ``torch.profiler`` records them
(``profile_memory=True``). Ratios are taken within the run.

    python benchmarks/memory.py                                  # CPU (or --device cuda)
    python benchmarks/memory.py --archs cifar-29-8-8 --batch 128 --json memory.json

Results go in BENCHMARKS.md with the device, date, command and number of runs.
"""

from __future__ import annotations

import argparse
import json
import platform
from datetime import date

import torch
from speed import _sync, time_train_step, train_step

import connlearn
from connlearn.topologies import PRESETS

ARMS = {"topk4": {"gate": "topk", "K": 4}, "full": {"gate": "full"}}


def peak_step_bytes(net: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> int:
    """The peak memory allocated during one training step of ``net`` above what was allocated before it."""
    net.train()
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    train_step(net, opt, x, y)  # makes the optimizer's state
    _sync(x.device)
    opt.zero_grad(set_to_none=True)
    if x.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(x.device)
        before = torch.cuda.memory_allocated(x.device)
        train_step(net, opt, x, y)
        _sync(x.device)
        return torch.cuda.max_memory_allocated(x.device) - before
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        train_step(net, opt, x, y)
    changes = sorted((e.time_range.start, e.self_cpu_memory_usage) for e in prof.events() if e.self_cpu_memory_usage)
    held = peak = 0
    for _, change in changes:
        held += change
        peak = max(peak, held)
    return peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--archs", nargs="+", default=["cifar-20-4-8"], choices=sorted(PRESETS))
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--warmup", type=int, default=None, help="default 3 on CUDA, 1 on CPU")
    parser.add_argument("--repeats", type=int, default=None, help="default 20 on CUDA, 3 on CPU")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    warmup = args.warmup if args.warmup is not None else (3 if cuda else 1)
    repeats = args.repeats if args.repeats is not None else (20 if cuda else 3)
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    x = torch.randn(args.batch, 3, 32, 32, device=device)
    y = torch.randint(0, 100, (args.batch,), device=device)
    rows = []
    for arch in args.archs:
        for arm in args.arms:
            row: dict = {"arch": arch, "arm": arm}
            for checkpointing in (False, True):
                net = connlearn.build(preset=arch, **ARMS[arm]).to(device)
                net.activation_checkpointing = checkpointing
                key = "checkpointed" if checkpointing else "plain"
                row[f"{key}_peak_mb"] = peak_step_bytes(net, x, y) / 2**20
                row[f"{key}_step_s"] = time_train_step(net, device, args.batch, warmup, repeats)
                del net
            row["peak_ratio"] = row["checkpointed_peak_mb"] / row["plain_peak_mb"]
            row["time_ratio"] = row["checkpointed_step_s"] / row["plain_step_s"]
            rows.append(row)
            print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
    if args.json:
        info = {"date": date.today().isoformat(), "device": torch.cuda.get_device_name(device) if cuda else
                platform.processor() or platform.machine(), "torch": torch.__version__, "batch": args.batch,
                "warmup": warmup, "repeats": repeats, "threads": torch.get_num_threads()}
        with open(args.json, "w") as f:
            json.dump({"info": info, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
