"""Checkpoints: written atomically, loaded with clear errors, rebuilt into networks from their IR.

A checkpoint is a ``torch.save`` dict (loadable with ``weights_only=True``) holding ``format``,
``version``, ``graph`` (the IR as JSON, with the connectivity at save time), ``model`` (state dict,
including the gate generator), ``environment`` (the versions and settings it was written under, see
:func:`environment`), and, from the trainer, the optimizer, recipe position, RNG states (of every rank under
``torch.distributed``) and the epoch log.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import io
import json
import os
import socket
import subprocess
import sys
import threading
import warnings
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from connlearn.blocks import device_and_dtype
from connlearn.compile import ConnectivityNet, check_net, engine_to_rebuild
from connlearn.errors import (
    CheckpointError,
    ConfigError,
    ConfigTypeError,
    ConnlearnError,
    GraphError,
    StateDictError,
    check_device,
    check_file_path,
    check_name,
    check_path,
    python_number,
    state_dict_mismatch,
)
from connlearn.files import write_atomic
from connlearn.graph import BranchGraph, check_graph

if sys.platform != "win32":
    import fcntl

FORMAT = "connlearn.checkpoint"
VERSION = 1


def save_atomic(obj: Any, path: str | os.PathLike) -> Path:
    """``torch.save`` ``obj`` to ``path`` whole or not at all (:func:`connlearn.files.write_atomic`): a crash
    never leaves a half-written file under ``path``."""
    path = check_file_path("path", path, "model.pt")
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_atomic(path, lambda f: torch.save(obj, f))


_HELD: dict[str, tuple[int, int]] = {}  # the folders this process holds: resolved path -> (lock file, thread)


def _forget_held() -> None:
    """In a forked child (a DataLoader worker): close its copies of the lock files and hold nothing. The
    parent's locks stay (a lock belongs to the open file, which the parent still has open)."""
    for fd, _ in _HELD.values():
        with contextlib.suppress(OSError):
            os.close(fd)
    _HELD.clear()


if sys.platform != "win32":
    os.register_at_fork(after_in_child=_forget_held)


@contextlib.contextmanager
def folder_lock(folder: str | os.PathLike, what: str = "a run") -> Iterator[None]:
    """Hold ``folder`` (that exists) for this process while the block runs (``what`` says for what, to anyone
    refused): another process, or another thread of this one, that asks for it gets a :class:`ConfigError`
    naming the holder, instead of the two overwriting each other's checkpoints and logs. An advisory ``flock``
    on ``folder/.lock``, which the system releases when the process ends however it ends (a kill leaves no
    stale lock); nested holds of one folder by one thread are one hold. On Windows nothing is held; on a file
    system that refuses ``flock`` (some network mounts) nothing is held either, with a warning."""
    folder = Path(folder)
    key, thread = str(folder.resolve()), threading.get_ident()
    if key in _HELD and _HELD[key][1] != thread:
        raise ConfigError(f"{folder} is in use by another thread of this process: two runs in one folder overwrite "
                          "each other's checkpoints and logs; give another output folder")
    if sys.platform == "win32" or key in _HELD:
        yield
        return
    path = folder / ".lock"
    try:
        fd, writable = os.open(path, os.O_RDWR | os.O_CREAT, 0o644), True
    except PermissionError:  # another user's run folder, shared: flock works on a file opened to read
        fd, writable = os.open(path, os.O_RDONLY), False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 300, 0).decode("utf-8", "replace").strip() or "another process"
        os.close(fd)
        raise ConfigError(f"{folder} is in use by {holder}: two processes in one folder overwrite each other's "
                          "checkpoints and logs. Wait for it to end (then the same command resumes), or give "
                          "another output folder") from None
    except OSError as exc:  # a file system without flock: unguarded, and said so
        os.close(fd)
        warnings.warn(f"cannot hold {folder} ({exc.strerror or exc}: its file system refuses flock): nothing stops "
                      "another process from writing in it at the same time; give each run its own folder",
                      stacklevel=3)
        yield
        return
    _HELD[key] = (fd, thread)
    try:
        if writable:
            with contextlib.suppress(OSError):  # who holds it is for messages only: a full disk is no reason to stop
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"process {os.getpid()} on {socket.gethostname()}, running {what} there\n".encode(), 0)
        yield
    finally:
        del _HELD[key]
        os.close(fd)  # releases the lock; the file stays (removing it would race with a process about to lock it)


