"""The benchmark scripts: the commands that BENCHMARKS.md and docs/results print, and those benchmarks/gpu_suite.sh
runs, parse with the scripts' own options; the suite asks for the runs of each mode, and stops at once where
connlearn does not import."""

import argparse
import importlib.util
import inspect
import os
import re
import shlex
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SUITE = ROOT / "benchmarks" / "gpu_suite.sh"


class _ParsedSignal(Exception):  # noqa: N818 - a signal, not an error
    """Raised by the patched ``parse_args`` once a command's options have parsed."""


def _load(script):
    """The benchmark script ``script`` (a path from the repository root) as a module."""
    spec = importlib.util.spec_from_file_location(f"_documented_{Path(script).stem}", ROOT / script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def parses(tmp_path_factory, monkeypatch):
    """``parses(script, argv)`` asserts that ``python script argv...`` parses its options (and does nothing
    else: ``parse_args`` raises once they have parsed, and nothing may be written before)."""
    parse_args = argparse.ArgumentParser.parse_args

    def parse_only(self, args=None, namespace=None):
        parse_args(self, args, namespace)
        raise _ParsedSignal

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_only)
    here = tmp_path_factory.mktemp("parsing")
    monkeypatch.chdir(here)  # a script that wrote before parsing (none should) writes here
    from connlearn.blocks import Bottleneck, ResNeXtBottleneck

    for cls in (Bottleneck, ResNeXtBottleneck):  # branch_init.py patches them after parsing (it should not get there)
        monkeypatch.setattr(cls, "__init__", cls.__init__)
    modules = {}

    def check(script, argv, where=""):
        if script not in modules:
            modules[script] = _load(script)
        module = modules[script]
        monkeypatch.setattr("sys.argv", [script, *argv])
        with pytest.raises(_ParsedSignal):
            try:
                module.main(argv) if inspect.signature(module.main).parameters else module.main()
            except SystemExit as exc:  # argparse's usage error, printed above
                raise AssertionError(f"{where}python {script} {shlex.join(argv)} does not parse") from exc
        assert not list(here.iterdir()), f"{script} wrote before it parsed its options"

    return check


def _benchmark_commands():
    """The ``python benchmarks/X.py ...`` commands of BENCHMARKS.md and docs/results, as (document, script,
    argv), with their placeholders filled: ``SEED`` is 0, ``ARM`` topk4, ``NAME`` a name, ``FLAGS`` none,
    ``...`` after an option a value (else dropped), ``[--flag]`` the flag; shell redirections end the command."""
    for doc in [ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs" / "results").glob("*.md"))]:
        text = doc.read_text().replace("\\\n", " ")
        for match in re.finditer(r"python3? (benchmarks/\w+\.py)([^`\n]*)", text):
            argv: list[str] = []
            filled = re.sub(r"SEED(?!S)", "0", match.group(2))
            filled = re.sub(r"\bFLAGS\b", "", re.sub(r"\bARM\b", "topk4", re.sub(r"\bNAME\b", "name", filled)))
            for word in shlex.split(filled, comments=True):
                if word in (">", "|", "&&", ";", "2>&1"):
                    break
                if word == "...":
                    if argv and argv[-1].startswith("--"):
                        argv.append("1")
                    continue
                argv.append(word.strip("[]"))
            yield doc.name, match.group(1), argv


def test_the_documented_benchmark_commands_parse(parses):
    # a reader reruns a measurement with the command printed beside it: its options must still exist
    from connlearn.cli import build_parser

    commands = list(_benchmark_commands())
    assert len(commands) >= 40, commands
    for doc, script, argv in commands:
        parses(script, argv, f"{doc}: ")
        if script == "benchmarks/planted.py" and "--" in argv:  # it passes what follows to `connlearn train`
            rest = argv[argv.index("--") + 1:]
            with pytest.raises(_ParsedSignal):
                try:
                    build_parser().parse_args(["train", *rest])
                except SystemExit as exc:
                    raise AssertionError(f"{doc}: connlearn train {shlex.join(rest)} does not parse") from exc


# ------------------------------------------------------------------------------------------ gpu_suite.sh
needs_bash = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None,
                                reason="needs bash and coreutils' timeout")

