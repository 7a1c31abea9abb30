"""DistributedDataParallel: two CPU processes (gloo) train one net and stay identical, gates included."""

import json
import os
import signal
import socket
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import connlearn
from connlearn.data import BatchLoader, synthetic
from connlearn.recipe import get_recipe
from connlearn.signals import TrainingStopped
from connlearn.train import Trainer


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Stopping(BatchLoader):
    """Stops the run (as a kill of the job would) when asked for its ``stop_at``-th batch of the run. Its
    training batches take noise from torch's global random state, which differs between the ranks (as a
    user's augmentation may): a resume gives each rank its own back."""

    stop_at = None
    signal_at = None  # or: this rank sends itself SIGTERM when asked for this batch of the run

    def epoch(self, epoch, start=0):
        for batch in super().epoch(epoch, start):
            if self.stop_at is not None:
                self.stop_at -= 1
                if self.stop_at < 0:
                    raise KeyboardInterrupt
            if self.signal_at is not None:
                self.signal_at -= 1
                if self.signal_at == 0:
                    os.kill(os.getpid(), signal.SIGTERM)
            x, y = batch
            yield (x + 0.1 * torch.randn_like(x), y) if self.train else batch


def _worker(rank, world, port, out, stop_at=None, signal_at=None):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    torch.manual_seed(rank)
    try:
        train, test = synthetic(num_classes=10, n_train=160, n_test=40, seed=0)
        loaders = [_Stopping(d, 20, train=t, seed=0, rank=rank, world_size=world) for d, t in ((train, True),
                                                                                               (test, False))]
        loaders[0].stop_at = stop_at
        loaders[0].signal_at = (signal_at or {}).get(rank)
        connlearn.train.STOP_CHECK_EVERY = 3  # the ranks compare their signals at steps 3, 6, ...
        net = connlearn.build(M=3, C=4, K=2, width=1, num_classes=10, stem_channels=4, base_channels=4, seed=0)
        net.activation_checkpointing = True  # DDP's gradient hooks fire in the recomputed modules too
        trainer = Trainer(net, *loaders, get_recipe("cifar").scaled(2), out_dir=out, progress=False,
                          verbose=False, snapshot_every=2, checkpoint_every=3)  # 4 steps an epoch
        try:
            trainer.fit(stop_signals=[signal.SIGTERM])
        except KeyboardInterrupt:
            return
        except TrainingStopped as stopped:
            with open(f"{out}/stopped{rank}.json", "w") as f:
                json.dump([stopped.signal.name, stopped.epoch, stopped.batch, stopped.code], f)
            return
        torch.save({"state": trainer.net.state_dict(), "history": trainer.history}, f"{out}/rank{rank}.state")
    finally:
        dist.destroy_process_group()


def _let_go_worker(rank, world, port, out):
    from connlearn.train import _all_reduce, _spread

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    counts = []
    for step in range(200):
        t = _all_reduce(torch.tensor([1.0, float(step)]))
        counts.append(t._use_count())
        _spread(step, torch.device("cpu"))
    dist.destroy_process_group()
    torch.save(counts, f"{out}/rank{rank}.counts")


def test_a_reduction_returns_only_once_the_backend_has_let_go_of_its_tensor(tmp_path):
    # else a process that ends just after its last reduction can abort in gloo's worker thread
    mp.spawn(_let_go_worker, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True)
    for rank in (0, 1):
        assert set(torch.load(tmp_path / f"rank{rank}.counts")) == {1}


@pytest.mark.slow
def test_ddp_ranks_stay_identical_and_only_rank_zero_writes(tmp_path):
    mp.spawn(_worker, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True)
    a, b = (torch.load(tmp_path / f"rank{r}.state", weights_only=False) for r in (0, 1))
    assert a["state"].keys() == b["state"].keys()
    for key, value in a["state"].items():
        if torch.is_tensor(value):
            assert torch.equal(value, b["state"][key]), key
    assert a["history"][-1]["test_top1"] == b["history"][-1]["test_top1"]  # metrics reduced over ranks
    assert a["state"]["stages.1.gate.mask"].sum() == 4 * 2  # frozen after phase 1: K inputs per block
    assert (tmp_path / "last.pt").exists() and (tmp_path / "log.jsonl").exists()


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    """The run of :func:`_worker` that was not stopped."""
    out = tmp_path_factory.mktemp("whole")
    mp.spawn(_worker, args=(2, _free_port(), str(out)), nprocs=2, join=True)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("how", ["killed", "signalled"])
