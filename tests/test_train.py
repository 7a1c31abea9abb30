"""The trainer's guarantees: exact resume (between and within epochs, after a stop signal, a kill between the
renames of a save, a damaged last.pt), whole files under a full disk, the folder lock, divergence, and the
recipes' arithmetic."""

import copy
import errno
import os
import signal
import subprocess
import sys
import threading

import attrs
import numpy as np
import pytest
import torch
from conftest import RandomLoader, shaped, tiny

import connlearn
import connlearn.files
from connlearn.errors import CheckpointError, ConfigError, DivergenceError
from connlearn.files import read_jsonl
from connlearn.train import Phase, Recipe, RunConfig, Trainer, TrainingStopped, get_recipe, load_checkpoint
from connlearn.train.checkpoint import folder_lock
from connlearn.train.data import ArrayDataset, synthetic
from connlearn.train.loaders import BatchLoader, make_loaders
from connlearn.train.metrics import recalibrate_batch_norm

TIMING_KEYS = ("epoch_time", "images_per_s", "eval_time")

RECIPE = get_recipe("cifar").scaled(4)  # one epoch of each phase: learned, frozen at 0.1, 0.01, 0.001
CHECKPOINT_KEYS = {"format", "version", "graph", "dtype", "model", "environment", "optimizer", "scaler",
                   "gate_optimizer", "epoch", "step", "recipe", "history", "best_top1", "meta", "within_epoch", "rng",
                   "frozen_from", "data_seed"}  # what earlier versions' checkpoints hold, less their "engine"
WITHIN_EPOCH_KEYS = {"batch", "sums", "draws", "elapsed", "rng_at_start", "last_connectivity"}


def _trainer(out, loader=None, recipe=RECIPE, gate_loader=None, **options):
    torch.manual_seed(0)  # the loader shuffles from the global RNG: every run starts from one state
    loader = loader or RandomLoader()
    net = connlearn.build(**tiny(gate_init="uniform"))
    config = RunConfig(out=out, device="cpu", progress=False, snapshot_every=3, **options)
    return Trainer(net, loader, RandomLoader(n=32, seed=9), recipe, config, gate_loader=gate_loader)


def _untimed(history):
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in history]


def _same_run(a, b):
    assert _untimed(a.history) == _untimed(b.history)
    for (name, p), q in zip(a.net.state_dict().items(), b.net.state_dict().values(), strict=True):
        if isinstance(p, dict):  # the extra state: the draws' generator, temperature, K and gate kind
            assert all(torch.equal(v, q[k]) if torch.is_tensor(v) else v == q[k] for k, v in p.items()), name
        else:
            assert torch.equal(p, q), name
    assert read_jsonl(a.out_dir / "gates.jsonl") == read_jsonl(b.out_dir / "gates.jsonl")


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """An uninterrupted run, the oracle of every resume."""
    trainer = _trainer(tmp_path_factory.mktemp("straight"))
    trainer.fit()
    return trainer


def test_a_run_resumed_after_any_epoch_ends_as_an_uninterrupted_one(straight, tmp_path):
    for stop in (1, 2):  # in phase 1 (learned gates) and in phase 2 (frozen)
        out = tmp_path / str(stop)
        _trainer(out).fit(max_epochs=stop)
        resumed = _trainer(out)
        resumed.fit()
        _same_run(straight, resumed)
        assert resumed.net.gate_kind == "frozen" and [r["epoch"] for r in read_jsonl(out / "log.jsonl")] == [1, 2, 3, 4]


class _Interrupted(RandomLoader):
    """Raises KeyboardInterrupt at batch ``at`` of epoch ``epoch``, as a kill would stop the run."""

    def __init__(self, epoch, at):
        super().__init__()
        self.stop = (epoch, at)

    def epoch(self, epoch):
        for i, batch in enumerate(super().epoch(epoch)):
            if (epoch, i) == self.stop:
                raise KeyboardInterrupt
            yield batch


