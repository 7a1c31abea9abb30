"""Export a (pruned) network for deployment: TorchScript, ONNX, or a ``torch.export`` program.

The exported model computes the network's eval-mode function, and its batch dimension is dynamic. Sampled
gates (``topk``) are frozen to their top-K first, which leaves that function unchanged; unfrozen ``real``
gates export as they compute, a weighted mix of every input. ONNX needs PyTorch 2.5 or newer and the ``onnx`` extra
(``pip install 'connlearn[onnx]'``: onnx, onnxscript, and onnxruntime to run the result).
"""

from __future__ import annotations

import copy
import importlib.util
import inspect
import io
import os
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

from connlearn.blocks import device_and_dtype
from connlearn.compile import ConnectivityNet, check_net
from connlearn.errors import ConfigError, ConfigTypeError, ShapeError, check_file_path, check_int, check_name
from connlearn.files import replace_whole, temporary_name, write_bytes_atomic

FORMATS = {"torchscript": ".ts", "onnx": ".onnx", "export": ".pt2"}
#: The formats by the suffix of their files (``pt2``: ``export``), which name them too.
_BY_SUFFIX = {suffix.lstrip("."): name for name, suffix in FORMATS.items()}


def format_name(format: str) -> str:
    """The format that ``format`` names: one of :data:`FORMATS` or the suffix of its files (``pt2``, ``.ts``),
    in any case; anything else is returned unchanged, for the caller to refuse."""
    if not isinstance(format, str) or format in FORMATS:
        return format
    lowered = format.lower()
    return lowered if lowered in FORMATS else _BY_SUFFIX.get(lowered.lstrip("."), format)


def onnx_supported() -> bool:
    """Whether this PyTorch has the exporter the ONNX format uses (``torch.onnx.export(dynamo=True)``, 2.5+)."""
    return "dynamo" in inspect.signature(torch.onnx.export).parameters


def example_input(net: ConnectivityNet, batch: int = 2) -> torch.Tensor:
    """A random input batch of the network's image size, ``[batch, in_channels, size, size]``, on its
    device and in its dtype."""
    size = check_net(net).graph().nodes["input"]["image_size"]
    return torch.randn(check_int("batch", batch, minimum=1), net.in_channels, size, size, **device_and_dtype(net))


def onnx_files(path: str | os.PathLike) -> list[Path]:
    """The files an ONNX export to ``path`` wrote: the model, and its weights beside it (``.onnx.data``)
    where the exporter keeps them apart; both must travel together."""
    path = Path(path)
    return [p for p in (path, path.with_name(path.name + ".data")) if p.exists()]


def export(net: ConnectivityNet, path: str | os.PathLike, format: str = "torchscript",
           example: torch.Tensor | None = None) -> Path:
    """Write ``net`` (in eval mode) to ``path`` as ``format`` ('torchscript', 'onnx' or 'export'; the suffix
    of a format's files names it too: 'ts', 'pt2'); returns the path. The input's batch size may vary at
    run time; the input's dtype is the network's (``example``, if given, must match it). ONNX may keep the
    weights in a second file beside ``path`` (``onnx_files`` lists both)."""
    check_net(net)
    format = check_name("export format", format_name(format), {*FORMATS, *_BY_SUFFIX})  # aliases are mapped
    path = check_file_path("path", path, "model" + FORMATS[format])
    named = _BY_SUFFIX.get(path.suffix.lower().lstrip("."))
    if named is not None and named != format:  # a file the suffix promises to be another format
        raise ConfigError(f"{path} has the suffix of format {named!r}, but the format asked for is {format!r}: "
                          f"name the file {path.with_suffix(FORMATS[format]).name}, or ask for {named!r}")
    path.parent.mkdir(parents=True, exist_ok=True)
    model = copy.deepcopy(net).eval()
    if model.stochastic and model.evaluates_top_k():  # fixed to it, the graph holds no sort
        model.freeze()
    example = example_input(model) if example is None else _checked_example(model, example)
    if example.shape[0] == 1:  # a batch of 1 would be traced (and torch.export specialised) as a constant
        example = example.expand(2, *example.shape[1:]).clone()
    batch = torch.export.Dim("batch", min=1)
    if format == "torchscript":
        with warnings.catch_warnings():
            # upstream marks TorchScript deprecated (a DeprecationWarning in 2.11, a FutureWarning later)
            warnings.filterwarnings("ignore", message=r"`torch\.jit\.\w+` is deprecated")
            with torch.no_grad():
                traced = torch.jit.trace(model, example, check_trace=False)
            _write(path, lambda f: torch.jit.save(traced, f))
    elif format == "onnx":
        if not onnx_supported():
            raise ConfigError(f"ONNX export needs PyTorch 2.5 or newer (torch.onnx.export(dynamo=True)); this is "
                              f"torch {torch.__version__}: export as 'torchscript' or 'export' instead")
        missing = [m for m in ("onnx", "onnxscript") if importlib.util.find_spec(m) is None]
        if missing:
            raise ConfigError(f"ONNX export needs {', '.join(missing)}: pip install 'connlearn[onnx]'")
        _write_onnx(model, example, path, batch)
    else:
        program = torch.export.export(model, (example,), dynamic_shapes=({0: batch},))
        _write(path, lambda f: torch.export.save(program, f))
    return path


def _write_onnx(model: ConnectivityNet, example: torch.Tensor, path: Path, batch: torch.export.Dim) -> None:
    """Export to ONNX in a temporary folder beside ``path``, then move the weights (``.onnx.data``, where the
    exporter writes them apart) and the model into place, each whole; a weights file an earlier export left
    beside ``path`` goes when this model holds its own."""
    staging = temporary_name(path)
    try:
        staging.mkdir()
        staged = staging / path.name
        torch.onnx.export(model, (example,), str(staged), dynamo=True, dynamic_shapes=({0: batch},), verbose=False)
        written = onnx_files(staged)
        for file in reversed(written):  # the weights first, then the model that reads them
            replace_whole(file, path.with_name(file.name))
        if len(written) == 1:
            path.with_name(path.name + ".data").unlink(missing_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot write {path}: {exc.strerror or exc}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _write(path: Path, save: Callable[[io.BytesIO], object]) -> None:
    """``save`` the exported model to ``path`` whole or not at all; a file it cannot write is a ConfigError.
    The model is serialised in memory first: torch's zip writer, handed a file that fails (a full disk), throws
    again from its destructor and aborts the process."""
    buffer = io.BytesIO()
    save(buffer)
    try:
        write_bytes_atomic(path, buffer.getbuffer())
    except OSError as exc:
        raise ConfigError(f"cannot write {path}: {exc.strerror or exc}") from None


def _checked_example(net: ConnectivityNet, example: torch.Tensor) -> torch.Tensor:
    """``example`` if the network takes it: a floating ``[B, in_channels, H, W]`` tensor in its dtype."""
    if not isinstance(example, torch.Tensor):
        raise ConfigTypeError(f"example must be a tensor [B, {net.in_channels}, H, W], got {type(example).__name__}")
    if example.dim() != 4 or example.shape[1] != net.in_channels:
        raise ShapeError(f"example must be a batch of images [B, {net.in_channels}, H, W], got {list(example.shape)}")
    wanted = device_and_dtype(net)
    if example.dtype != wanted["dtype"]:
        raise ConfigTypeError(f"example is {example.dtype} but the network's weights are {wanted['dtype']}; "
                              f"give example.to({wanted['dtype']}) (or convert the network)")
    return example
