"""The accuracy sweep (benchmarks/accuracy.py) on a tiny budget: results written, interruptions resumed."""

import json

import pytest
import torch
from accuracy import _mean_curves, _paired, _paired_by_density, main, parse_arm, write_table
from conftest import tiny
from gate_dynamics import _settled, from_runs, gradient_split, movement
from study import eval_set as study_eval_set
from study import find_runs
from study import main as study

import connlearn
from connlearn.data import pack, synthetic
from connlearn.errors import ConnlearnError
from connlearn.plots import gate_statistics
from connlearn.train import Trainer, read_jsonl


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "tiny.npz"
    pack(path, *synthetic(num_classes=10, n_train=300, n_test=100, seed=0))
    return path


def _args(out, data, *extra):
    return ["--budget", "2", "--arms", "full", "topk4", "--seeds", "0", "--out", str(out), "--data", str(data),
            "--M", "3", "--C", "4", "--width", "1", "--base-channels", "4", "--stem-channels", "4",
            "--batch-size", "50", "--no-progress", *extra]


def test_the_sweep_writes_every_run_and_the_table(tmp_path, data):
    state = main(_args(tmp_path, data))
    assert set(state["runs"]) == {"full-s0", "topk4-s0"}
    saved = json.loads((tmp_path / "sweep.json").read_text())
    assert saved["runs"]["topk4-s0"]["params_test"] <= saved["runs"]["topk4-s0"]["params_train"]
    table = (tmp_path / "results.md").read_text()
    assert "| Fixed-Full (ResNeXt) | 4 | 1 |" in table and "| Learned, K=4 | 4 | 1 |" in table
    assert "| input overlap |" in table
    assert "| 1.00 (1.00) |" in table.split("| Learned, K=4 |")[1].splitlines()[0]  # C=4: K=4 reads all inputs
    assert (tmp_path / "accuracy_curves.png").exists()
    learned = saved["runs"]["topk4-s0"]
    learned["input_overlap_chance"] = {m: 0.25 for m in learned["input_overlap"]}  # the run's own record decides
    write_table(tmp_path, saved)
    assert "(0.25) |" in (tmp_path / "results.md").read_text().split("| Learned, K=4 |")[1].splitlines()[0]
    del learned["input_overlap_chance"]  # written before it was recorded: from C and K
    write_table(tmp_path, saved)
    assert "| 1.00 (1.00) |" in (tmp_path / "results.md").read_text().split("| Learned, K=4 |")[1].splitlines()[0]


def test_an_interrupted_sweep_resumes_the_unfinished_run_and_skips_finished_ones(tmp_path, data, monkeypatch):
    original = Trainer._run_epoch

    def interrupt_in_second_run(self, epoch):
        if "topk4" in str(self.out_dir) and epoch == 1:
            raise KeyboardInterrupt
        return original(self, epoch)

    monkeypatch.setattr(Trainer, "_run_epoch", interrupt_in_second_run)
    with pytest.raises(KeyboardInterrupt):
        main(_args(tmp_path, data))
    first_epoch = read_jsonl(tmp_path / "topk4-s0" / "log.jsonl")
    assert [r["epoch"] for r in first_epoch] == [1]
    done = (tmp_path / "full-s0" / "summary.json").stat().st_mtime_ns
    monkeypatch.setattr(Trainer, "_run_epoch", original)
    state = main(_args(tmp_path, data))
    assert set(state["runs"]) == {"full-s0", "topk4-s0"}
    assert (tmp_path / "full-s0" / "summary.json").stat().st_mtime_ns == done  # not run again
    log = read_jsonl(tmp_path / "topk4-s0" / "log.jsonl")
    assert [r["epoch"] for r in log] == [1, 2] and log[0] == first_epoch[0]  # resumed, not restarted


