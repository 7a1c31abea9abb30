"""Checkpoints, written whole and checked where they are loaded, and the lock of a run's folder.

A checkpoint is a ``torch.save`` dict (loaded with ``weights_only=True``) of ``format``, ``version``, ``graph``
(the IR as JSON), ``dtype``, ``model`` (the state dict, with the gate generator), ``environment``
(the versions it was written under) and, from the trainer, the training state. A checkpoint of another
version is refused.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import io
import json
import os
import pickle
import platform
import socket
import subprocess
import threading
import warnings
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from connlearn.errors import CheckpointError, ConfigError
from connlearn.files import open_input, path_of, write_atomic
from connlearn.graph import BranchGraph
from connlearn.net import ConnectivityNet, state_of_branches
from connlearn.prune import PruneReport, prune_dead_blocks

FORMAT, VERSION = "connlearn.checkpoint", 2


def environment() -> dict[str, Any]:
    """What a result depends on besides its settings: versions (and connlearn's commit), platform, torch's
    CPU threads (their number changes a CPU run's bits) and whether its deterministic algorithms were on."""
    import numpy as np

    from connlearn import __version__

    return {"connlearn": __version__, "commit": source_commit(), "torch": str(torch.__version__),
            "cuda": torch.version.cuda, "numpy": np.__version__, "python": platform.python_version(),
            "platform": platform.platform(), "threads": torch.get_num_threads(),
            "deterministic": torch.are_deterministic_algorithms_enabled()}


@functools.cache
def source_commit() -> str | None:
    """The git commit of the checkout connlearn runs from (``+changes`` where its tracked files differ), or
    None for an installed package."""
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return None
    try:
        def git(*args: str) -> str:
            return subprocess.run(["git", "--no-optional-locks", "-C", str(root), *args], capture_output=True,
                                  text=True, timeout=10, check=True).stdout.strip()

        return git("rev-parse", "HEAD") + ("+changes" if git("status", "--porcelain", "--untracked-files=no") else "")
    except (OSError, subprocess.SubprocessError):
        return None


def make_checkpoint(net: ConnectivityNet, **extra: Any) -> dict[str, Any]:
    """The checkpoint dict of ``net`` (its IR and state), with ``extra`` entries."""
    return {"format": FORMAT, "version": VERSION, "graph": net.graph().to_json(),
            "dtype": str(next(net.parameters()).dtype).removeprefix("torch."),
            "model": {k: v.detach().cpu() if torch.is_tensor(v) else v for k, v in net.state_dict().items()},
            "environment": environment(), **extra}


def save_checkpoint(ckpt: dict[str, Any], path: str | os.PathLike) -> Path:
    """``torch.save`` ``ckpt`` to ``path`` whole or not at all. It is serialised in memory first: torch's
    zip writer, given a file that fails (a full disk), fails from inside C++ with nothing to name it."""
    buffer = io.BytesIO()
    torch.save(ckpt, buffer)
    path = path_of(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_atomic(path, lambda f: f.write(buffer.getbuffer()))


def load_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """The checkpoint at ``path``, checked: a missing, damaged, foreign or other version's file, or one
    without a graph, a floating dtype or a state dict, is a CheckpointError naming it."""
    path = path_of(path)
    with open_input(path, "checkpoint", CheckpointError) as file:
        try:
            with zipfile.ZipFile(file) as archive:  # torch.load does not check the bytes of the tensors it reads
                bad = archive.testzip()
            file.seek(0)
            ckpt = torch.load(file, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError:  # a whole archive whose pickle needs more than tensors and plain containers
            raise CheckpointError(f"{path} holds objects other than tensors and was not loaded: connlearn loads "
                                  "checkpoints with weights_only=True, which runs no code; load it by hand only if "
                                  "you trust its source") from None
        except Exception as exc:  # zipfile and torch raise several kinds for truncated or foreign files
            raise CheckpointError(f"{path} is not a readable checkpoint ({type(exc).__name__}: "
                                  f"{str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ''})") from None
    if bad is not None:
        raise CheckpointError(f"{path} is corrupt: its entry {bad!r} fails its checksum")
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a connlearn checkpoint")
    if ckpt.get("version") != VERSION:
        raise CheckpointError(f"{path} is a checkpoint of version {ckpt.get('version')!r}; this connlearn reads "
                              f"version {VERSION}")
    missing = [key for key, kind in (("graph", str), ("dtype", str), ("model", dict))
               if not isinstance(ckpt.get(key), kind)]
    dtype = getattr(torch, str(ckpt.get("dtype")), None)
    if missing or not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise CheckpointError(f"{path} is damaged: " + (f"it has no {' nor '.join(missing)}" if missing else
                                                        f"its dtype {ckpt['dtype']!r} is not a floating type"))
    return ckpt


def net_from_checkpoint(ckpt: dict[str, Any] | str | os.PathLike) -> ConnectivityNet:
    """The network of ``ckpt`` (a dict or a path), on the CPU, with its weights. The weights are checked against
    the network its graph describes: the same names, shapes and kinds of value."""
    ckpt = ckpt if isinstance(ckpt, dict) else load_checkpoint(ckpt)
    with torch.random.fork_rng(devices=[]):  # its weights are loaded over
        net = ConnectivityNet(BranchGraph.from_json(ckpt["graph"])).to(getattr(torch, ckpt["dtype"]))
    branched = ckpt.get("engine") == "reference"  # saved on the per-branch engine connlearn once had
    expected, found = net.state_dict(), state_of_branches(net, ckpt["model"]) if branched else ckpt["model"]
    faults = ([f"{k} is missing" for k in expected if k not in found] +
              [f"{k} is not one of its network's" for k in found if k not in expected] +
              [f"{k} is {_described(found[k])}, its network's {_described(v)}" for k, v in expected.items()
               if k in found and _described(found[k]) != _described(v)])
    if faults:
        raise CheckpointError("the checkpoint's weights do not fit the network its graph describes: " + "; ".join(
            faults[:3]) + (f"; and {len(faults) - 3} more" if len(faults) > 3 else ""))
    net.load_state_dict(found)
    return net


def top1(ckpt: dict[str, Any]) -> float | None:
    """The top-1 of a checkpoint's own weights: what a pruned one recorded, else its log's last epoch."""
    meta = ckpt.get("meta", {})
    return meta["top1"] if "top1" in meta else (ckpt.get("history") or [{}])[-1].get("test_top1")


def save_pruned(ckpt: dict[str, Any], path: str | os.PathLike) -> PruneReport:
    """Write the network of ``ckpt`` with its dead blocks pruned (its gates frozen) to ``path``, with its meta,
    epoch and top-1; returns what the pruning removed."""
    pruned, report = prune_dead_blocks(net_from_checkpoint(ckpt), freeze=True)
    meta = {**ckpt.get("meta", {}), "prune": str(report), "top1": top1(ckpt),
            "params_train": ckpt.get("meta", {}).get("params_train", report.params_before)}
    save_checkpoint(make_checkpoint(pruned, meta=meta, **{k: ckpt[k] for k in ("epoch", "best_top1") if k in ckpt}),
                    path)
    return report


def _described(value: Any) -> str:
    """What must match between a saved value and the network's: a tensor's shape and kind, else its type."""
    if not torch.is_tensor(value):
        return type(value).__name__
    kind = "floating" if value.is_floating_point() else "complex" if value.is_complex() else "integer"
    return f"{kind} {list(value.shape)}"


def architecture(graph: BranchGraph) -> tuple[tuple[str, str], ...]:
    """What must match for weights to transfer: every node and its shape attributes."""
    return tuple((n, json.dumps({k: v for k, v in d.items() if k != "kind"}, sort_keys=True))
                 for n, d in sorted(graph.nodes(data=True)))


_HELD: dict[str, tuple[int, int]] = {}  # the folders this process holds: path -> (lock file, thread)


def _forget_held() -> None:
    """In a forked child (a DataLoader worker): hold nothing, and keep no copy of the lock files open."""
    for fd, _ in _HELD.values():
        with contextlib.suppress(OSError):
            os.close(fd)
    _HELD.clear()


os.register_at_fork(after_in_child=_forget_held)


@contextlib.contextmanager
def folder_lock(folder: str | os.PathLike, what: str = "a run") -> Iterator[None]:
    """Hold ``folder`` while the block runs: another process or thread that asks for it gets a ConfigError
    naming the holder, instead of the two overwriting each other's files. An ``flock`` on ``folder/.lock``,
    released by the system however the process ends; nested holds by one thread are one."""
    key, thread = str(Path(folder).resolve()), threading.get_ident()
    if key in _HELD:
        if _HELD[key][1] != thread:
            raise ConfigError(f"{folder} is in use by another thread of this process; give another folder")
        yield
        return
    path = Path(folder) / ".lock"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except PermissionError:  # another user's folder: flock works on a file open to read
        fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 300, 0).decode("utf-8", "replace").strip() or "another process"
        os.close(fd)
        raise ConfigError(f"{folder} is in use by {holder}: wait for it to end (then the same command resumes) or "
                          "give another folder") from None
    except OSError as exc:  # a file system without flock (some network mounts)
        os.close(fd)
        warnings.warn(f"cannot hold {folder} ({exc.strerror}): nothing stops another process writing there too",
                      stacklevel=3)
        yield
        return
    _HELD[key] = (fd, thread)
    try:
        with contextlib.suppress(OSError):  # who holds it is for messages only
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"process {os.getpid()} on {socket.gethostname()}, running {what}\n".encode(), 0)
        yield
    finally:
        del _HELD[key]
        os.close(fd)
