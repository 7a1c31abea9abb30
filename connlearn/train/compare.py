"""``connlearn compare``: named arms x paired seeds, each run an ordinary ``connlearn train`` folder, and the
paired statistics that say whether an arm beats a baseline, loses to it, or is level with it within a margin.

An arm is a name and the train options it sets on top of the common ones (a gate kind and its knobs, a
connectivity file, ...), or ``retrain = ARM``: train from scratch the connectivity that ARM learned with the
same seed (its runs start once that run has finished). Run ``ARM`` of seed ``S`` lives in ``OUT/ARM-sS``: the
same command again skips the finished runs and resumes the others. Arms change the network, its gates and how
they learn; every run of a study shares the data, the evaluation set and the schedule, and every arm uses the
same seeds, so seed ``S`` gives every arm the same data order, augmentation and starting weights where the
architecture allows.

The statistics, per arm against the baseline, over the seeds both have (paired): the mean difference with its
95% t-interval and p-value (two-sided paired t-test), the p-values Holm-corrected across the arms, TOST at
``margin`` (equivalent when the 90% interval lies inside ``±margin``), and the smallest difference that many
seeds detect with power 0.8 at the seen spread.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import attrs

from connlearn.errors import ConfigError, DataError, closest, number_or_text
from connlearn.files import path_of, write_text

NAME = re.compile(r"[A-Za-z0-9_.]+")
#: the options a study sets per run, not per arm
PER_RUN = ("seed", "out")
#: an arm's option that is not a train option: ``retrain = ARM`` trains ARM's connectivity of the same seed anew
RETRAIN = "retrain"
#: what every run of one report must share: the data, the evaluation and the schedule
SHARED = ("dataset", "epochs", "phases", "batch_size", "train_subset", "test_subset", "val_split", "eval_every",
          "synthetic")


def _fields() -> list[str]:
    from connlearn.train.protocol import RunConfig

    return [f.name for f in attrs.fields(RunConfig)]


def check_options(where: str, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with ``-`` in names as ``_``; an unknown name is a ConfigError naming the closest."""
    options = {str(k).replace("-", "_"): v for k, v in options.items()}
    fields = [*_fields(), RETRAIN]
    for key in options:
        if key not in fields or key in PER_RUN:
            hint = closest(key, [f for f in fields if f not in PER_RUN])
            raise ConfigError(f"{where}: unknown train option {key!r}" + (f"; did you mean {hint!r}?" if hint else "")
                              + ("" if key not in PER_RUN else " (compare sets seed and out per run)"))
    return options


def parse_arm(text: str) -> tuple[str, dict[str, Any]]:
    """``"NAME key=value ..."`` (``gumbel gate=gumbel K=4 gate_lr=0.05``) as ``(name, options)``."""
    name, *pairs = text.split()
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ConfigError(f"arm {name!r}: {pair!r} is not key=value (e.g. 'gumbel gate=gumbel K=4')")
        options[key] = {"true": True, "false": False}.get(value.lower(), number_or_text(value))
    return check_name(name), check_options(f"arm {name!r}", options)


def check_name(name: str) -> str:
    if not NAME.fullmatch(name):
        raise ConfigError(f"arm name {name!r}: use letters, digits, '_' and '.' (it names the runs' folders)")
    return name


def read_study(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, dict[str, Any]], str | None]:
    """``(common, arms, baseline)`` of a TOML file: top-level train options for every arm, ``baseline = NAME``,
    and a table per arm under ``[arms.NAME]``."""
    import tomllib

    path = path_of(path)
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read the arms file {path}: {exc}") from None
    arms = data.pop("arms", None)
    if not isinstance(arms, dict) or not arms or not all(isinstance(v, dict) for v in arms.values()):
        raise ConfigError(f"{path} needs a table per arm, e.g. [arms.random] gate = \"random\"")
    baseline = data.pop("baseline", None)
    return (check_options(str(path), data),
            {check_name(n): check_options(f"{path}: arm {n!r}", o) for n, o in arms.items()}, baseline)


