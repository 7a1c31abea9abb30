"""Bad input is a ConnlearnError that names the value, what is allowed and the closest valid name."""

import contextlib
import warnings

import attrs
import numpy as np
import pytest
import torch
from conftest import RandomLoader, tiny
from hypothesis import given, settings
from hypothesis import strategies as st

import connlearn
from connlearn.errors import (
    CheckpointError,
    ConfigError,
    ConfigTypeError,
    ConnlearnError,
    DataError,
    GraphError,
    ShapeError,
    UnknownNameError,
    check_device,
)
from connlearn.experiment import CifarRun
from connlearn.recipe import Phase, Recipe
from connlearn.train import Trainer


def test_c_below_one():
    with pytest.raises(ConfigError, match="C must be >= 1, got 0"):
        connlearn.build(C=0)


def test_k_below_one():
    with pytest.raises(ConfigError, match="K must be >= 1, got 0"):
        connlearn.build(K=0)


def test_k_above_c():
    with pytest.raises(ConfigError, match=r"K \(each block's number of inputs\) must be <= C=8 .*got 9"):
        connlearn.build(C=8, K=9)


def test_depth_not_of_the_form_2_plus_3m():
    with pytest.raises(ConfigError, match="2 \\+ 3M"):
        connlearn.build(depth=21)


def test_m_not_fitting_the_stages():
    with pytest.raises(ConfigError, match="multiple of 3"):
        connlearn.build(M=4)


def test_unknown_topology_lists_known_names_and_closest():
    with pytest.raises(UnknownNameError, match=r"known topologies: dense, resnext; did you mean 'resnext'"):
        connlearn.build("resnxt")


def test_unknown_block():
    with pytest.raises(UnknownNameError, match="did you mean 'bottleneck'"):
        connlearn.build(block="botleneck")


def test_unknown_gate_kind():
    with pytest.raises(UnknownNameError, match="did you mean 'topk'"):
        connlearn.build(gate="top-k")


def test_unknown_preset():
    with pytest.raises(UnknownNameError, match=r"did you mean .cifar-29-8-8."):
        connlearn.build(preset="cifar-29-8")


def test_unknown_option_suggests_the_closest():
    with pytest.raises(ConfigError, match="did you mean 'width'"):
        connlearn.build(widht=4)


def test_unknown_engine():
    with pytest.raises(UnknownNameError, match="did you mean 'fused'"):
        connlearn.build(engine="fuse")


def test_non_integer_size():
    with pytest.raises(ConfigTypeError, match=r"C must be an integer, got 2\.5"):
        connlearn.build(C=2.5)


def test_negative_size():
    with pytest.raises(ConfigError, match="width must be >= 1, got -4"):
        connlearn.build(width=-4)


def test_full_with_a_fan_in_other_than_c():
    with pytest.raises(ConfigError, match="K must equal C"):
        connlearn.build(gate="full", C=8, K=4)


def test_forward_input_with_the_wrong_channel_count():
    net = connlearn.build(**tiny())
    with pytest.raises(ShapeError, match=r"expected images of shape \[B, 3, H, W\], got \[2, 1, 32, 32\]"):
        net(torch.randn(2, 1, 32, 32))


def test_forward_input_with_the_wrong_rank():
    net = connlearn.build(**tiny())
    with pytest.raises(ShapeError, match="got \\[3, 32, 32\\]"):
        net(torch.randn(3, 32, 32))


def test_errors_are_builtin_exception_subclasses_too():
    assert issubclass(ConfigError, ValueError) and issubclass(ConfigTypeError, TypeError)
    assert issubclass(UnknownNameError, ConnlearnError)


@pytest.mark.parametrize("option", ["stem_channels", "base_channels"])
def test_zero_channels_are_refused_not_replaced_by_the_default(option):
    with pytest.raises(connlearn.ConfigError, match=f"{option} must be >= 1, got 0"):
        connlearn.build(**tiny(**{option: 0}))


