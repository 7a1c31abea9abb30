"""What the trainer measures: evaluation, the gates' statistics, the draws' statistics, the connectivity's
numbers per epoch and the lines of ``gates.jsonl``; sums and decisions over the ranks under
``torch.distributed``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Sequence
from typing import Any, Protocol, cast

import torch
import torch.distributed as dist
import torch.nn.functional as F

from connlearn.errors import ConfigError
from connlearn.gates import Gate, LearnedGate, sampling_distribution, topk_mask
from connlearn.graph import active_branches, input_overlap
from connlearn.net import ConnectivityNet

DRAWS_KEPT = 2000  # the steps of an epoch whose draws make its draw statistics (the last ones)


class Loader(Protocol):
    def __len__(self) -> int: ...

    def epoch(self, epoch: int) -> Iterable[tuple[torch.Tensor, torch.Tensor]]: ...


def distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def over_ranks(value: float, op: str, device: torch.device) -> float:
    """The ``"min"`` or ``"max"`` of ``value`` over the ranks (``value`` itself outside torch.distributed): a
    decision each rank takes by its own clock, signal or files is taken by all, or the ranks that go on wait
    forever for those that stopped."""
    if not distributed():
        return value
    t = torch.tensor([value], device=device if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MIN if op == "min" else dist.ReduceOp.MAX)
    return t.item()


def on_every_rank(flag: bool, device: torch.device) -> bool:
    """Whether ``flag`` holds on every rank."""
    return bool(over_ranks(float(flag), "min", device))


def sum_over_ranks(t: torch.Tensor) -> torch.Tensor:
    """``t`` summed in place over the ranks."""
    if distributed():
        dist.all_reduce(t)
    return t


def autocast(device: torch.device, dtype: torch.dtype | None) -> Any:
    return contextlib.nullcontext() if dtype is None else torch.autocast(device.type, dtype=dtype)


@torch.no_grad()
def evaluate(model: torch.nn.Module, loader: Loader, *, amp: torch.dtype | None = None,
             channels_last: bool = False) -> dict[str, float]:
    """Loss, top-1 and top-5 (in %) of ``model`` in eval mode over ``loader.epoch(0)``, summed over ranks."""
    was_training = model.training
    model.eval()
    totals = torch.zeros(4)
    try:
        for x, y in loader.epoch(0):
            with autocast(x.device, amp):
                out = model(x.contiguous(memory_format=torch.channels_last) if channels_last else x)
            top = out.topk(min(5, out.shape[1]), dim=1).indices
            totals = totals.to(out.device) + torch.stack([F.cross_entropy(out.float(), y, reduction="sum"),
                                                          (top[:, 0] == y).sum().float(),
                                                          (top == y[:, None]).any(1).sum().float(),
                                                          torch.tensor(float(len(y)), device=out.device)])
    finally:
        model.train(was_training)
    loss, top1, top5, n = sum_over_ranks(totals).tolist()
    if not n:
        raise ConfigError("the evaluation loader yielded no batch")
    return {"test_loss": loss / n, "test_top1": 100 * top1 / n, "test_top5": 100 * top5 / n}


@torch.no_grad()
def recalibrate_batch_norm(net: torch.nn.Module, batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
                           count: int, amp: torch.dtype | None = None) -> None:
    """Recompute every batch norm's running statistics as the plain average over ``count`` training batches
    (the network as it evaluates: its evaluation connectivity, no draw), the ranks' averages averaged under DDP."""
    norms = [m for m in net.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    momenta = [m.momentum for m in norms]
    was_training = net.training
    net.eval()
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # a cumulative average
        m.train()
    try:
        for i, (x, _) in enumerate(batches):
            if i == count:
                break
            with autocast(x.device, amp):
                net(x)
    finally:
        net.train(was_training)
        for m, momentum in zip(norms, momenta, strict=True):
            m.momentum = momentum
    if distributed():
        for m in norms:
            for buffer in (m.running_mean, m.running_var):
                if buffer is not None:
                    sum_over_ranks(buffer).div_(dist.get_world_size())


def gate_numbers(net: ConnectivityNet) -> dict[str, float | None]:
    """The mean real gate, the mean std within a row, the shares at 0 and at 1, and the mean entropy (nats)
    of the rows' sampling distributions; None for a network without learned gates."""
    gates = [p.detach().float() for p in net.gate_parameters()]
    if not gates:
        return dict.fromkeys(("gate_mean", "gate_row_std", "gate_at_0", "gate_at_1", "gate_entropy"))
    flat = torch.cat([g.flatten() for g in gates])
    rows = torch.cat([g.reshape(-1, g.shape[-1]).std(dim=-1) if g.shape[-1] > 1 else g.new_zeros(g.numel())
                      for g in gates])
    p = [sampling_distribution(g) for g in gates]
    entropy = torch.cat([-(q * q.clamp(min=1e-12).log()).sum(-1).reshape(-1) for q in p])
    return {"gate_mean": flat.mean().item(), "gate_row_std": rows.mean().item(), "gate_at_0": (flat <= 0).float().mean()
            .item(), "gate_at_1": (flat >= 1).float().mean().item(), "gate_entropy": entropy.mean().item()}


def draw_statistics(draws: list[list[tuple[torch.Tensor, torch.Tensor]]]) -> dict[str, float | None]:
    """From the draws of an epoch (per step, ``(mask, agrees with the top-K)`` per stochastic gate): the number of
    distinct input sets a block drew and the share of its draws that were its top-K, averaged over blocks."""
    if not draws:
        return {"drawn_distinct": None, "drawn_topk_share": None}
    distinct, agreement, rows = 0, 0.0, 0
    for gate in range(len(draws[0])):
        masks = torch.stack([step[gate][0] for step in draws]).cpu()
        distinct += sum(torch.unique(masks[:, r], dim=0).shape[0] for r in range(masks.shape[1]))
        agreement += torch.stack([step[gate][1] for step in draws]).float().mean(dim=0).sum().item()
        rows += masks.shape[1]
    return {"drawn_distinct": distinct / rows, "drawn_topk_share": agreement / rows}


def _active_masks(gates: Sequence[Gate]) -> list[torch.Tensor]:
    """Every gate's ``active()``; learned gates alike in shape in one batched top-K."""
    if len(gates) > 1 and len({g.shape for g in gates}) == 1 and all(type(g).active is LearnedGate.active
                                                                      for g in gates):
        learned = cast(Sequence[LearnedGate], gates)
        real, order = torch.stack([g.real for g in learned]), torch.stack([g.tie_order for g in learned])
        return list(topk_mask(real, gates[0].K, order).unbind(0))
    return [g.active() for g in gates]


def record_draw(net: ConnectivityNet, draws: list[Any]) -> None:
    """Append this step's draw to ``draws`` (before the step moves the gates): per stochastic gate, its mask and
    whether each block drew its top-K; a connectivity per example is represented by the first example's."""
    gates = [s.gate for s in net.stages if s.gate is not None and s.gate.stochastic]
    masks = [(d[0] if d.dim() == 3 else d).detach().bool() for _, d in sorted(net.last_draw.items())]
    draws.append([(m, (m == a).all(dim=-1)) for m, a in zip(masks, _active_masks(gates), strict=True)])
    del draws[:-DRAWS_KEPT]


def connectivity_numbers(net: ConnectivityNet, before: dict[int, torch.Tensor]) -> dict[str, Any]:
    """The epoch log's numbers of the connectivity: active branches and input overlap per module, parameters, the
    gates' statistics and the share of blocks whose inputs changed since ``before`` (a ``net.connectivity()``)."""
    graph, now = net.graph(), net.connectivity()
    rows = sum(c.shape[0] for c in now.values())
    changed = sum(int((before[m] != now[m]).any(dim=1).sum()) for m in now) / rows if rows else None
    return {"active_branches": {str(m): n for m, n in active_branches(graph).items()},
            "input_overlap": {str(m): v for m, v in input_overlap(graph).items()},
            "params": net.num_parameters(), **gate_numbers(net), "connectivity_changed": changed}


def gate_snapshot(net: ConnectivityNet, step: int, epoch: float, tie_order: bool) -> dict[str, Any] | None:
    """A line of ``gates.jsonl``: the learned gates now (with the ranks of equal gates, at the start and at the
    freeze); None for a network without learned gates."""
    learned = [(m, g) for m, g in net.gates() if g.learnable]
    if not learned:
        return None
    record: dict[str, Any] = {"step": step, "epoch": epoch, "temperature": net.sample_temperature,
                              "gates": {str(m): g.values().float().cpu().tolist() for m, g in learned}}
    if tie_order:
        record["tie_order"] = {str(m): ties.cpu().tolist() for m, g in learned if (ties := g.ties()) is not None}
    return record