def test_a_sweep_folder_takes_more_runs_only_with_the_settings_it_was_started_with(tmp_path, data):
    main(_args(tmp_path, data, "--arms", "full"))
    # how a sweep runs may change, and options given at their defaults are the same settings
    state = main(_args(tmp_path, data, "--arms", "topk4", "--parallel", "1", "--device", "cpu", "--amp", "none",
                       "--gate-grad", "plain", "--residual-init", "auto", "--gate-init", "0.5"))
    assert set(state["runs"]) == {"full-s0", "topk4-s0"}
    saved = (tmp_path / "sweep.json").read_text()
    with pytest.raises(SystemExit, match="budget=2 there, 3 here") as refused:
        main([*_args(tmp_path, data, "--arms", "random4"), "--budget", "3"])
    assert "give another --out" in str(refused.value)
    with pytest.raises(SystemExit, match="gate_grad='plain' there, 'centered' here"):
        main(_args(tmp_path, data, "--gate-grad", "centered"))
    assert (tmp_path / "sweep.json").read_text() == saved and not (tmp_path / "random4-s0").exists()
    assert not list(tmp_path.glob(".*.tmp"))


def test_a_sweep_records_its_settings_before_its_first_run_ends(tmp_path, data, monkeypatch):
    def interrupt(self, epoch):
        raise KeyboardInterrupt

    monkeypatch.setattr(Trainer, "_run_epoch", interrupt)
    with pytest.raises(KeyboardInterrupt):  # killed in its first run: no run finished
        main(_args(tmp_path, data, "--arms", "full"))
    with pytest.raises(SystemExit, match="budget=2 there, 3 here"):
        main([*_args(tmp_path, data, "--arms", "full"), "--budget", "3"])


def test_parallel_runs_train_in_child_processes_and_land_in_one_table(tmp_path, data):
    state = main(_args(tmp_path, data, "--parallel", "2"))
    assert set(state["runs"]) == {"full-s0", "topk4-s0"}
    for name in state["runs"]:
        assert (tmp_path / name / "output.log").exists()
        assert [r["epoch"] for r in read_jsonl(tmp_path / name / "log.jsonl")] == [1, 2]
    assert json.loads((tmp_path / "sweep.json").read_text())["config"]["parallel"] == 2
    assert "2 runs at a time on one device" in (tmp_path / "results.md").read_text()
    again = main(_args(tmp_path, data, "--parallel", "2"))  # nothing left to do: no child starts
    assert again["runs"].keys() == state["runs"].keys()


def test_compiled_runs_train_one_at_a_time_each_in_a_process_of_its_own(tmp_path, data, monkeypatch):
    # one process keeps a bounded number of compiled versions of the forward pass: later arms would run eagerly
    import accuracy

    asked = []
    monkeypatch.setattr(accuracy, "run_parallel", lambda args, argv, todo, left: asked.append((args.parallel, todo)))
    monkeypatch.setattr(accuracy, "run_one", lambda *a: pytest.fail("a compiled run trained in the sweep's process"))
    main(_args(tmp_path, data, "--compile"))
    assert asked == [(1, [("full", 0), ("topk4", 0)])]


def test_arms_with_a_rule_train_with_that_rule_and_get_their_own_rows(tmp_path, data):
    state = main(_args(tmp_path, data, "--arms", "topk4", "topk4-centered", "--gate-grad", "plain"))
    assert set(state["runs"]) == {"topk4-s0", "topk4-centered-s0"}
    assert state["runs"]["topk4-centered-s0"]["run"]["gate_grad"] == "centered"
    assert state["runs"]["topk4-s0"]["run"]["gate_grad"] == "plain"
    rows = [line for line in (tmp_path / "results.md").read_text().splitlines() if line.startswith("| Learned")]
    assert [row.split(" | ")[0] for row in rows] == ["| Learned, K=4", "| Learned, K=4, centered rule"]
    share = float(rows[1].split(" | ")[7])  # draws equal to the top-K in phase 1's last epoch
    assert 0.0 <= share <= 1.0


def test_a_sweep_run_with_a_default_rule_and_init_is_labelled_with_them(tmp_path, data):
    main(_args(tmp_path, data, "--arms", "topk4", "--gate-grad", "renormalized", "--residual-init", "one",
               "--conv-init", "resnext"))
    state = json.loads((tmp_path / "sweep.json").read_text())
    assert state["runs"]["topk4-s0"]["run"]["residual_init"] == "one"
    assert state["runs"]["topk4-s0"]["run"]["conv_init"] == "resnext"
    for option in ("gate_grad", "residual_init", "conv_init"):
        state["config"].pop(option)  # the run's own record decides, not the last command line
    write_table(tmp_path, state)
    label = "| Learned, K=4, renormalized rule, residual_init one, conv_init resnext |"
    assert label in (tmp_path / "results.md").read_text()
    for option in ("residual_init", "conv_init"):  # recorded before the options existed: "one", "branch",
        del state["runs"]["topk4-s0"]["run"][option]
    state["config"].update(residual_init="auto", conv_init="resnext")  # whatever a later command line asked for
    write_table(tmp_path, state)
    assert "| Learned, K=4, renormalized rule, residual_init one |" in (tmp_path / "results.md").read_text()


