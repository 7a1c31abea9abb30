"""connlearn compare: its statistics against scipy's and against enumerated values, and a tiny study end to end."""

import json
import math
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from scipy import stats

from connlearn.cli import main
from connlearn.errors import ConfigError
from connlearn.train import compare
from connlearn.train.checkpoint import load_checkpoint

DIFFS = [0.8, -0.3, 1.1, 0.4, -0.6, 0.9, 0.2, 1.5, -0.1, 0.7]


def test_paired_interval_and_p_value_are_scipys():
    result = compare.paired(DIFFS, margin=1.0)
    test = stats.ttest_1samp(DIFFS, 0.0)
    assert result["p"] == pytest.approx(test.pvalue, rel=1e-9)
    assert result["ci"] == pytest.approx(list(test.confidence_interval(0.95)), rel=1e-9)
    assert result["sd"] == pytest.approx(stats.tstd(DIFFS), rel=1e-12)


def test_tost_is_the_larger_of_two_one_sided_tests():
    for margin in (0.5, 1.0, 2.0):
        lower = stats.ttest_1samp(DIFFS, -margin, alternative="greater").pvalue
        upper = stats.ttest_1samp(DIFFS, margin, alternative="less").pvalue
        assert compare.paired(DIFFS, margin)["tost_p"] == pytest.approx(max(lower, upper), rel=1e-9)


def test_holm_matches_the_enumerated_step_down():
    # sorted 0.01, 0.02, 0.03, 0.2 -> 4*0.01, max(.04, 3*.02), max(.06, 2*.03), max(.06, 1*.2)
    assert compare.holm([0.03, 0.01, 0.2, 0.02]) == pytest.approx([0.06, 0.04, 0.2, 0.06])
    assert compare.holm([0.04, 0.01]) == pytest.approx([0.04, 0.02])
    assert compare.holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])


def test_the_detectable_difference_has_power_point_eight():
    result = compare.paired(DIFFS, margin=1.0)
    n, se = len(DIFFS), result["sd"] / math.sqrt(len(DIFFS))
    critical, nc = stats.t.ppf(0.975, n - 1), result["detectable"] / se
    power = stats.nct.sf(critical, n - 1, nc) + stats.nct.cdf(-critical, n - 1, nc)  # the two tails
    assert power == pytest.approx(0.8, abs=1e-6)
    # many pairs: the normal approximation (z_0.975 + z_0.8) sd / sqrt(n), 2.80 standard errors
    many = compare.paired([1.0 + (1 if i % 2 else -1) for i in range(400)], 1.0)
    assert many["detectable"] == pytest.approx((1.959964 + 0.841621) * many["sd"] / 20, rel=5e-3)


def _run(folder, top1, **run):
    folder.mkdir(parents=True)
    settings = {"dataset": "cifar10", "epochs": 16, "gate": "random", "seed": 0, "out": str(folder), **run}
    (folder / "summary.json").write_text(json.dumps({"test_top1": top1, "run": settings,
                                                     "data": {"eval_images": 100}}))


def test_a_report_reads_runs_made_anywhere_paired_by_their_recorded_seeds(tmp_path):
    for seed, (a, b) in enumerate([(50.0, 51.0), (52.0, 52.5), (49.0, 50.5)]):
        since = {"gate_warmup": 0} if seed else {"engine": "fused"}  # an option a run predates counts at its default
        _run(tmp_path / "here" / f"random-s{seed}", a, seed=seed, **since)
        _run(tmp_path / "there" / f"topk-s{(seed + 1) % 3}", b, seed=seed, gate="topk")  # the folder's seed is not
    assert main(["compare", "--report", str(tmp_path / "here"), str(tmp_path / "there"), "--baseline", "random",
                 "--out", str(tmp_path / "report")]) == 0
    result = json.loads((tmp_path / "report" / "report.json").read_text())
    assert result["against"]["topk"]["diffs"] == pytest.approx([1.0, 0.5, 1.5])
    assert (tmp_path / "report" / "paired.png").stat().st_size > 1000


TINY = ["--preset", "cifar-20-4-8", "--M", "3", "--C", "4", "--width", "2", "--base-channels", "8", "--stem-channels",
        "8", "--train-subset", "64", "--test-subset", "50", "--batch-size", "32", "--no-progress"]


