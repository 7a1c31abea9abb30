"""Name -> object registries for block kinds, topologies and gate kinds, extended by entry points."""

from __future__ import annotations

import fnmatch
import warnings
from collections.abc import Callable
from importlib import metadata
from typing import Any, Generic, TypeVar

from connlearn.errors import ConfigError, check_choice

T = TypeVar("T")


class Registry(Generic[T]):
    """Objects of one kind (``what``) by name; the entry-point group ``group`` is loaded on first lookup.
    A plug-in that fails to load is skipped with a warning, and looking it up says why."""

    def __init__(self, what: str, group: str, check: Callable[[str, Any], None] | None = None) -> None:
        self.what, self.group, self._check = what, group, check
        self._items: dict[str, T] = {}
        self._broken: dict[str, str] = {}
        self._loaded = False

    def register(self, name: str, obj: Any = None, *, overwrite: bool = False) -> Any:
        """Register ``obj`` as ``name``; without ``obj``, return a decorator that does."""

        def add(item: Any) -> Any:
            if name in self._items and not overwrite and self._items[name] is not item:
                raise ConfigError(f"{self.what} {name!r} is already registered; pass overwrite=True to replace it")
            if self._check is not None:
                self._check(name, item)
            self._items[name] = item
            return item

        if not isinstance(name, str) or not name:
            raise ConfigError(f"a {self.what} name must be a non-empty string, got {name!r}")
        return add if obj is None else add(obj)

    def get(self, name: str) -> T:
        self._load()
        if name in self._broken and name not in self._items:
            raise ConfigError(self._broken[name])
        return self._items[check_choice(self.what, name, self._items)]

    def names(self, pattern: str = "*") -> list[str]:
        self._load()
        return sorted(n for n in self._items if fnmatch.fnmatchcase(n, pattern))

    def __contains__(self, name: object) -> bool:
        self._load()
        return name in self._items

    def _load(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        for ep in metadata.entry_points(group=self.group):
            if ep.name in self._items:
                continue
            try:
                self.register(ep.name, ep.load())
            except Exception as exc:  # a broken plug-in must not hide the others
                self._broken[ep.name] = (f"{self.what} {ep.name!r} (entry point {ep.value}) failed to load: "
                                         f"{type(exc).__name__}: {exc}")
                warnings.warn(self._broken[ep.name], RuntimeWarning, stacklevel=3)
