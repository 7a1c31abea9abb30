"""The CIFAR protocol end to end: examples, the generated-data fallback, real CIFAR-10 learning."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import attrs
import pytest
import torch
from conftest import SHARED_DATA

import connlearn
from connlearn import experiment
from connlearn.checkpoint import load_checkpoint
from connlearn.cli import train_script
from connlearn.data import DATA_ENV
from connlearn.errors import ConfigError, ConnlearnError, DataError, GraphError
from connlearn.experiment import CifarRun, eval_set_of, run_cifar
from connlearn.recipe import get_recipe
from connlearn.train import read_jsonl

ROOT = Path(__file__).resolve().parent.parent
TINY = ["--M", "3", "--C", "2", "--K", "1", "--width", "1", "--base-channels", "4", "--stem-channels", "4",
        "--batch-size", "32", "--no-progress", "--snapshot-every", "5"]


@pytest.fixture
def offline(monkeypatch):
    """No dataset anywhere: neither --data, nor the variable, nor a download."""
    monkeypatch.delenv(DATA_ENV, raising=False)

    def nothing(name, data=None, **kw):
        raise DataError(f"no {name} data found: pass --data PATH or set {DATA_ENV}")

    monkeypatch.setattr(experiment, "load_dataset", nothing)


@pytest.mark.parametrize("script", ["cifar100.py", "cifar10.py", "miniimagenet.py"])
def test_example_help(script):
    done = subprocess.run([sys.executable, str(ROOT / "examples" / script), "--help"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0
    assert "--gate" in done.stdout and "--epochs" in done.stdout and "--data" in done.stdout


def test_a_one_epoch_run_falls_back_to_generated_data_and_writes_everything(offline, tmp_path, capsys):
    out = tmp_path / "run"
    code = train_script("cifar100", None, ["--epochs", "1", "--out", str(out), "--train-subset", "400",
                                           "--test-subset", "200", *TINY])
    assert code == 0
    printed = capsys.readouterr().out
    fallback = [line for line in printed.splitlines() if "generated dataset" in line]
    assert len(fallback) == 2 and "--data" in fallback[0] and DATA_ENV in fallback[0]
    assert "these numbers are on a small generated dataset, not on cifar100" in fallback[1]  # beside the result
    assert "top-1:" in printed and "parameters:" in printed and "connectivity:" in printed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["dataset"] == "generated" and summary["epochs"] == 1
    assert summary["params_test"] <= summary["params_train"]
    assert summary["input_overlap"] and all(0 <= v <= 1 for v in summary["input_overlap"].values())
    # C=2, K=1: two blocks read the same input half the time
    assert summary["input_overlap_chance"] == {m: 0.5 for m in summary["input_overlap"]}
    assert "input overlap per module:" in printed and "independent random draws:" in printed
    for name in ("log.jsonl", "last.pt", "pruned.pt", "connectivity.dot", "active_branches.png", "curves.png",
                 "draws.png"):
        assert (out / name).exists(), name
    # what a rerun must match besides the settings: in the summary and in every checkpoint (loadable safely)
    assert summary["environment"]["torch"] == torch.__version__ and summary["environment"]["threads"] >= 1
    for name in ("last.pt", "pruned.pt"):
        assert torch.load(out / name, weights_only=True)["environment"].keys() == summary["environment"].keys()


def test_a_data_location_the_user_names_is_never_replaced_by_generated_data(tmp_path, capsys):
    code = train_script("cifar10", None, ["--epochs", "1", "--data", str(tmp_path / "missing.npz"),
                                          "--out", str(tmp_path / "run"), *TINY])
    assert code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "missing.npz" in err[0]


def test_running_again_resumes_instead_of_starting_over(offline, tmp_path):
    args = ["--epochs", "2", "--out", str(tmp_path), "--train-subset", "200", "--test-subset", "100", *TINY]
    assert train_script("cifar10", None, args) == 0
    log = (tmp_path / "log.jsonl").read_text()
    assert train_script("cifar10", None, args) == 0
    assert (tmp_path / "log.jsonl").read_text() == log


def test_the_time_limit_counts_the_data_loading(offline, tmp_path, monkeypatch):
    slow_load = experiment.load_data

    def load_data(run):
        time.sleep(1.0)
        return slow_load(run)

    monkeypatch.setattr(experiment, "load_data", load_data)
    run = CifarRun(dataset="cifar10", M=3, C=2, K=1, width=1, base_channels=4, stem_channels=4, epochs=2,
                   train_subset=200, test_subset=100, batch_size=32, out=str(tmp_path), progress=False)
    assert run_cifar(run, time_limit=0.5) is None  # the limit passed while loading: no epoch starts
    assert not (tmp_path / "log.jsonl").exists()


def test_a_resumed_run_keeps_and_records_the_start_it_was_built_with(offline, tmp_path, capsys, monkeypatch):
    from connlearn.train import Trainer

    opts = dict(dataset="cifar10", M=3, C=2, K=1, width=1, base_channels=4, stem_channels=4, epochs=2,
                train_subset=200, test_subset=100, batch_size=32, out=str(tmp_path), progress=False)
    original = Trainer._run_epoch

    def stop_in_epoch_2(self, epoch):
        if epoch == 1:
            raise KeyboardInterrupt
        return original(self, epoch)

    monkeypatch.setattr(Trainer, "_run_epoch", stop_in_epoch_2)
    with pytest.raises(KeyboardInterrupt):
        run_cifar(CifarRun(**opts, residual_init="one", conv_init="resnext"))
    monkeypatch.setattr(Trainer, "_run_epoch", original)
    summary = run_cifar(CifarRun(**opts))  # the defaults asked for, the checkpoint's starts kept
    assert (summary["run"]["residual_init"], summary["run"]["conv_init"]) == ("one", "resnext")
    said = capsys.readouterr().out
    assert "started with residual_init=one" in said and "started with conv_init=resnext" in said
    recorded = load_checkpoint(tmp_path / "last.pt")["meta"]["run"]  # written by the resumed epochs too
    assert (recorded["residual_init"], recorded["conv_init"]) == ("one", "resnext")


def test_real_gates_that_are_never_frozen_finish_unpruned(offline, tmp_path, capsys):
    """One epoch is phase 1 only: the real gates stay unfrozen, and pruning would change the outputs."""
    summary = run_cifar(CifarRun(dataset="cifar10", gate="real", K=1, M=3, C=2, width=1, base_channels=4,
                                 stem_channels=4, epochs=1, train_subset=64, test_subset=32, batch_size=32,
                                 out=str(tmp_path), progress=False))
    assert summary["params_test"] is None and summary["params_train"] > 0
    assert not (tmp_path / "pruned.pt").exists() and "not pruned" in capsys.readouterr().out


def _learned_source(tmp_path, tied=False):
    """A checkpoint of a small topk net whose gates have moved (random values), as a finished run leaves one;
    ``tied``: with the gates above 0.3 at the clip bound 1, as the paper's rule leaves many rows."""
    import torch

    from connlearn.checkpoint import make_checkpoint, save_atomic

    net = connlearn.build(gate="topk", K=2, M=3, C=4, width=1, base_channels=4, stem_channels=4, num_classes=10,
                          seed=5, residual_init="one", conv_init="resnext")
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for _, g in net.gates():
            g.real.uniform_(0, 1, generator=generator)
            if tied:
                g.real[g.real > 0.3] = 1.0
    path = tmp_path / "source.pt"
    save_atomic(make_checkpoint(net), path)
    return net, path