@pytest.mark.parametrize(("epoch", "at"), [(0, 3), (2, 1)])
def test_a_run_resumed_within_an_epoch_ends_as_an_uninterrupted_one(straight, tmp_path, epoch, at):
    """With checkpoint_every=1 a run stopped within an epoch resumes at the step it holds, with a loader that
    takes no ``start`` and shuffles from torch's global RNG: the resume reads the epoch again from its start."""
    with pytest.raises(KeyboardInterrupt):
        _trainer(tmp_path, _Interrupted(epoch, at), checkpoint_every=1).fit()
    ckpt = load_checkpoint(tmp_path / "last.pt")
    assert ckpt["within_epoch"]["batch"] == at
    assert set(ckpt) == CHECKPOINT_KEYS and set(ckpt["within_epoch"]) == WITHIN_EPOCH_KEYS  # older runs resume
    resumed = _trainer(tmp_path, checkpoint_every=1)
    resumed.fit()
    _same_run(straight, resumed)


def test_a_stop_signal_stops_at_the_next_step_with_a_checkpoint_and_the_run_resumes(straight, tmp_path):
    class Signalling(RandomLoader):
        def epoch(self, epoch):
            for i, batch in enumerate(super().epoch(epoch)):
                if (epoch, i) == (1, 2):
                    os.kill(os.getpid(), signal.SIGTERM)
                yield batch

    with pytest.raises(TrainingStopped) as stopped:
        _trainer(tmp_path, Signalling()).fit(stop_signals=[signal.SIGTERM])
    assert stopped.value.code == 128 + signal.SIGTERM and (stopped.value.epoch, stopped.value.batch) == (1, 3)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler is gone with fit
    resumed = _trainer(tmp_path)
    resumed.fit()
    _same_run(straight, resumed)


def test_a_save_cut_between_its_renames_resumes_from_the_newer_file(straight, tmp_path):
    _trainer(tmp_path).fit(max_epochs=2)
    os.replace(tmp_path / "last.pt", tmp_path / ".next.pt")  # last.pt moved to previous.pt, .next.pt not renamed
    resumed = _trainer(tmp_path)
    resumed.fit()
    _same_run(straight, resumed)
    assert not (tmp_path / ".next.pt").exists()