def test_integer_images_are_refused_by_name():
    with pytest.raises(connlearn.ConnlearnError, match=r"expected floating-point images .*torch.uint8"):
        connlearn.build(**tiny())(torch.zeros(2, 3, 32, 32, dtype=torch.uint8))


@pytest.mark.parametrize("interval", ["snapshot_every", "checkpoint_every"])
def test_a_negative_snapshot_or_checkpoint_interval_is_refused(tmp_path, interval):
    recipe = Recipe("r", [Phase(1, 0.1, gate_lr=0.2)], batch_size=4)
    with pytest.raises(ConfigError, match=f"{interval} must be >= 0, got -1"):
        Trainer(connlearn.build(**tiny()), RandomLoader(), None, recipe, out_dir=tmp_path, progress=False,
                **{interval: -1})


def test_a_negative_checkpoint_interval_of_a_run_is_refused_before_any_data_is_read():
    from connlearn.experiment import CifarRun

    with pytest.raises(ConfigError, match="checkpoint_every must be >= 0, got -1"):
        CifarRun(dataset="cifar10", checkpoint_every=-1)


_ANY = st.one_of(st.none(), st.booleans(), st.integers(-3, 40), st.floats(allow_nan=True, allow_infinity=True),
                 st.text(max_size=6), st.lists(st.integers(0, 5), max_size=3),
                 st.sampled_from(["topk", "full", "random", "real", "basic", "auto", "one", "cifar-20-4-8"]))
_OPTIONS = ["C", "M", "depth", "width", "num_classes", "preset", "layout", "block", "gate", "K", "seed",
            "gate_init", "residual_init", "conv_init", "stem_channels", "base_channels"]


@settings(max_examples=200, deadline=None)
@given(options=st.dictionaries(st.sampled_from(_OPTIONS), _ANY, max_size=3),
       topology=st.sampled_from(["resnext", "dense"]), engine=st.sampled_from(["fused", "reference"]))
def test_any_options_build_a_working_net_or_raise_a_connlearn_error(options, topology, engine):
    """Law: build() with values of any type either gives a network that runs, or names the bad value."""
    try:
        net = connlearn.build(topology, engine=engine, **{**tiny(M=3, C=2, K=1, width=1), **options})
    except ConnlearnError:
        return
    if sum(p.numel() for p in net.parameters()) > 2_000_000:
        return  # a large valid net: not worth running here
    net.eval()(torch.randn(2, 3, 32, 32))
    net.train()(torch.randn(2, 3, 32, 32)).sum().backward()


@pytest.mark.parametrize("field", [f.name for f in attrs.fields(CifarRun)])
@pytest.mark.parametrize("value", [None, True, -1, 1.5, float("nan"), "", "x", [1, 2], {"a": 1}])
def test_a_run_config_of_any_value_is_made_or_refused_by_name(field, value):
    with contextlib.suppress(ConnlearnError):
        CifarRun(**{field: value})


def test_paths_may_be_path_objects_and_are_recorded_as_strings(tmp_path):
    run = CifarRun(out=tmp_path / "run", data=tmp_path / "x.npz", connectivity=tmp_path / "g.json")
    assert run.to_dict()["out"] == str(tmp_path / "run") and isinstance(run.data, str)
    with pytest.raises(ConfigTypeError, match="out must be a path, got None"):
        CifarRun(out=None)
    with pytest.raises(ConfigTypeError, match="device must be a device name such as 'cuda:1' or None, got 0"):
        CifarRun(device=0)


@pytest.mark.parametrize(("value", "error", "message"), [
    ("gpu", ConfigError, "device 'gpu' is not a device: .*use e.g. 'cpu', 'cuda' or 'cuda:1'; did you mean 'cuda'"),
    ("cdua:1", ConfigError, "did you mean 'cuda:1'"),
    (-1, ConfigError, "device -1 is not a device"),
    (True, ConfigTypeError, "device must be a device name .*got True"),
    ([0], ConfigTypeError, r"got \[0\] \(list\)"),
])
def test_a_bad_device_is_named(value, error, message):
    with pytest.raises(error, match=message):
        check_device(value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="about a machine without a CUDA GPU")