def _masks(net):
    return [g.active().cpu() for _, g in net.gates()]


@pytest.mark.parametrize("form", ["checkpoint", "graph json", "graph json named .txt", "checkpoint, tied gates",
                                  "graph json, tied gates"])
def test_a_connectivity_trains_from_scratch_with_its_top_k_fixed(offline, tmp_path, form):
    import torch

    from connlearn.checkpoint import net_from_checkpoint

    source, path = _learned_source(tmp_path, tied="tied" in form)
    if "tied" in form:  # rows with more than K gates at 1: the source's tie order, not the run's seed, decides
        assert any(int((g.real == 1).sum(dim=1).max()) > 2 for _, g in source.gates())
    if not form.startswith("checkpoint"):
        path = tmp_path / ("graph.txt" if form.endswith(".txt") else "graph.json")
        path.write_text(source.graph().to_json())
    run = CifarRun(dataset="cifar10", connectivity=str(path), epochs=1, seed=1, train_subset=200, test_subset=100,
                   batch_size=32, out=str(tmp_path / "run"), progress=False, snapshot_every=0)
    summary = run_cifar(run)
    assert summary["gate"] == "frozen" and summary["K"] == 2
    recorded = summary["run"]
    assert recorded["residual_init"] == "one" and recorded["connectivity"] == str(path)
    assert recorded["conv_init"] == "resnext"
    assert (recorded["M"], recorded["C"], recorded["width"], recorded["base_channels"], recorded["stem_channels"]) \
        == (3, 4, 1, 4, 4)
    from connlearn.checkpoint import architecture  # the record rebuilds the network that ran

    rebuilt = connlearn.build(preset=recorded["preset"], gate="topk", K=2, num_classes=10,
                              **{k: recorded[k] for k in ("M", "C", "width", "base_channels", "stem_channels")})
    assert architecture(rebuilt.graph()) == architecture(net_from_checkpoint(tmp_path / "run" / "last.pt").graph())
    trained = net_from_checkpoint(tmp_path / "run" / "last.pt")
    wanted = [g.active() for _, g in source.gates()]
    assert all(torch.equal(a, b) for a, b in zip(_masks(trained), wanted, strict=True))
    assert trained.graph().graph["seed"] == 1
    # the weights start as those of the same network built from the run's seed
    fresh = experiment.build_net(run, 10)
    same_seed = connlearn.build(gate="topk", K=2, M=3, C=4, width=1, base_channels=4, stem_channels=4,
                                num_classes=10, seed=1, residual_init="one", conv_init="resnext")
    expected = dict(same_seed.named_parameters())
    assert all(torch.equal(w, expected[n]) for n, w in fresh.named_parameters())


