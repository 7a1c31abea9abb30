"""Bad input met in a user's own loop and on the command line: named by a ConnlearnError, never a crash in
torch or a file that cannot be read again."""

import collections
import json
import os
import pathlib
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
from conftest import RandomLoader, tiny

import connlearn
from connlearn.checkpoint import load_checkpoint, make_checkpoint, save_atomic
from connlearn.cli import main
from connlearn.data import load_dataset, make_loaders, synthetic
from connlearn.errors import (
    CheckpointError,
    ConfigError,
    ConfigTypeError,
    DataError,
    GraphError,
    StateDictError,
    UnknownNameError,
    check_bool,
)
from connlearn.experiment import CifarRun
from connlearn.recipe import Phase, Recipe
from connlearn.train import Trainer, evaluate

RECIPE = Recipe(name="r", phases=(Phase(epochs=1, lr=0.1, gate_lr=0.1), Phase(epochs=1, lr=0.01, frozen=True)),
                batch_size=8)


def _trainer(tmp_path, net=None, train=None, test=None, **kw):
    net = connlearn.build(**tiny()) if net is None else net
    train = RandomLoader(n=16, batch=8) if train is None else train
    kw = {"progress": False, "verbose": False, **kw}
    return Trainer(net, train, test, RECIPE, out_dir=tmp_path / "run", **kw)


# ------------------------------------------------------------------------------------- checkpoints
def test_numpy_numbers_in_meta_are_kept_as_python_numbers_and_the_run_resumes(tmp_path):
    meta = {"lr": np.float64(0.1), "n": np.int64(3), "flag": np.bool_(True), "pair": (np.float32(0.5), 1)}
    _trainer(tmp_path, meta=meta).fit(max_epochs=1)
    saved = load_checkpoint(tmp_path / "run" / "last.pt")["meta"]
    assert saved == {"lr": 0.1, "n": 3, "flag": True, "pair": (0.5, 1)}
    assert [type(v) for v in (saved["lr"], saved["n"], saved["flag"])] == [float, int, bool]
    resumed = _trainer(tmp_path, meta=meta)
    resumed.meta["added"] = np.float32(0.25)  # after the trainer was made
    resumed.fit()
    assert resumed.epoch == 2 and load_checkpoint(tmp_path / "run" / "last.pt")["meta"]["added"] == 0.25


@pytest.mark.parametrize(("meta", "named"), [({"out": pathlib.Path("x")}, r"meta\['out'\] must be JSON-able.*"
                                              "give the path as a string"),
                                             ({1: "a"}, "meta's keys must be strings"),
                                             ({"f": [object()]}, r"meta\['f'\]\[0\] must be JSON-able")])
def test_meta_that_a_checkpoint_could_not_load_is_refused_by_name(tmp_path, meta, named):
    with pytest.raises(ConfigTypeError, match=named):
        _trainer(tmp_path, meta=meta)


def test_make_checkpoint_refuses_entries_that_would_not_load_back():
    net = connlearn.build(**tiny())
    with pytest.raises(ConfigTypeError, match=r"meta\['lr'\] is (np.float64\()?0.1\)? \(float64\), which a checkpoint "
                                              "cannot load back"):
        make_checkpoint(net, meta={"lr": np.float64(0.1)})
    with pytest.raises(ConfigTypeError, match=r"where is PosixPath"):
        make_checkpoint(net, where=pathlib.Path("x"))
    ckpt = make_checkpoint(net, info={"dtype": torch.bfloat16, "device": torch.device("cpu"), "size": torch.Size([2])})
    assert ckpt["info"]["size"] == torch.Size([2])


def test_numpy_numbers_in_a_recipe_become_python_numbers_and_its_checkpoints_load(tmp_path):
    recipe = Recipe("r", [Phase(np.int64(1), np.float64(0.1), gate_lr=np.float32(0.25)),
                          Phase(1, np.logspace(-2, -1, 2)[0], frozen=True)], batch_size=np.int64(8),
                    momentum=np.float64(0.9), weight_decay=np.float32(1e-4), gate_momentum=np.float64(0))
    assert [type(v) for v in (recipe.phases[0].epochs, recipe.phases[0].lr, recipe.batch_size)] == [int, float, int]
    Trainer(connlearn.build(**tiny()), RandomLoader(n=16, batch=8), None, recipe, out_dir=tmp_path,
            progress=False, verbose=False).fit()
    assert load_checkpoint(tmp_path / "last.pt")["epoch"] == 2


