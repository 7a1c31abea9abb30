"""More ways to learn which K of a block's N candidate inputs it reads: k-subset estimators beside the paper's.

Each is a gate kind registered through the public interface (:func:`connlearn.register_gate` and the
:class:`~connlearn.gates.Gate` protocol) and learns unconstrained scores ``θ`` (the ``real`` parameter, which
the GateUpdater leaves unclipped). Freezing keeps each block's top-K of ``θ``, which is also the top-K of the
marginals of the distributions below. Knobs come from the graph's ``gate_options`` (``build(...,
gate_options={"tau": 0.5})``). Costs are per training step, for R rows (blocks) of N candidates:

=============  ================================================================  ================================
kind           forward / backward                                                cost per step
=============  ================================================================  ================================
``gumbel``     hard top-K of θ/T + Gumbel noise / Xie & Ermon's relaxed top-K       K softmaxes over R×N
``simple``     exact sample of p(z) ∝ exp(θ·z), |z| = K / its exact marginals      two O(N·K) recursions
``imle``       top-K of θ/T + sum-of-Gamma noise / difference of two MAP states    two top-Ks, s Gamma draws
``score``      exact k-subset sample per example / score function, LOO baseline   B samples, one recursion
``magnitude``  top-K of θ, no sampling / straight-through to every score           one top-K
               (``density``: the top scores of the network)
=============  ================================================================  ================================
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, cast

import numpy as np
import torch

from connlearn.gates import GATES, Budgeted, Gate, LearnedGate, topk_mask

#: log 0 in the recursions: finite, so that their gradients stay finite where a term is impossible
_NEG = -1.0e30


def _push(a: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """The recursion's step: ``log e_j`` of one more term ``t`` (``[..., 1]``) from ``a = log e_·``."""
    return torch.logaddexp(a, torch.cat([a[..., :1].new_full(a[..., :1].shape, _NEG), a[..., :-1]], dim=-1) + t)


def log_elementary(theta: torch.Tensor, K: int) -> torch.Tensor:
    """``log e_j(exp θ)`` for j = 0..K along the last dimension (the elementary symmetric polynomials):
    ``[..., K + 1]``; ``e_K`` is the partition function of the k-subset distribution p(z) ∝ exp(θ·z)."""
    a = torch.full((*theta.shape[:-1], K + 1), _NEG, dtype=theta.dtype, device=theta.device)
    a[..., 0] = 0.0
    for i in range(theta.shape[-1]):
        a = _push(a, theta[..., i:i + 1])
    return a


def _suffixes(theta: torch.Tensor, K: int) -> list[torch.Tensor]:
    """``[log e_·(θ_i..θ_N) for i = 0..N]`` (the last: of nothing), each ``[..., K + 1]``."""
    out = [log_elementary(theta[..., :0], K)]
    for i in range(theta.shape[-1] - 1, -1, -1):
        out.insert(0, _push(out[0], theta[..., i:i + 1]))
    return out


def marginals(theta: torch.Tensor, K: int) -> torch.Tensor:
    """The exact marginals P(z_i = 1) of the k-subset distribution p(z) ∝ exp(θ·z), |z| = K, along the last
    dimension: ``exp(θ_i) e_{K-1}(θ without i) / e_K(θ)``, from prefix and suffix recursions in log space
    (differentiable, as SIMPLE's backward pass needs; Ahmed et al. 2023, Eq. 7)."""
    suffix = _suffixes(theta, K)
    prefix = log_elementary(theta[..., :0], K)
    out = []
    for i in range(theta.shape[-1]):
        others = torch.logsumexp(prefix[..., :K] + suffix[i + 1][..., :K].flip(-1), dim=-1)
        out.append(theta[..., i] + others)
        prefix = _push(prefix, theta[..., i:i + 1])
    return torch.exp(torch.stack(out, dim=-1) - suffix[0][..., K:])


def sample_subsets(theta: torch.Tensor, K: int, generator: torch.Generator) -> torch.Tensor:
    """Exact samples of p(z) ∝ exp(θ·z), |z| = K, one per row (0/1, the shape of ``θ``): column by column,
    z_i = 1 with probability ``exp(θ_i) e_{r-1}(θ_{i+1..}) / e_r(θ_{i..})`` for the r still to choose."""
    theta = theta.detach().double()
    suffix = _suffixes(theta, K)
    uniform = torch.rand(theta.shape, generator=generator, dtype=torch.float64).to(theta.device)
    left = torch.full(theta.shape[:-1], K, device=theta.device, dtype=torch.long)
    z = torch.zeros_like(theta)
    for i in range(theta.shape[-1]):
        need = left.clamp(min=1).unsqueeze(-1)
        log_p = theta[..., i] + suffix[i + 1].gather(-1, need - 1).squeeze(-1) - suffix[i].gather(-1, need).squeeze(-1)
        take = (left > 0) & (uniform[..., i] < log_p.exp())
        z[..., i] = take.double()
        left = left - take.long()
    return z


