"""GateUpdater keeps gates in [0, 1] under any optimizer and GradScaler, and never touches weights."""

import pytest
import torch
from conftest import tiny

import connlearn
from connlearn.errors import ConfigTypeError
from connlearn.updater import GateUpdater, drop_gate_group, param_groups


def _steps(net, opt, n=3, scaler=None):
    for _ in range(n):
        out = net(torch.randn(4, 3, 32, 32))
        loss = out.square().mean()
        opt.zero_grad()
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()


def _in_unit_interval(net):
    return all(((p >= 0) & (p <= 1)).all() for p in net.gate_parameters())


@pytest.mark.parametrize("make_opt", [
    lambda groups: torch.optim.SGD(groups, momentum=0.9),
    lambda groups: torch.optim.Adam(groups),
])
def test_every_gate_stays_in_unit_interval_with_a_huge_learning_rate(make_opt):
    net = connlearn.build(**tiny()).train()
    with torch.no_grad():
        net.head.fc.bias.copy_(torch.linspace(-5, 5, 10))  # weights outside [0, 1] must stay so
    opt = make_opt(param_groups(net, lr=1e-3, weight_decay=0.0, gate_lr=1e4))
    GateUpdater(net).attach(opt)
    _steps(net, opt)
    assert _in_unit_interval(net)
    assert any(((p == 0) | (p == 1)).any() for p in net.gate_parameters())  # the clamp did engage
    assert net.head.fc.bias.min() < -4 and net.head.fc.bias.max() > 4


def test_gates_stay_in_unit_interval_under_a_grad_scaler():
    net = connlearn.build(**tiny()).train()
    opt = torch.optim.SGD(param_groups(net, lr=10.0, weight_decay=0.0, gate_lr=1e4))
    GateUpdater(net).attach(opt)
    _steps(net, opt, scaler=torch.amp.GradScaler("cpu", init_scale=2.0**10))
    assert _in_unit_interval(net)


def test_a_step_skipped_by_the_scaler_leaves_gates_untouched():
    net = connlearn.build(**tiny()).train()
    with torch.no_grad():
        for p in net.gate_parameters():
            p.fill_(1.5)  # out of range: a clamp would show
    opt = torch.optim.SGD(param_groups(net, lr=0.1, weight_decay=0.0, gate_lr=0.1))
    GateUpdater(net).attach(opt)
    scaler = torch.amp.GradScaler("cpu")
    loss = net(torch.randn(2, 3, 32, 32)).sum() * float("inf")
    scaler.scale(loss).backward()
    scaler.step(opt)
    assert all((p == 1.5).all() for p in net.gate_parameters())


def test_detach_removes_the_hooks():
    net = connlearn.build(**tiny()).train()
    opt = torch.optim.SGD(param_groups(net, lr=0.0, weight_decay=0.0, gate_lr=0.0))
    updater = GateUpdater(net).attach(opt)
    updater.detach()
    with torch.no_grad():
        for p in net.gate_parameters():
            p.fill_(2.0)
    _steps(net, opt, n=1)
    assert all((p == 2.0).all() for p in net.gate_parameters())


def test_param_groups_split_weights_and_gates_without_gate_weight_decay():
    net = connlearn.build(**tiny())
    weights, gates = param_groups(net, lr=0.1, weight_decay=5e-4, gate_lr=0.2)
    assert (weights["lr"], weights["weight_decay"], gates["lr"], gates["weight_decay"]) == (0.1, 5e-4, 0.2, 0.0)
    assert len(gates["params"]) == len(net.gate_parameters())


def test_fixed_gate_kinds_give_only_a_weight_group():
    assert len(param_groups(connlearn.build(**tiny(gate="random")), 0.1, 5e-4, 0.2)) == 1


def test_centered_gradients_keep_each_row_sum():
    net = connlearn.build(**tiny(gate_init="uniform")).train()
    opt = torch.optim.SGD(param_groups(net, lr=0.0, weight_decay=0.0, gate_lr=0.05))
    GateUpdater(net, grad_mode="centered", low=-10, high=10).attach(opt)
    sums = [p.detach().sum(-1).clone() for p in net.gate_parameters()]
    _steps(net, opt, n=2)
    for before, p in zip(sums, net.gate_parameters(), strict=True):
        torch.testing.assert_close(p.detach().sum(-1), before, atol=1e-4, rtol=0)


