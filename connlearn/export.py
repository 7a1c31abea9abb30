"""Export a (pruned) network for deployment: TorchScript, ONNX, or a ``torch.export`` program.

The exported model computes the network's eval-mode function: the connectivity is fixed (top-K for
learnable gates) and the batch dimension is dynamic. ONNX needs PyTorch 2.5 or newer and the ``onnx`` extra
(``pip install 'connlearn[onnx]'``: onnx, onnxscript, and onnxruntime to run the result).
"""

from __future__ import annotations

import copy
import importlib.util
import inspect
import os
import warnings
from pathlib import Path

import torch

from connlearn.compile import ConnectivityNet
from connlearn.errors import ConfigError, unknown_name

FORMATS = {"torchscript": ".ts", "onnx": ".onnx", "export": ".pt2"}


def onnx_supported() -> bool:
    """Whether this PyTorch has the exporter the ONNX format uses (``torch.onnx.export(dynamo=True)``, 2.5+)."""
    return "dynamo" in inspect.signature(torch.onnx.export).parameters


def example_input(net: ConnectivityNet, batch: int = 2) -> torch.Tensor:
    """A random input batch of the network's image size, ``[batch, in_channels, size, size]``."""
    size = net.graph().nodes["input"]["image_size"]
    device = next(net.parameters()).device
    return torch.randn(batch, net.in_channels, size, size, device=device)


def export(net: ConnectivityNet, path: str | os.PathLike, format: str = "torchscript",
           example: torch.Tensor | None = None) -> Path:
    """Write ``net`` (in eval mode) to ``path`` as ``format`` ('torchscript', 'onnx' or 'export');
    returns the path. The input's batch size may vary at run time."""
    if format not in FORMATS:
        raise unknown_name("export format", format, FORMATS)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    model = copy.deepcopy(net).eval()
    if model.stochastic and _evaluates_its_top_k(model):  # fixed to it, the graph holds no sort
        model.freeze()
    example = example_input(model) if example is None else example
    batch = torch.export.Dim("batch", min=1)
    if format == "torchscript":
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=FutureWarning)  # upstream marks TorchScript deprecated
            with torch.no_grad():
                traced = torch.jit.trace(model, example, check_trace=False)
            traced.save(str(path))
    elif format == "onnx":
        if not onnx_supported():
            raise ConfigError(f"ONNX export needs PyTorch 2.5 or newer (torch.onnx.export(dynamo=True)); this is "
                              f"torch {torch.__version__}: export as 'torchscript' or 'export' instead")
        missing = [m for m in ("onnx", "onnxscript") if importlib.util.find_spec(m) is None]
        if missing:
            raise ConfigError(f"ONNX export needs {', '.join(missing)}: pip install 'connlearn[onnx]'")
        torch.onnx.export(model, (example,), str(path), dynamo=True, dynamic_shapes=({0: batch},),
                          verbose=False)
    else:
        program = torch.export.export(model, (example,), dynamic_shapes=({0: batch},))
        torch.export.save(program, str(path))
    return path


def _evaluates_its_top_k(net: ConnectivityNet) -> bool:
    """Whether every gate's evaluation matrix is its binary top-K (``active()``), as for ``topk`` and its
    subclasses: then ``freeze()`` leaves the evaluation function unchanged."""
    with torch.no_grad():
        return all(torch.equal(g.matrix(None).float(), g.active().float()) for _, g in net.gates())