def test_a_damaged_last_checkpoint_falls_back_to_the_previous_one(straight, tmp_path):
    _trainer(tmp_path).fit(max_epochs=2)
    data = (tmp_path / "last.pt").read_bytes()
    (tmp_path / "last.pt").write_bytes(data[: len(data) // 2])
    resumed = _trainer(tmp_path)
    with pytest.warns(UserWarning, match="previous.pt"):
        resumed.fit()
    _same_run(straight, resumed)


def test_a_full_disk_leaves_the_last_checkpoint_whole_and_says_so(tmp_path, monkeypatch):
    trainer = _trainer(tmp_path)
    trainer.fit(max_epochs=1)
    before = (tmp_path / "last.pt").read_bytes()
    real_open = open

    def full(path, mode="r", *args, **kwargs):
        f = real_open(path, mode, *args, **kwargs)
        if ".next.pt" in str(path):
            f.close()
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return f

    monkeypatch.setattr(connlearn.files, "open", full, raising=False)
    with pytest.raises(CheckpointError, match=r"No space left.*last.pt still holds epoch 1"):
        trainer.fit(max_epochs=1)
    assert (tmp_path / "last.pt").read_bytes() == before
    assert not list(tmp_path.glob(".*.tmp"))


def test_another_process_or_thread_is_refused_the_folder(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from connlearn.train.checkpoint import "
                               f"folder_lock\nwith folder_lock({str(tmp_path)!r}, 'a test'):\n print(1, flush=True); "
                               "time.sleep(60)"], stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline().strip() == b"1"
        with pytest.raises(ConfigError, match=f"in use by process {holder.pid}"):
            _trainer(tmp_path).fit()
    finally:
        holder.kill()
        holder.wait()
    refused = []

    def another_thread():
        with pytest.raises(ConfigError, match="another thread"), folder_lock(tmp_path):
            pass
        refused.append(True)

    with folder_lock(tmp_path):
        thread = threading.Thread(target=another_thread)
        thread.start()
        thread.join()
    assert refused
    _trainer(tmp_path).fit(max_epochs=1)  # released by the holder's end, however it ended


def test_divergence_is_named_and_the_last_good_checkpoint_stays(tmp_path):
    recipe = Recipe("hot", [Phase(1, 0.1, gate_lr=0.2), Phase(1, 1e12, frozen=True)], weight_decay=0.0)
    with pytest.raises(DivergenceError, match="epoch 2"):
        _trainer(tmp_path, recipe=recipe).fit()
    assert load_checkpoint(tmp_path / "last.pt")["epoch"] == 1


def test_a_resume_with_another_recipe_or_network_is_refused(tmp_path):
    _trainer(tmp_path).fit(max_epochs=1)
    with pytest.raises(CheckpointError, match="recipe phases"):
        _trainer(tmp_path, recipe=get_recipe("cifar").scaled(5)).fit()
    other = Trainer(connlearn.build(**tiny(K=1)), RandomLoader(), None, RECIPE, RunConfig(out=tmp_path, progress=False))
    with pytest.raises(CheckpointError, match="K: 2 there, 1 here"):
        other.fit()


def test_the_log_has_every_epochs_numbers(straight):
    record = read_jsonl(straight.out_dir / "log.jsonl")[0]
    assert {"train_loss", "test_top1", "test_top5", "active_branches", "input_overlap", "gate_mean", "gate_entropy",
            "drawn_distinct", "drawn_topk_share", "connectivity_changed", "temperature"} <= set(record)
    assert 1 <= record["drawn_distinct"] <= 4 and 0 <= record["drawn_topk_share"] <= 1


def test_tensorboard_gets_the_scalars(tmp_path):
    pytest.importorskip("tensorboard")
    _trainer(tmp_path, tensorboard=True, amp="bf16").fit(max_epochs=1)
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))


def test_eval_every_evaluates_those_epochs_and_the_last(tmp_path):
    history = _trainer(tmp_path, eval_every=3).fit()
    assert [r["epoch"] for r in history if "test_top1" in r] == [3, 4]


def test_the_gates_own_adam_after_a_warmup_resumes_exactly(tmp_path):
    recipe = attrs.evolve(get_recipe("cifar").with_phase_epochs([3, 1, 1, 1]), gate_optimizer="adam", gate_warmup=1)
    warm = _trainer(tmp_path / "warm", recipe=recipe)
    start = [p.clone() for p in warm.net.gate_parameters()]
    warm.fit(max_epochs=1)
    assert all(torch.equal(a, b) for a, b in zip(start, warm.net.gate_parameters(), strict=True))
    assert isinstance(warm.optimizers.gates, torch.optim.Adam) and len(warm.optimizers.weights.param_groups) == 1
    warm.fit(max_epochs=1)
    assert not all(torch.equal(a, b) for a, b in zip(start, warm.net.gate_parameters(), strict=True))
    straight = _trainer(tmp_path / "straight", recipe=recipe)
    straight.fit()
    _trainer(tmp_path / "resumed", recipe=recipe).fit(max_epochs=2)  # stopped in phase 1, Adam's moments saved
    resumed = _trainer(tmp_path / "resumed", recipe=recipe)
    resumed.fit()
    _same_run(straight, resumed)
    assert resumed.optimizers.gates is None  # the freeze took it


def _held_out(seed=7):
    return BatchLoader(synthetic(n_train=48, n_test=10, seed=seed)[0], 16, train=True, seed=seed)