@pytest.mark.parametrize(("arm", "message"), [
    ("topk5", "did you mean 'topk4'"),
    ("topk4-centred", "did you mean 'centered'"),
    ("random4-centered", "only arms with learned gates"),
])
def test_bad_arms_are_named_with_what_is_allowed(arm, message, capsys):
    with pytest.raises(ConnlearnError, match=message):
        parse_arm(arm)
    with pytest.raises(SystemExit):
        main(["--arms", arm])
    assert message in capsys.readouterr().err  # the command line shows the same message


def test_arms_are_paired_by_seed_against_fixed_random():
    runs = {"random4": [{"seed": 0, "test_top1": 50.0}, {"seed": 1, "test_top1": 52.0}],
            "topk4-centered": [{"seed": 0, "test_top1": 51.0}, {"seed": 1, "test_top1": 51.5},
                               {"seed": 2, "test_top1": 9.0}],  # seed 2 has no partner: left out
            "full": [{"seed": 3, "test_top1": 60.0}]}  # no common seed: no row
    rows = _paired(runs, "random4")
    assert rows[-1] == "| topk4-centered | 2 | +0.25 ± 1.06 | 1 of 2 |" and not any("| full |" in r for r in rows)
    assert _paired({"topk4": runs["topk4-centered"]}, "random4") == []


def test_each_arm_is_paired_with_the_fixed_random_arm_of_its_density():
    runs = {"random4": [{"seed": 0, "K": 4, "test_top1": 50.0}], "topk4": [{"seed": 0, "K": 4, "test_top1": 51.0}],
            "random1": [{"seed": 0, "K": 1, "test_top1": 40.0}], "topk1": [{"seed": 0, "K": 1, "test_top1": 38.0}]}
    rows = _paired_by_density(runs)
    k4, k1 = "\n".join(rows).split("Paired by seed against random1")
    assert "against random4" in k4 and "| topk4 | 1 | +1.00 | 1 of 1 |" in k4 and "topk1" not in k4
    assert "| topk1 | 1 | -2.00 | 0 of 1 |" in k1 and "topk4" not in k1
    assert parse_arm("random1") == ("random1", None)
    del runs["random1"]  # not reached yet: the K=1 arms keep a partner
    assert "| topk1 | 1 | -12.00 | 0 of 1 |" in _paired_by_density(runs)


def test_the_curves_are_the_mean_over_seeds_per_arm():
    by_arm = {"random4": [{"seed": 0}, {"seed": 1}], "topk4-centered": [{"seed": 0}]}
    logs = {"random4-s0": [{"epoch": 1, "test_top1": 10.0}, {"epoch": 2, "test_top1": 20.0}],
            "random4-s1": [{"epoch": 1, "test_top1": 12.0}, {"epoch": 2}],  # no eval after epoch 2
            "topk4-centered-s0": [{"epoch": 1, "test_top1": 5.0}]}
    assert _mean_curves(by_arm, logs) == {
        "topk4-centered": [{"epoch": 1, "test_top1": 5.0}],
        "random4, mean of 2 seeds": [{"epoch": 1, "test_top1": 11.0}, {"epoch": 2, "test_top1": 20.0}],
    }


def test_rules_with_a_hyphen_parse():
    assert parse_arm("topk4-double-centered") == ("topk4", "double-centered")
    assert parse_arm("real4") == ("real4", None)


def test_parallel_must_be_positive(tmp_path, data):
    with pytest.raises(SystemExit):
        main(_args(tmp_path, data, "--parallel", "0"))


