"""The GateConnect trainer: a :class:`~connlearn.train.recipe.Recipe` run on a network, in plain PyTorch.

Each epoch appends one JSON line to ``out_dir/log.jsonl`` (losses, top-1/top-5, learning rates, times, active
branches, gate statistics and, for sampled gates, how many distinct input sets each block drew and how often
a draw was its top-K) and writes the checkpoints ``last.pt`` (the one before it as ``previous.pt``) and
``best.pt``, each whole: ``last.pt`` by way of ``.next.pt``, which a resume takes where a stop between the two
renames left no ``last.pt``. Every ``snapshot_every`` steps (and at the freeze) it appends the real gates to
``gates.jsonl``. While ``fit`` runs the folder is held: another process is refused it.

Resuming (``fit(resume="auto")``) goes on exactly: a run stopped after any epoch, or within one at a
``checkpoint_every`` checkpoint or a stop signal, ends with the same weights, gates and log (timings aside)
as an uninterrupted one, on the CPU. Under ``torch.distributed`` the trainer wraps the network in
DistributedDataParallel, sums metrics over the ranks and writes files from rank 0; give each rank its shard
of the data (the loaders' ``rank``/``world_size``).
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import json
import math
import os
import sys
import time
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm
from tqdm.auto import tqdm

from connlearn.errors import CheckpointError, ConfigError, DivergenceError, check_choice, check_int
from connlearn.files import path_of, read_jsonl, remove_leftovers, write_jsonl
from connlearn.net import ConnectivityNet
from connlearn.train.checkpoint import (
    architecture,
    folder_lock,
    load_checkpoint,
    make_checkpoint,
    net_from_checkpoint,
    save_checkpoint,
)
from connlearn.train.metrics import (
    Loader,
    autocast,
    connectivity_numbers,
    distributed,
    draw_statistics,
    evaluate,
    gate_snapshot,
    recalibrate_batch_norm,
    record_draw,
    sum_over_ranks,
)
from connlearn.train.recipe import Recipe
from connlearn.train.signals import StopSignals, TrainingStopped, check_signals
from connlearn.updater import GateUpdater, drop_gate_group, param_groups

AMP_MODES = ("auto", "bf16", "fp16", "none")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
TIMING_KEYS = ("epoch_time", "images_per_s", "eval_time")
STOP_CHECK_EVERY = 10  # steps between the ranks' checks for a stop signal under torch.distributed
WRITES = ("last.pt", ".next.pt", "best.pt", "log.jsonl")


def _over_ranks(value: float, op: str, device: torch.device) -> float:
    """The ``"min"`` or ``"max"`` of ``value`` over the ranks: a decision each rank takes by its own clock
    (or signal) is taken together, or the ranks that go on wait forever for those that stopped."""
    if not distributed():
        return value
    t = torch.tensor([value], device=device if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MIN if op == "min" else dist.ReduceOp.MAX)
    return t.item()


def _all(flag: bool, device: torch.device) -> bool:
    return bool(_over_ranks(float(flag), "min", device))


def _finite(net: ConnectivityNet) -> bool:
    """Whether every trained weight and every batch norm's running statistic is finite."""
    tensors = [p for p in net.parameters() if p.requires_grad] + [
        s for m in net.modules() if isinstance(m, _BatchNorm) for s in (m.running_mean, m.running_var) if s is not None]
    return bool(torch.stack([torch.isfinite(t).all() for t in tensors]).all())


@contextlib.contextmanager
def _held(out_dir: Path, is_main: bool, device: torch.device) -> Iterator[None]:
    """Rank 0 holds ``out_dir``; a refusal is raised on every rank, which would otherwise wait for rank 0."""
    with contextlib.ExitStack() as held:
        refused = None
        if is_main:
            try:
                held.enter_context(folder_lock(out_dir, "a training run"))
            except ConfigError as exc:
                refused = exc
        if not _all(refused is None, device):
            raise refused or ConfigError(f"{out_dir} is in use by another process (rank 0 was refused it)")
        yield


