"""The errors connlearn raises for bad input.

Every error is a :class:`ConnlearnError`. Errors of bad input are also a ``ValueError`` or ``TypeError``,
so that code written against the builtin exceptions keeps working; :class:`StateDictError`
(``load_state_dict`` of another network's state) is a ``ValueError`` and a ``RuntimeError``, as torch's
error was, and :class:`CheckpointWriteError` (a full disk or an I/O error while saving) a ``ValueError``
and an ``OSError``, as the failed write was. Two are ``RuntimeError`` only: :class:`BlockError` (a block
kind that fails in its own forward) and :class:`DivergenceError` (training left a weight infinite or NaN).
Messages name the bad value, what is allowed and, for names, the closest valid ones.
"""

from __future__ import annotations

import difflib
import math
import numbers
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from connlearn.files import expand_home


class ConnlearnError(Exception):
    """Base class of every error raised by connlearn for bad input, files or state."""


class ConfigError(ConnlearnError, ValueError):
    """A configuration value is out of its allowed range."""


class ConfigTypeError(ConnlearnError, TypeError):
    """A configuration value has the wrong type."""


class UnknownNameError(ConnlearnError, ValueError):
    """A registry lookup (block, topology, gate kind, preset, ...) found no such name."""


class GraphError(ConnlearnError, ValueError):
    """A BranchGraph is not a valid network description."""


class ShapeError(ConnlearnError, ValueError):
    """A tensor given to a network has the wrong rank, channels or size."""


class BlockError(ConnlearnError, RuntimeError):
    """A block kind failed in its own forward: it does not follow the block protocol, or has a fault."""


class CheckpointError(ConnlearnError, ValueError):
    """A checkpoint file is missing, truncated, foreign or of another architecture."""


class CheckpointWriteError(CheckpointError, OSError):
    """A checkpoint could not be written (a full disk, a quota, an I/O error): its message says why and what
    the folder still holds; ``errno`` is the system's and ``filename`` the file that failed. An ``OSError``
    too, as the failed write was."""

    def __init__(self, message: str, errno: int | None = None, filename: str | None = None) -> None:
        super().__init__(message)
        self.errno, self.strerror, self.filename = errno, message, filename

    def __str__(self) -> str:
        return str(self.args[0])

    def __reduce__(self) -> tuple[Any, ...]:  # pickles whole (across processes, as DDP's errors travel)
        return type(self), (self.args[0], self.errno, self.filename)


class StateDictError(CheckpointError, RuntimeError):
    """``load_state_dict`` was given the state of another network (other shapes, missing or unexpected keys):
    a :class:`CheckpointError`, and a ``RuntimeError`` as torch's error was. ``gist``: the keys it names."""

    def __init__(self, message: str, gist: str = "") -> None:
        super().__init__(message)
        self.gist = gist


def state_dict_mismatch(exc: BaseException) -> str:
    """The gist of a ``load_state_dict`` error: its lines that name keys (each cut to 200 characters), or
    else its first line of detail, not its heading."""
    lines = [line.strip().rstrip(".") for line in str(exc).strip().splitlines() if line.strip()]
    keys = [line for line in lines[1:] if line.startswith(("Missing", "Unexpected"))]
    sizes = [line for line in lines[1:] if line.startswith("size mismatch")]
    if sizes:
        keys.append(sizes[0] + (f" (and {len(sizes) - 1} more)" if len(sizes) > 1 else ""))
    picked = keys or lines[1:2] or lines[:1]  # another fault: torch's first line of detail, else its heading
    named = [line if len(line) <= 200 else line[:197] + "..." for line in picked]
    return "; ".join(named) if named else type(exc).__name__


class DivergenceError(ConnlearnError, RuntimeError):
    """Training made a weight infinite or NaN (a learning rate too high for the network, or float16 without
    a gradient scaler): the epoch that did it is not logged or saved."""