STUB = """#!/bin/bash
echo "$*" >> "$STUB_LOG"
if [ "$1" = -c ] && [[ "$2" == *connlearn* ]]; then echo "no module named graphviz" >&2; exit "${STUB_IMPORT_RC:-0}"; fi
exit 0
"""


def _suite(tmp_path, *args, import_rc=0, **env):
    """Run the suite in ``tmp_path`` (its ``runs/`` are there) on the CPU with a stand-in ``python3`` that records
    its command lines; return the process and those lines."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in ("python3", "nvidia-smi"):
        (bin_dir / name).write_text(STUB)
        (bin_dir / name).chmod((bin_dir / name).stat().st_mode | stat.S_IEXEC)
    log = tmp_path / "calls.log"
    # nothing else of the caller's environment: bash would read SECONDS, BASH_ENV or exported functions
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(tmp_path), "LANG": "C.UTF-8",
           "STUB_LOG": str(log), "DEVICE": "cpu", "STUB_IMPORT_RC": str(import_rc), **env}
    done = subprocess.run(["bash", str(SUITE), *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=60)
    return done, log.read_text().splitlines() if log.exists() else []


def _runs(calls):
    return [c for c in calls if "benchmarks/accuracy.py" in c]


def test_the_suite_checks_a_module_that_exists():
    # what it imports to find missing packages must itself be there, or every mode stops at once
    (module,) = re.findall(r"python3 -c 'import ([\w.]+)'", SUITE.read_text())
    assert importlib.util.find_spec(module) is not None, module


@needs_bash
def test_an_unknown_mode_is_refused_before_anything_runs(tmp_path):
    done, calls = _suite(tmp_path, "sweeep", "data.npz", "out")
    assert done.returncode == 2 and "measure, rules, choose, sweep, protocol, claim, convinit or studies" in done.stderr
    assert calls == [] and not (tmp_path / "out").exists()


@needs_bash
def test_a_missing_package_stops_the_suite_at_once(tmp_path):
    done, calls = _suite(tmp_path, "claim", "data.npz", "out", "600", import_rc=1)
    assert done.returncode == 3 and _runs(calls) == []
    assert "no module named graphviz" in done.stderr and ".whl/" in done.stderr


@needs_bash
def test_the_claim_runs_both_folders_for_every_seed(tmp_path):
    done, calls = _suite(tmp_path, "claim", "data.npz", "out", "600", SEEDS="0 1")
    assert done.returncode == 0, done.stderr
    runs = _runs(calls)
    assert len(runs) == 2
    paper = next(c for c in runs if "--out runs/sweep30 " in c)
    remedy = next(c for c in runs if "--out runs/sweep30_annealed " in c)
    assert "--arms topk4 random4 full --seeds 0 1 --parallel 2" in paper and "--gate-temperature" not in paper
    assert "--arms topk4-centered --seeds 0 1 --parallel 1" in remedy
    assert remedy.endswith("--gate-temperature 1 --gate-temperature-end 0.05")
    for call in runs:
        limit = int(call.split("--time-limit ")[1].split()[0])
        assert "--data data.npz --budget 30" in call and "--device cpu" in call and 60 <= limit <= 600 - 45


@needs_bash
def test_the_state_to_resume_from_is_packed_without_the_spare_copies(tmp_path):
    run = tmp_path / "runs" / "sweep30" / "topk4-s0"
    run.mkdir(parents=True)
    for name in ("last.pt", "previous.pt", "best.pt", "log.jsonl"):
        (run / name).write_text(name)
    done, calls = _suite(tmp_path, "protocol", "data.npz", "out", "50")
    assert done.returncode == 0 and _runs(calls) == []  # without time left no run starts
    listing = subprocess.run(["tar", "-tzf", str(tmp_path / "out" / "runs.tar.gz")], capture_output=True,
                             text=True, check=True).stdout.split()
    assert "runs/sweep30/topk4-s0/last.pt" in listing and "runs/sweep30/topk4-s0/log.jsonl" in listing
    assert not any(name.endswith(("previous.pt", "best.pt")) for name in listing)


@needs_bash
def test_every_command_of_every_mode_parses(tmp_path, parses):
    # the suite runs unattended on a leased GPU: an option a script no longer takes loses the whole lease
    suite = tmp_path / "suite"
    suite.mkdir()
    seen = set()
    from connlearn.cli import build_parser

    for mode in ("measure", "rules", "choose", "sweep", "protocol", "claim", "convinit", "studies"):
        done, calls = _suite(suite, mode, "data.npz", "out", "1000", SEEDS="0 1",
                             STUDIES="benchmarks/studies/a/x.toml benchmarks/studies/b/y.toml")
        assert done.returncode == 0, (mode, done.stderr)
        for call in calls:
            words = shlex.split(call)
            if words and words[0].startswith("benchmarks/"):
                seen.add(words[0])
                parses(words[0], words[1:], f"gpu_suite.sh {mode}: ")
            elif words[:2] == ["-m", "connlearn.cli"]:  # studies: connlearn compare per arms file
                with pytest.raises(_ParsedSignal):
                    build_parser().parse_args(words[2:])
                seen.add(words[words.index("--out") + 1])
    assert seen == {*(f"benchmarks/{s}.py" for s in ("epoch", "speed", "memory", "gate_dynamics", "accuracy")),
                    "benchmarks/studies/a/results", "benchmarks/studies/b/results"}


def test_every_run_of_the_estimator_benchmark_is_a_valid_connlearn_train(tmp_path):
    # the benchmark starts dozens of hour-long runs: a refused one must fail here, not after its arm has trained
    from connlearn.cli import build_parser, config_from

    module = _load("benchmarks/estimators.py")
    for task, arms in (("planted", list(module.ARMS)), ("unplanted", [*module.ARMS, "retrained-gumbel4"])):
        for arm in arms:
            command = module._command(task, arm, 0, tmp_path / f"{arm}-s0", "cpu")
            train = command[command.index("--" if task == "planted" else "train") + 1:]
            config_from(build_parser().parse_args(["train", *train]))


def test_the_ceiling_splits_a_crossed_table_and_draws_balanced_connectivities():
    import numpy as np
    import torch

    ceiling = _load("benchmarks/ceiling.py")
    conn, seed = np.array([0.0, 1.0, -1.0, 2.0]), np.array([0.5, -0.5, 0.0])
    table = 50 + conn[:, None] + seed[None, :]  # no interaction: every spread is a component's
    sigma_conn, sigma_seed, sigma_e = ceiling.components(table)
    assert sigma_e == pytest.approx(0, abs=1e-9)
    assert sigma_conn == pytest.approx(conn.std(ddof=1)) and sigma_seed == pytest.approx(seed.std(ddof=1))
    mask = ceiling.balanced_mask(8, 8, 4, torch.Generator().manual_seed(0))
    assert mask.sum(1).tolist() == [4] * 8 and mask.sum(0).tolist() == [4] * 8
    assert ceiling.expected_max(1, draws=20000) == pytest.approx(0.0, abs=0.02)
    diff, low, high, _ = ceiling.versus(table, table[:3] + 1.0)  # a family one point better, rows for rows
    assert diff == pytest.approx(1 - conn[3] / 4) and low < diff < high


def test_the_complement_of_a_learned_connectivity_reads_every_input_it_rejected(tmp_path):
    import json

    import connlearn
    from connlearn.train.checkpoint import make_checkpoint, save_checkpoint

    ceiling = _load("benchmarks/ceiling.py")
    net = connlearn.build(gate="random", C=4, K=2, M=3, width=2, base_channels=8, stem_channels=8, num_classes=10,
                          seed=3)
    save_checkpoint(make_checkpoint(net), tmp_path / "last.pt")
    ceiling.complement(tmp_path / "last.pt", tmp_path, "learned")

    def reads(name):  # block -> the inputs it reads
        edges = json.loads((tmp_path / "connectivities" / f"{name}.json").read_text())["edges"]
        return {(e["target"], e["source"]): e["active"] for e in edges if e["kind"] == "gate"}

    learned, rejected = reads("learned"), reads("learned_complement")
    assert learned.keys() == rejected.keys() and all(learned[k] != rejected[k] for k in learned)
    assert "[arms.learned_complement]" in (tmp_path / "learned.toml").read_text()


def test_the_ceilings_f_test_has_its_size_and_its_upper_bound_its_coverage():
    import numpy as np

    ceiling, rng = _load("benchmarks/ceiling.py"), np.random.default_rng(0)

    def tests(sigma_conn):  # 2,000 tables of 12 connectivities x 3 seeds, seed and residual spreads as measured
        tables = (sigma_conn * rng.standard_normal((2000, 12, 1)) + 0.7 * rng.standard_normal((2000, 1, 3))
                  + 0.7 * rng.standard_normal((2000, 12, 3)))
        return np.array([ceiling.conn_test(t) for t in tables]).T

    p, _ = tests(0.0)
    assert np.mean(p < 0.05) == pytest.approx(0.05, abs=0.015)
    _, upper = tests(0.5)
    assert np.mean(upper >= 0.5) == pytest.approx(0.95, abs=0.02)


def test_the_tuning_picks_each_kinds_best_against_random_search_on_the_same_seeds(tmp_path):
    import json
    import shutil

    tuning = _load("benchmarks/tuning.py")
    ceiling = ROOT / "benchmarks/studies/ceiling/results"
    for i in range(tuning.CONFIGS):  # random search's tries, as committed
        for s in tuning.SEEDS:
            shutil.copytree(ceiling / f"r{i:02d}-s{s}", tmp_path / "random" / f"r{i:02d}-s{s}")
    for arm, top1, lr in (("gumbel_0", 50.0, None), ("gumbel_1", 60.0, 0.01), ("magnitude_0", 55.0, None)):
        for s in tuning.SEEDS:
            summary = json.loads((ceiling / f"r00-s{s}" / "summary.json").read_text())
            summary["test_top1"] = top1 + s
            summary["run"] |= {"gate": arm.split("_")[0], "gate_lr": lr, "connectivity": None}
            (tmp_path / "tuned" / f"{arm}-s{s}").mkdir(parents=True)
            (tmp_path / "tuned" / f"{arm}-s{s}" / "summary.json").write_text(json.dumps(summary))
    random = [json.loads((tmp_path / "random" / f"r{i:02d}-s{s}" / "summary.json").read_text())["test_top1"]
              for i in range(tuning.CONFIGS) for s in tuning.SEEDS]
    text = tuning.analyse([tmp_path / "tuned", tmp_path / "random"])
    assert f"| gumbel | 2 of 8 | gumbel_1 | 60.50 | {60.5 - sum(random) / len(random):+.2f} |" in text
    assert "| gumbel_1 | lr 0.01 |" in text and "| magnitude | 1 of 8 | magnitude_0 |" in text
    assert "| random search | 8 of 8 | r00 | 54.78 | +0.56 |" in text  # the best of r00-r07 on seeds 0, 1, as committed


def _summaries(out, shifts, seeds):
    """Finished runs of arms whose top-1 is 50 + shift x (seed mod 3): every arm's difference from one with
    shift 0 has the same t statistic."""
    import json

    for arm, shift in shifts.items():
        for seed in seeds:
            (out / f"{arm}-s{seed}").mkdir(parents=True)
            (out / f"{arm}-s{seed}" / "summary.json").write_text(json.dumps({"test_top1": 50 + shift * (seed % 3),
                "run": {"dataset": "cifar10", "epochs": 16, "gate": arm, "seed": seed, "out": str(out)}}))


def test_the_budget_study_pits_a_tuned_arm_against_random_at_every_budget(tmp_path):
    from connlearn.train.compare import Study, read_study

    budget = _load("benchmarks/budget.py")
    budget.write(ROOT / "benchmarks/studies/tuning_k1/gumbel.toml", "gumbel_3", tmp_path)
    for epochs in budget.BUDGETS:
        common, arms, baseline = read_study(tmp_path / f"e{epochs}.toml")
        Study(arms, common, (0,), tmp_path / "runs", baseline)
        assert common["epochs"] == common["eval_every"] == epochs and arms["random"]["K"] == arms["learned"]["K"] == 1
    assert arms["sampling"] == {**arms["learned"], "gate_lr": 0.0}
    _summaries(tmp_path / "results_e64", {"random": 0.0, "learned": 1.0, "sampling": -0.5}, range(6))
    _summaries(tmp_path / "results_e16", {"random": 0.0, "learned": 0.5}, range(6))  # half the gain, two doublings less
    (tmp_path / "results_e8" / "random-s0").mkdir(parents=True)  # a budget begun: its first run unfinished
    (tmp_path / "results_e8" / "random-s0" / "output.log").touch()
    table = budget.analyse(tmp_path)
    assert "| 64 | learned | 6 | +1.00 ± 0.89 |" in table and "| 64 | sampling | 6 | -0.50 ± 0.45 |" in table
    assert "| 64 | learned − sampling | 6 | +1.50 ± 1.34 |" in table
    assert "| 8 | unfinished runs: 1 |" in table
    assert "learned − random per doubling of the epochs: +0.25 ± " in table and "12 pairs at 2 budgets" in table


def test_the_verdict_sets_a_tuned_arm_and_its_retrained_connectivity_against_random_on_the_test_set(tmp_path):
    from connlearn.train.compare import Study, read_study

    verdict = _load("benchmarks/verdict.py")
    verdict.write(ROOT / "benchmarks/studies/tuning_k4/gumbel.toml", "gumbel_3", tmp_path)
    for name in ("alike", "unlike"):
        common, arms, baseline = read_study(tmp_path / f"{name}.toml")
        study = Study(arms, common, verdict.SEEDS, tmp_path / "runs", baseline)
        assert "val_split" not in common and baseline == "random" and arms["retrained"]["retrain"] == "learned"
        assert study.options("retrained", 100)["connectivity"] == str(tmp_path / "runs/learned-s100/last.pt")
        assert arms["learned"].get("kernels") == ([1, 3, 5] if name == "unlike" else None) and arms["learned"]["K"] == 4
        _summaries(tmp_path / f"results_{name}", {"random": 0.0, "learned": 1.0, "retrained": 0.1}, verdict.SEEDS)

    def corrected_by_four(rows_expected, not_run):
        """Every comparison's Holm p is 4 x its p (four equal p-values, the ones not run counting as p = 1)."""
        table = verdict.analyse(tmp_path)
        rows = [line.split(" | ") for line in table.splitlines()
                if line.startswith(("| alike: ", "| unlike: ")) and "[" in line]
        assert len(rows) == rows_expected and (f"{not_run} of the 4 comparisons have not run" in table) == (not_run > 0)
        assert all(float(r[5]) == pytest.approx(min(1.0, 4 * float(r[4])), rel=0.01) for r in rows)

    corrected_by_four(4, 0)  # Holm across the four (within a report it would be across 2)
    for seed in verdict.SEEDS:  # the retrained arm with unlike branches not run yet
        shutil.rmtree(tmp_path / f"results_unlike/retrained-s{seed}")
    corrected_by_four(3, 1)
    shutil.rmtree(tmp_path / "results_unlike")  # the unlike branches not run yet
    corrected_by_four(2, 2)
    (tmp_path / "results_unlike/random-s100").mkdir(parents=True)  # begun: its first run unfinished
    (tmp_path / "results_unlike/random-s100/output.log").touch()
    corrected_by_four(2, 2)


