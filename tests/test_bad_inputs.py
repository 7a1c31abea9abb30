"""Every bad value where it enters (builder options, graphs, configs, files, registries) is refused with the
error class and the fragments a user needs: the value, what is allowed, the closest name."""

import json
import math
import os
import stat
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import tiny
from PIL import Image

import connlearn
from connlearn import ConfigError, DataError, GraphError
from connlearn.errors import CheckpointError
from connlearn.export import export
from connlearn.files import write_text
from connlearn.render import save
from connlearn.train import ImageDataset, RunConfig, Trainer, load_checkpoint, load_packed
from connlearn.train.compare import Study, collect, parse_arm
from connlearn.train.data import ArrayDataset, load_dataset, pack, read_image_folder
from connlearn.train.signals import check_signals
from connlearn.updater import GateUpdater
from connlearn.wiring import generated, shuffle


def _graph(**changes):
    graph = connlearn.build(**tiny()).graph()
    graph.graph.update(changes.get("attrs", {}))
    for (u, v), values in changes.get("edges", {}).items():
        graph.edges[u, v].update(values)
    for node, values in changes.get("nodes", {}).items():
        graph.nodes[node].update(values)
    return graph


def _no_candidates():
    """A graph under one budget (dnw, density) whose only module reads the stem: no candidate gate edges."""
    g = connlearn.build(**tiny(gate="dnw", K=None, density=0.5)).graph()
    g.remove_nodes_from([n for n in g.block_nodes() if g.nodes[n]["module"] > 1])
    g.add_edges_from(((n, "output") for n in g.branches(1)), kind="fixed", active=True)
    g.nodes["output"]["in_channels"] = g.nodes["m1.b1"]["out_channels"]
    return g


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


