"""Stopping a training run on a signal, with a checkpoint.

A job scheduler that preempts a job sends it a signal first (``SIGTERM``; Slurm's ``--signal`` sends
``SIGUSR1`` a chosen time before the end), and a person stops a run with Ctrl-C (``SIGINT``). With
``Trainer.fit(stop_signals=...)`` the first of them is noted and training stops at the next step: it writes
``last.pt`` there and raises :class:`TrainingStopped`, which ends the process, unless caught, with the code
that signal gives (128 + its number). Running the same command again resumes from that step. A second
signal acts as it would have without connlearn (a second Ctrl-C interrupts at once).
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterable, Iterator
from types import FrameType
from typing import Any

from connlearn.errors import ConfigError, ConfigTypeError, closest

#: The signals ``connlearn train`` and ``examples/`` stop on: Ctrl-C, a scheduler's ``SIGTERM`` and Slurm's
#: ``--signal`` default, ``SIGUSR1`` (where the platform has it).
STOP_SIGNALS: tuple[signal.Signals, ...] = tuple(
    s for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGUSR1", None)) if s is not None)

_UNCATCHABLE = {getattr(signal, name) for name in ("SIGKILL", "SIGSTOP") if hasattr(signal, name)}


class TrainingStopped(SystemExit):
    """Training stopped at a signal, after writing a checkpoint of where it stopped (``path``).

    A ``SystemExit`` whose code is the one the signal gives a process it ends (128 + its number): uncaught,
    it ends the program quietly with that code, and ``except Exception`` does not catch it. ``epoch``:
    epochs completed; ``batch``: batches of the next one trained (0 when it stopped between epochs);
    ``path``: ``None`` when it stopped before anything was trained."""

    def __init__(self, signum: int, epoch: int, batch: int, path: str | None) -> None:
        super().__init__(128 + signum)
        self.signal = signal.Signals(signum)
        self.epoch, self.batch, self.path = epoch, batch, path

    def __str__(self) -> str:
        where = (f"within epoch {self.epoch + 1}, after its batch {self.batch}" if self.batch
                 else f"after epoch {self.epoch}")
        if self.path is None:
            return f"{self.signal.name}: stopped before it trained anything; nothing was saved"
        return (f"{self.signal.name}: stopped {where}; {self.path} holds it: run again (resume) to go on from "
                "there")


def check_signals(signals: Iterable[object] | None) -> tuple[signal.Signals, ...]:
    """``signals`` (numbers, ``signal.Signals`` or names such as ``"SIGTERM"`` or ``"TERM"``) as signals,
    checked: each one that Python can catch here, and only in the main thread, where Python runs signal
    handlers."""
    if signals is None:
        return ()
    if isinstance(signals, (str, int)):
        signals = (signals,)
    try:
        given = list(signals)
    except TypeError:
        raise ConfigTypeError(f"stop_signals must be a sequence of signals (e.g. connlearn.signals.STOP_SIGNALS), "
                              f"got {signals!r}") from None
    valid = {s.name: s for s in signal.Signals}
    out: list[signal.Signals] = []
    for s in given:
        if isinstance(s, str):
            name = s.upper() if s.upper().startswith("SIG") else f"SIG{s.upper()}"
            if name not in valid:
                hint = closest(name, valid)
                raise ConfigError(f"stop signal {s!r} is no signal of this platform"
                                  + (f"; did you mean {', '.join(map(repr, hint))}?" if hint else ""))
            s = valid[name]
        elif isinstance(s, int) and not isinstance(s, bool):
            try:
                s = signal.Signals(s)
            except ValueError:
                raise ConfigError(f"stop signal {s!r} is no signal number of this platform") from None
        else:
            raise ConfigTypeError(f"a stop signal is a number, a signal.Signals or a name such as 'SIGTERM', got "
                                  f"{s!r} ({type(s).__name__})")
        if s in _UNCATCHABLE:
            raise ConfigError(f"stop signal {s.name} cannot be caught by any process; give signals such as "
                              "SIGTERM, SIGINT or SIGUSR1")
        if s not in out:
            out.append(s)
    if out and threading.current_thread() is not threading.main_thread():
        raise ConfigError("stop_signals can be caught in the main thread only (Python runs signal handlers "
                          "there); in another thread, give stop_signals=()")
    return tuple(out)


class StopSignals:
    """For a ``with`` block: notes the first of ``signals`` received (``received``: its number, else 0),
    after which each of them gets its earlier handler back, so a second one acts as it would have.
    ``say``: print that it was received (to stderr, with a raw write: a handler may run in the middle of
    another write to the stream)."""

    def __init__(self, signals: Iterable[signal.Signals], *, say: bool = True) -> None:
        self.signals = tuple(signals)
        self.say = say
        self.received = 0
        self._earlier: dict[signal.Signals, object] = {}

    def __enter__(self) -> StopSignals:
        for s in self.signals:
            self._earlier[s] = signal.signal(s, self._note)
        return self

    def __exit__(self, *exc: object) -> None:
        self._restore()

    def _note(self, signum: int, frame: FrameType | None) -> None:
        if not self.received:
            self.received = signum
        self._restore()
        if self.say:
            again = "Ctrl-C again" if signum == signal.SIGINT else "another signal"
            os.write(2, f"\nconnlearn: {signal.Signals(signum).name} received: stopping after this step, with a "
                        f"checkpoint ({again} stops at once)\n".encode())

    def _restore(self) -> None:
        for s, handler in self._earlier.items():
            signal.signal(s, signal.SIG_DFL if handler is None else handler)  # None: a handler set outside Python
        self._earlier.clear()


def ignore_stop_signals(worker_id: int = 0) -> None:
    """A DataLoader's ``worker_init_fn``: its worker process ignores the stop signals that do not come from
    the process that started it. A scheduler signals every process of a job, and ``torchrun`` its
    processes' groups; a worker ended by one would make the loader raise before the training process could
    stop at its next step. ``SIGTERM`` from the training process still ends the worker, as it ends its
    workers (``Process.terminate``) when it exits with a loader alive: a thread of the worker waits for
    ``SIGTERM`` and tells its sender (where Python can, as on Linux; elsewhere ``SIGTERM`` acts as before).
    A worker started by :func:`start_workers` had the signals blocked until now: one sent in between is
    dropped here."""
    parent = os.getppid()
    held = signal.SIGTERM in STOP_SIGNALS and hasattr(signal, "sigwaitinfo")
    for s in STOP_SIGNALS:
        if not (held and s == signal.SIGTERM):
            signal.signal(s, signal.SIG_IGN)
    if held:  # blocked in every thread, SIGTERM reaches only the thread that waits for it
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])
        threading.Thread(target=_end_at_parents_sigterm, args=(parent,), daemon=True,
                         name="connlearn-sigterm").start()
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [s for s in STOP_SIGNALS if not (held and s == signal.SIGTERM)])


def _end_at_parents_sigterm(parent: int) -> None:
    """End this process at a ``SIGTERM`` from ``parent`` (or once it has no parent), as torch's own handler
    of a worker's ``SIGTERM`` does; ignore any other."""
    while True:
        sender = signal.sigwaitinfo([signal.SIGTERM]).si_pid
        if sender == parent or os.getppid() != parent:
            os._exit(0)


def start_workers(loader: Iterable[Any]) -> Iterator[Any]:
    """``iter(loader)`` of a DataLoader whose workers run :func:`ignore_stop_signals`, with the stop signals
    blocked while it starts them: a worker inherits the block, so a signal to the process group in the
    moment before a worker ignores them does not end it. This process gets such a signal when the block
    ends."""
    if not hasattr(signal, "pthread_sigmask"):
        return iter(loader)
    held = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        return iter(loader)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


__all__ = ["STOP_SIGNALS", "StopSignals", "TrainingStopped", "check_signals", "ignore_stop_signals", "start_workers"]
