"""Files written whole or not at all: every file connlearn writes (checkpoints, logs, summaries, figures,
drawings, exported models, packed datasets) goes through :func:`write_atomic`.

A file is written to a temporary beside it, flushed to disk, then renamed over the target, and the folder's
entry is flushed too: a crash, a kill or a full disk at any moment leaves either the old file or the new one,
never a part of one. The temporary's name is unique to the writer, so processes that write the same file at
once (every rank of a job drawing the same diagram) each replace it whole; the last one wins.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import BinaryIO

#: The longest file name most file systems take, in bytes.
NAME_MAX = 255
_TEMPORARY = re.compile(r"\.(?P<name>.+)\.\d+\.[0-9a-f]{8}\.tmp")


def expand_home(path: str | os.PathLike) -> Path:
    """``path`` with a leading ``~`` or ``~user`` made the home folder, as a shell does; a ``~name`` of no
    user on this machine stays as it is (a file named so)."""
    return Path(os.path.expanduser(path))


def write_atomic(path: str | os.PathLike, write: Callable[[BinaryIO], object]) -> Path:
    """Call ``write`` on a binary file that becomes ``path`` only once ``write`` returned and the data is on
    disk; returns ``path``. A failed or interrupted write leaves ``path`` as it was and no temporary, and its
    ``OSError`` names ``path`` (not the temporary); so does a full disk met inside torch's zip writer (see
    :func:`write_failure`). A kill (SIGKILL) or a power loss mid-write can leave the hidden temporary
    ``.NAME.PID.XXXXXXXX.tmp`` beside ``path``, and ``path`` as it was."""
    path = expand_home(path)
    tmp = temporary_name(path)
    try:
        with open(tmp, "xb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:  # a failed or interrupted write leaves neither a partial file nor its temporary
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        failed = write_failure(exc)
        if failed is not None and failed.errno is None:
            raise OSError(f"cannot write {path}: {failed}") from exc
        if failed is not None:  # named as the file asked for, whatever torch's writer made of it
            raise OSError(failed.errno, failed.strerror or str(failed), str(path)) from exc
        raise
    _sync_folder(path.parent)
    return path


def write_bytes_atomic(path: str | os.PathLike, data: bytes | memoryview) -> Path:
    """Write ``data`` to ``path`` whole or not at all (:func:`write_atomic`)."""
    return write_atomic(path, lambda f: f.write(data))


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` whole or not at all (:func:`write_atomic`)."""
    return write_bytes_atomic(path, text.encode())


def replace_whole(source: Path, target: Path) -> Path:
    """Flush the finished file ``source`` to disk and rename it over ``target`` (in the same file system), then
    flush the folder's entry: for files that another writer made whole (ONNX's exporter, in a temporary
    folder); returns ``target``."""
    fd = os.open(source, os.O_RDWR)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(source, target)
    _sync_folder(target.parent)
    return target


def temporary_name(path: Path) -> Path:
    """A hidden name beside ``path`` that no other writer uses: ``.NAME.PID.XXXXXXXX.tmp``, with ``NAME`` cut
    short where the whole would pass the file system's limit on a name's length."""
    tail = f".{os.getpid()}.{secrets.token_hex(4)}.tmp"
    room = NAME_MAX - 1 - len(tail)
    name = os.fsencode(path.name)  # the bytes on disk: a name that is no UTF-8 too
    if len(name) > room:  # cut short (and no longer known as its file's by remove_leftovers)
        whole, name = name, name[:room]
        with contextlib.suppress(UnicodeDecodeError):
            whole.decode("utf-8")  # a UTF-8 name: cut on a character's boundary
            name = name.decode("utf-8", "ignore").encode("utf-8")
    return path.with_name(f".{os.fsdecode(name)}{tail}")


def remove_leftovers(folder: Path, names: Iterable[str] | None = None) -> list[Path]:
    """Remove the temporaries of ``folder/NAME`` for each of ``names`` (``None``: of every file) that writers
    killed mid-write left (a kill or a power loss, which no clean-up outlives); returns them. Only for files no
    one else writes at the same time: those of a folder its caller holds
    (:func:`~connlearn.checkpoint.folder_lock`)."""
    wanted = None if names is None else set(names)
    removed = []
    for path in sorted(folder.glob(".*.tmp")):
        found = _TEMPORARY.fullmatch(path.name)
        if found is not None and (wanted is None or found["name"] in wanted) and path.is_file():
            with contextlib.suppress(OSError):
                path.unlink()
                removed.append(path)
    return removed


def write_failure(exc: BaseException) -> OSError | None:
    """The OSError behind a failed write: ``exc`` itself, one it was raised from or during (torch's zip
    writer turns a full disk into a ``RuntimeError`` "[enforce fail at inline_container.cc] unexpected pos",
    with the OSError of the file's ``write`` as its context), or for that writer's error alone an ``EIO``;
    ``None`` for anything else (an interrupt, an object that does not pickle)."""
    if not isinstance(exc, Exception):  # an interrupt stays one
        return None
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, OSError):
            return cause
        seen.add(id(cause))
        # an error raised while another was handled is about that one only where it is torch's writer's (a
        # RuntimeError): another raised in a handler of an unrelated OSError is its own
        cause = cause.__cause__ or (cause.__context__ if isinstance(cause, RuntimeError) else None)
    if isinstance(exc, RuntimeError) and ("inline_container" in str(exc) or "PytorchStreamWriter" in str(exc)):
        return OSError(5, f"torch.save could not write the file ({' '.join(str(exc).split())})")
    return None


def _sync_folder(folder: Path) -> None:
    """Flush ``folder``'s entries (the rename) to disk. Not on Windows, which cannot open a folder; a file
    system that refuses is no reason to fail a write that already succeeded."""
    if sys.platform == "win32":
        return
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
