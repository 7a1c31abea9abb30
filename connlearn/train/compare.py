"""``connlearn compare``: named arms x paired seeds, each run an ordinary ``connlearn train`` folder
(``OUT/ARM-sS``, resumed by the same command), and the paired statistics of each arm against a baseline:
the mean difference with its 95% t-interval and p-value, Holm across the arms, TOST at ``±margin`` and the
smallest difference the seeds detect with power 0.8 (docs/compare.md says each). An arm sets train options
on top of the common ones, or ``retrain = ARM``: ARM's learned connectivity of the same seed, from scratch.
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import attrs

from connlearn.errors import ConfigError, DataError, closest, number_or_text
from connlearn.files import path_of, read_text, write_text
from connlearn.train.options import (
    ARCHITECTURE,
    OPTIONS,
    PER_RUN,
    SHARED,
    RunConfig,
    check_names,
    names,
    read_options,
    recorded,
    relative_to,
)
from connlearn.train.protocol import network_graph, network_words, schedule_words

NAME = re.compile(r"[A-Za-z0-9_.]+")
#: an arm's option that is not a train option: ``retrain = ARM`` trains ARM's connectivity of the same seed anew
RETRAIN = "retrain"
#: what a study records of itself in its folder: its arms, common options, seeds and baseline
STUDY_FILE = "study.json"


def check_options(where: str, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with ``-`` in names as ``_``; an unknown name, or one compare sets per run, is a ConfigError
    naming the closest."""
    return check_names(f"{where}: ", options, [*(n for n, o in OPTIONS.items() if o.group != PER_RUN), RETRAIN])