def log_subset_probability(theta: torch.Tensor, z: torch.Tensor, K: int) -> torch.Tensor:
    """``log p(z)`` of the k-subset distribution: ``θ·z − log e_K(exp θ)``, per row."""
    return (theta * z).sum(-1) - log_elementary(theta, K)[..., K]


class _ScoreGate(LearnedGate):
    """Unconstrained learned scores (``clipped = False``) with the knobs of the graph's ``gate_options``; in
    evaluation (and for ``magnitude`` in training too) the top-K, straight-through to every score."""

    clipped = False
    noise: torch.Tensor

    def __init__(self, values: torch.Tensor, active: torch.Tensor, K: int, **options: Any) -> None:
        super().__init__(values, active, K, **options)
        self.temperature = 1.0  # the last draw's
        self.register_buffer("noise", torch.zeros(self.shape), persistent=False)  # the last draw's perturbation

    def matrix(self, drawn: torch.Tensor | None = None) -> torch.Tensor:
        return self.active().to(self.real.dtype) + (self.real - self.real.detach())


class GumbelGate(_ScoreGate):
    """Straight-through Gumbel-top-K: forward the K-hot of the perturbed scores ``θ/T + g`` (g Gumbel noise,
    T the sampling temperature), backward through Xie & Ermon (2019)'s relaxed top-K, K successive softmaxes
    of temperature ``tau``: ``α¹ = θ/T + g``, ``w_j = softmax(α^j / τ)``, ``α^{j+1} = α^j + log(1 − w_j)``,
    relaxed = Σ_j w_j (their Eq. 6-8)."""

    stochastic = True
    knobs: ClassVar[dict[str, Any]] = {"tau": 0.5}
    trains_with: ClassVar[dict[str, Any]] = {"gate_optimizer": "adam", "gate_lr": 0.01517}  # tuned, K=4
    tau: float

    def matrix(self, drawn: torch.Tensor | None = None) -> torch.Tensor:
        if drawn is None:
            return super().matrix()
        alpha, relaxed = self.real / self.temperature + self.noise, torch.zeros_like(self.real)
        for _ in range(self.K):
            w = torch.softmax(alpha / self.tau, dim=-1)
            relaxed = relaxed + w
            alpha = alpha + torch.log1p(-w.clamp(max=1 - 1e-6))
        return drawn + (relaxed - relaxed.detach())  # forward: exactly the draw

    @classmethod
    def draw(cls, gates: Sequence[Gate], generator: torch.Generator, temperature: float = 1.0,
             batch: int = 1) -> list[torch.Tensor]:
        out = []
        for g in cast(Sequence[GumbelGate], gates):
            u = torch.rand(g.shape, generator=generator).clamp(1e-20, 1 - 1e-7).to(g.real.device)
            g.noise.copy_(-(-u.log()).log())
            g.temperature = temperature
            out.append(topk_mask(g.real.detach() / temperature + g.noise, g.K).to(g.real.dtype))
        return out


class SimpleGate(_ScoreGate):
    """SIMPLE (Ahmed, Zeng, Niepert & Van den Broeck, ICLR 2023): forward an exact sample of the k-subset
    distribution p(z) ∝ exp(θ·z / T), |z| = K; backward the gradient of its exact marginals μ(θ), computed by
    a recursion in log space (their Eq. 5-7): ``G = z + μ − sg(μ)``."""

    stochastic = True
    trains_with: ClassVar[dict[str, Any]] = {"gate_optimizer": "adam", "gate_lr": 0.03829,
                                             "gate_temperature_end": 0.13}  # tuned, K=4

    def matrix(self, drawn: torch.Tensor | None = None) -> torch.Tensor:
        if drawn is None:
            return super().matrix()
        mu = marginals(self.real / self.temperature, self.K)
        return drawn + (mu - mu.detach())  # forward: exactly the draw

    @classmethod
    def draw(cls, gates: Sequence[Gate], generator: torch.Generator, temperature: float = 1.0,
             batch: int = 1) -> list[torch.Tensor]:
        for g in gates:
            cast(SimpleGate, g).temperature = temperature
        return [sample_subsets(cast(SimpleGate, g).real / temperature, g.K, generator).to(cast(SimpleGate, g).real)
                for g in gates]


class _PerturbAndMap(torch.autograd.Function):
    """Forward the MAP state z = top-K(θ + ε); backward I-MLE's (z − top-K(θ − λ·∂ℓ/∂z + ε)) / λ."""

    @staticmethod
    def forward(ctx: Any, theta: torch.Tensor, noise: torch.Tensor, K: int, lam: float) -> torch.Tensor:
        z = topk_mask(theta + noise, K).to(theta.dtype)
        ctx.save_for_backward(theta, noise, z)
        ctx.K, ctx.lam = K, lam
        return z

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        theta, noise, z = ctx.saved_tensors
        target = topk_mask(theta - ctx.lam * grad + noise, ctx.K).to(theta.dtype)
        return (z - target) / ctx.lam, None, None, None


