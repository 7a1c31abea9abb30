"""Gate kinds: how each block of a module chooses which earlier branch outputs it averages.

One :class:`Gate` per module holds its gate matrix, rows = its blocks, columns = its candidate inputs. The
module computes ``x_j = ReLU((1/K) Σ_k G_jk y_k)`` with ``G = gate.matrix(drawn)``.

=========  ==========================================================  ========================  =========
kind       train forward                                               eval forward              learnable
=========  ==========================================================  ========================  =========
``topk``   K distinct inputs drawn from the normalised real gates       top-K of the real gates   yes
           (Gumbel-top-K: K draws without replacement), straight-through
``real``   the real gates themselves                                   same                      yes
``random`` K random inputs, drawn once from the seed                   same                      no
``full``   every input (ResNeXt)                                       same                      no
``frozen`` a fixed binary connectivity (what ``freeze()`` leaves)      same                      no
``dnw``    signed edge weights on the top edges by |value| (each       the same top edges        yes, as
           block its K, or one budget: ``density``); every edge gets                             weights
           its dense gradient, straight-through (``dnw_masked``: the
           kept edges only)
=========  ==========================================================  ========================  =========

Edge weights (Discovering Neural Wirings, Wortsman et al. 2019): a ``dnw`` gate's values are signed weights
that multiply their inputs, ``x_j = ReLU(Σ_k m_jk w_jk y_k)`` with no 1/K and no clipping, ``m`` the kept edges;
they are ordinary weights (the weights' param group, with its weight decay). ``density`` (a build option) spends
one budget of ``round(density · candidates)`` edges over every gate edge of the network, by |w|: K is then free
per block; a block that no path of kept edges reaches from the stem is switched off (its output is 0, so no
batch norm normalises a constant) and pruned.
``magnitude`` (:mod:`connlearn.estimators`) spends a ``density`` too, as binary gates averaged by the nominal
1/K (the mean kept fan-in, rounded): its scores rank the edges of the whole network.
``random`` with ``density`` is DNW's random graph, the fair baseline of ``dnw``: that many edges drawn uniformly
over all candidate edges once from the seed, then fixed, each carrying a trainable signed weight started as
``dnw``'s are (uniform in [-1, 1]). Freezing keeps the kept edges and their weights (the function does not change).

Straight-through: the binary draw is used forward and every real gate, drawn or not, receives
``∂ℓ/∂G_jk = ⟨∂ℓ/∂s_j, y_k⟩ / K`` (``s_j`` the gated sum). Gates below 0 count as 0 when sampling; a row of
zeros samples uniformly. A temperature τ draws from the gates raised to 1/τ.

A kind is one :class:`Gate` subclass (``register_gate(name, cls)``), and everything that depends on the kind
is read through its protocol, nowhere else:

- how it starts: the classmethods ``initial(rows, cols, K, gate_init, generator)`` (a module's initial
  values and active flags, for the topologies) and ``kept(K, inputs)`` (how many inputs a row reads: K; under a
  ``density``, whatever the budget gives it);
- how it weights: ``averaged`` (the kept inputs are averaged by 1/K; else they are multiplied by the values,
  signed edge weights), ``weighting()`` (the class that compiles the kind on a graph of edge weights, the
  graph attribute ``edge_weights``: the kind itself, the fixed :class:`EdgeWeights` for ``random`` and
  ``frozen``, None where it has no such form), and for a kind that ``spends`` one budget itself (the class
  that compiles it: :class:`Budgeted` kinds select their top edges by score, :class:`EdgeWeights` draws them),
  ``spend(values, budget, generator)`` (the initial kept edges of the whole network) and ``share(gates,
  budget)`` (its gates choose their top edges together);
- what it is: ``learnable`` (holds parameters, ``real_parameters()``), ``stochastic`` (draws a connectivity
  every training step), ``weighted`` (its values weight the inputs, as unfrozen ``real`` gates do; else they
  only select ``kept`` inputs, averaged by 1/K), ``clipped`` (the :class:`~connlearn.updater.GateUpdater`
  keeps its parameters in [0, 1]), ``single_stream`` (every block reads every input: the compiler emits
  ResNeXt's one stream where the block kind has that form);
- what it computes: built per module as ``cls(values, active, K, **gate_options)`` (its ``knobs``, checked
  here), it gives ``values()``, ``active()`` (the eval and freeze choice: exactly K ones per row, or the
  budget's edges; equal values ranked by ``ties()``), ``matrix(drawn)`` (the forward pass's matrix; the
  network asks the classmethod ``matrices`` for every gate of the kind in one call) and ``freeze(active)``
  (the fixed gate it leaves); a stochastic kind draws in the classmethod ``draw`` (one
  call for every gate of the kind; ``[B, rows, cols]`` draws for a draw per example);
- what the training loop adds: ``surrogate(drawn, losses)`` (0 but for kinds whose gradient needs the loss
  itself, added through ``net.surrogate_loss``) and ``trains_with`` (its tuned ``gate_*`` run options, among
  them the temperature schedule's ``gate_temperature_end``).

:mod:`connlearn.estimators` holds five more kinds written this way.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar, cast

import torch
import torch.nn.functional as F
from torch import nn

from connlearn.errors import ConfigError, check_choice
from connlearn.registry import Registry

#: The key of a zero weight in a draw: below every log-probability a float32 holds, so such entries are drawn
#: only once the positive ones are exhausted, in random order among themselves.
_ZERO_KEY = -1.0e4


def sampling_distribution(gates: torch.Tensor) -> torch.Tensor:
    """The distribution each row of real gates (the last dimension) draws from: its positive part over its
    sum; uniform where no entry is positive."""
    w = gates.clamp(min=0)
    total = w.sum(dim=-1, keepdim=True)
    return torch.where(total > 0, w / torch.where(total > 0, total, 1.0), torch.full_like(w, 1 / w.shape[-1]))


def topk_mask(values: torch.Tensor, K: int, order: torch.Tensor | None = None) -> torch.Tensor:
    """The boolean mask of the K largest entries of each row; equal values ranked by ``order`` (the larger
    first; by default the lower index first). Rows of the paper's gates end tied at 1: a random ``order``
    keeps their top-K from crowding onto the lowest-numbered inputs."""
    values = values.detach()
    if order is None:
        idx = torch.sort(values, dim=-1, descending=True, stable=True).indices[..., :K]
    else:
        by_order = torch.sort(order.to(values.device).expand(values.shape), dim=-1, descending=True,
                              stable=True).indices
        ranked = torch.sort(values.gather(-1, by_order), dim=-1, descending=True, stable=True).indices
        idx = by_order.gather(-1, ranked[..., :K])
    return torch.zeros_like(values, dtype=torch.bool).scatter(-1, idx, True)


def random_tie_order(rows: int, cols: int, generator: torch.Generator) -> torch.Tensor:
    """Each row a random permutation of the ranks ``0 .. cols-1``."""
    return torch.rand(rows, cols, generator=generator).argsort(dim=-1).argsort(dim=-1)


def tie_generator(seed: int) -> torch.Generator:
    """The generator of a network's tie orders, derived from its seed apart from every other draw."""
    return torch.Generator().manual_seed((seed * 6364136223846793005 + 1442695040888963407) % 2**63)


