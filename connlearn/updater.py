"""GateUpdater: keeps the real gates in [0, 1] under any ``torch.optim`` optimizer.

It attaches to an optimizer as a step post-hook, so it runs after every real step and not after a step
that ``torch.amp.GradScaler`` skips (inf/NaN gradients): a skipped step leaves the gates as they were (a
fused optimizer's step runs under the scaler even when it skips, and the hooks then read the scaler's
``found_inf`` and leave the gates alone too). It never touches weights.

Optionally (``grad_mode``) it rewrites the gates' gradients, or for ``"renormalized"`` the gates, before
each step (a step pre-hook, which runs after GradScaler has unscaled them; under a fused optimizer they
are still scaled, which these linear rewrites do not mind). The default, ``"plain"``, is the paper's rule
as the project's design reads it: the plain gradient, then the clip. The optimizer's step comes in between: under
SGD with momentum 0.9 (the paper's setup, which the trainer gives the gates too) a steady gradient moves
the gates up to ten times as far per step as Algorithm 1's plain step, which ``param_groups(...,
gate_momentum=0)`` gives. The alternatives act on the observation that
sampling depends only on the ratios within a row of gates. They rewrite the gradient, so what they promise
of the update holds for optimizers whose step is linear in it (SGD, with or without momentum); an
adaptive one (Adam, AdamW) rescales every gate on its own, and a row's mean may then move a little:

- ``"centered"``: subtract each row's mean gradient, so that a row cannot drift up or down as a whole
  (drift towards the clip bound flattens the sampling distribution);
- ``"normalized"``: treat the straight-through gradient as the gradient with respect to the normalised
  probabilities p = ĝ / Σĝ and take it back to ĝ by the chain rule: (g − ⟨p, g⟩) / Σĝ;
- ``"double-centered"``: subtract each row's and each column's mean (adding back the grand mean), so that
  neither a row nor a source branch as a whole moves: only a block's preference among its inputs is
  learned (against the column effect seen in BENCHMARKS.md, where every block prefers the same inputs);
- ``"renormalized"``: the paper's Algorithm 1 read literally. Its forward step *assigns* the normalised
  gates, g̃ ← g̃ / Σ g̃, before the update g̃ ← clip(g̃ − η ∂ℓ/∂g): the stored gates of a row sum to 1
  when they are updated, instead of drifting as a whole. The gradient is the plain one; before each step
  every row of a sampled gate kind is divided by its sum (a row of zeros becomes uniform). Sampling only
  sees the ratios within a row, so the draws are those of the same gates unnormalised, but the update
  acts on gates of size 1/C instead of up to 1. Gate kinds whose forward pass uses the values (``real``)
  are left as they are.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from connlearn.errors import ConfigError, ConfigTypeError, check_float, check_name
from connlearn.gates import sampling_distribution
from connlearn.recipe import check_gate_momentum

GRAD_MODES = ("plain", "centered", "normalized", "double-centered", "renormalized")


class GateUpdater:
    """Clamp every real gate of ``net`` to [low, high] after each step of the optimizers it is attached to.

    Usage::

        opt = torch.optim.SGD(param_groups(net, lr=0.1, weight_decay=5e-4, gate_lr=0.2), momentum=0.9)
        updater = GateUpdater(net).attach(opt)
        ...
        updater.detach()

    The gates are looked up on every step, so ``net.freeze()`` (which removes them) needs no re-attaching
    of the updater; the optimizer still holds the removed gates until :func:`drop_gate_group`.
    """

    def __init__(self, net: nn.Module, *, grad_mode: str = "plain", low: float = 0.0, high: float = 1.0) -> None:
        check_name("gate gradient mode", grad_mode, GRAD_MODES)
        inner: Any = getattr(net, "module", None)  # DistributedDataParallel, or an AveragedModel: the network inside
        if not callable(getattr(net, "gate_parameters", None)) and callable(getattr(inner, "gate_parameters", None)):
            net = inner
        if not callable(getattr(net, "gate_parameters", None)):
            raise ConfigTypeError(f"GateUpdater takes a connlearn ConnectivityNet (or a wrapper of one with "
                                  f".module), got {type(net).__name__}")
        self.low, self.high = check_float("low", low), check_float("high", high)
        if self.low >= self.high:
            raise ConfigError(f"low must be below high, got low={low}, high={high}")
        self.net: Any = net  # a ConnectivityNet, or a module with its gate_parameters() (checked above)
        self.grad_mode = grad_mode
        self._handles: list[Any] = []

    def gates(self) -> list[nn.Parameter]:
        return list(self.net.gate_parameters())

    def sampled_gates(self) -> list[nn.Parameter]:
        """The real gates of sampled gate kinds (whose forward pass depends only on the ratios in a row); all
        gates for a network without ``gates()``."""
        if not hasattr(self.net, "gates"):
            return self.gates()
        return [p for _, g in self.net.gates() if g.stochastic for p in g.real_parameters()]

    def attach(self, optimizer: torch.optim.Optimizer) -> GateUpdater:
        """Register the hooks on ``optimizer``; returns ``self``."""
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise ConfigTypeError(f"GateUpdater.attach takes a torch.optim.Optimizer, got {type(optimizer).__name__}")
        self._handles.append(optimizer.register_step_post_hook(
            lambda opt, args, kwargs: None if _skipped(opt) else self.clamp()))
        if self.grad_mode != "plain":
            before = self.renormalize if self.grad_mode == "renormalized" else self.transform_grads
            self._handles.append(optimizer.register_step_pre_hook(
                lambda opt, args, kwargs: None if _skipped(opt) else before()))
        return self

    def detach(self) -> None:
        """Remove every hook this updater registered."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    @torch.no_grad()
    def clamp(self) -> None:
        """Clip every real gate to [low, high] in place."""
        gates: list[torch.Tensor] = list(self.gates())
        if gates:  # two kernels for all of them, as torch's optimizers update their parameters
            torch._foreach_clamp_min_(gates, self.low)
            torch._foreach_clamp_max_(gates, self.high)

    @torch.no_grad()
    def renormalize(self) -> None:
        """Divide every row of the sampled gates by its sum, in place; a row without a positive entry becomes
        uniform (the distribution it samples from)."""
        for gate in self.sampled_gates():
            gate.copy_(sampling_distribution(gate))

    @torch.no_grad()
    def transform_grads(self) -> None:
        """Rewrite the gates' gradients according to ``grad_mode`` (rows are the last dimension)."""
        for gate in self.gates():
            if gate.grad is None:
                continue
            g = gate.grad
            if self.grad_mode == "centered":
                g.sub_(g.mean(dim=-1, keepdim=True))
            elif self.grad_mode == "double-centered":
                g.sub_(g.mean(dim=-1, keepdim=True) + g.mean(dim=-2, keepdim=True) - g.mean(dim=(-2, -1), keepdim=True))
            elif self.grad_mode == "normalized":
                w = gate.clamp(min=0)
                total = w.sum(dim=-1, keepdim=True).clamp(min=1e-12)
                p = w / total
                g.copy_((g - (p * g).sum(dim=-1, keepdim=True)) / total)


