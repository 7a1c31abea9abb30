"""Every bad value where it enters (builder options, graphs, configs, files, registries) is refused with the
error class and the fragments a user needs: the value, what is allowed, the closest name."""

import json
import math

import numpy as np
import pytest
import torch
from conftest import tiny

import connlearn
from connlearn import ConfigError, DataError, GraphError
from connlearn.errors import CheckpointError
from connlearn.export import export
from connlearn.train import ImageDataset, RunConfig, Trainer, load_checkpoint, load_packed
from connlearn.train.compare import Study, collect, parse_arm
from connlearn.train.signals import check_signals
from connlearn.updater import GateUpdater


def _graph(**changes):
    graph = connlearn.build(**tiny()).graph()
    graph.graph.update(changes.get("attrs", {}))
    for (u, v), values in changes.get("edges", {}).items():
        graph.edges[u, v].update(values)
    for node, values in changes.get("nodes", {}).items():
        graph.nodes[node].update(values)
    return graph


def _looped():
    connlearn.register_block("looped", connlearn.Looped(lambda i, o, s, width: torch.nn.Conv2d(i, o, 3, s, 1)))
    return "looped"


def _held_per_example_draw():
    net = connlearn.build(**tiny(gate="score"))
    with net.hold_draw():
        net(torch.randn(4, 3, 32, 32))
        net(torch.randn(3, 3, 32, 32))


def _mismatched_splits(tmp_path):
    from connlearn.train.data import pack, synthetic

    return pack(tmp_path / "m.npz", synthetic(n_train=10, n_test=5, size=8)[0], synthetic(n_train=10, n_test=5,
                                                                                          size=6)[1])


