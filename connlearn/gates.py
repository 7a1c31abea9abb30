"""Gate kinds: how each block of a module chooses which earlier branch outputs it sums.

One :class:`Gate` per module holds the gate matrix of that module, rows = its blocks, columns = its
candidate inputs (see ``BranchGraph.candidates``). The module computes ``x_j = ReLU((1/K) Σ_k G_jk y_k)``
with ``G = gate.matrix(drawn)``.

=========  =====================================================  ==========================  ==========
kind       train forward                                          eval forward                learnable
=========  =====================================================  ==========================  ==========
``topk``   K distinct inputs per block drawn from the normalised  top-K of the real gates     yes
           real gates (Gumbel-top-K = K draws without
           replacement), straight-through gradient
``real``   the real gates themselves                              same                        yes
``random`` K random inputs per block, drawn once from the seed    same                        no
``full``   every input (ResNeXt)                                  same                        no
``frozen`` a fixed binary connectivity (what ``freeze()`` leaves)  same                        no
=========  =====================================================  ==========================  ==========

Straight-through: the binary ``g`` is used forward, and every real gate, drawn or not, receives
``∂ℓ/∂g_jk = ⟨∂ℓ/∂s_j, y_k⟩ / K`` where ``s_j`` is the gated sum. Real gates below 0 count as 0 when
sampling; a row whose gates are all 0 samples uniformly. A sampling temperature τ (default 1, the paper)
draws from the row's gates raised to the power 1/τ: below 1 the draws follow the largest gates more
closely (τ → 0: always the top-K), above 1 they are closer to uniform; the gradient is the same.
Keeping gates in [0, 1] is the job of ``connlearn.updater.GateUpdater``.

New kinds subclass :class:`Gate` and are registered with ``connlearn.register_gate(name, cls)`` or the
entry-point group ``connlearn.gates``. A kind is built as ``cls(values, active, K)`` for each module
(``values`` float and ``active`` boolean ``[rows, cols]``: the graph's initial gates; ``Gate.__init__`` keeps
only ``K`` and ``shape``, the kind stores what it needs) and defines ``values()`` and ``active()``; the
default ``matrix()`` is ``active()`` as 0/1; ``active()`` must hold exactly K ones per row (the network
takes the mean of K inputs, and ``freeze()`` keeps them). A stochastic kind (``stochastic = True``) also
defines the classmethod ``draw`` and a ``matrix(drawn)`` that uses this step's draw (``TopKGate`` adds the
straight-through term that carries the gradient to its real gates); a learnable one (``learnable =
True``) holds its gates as ``nn.Parameter`` and returns them from ``real_parameters()``: note that
``GateUpdater`` clamps those to [0, 1] after every step, the range of the paper's gates. ``kind`` is set
to the registered name where a class does not set it itself. Registration checks these; the network
checks the shapes of ``matrix()``, ``active()`` and ``draw()`` against ``[rows, cols]``, the K ones of
``active()`` when it is built and frozen, and that a kind holding parameters is learnable.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar, cast

import torch
from torch import nn

from connlearn.errors import ConfigTypeError, ShapeError
from connlearn.registry import Registry

# Keys of zero-probability entries: below every log-probability a float32 can hold (about -104), so they are
# drawn only once the positive entries are exhausted, and in random order among themselves.
_ZERO_KEY = -1.0e4


def sampling_distribution(gates: torch.Tensor) -> torch.Tensor:
    """The distribution each row of real gate values (rows are the last dimension) samples its inputs from:
    its positive part over that part's exact sum (no floor: a row of tiny gates sums to 1 too); a row without
    a positive entry is uniform."""
    w = gates.clamp(min=0)
    total = w.sum(dim=-1, keepdim=True)
    return torch.where(total > 0, w / torch.where(total > 0, total, 1.0), torch.full_like(w, 1 / w.shape[-1]))


def topk_mask(values: torch.Tensor, K: int, order: torch.Tensor | None = None) -> torch.Tensor:
    """Boolean mask of the K largest entries of each row.

    Equal values are ranked by ``order`` (same shape, or broadcastable: the larger wins), by default
    towards the lower index. The learned gates pass their ``tie_order``: under the paper's rule many gates
    of a row end at exactly 1, and breaking those ties by index would freeze a connectivity that crowds
    every block onto the lowest-numbered inputs. (The sort is stable, which ONNX cannot express: an export
    freezes a net's top-K first.)
    """
    values = values.detach()
    if order is None:
        idx = torch.sort(values, dim=-1, descending=True, stable=True).indices[..., :K]
    else:
        by_order = torch.sort(order.to(values.device).expand(values.shape), dim=-1, descending=True,
                              stable=True).indices
        ranked = torch.sort(values.gather(-1, by_order), dim=-1, descending=True, stable=True).indices
        idx = by_order.gather(-1, ranked[..., :K])
    # a tensor of ones, not the scalar True: torch.jit.trace cannot record a scatter of a Python bool
    return torch.zeros(values.shape, dtype=torch.bool, device=values.device).scatter(
        -1, idx, torch.ones(idx.shape, dtype=torch.bool, device=values.device))


def active_masks(gates: Sequence[Gate]) -> list[torch.Tensor]:
    """Every gate's :meth:`Gate.active`; those of learned gates alike in shape and K in one batched top-K
    (the same masks, with a few kernels instead of a few per gate)."""
    if len(gates) > 1 and len({(g.shape, g.K) for g in gates}) == 1 and all(
            type(g).active is _LearnableGate.active for g in gates):
        learned: list[_LearnableGate] = gates  # type: ignore[assignment]  # checked just above
        real = torch.stack([g.real for g in learned])
        return list(topk_mask(real, learned[0].K, torch.stack([g.tie_order for g in learned])).unbind(0))
    return [g.active() for g in gates]


def index_order(rows: int, cols: int) -> torch.Tensor:
    """The tie order of ``topk_mask``'s default, as ranks (``int64``, the larger wins): the lower column
    index first."""
    return torch.arange(cols - 1, -1, -1).expand(rows, cols).clone()


def random_tie_order(rows: int, cols: int, generator: torch.Generator) -> torch.Tensor:
    """A random tie order: each row a random permutation of the ranks ``0 .. cols-1`` (``int64``)."""
    return torch.rand(rows, cols, generator=generator).argsort(dim=-1).argsort(dim=-1)


def tie_generator(seed: int) -> torch.Generator:
    """The CPU generator of a network's tie orders: derived from its seed, apart from every other draw."""
    return torch.Generator().manual_seed((seed * 6364136223846793005 + 1442695040888963407) % 2**63)


def draw_generator(seed: int) -> torch.Generator:
    """The CPU generator of a network's training draws: derived from its seed, apart from the generator of
    the topology's initial gates and Fixed-Random connectivity (seeded with the seed itself). From one
    stream, the first draw would reuse the uniforms that set uniformly initialised gates, and so always be
    their top-K, and a ``topk`` network's first draw would be the Fixed-Random connectivity of its seed."""
    return torch.Generator().manual_seed(((seed + 1) * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) % 2**63)


def gumbel_topk(probs: Sequence[torch.Tensor], K: int, generator: torch.Generator,
                temperature: float = 1.0) -> list[torch.Tensor]:
    """Draw K distinct columns per row of every matrix in ``probs``, in one batched call.

    Each row is a (not necessarily normalised) non-negative weight vector w; the draw follows the law of K
    successive draws without replacement from the normalised row w^(1/temperature) (Gumbel-top-K with the
    log-weights divided by ``temperature``, which :func:`~connlearn.errors.check_temperature` bounds to
    [1e-4, 1e4]; zero weights stay zero). The uniform noise comes from
    ``generator`` (a CPU generator), so the draws are the same on every device and every DDP rank, and the
    same noise at any temperature. Returns float 0/1 matrices shaped like the inputs.
    """
    device = probs[0].device
    rows = [p.shape[0] for p in probs]
    width = max(p.shape[1] for p in probs)
    alike = len({(p.shape, p.dtype) for p in probs}) == 1  # as in ResNeXt: one stack, no padding, few kernels
    valid: torch.Tensor | None = None
    if alike:
        weights = torch.stack([p.detach() for p in probs]).float().clamp(min=0).reshape(sum(rows), width)
    else:
        weights = torch.zeros(sum(rows), width, device=device, dtype=torch.float32)
        valid = torch.zeros(sum(rows), width, device=device, dtype=torch.bool)
        r = 0
        for p in probs:
            weights[r : r + p.shape[0], : p.shape[1]] = p.detach().float().clamp(min=0)
            valid[r : r + p.shape[0], : p.shape[1]] = True
            r += p.shape[0]
    empty = weights.sum(dim=1, keepdim=True) <= 0
    weights = torch.where(empty if valid is None else empty & valid, torch.ones_like(weights), weights)
    zero_key = _ZERO_KEY
    if temperature == 1.0:
        logw = weights.clamp(min=1e-30).log()
    else:  # each row scaled to a largest weight of 1: log-weights in [log 1e-30, 0] before the division
        top = weights.amax(dim=1, keepdim=True).clamp(min=1e-30)
        logw = (weights / top).clamp(min=1e-30).log() / temperature
        zero_key = min(_ZERO_KEY, math.log(1e-30) / temperature - 100.0)  # below every positive entry's key
    logw = torch.where(weights > 0, logw, torch.full_like(weights, zero_key))
    noise = torch.rand(weights.shape, generator=generator)
    if device.type == "cuda":
        noise = noise.pin_memory()  # an asynchronous copy: no host-device synchronisation per step
    noise = noise.to(device, non_blocking=True)
    gumbel = -(-noise.clamp(1e-20, 1.0 - 1e-7).log()).log()
    keys = logw + gumbel
    if valid is not None:  # the padding is never drawn
        keys = torch.where(valid, keys, torch.full_like(weights, float("-inf")))
    idx = keys.topk(K, dim=1).indices
    hard = torch.zeros_like(weights).scatter_(1, idx, 1.0)
    if alike:
        return list(hard.to(probs[0].dtype).view(len(probs), *probs[0].shape).unbind(0))
    out, r = [], 0
    for p in probs:
        out.append(hard[r : r + p.shape[0], : p.shape[1]].to(p.dtype))
        r += p.shape[0]
    return out


def random_connectivity(rows: int, cols: int, K: int, generator: torch.Generator) -> torch.Tensor:
    """A fixed random connectivity: K distinct uniformly drawn columns per row, as a boolean matrix."""
    return gumbel_topk([torch.ones(rows, cols)], K, generator)[0].bool()


class Gate(nn.Module):
    """The gate matrix of one module: rows = its blocks, columns = its candidate inputs.

    Subclasses set ``learnable`` (holds ``nn.Parameter`` real gates, see :meth:`real_parameters`) and
    ``stochastic`` (draws a new connectivity each training step with :meth:`draw`).
    """

    kind: ClassVar[str] = ""
    learnable: ClassVar[bool] = False
    stochastic: ClassVar[bool] = False

    def __init__(self, values: torch.Tensor, active: torch.Tensor, K: int) -> None:
        super().__init__()
        self.K = int(K)
        self.shape = tuple(values.shape)

    def values(self) -> torch.Tensor:
        """The real gate values ``[rows, cols]`` (for display and for ``freeze``)."""
        raise NotImplementedError

    def active(self) -> torch.Tensor:
        """The evaluation-time connectivity, a boolean ``[rows, cols]``."""
        raise NotImplementedError

    def matrix(self, drawn: torch.Tensor | None = None) -> torch.Tensor:
        """The matrix G used in the forward pass (before the 1/K), given this step's draw if stochastic."""
        return self.active().to(self.values().dtype)

    def real_parameters(self) -> list[nn.Parameter]:
        """The learnable real gates of this module (empty for fixed kinds)."""
        return []

    @classmethod
    def draw(cls, gates: Sequence[Gate], generator: torch.Generator, temperature: float = 1.0) -> list[torch.Tensor]:
        """This step's binary draws for ``gates`` (all of this class), in one batched call. ``temperature``
        (positive; 1 by default) sharpens (below 1) or flattens (above 1) the draws; a kind without such a
        notion may leave the parameter out, and then trains at the default temperature only. The draws are
        values without autograd history: the gradient to the gates goes through ``matrix(drawn)``, and a
        held draw (``ConnectivityNet.hold_draw``) is used again in several backward passes."""
        raise NotImplementedError


class _LearnableGate(Gate):
    """Real gates held as an ``nn.Parameter`` ``real``; the evaluation connectivity is their top-K.

    Equal gates are ranked by the buffer ``tie_order`` (integer ranks, the larger wins). It starts in index
    order; ``ConnectivityNet`` sets each network's from its graph, which the topologies draw at random from
    the seed (the ``tie`` of each gate edge), so that gates tied at a clip bound freeze to a random choice
    among them, not to the lowest-numbered inputs. A checkpoint saved before the buffer existed loads with
    the index order it was trained with.
    """

    learnable = True
    _version = 2  # 2: has tie_order (state dicts of version 1 load with the index order)
    tie_order: torch.Tensor  # a buffer

    def __init__(self, values: torch.Tensor, active: torch.Tensor, K: int) -> None:
        super().__init__(values, active, K)
        self.real = nn.Parameter(values.detach().clone().float())
        self.register_buffer("tie_order", index_order(*self.shape))

    def values(self) -> torch.Tensor:
        return self.real.detach()

    def active(self) -> torch.Tensor:
        return topk_mask(self.real, self.K, self.tie_order)

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, local_metadata: dict[str, Any],
                              *args: Any, **kwargs: Any) -> None:
        # a state dict that has real gates but no tie order was saved before tie orders existed (ties went to the
        # lower index), unless its metadata says otherwise: a partial load of today's state keeps the order
        old = local_metadata.get("version", 1) < 2
        if old and prefix + "real" in state_dict and prefix + "tie_order" not in state_dict:
            state_dict[prefix + "tie_order"] = index_order(*self.shape).to(self.tie_order.device)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, *args, **kwargs)

    def real_parameters(self) -> list[nn.Parameter]:
        return [self.real]