def environment() -> dict[str, Any]:
    """What a result depends on besides its settings and seed, for a checkpoint or a run's summary: the
    versions of connlearn (and its commit, see :func:`source_commit`), torch (and its CUDA), NumPy and Python,
    the platform, torch's CPU threads (their number changes a CPU run's bits) and whether its deterministic
    algorithms were on."""
    import platform

    import numpy as np

    from connlearn import __version__

    return {"connlearn": __version__, "commit": source_commit(),
            "torch": str(torch.__version__),  # a str of torch's own class: a plain one
            "cuda": torch.version.cuda,
            "numpy": np.__version__, "python": platform.python_version(), "platform": platform.platform(),
            "threads": torch.get_num_threads(), "deterministic": torch.are_deterministic_algorithms_enabled()}


@functools.cache
def source_commit() -> str | None:
    """The git commit of the checkout connlearn runs from (an editable install), ending in ``+changes`` where
    its tracked files differ from it; ``None`` for an installed package, or without git."""
    root = Path(__file__).resolve().parent.parent
    if not (root / ".git").exists():
        return None
    try:
        def git(*args: str) -> str:
            return subprocess.run(["git", "--no-optional-locks", "-C", str(root), *args], capture_output=True,
                                  text=True, timeout=10, check=True).stdout.strip()  # never in a user's way

        commit, changes = git("rev-parse", "HEAD"), git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("+changes" if changes else "")


def make_checkpoint(net: ConnectivityNet, **extra: Any) -> dict[str, Any]:
    """A checkpoint dict of ``net`` (IR + state), plus ``extra`` entries (under names of their own). Every
    entry must load back under ``torch.load(weights_only=True)``: dicts, lists and tuples of tensors, Python's
    own numbers, strings, bools and ``None``, dtypes and devices; anything else is refused here, by name,
    rather than written into a file that could not be read again."""
    check_net(net)
    taken = sorted(set(extra) & {"format", "version", "graph", "engine", "model", "dtype", "environment"})
    if taken:
        raise ConfigError(f"make_checkpoint: {', '.join(taken)} are the checkpoint's own entries; give extra "
                          "entries other names")
    for key, value in extra.items():
        _check_loadable(value, key)
    return {
        "format": FORMAT,
        "version": VERSION,
        "graph": net.graph().to_json(),
        "engine": net.engine,
        "dtype": str(device_and_dtype(net).get("dtype", torch.float32)).removeprefix("torch."),
        "model": {k: v.detach().cpu() if torch.is_tensor(v) else v for k, v in net.state_dict().items()},
        "environment": environment(),
        **extra,
    }


_PLAIN = (str, int, float, bool, type(None))