def test_normalized_gradients_are_orthogonal_to_the_row_sum():
    net = connlearn.build(**tiny(gate_init="uniform")).train()
    opt = torch.optim.SGD(param_groups(net, lr=0.0, weight_decay=0.0, gate_lr=0.0))
    updater = GateUpdater(net, grad_mode="normalized").attach(opt)
    net(torch.randn(2, 3, 32, 32)).square().sum().backward()
    updater.transform_grads()
    for p in net.gate_parameters():
        # the gradient of a function of p = ĝ/Σĝ has no component along ĝ (scale invariance)
        torch.testing.assert_close((p.grad * p.detach()).sum(-1), torch.zeros(p.shape[0]), atol=1e-6, rtol=0)


def test_unknown_grad_mode():
    with pytest.raises(connlearn.ConnlearnError, match="did you mean 'centered'"):
        GateUpdater(connlearn.build(**tiny()), grad_mode="centred")


def test_double_centered_gradients_keep_every_row_and_column_sum():
    net = connlearn.build(**tiny(gate_init="uniform")).train()
    opt = torch.optim.SGD(param_groups(net, lr=0.0, weight_decay=0.0, gate_lr=0.05))
    GateUpdater(net, grad_mode="double-centered", low=-10, high=10).attach(opt)
    before = [(p.detach().sum(-1).clone(), p.detach().sum(-2).clone()) for p in net.gate_parameters()]
    _steps(net, opt, n=2)
    for (rows, cols), p in zip(before, net.gate_parameters(), strict=True):
        torch.testing.assert_close(p.detach().sum(-1), rows, atol=1e-4, rtol=0)
        torch.testing.assert_close(p.detach().sum(-2), cols, atol=1e-4, rtol=0)


def test_clip_bounds_must_be_ordered():
    with pytest.raises(connlearn.ConnlearnError, match="low must be below high"):
        GateUpdater(connlearn.build(**tiny()), low=1.0, high=0.0)


def test_renormalized_updates_gates_whose_rows_sum_to_one():
    """Algorithm 1 of the paper: g̃ ← g̃ / Σg̃, then g̃ ← clip(g̃ − η ∂ℓ/∂g) with the plain gradient."""
    net = connlearn.build(**tiny(gate_init="uniform")).train()
    opt = torch.optim.SGD(param_groups(net, lr=0.0, weight_decay=0.0, gate_lr=0.05))
    GateUpdater(net, grad_mode="renormalized").attach(opt)
    before = [p.detach().clone() for p in net.gate_parameters()]
    net(torch.randn(2, 3, 32, 32)).square().sum().backward()
    grads = [p.grad.clone() for p in net.gate_parameters()]
    opt.step()
    for old, grad, p in zip(before, grads, net.gate_parameters(), strict=True):
        expected = (old / old.sum(-1, keepdim=True) - 0.05 * grad).clamp(0, 1)
        torch.testing.assert_close(p.detach(), expected)


def test_renormalizing_keeps_the_sampled_distribution_and_makes_empty_rows_uniform():
    net = connlearn.build(**tiny(gate_init="uniform"))
    updater = GateUpdater(net, grad_mode="renormalized")
    gate = net.gate_parameters()[0]
    with torch.no_grad():
        gate[0] = 0.0
    ratios = gate.detach()[1:] / gate.detach()[1:].sum(-1, keepdim=True)
    updater.renormalize()
    torch.testing.assert_close(gate.detach()[1:], ratios)
    torch.testing.assert_close(gate.detach()[0], torch.full((gate.shape[1],), 1 / gate.shape[1]))


def test_renormalizing_leaves_real_valued_gates_alone():
    # a `real` gate weights its inputs by its values: dividing them by the row sum would change the network
    net = connlearn.build(**tiny(gate="real", gate_init="uniform"))
    before = [p.detach().clone() for p in net.gate_parameters()]
    GateUpdater(net, grad_mode="renormalized").renormalize()
    for old, p in zip(before, net.gate_parameters(), strict=True):
        torch.testing.assert_close(p.detach(), old)