class DataError(ConnlearnError, ValueError):
    """A dataset file is missing, corrupt or of an unknown format."""


def closest(name: str, known: Iterable[str], n: int = 3) -> list[str]:
    """The known names closest to ``name`` (best first), for 'did you mean' hints."""
    known = list(known)
    lowered = {k.lower(): k for k in known}
    hits = difflib.get_close_matches(str(name).lower(), list(lowered), n=n, cutoff=0.5)
    return [lowered[h] for h in hits]


def plural(noun: str) -> str:
    """``noun`` (its last word) in the plural: topology -> topologies, gate kind -> gate kinds."""
    if noun.endswith("y") and noun[-2:-1] not in ("a", "e", "o", "u", ""):
        return noun[:-1] + "ies"
    return noun + ("es" if noun.endswith(("s", "x", "ch", "sh")) else "s")


def unknown_name(what: str, name: object, known: Iterable[str]) -> UnknownNameError:
    """An :class:`UnknownNameError` that lists the known names and the closest match."""
    known = sorted(known)
    hint = closest(str(name), known)
    msg = f"unknown {what} {name!r}; known {plural(what)}: {', '.join(known) or '(none)'}"
    if hint:
        msg += f"; did you mean {hint[0]!r}?"
    return UnknownNameError(msg)


def check_name(what: str, name: object, known: Iterable[str]) -> str:
    """``name`` if it is one of the ``known`` names; else an :class:`UnknownNameError` listing them with the
    closest, or a :class:`ConfigTypeError` for a value that is not a string at all (a list, a number)."""
    known = list(known)
    if isinstance(name, str) and name in known:
        return name
    if not isinstance(name, str):
        raise ConfigTypeError(f"{what} must be a name (a string), got {name!r} ({type(name).__name__}); "
                              f"known {plural(what)}: {', '.join(sorted(known)) or '(none)'}")
    raise unknown_name(what, name, known)


def check_int(name: str, value: object, *, minimum: int | None = None, maximum: int | None = None) -> int:
    """Return ``value`` as an int, or raise a clear error if it is not an integer in [minimum, maximum]."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ConfigTypeError(f"{name} must be an integer, got {value!r} ({type(value).__name__})")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ConfigError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ConfigError(f"{name} must be <= {maximum}, got {value}")
    return value


def check_bool(name: str, value: object) -> bool:
    """``value`` if it is a bool, else a :class:`ConfigTypeError`: a string such as ``"no"`` would otherwise
    count as true."""
    if isinstance(value, np.bool_):
        return bool(value)  # NumPy's bool, e.g. from an array's comparison
    if not isinstance(value, bool):
        raise ConfigTypeError(f"{name} must be True or False, got {value!r} ({type(value).__name__})")
    return value


def python_number(value: Any) -> Any:
    """NumPy's (or another) bool, integer or real number as Python's own ``bool``, ``int`` or ``float``, which
    a checkpoint loads back (``np.logspace`` gives ``np.float64``); anything else as it is."""
    if type(value) in (bool, int, float):
        return value
    if isinstance(value, np.bool_):  # not a numbers.Integral
        return bool(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    return value


def check_float(name: str, value: object, *, minimum: float | None = None, maximum: float | None = None,
                finite: bool = False) -> float:
    """Return ``value`` as a float, or raise a clear error if it is not a number in [minimum, maximum] (and,
    with ``finite``, not infinite)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ConfigTypeError(f"{name} must be a number, got {value!r} ({type(value).__name__})")
    value = float(value)
    if value != value:
        raise ConfigError(f"{name} must be a number, got NaN")
    if minimum is not None and value < minimum:
        raise ConfigError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ConfigError(f"{name} must be <= {maximum}, got {value}")
    if finite and math.isinf(value):
        raise ConfigError(f"{name} must be finite, got {value}")
    return value