class ImleGate(_ScoreGate):
    """I-MLE (Niepert, Minervini & Franceschi, NeurIPS 2021): perturb-and-MAP top-K of ``θ/T + ε`` with
    sum-of-Gamma noise ``ε = (Σ_{i=1..s} Gamma(1/K, K/i) − log s) / K`` (their Eq. 12; ``samples`` s = 10),
    the gradient the difference of the MAP states of θ and of the target ``θ − λ ∂ℓ/∂z`` over ``lam`` λ
    (Eq. 8-10; default 100)."""

    stochastic = True
    knobs: ClassVar[dict[str, Any]] = {"lam": 100.0, "samples": 10}
    trains_with: ClassVar[dict[str, Any]] = {"gate_optimizer": "adam", "gate_lr": 0.00126,
                                             "gate_temperature_end": 0.464}  # tuned, K=4
    lam: float
    samples: int

    def matrix(self, drawn: torch.Tensor | None = None) -> torch.Tensor:
        if drawn is None:
            return super().matrix()
        return _PerturbAndMap.apply(self.real / self.temperature, self.noise, self.K, self.lam)

    @classmethod
    def draw(cls, gates: Sequence[Gate], generator: torch.Generator, temperature: float = 1.0,
             batch: int = 1) -> list[torch.Tensor]:
        out = []
        for g in cast(Sequence[ImleGate], gates):  # NumPy's Gamma draws, seeded from the network's generator
            rng = np.random.default_rng(int(torch.randint(2**62, (1,), generator=generator)))
            gamma = sum(rng.gamma(1 / g.K, g.K / i, g.shape) for i in range(1, g.samples + 1))
            g.noise.copy_(torch.from_numpy((gamma - np.log(g.samples)) / g.K))
            g.temperature = temperature
            out.append(topk_mask(g.real.detach() / temperature + g.noise, g.K).to(g.real.dtype))
        return out


class ScoreFunctionGate(_ScoreGate):
    """The score-function estimator (REINFORCE; Williams 1992) of the k-subset distribution p(z) ∝ exp(θ·z/T):
    one exact sample per example; the gradient ``(1/B) Σ_b (ℓ_b − b_b) ∇ log p(z_b)`` with the leave-one-out
    baseline ``b_b`` = the mean loss of the batch's other examples (Kool, van Hoof & Welling 2019), through
    :meth:`surrogate`, which the training loop adds to the loss (``net.surrogate_loss(losses)``). Per-example
    draws make the gate mix a [B, C, N] batched matmul, as costly as the shared draw's."""

    stochastic = True

    def matrix(self, drawn: torch.Tensor | None = None) -> torch.Tensor:
        return super().matrix() if drawn is None else drawn  # no gradient through the forward pass

    def surrogate(self, drawn: torch.Tensor, losses: torch.Tensor) -> torch.Tensor:
        n = losses.numel()
        losses = losses.detach().float()
        baseline = (losses.sum() - losses) / max(n - 1, 1)
        log_p = log_subset_probability(self.real / self.temperature, drawn, self.K).sum(-1)  # [B]: over rows
        return ((losses - baseline) * log_p).sum() / n

    @classmethod
    def draw(cls, gates: Sequence[Gate], generator: torch.Generator, temperature: float = 1.0,
             batch: int = 1) -> list[torch.Tensor]:
        out = []
        for g in cast(Sequence[ScoreFunctionGate], gates):
            g.temperature = temperature
            theta = (g.real / temperature).expand(batch, *g.shape)
            out.append(sample_subsets(theta, g.K, generator).to(g.real))
        return out


class MagnitudeGate(Budgeted, _ScoreGate):
    """Discovering Neural Wirings (Wortsman, Farhadi & Rastegari 2019): each block reads the top-K of its
    learned scores, in training too (no sampling), and the gradient reaches every score straight through
    (their Eq. 3-4): ``G = top-K(θ) + θ − sg(θ)``: the matrix of every score kind in evaluation. Under a
    ``density`` the top scores of the whole network, K free per block (equal ones: each row's tie ranks)."""

    trains_with: ClassVar[dict[str, Any]] = {"gate_optimizer": "adam", "gate_lr": 0.00133}  # the tuning's best, K=4

    def weighted_by(self, kept: torch.Tensor) -> torch.Tensor:
        return kept.to(self.real.dtype) + (self.real - self.real.detach())


for _name, _cls in (("gumbel", GumbelGate), ("simple", SimpleGate), ("imle", ImleGate), ("score", ScoreFunctionGate),
                    ("magnitude", MagnitudeGate)):
    GATES.register(_name, _cls)