def draw_generator(seed: int) -> torch.Generator:
    """The generator of a network's training draws, apart from the one of its initial gates and Fixed-Random
    connectivity (seeded with the seed itself), whose first uniforms the first draw would otherwise reuse."""
    return torch.Generator().manual_seed(((seed + 1) * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) % 2**63)


def gumbel_topk(weights: Sequence[torch.Tensor], K: int, generator: torch.Generator,
                temperature: float = 1.0) -> list[torch.Tensor]:
    """K distinct columns per row of every matrix in ``weights``, in one batched call: the law of K draws
    without replacement from each row's non-negative weights w^(1/temperature), normalised (Gumbel-top-K).
    The uniforms come from ``generator`` (on the CPU): the same draws on every device and DDP rank, and the
    same noise at any temperature. Returns 0/1 matrices shaped like the inputs."""
    device, width = weights[0].device, max(p.shape[1] for p in weights)
    w = torch.cat([F.pad(p.detach().float().clamp(min=0), (0, width - p.shape[1])) for p in weights])
    valid = torch.cat([F.pad(torch.ones_like(p, dtype=torch.bool), (0, width - p.shape[1])) for p in weights])
    w = torch.where((w.sum(dim=1, keepdim=True) <= 0) & valid, torch.ones_like(w), w)  # a row of zeros: uniform
    zero_key = _ZERO_KEY
    if temperature == 1.0:
        logw = w.clamp(min=1e-30).log()
    else:  # each row scaled to a largest weight of 1 before the division
        top = w.amax(dim=1, keepdim=True).clamp(min=1e-30)
        logw = (w / top).clamp(min=1e-30).log() / temperature
        zero_key = min(_ZERO_KEY, math.log(1e-30) / temperature - 100.0)
    logw = torch.where(w > 0, logw, torch.full_like(w, zero_key))
    noise = torch.rand(w.shape, generator=generator)
    if device.type == "cuda":
        noise = noise.pin_memory()  # an asynchronous copy: no synchronisation per step
    gumbel = -(-noise.to(device, non_blocking=True).clamp(1e-20, 1.0 - 1e-7).log()).log()
    keys = torch.where(valid, logw + gumbel, torch.full_like(w, float("-inf")))  # padding: never drawn
    hard = torch.zeros_like(w).scatter_(1, keys.topk(K, dim=1).indices, 1.0)
    return [h[:, :p.shape[1]].to(p.dtype) for h, p in zip(hard.split([p.shape[0] for p in weights]), weights,
                                                          strict=True)]