def test_dict_classes_that_a_checkpoint_cannot_load_are_made_dicts_or_refused(tmp_path):
    facts = collections.defaultdict(int, {"a": {"b": np.int64(1)}})
    trainer = _trainer(tmp_path, meta=facts)
    assert type(trainer.meta) is dict and trainer.meta == {"a": {"b": 1}}
    with pytest.raises(ConfigTypeError, match=r"make_checkpoint: meta is defaultdict"):
        make_checkpoint(connlearn.build(**tiny()), meta=collections.defaultdict(int))
    make_checkpoint(connlearn.build(**tiny()), meta=collections.OrderedDict(a=1))


def test_a_state_dict_of_another_network_is_a_checkpoint_error():
    net = connlearn.build(**tiny())
    with pytest.raises(StateDictError, match=r"does not fit this network: size mismatch for .* \(and \d+ more\); "
                                             "build the network it came from"):
        net.load_state_dict(connlearn.build(**tiny(C=5)).state_dict())
    with pytest.raises(RuntimeError):  # as torch's error was
        net.load_state_dict(connlearn.build(**tiny(C=5)).state_dict())
    with pytest.raises(StateDictError, match=r"keys start with '_orig_mod\.': it is the state of a wrapped network"):
        net.load_state_dict({f"_orig_mod.{k}": v for k, v in net.state_dict().items()})
    with pytest.raises(CheckpointError, match="does not fit this network: Missing key"):
        net.load_state_dict({k: v for k, v in net.state_dict().items() if not k.startswith("head")})
    with pytest.raises(CheckpointError, match="_extra_state is 5, not a ConnectivityNet's"):
        net.load_state_dict({**net.state_dict(), "_extra_state": 5})
    loose = net.load_state_dict({k: v for k, v in net.state_dict().items() if not k.startswith("head")}, strict=False)
    assert loose.missing_keys == ["head.fc.weight", "head.fc.bias"]


def test_a_state_dict_value_that_is_no_tensor_is_named_by_its_key():
    net = connlearn.build(**tiny())
    with pytest.raises(StateDictError, match=r"does not fit this network: 'stages\.0\.block\.conv1\.weight' holds a "
                                             r"value of type str, not a tensor; every value but the _extra_state"):
        net.load_state_dict({**net.state_dict(), "stages.0.block.conv1.weight": "x"})


@pytest.mark.parametrize("bad", [[1, 2], None, "last.pt"])
def test_a_state_dict_that_is_no_mapping_is_a_type_error_of_connlearn(bad):
    with pytest.raises(ConfigTypeError, match=rf"load_state_dict: the state dict must be a mapping .* got "
                                              rf"{type(bad).__name__}$"):
        connlearn.build(**tiny()).load_state_dict(bad)


def test_the_gist_of_a_state_dict_error_is_its_first_line_of_detail():
    from connlearn.errors import state_dict_mismatch

    heading = "Error(s) in loading state_dict for Linear:"
    assert state_dict_mismatch(RuntimeError(f"{heading}\n\tWhile copying \"weight\", a fault.\n\tAnother.")) == \
        'While copying "weight", a fault'
    assert state_dict_mismatch(RuntimeError(heading)) == heading
    assert state_dict_mismatch(RuntimeError("")) == "RuntimeError"


def test_a_checkpoint_with_a_damaged_graph_is_named(tmp_path):
    ckpt = make_checkpoint(connlearn.build(**tiny()))
    path = tmp_path / "bad.pt"
    save_atomic({**ckpt, "graph": "{not json"}, path)
    with pytest.raises(CheckpointError, match=r"bad\.pt: its graph cannot be read: not a BranchGraph"):
        load_checkpoint(path)


def test_a_file_under_a_file_is_named(tmp_path):
    (tmp_path / "good.pt").write_bytes(b"x")
    with pytest.raises(ConfigError, match=r"cannot write .*good.pt/x.pt: .*good.pt is a file, not a folder"):
        save_atomic({}, tmp_path / "good.pt" / "x.pt")


# ------------------------------------------------------------------------------------- the trainer
def test_a_dataset_with_more_classes_than_the_network_has_outputs_is_refused(tmp_path):
    train, test = synthetic(num_classes=20, n_train=40, n_test=20)
    loaders = make_loaders(train, test, 10, device="cpu")
    net = connlearn.build(**tiny(num_classes=10))
    with pytest.raises(ConfigError, match="train_loader's dataset has 20 classes, but the network has 10 outputs; "
                                          "build it with num_classes=20"):
        _trainer(tmp_path, net, *loaders)
    with pytest.raises(ConfigError, match="the evaluation loader's dataset has 20 classes"):
        evaluate(net, loaders[1])
    evaluate(connlearn.build(**tiny(num_classes=20)), loaders[1])


