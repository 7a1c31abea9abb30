"""Stopping a training run on a signal, with a checkpoint.

A job scheduler that preempts a job sends it a signal first (``SIGTERM``; Slurm's ``--signal`` sends
``SIGUSR1`` a chosen time before the end), and a person stops a run with Ctrl-C (``SIGINT``). With
``Trainer.fit(stop_signals=...)`` the first of them is noted and training stops at the next step: it writes
``last.pt`` there and raises :class:`TrainingStopped`, which ends the process, unless caught, with the code
that signal gives (128 + its number). Running the same command again resumes from that step. After the
first, Ctrl-C interrupts at once; a second ``SIGTERM`` or ``SIGUSR1`` is taken as the same request (a scheduler
and ``torchrun`` may both send one; a scheduler that will not wait sends ``SIGKILL``). A signal that the
process ignores (``SIG_IGN``, as a shell leaves Ctrl-C for a command started with ``&``) stays ignored,
and one whose handler was set outside Python before it started (``signal.getsignal`` gives ``None``) is
left to that handler, with a warning. A handler set in C later (``faulthandler.register``) is not seen,
and is replaced by Python's earlier one after ``fit``.

The DataLoader workers of connlearn's loaders ignore the stop signals while ``fit`` stops on them (a
scheduler signals every process of a job, and ``torchrun`` its processes' groups; a worker ended by one
would make the loader raise before the training process could stop).
"""

from __future__ import annotations

import functools
import os
import signal
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator
from types import FrameType
from typing import Any

from connlearn.errors import ConfigError, ConfigTypeError, closest