def test_a_pruned_connectivity_trains_from_scratch_and_its_pruned_checkpoint_has_its_own_top1(offline, tmp_path,
                                                                                                  capsys):
    from connlearn.checkpoint import load_checkpoint, make_checkpoint, save_atomic
    from connlearn.prune import prune_dead_blocks

    small, report = prune_dead_blocks(connlearn.build(gate="random", K=1, M=3, C=4, width=1, base_channels=4,
                                                      stem_channels=4, num_classes=10, seed=3))
    assert report.blocks_after < report.blocks_before
    save_atomic(make_checkpoint(small), tmp_path / "pruned_source.pt")
    run = CifarRun(dataset="cifar10", connectivity=str(tmp_path / "pruned_source.pt"), epochs=2, train_subset=200,
                   test_subset=100, batch_size=32, out=str(tmp_path / "run"), progress=False, snapshot_every=0)
    summary = run_cifar(run)
    assert summary["params_train"] == small.num_parameters()
    assert "no resnext_vs_learned.svg" in capsys.readouterr().out
    assert not (tmp_path / "run" / "resnext_vs_learned.svg").exists()
    assert (tmp_path / "run" / "connectivity.dot").exists()
    pruned = load_checkpoint(tmp_path / "run" / "pruned.pt")
    assert pruned["meta"]["top1"] == load_checkpoint(tmp_path / "run" / "last.pt")["history"][-1]["test_top1"]