@pytest.mark.parametrize("flag", ["channels_last", "cudnn_benchmark", "tensorboard", "progress", "verbose"])
def test_the_trainer_s_switches_take_bools_only(tmp_path, flag):
    with pytest.raises(ConfigTypeError, match=f"{flag} must be True or False, got 'no'"):
        _trainer(tmp_path, **{flag: "no"})


@pytest.mark.parametrize(("kwargs", "error", "named"), [
    ({"max_epochs": "1"}, ConfigTypeError, "max_epochs must be an integer"),
    ({"max_epochs": -1}, ConfigError, "max_epochs must be >= 0"),
    ({"time_limit": "10"}, ConfigTypeError, r"time_limit \(seconds\) must be a number"),
    ({"time_limit": float("nan")}, ConfigError, r"time_limit \(seconds\) must be a number, got NaN"),
    ({"resume": 5}, ConfigTypeError, r"resume \(True, False, 'auto' or a checkpoint's path\) must be a path"),
    ({"resume": "auot"}, ConfigError, "resume 'auot' is neither 'auto' nor an existing checkpoint; did you mean"),
])
def test_fit_names_bad_arguments(tmp_path, kwargs, error, named):
    with pytest.raises(error, match=named):
        _trainer(tmp_path).fit(**kwargs)


def test_an_out_dir_that_cannot_be_made_is_named(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="cannot make out_dir"):
        Trainer(connlearn.build(**tiny()), RandomLoader(), None, RECIPE, out_dir=tmp_path / "file" / "run")


def test_evaluate_takes_the_trainer_s_amp_names_and_names_what_it_cannot_take():
    net, loader = connlearn.build(**tiny()), RandomLoader(n=16, batch=8)
    assert evaluate(net, loader, amp="bf16")["test_top1"] == evaluate(net, loader, amp=torch.bfloat16)["test_top1"]
    assert evaluate(net, loader, amp="none") == evaluate(net, loader) == evaluate(net, loader, amp=torch.float32)
    with pytest.raises(UnknownNameError, match="unknown amp mode 'bf61'"):
        evaluate(net, loader, amp="bf61")
    with pytest.raises(ConfigError, match=r"amp must be torch.bfloat16, torch.float16, torch.float32 or None"):
        evaluate(net, loader, amp=torch.float64)
    with pytest.raises(ConfigTypeError, match=r"evaluate takes a torch.nn.Module"):
        evaluate(None, loader)
    with pytest.raises(ConfigTypeError, match="evaluate takes a loader"):
        evaluate(net, None)


def test_images_on_another_device_than_the_network_are_named():
    net = connlearn.build(**tiny())
    with pytest.raises(ConfigError, match=r"the images are on meta and the network on cpu: move the images"):
        net(torch.empty(2, 3, 32, 32, device="meta"))


def test_a_stem_whose_weights_a_hook_brings_runs(images):
    # offloading (e.g. accelerate's) keeps the weights elsewhere and brings them in a pre-forward hook
    net = connlearn.build(**tiny()).eval()
    expected = net(images)
    weight = net.stem.conv.weight.detach().clone()
    net.stem.conv.weight = torch.nn.Parameter(torch.empty_like(weight, device="meta"))

    def bring(module, args):
        module.conv.weight = torch.nn.Parameter(weight)

    net.stem.register_forward_pre_hook(bring)
    torch.testing.assert_close(net(images), expected)


def test_the_class_check_reads_the_folder_loader_s_files(tmp_path):
    class FolderLike(RandomLoader):
        files = type("Files", (), {"num_classes": 1000})()

    with pytest.raises(ConfigError, match="train_loader's dataset has 1000 classes, but the network has 10 outputs"):
        _trainer(tmp_path, train=FolderLike())


def test_freezing_a_frozen_network_to_another_connectivity_is_refused():
    net = connlearn.build(**tiny()).freeze()
    net.freeze(net.connectivity())  # the one it has: nothing to do
    other = {m: mask.roll(1, dims=1) for m, mask in net.connectivity().items()}
    with pytest.raises(ConfigError, match=r"connectivity is fixed already .* the given one is another"):
        net.freeze(other)
    full = connlearn.build(**tiny(gate="full", K=None))
    assert full.freeze(full.connectivity()) is full


# ------------------------------------------------------------------------------------- recipes and switches
def test_recipe_momentum_and_nesterov_are_checked():
    with pytest.raises(ConfigError, match=r"momentum must be <= 1.0, got 2.0"):
        Recipe("r", [Phase(1, 0.1)], momentum=2)
    with pytest.raises(ConfigError, match="nesterov=True needs a momentum above 0"):
        Recipe("r", [Phase(1, 0.1)], nesterov=True, momentum=0)


