"""The folder of a training run: its checkpoints, its epoch log and its gate snapshots.

Checkpoints are written whole: ``last.pt`` by way of ``.next.pt`` (the one before it kept as ``previous.pt``),
and ``best.pt``. A resume takes ``last.pt``, or the ``.next.pt`` that a stop between the two renames left, or
``previous.pt`` where ``last.pt`` is damaged or gone. Under ``torch.distributed`` rank 0 writes every file
and every rank reads the checkpoints.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from tqdm.auto import tqdm

from connlearn.errors import CheckpointError, ConfigError
from connlearn.files import path_of, read_jsonl, remove_leftovers, write_jsonl
from connlearn.net import ConnectivityNet
from connlearn.train.checkpoint import folder_lock, load_checkpoint, save_checkpoint
from connlearn.train.metrics import distributed, gate_snapshot, on_every_rank, over_ranks
from connlearn.train.signals import TrainingStopped

WRITES = ("last.pt", ".next.pt", "best.pt", "log.jsonl")
CHECKPOINTS = ("last.pt", ".next.pt", "previous.pt", "best.pt")


class RunFolder:
    """The files of a run in ``path``; ``saved``: the (epochs, batches of the next epoch) that ``last.pt``
    holds, None before the first save."""

    def __init__(self, path: str | os.PathLike, device: torch.device) -> None:
        self.path, self.device = path_of(path), device
        self.is_main = not distributed() or dist.get_rank() == 0
        self.saved: tuple[int, int] | None = None
        self.snapshot_step: int | None = None  # the step of gates.jsonl's last line
        self.board: Any = None  # TensorBoard's SummaryWriter while fit runs
        if self.is_main:
            self.path.mkdir(parents=True, exist_ok=True)

    @property
    def last(self) -> Path:
        return self.path / "last.pt"

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Hold the folder while the block runs (rank 0 holds it; a refusal is raised on every rank, which would
        otherwise wait for rank 0); its writers' leftovers are removed first."""
        with contextlib.ExitStack() as held:
            refused = None
            if self.is_main:
                try:
                    held.enter_context(folder_lock(self.path, "a training run"))
                except ConfigError as exc:
                    refused = exc
            if not on_every_rank(refused is None, self.device):
                raise refused or ConfigError(f"{self.path} is in use by another process (rank 0 was refused it)")
            if self.is_main:
                remove_leftovers(self.path, WRITES)
            try:
                yield
            finally:
                if self.board is not None:
                    self.board.close()
                    self.board = None

    def open_board(self, epoch: int) -> None:
        """Write TensorBoard scalars to ``tb/``, epochs as its steps: what a run logged past ``epoch`` (a kill) is
        hidden."""
        if self.is_main and self.board is None:
            from torch.utils.tensorboard import SummaryWriter

            self.board = SummaryWriter(str(self.path / "tb"), purge_step=epoch + 1)

    def clear(self) -> None:
        """A fresh run: no other run's checkpoints."""
        if self.is_main and self.saved is None:
            for name in CHECKPOINTS:
                (self.path / name).unlink(missing_ok=True)

    def resume_path(self, resume: bool | str | os.PathLike) -> Path | None:
        """The checkpoint ``fit(resume=...)`` goes on from: a path given, else ``last.pt`` (or the ``.next.pt`` a
        stop between the renames of a save left, or, where ``last.pt`` is gone, ``previous.pt``)."""
        if resume not in (True, "auto"):
            return path_of(resume)  # type: ignore[arg-type]
        following, present = self.path / ".next.pt", os.path.lexists  # a link to nowhere too: refused, not replaced
        found = (self.last if present(self.last) else following if present(following)
                 else self.last if present(self.path / "previous.pt") else None)
        if resume is True and found is None:
            raise CheckpointError(f"resume=True, but {self.path} holds no checkpoint")
        some = float(found is not None)
        if over_ranks(some, "min", self.device) != over_ranks(some, "max", self.device):
            raise CheckpointError("the ranks disagree on whether there is a checkpoint: give them a shared out folder")
        return found

    def read(self, path: Path) -> tuple[dict[str, Any], Path]:
        """The training state at ``path`` and where it was read: a damaged ``last.pt`` falls back to
        ``previous.pt`` with a warning."""
        try:
            ckpt = load_checkpoint(path)
        except CheckpointError as exc:
            if path.name not in ("last.pt", ".next.pt") or not path.with_name("previous.pt").exists():
                raise
            warnings.warn(f"{exc}; resuming from previous.pt instead", stacklevel=3)
            path = path.with_name("previous.pt")
            ckpt = load_checkpoint(path)
        if "optimizer" not in ckpt:
            raise CheckpointError(f"{path} holds a network but no training state to resume")
        return ckpt, path

    def resumed(self, path: Path, saved: tuple[int, int], history: list[dict[str, Any]], step: int) -> None:
        """After a resume from ``path``: the save a stop cut short between its renames is finished, the log is
        the checkpoint's ``history`` and the gate snapshots go up to its ``step``."""
        self.saved = saved
        if not self.is_main:
            return
        if path.name == ".next.pt" and path.parent.resolve() == self.path.resolve() and not os.path.lexists(self.last):
            os.replace(path, self.last)
        write_jsonl(self.path / "log.jsonl", history)
        snapshots = self.path / "gates.jsonl"
        if snapshots.exists():
            kept = [r for r in read_jsonl(snapshots, torn_tail=True) if r["step"] <= step]
            write_jsonl(snapshots, kept)
            self.snapshot_step = kept[-1]["step"] if kept else None

    def save(self, state: Callable[[], dict[str, Any]], saved: tuple[int, int], best: bool) -> None:
        """Write ``state()`` as ``last.pt`` (and ``best.pt``), which then holds ``saved``."""
        if self.is_main:
            following, ckpt = self.path / ".next.pt", state()
            try:
                if best:  # before .next.pt: a run stopped before it rewrites this epoch and best.pt
                    save_checkpoint(ckpt, self.path / "best.pt")
                save_checkpoint(ckpt, following)
                if self.last.exists():
                    os.replace(self.last, self.path / "previous.pt")
                os.replace(following, self.last)
            except OSError as exc:  # a full disk, a quota: say what the folder still holds
                kept = f"{self.last} still holds epoch {self.saved[0]}" if self.saved else "no checkpoint was written"
                raise CheckpointError(f"cannot write the checkpoint of epoch {saved[0]} to {exc.filename or self.last}"
                                      f": {exc.strerror or exc}; {kept} (make room and run again to resume)") from exc
        self.saved = saved

    def log(self, history: list[dict[str, Any]], line: str) -> None:
        """Write the epoch log, its last epoch's numbers to TensorBoard too, and print ``line``, which says them."""
        if not self.is_main:
            return
        write_jsonl(self.path / "log.jsonl", history)
        tqdm.write(line)
        if self.board is not None:
            for k, v in history[-1].items():
                if isinstance(v, int | float) and not isinstance(v, bool):
                    self.board.add_scalar(k, v, history[-1]["epoch"])
            self.board.flush()

    def stopped(self, signum: int) -> TrainingStopped:
        """The stop at ``signum``, named (on stderr) with the checkpoint that holds where it stopped."""
        epoch, batch = self.saved or (0, 0)
        stopped = TrainingStopped(signum, epoch, batch, None if self.saved is None else str(self.last))
        if self.is_main:
            tqdm.write(f"connlearn: {stopped}", file=sys.stderr)
        return stopped

    def restart_snapshots(self) -> None:
        if self.is_main:
            (self.path / "gates.jsonl").unlink(missing_ok=True)

    def snapshot(self, net: ConnectivityNet, step: int, epoch: float, tie_order: bool) -> None:
        """Append the learned gates of ``net`` at ``step`` to ``gates.jsonl``."""
        record = gate_snapshot(net, step, epoch, tie_order) if self.is_main else None
        if record is not None:
            with open(self.path / "gates.jsonl", "a") as f:
                f.write(json.dumps(record) + "\n")
            self.snapshot_step = step