@attrs.frozen
class Study:
    """Arms (name -> train options) over paired seeds, on common options, in ``out``."""

    arms: dict[str, dict[str, Any]]
    common: dict[str, Any]
    seeds: tuple[int, ...]
    out: Path
    baseline: str

    def __attrs_post_init__(self) -> None:
        from connlearn.train.protocol import RunConfig

        if self.baseline not in self.arms:
            raise ConfigError(f"baseline {self.baseline!r} is not an arm; arms: {', '.join(self.arms)}")
        if len(set(self.seeds)) != len(self.seeds) or not self.seeds:
            raise ConfigError(f"seeds must be distinct and at least one, got {list(self.seeds)}")
        for name, options in self.arms.items():
            shared = [k for k in options if k in SHARED]
            if shared:
                raise ConfigError(f"arm {name!r} sets {', '.join(shared)}: every arm shares the data, evaluation "
                                  "and schedule; set them for all")
            source = self.source(name)
            if source is not None and (source not in self.arms or self.source(source) is not None):
                raise ConfigError(f"arm {name!r}: retrain {source!r} must name an arm of the study that learns; "
                                  f"arms: {', '.join(a for a in self.arms if self.source(a) is None)}")
            RunConfig(**self.options(name, self.seeds[0]))  # a bad value is named before any run starts

    def folder(self, arm: str, seed: int) -> Path:
        return self.out / f"{arm}-s{seed}"

    def source(self, arm: str) -> str | None:
        """The arm whose learned connectivity ``arm`` trains anew (``retrain``), if any."""
        return {**self.common, **self.arms[arm]}.get(RETRAIN)

    def options(self, arm: str, seed: int) -> dict[str, Any]:
        from connlearn.train.protocol import ARCHITECTURE

        options = {**self.common, **self.arms[arm], "seed": seed, "out": str(self.folder(arm, seed))}
        source = options.pop(RETRAIN, None)
        if source is not None:  # the architecture is the source's: drop the common one, keep what the arm sets
            options = {k: v for k, v in options.items() if k not in ARCHITECTURE or k in self.arms[arm]}
            options["connectivity"] = str(self.folder(source, seed) / "last.pt")
        return options

    def command(self, arm: str, seed: int) -> list[str]:
        """The ``connlearn train`` command of one run."""
        return [sys.executable, "-m", "connlearn.cli", "train", *flags(self.options(arm, seed))]

    def runs(self) -> list[tuple[str, int]]:
        """Every run, those that retrain a learned connectivity after all the others."""
        return sorted(((arm, seed) for seed in self.seeds for arm in self.arms),
                      key=lambda run: self.source(run[0]) is not None)


def flags(options: dict[str, Any]) -> list[str]:
    """``connlearn train`` flags of train options."""
    argv: list[str] = []
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if key == "compile":
            argv += [] if value is False else [flag] if value is True else [flag, str(value)]
        elif isinstance(value, bool):
            argv.append(flag if value else f"--no-{key.replace('_', '-')}")
        elif isinstance(value, list | tuple):
            argv += [flag, *map(str, value)]
        elif value is not None:
            argv += [flag, str(value)]
    return argv


def print_commands(study: Study) -> None:
    for arm, seed in study.runs():
        print(shlex.join(study.command(arm, seed)))


def visible_gpus() -> list[str]:
    """The CUDA devices this process sees, by the ids a child's ``CUDA_VISIBLE_DEVICES`` takes."""
    import torch

    count, visible = torch.cuda.device_count(), os.environ.get("CUDA_VISIBLE_DEVICES")
    return visible.split(",")[:count] if visible else [str(i) for i in range(count)]