def test_a_run_resumed_with_other_settings_is_refused(offline, tmp_path):
    """Its folder holds a run of another seed or another connectivity: resuming would mix two runs."""
    import torch

    from connlearn.checkpoint import make_checkpoint, save_atomic
    from connlearn.errors import ConfigError

    source, path = _learned_source(tmp_path)
    opts = dict(dataset="cifar10", epochs=1, seed=1, train_subset=200, test_subset=100, batch_size=32,
                progress=False, snapshot_every=0)
    run = CifarRun(connectivity=str(path), out=str(tmp_path / "run"), **opts)
    run_cifar(run)
    assert run_cifar(run)["run"]["seed"] == 1  # the same command resumes (here: finds it finished)
    with pytest.raises(ConfigError, match="seed=1 there, 2 here"):
        run_cifar(attrs.evolve(run, seed=2))
    with torch.no_grad():  # the same network with the gate values of each row reversed: another top-K
        for _, g in source.gates():
            g.real.copy_(g.real.flip(-1))
    other = tmp_path / "other.pt"
    save_atomic(make_checkpoint(source), other)
    with pytest.raises(ConfigError, match="another top-K"):
        run_cifar(attrs.evolve(run, connectivity=str(other)))
    with pytest.raises(ConfigError, match=r"connectivity='.*source.pt' there, None here"):
        run_cifar(attrs.evolve(run, connectivity=None, M=3, C=4, K=2, width=1, base_channels=4, stem_channels=4))
    gated = CifarRun(M=3, C=4, K=2, width=1, base_channels=4, stem_channels=4, out=str(tmp_path / "gated"), **opts)
    run_cifar(gated)
    with pytest.raises(ConfigError, match="connectivity=None there"):
        run_cifar(attrs.evolve(gated, connectivity=str(path)))
    for change, message in [(dict(gate_grad="centered"), "gate_grad='plain' there, 'centered' here"),
                            (dict(gate_init=0.3), "gate_init=0.5 there, 0.3 here"),
                            (dict(train_subset=300), "train_subset=200 there, 300 here"),
                            (dict(gate="real"), "gate='topk' there, 'real' here"),
                            (dict(gate_temperature_end=0.1), "gate_temperature_end=None there, 0.1 here"),
                            (dict(loader="dataloader"), "loader='auto' there, 'dataloader' here")]:
        with pytest.raises(ConfigError, match=message):
            run_cifar(attrs.evolve(gated, **change))
    (tmp_path / "gated" / "last.pt").write_bytes(b"truncated")  # the trainer would resume from previous.pt
    (tmp_path / "gated" / "previous.pt").write_bytes((tmp_path / "run" / "last.pt").read_bytes())
    with pytest.raises(ConfigError, match="seed=1 there, 2 here"), pytest.warns(UserWarning, match="previous.pt"):
        run_cifar(attrs.evolve(gated, seed=2))


