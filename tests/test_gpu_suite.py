"""benchmarks/gpu_suite.sh, with a stand-in ``python3`` that records its command lines: which runs each
mode asks for, with which options and folders, and how it stops when connlearn does not import."""

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

SUITE = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu_suite.sh"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None,
                                reason="needs bash and coreutils' timeout")

STUB = """#!/bin/bash
echo "$*" >> "$STUB_LOG"
if [ "$1" = -c ] && [[ "$2" == *connlearn* ]]; then echo "no module named graphviz" >&2; exit "${STUB_IMPORT_RC:-0}"; fi
exit 0
"""


def _suite(tmp_path, *args, import_rc=0, **env):
    """Run the suite in ``tmp_path`` (its ``runs/`` and ``.whl/`` are there) on the CPU; return the process
    and the stand-in's command lines."""
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
                          timeout=120)
    calls = log.read_text().splitlines() if log.exists() else []
    return done, calls


def _runs(calls):
    return [c for c in calls if "benchmarks/accuracy.py" in c]


def test_an_unknown_mode_is_refused_before_anything_runs(tmp_path):
    done, calls = _suite(tmp_path, "sweeep", "data.npz", "out")
    assert done.returncode == 2 and "measure, rules, choose, sweep, protocol, claim or convinit" in done.stderr
    assert calls == [] and not (tmp_path / "out").exists()


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
        assert "--data data.npz --budget 30" in call and "--device cpu" in call
        limit = int(call.split("--time-limit ")[1].split()[0])
        assert 60 <= limit <= 600 - 45
    assert "suite ended after" in done.stdout


def test_the_claim_takes_seed_0_by_default_and_extra_reaches_both_folders(tmp_path):
    _, calls = _suite(tmp_path, "claim", "data.npz", "out", "600", EXTRA="--compile")
    runs = _runs(calls)
    assert len(runs) == 2 and all("--seeds 0 --parallel" in c and "--compile" in c for c in runs)


def test_convinit_runs_the_gated_arms_of_the_claim_at_resnexts_start(tmp_path):
    done, calls = _suite(tmp_path, "convinit", "data.npz", "out", "600", SEEDS="0 1")
    assert done.returncode == 0, done.stderr
    (run,) = _runs(calls)
    assert "--arms random4 topk4-centered --seeds 0 1 --parallel 2 --out runs/sweep30_resnext " in run
    assert run.endswith("--conv-init resnext --gate-temperature 1 --gate-temperature-end 0.05")


def test_the_sweep_has_every_arm_and_its_k1_baseline(tmp_path):
    _, calls = _suite(tmp_path, "sweep", "data.npz", "out", "600")
    sweep30 = next(c for c in _runs(calls) if "--out runs/sweep30 " in c)
    assert "--arms full topk4 random4 topk1 random1 real4 --seeds 0 1 --parallel 5" in sweep30


def test_without_time_left_no_run_starts(tmp_path):
    done, calls = _suite(tmp_path, "protocol", "data.npz", "out", "50")
    assert done.returncode == 0 and _runs(calls) == []


def test_a_missing_package_stops_the_suite_at_once_naming_the_wheels(tmp_path):
    done, calls = _suite(tmp_path, "claim", "data.npz", "out", "600", import_rc=1)
    assert done.returncode == 3 and _runs(calls) == []
    assert "no module named graphviz" in done.stderr and ".whl/" in done.stderr


def test_wheels_in_whl_are_installed_first(tmp_path):
    (tmp_path / ".whl").mkdir()
    (tmp_path / ".whl" / "graphviz-0.20-py3-none-any.whl").write_bytes(b"")
    _, calls = _suite(tmp_path, "protocol", "data.npz", "out", "50")
    install = calls[0]
    assert install.startswith("-m pip install") and "--no-index" in install
    assert install.endswith(".whl/graphviz-0.20-py3-none-any.whl")


def test_the_state_to_resume_from_is_packed_without_the_spare_copies(tmp_path):
    run = tmp_path / "runs" / "sweep30" / "topk4-s0"
    run.mkdir(parents=True)
    for name in ("last.pt", "previous.pt", "best.pt", "log.jsonl"):
        (run / name).write_text(name)
    done, _ = _suite(tmp_path, "protocol", "data.npz", "out", "50")
    assert done.returncode == 0
    listing = subprocess.run(["tar", "-tzf", str(tmp_path / "out" / "runs.tar.gz")], capture_output=True,
                             text=True, check=True).stdout.split()
    assert "runs/sweep30/topk4-s0/last.pt" in listing and "runs/sweep30/topk4-s0/log.jsonl" in listing
    assert not any(name.endswith(("previous.pt", "best.pt")) for name in listing)


def test_measure_times_the_epochs_first_and_compile_before_the_step_times(tmp_path):
    done, calls = _suite(tmp_path, "measure", "data.npz", "out", "600")
    assert done.returncode == 0, done.stderr
    timed = [c for c in calls if "benchmarks/" in c]
    assert [c.split()[0] for c in timed] == ["benchmarks/epoch.py"] * 3 + ["benchmarks/speed.py",
                                                                          "benchmarks/memory.py"]
    eager, default, overhead, _, _ = timed
    assert "--arms full topk4 random4 real4 topk1" in eager and "--compile" not in eager
    assert default.endswith("--compile --json out/epoch_compile.json")
    assert all("--repeats" in c for c in (eager, default, overhead))
    assert "--compile reduce-overhead" in overhead