def test_held_out_gate_steps_move_only_the_gates_and_weight_steps_only_the_weights(tmp_path):
    trainer = _trainer(tmp_path, gate_loader=_held_out())
    x, y = next(iter(trainer.train_loader.epoch(0)))
    gates, weights = trainer.net.gate_parameters(), trainer.net.weight_parameters()
    before = [p.clone() for p in gates + weights]
    weights_sgd, gates_own = trainer.optimizers.all  # a training batch steps the first, a held-out one the second
    trainer._pass(x, y, [weights_sgd])
    assert all(torch.equal(a, b) for a, b in zip(before[:len(gates)], gates, strict=True))
    after_weights = [p.clone() for p in weights]
    trainer._pass(*trainer.optimizers.held_out_batch(0), [gates_own])
    assert all(torch.equal(a, b) for a, b in zip(after_weights, weights, strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(before[:len(gates)], gates, strict=True))


def test_a_run_with_held_out_gate_steps_resumes_exactly(tmp_path):
    recipe = get_recipe("cifar").with_phase_epochs([2, 1, 1, 1])
    straight = _trainer(tmp_path / "straight", recipe=recipe, gate_loader=_held_out())
    straight.fit()
    with pytest.raises(KeyboardInterrupt):
        _trainer(tmp_path / "resumed", _Interrupted(1, 2), recipe=recipe, gate_loader=_held_out(),
                 checkpoint_every=1).fit()
    resumed = _trainer(tmp_path / "resumed", recipe=recipe, gate_loader=_held_out(), checkpoint_every=1)
    resumed.fit()
    _same_run(straight, resumed)


def test_the_gates_held_out_images_leave_the_weights_training_images_as_they_were(tmp_path):
    from connlearn.train.protocol import load_data

    options = {"dataset": "cifar10", "synthetic": True, "train_subset": 200}
    plain, *_ = load_data(RunConfig(**options))
    train, _, _, held = load_data(RunConfig(**options, gate_holdout=100))
    assert np.array_equal(plain.images, train.images) and len(held) == 100
    assert not (held.images[:, None] == train.images[None]).all(axis=(2, 3, 4)).any()


def _arrays(dims, n=64, seed=0):
    rng = np.random.default_rng(seed)
    shape = {1: (2, 12), 0: (6,)}[dims]
    return ArrayDataset(rng.normal(size=(n, *shape)), rng.integers(0, 10, n), [str(c) for c in range(10)])


@pytest.mark.parametrize("dims", [1, 0])
def test_a_run_of_signals_or_vectors_resumed_within_an_epoch_ends_as_an_uninterrupted_one(tmp_path, dims):
    train, test = _arrays(dims), _arrays(dims, 20, seed=1)

    def trainer(out, **options):
        return Trainer(connlearn.build(**shaped(dims, gate_init="uniform")), *make_loaders(train, test, 16,
                       device="cpu", seed=3), RECIPE, RunConfig(out=out, device="cpu", progress=False,
                                                                snapshot_every=3, **options))

    straight = trainer(tmp_path / "straight")
    straight.fit()
    interrupted = trainer(tmp_path / "resumed", checkpoint_every=1)
    real_epoch = interrupted.train_loader.epoch

    def stop_at(epoch, start=0):  # a kill at batch 2 of epoch 1 (phase 2)
        for i, batch in enumerate(real_epoch(epoch, start), start):
            if (epoch, i) == (1, 2):
                raise KeyboardInterrupt
            yield batch

    interrupted.train_loader.epoch = stop_at
    with pytest.raises(KeyboardInterrupt):
        interrupted.fit()
    resumed = trainer(tmp_path / "resumed", checkpoint_every=1)
    resumed.fit()
    _same_run(straight, resumed)


def test_recalibrated_batch_norms_are_the_average_over_the_batches_given(tmp_path):
    train, test = synthetic(n_train=64, n_test=16)
    loaders = make_loaders(train, test, 16, device="cpu", seed=1)
    trainer = Trainer(connlearn.build(**tiny()), *loaders, RECIPE, RunConfig(out=tmp_path, progress=False,
                                                                                recalibrate_bn=2))
    last = trainer.fit()[-1]
    assert {"test_top1_before_recalibration", "test_top1"} <= set(last)
    seen = []
    handle = trainer.net.eval().stem.bn.register_forward_hook(lambda m, inputs, out: seen.append(inputs[0]))
    with torch.no_grad():
        for x, _ in list(loaders[0].epoch(RECIPE.total_epochs - 1))[:2]:
            trainer.net(x)
    handle.remove()
    expected = torch.stack([x.mean((0, 2, 3)) for x in seen]).mean(0)
    torch.testing.assert_close(trainer.net.stem.bn.running_mean, expected, rtol=1e-4, atol=1e-6)


def test_recalibration_sees_the_evaluation_connectivity_not_a_draw():
    net = connlearn.build(**tiny(gate_init="uniform"))  # topk, not frozen: training passes draw their inputs
    frozen = copy.deepcopy(net).freeze()
    batches = [(torch.randn(8, 3, 32, 32, generator=torch.Generator().manual_seed(i)), None) for i in range(3)]
    for n in (net, frozen):
        recalibrate_batch_norm(n.train(), batches, 3)
    assert all(m.training for m in net.modules())  # as it found them
    x = torch.randn(4, 3, 32, 32)
    torch.testing.assert_close(net.eval()(x), frozen.eval()(x))


@pytest.mark.slow
def test_the_command_says_its_epochs_and_a_fallback_in_one_line(tmp_path):
    command = [sys.executable, "-m", "connlearn.cli", "train", "--dataset", "cifar10", "--synthetic", "--epochs", "4",
               "--preset", "cifar-20-4-8", "--C", "2", "--width", "2", "--base-channels", "8", "--stem-channels",
               "8", "--train-subset", "40", "--test-subset", "20", "--batch-size", "20", "--no-progress",
               "--out", str(tmp_path)]
    first = subprocess.run(command, check=True, capture_output=True, text=True)
    assert "epoch 4/4 (phase 4" in first.stdout  # --no-progress hides the bars, not the epoch lines
    data = (tmp_path / "last.pt").read_bytes()
    (tmp_path / "last.pt").write_bytes(data[: len(data) // 2])
    again = subprocess.run(command, check=True, capture_output=True, text=True)
    assert again.stderr.startswith("connlearn: warning: ") and "previous.pt" in again.stderr
    assert len(again.stderr.strip().splitlines()) == 1


def test_the_recipes_scale_and_split_as_the_paper_does():
    cifar = get_recipe("cifar")
    assert [p.epochs for p in cifar.phases] == [120, 100, 50, 50] and cifar.total_epochs == 320
    assert [p.epochs for p in cifar.scaled(30).phases] == [11, 9, 5, 5]
    assert [p.epochs for p in cifar.scaled(2).phases] == [1, 1]
    annealed = Phase(10, 0.1, temperature=1.0, temperature_end=0.01)
    assert annealed.temperature_at(0) == 1.0 and annealed.temperature_at(1) == 0.01
    assert annealed.temperature_at(0.5) == pytest.approx(0.1)


def test_a_data_seed_of_another_run_is_refused(tmp_path):
    train, test = synthetic(n_train=64, n_test=16)
    trainer = Trainer(connlearn.build(**tiny()), *make_loaders(train, test, 16, device="cpu", seed=1), RECIPE,
                      RunConfig(out=tmp_path, progress=False))
    trainer.fit(max_epochs=1)
    again = Trainer(connlearn.build(**tiny()), *make_loaders(train, test, 16, device="cpu", seed=2), RECIPE,
                    RunConfig(out=tmp_path, progress=False))
    with pytest.raises(CheckpointError, match="data seed: 1 there, 2 here"):
        again.fit()