@pytest.mark.parametrize(("d", "error", "named"), [
    (5, ConfigTypeError, "a recipe dict must be a dict"),
    ({}, ConfigError, "a recipe dict lacks 'name', 'phases'"),
    ({"nmae": "r", "phases": []}, UnknownNameError, "unknown recipe entry 'nmae'.*did you mean 'name'"),
    ({"name": "r", "phases": 3}, ConfigTypeError, "'phases' must be a list of phase dicts"),
    ({"name": "r", "phases": [{"epochs": 1}]}, ConfigError, "phase 1 of the recipe dict lacks 'lr'"),
    ({"name": "r", "phases": [{"epochs": 1, "lr": 0.1, "gatelr": 0.1}]}, UnknownNameError,
     "unknown phase entry 'gatelr'.*did you mean 'gate_lr'"),
])
def test_recipe_from_dict_names_what_is_wrong(d, error, named):
    with pytest.raises(error, match=named):
        Recipe.from_dict(d)


def test_recipe_from_dict_reads_what_to_dict_writes():
    recipe = connlearn.recipe.get_recipe("cifar")
    assert Recipe.from_dict(recipe.to_dict()) == recipe


@pytest.mark.parametrize("field", ["tensorboard", "progress", "synthetic_fallback"])
def test_run_switches_take_bools_only(field):
    with pytest.raises(ConfigTypeError, match=f"{field} must be True or False, got 'false'"):
        CifarRun(**{field: "false"})


@pytest.mark.parametrize("option", ["shuffle", "drop_last", "channels_last"])
def test_loader_switches_take_bools_only(option):
    train, test = synthetic(num_classes=2, n_train=8, n_test=4)
    with pytest.raises(ConfigTypeError, match=f"{option} must be True or False, got 'no'"):
        make_loaders(train, test, 4, device="cpu", **{option: "no"})
    with pytest.raises(UnknownNameError, match=r"unknown make_loaders option 'shufle'.*did you mean 'shuffle'"):
        make_loaders(train, test, 4, device="cpu", shufle=True)


def test_registering_takes_a_bool_overwrite(clean_registries):
    block = connlearn.blocks.BLOCKS.get("bottleneck")
    with pytest.raises(ConfigTypeError, match="overwrite must be True or False, got 'yes'"):
        connlearn.register_block("bottleneck", block, overwrite="yes")


def test_numpy_bools_are_bools():
    assert check_bool("x", np.bool_(True)) is True and check_bool("x", np.array(0) > 1) is False


# ------------------------------------------------------------------------------------- files and data
def test_a_graph_json_with_a_byte_order_mark_or_blank_lines_is_read(tmp_path):
    from connlearn.experiment import _net_of_connectivity

    graph = connlearn.build(**tiny(gate="random")).graph().to_json()
    for text, encoding in ((graph, "utf-8-sig"), ("\n\n" + graph, "utf-8")):
        (tmp_path / "g.json").write_text(text, encoding=encoding)
        run = CifarRun(dataset="cifar10", connectivity=str(tmp_path / "g.json"), out=str(tmp_path / "run"))
        assert _net_of_connectivity(run, 10).K == 2
    (tmp_path / "g.json").write_bytes(b"{\xff")
    with pytest.raises(ConfigError, match=r"connectivity: .*g.json is not a UTF-8 text file"):
        _net_of_connectivity(run, 10)
    (tmp_path / "g.json").write_text("{}")
    with pytest.raises(GraphError, match=r"connectivity: .*g.json: not a BranchGraph JSON document"):
        _net_of_connectivity(run, 10)


def test_no_data_in_the_folder_given_names_what_was_looked_for(tmp_path):
    with pytest.raises(DataError, match=f"data path {tmp_path} holds no cifar100_jpeg.npz, cifar100.npz or torchvision "
                                        "cifar-100-python folder.*connlearn pack cifar100 -o cifar100.npz"):
        load_dataset("cifar100", tmp_path, download=False, cache_dir=tmp_path / "cache")


def test_a_log_with_values_that_are_not_numbers_is_named(tmp_path, capsys):
    log = tmp_path / "log.jsonl"
    log.write_text(json.dumps({"epoch": "x", "test_top1": "y"}) + "\n")
    assert main(["plot", str(log), "-o", str(tmp_path / "figs")]) == 1
    assert "record 0 has 'epoch' = 'x', not a number" in capsys.readouterr().err


def test_a_figure_path_that_is_a_folder_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="is a folder; give the file to write"):
        connlearn.plots.plot_active_branches(connlearn.build(**tiny()).graph(), tmp_path)


