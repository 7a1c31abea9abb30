"""benchmarks/planted.py: uninformative branches carry nothing of the image, the oracle reads only the others,
and a planted run trains, reports and refuses to resume under another setting."""

import json

import pytest
import torch
from conftest import tiny
from planted import main, plant_noise, rewire_oracle, top_k_share

import connlearn
import connlearn.experiment
from connlearn.checkpoint import net_from_checkpoint
from connlearn.cli import main as connlearn_main
from connlearn.compile import FusedModule
from connlearn.data import make_loaders, pack, synthetic
from connlearn.prune import prune_dead_blocks
from connlearn.recipe import Phase, Recipe
from connlearn.train import Trainer


@pytest.fixture
def restore(monkeypatch):
    """Put back what the script replaces, whatever a test does."""
    monkeypatch.setattr(FusedModule, "_first", FusedModule._first)
    monkeypatch.setattr(connlearn.experiment, "build_net", connlearn.experiment.build_net)


def _first_module(net, x):
    stage = net.stages[0]
    assert isinstance(stage, FusedModule)
    return stage([net.stem(x)], None)


def test_uninformative_branches_carry_nothing_of_the_image_at_their_own_scale(restore):
    net = connlearn.build(**tiny(C=4, K=2)).eval()
    x = torch.randn(16, 3, 32, 32, generator=torch.Generator().manual_seed(0), requires_grad=True)
    clean = _first_module(net, x).detach()
    plant_noise([3, 4], 4)
    out = _first_module(net, x)
    b, _, h, w = out.shape
    y, y0 = out.view(b, 4, -1, h, w), clean.view(b, 4, -1, h, w)
    assert torch.equal(y[:, :2], y0[:, :2])  # the informative branches are untouched
    (grad,) = torch.autograd.grad(y[:, 2:].sum(), x, allow_unused=True)
    assert grad is None or not grad.any()  # nothing flows back from the noise to the image
    for j in (2, 3):
        ratio = y[:, j].detach().pow(2).mean().sqrt() / y0[:, j].pow(2).mean().sqrt()
        assert 0.9 < float(ratio) < 1.1  # the branch's own scale
    assert not torch.equal(_first_module(net, x)[:, 2 * y.shape[2]:], out[:, 2 * y.shape[2]:])  # fresh noise


def test_planting_twice_does_not_stack_and_another_setting_is_refused(restore):
    plant_noise([2], 2)
    first = FusedModule._first
    plant_noise([2], 2)
    assert FusedModule._first is first
    with pytest.raises(RuntimeError, match="already outputs noise"):
        plant_noise([1], 2)


def test_the_oracle_reads_only_informative_branches_in_module_two():
    net = connlearn.build(**tiny(C=4, K=2, gate="random"))
    oracle = rewire_oracle(net, [1, 3])
    graph = oracle.graph()
    for node in graph.branches(2):
        assert [u for u, _, d in graph.gate_edges(node) if d["active"]] == ["m1.b2", "m1.b4"]
    assert graph.branches(3) and oracle.connectivity()[3].equal(net.connectivity()[3])  # later modules keep theirs


def test_with_more_informative_branches_than_k_the_oracle_draws_among_them():
    net = connlearn.build(**tiny(C=8, K=2, gate="random"))
    graph = rewire_oracle(net, [7, 8]).graph()
    reads = [frozenset(u for u, _, d in graph.gate_edges(node) if d["active"]) for node in graph.branches(2)]
    assert all(len(r) == 2 and not r & {"m1.b7", "m1.b8"} for r in reads)
    assert len(set(reads)) > 1  # not one subset for every block

    def reads_of(seed):
        graph = rewire_oracle(connlearn.build(**tiny(C=8, K=2, gate="random", seed=seed)), [7, 8]).graph()
        return [frozenset(u for u, _, d in graph.gate_edges(n) if d["active"]) for n in graph.branches(2)]

    assert reads == reads_of(0) and reads != reads_of(1)  # drawn from the graph's seed


