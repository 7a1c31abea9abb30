"""Every bad value where it enters (builder options, graphs, configs, files, registries) is refused with the
error class and the fragments a user needs: the value, what is allowed, the closest name."""

import json
import math
import os
import struct
import zlib

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
from connlearn.train import ImageDataset, RunConfig, Trainer, load_checkpoint, load_packed
from connlearn.train.compare import Study, collect, parse_arm
from connlearn.train.data import ArrayDataset, load_dataset, read_image_folder
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


def _pack(*argv):
    from connlearn.cli import build_parser, cmd_pack

    return cmd_pack(build_parser().parse_args(["pack", *map(str, argv)]))


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
    (lambda _: connlearn.build(kernels=(1, 4)), ConfigError, ["kernels must be odd sizes", "(1, 4)"]),
    (lambda _: connlearn.build(block="basic", kernels=(1, 3)), ConfigError, ["block kind 'basic' takes no 'kernel'"]),
    (lambda _: connlearn.build(C=4, uninformative=(4, 5)), ConfigError, ["uninformative", "1 to C=4", "[4, 5]"]),
    (lambda _: connlearn.build(gate="full", uninformative=(1,)), ConfigError, ["of a gated network", "'full'"]),
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
    (lambda _: RunConfig(gate_optimizer="adamw"), ConfigError, ["unknown gate_optimizer 'adamw'", "'adam'"]),
    (lambda _: RunConfig(epochs=16, gate_warmup=6), ConfigError, ["gate_warmup 6", "shorter than phase 1's 6 epochs"]),
    (lambda _: RunConfig(gate="random", gate_holdout=500), ConfigError, ["gate_holdout", "a gate kind that learns"]),
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
    (lambda t: Study({"a": {"M": 4}}, {}, (0,), t, "a"), ConfigError, ["multiple of 3", "M=4"]),
    (lambda t: Study({"a": {}, "b": {"retrain": "c"}}, {}, (0,), t, "a"), ConfigError,
     ["arm 'b': retrain 'c' must name an arm of the study that learns", "arms: a"]),
    (lambda t: collect([t]), DataError, ["neither a run folder (ARM-sSEED) nor a folder holding them"]),
    (lambda t: collect([_file(t, "a-s0", b"")]), DataError, ["a-s0 is not a connlearn train run"]),
    (lambda t: _runs(t, {"epochs": 16}, {"epochs": 32}), DataError,
     ["arms 'a' and 'b' differ in their data or schedule", "epochs=16 against 32"]),
    # files being loaded
    (lambda t: load_checkpoint(t / "none.pt"), CheckpointError, ["no checkpoint at", "none.pt"]),
    (lambda t: load_checkpoint(_file(t, "x.pt", json.dumps({"a": 1}).encode())), CheckpointError,
     ["x.pt is not a readable checkpoint"]),
    (lambda t: load_checkpoint(_pickled_net(t)), CheckpointError,
     ["net.pt holds objects other than tensors and was not loaded", "weights_only=True", "trust its source"]),
    (lambda t: load_checkpoint(_other_version(t)), CheckpointError, ["version 1", "reads version 2"]),
    (lambda t: load_packed(_file(t, "d.npz", b"PK\x03\x04")), DataError, ["d.npz is not a readable packed dataset"]),
    (lambda t: load_packed(_mismatched_splits(t)), DataError, ["the train images are [8, 8, 3]", "[6, 6, 3]"]),
    (lambda t: ImageDataset(np.zeros((2, 4, 4, 3)), [0, 1], ["a", "b"]), DataError, ["uint8", "float64"]),
    (lambda t: ImageDataset(np.zeros((2, 4, 4, 3), np.uint8), [0, 2], ["a", "b"]), DataError, ["0..1"]),
    # data: never a wrong label, never an unbounded read, never a write where the user did not mean
    (lambda t: _pack(_images(t / "train"), "-o", t / "x.npz"), DataError, ["train' is neither cifar10"]),
    (lambda t: read_image_folder(_images(t / "r" / "test", ("a", "z")), classes=("a", "b")), DataError,
     ["class folders the training split lacks: z"]),
    (lambda t: read_image_folder(_images(t, n=0)), DataError, ["the class folder", "a holds no image files"]),
    (lambda t: read_image_folder(_linked(t, "loop", ".")), DataError, ["a/loop leads back to a folder already read"]),
    (lambda t: read_image_folder(_linked(t, "up", "..")), DataError, ["a/up links out of its class folder"]),
    (lambda t: read_image_folder(_linked(t, "gone.png", "nowhere.png")), DataError, ["gone.png is a link to nothing"]),
    (lambda t: (_fifo(_images(t) / "a", "pipe.png"), read_image_folder(t)), DataError,
     ["pipe.png is not a regular file"]),
    (lambda t: read_image_folder(_images(t), size=100000), DataError, ["4 images of 100000x100000x3", "GiB of memory"]),
    (lambda t: _pack(_images(t), "--size", 0, "--test-per-class", 1, "-o", t / "x.npz"), ConfigError,
     ["--size must be in [1", "got 0"]),
    (lambda t: _pack(_images(t), "--test-per-class", -1, "-o", t / "x.npz"), ConfigError,
     ["--test-per-class must be in [1", "got -1"]),
    (lambda t: _pack(_images(t), "--test-per-class", 0, "-o", t / "x.npz"), ConfigError, ["got 0"]),
    (lambda t: _pack(t / "absent", "-o", t / "x.npz"), DataError, ["absent: no such folder"]),
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
