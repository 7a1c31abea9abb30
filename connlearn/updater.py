"""GateUpdater: keeps the real gates in [0, 1] under any ``torch.optim`` optimizer, and the gate rules.

It attaches as an optimizer step post-hook, so it runs after every real step and not after one that
``torch.amp.GradScaler`` skips. ``grad_mode`` rewrites the gates' gradients before each step (a pre-hook,
after the scaler has unscaled them); the rewrites act on what sampling depends on, the ratios within a row,
and keep their promise under optimizers whose step is linear in the gradient (SGD):

- ``plain``: the paper's rule as the design reads it: the plain gradient, then the clip;
- ``centered``: each row's mean gradient subtracted, so a row cannot drift up or down as a whole;
- ``renormalized``: Algorithm 1 read literally: before each step every row of a sampled kind is divided by
  its sum (the draws are unchanged; the update acts on gates of size 1/C).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from connlearn.errors import check_choice
from connlearn.gates import sampling_distribution

GRAD_MODES = ("plain", "centered", "renormalized")


class GateUpdater:
    """Clamp the clipped gates of ``net`` (a ConnectivityNet, or a wrapper with ``.module``) to [0, 1]
    after each step of the optimizers it is attached to::

        opt = torch.optim.SGD(param_groups(net, lr=0.1, weight_decay=5e-4, gate_lr=0.2), momentum=0.9)
        GateUpdater(net).attach(opt)

    The gates are looked up at every step: after ``net.freeze()`` there is nothing to clamp."""

    def __init__(self, net: nn.Module, *, grad_mode: str = "plain") -> None:
        self.net: Any = getattr(net, "module", net)
        self.grad_mode = check_choice("gate rule", grad_mode, GRAD_MODES)
        self._handles: list[Any] = []

    def gates(self) -> list[nn.Parameter]:
        return [p for _, g in self.net.gates() if g.clipped for p in g.real_parameters()]

    def attach(self, optimizer: torch.optim.Optimizer) -> GateUpdater:
        """Hook onto ``optimizer``; returns ``self``."""
        self._handles.append(optimizer.register_step_post_hook(lambda opt, *_: None if _skipped(opt) else self.clamp()))
        if self.grad_mode != "plain":
            before = self.renormalize if self.grad_mode == "renormalized" else self.center_grads
            self._handles.append(optimizer.register_step_pre_hook(lambda opt, *_: None if _skipped(opt) else before()))
        return self

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    @torch.no_grad()
    def clamp(self) -> None:
        gates: list[torch.Tensor] = list(self.gates())
        if gates:
            torch._foreach_clamp_min_(gates, 0.0)
            torch._foreach_clamp_max_(gates, 1.0)

    @torch.no_grad()
    def renormalize(self) -> None:
        """Divide every row of the sampled gates by its sum (a row of zeros becomes uniform)."""
        for _, g in self.net.gates():
            for p in g.real_parameters() if g.stochastic and g.clipped else ():
                p.copy_(sampling_distribution(p))

    @torch.no_grad()
    def center_grads(self) -> None:
        """Subtract each row's mean from the gates' gradients."""
        for gate in self.gates():
            if gate.grad is not None:
                gate.grad.sub_(gate.grad.mean(dim=-1, keepdim=True))


def _skipped(optimizer: torch.optim.Optimizer) -> bool:
    """Whether GradScaler hands a fused optimizer a step with inf/NaN gradients, which it then skips."""
    found = getattr(optimizer, "found_inf", None)
    return isinstance(found, torch.Tensor) and bool(found.item())


def param_groups(net: nn.Module, lr: float, weight_decay: float, gate_lr: float,
                 gate_momentum: float | None = None) -> list[dict[str, Any]]:
    """Optimizer param groups ``weights`` (lr, weight_decay) and, if the net has gates, ``gates`` (gate_lr,
    no weight decay; ``gate_momentum``: SGD's momentum for the gates alone, 0 for Algorithm 1's plain step)."""
    inner: Any = getattr(net, "module", net)
    groups = [{"params": inner.weight_parameters(), "lr": lr, "weight_decay": weight_decay, "name": "weights"}]
    if inner.gate_parameters():
        groups.append({"params": inner.gate_parameters(), "lr": gate_lr, "weight_decay": 0.0, "name": "gates",
                       **({} if gate_momentum is None else {"momentum": gate_momentum})})
    return groups


#: The per-param-group lists of torch's LR schedulers.
_SCHEDULER_LISTS = ("base_lrs", "_last_lr", "lr_lambdas", "max_lrs", "min_lrs", "base_momentums", "max_momentums")


def drop_gate_group(optimizer: torch.optim.Optimizer, *schedulers: Any) -> list[nn.Parameter]:
    """Remove the ``gates`` param group (and its state) from ``optimizer`` after ``net.freeze()``, and the
    entries of ``schedulers`` for it (and of the schedulers they hold); returns its parameters."""
    gone = [i for i, g in enumerate(optimizer.param_groups) if g.get("name") == "gates"]
    count = len(optimizer.param_groups)
    removed = [p for i in gone for p in optimizer.param_groups[i]["params"]]
    optimizer.param_groups[:] = [g for i, g in enumerate(optimizer.param_groups) if i not in gone]
    for p in removed:
        optimizer.state.pop(p, None)
    todo, seen = list(schedulers), list[Any]()
    while todo:
        scheduler = todo.pop()
        if any(scheduler is s for s in seen):
            continue
        seen.append(scheduler)
        todo.extend(getattr(scheduler, "_schedulers", ()))
        for name in _SCHEDULER_LISTS:
            value = getattr(scheduler, name, None)
            if isinstance(value, list) and len(value) == count:
                setattr(scheduler, name, [v for i, v in enumerate(value) if i not in gone])
    return removed
