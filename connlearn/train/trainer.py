"""The GateConnect trainer: a :class:`~connlearn.train.recipe.Recipe` run on a network, in plain PyTorch.

Each epoch appends a JSON line to ``log.jsonl`` (losses, top-1/top-5, learning rates, times, active branches,
gate and draw statistics) and writes ``last.pt`` and ``best.pt`` whole (:mod:`connlearn.train.run_folder`);
every ``snapshot_every`` steps and at the freeze the real gates go to ``gates.jsonl``. ``fit(resume="auto")``
goes on exactly: a run stopped after any epoch, or within one at a checkpoint or a stop signal, ends as an
uninterrupted one (timings aside) on the CPU. Under ``torch.distributed``: DDP, metrics summed over the
ranks, files from rank 0; give each rank its shard (the loaders' ``rank``/``world_size``).
"""

from __future__ import annotations

import inspect
import itertools
import math
import os
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm
from tqdm.auto import tqdm

from connlearn.errors import CheckpointError, DivergenceError
from connlearn.files import path_of
from connlearn.net import ConnectivityNet
from connlearn.train.checkpoint import architecture, make_checkpoint, net_from_checkpoint
from connlearn.train.metrics import (
    Loader,
    autocast,
    connectivity_numbers,
    distributed,
    draw_statistics,
    evaluate,
    on_every_rank,
    recalibrate_batch_norm,
    record_draw,
    sum_over_ranks,
)
from connlearn.train.options import RunConfig
from connlearn.train.recipe import Recipe
from connlearn.train.run_folder import RunFolder
from connlearn.train.signals import StopRequests
from connlearn.updater import GateUpdater, drop_gate_group, param_groups


def _finite(net: ConnectivityNet) -> bool:
    """Whether every trained weight and every batch norm's running statistic is finite."""
    tensors = [p for p in net.parameters() if p.requires_grad] + [
        s for m in net.modules() if isinstance(m, _BatchNorm) for s in (m.running_mean, m.running_var) if s is not None]
    return bool(torch.stack([torch.isfinite(t).all() for t in tensors]).all())


def _check_finite(net: ConnectivityNet, folder: RunFolder, epoch: int, loss: float, batch: int | None = None) -> None:
    """A DivergenceError (on every rank) where a trained weight or a batch norm's running statistic is no longer
    finite; the checkpoint on disk stays the last good one."""
    if on_every_rank(_finite(net), folder.device):
        return
    kept = f"{folder.last} holds epoch {folder.saved[0]}" if folder.saved else "nothing was saved"
    where = f"epoch {epoch + 1}" + (f" (batch {batch})" if batch else "")
    raise DivergenceError(f"training diverged in {where}, train loss {loss:.4g}: weights are no longer finite; "
                          f"{kept}. Train again with a lower learning rate, in a new out folder")


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


def _epoch_so_far(within: dict[str, Any] | None, device: torch.device,
                  is_main: bool) -> tuple[torch.Tensor, list[Any], torch.Tensor, float]:
    """An epoch's loss sum, correct answers and images, its draws, the global random state it began with and its
    seconds: none yet, or what a checkpoint ``within`` it holds (the other ranks add theirs to rank 0's)."""
    if within is None:
        return torch.zeros(3, device=device), [], torch.get_rng_state(), 0.0
    totals = within["sums"].to(device) if is_main else torch.zeros(3, device=device)
    draws = [[(m.to(device), a.to(device)) for m, a in step] for step in within["draws"]]
    return totals, draws, within["rng_at_start"], within["elapsed"]


def _show(bar: Any, totals: torch.Tensor, shown: float, last: bool) -> float:
    """The epoch's loss and accuracy so far on its progress bar, read (a wait on a GPU) once a second; returns
    when they were last shown."""
    if not bar.disable and (time.perf_counter() >= shown + 1.0 or last):
        shown = time.perf_counter()
        loss_sum, correct, seen = totals.tolist()
        bar.set_postfix(loss=f"{loss_sum / seen:.3f}", acc=f"{100 * correct / seen:.1f}", refresh=False)
    bar.update(1)
    return shown