#: The signals ``connlearn train`` and ``examples/`` stop on: Ctrl-C, a scheduler's ``SIGTERM`` and Slurm's
#: ``--signal`` default, ``SIGUSR1`` (where the platform has it).
STOP_SIGNALS: tuple[signal.Signals, ...] = tuple(
    s for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGUSR1", None)) if s is not None)

_UNCATCHABLE = {getattr(signal, name) for name in ("SIGKILL", "SIGSTOP") if hasattr(signal, name)}
#: Signals of faults and of child processes: a Python handler of a real fault runs again forever, and
#: ``SIGCHLD`` comes whenever a DataLoader worker ends.
_NOT_STOPS = {getattr(signal, name) for name in ("SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL", "SIGABRT", "SIGCHLD")
              if hasattr(signal, name)}
_active: tuple[signal.Signals, ...] = ()  # the signals a StopSignals block stops on now (its workers ignore them)


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
        if s in _NOT_STOPS:
            raise ConfigError(f"stop signal {s.name} reports a fault or a child process, not a request to stop; "
                              "give signals such as SIGTERM, SIGINT or SIGUSR1")
        if s not in out:
            out.append(s)
    if out and threading.current_thread() is not threading.main_thread():
        raise ConfigError("stop_signals can be caught in the main thread only (Python runs signal handlers "
                          "there); in another thread, give stop_signals=()")
    return tuple(out)


class StopSignals:
    """For a ``with`` block: notes the first of ``signals`` received (``received``: its number, else 0).
    After it, Ctrl-C (``SIGINT``) gets its earlier handler back, so that Ctrl-C then interrupts at once; the
    others are taken as the same request. A signal the process ignores, or whose handler was set outside
    Python, is left as it is. ``say``: print that it was received (to stderr, with a raw write: a handler
    may run in the middle of another write to the stream)."""

    def __init__(self, signals: Iterable[signal.Signals], *, say: bool = True) -> None:
        self.signals = tuple(signals)
        self.say = say
        self.received = 0
        self._earlier: dict[signal.Signals, Any] = {}
        self._outer: tuple[signal.Signals, ...] = ()

    def __enter__(self) -> StopSignals:
        global _active
        for s in self.signals:
            earlier = signal.getsignal(s)
            if earlier is signal.SIG_IGN:
                continue
            if earlier is None:
                warnings.warn(f"stop signal {s.name} has a handler set outside Python; it is left to that handler, "
                              "and does not stop training", RuntimeWarning, stacklevel=3)
                continue
            self._earlier[s] = signal.signal(s, self._note)
        self._outer, _active = _active, tuple(self._earlier)
        return self

    def __exit__(self, *exc: object) -> None:
        global _active
        for s in list(self._earlier):
            self._restore(s)
        _active = self._outer

    def _note(self, signum: int, frame: FrameType | None) -> None:
        if self.received:
            return
        self.received = signum
        hint = ""
        if signal.SIGINT in self._earlier:  # from now on Ctrl-C acts as it did before
            hint = " (Ctrl-C again stops at once)" if signum == signal.SIGINT else " (Ctrl-C stops at once)"
            self._restore(signal.SIGINT)
        if self.say:
            os.write(2, f"\nconnlearn: {signal.Signals(signum).name} received: stopping after this step, with a "
                        f"checkpoint{hint}\n".encode())

    def _restore(self, s: signal.Signals) -> None:
        if s in self._earlier:
            signal.signal(s, self._earlier.pop(s))


def worker_init() -> Callable[[int], None] | None:
    """A ``worker_init_fn`` for a DataLoader made now: :func:`ignore_stop_signals` of the signals a training
    run stops on now (``None`` when it stops on none)."""
    if not _active:
        return None
    return functools.partial(ignore_stop_signals, parent=os.getpid(), signals=_active)


def ignore_stop_signals(worker_id: int = 0, *, parent: int | None = None,
                        signals: Iterable[signal.Signals] = STOP_SIGNALS) -> None:
    """A DataLoader's ``worker_init_fn`` (:func:`worker_init` makes it): the worker process ignores
    ``signals``, except ``SIGTERM`` from ``parent`` (the training process, by default the worker's parent),
    which ends it as before: the training process ends its workers with ``SIGTERM`` (``Process.terminate``)
    when it exits with a loader alive. A thread of the worker waits for ``SIGTERM`` and reads who sent it;
    where Python cannot (no ``sigwaitinfo``, as on macOS), ``SIGTERM`` acts as before. The worker's other
    threads, and processes it starts, have ``SIGTERM`` blocked. A worker started by :func:`start_workers`
    had the signals blocked until now: one sent in between is dropped here."""
    signals = tuple(signals)
    parent = os.getppid() if parent is None else parent
    waits = signal.SIGTERM in signals and hasattr(signal, "sigwaitinfo")
    for s in signals:
        if s != signal.SIGTERM:
            signal.signal(s, signal.SIG_IGN)
    if waits:  # blocked in every thread, SIGTERM reaches only the thread that waits for it
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])
        threading.Thread(target=_end_at_sigterm_from, args=(parent, os.getppid()), daemon=True,
                         name="connlearn-sigterm").start()
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [s for s in signals if s != signal.SIGTERM or not waits])


def _end_at_sigterm_from(parent: int, ppid: int) -> None:
    """End this process at a ``SIGTERM`` from ``parent``, or once its parent process (``ppid``) is gone, as
    torch's own handler of a worker's ``SIGTERM`` does; ignore any other."""
    while True:
        sender = signal.sigwaitinfo([signal.SIGTERM]).si_pid
        if sender == parent or os.getppid() != ppid:
            os._exit(0)


def start_workers(loader: Iterable[Any]) -> Iterator[Any]:
    """``iter(loader)`` of a DataLoader made with :func:`worker_init`, with the stop signals blocked while it
    starts its workers: a worker inherits the block (when it is forked or spawned, not from a forkserver),
    so a signal to the process group in the moment before the worker ignores them does not end it. This
    process gets such a signal when the block ends."""
    if not _active or not hasattr(signal, "pthread_sigmask"):
        return iter(loader)
    held = signal.pthread_sigmask(signal.SIG_BLOCK, _active)
    try:
        return iter(loader)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


__all__ = ["STOP_SIGNALS", "StopSignals", "TrainingStopped", "check_signals", "ignore_stop_signals", "start_workers",
           "worker_init"]