def test_a_connectivity_must_exist_and_fit_the_dataset(tmp_path):
    from connlearn.errors import ConfigError

    with pytest.raises(ConfigError, match="no file at"):
        experiment.build_net(CifarRun(dataset="cifar10", connectivity=str(tmp_path / "none.pt")), 10)
    _, path = _learned_source(tmp_path)
    with pytest.raises(ConfigError, match="has 10 classes; cifar100 has 100"):
        experiment.build_net(CifarRun(dataset="cifar100", connectivity=str(path)), 100)
    with pytest.raises(ConfigError, match="own output folder"):  # its checkpoints would be resumed and overwritten
        experiment.build_net(CifarRun(dataset="cifar10", connectivity=str(path), out=str(tmp_path)), 10)
    imagenet = tmp_path / "imagenet.json"
    imagenet.write_text(connlearn.build(preset="miniimagenet-20-4-8", gate="random", K=2, C=4, M=3, width=1,
                                        num_classes=10).graph().to_json())
    with pytest.raises(ConfigError, match="64 px images; cifar10 runs on 3-channel 32 px images"):
        experiment.build_net(CifarRun(dataset="cifar10", connectivity=str(imagenet)), 10)
    with pytest.raises(ConfigError, match="32 px images; miniimagenet runs on 3-channel 64 px images"):
        experiment.build_net(CifarRun(dataset="miniimagenet", connectivity=str(path)), 100)


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(SHARED_DATA), reason=f"the real CIFAR-10 file is absent ({SHARED_DATA})")
def test_a_small_gated_net_learns_real_cifar10(tmp_path):
    """5,000 class-balanced training images, 3 epochs (phases 1/1/1 at lr 0.1/0.1/0.01), K=2 of C=4."""
    run = CifarRun(dataset="cifar10", preset="cifar-20-4-8", M=3, C=4, K=2, width=4, base_channels=32,
                   stem_channels=16, epochs=3, train_subset=5000, test_subset=2000, data=SHARED_DATA,
                   out=str(tmp_path), progress=False, snapshot_every=0)
    summary = run_cifar(run)
    assert summary["dataset"] == "cifar10"
    assert summary["test_top1"] >= 30.0, summary["test_top1"]


@pytest.mark.parametrize("seed", [-1, 2**40 + 1])
def test_a_seed_the_data_order_cannot_take_is_refused_before_anything_is_made(seed):
    with pytest.raises(ConfigError, match=r"seed \(of the weights, the gates and the data order\) must be"):
        CifarRun(dataset="cifar10", seed=seed)


def test_unknown_dataset_and_preset_names_suggest_the_closest():
    from connlearn.errors import UnknownNameError

    with pytest.raises(UnknownNameError, match="did you mean 'cifar100'"):
        CifarRun(dataset="cifar1000")
    with pytest.raises(UnknownNameError, match="did you mean 'cifar-29-8-8'"):
        CifarRun(preset="cifar-29-8-9")
    with pytest.raises(UnknownNameError, match="did you mean 'sqrt_k'"):
        CifarRun(residual_init="sqrtK")
    with pytest.raises(UnknownNameError, match="did you mean 'topk'"):  # before any data is looked for
        CifarRun(gate="top-k")


def test_a_run_s_temperature_reaches_phase_one_only_and_bad_ones_are_refused():
    recipe = experiment.make_recipe(CifarRun(epochs=8, gate_temperature=0.5, gate_temperature_end=0.05, gate_lr=0.1,
                                             gate_momentum=0.0))
    first, *rest = recipe.phases
    assert (first.temperature, first.temperature_end, first.gate_lr, recipe.gate_momentum) == (0.5, 0.05, 0.1, 0.0)
    assert all(p.temperature == 1.0 and p.temperature_end is None for p in rest)
    assert experiment.make_recipe(CifarRun(epochs=8)) == get_recipe("cifar").scaled(8)
    for bad in (dict(gate_temperature=0), dict(gate_temperature_end=-1.0), dict(gate_momentum=1.5)):
        with pytest.raises(connlearn.ConnlearnError, match=next(iter(bad))):
            CifarRun(**bad)


def test_a_run_takes_its_phase_split_as_given_and_the_cli_fills_in_the_total():
    from connlearn.cli import build_parser, run_from_args

    recipe = experiment.make_recipe(CifarRun(epochs=16, phases=[10, 3, 2, 1], gate_temperature_end=0.05))
    assert [p.epochs for p in recipe.phases] == [10, 3, 2, 1]  # instead of the scaled 6/5/3/2
    assert recipe.phases[0].temperature_end == 0.05 and recipe.phases[0].gate_lr == 0.2
    with pytest.raises(ConfigError, match="phases 10/3/2/1 add up to 16 epochs, but epochs is 320"):
        CifarRun(phases=(10, 3, 2, 1))
    with pytest.raises(ConfigError, match="4 counts"):
        CifarRun(phases=(10, 6), epochs=16)
    parse = build_parser().parse_args
    assert run_from_args(parse(["train", "--phases", "10", "3", "2", "1"])).epochs == 16
    with pytest.raises(ConfigError, match="but epochs is 20"):
        run_from_args(parse(["train", "--phases", "10", "3", "2", "1", "--epochs", "20"]))
    with pytest.raises(ConfigError, match="epochs of phase 1 must be >= 1, got 0"):  # not a complaint about epochs
        run_from_args(parse(["train", "--phases", "0", "0", "0", "0"]))


