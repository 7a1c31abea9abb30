"""Decisions the ranks of a ``torch.distributed`` run take together: a decision each rank takes by its own
clock, signal or files is taken by all, or the ranks that go on wait forever for those that stopped."""

from __future__ import annotations

import torch
import torch.distributed as dist

from connlearn.train.metrics import distributed


def over_ranks(value: float, op: str, device: torch.device) -> float:
    """The ``"min"`` or ``"max"`` of ``value`` over the ranks (``value`` itself outside torch.distributed)."""
    if not distributed():
        return value
    t = torch.tensor([value], device=device if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MIN if op == "min" else dist.ReduceOp.MAX)
    return t.item()


def on_every_rank(flag: bool, device: torch.device) -> bool:
    """Whether ``flag`` holds on every rank."""
    return bool(over_ranks(float(flag), "min", device))
