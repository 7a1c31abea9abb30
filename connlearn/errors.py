"""The errors connlearn raises, and the one-line checks that raise them where a value enters."""

from __future__ import annotations

import difflib
import numbers
from collections.abc import Iterable
from typing import Any, TypeVar

T = TypeVar("T")


class ConnlearnError(Exception):
    """Base class of every error connlearn raises for bad input, files or state."""


class ConfigError(ConnlearnError, ValueError):
    """An option, a name or a setting is not one that is allowed."""


class GraphError(ConnlearnError, ValueError):
    """A BranchGraph does not describe a network."""


class CheckpointError(ConnlearnError, ValueError):
    """A checkpoint is missing, damaged, of another version, or of another run."""


class DataError(ConnlearnError, ValueError):
    """A dataset is missing, damaged or of an unknown format."""


class DivergenceError(ConnlearnError, RuntimeError):
    """Training made a weight infinite or NaN; the epoch that did it is not saved."""


def closest(name: object, known: Iterable[str]) -> str | None:
    """The known name closest to ``name``, for 'did you mean' hints."""
    hits = difflib.get_close_matches(str(name), list(known), n=1, cutoff=0.5)
    return hits[0] if hits else None


def check_choice(what: str, value: T, known: Iterable[T], error: type[ConnlearnError] = ConfigError) -> T:
    """``value`` if it is one of ``known``; else an ``error`` listing them and naming the closest."""
    known = list(known)
    if isinstance(value, str | int | float | type(None)) and value in known:
        return value
    hint = closest(value, [str(k) for k in known])
    raise error(f"unknown {what} {value!r}; known: {', '.join(map(str, known)) or '(none)'}"
                      + (f"; did you mean {hint!r}?" if hint else ""))


def check_int(name: str, value: Any, low: int | None = None, high: int | None = None) -> int:
    """``value`` as an int, or a ConfigError unless it is an integer in [low, high]."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ConfigError(f"{name} must be an integer, got {value!r}")
    value = int(value)
    if (low is not None and value < low) or (high is not None and value > high):
        raise ConfigError(f"{name} must be in [{low}, {high if high is not None else '∞'}], got {value}")
    return value


def check_float(name: str, value: Any, low: float | None = None, high: float | None = None) -> float:
    """``value`` as a float, or a ConfigError unless it is a number (not NaN) in [low, high]."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or value != value:
        raise ConfigError(f"{name} must be a number, got {value!r}")
    value = float(value)
    if (low is not None and value < low) or (high is not None and value > high):
        raise ConfigError(f"{name} must be in [{low}, {high if high is not None else '∞'}], got {value}")
    return value


def number_or_text(text: str) -> Any:
    """A value given as text, as an int, a float, or the text (``--gate-init uniform``, ``--gate-init 0.3``)."""
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text