def run_study(study: Study, parallel: int = 1, threads: int | None = 1) -> list[str]:
    """Train every run not yet finished, ``parallel`` processes at a time (``threads`` each), each on the
    least busy GPU where there are several and the run sets no ``device``; returns the names of the runs that
    failed (each reported as it ends; the others go on)."""
    runs = study.runs()
    queue = [r for r in runs if not (study.folder(*r) / "summary.json").exists()]
    done = len(runs) - len(queue)
    print(f"compare: {len(runs)} runs ({len(study.arms)} arms x {len(study.seeds)} seeds) in {study.out}; "
          f"{done} finished, {len(queue)} to run, {parallel} at a time", flush=True)
    env = {**os.environ, **({} if threads is None else {"OMP_NUM_THREADS": str(threads)})}
    gpus = visible_gpus()
    running: dict[str, tuple[subprocess.Popen, Any, float, str | None]] = {}
    failed: list[str] = []
    spent: list[float] = []  # minutes of each run ended here, for the time left

    def ready(run: tuple[str, int]) -> bool:  # a run that retrains a connectivity waits for the run that learns it
        source = study.source(run[0])
        return source is None or (study.folder(source, run[1]) / "summary.json").exists()

    while queue or running:
        for arm, seed in [r for r in queue if f"{study.source(r[0])}-s{r[1]}" in failed]:
            queue.remove((arm, seed))
            failed.append(f"{arm}-s{seed}")
            print(f"compare: {arm}-s{seed} FAILED: the run whose connectivity it retrains, "
                  f"{study.source(arm)}-s{seed}, failed", flush=True)
        while len(running) < parallel and any(map(ready, queue)):
            arm, seed = next(filter(ready, queue))
            queue.remove((arm, seed))
            folder = study.folder(arm, seed)
            folder.mkdir(parents=True, exist_ok=True)
            log = open(folder / "output.log", "a")  # noqa: SIM115 (closed when the run ends)
            gpu = None if len(gpus) < 2 or study.options(arm, seed).get("device") else min(
                gpus, key=lambda g: sum(r[3] == g for r in running.values()))
            proc = subprocess.Popen(study.command(arm, seed), stdout=log, stderr=subprocess.STDOUT,
                                    env=env if gpu is None else {**env, "CUDA_VISIBLE_DEVICES": gpu})
            running[folder.name] = (proc, log, time.perf_counter(), gpu)
        time.sleep(0.5)
        for name, (proc, log, started, _) in list(running.items()):
            if proc.poll() is None:
                continue
            log.close()
            del running[name]
            done += 1
            minutes = (time.perf_counter() - started) / 60
            spent.append(minutes)
            left = len(queue) + len(running)
            eta = f"; about {math.ceil(left / parallel) * sum(spent) / len(spent):.0f} min left" if left else ""
            summary = study.out / name / "summary.json"
            if proc.returncode == 0 and summary.exists():
                top1 = json.loads(summary.read_text())["test_top1"]
                print(f"compare: [{done}/{len(runs)}] {name}: top-1 {top1:.2f}% ({minutes:.1f} min{eta})", flush=True)
            else:
                failed.append(name)
                lines = (study.out / name / "output.log").read_text(errors="replace").strip().splitlines()
                print(f"compare: [{done}/{len(runs)}] {name} FAILED (exit {proc.returncode}): "
                      f"{lines[-1] if lines else 'no output'}", flush=True)
    return failed


# ------------------------------------------------------------------------------------------------ report
def _settings(run: dict[str, Any]) -> dict[str, Any]:
    """A run's settings that a comparison holds fixed; an option the run predates counts at its default."""
    from connlearn.train.protocol import MAY_CHANGE, defaults

    run = {**defaults(), **run}
    source = Path(run["connectivity"] or "").parent.name
    if source.endswith(f"-s{run['seed']}"):  # the connectivity its seed learned in another arm (retrain)
        run["connectivity"] = source.removesuffix(f"-s{run['seed']}") + "-s{seed}"
    return {k: list(v) if isinstance(v, tuple) else v for k, v in run.items()
            if k not in PER_RUN and k not in MAY_CHANGE}


def _shared(summary: dict[str, Any]) -> dict[str, Any]:
    """What every run of one report shares: its :data:`SHARED` settings and the facts of its data."""
    settings = _settings(summary["run"])
    return {**{k: settings[k] for k in SHARED}, "data": summary.get("data")}


