"""benchmarks/: the studies' analyses give, from the committed summaries, the numbers their notes print; every
declared study is a set of valid runs; the planted control does what it says; every script runs."""

import importlib.util
import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import tiny

import connlearn

ROOT = Path(__file__).resolve().parent.parent
STUDIES = ROOT / "benchmarks" / "studies"


def script(name):
    """``benchmarks/NAME.py`` as a module (by path: benchmarks/ is no package)."""
    spec = importlib.util.spec_from_file_location(f"benchmarks_{name}", ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def numbers(text):
    """The two-decimal numbers of ``text``, signs as written ("−" read as "-", "+" dropped)."""
    return {n.replace("−", "-").lstrip("+") for n in re.findall(r"[-+−]?\d+\.\d\d(?!\d)", text)}


@pytest.mark.parametrize(("name", "argv", "note"), [
    ("ceiling", ["analyse", "ceiling/results"], "cpu_ceiling"),
    ("tuning", ["analyse", "tuning_k4/results", "ceiling/results"], "cpu_tuning_k4"),
    ("budget", ["analyse", "budget"], "cpu_budget"),
    ("verdict", ["analyse", "verdict"], "cpu_verdict"),
    ("ceiling", ["analyse", "wiring/results_sigma", "--prefix", "mask"], "cpu_wiring"),
])
def test_a_studys_analysis_of_its_committed_summaries_gives_the_numbers_of_its_note(name, argv, note, capsys):
    script(name).main([str(STUDIES / a) if (STUDIES / a).exists() else a for a in argv])
    tables = "\n".join(line for line in capsys.readouterr().out.splitlines() if line.startswith("|") or "±" in line)
    assert numbers(tables) and numbers(tables) <= numbers((ROOT / "docs" / "results" / f"{note}.md").read_text())


WIRING = STUDIES / "wiring"


@pytest.mark.parametrize("question", [  # the folders to report and the arms file or baseline of each question
    ["results", "--arms", "attribution.toml"], ["results", "--arms", "controls.toml"],
    ["results_bridge", "--arms", "bridge.toml"],
    *([*sorted(WIRING.glob(f"results_density/*_{d}-s*")), "--baseline", f"random_{d}"] for d in (20, 50)),
    ["results_confirm", "--arms", "confirm.toml"], ["results_confirm8", "--arms", "confirm8.toml"],
])
def test_the_wiring_notes_tables_are_compares_report_of_the_committed_summaries(question, capsys):
    from connlearn.cli import main

    main(["compare", "--report", *(str(WIRING / a) if (WIRING / a).exists() else a for a in question)])
    tables = "\n".join(line for line in capsys.readouterr().out.splitlines() if line.startswith("|"))
    assert numbers(tables) and numbers(tables) <= numbers((ROOT / "docs" / "results" / "cpu_wiring.md").read_text())


def test_every_declared_study_is_a_set_of_valid_runs(tmp_path):
    from connlearn.cli import build_parser, config_from
    from connlearn.train.compare import Study, read_study
    from connlearn.train.options import read_options

    files = sorted(STUDIES.rglob("*.toml"))
    assert len(files) >= 20
    for path in files:
        if "arms" not in read_options(path, "study"):  # a single run's config (a `connlearn train --config`)
            config_from(build_parser().parse_args(["train", "--config", str(path)]))
            continue
        common, arms, baseline = read_study(path)
        study = Study(arms, common, (0, 1), tmp_path, baseline or next(iter(arms)))  # every arm a valid RunConfig
        assert ("recalibrate_bn" in common) == ("batch norms recomputed over" in study.plan[0])
        for name, options in arms.items():  # an arm of a connectivity file is the file's network, not a preset's
            assert ("connectivity" in options) == (f"{name}: the connectivity of " in "\n".join(study.plan))


# ---------------------------------------------------------------------------------------------- the planted control
def test_uninformative_branches_output_noise_at_their_own_scale_and_the_others_are_untouched():
    plain = connlearn.build(**tiny(C=4, gate="random", seed=3))
    planted = connlearn.build(**tiny(C=4, gate="random", seed=3, uninformative=(3, 4)))
    planted.load_state_dict(plain.state_dict())
    x = torch.randn(16, 3, 32, 32)
    outs = []
    for net in (plain, planted, planted):
        stem = net.stem(x)
        outs.append(net.stages[0]([stem], None).reshape(16, 4, -1))
    torch.testing.assert_close(outs[1][:, :2], outs[0][:, :2])
    rms = outs[0][:, 2:].pow(2).mean(dim=(0, 2)).sqrt()
    torch.testing.assert_close(outs[1][:, 2:].pow(2).mean(dim=(0, 2)).sqrt(), rms, rtol=0.05, atol=0)
    assert not torch.allclose(outs[1][:, 2:], outs[2][:, 2:])  # fresh noise in every pass, evaluation included


def test_a_planted_connectivity_stays_planted_through_the_command_line_json_and_pruning():
    from connlearn.cli import build_parser, config_from
    from connlearn.prune import prune_dead_blocks
    from connlearn.train.data import synthetic
    from connlearn.train.protocol import build_net

    config = config_from(build_parser().parse_args(["train", "--C", "4", "--M", "3", "--uninformative", "3", "4"]))
    assert build_net(config, synthetic(10, 20, 10)[0]).stages[0].noise.tolist() == [False, False, True, True]

    net = connlearn.build(**tiny(C=4, K=1, gate="random", seed=3, uninformative=(2, 4)))
    again = connlearn.from_graph(net.graph().to_json())
    pruned, _ = prune_dead_blocks(net)
    kept, noise = pruned.graph().branches(1), pruned.stages[0].noise
    assert again.stages[0].noise.tolist() == [False, True, False, True] and len(kept) < 4
    assert ([False] * len(kept) if noise is None else noise.tolist()) == [n in ("m1.b2", "m1.b4") for n in kept]


def test_the_noise_share_of_tied_gates_is_the_noise_share_of_the_candidates():
    planted = script("planted")
    noise = np.array([False, False, True, True])
    assert planted.top_k_share([[0.5] * 4] * 3, 2, noise) == pytest.approx(0.5)
    assert planted.top_k_share([[0.9, 0.5, 0.5, 0.1]], 2, noise) == pytest.approx(0.25)


# ---------------------------------------------------------------------------------------------- the analyses' laws
def test_the_ceiling_splits_a_crossed_table_into_its_components():
    ceiling = script("ceiling")
    conn, seed = np.array([0.0, 1.0, -1.0, 2.0]), np.array([0.5, -0.5, 0.0])
    table = 50 + conn[:, None] + seed[None, :]  # no interaction: every spread is a component's
    sigma_conn, sigma_seed, sigma_e = ceiling.components(table)
    assert sigma_e == pytest.approx(0, abs=1e-9)
    assert sigma_conn == pytest.approx(conn.std(ddof=1)) and sigma_seed == pytest.approx(seed.std(ddof=1))
    assert ceiling.expected_max(1, draws=20000) == pytest.approx(0.0, abs=0.02)
    diff, low, high, _ = ceiling.versus(table, table[:3] + 1.0)  # a family one point better, rows for rows
    assert diff == pytest.approx(1 - conn[3] / 4) and low < diff < high


def test_the_ceilings_f_test_has_its_size_and_its_upper_bound_its_coverage():
    ceiling, rng = script("ceiling"), np.random.default_rng(0)

    def tests(sigma_conn):  # 2,000 tables of 12 connectivities x 3 seeds, seed and residual spreads as measured
        tables = (sigma_conn * rng.standard_normal((2000, 12, 1)) + 0.7 * rng.standard_normal((2000, 1, 3))
                  + 0.7 * rng.standard_normal((2000, 12, 3)))
        return np.array([ceiling.conn_test(t) for t in tables]).T

    p, _ = tests(0.0)
    assert np.mean(p < 0.05) == pytest.approx(0.05, abs=0.015)
    _, upper = tests(0.5)
    assert np.mean(upper >= 0.5) == pytest.approx(0.95, abs=0.02)


def test_the_complement_of_a_learned_connectivity_reads_every_input_it_rejected(tmp_path):
    from connlearn.train.checkpoint import make_checkpoint, save_checkpoint

    net = connlearn.build(gate="random", C=4, K=2, M=3, width=2, base_channels=8, stem_channels=8, num_classes=10,
                          seed=3)
    save_checkpoint(make_checkpoint(net), tmp_path / "last.pt")
    shutil.copy(STUDIES / "ceiling" / "random.toml", tmp_path / "random.toml")
    script("ceiling").main(["complement", str(tmp_path / "last.pt"), "--name", "learned", "--out", str(tmp_path)])

    def reads(name):  # block -> the inputs it reads
        edges = json.loads((tmp_path / "connectivities" / f"{name}.json").read_text())["edges"]
        return {(e["target"], e["source"]): e["active"] for e in edges if e["kind"] == "gate"}

    learned, rejected = reads("learned"), reads("learned_complement")
    assert learned.keys() == rejected.keys() and all(learned[k] != rejected[k] for k in learned)
    assert "[arms.learned_complement]" in (tmp_path / "learned.toml").read_text()


def test_the_kernels_read_count_each_live_blocks_k_inputs_by_their_branch_kernel():
    verdict = script("verdict")
    options = {"preset": "cifar-20-4-8", "M": 3, "C": 8, "width": 2, "base_channels": 8, "stem_channels": 8,
               "kernels": [1, 3, 5]}
    graph = connlearn.build(**options, gate="random", K=4).graph()
    read, candidates = verdict.source_kernels(graph), verdict.source_kernels(graph, active=False)
    assert candidates == {1: 3 * 16, 3: 3 * 16, 5: 2 * 16}  # 16 gated blocks, each with the 8 of its module
    assert sum(read.values()) == 4 * 16


# ---------------------------------------------------------------------------------------------- every script runs
@pytest.fixture(scope="module")
def planted_run(tmp_path_factory):
    """A tiny run of learned gates on a planted network with unlike branches: the files a run folder holds."""
    from conftest import RandomLoader

    from connlearn.graph import active_branches
    from connlearn.train import RunConfig, Trainer
    from connlearn.train.recipe import Phase, Recipe

    out = tmp_path_factory.mktemp("runs") / "planted-s0"
    net = connlearn.build(**tiny(C=4, kernels=(1, 3), uninformative=(3, 4)))
    recipe = Recipe("tiny", [Phase(2, 0.1, gate_lr=0.2), Phase(1, 0.01, frozen=True)])
    history = Trainer(net, RandomLoader(n=8, batch=4, size=16), RandomLoader(n=8, batch=4, seed=1, size=16), recipe,
                      RunConfig(out=out, snapshot_every=1, progress=False)).fit()
    (out / "summary.json").write_text(json.dumps({
        "gate": "topk", "K": net.K, "test_top1": history[-1]["test_top1"],
        "active_branches": {str(m): n for m, n in active_branches(net.graph()).items()}}))
    return out


def test_the_run_analyses_report_a_planted_run(planted_run, tmp_path):
    row = script("planted").main([str(planted_run), "--png", str(tmp_path / "share.png")]).splitlines()[-1]
    assert row.startswith(f"| {planted_run} | topk |") and "(0.50)" in row and (tmp_path / "share.png").is_file()
    script("gate_dynamics").main([str(planted_run), "--out", str(tmp_path)])
    assert (tmp_path / "dynamics.md").is_file() and (tmp_path / "gate_dynamics.png").is_file()
    script("verdict").main(["kernels", str(planted_run.parent)])


def test_the_measuring_scripts_run(tmp_path):
    speed = script("speed").main(["--archs", "cifar-20-4-8", "--gates", "topk", "--batch", "1", "--warmup", "0",
                                  "--repeats", "1", "--json", str(tmp_path / "speed.json")])
    assert speed["train_step"]["cifar-20-4-8"].keys() == {"topk", "full", "plain ResNeXt"}
    script("epoch").main(["--synthetic", "--train-subset", "10", "--batch", "5", "--archs", "cifar-20-4-8",
                          "--arms", "random4", "--paths", "resident"])
    script("folder_loader").main(["--images", "8", "--batch-size", "4", "--workers", "0", "--repeats", "1"])
    assert "cifar-20-4-8" in script("k1_pruning").main(["--presets", "cifar-20-4-8", "--seeds", "0"])[2]
    wiring = script("wiring").main(["--nodes", "8", "8", "--batch", "2", "--warmup", "0", "--repeats", "1",
                                    "--rounds", "1", "--gates", "dnw"])
    assert wiring["results"]["dnw 0.05"]["ratio"]["step"] > 0


def test_a_steps_peak_memory_counts_what_it_allocates_and_not_what_was_there():
    held = torch.ones(2_000_000)
    peak = script("speed").peak_bytes(lambda: torch.ones(1_000_000).sum(), torch.device("cpu"))
    assert 4_000_000 <= peak < 8_000_000 and held.numel()


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None, reason="needs bash, timeout")
def test_the_gpu_suite_runs_connlearn_compare_on_each_study(tmp_path):
    from connlearn.cli import build_parser

    (tmp_path / "bin").mkdir()
    stub = tmp_path / "bin" / "python3"
    stub.write_text('#!/bin/bash\necho "$*" >> "$STUB_LOG"\n')
    stub.chmod(0o755)
    env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path), "STUB_LOG": str(tmp_path / "calls"),
           "DEVICE": "cpu", "SEEDS": "0 1", "STUDIES": "benchmarks/studies/a/x.toml benchmarks/studies/budget/e8.toml"}
    suite = ["bash", str(ROOT / "benchmarks" / "gpu_suite.sh")]
    refused = subprocess.run([*suite, "sweep", "d.npz", "out"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert refused.returncode == 2 and "measure or studies" in refused.stderr
    done = subprocess.run([*suite, "studies", "d.npz", "out"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    calls = [c.split() for c in (tmp_path / "calls").read_text().splitlines() if c.startswith("-m connlearn.cli")]
    assert [c[c.index("--out") + 1] for c in calls] == ["benchmarks/studies/a/results",
                                                        "benchmarks/studies/budget/results_e8"]
    for call in calls:
        build_parser().parse_args(call[2:])