def test_ddp_ranks_stopped_within_an_epoch_resume_to_the_run_that_was_not_stopped(whole, tmp_path, how):
    parts = tmp_path
    if how == "killed":  # stopped in epoch 2, step 7: the last checkpoint is of step 6
        mp.spawn(_worker, args=(2, _free_port(), str(parts), 7), nprocs=2, join=True)
    else:  # a SIGTERM to rank 1 only, at its step 5: every rank stops at the next check, step 6, and saves there
        mp.spawn(_worker, args=(2, _free_port(), str(parts), None, {1: 5}), nprocs=2, join=True)
        for rank in (0, 1):
            assert json.loads((parts / f"stopped{rank}.json").read_text()) == ["SIGTERM", 1, 2, 128 + signal.SIGTERM]
    assert torch.load(parts / "last.pt", weights_only=False)["within_epoch"]["batch"] == 2
    mp.spawn(_worker, args=(2, _free_port(), str(parts)), nprocs=2, join=True)
    for rank in (0, 1):
        a, b = (torch.load(d / f"rank{rank}.state", weights_only=False) for d in (whole, parts))
        for key, value in a["state"].items():
            if torch.is_tensor(value):
                assert torch.equal(value, b["state"][key]), key
        for x, y in zip(a["history"], b["history"], strict=True):  # sums over the ranks, added in another order
            assert x["train_top1"] == y["train_top1"] and x["train_loss"] == pytest.approx(y["train_loss"], rel=1e-6)
            assert x["test_top1"] == y["test_top1"] and x["drawn_distinct"] == y["drawn_distinct"]


def _protocol_worker(rank, world, port, out, limits, outs=None, torchrun=True):
    import os

    from connlearn import experiment
    from connlearn.experiment import CifarRun, run_cifar

    experiment.load_dataset = lambda *a, **k: synthetic(num_classes=10, n_train=400, n_test=200, seed=0)  # offline
    os.environ.pop("CONNLEARN_DATA", None)
    if torchrun:  # what torchrun sets; else the group is made here, as a user's own launcher would
        os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(port))
    else:
        for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
            os.environ.pop(key, None)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    run = CifarRun(dataset="cifar10", epochs=2, M=3, C=2, K=1, width=1, base_channels=4, stem_channels=4,
                   train_subset=400, test_subset=200, batch_size=32, device="cpu", progress=False,
                   snapshot_every=0, out=outs[rank] if outs else out)
    try:
        result = {"summary": run_cifar(run, time_limit=limits[rank])}
    except Exception as exc:  # the test reads what each rank raised
        result = {"error": f"{type(exc).__name__}: {exc}"}
    result["initialized"] = dist.is_initialized()
    if not torchrun:
        dist.destroy_process_group()
    torch.save(result, f"{out}/rank{rank}.result")


def _two_ranks(worker, *args, limit=600):
    """Run ``worker(rank, 2, port, *args)`` on two ranks; a test failure if they have not ended after ``limit``
    seconds (a rank left waiting for the other would hang here)."""
    context = mp.spawn(worker, args=(2, _free_port(), *args), nprocs=2, join=False)
    deadline = time.monotonic() + limit
    while not context.join(timeout=5):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail(f"the ranks did not finish within {limit} s")


def _spawn(limits, out, **options):
    _two_ranks(_protocol_worker, out, limits, options.get("outs"), options.get("torchrun", True))
    return [torch.load(f"{out}/rank{r}.result", weights_only=False) for r in (0, 1)]