def test_every_declared_study_is_a_set_of_valid_runs(tmp_path):
    from connlearn.train.compare import Study, read_study

    files = sorted((ROOT / "benchmarks" / "studies").rglob("*.toml"))
    assert len(files) >= 15
    for path in files:
        common, arms, baseline = read_study(path)
        Study(arms, common, (0, 1), tmp_path, baseline or next(iter(arms)))  # every arm a valid RunConfig


def test_the_kernels_read_count_each_live_blocks_k_inputs_by_their_branch_kernel():
    import connlearn

    verdict = _load("benchmarks/verdict.py")
    options = {"preset": "cifar-20-4-8", "M": 3, "C": 8, "width": 2, "base_channels": 8, "stem_channels": 8,
               "kernels": [1, 3, 5]}
    graph = connlearn.build(**options, gate="random", K=4).graph()
    read, candidates = verdict.source_kernels(graph), verdict.source_kernels(graph, active=False)
    assert candidates == {1: 3 * 16, 3: 3 * 16, 5: 2 * 16}  # 16 gated blocks, each with the 8 of its module
    assert sum(read.values()) == 4 * 16
    full = connlearn.build(**options, gate="random", K=8).graph()
    assert verdict.source_kernels(full) == verdict.source_kernels(full, active=False) == candidates