def _skipped(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``GradScaler`` runs this step of an optimizer that unscales for itself (a fused one) with
    inf/NaN gradients, which that optimizer then skips. The scaler hands it ``found_inf`` as an attribute
    for the step; reading it waits for the device, so only such steps pay for it."""
    found = getattr(optimizer, "found_inf", None)
    return isinstance(found, torch.Tensor) and bool(found.item())


def param_groups(net: nn.Module, lr: float, weight_decay: float, gate_lr: float,
                 gate_momentum: float | None = None) -> list[dict[str, Any]]:
    """Optimizer param groups: weights with (lr, weight_decay); real gates, if any, with (gate_lr, no
    weight decay). Each group carries a ``name`` ('weights' or 'gates'). The rates and the decay must be
    finite and non-negative (PyTorch checks only an optimizer's default ``lr``).

    ``gate_momentum`` (SGD's ``momentum`` for the gates' group alone; ``None``: the optimizer's own) set to 0
    gives the gates Algorithm 1's plain clipped step, g̃ ← clip(g̃ − η ∂ℓ/∂g), while the weights keep
    their momentum. The paper's setup names one momentum, 0.9, which the default applies to both."""
    for name, value in (("lr", lr), ("weight_decay", weight_decay), ("gate_lr", gate_lr)):
        check_float(name, value, minimum=0.0, finite=True)
    check_gate_momentum(gate_momentum)
    weight_parameters, gate_parameters = getattr(net, "weight_parameters", None), getattr(net, "gate_parameters", None)
    if not callable(weight_parameters) or not callable(gate_parameters):
        raise ConfigTypeError(f"param_groups takes a connlearn ConnectivityNet (it splits weights from gates), got "
                              f"{type(net).__name__}")
    groups = [{"params": list(weight_parameters()), "lr": lr, "weight_decay": weight_decay, "name": "weights"}]
    gates = list(gate_parameters())
    if gates:
        groups.append({"params": gates, "lr": gate_lr, "weight_decay": 0.0, "name": "gates"})
        if gate_momentum is not None:
            groups[-1]["momentum"] = gate_momentum
    return groups


#: The per-param-group lists of ``torch.optim.lr_scheduler``'s schedulers (one entry per group).
_SCHEDULER_LISTS = ("base_lrs", "_last_lr", "lr_lambdas", "max_lrs", "min_lrs", "base_momentums", "max_momentums")


def drop_gate_group(optimizer: torch.optim.Optimizer, *schedulers: Any) -> list[nn.Parameter]:
    """Remove the ``'gates'`` param group of :func:`param_groups` from ``optimizer``, with its state (e.g.
    momentum), and return its parameters. Call it after ``net.freeze()``, which takes the real gates out of
    the network: the optimizer then holds only the network's parameters again, and its ``state_dict`` loads
    into one built from ``param_groups`` of the frozen network.

    A ``torch.optim.lr_scheduler`` scheduler keeps one entry per param group: pass the schedulers of
    ``optimizer`` (``drop_gate_group(opt, sched)``) and their entries for the gates go too, so that they
    step on (``SequentialLR`` and ``ChainedScheduler`` with the schedulers they hold). A scheduler made
    before and not passed fails at its next step with a length mismatch inside torch."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ConfigTypeError(f"drop_gate_group takes a torch.optim.Optimizer, got {type(optimizer).__name__}")
    for scheduler in schedulers:
        if getattr(scheduler, "optimizer", None) is not optimizer:
            raise ConfigTypeError(f"drop_gate_group: {type(scheduler).__name__} is not a scheduler of this optimizer")
    gone = [i for i, g in enumerate(optimizer.param_groups) if g.get("name") == "gates"]
    groups = len(optimizer.param_groups)
    removed = [p for i in gone for p in optimizer.param_groups[i]["params"]]
    optimizer.param_groups[:] = [g for i, g in enumerate(optimizer.param_groups) if i not in gone]
    for p in removed:
        optimizer.state.pop(p, None)
    for scheduler in _with_inner(schedulers):
        for name in _SCHEDULER_LISTS:
            value = getattr(scheduler, name, None)
            if isinstance(value, list) and len(value) == groups:
                setattr(scheduler, name, [v for i, v in enumerate(value) if i not in gone])
    return removed


def _with_inner(schedulers: tuple[Any, ...]) -> list[Any]:
    """``schedulers`` and those they hold (``SequentialLR``, ``ChainedScheduler``), each once."""
    found: list[Any] = []
    todo = list(schedulers)
    while todo:
        scheduler = todo.pop()
        if all(scheduler is not s for s in found):
            found.append(scheduler)
            todo.extend(getattr(scheduler, "_schedulers", ()))
    return found
