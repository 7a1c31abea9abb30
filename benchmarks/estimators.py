"""Which K-of-C estimators learn? The gate kinds of ``connlearn.estimators`` beside the paper's rule, on the
reduced CIFAR-10 network and the planted setup of the CPU studies (BENCHMARKS.md, docs/results/cpu_planted.md).

    python benchmarks/estimators.py planted --seeds 0 1 2 --out runs/estimators/planted
    python benchmarks/estimators.py unplanted --arms simple4 gumbel4 imle4 --seeds 0 1 2 3 4 \\
        --out runs/estimators/unplanted
    python benchmarks/estimators.py speed --steps 40
    python benchmarks/estimators.py report --planted runs/estimators/planted --unplanted runs/estimators/unplanted

- ``planted``: every arm (:data:`ARMS`) on the planted network (branches 5-8 of module 1 output noise), with
  Fixed-Random and the oracle (module 2 reads only informative branches) as baselines;
- ``unplanted``: the given arms and Fixed-Random on the plain network, then each learned connectivity trained
  again from scratch (``--connectivity``), which separates what the connectivity is worth from what learning it
  cost;
- ``speed``: the training step time of each gate kind against ``random``, measured in one process;
- ``report``: the tables (markdown) of what the folders hold.

Every run is ``connlearn train`` (via ``planted.py`` for the planted task) with :data:`COMMON` options: 5,000
training images, the 2,500-image validation split, 16 epochs (6/5/3/2) at batch 32, one thread per run; it
lives in ``OUT/<arm>-s<seed>``, and the same command again skips finished runs and resumes unfinished ones.
The commands run unchanged on a GPU with ``--device cuda``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

import connlearn
from connlearn.files import read_jsonl

HERE = Path(__file__).resolve().parent
#: the reduced network (a learned connectivity retrained from scratch brings its own)
NETWORK = ["--preset", "cifar-20-4-8", "--M", "3", "--C", "8", "--width", "2", "--base-channels", "16",
           "--stem-channels", "16"]
COMMON = ["--dataset", "cifar10", "--epochs", "16", "--batch-size", "32", "--train-subset", "5000",
          "--val-split", "2500", "--snapshot-every", "50", "--no-progress"]
#: arm -> the options it adds (the oracle's is planted.py's own flag)
ARMS = {
    "random4": ["--gate", "random", "--K", "4"],
    "oracle4": ["--gate", "random", "--K", "4"],
    "topk4": ["--gate", "topk", "--K", "4"],
    "topk4ca": ["--gate", "topk", "--K", "4", "--gate-rule", "centered", "--gate-temperature-end", "0.05"],
    **{f"{kind}4": ["--gate", kind, "--K", "4"] for kind in ("gumbel", "simple", "imle", "score", "magnitude")},
}
LABELS = {"random4": "Fixed-Random", "oracle4": "oracle (planted answer)", "topk4": "topk, the paper's rule",
          "topk4ca": "topk, centred, T 1→0.05", "gumbel4": "gumbel", "simple4": "simple", "imle4": "imle",
          "score4": "score", "magnitude4": "magnitude"}
UNINFORMATIVE = ["5", "6", "7", "8"]


def _command(task: str, arm: str, seed: int, out: Path, device: str) -> list[str]:
    """The command of one run; ``retrained-ARM`` trains ARM's learned connectivity from scratch."""
    train = [*COMMON, "--seed", str(seed), "--out", str(out), "--device", device]
    if arm.startswith("retrained-"):
        train += ["--connectivity", str(out.parent / f"{arm.removeprefix('retrained-')}-s{seed}" / "last.pt")]
    else:
        train += [*NETWORK, *ARMS[arm]]
    if task == "unplanted":
        return [sys.executable, "-m", "connlearn.cli", "train", *train]
    oracle = ["--oracle"] if arm.startswith("oracle") else []
    return [sys.executable, str(HERE / "planted.py"), "--uninformative", *UNINFORMATIVE, *oracle, "--", *train]


def run_all(task: str, runs: list[tuple[str, int]], out: Path, parallel: int, device: str,
            time_limit: float | None) -> None:
    """Train ``runs`` (arm, seed), ``parallel`` at a time, each a process of one thread; skip finished ones."""
    queue = [(a, s) for a, s in runs if not (out / f"{a}-s{s}" / "summary.json").exists()]
    started, running = time.perf_counter(), {}
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    while queue or running:
        while queue and len(running) < parallel and (time_limit is None or time.perf_counter() - started < time_limit):
            arm, seed = queue.pop(0)
            folder = out / f"{arm}-s{seed}"
            folder.mkdir(parents=True, exist_ok=True)
            log = open(folder / "output.log", "a")  # noqa: SIM115 (closed when the run ends)
            command = _command(task, arm, seed, folder, device)
            running[folder.name] = (subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env), log)
            print(f"started {folder.name}", flush=True)
        if time_limit is not None and time.perf_counter() - started >= time_limit:
            queue.clear()
        time.sleep(2.0)
        for name, (proc, log) in list(running.items()):
            if proc.poll() is not None:
                log.close()
                del running[name]
                print(f"{name}: {'finished' if proc.returncode == 0 else f'exit {proc.returncode}'}", flush=True)


