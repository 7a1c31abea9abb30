"""Files written whole or not at all, and the JSONL records of a run.

Every file connlearn writes goes through :func:`write_atomic`: to a temporary beside it, flushed to disk,
renamed over the target, the folder flushed too. A crash, a kill or a full disk leaves the old file or the
new one, never part of one. A target that is a link is written through (the file it names is replaced); one
that exists and is not a regular file (a device, a FIFO, a folder) is refused.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, BinaryIO

from connlearn.errors import ConfigError, DataError

_TEMPORARY = re.compile(r"\.(?P<name>.+)\.\d+\.[0-9a-f]{8}\.tmp")


def path_of(path: str | os.PathLike) -> Path:
    """``path`` as a Path with ``~`` expanded (a ``~name`` of no user stays as it is, as in a shell)."""
    return Path(os.path.expanduser(path))


def write_atomic(path: str | os.PathLike, write: Callable[[BinaryIO], object]) -> Path:
    """Call ``write`` on a file that becomes ``path`` only once it is whole on disk; returns ``path``.
    A failed write leaves ``path`` as it was and no temporary; its OSError names ``path``."""
    path = path_of(path)
    if path.is_symlink():
        path = path.resolve()
    if path.exists() and not path.is_file():
        raise ConfigError(f"{path} exists and is not a regular file (a device, a FIFO or a folder): connlearn "
                          "writes only regular files; give another output path")
    name = os.fsencode(path.name)[:200].decode("utf-8", "ignore")  # room for the suffix within 255 bytes
    tmp = path.with_name(f".{name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "xb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.filename != str(path):
            raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from exc
        raise
    with contextlib.suppress(OSError):  # the rename itself, on disk
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    return path


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` whole or not at all."""
    return write_atomic(path, lambda f: f.write(text.encode()))


def remove_leftovers(folder: Path, names: Iterable[str] | None = None) -> None:
    """Remove the temporaries that writers killed mid-write left beside ``folder/NAME`` (every NAME by
    default); only for a folder its caller holds (:func:`connlearn.train.checkpoint.folder_lock`)."""
    wanted = None if names is None else set(names)
    for path in folder.glob(".*.tmp"):
        found = _TEMPORARY.fullmatch(path.name)
        if found and (wanted is None or found["name"] in wanted):
            with contextlib.suppress(OSError):
                path.unlink()


def write_jsonl(path: str | os.PathLike, records: Iterable[dict[str, Any]]) -> None:
    """Rewrite a JSONL file whole."""
    write_text(path, "".join(json.dumps(r) + "\n" for r in records))


def read_jsonl(path: str | os.PathLike, torn_tail: bool = False) -> list[dict[str, Any]]:
    """The records of a JSONL file, one JSON object a line. ``torn_tail``: a last line that a crash cut short
    (an append) is left out. An unreadable file or line is a DataError naming the path and line."""
    try:
        lines = path_of(path).read_text(encoding="utf-8").splitlines(keepends=True)
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"cannot read {path}: {exc}") from None
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            if torn_tail and number == len(lines) and not line.endswith("\n"):
                break
            raise DataError(f"{path} line {number} is not JSON: {exc}") from None
        if not isinstance(record, dict):
            raise DataError(f"{path} line {number} is a {type(record).__name__}, not a JSON object")
        records.append(record)
    return records