def collect(folders: Iterable[str | os.PathLike]) -> tuple[dict[str, dict[int, dict[str, Any]]], list[str]]:
    """``(arm -> seed -> summary, unfinished)`` of run folders (``ARM-sSEED``) and of folders holding them.
    Runs of one arm must share their settings, and every run the data and schedule (:data:`SHARED`)."""
    found: dict[str, dict[int, dict[str, Any]]] = {}
    unfinished: list[str] = []
    for given in map(path_of, folders):
        runs = [given] if _run_name(given.name) else sorted(p for p in given.glob("*") if _run_name(p.name)
                                                             and p.is_dir())
        if not runs:
            raise DataError(f"{given} is neither a run folder (ARM-sSEED) nor a folder holding them")
        for folder in runs:
            arm, seed = _run_name(folder.name) or ("", 0)
            if not (folder / "summary.json").is_file():
                if not (folder / "output.log").exists() and not (folder / "last.pt").exists():
                    raise DataError(f"{folder} is not a connlearn train run (no summary.json, last.pt or output.log)")
                unfinished.append(folder.name)
                continue
            try:
                summary = json.loads((folder / "summary.json").read_text())
                float(summary["test_top1"]), dict(summary["run"])  # what a report reads
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise DataError(f"{folder}/summary.json is not a run's summary ({exc})") from None
            if seed in found.get(arm, {}):
                raise DataError(f"{arm}-s{seed} is given twice ({folder})")
            found.setdefault(arm, {})[seed] = summary
    for arm, by_seed in found.items():
        first_seed, first = next(iter(by_seed.items()))
        for seed, summary in by_seed.items():
            differ = _differ(_settings(first["run"]), _settings(summary["run"]))
            if differ:
                raise DataError(f"{arm}-s{seed} and {arm}-s{first_seed} were trained with different settings "
                                f"({differ}): one arm, one setting")
    arms = list(found)
    for arm in arms[1:]:
        a, b = next(iter(found[arms[0]].values())), next(iter(found[arm].values()))
        differ = _differ(_shared(a), _shared(b))
        if differ:
            raise DataError(f"arms {arms[0]!r} and {arm!r} differ in their data or schedule ({differ}): runs of "
                            "different settings cannot be compared")
    return found, unfinished


def _run_name(name: str) -> tuple[str, int] | None:
    found = re.fullmatch(rf"({NAME.pattern})-s(\d+)", name)
    return (found[1], int(found[2])) if found else None