def parse_arm(text: str) -> tuple[str, dict[str, Any]]:
    """``"NAME key=value ..."`` (``gumbel gate=gumbel K=4 gate_warmup=2``) as ``(name, options)``."""
    if not text.split():
        raise ConfigError(f"--arm {text!r}: give a name and its options, e.g. --arm 'gumbel gate=gumbel K=4'")
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
    and a table per arm under ``[arms.NAME]``; a relative ``data`` path from its folder."""
    path = path_of(path)
    data = read_options(path, "arms file")
    arms = data.pop("arms", None)
    if not isinstance(arms, dict) or not arms or not all(isinstance(v, dict) for v in arms.values()):
        raise ConfigError(f"{path} needs a table per arm, e.g. [arms.random] gate = \"random\"")
    baseline = data.pop("baseline", None)
    return (relative_to(path.parent, check_options(str(path), data)),
            {check_name(n): relative_to(path.parent, check_options(f"{path}: arm {n!r}", o)) for n, o in arms.items()},
            baseline)


@attrs.frozen
class Study:
    """Arms (name -> train options) over paired seeds, on common options, in ``out``; ``plan``: what each run
    trains, in words (checked as the study is made: a bad value is named before any run starts)."""

    arms: dict[str, dict[str, Any]]
    common: dict[str, Any]
    seeds: tuple[int, ...]
    out: Path
    baseline: str
    plan: tuple[str, ...] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        if self.baseline not in self.arms and not any(self.out.glob(f"{self.baseline}-s*")):
            raise ConfigError(f"baseline {self.baseline!r} is not an arm; arms: {', '.join(self.arms)}")
        if len(set(self.seeds)) != len(self.seeds) or not self.seeds:
            raise ConfigError(f"seeds must be distinct and at least one, got {list(self.seeds)}")
        for seed in self.seeds:
            OPTIONS["seed"].validate(seed)
        for name, options in self.arms.items():
            shared = [k for k in options if k in names(SHARED)]
            if shared:
                raise ConfigError(f"arm {name!r} sets {', '.join(shared)}: every arm shares the data, evaluation "
                                  "and schedule; set them for all")
            source = self.source(name)
            if source is not None and (source not in self.arms or self.source(source) is not None):
                raise ConfigError(f"arm {name!r}: retrain {source!r} must name an arm of the study that learns; "
                                  f"arms: {', '.join(a for a in self.arms if self.source(a) is None)}")
        object.__setattr__(self, "plan", self._plan())

    def _plan(self) -> tuple[str, ...]:
        """Each arm's network and the schedule and data every run shares, in words (every arm's config checked)."""
        configs = {name: RunConfig(**self.options(name, self.seeds[0])) for name in self.arms}
        lines = []
        for name, config in configs.items():
            rewired = f", rewired ({config.rewire})" if config.rewire else ""
            if self.source(name) is not None:
                lines.append(f"{name}: the connectivity {self.source(name)} learns{rewired}, trained again from "
                             + ("other weights" if config.reinit else "the same seed's weights (its own first ones)"))
            elif config.connectivity is not None:  # the file's network, read when a run starts
                lines.append(f"{name}: the connectivity of {config.connectivity}{rewired}, trained from scratch")
            else:
                graph = network_graph(config)
                top = ", kept edges started at the top" if config.edge_init else ""
                lines.append(f"{name}: {network_words(config, graph)} {graph.gate_words()}{top}")
        config = configs.get(self.baseline, next(iter(configs.values())))  # all share the schedule and data
        data = f"{config.dataset}{' (a generated stand-in)' if config.synthetic else ''}"
        subsets = ", ".join(f"{what} subset of {n}" for what, n in (("training", config.train_subset),
                                                                       ("evaluation", config.test_subset)) if n)
        paper = ", the paper's whole schedule as no --epochs was given," if config.epochs is config.phases is None \
            else ""
        return (f"every run trains {schedule_words(config)}{paper} on "
                + (f"{data}: {subsets}" if subsets else f"all of {data}"), *lines)

    def check_comparable(self) -> None:
        """A study compares two arms or more: those it names, and those whose runs its folder already holds."""
        others = {found[0] for p in self.out.glob("*-s*") if (found := _run_name(p.name)) and found[0] not in self.arms}
        if len(self.arms) + len(others) < 2:
            raise ConfigError(f"a study compares arms: give at least two (got {', '.join(self.arms)}), or add this "
                              "one to a folder holding another arm's runs (--out)")

    def folder(self, arm: str, seed: int) -> Path:
        return self.out / f"{arm}-s{seed}"

    def source(self, arm: str) -> str | None:
        """The arm whose learned connectivity ``arm`` trains anew (``retrain``), if any."""
        return {**self.common, **self.arms[arm]}.get(RETRAIN)

    def options(self, arm: str, seed: int) -> dict[str, Any]:
        options = {**self.common, **self.arms[arm], "seed": seed, "out": str(self.folder(arm, seed))}
        source = options.pop(RETRAIN, None)
        if source is not None:  # the architecture is the source's: drop the common one, keep what the arm sets
            options = {k: v for k, v in options.items() if k not in names(ARCHITECTURE) or k in self.arms[arm]}
            options["connectivity"] = str(self.folder(source, seed) / "last.pt")
        return options

    def command(self, arm: str, seed: int) -> list[str]:
        """The ``connlearn train`` command of one run: the installed connlearn, whatever the working folder
        holds (``-P``: the working folder stays off ``sys.path``)."""
        return [sys.executable, "-P", "-m", "connlearn.cli", "train", *flags(self.options(arm, seed))]

    def runs(self) -> list[tuple[str, int]]:
        """Every run, those that retrain a learned connectivity after all the others."""
        return sorted(((arm, seed) for seed in self.seeds for arm in self.arms),
                      key=lambda run: self.source(run[0]) is not None)

    def record(self) -> Path:
        """Write :data:`STUDY_FILE`: what ``--report`` reads the baseline from; the arms recorded before stay."""
        self.out.mkdir(parents=True, exist_ok=True)
        path = self.out / STUDY_FILE
        arms = {**(json.loads(read_text(path, "study record")).get("arms", {}) if path.is_file() else {}), **self.arms}
        return write_text(path, json.dumps({"baseline": self.baseline, "arms": arms, "common": self.common,
                                            "seeds": list(self.seeds)}, indent=2))


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


def run_study(study: Study, parallel: int = 1, threads: int | None = 1, rerun_changed: bool = False) -> list[str]:
    """Train every run not yet finished, ``parallel`` processes at a time (``threads`` each), each on the
    least busy GPU where there are several and the run sets no ``device``; returns the names of the runs that
    failed (each reported as it ends; the others go on). A finished run trained with other settings than the
    study's is refused, or with ``rerun_changed`` set aside and trained again. A stop signal (Ctrl-C, SIGTERM,
    SIGHUP), or any error here, stops the running runs (each with a checkpoint) before compare ends."""
    changed = {}  # the finished runs whose recorded settings differ from the study's, and how
    for arm, seed in study.runs():
        if (study.folder(arm, seed) / "summary.json").is_file():
            differ = _differ(_settings(_read_summary(study.folder(arm, seed))["run"]),
                             _settings(RunConfig(**study.options(arm, seed)).to_dict()), "{k}={a!r} there, {b!r} here")
            changed.update({f"{arm}-s{seed}": differ} if differ else {})
    if changed and not rerun_changed:
        listed = "; ".join(f"{name} ({how})" for name, how in changed.items())
        raise ConfigError(f"finished runs trained with other settings than this command's: {listed}: give another "
                          "--out, or --rerun-changed to train them again (their folders kept as NAME.replaced-N)")
    for name in changed:  # set aside as NAME.replaced-N, the first N free
        n = next(n for n in itertools.count(1) if not (study.out / f"{name}.replaced-{n}").exists())
        (study.out / name).rename(study.out / f"{name}.replaced-{n}")
        print(f"compare: {name} was trained with other settings: kept as {name}.replaced-{n}, trained again",
              flush=True)
    study.record()
    runs = study.runs()
    queue = [r for r in runs if not (study.folder(*r) / "summary.json").exists()]
    print(f"compare: {len(runs)} runs ({len(study.arms)} arms x {len(study.seeds)} seeds) in {study.out}; "
          f"{len(runs) - len(queue)} finished, {len(queue)} to run, {parallel} at a time", flush=True)
    for line in study.plan:
        print(f"compare: {line}", flush=True)
    running: dict[str, tuple[subprocess.Popen, Any, float, str | None]] = {}
    earlier = {s: signal.signal(s, _stop) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        return _run_queue(study, queue, running, parallel, threads)
    finally:
        for s, handler in earlier.items():
            signal.signal(s, handler)
        _stop_runs(running)


def _stop(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def _stop_runs(running: dict[str, tuple[subprocess.Popen, Any, float, str | None]]) -> None:
    """Stop the running runs (SIGTERM to each one's process group: a checkpoint, then the end), and wait."""
    if running:
        print(f"compare: stopping {', '.join(running)} (each writes a checkpoint; the same command goes on)",
              file=sys.stderr, flush=True)
    for proc, *_ in running.values():
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    for proc, log, *_ in running.values():
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def _run_queue(study: Study, queue: list[tuple[str, int]], running: dict[str, Any], parallel: int,
               threads: int | None) -> list[str]:
    runs, done = study.runs(), len(study.runs()) - len(queue)
    env = {**os.environ, **({} if threads is None else {"OMP_NUM_THREADS": str(threads)})}
    import torch

    count, visible = torch.cuda.device_count(), os.environ.get("CUDA_VISIBLE_DEVICES")
    gpus = visible.split(",")[:count] if visible else [str(i) for i in range(count)]  # as a child's env names them
    # PR_SET_PDEATHSIG (Linux): a SIGTERM (a checkpoint, then the end) to each run when compare ends, however it ends
    tied = functools.partial(ctypes.CDLL(None).prctl, 1, signal.SIGTERM) if sys.platform == "linux" else None
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
            proc = subprocess.Popen(study.command(arm, seed), stdout=log, stderr=subprocess.STDOUT, process_group=0,
                                    env=env if gpu is None else {**env, "CUDA_VISIBLE_DEVICES": gpu},
                                    preexec_fn=tied)
            running[folder.name] = (proc, log, time.perf_counter(), gpu)
            print(f"compare: {folder.name} started (pid {proc.pid}; its output in {folder / 'output.log'})",
                  flush=True)
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
    run = recorded(run)
    source = Path(run["connectivity"] or "").parent.name
    if source.endswith(f"-s{run['seed']}"):  # the connectivity its seed learned in another arm (retrain)
        run["connectivity"] = source.removesuffix(f"-s{run['seed']}") + "-s{seed}"
    return {k: v for k, v in run.items() if OPTIONS[k].group != PER_RUN and not OPTIONS[k].resumable}


def _shared(summary: dict[str, Any]) -> dict[str, Any]:
    """What every run of one report shares: its :data:`SHARED` settings and the facts of its data."""
    settings = _settings(summary["run"])
    return {**{k: v for k, v in settings.items() if OPTIONS[k].group == SHARED}, "data": summary.get("data")}


def _read_summary(folder: Path) -> dict[str, Any]:
    """A run's ``summary.json``, with a finite top-1 and a recorded seed."""
    try:
        summary = json.loads((folder / "summary.json").read_text())
        top1, seed = float(summary["test_top1"]), summary["run"]["seed"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DataError(f"{folder}/summary.json is not a run's summary ({exc})") from None
    if not math.isfinite(top1) or not isinstance(seed, int):
        raise DataError(f"{folder}/summary.json is not a run's summary (test_top1 {top1}, seed {seed!r})")
    return summary


def collect(folders: Iterable[str | os.PathLike]) -> tuple[dict[str, dict[int, dict[str, Any]]], list[str]]:
    """``(arm -> seed -> summary, unfinished)`` of run folders (``ARM-sSEED``) and of folders holding them, each
    run paired by the seed its summary records. Runs of one arm must share their settings, and every run the
    data and schedule (:data:`SHARED`)."""
    found: dict[str, dict[int, dict[str, Any]]] = {}
    unfinished: list[str] = []
    for given in map(path_of, folders):
        runs = [given] if _run_name(given.name) else sorted(p for p in given.glob("*") if _run_name(p.name)
                                                             and p.is_dir())
        if not runs:
            raise DataError(f"{given} is neither a run folder (ARM-sSEED) nor a folder holding them")
        for folder in runs:
            arm = (_run_name(folder.name) or ("", 0))[0]
            if not (folder / "summary.json").is_file():
                if not (folder / "output.log").exists() and not (folder / "last.pt").exists():
                    raise DataError(f"{folder} is not a connlearn train run (no summary.json, last.pt or output.log)")
                unfinished.append(folder.name)
                continue
            summary = _read_summary(folder)
            seed = summary["run"]["seed"]
            if seed in found.get(arm, {}):
                raise DataError(f"{arm} of seed {seed} is given twice ({folder})")
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


def recorded_baseline(folders: Iterable[str | os.PathLike]) -> str | None:
    """The baseline that the studies in ``folders`` (or holding these run folders) were run with, where they
    record one and agree."""
    records = {path_of(f) / STUDY_FILE for f in folders} | {path_of(f).parent / STUDY_FILE for f in folders}
    baselines = set()
    for record in filter(Path.is_file, records):
        try:
            baselines.add(str(json.loads(record.read_text())["baseline"]))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise DataError(f"{record} is not a study's record ({exc})") from None
    return baselines.pop() if len(baselines) == 1 else None


def _run_name(name: str) -> tuple[str, int] | None:
    found = re.fullmatch(rf"({NAME.pattern})-s(\d+)", name)
    return (found[1], int(found[2])) if found else None


def _differ(a: dict[str, Any], b: dict[str, Any], how: str = "{k}={a!r} against {b!r}") -> str:
    """How ``a`` and ``b`` differ, each key in the words of ``how``: ``K=2 against 4``."""
    return "; ".join(how.format(k=k, a=a.get(k), b=b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k))


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
            "setting": {k: v for k, v in shared.items() if k != "data"},
            "eval_images": (shared["data"] or {}).get("eval_images")}


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