@pytest.mark.parametrize("name, value", [("lr", -0.1), ("gate_lr", -0.5), ("weight_decay", float("nan")),
                                         ("gate_lr", float("inf"))])
def test_param_groups_refuse_negative_or_non_finite_rates(name, value):
    rates = {"lr": 0.1, "weight_decay": 5e-4, "gate_lr": 0.2, name: value}
    with pytest.raises(connlearn.ConfigError, match=name):
        param_groups(connlearn.build(**tiny()), **rates)


def test_drop_gate_group_leaves_an_optimizer_that_matches_the_frozen_net():
    net = connlearn.build(**tiny())
    opt = torch.optim.SGD(param_groups(net, lr=0.1, weight_decay=5e-4, gate_lr=0.2), momentum=0.9)
    net(torch.randn(2, 3, 32, 32)).sum().backward()
    opt.step()
    gates = net.gate_parameters()
    net.freeze()
    assert drop_gate_group(opt) == gates and not any(p in opt.state for p in gates)
    fresh = torch.optim.SGD(param_groups(net, lr=0.1, weight_decay=5e-4, gate_lr=0.2), momentum=0.9)
    fresh.load_state_dict(opt.state_dict())
    assert drop_gate_group(opt) == []


_SCHEDULERS = {
    "lambda": lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda e: 0.9 ** e),
    "multiplicative": lambda o: torch.optim.lr_scheduler.MultiplicativeLR(o, lambda e: 0.9),
    "step": lambda o: torch.optim.lr_scheduler.StepLR(o, 2, 0.5),
    "cyclic": lambda o: torch.optim.lr_scheduler.CyclicLR(o, 0.01, 0.1, step_size_up=2),
    "onecycle": lambda o: torch.optim.lr_scheduler.OneCycleLR(o, 0.1, total_steps=20),
    "warm-restarts": lambda o: torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(o, 3),
    "plateau": lambda o: torch.optim.lr_scheduler.ReduceLROnPlateau(o, patience=0),
    "sequential": lambda o: torch.optim.lr_scheduler.SequentialLR(
        o, [torch.optim.lr_scheduler.LambdaLR(o, lambda e: 0.5), torch.optim.lr_scheduler.ExponentialLR(o, 0.9)],
        milestones=[3]),
}


@pytest.mark.parametrize("kind", sorted(_SCHEDULERS))
def test_schedulers_passed_to_drop_gate_group_step_on_as_for_a_net_without_gates(kind):
    def run(gate):
        net = connlearn.build(**tiny(gate=gate))
        opt = torch.optim.SGD(param_groups(net, 0.1, 5e-4, 0.2), lr=0.1, momentum=0.9)
        sched = _SCHEDULERS[kind](opt)
        lrs = []
        for step in range(6):
            _steps(net, opt, n=1)
            sched.step(1.0) if kind == "plateau" else sched.step()
            if step == 2 and gate == "topk":
                net.freeze()
                drop_gate_group(opt, sched)
            lrs.append(opt.param_groups[0]["lr"])
        return lrs, len(opt.param_groups)

    gated, groups = run("topk")
    fixed, _ = run("random")  # a net that never had gates: one group from the start
    assert groups == 1 and gated == pytest.approx(fixed)


def test_drop_gate_group_refuses_a_scheduler_of_another_optimizer():
    net = connlearn.build(**tiny())
    opt = torch.optim.SGD(param_groups(net, 0.1, 5e-4, 0.2), lr=0.1)
    other = torch.optim.lr_scheduler.StepLR(torch.optim.SGD(net.weight_parameters(), lr=0.1), 1)
    with pytest.raises(ConfigTypeError, match="StepLR is not a scheduler of this optimizer"):
        drop_gate_group(opt, other)


def _fused_sgd_on_the_cpu() -> bool:
    p = torch.zeros(1, requires_grad=True)
    p.grad = torch.zeros(1)
    try:
        torch.optim.SGD([p], lr=0.1, fused=True).step()
    except (RuntimeError, NotImplementedError):  # torch before 2.4
        return False
    return True