def test_a_cuda_device_on_a_machine_without_one_is_named():
    assert check_device(None) == torch.device("cpu") and check_device("cpu") == torch.device("cpu")
    for value in ("cuda", "cuda:1", 0):
        with pytest.raises(ConfigError, match=r"asks for a CUDA GPU, but PyTorch sees none here"):
            check_device(value)


def _public_functions():
    from connlearn import checkpoint, export, plots, prune, recipe, render, updater

    return [prune.live_blocks, prune.dead_blocks, prune.active_branches, prune.input_overlap,
            prune.random_overlap, prune.freezing_changes_outputs, prune.prune_dead_blocks, render.to_dot,
            render.side_by_side, render.save, plots.plot_active_branches, plots.plot_gate_heatmaps, plots.plot_run,
            plots.plot_gate_evolution, plots.plot_training_curves, checkpoint.load_checkpoint,
            checkpoint.net_from_checkpoint, checkpoint.make_checkpoint, checkpoint.architecture,
            checkpoint.save_atomic, export.example_input, export.export, updater.param_groups,
            updater.drop_gate_group, updater.GateUpdater, recipe.get_recipe, connlearn.from_graph]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A short run's folder: last.pt, log.jsonl and gates.jsonl."""
    out = tmp_path_factory.mktemp("run")
    recipe = Recipe(name="r", phases=(Phase(epochs=1, lr=0.1, gate_lr=0.1),), batch_size=8)
    Trainer(connlearn.build(**tiny()), RandomLoader(n=16, batch=8), RandomLoader(n=8, batch=8), recipe,
            out_dir=out, progress=False, verbose=False, snapshot_every=1).fit()
    return out