def _runs(tmp_path, first, second):
    for name, run in (("a-s0", first), ("b-s0", second)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text(json.dumps({"test_top1": 50.0, "run": run}))
    return collect([tmp_path])


def _file(tmp_path, name, content):
    path = tmp_path / name
    path.write_bytes(content)
    return path


def _pickled_net(tmp_path):
    torch.save(connlearn.build(**tiny()), tmp_path / "net.pt")
    return tmp_path / "net.pt"


def _other_version(tmp_path):
    from connlearn.train.checkpoint import make_checkpoint, save_checkpoint

    return save_checkpoint({**make_checkpoint(connlearn.build(**tiny())), "version": 1}, tmp_path / "old.pt")


CASES = [
    # the builder and its topology
    (lambda _: connlearn.build("resnxt"), ConfigError, ["unknown topology 'resnxt'", "did you mean 'resnext'"]),
    (lambda _: connlearn.build(gate="topkk"), ConfigError, ["unknown gate kind 'topkk'", "did you mean 'topk'"]),
    (lambda _: connlearn.build(preset="cifar-29-8"), ConfigError, ["unknown preset", "cifar-29-8-8"]),
    (lambda _: connlearn.build(C=0), ConfigError, ["C must be in [1", "got 0"]),
    (lambda _: connlearn.build(C=4, K=5), ConfigError, ["K must be in [1, 4]", "got 5"]),
    (lambda _: connlearn.build(depth=30), ConfigError, ["2 + 3M", "depth=30"]),
    (lambda _: connlearn.build(M=4), ConfigError, ["multiple of 3", "M=4"]),
    (lambda _: connlearn.build(gate_init=2), ConfigError, ["gate_init", "[0.0, 1.0]", "got 2"]),
    (lambda _: connlearn.build(gate_init="unifrom"), ConfigError, ["gate_init", "'unifrom'"]),
    (lambda _: connlearn.build(residual_init="sqrtk"), ConfigError, ["residual_init 'sqrtk'", "'sqrt_k'"]),
    (lambda _: connlearn.build(block="bottleneckk"), ConfigError, ["block kind 'bottleneckk'", "'bottleneck'"]),
    (lambda _: connlearn.build(gate="frozen"), ConfigError, ["what freeze() leaves"]),
    (lambda _: connlearn.build(gate="full", C=4, K=2), ConfigError, ["K must be C=4", "K=2"]),
    (lambda _: connlearn.build(block_params={"width": 3}), ConfigError, ["may not set 'width'"]),
    (lambda _: connlearn.build(Cc=8), TypeError, ["unexpected keyword argument 'Cc'"]),
    (lambda _: connlearn.build(engine="fast"), ConfigError, ["unknown engine 'fast'", "fused"]),
    (lambda _: connlearn.build(gate="topk", gate_options={"tau": 0.5}), ConfigError,
     ["gate option of 'topk' 'tau'", "known: (none)"]),
    (lambda _: connlearn.build(gate="gumbel", gate_options={"taus": 0.5}), ConfigError, ["'taus'", "'tau'"]),
    (lambda _: connlearn.build(gate="imle", gate_options={"samples": 0}), ConfigError,
     ["samples must be a positive int", "got 0"]),
    (lambda _: connlearn.build(block=_looped(), residual_init="sqrt_k"), ConfigError,
     ["'sqrt_k' start", "has no init_residual_scale", "'auto'"]),
    (lambda _: connlearn.from_graph(_graph(attrs={"residual_init": "sqrtk"})), GraphError,
     ["residual_init is 'sqrtk'", "sqrt_k"]),
    (lambda _: _held_per_example_draw(), ConfigError, ["held draw", "the size of the first"]),
    # graphs
    (lambda _: connlearn.from_graph(_graph(edges={("m1.b1", "m2.b1"): {"gate": math.nan}})), GraphError,
     ["m1.b1 → m2.b1", "nan"]),
    (lambda _: connlearn.from_graph(_graph(nodes={"m2.b1": {"in_channels": 5}})), GraphError,
     ["joins 8 channels", "takes 5"]),
    (lambda _: connlearn.from_graph(_graph(nodes={"m2.b1": {"stride": 0}})), GraphError, ["m2.b1", "stride", "got 0"]),
    (lambda _: connlearn.from_graph('{"format": "x"}'), GraphError, ["not a BranchGraph JSON document"]),
    (lambda _: connlearn.from_graph(connlearn.build(**tiny())), ConfigError,
     ["takes a BranchGraph", "ConnectivityNet"]),
    (lambda _: connlearn.build(**tiny()).freeze({2: torch.ones(4, 4, dtype=torch.bool)}), ConfigError,
     ["modules [2, 3]", "K=2 ones per row"]),
    # the protocol's settings
    (lambda _: RunConfig(dataset="cifar"), ConfigError, ["unknown dataset 'cifar'", "did you mean"]),
    (lambda _: RunConfig(dataset="cifar10", preset="imagenet-50-4-32"), ConfigError, ["not one of cifar10's"]),
    (lambda _: RunConfig(gate="topkk"), ConfigError, ["'topkk'", "did you mean 'topk'"]),
    (lambda _: RunConfig(dataset="custom"), ConfigError, ["--data"]),
    (lambda _: RunConfig(connectivity="last.pt", K=2), ConfigError, ["fixes the architecture", "K"]),
    (lambda _: RunConfig(phases=(1, 1, 1, 1), epochs=5), ConfigError, ["add up to 4", "epochs=5"]),
    (lambda _: RunConfig(gate_temperature=0.0), ConfigError, ["temperature", "got 0.0"]),
    (lambda _: RunConfig(compile="fastest"), ConfigError, ["unknown compile 'fastest'", "reduce-overhead"]),
    (lambda _: RunConfig(workers=4), ConfigError, ["workers", "loader 'dataloader'"]),
    (lambda _: RunConfig(snapshot_every=-3), ConfigError, ["snapshot_every must be in [0", "got -3"]),
    (lambda _: RunConfig(out=7), ConfigError, ["out must be a path", "got 7"]),
    (lambda _: Trainer(connlearn.build(**tiny()), [], None, connlearn.train.get_recipe("cifar"), out_dir=".",
                       amp="fp32"), ConfigError, ["unknown amp mode 'fp32'", "'fp16'"]),
    (lambda _: check_signals(["TERMM"]), ConfigError, ["stop signal 'SIGTERMM'", "'SIGTERM'"]),
    (lambda _: check_signals(["KILL"]), ConfigError, ["'SIGKILL'"]),
    (lambda _: GateUpdater(connlearn.build(**tiny()), grad_mode="centred"), ConfigError, ["'centered'"]),
    (lambda t: export(connlearn.build(**tiny()), t / "m", "onnxx"), ConfigError, ["export format 'onnxx'", "'onnx'"]),
    # compare's arms and the runs it reports
    (lambda _: parse_arm("gumbel gate=gumbel gate_lrr=0.1"), ConfigError,
     ["arm 'gumbel'", "unknown train option 'gate_lrr'", "did you mean 'gate_lr'"]),
    (lambda _: parse_arm("gumbel gate=gumbel seed=3"), ConfigError, ["'seed'", "compare sets seed and out per run"]),
    (lambda _: parse_arm("my-arm gate=topk"), ConfigError, ["arm name 'my-arm'", "letters, digits"]),
    (lambda t: Study({"a": {"epochs": 4}}, {}, (0,), t, "a"), ConfigError, ["arm 'a' sets epochs", "set them for all"]),
    (lambda t: Study({"a": {"gate": "gumbell"}}, {}, (0,), t, "a"), ConfigError, ["'gumbell'", "'gumbel'"]),
    (lambda t: Study({"a": {}}, {}, (0,), t, "b"), ConfigError, ["baseline 'b' is not an arm"]),
    (lambda t: collect([t]), DataError, ["neither a run folder (ARM-sSEED) nor a folder holding them"]),
    (lambda t: collect([_file(t, "a-s0", b"")]), DataError, ["a-s0 is not a connlearn train run"]),
    (lambda t: _runs(t, {"epochs": 16}, {"epochs": 32}), DataError,
     ["arms 'a' and 'b' differ in their data or schedule", "epochs=16 against 32"]),
    # files being loaded
    (lambda t: load_checkpoint(t / "none.pt"), CheckpointError, ["no checkpoint at", "none.pt"]),
    (lambda t: load_checkpoint(_file(t, "x.pt", json.dumps({"a": 1}).encode())), CheckpointError,
     ["x.pt is not a readable checkpoint"]),
    (lambda t: load_checkpoint(_pickled_net(t)), CheckpointError, ["net.pt is not a readable checkpoint", "Weights"]),
    (lambda t: load_checkpoint(_other_version(t)), CheckpointError, ["version 1", "reads version 2"]),
    (lambda t: load_packed(_file(t, "d.npz", b"PK\x03\x04")), DataError, ["d.npz is not a readable packed dataset"]),
    (lambda t: load_packed(_mismatched_splits(t)), DataError, ["the train images are [8, 8, 3]", "[6, 6, 3]"]),
    (lambda t: ImageDataset(np.zeros((2, 4, 4, 3)), [0, 1], ["a", "b"]), DataError, ["uint8", "float64"]),
    (lambda t: ImageDataset(np.zeros((2, 4, 4, 3), np.uint8), [0, 2], ["a", "b"]), DataError, ["0..1"]),
    # registries
    (lambda _: connlearn.register_gate("odd", int), ConfigError,
     ["gate kind 'odd'", "subclass of connlearn.gates.Gate"]),
    (lambda _: connlearn.register_block("bottleneck", connlearn.blocks.Basic), ConfigError,
     ["'bottleneck' is already registered", "overwrite=True"]),
]


@pytest.mark.parametrize(("make", "error", "fragments"), CASES)
def test_a_bad_input_is_one_clear_error(make, error, fragments, tmp_path, clean_registries):
    with pytest.raises(error) as raised:
        make(tmp_path)
    message = str(raised.value)
    assert "\n" not in message.strip()
    for fragment in fragments:
        assert fragment in message