@pytest.mark.parametrize(("phases", "message"), [([10, 3, 2, 1], None),
                                                 (["10", "3", "2", "1"], "phase 1 must be an integer"),
                                                 ([-5, 1, 1, 1], "phase 1 must be >= 1"), ([], "4 counts"),
                                                 ([10.0, 3, 2, 1], "phase 1 must be an integer")])
def test_a_config_file_gives_the_split_and_bad_counts_are_named(phases, message, tmp_path):
    from connlearn.cli import build_parser, run_from_args

    config = tmp_path / "run.json"
    config.write_text(json.dumps({"phases": phases, "dataset": "cifar10"}))
    args = build_parser().parse_args(["train", "--config", str(config)])
    if message is None:
        run = run_from_args(args)
        assert run.phases == (10, 3, 2, 1) and run.epochs == 16
        assert json.loads(json.dumps(run.to_dict()))["phases"] == phases
    else:
        with pytest.raises(connlearn.ConnlearnError, match=message):
            run_from_args(args)


def test_numpy_counts_become_ints_that_a_summary_can_hold():
    import numpy as np

    for counts in (tuple(np.array([10, 3, 2, 1])), list(np.array([10, 3, 2, 1]))):
        run = CifarRun(phases=counts, epochs=16)
        assert all(type(e) is int for e in run.phases) and json.dumps(run.to_dict())


def test_a_run_trains_its_phase_split_and_resumes_only_with_it(offline, tmp_path):
    run = CifarRun(dataset="cifar10", M=3, C=2, K=1, width=1, base_channels=4, stem_channels=4, epochs=5,
                   phases=(1, 2, 1, 1), train_subset=100, test_subset=50, batch_size=50, out=str(tmp_path),
                   progress=False, snapshot_every=0)
    assert run_cifar(run)["epochs"] == 5
    assert [r["phase"] for r in read_jsonl(tmp_path / "log.jsonl")] == [1, 2, 2, 3, 4]  # scaled: 2/1/1/1
    with pytest.raises(ConfigError, match="phases='1/2/1/1' there, '2/1/1/1' here"):
        run_cifar(attrs.evolve(run, phases=None))  # the scaled split of the same 5 epochs


def test_a_run_on_a_validation_split_labels_its_curves_validation(offline, tmp_path, monkeypatch):
    from connlearn import plots

    told, plot_run = [], plots.plot_run

    def recording(*args, eval_set, **kw):
        told.append(eval_set)
        return plot_run(*args, eval_set=eval_set, **kw)

    monkeypatch.setattr(plots, "plot_run", recording)
    run = CifarRun(dataset="cifar10", M=3, C=2, K=1, width=1, base_channels=4, stem_channels=4, epochs=1,
                   train_subset=100, val_split=50, batch_size=50, progress=False, snapshot_every=0)
    for held_out, name in ((run, "validation"), (attrs.evolve(run, val_split=None, test_subset=50), "test")):
        run_cifar(attrs.evolve(held_out, out=str(tmp_path / name)))
        assert told.pop() == name and (tmp_path / name / "curves.png").exists()


def test_a_run_is_evaluated_on_the_validation_split_it_holds_out_else_on_the_test_set():
    assert eval_set_of(CifarRun(val_split=500).to_dict()) == "validation"
    assert eval_set_of(CifarRun().to_dict()) == "test"
    with pytest.raises(ConfigError, match="got str"):
        eval_set_of("validation")