@pytest.mark.slow
def test_the_protocol_under_torchrun_trains_on_both_ranks_and_rank_zero_writes_the_results(tmp_path):
    first, second = _spawn([None, None], str(tmp_path))
    assert first["summary"]["epochs"] == 2 and second["summary"] is None
    assert not first["initialized"] and not second["initialized"]  # the group it joined is left again
    assert (tmp_path / "summary.json").exists() and (tmp_path / "pruned.pt").exists()
    log = (tmp_path / "log.jsonl").read_text()
    assert len(log.splitlines()) == 2
    first, _ = _spawn([None, None], str(tmp_path))  # resumes: finished, nothing trained again
    assert first["summary"]["epochs"] == 2 and (tmp_path / "log.jsonl").read_text() == log


@pytest.mark.slow
def test_in_a_group_made_by_the_caller_the_protocol_takes_its_ranks_and_leaves_it_open(tmp_path):
    first, second = _spawn([None, None], str(tmp_path), torchrun=False)
    assert first["summary"]["epochs"] == 2 and second["summary"] is None  # rank 1 knew it was not rank 0
    assert first["initialized"] and second["initialized"]


@pytest.mark.slow
def test_a_time_limit_that_passes_on_one_rank_stops_every_rank(tmp_path):
    results = _spawn([None, 0.0], str(tmp_path))  # rank 1 is out of time before the first epoch
    assert [r["summary"] for r in results] == [None, None]
    assert not (tmp_path / "log.jsonl").exists() or not (tmp_path / "log.jsonl").read_text().strip()


@pytest.mark.slow
def test_ranks_that_would_resume_differently_all_refuse(tmp_path):
    (tmp_path / "a").mkdir()
    _spawn([None, None], str(tmp_path / "a"))  # a finished run in a/, nothing in b/
    results = _spawn([None, None], str(tmp_path), outs=[str(tmp_path / "a"), str(tmp_path / "b")])
    for result in results:
        assert "CheckpointError: the ranks disagree on whether there is a checkpoint" in result["error"]