def speed(steps: int, device: str, rounds: int = 5) -> str:
    """The training step time of each gate kind on the reduced network (batch 32), against ``random``: the kinds
    interleaved over ``rounds`` rounds (the first a warm-up), each kind's median step of each round, then the
    median over the rounds."""
    torch.set_num_threads(1)
    kinds = ["random", "topk", "gumbel", "simple", "imle", "score", "magnitude"]
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(32, 3, 32, 32, generator=g).to(device), torch.randint(0, 10, (32,), generator=g).to(device)
    times: dict[str, list[float]] = {kind: [] for kind in kinds}
    for kind in kinds * rounds:
        net = connlearn.build(preset="cifar-20-4-8", M=3, C=8, width=2, base_channels=16, stem_channels=16,
                              num_classes=10, gate=kind, K=4).to(device)
        opt = torch.optim.SGD(connlearn.updater.param_groups(net, 0.1, 5e-4, 0.2), lr=0.1, momentum=0.9)
        connlearn.updater.GateUpdater(net).attach(opt)
        samples = []
        for _ in range(steps):
            t0 = time.perf_counter()
            losses = torch.nn.functional.cross_entropy(net(x), y, reduction="none")
            opt.zero_grad()
            (losses.mean() + net.surrogate_loss(losses)).backward()
            opt.step()
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            samples.append(time.perf_counter() - t0)
        times[kind].append(statistics.median(samples[steps // 4:]))
    median = {kind: statistics.median(t[1:]) for kind, t in times.items()}
    rows = ["| gate kind | step (ms) | against random |", "| --- | --- | --- |"]
    rows += [f"| {k} | {1000 * t:.1f} | {t / median['random']:.2f}x |" for k, t in median.items()]
    return "\n".join(rows)


def _runs(folder: Path) -> dict[str, dict[int, dict]]:
    """arm -> seed -> summary of the finished runs in ``folder``."""
    found: dict[str, dict[int, dict]] = {}
    for path in sorted(folder.glob("*-s*/summary.json")):
        arm, seed = path.parent.name.rsplit("-s", 1)
        found.setdefault(arm, {})[int(seed)] = json.loads(path.read_text())
    return found


def _paired(runs: dict[int, dict], against: dict[int, dict]) -> str:
    diffs = [runs[s]["test_top1"] - against[s]["test_top1"] for s in runs if s in against]
    if not diffs:
        return ""
    spread = f" ± {statistics.stdev(diffs):.2f}" if len(diffs) > 1 else ""
    return f"{statistics.mean(diffs):+.2f}{spread} ({sum(d > 0 for d in diffs)} of {len(diffs)} above)"


def _top1(runs: dict[int, dict]) -> str:
    """Validation top-1: mean ± std, and each seed's."""
    if not runs:
        return ""
    seeds = ", ".join(f"{runs[s]['test_top1']:.2f}" for s in sorted(runs))
    return f"{_mean([r['test_top1'] for r in runs.values()])} ({seeds})"


def _draws(folder: Path, arm: str, runs: dict[int, dict]) -> str:
    """The share of training draws equal to the top-K at the end of phase 1 (none for kinds that do not draw)."""
    shares = []
    for seed in runs:
        log = read_jsonl(folder / f"{arm}-s{seed}" / "log.jsonl")
        phase1 = [r["drawn_topk_share"] for r in log if r["phase"] == 1 and r.get("drawn_topk_share") is not None]
        shares += phase1[-1:]
    return _mean(shares, 3)


def _mean(values: list[float], digits: int = 2) -> str:
    if not values:
        return ""
    return f"{statistics.mean(values):.{digits}f}" + (f" ± {statistics.stdev(values):.{digits}f}" if len(values) > 1
                                                      else "")


def planted_table(folder: Path) -> str:
    """Per arm: the noise share of module 2's top-K over phase 1 and from which step it stays below 10%, the
    share in the final connectivity, validation top-1, and the paired differences to Fixed-Random and the oracle."""
    sys.path.insert(0, str(HERE))
    from planted import connectivity_share, share_curve  # a sibling script

    from connlearn.graph import BranchGraph
    from connlearn.train.checkpoint import load_checkpoint

    runs = _runs(folder)
    rows = ["| arm | seeds | noise in module 2's top-4 over phase 1 (mean) | below 10% from step | noise at the end "
            "(chance 0.50) | draws = top-K, end of phase 1 | validation top-1 (per seed) | "
            "against Fixed-Random, paired | against the oracle, paired |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for arm in [a for a in ARMS if a in runs]:
        phase1, settled, final = [], [], []
        for seed in runs[arm]:
            path = folder / f"{arm}-s{seed}"
            snaps = read_jsonl(path / "gates.jsonl") if (path / "gates.jsonl").is_file() else []
            curve = [(s["step"], v) for s, (epoch, v) in zip(snaps, share_curve(path, 4, [5, 6, 7, 8]), strict=True)
                     if epoch <= 6]
            if curve:
                phase1.append(statistics.mean(v for _, v in curve))
                settled.append(next((st for i, (st, _) in enumerate(curve) if all(v < 0.1 for _, v in curve[i:])),
                                    None))
            final.append(connectivity_share(BranchGraph.from_json(load_checkpoint(path / "last.pt")["graph"]),
                                            [5, 6, 7, 8])[0])
        stays = [s for s in settled if s is not None]
        stay = (f"{statistics.median(stays):.0f} ({len(stays)} of {len(settled)} seeds)" if stays
                else f"never ({len(settled)} seeds)" if settled else "–")
        rows.append(f"| {LABELS[arm]} | {len(runs[arm])} | {_mean(phase1, 3)} | {stay} | {_mean(final, 3)} | "
                    f"{_draws(folder, arm, runs[arm])} | {_top1(runs[arm])} | "
                    f"{_paired(runs[arm], runs.get('random4', {})) if arm != 'random4' else ''} | "
                    f"{_paired(runs[arm], runs.get('oracle4', {})) if arm != 'oracle4' else ''} |")
    return "\n".join(rows)


def unplanted_table(folder: Path) -> str:
    """Per arm: validation top-1, paired against Fixed-Random, and its connectivity retrained from scratch."""
    runs = _runs(folder)
    rows = ["| arm | seeds | validation top-1 (per seed) | against Fixed-Random, paired | retrained from scratch "
            "(per seed) | retrained against Fixed-Random, paired | draws = top-K, end of phase 1 |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    for arm in [a for a in ARMS if a in runs]:
        again = runs.get(f"retrained-{arm}", {})
        rows.append(f"| {LABELS[arm]} | {len(runs[arm])} | {_top1(runs[arm])} | "
                    f"{_paired(runs[arm], runs.get('random4', {})) if arm != 'random4' else ''} | "
                    f"{_top1(again)} | {_paired(again, runs.get('random4', {}))} | "
                    f"{_draws(folder, arm, runs[arm])} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("task", choices=("planted", "unplanted", "speed", "report"))
    parser.add_argument("--arms", nargs="+", choices=list(ARMS), help="default: every arm (planted), or those "
                                                                      "and random4 (unplanted)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, help="the folder of the runs")
    parser.add_argument("--parallel", type=int, default=2, help="runs at a time (default 2, one per core)")
    parser.add_argument("--time-limit", type=float, help="seconds: start no run after it (the same command resumes)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=40, help="speed: steps per gate kind and round")
    parser.add_argument("--rounds", type=int, default=5, help="speed: rounds over the kinds, the first a warm-up")
    parser.add_argument("--planted", type=Path, help="report: the planted runs' folder")
    parser.add_argument("--unplanted", type=Path, help="report: the unplanted runs' folder")
    args = parser.parse_args(argv)
    if args.task == "speed":
        print(speed(args.steps, args.device, args.rounds))
    elif args.task == "report":
        for title, folder, table in (("planted", args.planted, planted_table),
                                     ("unplanted", args.unplanted, unplanted_table)):
            if folder is not None:
                print(f"\n{title} ({folder}):\n\n{table(folder)}")
    else:
        if args.out is None:
            parser.error(f"{args.task} needs --out")
        arms = args.arms or (list(ARMS) if args.task == "planted" else [a for a in ARMS if a != "oracle4"])
        if args.task == "unplanted":
            arms = list(dict.fromkeys(["random4", *arms]))
        runs = [(a, s) for s in args.seeds for a in arms]
        run_all(args.task, runs, args.out, args.parallel, args.device, args.time_limit)
        if args.task == "unplanted":
            learned = [(f"retrained-{a}", s) for s in args.seeds for a in arms if a != "random4"]
            run_all(args.task, learned, args.out, args.parallel, args.device, args.time_limit)
    return 0


if __name__ == "__main__":
    sys.exit(main())