def test_a_connectivity_file_that_is_no_network_and_a_missing_gpu_are_named_before_data(tmp_path, monkeypatch):
    def no_data(*args, **kwargs):
        raise AssertionError("data was read")

    monkeypatch.setattr(experiment, "load_dataset", no_data)
    doc = json.loads(connlearn.build(M=3, C=2, K=1, width=1).graph().to_json())
    doc["nodes"] = [n for n in doc["nodes"] if n["id"] != "input"]
    doc["edges"] = [e for e in doc["edges"] if e["source"] != "input"]
    (tmp_path / "g.json").write_text(json.dumps(doc))
    with pytest.raises(GraphError, match=r"connectivity: .*g.json does not describe a network: the graph has no "
                                         "'input' node"):
        experiment._net_of_connectivity(CifarRun(connectivity=str(tmp_path / "g.json"), out=str(tmp_path / "run")),
                                        10)
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="device 'cuda' asks for a CUDA GPU"):
            run_cifar(CifarRun(device="cuda", out=str(tmp_path / "run")))


def test_a_subset_not_below_the_images_there_says_it_takes_them_all(offline, capsys):
    train, test, _ = experiment.load_data(experiment.CifarRun(dataset="cifar10", train_subset=10**7, test_subset=300))
    said = capsys.readouterr().out
    assert f"train_subset=10000000 is not below the {len(train)} images there: taking all of them" in said
    assert len(test) == 300 and "test_subset" not in said


def test_an_architecture_value_given_beside_a_connectivity_file_is_refused_not_dropped(offline, tmp_path):
    _, path = _learned_source(tmp_path)
    run = CifarRun(dataset="cifar10", connectivity=str(path), epochs=1, C=8, K=3, M=3, train_subset=200,
                   test_subset=100, batch_size=32, out=str(tmp_path / "run"), progress=False, snapshot_every=0)
    with pytest.raises(ConfigError, match=r"connectivity: the network in .* has C=4, K=2; C=8, K=3 asks for another: "
                                          r"leave it out"):
        run_cifar(run)


def test_a_file_given_as_the_output_folder_is_named_and_a_resume_says_where_it_goes_on(offline, tmp_path, capsys):
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match=r"out: .*file is a file; the output is a folder"):
        run_cifar(CifarRun(dataset="cifar10", out=str(tmp_path / "file"), progress=False))
    bad = tmp_path / "never"
    with pytest.raises(ConnlearnError, match="unknown gate kind 'topkk'"):
        run_cifar(CifarRun(dataset="cifar10", gate="topkk", out=str(bad), progress=False, epochs=1,
                           train_subset=200, test_subset=100))
    assert not bad.exists()  # no folder left by options that built nothing
    args = ["--epochs", "1", "--out", str(tmp_path / "run"), "--train-subset", "200", "--test-subset", "100", *TINY]
    assert train_script("cifar10", None, args) == 0
    capsys.readouterr()
    assert train_script("cifar10", None, args) == 0  # finished: resumes after its last epoch
    assert f"connlearn: resuming the run in {tmp_path / 'run'} after epoch 1 of 1" in capsys.readouterr().out


def test_a_gate_rule_for_gates_that_learn_nothing_is_noted(offline, tmp_path, capsys):
    args = ["--epochs", "1", "--out", str(tmp_path / "run"), "--train-subset", "200", "--test-subset", "100",
            "--gate", "random", "--gate-grad", "centered", *TINY]
    assert train_script("cifar10", None, args) == 0
    assert "connlearn: gate=random learns no gates: gate_grad=centered has no effect" in capsys.readouterr().out


