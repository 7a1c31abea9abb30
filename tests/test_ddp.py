"""DistributedDataParallel on two CPU processes (gloo): the ranks agree on every weight, gate and draw, a resume
ends as an uninterrupted run, and the protocol runs under torchrun."""

import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from conftest import SHAPES, shaped, tiny

import connlearn
from connlearn.train import RunConfig, Trainer, get_recipe
from connlearn.train.data import ArrayDataset, synthetic
from connlearn.train.loaders import make_loaders


def _digest(net):
    return [float(p.double().sum()) for p in net.state_dict().values() if torch.is_tensor(p)]


def _worker(rank, world, init, out, results):
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    torch.set_num_threads(1)
    train, test = synthetic(n_train=128, n_test=32)

    def trainer(folder, gate="topk"):
        loaders = make_loaders(train, test, 16 // world, device="cpu", seed=0, rank=rank, world_size=world)
        return Trainer(connlearn.build(**tiny(gate=gate)), *loaders, get_recipe("cifar").scaled(2),
                       RunConfig(out=os.path.join(out, folder), progress=False, snapshot_every=0))

    straight = trainer("straight")
    straight.fit()
    trainer("resumed").fit(max_epochs=1)
    resumed = trainer("resumed")
    resumed.fit()
    kinds = {gate: _digest(_fit(trainer(gate, gate))) for gate in ("imle", "score")}
    shapes = {}
    for dims in (1, 0):  # signals and vectors: every rank the same network, a resume as if uninterrupted
        rng = np.random.default_rng(dims)
        x = rng.normal(size=(96, *SHAPES[dims][1])).astype("float32")
        arrays = ArrayDataset(x, rng.integers(0, 10, 96), [str(c) for c in range(10)])

        def of_shape(folder, dims=dims, arrays=arrays):
            loaders = make_loaders(arrays, arrays, 16 // world, device="cpu", seed=0, rank=rank, world_size=world)
            return Trainer(connlearn.build(**shaped(dims)), *loaders, get_recipe("cifar").scaled(2),
                           RunConfig(out=os.path.join(out, folder), progress=False, snapshot_every=0))

        whole = _fit(of_shape(f"d{dims}"))
        of_shape(f"d{dims}-resumed").fit(max_epochs=1)
        shapes[dims] = (_digest(whole), _digest(_fit(of_shape(f"d{dims}-resumed"))))
    results[rank] = (_digest(straight.net), _digest(resumed.net), straight.history[-1]["test_top1"],
                     straight.history[-1]["drawn_distinct"], kinds, _global_draws(rank, world), shapes)
    dist.destroy_process_group()


def _global_draws(rank, world):
    """Whether the ranks' per-example draws of the score kind are the global batch's, each rank its slice."""
    net = connlearn.build(**tiny(gate="score"))
    state = net.generator.get_state()
    net(torch.randn(2, 3, 32, 32))
    gathered = [torch.empty_like(net.last_draw[1]) for _ in range(world)]
    dist.all_gather(gathered, net.last_draw[1])
    generator = torch.Generator()
    generator.set_state(state)
    gates = [s.gate for s in net.stages if s.gate is not None]
    return torch.equal(torch.cat(gathered), type(gates[0]).draw(gates, generator, batch=2 * world)[0])


def _fit(trainer):
    trainer.fit()
    return trainer.net


def test_ranks_agree_and_a_resume_ends_as_an_uninterrupted_run(tmp_path):
    manager = mp.Manager()
    results = manager.dict()
    mp.spawn(_worker, args=(2, f"file://{tmp_path}/rendezvous", str(tmp_path), results), nprocs=2, join=True)
    (digest0, again0, top1_0, draws0, kinds0, global0, shapes0), (digest1, again1, top1_1, draws1, kinds1, global1,
                                                                   shapes1) = results[0], results[1]
    assert shapes0 == shapes1 and all(whole == again for whole, again in shapes0.values())  # signals, vectors
    assert digest0 == digest1 and again0 == again1  # every rank holds the same network
    assert digest0 == again0  # resumed as if uninterrupted
    assert top1_0 == top1_1 and draws0 == draws1  # metrics summed over both ranks' shards
    assert kinds0 == kinds1  # the estimators draw alike on every rank (imle's noise, score's per-example draws)
    assert global0 and global1  # score's per-example draws: each rank its share of the global batch's


def test_the_protocol_trains_under_torchrun(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               "-m", "connlearn.cli", "train", "--dataset", "cifar10", "--synthetic", "--epochs", "2", "--M", "3",
               "--C", "4", "--K", "2", "--width", "2", "--base-channels", "8", "--stem-channels", "4",
               "--train-subset", "200", "--test-subset", "100", "--batch-size", "32", "--out", str(tmp_path),
               "--no-progress", "--device", "cpu"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, cwd=tempfile.gettempdir())
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["epochs"] == 2 and "2 process(es)" in done.stdout