def test_the_oracle_needs_a_random_connectivity_and_enough_informative_branches():
    with pytest.raises(SystemExit, match="--gate random"):
        rewire_oracle(connlearn.build(**tiny(C=4, K=2, gate="topk")), [1])
    with pytest.raises(SystemExit, match="at least K=2"):
        rewire_oracle(connlearn.build(**tiny(C=4, K=2, gate="random")), [1, 2, 3])


@pytest.mark.parametrize("argv", [["--report", "x", "--uninformative", "1"], ["--png", "x.png"], [],
                                  ["--uninformative", "0"], ["--uninformative", "2", "2"]])
def test_bad_command_lines_are_usage_errors(argv):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2


def test_top_k_share_counts_uninformative_columns_among_each_rows_top_k():
    gates = [[0.9, 0.1, 0.8, 0.2], [0.1, 0.9, 0.2, 0.8]]
    assert top_k_share(gates, 2, [3, 4]) == 0.5
    assert top_k_share(gates, 2, [2, 4]) == 0.5
    assert top_k_share([[0.9, 0.8, 0.1, 0.2]], 2, [3, 4]) == 0.0
    assert top_k_share([[0.5, 0.5, 0.5, 0.5]], 2, [3, 4]) == 0.5  # ties share the places, whatever their index
    assert top_k_share([[0.9, 0.5, 0.5, 0.5]], 2, [4]) == pytest.approx(1 / 6)
    with pytest.raises(ValueError, match="K=5"):
        top_k_share(gates, 5, [3])


def test_a_planted_run_trains_reports_and_refuses_another_setting(tmp_path, restore, capsys):
    data = tmp_path / "data.npz"
    pack(data, *synthetic(num_classes=10, n_train=100, n_test=40))

    def train(out, *extra):
        return ["--dataset", "cifar10", "--data", str(data), "--epochs", "4", "--phases", "1", "1", "1", "1",
                "--M", "3", "--C", "4", "--K", "2", "--width", "1", "--base-channels", "4", "--stem-channels", "4",
                "--batch-size", "25", "--snapshot-every", "2", "--no-progress", "--out", str(out), *extra]

    learned, oracle = tmp_path / "learned", tmp_path / "oracle"
    with pytest.raises(SystemExit, match="module 1 has 4 branches"):  # a failed start leaves no record behind
        main(["--uninformative", "9", "--", *train(learned)])
    assert main(["--uninformative", "3", "4", "--", *train(learned)]) == 0
    assert json.loads((learned / "planted.json").read_text())["uninformative"] == [3, 4]
    assert FusedModule._first.planted == ((3, 4), 4)  # what the run trained with
    assert main(["--uninformative", "3", "4", "--oracle", "--", *train(oracle, "--gate", "random")]) == 0
    graph = net_from_checkpoint(oracle / "last.pt").graph()
    assert all(u in ("m1.b1", "m1.b2") for n in graph.branches(2) for u, _, d in graph.gate_edges(n) if d["active"])
    capsys.readouterr()
    assert main(["--report", str(learned), str(oracle), "--png", str(tmp_path / "share.png")]) == 0
    table = capsys.readouterr().out
    assert f"| {learned} | topk | " in table and f"| {oracle} | random (oracle) | " in table
    assert "| 0.000 (0.50) | – | 2 |" in table  # the oracle reads 2 branches of module 1, no noise
    with pytest.raises(SystemExit, match="give the same --uninformative"):
        main(["--uninformative", "4", "--", *train(tmp_path / "again", "--connectivity", str(learned / "last.pt"))])
    with pytest.raises(SystemExit, match="does not take --connectivity"):
        main(["--uninformative", "3", "4", "--oracle", "--",
              *train(tmp_path / "again", "--connectivity", str(learned / "last.pt"))])
    with pytest.raises(SystemExit, match="module 1 has 2 branches"):  # the oracle's pruned.pt lost 3 and 4
        main(["--uninformative", "3", "4", "--",
              *train(tmp_path / "again", "--connectivity", str(oracle / "pruned.pt"))])
    pruned, _ = prune_dead_blocks(rewire_oracle(connlearn.build(**tiny(C=4, K=2, gate="random")), [1]))
    assert pruned.graph().branches(1) == ["m1.b2", "m1.b3", "m1.b4"]
    (tmp_path / "pruned.json").write_text(pruned.graph().to_json())
    with pytest.raises(SystemExit, match="a pruned network"):  # its branches 3 and 4 are not the built ones
        main(["--uninformative", "3", "4", "--",
              *train(tmp_path / "again", "--connectivity", str(tmp_path / "pruned.json"))])
    with pytest.raises(SystemExit, match=r"no planted\.json"):
        main(["--report", str(tmp_path / "again")])
    assert (tmp_path / "share.png").stat().st_size > 0
    with pytest.raises(SystemExit, match="same setting"):
        main(["--uninformative", "4", "--", *train(learned)])