@pytest.mark.skipif(not _fused_sgd_on_the_cpu(), reason="this torch has no fused SGD on the CPU")
@pytest.mark.parametrize("mode", ["plain", "renormalized", "centered"])
def test_a_step_that_a_grad_scaler_skips_on_a_fused_optimizer_leaves_the_gates_alone(mode):
    net = connlearn.build(**tiny(gate_init="uniform"))
    opt = torch.optim.SGD(param_groups(net, 0.1, 0.0, 0.2), lr=0.1, momentum=0.9, fused=True)
    GateUpdater(net, grad_mode=mode).attach(opt)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 127)  # overflows: the step is skipped
    before = [p.detach().clone() for p in net.gate_parameters()]
    with torch.autocast("cpu", dtype=torch.float16):
        loss = net(torch.randn(4, 3, 32, 32)).float().square().mean() * 1e10
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() < 2.0 ** 127  # it did skip
    for p, q in zip(net.gate_parameters(), before, strict=True):
        assert torch.equal(p, q)


def test_the_updater_takes_the_network_inside_a_wrapper_and_refuses_anything_else():
    net = connlearn.build(**tiny())
    wrapped = torch.optim.swa_utils.AveragedModel(net)  # has .module, as DistributedDataParallel
    assert GateUpdater(wrapped).net is wrapped.module
    with pytest.raises(ConfigTypeError, match=r"GateUpdater takes a connlearn ConnectivityNet .*got Linear"):
        GateUpdater(torch.nn.Linear(2, 2))
    with pytest.raises(ConfigTypeError, match=r"attach takes a torch\.optim\.Optimizer, got list"):
        GateUpdater(net).attach([])


def _gate_steps(net, opt, n=3):
    """(before, gradient, after) of every gate tensor in each of ``n`` steps."""
    seen = []
    for _ in range(n):
        before = [g.detach().clone() for g in net.gate_parameters()]
        loss = net(torch.randn(4, 3, 32, 32)).square().mean()
        opt.zero_grad()
        loss.backward()
        grads = [g.grad.clone() for g in net.gate_parameters()]
        opt.step()
        seen.append((before, grads, [g.detach().clone() for g in net.gate_parameters()]))
    return seen


def test_gate_momentum_zero_is_algorithm_1s_plain_clipped_step_while_the_weights_keep_theirs():
    torch.manual_seed(0)
    net = connlearn.build(**tiny(gate_init="uniform"))
    opt = torch.optim.SGD(param_groups(net, lr=0.1, weight_decay=0.0, gate_lr=5.0, gate_momentum=0.0), momentum=0.9)
    GateUpdater(net).attach(opt)
    for before, grads, after in _gate_steps(net, opt):
        for b, g, a in zip(before, grads, after, strict=True):
            torch.testing.assert_close(a, (b - 5.0 * g).clamp(0.0, 1.0))
    weights, gates = opt.param_groups
    assert (weights["momentum"], gates["momentum"]) == (0.9, 0.0)
    assert all("momentum_buffer" in opt.state[p] for p in weights["params"])


def test_by_default_the_gates_take_the_optimizers_momentum():
    torch.manual_seed(0)
    net = connlearn.build(**tiny(gate_init="uniform"))
    opt = torch.optim.SGD(param_groups(net, lr=0.1, weight_decay=0.0, gate_lr=0.01), momentum=0.9)
    (_, g0, _), (b1, g1, a1) = _gate_steps(net, opt, n=2)
    assert "momentum" not in opt.param_groups[1] or opt.param_groups[1]["momentum"] == 0.9
    torch.testing.assert_close(a1[0], (b1[0] - 0.01 * (0.9 * g0[0] + g1[0])).clamp(0.0, 1.0))


@pytest.mark.parametrize("value", [-0.1, 1.5, float("nan"), "0.9"])
def test_param_groups_refuse_a_gate_momentum_outside_0_to_1(value):
    with pytest.raises(connlearn.ConnlearnError, match="gate_momentum"):
        param_groups(connlearn.build(**tiny()), 0.1, 5e-4, 0.2, gate_momentum=value)