def _batches(loader: Loader, epoch: int, start: int, rng_at_start: torch.Tensor | None) -> Iterator[Any]:
    """The batches of ``epoch`` from batch ``start`` on: ``loader.epoch(epoch, start=start)`` where it takes
    ``start``; else the epoch read with the global random state it began with, its first batches dropped."""
    if not start:
        return iter(loader.epoch(epoch))
    if "start" in inspect.signature(loader.epoch).parameters:
        return iter(loader.epoch(epoch, start=start))  # type: ignore[call-arg]
    now = torch.get_rng_state()
    try:
        if rng_at_start is not None:
            torch.set_rng_state(rng_at_start)
        batches = iter(loader.epoch(epoch))
        for _ in itertools.islice(batches, start):
            pass
    finally:
        torch.set_rng_state(now)
    return batches


class Trainer:
    """Runs ``recipe`` on ``net`` with SGD, writing logs and checkpoints to ``out_dir`` (see the module docstring).

    Args:
        net: the network; a resume replaces it by the checkpoint's. train_loader, test_loader: ``len()`` and
            ``epoch(e, start=0)`` giving ``(images, labels)`` on the device (``test_loader`` may be None).
        device: default CUDA where there is one. amp: ``auto`` (bf16 on CUDA, off on the CPU), ``bf16``,
            ``fp16`` (with a GradScaler) or ``none``. channels_last: train in channels-last memory format.
        compile: ``torch.compile`` the network (True, or a mode of :data:`COMPILE_MODES`: on a GPU
            ``reduce-overhead``); recompiled once, when the connectivity freezes.
        snapshot_every: steps between gate snapshots (0: none). checkpoint_every: steps between checkpoints
            within an epoch (0: at its end only). eval_every: evaluate after every this many epochs and the last.
            recalibrate_bn: before the last evaluation, recompute the batch norms' statistics over this many
            training batches (0: not); the log keeps the top-1 before it as ``test_top1_before_recalibration``.
            tensorboard: also write TensorBoard scalars to ``out_dir/tb``.
        gate_loader: held-out batches for the gates (a first-order bilevel step, as DARTS's): in phase 1 every
            weight step on a training batch is followed by a gate step on the next held-out batch (its
            ``epoch(e, start)`` read in order), the weights and the gates each in their own optimizer.
        progress: a progress bar and a line per epoch. meta: JSON-able facts kept in the checkpoints.
        resume_check: called with the checkpoint a resume is about to load; it raises to refuse it.
    """

    def __init__(self, net: ConnectivityNet, train_loader: Loader, test_loader: Loader | None, recipe: Recipe, *,
                 out_dir: str | os.PathLike, device: str | torch.device | None = None, amp: str = "auto",
                 channels_last: bool = False, compile: bool | str = False, snapshot_every: int = 100,
                 checkpoint_every: int = 0, eval_every: int = 1, recalibrate_bn: int = 0, tensorboard: bool = False,
                 progress: bool = True, gate_loader: Loader | None = None, meta: dict[str, Any] | None = None,
                 resume_check: Any = None) -> None:
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        amp = check_choice("amp mode", amp, AMP_MODES)
        self.amp = {"bf16": torch.bfloat16, "fp16": torch.float16, "none": None,
                    "auto": torch.bfloat16 if self.device.type == "cuda" else None}[amp]
        self.compile = compile if compile is False else check_choice("compile mode", "default" if compile is True
                                                                     else compile, COMPILE_MODES)
        if self.device.type == "cuda":
            torch.backends.cudnn.benchmark = True  # fixed shapes: cuDNN's autotuned kernels are chosen once
        self.train_loader, self.test_loader, self.recipe = train_loader, test_loader, recipe
        self.gate_loader = gate_loader
        self._gate_batches: tuple[int, Iterator[Any]] | None = None  # the next gate step's index, its batches
        self.out_dir, self.is_main = path_of(out_dir), not distributed() or dist.get_rank() == 0
        self.channels_last, self.snapshot_every, self.checkpoint_every = channels_last, snapshot_every, checkpoint_every
        self.eval_every = check_int("eval_every", eval_every, 1)
        self.recalibrate_bn = check_int("recalibrate_bn", recalibrate_bn, 0)
        self.tensorboard, self.progress, self.meta, self.resume_check = tensorboard, progress, meta or {}, resume_check
        if self.is_main:
            self.out_dir.mkdir(parents=True, exist_ok=True)
        self.history: list[dict[str, Any]] = []
        self.epoch = self.step = 0
        self.best_top1: float | None = None
        self.scaler = torch.amp.GradScaler(self.device.type) if self.amp is torch.float16 else None
        self._tb: Any = None
        self._signals: StopSignals | None = None
        self._within: dict[str, Any] | None = None  # an unfinished epoch: what a checkpoint within it holds
        self._saved: tuple[int, int] | None = None  # (epochs, batches of the next) out_dir/last.pt holds
        self._fresh = True  # the state in memory is a checkpoint's (or the start's): fit may go on from it
        self._frozen_from: str | None = None
        self._snapshot_step: int | None = None  # the step of gates.jsonl's last line
        self._set_net(net)

    def _set_net(self, net: ConnectivityNet) -> None:
        layout = torch.channels_last if self.channels_last else torch.preserve_format
        self.net = cast(ConnectivityNet, net.to(self.device, memory_format=layout))  # type: ignore[call-overload]
        self.updater = GateUpdater(self.net, grad_mode=self.recipe.gate_rule)
        phase = self.recipe.phases[0]
        groups = param_groups(self.net, phase.lr, self.recipe.weight_decay, phase.gate_lr, self.recipe.gate_momentum)
        own = len(groups) > 1 and (self.recipe.gate_optimizer == "adam" or self.gate_loader is not None)
        momentum = self.recipe.momentum
        self.optimizer = torch.optim.SGD(groups[:1] if own else groups, lr=phase.lr, momentum=momentum)
        self.gate_optimizer = None if not own else (
            torch.optim.Adam([{k: v for k, v in groups[1].items() if k != "momentum"}])
            if self.recipe.gate_optimizer == "adam" else torch.optim.SGD(groups[1:], lr=phase.gate_lr,
                                                                         momentum=momentum))
        self.updater.attach(self.gate_optimizer or self.optimizer)
        self._last_connectivity = self.net.connectivity()
        self._wrap()

    def _wrap(self) -> None:
        model: torch.nn.Module = self.net
        if distributed():
            model = torch.nn.parallel.DistributedDataParallel(
                model, device_ids=[self.device.index] if self.device.type == "cuda" else None)
        self.model: Any = torch.compile(model, mode=self.compile) if self.compile else model

    # --------------------------------------------------------------------------------------------- fit
    def fit(self, *, resume: bool | str | os.PathLike = "auto", max_epochs: int | None = None,
            time_limit: float | None = None, stop_signals: Iterable[Any] | None = ()) -> list[dict[str, Any]]:
        """Train to the end of the recipe (or ``max_epochs`` more); returns the epoch log.

        ``resume``: ``"auto"`` goes on from ``out_dir/last.pt`` where there is one, ``True`` requires it,
        ``False`` starts afresh (removing the folder's checkpoints), a path resumes from that checkpoint.
        ``time_limit`` (seconds): start no epoch after it. ``stop_signals`` (e.g.
        :data:`~connlearn.train.signals.STOP_SIGNALS`): on the first one, stop at the next step with a checkpoint
        and raise :class:`~connlearn.train.signals.TrainingStopped`."""
        started, signals = time.perf_counter(), check_signals(stop_signals)
        with _held(self.out_dir, self.is_main, self.device), StopSignals(signals, say=self.is_main) as self._signals:
            if self.is_main:
                remove_leftovers(self.out_dir, WRITES)
            memory = resume in (True, "auto") and self._saved is not None and self._fresh  # last.pt holds it
            path = None if resume is False or memory else _resume_path(self.out_dir, resume, self.device)
            if resume is False and self.is_main and self._saved is None:  # a fresh run: no other run's checkpoints
                for name in ("last.pt", ".next.pt", "previous.pt", "best.pt"):
                    (self.out_dir / name).unlink(missing_ok=True)
            if path is not None:
                self.load(path)
            elif not self._fresh:
                raise CheckpointError(f"this trainer was stopped within epoch {self.epoch + 1} and has no checkpoint "
                                      "to go on from: make a new Trainer (and network)")
            self._start_logs()
            end = self.recipe.total_epochs if max_epochs is None else min(self.recipe.total_epochs,
                                                                          self.epoch + max_epochs)
            try:
                while self.epoch < end and _all(time_limit is None or time.perf_counter() - started < time_limit,
                                                self.device):
                    if signum := self._signal(every=1):
                        self._stop(signum)
                    self._run_epoch(self.epoch)
                if signum := self._signal(every=1):  # in the last epoch: it ends here all the same
                    self._stop(signum)
            finally:
                self._signals = None
                if self._tb is not None:
                    self._tb.close()
                    self._tb = None
        return self.history

    def _start_logs(self) -> None:
        if self.tensorboard and self.is_main and self._tb is None:
            from torch.utils.tensorboard import SummaryWriter

            # epochs are its steps: what a run logged past the one resumed from (a kill) is hidden
            self._tb = SummaryWriter(str(self.out_dir / "tb"), purge_step=self.epoch + 1)
        if self.step == 0:
            if self.recipe.gate_rule == "renormalized":
                self.updater.renormalize()  # Algorithm 1 normalises before the first forward pass
            if self.is_main:
                (self.out_dir / "gates.jsonl").unlink(missing_ok=True)
            if self.snapshot_every:
                first = self.recipe.phases[0]
                if self.net.stochastic and not first.frozen:
                    self.net.sample_temperature = first.temperature_at(0.0)
                self._snapshot(0.0)

    def _signal(self, every: int = STOP_CHECK_EVERY) -> int:
        """The stop signal received, else 0; under DDP by any rank, the ranks comparing theirs at every step
        that is a multiple of ``every``."""
        if self._signals is None or not self._signals.signals or (distributed() and self.step % every):
            return 0
        return int(_over_ranks(float(self._signals.received), "max", self.device))

    def _stop(self, signum: int) -> None:
        epoch, batch = self._saved or (self.epoch, 0)
        stopped = TrainingStopped(signum, epoch, batch, None if self._saved is None else str(self.out_dir / "last.pt"))
        if self.is_main and self.progress:
            tqdm.write(f"connlearn: {stopped}", file=sys.stderr)
        raise stopped

    # ------------------------------------------------------------------------------------------- epochs
    def _run_epoch(self, epoch: int) -> None:
        index, phase = self.recipe.phase_at(epoch)
        if phase.frozen and not self.net.fixed_connectivity:
            self._freeze(epoch)
        learning = epoch >= self.recipe.gate_warmup  # the warm-up's gates stay where they start
        for group in self.optimizer.param_groups + (self.gate_optimizer.param_groups if self.gate_optimizer else []):
            group["lr"] = (phase.gate_lr if learning else 0.0) if group.get("name") == "gates" else phase.lr
        record: dict[str, Any] = {"epoch": epoch + 1, "phase": index + 1, "lr": phase.lr,
                                  "gate_lr": phase.gate_lr if self.net.gate_parameters() else None}
        record.update(self._train_epoch(epoch, index))
        self._check_finite(epoch, record["train_loss"])
        last = epoch + 1 == self.recipe.total_epochs
        if self.test_loader is not None and ((epoch + 1) % self.eval_every == 0 or last):
            t0 = time.perf_counter()
            record.update(evaluate(self.model, self.test_loader, amp=self.amp, channels_last=self.channels_last))
            if last and self.recalibrate_bn:
                record["test_top1_before_recalibration"] = record["test_top1"]
                recalibrate_batch_norm(self.net, self.train_loader.epoch(epoch), self.recalibrate_bn, self.amp)
                record.update(evaluate(self.model, self.test_loader, amp=self.amp, channels_last=self.channels_last))
            record["eval_time"] = time.perf_counter() - t0
        record.update(connectivity_numbers(self.net, self._last_connectivity))
        self._last_connectivity = self.net.connectivity()
        top1 = record.get("test_top1")
        best = top1 is not None and (self.best_top1 is None or top1 > self.best_top1)
        self.best_top1 = top1 if best else self.best_top1
        record["best_top1"] = self.best_top1
        self.epoch = epoch + 1
        self.history.append(record)
        self._save(best)  # first: a log that cannot be written loses no epoch (a resume rewrites the log)
        if self.is_main:
            write_jsonl(self.out_dir / "log.jsonl", self.history)
            if self.progress:
                tqdm.write(_summary_line(record, self.recipe.total_epochs))
            if self._tb is not None:
                for k, v in record.items():
                    if isinstance(v, int | float) and not isinstance(v, bool):
                        self._tb.add_scalar(k, v, self.epoch)
                self._tb.flush()

    def _train_epoch(self, epoch: int, index: int) -> dict[str, Any]:
        self.model.train()
        within, self._within = self._within, None
        start = 0 if within is None else within["batch"]
        n, phase = len(self.train_loader), self.recipe.phases[index]
        sampled = self.net.stochastic and not phase.frozen
        first = (epoch - sum(p.epochs for p in self.recipe.phases[:index])) * n  # the phase's earlier steps
        totals = torch.zeros(3, device=self.device) if within is None or not self.is_main else within["sums"].to(
            self.device)  # loss sum, correct, images; the other ranks add theirs to rank 0's so far
        draws = [] if within is None else [[(m.to(self.device), a.to(self.device)) for m, a in step]
                                           for step in within["draws"]]
        rng = torch.get_rng_state() if within is None else within["rng_at_start"]
        bar = tqdm(total=n, initial=start, disable=not (self.progress and self.is_main), leave=False,
                   desc=f"epoch {epoch + 1}/{self.recipe.total_epochs} (phase {index + 1})", dynamic_ncols=True)
        t0, shown = time.perf_counter() - (0.0 if within is None else within["elapsed"]), -math.inf
        with bar:
            for i, (x, y) in enumerate(_batches(self.train_loader, epoch, start, rng), start):
                self._fresh = False  # from here on, what is in memory is no checkpoint's state
                if sampled:
                    self.net.sample_temperature = phase.temperature_at((first + i) / max(phase.epochs * n - 1, 1))
                totals += self._step(x, y, draws if sampled else None)
                if self.snapshot_every and self.step % self.snapshot_every == 0:
                    self._snapshot(epoch + (i + 1) / n)
                if i + 1 < n:
                    signum = self._signal()
                    if signum or (self.checkpoint_every and self.step % self.checkpoint_every == 0):
                        self._within = {"batch": i + 1, "sums": sum_over_ranks(totals.clone()).cpu(), "draws": draws,
                                        "elapsed": time.perf_counter() - t0, "rng_at_start": rng,
                                        "last_connectivity": self._last_connectivity}
                        self._check_finite(epoch, (self._within["sums"][0] / self._within["sums"][2]).item(), i + 1)
                        self._save(best=False)
                        self._within = None
                    if signum:
                        self._stop(signum)
                if not bar.disable and (time.perf_counter() >= shown + 1.0 or i == n - 1):
                    shown = time.perf_counter()  # the totals are read (a wait on a GPU) once a second
                    loss_sum, correct, seen = totals.tolist()
                    bar.set_postfix(loss=f"{loss_sum / seen:.3f}", acc=f"{100 * correct / seen:.1f}", refresh=False)
                bar.update(1)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        elapsed = time.perf_counter() - t0
        loss_sum, correct, seen = sum_over_ranks(totals).tolist()
        record = {"train_loss": loss_sum / seen, "train_top1": 100 * correct / seen, "epoch_time": elapsed,
                  "images_per_s": seen / elapsed, "step": self.step, **draw_statistics(draws)}
        if sampled:
            record["temperature"] = self.net.sample_temperature
        return record

    def _step(self, x: torch.Tensor, y: torch.Tensor, draws: list[Any] | None) -> torch.Tensor:
        """One training step (its draw appended to ``draws``; with a gate loader, then a gate step on the next
        held-out batch); returns its loss sum, correct answers and images."""
        held_out = self.gate_loader is not None and self.gate_optimizer is not None  # while the gates learn
        out, loss = self._pass(x, y, [self.optimizer] if held_out or self.gate_optimizer is None else
                               [self.optimizer, self.gate_optimizer])
        if draws is not None:
            record_draw(self.net, draws)
        if held_out:
            self._pass(*self._gate_batch(self.step), [cast(torch.optim.Optimizer, self.gate_optimizer)])
        self.step += 1
        return torch.stack([loss.detach().float() * len(y), (out.argmax(1) == y).sum().float(),
                            torch.tensor(float(len(y)), device=out.device)])

    def _pass(self, x: torch.Tensor, y: torch.Tensor,
              optimizers: list[torch.optim.Optimizer]) -> tuple[torch.Tensor, torch.Tensor]:
        """Forward, backward and a step of ``optimizers`` (the others' gradients are dropped at their next pass);
        returns the outputs and the mean loss."""
        with autocast(self.device, self.amp):
            out = self.model(x.contiguous(memory_format=torch.channels_last) if self.channels_last else x)
            if any(hasattr(g, "surrogate") for _, g in self.net.gates()):  # a kind whose gradient needs the loss
                losses = F.cross_entropy(out, y, reduction="none")
                loss, objective = losses.mean(), losses.mean() + self.net.surrogate_loss(losses)
            else:
                loss = objective = F.cross_entropy(out, y)
        self.optimizer.zero_grad(set_to_none=True)
        if self.gate_optimizer is not None:
            self.gate_optimizer.zero_grad(set_to_none=True)
        if self.scaler is not None:
            self.scaler.scale(objective).backward()
            for optimizer in optimizers:
                self.scaler.step(optimizer)
            self.scaler.update()
        else:
            objective.backward()
            for optimizer in optimizers:
                optimizer.step()
        return out, loss

    def _gate_batch(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The held-out batch of gate step ``index``: batch ``index % n`` of the gate loader's epoch ``index // n``."""
        loader = cast(Any, self.gate_loader)
        n = len(loader)
        if self._gate_batches is None or self._gate_batches[0] != index or index % n == 0:  # a start or a resume
            self._gate_batches = (index, iter(loader.epoch(index // n, start=index % n)))
        batch = next(self._gate_batches[1])
        self._gate_batches = (index + 1, self._gate_batches[1])
        return batch

    def _freeze(self, epoch: int) -> None:
        """Fix the connectivity to each block's top-K and stop updating gates; the gates it reads are
        snapshotted first (unless this step's regular snapshot holds them)."""
        if self.snapshot_every and self.net.gate_parameters() and self._snapshot_step != self.step:
            self._snapshot(float(epoch), freeze=True)
        self._frozen_from = self.net.gate_kind
        self.net.freeze()
        drop_gate_group(self.optimizer)
        self.gate_optimizer = None
        self._wrap()

    def _check_finite(self, epoch: int, loss: float, batch: int | None = None) -> None:
        """A DivergenceError (on every rank) where a trained weight or a batch norm's running statistic is no
        longer finite; the checkpoint on disk stays the last good one."""
        if _all(_finite(self.net), self.device):
            return
        self._fresh = False
        kept = f"{self.out_dir / 'last.pt'} holds epoch {self._saved[0]}" if self._saved else "nothing was saved"
        where = f"epoch {epoch + 1}" + (f" (batch {batch})" if batch else "")
        raise DivergenceError(f"training diverged in {where}, train loss {loss:.4g}: weights are no longer finite; "
                              f"{kept}. Train again with a lower learning rate, in a new out_dir")

    def _snapshot(self, epoch: float, freeze: bool = False) -> None:
        if not self.is_main:
            return
        record = gate_snapshot(self.net, self.step, epoch, tie_order=self.step == 0 or freeze)
        if record is not None:
            with open(self.out_dir / "gates.jsonl", "a") as f:
                f.write(json.dumps(record) + "\n")
            self._snapshot_step = self.step

    # --------------------------------------------------------------------------------------- checkpoints
    def state(self) -> dict[str, Any]:
        """The checkpoint dict of the training state now."""
        within = None if self._within is None else {**self._within, "draws": [
            [(m.cpu(), a.cpu()) for m, a in step] for step in self._within["draws"]]}
        return make_checkpoint(self.net, optimizer=self.optimizer.state_dict(), epoch=self.epoch, step=self.step,
                               gate_optimizer=self.gate_optimizer.state_dict() if self.gate_optimizer else None,
                               scaler=None if self.scaler is None else self.scaler.state_dict(),
                               recipe=self.recipe.to_dict(), history=self.history, best_top1=self.best_top1,
                               meta=self.meta, within_epoch=within, rng=torch.get_rng_state(),
                               frozen_from=self._frozen_from, data_seed=getattr(self.train_loader, "seed", None))

    def _save(self, best: bool) -> None:
        saved = (self.epoch, 0 if self._within is None else self._within["batch"])
        if self.is_main:
            last, state = self.out_dir / "last.pt", self.state()
            try:
                if best:  # before .next.pt: a run stopped before it rewrites this epoch and best.pt
                    save_checkpoint(state, self.out_dir / "best.pt")
                following = save_checkpoint(state, self.out_dir / ".next.pt")
                if last.exists():
                    os.replace(last, self.out_dir / "previous.pt")
                os.replace(following, last)
            except OSError as exc:  # a full disk, a quota: say what the folder still holds
                kept = (f"{last} still holds epoch {self._saved[0]}" if self._saved else "no checkpoint was written")
                raise CheckpointError(f"cannot write the checkpoint of epoch {saved[0]} to {exc.filename or last}: "
                                      f"{exc.strerror or exc}; {kept} (make room and run again to resume)") from exc
        self._saved, self._fresh = saved, True

    def load(self, path: str | os.PathLike) -> None:
        """Restore the training state of a checkpoint this trainer's run wrote; a damaged ``last.pt`` falls back
        to ``previous.pt`` with a warning."""
        path = path_of(path)
        try:
            ckpt = load_checkpoint(path)
        except CheckpointError as exc:
            if path.name not in ("last.pt", ".next.pt") or not path.with_name("previous.pt").exists():
                raise
            warnings.warn(f"{exc}; resuming from previous.pt instead", stacklevel=2)
            path = path.with_name("previous.pt")
            ckpt = load_checkpoint(path)
        if "optimizer" not in ckpt:
            raise CheckpointError(f"{path} holds a network but no training state to resume")
        if self.resume_check is not None:
            self.resume_check(ckpt)
        _check_same_run(ckpt, path, self)
        self._set_net(net_from_checkpoint(ckpt))
        self.optimizer.load_state_dict(ckpt["optimizer"])
        if self.gate_optimizer is not None and ckpt.get("gate_optimizer"):
            self.gate_optimizer.load_state_dict(ckpt["gate_optimizer"])
        if self.scaler is not None and ckpt["scaler"]:
            self.scaler.load_state_dict(ckpt["scaler"])
        torch.set_rng_state(ckpt["rng"])
        self.epoch, self.step, self.history = ckpt["epoch"], ckpt["step"], ckpt["history"]
        self.best_top1 = ckpt["best_top1"]
        self._frozen_from, self.meta = ckpt["frozen_from"], {**ckpt["meta"], **self.meta}
        self._within = ckpt["within_epoch"]
        if self._within is not None:
            self._last_connectivity = self._within["last_connectivity"]
        self._saved, self._fresh = (self.epoch, 0 if self._within is None else self._within["batch"]), True
        if (path.name == ".next.pt" and path.parent.resolve() == self.out_dir.resolve() and self.is_main
                and not (self.out_dir / "last.pt").exists()):
            os.replace(path, self.out_dir / "last.pt")  # the save a stop cut short between its renames, finished
        if self.is_main:
            write_jsonl(self.out_dir / "log.jsonl", self.history)
            snapshots = self.out_dir / "gates.jsonl"
            if snapshots.exists():
                kept = [r for r in read_jsonl(snapshots, torn_tail=True) if r["step"] <= self.step]
                write_jsonl(snapshots, kept)
                self._snapshot_step = kept[-1]["step"] if kept else None


def _resume_path(out_dir: Path, resume: bool | str | os.PathLike, device: torch.device) -> Path | None:
    """The checkpoint ``fit(resume=...)`` goes on from: a path given, else ``last.pt`` (or the ``.next.pt`` a stop
    between the renames of a save left, or, where ``last.pt`` is gone, the previous.pt ``load`` falls back to)."""
    if resume not in (True, "auto"):
        return path_of(resume)  # type: ignore[arg-type]
    last, following = out_dir / "last.pt", out_dir / ".next.pt"
    found = (last if last.exists() else following if following.exists()
             else last if (out_dir / "previous.pt").exists() else None)
    if resume is True and found is None:
        raise CheckpointError(f"resume=True, but {out_dir} holds no checkpoint")
    if _over_ranks(float(found is not None), "min", device) != _over_ranks(float(found is not None), "max", device):
        raise CheckpointError("the ranks disagree on whether there is a checkpoint: give them a shared out_dir")
    return found


def _check_same_run(ckpt: dict[str, Any], path: Path, trainer: Trainer) -> None:
    """A CheckpointError unless ``ckpt`` is of the run ``trainer`` is set up for: the same architecture, gate
    kind (as it was before either froze), K, recipe and data seed."""
    from connlearn.graph import BranchGraph

    saved, given = BranchGraph.from_json(ckpt["graph"]), trainer.net.graph()
    kinds = (ckpt["frozen_from"] or saved.gate_kind, trainer._frozen_from or given.gate_kind)
    differ = [f"{name}: {a} there, {b} here" for name, a, b in (
        ("gate", *kinds), ("K", saved.K, given.K),
        ("data seed", ckpt["data_seed"], getattr(trainer.train_loader, "seed", None))) if a != b]
    if architecture(saved) != architecture(given):
        differ.append("the architecture")
    if ckpt["recipe"] != trainer.recipe.to_dict():
        theirs, mine = ckpt["recipe"], trainer.recipe.to_dict()
        differ += [f"recipe {k}: {theirs.get(k)!r} there, {mine[k]!r} here" for k in mine if theirs.get(k) != mine[k]]
    within = ckpt["within_epoch"]
    if within is not None and within["batch"] >= len(trainer.train_loader):
        differ.append(f"the training loader (batch {within['batch']} of {len(trainer.train_loader)} an epoch)")
    if differ:
        raise CheckpointError(f"{path} is of another run ({'; '.join(differ)}): resume it with the settings it was "
                              "trained with, or train in another out_dir")


def _summary_line(r: dict[str, Any], total: int) -> str:
    line = (f"epoch {r['epoch']}/{total} (phase {r['phase']}, lr {r['lr']:g}): train loss {r['train_loss']:.3f} "
            f"top-1 {r['train_top1']:.1f}%")
    if r.get("test_top1") is not None:
        line += f" | eval loss {r['test_loss']:.3f} top-1 {r['test_top1']:.2f}% (best {r['best_top1']:.2f}%)"
    return line + f" | {r['epoch_time']:.0f}s, {r['images_per_s']:.0f} img/s"