def test_a_folder_of_a_run_that_was_not_planted_is_refused(tmp_path, restore):
    data = tmp_path / "data.npz"
    pack(data, *synthetic(num_classes=10, n_train=50, n_test=20))
    args = ["--dataset", "cifar10", "--data", str(data), "--epochs", "1", "--M", "3", "--C", "2", "--K", "1",
            "--width", "1", "--base-channels", "4", "--stem-channels", "4", "--batch-size", "25", "--no-progress",
            "--out", str(tmp_path / "run")]
    assert connlearn_main(["train", *args]) == 0
    with pytest.raises(SystemExit, match="not planted"):
        main(["--uninformative", "2", "--", *args])


def _module_two_gates_after_phase_one(rule, tmp_path):
    """Module 2's gates after 24 steps of phase 1 under ``rule``, with branches 3 and 4 of module 1 made noise."""
    train, _ = synthetic(num_classes=4, n_train=400, n_test=4, seed=0)
    plant_noise([3, 4], 4)
    torch.manual_seed(0)  # the planted noise comes from torch's global RNG
    net = connlearn.build(**tiny(C=4, K=2, num_classes=4))
    recipe = Recipe("phase 1", [Phase(3, 0.1, gate_lr=0.2)], batch_size=50)
    loader = make_loaders(train, train, 50, device=torch.device("cpu"), seed=0)[0]
    trainer = Trainer(net, loader, None, recipe, out_dir=tmp_path, device="cpu", gate_grad=rule, snapshot_every=0,
                      progress=False, verbose=False)
    trainer.fit()
    return dict(trainer.net.gates())[2].values().detach()


@pytest.mark.slow
@pytest.mark.parametrize("rule", ["plain", "centered", "normalized", "renormalized"])
def test_the_gates_learn_to_avoid_inputs_that_carry_nothing(rule, restore, tmp_path):
    """The positive control of the gate gradient: with half of module 1 made noise, 24 steps of phase 1
    leave module 2's top-K without any of it (chance: half)."""
    gates = _module_two_gates_after_phase_one(rule, tmp_path)
    assert top_k_share(gates.tolist(), 2, [3, 4]) == 0.0


@pytest.mark.slow
def test_double_centring_cannot_learn_that_an_input_is_useless_to_every_block(restore, tmp_path):
    """Double-centring keeps every column's mean gate, so an input that no block should read keeps the same
    mean gate as the others: much of the top-K stays noise (by design; see connlearn.updater), where the
    other rules leave none (over seeds of the noise: 3/8 to 1/2 of it, chance being 1/2)."""
    gates = _module_two_gates_after_phase_one("double-centered", tmp_path)
    assert torch.allclose(gates.mean(dim=0), torch.full((4,), 0.5), atol=1e-5)
    assert top_k_share(gates.tolist(), 2, [3, 4]) >= 0.25
