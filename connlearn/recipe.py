"""Training recipes: the paper's phased schedules as data.

Phase 1 learns weights and gates; from phase 2 on the connectivity is frozen to the top-K of the real
gates and only the weights are fine-tuned at decreasing learning rates. Gate kinds that learn nothing
(``random``, ``full``, ``frozen``) run the same schedule without gate updates.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from connlearn.errors import (
    ConfigError,
    ConfigTypeError,
    check_bool,
    check_float,
    check_int,
    check_name,
    check_temperature,
    python_number,
    unknown_name,
)


def _positive_int(name: str):
    def check(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
        check_int(name, value, minimum=1)

    return check


def _non_negative(name: str):
    def check(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
        check_float(name, value, minimum=0.0, finite=True)

    return check


def _momentum(name: str):
    def check(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
        check_float(name, value, minimum=0.0, maximum=1.0)

    return check


def check_gate_momentum(value: Any) -> float | None:
    """``value`` if it is ``None`` (the optimizer's momentum) or a momentum in [0, 1]; else a clear error."""
    return None if value is None else check_float("gate_momentum", value, minimum=0.0, maximum=1.0)


def _optional_momentum(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    check_gate_momentum(value)


def flag_check(name: str):
    """An attrs validator: the field must be a bool (:func:`~connlearn.errors.check_bool`)."""

    def check(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
        check_bool(name, value)

    return check


def _name(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    if not isinstance(value, str):
        raise ConfigTypeError(f"a recipe's name must be a string, got {value!r} ({type(value).__name__})")


def _phases(value: Any) -> Any:
    """Phases given as any iterable (a list, a generator) as a tuple; anything else is left for the check."""
    if isinstance(value, (str, bytes, Mapping, set, frozenset)) or not isinstance(value, Iterable):
        return value  # unordered or not phases at all: left for the check to name
    return tuple(value)


def _check_phases(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    if not isinstance(value, tuple) or not all(isinstance(p, Phase) for p in value):
        raise ConfigTypeError(f"phases must be a list of connlearn.recipe.Phase, got {value!r}")


def _temperature(name: str, optional: bool = False):
    def check(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
        if value is not None or not optional:
            check_temperature(name, value)

    return check


@attrs.frozen
class Phase:
    """One phase: ``epochs`` at a constant weight ``lr`` and ``gate_lr``; ``frozen``: the connectivity is
    fixed (top-K of the real gates) from the start of this phase on.

    ``temperature`` is the sampling temperature of the draws in this phase (1: the paper's; see
    :mod:`connlearn.gates`); with ``temperature_end`` it moves geometrically from ``temperature`` at the
    phase's first step to ``temperature_end`` at its last. A frozen phase draws nothing and keeps both at
    their defaults."""

    epochs: int = attrs.field(converter=python_number, validator=_positive_int("epochs"))
    lr: float = attrs.field(converter=python_number, validator=_non_negative("lr"))
    gate_lr: float = attrs.field(default=0.0, converter=python_number, validator=_non_negative("gate_lr"))
    frozen: bool = attrs.field(default=False, converter=python_number, validator=flag_check("frozen"))
    temperature: float = attrs.field(default=1.0, converter=python_number, validator=_temperature("temperature"))
    temperature_end: float | None = attrs.field(default=None, converter=python_number,
                                                validator=_temperature("temperature_end", optional=True))

    def __attrs_post_init__(self) -> None:
        if self.frozen and (self.temperature != 1.0 or self.temperature_end is not None):
            raise ConfigError("a frozen phase draws no connectivity: its temperature stays 1 (no temperature_end)")

    def temperature_at(self, progress: float) -> float:
        """The sampling temperature at ``progress`` in [0, 1] of this phase (0: its first step, 1: its last; a
        phase of a single step draws at ``temperature``)."""
        if self.temperature_end is None or progress <= 0.0:
            return self.temperature
        if progress >= 1.0:
            return self.temperature_end
        start, end = math.log(self.temperature), math.log(self.temperature_end)
        low, high = sorted((self.temperature, self.temperature_end))
        return min(max(math.exp(start + (end - start) * progress), low), high)  # never past an end by rounding


@attrs.frozen
class Recipe:
    """A phased SGD schedule (momentum, weight decay, batch size) for GateConnect training."""

    name: str = attrs.field(validator=_name)
    phases: tuple[Phase, ...] = attrs.field(converter=_phases, validator=_check_phases)
    batch_size: int = attrs.field(default=128, converter=python_number, validator=_positive_int("batch_size"))
    momentum: float = attrs.field(default=0.9, converter=python_number, validator=_momentum("momentum"))
    weight_decay: float = attrs.field(default=5e-4, converter=python_number, validator=_non_negative("weight_decay"))
    nesterov: bool = attrs.field(default=False, converter=python_number, validator=flag_check("nesterov"))
    #: the gates' own SGD momentum (None: ``momentum``, as the paper's setup names one); 0 is Algorithm 1's
    #: plain clipped step
    gate_momentum: float | None = attrs.field(default=None, converter=python_number, validator=_optional_momentum)

    def __attrs_post_init__(self) -> None:
        if not self.phases:
            raise ConfigError("a recipe needs at least one phase")
        frozen = [p.frozen for p in self.phases]
        if frozen != sorted(frozen):
            raise ConfigError("once a phase freezes the connectivity, every later phase must be frozen too")
        if self.nesterov and self.momentum == 0:
            raise ConfigError("nesterov=True needs a momentum above 0 (SGD's Nesterov step is one of momentum), got "
                              "momentum=0")

    @property
    def total_epochs(self) -> int:
        return sum(p.epochs for p in self.phases)

    def phase_at(self, epoch: int) -> tuple[int, Phase]:
        """(index, phase) of the 0-based ``epoch``."""
        epoch = check_int("epoch", epoch, minimum=0, maximum=self.total_epochs - 1)
        for i, phase in enumerate(self.phases):
            if epoch < phase.epochs:
                return i, phase
            epoch -= phase.epochs
        raise AssertionError("unreachable")

    def scaled(self, total_epochs: int) -> Recipe:
        """The same schedule in ``total_epochs`` epochs, keeping the phases' proportions (largest
        remainder rounding). Every phase keeps at least one epoch when ``total_epochs`` allows; below
        that, the first ``total_epochs`` phases get one epoch each."""
        total = check_int("total_epochs", total_epochs, minimum=1)
        n = len(self.phases)
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
        return attrs.evolve(self, phases=[attrs.evolve(p, epochs=e) for p, e in zip(self.phases, alloc, strict=True)])

    def with_phase_epochs(self, epochs: Sequence[int]) -> Recipe:
        """The same schedule with ``epochs[i]`` epochs in phase ``i``: one positive count per phase (the
        paper's CIFAR schedule is ``(120, 100, 50, 50)``), for a split other than :meth:`scaled`'s."""
        split = "/".join(str(p.epochs) for p in self.phases)
        if not isinstance(epochs, (list, tuple)) or len(epochs) != len(self.phases):
            raise ConfigError(f"phase epochs must be {len(self.phases)} counts, one per phase of the {self.name!r} "
                              f"recipe (its own: {split}), got {epochs!r}")
        counts = [check_int(f"epochs of phase {i}", e, minimum=1) for i, e in enumerate(epochs, 1)]
        return attrs.evolve(self, phases=[attrs.evolve(p, epochs=e) for p, e in zip(self.phases, counts, strict=True)])

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Recipe:
        """The recipe of :meth:`to_dict`'s dict; a missing or unknown entry is a clear error."""
        d = dict(_fields_of(cls, d, "a recipe dict", "recipe entry"))
        if not isinstance(d["phases"], (list, tuple)):
            raise ConfigTypeError(f"a recipe dict's 'phases' must be a list of phase dicts, got {d['phases']!r}")
        d["phases"] = [Phase(**_fields_of(Phase, p, f"phase {i} of the recipe dict", "phase entry"))
                       for i, p in enumerate(d["phases"], 1)]
        return cls(**d)


def _fields_of(cls: type, d: Any, what: str, entry: str) -> Mapping[str, Any]:
    """``d`` if it is a dict holding every required field of the attrs class ``cls`` and no other entry."""
    if not isinstance(d, Mapping):
        raise ConfigTypeError(f"{what} must be a dict (as Recipe.to_dict() writes), got {d!r} ({type(d).__name__})")
    fields = attrs.fields(cls)
    names = [f.name for f in fields]
    for key in d:
        if key not in names:
            raise unknown_name(entry, key, names)
    missing = [f.name for f in fields if f.default is attrs.NOTHING and f.name not in d]
    if missing:
        raise ConfigError(f"{what} lacks {', '.join(map(repr, missing))}")
    return d


def _paper(name: str, epochs: tuple[int, int, int, int], **kw: Any) -> Recipe:
    lrs = (0.1, 0.1, 0.01, 0.001)
    phases = [Phase(epochs[0], lrs[0], gate_lr=0.2)]
    phases += [Phase(e, lr, frozen=True) for e, lr in zip(epochs[1:], lrs[1:], strict=True)]
    return Recipe(name, phases, **kw)


#: The paper's schedules (appendix "Implementation details").
RECIPES: dict[str, Recipe] = {
    "cifar": _paper("cifar", (120, 100, 50, 50), batch_size=128, weight_decay=5e-4),
    "miniimagenet": _paper("miniimagenet", (120, 100, 50, 50), batch_size=256, weight_decay=5e-4),
    "imagenet": _paper("imagenet", (30, 30, 30, 30), batch_size=256, weight_decay=1e-4),
}


def get_recipe(name: str) -> Recipe:
    """A preset recipe by name: ``cifar``, ``miniimagenet`` or ``imagenet``."""
    return RECIPES[check_name("recipe", name, RECIPES)]
