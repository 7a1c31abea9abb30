"""Name -> object registries for blocks, topologies and gate kinds, filled at import and by entry points."""

from __future__ import annotations

import fnmatch
import warnings
from collections.abc import Callable
from importlib import metadata
from typing import Generic, TypeVar

from connlearn.errors import (
    ConfigError,
    ConfigTypeError,
    UnknownNameError,
    check_bool,
    check_name,
    check_pattern,
    closest,
)

T = TypeVar("T")


class Registry(Generic[T]):
    """A registry of named objects of one kind (``what``), extended by the entry-point group ``group``.

    Entry points are loaded lazily, the first time a name is looked up or listed, so that a third-party
    package can add blocks without being imported by hand. An entry point that fails to load (or to pass
    ``check``) is skipped with a warning, and looking its name up raises an error that says why; the
    others load as usual.

    ``check(name, obj)``, if given, vets every object before it is registered (by ``register`` or an entry
    point) and returns it, or raises a :class:`~connlearn.errors.ConnlearnError` saying what is wrong.
    """

    def __init__(self, what: str, group: str, check: Callable[[str, T], T] | None = None) -> None:
        self.what = what
        self.group = group
        self._check = check
        self._items: dict[str, T] = {}
        self._broken: dict[str, str] = {}  # entry-point name -> why it did not load
        self._entry_points_loaded = False

    def register(self, name: str, obj: T | None = None, *, overwrite: bool = False) -> T | Callable[[T], T]:
        """Register ``obj`` under ``name``; without ``obj``, return a decorator that does."""
        if not isinstance(name, str) or not name:
            raise ConfigTypeError(f"a {self.what} name must be a non-empty string, got {name!r}")
        check_bool("overwrite", overwrite)

        def add(item: T) -> T:
            if name in self._items and not overwrite and self._items[name] is not item:
                raise ConfigError(
                    f"{self.what} {name!r} is already registered; pass overwrite=True to replace it"
                )
            self._items[name] = self._check(name, item) if self._check is not None else item
            self._broken.pop(name, None)
            return item

        return add if obj is None else add(obj)

    def get(self, name: str) -> T:
        """The object registered as ``name``; an unknown name lists the known ones and the closest."""
        self._load_entry_points()
        if isinstance(name, str) and name in self._broken and name not in self._items:
            raise ConfigError(self._broken[name])
        try:
            return self._items[check_name(self.what, name, self._items)]
        except UnknownNameError as exc:
            if not isinstance(name, str) or closest(name, self._items):
                raise
            error = exc  # maybe a kind that a program registered for itself, which this process never ran
        raise UnknownNameError(f"{error}. A {self.what} registered in a program's own code is known to that process "
                               f"only; a package makes it known to every process (the connlearn command included) "
                               f"through the entry-point group {self.group!r}")

    def names(self, pattern: str = "*") -> list[str]:
        """Registered names matching the shell-style ``pattern``, sorted."""
        self._load_entry_points()
        pattern = check_pattern(pattern)
        return sorted(n for n in self._items if fnmatch.fnmatchcase(n, pattern))

    def __contains__(self, name: object) -> bool:
        self._load_entry_points()
        return name in self._items

    def _load_entry_points(self) -> None:
        if self._entry_points_loaded:
            return
        self._entry_points_loaded = True
        for ep in metadata.entry_points(group=self.group):
            if ep.name in self._items:
                continue
            try:
                obj = ep.load()
                self._items[ep.name] = self._check(ep.name, obj) if self._check is not None else obj
            except Exception as exc:  # a broken plug-in must not hide the others
                why = (f"{self.what} {ep.name!r} is installed (entry point {ep.name} = {ep.value} in group "
                       f"{self.group!r}) but failed to load: {type(exc).__name__}: {exc}")
                self._broken[ep.name] = why
                warnings.warn(why, RuntimeWarning, stacklevel=3)
