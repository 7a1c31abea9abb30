"""Exported models give the same outputs as the pruned net they came from."""

import importlib.util
import re

import pytest
import torch
from conftest import tiny

import connlearn
from connlearn.errors import ConfigError, ConfigTypeError, ShapeError, UnknownNameError
from connlearn.export import export, format_name, onnx_supported
from connlearn.prune import prune_dead_blocks


@pytest.fixture(scope="module")
def pruned():
    net = connlearn.build(**tiny(gate="random", K=1, M=6))
    return prune_dead_blocks(net)[0].eval()


def test_torchscript_export_gives_the_same_outputs(pruned, tmp_path):
    path = export(pruned, tmp_path / "net.ts", "torchscript")
    loaded = torch.jit.load(str(path))
    x = torch.randn(5, 3, 32, 32)
    torch.testing.assert_close(loaded(x), pruned(x), atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_torch_export_program_gives_the_same_outputs(pruned, tmp_path):
    path = export(pruned, tmp_path / "net.pt2", "export")
    program = torch.export.load(str(path))
    x = torch.randn(3, 3, 32, 32)
    torch.testing.assert_close(program.module()(x), pruned(x), atol=1e-5, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("onnx", "onnxscript", "onnxruntime")),
    reason="the onnx extra (onnx, onnxscript, onnxruntime) is not installed",
)
@pytest.mark.skipif(not onnx_supported(), reason="ONNX export needs PyTorch 2.5 or newer")
def test_onnx_export_gives_the_same_outputs(pruned, tmp_path):
    import onnxruntime

    path = export(pruned, tmp_path / "net.onnx", "onnx")
    session = onnxruntime.InferenceSession(str(path))
    x = torch.randn(4, 3, 32, 32)
    out = session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]
    torch.testing.assert_close(torch.from_numpy(out), pruned(x), atol=1e-4, rtol=1e-4)


def test_onnx_export_on_a_pytorch_without_its_exporter_names_the_version(pruned, tmp_path, monkeypatch):
    def old_export(model, args, f, verbose=False, dynamic_axes=None):  # the signature before 2.5
        raise AssertionError("not called")

    monkeypatch.setattr(torch.onnx, "export", old_export)
    with pytest.raises(ConfigError, match=r"PyTorch 2\.5 or newer.*'torchscript' or 'export'"):
        export(pruned, tmp_path / "net.onnx", "onnx")
    assert not (tmp_path / "net.onnx").exists()


def test_an_unfrozen_topk_net_exports_its_top_k(tmp_path):
    net = connlearn.build(**tiny(seed=2)).eval()
    with torch.no_grad():
        for _, gate in net.gates():
            gate.real.fill_(1.0)  # every gate tied: the top-K comes from the tie order
    loaded = torch.jit.load(str(export(net, tmp_path / "net.ts", "torchscript")))
    x = torch.randn(3, 3, 32, 32)
    torch.testing.assert_close(loaded(x), net(x), atol=1e-5, rtol=1e-5)
    assert all(g.tie_order.dtype == torch.int64 for _, g in net.gates())  # the export left the net as it was


@pytest.mark.filterwarnings(r"ignore:`torch\.jit\.\w+` is deprecated")
@pytest.mark.parametrize("engine", ["fused", "reference"])
def test_torch_jit_trace_records_an_unfrozen_topk_net_in_eval_mode(engine):
    net = connlearn.build(**tiny(seed=2), engine=engine).eval()
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        traced = torch.jit.trace(net, (x,))
        torch.testing.assert_close(traced(x), net(x), atol=1e-5, rtol=1e-5)


def test_unknown_format(pruned, tmp_path):
    with pytest.raises(UnknownNameError, match="did you mean 'onnx'"):
        export(pruned, tmp_path / "x", "onx")


@pytest.mark.parametrize(("given", "name"), [("pt2", "export"), (".PT2", "export"), ("ts", "torchscript"),
                                             ("onnx", "onnx"), ("export", "export"), ("TorchScript", "torchscript"),
                                             ("EXPORT", "export"), ("pt", "pt")])
def test_a_format_is_named_by_its_files_suffix_too(given, name):
    assert format_name(given) == name  # an unknown name is left to the caller to refuse


def _onnx_ready():
    return onnx_supported() and all(importlib.util.find_spec(m) for m in ("onnx", "onnxscript", "onnxruntime"))


@pytest.fixture(scope="module")
def reference():
    return prune_dead_blocks(connlearn.build(**tiny(gate="random", K=1, M=6), engine="reference"))[0].eval()


@pytest.mark.parametrize("form", ["torchscript", pytest.param("export", marks=pytest.mark.slow),
                                  pytest.param("onnx", marks=[pytest.mark.slow, pytest.mark.skipif(
                                      not _onnx_ready(), reason="the onnx extra is not installed")])])
