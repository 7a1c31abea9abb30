"""Checkpoints: written atomically, loaded with clear errors, rebuilt into networks from their IR.

A checkpoint is a ``torch.save`` dict (loadable with ``weights_only=True``) holding ``format``,
``version``, ``graph`` (the IR as JSON, with the connectivity at save time), ``model`` (state dict,
including the gate generator), and, from the trainer, the optimizer, recipe position, RNG states and the
epoch log.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from connlearn.compile import ConnectivityNet
from connlearn.errors import CheckpointError, ConnlearnError
from connlearn.graph import BranchGraph

FORMAT = "connlearn.checkpoint"
VERSION = 1


def save_atomic(obj: Any, path: str | os.PathLike) -> Path:
    """``torch.save`` to a temporary file in the same folder, fsync, then ``os.replace``: a crash never
    leaves a half-written file under ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def make_checkpoint(net: ConnectivityNet, **extra: Any) -> dict[str, Any]:
    """A checkpoint dict of ``net`` (IR + state), plus ``extra`` entries."""
    return {
        "format": FORMAT,
        "version": VERSION,
        "graph": net.graph().to_json(),
        "engine": net.engine,
        "model": {k: v.detach().cpu() if torch.is_tensor(v) else v for k, v in net.state_dict().items()},
        **extra,
    }


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load and check a checkpoint; a missing, truncated or foreign file is a :class:`CheckpointError`."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {path}")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # torch raises several types for truncated or foreign files
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"{path} is not a readable checkpoint (truncated or corrupt?): {reason}") from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a connlearn checkpoint")
    if ckpt.get("version") != VERSION:
        raise CheckpointError(f"{path} has checkpoint version {ckpt.get('version')!r}; this connlearn reads {VERSION}")
    return ckpt


def net_from_checkpoint(ckpt: dict[str, Any] | str | os.PathLike, engine: str | None = None) -> ConnectivityNet:
    """Rebuild the network saved in ``ckpt`` (a dict or a path), on the CPU, with its weights."""
    if not isinstance(ckpt, dict):
        ckpt = load_checkpoint(ckpt)
    try:
        graph = BranchGraph.from_json(ckpt["graph"])
        saved = ckpt.get("engine", "fused")
        net = ConnectivityNet(graph, engine=engine or ("fused" if saved == "single-stream" else saved))
        net.load_state_dict(ckpt["model"])
    except ConnlearnError:
        raise
    except (KeyError, RuntimeError) as exc:
        raise CheckpointError(f"the checkpoint's weights do not fit its network: {str(exc).splitlines()[0]}") from None
    return net


def architecture(graph: BranchGraph) -> tuple:
    """What must match for weights to transfer: every node's shape attributes (not gate values)."""
    nodes = []
    for n, d in sorted(graph.nodes(data=True)):
        keep = {k: v for k, v in d.items() if k not in ("kind",)}
        nodes.append((n, repr(sorted(keep.items()))))
    return tuple(nodes)