class Optimizers:
    """``weights``: SGD over the weights (and the gates, unless they have their own); ``gates``: the gates'
    own optimizer, or None (none of their own, or frozen); ``scaler``: fp16's GradScaler (else a disabled one).

    The paper trains the gates in the weights' SGD, in a param group of their own (own lr, no weight decay).
    ``Recipe(gate_optimizer="adam")`` gives them Adam at the phase's gate lr instead, as differentiable NAS
    trains its architecture; a ``gate_loader`` of held-out batches gives them a step of their own on the next
    held-out batch after every weight step (a first-order bilevel step, as DARTS's). Either way the gates do
    not move in the recipe's ``gate_warmup`` epochs, the :class:`~connlearn.updater.GateUpdater` clips them
    after each of their steps, and the freeze takes them out of every optimizer."""

    def __init__(self, net: ConnectivityNet, recipe: Recipe, gate_loader: Loader | None,
                 scaler: torch.amp.GradScaler) -> None:
        self.recipe, self.gate_loader, self.scaler = recipe, gate_loader, scaler
        self._held_out: tuple[int, Iterator[Any]] | None = None  # the next gate step's index, its batches
        self.updater = GateUpdater(net, grad_mode=recipe.gate_rule)
        phase = recipe.phases[0]
        groups = param_groups(net, phase.lr, recipe.weight_decay, phase.gate_lr, recipe.gate_momentum)
        own = len(groups) > 1 and (recipe.gate_optimizer == "adam" or gate_loader is not None)
        sgd: dict[str, Any] = {"momentum": recipe.momentum}
        self.weights = torch.optim.SGD(groups[:1] if own else groups, lr=phase.lr, **sgd)
        self.gates: torch.optim.Optimizer | None = None
        if own and recipe.gate_optimizer == "adam":
            self.gates = torch.optim.Adam([{k: v for k, v in groups[1].items() if k != "momentum"}])
        elif own:
            self.gates = torch.optim.SGD(groups[1:], lr=phase.gate_lr, **sgd)
        self.updater.attach(self.gates or self.weights)

    @property
    def all(self) -> list[torch.optim.Optimizer]:
        return [self.weights] + ([self.gates] if self.gates is not None else [])

    def start_epoch(self, epoch: int) -> None:
        """Set the learning rates of ``epoch``'s phase; the gates' is 0 in the warm-up, where they stay as they
        start (the draws go on)."""
        phase = self.recipe.phase_at(epoch)[1]
        learning = epoch >= self.recipe.gate_warmup
        for group in (g for optimizer in self.all for g in optimizer.param_groups):
            group["lr"] = (phase.gate_lr if learning else 0.0) if group.get("name") == "gates" else phase.lr

    def temperature_at(self, epoch: int, batch: int, batches: int) -> float:
        """The draws' temperature at ``batch`` (of ``batches``) of ``epoch``: its phase's schedule, from the phase's
        first step to its last."""
        index, phase = self.recipe.phase_at(epoch)
        done = (epoch - sum(p.epochs for p in self.recipe.phases[:index])) * batches + batch  # the phase's steps
        return phase.temperature_at(done / max(phase.epochs * batches - 1, 1))

    def held_out_batch(self, index: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The held-out batch of gate step ``index`` (batch ``index % n`` of the gate loader's epoch ``index // n``),
        or None where the gates take no step of their own."""
        if self.gate_loader is None or self.gates is None:
            return None
        n = len(self.gate_loader)
        if self._held_out is None or self._held_out[0] != index or index % n == 0:  # a start or a resume
            self._held_out = (index, iter(self.gate_loader.epoch(index // n, start=index % n)))  # type: ignore[call-arg]
        batch = next(self._held_out[1])
        self._held_out = (index + 1, self._held_out[1])
        return batch

    def step(self, objective: torch.Tensor, optimizers: list[torch.optim.Optimizer]) -> None:
        """Backward from ``objective`` and a step of ``optimizers``; the others' gradients are dropped."""
        for optimizer in self.all:
            optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(objective).backward()
        for optimizer in optimizers:
            self.scaler.step(optimizer)
        self.scaler.update()

    def freeze(self) -> None:
        """After ``net.freeze()``: the gates leave the weights' SGD, and their own optimizer goes."""
        drop_gate_group(self.weights)
        self.gates = None

    def state_dict(self) -> dict[str, Any]:
        """The checkpoint's entries ``optimizer``, ``gate_optimizer`` and ``scaler``."""
        return {"optimizer": self.weights.state_dict(),
                "gate_optimizer": None if self.gates is None else self.gates.state_dict(),
                "scaler": self.scaler.state_dict()}

    def load_state_dict(self, ckpt: dict[str, Any]) -> None:
        self.weights.load_state_dict(ckpt["optimizer"])
        if self.gates is not None and ckpt.get("gate_optimizer"):
            self.gates.load_state_dict(ckpt["gate_optimizer"])
        if ckpt["scaler"]:
            self.scaler.load_state_dict(ckpt["scaler"])


class Execution:
    """How a network trains, as ``config`` says: on its device (default CUDA where there is one), under autocast
    (``auto``: bf16 on CUDA, off on the CPU; ``fp16`` with a GradScaler), channels-last or not,
    ``torch.compile``-d or not, in DDP under torch.distributed."""

    def __init__(self, config: RunConfig) -> None:
        self.device = torch.device(config.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.amp = {"bf16": torch.bfloat16, "fp16": torch.float16, "none": None,
                    "auto": torch.bfloat16 if self.device.type == "cuda" else None}[config.amp]
        self.compile = "default" if config.compile is True else config.compile
        self.channels_last = config.channels_last
        if self.device.type == "cuda":
            torch.backends.cudnn.benchmark = True  # fixed shapes: cuDNN's autotuned kernels are chosen once

    def place(self, net: ConnectivityNet) -> ConnectivityNet:
        layout = torch.channels_last if self.channels_last else torch.preserve_format
        return cast(ConnectivityNet, net.to(self.device, memory_format=layout))  # type: ignore[call-overload]

    def wrap(self, net: ConnectivityNet) -> Any:
        """``net`` in DDP under torch.distributed, compiled if asked (again after the freeze)."""
        model: torch.nn.Module = net
        if distributed():
            model = torch.nn.parallel.DistributedDataParallel(
                model, device_ids=[self.device.index] if self.device.type == "cuda" else None)
        return torch.compile(model, mode=self.compile) if self.compile else model

    def evaluate(self, model: torch.nn.Module, loader: Loader) -> dict[str, float]:
        return evaluate(model, loader, amp=self.amp, channels_last=self.channels_last)


class Trainer:
    """Runs ``recipe`` on ``net`` with SGD, writing logs and checkpoints to ``config.output`` (its ``out``; see
    the module docstring). ``config``'s machine options say how (``device``, ``amp``, ``compile``, ``channels_last``,
    ``tensorboard``, ``progress``), and ``snapshot_every``, ``checkpoint_every``, ``eval_every`` and
    ``recalibrate_bn`` when (``connlearn train --help`` says each); its other options are the protocol's.

    Args:
        net: the network; a resume replaces it by the checkpoint's. train_loader, test_loader: ``len()`` and
            ``epoch(e, start=0)`` giving ``(images, labels)`` on the device (``test_loader`` may be None).
        gate_loader: held-out batches for the gates' own steps (see :class:`Optimizers`).
        meta: JSON-able facts kept in the checkpoints. resume_check: called with the checkpoint a resume is
            about to load; it raises to refuse it.
    """

    def __init__(self, net: ConnectivityNet, train_loader: Loader, test_loader: Loader | None, recipe: Recipe,
                 config: RunConfig, *, gate_loader: Loader | None = None, meta: dict[str, Any] | None = None,
                 resume_check: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.config, self.execution = config, Execution(config)
        self.train_loader, self.test_loader, self.recipe = train_loader, test_loader, recipe
        self.gate_loader, self.device = gate_loader, self.execution.device
        self.folder = RunFolder(config.output, self.device)
        self.out_dir, self.is_main = self.folder.path, self.folder.is_main
        self.meta, self.resume_check = meta or {}, resume_check
        self.history: list[dict[str, Any]] = []
        self.epoch = self.step = 0
        self.best_top1: float | None = None
        self._within: dict[str, Any] | None = None  # an unfinished epoch: what a checkpoint within it holds
        self._fresh = True  # the state in memory is a checkpoint's (or the start's): fit may go on from it
        self._frozen_from: str | None = None  # the gate kind before the freeze
        self._set_net(net)

    def _set_net(self, net: ConnectivityNet) -> None:
        self.net = self.execution.place(net)
        scaler = torch.amp.GradScaler(self.device.type, enabled=self.execution.amp is torch.float16)
        self.optimizers = Optimizers(self.net, self.recipe, self.gate_loader, scaler)
        self._last_connectivity = self.net.connectivity()
        self.model = self.execution.wrap(self.net)

    # --------------------------------------------------------------------------------------------- fit
    def fit(self, *, resume: bool | str | os.PathLike = "auto", max_epochs: int | None = None,
            time_limit: float | None = None, stop_signals: Iterable[Any] | None = ()) -> list[dict[str, Any]]:
        """Train to the end of the recipe (or ``max_epochs`` more); returns the epoch log.

        ``resume``: ``"auto"`` goes on from ``out/last.pt`` where there is one, ``True`` requires it,
        ``False`` starts afresh (removing the folder's checkpoints), a path resumes from that checkpoint.
        ``time_limit`` (seconds): start no epoch after it. ``stop_signals`` (e.g.
        :data:`~connlearn.train.signals.STOP_SIGNALS`): on the first one, stop at the next step with a checkpoint
        and raise :class:`~connlearn.train.signals.TrainingStopped`."""
        stop = StopRequests(stop_signals, time_limit, self.device, say=self.is_main)
        with self.folder.held(), stop:
            self._resume(resume)
            self._start()
            end = self.recipe.total_epochs if max_epochs is None else min(self.recipe.total_epochs,
                                                                          self.epoch + max_epochs)
            while self.epoch < end and stop.time_left():
                self._stop_if(stop.signal())
                self._run_epoch(self.epoch, stop)
            self._stop_if(stop.signal())  # in the last epoch: it ends here all the same
        return self.history

    def _resume(self, resume: bool | str | os.PathLike) -> None:
        """Load the checkpoint ``resume`` asks for (see ``fit``), unless memory holds what ``last.pt`` holds."""
        in_memory = resume in (True, "auto") and self.folder.saved is not None and self._fresh
        if resume is False:
            self.folder.clear()
        path = None if resume is False or in_memory else self.folder.resume_path(resume)
        if path is not None:
            self.load(path)
        elif not self._fresh:
            raise CheckpointError(f"this trainer was stopped within epoch {self.epoch + 1} and has no checkpoint "
                                  "to go on from: make a new Trainer (and network)")

    def _start(self) -> None:
        if self.config.tensorboard:
            self.folder.open_board(self.epoch)
        if self.step:
            return
        if self.recipe.gate_rule == "renormalized":
            self.optimizers.updater.renormalize()  # Algorithm 1 normalises before the first forward pass
        self.folder.restart_snapshots()
        if self.config.snapshot_every:
            first = self.recipe.phases[0]
            if self.net.stochastic and not first.frozen:
                self.net.sample_temperature = first.temperature_at(0.0)
            self.folder.snapshot(self.net, self.step, 0.0, tie_order=True)

    def _stop_if(self, signum: int) -> None:
        if signum:
            raise self.folder.stopped(signum)

    # ------------------------------------------------------------------------------------------- epochs
    def _run_epoch(self, epoch: int, stop: StopRequests) -> None:
        index, phase = self.recipe.phase_at(epoch)
        if phase.frozen and not self.net.fixed_connectivity:
            self._freeze(epoch)
        self.optimizers.start_epoch(epoch)
        record: dict[str, Any] = {"epoch": epoch + 1, "phase": index + 1, "lr": phase.lr,
                                  "gate_lr": phase.gate_lr if self.net.gate_parameters() else None}
        record.update(self._train_epoch(epoch, stop))
        _check_finite(self.net, self.folder, epoch, record["train_loss"])
        record.update(self._evaluate(epoch))
        record.update(connectivity_numbers(self.net, self._last_connectivity))
        self._last_connectivity = self.net.connectivity()
        top1 = record.get("test_top1")
        best = top1 is not None and (self.best_top1 is None or top1 > self.best_top1)
        self.best_top1 = record["best_top1"] = top1 if best else self.best_top1
        self.epoch = epoch + 1
        self.history.append(record)
        self._save(best)  # first: a log that cannot be written loses no epoch (a resume rewrites the log)
        self.folder.log(self.history, _summary_line(record, self.recipe.total_epochs))

    def _train_epoch(self, epoch: int, stop: StopRequests) -> dict[str, Any]:
        self.model.train()
        within, self._within = self._within, None
        index, phase = self.recipe.phase_at(epoch)
        n, start = len(self.train_loader), 0 if within is None else within["batch"]
        sampled = self.net.stochastic and not phase.frozen
        totals, draws, rng, elapsed = _epoch_so_far(within, self.device, self.is_main)
        bar = tqdm(total=n, initial=start, disable=not (self.config.progress and self.is_main), leave=False,
                   desc=f"epoch {epoch + 1}/{self.recipe.total_epochs} (phase {index + 1})", dynamic_ncols=True)
        t0, shown = time.perf_counter() - elapsed, -math.inf
        with bar:
            for i, (x, y) in enumerate(_batches(self.train_loader, epoch, start, rng), start):
                self._fresh = False  # from here on, what is in memory is no checkpoint's state
                if sampled:
                    self.net.sample_temperature = self.optimizers.temperature_at(epoch, i, n)
                totals += self._step(x, y, draws if sampled else None)
                if self.config.snapshot_every and self.step % self.config.snapshot_every == 0:
                    self.folder.snapshot(self.net, self.step, epoch + (i + 1) / n, tie_order=False)
                if i + 1 < n:
                    signum = stop.signal(self.step)
                    if signum or (self.config.checkpoint_every and self.step % self.config.checkpoint_every == 0):
                        self._save_within(epoch, i + 1, totals, draws, rng, time.perf_counter() - t0)
                    self._stop_if(signum)
                shown = _show(bar, totals, shown, i == n - 1)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        elapsed = time.perf_counter() - t0
        loss_sum, correct, seen = sum_over_ranks(totals).tolist()
        record = {"train_loss": loss_sum / seen, "train_top1": 100 * correct / seen, "epoch_time": elapsed,
                  "images_per_s": seen / elapsed, "step": self.step, **draw_statistics(draws)}
        if sampled:
            record["temperature"] = self.net.sample_temperature
        return record

    def _save_within(self, epoch: int, batch: int, totals: torch.Tensor, draws: list[Any], rng: torch.Tensor,
                     elapsed: float) -> None:
        """A checkpoint after ``batch`` batches of ``epoch``, holding what the epoch has summed and drawn so far."""
        sums = sum_over_ranks(totals.clone()).cpu()
        self._within = {"batch": batch, "sums": sums, "draws": draws, "elapsed": elapsed, "rng_at_start": rng,
                        "last_connectivity": self._last_connectivity}
        _check_finite(self.net, self.folder, epoch, (sums[0] / sums[2]).item(), batch)
        self._save(best=False)
        self._within = None

    def _step(self, x: torch.Tensor, y: torch.Tensor, draws: list[Any] | None) -> torch.Tensor:
        """One training step (its draw appended to ``draws``; where the gates step on held-out batches, then
        theirs); returns its loss sum, correct answers and images."""
        held_out, every = self.optimizers.held_out_batch(self.step), self.optimizers.all
        out, loss = self._pass(x, y, every if held_out is None else every[:1])
        if draws is not None:
            record_draw(self.net, draws)
        if held_out is not None:  # the gates' own step
            self._pass(*held_out, every[1:])
        self.step += 1
        return torch.stack([loss.detach().float() * len(y), (out.argmax(1) == y).sum().float(),
                            torch.tensor(float(len(y)), device=out.device)])

    def _pass(self, x: torch.Tensor, y: torch.Tensor,
              optimizers: list[torch.optim.Optimizer]) -> tuple[torch.Tensor, torch.Tensor]:
        """Forward, backward and a step of ``optimizers``; returns the outputs and the mean loss."""
        with autocast(self.device, self.execution.amp):
            out = self.model(x.contiguous(memory_format=torch.channels_last) if self.config.channels_last else x)
            losses = F.cross_entropy(out, y, reduction="none")
            loss = losses.mean()
            objective = loss + self.net.surrogate_loss(losses)  # what the gate kind adds (score's); else 0
        self.optimizers.step(objective, optimizers)
        return out, loss

    def _evaluate(self, epoch: int) -> dict[str, Any]:
        """The eval numbers after ``epoch`` where it is one to evaluate (with the batch norms recalibrated first
        after the last), else none."""
        last = epoch + 1 == self.recipe.total_epochs
        if self.test_loader is None or not ((epoch + 1) % self.config.eval_every == 0 or last):
            return {}
        t0 = time.perf_counter()
        record: dict[str, Any] = self.execution.evaluate(self.model, self.test_loader)
        if last and self.config.recalibrate_bn:
            record["test_top1_before_recalibration"] = record["test_top1"]
            recalibrate_batch_norm(self.net, self.train_loader.epoch(epoch), self.config.recalibrate_bn,
                                   self.execution.amp)
            record.update(self.execution.evaluate(self.model, self.test_loader))
        return {**record, "eval_time": time.perf_counter() - t0}

    def _freeze(self, epoch: int) -> None:
        """Fix the connectivity to each block's top-K and stop updating gates; the gates it reads are
        snapshotted first (unless this step's regular snapshot holds them)."""
        if self.config.snapshot_every and self.net.gate_parameters() and self.folder.snapshot_step != self.step:
            self.folder.snapshot(self.net, self.step, float(epoch), tie_order=True)
        self._frozen_from = self.net.gate_kind
        self.net.freeze()
        self.optimizers.freeze()
        self.model = self.execution.wrap(self.net)

    # --------------------------------------------------------------------------------------- checkpoints
    def state(self) -> dict[str, Any]:
        """The checkpoint dict of the training state now."""
        within = None if self._within is None else {**self._within, "draws": [
            [(m.cpu(), a.cpu()) for m, a in step] for step in self._within["draws"]]}
        return make_checkpoint(self.net, **self.optimizers.state_dict(), epoch=self.epoch, step=self.step,
                               recipe=self.recipe.to_dict(), history=self.history, best_top1=self.best_top1,
                               meta=self.meta, within_epoch=within, rng=torch.get_rng_state(),
                               frozen_from=self._frozen_from, data_seed=getattr(self.train_loader, "seed", None))

    def _position(self) -> tuple[int, int]:
        """Epochs done and batches of the next."""
        return self.epoch, 0 if self._within is None else self._within["batch"]

    def _save(self, best: bool) -> None:
        self.folder.save(self.state, self._position(), best)
        self._fresh = True

    def load(self, path: str | os.PathLike) -> None:
        """Restore the training state of a checkpoint this trainer's run wrote; a damaged ``last.pt`` falls back
        to ``previous.pt`` with a warning."""
        ckpt, path = self.folder.read(path_of(path))
        if self.resume_check is not None:
            self.resume_check(ckpt)
        _check_same_run(ckpt, path, self)
        self._set_net(net_from_checkpoint(ckpt))
        self.optimizers.load_state_dict(ckpt)
        torch.set_rng_state(ckpt["rng"])
        self.epoch, self.step, self.history, self.best_top1 = (ckpt["epoch"], ckpt["step"], ckpt["history"],
                                                                ckpt["best_top1"])
        self._frozen_from, self.meta = ckpt["frozen_from"], {**ckpt["meta"], **self.meta}
        self._within = ckpt["within_epoch"]
        if self._within is not None:
            self._last_connectivity = self._within["last_connectivity"]
        self.folder.resumed(path, self._position(), self.history, self.step)
        self._fresh = True


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
                              "trained with, or train in another out folder")


def _summary_line(r: dict[str, Any], total: int) -> str:
    line = (f"epoch {r['epoch']}/{total} (phase {r['phase']}, lr {r['lr']:g}): train loss {r['train_loss']:.3f} "
            f"top-1 {r['train_top1']:.1f}%")
    if r.get("test_top1") is not None:
        line += f" | eval loss {r['test_loss']:.3f} top-1 {r['test_top1']:.2f}% (best {r['best_top1']:.2f}%)"
    return line + f" | {r['epoch_time']:.0f}s, {r['images_per_s']:.0f} img/s"
