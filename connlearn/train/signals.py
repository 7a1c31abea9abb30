"""Stopping a training run on a signal, with a checkpoint.

A scheduler that preempts a job signals it first (``SIGTERM``; Slurm's ``--signal`` sends ``SIGUSR1``) and a
person stops a run with Ctrl-C. With ``Trainer.fit(stop_signals=...)`` the first of them is noted, training
stops at the next step, writes ``last.pt`` there and raises :class:`TrainingStopped`, which ends the process
with the code that signal gives (128 + its number); the same command resumes. After the first, Ctrl-C
interrupts at once. A signal the process ignores stays ignored. The DataLoader workers of connlearn's loaders
ignore the stop signals while ``fit`` runs (a scheduler signals every process of a job, and a worker ended
by one would make its loader fail before the run could stop).
"""

from __future__ import annotations

import functools
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from types import FrameType
from typing import Any

import torch

from connlearn.errors import check_choice
from connlearn.train.metrics import distributed, on_every_rank, over_ranks

#: Ctrl-C, a scheduler's SIGTERM and Slurm's ``--signal`` default, SIGUSR1.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)
_active: tuple[signal.Signals, ...] = ()  # what a StopRequests block stops on now (its workers ignore them)
CHECK_EVERY = 10  # steps between the ranks' checks for a stop signal within an epoch under torch.distributed


class TrainingStopped(SystemExit):
    """Training stopped at a signal after writing a checkpoint of where it stopped (``path``; None when it had
    trained nothing). A SystemExit of code 128 + the signal's number: uncaught, it ends the program quietly."""

    def __init__(self, signum: int, epoch: int, batch: int, path: str | None) -> None:
        super().__init__(128 + signum)
        self.signal, self.epoch, self.batch, self.path = signal.Signals(signum), epoch, batch, path

    def __str__(self) -> str:
        if self.path is None:
            return f"{self.signal.name}: stopped before it trained anything; nothing was saved"
        where = (f"within epoch {self.epoch + 1}, after its batch {self.batch}" if self.batch
                 else f"after epoch {self.epoch}")
        return f"{self.signal.name}: stopped {where}; {self.path} holds it: run again to go on from there"


def check_signals(signals: Iterable[Any] | None) -> tuple[signal.Signals, ...]:
    """``signals`` (numbers, ``signal.Signals`` or names such as ``"SIGTERM"``) checked: each one a process can
    catch and that asks it to stop (in the main thread: Python runs signal handlers there alone)."""
    names = {s.name: s for s in signal.Signals if s not in (signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD,
                                                                signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE)}
    out = []
    for s in signals or ():
        name = "SIG" + s.upper().removeprefix("SIG") if isinstance(s, str) else signal.Signals(s).name
        out.append(names[check_choice("stop signal", name, names)])
    return tuple(dict.fromkeys(out))


class StopRequests:
    """Why a ``fit`` stops before its end, asked by every rank together: the first of ``signals`` received (by
    any rank; within an epoch under torch.distributed the ranks compare theirs every :data:`CHECK_EVERY`
    steps) or, between epochs, ``time_limit`` (seconds from now) spent on any rank. A ``with`` block listens
    for the signals; after the first, Ctrl-C gets its earlier handler back. ``say``: print that it came."""

    def __init__(self, signals: Iterable[Any] | None, time_limit: float | None, device: torch.device, *,
                 say: bool) -> None:
        self.signals, self.say, self.received = check_signals(signals), say, 0
        self.deadline = None if time_limit is None else time.perf_counter() + time_limit
        self.device = device
        self._earlier: dict[signal.Signals, Any] = {}
        self._outer: tuple[signal.Signals, ...] = ()

    def __enter__(self) -> StopRequests:
        global _active
        for s in self.signals:
            if signal.getsignal(s) not in (signal.SIG_IGN, None):  # None: a handler set outside Python
                self._earlier[s] = signal.signal(s, self._note)
        self._outer, _active = _active, tuple(self._earlier)
        return self

    def __exit__(self, *exc: object) -> None:
        global _active
        for s, handler in self._earlier.items():
            signal.signal(s, handler)
        self._earlier.clear()
        _active = self._outer

    def _note(self, signum: int, frame: FrameType | None) -> None:
        if self.received:
            return
        self.received = signum
        if signal.SIGINT in self._earlier:  # from now on Ctrl-C interrupts at once
            signal.signal(signal.SIGINT, self._earlier.pop(signal.SIGINT))
        if self.say:  # a raw write: the handler may run in the middle of another write to the stream
            os.write(2, f"\nconnlearn: {signal.Signals(signum).name} received: stopping after this step, with a "
                        "checkpoint (Ctrl-C again stops at once)\n".encode())

    def signal(self, step: int | None = None) -> int:
        """The stop signal received, else 0; ``step``: the step just taken within an epoch."""
        if not self.signals or (step is not None and distributed() and step % CHECK_EVERY):
            return 0
        return int(over_ranks(float(self.received), "max", self.device))

    def time_left(self) -> bool:
        return on_every_rank(self.deadline is None or time.perf_counter() < self.deadline, self.device)


def worker_init() -> Callable[[int], None] | None:
    """A DataLoader ``worker_init_fn`` made now: its workers ignore the signals training stops on, except a
    SIGTERM from the training process, which ends them as usual."""
    return functools.partial(ignore_stop_signals, parent=os.getpid(), signals=_active) if _active else None


def ignore_stop_signals(worker_id: int, *, parent: int, signals: tuple[signal.Signals, ...]) -> None:
    for s in signals:
        if s != signal.SIGTERM:
            signal.signal(s, signal.SIG_IGN)
    waits = signal.SIGTERM in signals and hasattr(signal, "sigwaitinfo")  # not on macOS: SIGTERM acts as usual
    if waits:  # blocked in every thread but one, which ends the worker at its parent's SIGTERM
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])
        threading.Thread(target=_end_at_sigterm_from, args=(parent, os.getppid()), daemon=True).start()
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [s for s in signals if s != signal.SIGTERM or not waits])


def _end_at_sigterm_from(parent: int, ppid: int) -> None:
    while True:
        if signal.sigwaitinfo([signal.SIGTERM]).si_pid == parent or os.getppid() != ppid:
            os._exit(0)


def start_workers(loader: Iterable[Any]) -> Iterator[Any]:
    """``iter(loader)`` with the stop signals blocked while its workers start (they inherit the block until
    :func:`ignore_stop_signals` runs in them), so a signal to the process group in between spares them."""
    if not _active:
        return iter(loader)
    held = signal.pthread_sigmask(signal.SIG_BLOCK, _active)
    try:
        return iter(loader)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
