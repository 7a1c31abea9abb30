"""The optimizers of a training run: the weights' SGD and, where the gates train on their own, theirs.

The paper trains the gates in the weights' SGD, in a param group of their own (own lr, no weight decay).
``Recipe(gate_optimizer="adam")`` gives them Adam at the phase's gate lr instead, as differentiable NAS
trains its architecture; a ``gate_loader`` of held-out batches gives them a step of their own on the next
held-out batch after every weight step (a first-order bilevel step, as DARTS's). Either way the gates do not
move in the recipe's ``gate_warmup`` epochs, the :class:`~connlearn.updater.GateUpdater` clips them after each
of their steps, and the freeze takes them out of every optimizer.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from connlearn.net import ConnectivityNet
from connlearn.train.metrics import Loader
from connlearn.train.recipe import Recipe
from connlearn.updater import GateUpdater, drop_gate_group, param_groups


class Optimizers:
    """``weights``: SGD over the weights (and the gates, unless they have their own); ``gates``: the gates'
    own optimizer, or None (none of their own, or frozen); ``scaler``: fp16's GradScaler (else a disabled one)."""

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

    def for_training_batch(self) -> list[torch.optim.Optimizer]:
        """The optimizers a training batch steps: all but the gates' where they step on held-out batches."""
        return [self.weights] if self.gate_loader is not None and self.gates is not None else self.all

    def for_held_out_batch(self) -> list[torch.optim.Optimizer]:
        """The optimizer a held-out batch steps: the gates' own."""
        return self.all[1:]

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