def test_the_dynamics_report_says_never_for_a_top_k_that_changed_up_to_the_last_snapshot():
    def stats(*rows):
        return gate_statistics([{"step": i, "epoch": i / 2, "gates": {"2": r}} for i, r in enumerate(rows)], K=1)

    assert _settled(stats([[1.0, 0.0]], [[0.0, 1.0]])) == "never"
    assert _settled(stats([[1.0, 0.0]], [[0.0, 1.0]], [[0.2, 0.9]])) == "0.50"
    assert _settled(stats([[1.0, 0.0]])) == "-"  # one snapshot says nothing


def test_the_gate_dynamics_of_sweep_runs_are_reported(tmp_path, data):
    main(_args(tmp_path / "sweep", data))
    from_runs([str(tmp_path / "sweep" / "topk4-s0")], tmp_path / "report")
    table = (tmp_path / "report" / "dynamics.md").read_text()
    # two snapshots: step 0 and the freeze after the one epoch of phase 1
    assert "| topk4-s0 | 1.0 | 0.500 |" in table and "sampling entropy (uniform: 1.386)" in table
    header, row = [line.split(" | ") for line in table.splitlines() if line.startswith("| run |")
                   or line.startswith("| topk4-s0 |")]
    assert row[header.index("top-K final since epoch")] == "0.00"  # K=4 of 4 inputs: the top-K is every input
    assert (tmp_path / "report" / "gate_dynamics.png").exists()


def _snapshots(*matrices):
    return [{"step": i, "epoch": float(i), "gates": {"2": m}} for i, m in enumerate(matrices)]


def test_a_common_drift_moves_the_row_means_only():
    moved = movement(_snapshots([[0.5, 0.5]], [[0.6, 0.6]], [[0.8, 0.8]]))
    assert moved["drift"] == pytest.approx(0.3) and moved["drift_persistence"] == pytest.approx(1.0)
    assert moved["structure"] == 0.0 and moved["structure_persistence"] != moved["structure_persistence"]  # NaN


def test_a_structure_that_goes_back_and_forth_has_low_persistence():
    moved = movement(_snapshots([[0.4, 0.6]], [[0.6, 0.4]], [[0.4, 0.6]], [[0.5, 0.5]]))
    assert moved["drift"] == pytest.approx(0.0)
    assert moved["structure"] == pytest.approx(0.1) and moved["structure_persistence"] == pytest.approx(0.2)


def test_the_gradient_split_separates_drawn_and_undrawn_gates():
    net = connlearn.build(**tiny(C=4, K=2)).double()
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(8, 3, 32, 32, generator=g, dtype=torch.float64), torch.arange(8) % 10) for _ in range(2)]
    rows = gradient_split(net, batches)
    assert [r["module"] for r in rows] == net.module_ids[1:] and {r["shortcut"] for r in rows} == {"projection"}
    assert all(abs(r["drawn"]) < 1e-3 * abs(r["undrawn"]) for r in rows)  # the invariance behind a projection
    net.record_draws()
    gradient_split(net, batches[:1])
    assert len(net._draws) == 1  # the forward pass's draw only (the extra draw is the same, so white-box)
    with pytest.raises(SystemExit, match="phase 1"):
        gradient_split(net.freeze(), batches)
    with pytest.raises(SystemExit, match="no batches"):
        gradient_split(connlearn.build(**tiny()), [])


def test_a_sweep_with_a_sampling_temperature_labels_its_drawing_arms_and_keeps_it(tmp_path, data):
    state = main(_args(tmp_path, data, "--arms", "topk4", "random4", "--gate-temperature", "1",
                       "--gate-temperature-end", "0.05"))
    assert state["runs"]["topk4-s0"]["run"]["gate_temperature_end"] == 0.05
    assert read_jsonl(tmp_path / "topk4-s0" / "log.jsonl")[0]["temperature"] == pytest.approx(0.05)  # 1 epoch
    table = (tmp_path / "results.md").read_text()
    assert "| Learned, K=4, temperature 1→0.05 | 4 |" in table
    assert "| Fixed-Random, K=4 | 4 |" in table  # draws nothing: no temperature
    with pytest.raises(SystemExit, match=r"gate_temperature_end=0\.05 there, None here"):
        main(_args(tmp_path, data, "--arms", "topk4", "random4"))