def check_gate_kind(name: str, cls: Any) -> type[Gate]:
    """``cls`` if it can be the gate kind ``name`` (what ``register_gate`` accepts): a :class:`Gate`
    subclass defining ``values`` and ``active`` (and ``draw`` when stochastic); else a
    :class:`~connlearn.errors.ConfigTypeError` saying what is missing. Sets ``cls.kind`` to ``name`` where
    the class itself does not set it."""
    if not (isinstance(cls, type) and issubclass(cls, Gate)):
        raise ConfigTypeError(f"gate kind {name!r}: {cls!r} is not a subclass of connlearn.gates.Gate")
    missing = [m for m in ("values", "active") if getattr(cls, m) is getattr(Gate, m)]
    if cls.stochastic and getattr(cls.draw, "__func__", None) is vars(Gate)["draw"].__func__:
        missing.append("draw (it is stochastic)")
    if cls.stochastic and cls.matrix is Gate.matrix:
        missing.append("matrix (it is stochastic: the training forward pass must use the draw it is given)")
    if cls.learnable and cls.real_parameters is Gate.real_parameters:
        missing.append("real_parameters (it is learnable)")
    if missing:
        raise ConfigTypeError(f"gate kind {name!r} ({cls.__qualname__}) does not define {', '.join(missing)}; "
                              "see connlearn.gates.Gate")
    if not cls.learnable and cls.real_parameters is not Gate.real_parameters:
        raise ConfigTypeError(f"gate kind {name!r} ({cls.__qualname__}) defines real_parameters but sets "
                              "learnable = False; set learnable = True so that its gates are trained, frozen by "
                              "freeze() and kept from pruning until then")
    if "kind" not in vars(cls) or not cls.kind:
        cls.kind = name
    return cls


