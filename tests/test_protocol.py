"""The protocols and the command, end to end: a run trains, prunes, draws and resumes; every subcommand works on
its files; a dataset of its own size and channels trains; bad settings and missing data are one line each."""

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

import connlearn
from connlearn.cli import main
from connlearn.train import ImageDataset, RunConfig, load_checkpoint, make_checkpoint, net_from_checkpoint, run
from connlearn.train.checkpoint import save_checkpoint
from connlearn.train.data import pack, synthetic
from connlearn.train.metrics import evaluate
from connlearn.train.protocol import build_net, load_data, run_loaders

TINY = ["--synthetic", "--M", "3", "--C", "4", "--K", "2", "--width", "2", "--base-channels", "8", "--stem-channels",
        "4", "--train-subset", "200", "--test-subset", "100", "--batch-size", "32", "--no-progress", "--snapshot-every",
        "3"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    assert main(["train", "--dataset", "cifar10", "--epochs", "3", "--out", str(out), *TINY]) == 0
    return out


def test_a_run_writes_its_checkpoints_pictures_and_summary(finished):
    summary = json.loads((finished / "summary.json").read_text())
    assert summary["epochs"] == 3 and summary["params_test"] <= summary["params_train"]
    for name in ("last.pt", "best.pt", "pruned.pt", "log.jsonl", "gates.jsonl", "connectivity.dot", "connectivity.svg",
                 "resnext_vs_learned.png", "active_branches.png", "gate_heatmaps.png", "curves.png",
                 "gate_evolution.png"):
        assert (finished / name).is_file(), name
    assert not (finished / "draws.png").exists()  # phase 1 is one epoch: one point of draws is no curve
    trained, pruned = net_from_checkpoint(finished / "last.pt").eval(), net_from_checkpoint(finished / "pruned.pt")
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(pruned.eval()(x), trained(x), atol=1e-5, rtol=1e-5)


def test_the_same_command_resumes_and_other_settings_are_refused(finished, capsys):
    assert main(["train", "--dataset", "cifar10", "--epochs", "3", "--out", str(finished), *TINY]) == 0
    assert "resuming the run" in capsys.readouterr().out
    assert main(["train", "--dataset", "cifar10", "--epochs", "3", "--seed", "1", "--out", str(finished), *TINY]) == 1
    assert "seed=0 there, 1 here" in capsys.readouterr().err


def test_a_time_limit_stops_between_epochs_and_the_run_goes_on(tmp_path):
    config = RunConfig(dataset="cifar10", synthetic=True, epochs=2, M=3, C=4, K=2, width=2, base_channels=8,
                       stem_channels=4, train_subset=100, test_subset=50, batch_size=25, out=str(tmp_path),
                       progress=False)
    assert run(config, time_limit=0.0) is None
    assert run(config)["epochs"] == 2


def test_params_train_counts_what_trained_though_the_last_phase_freezes_the_edges(tmp_path):
    k = TINY.index("--K")
    tiny = TINY[:k] + TINY[k + 2:]
    assert main(["train", "--dataset", "cifar10", "--epochs", "3", "--gate", "dnw", "--density", "0.5", "--out",
                 str(tmp_path), *tiny]) == 0
    summary, net = json.loads((tmp_path / "summary.json").read_text()), net_from_checkpoint(load_checkpoint(
        tmp_path / "last.pt"))  # frozen: the edges not kept are multiplied by 0 from here on
    assert summary["params_train"] == sum(p.numel() for p in net.weight_parameters()) > net.num_parameters()


def test_a_node_graph_run_finishes_at_any_density_and_compares_no_k_of_c_chance(tmp_path, capsys):
    # a budget's nominal K (its mean fan-in) exceeds the first stage's candidates here
    assert main(["train", "--dataset", "cifar10", "--synthetic", "--epochs", "1", "--topology", "neural-graph",
                 "--nodes", "2", "100", "--stem-nodes", "8", "--features", "4", "--gate", "dnw", "--density", "1",
                 "--train-subset", "64", "--test-subset", "32", "--batch-size", "32", "--no-progress", "--out",
                 str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["K"] > 8 and summary["input_overlap"] and summary["input_overlap_chance"] == {}
    capsys.readouterr()
    assert main(["info", str(tmp_path / "last.pt"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["architecture"] == "neural-graph {nodes 8+2+100}"


def test_a_run_started_by_an_earlier_version_resumes(finished, tmp_path, capsys):
    ckpt = load_checkpoint(finished / "last.pt")  # as 0.2.0 wrote it: an engine option, no lr, a nesterov flag
    ckpt["meta"]["run"] = {**{k: v for k, v in ckpt["meta"]["run"].items() if k != "lr"}, "engine": "fused",
                           "out": str(tmp_path)}
    ckpt["recipe"]["nesterov"] = False
    save_checkpoint(ckpt, tmp_path / "last.pt")
    assert main(["train", "--dataset", "cifar10", "--epochs", "3", "--out", str(tmp_path), *TINY]) == 0
    assert "resuming the run" in capsys.readouterr().out and (tmp_path / "summary.json").is_file()


def test_every_subcommand_works_on_a_runs_files(finished, tmp_path, capsys):
    assert main(["info", str(finished / "last.pt"), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["gate"] == "frozen from topk" and info["epochs_done"] == 3 and info["evaluated_on"] == "test"
    shutil.copy(finished / "last.pt", tmp_path / "last.pt")
    assert main(["prune", str(tmp_path / "last.pt")]) == 0
    assert load_checkpoint(tmp_path / "last.pruned.pt")["meta"]["params_train"] == info["params_train"]
    assert main(["render", str(finished / "last.pt"), "-o", str(tmp_path / "c.png"), "--side-by-side"]) == 0
    assert (tmp_path / "c.png").is_file() and (tmp_path / "c.dot").is_file()
    assert main(["plot", str(finished / "last.pt"), "-o", str(tmp_path / "plots")]) == 0
    assert main(["plot", str(finished / "gates.jsonl"), "-o", str(tmp_path / "g"), "--K", "2"]) == 0
    assert (tmp_path / "plots" / "curves.png").is_file() and (tmp_path / "g" / "gate_evolution.png").is_file()
    images, reference = torch.randn(3, 3, 32, 32), net_from_checkpoint(finished / "pruned.pt").eval()
    for format, load in (("torchscript", torch.jit.load), ("export", lambda p: torch.export.load(p).module())):
        assert main(["export", str(finished / "last.pt"), "--format", format, "-o", str(tmp_path / f"m.{format}")]) == 0
        torch.testing.assert_close(load(str(tmp_path / f"m.{format}"))(images), reference(images))


def test_a_finished_run_evaluates_again_to_its_logged_top1(finished):
    summary = json.loads((finished / "summary.json").read_text())
    config = RunConfig(**summary["run"])
    train, test, _, _ = load_data(config)
    test_loader = run_loaders(config, train, test, device=torch.device("cpu"))[1]
    as_trained = evaluate(net_from_checkpoint(finished / "last.pt"), test_loader)["test_top1"]
    assert as_trained == pytest.approx(summary["test_top1"], abs=1e-6)


def test_onnx_export_computes_the_same_outputs(finished, tmp_path):
    onnxruntime = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    assert main(["export", str(finished / "last.pt"), "--format", "onnx", "-o", str(tmp_path / "m.onnx")]) == 0
    images = torch.randn(3, 3, 32, 32)
    session = onnxruntime.InferenceSession(str(tmp_path / "m.onnx"))
    out = session.run(None, {session.get_inputs()[0].name: images.numpy()})[0]
    torch.testing.assert_close(torch.from_numpy(out), net_from_checkpoint(finished / "pruned.pt").eval()(images),
                               atol=1e-4, rtol=1e-4)


def test_a_learned_connectivity_trains_again_from_scratch(finished, tmp_path):
    config = RunConfig(dataset="cifar10", synthetic=True, epochs=2, connectivity=str(finished / "last.pt"),
                       train_subset=100, test_subset=50, batch_size=25, out=str(tmp_path), progress=False, seed=5)
    run(config)
    learned, again = net_from_checkpoint(finished / "last.pt"), net_from_checkpoint(tmp_path / "last.pt")
    assert all(torch.equal(a, b) for a, b in zip(learned.connectivity().values(), again.connectivity().values(),
                                                            strict=True))
    assert not torch.equal(learned.stem.conv.weight, again.stem.conv.weight)


def test_a_dataset_of_its_own_size_and_channels_trains_with_the_cifar_protocol(tmp_path):
    train, test = synthetic(num_classes=5, n_train=100, n_test=25, size=32, channels=1)
    train, test = (ImageDataset(d.images[:, 2:30], d.labels, d.class_names) for d in (train, test))  # 28x32
    data = pack(tmp_path / "grey28.npz", train, test)
    summary = run(RunConfig(dataset="custom", data=str(data), epochs=2, M=3, C=4, K=2, width=2, base_channels=8,
                            stem_channels=4, batch_size=20, out=str(tmp_path / "run"), progress=False))
    net = net_from_checkpoint(tmp_path / "run" / "last.pt")
    assert (net.in_channels, net.num_classes, net.graph().nodes["input"]["image_size"]) == (1, 5, 28)
    assert summary["epochs"] == 2


def test_without_data_the_examples_stop_with_one_line_saying_where_they_looked(tmp_path):
    env = {**os.environ, "HOME": str(tmp_path), "CONNLEARN_DATA": str(tmp_path / "none")}
    env.pop("PYTHONPATH", None)
    script = os.path.join(os.path.dirname(__file__), "..", "examples", "cifar100.py")
    done = subprocess.run([sys.executable, script, "--out", str(tmp_path / "run")], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert all(f in done.stderr for f in ("no cifar100 data found", "the default dataset", "(looked in", "--data"))
    assert not (tmp_path / "run" / "last.pt").exists()


def test_a_connectivity_learned_with_gate_options_trains_again(tmp_path):
    learned = connlearn.build(M=3, C=4, K=2, width=2, base_channels=8, stem_channels=4, num_classes=10,
                              gate="gumbel", gate_options={"tau": 0.3})
    save_checkpoint(make_checkpoint(learned), tmp_path / "gumbel.pt")
    again = build_net(RunConfig(dataset="cifar10", connectivity=str(tmp_path / "gumbel.pt")), synthetic()[0])
    assert again.gate_kind == "frozen" and again.graph().gate_label() == "frozen from gumbel"


def test_a_run_trains_its_gate_kind_as_the_kind_says_unless_told_otherwise(monkeypatch):
    from connlearn.gates import GATES

    monkeypatch.setattr(GATES.get("gumbel"), "trains_with", {"gate_optimizer": "adam", "gate_lr": 0.01})
    assert (RunConfig(gate="gumbel").gate_optimizer, RunConfig(gate="gumbel").gate_lr) == ("adam", 0.01)
    assert RunConfig(gate="gumbel", gate_optimizer="sgd").gate_optimizer == "sgd"  # what a run sets wins
    assert (RunConfig(gate="topk").gate_optimizer, RunConfig(gate="topk").gate_warmup) == ("sgd", 0)  # the paper's
    assert RunConfig(gate="gumbel").recipe().phases[0].gate_lr == 0.01


def test_flags_keep_the_type_of_their_option():
    from connlearn.cli import build_parser, config_from

    config = config_from(build_parser().parse_args(["train", "--out", "007", "--seed", "3", "--gate-init", "uniform"]))
    assert (config.out, config.seed, config.gate_init) == ("007", 3, "uniform")


def test_a_config_file_gives_the_options_and_flags_override_it(tmp_path):
    (tmp_path / "run.toml").write_text('epochs = 1\nseed = 3\nsynthetic = true\ndata = "here.npz"\n')
    from connlearn.cli import build_parser, config_from

    config = config_from(build_parser().parse_args(["train", "--config", str(tmp_path / "run.toml"), "--seed", "4"]))
    assert (config.epochs, config.seed, config.synthetic) == (1, 4, True)
    assert config.data == str(tmp_path / "here.npz")  # a relative path from the file's folder


def test_a_reader_that_goes_away_ends_the_command_quietly(finished):
    info = subprocess.Popen([sys.executable, "-m", "connlearn.cli", "info", str(finished / "last.pt")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    info.stdout.close()  # the reader is gone before the command writes
    assert info.wait(timeout=60) == 141 and info.stderr.read() == b""


def test_summary_says_modules_live_blocks_and_parameters_before_and_after_pruning():
    text = connlearn.summary(connlearn.build(preset="cifar-29-8-8", K=1).freeze())
    assert text.count("\n  module") == 9 and "0.858M" in text and "after pruning" in text
