"""Learned vs Fixed-Full vs Fixed-Random vs real-valued gates on CIFAR-10: the paper's central claim.

Trains, for one architecture, budget and list of seeds, the arms ``full`` (ResNeXt), ``topk`` K=4
(GateConnect), ``random`` K=4 (Fixed-Random), ``real`` K=4 (real-valued gates) and optionally ``topk`` K=1
with its baseline ``random`` K=1, all with the paper's four-phase schedule scaled to the budget (or split
by ``--phases``), the same data order per seed and the same augmentation. Each run lives in
``OUT/<arm>-s<seed>``; ``OUT/sweep.json`` holds every finished run and ``OUT/results.md`` the table in the
paper's format (best and mean ± std of top-1, Params-Train, Params-Test after pruning dead blocks, time),
next to the paper's numbers. Running the same command again skips finished runs and resumes an unfinished
one from its last checkpoint, so a long sweep can be split into pieces with ``--time-limit``. More arms
and seeds may join a sweep folder later, with the settings it was started with (``--device``, ``--amp``,
``--compile``, ``--data`` and ``--parallel`` may change); other settings are refused, naming what differs.

    python benchmarks/accuracy.py --preset cifar-20-4-8 --budget 30 --seeds 0 1 --out runs/sweep
    python benchmarks/accuracy.py ... --parallel 8      # 8 runs at once (one GPU trains several small nets)
    python benchmarks/accuracy.py --budget 320 --arms full topk4 --seeds 0 --time-limit 540   # repeat
    python benchmarks/accuracy.py ... --val-split 5000      # choose settings on a validation split
    python benchmarks/accuracy.py ... --phases 10 3 2 1     # 16 epochs, 10 of them learning the connectivity
    python benchmarks/accuracy.py ... --arms random4 topk4 topk4-centered topk4-renormalized --val-split 5000

An arm of learned gates (``topk4``, ``real4``, ``topk1``) takes a gate-gradient rule as a suffix
(``topk4-centered``; the rules of ``connlearn.updater.GRAD_MODES``), so rules are compared in one sweep and
one table; an arm without a suffix uses ``--gate-grad`` (default: the paper's plain rule).

Do not tune on the test set: use ``--val-split`` for every choice, the test set for final settings only.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import connlearn
from connlearn import plots
from connlearn.errors import ConfigError, ConnlearnError, check_choice
from connlearn.files import read_jsonl, write_text
from connlearn.topologies import CONV_INITS, RESIDUAL_INITS, resnext
from connlearn.train.checkpoint import folder_lock
from connlearn.train.options import defaults as run_defaults
from connlearn.train.protocol import RunConfig, run
from connlearn.train.recipe import get_recipe
from connlearn.train.signals import STOP_SIGNALS
from connlearn.train.trainer import AMP_MODES, COMPILE_MODES
from connlearn.updater import GRAD_MODES

ARMS: dict[str, dict[str, Any]] = {
    "full": {"gate": "full", "K": None, "label": "Fixed-Full (ResNeXt)"},
    "topk4": {"gate": "topk", "K": 4, "label": "Learned, K=4"},
    "random4": {"gate": "random", "K": 4, "label": "Fixed-Random, K=4"},
    "real4": {"gate": "real", "K": 4, "label": "Real-valued gates, K=4"},
    "topk1": {"gate": "topk", "K": 1, "label": "Learned, K=1"},
    "random1": {"gate": "random", "K": 1, "label": "Fixed-Random, K=1"},
}

#: The paper's CIFAR-10 table (appendix): best (mean ± std) over 4 runs of 320 epochs.
PAPER_CIFAR10 = {
    "cifar-20-4-8": {"full": "91.39 (91.13±0.11)", "topk4": "92.85 (92.76±0.10)"},
    "cifar-29-4-8": {"full": "92.77 (92.65±0.09)", "topk4": "93.88 (93.76±0.12)"},
    "cifar-29-8-8": {"full": "93.26 (93.14±0.11)", "topk4": "95.11 (94.96±0.12)"},
    "cifar-29-64-8": {"full": "96.35 (96.23±0.12)", "topk4": "96.83 (96.73±0.11)"},
}

RUN_NAME = re.compile(r"(?P<arm>[a-z0-9-]+?)-s(?P<seed>\d+)")
LEARNED = ("topk", "real")  # the gate kinds whose gates a gate-gradient rule updates
CIFAR_PRESETS = connlearn.list_presets("cifar-*")
#: The protocol's starts, which a run's record holds as None where the command line left them out.
DEFAULT_STARTS = {"residual_init": "auto", "conv_init": "branch"}


def parse_arm(name: str) -> tuple[str, str | None]:
    """``"topk4-centered"`` → ``("topk4", "centered")``; ``"full"`` → ``("full", None)``. Raises a
    :class:`~connlearn.errors.ConnlearnError` naming what is allowed and the closest valid name."""
    base, _, rule = name.partition("-")
    check_choice("arm", base, ARMS)
    if not rule:
        return base, None
    if ARMS[base]["gate"] not in LEARNED:
        learned = ", ".join(a for a in ARMS if ARMS[a]["gate"] in LEARNED)
        raise ConfigError(f"arm {name!r}: only arms with learned gates ({learned}) take a gate-gradient rule")
    return base, check_choice("gate-gradient rule", rule, GRAD_MODES)


def _arm(name: str) -> str:
    """``--arms``' type: argparse shows an ``ArgumentTypeError``'s message (a ``ValueError``'s it hides)."""
    try:
        parse_arm(name)
    except ConnlearnError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    return name


def _known(arm: str) -> bool:
    try:
        parse_arm(arm)
    except ConnlearnError:
        return False
    return True


ARCHITECTURE_OPTIONS = ("M", "C", "width", "base_channels", "stem_channels")
#: The RunConfig fields the command line may set (``--gate-grad`` sets ``gate_rule``).
OVERRIDES = ("M", "C", "width", "base_channels", "stem_channels", "train_subset", "test_subset", "val_split",
             "batch_size", "gate_rule", "gate_lr", "gate_momentum", "gate_init", "gate_temperature",
             "gate_temperature_end", "residual_init", "conv_init", "phases", "device", "amp", "compile", "data")


def collect(out: Path, state: dict[str, Any]) -> dict[str, Any]:
    """Add every finished run under ``out`` (a ``<arm>-s<seed>`` folder holding ``summary.json``) to ``state``."""
    for folder in sorted(out.iterdir()):
        match = RUN_NAME.fullmatch(folder.name)
        if match and _known(match["arm"]) and (folder / "summary.json").exists():
            try:
                summary = json.loads((folder / "summary.json").read_text())
                if not isinstance(summary, dict):
                    raise ValueError(f"it holds a {type(summary).__name__}, not a run's summary")
            except (OSError, ValueError) as exc:  # cut short by a crash or a full disk: its run is not done
                state["runs"].pop(folder.name, None)
                print(f"{folder / 'summary.json'} cannot be read ({exc}): {folder.name} counts as unfinished, and "
                      "a sweep with its arm and seed resumes it", flush=True)
                continue
            summary["arm"], summary["seed"] = match["arm"], int(match["seed"])
            state["runs"][folder.name] = summary
    return state


def _eval_set(options: dict[str, Any]) -> str:
    """The data runs of ``options`` (a sweep's config, a run's ``RunConfig.to_dict()``) were evaluated on."""
    return "validation" if options.get("val_split") else "test"


def _save(out: Path, state: dict[str, Any]) -> None:
    write_text(out / "sweep.json", json.dumps(state, indent=2))  # an interrupted save leaves the old one
    if state["runs"]:
        write_table(out, state)


def _options(args: argparse.Namespace) -> dict[str, Any]:
    """The RunConfig options given on the command line."""
    return {k: getattr(args, k) for k in OVERRIDES if getattr(args, k) is not None}


def run_one(args: argparse.Namespace, arm: str, seed: int, time_limit: float | None) -> dict[str, Any] | None:
    """Train (or resume) one run of the sweep; ``None`` when the time limit stopped it."""
    base, rule = parse_arm(arm)
    spec, options = ARMS[base], _options(args)
    if rule:
        options["gate_rule"] = rule
    config = RunConfig(dataset="cifar10", preset=args.preset, gate=spec["gate"], K=spec["K"], epochs=args.budget,
                       seed=seed, out=str(Path(args.out) / f"{arm}-s{seed}"), progress=not args.no_progress,
                       **options)
    return run(config, time_limit=time_limit)


# options that change how a sweep runs, not what it measures: they may differ from one call to the next
HOW_IT_RUNS = ("device", "amp", "compile", "data", "parallel")


def _check_same_sweep(out: Path, before: dict[str, Any] | None, config: dict[str, Any],
                      settings: dict[str, Any] | None = None) -> None:
    """Refuse to add runs to a sweep folder whose runs were trained with other settings (budget,
    architecture, data, gate options): its table would mix them under one heading. ``before``: the first
    command's options; ``settings``: every setting of it with the defaults of its day, as the folder recorded
    them (a setting added since falls back to today's default)."""
    if before is None:
        return
    now, was = _resolved(config), {**_resolved(before), **(settings or {})}
    differ = sorted(k for k in set(was) | set(now) if k not in HOW_IT_RUNS and was.get(k) != now.get(k))
    if differ:
        listed = "; ".join(f"{k}={was.get(k)!r} there, {now.get(k)!r} here" for k in differ)
        raise ConfigError(f"{out} holds a sweep with other settings ({listed}); give the options it was started "
                          "with to add to it or resume it, or give another --out")


def _resolved(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with the options it leaves out at their defaults (today's), so that an option given at its
    default value and one left out compare equal. The architecture's come from the network the options
    build (the stem and first-stage channels depend on the width)."""
    defaults = {k: v for k, v in run_defaults().items() if k in OVERRIDES}
    defaults.update(DEFAULT_STARTS, batch_size=get_recipe("cifar").batch_size)
    given = {k: config[k] for k in ARCHITECTURE_OPTIONS if config.get(k) is not None}
    graph = resnext(preset=config.get("preset"), gate="full", **given)
    first = graph.branches(graph.modules()[0])[0]
    defaults.update(M=len(graph.modules()), C=graph.graph["options"]["C"], width=graph.graph["options"]["width"],
                    base_channels=graph.nodes[first]["out_channels"],
                    stem_channels=graph.nodes["input"]["out_channels"])
    resolved = {**defaults, **config}
    budget, phases = resolved.get("budget"), resolved.get("phases")
    if phases is not None and isinstance(budget, int) and budget >= 1 and list(phases) == [
            p.epochs for p in get_recipe("cifar").scaled(budget).phases]:
        resolved["phases"] = None  # the split the budget gives anyway: the same schedule
    return resolved


def sweep(args: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with folder_lock(out, "a sweep"):  # a second launch on the same --out would train every run twice at once
        return _sweep(args, argv, out)


def _sweep(args: argparse.Namespace, argv: list[str], out: Path) -> dict[str, Any]:
    state_path = out / "sweep.json"
    state = json.loads(state_path.read_text()) if state_path.exists() else {"runs": {}}
    config = {"preset": args.preset, "budget": args.budget, **_options(args), "parallel": args.parallel}
    RunConfig(dataset="cifar10", preset=args.preset, epochs=args.budget, **_options(args))  # refused before recorded
    _check_same_sweep(out, state.get("config"), config, state.get("settings"))
    state["config"] = config
    state.setdefault("settings", _resolved(config))  # every setting of the first command, defaults included
    _save(out, state)  # the settings are on record before the first run starts
    collect(out, state)
    todo = [(arm, seed) for seed in args.seeds for arm in args.arms if f"{arm}-s{seed}" not in state["runs"]]
    started = time.perf_counter()

    def left() -> float | None:
        return None if args.time_limit is None else args.time_limit - (time.perf_counter() - started)

    failed: list[str] = []
    # compiled runs each in a process of its own, also one at a time: torch.compile keeps at most
    # torch._dynamo.config.recompile_limit versions of the forward pass per process, and each arm's
    # networks (other gate kinds, the frozen network) need versions of their own, so that later runs would
    # train uncompiled
    if len(todo) > 1 and (args.parallel > 1 or args.compile):
        failed = run_parallel(args, argv, todo, left)
        collect(out, state)
    else:
        for arm, seed in todo:
            remaining = left()
            if remaining is not None and remaining <= 0:
                print(f"time limit reached before {arm}-s{seed}; run the same command again to continue", flush=True)
                break
            if run_one(args, arm, seed, remaining) is None:
                break
            collect(out, state)
            _save(out, state)
    _save(out, state)
    if failed:
        raise SystemExit(f"runs failed: {', '.join(failed)} (see output.log in their folders)")
    return state


def run_parallel(args: argparse.Namespace, argv: list[str], todo: list[tuple[str, int]], left) -> list[str]:
    """Run ``todo`` as up to ``args.parallel`` child processes at once (small CIFAR networks leave most of a
    large GPU idle; compiled runs, one each); each child trains one run and writes its ``summary.json``.
    Returns the failed runs."""
    queue, running, failed = list(todo), {}, []
    while queue or running:
        while queue and len(running) < args.parallel:
            remaining = left()
            if remaining is not None and remaining <= 0:
                print(f"time limit reached before {', '.join(f'{a}-s{s}' for a, s in queue)}; "
                      "run the same command again to continue", flush=True)
                queue.clear()
                break
            arm, seed = queue.pop(0)
            name = f"{arm}-s{seed}"
            folder = Path(args.out) / name
            folder.mkdir(parents=True, exist_ok=True)
            child = [sys.executable, str(Path(__file__).resolve()), *argv, "--only", name, "--parallel", "1",
                     "--no-progress"]
            if remaining is not None:
                child += ["--time-limit", f"{remaining:.0f}"]
            log = open(folder / "output.log", "a")  # noqa: SIM115 (closed when the child ends)
            running[name] = (subprocess.Popen(child, stdout=log, stderr=subprocess.STDOUT), log)
            print(f"started {name}", flush=True)
        time.sleep(1.0)
        for name, (proc, log) in list(running.items()):
            if proc.poll() is None:
                continue
            log.close()
            del running[name]
            if proc.returncode in {128 + s for s in STOP_SIGNALS}:  # it stopped at a signal, with a checkpoint
                print(f"{name} stopped by {signal.Signals(proc.returncode - 128).name}; run the same command again "
                      "to resume it", flush=True)
            elif proc.returncode:
                failed.append(name)
                print(f"{name} failed (exit {proc.returncode}); see {Path(args.out) / name / 'output.log'}", flush=True)
            elif (Path(args.out) / name / "summary.json").exists():
                print(f"{name} finished", flush=True)
            else:
                print(f"{name} stopped at the time limit; run the same command again to resume it", flush=True)
    return failed


def _mean_std(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{max(values):.2f} ({statistics.mean(values):.2f}±{statistics.stdev(values):.2f})"


def _order(arm: str) -> tuple[int, int]:
    base, rule = parse_arm(arm)
    return list(ARMS).index(base), -1 if rule is None else GRAD_MODES.index(rule)


def _rule(summary: dict[str, Any]) -> str | None:
    """The gate-gradient rule a run trained with (``None`` for arms without learned gates)."""
    base, rule = parse_arm(summary["arm"])
    if ARMS[base]["gate"] not in LEARNED:
        return None
    return rule or summary["run"]["gate_rule"]


def _phase1_topk_share(log: list[dict[str, Any]]) -> float | None:
    """How often a draw equalled the block's top-K in the last epoch of phase 1 (``None`` without draws)."""
    shares = [r.get("drawn_topk_share") for r in log if r.get("phase") == 1]
    return shares[-1] if shares and shares[-1] is not None else None


def _paired(by_arm: dict[str, list[dict[str, Any]]], reference: str) -> list[str]:
    """Each arm's top-1 minus the reference arm's, paired by seed (the same data order): the seed-to-seed
    spread that both share drops out. Empty without the reference or a common seed."""
    if reference not in by_arm:
        return []
    ref = {r["seed"]: r["test_top1"] for r in by_arm[reference]}
    rows = []
    for arm in sorted(by_arm, key=_order):
        diffs = [r["test_top1"] - ref[r["seed"]] for r in by_arm[arm] if r["seed"] in ref]
        if arm == reference or not diffs:
            continue
        spread = f" ± {statistics.stdev(diffs):.2f}" if len(diffs) > 1 else ""
        wins = sum(d > 0 for d in diffs)
        rows.append(f"| {arm} | {len(diffs)} | {statistics.mean(diffs):+.2f}{spread} | {wins} of {len(diffs)} |")
    if not rows:
        return []
    return ["", f"Paired by seed against {reference}: top-1 difference in points (mean ± std over seeds)", "",
            "| arm | seeds | difference | seeds above |", "| --- | --- | --- | --- |", *rows]


def _paired_by_density(by_arm: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Each arm paired with the Fixed-Random arm of its density: the K=1 arms with ``random1``, the others
    (K=4, and Fixed-Full) with ``random4``. Without ``random1`` (a sweep that has not reached it, or one
    from before it existed) every arm is paired with ``random4``."""
    if "random1" not in by_arm:
        return _paired(by_arm, "random4")
    k1 = {arm for arm, runs in by_arm.items() if runs[0]["K"] == 1}
    return (_paired({a: r for a, r in by_arm.items() if a not in k1}, "random4")
            + _paired({a: r for a, r in by_arm.items() if a in k1}, "random1"))


def _temperature(run: dict[str, Any]) -> str:
    """A run's phase-1 sampling temperature as a label: ``"1"`` (the paper's), ``"0.5"``, or ``"1→0.05"``."""
    start, end = run.get("gate_temperature") or 1.0, run.get("gate_temperature_end")
    return f"{start:g}" if end is None else f"{start:g}→{end:g}"


def _params(counts) -> str:
    """The mean of parameter counts in millions; n/a where a run was not pruned (real gates never frozen)."""
    counts = list(counts)
    return "n/a" if any(c is None for c in counts) else f"{statistics.mean(counts) / 1e6:.3f}M"


def write_table(out: Path, state: dict[str, Any]) -> Path:
    """``results.md``: one row per arm, the paper's format, and a plot of top-1 over epochs (on the test
    set, or on the validation split when the sweep holds one out).

    Learned arms are labelled with their gate-gradient rule unless it is the paper's (plain), gated arms
    with their ``residual_init`` and ``conv_init`` unless they are the defaults, arms that draw with their
    sampling temperature unless it is 1; the paper's numbers stand beside the default settings only.
    "draws = top-K" is how often, in the last epoch of phase 1, a block's draw equalled its top-K (the
    connectivity that phase 2 freezes): near 1 / C(C,K) for draws that follow nothing, near 1 for settled
    gates (or for draws at a small sampling temperature, which that epoch ends with when it is annealed).
    "input overlap" is ``connlearn.graph.input_overlap`` of the final connectivity, averaged over modules
    and seeds, with its value for independent random draws in brackets: far above it, the blocks crowd onto
    the same inputs."""
    config = state.get("config", {})
    preset = config.get("preset", "")
    by_arm: dict[str, list[dict[str, Any]]] = {}
    for summary in state["runs"].values():
        by_arm.setdefault(summary["arm"], []).append(summary)
    eval_set = _eval_set(config)
    evaluated_on = {"validation": "validation split", "test": "test set"}[eval_set]
    changed = {k: config[k] for k in ARCHITECTURE_OPTIONS if config.get(k) is not None}
    arch = preset + (" with " + ", ".join(f"{k}={v}" for k, v in changed.items()) if changed else "")
    data = f", {config['train_subset']} training images" if config.get("train_subset") else ""
    if config.get("phases"):
        data = f" (phases {'/'.join(str(e) for e in config['phases'])})" + data
    papers = {"gate_lr": get_recipe("cifar").phases[0].gate_lr, "gate_momentum": get_recipe("cifar").momentum}
    gates = [f"{k.replace('_', ' ')} {config[k]:g}" for k in papers if config.get(k) not in (None, papers[k])]
    data += "".join(f", {g}" for g in gates)
    shared = config.get("parallel", 1)
    shared = f"; {shared} runs at a time on one device, so epoch times are shared-device times" if shared > 1 else ""
    logs = {name: read_jsonl(out / name / "log.jsonl") for name in state["runs"]}
    lines = [
        f"{arch}, budget {config.get('budget')} epochs{data}, {evaluated_on}; top-1 = best (mean ± std) over seeds"
        + shared,
        "",
        "| method | K | seeds | Params-Train | Params-Test | top-1 (%) | paper, 320 epochs | draws = top-K "
        "| input overlap | epoch time | wall time |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for arm in sorted(by_arm, key=_order):
        runs = by_arm[arm]
        top1 = [r["test_top1"] for r in runs]
        base, _ = parse_arm(arm)
        rules = {_rule(r) for r in runs}
        rule = rules.pop() if len(rules) == 1 else "mixed"
        label = ARMS[base]["label"] + (f", {rule} rule" if rule not in (None, "plain") else "")
        starts = [{k: r["run"][k] or default for k, default in DEFAULT_STARTS.items()} for r in runs]
        inits = {s["residual_init"] for s in starts}
        # Fixed-Full's single stream is never rescaled; "auto" is "sqrt_k" for the bottleneck of these presets
        if ARMS[base]["gate"] != "full" and not inits <= {"auto", "sqrt_k"}:
            label += f", residual_init {inits.pop() if len(inits) == 1 else 'mixed'}"
        convs = {s["conv_init"] for s in starts}
        if ARMS[base]["gate"] != "full" and convs != {"branch"}:  # Fixed-Full's single stream: unchanged
            label += f", conv_init {convs.pop() if len(convs) == 1 else 'mixed'}"
        if ARMS[base]["gate"] == "topk":  # the arms that draw
            temperatures = {_temperature(r["run"]) for r in runs}
            if temperatures != {"1"}:
                label += f", temperature {temperatures.pop() if len(temperatures) == 1 else 'mixed'}"
        own_settings = (not changed and not gates and rule in (None, "plain") and "residual_init" not in label
                        and "conv_init" not in label and "temperature" not in label)
        paper = PAPER_CIFAR10.get(preset, {}).get(base, "") if own_settings else ""
        shares = [s for r in runs if (s := _phase1_topk_share(logs[f"{arm}-s{r['seed']}"])) is not None]
        share = f"{statistics.mean(shares):.3f}" if shares and ARMS[base]["gate"] == "topk" else ""
        overlaps = [v for r in runs for v in r.get("input_overlap", {}).values()]
        overlap = ""
        if overlaps and ARMS[base]["gate"] != "full":
            chance = statistics.mean(v for r in runs for v in r["input_overlap_chance"].values())
            overlap = f"{statistics.mean(overlaps):.2f} ({chance:.2f})"
        lines.append(
            f"| {label} | {runs[0]['K']} | {len(runs)} | {runs[0]['params_train'] / 1e6:.3f}M | "
            f"{_params(r['params_test'] for r in runs)} | {_mean_std(top1)} | {paper} | {share} | "
            f"{overlap} | "
            f"{statistics.mean(r['epoch_time_s'] for r in runs):.1f} s | "
            f"{sum(r['wall_time_s'] for r in runs) / 60:.1f} min |"
        )
    lines += _paired_by_density(by_arm)
    path = out / "results.md"
    write_text(path, "\n".join(lines) + "\n")
    if logs:
        plots.plot_training_curves(_mean_curves(by_arm, logs), out / "accuracy_curves.png", keys=("test_top1",),
                                   eval_set=eval_set)
    return path


def mean_curve(logs: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Top-1 after each epoch, the mean over the logs (one per seed) that evaluated that epoch."""
    per_epoch: dict[int, list[float]] = {}
    for log in logs:
        for record in log:
            if record.get("test_top1") is not None:
                per_epoch.setdefault(record["epoch"], []).append(record["test_top1"])
    return [{"epoch": e, "test_top1": statistics.mean(v)} for e, v in sorted(per_epoch.items())]


def _mean_curves(by_arm: dict[str, list[dict[str, Any]]], logs: dict[str, list[dict[str, Any]]]):
    """One curve per arm: top-1 after each epoch, the mean over the arm's seeds that reached that epoch."""
    curves = {}
    for arm in sorted(by_arm, key=_order):
        seeds = len(by_arm[arm])
        label = arm if seeds == 1 else f"{arm}, mean of {seeds} seeds"
        curves[label] = mean_curve([logs[f"{arm}-s{run['seed']}"] for run in by_arm[arm]])
    return curves


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="cifar-20-4-8", choices=CIFAR_PRESETS)
    parser.add_argument("--budget", type=int,
                        help="total epochs of each run (paper: 320; default 30, or the sum of --phases)")
    parser.add_argument("--phases", type=int, nargs=4, metavar=("P1", "P2", "P3", "P4"),
                        help="epochs of each phase instead of the budget's scaled split")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--arms", nargs="+", default=["full", "topk4", "random4", "real4"], type=_arm,
                        metavar="ARM", help=f"{', '.join(ARMS)}; a learned arm may add -RULE (topk4-centered)")
    parser.add_argument("--out", default="runs/sweep")
    parser.add_argument("--time-limit", type=float, help="seconds; start no new epoch after it (resume later)")
    parser.add_argument("--no-progress", action="store_true")
    for name in ("M", "C", "width", "base-channels", "stem-channels", "train-subset", "test-subset", "val-split",
                 "batch-size"):
        parser.add_argument(f"--{name}", type=int)
    parser.add_argument("--gate-grad", dest="gate_rule", choices=GRAD_MODES,
                        help="the rule of learned arms without a -RULE suffix")
    parser.add_argument("--gate-lr", type=float)
    parser.add_argument("--gate-momentum", type=float, help="the gates' own SGD momentum (default: the weights')")
    parser.add_argument("--gate-init", type=lambda v: v if v == "uniform" else float(v))
    parser.add_argument("--gate-temperature", type=float, help="phase 1's sampling temperature (default 1)")
    parser.add_argument("--gate-temperature-end", type=float, help="anneal it geometrically to this over phase 1")
    parser.add_argument("--residual-init", choices=RESIDUAL_INITS,
                        help=f"every arm's branches (default {DEFAULT_STARTS['residual_init']})")
    parser.add_argument("--conv-init", choices=CONV_INITS,
                        help=f"every gated arm's inner convolutions (default {DEFAULT_STARTS['conv_init']})")
    parser.add_argument("--device")
    parser.add_argument("--amp", choices=AMP_MODES)
    parser.add_argument("--compile", nargs="?", const="default", choices=COMPILE_MODES, metavar="MODE")
    parser.add_argument("--data", help="CIFAR-10 location (else $CONNLEARN_DATA, else download)")
    parser.add_argument("--parallel", type=int, default=1,
                        help="train this many runs at once, as separate processes (one GPU runs several small nets)")
    parser.add_argument("--only", help=argparse.SUPPRESS)  # a child of --parallel: this one run, no table
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    if args.parallel < 1:
        parser.error(f"--parallel must be at least 1, got {args.parallel}")
    if args.phases and min(args.phases) < 1:
        parser.error(f"--phases: every phase needs at least one epoch, got {' '.join(map(str, args.phases))}")
    if args.budget is None:
        args.budget = sum(args.phases) if args.phases else 30
    if args.only is not None:
        match = RUN_NAME.fullmatch(args.only)
        run_one(args, match["arm"], int(match["seed"]), args.time_limit)
        return {}
    try:
        state = sweep(args, argv)
    except ConnlearnError as exc:
        raise SystemExit(f"error: {exc}") from None
    if (Path(args.out) / "results.md").exists():
        print((Path(args.out) / "results.md").read_text())
    return state


if __name__ == "__main__":
    main()