def _seed_worker(rank, world, port, out, seeds):
    """One epoch on loaders of ``seeds[rank]``, resuming ``out`` where it holds a run; what it raised, if any."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    train, _ = synthetic(num_classes=10, n_train=64, n_test=8, seed=0)
    loader = BatchLoader(train, 16, train=True, seed=seeds[rank], rank=rank, world_size=world)
    net = connlearn.build(M=3, C=4, K=2, width=1, num_classes=10, stem_channels=4, base_channels=4, seed=0)
    trainer = Trainer(net, loader, None, get_recipe("cifar").scaled(2), out_dir=out, progress=False, verbose=False)
    try:
        trainer.fit(max_epochs=1)
        error = None
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    finally:
        dist.destroy_process_group()
    torch.save(error, f"{out}/rank{rank}.error")


@pytest.mark.slow
def test_a_resume_with_a_loader_of_another_seed_on_one_rank_is_refused_by_every_rank(tmp_path):
    # one rank refusing alone would leave the others waiting in the next collective
    for seeds in ([0, 0], [0, 1]):
        _two_ranks(_seed_worker, str(tmp_path), seeds, limit=300)
    for rank in (0, 1):
        assert "CheckpointError" in torch.load(tmp_path / f"rank{rank}.error") and "seed 0" in torch.load(
            tmp_path / f"rank{rank}.error")


@pytest.mark.slow
def test_a_folder_held_by_another_process_is_refused_by_every_rank(tmp_path):
    # rank 0 takes the lock; the others would wait for it in their next collective if it refused alone
    import subprocess
    import sys

    holder = subprocess.Popen(
        [sys.executable, "-c", "import time; from connlearn.checkpoint import folder_lock\n"
         f"with folder_lock({str(tmp_path)!r}, 'a sweep'):\n    time.sleep(600)"],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / ".lock").exists() or b"sweep" not in (tmp_path / ".lock").read_bytes():
            assert holder.poll() is None and time.monotonic() < deadline, "the holder did not take the folder"
            time.sleep(0.05)
        _two_ranks(_seed_worker, str(tmp_path), [0, 0], limit=300)
    finally:
        holder.kill()
        holder.wait()
    for rank in (0, 1):
        assert "ConfigError" in torch.load(tmp_path / f"rank{rank}.error") and "in use by" in torch.load(
            tmp_path / f"rank{rank}.error")
    assert not (tmp_path / "last.pt").exists()


def test_random_states_of_a_run_on_other_ranks_are_not_passed_on_by_a_run_on_fewer():
    # a resume on another number of ranks takes the top (rank 0's) states, and its own checkpoints hold its own
    from connlearn.train import _every_rank, _own

    def state(seed):
        return torch.Generator().manual_seed(seed).get_state()

    two = {"torch": state(0), "cuda": None, "ranks": [{"torch": state(0), "cuda": None},
                                                      {"torch": state(1), "cuda": None}]}
    mine = _own(two)
    assert torch.equal(mine["torch"], state(0)) and "ranks" not in _every_rank(mine, torch.device("cpu"))


def test_the_ranks_shares_of_a_batch_make_up_the_batch_of_one_process():
    train, _ = synthetic(num_classes=10, n_train=200, n_test=10, seed=0)
    one = BatchLoader(train, 32, train=True, seed=4).plan(3)
    shares = [BatchLoader(train, 8, train=True, seed=4, rank=r, world_size=4).plan(3) for r in range(4)]
    for batch in range(len(BatchLoader(train, 32, train=True, seed=4))):
        rows = slice(batch * 32, (batch + 1) * 32)
        together = {(int(i), tuple(o.tolist()), bool(f)) for s in shares
                    for i, o, f in zip(s.indices[batch * 8:(batch + 1) * 8], s.offsets[batch * 8:(batch + 1) * 8],
                                       s.flips[batch * 8:(batch + 1) * 8], strict=True)}
        alone = {(int(i), tuple(o.tolist()), bool(f))
                 for i, o, f in zip(one.indices[rows], one.offsets[rows], one.flips[rows], strict=True)}
        assert together == alone and len(alone) == 32  # the same images with the same crops and flips


@pytest.mark.parametrize("count", [203, 8, 5])
def test_evaluation_shards_read_every_test_image_once_between_the_ranks(count):
    from connlearn.data import DataLoaderPath
    from connlearn.folders import FolderLoader, ImageFiles

    _, test = synthetic(num_classes=1, n_train=2, n_test=count, seed=0)
    files = ImageFiles([f"{i}.png" for i in range(count)], [0] * count, ["c"])
    for make in (lambda r: BatchLoader(test, 16, train=False, rank=r, world_size=4).plan(0).indices,
                 lambda r: DataLoaderPath(test, 16, train=False, rank=r, world_size=4).plan(0).indices,
                 lambda r: FolderLoader(files, 16, train=False, rank=r, world_size=4).order(0)):
        shares = [make(r).tolist() for r in range(4)]
        assert sorted(i for share in shares for i in share) == list(range(count))
        assert max(map(len, shares)) - min(map(len, shares)) <= 1


def test_bad_torchrun_variables_and_a_batch_that_does_not_split_are_named_before_any_data_is_read(tmp_path,
                                                                                                   monkeypatch):
    from connlearn import experiment
    from connlearn.errors import ConfigError
    from connlearn.experiment import CifarRun, run_cifar

    def no_data(run):
        raise AssertionError("the data was read")

    monkeypatch.setattr(experiment, "load_data", no_data)
    run = CifarRun(dataset="cifar10", batch_size=30, device="cpu", out=str(tmp_path / "run"))
    monkeypatch.setenv("WORLD_SIZE", "two")
    with pytest.raises(ConfigError, match=r"WORLD_SIZE='two' and LOCAL_RANK=None must be integers"):
        run_cifar(run)
    monkeypatch.delenv("WORLD_SIZE")
    monkeypatch.setattr(experiment, "_join_torchrun", lambda device: (0, 4, device, False))
    with pytest.raises(ConfigError, match=r"batch size 30 does not split over 4 processes; give a multiple of 4"):
        run_cifar(run)
