"""Export a (pruned) network for deployment: TorchScript, ONNX or a ``torch.export`` program.

The exported model computes the network's eval-mode function, with a dynamic batch dimension. Sampled gates
are frozen to their top-K first, which keeps that function. ONNX needs the ``onnx`` extra
(``pip install 'connlearn[onnx]'``).
"""

from __future__ import annotations

import copy
import io
import os
import shutil
import tempfile
import warnings
from pathlib import Path

import torch

from connlearn.errors import check_choice
from connlearn.files import check_target, path_of, write_atomic
from connlearn.net import ConnectivityNet

FORMATS = {"torchscript": ".ts", "onnx": ".onnx", "export": ".pt2"}


def export(net: ConnectivityNet, path: str | os.PathLike, format: str = "torchscript") -> list[Path]:
    """Write ``net`` in eval mode to ``path`` as ``format`` (``torchscript``, ``onnx`` or ``export``); returns the
    files written (ONNX keeps large weights in ``<path>.data`` beside the model: keep them together)."""
    check_choice("export format", format, FORMATS)
    path = path_of(path)
    for target in (path, path.with_name(path.name + ".data")) if format == "onnx" else (path,):
        check_target(target)
    path.parent.mkdir(parents=True, exist_ok=True)
    model = copy.deepcopy(net).eval()
    if not model.fixed_connectivity and not model.weighted:  # fixed to it, the graph holds no sort
        model.freeze()
    param = next(model.parameters())  # a random batch of 2 of its input, on its device and in its dtype
    example = torch.randn(2, model.in_channels, *model.input_size, device=param.device, dtype=param.dtype)
    batch = torch.export.Dim("batch", min=1)
    buffer = io.BytesIO()  # serialised in memory first: torch's writers abort on a file that fails
    if format == "torchscript":
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"`torch\.jit\.\w+` is deprecated")
            with torch.no_grad():
                torch.jit.save(torch.jit.trace(model, example, check_trace=False), buffer)
    elif format == "export":
        torch.export.save(torch.export.export(model, (example,), dynamic_shapes=({0: batch},)), buffer)
    else:
        with tempfile.TemporaryDirectory(dir=path.parent) as staging:
            staged = Path(staging) / path.name
            torch.onnx.export(model, (example,), str(staged), dynamo=True, dynamic_shapes=({0: batch},), verbose=False)
            files = [p for p in (staged, staged.with_name(staged.name + ".data")) if p.exists()]
            for file in reversed(files):  # the weights first, then the model that reads them
                with open(file, "rb") as staged_file:
                    write_atomic(path.with_name(file.name), lambda f: shutil.copyfileobj(staged_file, f))
            if len(files) == 1:
                path.with_name(path.name + ".data").unlink(missing_ok=True)
            return [path.with_name(f.name) for f in files]
    return [write_atomic(path, lambda f: f.write(buffer.getbuffer()))]