def test_a_sweep_with_a_phase_split_takes_its_budget_from_it_and_keeps_it(tmp_path, data, capsys):
    args = _args(tmp_path, data, "--arms", "topk4", "--phases", "1", "2", "1", "1")[2:]  # no --budget
    state = main(args)
    assert state["config"]["budget"] == 5 and state["config"]["phases"] == [1, 2, 1, 1]
    assert [r["phase"] for r in read_jsonl(tmp_path / "topk4-s0" / "log.jsonl")] == [1, 2, 2, 3, 4]  # scaled: 2/1/1/1
    assert "budget 5 epochs (phases 1/2/1/1), " in (tmp_path / "results.md").read_text()
    with pytest.raises(SystemExit, match=r"phases=\[1, 2, 1, 1\] there, None here"):
        main(_args(tmp_path, data, "--arms", "random4", "--budget", "5"))
    with pytest.raises(SystemExit, match="add up to 5 epochs, but epochs is 6"):
        main([*args, "--budget", "6"])
    with pytest.raises(SystemExit):
        main([*args[:-4], "1", "0", "1", "1"])
    assert "--phases: every phase needs at least one epoch, got 1 0 1 1" in capsys.readouterr().err


def test_a_split_equal_to_the_scaled_one_is_the_same_sweep_and_old_folders_resume(tmp_path):
    from accuracy import _check_same_sweep

    started = {"preset": "cifar-20-4-8", "budget": 16}  # recorded before --phases existed: no "phases"
    _check_same_sweep(tmp_path, started, {**started, "phases": None})
    _check_same_sweep(tmp_path, started, {**started, "phases": [6, 5, 3, 2]})  # what 16 epochs scale to
    with pytest.raises(ConnlearnError, match=r"phases=None there, \[10, 3, 2, 1\] here"):
        _check_same_sweep(tmp_path, started, {**started, "phases": [10, 3, 2, 1]})


def test_architecture_options_given_at_what_the_preset_builds_are_no_change(tmp_path):
    from accuracy import _check_same_sweep

    started = {"preset": "cifar-20-4-8", "budget": 2, "width": 1}
    same = {**started, "M": 6, "C": 8, "base_channels": 64, "stem_channels": 16}  # what {20,4,8} at width 1 builds
    _check_same_sweep(tmp_path, started, same)
    with pytest.raises(ConnlearnError, match="base_channels=64 there, 32 here"):
        _check_same_sweep(tmp_path, started, {**same, "base_channels": 32})
    with pytest.raises(ConnlearnError, match="stem_channels=16 there, 64 here; width=1 there, 64 here"):
        _check_same_sweep(tmp_path, started, {**started, "width": 64})  # a wide network starts wider too


def test_a_sweep_compares_with_the_defaults_of_the_day_it_started(tmp_path, data):
    main(_args(tmp_path, data, "--arms", "full"))
    state = json.loads((tmp_path / "sweep.json").read_text())
    assert state["settings"]["residual_init"] == "auto" and state["settings"]["gate_temperature"] == 1.0
    state["settings"]["residual_init"] = "one"  # as if the default was "one" when the folder started
    del state["settings"]["gate_temperature"]  # and the option came later: today's default
    (tmp_path / "sweep.json").write_text(json.dumps(state))
    with pytest.raises(SystemExit, match="residual_init='one' there, 'auto' here"):
        main(_args(tmp_path, data, "--arms", "full"))
    main(_args(tmp_path, data, "--arms", "full", "--residual-init", "one"))
    assert json.loads((tmp_path / "sweep.json").read_text())["settings"]["residual_init"] == "one"  # kept


def test_a_refused_setting_does_not_lock_the_sweep_folder(tmp_path, data):
    with pytest.raises(SystemExit, match=r"gate_temperature must be >= 0\.0001"):
        main(_args(tmp_path, data, "--arms", "full", "--gate-temperature", "0"))
    assert not (tmp_path / "sweep.json").exists()
    state = main(_args(tmp_path, data, "--arms", "full"))
    assert set(state["runs"]) == {"full-s0"}