def test_pruning_a_checkpoint_onto_itself_is_refused(tmp_path, capsys):
    path = tmp_path / "last.pt"
    save_atomic(make_checkpoint(connlearn.build(**tiny(gate="random"))), path)
    before = path.read_bytes()
    assert main(["prune", str(path), "-o", str(path)]) == 1
    assert "is the checkpoint being pruned" in capsys.readouterr().err and path.read_bytes() == before


def test_summary_json_is_written_before_the_drawings(tmp_path, monkeypatch):
    from connlearn import experiment

    def no_drawing(*args, **kwargs):
        raise RuntimeError("the drawing failed")

    def no_data(name, data=None, **kw):
        raise DataError(f"no {name} data found")

    monkeypatch.setattr(experiment, "_draw", no_drawing)
    monkeypatch.delenv(connlearn.data.DATA_ENV, raising=False)
    monkeypatch.setattr(experiment, "load_dataset", no_data)  # a small generated stand-in instead
    run = CifarRun(dataset="cifar10", M=3, C=2, K=1, width=1, base_channels=4, stem_channels=4, epochs=2,
                   batch_size=32, out=str(tmp_path), progress=False, snapshot_every=0, train_subset=200,
                   test_subset=100)
    with pytest.raises(RuntimeError, match="the drawing failed"):
        experiment.run_cifar(run)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["files"] == [] and summary["test_top1"] is not None


def test_info_says_when_a_run_trained_on_generated_data(tmp_path, capsys):
    path = tmp_path / "pruned.pt"
    save_atomic(make_checkpoint(connlearn.build(**tiny(gate="random")), meta={"run": {"val_split": None},
                                                                                  "source": "generated"}), path)
    assert main(["info", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["evaluated_on"] == "test (of a generated dataset)"


def test_a_dot_that_fails_leaves_the_dot_file_and_a_warning(tmp_path, monkeypatch):
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "dot").write_text('#!/bin/sh\necho \'Format: "svg" not recognized\' >&2\nexit 1\n')
    (fake / "dot").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        files = connlearn.render.save(connlearn.build(**tiny()).graph(), tmp_path / "c.svg")
    assert files == [tmp_path / "c.dot"] and not (tmp_path / "c.svg").exists()
    assert any("'dot' failed: Format: \"svg\" not recognized" in str(w.message) for w in caught)
    with pytest.raises(UnknownNameError, match=r"unknown to_dot option 'wieghted'.*did you mean 'weighted'"):
        connlearn.render.save(connlearn.build(**tiny()).graph(), tmp_path / "c.dot", wieghted=True)


def test_a_toml_config_without_tomllib_says_so(tmp_path, monkeypatch, capsys):
    config = tmp_path / "run.toml"
    config.write_text("epochs = 1\n")
    monkeypatch.setitem(sys.modules, "tomllib", None)  # as on Python 3.10
    assert main(["train", "--config", str(config)]) == 1
    err = capsys.readouterr().err
    assert "TOML configs need Python 3.11 or later" in err and "not valid TOML" not in err


def test_importing_connlearn_does_not_import_dynamo():
    # torch._dynamo takes seconds to import; connlearn --help should not pay for it
    done = subprocess.run([sys.executable, "-c", "import sys, connlearn.cli; print('torch._dynamo' in sys.modules)"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stderr


def test_a_path_from_the_home_folder_is_read_where_it_was_written(tmp_path, monkeypatch, capsys):
    """``~`` means the home folder in every path connlearn takes, to write and to read alike."""
    from conftest import RandomLoader

    from connlearn.cli import main
    from connlearn.recipe import get_recipe
    from connlearn.train import Trainer, read_jsonl

    monkeypatch.setenv("HOME", str(tmp_path))
    net = connlearn.build(**tiny())
    save_atomic(make_checkpoint(net), "~/m.pt")
    assert (tmp_path / "m.pt").is_file() and load_checkpoint("~/m.pt")["version"] == 1
    t = Trainer(net, RandomLoader(), None, get_recipe("cifar").scaled(4), out_dir="~/run", progress=False)
    t.fit(max_epochs=1)
    assert (tmp_path / "run" / "last.pt").is_file() and len(read_jsonl("~/run/log.jsonl")) == 1
    t.fit(resume="~/run/last.pt", max_epochs=1)
    assert main(["render", "~/run/last.pt", "-o", "~/c.dot"]) == 0 and (tmp_path / "c.dot").is_file()
    assert main(["plot", "~/run/last.pt", "-o", "~/plots"]) == 0 and (tmp_path / "plots" / "curves.png").is_file()
    capsys.readouterr()