def random_connectivity(rows: int, cols: int, K: int, generator: torch.Generator) -> torch.Tensor:
    """K distinct uniformly drawn columns per row, as a boolean matrix."""
    return gumbel_topk([torch.ones(rows, cols)], K, generator)[0].bool()


class Gate(nn.Module):
    """The gate matrix of one module: rows its blocks, columns its candidate inputs (the protocol: see above)."""

    learnable: ClassVar[bool] = False
    stochastic: ClassVar[bool] = False
    weighted: ClassVar[bool] = False
    clipped: ClassVar[bool] = True
    single_stream: ClassVar[bool] = False
    averaged: ClassVar[bool] = True
    spends: ClassVar[bool] = False
    knobs: ClassVar[dict[str, Any]] = {}  # the keyword options it takes (the graph's gate_options), by default
    #: how ``connlearn train`` trains it where a run leaves them unset: its ``gate_optimizer``, ``gate_lr``,
    #: ``gate_rule``, ``gate_warmup``, ``gate_holdout``, ``gate_temperature_end`` (docs/estimators.md)
    trains_with: ClassVar[dict[str, Any]] = {}

    def __init__(self, values: torch.Tensor, active: torch.Tensor, K: int, **options: Any) -> None:
        super().__init__()
        self.K, self.shape = K, tuple(values.shape)
        for name in options:
            check_choice("gate option", name, self.knobs)
        for name, default in self.knobs.items():  # each knob a positive number
            value = options.get(name, default)
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0 or (
                    isinstance(default, int) and value != int(value)):
                raise ConfigError(f"gate option {name} must be a positive {type(default).__name__}, got {value!r}")
            setattr(self, name, type(default)(value))

    @classmethod
    def kept(cls, K: int, inputs: int) -> int:
        """How many of its ``inputs`` candidates each block reads, given the network's fan-in K."""
        return K

    @classmethod
    def initial(cls, rows: int, cols: int, K: int, gate_init: float | str,
                generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """One module's initial values and active flags: ``gate_init`` (in [0, 1]), or uniform draws from
        ``generator`` (``"uniform"``), and their top-K."""
        values = (torch.rand(rows, cols, generator=generator) if gate_init == "uniform"
                  else torch.full((rows, cols), float(gate_init)))
        return values, topk_mask(values, K)

    @classmethod
    def weighting(cls) -> type[Gate] | None:
        """The class that compiles this kind on a graph of edge weights (``edge_weights``); None: it has none."""
        return None

    @classmethod
    def spend(cls, values: torch.Tensor, budget: int, generator: torch.Generator) -> torch.Tensor:
        """The kept edges (boolean, like ``values``: every gate edge of the network, flat) of one budget, for
        a kind that ``spends``."""
        raise NotImplementedError

    def share(self, gates: Sequence[Gate], budget: int) -> None:
        """Make ``gates`` (this kind's, of one network, this one among them) spend one budget together."""

    def values(self) -> torch.Tensor:
        """The real gate values ``[rows, cols]``, for display and for ``freeze``."""
        raise NotImplementedError

    def freeze(self, active: torch.Tensor) -> Gate:
        """What ``freeze()`` leaves of this gate: the fixed connectivity ``active``."""
        values = self.values()
        return FrozenGate(values, active, self.K).to(values.device)

    def active(self) -> torch.Tensor:
        """The evaluation connectivity: boolean ``[rows, cols]``, K ones per row."""
        raise NotImplementedError

    def ties(self) -> torch.Tensor | None:
        """The ranks that order equal values in ``active()`` (the larger first), where the kind has them."""
        return None

    def matrix(self, drawn: torch.Tensor | None = None) -> torch.Tensor:
        """The matrix of the forward pass (before the 1/K), given this step's draw where it draws."""
        return self.active().to(self.values().dtype)

    @classmethod
    def matrices(cls, gates: Sequence[Gate], drawn: Sequence[torch.Tensor | None]) -> list[torch.Tensor]:
        """The matrices of the forward pass of ``gates`` (all of this kind, with their draws) in one call."""
        return [g.matrix(d) for g, d in zip(gates, drawn, strict=True)]

    def real_parameters(self) -> list[nn.Parameter]:
        return []

    @classmethod
    def draw(cls, gates: Sequence[Gate], generator: torch.Generator, temperature: float = 1.0,
             batch: int = 1) -> list[torch.Tensor]:
        """This step's draws of ``gates`` (all of this kind) in one call, for a batch of ``batch`` examples:
        values without autograd history."""
        raise NotImplementedError

    def surrogate(self, drawn: torch.Tensor, losses: torch.Tensor) -> torch.Tensor:
        """The term the training loop adds to the loss, given this gate's draw and the per-example losses."""
        return losses.new_zeros(())


class LearnedGate(Gate):
    """Real gates held as the parameter ``real``; the evaluation connectivity is their top-K, equal gates
    ranked by the buffer ``tie_order`` (set from the graph's ties)."""

    learnable = True
    tie_order: torch.Tensor

    def __init__(self, values: torch.Tensor, active: torch.Tensor, K: int, **options: Any) -> None:
        super().__init__(values, active, K, **options)
        self.real = nn.Parameter(values.detach().clone().float())
        self.register_buffer("tie_order", torch.arange(self.shape[1] - 1, -1, -1).expand(self.shape).clone())

    def values(self) -> torch.Tensor:
        return self.real.detach()

    def active(self) -> torch.Tensor:
        return topk_mask(self.real, self.K, self.tie_order)

    def ties(self) -> torch.Tensor:
        return self.tie_order

    def real_parameters(self) -> list[nn.Parameter]:
        return [self.real]


class TopKGate(LearnedGate):
    """GateConnect: K inputs per block drawn from the normalised real gates; their top-K in eval mode."""

    stochastic = True

    def matrix(self, drawn: torch.Tensor | None = None) -> torch.Tensor:
        hard = drawn if drawn is not None else self.active().to(self.real.dtype)
        return hard + (self.real - self.real.detach())  # forward: exactly `hard`; backward: to every gate

    @classmethod
    def draw(cls, gates: Sequence[Gate], generator: torch.Generator, temperature: float = 1.0,
             batch: int = 1) -> list[torch.Tensor]:
        return gumbel_topk([cast(TopKGate, g).real for g in gates], gates[0].K, generator, temperature)


class RealGate(LearnedGate):
    """Ablation: the real gates themselves weight the inputs, in training and evaluation."""

    weighted = True

    def matrix(self, drawn: torch.Tensor | None = None) -> torch.Tensor:
        return self.real


class FixedGate(Gate):
    """A fixed binary connectivity, in buffers (``mask``; ``gate_values`` for display)."""

    mask: torch.Tensor
    gate_values: torch.Tensor

    def __init__(self, values: torch.Tensor, active: torch.Tensor, K: int, **options: Any) -> None:
        super().__init__(values, active, K, **options)
        self.register_buffer("mask", active.detach().clone().bool())
        self.register_buffer("gate_values", _floating(values))

    def values(self) -> torch.Tensor:
        return self.gate_values

    def active(self) -> torch.Tensor:
        return self.mask


class SignedWeights(Gate):
    """Gate values that are signed edge weights, multiplying their inputs (no 1/K): the parameter ``weight``,
    a weight like any other (the weights' param group, with its weight decay)."""

    averaged = False

    def __init__(self, values: torch.Tensor, active: torch.Tensor, K: int, **options: Any) -> None:
        super().__init__(values, active, K, **options)
        self.weight = nn.Parameter(_floating(values))

    @classmethod
    def initial(cls, rows: int, cols: int, K: int, gate_init: float | str,
                generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """Signed weights uniform in [-1, 1] (the kept ones start near the scale of the mean the other kinds
        take), and their top-K by magnitude."""
        values = 2 * torch.rand(rows, cols, generator=generator) - 1
        return values, topk_mask(values.abs(), K)

    def values(self) -> torch.Tensor:
        return self.weight.detach()

    def active(self) -> torch.Tensor:
        return topk_mask(self.weight.abs(), self.K)


class EdgeWeights(SignedWeights):
    """A fixed set of kept edges (the buffer ``mask``), each weighting its input by its trainable signed weight:
    a frozen ``dnw`` network, and DNW's random graph."""

    spends = True
    mask: torch.Tensor

    def __init__(self, values: torch.Tensor, active: torch.Tensor, K: int, **options: Any) -> None:
        super().__init__(values, active, K, **options)
        self.register_buffer("mask", active.detach().clone().bool())

    @classmethod
    def spend(cls, values: torch.Tensor, budget: int, generator: torch.Generator) -> torch.Tensor:
        """``budget`` edges drawn uniformly from all of them."""
        kept = torch.zeros(values.shape, dtype=torch.bool)
        kept[torch.randperm(values.numel(), generator=generator)[:budget]] = True
        return kept

    def active(self) -> torch.Tensor:
        return self.mask

    def matrix(self, drawn: torch.Tensor | None = None) -> torch.Tensor:
        return self.weight * self.mask


class Budgeted(Gate):
    """A kind that can spend one budget over the network (``density``): the gates of one scope keep their
    top edges by ``score`` together, one selection a pass (equal scores: the higher ``ties()`` rank, then the
    lower index, first); without a budget each block keeps its own K. A subclass gives ``weighted_by``."""

    spends = True

    def __init__(self, values: torch.Tensor, active: torch.Tensor, K: int, **options: Any) -> None:
        super().__init__(values, active, K, **options)
        self.budget: int | None = None  # None: each block its K
        self.scope: list[Budgeted] = [self]  # the gates of the network that spend the budget, in order

    @staticmethod
    def score(values: torch.Tensor) -> torch.Tensor:
        """What the budget ranks edges by, given their values."""
        return values

    @classmethod
    def spend(cls, values: torch.Tensor, budget: int, generator: torch.Generator | None = None,
              order: torch.Tensor | None = None) -> torch.Tensor:
        """The ``budget`` edges of largest score; equal ones by ``order`` (larger first), then index."""
        a = cls.score(values.detach())
        if budget == 0:
            return torch.zeros_like(a, dtype=torch.bool)
        last = torch.kthvalue(a, a.numel() - budget + 1).values  # the budget-th largest: a selection, not a sort
        kept, tied = a > last, (a == last).nonzero().flatten()
        if order is not None:
            tied = tied[order[tied].argsort(descending=True, stable=True)]
        return kept.index_fill_(0, tied[:budget - int(kept.sum())], True)

    @staticmethod
    def row_ranks(ties: Sequence[torch.Tensor]) -> torch.Tensor:
        """The ``order`` of :meth:`spend` for gates of these tie ranks, flat: each row's ranks counted from its top
        (-1 first), so that equal scores share the budget over the rows."""
        return torch.cat([(t - t.shape[-1]).flatten() for t in ties])

    def share(self, gates: Sequence[Gate], budget: int) -> None:
        self.scope, self.budget = cast("list[Budgeted]", list(gates)), budget

    def active(self) -> torch.Tensor:
        return super().active() if self.budget is None else self._spent()[self.scope.index(self)]

    def _spent(self) -> list[torch.Tensor]:
        """The kept edges of every gate of the budget's scope, in order: one selection for them all."""
        gates, ties = self.scope, [g.ties() for g in self.scope]
        order = None if any(t is None for t in ties) else self.row_ranks(cast(list, ties))
        kept = self.spend(torch.cat([g.values().flatten() for g in gates]), cast(int, self.budget), order=order)
        return [k.view(g.shape) for g, k in zip(gates, kept.split([math.prod(g.shape) for g in gates]), strict=True)]

    @classmethod
    def matrices(cls, gates: Sequence[Gate], drawn: Sequence[torch.Tensor | None]) -> list[torch.Tensor]:
        budgeted = cast("list[Budgeted]", list(gates))
        if budgeted[0].budget is None or budgeted != budgeted[0].scope:
            return super().matrices(gates, drawn)
        return [g.weighted_by(k) for g, k in zip(budgeted, budgeted[0]._spent(), strict=True)]

    def matrix(self, drawn: torch.Tensor | None = None) -> torch.Tensor:
        return self.weighted_by(self.active())

    def weighted_by(self, kept: torch.Tensor) -> torch.Tensor:
        """The forward pass's matrix given the kept edges (boolean, like the gate)."""
        raise NotImplementedError


class WiringGate(Budgeted, SignedWeights):
    """Discovering Neural Wirings: signed edge weights (the parameter ``weight``, in the weights' param group);
    the forward pass keeps the top edges by |weight| (each block its K, or one budget over the network) and
    every edge gets the gradient of the dense matrix at it (straight-through, DNW's ChooseTopEdges)."""

    learnable = True
    clipped = False

    @classmethod
    def weighting(cls) -> type[Gate]:
        return cls

    @staticmethod
    def score(values: torch.Tensor) -> torch.Tensor:
        return values.abs()

    def freeze(self, active: torch.Tensor) -> Gate:
        """The kept edges, each with its weight (the same parameter: an optimizer holding it goes on)."""
        frozen = EdgeWeights(self.values(), active, self.K).to(active.device)
        frozen.weight = self.weight
        return frozen

    def weighted_by(self, kept: torch.Tensor) -> torch.Tensor:
        """Their weights; backward, every edge's dense gradient."""
        w = self.weight
        return w.detach() * kept + (w - w.detach())


class MaskedWiringGate(WiringGate):
    """Ablation of ``dnw``: the same forward pass, but edges not kept get no gradient."""

    def weighted_by(self, kept: torch.Tensor) -> torch.Tensor:
        return self.weight * kept


class RandomGate(FixedGate):
    """Fixed-Random: K random inputs per block, drawn once from the seed (with ``density``: DNW's random
    graph, :class:`EdgeWeights`)."""

    @classmethod
    def weighting(cls) -> type[Gate]:
        return EdgeWeights

    @classmethod
    def initial(cls, rows: int, cols: int, K: int, gate_init: float | str,
                generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        mask = random_connectivity(rows, cols, K, generator)
        return mask.float(), mask


class FrozenGate(FixedGate):
    """A fixed connectivity: the top-K that ``freeze()`` keeps of learned gates."""

    @classmethod
    def initial(cls, rows: int, cols: int, K: int, gate_init: float | str,
                generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        raise ConfigError("gate 'frozen' is what freeze() leaves; build 'topk' (and freeze it) or 'random'")

    @classmethod
    def weighting(cls) -> type[Gate]:
        return EdgeWeights


class FullGate(FixedGate):
    """Fixed-Full: every block reads every input; ResNeXt's single stream where the block kind has that form."""

    single_stream = True

    @classmethod
    def kept(cls, K: int, inputs: int) -> int:
        return inputs

    @classmethod
    def initial(cls, rows: int, cols: int, K: int, gate_init: float | str,
                generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.ones(rows, cols), torch.ones(rows, cols, dtype=torch.bool)


def _floating(values: torch.Tensor) -> torch.Tensor:
    """A detached copy of ``values`` in its own floating dtype, or float32."""
    return values.detach().clone().to(values.dtype if values.is_floating_point() else torch.float32)


def _check_kind(name: str, cls: Any) -> None:
    if not (isinstance(cls, type) and issubclass(cls, Gate)):
        raise ConfigError(f"gate kind {name!r} must be a subclass of connlearn.gates.Gate, got {cls!r}")


GATES: Registry[type[Gate]] = Registry("gate kind", "connlearn.gates", check=_check_kind)
for _name, _cls in (("topk", TopKGate), ("real", RealGate), ("random", RandomGate), ("frozen", FrozenGate),
                    ("full", FullGate), ("dnw", WiringGate), ("dnw_masked", MaskedWiringGate)):
    GATES.register(_name, _cls)