def _runs(tmp_path, first, second, top1=50.0, collected=True):
    for name, run in (("a-s0", first), ("b-s0", second)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text(json.dumps({"test_top1": top1, "run": run}))
    return collect([tmp_path]) if collected else tmp_path


def _compare(*argv):
    from connlearn.cli import build_parser, cmd_compare

    return cmd_compare(build_parser().parse_args(["compare", *map(str, argv)]))


def _train(*argv):
    from connlearn.cli import build_parser, config_from

    return config_from(build_parser().parse_args(["train", *map(str, argv)]))


def _network(**options):
    from connlearn.train.protocol import network_graph

    return network_graph(RunConfig(**options))


def _images(tmp_path, classes=("a", "b"), n=2, size=8, mode="RGB"):
    for c in classes:
        (tmp_path / c).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            Image.new(mode, (size, size), 40 * i).save(tmp_path / c / f"{i}.png")
    return tmp_path


def _linked(tmp_path, name, target):
    os.symlink(target, _images(tmp_path) / "a" / name)
    return tmp_path


def _fifo(tmp_path, name):
    os.mkfifo(tmp_path / name)
    return tmp_path / name


def _bomb(tmp_path):
    header = struct.pack(">IIBBBBB", 60000, 60000, 8, 2, 0, 0, 0)
    chunks = b"".join(struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
                      for kind, data in ((b"IHDR", header), (b"IDAT", zlib.compress(b"")), (b"IEND", b"")))
    (_images(tmp_path) / "a" / "bomb.png").write_bytes(b"\x89PNG\r\n\x1a\n" + chunks)
    return tmp_path


def _truncated(tmp_path):
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(tmp_path / "t.png")
    data = (tmp_path / "t.png").read_bytes()
    (_images(tmp_path) / "a" / "t.png").write_bytes(data[:len(data) // 2])
    return tmp_path


def _npz(tmp_path, **arrays):
    from connlearn.train.data import pack, synthetic

    path = pack(tmp_path / "d.npz", *synthetic(n_train=10, n_test=10, size=8))
    with np.load(path) as archive:
        np.savez(path, **{**dict(archive), **arrays})
    return path


def _npz_arrays(tmp_path, train_x):
    np.savez(tmp_path / "a.npz", train_x=train_x, train_y=np.zeros(len(train_x), int), test_x=np.zeros((1, 2, 2)),
             test_y=np.zeros(1, int))
    return tmp_path / "a.npz"


def _npy(path):
    with open(path, "wb") as f:
        np.save(f, np.zeros(3))
    return path


def _grey_cifar(tmp_path):
    from connlearn.train.data import pack, synthetic
    from connlearn.train.protocol import load_data

    pack(tmp_path / "cifar10.npz", *synthetic(n_train=10, n_test=10, size=32, channels=1))
    return load_data(RunConfig(dataset="cifar10", data=str(tmp_path / "cifar10.npz")))[0]


def _command(*argv):
    from connlearn.cli import build_parser

    args = build_parser().parse_args([*map(str, argv)])
    return args.func(args)


def _tree(folder):
    """What a folder holds, links not followed: each path's kind and, for a file, its bytes."""
    found = {}
    for root, folders, files in os.walk(folder):
        for name in folders + files:
            path = os.path.join(root, name)
            mode = os.lstat(path).st_mode
            found[path] = (os.readlink(path) if stat.S_ISLNK(mode) else Path(path).read_bytes() if stat.S_ISREG(mode)
                           else stat.S_IFMT(mode))
    return found


def _kept(folder, act, *args):
    """``act(*args)`` (its inputs made before it runs), which must leave ``folder`` as it was: nothing written,
    nothing replaced."""
    before = _tree(folder)
    try:
        act(*args)
    finally:
        assert _tree(folder) == before


def _link(tmp_path, name, target):
    os.symlink(target, tmp_path / name)
    return tmp_path / name


def _cut_png(tmp_path):
    """A PNG whose header declares 8 rows and whose image data holds 4 (Pillow reads it with 4 black rows)."""
    header = struct.pack(">IIBBBBB", 8, 8, 8, 2, 0, 0, 0)
    rows = zlib.compress(b"".join(b"\x00" + bytes([200]) * 24 for _ in range(4)))
    chunks = b"".join(struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
                      for kind, data in ((b"IHDR", header), (b"IDAT", rows), (b"IEND", b"")))
    (_images(tmp_path) / "a" / "cut.png").write_bytes(b"\x89PNG\r\n\x1a\n" + chunks)
    return tmp_path


def _checkpoint(tmp_path, name="c.pt", change=lambda ckpt: None):
    """A checkpoint of a tiny network, ``change`` made to its dict first (a damaged one)."""
    from connlearn.train.checkpoint import make_checkpoint, save_checkpoint

    ckpt = make_checkpoint(connlearn.build(**tiny()))
    change(ckpt)
    return save_checkpoint(ckpt, tmp_path / name)


def _one_weight_of_shape_3(ckpt):
    name = next(k for k, v in ckpt["model"].items() if torch.is_tensor(v) and v.dim() > 1)
    ckpt["model"][name] = torch.zeros(3)


def _connectivity(path):
    from connlearn.train.data import synthetic
    from connlearn.train.protocol import build_net

    return build_net(RunConfig(dataset="cifar10", connectivity=str(path)), synthetic()[0])


def _images_of(channels):
    return ImageDataset(np.zeros((2, 4, 4, channels), np.uint8), [0, 1], ["a", "b"])


def _signal_net_given_images(tmp_path):
    from connlearn.train.checkpoint import make_checkpoint, save_checkpoint
    from connlearn.train.data import synthetic
    from connlearn.train.protocol import build_net

    net = connlearn.build(**tiny(in_channels=2, input_size=(12,))).freeze()
    save_checkpoint(make_checkpoint(net), tmp_path / "signals.pt")
    return build_net(RunConfig(dataset="cifar10", connectivity=str(tmp_path / "signals.pt")), synthetic()[0])


def _saved(path, **arrays):
    np.savez(path, **arrays)
    return path


def _file(tmp_path, name, content):
    path = tmp_path / name
    path.write_bytes(content)
    return path


def _pickled_net(tmp_path):
    torch.save(connlearn.build(**tiny()), tmp_path / "net.pt")
    return tmp_path / "net.pt"


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
    (lambda _: connlearn.build(gate="full", C=4, K=2), ConfigError, ["reads 4 of C=4 inputs", "K must be 4", "K=2"]),
    (lambda _: connlearn.build(block_params={"width": 3}), ConfigError, ["may not set 'width'"]),
    (lambda _: connlearn.build(kernels=(1, 4)), ConfigError, ["kernels must be odd sizes", "(1, 4)"]),
    (lambda _: connlearn.build(block="basic", kernels=(1, 3)), ConfigError, ["block kind 'basic' takes no 'kernel'"]),
    (lambda _: connlearn.build(C=4, uninformative=(4, 5)), ConfigError, ["uninformative", "1 to C=4", "[4, 5]"]),
    (lambda _: connlearn.build(gate="full", uninformative=(1,)), ConfigError, ["of a network with branches", "'full'"]),
    (lambda _: connlearn.build(Cc=8), TypeError, ["unexpected keyword argument 'Cc'"]),
    (lambda _: connlearn.build(gate="dnw", K=2, density=0.1), ConfigError, ["K", "density", "not both", "K=2"]),
    (lambda _: connlearn.build(gate="dnw", density=1.5), ConfigError, ["density must be in (0, 1]", "got 1.5"]),
    (lambda _: connlearn.build(gate="random", density=0), ConfigError, ["density must be in (0, 1]", "got 0"]),
    (lambda _: connlearn.build(gate="topk", density=0.1), ConfigError,
     ["gate 'topk' cannot spend one budget", "dnw, dnw_masked, magnitude, random"]),
    (lambda _: connlearn.from_graph(_no_candidates()), GraphError, ["density 0.5", "has none", "leave density out"]),
    (lambda _: connlearn.build(gate="frozen", density=0.5), ConfigError,
     ["gate 'frozen' cannot spend one budget", "dnw, dnw_masked, magnitude, random"]),
    (lambda _: connlearn.build(gate="dnw", density=0.05), GraphError,
     ["26 of the network's 512 candidate edges", "density 0.05", "no path from the stem to the head",
      "give a larger density"]),
    (lambda _: shuffle(connlearn.build(**tiny(gate="random")).graph()), GraphError,
     ["shuffle", "keeps K=2 in every block", "rewire it (degrees)"]),
    (lambda _: generated(connlearn.build(**tiny(gate="random")).graph(), "er"), GraphError,
     ["generated", "keeps K=2 in every block", "rewire it (degrees)"]),
    (lambda _: connlearn.build("neural-graph", gate="frozen"), ConfigError, ["gate 'frozen' is what freeze() leaves"]),
    (lambda t: save(connlearn.build("neural-graph", nodes=[4, 4], stem_nodes=2, features=2, K=1).graph(), t / "g.svg",
                    beside_resnext=True), ConfigError, ["a node graph has no ResNeXt", "leave out side-by-side"]),
    (lambda _: connlearn.build("neural-graph", nodes=[4, 4], features=5), ConfigError,
     ["features must be 1 to the last stage's nodes, 4", "got 5"]),
    (lambda _: RunConfig(rewire="stages"), ConfigError, ["rewire stages", "give connectivity"]),
    (lambda _: RunConfig(reinit=True), ConfigError, ["reinit", "give connectivity"]),
    (lambda _: RunConfig(gate="dnw", density=0.05, edge_init="top"), ConfigError,
     ["edge_init top", "give gate random and density", "got gate dnw"]),
    (lambda _: RunConfig(topology="neural-graph", C=4), ConfigError, ["neural-graph takes", "nodes", "not C"]),
    (lambda _: RunConfig(nodes=[8, 8]), ConfigError, ["topology resnext takes", "not nodes"]),
    (lambda _: connlearn.build(gate="topk", gate_options={"tau": 0.5}), ConfigError,
     ["unknown gate option 'tau'", "known: (none)"]),
    (lambda _: connlearn.build(gate="gumbel", gate_options={"taus": 0.5}), ConfigError, ["'taus'", "'tau'"]),
    (lambda _: connlearn.build(gate="imle", gate_options={"samples": 0}), ConfigError,
     ["samples must be a positive int", "got 0"]),
    (lambda _: connlearn.build(block=_looped(), residual_init="sqrt_k"), ConfigError,
     ["'sqrt_k' start", "has no init_residual_scale", "'auto'"]),
    (lambda _: connlearn.from_graph(_graph(attrs={"residual_init": "sqrtk"})), GraphError,
     ["residual_init 'sqrtk'", "sqrt_k"]),
    (lambda _: _held_per_example_draw(), ConfigError, ["held draw", "the size of the first"]),
    # graphs
    (lambda _: connlearn.from_graph(_graph(edges={("m1.b1", "m2.b1"): {"gate": math.nan}})), GraphError,
     ["m1.b1 → m2.b1", "nan"]),
    (lambda _: connlearn.from_graph(_graph(nodes={"m2.b1": {"in_channels": 5}})), GraphError,
     ["joins 8 channels", "takes 5"]),
    (lambda _: connlearn.from_graph(_graph(nodes={"m2.b1": {"stride": 0}})), GraphError, ["m2.b1", "stride", "got 0"]),
    (lambda _: connlearn.from_graph('{"format": "x"}'), GraphError, ["not a BranchGraph JSON document"]),
    (lambda _: connlearn.from_graph(_graph(attrs={"gate": "topkk"})), GraphError,
     ["unknown gate kind 'topkk'", "did you mean 'topk'"]),
    (lambda _: connlearn.from_graph(_graph(nodes={"m2.b1": {"block": "bottleneckk"}})), GraphError,
     ["unknown block kind 'bottleneckk'", "did you mean 'bottleneck'"]),
    (lambda _: connlearn.from_graph(_graph(attrs={"K": 5})), GraphError, ["fan-in K=5", "the 4 inputs of block m2.b1"]),
    (lambda _: connlearn.from_graph(_graph(attrs={"density": 0.5})), GraphError,
     ["graph density 0.5", "spends one budget", "the graph's gate 'topk'", "does not"]),
    (lambda _: connlearn.from_graph(_graph(attrs={"edge_weights": True})), GraphError,
     ["gate kind 'topk' has no form with edge weights"]),
    (lambda _: connlearn.from_graph(connlearn.build(**tiny())), ConfigError,
     ["takes a BranchGraph", "ConnectivityNet"]),
    (lambda _: connlearn.build(**tiny()).freeze({2: torch.ones(4, 4, dtype=torch.bool)}), ConfigError,
     ["modules [2, 3]", "K=2 ones per row"]),
    # the protocol's settings
    (lambda _: RunConfig(dataset="cifar"), ConfigError, ["unknown dataset 'cifar'", "did you mean"]),
    (lambda _: RunConfig(dataset="cifar10", preset="imagenet-50-4-32"), ConfigError, ["not one of cifar10's"]),
    (lambda _: RunConfig(gate="topkk"), ConfigError, ["'topkk'", "did you mean 'topk'"]),
    (lambda _: RunConfig(density=1.5), ConfigError, ["density must be in (0, 1]", "got 1.5"]),
    (lambda _: RunConfig(dataset="custom"), ConfigError, ["--data"]),
    (lambda _: RunConfig(connectivity="last.pt", K=2), ConfigError, ["fixes the architecture", "K"]),
    (lambda _: RunConfig(phases=(1, 1, 1, 1), epochs=5), ConfigError, ["add up to 4", "epochs=5"]),
    (lambda _: RunConfig(gate_temperature=0.0), ConfigError, ["temperature", "got 0.0"]),
    (lambda _: RunConfig(compile="fastest"), ConfigError, ["unknown compile 'fastest'", "reduce-overhead"]),
    (lambda _: RunConfig(gate_optimizer="adamw"), ConfigError, ["unknown gate_optimizer 'adamw'", "'adam'"]),
    (lambda _: RunConfig(epochs=16, gate_warmup=6), ConfigError, ["gate_warmup 6", "shorter than phase 1's 6 epochs"]),
    (lambda _: RunConfig(gate="random", gate_holdout=500), ConfigError, ["gate_holdout", "a gate kind that learns"]),
    (lambda _: RunConfig(workers=4), ConfigError, ["workers", "loader 'dataloader'"]),
    (lambda _: RunConfig(snapshot_every=-3), ConfigError, ["snapshot_every must be in [0", "got -3"]),
    (lambda _: RunConfig(out=7), ConfigError, ["out must be a path", "got 7"]),
    (lambda _: RunConfig(epoch=3), ConfigError, ["unknown train option 'epoch'", "did you mean 'epochs'"]),
    (lambda t: _train("--config", _file(t, "c.json", b'{"epoch": 2}')), ConfigError,
     ["c.json: unknown train option 'epoch'", "did you mean 'epochs'"]),
    (lambda _: _train("--M", 3000), ConfigError, ["M must be in [1, 300]", "got 3000"]),
    (lambda _: _train("--C", 10000), ConfigError, ["C must be in [1, 256]", "got 10000"]),
    (lambda _: _train("--width", 100000), ConfigError, ["width must be in [1, 4096]", "got 100000"]),
    (lambda _: _train("--base-channels", 0), ConfigError, ["base_channels must be in [1", "got 0"]),
    (lambda _: _train("--stem-channels", 10**6), ConfigError, ["stem_channels must be in [1, 65536]"]),
    (lambda _: _train("--kernels", 3, 999), ConfigError, ["kernels must be in [1, 15]", "got 999"]),
    (lambda _: _train("--K", 0), ConfigError, ["K must be in [1", "got 0"]),
    (lambda _: _train("--gate-lr", "inf"), ConfigError, ["gate_lr must be a finite number >= 0", "inf"]),
    (lambda _: _train("--gate-lr", -0.1), ConfigError, ["gate_lr must be a finite number >= 0", "-0.1"]),
    (lambda _: _train("--lr", 0), ConfigError, ["lr must be a finite number > 0", "got 0"]),
    (lambda _: _train("--lr", "nan"), ConfigError, ["lr must be a number", "nan"]),
    (lambda _: _train("--device", "tpu"), ConfigError, ["unknown device 'tpu'", "cpu, cuda"]),
    (lambda _: _train("--device", f"cuda:{torch.cuda.device_count()}"), ConfigError, ["this machine has cpu"]),
    (lambda _: _train("--device", "meta"), ConfigError, ["device 'meta'", "this machine has cpu"]),
    (lambda _: _network(width=4096), ConfigError, ["{D=29, w=4096, C=8} would hold", "up to 1,000,000,000"]),
    (lambda _: _network(C=256), ConfigError, ["M=9 modules of C=256 branches", "up to 262,144"]),
    (lambda _: _network(topology="neural-graph", nodes=[400] * 4), ConfigError,
     ["nodes [400, 400, 400, 400] make 1,041,200 candidate edges", "up to 262,144"]),
    (lambda _: RunConfig(amp="fp32"), ConfigError, ["unknown amp 'fp32'", "'fp16'"]),
    (lambda t: (os.symlink("last.pt", t / "last.pt"), Trainer(connlearn.build(**tiny()), [], None,
                connlearn.train.get_recipe("cifar"), RunConfig(out=t)).fit()), CheckpointError, ["last.pt"]),
    (lambda _: check_signals(["TERMM"]), ConfigError, ["stop signal 'SIGTERMM'", "'SIGTERM'"]),
    (lambda _: check_signals(["KILL"]), ConfigError, ["'SIGKILL'"]),
    (lambda _: GateUpdater(connlearn.build(**tiny()), grad_mode="centred"), ConfigError, ["'centered'"]),
    (lambda t: export(connlearn.build(**tiny()), t / "m", "onnxx"), ConfigError, ["export format 'onnxx'", "'onnx'"]),
    # compare's arms and the runs it reports
    (lambda _: parse_arm("gumbel gate=gumbel gate_lrr=0.1"), ConfigError,
     ["arm 'gumbel'", "unknown train option 'gate_lrr'", "did you mean 'gate_lr'"]),
    (lambda _: parse_arm("gumbel gate=gumbel seed=3"), ConfigError, ["'seed'", "compare sets seed and out per run"]),
    (lambda _: parse_arm("my-arm gate=topk"), ConfigError, ["arm name 'my-arm'", "letters, digits"]),
    (lambda t: Study({"a": {"epochs": 4}, "b": {}}, {}, (0,), t, "a"), ConfigError,
     ["arm 'a' sets epochs", "set them for all"]),
    (lambda t: Study({"a": {"gate": "gumbell"}, "b": {}}, {}, (0,), t, "a"), ConfigError, ["'gumbell'", "'gumbel'"]),
    (lambda t: Study({"a": {}, "c": {}}, {}, (0,), t, "b"), ConfigError, ["baseline 'b' is not an arm"]),
    (lambda t: Study({"a": {"M": 4}, "b": {}}, {}, (0,), t, "a"), ConfigError, ["multiple of 3", "M=4"]),
    (lambda t: _compare("--arm", "a gate=random", "--out", t), ConfigError, ["at least two (got a)", "another arm's"]),
    (lambda t: _compare("--arm", "a gate=random", "--arm", "a gate=topk", "--out", t), ConfigError,
     ["arm 'a' is given twice"]),
    (lambda t: parse_arm(""), ConfigError, ["--arm ''", "give a name and its options"]),
    (lambda t: Study({"a": {}, "b": {}}, {}, (0, -1), t, "a"), ConfigError, ["seed must be in [0", "got -1"]),
    (lambda t: _compare("--arm", "a gate=random", "--arm", "b", "--parallel", 0, "--out", t / "s"), ConfigError,
     ["--parallel must be in [1", "got 0"]),
    (lambda t: _compare("--arm", "a gate=random", "--arm", "b", "--threads", -1, "--out", t / "s"), ConfigError,
     ["--threads must be in [1", "got -1"]),
    (lambda t: _compare("--report", t, "--margin", -1), ConfigError, ["--margin must be a finite number > 0", "-1"]),
    (lambda t: _compare("--report", t, "--margin", "nan"), ConfigError, ["--margin must be a", "nan"]),
    (lambda t: _compare("--report", _runs(t, {"seed": 0}, {"seed": 0}, collected=False)), ConfigError,
     ["--report: give --baseline NAME", "arms: a, b"]),
    (lambda t: collect([_runs(t, {"seed": 0}, {"seed": 0}, top1=math.nan, collected=False)]), DataError,
     ["a-s0/summary.json is not a run's summary", "test_top1 nan"]),
    (lambda t: Study({"a": {}, "b": {"retrain": "c"}}, {}, (0,), t, "a"), ConfigError,
     ["arm 'b': retrain 'c' must name an arm of the study that learns", "arms: a"]),
    (lambda t: collect([t]), DataError, ["neither a run folder (ARM-sSEED) nor a folder holding them"]),
    (lambda t: collect([_file(t, "a-s0", b"")]), DataError, ["a-s0 is not a connlearn train run"]),
    (lambda t: _runs(t, {"epochs": 16, "seed": 0}, {"epochs": 32, "seed": 0}), DataError,
     ["arms 'a' and 'b' differ in their data or schedule", "epochs=16 against 32"]),
    # files being loaded
    (lambda t: load_checkpoint(t / "none.pt"), CheckpointError, ["no checkpoint at", "none.pt"]),
    (lambda t: load_checkpoint(_file(t, "x.pt", json.dumps({"a": 1}).encode())), CheckpointError,
     ["x.pt is not a readable checkpoint"]),
    (lambda t: load_checkpoint(_pickled_net(t)), CheckpointError,
     ["net.pt holds objects other than tensors and was not loaded", "weights_only=True", "trust its source"]),
    (lambda t: load_checkpoint(_checkpoint(t, change=lambda c: c.update(version=1))), CheckpointError,
     ["version 1", "reads version 2"]),
    (lambda t: load_packed(_file(t, "d.npz", b"PK\x03\x04")), DataError, ["d.npz is not a readable packed dataset"]),
    (lambda t: load_packed(_mismatched_splits(t)), DataError, ["the train images are [8, 8, 3]", "[6, 6, 3]"]),
    (lambda t: ImageDataset(np.zeros((2, 4, 4, 3)), [0, 1], ["a", "b"]), DataError, ["uint8", "float64"]),
    (lambda t: ImageDataset(np.zeros((2, 4, 4, 3), np.uint8), [0, 2], ["a", "b"]), DataError, ["0..1"]),
    # data: never a wrong label, never an unbounded read, never a write where the user did not mean
    (lambda t: _command("pack", _images(t / "train"), "-o", t / "x.npz"), DataError, ["train' is neither cifar10"]),
    (lambda t: read_image_folder(_images(t / "r" / "test", ("a", "z")), classes=("a", "b")), DataError,
     ["class folders the training split lacks: z"]),
    (lambda t: read_image_folder(_images(t, n=0)), DataError, ["the class folder", "a holds no image files"]),
    (lambda t: read_image_folder(_linked(t, "loop", ".")), DataError, ["a/loop leads back to a folder already read"]),
    (lambda t: read_image_folder(_linked(t, "up", "..")), DataError, ["a/up links out of its class folder"]),
    (lambda t: read_image_folder(_linked(t, "gone.png", "nowhere.png")), DataError, ["gone.png is a link to nothing"]),
    (lambda t: (_fifo(_images(t) / "a", "pipe.png"), read_image_folder(t)), DataError,
     ["pipe.png is not a regular file"]),
    (lambda t: read_image_folder(_images(t), size=100000), DataError, ["4 images of 100000x100000x3", "GiB of memory"]),
    (lambda t: _command("pack", _images(t), "--size", 0, "--test-per-class", 1, "-o", t / "x.npz"), ConfigError,
     ["--size must be in [1", "got 0"]),
    (lambda t: _command("pack", _images(t), "--test-per-class", -1, "-o", t / "x.npz"), ConfigError,
     ["--test-per-class must be in [1", "got -1"]),
    (lambda t: _command("pack", _images(t), "--test-per-class", 0, "-o", t / "x.npz"), ConfigError, ["got 0"]),
    (lambda t: _command("pack", t / "absent", "-o", t / "x.npz"), DataError, ["absent: no such folder"]),
    (lambda t: read_image_folder(_bomb(t)), DataError, ["bomb.png is not a readable image", "decompression bomb"]),
    (lambda t: read_image_folder(_truncated(t)), DataError, ["a/t.png is not a readable image", "truncated"]),
    (lambda t: load_packed(_npz(t, train_labels=np.arange(10) + 0.5)), DataError,
     ["d.npz (train)", "labels must be whole numbers; label 0 is 0.5"]),
    (lambda t: load_packed(_npz(t, test_jpeg=np.frombuffer(b"\xff\xd8 not a JPEG", np.uint8),
                                test_offsets=np.array([0, 4, 13]), test_labels=np.array([0, 1]))), DataError,
     ["d.npz (test): image 0 is not an image file Pillow can identify"]),
    (lambda t: load_packed(_npy(t / "d.npz")), DataError, ["d.npz holds one array (a .npy file)"]),
    (lambda t: ImageDataset(np.zeros((3, 4, 4, 3), np.uint8), [0, 5, -1], ["a", "b"]), DataError,
     ["label 1 is 5", "in 0..1", "2 are not"]),
    (lambda t: load_dataset("cifar100", _npz(t)), DataError, ["d.npz has 10 classes, not cifar100's 100",
                                                             "--dataset custom"]),
    (lambda t: _grey_cifar(t), DataError, ["32x32x1 images", "takes 32x32x3", "--dataset custom"]),
    (lambda t: write_text("/dev/full", "x"), ConfigError, ["/dev/full exists and is not a regular file"]),
    (lambda t: write_text(_fifo(t, "out.npz"), "x"), ConfigError, ["out.npz exists and is not a regular file"]),
    (lambda t: write_text(t, "x"), ConfigError, ["is not a regular file"]),
    # writers: a regular file or nothing, never the command's own input; nothing written, nothing replaced
    (lambda t: _kept(t, _command, "export", _checkpoint(t), "--format", "onnx", "-o", _fifo(t, "m.onnx")), ConfigError,
     ["m.onnx exists and is not a regular file (a FIFO)", "give another output path"]),
    (lambda t: _kept(t, _command, "export", _checkpoint(t), "--format", "onnx", "-o", _link(t, "m.onnx", "/dev/null")),
     ConfigError, ["m.onnx exists and is not a regular file (a device)"]),
    (lambda t: _kept(t, _command, "export", _checkpoint(t), "-o", t / "c.pt"), ConfigError,
     ["the output", "c.pt is the input", "give another output path"]),
    (lambda t: _kept(t, _command, "export", _checkpoint(t, "c.ts")), ConfigError, ["c.ts is the input", "c.ts itself"]),
    (lambda t: _kept(t, _command, "export", _checkpoint(t, "c.pt2"), "--format", "export"), ConfigError,
     ["c.pt2 is the input"]),
    (lambda t: _kept(t, _command, "prune", _checkpoint(t), "-o", _link(t, "l.pt", "c.pt")), ConfigError,
     ["l.pt is the input", "c.pt itself"]),
    (lambda t: _kept(t, _command, "render", _checkpoint(t, "c.svg"), "-o", t / "c.svg"), ConfigError,
     ["c.svg is the input"]),
    (lambda t: _kept(t, _command, "pack", _npz(t), "-o", t / "d.npz"), ConfigError, ["d.npz is the input"]),
    # readers: regular files only, never blocking on a FIFO or reading a device until memory runs out
    (lambda t: _kept(t, _command, "train", "--config", _fifo(t, "c.toml")), ConfigError,
     ["the config", "c.toml is a FIFO, not a regular file"]),
    (lambda t: _kept(t, _command, "train", "--config", _link(t, "c.json", "/dev/zero")), ConfigError,
     ["c.json is a device, not a regular file"]),
    (lambda t: _kept(t, load_packed, _fifo(t, "d.npz")), DataError, ["the packed dataset", "d.npz is a FIFO"]),
    (lambda t: _kept(t, load_dataset, "cifar10", _link(t, "d.npz", "/dev/zero")), DataError,
     ["--data", "d.npz is neither a regular file nor a folder"]),
    (lambda t: _kept(t, _connectivity, _fifo(t, "g.json")), ConfigError, ["the graph", "g.json is a FIFO"]),
    (lambda t: _kept(t, _command, "plot", _fifo(t, "log.jsonl"), "-o", t), DataError, ["log.jsonl is a FIFO"]),
    (lambda t: _kept(t, load_checkpoint, _link(t, "z.pt", "/dev/zero")), CheckpointError,
     ["the checkpoint", "z.pt is a device, not a regular file"]),
    (lambda t: _kept(t, load_checkpoint, _link(t, "loop.pt", "loop.pt")), CheckpointError,
     ["cannot read the checkpoint", "loop.pt", "symbolic links"]),
    # damaged checkpoints, checked where they are loaded, in every command that loads one
    (lambda t: _kept(t, _command, "info", _checkpoint(t, change=_one_weight_of_shape_3)), CheckpointError,
     ["weights do not fit the network its graph describes", "is floating [3], its network's floating ["]),
    (lambda t: _kept(t, _command, "render", _checkpoint(t, change=lambda c: c["model"].popitem()), "-o", t / "c.svg"),
     CheckpointError, ["weights do not fit", "is missing"]),
    (lambda t: _kept(t, _command, "plot", _checkpoint(t, change=lambda c: c["model"].update(extra=torch.ones(1))),
                     "-o", t), CheckpointError, ["extra is not one of its network's"]),
    (lambda t: _kept(t, _command, "prune", _checkpoint(t, change=lambda c: c.pop("graph"))), CheckpointError,
     ["c.pt is damaged: it has no graph"]),
    (lambda t: _kept(t, _command, "export", _checkpoint(t, change=lambda c: c.update(dtype="int8"))), CheckpointError,
     ["c.pt is damaged: its dtype 'int8' is not a floating type"]),
    (lambda t: _kept(t, _connectivity, _checkpoint(t, change=lambda c: c.pop("graph"))), CheckpointError,
     ["it has no graph"]),
    # plot's records
    (lambda t: _kept(t, _command, "plot", _file(t, "log.jsonl", b""), "-o", t), DataError,
     ["log.jsonl holds no records"]),
    (lambda t: _kept(t, _command, "plot", _file(t, "gates.jsonl", b'{"gates": {"1": [[0.5]]}}'), "-o", t, "--K", 1),
     DataError, ["gates.jsonl record 1 is not a gate snapshot", "step, epoch and gates"]),
    (lambda t: _kept(t, _command, "plot", _file(t, "g.jsonl", b'{"step": 0, "epoch": 0, "gates": {"2": [[1], []]}}'),
                     "-o", t, "--K", 1), DataError, ["g.jsonl record 1", "rows of numbers, one row per block"]),
    (lambda t: _kept(t, _command, "plot", _file(t, "log.jsonl", b'{"epoch": 1, "test_top1": "50"}'), "-o", t),
     DataError, ["log.jsonl", "'test_top1' needs it and its epoch as numbers"]),
    # images keep their channels or are refused
    (lambda t: _kept(t, pack, t / "x.npz", _images_of(4), _images_of(4), "jpeg"), DataError,
     ["jpeg holds images of 1 or 3 channels, not 4", "pack them as png"]),
    (lambda t: _kept(t, pack, t / "x.npz", _images_of(5), _images_of(5)), DataError,
     ["png holds images of 1 or 2 or 3 or 4 channels, not 5", "an .npz of uint8 arrays"]),
    (lambda t: _kept(t, read_image_folder, _cut_png(t)), DataError,
     ["a/cut.png", "image data ends before the rows its header declares"]),
    (lambda t: _kept(t, load_packed, _npz_arrays(t, np.zeros((3, 28, 28), np.uint8))), DataError,
     ["train_x is uint8 [3, 28, 28]", "28-channel signals", "images need [N, H, W, C]", "x[..., None]"]),
    (lambda t: _kept(t, load_packed, _saved(t / "s.npz", train_x=np.zeros((2, 1, 4)), train_y=np.array(["cat", "dog"]),
                                           test_x=np.zeros((1, 1, 4)), test_y=np.array(["cat"]))), DataError,
     ["s.npz (train)", "label 0 is 'cat'", "class_names"]),
    # beyond images: the shapes a network and its blocks take
    (lambda _: connlearn.build(block="basic", input_size=()), ConfigError,
     ["block kind 'basic' works on signals (1-D) and images (2-D)", "input is vectors (0-D)", "use 'vector'"]),
    (lambda _: connlearn.build(block="vector"), ConfigError, ["'vector' works on vectors (0-D)", "images (2-D)"]),
    (lambda _: connlearn.build(input_size=(4, 5)), ConfigError, ["input_size must be (), (L,) or square", "(4, 5)"]),
    (lambda _: ArrayDataset(np.zeros((4, 2, 3, 5)), [0] * 4, ["a"]), DataError,
     ["[N, C, L] (signals) or [N, F] (vectors)", "[4, 2, 3, 5]"]),
    (lambda _: ArrayDataset(np.array([[0.0, np.nan]]), [0], ["a"]), DataError, ["finite", "x[0, 1] is nan"]),
    (lambda t: load_packed(_npz_arrays(t, np.zeros((3, 2, 2, 2, 2)))), DataError, ["a.npz (train)", "[N, C, L]"]),
    (lambda t: load_packed(_npz_arrays(t, np.zeros((3, 2, 2, 2)))), DataError,
     ["a.npz (train)", "uint8 [N, H, W, C]", "float64"]),
    (lambda t: load_packed(_npz_arrays(t, np.zeros((3, 3, 8, 8), np.uint8))), DataError,
     ["train_x is [3, 3, 8, 8]", "8 channels and 3 rows", "x.transpose(0, 2, 3, 1)"]),
    (lambda t: load_packed(_saved(t / "d.npz", x_train=np.zeros(1), y_train=np.zeros(1))), DataError,
     ["d.npz holds x_train, y_train", "train_x, train_y, test_x, test_y"]),
    (lambda t: _signal_net_given_images(t), ConfigError,
     ["takes 2-channel signals of length 12 to 10 classes", "the data is 3x32x32 images"]),
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