def plain_facts(value: Any, name: str) -> Any:
    """``value``, JSON-like facts (dicts with string keys, lists, tuples, strings, numbers, bools, ``None``),
    with NumPy's and other numbers made Python's own ints and floats, which a checkpoint loads back; anything
    else is a :class:`ConfigTypeError` naming where it is. Dicts and lists are changed in place (whoever holds
    them sees the same objects), tuples made anew."""
    if type(value) in _PLAIN:
        return value
    if isinstance(value, dict):
        for key in value:
            if type(key) is not str:
                raise ConfigTypeError(f"{name}'s keys must be strings, got {key!r} ({type(key).__name__})")
        if type(value) is not dict:  # a defaultdict or a user's dict class: a checkpoint loads only dict
            value = dict(value)
        for key, item in value.items():
            value[key] = plain_facts(item, f"{name}[{key!r}]")
        return value
    if type(value) is list:
        value[:] = [plain_facts(item, f"{name}[{i}]") for i, item in enumerate(value)]
        return value
    if type(value) is tuple:
        return tuple(plain_facts(item, f"{name}[{i}]") for i, item in enumerate(value))
    if type(number := python_number(value)) in _PLAIN:
        return number
    hint = "; give the path as a string" if isinstance(value, os.PathLike) else ""
    raise ConfigTypeError(f"{name} must be JSON-able facts (strings, numbers, bools, None, lists and dicts of "
                          f"them), got {value!r} ({type(value).__name__}){hint}")


def _check_loadable(value: Any, where: str) -> None:
    """A clear error unless ``value`` loads back under ``torch.load(weights_only=True)``."""
    if type(value) in _PLAIN or isinstance(value, (torch.Tensor, torch.dtype, torch.device)):
        return
    if type(value) in (dict, collections.OrderedDict):  # subclasses (defaultdict, ...) do not load back
        for key, item in value.items():
            _check_loadable(key, f"{where}'s key {key!r}")
            _check_loadable(item, f"{where}[{key!r}]")
        return
    if type(value) in (list, tuple):
        for i, item in enumerate(value):
            _check_loadable(item, f"{where}[{i}]")
        return
    buffer = io.BytesIO()  # anything else: as torch.load will see it
    try:
        torch.save(value, buffer)
        buffer.seek(0)
        torch.load(buffer, weights_only=True)
    except Exception:
        raise ConfigTypeError(f"make_checkpoint: {where} is {value!r} ({type(value).__name__}), which a checkpoint "
                              "cannot load back (torch.load(weights_only=True)); give Python's own numbers, "
                              "strings, bools, None, tensors, and lists and dicts of them") from None


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load and check a checkpoint; a missing, truncated or foreign file is a :class:`CheckpointError`."""
    path = check_path("path", path)
    if map_location is not None and not isinstance(map_location, dict) and not callable(map_location):
        map_location = check_device(map_location, "map_location")  # a device, its name or a CUDA index
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {path}")
    with path.open("rb") as f:
        head = f.read(4)
    if head[:1] in (b"{", b"["):
        raise CheckpointError(f"{path} is a JSON file, not a checkpoint (a .pt file such as a run's last.pt)")
    exported = _exported_as(path) if head[:2] == b"PK" else None
    if exported is not None:
        raise CheckpointError(f"{path} is a network exported as {exported}, which keeps no graph to rebuild or "
                              "prune; give the checkpoint it was exported from (a run's last.pt or pruned.pt)")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # torch raises several types for truncated or foreign files
        text = str(exc).strip()
        if head[:2] != b"PK":  # torch.save writes zip archives
            raise CheckpointError(f"{path} is not a readable checkpoint (truncated or corrupt?): not a zip archive "
                                  "as torch.save writes") from None
        if "Weights only load failed" in text:  # a pickled object, e.g. torch.save(net): never unpickled here
            raise CheckpointError(f"{path} holds pickled Python objects, not a connlearn checkpoint (write one with "
                                  "connlearn.checkpoint.make_checkpoint and save_atomic)") from None
        reason = text.splitlines()[0] if text else type(exc).__name__
        raise CheckpointError(f"{path} is not a readable checkpoint (truncated or corrupt?): {reason}") from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a connlearn checkpoint")
    _check_crc(path)
    _check_contents(ckpt, str(path))
    if not isinstance(ckpt.get("version"), int) or ckpt["version"] != VERSION:
        raise CheckpointError(f"{path} has checkpoint version {ckpt.get('version')!r}; this connlearn reads {VERSION}")
    return ckpt


def _exported_as(path: Path) -> str | None:
    """'TorchScript (torch.jit.load)' or 'torch.export (torch.export.load)' for a zip archive of either, else
    ``None``."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = {n.split("/", 2)[1] for n in archive.namelist() if n.count("/") >= 1}
    except (OSError, zipfile.BadZipFile):
        return None
    if {"code", "constants.pkl"} <= names:
        return "TorchScript (load it with torch.jit.load)"
    if "archive_format" in names and "data.pkl" not in names:
        return "torch.export (load it with torch.export.load)"
    return None