def test_a_resume_names_another_engine_or_architecture_and_tells_of_another_number_of_processes(offline, tmp_path,
                                                                                               capsys):
    from connlearn.checkpoint import load_checkpoint, save_atomic

    run = CifarRun(dataset="cifar10", gate="random", K=1, M=3, C=4, width=1, base_channels=4, stem_channels=4,
                   epochs=1, train_subset=100, test_subset=50, batch_size=25, out=str(tmp_path / "run"),
                   progress=False, snapshot_every=0)
    run_cifar(run)
    with pytest.raises(ConfigError, match=r"engine='fused' there, 'reference' here"):
        run_cifar(attrs.evolve(run, engine="reference"))
    with pytest.raises(ConfigError, match=r"C=4 there, 2 here; K=1 there, 2 here"):  # named, not "another architecture"
        run_cifar(attrs.evolve(run, C=2, K=2))
    first = run_cifar(attrs.evolve(run, engine="auto"))  # options that build the same network resume it
    capsys.readouterr()
    renamed = run_cifar(attrs.evolve(run, preset="cifar-20-4-8"))  # every option of its shape overridden
    assert renamed["preset"] == renamed["run"]["preset"] == first["preset"] != "cifar-20-4-8"
    assert f"built as {first['preset']} (its checkpoint), not cifar-20-4-8" in capsys.readouterr().out
    full = attrs.evolve(run, gate="full", K=None, out=str(tmp_path / "full"))
    run_cifar(full)
    run_cifar(attrs.evolve(full, K=4, engine="reference"))  # ResNeXt's single stream on any engine, K=C
    ckpt = load_checkpoint(tmp_path / "run" / "last.pt")
    assert ckpt["meta"]["world_size"] == 1
    ckpt["meta"]["world_size"] = 2  # as if trained under torchrun with two processes
    save_atomic(ckpt, tmp_path / "run" / "last.pt")
    capsys.readouterr()
    run_cifar(run)
    assert "in 2 processes and goes on in 1: each batch norm now normalises over 1/1" in capsys.readouterr().out


def test_a_run_with_activation_checkpointing_trains_as_one_without(offline, tmp_path, monkeypatch):
    trainer, settings = experiment.Trainer, []

    def recording(net, *args, **kwargs):  # what the trainer is given
        settings.append(net.activation_checkpointing)
        return trainer(net, *args, **kwargs)

    monkeypatch.setattr(experiment, "Trainer", recording)
    args = ["--epochs", "2", "--train-subset", "200", "--test-subset", "100", *TINY]
    for name, extra in (("plain", []), ("checkpointed", ["--activation-checkpointing"])):
        assert train_script("cifar10", None, [*args, "--out", str(tmp_path / name), *extra]) == 0
    assert settings == [False, True]
    plain, checkpointed = (json.loads((tmp_path / name / "summary.json").read_text())
                           for name in ("plain", "checkpointed"))
    assert checkpointed["run"]["activation_checkpointing"] and not plain["run"]["activation_checkpointing"]
    for key in ("test_top1", "best_top1", "params_test"):
        assert checkpointed[key] == plain[key], key
    logs = [read_jsonl(tmp_path / name / "log.jsonl") for name in ("plain", "checkpointed")]
    for a, b in zip(*logs, strict=True):
        for key in ("train_loss", "test_loss", "gate_mean", "drawn_distinct"):
            assert b[key] == (None if a[key] is None else pytest.approx(a[key], rel=1e-5)), key


def test_the_environment_names_the_commit_of_the_checkout_connlearn_runs_from(tmp_path, monkeypatch):
    import shutil

    import connlearn.checkpoint as checkpoint

    root = Path(checkpoint.__file__).resolve().parent.parent
    checkpoint.source_commit.cache_clear()  # read once a process: this one may have begun at another commit
    if (root / ".git").exists() and shutil.which("git"):
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True)
        if head.returncode == 0:
            assert checkpoint.environment()["commit"] in (head.stdout.strip(), head.stdout.strip() + "+changes")
    # an installed package (no checkout above it) has no commit to name
    monkeypatch.setattr(checkpoint, "__file__", str(tmp_path / "site-packages" / "connlearn" / "checkpoint.py"))
    assert checkpoint.source_commit.__wrapped__() is None
