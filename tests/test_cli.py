"""The connlearn command: every subcommand works and fails with one clear line and a non-zero exit code."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import needs_dot, tiny

import connlearn
from connlearn.checkpoint import make_checkpoint, save_atomic
from connlearn.cli import build_parser, main

COMMANDS = ["train", "prune", "render", "plot", "info", "export", "pack"]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    net = connlearn.build(**tiny(gate="random", K=1, M=6))
    path = tmp_path_factory.mktemp("ckpt") / "net.pt"
    save_atomic(make_checkpoint(net, best_top1=12.5, epoch=3), path)
    return path


def _run(args, capsys):
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("command", COMMANDS)
def test_every_subcommand_has_help(command, capsys):
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args([command, "--help"])
    assert exit_.value.code == 0
    assert "usage: connlearn " + command in capsys.readouterr().out


@pytest.mark.parametrize(("args", "closest"), [
    (["infoo"], "info"),
    (["train", "--dataset", "cifar11"], "cifar10"),
    (["train", "--preset", "cifar-20-4-9"], "cifar-20-4-8"),
    (["render", "x.pt", "-o", "y.svg", "--dead", "hid"], "hide"),
    (["train", "--engine", "fusd"], "fused"),
])
def test_a_value_outside_an_options_choices_is_bad_usage_naming_the_closest(args, closest, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(args)
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"invalid choice: {args[-1]!r}" in err and err.endswith(f"; did you mean {closest!r}?")


def test_a_choice_with_nothing_close_names_the_choices_only(capsys):
    from connlearn.cli import Parser

    parser = Parser(prog="p")
    parser.add_argument("--colour", choices=["red", "it's"])
    for value in ("zzz", 'say "no"'):
        with pytest.raises(SystemExit):
            parser.parse_args(["--colour", value])
        err = capsys.readouterr().err
        assert "invalid choice" in err and "did you mean" not in err
    with pytest.raises(SystemExit):
        parser.parse_args(["--colour", "its"])  # a choice that argparse writes in double quotes is found too
    assert capsys.readouterr().err.strip().endswith("""; did you mean "it's"?""")


def test_the_console_script_module_runs():
    done = subprocess.run([sys.executable, "-m", "connlearn.cli", "--help"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and all(c in done.stdout for c in COMMANDS)


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX pipes")
def test_output_piped_to_a_reader_that_stops_early_ends_quietly(ckpt):
    """``connlearn info last.pt | head -1``: no error and no traceback once the reader is gone."""
    import os

    read, write = os.pipe()
    os.close(read)  # the reader is gone before anything is written
    done = subprocess.run([sys.executable, "-m", "connlearn.cli", "info", str(ckpt)], stdout=write,
                          stderr=subprocess.PIPE, text=True, timeout=120)
    os.close(write)
    assert (done.returncode, done.stderr) == (141, "")


def test_a_broken_pipe_other_than_the_outputs_is_an_error_line(capsys):
    from connlearn.cli import _guarded

    def fails(args):
        raise BrokenPipeError(32, "Broken pipe")  # a worker's pipe, a socket: not the reader of the output

    assert _guarded(fails, None) == 1
    assert capsys.readouterr().err == "connlearn: error: [Errno 32] Broken pipe\n"


def test_info_describes_the_checkpoint(ckpt, capsys):
    code, out, _ = _run(["info", ckpt, "--json"], capsys)
    info = json.loads(out)
    assert code == 0
    assert info["gate"] == "random" and info["K"] == 1 and info["best_top1"] == 12.5
    assert info["conv_init"] == "branch"
    assert info["params_test"] < info["params_train"]
    assert [part.split(":")[0] for part in info["input_overlap"].split(", ")] == ["m2", "m3", "m4", "m5", "m6"]
    assert info["evaluated_on"] == "unknown"  # a checkpoint without run options cannot say which data


@pytest.mark.parametrize(("val_split", "named"), [(None, "test"), (500, "validation")])
def test_info_names_the_data_best_top1_was_measured_on(val_split, named, tmp_path, capsys):
    net = connlearn.build(**tiny(gate="random", K=1))
    path = tmp_path / "last.pt"
    save_atomic(make_checkpoint(net, best_top1=40.0, epoch=2, meta={"run": {"val_split": val_split}}), path)
    code, out, _ = _run(["info", path], capsys)
    assert code == 0 and f"evaluated_on    {named}" in out


def test_prune_writes_a_smaller_network_with_the_same_outputs(ckpt, tmp_path, capsys):
    code, out, _ = _run(["prune", ckpt, "-o", tmp_path / "pruned.pt"], capsys)
    assert code == 0 and "fewer" in out
    net = connlearn.checkpoint.net_from_checkpoint(ckpt).eval()
    pruned = connlearn.checkpoint.net_from_checkpoint(tmp_path / "pruned.pt").eval()
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(pruned(x), net(x))
    assert pruned.num_parameters() < net.num_parameters()


def test_info_tells_the_weights_own_top1_from_the_runs_best_and_prune_keeps_both_and_the_overlap(tmp_path, capsys):
    net = connlearn.build(**tiny(gate="random", K=1, M=6))
    history = [{"epoch": 1, "test_top1": 30.0}, {"epoch": 2, "test_top1": 20.0}]
    save_atomic(make_checkpoint(net, best_top1=30.0, epoch=2, history=history), tmp_path / "last.pt")
    overlaps = []
    for path in ("last.pt", "pruned.pt"):
        if path == "pruned.pt":
            assert _run(["prune", tmp_path / "last.pt", "-o", tmp_path / path], capsys)[0] == 0
        info = json.loads(_run(["info", tmp_path / path, "--json"], capsys)[1])
        assert (info["best_top1"], info["top1"]) == (30.0, 20.0)
        overlaps.append(info["input_overlap"])
    assert overlaps[0] == overlaps[1]  # the pruned one says the unpruned one's
    from connlearn.prune import input_overlap  # which differs from the pruned network's own

    own = input_overlap(connlearn.checkpoint.net_from_checkpoint(tmp_path / "pruned.pt").graph())
    assert ", ".join(f"m{m}: {v:.2f}" for m, v in own.items()) != overlaps[0]


@needs_dot
def test_render_writes_dot_and_svg(ckpt, tmp_path, capsys):
    code, _, _ = _run(["render", ckpt, "-o", tmp_path / "fig.svg", "--side-by-side"], capsys)
    assert code == 0 and (tmp_path / "fig.dot").exists() and (tmp_path / "fig.svg").exists()


@pytest.mark.parametrize(("flag", "weighted"), [((), True), (("--weighted",), True), (("--no-weighted",), False)])
def test_render_draws_unfrozen_real_gates_weighted_unless_told_not_to(tmp_path, capsys, flag, weighted):
    path = tmp_path / "real.pt"
    save_atomic(make_checkpoint(connlearn.build(**tiny(gate="real", gate_init="uniform"))), path)
    code, _, _ = _run(["render", path, "-o", tmp_path / "real.dot", *flag], capsys)
    assert code == 0 and ("penwidth" in (tmp_path / "real.dot").read_text()) is weighted


def test_render_without_graphviz_writes_the_dot_file_and_fails_naming_the_fix(ckpt, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    code, _, err = _run(["render", ckpt, "-o", tmp_path / "fig.svg"], capsys)
    assert code == 1 and err.startswith("connlearn: error: ") and "install Graphviz" in err
    assert (tmp_path / "fig.dot").exists() and not (tmp_path / "fig.svg").exists()


@pytest.mark.parametrize("name", ["fig.dot", "fig.DOT"])
def test_render_to_dot_needs_no_graphviz(ckpt, tmp_path, capsys, monkeypatch, name):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    code, _, err = _run(["render", ckpt, "-o", tmp_path / name], capsys)
    assert code == 0 and not err and (tmp_path / "fig.dot").read_text().startswith("digraph")


def test_plot_writes_pictures(ckpt, tmp_path, capsys):
    code, _, _ = _run(["plot", ckpt, "-o", tmp_path], capsys)
    assert code == 0 and (tmp_path / "active_branches.png").exists()


def _plot_eval_set(tmp_path, capsys, monkeypatch, source, meta=None, summary=None, last=True, extra=()):
    """Run ``connlearn plot`` on a run folder holding the given files; the eval_set its curves got."""
    from connlearn import plots

    run = tmp_path / "run"
    run.mkdir()
    if last:
        save_atomic(make_checkpoint(connlearn.build(**tiny(gate="random", K=1, M=6)), meta=meta), run / "last.pt")
    if summary is not None:
        (run / "summary.json").write_text(summary)
    (run / "log.jsonl").write_text("".join(json.dumps({"epoch": e, "test_top1": 10.0 * e, "train_loss": 2.0 / e})
                                           + "\n" for e in (1, 2)))
    seen, plot = [], plots.plot_training_curves
    monkeypatch.setattr(plots, "plot_training_curves", lambda *a, **kw: seen.append(kw["eval_set"]) or plot(*a, **kw))
    code, _, err = _run(["plot", run / source, "-o", tmp_path / "out", *extra], capsys)
    assert code == 0, err
    assert len(seen) == 1
    return seen[0]


@pytest.mark.parametrize(("options", "expected"), [({"val_split": 500}, "validation"), ({"val_split": None}, "test")])
def test_plot_names_the_evaluation_set_the_run_used(tmp_path, capsys, monkeypatch, options, expected):
    run = {"run": options}
    summary = json.dumps(run)
    for name, kwargs in {
        "checkpoint": dict(source="last.pt", meta=run),
        "log of a finished run": dict(source="log.jsonl", summary=summary, last=False),
        "log of an unfinished run (its last.pt)": dict(source="log.jsonl", meta=run),
        "log beside an unreadable summary.json": dict(source="log.jsonl", meta=run, summary="{not json"),
    }.items():
        folder = tmp_path / name
        folder.mkdir()
        assert _plot_eval_set(folder, capsys, monkeypatch, **kwargs) == expected, name


@pytest.mark.parametrize(("source", "meta"), [("log.jsonl", None), ("last.pt", None), ("last.pt", {"run": "a name"}),
                                              ("last.pt", {"run": {"val_split": 500}})])
def test_plot_says_eval_where_the_run_does_not_say_or_as_told(tmp_path, capsys, monkeypatch, source, meta):
    told = meta is not None and isinstance(meta["run"], dict)  # a run that says validation, told test
    last = source == "last.pt"  # a log alone: no options anywhere
    extra = ("--eval-set", "test") if told else ()
    expected = "test" if told else "eval"
    assert _plot_eval_set(tmp_path, capsys, monkeypatch, source, meta=meta, last=last, extra=extra) == expected


def test_export_writes_torchscript(ckpt, tmp_path, capsys):
    code, _, _ = _run(["export", ckpt, "--format", "torchscript", "-o", tmp_path / "net.ts"], capsys)
    assert code == 0 and (tmp_path / "net.ts").exists()
    code, _, _ = _run(["export", ckpt, "--format", "ts"], capsys)  # the suffix names the format
    assert code == 0 and Path(ckpt).with_suffix(".ts").exists()
    with pytest.raises(SystemExit):
        _run(["export", ckpt, "--format", "tflite"], capsys)
    assert "invalid choice: 'tflite' (choose from" in capsys.readouterr().err


def test_pack_an_image_folder(tmp_path, capsys):
    from PIL import Image

    for split in ("train", "test"):
        for cls in ("a", "b"):
            (tmp_path / "src" / split / cls).mkdir(parents=True)
            Image.new("RGB", (8, 8), (10, 200, 30)).save(tmp_path / "src" / split / cls / "0.png")
    code, _, _ = _run(["pack", tmp_path / "src", "-o", tmp_path / "packed.npz"], capsys)
    assert code == 0
    train, _ = connlearn.data.load_packed(tmp_path / "packed.npz")
    assert len(train) == 2 and train.class_names == ("a", "b")


def _one_line_error(code, err):
    lines = err.strip().splitlines()
    return code == 1 and len(lines) == 1 and lines[0].startswith("connlearn: error:") and "Traceback" not in err


@pytest.mark.parametrize("command", ["info", "prune", "render", "plot", "export"])
def test_a_missing_file_is_one_line_and_exit_1(command, tmp_path, capsys):
    extra = [] if command in ("info", "export") else ["-o", tmp_path / "out"]
    code, _, err = _run([command, tmp_path / "nope.pt", *extra], capsys)
    assert _one_line_error(code, err) and "nope.pt" in err


def test_a_truncated_checkpoint_is_one_line_and_exit_1(ckpt, tmp_path, capsys):
    cut = tmp_path / "cut.pt"
    cut.write_bytes(ckpt.read_bytes()[:100])
    code, _, err = _run(["info", cut], capsys)
    assert _one_line_error(code, err) and "truncated or corrupt" in err


def test_a_foreign_checkpoint_is_one_line_and_exit_1(tmp_path, capsys):
    torch.save({"state_dict": {}}, tmp_path / "foreign.pt")
    code, _, err = _run(["render", tmp_path / "foreign.pt", "-o", tmp_path / "x.svg"], capsys)
    assert _one_line_error(code, err) and "not a connlearn checkpoint" in err


def test_a_checkpoint_whose_weights_do_not_fit_is_one_line_and_exit_1(tmp_path, capsys):
    net = connlearn.build(**tiny())
    ckpt = make_checkpoint(net)
    ckpt["graph"] = connlearn.build(**tiny(C=3)).graph().to_json()
    torch.save(ckpt, tmp_path / "mixed.pt")
    code, _, err = _run(["info", tmp_path / "mixed.pt"], capsys)
    assert _one_line_error(code, err) and "do not fit" in err


def test_resuming_a_run_of_another_architecture_is_one_line_and_exit_1(tmp_path, capsys):
    data = tmp_path / "data.npz"
    connlearn.data.pack(data, *connlearn.data.synthetic(num_classes=10, n_train=100, n_test=50))

    def train(modules):
        return _run(["train", "--dataset", "cifar10", "--data", data, "--epochs", "1", "--out", tmp_path / "run",
                     "--M", modules, "--C", "2", "--K", "1", "--width", "1", "--base-channels", "4",
                     "--stem-channels", "4", "--batch-size", "25", "--no-progress"], capsys)

    assert train(3)[0] == 0
    code, _, err = train(6)
    assert _one_line_error(code, err) and "other settings (depth=11 there, 20 here)" in err


def test_usage_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["render"])
    assert exit_.value.code == 2


def test_train_options_come_from_a_config_file_and_flags_override_it(tmp_path):
    import argparse

    from connlearn.cli import add_train_arguments, run_from_args

    config = tmp_path / "run.json"
    config.write_text(json.dumps({"preset": "cifar-20-4-8", "gate": "random", "K": 2, "train-subset": 500}))
    parser = argparse.ArgumentParser()
    add_train_arguments(parser)
    run = run_from_args(parser.parse_args(["--config", str(config), "--K", "3", "--residual-init", "sqrt_k",
                                           "--conv-init", "resnext", "--gate-temperature", "0.5",
                                           "--gate-temperature-end", "0.05"]))
    assert (run.preset, run.gate, run.K, run.train_subset) == ("cifar-20-4-8", "random", 3, 500)
    assert (run.residual_init, run.gate_temperature, run.gate_temperature_end) == ("sqrt_k", 0.5, 0.05)
    assert run.conv_init == "resnext"
    from connlearn.experiment import build_net

    bn3 = build_net(run, 10).stages[0].block.bn3.weight
    torch.testing.assert_close(bn3.detach(), torch.full_like(bn3, 3**0.5))


def test_an_unknown_config_key_is_one_line_with_the_closest_option(tmp_path, capsys):
    config = tmp_path / "run.json"
    config.write_text(json.dumps({"epoch": 3}))
    code, _, err = _run(["train", "--config", config], capsys)
    assert _one_line_error(code, err) and "did you mean 'epochs'" in err


@pytest.mark.parametrize(("name", "content", "message"), [
    ("run.json", "[1, 2]", "holds a list; a config is one JSON object of options"),
    ("run.json", b"\x80\x81", "is not valid JSON"),
    pytest.param("run.toml", "epochs = [", "is not valid TOML",
                 marks=pytest.mark.skipif(sys.version_info < (3, 11), reason="TOML configs need Python 3.11")),
])
def test_a_config_file_that_is_no_object_of_options_is_one_line(tmp_path, capsys, name, content, message):
    config = tmp_path / name
    config.write_bytes(content if isinstance(content, bytes) else content.encode())
    code, _, err = _run(["train", "--config", config], capsys)
    assert _one_line_error(code, err) and message in err


@pytest.fixture(scope="module")
def real_ckpt(tmp_path_factory):
    """A ``real``-gated net in phase 1: its gates weight every input, nothing is frozen yet."""
    net = connlearn.build(**tiny(gate="real", gate_init="uniform", K=1, seed=1))
    path = tmp_path_factory.mktemp("real") / "real.pt"
    save_atomic(make_checkpoint(net), path)
    return path


def test_an_unfrozen_real_net_is_exported_unpruned_or_not_at_all(real_ckpt, tmp_path, capsys):
    code, _, err = _run(["export", real_ckpt, "-o", tmp_path / "net.ts"], capsys)
    assert _one_line_error(code, err) and "--no-prune" in err and not (tmp_path / "net.ts").exists()
    code, out, _ = _run(["export", real_ckpt, "-o", tmp_path / "net.ts", "--no-prune"], capsys)
    assert code == 0 and (tmp_path / "net.ts").exists()
    code, out, _ = _run(["info", real_ckpt, "--json"], capsys)
    assert code == 0 and json.loads(out)["params_test"] == "n/a (not frozen)"
    code, _, err = _run(["prune", real_ckpt, "-o", tmp_path / "p.pt"], capsys)
    assert _one_line_error(code, err) and "would change the outputs" in err


def test_a_pruned_checkpoint_keeps_the_results_and_the_size_it_was_pruned_from(ckpt, tmp_path, capsys):
    code, _, _ = _run(["prune", ckpt, "-o", tmp_path / "small.pt"], capsys)
    assert code == 0
    _, out, _ = _run(["info", ckpt, "--json"], capsys)
    _, small, _ = _run(["info", tmp_path / "small.pt", "--json"], capsys)
    before, after = json.loads(out), json.loads(small)
    assert (after["best_top1"], after["epochs_done"]) == (12.5, 3)
    assert (after["params_train"], after["params_test"]) == (before["params_train"], before["params_test"])
    code, _, _ = _run(["prune", tmp_path / "small.pt", "-o", tmp_path / "again.pt"], capsys)
    _, again, _ = _run(["info", tmp_path / "again.pt", "--json"], capsys)
    assert code == 0 and json.loads(again)["params_train"] == before["params_train"]


def test_writing_a_checkpoint_onto_a_folder_is_one_line_and_leaves_nothing(ckpt, tmp_path, capsys):
    folder = tmp_path / "out"
    folder.mkdir()
    code, _, err = _run(["prune", ckpt, "-o", folder], capsys)
    assert _one_line_error(code, err) and f"{folder} is a folder" in err
    assert list(tmp_path.iterdir()) == [folder] and not list(folder.iterdir())
    code, _, err = _run(["export", ckpt, "-o", folder], capsys)
    assert _one_line_error(code, err) and f"{folder} is a folder" in err


@pytest.mark.parametrize(("content", "message"), [
    (lambda p: p.write_text('{"epoch": 1}\n'), "is a JSON file, not a checkpoint"),
    (lambda p: torch.save(torch.nn.Linear(2, 2), p), "holds pickled Python objects"),
    (lambda p: p.write_bytes(b"\x00garbage" * 10), "not a zip archive"),
])
def test_files_that_are_not_checkpoints_say_what_they_are(tmp_path, capsys, content, message):
    path = tmp_path / "x.pt"
    content(path)
    code, _, err = _run(["info", path], capsys)
    assert _one_line_error(code, err) and message in err and "\x1b" not in err and "weights_only" not in err


def test_damaged_checkpoints_name_what_is_wrong(tmp_path, capsys):
    good = make_checkpoint(connlearn.build(**tiny()))
    without_graph = {k: v for k, v in good.items() if k != "graph"}
    for damaged, message in ((without_graph, "its 'graph' is missing"),
                             ({**good, "model": None}, "its 'model' is a NoneType")):
        torch.save(damaged, tmp_path / "d.pt")
        code, _, err = _run(["info", tmp_path / "d.pt"], capsys)
        assert _one_line_error(code, err) and message in err
    headless = {**good, "model": {k: v for k, v in good["model"].items() if not k.startswith("head.")}}
    torch.save(headless, tmp_path / "h.pt")
    code, _, err = _run(["info", tmp_path / "h.pt"], capsys)
    assert _one_line_error(code, err) and "Missing key(s)" in err and "head.fc.weight" in err


def test_a_checkpoint_loads_onto_another_engine(ckpt):
    from connlearn.checkpoint import net_from_checkpoint

    fused = net_from_checkpoint(ckpt)
    reference = net_from_checkpoint(ckpt, engine="reference")
    assert (fused.engine, reference.engine) == ("fused", "reference")
    assert net_from_checkpoint(ckpt, engine="auto").engine == "fused"
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(reference.eval()(x), fused.eval()(x), atol=1e-5, rtol=1e-5)
    with pytest.raises(connlearn.ConnlearnError, match="did you mean 'fused'"):
        net_from_checkpoint(ckpt, engine="fuse")


def test_info_names_a_preset_only_as_the_origin_of_a_changed_architecture(tmp_path, capsys):
    for preset, overrides, expected in (
        ("cifar-20-4-8", {}, "resnext cifar-20-4-8 {D=20, w=4, C=8}"),
        ("cifar-29-8-8", {"M": 3, "C": 4, "width": 2}, "resnext {D=11, w=2, C=4} (changed from cifar-29-8-8)"),
    ):
        net = connlearn.build(preset=preset, num_classes=10, **overrides)
        save_atomic(make_checkpoint(net), tmp_path / "net.pt")
        code, out, _ = _run(["info", tmp_path / "net.pt", "--json"], capsys)
        assert code == 0 and json.loads(out)["architecture"] == expected


def test_plot_into_a_file_or_from_a_missing_source_is_named_and_makes_no_folder(ckpt, tmp_path, capsys):
    (tmp_path / "file").write_text("")
    code, _, err = _run(["plot", ckpt, "-o", tmp_path / "file"], capsys)
    assert code == 1 and "is a file; the figures go into a folder" in err
    code, _, err = _run(["plot", tmp_path / "missing.pt", "-o", tmp_path / "figs"], capsys)
    assert code == 1 and not (tmp_path / "figs").exists()


def test_the_commands_own_warnings_are_one_line_and_others_are_left_as_python_shows_them(capsys):
    import warnings

    import connlearn.train
    from connlearn import cli

    def warn(args):
        warnings.warn_explicit("resuming from previous.pt instead", UserWarning, connlearn.train.__file__, 1)
        warnings.warn_explicit("from elsewhere", UserWarning, "/elsewhere/module.py", 7)
        return 0

    with pytest.warns(UserWarning, match="from elsewhere"):  # Python's own path, which pytest records
        assert cli._guarded(warn, None) == 0
    err = capsys.readouterr().err
    assert "connlearn: warning: resuming from previous.pt instead\n" in err and "from elsewhere" not in err


def test_under_torchrun_each_error_is_one_whole_line_that_names_its_rank(capsys, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    code, _, err = _run(["info", "missing.pt"], capsys)
    assert code == 1 and err.startswith("connlearn (rank 1): error: ") and err.count("\n") == 1
    monkeypatch.setenv("RANK", "0")
    assert _run(["info", "missing.pt"], capsys)[2].startswith("connlearn: error: ")
