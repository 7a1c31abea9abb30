"""Training recipes: the paper's phased schedules as data.

Phase 1 learns weights and gates; from phase 2 on the connectivity is frozen to each block's top-K and the
weights are fine-tuned at decreasing learning rates. Gate kinds that learn nothing run the same schedule.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import attrs

from connlearn.errors import ConfigError, check_choice, check_float, check_int
from connlearn.updater import GRAD_MODES

GATE_OPTIMIZERS = ("sgd", "adam")
#: The sampling temperatures allowed: within them the draws' Gumbel keys keep their order in float32.
TEMPERATURES = (1e-4, 1e4)


def _checked(check: Any, *bounds: Any, optional: bool = False) -> Any:
    """An attrs validator: ``check(name, value, *bounds)`` (None passes where ``optional``)."""
    return lambda _, a, v: None if optional and v is None else check(a.name, v, *bounds)


@attrs.frozen
class Phase:
    """``epochs`` at weight lr ``lr`` and gate lr ``gate_lr``; ``frozen``: the connectivity is fixed from its
    start. The draws' temperature moves geometrically from ``temperature`` at the phase's first step to
    ``temperature_end`` (if given) at its last."""

    epochs: int = attrs.field(validator=_checked(check_int, 1))
    lr: float = attrs.field(validator=_checked(check_float, 0.0, math.inf))
    gate_lr: float = attrs.field(default=0.0, validator=_checked(check_float, 0.0, math.inf))
    frozen: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    temperature: float = attrs.field(default=1.0, validator=_checked(check_float, *TEMPERATURES))
    temperature_end: float | None = attrs.field(default=None, validator=_checked(check_float, *TEMPERATURES,
                                                                                  optional=True))

    def temperature_at(self, progress: float) -> float:
        """The temperature at ``progress`` in [0, 1] of the phase."""
        if self.temperature_end is None or progress <= 0.0:
            return self.temperature
        if progress >= 1.0:
            return self.temperature_end
        low, high = sorted((self.temperature, self.temperature_end))
        start, end = math.log(self.temperature), math.log(self.temperature_end)
        t = math.exp(start + (end - start) * progress)
        return min(max(t, low), high)


@attrs.frozen
class Recipe:
    """A phased SGD schedule. ``gate_momentum``: the gates' own momentum (None: ``momentum``; 0: Algorithm
    1's plain clipped step). ``gate_rule``: the GateUpdater's rule (see :mod:`connlearn.updater`).
    ``gate_optimizer``: ``sgd`` (the paper's: the gates in the weights' SGD, at their own lr) or ``adam`` (the
    gates alone in Adam at the phase's gate lr, as differentiable NAS trains its architecture). ``gate_warmup``:
    the first epochs of phase 1 in which the gates do not learn (the draws go on)."""

    name: str
    phases: tuple[Phase, ...] = attrs.field(converter=lambda v: tuple(v))
    batch_size: int = attrs.field(default=128, validator=_checked(check_int, 1))
    momentum: float = attrs.field(default=0.9, validator=_checked(check_float, 0.0, 1.0))
    weight_decay: float = attrs.field(default=5e-4, validator=_checked(check_float, 0.0, math.inf))
    gate_momentum: float | None = attrs.field(default=None, validator=_checked(check_float, 0.0, 1.0, optional=True))
    gate_rule: str = attrs.field(default="plain", validator=_checked(check_choice, GRAD_MODES))
    gate_optimizer: str = attrs.field(default="sgd", validator=_checked(check_choice, GATE_OPTIMIZERS))
    gate_warmup: int = attrs.field(default=0, validator=_checked(check_int, 0))

    def __attrs_post_init__(self) -> None:
        frozen = [p.frozen for p in self.phases]
        if not frozen or frozen != sorted(frozen):
            raise ConfigError("a recipe needs phases, and every phase after a frozen one is frozen too")
        if self.gate_warmup and self.gate_warmup >= self.phases[0].epochs:
            raise ConfigError(f"gate_warmup {self.gate_warmup} must be shorter than phase 1's "
                              f"{self.phases[0].epochs} epochs")

    @property
    def total_epochs(self) -> int:
        return sum(p.epochs for p in self.phases)

    def phase_at(self, epoch: int) -> tuple[int, Phase]:
        """(index, phase) of the 0-based ``epoch``."""
        for i, phase in enumerate(self.phases):
            if epoch < phase.epochs:
                return i, phase
            epoch -= phase.epochs
        raise ConfigError(f"epoch {epoch} is past the recipe's {self.total_epochs} epochs")

    def scaled(self, total_epochs: int) -> Recipe:
        """The schedule in ``total_epochs`` epochs, the phases' proportions kept (largest remainder); every
        phase keeps one epoch where the total allows, else the first ``total_epochs`` phases get one."""
        total, n = check_int("epochs", total_epochs, 1), len(self.phases)
        if total < n:
            return attrs.evolve(self, phases=[attrs.evolve(p, epochs=1) for p in self.phases[:total]])
        ideal = [p.epochs * total / self.total_epochs for p in self.phases]
        alloc = [max(1, math.floor(x)) for x in ideal]
        while sum(alloc) > total:
            i = max((i for i in range(n) if alloc[i] > 1), key=lambda i: alloc[i] - ideal[i])
            alloc[i] -= 1
        while sum(alloc) < total:
            i = max(range(n), key=lambda i: ideal[i] - alloc[i])
            alloc[i] += 1
        return self.with_phase_epochs(alloc)

    def with_phase_epochs(self, epochs: Sequence[int]) -> Recipe:
        """The schedule with ``epochs[i]`` epochs in phase ``i``."""
        if len(epochs) != len(self.phases):
            raise ConfigError(f"give {len(self.phases)} phase lengths (one per phase), got {list(epochs)}")
        return attrs.evolve(self, phases=[attrs.evolve(p, epochs=e) for p, e in zip(self.phases, epochs, strict=True)])

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


def _paper(name: str, epochs: tuple[int, ...], **options: Any) -> Recipe:
    phases = [Phase(epochs[0], 0.1, gate_lr=0.2)]
    phases += [Phase(e, lr, frozen=True) for e, lr in zip(epochs[1:], (0.1, 0.01, 0.001), strict=True)]
    return Recipe(name, phases, **options)


#: The paper's schedules (appendix, "Implementation details").
RECIPES = {
    "cifar": _paper("cifar", (120, 100, 50, 50), batch_size=128, weight_decay=5e-4),
    "miniimagenet": _paper("miniimagenet", (120, 100, 50, 50), batch_size=256, weight_decay=5e-4),
    "imagenet": _paper("imagenet", (30, 30, 30, 30), batch_size=256, weight_decay=1e-4),
    # Discovering Neural Wirings' small-scale schedule (160 epochs, lr steps at 80 and 120), nothing frozen
    "dnw": Recipe("dnw", [Phase(80, 0.1), Phase(40, 0.01), Phase(40, 0.001)], batch_size=128, weight_decay=1e-4),
}


def get_recipe(name: str) -> Recipe:
    return RECIPES[check_choice("recipe", name, RECIPES)]
