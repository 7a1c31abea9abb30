"""The k-subset estimators against what can be enumerated on a toy of C=5, K=2 (ten subsets): SIMPLE's marginals
and samples, the score function's mean gradient, I-MLE's and the relaxed top-K's definitions; and every kind
resumes a run bit for bit and compiles."""

import copy
import itertools
import math

import pytest
import torch
from conftest import RandomLoader, tiny

import connlearn
from connlearn.estimators import (
    GumbelGate,
    ImleGate,
    ScoreFunctionGate,
    log_subset_probability,
    marginals,
    sample_subsets,
)
from connlearn.train import RunConfig, Trainer, get_recipe

KINDS = ["gumbel", "simple", "imle", "score", "magnitude"]
SUBSETS = [frozenset(s) for s in itertools.combinations(range(5), 2)]


def _law(theta):
    """The k-subset distribution p(S) ∝ exp(Σ_{i∈S} θ_i) over the ten 2-subsets of 5, by enumeration."""
    weights = torch.stack([theta[list(s)].sum().exp() for s in SUBSETS])
    return weights / weights.sum()


def _onehot(s):
    return torch.tensor([float(i in s) for i in range(5)], dtype=torch.float64)


def test_simples_marginals_are_the_enumerated_ones():
    for seed in range(5):
        theta = torch.randn(5, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 2
        exact = sum(p * _onehot(s) for p, s in zip(_law(theta), SUBSETS, strict=True))
        torch.testing.assert_close(marginals(theta, 2), exact, atol=1e-6, rtol=0)
        assert torch.allclose(log_subset_probability(theta, _onehot(SUBSETS[3]), 2), _law(theta)[3].log())


def test_the_exact_sampler_draws_the_k_subset_distribution():
    theta = torch.tensor([1.0, -0.5, 0.0, 2.0, 0.3], dtype=torch.float64)
    n = 40_000
    z = sample_subsets(theta.expand(n, 5), 2, torch.Generator().manual_seed(0))
    assert (z.sum(-1) == 2).all()
    seen = {s: 0 for s in SUBSETS}
    for row in z.bool().tolist():
        seen[frozenset(i for i, on in enumerate(row) if on)] += 1
    for p, s in zip(_law(theta).tolist(), SUBSETS, strict=True):
        assert abs(seen[s] / n - p) < 5 * math.sqrt(p * (1 - p) / n), (sorted(s), p, seen[s] / n)


def test_the_score_function_gradient_is_unbiased():
    """Its mean over 60 steps of 256 per-example draws against the exact gradient of E_p[f(S)] for a fixed f
    of the ten subsets; tolerance: 4 standard errors of the 60 estimates (seeded, so it is deterministic)."""
    g = torch.Generator().manual_seed(1)
    theta0 = torch.randn(1, 5, generator=g)
    f = {s: float(v) for s, v in zip(SUBSETS, torch.randn(10, generator=g), strict=True)}
    theta = theta0.double().requires_grad_()
    exact = torch.autograd.grad(sum(p * f[s] for p, s in zip(_law(theta[0]), SUBSETS, strict=True)), theta)[0]
    gate = ScoreFunctionGate(theta0, torch.zeros(1, 5, dtype=torch.bool), 2)
    estimates = []
    for _ in range(60):
        drawn = ScoreFunctionGate.draw([gate], g, batch=256)[0]
        losses = torch.tensor([f[frozenset(row[0].nonzero().flatten().tolist())] for row in drawn])
        gate.real.grad = None
        gate.surrogate(drawn, losses).backward()
        estimates.append(gate.real.grad.clone())
    estimates = torch.stack(estimates).double()
    error = estimates.std(0) / math.sqrt(len(estimates))
    assert ((estimates.mean(0) - exact).abs() < 4 * error + 1e-4).all(), (estimates.mean(0), exact, error)


def test_imles_gradient_is_the_difference_of_two_map_states():
    gate = ImleGate(torch.tensor([[0.1, 0.4, 0.3, 0.9, 0.0]]), torch.zeros(1, 5, dtype=torch.bool), 2, lam=10.0)
    gate.train()
    drawn = ImleGate.draw([gate], torch.Generator().manual_seed(0))[0]
    assert torch.equal(drawn, (gate.real.detach() + gate.noise).topk(2).indices.new_zeros(1, 5).scatter(
        1, (gate.real.detach() + gate.noise).topk(2).indices, 1).float())
    downstream = torch.tensor([[0.0, 0.0, 0.0, 0.2, -0.1]])  # makes input 3 costly and input 4 attractive
    (gate.matrix(drawn) * downstream).sum().backward()
    target = torch.zeros(1, 5).scatter(1, (gate.real.detach() - 10.0 * downstream + gate.noise).topk(2).indices, 1)
    torch.testing.assert_close(gate.real.grad, (drawn - target) / 10.0)


def test_the_relaxed_top_k_sums_to_k_and_its_forward_is_the_hard_draw():
    gate = GumbelGate(torch.randn(3, 6), torch.zeros(3, 6, dtype=torch.bool), 2, tau=0.3)
    drawn = GumbelGate.draw([gate], torch.Generator().manual_seed(0))[0]
    matrix = gate.matrix(drawn)
    assert torch.equal(matrix.detach(), drawn) and (drawn.sum(-1) == 2).all()
    relaxed = matrix - drawn.detach()
    assert torch.autograd.grad(relaxed.sum(), gate.real)[0].abs().max() < 1e-5  # Σ of the relaxation is K
    assert torch.equal(drawn, torch.zeros(3, 6).scatter(1, (gate.real.detach() + gate.noise).topk(2).indices, 1))


def test_magnitude_reads_its_top_k_in_training_and_learns_straight_through():
    net = connlearn.build(**tiny(gate="magnitude", gate_init="uniform")).train()
    topk = connlearn.build(**tiny(gate="topk", gate_init="uniform")).train()
    topk.load_state_dict({**net.state_dict(), "_extra_state": topk.state_dict()["_extra_state"]})
    topk.sample_temperature = 1e-4  # its draws are then its top-K
    x = torch.randn(3, 3, 32, 32)
    net(x).square().sum().backward()
    topk(x).square().sum().backward()
    for a, b in zip(net.gate_parameters(), topk.gate_parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad)


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_resumes_a_run_bit_for_bit(kind, tmp_path):
    def trainer(out):
        net = connlearn.build(**tiny(gate=kind, gate_init="uniform"))
        return Trainer(net, RandomLoader(n=32), None, get_recipe("cifar").scaled(2),
                       RunConfig(out=out, progress=False, checkpoint_every=1, snapshot_every=1))

    torch.manual_seed(0)
    straight = trainer(tmp_path / "a")
    straight.fit()
    torch.manual_seed(0)
    trainer(tmp_path / "b").fit(max_epochs=1)
    resumed = trainer(tmp_path / "b")
    resumed.fit()
    for (name, p), q in zip(straight.net.state_dict().items(), resumed.net.state_dict().values(), strict=True):
        assert torch.equal(p, q) if torch.is_tensor(p) else str(p) == str(q), name
    assert straight.net.gate_kind == "frozen" and straight.history[0]["gate_mean"] is not None


@pytest.mark.parametrize("kind", ["gumbel", "simple", "imle", "score"])
def test_every_kind_compiles_to_the_same_outputs_and_gradients(kind):
    net = connlearn.build(**tiny(gate=kind, gate_init="uniform"))
    twin = torch.compile(copy.deepcopy(net), backend="aot_eager")
    x = torch.randn(3, 3, 32, 32)
    out, compiled = net(x), twin(x)
    torch.testing.assert_close(compiled, out)
    losses = out.logsumexp(1)
    (losses.mean() + net.surrogate_loss(losses)).backward()
    losses = compiled.logsumexp(1)
    (losses.mean() + twin.surrogate_loss(losses)).backward()
    for a, b in zip(net.gate_parameters(), twin.gate_parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad)


def test_every_kinds_documented_knobs_are_its_defaults():
    # docs/estimators.md's tables are where a user reads a kind's knobs and how it trains, by default
    import re
    from pathlib import Path

    from connlearn.gates import GATES

    table = (Path(__file__).resolve().parent.parent / "docs" / "estimators.md").read_text().split("\n## ")[0]
    rows = [line.split(" | ") for line in table.splitlines() if line.startswith("| `")]
    documented = {kind: {k: float(v) for k, v in re.findall(r"`(\w+)` \(([\d.]+)\)", row[3])}
                  for row in rows for kind in re.findall(r"`(\w+)`", row[0])}
    assert set(documented) == set(GATES.names())
    assert documented == {kind: dict(GATES.get(kind).knobs) for kind in documented}
    trains = (Path(__file__).resolve().parent.parent / "docs" / "estimators.md").read_text().split(
        "## How `connlearn train` trains each kind")[1].split("\n## ")[0]
    rows = [line.split(" | ") for line in trains.splitlines() if line.startswith("| `")]
    documented = {re.findall(r"`(\w+)`", row[0])[0]: {k: v if v.isalpha() else float(v) for k, v in
                                                      re.findall(r"`(\w+)` \(([\w.]+)\)", row[1])} for row in rows}
    assert documented == {kind: GATES.get(kind).trains_with for kind in GATES.names() if GATES.get(kind).trains_with}