def _differ(a: dict[str, Any], b: dict[str, Any]) -> str:
    return "; ".join(f"{k}={a.get(k)!r} against {b.get(k)!r}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k))


def holm(p: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (in the order given)."""
    order = sorted(range(len(p)), key=lambda i: p[i])
    adjusted, running = [0.0] * len(p), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p) - rank) * p[i]))
        adjusted[i] = running
    return adjusted


def paired(diffs: Sequence[float], margin: float, alpha: float = 0.05, power: float = 0.8) -> dict[str, Any]:
    """The paired statistics of differences: mean, sd, the (1 - alpha) t-interval, the two-sided p-value,
    TOST's p-value at ``±margin``, and the smallest true difference detected with ``power``."""
    from scipy import optimize, stats

    n = len(diffs)
    mean = sum(diffs) / n
    if n < 2:
        return {"n": n, "mean": mean}
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
    se, df = sd / math.sqrt(n), n - 1
    half = stats.t.ppf(1 - alpha / 2, df) * se
    result = {"n": n, "mean": mean, "sd": sd, "ci": [float(mean - half), float(mean + half)]}
    if se == 0:
        return {**result, "p": 0.0 if mean else 1.0, "tost_p": 0.0 if abs(mean) < margin else 1.0, "detectable": 0.0}
    p = 2 * stats.t.sf(abs(mean) / se, df)
    tost = max(stats.t.sf((mean + margin) / se, df), stats.t.cdf((mean - margin) / se, df))
    critical = stats.t.ppf(1 - alpha / 2, df)

    def shortfall(delta: float) -> float:  # power of the two-sided test at a true difference delta, less `power`
        nc = delta / se
        return float(stats.nct.sf(critical, df, nc) + stats.nct.sf(critical, df, -nc)) - power

    high = (critical + 1) * se
    while shortfall(high) < 0:
        high *= 2
    detectable = optimize.brentq(shortfall, 0.0, high)
    return {**result, "p": float(p), "tost_p": float(tost), "detectable": float(detectable)}


def report(found: dict[str, dict[int, dict[str, Any]]], baseline: str, margin: float) -> dict[str, Any]:
    """Per arm mean ± sd of top-1, and each arm against ``baseline`` paired by seed (with Holm and TOST)."""
    if baseline not in found:
        hint = closest(baseline, found)
        raise ConfigError(f"baseline {baseline!r} has no finished run; arms: {', '.join(found)}"
                          + (f"; did you mean {hint!r}?" if hint else ""))
    arms: dict[str, Any] = {}
    for arm, runs in found.items():
        top1 = [runs[s]["test_top1"] for s in sorted(runs)]
        mean = sum(top1) / len(top1)
        sd = math.sqrt(sum((t - mean) ** 2 for t in top1) / (len(top1) - 1)) if len(top1) > 1 else None
        arms[arm] = {"seeds": sorted(runs), "top1": top1, "mean": mean, "sd": sd}
    others = [a for a in found if a != baseline]
    tests: dict[str, Any] = {}
    for arm in others:
        seeds = sorted(set(found[arm]) & set(found[baseline]))
        diffs = [found[arm][s]["test_top1"] - found[baseline][s]["test_top1"] for s in seeds]
        tests[arm] = {"seeds": seeds, "diffs": diffs, **(paired(diffs, margin) if diffs else {"n": 0})}
    testable = [a for a in others if "p" in tests[a]]
    for arm, adjusted in zip(testable, holm([tests[a]["p"] for a in testable]), strict=True):
        tests[arm]["p_holm"] = adjusted
        tests[arm]["verdict"] = verdict(tests[arm], margin)
    shared = _shared(next(iter(found[baseline].values())))
    return {"baseline": baseline, "margin": margin, "alpha": 0.05, "power": 0.8, "arms": arms, "against": tests,
            "setting": {k: shared[k] for k in SHARED}, "eval_images": (shared["data"] or {}).get("eval_images")}


def verdict(test: dict[str, Any], margin: float) -> str:
    """better or worse where Holm's p < 0.05, else level where TOST's p < 0.05, else undecided."""
    if test["p_holm"] < 0.05:
        return "better" if test["mean"] > 0 else "worse"
    if test["tost_p"] < 0.05:
        return f"level (within ±{margin:g})"
    return "undecided"


def markdown(result: dict[str, Any]) -> str:
    """The report as markdown tables."""
    base, margin = result["baseline"], result["margin"]
    rows = ["| arm | seeds | top-1 mean ± sd |", "| --- | --- | --- |"]
    for arm, a in result["arms"].items():
        sd = f" ± {a['sd']:.2f}" if a["sd"] is not None else ""
        rows.append(f"| {arm}{' (baseline)' if arm == base else ''} | {len(a['seeds'])} | {a['mean']:.2f}{sd} |")
    rows += ["", f"| arm − {base} | pairs | mean ± sd | 95% interval | p | p (Holm) | TOST p (±{margin:g}) | "
                 "detectable (power 0.8) | verdict |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for arm, t in result["against"].items():
        if "p" not in t:
            rows.append(f"| {arm} | {t['n']} | {t.get('mean', float('nan')):+.2f} | | | | | | too few pairs |")
            continue
        rows.append(f"| {arm} | {t['n']} | {t['mean']:+.2f} ± {t['sd']:.2f} | [{t['ci'][0]:+.2f}, {t['ci'][1]:+.2f}] "
                    f"| {t['p']:.3g} | {t['p_holm']:.3g} | {t['tost_p']:.3g} | {t['detectable']:.2f} | "
                    f"{t['verdict']} |")
    return "\n".join(rows) + "\n"


def plot(result: dict[str, Any], path: str | os.PathLike) -> Path:
    """Each arm's per-seed differences from the baseline, with the mean, its 95% interval and ``±margin``."""
    from matplotlib.figure import Figure

    from connlearn.plots import _save

    tests = result["against"]
    fig = Figure(figsize=(6.4, 0.7 * max(1, len(tests)) + 1.4), layout="constrained")
    ax = fig.subplots()
    margin = result["margin"]
    ax.axvspan(-margin, margin, color="0.9", label=f"±{margin:g} (equivalence margin)")
    ax.axvline(0.0, color="0.4", lw=0.8)
    for row, t in enumerate(tests.values()):
        ax.plot(t["diffs"], [row] * len(t["diffs"]), "o", color="C0", alpha=0.6, ms=5,
                label="one seed" if row == 0 else None)
        if "ci" in t:
            ax.errorbar([t["mean"]], [row], xerr=[[t["mean"] - t["ci"][0]], [t["ci"][1] - t["mean"]]], fmt="D",
                        color="C3", capsize=4, label="mean, 95% interval" if row == 0 else None)
    ax.set_yticks(range(len(tests)), list(tests))
    ax.invert_yaxis()
    ax.set_xlabel(f"top-1 minus {result['baseline']}'s, same seed (points)")
    ax.legend(fontsize=7, loc="best")
    return _save(fig, path)


def write_report(result: dict[str, Any], out: str | os.PathLike) -> list[Path]:
    """``report.md``, ``report.json`` and ``paired.png`` in ``out``."""
    out = path_of(out)
    out.mkdir(parents=True, exist_ok=True)
    return [write_text(out / "report.md", markdown(result)), write_text(out / "report.json", json.dumps(result,
                                                                                                         indent=2)),
            plot(result, out / "paired.png")]