def test_the_reference_engine_exports_with_a_free_batch_size(reference, tmp_path, form):
    path = export(reference, tmp_path / f"net.{form}", form)
    x = torch.randn(5, 3, 32, 32)  # the example had 2
    if form == "onnx":
        import onnxruntime

        session = onnxruntime.InferenceSession(str(path))
        assert session.get_inputs()[0].shape[0] == "batch"
        out = torch.from_numpy(session.run(None, {session.get_inputs()[0].name: x.numpy()})[0])
    else:
        out = (torch.jit.load(str(path)) if form == "torchscript" else torch.export.load(str(path)).module())(x)
    torch.testing.assert_close(out, reference(x), atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_an_example_batch_of_one_does_not_fix_the_batch_size(pruned, tmp_path):
    path = export(pruned, tmp_path / "net.pt2", "export", example=torch.randn(1, 3, 32, 32))
    x = torch.randn(3, 3, 32, 32)
    torch.testing.assert_close(torch.export.load(str(path)).module()(x), pruned(x), atol=1e-5, rtol=1e-5)


def test_a_float64_net_exports_in_float64(pruned, tmp_path):
    net = pruned.double()
    try:
        loaded = torch.jit.load(str(export(net, tmp_path / "net.ts")))
        x = torch.randn(3, 3, 32, 32, dtype=torch.float64)
        torch.testing.assert_close(loaded(x), net(x))
    finally:
        pruned.float()


def test_bad_examples_targets_and_formats_are_named(pruned, tmp_path):
    with pytest.raises(ShapeError, match=r"example must be a batch of images \[B, 3, H, W\], got \[2, 1, 32, 32\]"):
        export(pruned, tmp_path / "net.ts", example=torch.randn(2, 1, 32, 32))
    with pytest.raises(ConfigTypeError, match=r"example is torch.float64 but the network's weights are torch.float32"):
        export(pruned, tmp_path / "net.ts", example=torch.randn(2, 3, 32, 32, dtype=torch.float64))
    with pytest.raises(ConfigError, match="is a folder; give the file to write"):
        export(pruned, tmp_path)
    with pytest.raises(ConfigTypeError, match=r"export format must be a name \(a string\), got None \(NoneType\); "
                                              "known export formats: export, onnx, pt2, torchscript, ts"):
        export(pruned, tmp_path / "x", None)
    with pytest.raises(ConfigTypeError, match="net must be a connlearn ConnectivityNet"):
        export(torch.nn.Linear(2, 2), tmp_path / "x.ts")


def test_a_file_named_for_another_format_is_refused(tmp_path):
    net = connlearn.build(**tiny(gate="random"))
    with pytest.raises(ConfigError, match=r"x\.onnx has the suffix of format 'onnx', but the format asked for is "
                                          r"'torchscript': name the file x\.ts, or ask for 'onnx'"):
        export(net, tmp_path / "x.onnx", format="ts")
    assert not (tmp_path / "x.onnx").exists()


@pytest.mark.parametrize("name, said", [("net.ts", r"TorchScript \(load it with torch\.jit\.load\)"),
                                        ("net.pt2", r"torch\.export \(load it with torch\.export\.load\)")])
def test_an_exported_file_given_as_a_checkpoint_is_named_as_what_it_is(pruned, tmp_path, name, said):
    from connlearn.checkpoint import load_checkpoint
    from connlearn.errors import CheckpointError

    path = export(pruned, tmp_path / name, "torchscript" if name.endswith(".ts") else "export")
    with pytest.raises(CheckpointError, match=rf"{re.escape(name)} is a network exported as {said}.*the checkpoint "
                                              r"it was exported from"):
        load_checkpoint(path)


@pytest.mark.parametrize("wrap, attr", [(torch.optim.swa_utils.AveragedModel, "net.module"),
                                        (torch.compile, "net._orig_mod")])
def test_a_wrapped_network_is_refused_naming_the_network_inside(pruned, tmp_path, wrap, attr):
    with pytest.raises(ConfigTypeError, match=f"it wraps one: pass {attr.replace('.', '[.]')}$"):
        export(wrap(pruned), tmp_path / "x.ts")
    with pytest.raises(ConfigTypeError, match=f"it wraps one: pass {attr.replace('.', '[.]')}$"):
        prune_dead_blocks(wrap(pruned))


@pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in ("onnx", "onnxscript")) or not onnx_supported(),
                    reason="ONNX export needs PyTorch 2.5 or newer and the onnx extra")
def test_an_onnx_file_that_cannot_be_written_is_named(pruned, tmp_path, monkeypatch):
    def unwritable(model, args, f, dynamo=False, **kw):
        raise FileNotFoundError(2, "No such file or directory", str(tmp_path / ".net.onnx.data.tmp"))

    monkeypatch.setattr(torch.onnx, "export", unwritable)
    with pytest.raises(ConfigError, match=r"cannot write .*net\.onnx: No such file or directory$"):
        export(pruned, tmp_path / "net.onnx", "onnx")