@pytest.mark.slow
def test_a_tiny_study_end_to_end_from_a_folder_holding_a_connlearn_folder(tmp_path, capsys, monkeypatch):
    arms = ["--arm", "again retrain=topk", "--arm", "random gate=random K=2", "--arm", "topk gate=topk K=2"]
    argv = ["compare", "--baseline", "random", "--seeds", "0", "1", "--dataset", "cifar10", "--synthetic", "--epochs",
            "4", *TINY, "--out", str(tmp_path / "study")]
    (tmp_path / "connlearn").mkdir()  # a package without build: what the runs must not import
    (tmp_path / "connlearn" / "__init__.py").write_text("")
    monkeypatch.chdir(tmp_path)
    tmp_path = tmp_path / "study"
    assert main([*argv, *arms]) == 0
    out = capsys.readouterr().out
    assert "[6/6]" in out and "| topk | 2 |" in out and "| again | 2 |" in out
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["arms"]["random"]["seeds"] == [0, 1] and report["against"]["topk"]["n"] == 2
    for seed in (0, 1):  # retrained: the connectivity the same seed learned, trained from scratch
        learned, again = (json.loads(load_checkpoint(tmp_path / f"{a}-s{seed}" / "last.pt")["graph"])["edges"]
                          for a in ("topk", "again"))
        assert [e["active"] for e in again] == [e["active"] for e in learned]
    first = (tmp_path / "topk-s0" / "summary.json").stat().st_mtime_ns
    assert main([*argv, *arms]) == 0  # again: every run is skipped, none trained again
    assert "6 finished, 0 to run" in capsys.readouterr().out
    assert (tmp_path / "topk-s0" / "summary.json").stat().st_mtime_ns == first
    changed = [*arms[:3], "random gate=random K=1", *arms[4:]]
    assert main([*argv, *changed]) == 1  # a finished run of other settings: refused by name, nothing replaced
    error = capsys.readouterr().err
    assert "random-s0 (K=2 there, 1 here); random-s1" in error and "--rerun-changed" in error
    assert (tmp_path / "topk-s0" / "summary.json").stat().st_mtime_ns == first
    assert main([*argv, *arms, "--print-commands"]) == 0
    commands = capsys.readouterr().out.splitlines()
    assert len(commands) == 6 and all(" train " in c and "--seed" in c for c in commands)
    assert all("--connectivity" in c for c in commands[4:])  # the retrained runs come last


def _instant_runs(monkeypatch):
    """Runs that end at once with a summary; returns (folder, CUDA_VISIBLE_DEVICES) of each as it starts."""
    started = []

    class Finished:
        returncode, pid = 0, None

        def __init__(self, command, env, **_):
            out = Path(command[command.index("--out") + 1])
            started.append((out.name, env.get("CUDA_VISIBLE_DEVICES")))
            (out / "summary.json").write_text('{"test_top1": 50.0, "run": {}}')

        def poll(self):
            return 0

        def wait(self, timeout=None):
            return 0

    monkeypatch.setattr(compare.subprocess, "Popen", Finished)
    return started


def test_parallel_runs_go_to_the_least_busy_visible_gpu(tmp_path, monkeypatch):
    started = _instant_runs(monkeypatch)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    study = compare.Study({"a": {}, "b": {}, "c": {"device": "cuda:0"}}, {"dataset": "cifar10", "synthetic": True},
                          (0,), tmp_path, "a")
    assert compare.run_study(study, parallel=3) == []
    assert [gpu for _, gpu in started] == ["3", "5", "3,5"]  # a run that sets its device keeps the parent's view


def test_a_run_of_changed_settings_is_set_aside_and_trained_again_on_request(tmp_path, monkeypatch):
    started = _instant_runs(monkeypatch)
    _run(tmp_path / "a-s0", 50.0, gate="random", K=2)
    _run(tmp_path / "b-s0", 51.0, gate="random")
    study = compare.Study({"a": {"gate": "random", "K": 1}, "b": {"gate": "random"}},
                          {"dataset": "cifar10", "epochs": 16}, (0,), tmp_path, "a")
    with pytest.raises(ConfigError, match=r"a-s0 \(K=2 there, 1 here\)"):
        compare.run_study(study)
    assert compare.run_study(study, rerun_changed=True) == []
    assert started == [("a-s0", None)] and (tmp_path / "a-s0.replaced-1" / "summary.json").is_file()