def test_a_study_table_pairs_arms_of_separate_folders_by_seed(tmp_path, data, capsys):
    for arm in ("full", "topk4"):  # each arm in its own folder, as the CPU studies run them
        main([*_args(tmp_path / arm, data, "--arms", arm, "--seeds", "0", "1")])
    capsys.readouterr()
    with pytest.raises(SystemExit):
        study([f"R={tmp_path}/nothing-s*"])
    assert "no finished run" in capsys.readouterr().err
    png = tmp_path / "study.png"
    text = study(["--reference", "Fixed-Full", f"Fixed-Full={tmp_path}/full/full-s*",
                  f"Learned K=4={tmp_path}/topk4/topk4-s*", "--png", str(png)])
    assert text == capsys.readouterr().out and png.exists()
    assert text.startswith("| arm (test top-1 %, last epoch) |")
    rows = {line.split(" | ")[0][2:]: line.split(" | ") for line in text.splitlines()[2:]}
    sweep = {arm: json.loads((tmp_path / arm / "sweep.json").read_text())["runs"] for arm in ("full", "topk4")}
    top1 = {arm: [sweep[arm][f"{arm}-s{s}"]["test_top1"] for s in (0, 1)] for arm in sweep}
    assert rows["Learned K=4"][1:3] == [f"{v:.2f}" for v in top1["topk4"]]
    diffs = [a - b for a, b in zip(top1["topk4"], top1["full"], strict=True)]
    assert rows["Learned K=4"][4].startswith(f"{sum(diffs) / 2:+.2f}".replace("-", "−"))
    assert rows["Learned K=4"][5] == f"{sum(d > 0 for d in diffs)} of 2" and rows["Fixed-Full"][4] == ""


def test_a_study_refuses_to_compare_runs_evaluated_on_different_data():
    arms = {"Fixed-Random": {0: {"eval_set": "validation"}}, "Learned": {0: {"eval_set": "test"}}}
    with pytest.raises(ConnlearnError, match="not evaluated on the same data: test: Learned; validation: Fixed"):
        study_eval_set(arms)
    assert study_eval_set({"Learned": {0: {"eval_set": "test"}, 1: {"eval_set": "test"}}}) == "test"


def test_a_study_finds_one_finished_run_per_seed_or_says_what_is_wrong(tmp_path):
    def run(path, finished=True):
        path.mkdir(parents=True)
        if finished:
            (path / "summary.json").write_text("{}")
        return path

    plain = run(tmp_path / "a" / "topk4-s0")  # a run folder itself
    swept = run(tmp_path / "a" / "x-s1" / "topk4-s1")  # a sweep folder of one run
    run(tmp_path / "a" / "x-s2" / "topk4-s2", finished=False)  # not finished: left out
    assert find_runs(f"{tmp_path}/a/*-s*") == {0: plain, 1: swept}
    run(tmp_path / "b" / "x-s0" / "topk4-s0")
    run(tmp_path / "b" / "x-s0" / "random4-s0", finished=False)
    with pytest.raises(ConnlearnError, match="holds 2 runs"):
        find_runs(f"{tmp_path}/b/*-s*")
    run(tmp_path / "c" / "x-s0" / "topk4-s1")
    with pytest.raises(ConnlearnError, match="seed differs"):
        find_runs(f"{tmp_path}/c/*-s*")
    run(tmp_path / "d" / "one" / "topk4-s0")
    run(tmp_path / "d" / "two" / "topk4-s0")
    with pytest.raises(ConnlearnError, match="two runs of seed 0"):
        find_runs(f"{tmp_path}/d/*/topk4-s*")


def test_epoch_times_are_the_epochs_after_the_untimed_first():
    from conftest import RandomLoader
    from epoch import epoch_times

    times = epoch_times("cifar-20-4-8", "topk4", RandomLoader(n=16, batch=8), torch.device("cpu"), None, False,
                        repeats=2)
    assert len(times) == 2 and all(t > 0 for t in times)


def test_a_sweep_table_names_a_gate_rate_or_momentum_other_than_the_papers(tmp_path, data):
    main(_args(tmp_path, data, "--arms", "topk4", "--gate-momentum", "0"))
    state = json.loads((tmp_path / "sweep.json").read_text())
    assert "gate momentum 0" in (tmp_path / "results.md").read_text().splitlines()[0]
    state["config"].update(gate_momentum=0.9, gate_lr=0.2)  # the paper's values, given: nothing to name
    write_table(tmp_path, state)
    assert "gate " not in (tmp_path / "results.md").read_text().splitlines()[0]