#: The sampling temperatures allowed (``check_temperature``): within them the Gumbel keys of a draw keep
#: their order in float32, from nearly the top-K (1e-4) to nearly uniform draws (1e4).
TEMPERATURE_RANGE = (1e-4, 1e4)


def check_temperature(name: str, value: object) -> float:
    """``value`` as a float, or a clear error unless it is a sampling temperature in :data:`TEMPERATURE_RANGE`."""
    low, high = TEMPERATURE_RANGE
    if value is None:
        raise ConfigError(f"{name} must be a number in [{low:g}, {high:g}], got None")
    return check_float(name, value, minimum=low, maximum=high)


def check_device(value: object, name: str = "device") -> Any:
    """``value`` (a ``torch.device``, a string such as ``"cuda:1"``, a CUDA index, or ``None`` for CUDA where
    PyTorch sees a GPU, else the CPU) as a ``torch.device``; a clear error for anything else, and for a CUDA
    device that this machine does not have."""
    import torch

    if value is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if isinstance(value, bool) or not isinstance(value, (str, numbers.Integral, torch.device)):
        raise ConfigTypeError(f"{name} must be a device name such as 'cpu', 'cuda' or 'cuda:1', got {value!r} "
                              f"({type(value).__name__})")
    try:
        device = torch.device(int(value) if isinstance(value, numbers.Integral) else value)
    except (RuntimeError, TypeError, ValueError) as exc:
        kind = str(value).partition(":")[0]
        kinds = ["cuda"] if kind.lower() == "gpu" else closest(kind, ("cpu", "cuda", "mps", "xpu", "meta"), n=1)
        guess = str(value).replace(kind, kinds[0], 1) if kinds else None
        hint = f"; did you mean {guess!r}?" if guess is not None and guess != value else ""
        raise ConfigError(f"{name} {value!r} is not a device: {str(exc).splitlines()[0]}; use e.g. 'cpu', "
                          f"'cuda' or 'cuda:1'{hint}") from None
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ConfigError(f"{name} {value!r} asks for a CUDA GPU, but PyTorch sees none here "
                              "(torch.cuda.is_available() is False); use 'cpu'")
        if device.index is not None and device.index >= count:
            raise ConfigError(f"{name} {value!r} asks for CUDA GPU {device.index}, but PyTorch sees {count} "
                              f"(indices 0 to {count - 1})")
    return device


def check_path(name: str, value: object) -> Path:
    """``value`` (a non-empty string or an ``os.PathLike``) as a ``Path``, ``~`` expanded to the home folder; a
    clear error for anything else."""
    if isinstance(value, os.PathLike) or (isinstance(value, str) and value):
        return expand_home(value)
    raise ConfigTypeError(f"{name} must be a path (a non-empty string or a pathlib.Path), got {value!r} "
                          f"({type(value).__name__})")


def check_file_path(name: str, value: object, example: str) -> Path:
    """``value`` as a ``Path`` (see :func:`check_path`) to a file to write; a folder there is refused with an
    example file name inside it (``example``, e.g. ``"model.pt"``)."""
    path = check_path(name, value)
    if path.is_dir():
        raise ConfigError(f"{path} is a folder; give the file to write (e.g. {path / example})")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ConfigError(f"cannot write {path}: {parent} is a file, not a folder")
            break
    return path


def check_pattern(value: object) -> str:
    """``value`` if it is a shell-style pattern (a string such as ``"cifar-*"``); else a clear error."""
    if not isinstance(value, str):
        raise ConfigTypeError(f"pattern must be a shell-style pattern string such as 'cifar-*', got {value!r} "
                              f"({type(value).__name__})")
    return value


def check_title(value: object, name: str = "title") -> str | None:
    """``value`` if it is a string or ``None`` (a figure's or drawing's title); else a clear error."""
    if value is not None and not isinstance(value, str):
        raise ConfigTypeError(f"{name} must be a string or None, got {value!r} ({type(value).__name__})")
    return value