def net_from_checkpoint(ckpt: dict[str, Any] | str | os.PathLike, engine: str | None = None) -> ConnectivityNet:
    """Rebuild the network saved in ``ckpt`` (a dict or a path), on the CPU, with its weights; ``engine``
    ('fused', 'reference' or 'auto') moves it to another engine than the one it was saved from."""
    if not isinstance(ckpt, dict):
        ckpt = load_checkpoint(ckpt)  # checks its contents
    else:
        _check_contents(ckpt, "the checkpoint dict")
    saved = ckpt.get("engine", "fused")
    try:
        graph = BranchGraph.from_json(ckpt["graph"])
        net = ConnectivityNet(graph, engine=engine_to_rebuild(saved))
        dtype = getattr(torch, str(ckpt.get("dtype", "float32")), None)  # checkpoints before it: float32
        if isinstance(dtype, torch.dtype) and dtype.is_floating_point:
            net = net.to(dtype)  # before loading, so that no weight is rounded on the way
        net.load_state_dict(ckpt["model"])
    except StateDictError as exc:  # its advice (build the network it came from) is what failed here
        raise CheckpointError(f"the checkpoint's weights do not fit its network: {exc.gist}") from None
    except ConnlearnError:
        raise
    except (KeyError, RuntimeError, TypeError) as exc:
        raise CheckpointError(f"the checkpoint's weights do not fit its network: {state_dict_mismatch(exc)}") from None
    if engine is not None and engine != net.engine:
        check_name("engine", engine, ("fused", "reference", "auto"))
        if engine != "auto":
            net = net.to_engine(engine)
        elif net.engine == "reference":  # auto: fused where every module's blocks share kind and parameters
            with contextlib.suppress(ConfigError):
                net = net.to_engine("fused")
    return net


def _check_crc(path: Path) -> None:
    """torch.load reads the tensors' bytes without checking them: a flipped byte would load as a wrong
    weight (a NaN, say). The zip archive's CRC-32 of every entry catches it."""
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError) as exc:
        raise CheckpointError(f"{path} is not a readable checkpoint (truncated or corrupt?): {exc}") from None
    if bad is not None:
        raise CheckpointError(f"{path} is corrupt: the bytes of its entry {bad!r} fail their checksum")


def _check_contents(ckpt: dict[str, Any], where: str) -> None:
    """The network's IR (a JSON string) and state (a dict) must be there."""
    for key, kind in (("graph", str), ("model", dict)):
        if not isinstance(ckpt.get(key), kind):
            found = "missing" if key not in ckpt else f"a {type(ckpt[key]).__name__}"
            raise CheckpointError(f"{where} is a damaged connlearn checkpoint: its {key!r} is {found}")
    try:
        BranchGraph.from_json(ckpt["graph"])
    except GraphError as exc:
        raise CheckpointError(f"{where}: its graph cannot be read: {exc}") from None


def architecture(graph: BranchGraph) -> tuple:
    """What must match for weights to transfer: every node's shape attributes (not gate values), as their
    JSON (a tuple given to a topology and the list its saved graph holds are the same)."""
    nodes = []
    for n, d in sorted(check_graph(graph).nodes(data=True)):
        keep = {k: v for k, v in d.items() if k not in ("kind",)}
        nodes.append((n, json.dumps(keep, sort_keys=True, default=repr)))
    return tuple(nodes)