def test_a_report_of_mixed_settings_is_one_line_and_overwrites_nothing(tmp_path, capsys):
    for seed in (0, 1):
        _run(tmp_path / f"random-s{seed}", 50.0 + seed, seed=seed)
        _run(tmp_path / f"topk-s{seed}", 51.0 + seed, seed=seed, gate="topk")
    argv = ["compare", "--report", str(tmp_path), "--baseline", "random", "--out", str(tmp_path / "report")]
    assert main(argv) == 0
    before = (tmp_path / "report" / "report.md").read_text()
    _run(tmp_path / "topk-s2", 52.0, seed=2, gate="topk", epochs=32)  # a run of another schedule
    assert main(argv) == 1
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and "different settings" in error and "epochs=16 against 32" in error
    assert (tmp_path / "report" / "report.md").read_text() == before


def test_a_report_keeps_the_studys_baseline_and_writes_only_where_out_says(tmp_path, capsys):
    for seed in (0, 1):
        _run(tmp_path / f"random-s{seed}", 50.0 + seed, seed=seed)
        _run(tmp_path / f"topk-s{seed}", 52.0 + seed, seed=seed, gate="topk")
    (tmp_path / compare.STUDY_FILE).write_text(json.dumps({"baseline": "topk"}))  # as the study was run
    assert main(["compare", "--report", str(tmp_path)]) == 0
    assert "| topk (baseline) |" in capsys.readouterr().out and not (tmp_path / "report.md").exists()
    assert main(["compare", "--report", str(tmp_path), "--out", str(tmp_path / "r")]) == 0
    result = json.loads((tmp_path / "r" / "report.json").read_text())
    assert result["baseline"] == "topk" and result["against"]["random"]["diffs"] == [-2.0, -2.0]
    for seed in (0, 1):  # another question's arm in the same folder: left out of this one's report and its Holm
        _run(tmp_path / f"real-s{seed}", 49.0, seed=seed, gate="real")
    (tmp_path / "question.toml").write_text('baseline = "random"\n[arms.topk]\ngate = "topk"\n[arms.random]\n'
                                            'gate = "random"\n')
    assert main(["compare", "--report", str(tmp_path), "--arms", str(tmp_path / "question.toml")]) == 0
    out = capsys.readouterr().out
    assert "| random (baseline) |" in out and "| topk |" in out and "real" not in out
    argv = ["--dataset", "cifar10", "--synthetic", "--epochs", "1", "--out", str(tmp_path), "--print-commands"]
    assert main(["compare", "--arm", "real gate=real", "--seeds", "0", "1", *argv]) == 0  # an arm added later
    record = json.loads((tmp_path / compare.STUDY_FILE).read_text())
    assert record["baseline"] == "topk" and "real" in record["arms"]


def test_an_arms_file_gives_relative_data_from_its_own_folder(tmp_path, monkeypatch):
    (tmp_path / "study").mkdir()
    (tmp_path / "study" / "arms.toml").write_text('data = "cifar10.npz"\n[arms.a]\ngate = "random"\n[arms.b]\n')
    monkeypatch.chdir(tmp_path)
    common, arms, _ = compare.read_study("study/arms.toml")
    assert common["data"] == str(Path("study") / "cifar10.npz") and set(arms) == {"a", "b"}


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL], ids=["TERM", "KILL"])
def test_a_stop_of_compare_stops_its_runs(tmp_path, stop):
    argv = [sys.executable, "-m", "connlearn.cli", "compare", "--arm", "a gate=random", "--arm", "b", "--seeds", "0",
            "--dataset", "cifar10", "--synthetic", "--epochs", "2", *TINY, "--out", str(tmp_path)]
    study = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, cwd=tmp_path)
    for line in study.stdout:  # until its first run has started
        if " started (pid " in line:
            break
    child = int(line.split("(pid ")[1].split(";")[0])
    study.send_signal(stop)
    assert study.wait(timeout=300) == (128 + stop if stop == signal.SIGTERM else -stop)
    for _ in range(600):  # a TERM: compare waited for it; a KILL: the run ends on its own, with a checkpoint
        if not _alive(child):
            break
        time.sleep(0.5)
    assert not _alive(child)
    assert not (tmp_path / "a-s0" / "summary.json").exists()


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, ended but not yet reaped, counts as ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False