def check_active_rows(gate: Gate, active: torch.Tensor, module: int | None = None, what: str = "active()") -> None:
    """A :class:`~connlearn.errors.ShapeError` unless every row of ``active`` (``gate``'s ``what``, in
    ``module``) holds exactly ``gate.K`` ones: the network takes the mean of K inputs, and a frozen
    connectivity must keep K per block. Not checked on the meta device (a network built there has no
    values yet; its graph was checked)."""
    if active.is_meta:
        return
    counts = active.to(torch.int64).sum(dim=1)
    bad = (counts != gate.K).nonzero().flatten().tolist()
    if bad:
        where = "" if module is None else f" in module {module}"
        raise ShapeError(f"gate kind {gate.kind!r}{where}: {what} gives {counts[bad[0]].item()} active inputs "
                         f"in row {bad[0]}; every row needs exactly K={gate.K}")


def check_gate_shape(gate: Gate, what: str, value: Any, module: int | None = None) -> None:
    """A :class:`~connlearn.errors.ShapeError` unless ``value`` (``gate``'s ``what``, in ``module``) is a
    ``[rows, cols]`` tensor. Not checked while ``torch.jit.trace`` records (the shapes are traced values)."""
    if torch.jit.is_tracing():
        return
    if not isinstance(value, torch.Tensor) or tuple(value.shape) != tuple(gate.shape):
        got = list(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
        where = "" if module is None else f" in module {module}"
        raise ShapeError(f"gate kind {gate.kind!r}{where}: {what} gave {got}; expected a tensor of shape "
                         f"{list(gate.shape)} (rows: the module's blocks, columns: its candidate inputs)")


GATES: Registry = Registry("gate kind", "connlearn.gates", check=check_gate_kind)


@GATES.register("topk")
class TopKGate(_LearnableGate):
    """GateConnect: K inputs per block drawn from the normalised real gates; top-K in eval mode."""

    kind = "topk"
    stochastic = True

    def matrix(self, drawn: torch.Tensor | None = None) -> torch.Tensor:
        hard = drawn if drawn is not None else self.active().to(self.real.dtype)
        # forward value exactly `hard`; gradient flows to every real gate (straight-through)
        return hard + (self.real - self.real.detach())

    @classmethod
    def draw(cls, gates: Sequence[Gate], generator: torch.Generator, temperature: float = 1.0) -> list[torch.Tensor]:
        return gumbel_topk([cast(TopKGate, g).real for g in gates], gates[0].K, generator, temperature)


@GATES.register("real")
class RealGate(_LearnableGate):
    """Ablation: the real gates themselves weight the inputs, in training and evaluation."""

    kind = "real"

    def matrix(self, drawn: torch.Tensor | None = None) -> torch.Tensor:
        return self.real


class _FixedGate(Gate):
    """A fixed binary connectivity held in buffers (``mask``; ``gate_values`` for display)."""

    mask: torch.Tensor
    gate_values: torch.Tensor

    def __init__(self, values: torch.Tensor, active: torch.Tensor, K: int) -> None:
        super().__init__(values, active, K)
        self.register_buffer("mask", active.detach().clone().bool())
        dtype = values.dtype if values.is_floating_point() else torch.float32  # a float64 net's stay float64
        self.register_buffer("gate_values", values.detach().clone().to(dtype))

    def values(self) -> torch.Tensor:
        return self.gate_values

    def active(self) -> torch.Tensor:
        return self.mask

    def matrix(self, drawn: torch.Tensor | None = None) -> torch.Tensor:
        return self.mask.to(self.gate_values.dtype)


@GATES.register("random")
class RandomGate(_FixedGate):
    """Fixed-Random: K random inputs per block, drawn once from the seed when the graph is made."""

    kind = "random"


@GATES.register("frozen")
class FrozenGate(_FixedGate):
    """A fixed binary connectivity, e.g. the top-K that ``freeze()`` keeps of learned gates."""

    kind = "frozen"


@GATES.register("full")
class FullGate(_FixedGate):
    """Fixed-Full (ResNeXt): every block takes every input. Blocks with a single-stream form compile to
    the genuine ResNeXt instead of using this gate."""

    kind = "full"
