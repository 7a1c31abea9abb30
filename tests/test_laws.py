"""Two laws of GateConnect checked over many cases: the gates' straight-through gradient, and the law of the
draws (Algorithm 1's K distinct samples from the normalised gates)."""

import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import connlearn
from connlearn.gates import gumbel_topk


def _loss(net, x, target):
    return (net(x) * target).sum()


@pytest.mark.slow
@settings(max_examples=12)
@given(C=st.integers(1, 4), data=st.data(), topology=st.sampled_from(["resnext", "dense"]),
       engine=st.sampled_from(["fused", "reference"]), gate=st.sampled_from(["topk", "real"]),
       temperature=st.sampled_from([1.0, 0.1]), seed=st.integers(0, 10**6))
def test_every_gate_s_gradient_is_the_loss_derivative_at_the_drawn_matrix(C, data, topology, engine, gate,
                                                                          temperature, seed):
    # DESIGN, "straight-through": the forward pass uses the draw g (binary for topk, the gates for real) and
    # every real gate, drawn or not, gets dl/dg_jk = <dl/ds_j, y_k> / K: the derivative of the loss with the
    # gate matrix taken as a free variable at g, with the 1/K of the mean. Central differences in float64.
    K = data.draw(st.integers(1, C))
    net = connlearn.build(topology, C=C, K=K, M=3 if topology == "resnext" else 6, gate=gate, seed=seed, width=2,
                          num_classes=3, stem_channels=3, base_channels=4, engine=engine,
                          gate_init="uniform").double().train()
    if gate == "topk":
        net.sample_temperature = temperature
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 3, 6, 6, generator=g, dtype=torch.float64)
    target = torch.randn(3, 3, generator=g, dtype=torch.float64)
    state = net.generator.get_state()
    matrices = {m: None if mix is None else mix.detach() * K for m, mix in zip(net.module_ids, net.gate_matrices(),
                                                                               strict=True)}
    net.generator.set_state(state)  # the backward pass draws what gate_matrices() drew
    _loss(net, x, target).backward()
    gates = dict(net.gates())
    grads = {m: gates[m].real.grad.clone() for m in gates}
    for m in gates:  # from here on the forward pass uses these matrices, as free variables
        gates[m].matrix = (lambda fixed: lambda drawn=None: fixed)(matrices[m])
    try:
        for m, gate_module in gates.items():
            drawn = matrices[m]
            if gate == "topk":
                assert torch.equal(drawn, drawn.round()) and (drawn.sum(1) == K).all()
            numeric = torch.zeros_like(drawn)
            for j, k in itertools.product(range(drawn.shape[0]), range(drawn.shape[1])):
                losses = []
                for step in (1e-6, -1e-6):
                    moved = drawn.clone()
                    moved[j, k] += step
                    gate_module.matrix = (lambda fixed: lambda drawn=None: fixed)(moved)
                    with torch.no_grad():
                        losses.append(_loss(net, x, target).item())
                numeric[j, k] = (losses[0] - losses[1]) / 2e-6
            gate_module.matrix = (lambda fixed: lambda drawn=None: fixed)(drawn)
            torch.testing.assert_close(grads[m], numeric, atol=1e-5 * max(1.0, numeric.abs().max().item()), rtol=1e-4)
            if gate == "topk" and drawn.shape[1] > K:
                assert (grads[m][drawn == 0] != 0).any()  # undrawn gates learn too
    finally:
        for gate_module in gates.values():
            del gate_module.matrix


def _law_of_sets(p, K):
    """The probability of each K-set under K successive draws without replacement from ``p``."""
    law = {}
    for order in itertools.permutations(range(len(p)), K):
        chance, left = 1.0, 1.0
        for i in order:
            if left <= 1e-15:
                chance = 0.0
                break
            chance *= p[i] / left
            left -= p[i]
        law[frozenset(order)] = law.get(frozenset(order), 0.0) + chance
    return law


def test_draws_follow_k_successive_draws_without_replacement_over_whole_sets():
    # Algorithm 1: K distinct samples from Mult(w^(1/T) / sum). Checked on the law of whole K-sets, not only
    # each input's share, for random gates with zeros among them, at three temperatures. Where K exceeds the
    # non-zero gates, every non-zero one is drawn and the rest uniformly among the zeros (gates.py).
    g = torch.Generator().manual_seed(0)
    n = 20_000
    for trial in range(30):
        C = int(torch.randint(1, 6, (1,), generator=g))
        K = int(torch.randint(1, C + 1, (1,), generator=g))
        w = torch.rand(C, generator=g) * (torch.rand(C, generator=g) > 0.25)
        T = (1.0, 0.5, 2.0)[trial % 3]
        weighted = w ** (1 / T)
        p = weighted / weighted.sum() if weighted.sum() > 0 else torch.full((C,), 1 / C)
        drawn = gumbel_topk([w.expand(n, C)], K, torch.Generator().manual_seed(trial), temperature=T)[0].bool()
        counts = {}
        for row in drawn.tolist():
            key = frozenset(i for i, on in enumerate(row) if on)
            counts[key] = counts.get(key, 0) + 1
        positive = [i for i in range(C) if p[i] > 0]
        if len(positive) >= K:
            law = _law_of_sets(p.tolist(), K)
        else:
            zeros = [i for i in range(C) if p[i] == 0]
            law = {frozenset(positive) | frozenset(c): 1 / math.comb(len(zeros), K - len(positive))
                   for c in itertools.combinations(zeros, K - len(positive))}
        for key in set(law) | set(counts):
            expected, seen = law.get(key, 0.0), counts.get(key, 0) / n
            if expected == 0:
                assert seen == 0, (trial, sorted(key))  # a set that cannot be drawn never is
            else:
                z = abs(seen - expected) / math.sqrt(expected * (1 - expected) / n + 1e-12)
                assert z < 5.5, (trial, C, K, T, w.tolist(), sorted(key), expected, seen)
