"""Files read and written: regular files only, written whole or not at all; the JSONL records of a run.

Every file connlearn writes goes through :func:`write_atomic`: to a temporary beside it, flushed to disk,
renamed over the target, the folder flushed too. A crash, a kill or a full disk leaves the old file or the
new one, never part of one. Its target passes :func:`check_target`: a link is written through (the file it
names is replaced); a target that exists and is not a regular file (a device, a FIFO, a folder), or that is
the command's own input, is refused. Every file connlearn reads is opened by :func:`open_input`: a regular
file (a link: the file it names) that fits in memory; a FIFO or a device, which may never end, is refused
before anything is read from it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import stat
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, BinaryIO

from connlearn.errors import ConfigError, DataError

_TEMPORARY = re.compile(r"\.(?P<name>.+)\.\d+\.[0-9a-f]{8}\.tmp")


def path_of(path: str | os.PathLike) -> Path:
    """``path`` as a Path with ``~`` expanded (a ``~name`` of no user stays as it is, as in a shell)."""
    return Path(os.path.expanduser(path))


def _kind(mode: int) -> str:
    return ("a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if
            stat.S_ISSOCK(mode) else "a device")


def memory_available() -> int | None:
    """The bytes of memory available now (``MemAvailable``), or None where the system does not say."""
    try:
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return None


def check_target(path: str | os.PathLike, *inputs: str | os.PathLike) -> Path:
    """``path`` as a writer's target, a link resolved to the file it names: absent, or a regular file that is
    none of ``inputs`` (the files the command reads); else a ConfigError naming it."""
    path = path_of(path)
    try:
        found = os.stat(path)
    except FileNotFoundError:
        found = None
    except OSError as exc:  # a link loop
        raise ConfigError(f"cannot write {path}: {exc.strerror}; give another output path") from None
    if found is not None and not stat.S_ISREG(found.st_mode):
        raise ConfigError(f"{path} exists and is not a regular file ({_kind(found.st_mode)}): connlearn writes only "
                          "regular files; give another output path")
    for source in inputs:
        with contextlib.suppress(OSError):
            if found is not None and os.path.samefile(path, source):
                raise ConfigError(f"the output {path} is the input {source} itself, which writing would replace: "
                                  "give another output path")
    return Path(os.path.realpath(path)) if path.is_symlink() else path


def write_atomic(path: str | os.PathLike, write: Callable[[BinaryIO], object]) -> Path:
    """Call ``write`` on a file that becomes ``path`` (checked by :func:`check_target`) only once it is whole
    on disk; returns ``path``. A failed write leaves ``path`` as it was and no temporary; its OSError names
    ``path``."""
    path = check_target(path)
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


def open_input(path: str | os.PathLike, what: str = "file", error: type[Exception] = DataError) -> BinaryIO:
    """``path`` opened to read, if it is a regular file (a link: the file it names) that fits in the memory
    available now; else ``error`` naming it and the ``what`` it should be, in one line. A FIFO or a device is
    refused before anything is read from it (opened without blocking, checked by its ``fstat``)."""
    path = path_of(path)
    try:
        file = os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC), "rb")
    except FileNotFoundError:
        raise error(f"no {what} at {path}") from None
    except OSError as exc:  # a link loop, no permission
        raise error(f"cannot read the {what} {path}: {exc.strerror}") from None
    found, free = os.fstat(file.fileno()), memory_available()
    if not stat.S_ISREG(found.st_mode):
        file.close()
        raise error(f"the {what} {path} is {_kind(found.st_mode)}, not a regular file: connlearn reads only regular "
                    "files")
    if free is not None and found.st_size > free:
        file.close()
        raise error(f"the {what} {path} is {found.st_size / 2**30:.1f} GiB, more than the {free / 2**30:.1f} GiB of "
                    "memory available now")
    return file


def read_text(path: str | os.PathLike, what: str = "file", error: type[Exception] = DataError) -> str:
    """The UTF-8 text of a file (:func:`open_input`'s files; a byte order mark dropped)."""
    with open_input(path, what, error) as f:
        data = f.read()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise error(f"the {what} {path} is not UTF-8 text (byte {exc.start}: {exc.reason})") from None


def read_jsonl(path: str | os.PathLike, torn_tail: bool = False) -> list[dict[str, Any]]:
    """The records of a JSONL file, one JSON object a line. ``torn_tail``: a last line that a crash cut short
    (an append) is left out. An unreadable file or line is a DataError naming the path and line."""
    lines = read_text(path, "JSONL file").splitlines(keepends=True)
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