@pytest.mark.parametrize("fn", _public_functions(), ids=lambda fn: fn.__qualname__)
def test_every_argument_of_the_wrong_kind_is_named(fn, tmp_path, finished_run, monkeypatch):
    """Law: each argument of a public function, given None, a number, a string, a list, a dict, a network
    or a graph where it takes something else, raises a ConnlearnError (or works), never a bare TypeError or
    AttributeError from inside. The call with valid arguments works, so every argument is reached."""
    import inspect

    monkeypatch.chdir(tmp_path)  # a string given as a path ('x') lands here

    net = connlearn.build(**tiny(gate="random"))  # fixed: it prunes
    graph = net.graph()
    valid = {"graph": graph, "net": net, "obj": graph, "learned": graph, "path": tmp_path / "f.png",
             "out": tmp_path, "K": 2, "C": 4, "lr": 0.1, "weight_decay": 0.0, "gate_lr": 0.1,
             "ckpt": finished_run / "last.pt", "optimizer": torch.optim.SGD(net.parameters(), lr=0.1),
             "snapshots": finished_run / "gates.jsonl", "log": finished_run / "log.jsonl", "name": "cifar",
             "graphs": graph}
    valid.update({"load_checkpoint": {"path": finished_run / "last.pt"},
                  "save_atomic": {"obj": {"a": 1}, "path": tmp_path / "x.pt"},
                  "export": {"path": tmp_path / "m.ts"}, "save": {"path": tmp_path / "f.dot"}}.get(fn.__name__, {}))
    params = [p for p in inspect.signature(fn).parameters.values()
              if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    required = {p.name: valid[p.name] for p in params if p.default is inspect.Parameter.empty}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fn(**required)
    for param in params:
        for value in (None, 3, -1, 1.5, float("nan"), "", "x", [1], {"a": 1}, True, net, graph):
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("error")  # e.g. a figure squashed by a label it should have refused
                    fn(**{**required, param.name: value})
            except ConnlearnError:
                pass
            except Exception as exc:  # pragma: no cover - the message is the point
                raise AssertionError(f"{fn.__qualname__}({param.name}={value!r}) raised {exc!r}") from exc


@pytest.mark.parametrize("value", [None, [1, 2], "images"])
def test_forward_of_something_other_than_a_tensor(value):
    net = connlearn.build(**tiny())
    with pytest.raises(ConfigTypeError, match=r"expected a tensor of images \[B, 3, H, W\], got"):
        net(value)


def test_symbolic_tracing_is_named_as_unsupported_with_what_to_use_instead():
    net = connlearn.build(**tiny()).eval()
    with pytest.raises(ConfigError, match=r"torch\.fx symbolic tracing.*forward hooks.*torch\.export"):
        torch.fx.symbolic_trace(net)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_images_of_another_dtype_than_the_weights_are_named_unless_autocast_casts_them(dtype):
    net = connlearn.build(**tiny()).eval()
    x = torch.randn(2, 3, 32, 32)
    with pytest.raises(ConfigTypeError, match=rf"the images are {dtype} and the network's weights torch.float32: "
                                              r"cast the images \(x.to\(torch.float32\)\) or the network"):
        net(x.to(dtype))
    if dtype is torch.bfloat16:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert net(x.to(dtype)).shape == (2, 10)
    assert net.to(dtype)(x.to(dtype)).dtype == dtype


@pytest.mark.parametrize("autocast", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("weights", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_under_autocast_images_and_weights_it_cannot_reconcile_are_named_and_the_others_run(weights, autocast):
    # autocast never casts float64, and the batch norms take weights of float32 or of autocast's dtype only
    net = connlearn.build(**tiny()).to(weights)
    for images in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        x = torch.randn(2, 3, 32, 32, dtype=images)
        with torch.autocast("cpu", dtype=autocast):
            if images == weights == torch.float64:  # nothing to cast: it runs in float64
                assert net(x).dtype == torch.float64
            elif torch.float64 in (images, weights) or weights not in (torch.float32, autocast):
                with pytest.raises(ConfigTypeError, match=r"torch.float64, which torch.autocast does not cast|under "
                                                          r"autocast keep the network in float32 \(net.float\(\)\)"):
                    net(x)
            else:
                net(x).float().sum().backward()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_a_network_on_the_meta_device_runs_in_any_dtype(dtype):
    net = connlearn.build(**tiny()).to("meta").to(dtype).eval()
    assert net(torch.empty(2, 3, 32, 32, device="meta", dtype=dtype)).shape == (2, 10)


@pytest.mark.parametrize("engine", ["fused", "reference"])
@pytest.mark.parametrize("gate", ["topk", "real", "random", "full"])
def test_an_empty_batch_gives_empty_logits(engine, gate):
    net = connlearn.build(**tiny(gate=gate, K=4 if gate == "full" else 2), engine=engine)
    for mode in (net.eval, net.train):
        mode()
        assert net(torch.randn(0, 3, 32, 32)).shape == (0, 10)


_WRONG = (None, True, 0, -1, 1.5, float("nan"), float("inf"), "", "x", [1], {"a": 1})


def test_phases_and_recipes_of_any_field_value_are_made_or_refused_by_name():
    for field in attrs.fields(Phase):
        for value in _WRONG:
            with contextlib.suppress(ConnlearnError):
                Phase(**{"epochs": 1, "lr": 0.1, field.name: value})
    for field in attrs.fields(Recipe):
        for value in _WRONG:
            with contextlib.suppress(ConnlearnError):
                Recipe(**{"name": "r", "phases": [Phase(epochs=1, lr=0.1)], field.name: value})
    with pytest.raises(ConfigTypeError, match=r"phases must be a list of connlearn\.recipe\.Phase, got 'x'"):
        Recipe(name="r", phases="x")
    with pytest.raises(ConfigError, match="lr must be finite"):
        Phase(epochs=1, lr=float("inf"))


def test_trainer_arguments_of_the_wrong_kind_are_named(tmp_path, monkeypatch):
    import inspect

    monkeypatch.chdir(tmp_path)  # a string given as out_dir lands here
    (tmp_path / "x").write_text("a file where a run folder would go")

    recipe = Recipe(name="r", phases=(Phase(epochs=1, lr=0.1, gate_lr=0.1),), batch_size=8)
    args = {"net": connlearn.build(**tiny()), "train_loader": RandomLoader(n=16, batch=8),
            "test_loader": RandomLoader(n=8, batch=8), "recipe": recipe}
    keywords = [p.name for p in inspect.signature(Trainer).parameters.values() if p.kind == p.KEYWORD_ONLY]
    for name in [*args, *keywords]:
        for value in (*_WRONG, args["net"].graph()):
            kwargs = {**args, "out_dir": tmp_path / "run", "progress": False, "verbose": False, name: value}
            with contextlib.suppress(ConnlearnError):
                Trainer(**kwargs)
    with pytest.raises(ConfigTypeError, match=r"recipe must be a connlearn.recipe.Recipe \(e.g. get_recipe"):
        Trainer(**{**args, "recipe": "cifar"}, out_dir=tmp_path)
    with pytest.raises(ConfigTypeError, match="test_loader must be a loader: an object with len"):
        Trainer(**{**args, "test_loader": [1, 2]}, out_dir=tmp_path)
    with pytest.raises(UnknownNameError, match="unknown compile mode 'fast'"):
        Trainer(**args, out_dir=tmp_path, compile="fast")


@pytest.mark.parametrize("listing", ["list_blocks", "list_gates", "list_presets", "list_topologies"])
def test_a_listing_pattern_that_is_not_a_string_is_named(listing):
    assert getattr(connlearn, listing)("*")
    for value in (None, 1, ["*"]):
        with pytest.raises(ConfigTypeError, match="pattern must be a shell-style pattern string"):
            getattr(connlearn, listing)(value)


def test_recipe_flags_and_names_are_refused_unless_bools_and_strings():
    import numpy as np

    for field in ("frozen",):
        for value in ("yes", 1, None):
            with pytest.raises(ConfigTypeError, match=f"{field} must be True or False, got"):
                Phase(epochs=1, lr=0.1, **{field: value})
    assert Phase(epochs=1, lr=0.1, frozen=np.bool_(True)).frozen is True
    with pytest.raises(ConfigTypeError, match="nesterov must be True or False, got 'yes'"):
        Recipe(name="r", phases=[Phase(epochs=1, lr=0.1)], nesterov="yes")
    with pytest.raises(ConfigTypeError, match="a recipe's name must be a string, got 3"):
        Recipe(name=3, phases=[Phase(epochs=1, lr=0.1)])
    assert len(Recipe("r", (Phase(epochs=1, lr=0.1) for _ in range(2))).phases) == 2  # any ordered iterable
    with pytest.raises(ConfigTypeError, match="phases must be a list"):
        Recipe("r", {Phase(epochs=1, lr=0.1)})


def test_trainer_takes_compile_none_and_refuses_a_resume_check_that_is_not_a_function(tmp_path):
    recipe = Recipe(name="r", phases=(Phase(epochs=1, lr=0.1, gate_lr=0.1),), batch_size=8)
    args = (connlearn.build(**tiny()), RandomLoader(n=16, batch=8), None, recipe)
    assert Trainer(*args, out_dir=tmp_path, compile=None).compile is False
    with pytest.raises(ConfigTypeError, match="resume_check must be a function of the checkpoint dict, got 'x'"):
        Trainer(*args, out_dir=tmp_path, resume_check="x")


def test_a_cuda_index_beyond_the_gpus_is_named(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert check_device("cuda:1") == torch.device("cuda:1")
    with pytest.raises(ConfigError, match=r"asks for CUDA GPU 2, but PyTorch sees 2 \(indices 0 to 1\)"):
        check_device("cuda:2")


def test_a_map_location_is_a_device_this_machine_has(finished_run):
    from connlearn.checkpoint import load_checkpoint

    assert load_checkpoint(finished_run / "last.pt", map_location=torch.device("cpu"))["epoch"] == 1
    with pytest.raises(ConfigError, match="map_location 'gpu' is not a device"):
        load_checkpoint(finished_run / "last.pt", map_location="gpu")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="map_location 'cuda' asks for a CUDA GPU, but PyTorch sees none"):
            load_checkpoint(finished_run / "last.pt", map_location="cuda")


@pytest.mark.parametrize("engine", ["fused", "reference"])
def test_an_empty_batch_runs_through_a_pruned_network(engine):
    """Modules of fewer branches than C, after pruning."""
    from connlearn.prune import prune_dead_blocks

    pruned, report = prune_dead_blocks(connlearn.build(**tiny(gate="random", K=1, M=6), engine=engine))
    assert report.params_after < report.params_before
    assert pruned.eval()(torch.randn(0, 3, 32, 32)).shape == (0, 10)


def test_a_binary_file_for_a_log_and_a_file_for_a_run_folder_are_named(tmp_path, finished_run):
    from connlearn.plots import plot_training_curves

    with pytest.raises(DataError, match="is not JSONL"):
        plot_training_curves(finished_run / "last.pt", tmp_path / "c.png")
    (tmp_path / "run").write_text("")
    recipe = Recipe(name="r", phases=(Phase(epochs=1, lr=0.1),), batch_size=8)
    with pytest.raises(ConfigError, match=r"out_dir .* is a file; give the folder of the run"):
        Trainer(connlearn.build(**tiny()), RandomLoader(), None, recipe, out_dir=tmp_path / "run")


def test_a_network_given_where_a_graph_goes_says_to_pass_its_graph():
    from connlearn.compile import ConnectivityNet

    net = connlearn.build(**tiny())
    with pytest.raises(ConfigTypeError, match=r"compiled from must be a connlearn BranchGraph, got "
                                              r"ConnectivityNet; pass net.graph\(\)"):
        ConnectivityNet(net)
    assert ConnectivityNet(net.graph()).graph().to_json() == net.graph().to_json()


def test_every_file_writer_refuses_a_folder_alike_and_writes_nothing_into_it(tmp_path):
    from connlearn.checkpoint import save_atomic
    from connlearn.data import ImageDataset, pack
    from connlearn.export import export

    net = connlearn.build(**tiny()).eval()
    images = ImageDataset(np.zeros((4, 8, 8, 3), dtype=np.uint8), np.arange(4) % 2, ("a", "b"))
    writers = {"model.pt": lambda: save_atomic({"x": 1}, tmp_path),
               "model.ts": lambda: export(net, tmp_path),
               "data.npz": lambda: pack(tmp_path, images, images)}
    for example, write in writers.items():
        with pytest.raises(ConfigError, match=rf"{tmp_path} is a folder; give the file to write "
                                              rf"\(e.g. {tmp_path / example}\)"):
            write()
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("engine", [["fused"], 3, "fusd"])
def test_a_checkpoint_whose_engine_is_no_engine_name_is_named(engine):
    from connlearn.checkpoint import make_checkpoint, net_from_checkpoint

    ckpt = make_checkpoint(connlearn.build(**tiny()))
    ckpt["engine"] = engine
    with pytest.raises(ConnlearnError, match=r"engine"):
        net_from_checkpoint(ckpt)


@pytest.mark.parametrize("other", [dict(K=1), dict(gate="real"), dict(gate="random")])
def test_a_state_dict_of_another_k_or_gate_kind_is_refused_though_every_shape_fits(other):
    state = connlearn.build(**tiny()).state_dict()
    with pytest.raises(CheckpointError, match=r"a network with K=2, gate='topk', this network has (K=1|K=2, gate=)"):
        connlearn.build(**tiny(**other)).load_state_dict(state)
    del state["_extra_state"]["K"], state["_extra_state"]["gate"]  # as saved before they were recorded
    if other.get("gate") != "random":  # same tensors: loads, unchecked, as it always did
        connlearn.build(**tiny(**other)).load_state_dict(state)


def test_images_without_pixels_and_a_training_batch_that_batch_norm_cannot_normalise_are_named():
    net = connlearn.build(**tiny())
    with pytest.raises(ShapeError, match="expected images of at least 1x1 pixels, got 0x0"):
        net(torch.randn(2, 3, 0, 0))
    with pytest.raises(ShapeError, match=r"a training batch of 1 image of 4x4 ends in 1x1 feature maps.*net\.eval"):
        net(torch.randn(1, 3, 4, 4))
    assert net(torch.randn(2, 3, 4, 4)).shape == (2, 10)  # two values per channel: trains
    assert net(torch.randn(1, 3, 32, 32)).shape == (1, 10)  # 8x8 at the end
    assert net.eval()(torch.randn(1, 3, 4, 4)).shape == (1, 10)


@pytest.mark.parametrize("seed, match", [(2**64, r"seed must be <= 18446744073709551615"), (-5, "seed must be >= 0")])
def test_a_seed_beyond_64_bits_or_negative_is_refused_by_build_and_from_graph(seed, match):
    with pytest.raises(ConfigError, match=match):
        connlearn.build(**tiny(seed=seed))
    with pytest.raises(ConfigError, match=match):
        connlearn.from_graph(connlearn.build(**tiny()).graph(), seed=seed)
    assert connlearn.build(**tiny(seed=2**64 - 1))(torch.randn(2, 3, 32, 32)).shape == (2, 10)


def test_a_switch_given_something_other_than_a_bool_is_refused_by_name():
    from connlearn import prune, render

    net = connlearn.build(**tiny())
    with pytest.raises(ConfigTypeError, match=r"on must be True or False, got 'no' \(str\)"):
        net.record_draws(on="no")
    with pytest.raises(ConfigTypeError, match=r"freeze must be True or False, got 'yes'"):
        prune.prune_dead_blocks(net, freeze="yes")
    with pytest.raises(ConfigTypeError, match=r"weighted must be True or False, got 1 \(int\)"):
        render.to_dot(net.graph(), weighted=1)


def test_a_checkpoint_entry_that_would_replace_the_checkpoints_own_and_a_graph_that_is_no_text_are_named():
    from connlearn.checkpoint import make_checkpoint
    from connlearn.graph import BranchGraph

    with pytest.raises(ConfigError, match="make_checkpoint: graph, model are the checkpoint's own entries"):
        make_checkpoint(connlearn.build(**tiny()), graph="x", model={}, epoch=1)
    with pytest.raises(GraphError, match="a BranchGraph JSON document is a string, got NoneType"):
        BranchGraph.from_json(None)


def test_a_graph_too_large_to_build_is_refused_at_once():
    with pytest.raises(ConfigError, match=r"C=1000000000 with 3 modules makes 2,000,000,000,000,000,000 gate edges"):
        connlearn.build(C=10**9, M=3)


def test_subsets_and_splits_name_the_option_that_asked_for_them():
    from connlearn.data import synthetic

    train, _ = synthetic(num_classes=10, n_train=100, n_test=20, size=8, seed=0)
    with pytest.raises(ConfigError, match="val_split must be >= 10, got 5"):
        train.split(5, name="val_split")
    with pytest.raises(ConfigError, match=r"split\(val_split=100\) would hold out every one of the 100 images; use "
                                          r"val_split < 100"):
        train.split(100, name="val_split")
    with pytest.raises(ConfigError, match=r"subset\(train_subset=200\) needs 20 images of each class .*use "
                                          r"train_subset <= 100"):
        train.subset(200, name="train_subset")


def test_a_gate_init_typo_is_named_with_what_is_allowed():
    with pytest.raises(ConfigError, match=r"gate_init must be a number in \[0, 1\] or 'uniform', got 'unifrom'; "
                                          r"did you mean 'uniform'\?"):
        connlearn.build(**tiny(gate_init="unifrom"))
