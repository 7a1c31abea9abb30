"""DistributedDataParallel: two CPU processes (gloo) train one net and stay identical, gates included."""

import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import connlearn
from connlearn.data import BatchLoader, synthetic
from connlearn.recipe import get_recipe
from connlearn.train import Trainer


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world, port, out):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    try:
        train, test = synthetic(num_classes=10, n_train=160, n_test=40, seed=0)
        loaders = [BatchLoader(d, 20, train=t, seed=0, rank=rank, world_size=world) for d, t in ((train, True),
                                                                                                 (test, False))]
        net = connlearn.build(M=3, C=4, K=2, width=1, num_classes=10, stem_channels=4, base_channels=4, seed=0)
        trainer = Trainer(net, *loaders, get_recipe("cifar").scaled(2), out_dir=out, progress=False,
                          verbose=False, snapshot_every=2)
        trainer.fit()
        torch.save({"state": trainer.net.state_dict(), "history": trainer.history}, f"{out}/rank{rank}.state")
    finally:
        dist.destroy_process_group()


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
