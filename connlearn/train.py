"""The GateConnect trainer: runs a :class:`~connlearn.recipe.Recipe` on a network, in plain PyTorch.

Per epoch it writes one JSON line to ``log.jsonl`` (train/test loss, top-1/top-5, learning rates, epoch time,
images/s, active branches per module, gate statistics, and for sampled gates how many distinct connectivities
each block drew and how often a draw was its top-K) and a checkpoint (``last.pt``, the one before it as
``previous.pt``, and ``best.pt``), written atomically: each file whole to a temporary, renamed into place, and
``last.pt`` by way of ``.next.pt``, which a resume takes where a stop between the renames left no ``last.pt``.
While ``fit`` runs, the folder is held (``.lock``): another process is refused it. Every ``snapshot_every``
steps of a network with learnable gates it appends the real gate values to ``gates.jsonl`` (for the evolution
plots), and once more at the freeze (with the tie order), so that in a run that reached phase 2 the last
snapshot holds the gates whose top-K became the fixed connectivity.

Resuming (``fit(resume=...)``) continues exactly: a run stopped after epoch e and resumed ends with the
same weights, gates and log (timings aside) as an uninterrupted run, on the CPU; on a GPU up to the
non-determinism of its kernels. The checkpoint holds the model (with the gate generator), the IR, the
optimizer, the epoch, every RNG state and the log; the data order comes from (seed, epoch).

With ``checkpoint_every`` it also writes ``last.pt`` within epochs, every that many steps, and a resume
goes on from the step it holds, exactly as from an epoch's end (for long epochs, and jobs that may be
stopped at any time). With ``fit(stop_signals=...)`` a signal (Ctrl-C, a scheduler's ``SIGTERM``) stops
training at the next step with such a checkpoint (:mod:`connlearn.signals`).

Loaders are objects with ``len()`` (batches per epoch) and ``epoch(e)`` yielding ``(images, labels)`` on
the device, such as :class:`connlearn.data.BatchLoader`; a resume within an epoch calls ``epoch(e,
start=b)`` where it takes a ``start`` (as connlearn's loaders do: batches ``b, b+1, ...`` of that epoch),
and otherwise reads and drops the epoch's first ``b`` batches. Under ``torch.distributed`` the trainer wraps the
network in DistributedDataParallel, reduces metrics over ranks and writes files from rank 0 only; give
each rank its shard of the data (``rank``/``world_size`` of the loaders).
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import json
import math
import os
import signal
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm
from tqdm.auto import tqdm

from connlearn.checkpoint import (
    architecture,
    folder_lock,
    load_checkpoint,
    make_checkpoint,
    net_from_checkpoint,
    plain_facts,
    save_atomic,
)
from connlearn.compile import ConnectivityNet, check_net
from connlearn.data import ShardedBatches
from connlearn.errors import (
    CheckpointError,
    CheckpointWriteError,
    ConfigError,
    ConfigTypeError,
    ConnlearnError,
    DataError,
    DivergenceError,
    check_bool,
    check_device,
    check_float,
    check_int,
    check_name,
    check_path,
    closest,
)
from connlearn.files import expand_home, remove_leftovers, write_text_atomic
from connlearn.gates import sampling_distribution
from connlearn.graph import BranchGraph
from connlearn.prune import active_branches, input_overlap
from connlearn.recipe import Phase, Recipe
from connlearn.signals import StopSignals, TrainingStopped, check_signals
from connlearn.updater import GateUpdater, drop_gate_group, param_groups

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter

TIMING_KEYS = ("epoch_time", "images_per_s", "eval_time")
AMP_MODES = ("auto", "bf16", "fp16", "none")
#: ``torch.compile`` modes the Trainer accepts (``compile=True`` is ``"default"``).
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
#: Steps between the ranks' checks for a stop signal under ``torch.distributed`` (one small reduction each).
STOP_CHECK_EVERY = 10
#: The files a trainer writes whole (:func:`~connlearn.files.write_atomic`) in its ``out_dir``.
WRITES = ("last.pt", ".next.pt", "best.pt", "log.jsonl")


class Loader(Protocol):
    def __len__(self) -> int: ...

    def epoch(self, epoch: int) -> Iterable[tuple[torch.Tensor, torch.Tensor]]: ...


def _batches_from(loader: Loader, epoch: int, start: int, rng_at_start: dict[str, Any] | None,
                  device: torch.device) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The batches of ``epoch`` from its batch number ``start`` on. A loader that takes no ``start`` is read
    from the beginning of the epoch and its first ``start`` batches are dropped, with torch's random state
    of the epoch's beginning (``rng_at_start``), as a loader that shuffles or augments from it read them;
    then the state is put back."""
    if not start:
        return iter(loader.epoch(epoch))
    try:
        takes_start = "start" in inspect.signature(loader.epoch).parameters
    except (TypeError, ValueError):  # a callable without a signature Python can read
        takes_start = False
    if takes_start:
        return iter(loader.epoch(epoch, start=start))  # type: ignore[call-arg]
    now = _rng_state(device)
    try:
        if rng_at_start is not None:
            _set_rng_state(rng_at_start, device)
        batches = iter(loader.epoch(epoch))
        for _ in itertools.islice(batches, start):  # the batches already trained on
            pass
    finally:
        _set_rng_state(now, device)
    return batches


def _packed(draws: Iterable[list[tuple[int, torch.Tensor, torch.Tensor]]] | None) -> Any:
    """The draws a network recorded (per step, ``(gate index, mask, agreement)`` of each of its stochastic
    gates, in order), for a checkpoint: stacked over the steps, one pair of tensors per gate, on the CPU;
    not thousands of small tensors."""
    if draws is None:
        return None
    steps = list(draws)
    gates = range(len(steps[0]) if steps else 0)
    return {"masks": [torch.stack([step[j][1] for step in steps]).cpu() for j in gates],
            "agree": [torch.stack([step[j][2] for step in steps]).cpu() for j in gates]}


def _unpacked(draws: Any, device: torch.device) -> list[list[tuple[int, torch.Tensor, torch.Tensor]]]:
    """What :func:`_packed` gave, as the network records it, on ``device``."""
    if draws is None:
        return []
    masks = [m.to(device) for m in draws["masks"]]
    agree = [a.to(device) for a in draws["agree"]]
    return [[(j, masks[j][s], agree[j][s]) for j in range(len(masks))] for s in range(len(masks[0]) if masks else 0)]


def _rng_state(device: torch.device) -> dict[str, Any]:
    """torch's global random states: the CPU's and, training on a GPU, that GPU's (only: reading another
    GPU's would make a CUDA context on it, in every process)."""
    return {"torch": torch.get_rng_state(),
            "cuda": [torch.cuda.get_rng_state(device)] if device.type == "cuda" else None}


def _set_rng_state(rng: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(rng["torch"])
    state = _gpu_state(rng, device)
    if state is not None:
        torch.cuda.set_rng_state(state, device)


def _gpu_state(rng: dict[str, Any], device: torch.device) -> torch.Tensor | None:
    """The state of the training GPU in ``rng`` (``None`` off a GPU or where it has none): its only one;
    checkpoints of older versions hold every GPU's."""
    states = rng.get("cuda")
    if device.type != "cuda" or not states:
        return None
    index = torch.cuda.current_device() if device.index is None else device.index
    return states[0] if len(states) == 1 else states[index] if index < len(states) else None


def _every_rank(rng: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """``rng`` (this process's random states, as :func:`_rng_state` gives them) for a checkpoint: under
    ``torch.distributed``, with every rank's in ``"ranks"`` (gathered: call it on every rank), as each
    rank's augmentation or dropout may draw from its own. Rank 0 writes the checkpoint: its own states
    stay at the top, where a checkpoint of one process has them."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return rng
    gpu = _gpu_state(rng, device)
    rng = {**rng, "cuda": None if gpu is None else [gpu]}  # this GPU's only, also from a checkpoint with every GPU's
    # one uint8 tensor: the CPU's state, then the GPU's; every rank runs the same torch, so the sizes agree
    flat = torch.cat([rng["torch"], *(rng["cuda"] or [])])
    flat = flat.to(device if dist.get_backend() == "nccl" else "cpu")  # as in _spread
    parts = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, flat)
    for t in (flat, *parts):
        _let_go(t)
    n = len(rng["torch"])
    ranks = [{"torch": part[:n].cpu(), "cuda": [part[n:].cpu()] if rng["cuda"] else None} for part in parts]
    return {**rng, "ranks": ranks}


def _own(rng: dict[str, Any]) -> dict[str, Any]:
    """This rank's random states in a checkpoint's ``rng`` (see :func:`_every_rank`): its own where the
    checkpoint was written by as many ranks, else the top ones (rank 0's, as checkpoints of older
    versions had only: a resume on another number of ranks reads other shards anyway)."""
    ranks = rng.get("ranks")
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    if ranks is not None and len(ranks) == world:
        return ranks[_rank()]
    return {k: v for k, v in rng.items() if k != "ranks"}  # nor passed on to this run's checkpoints


def _check_rng(rng: object, what: str) -> None:
    """A ``TypeError`` unless ``rng`` is random states as :func:`_every_rank` gives them."""
    def states(r: object) -> bool:
        cuda = r.get("cuda") if isinstance(r, dict) else None
        return (isinstance(r, dict) and torch.is_tensor(r.get("torch")) and r["torch"].dtype == torch.uint8
                and (cuda is None or (isinstance(cuda, (list, tuple)) and all(torch.is_tensor(c) for c in cuda))))

    ranks = rng.get("ranks") if isinstance(rng, dict) else None
    if not states(rng) or not (ranks is None or (isinstance(ranks, list) and ranks and all(map(states, ranks)))):
        raise TypeError(f"{what} is not torch's random state (of every rank)")


def _checked_within(within: object) -> dict[str, Any] | None:
    """A checkpoint's ``within_epoch`` entry (what :meth:`Trainer._save_within` writes), or a ``TypeError``
    /``ValueError`` naming what is wrong with it."""
    if within is None:
        return None
    if not isinstance(within, dict):
        raise TypeError("within_epoch is not a dict")
    batch = check_int("within_epoch's batch", within["batch"], minimum=1)
    sums, draws, connectivity = within["sums"], within["draws"], within["last_connectivity"]
    if not torch.is_tensor(sums) or sums.shape != (3,):
        raise TypeError("within_epoch's sums are not a tensor of 3 numbers")
    if draws is not None:
        masks, agree = draws["masks"], draws["agree"]
        if not (isinstance(masks, list) and isinstance(agree, list) and len(masks) == len(agree)
                and all(torch.is_tensor(t) for t in [*masks, *agree]) and len({len(t) for t in [*masks, *agree]}) < 2):
            raise TypeError("within_epoch's draws are not the stacked draws of every gate")
    if within.get("rng_at_start") is not None:
        _check_rng(within["rng_at_start"], "within_epoch's rng_at_start")
    if not isinstance(connectivity, dict) or not all(torch.is_tensor(v) for v in connectivity.values()):
        raise TypeError("within_epoch's last_connectivity is not a dict of tensors")
    return {**within, "batch": batch, "elapsed": check_float("within_epoch's elapsed time", within["elapsed"])}


def _data_seed(loader: object) -> int | None:
    """The seed of the data order and augmentation of one of connlearn's loaders (the same on every rank),
    else ``None``: a user's loader may be seeded otherwise, such as by rank."""
    return loader.seed if isinstance(loader, ShardedBatches) else None


def _is_loader(obj: object) -> bool:
    return callable(getattr(obj, "epoch", None)) and callable(getattr(obj, "__len__", None))


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def write_jsonl(path: Path, records: Iterable[dict[str, Any]]) -> None:
    """Rewrite a JSONL file atomically (:func:`write_text_atomic`)."""
    write_text_atomic(path, "".join(json.dumps(r) + "\n" for r in records))


def read_jsonl(path: str | os.PathLike, what: str = "file", *, torn_tail: bool = False) -> list[dict[str, Any]]:
    """The records of a JSONL file (a log or gate snapshots): one JSON object a line, blank lines skipped.
    A file that cannot be read, or a line that is not a JSON object, is a :class:`DataError` naming
    ``what`` (e.g. "log file"), the path and the line. ``torn_tail``: a last line cut short (an append that
    a crash interrupted) is left out instead."""
    records: list[dict[str, Any]] = []
    where = f"{what} {str(path)!r}"
    number = 0
    try:
        with open(expand_home(path), encoding="utf-8") as f:
            lines = [(n, line) for n, line in enumerate(f, 1) if line.strip()]
        for number, line in lines:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                if torn_tail and number == lines[-1][0] and not line.endswith("\n"):
                    break
                raise
            if not isinstance(record, dict):
                raise DataError(f"{where} is not JSONL (one JSON object a line): line {number} is a "
                                f"{type(record).__name__}")
            records.append(record)
    except OSError as exc:
        raise DataError(f"cannot read {where}: {exc.strerror or exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        line = f"line {number}: " if isinstance(exc, json.JSONDecodeError) else ""
        raise DataError(f"{where} is not JSONL (one JSON object a line): {line}{exc}") from None
    return records


def gate_statistics(net: ConnectivityNet) -> dict[str, Any]:
    """Mean real gate, mean within-row std, share clipped at 0 and at 1, and the mean entropy (nats) of the
    rows' normalised sampling distributions; ``None`` values for nets without learnable gates."""
    gates = [p.detach().float() for p in net.gate_parameters()]
    if not gates:
        return {"gate_mean": None, "gate_row_std": None, "gate_at_0": None, "gate_at_1": None, "gate_entropy": None}
    # per-row std of every gate matrix (modules of the dense topology differ in width); 0 for one-entry rows
    row_std = torch.cat([g.reshape(-1, g.shape[-1]).std(dim=-1) if g.shape[-1] > 1
                         else g.new_zeros(g.numel()) for g in gates])
    flat = torch.cat([g.flatten() for g in gates])
    entropies = []
    for g in gates:
        p = sampling_distribution(g)
        entropies.append(-(p * p.clamp(min=1e-12).log()).sum(-1).reshape(-1))  # a 1-D gate: one row
    return {
        "gate_mean": flat.mean().item(),
        "gate_row_std": row_std.mean().item(),
        "gate_at_0": (flat <= 0).float().mean().item(),
        "gate_at_1": (flat >= 1).float().mean().item(),
        "gate_entropy": torch.cat(entropies).mean().item(),
    }


@torch.no_grad()
def evaluate(model: torch.nn.Module, loader: Loader, *, amp: torch.dtype | str | None = None,
             channels_last: bool = False) -> dict[str, float]:
    """Test loss, top-1 and top-5 accuracy (in %) of ``model`` in eval mode over ``loader.epoch(0)``.

    ``amp``: ``None`` (full precision), a dtype (``torch.bfloat16``, ``torch.float16``) or one of the
    Trainer's names (``"bf16"``, ``"fp16"``, ``"none"``, or ``"auto"``: bf16 on CUDA)."""
    if not isinstance(model, torch.nn.Module):
        raise ConfigTypeError(f"evaluate takes a torch.nn.Module (e.g. connlearn.build(...)), got "
                              f"{type(model).__name__}")
    if not _is_loader(loader):
        raise ConfigTypeError(f"evaluate takes a loader: an object with len() and epoch(n) giving (images, labels) "
                              f"batches (connlearn.data.make_loaders), got {type(loader).__name__}")
    check_bool("channels_last", channels_last)
    if not isinstance(amp, torch.dtype) and amp is not None:
        check_name("amp mode", amp, AMP_MODES)
        device = next((p.device for p in model.parameters()), torch.device("cpu"))
        amp = _amp_dtype(amp, device)
    elif amp == torch.float32:
        amp = None  # full precision
    elif amp is not None and amp not in (torch.bfloat16, torch.float16):
        raise ConfigError(f"amp must be torch.bfloat16, torch.float16, torch.float32 or None, got {amp}")
    check_classes(model, loader, "the evaluation loader")
    was_training = model.training
    model.eval()
    totals, seen = None, 0
    try:
        for x, y in loader.epoch(0):
            if channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            with _autocast(x.device, amp):
                out = model(x)
            loss = F.cross_entropy(out.float(), y, reduction="sum")
            k = min(5, out.shape[1])
            top = out.topk(k, dim=1).indices
            batch = torch.stack([loss, (top[:, 0] == y).sum().float(), (top == y[:, None]).any(1).sum().float()])
            totals = batch if totals is None else totals + batch
            seen += len(y)
    finally:  # an error or an interrupt mid-way leaves the model in the mode it was given in
        model.train(was_training)
    if totals is None:
        raise ConfigError("the evaluation loader yielded no batch")
    loss, top1, top5, n = _all_reduce(torch.cat([totals, totals.new_tensor([seen])])).tolist()
    return {"test_loss": loss / n, "test_top1": 100 * top1 / n, "test_top5": 100 * top5 / n}


def _all_reduce(t: torch.Tensor, op: Any = None) -> torch.Tensor:
    """``t`` summed (or reduced by ``op``) in place over the ranks under ``torch.distributed``."""
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(t, **({} if op is None else {"op": op}))
        _let_go(t)
    return t


def _let_go(t: torch.Tensor) -> None:
    """Wait (at most a second) until gloo's worker thread has dropped its references to ``t``. The worker
    drops them just after the collective completes, and dropping a tensor made in Python takes Python's
    lock; a process that ends in between (at the end of a run) aborts with "terminate called without an
    active exception". On a torch without ``Tensor._use_count`` there is nothing to wait on."""
    count = getattr(t, "_use_count", None)
    if count is None or not _reduced_by_gloo(t):
        return
    deadline = time.monotonic() + 1.0
    while count() > 1 and time.monotonic() < deadline:
        time.sleep(1e-4)  # releases Python's lock for the worker


def _reduced_by_gloo(t: torch.Tensor) -> bool:
    """Whether the default group reduces ``t`` with gloo: its backend config (``"cpu:gloo,cuda:nccl"``) maps
    ``t``'s device type to gloo."""
    for part in str(dist.get_backend_config()).split(","):
        device, _, backend = part.strip().rpartition(":")
        if device in ("", t.device.type):
            return backend == "gloo"
    return False


def _spread(value: int, device: torch.device) -> tuple[int, int]:
    """The least and the greatest of ``value`` over the ranks under ``torch.distributed``, else ``value``
    twice."""
    if not (dist.is_available() and dist.is_initialized()):
        return value, value
    # NCCL reduces CUDA tensors only; gloo takes CPU ones
    t = _all_reduce(torch.tensor([-value, value], device=device if dist.get_backend() == "nccl" else "cpu"),
                    op=dist.ReduceOp.MAX)
    return -int(t[0]), int(t[1])


def _all_agree(flag: bool, device: torch.device) -> bool:
    """``flag`` on every rank under ``torch.distributed`` (False if any rank says False), else ``flag``:
    a decision each rank takes from its own clock, such as starting another epoch, is taken together,
    or the ranks that go on would wait forever for those that stopped."""
    return bool(_spread(int(flag), device)[0])


@contextlib.contextmanager
def hold_folder(folder: Path, what: str, is_main: bool, device: torch.device) -> Iterator[None]:
    """Rank 0 holds ``folder`` (:func:`~connlearn.checkpoint.folder_lock`) while the block runs; a refusal is
    raised on every rank (under ``torch.distributed``), which would otherwise wait for rank 0 in their next
    collective."""
    refused: ConfigError | None = None
    with contextlib.ExitStack() as held:
        if is_main:
            try:
                held.enter_context(folder_lock(folder, what))
            except ConfigError as exc:
                refused = exc
        if not _all_agree(refused is None, device):
            raise refused or ConfigError(f"{folder} is in use by another process (rank 0 could not hold it): two "
                                         "runs in one folder overwrite each other's checkpoints; give another one")
        yield


def _same_on_every_rank(value: int, device: torch.device, what: str,
                        fix: str = "give every rank the same out_dir, a folder they share") -> None:
    """A :class:`CheckpointError` on every rank unless ``value`` is the same on all of them."""
    low, high = _spread(value, device)
    if low != high:
        raise CheckpointError(f"the ranks disagree on {what} ({low} on one, {high} on another): {fix}")


def _amp_dtype(mode: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype of an amp mode (:data:`AMP_MODES`) on ``device``."""
    return {"auto": torch.bfloat16 if device.type == "cuda" else None, "bf16": torch.bfloat16,
            "fp16": torch.float16, "none": None}[mode]


def check_classes(model: torch.nn.Module, loader: Loader, name: str) -> None:
    """A clear error when ``loader``'s dataset has more classes than ``model`` has outputs: its labels would
    fail inside the loss (on a GPU, as a device-side assert)."""
    inner = getattr(model, "_orig_mod", model)
    inner = getattr(inner, "module", inner)
    outputs = getattr(inner, "num_classes", None)
    data = getattr(loader, "dataset", None)
    data = getattr(loader, "files", None) if data is None else data  # the ImageNet folder loader's file lists
    classes = getattr(data, "num_classes", None)
    if isinstance(outputs, int) and isinstance(classes, int) and classes > outputs:
        raise ConfigError(f"{name}'s dataset has {classes} classes, but the network has {outputs} outputs; build "
                          f"it with num_classes={classes}")


def _autocast(device: torch.device, dtype: torch.dtype | None):
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


class Trainer:
    """Runs ``recipe`` on ``net`` with SGD (the paper's protocol), writing logs and checkpoints to ``out_dir``.

    Args:
        net: the network (e.g. ``connlearn.build(...)``); on resume it is replaced by the checkpoint's.
        train_loader, test_loader: see the module docstring; ``test_loader`` may be ``None``.
        recipe: the schedule (``connlearn.recipe.get_recipe("cifar").scaled(epochs)``).
        out_dir: the run's folder (made if missing): ``log.jsonl``, ``gates.jsonl`` and the checkpoints
            ``last.pt``, ``previous.pt`` and ``best.pt`` (see the module docstring; ``fit`` resumes from
            them).
        device: where to train (default: CUDA if available).
        amp: ``"auto"`` (bf16 on CUDA, off on CPU), ``"bf16"``, ``"fp16"`` (with a GradScaler) or ``"none"``.
        channels_last: train in channels-last memory format (default off: on an H200 a gated {20,4,8} step
            took 24.0 ms channels-last against 18.9 ms contiguous in bf16, since cuDNN's grouped convolutions
            and the gate mix pay for layout conversions; see BENCHMARKS.md).
        cudnn_benchmark: on CUDA, set ``torch.backends.cudnn.benchmark`` (the shapes are fixed, so cuDNN's
            autotuned kernels are chosen once); ``False`` leaves the global setting alone.
        compile: wrap the network in ``torch.compile`` (recompiled once, when the connectivity freezes);
            ``True`` or a mode of :data:`COMPILE_MODES`. On a GPU use ``"reduce-overhead"`` (CUDA graphs): it
            shortened the gated epochs measured in BENCHMARKS.md, where the default mode gained nothing
            measurable.
        gate_grad: the GateUpdater's gate rule: ``plain`` (the default: plain gradient, clip), ``centered``,
            ``normalized``, ``double-centered`` or ``renormalized`` (see :mod:`connlearn.updater`).
        snapshot_every: steps between gate snapshots (0: none).
        checkpoint_every: steps between checkpoints within an epoch (``last.pt``; 0: at the end of each epoch
            only), for epochs too long to lose to a stopped job; a resume goes on from the step it holds.
        tensorboard: also write TensorBoard scalars to ``out_dir/tb``, one step per epoch; a resume hides what
            the run logged after the epoch it resumes from (a kill, or a resume from an earlier checkpoint).
        progress: show a tqdm progress bar.
        verbose: print one summary line per epoch.
        meta: free-form JSON-able facts stored in checkpoints (dataset, preset, ...).
        resume_check: called with the checkpoint dict a resume is about to load (after the fallback to
            ``previous.pt``, before the architecture, gate, recipe and data-seed checks); it raises to refuse
            the resume (e.g. when the checkpoint's ``meta`` records other settings than the caller's). The
            training loader's ``seed``, where it is one of connlearn's, is recorded and checked by itself.
    """

    def __init__(
        self,
        net: ConnectivityNet,
        train_loader: Loader,
        test_loader: Loader | None,
        recipe: Recipe,
        *,
        out_dir: str | os.PathLike,
        device: str | torch.device | None = None,
        amp: str = "auto",
        channels_last: bool = False,
        cudnn_benchmark: bool = True,
        compile: bool | str = False,
        gate_grad: str = "plain",
        snapshot_every: int = 100,
        checkpoint_every: int = 0,
        tensorboard: bool = False,
        progress: bool = True,
        verbose: bool = True,
        meta: dict[str, Any] | None = None,
        resume_check: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        check_net(net)
        other = sorted({str(p.dtype) for p in net.parameters() if p.is_floating_point() and p.dtype != torch.float32})
        if other:  # its images would be float32, and a step of the gates in half precision rounds away
            raise ConfigTypeError(f"the Trainer trains float32 networks; this one has {' and '.join(other)} weights: "
                                  "give it net.float(), and amp='bf16' or 'fp16' for half-precision compute (the "
                                  "weights and gates stay float32)")
        for name, loader in (("train_loader", train_loader), ("test_loader", test_loader)):
            if (loader is not None or name == "train_loader") and not _is_loader(loader):
                raise ConfigTypeError(f"{name} must be a loader: an object with len() (batches per epoch) and "
                                      f"epoch(n) giving (images, labels) batches (connlearn.data.make_loaders), got "
                                      f"{type(loader).__name__}")
        if not isinstance(recipe, Recipe):
            raise ConfigTypeError(f"recipe must be a connlearn.recipe.Recipe (e.g. get_recipe('cifar')), got "
                                  f"{recipe!r}")
        check_name("amp mode", amp, AMP_MODES)
        if compile is None:  # as in a config file's "compile": null
            compile = False
        if not isinstance(compile, bool):
            check_name("compile mode", compile, COMPILE_MODES)
        if resume_check is not None and not callable(resume_check):
            raise ConfigTypeError(f"resume_check must be a function of the checkpoint dict, got {resume_check!r}")
        if meta is not None and not isinstance(meta, dict):
            raise ConfigTypeError(f"meta must be a dict of JSON-able facts, got {meta!r} ({type(meta).__name__})")
        for name, loader in (("train_loader", train_loader), ("test_loader", test_loader)):
            if loader is not None:
                check_classes(net, loader, name)
        self.device = check_device(device)
        self.amp = _amp_dtype(amp, self.device)
        self.channels_last = check_bool("channels_last", channels_last)
        if check_bool("cudnn_benchmark", cudnn_benchmark) and self.device.type == "cuda":
            torch.backends.cudnn.benchmark = True
        self.compile = compile
        self.gate_grad = gate_grad
        self.snapshot_every = check_int("snapshot_every", snapshot_every, minimum=0)
        self.checkpoint_every = check_int("checkpoint_every", checkpoint_every, minimum=0)
        self.progress = check_bool("progress", progress)
        self.verbose = check_bool("verbose", verbose)
        self.tensorboard = check_bool("tensorboard", tensorboard)
        self.meta = dict(plain_facts(meta or {}, "meta"))  # its entries stay the caller's (a resume check updates them)
        self.resume_check = resume_check
        self.train_loader, self.test_loader, self.recipe = train_loader, test_loader, recipe
        self.out_dir = check_path("out_dir", out_dir)
        if self.out_dir.exists() and not self.out_dir.is_dir():
            raise ConfigError(f"out_dir {str(self.out_dir)!r} is a file; give the folder of the run")
        self.is_main = _rank() == 0
        if self.is_main:
            try:
                self.out_dir.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise ConfigError(f"cannot make out_dir {str(self.out_dir)!r}: {exc.strerror or exc}") from None
        self.history: list[dict[str, Any]] = []
        self.epoch = 0  # epochs completed
        self.step = 0
        self.best_top1: float | None = None
        self._tb: SummaryWriter | None = None
        self._last_connectivity: dict[int, torch.Tensor] | None = None
        self._snapshot_step: int | None = None  # the step of the last line of gates.jsonl
        self._holds_last = False  # the state in memory is the one out_dir/last.pt holds (saved or loaded)
        self._diverged: int | None = None  # the epoch whose weights stopped being finite
        self._within: dict[str, Any] | None = None  # the unfinished epoch's progress: saved, or to resume from
        self._midway = False  # a batch reached the network in an epoch that did not end (an exception stopped it)
        self._saved: tuple[int, int] | None = None  # (epochs, batches of the next) that out_dir/last.pt holds
        self._rng_at_epoch_start: dict[str, Any] | None = None
        self._froze_from: str | None = None  # the kind its frozen network learned as (those checkpoints are its run's)
        self._signals: StopSignals | None = None  # while fit() stops on signals
        self._set_net(net)
        for phase in recipe.phases:  # a gate kind that cannot draw at the recipe's temperatures says so now
            if self._draws_in(phase):
                for t in (phase.temperature, phase.temperature_end):
                    if t is not None:
                        self.net.check_temperature(t, "the recipe's temperature")
        self.optimizer = self._make_optimizer()
        self.scaler = torch.amp.GradScaler(self.device.type) if self.amp is torch.float16 else None

    # ------------------------------------------------------------------ setup
    def _set_net(self, net: ConnectivityNet) -> None:
        net = net.to(self.device)
        if self.channels_last:
            net = net.to(memory_format=torch.channels_last)
        self.net = net
        self.updater = GateUpdater(net, grad_mode=self.gate_grad)
        self._wrap()

    def _wrap(self) -> None:
        model: torch.nn.Module = self.net
        if dist.is_available() and dist.is_initialized():
            ids = [self.device.index] if self.device.type == "cuda" else None
            model = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)
        mode = self.compile if isinstance(self.compile, str) else "default"
        # torch.compile gives a compiled module (an nn.Module) for a module, which its type hint leaves a callable
        self.model: torch.nn.Module = torch.compile(model, mode=mode) if self.compile else model  # type: ignore[assignment]

    def _make_optimizer(self) -> torch.optim.Optimizer:
        phase = self.recipe.phases[0]
        opt = torch.optim.SGD(
            param_groups(self.net, phase.lr, self.recipe.weight_decay, phase.gate_lr, self.recipe.gate_momentum),
            lr=phase.lr, momentum=self.recipe.momentum, nesterov=self.recipe.nesterov,
        )
        self.updater.detach()
        self.updater.attach(opt)
        return opt

    def _freeze(self, epoch: int) -> None:
        """Fix the connectivity to the top-K of the real gates and stop updating gates. The first time, the
        gates it reads are snapshotted (at ``epoch``, unless the step's regular snapshot holds them)."""
        gates = self.net.gate_parameters()
        if gates and self.snapshot_every and self._snapshot_step != self.step:
            self._snapshot(float(epoch), freeze=True)
        if not self.net.fixed_connectivity:
            self._froze_from = self.net.gate_kind
        self.net.freeze()
        drop_gate_group(self.optimizer)
        self._wrap()

    # ------------------------------------------------------------------ resume
    def _resume_path(self, resume: bool | str | os.PathLike) -> Path | None:
        if resume is False:
            return None
        if resume not in (True, "auto"):
            return check_path("resume", cast("str | os.PathLike[str]", resume))  # neither False nor True here
        last, previous = self.out_dir / "last.pt", self.out_dir / "previous.pt"
        interrupted = self.out_dir / ".next.pt"  # whole (written atomically); newer than last.pt until renamed to it
        if not last.exists() and interrupted.exists():  # a save stopped between its two renames (see _save)
            return interrupted
        if not last.exists() and not previous.exists():
            if resume is True:
                raise CheckpointError(f"resume=True but there is no checkpoint in {self.out_dir}")
            return None
        return last

    def load(self, path: str | os.PathLike) -> None:
        """Restore the whole training state from a checkpoint written by this trainer."""
        path = check_path("path", path)
        try:
            ckpt = load_checkpoint(path)
        except CheckpointError as exc:
            fallback = path.with_name("previous.pt")
            if path.name not in ("last.pt", ".next.pt") or not fallback.exists():
                raise
            warnings.warn(f"{exc}; resuming from {fallback} instead", stacklevel=2)
            ckpt, path = load_checkpoint(fallback), fallback  # what follows names the file read
        if "optimizer" not in ckpt or "recipe" not in ckpt:
            raise CheckpointError(f"{path} holds a network but no training state; it cannot be resumed")
        if self.resume_check is not None:
            self.resume_check(ckpt)
        saved, given = BranchGraph.from_json(ckpt["graph"]), self.net.graph()
        if architecture(saved) != architecture(given):
            raise CheckpointError(f"{path} is a checkpoint of another architecture than the network given")
        # training may have frozen the given kind of gates since; any other change of gate kind or K is another run
        kind, given_kind = saved.gate_kind, self._froze_from or given.gate_kind  # as before this trainer froze it
        if kind == "frozen" and (not self.net.fixed_connectivity or self._froze_from):
            kind = saved.graph.get("frozen_from", given_kind)  # checkpoints before it was recorded: trusted
        if saved.K != given.K or kind != given_kind:
            learned = f" (learned as {kind}, since frozen)" if kind != saved.gate_kind else ""
            raise CheckpointError(f"{path} was trained with gate={saved.gate_kind}{learned} K={saved.K}; the network "
                                  f"given has gate={given.gate_kind} K={given.K} (train it in another out_dir)")
        previous = path.with_name("previous.pt")
        other = f", or resume from {previous}" if path.name != previous.name and previous.exists() else ""

        def damaged(exc: Exception) -> CheckpointError:
            return CheckpointError(f"the training state in {path} is damaged or of another version, so it cannot be "
                                   f"resumed ({type(exc).__name__}: {str(exc).strip()[:200]}); start a new "
                                   f"out_dir{other}")

        try:  # read and check the entries first: a damaged one is named before anything is restored
            recipe = Recipe.from_dict(ckpt["recipe"])
            epoch = check_int("the checkpoint's epoch", ckpt["epoch"], minimum=0)
            step = check_int("the checkpoint's step", ckpt["step"], minimum=0)
            history = list(ckpt["history"])
            if not all(isinstance(record, dict) for record in history):
                raise TypeError("history is not a list of epoch records")
            best = ckpt.get("best_top1")
            best = None if best is None else check_float("the checkpoint's best_top1", best)
            rng, optimizer = ckpt["rng"], ckpt["optimizer"]
            _check_rng(rng, "rng")
            if not isinstance(optimizer, dict):
                raise TypeError("optimizer is not the state this trainer writes")
            within = _checked_within(ckpt.get("within_epoch"))
            data_seed = ckpt.get("data_seed")  # checkpoints of older versions: none
            data_seed = None if data_seed is None else check_int("the checkpoint's data_seed", data_seed)
        except ConnlearnError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise damaged(exc) from exc
        if recipe != self.recipe:
            raise CheckpointError(f"{path} was trained with another recipe: "
                                  f"{_recipe_differences(recipe.to_dict(), self.recipe.to_dict())}")
        seed = _data_seed(self.train_loader)
        if not _all_agree(data_seed is None or seed is None or data_seed == seed, self.device):  # every rank
            raise CheckpointError(f"{path} was trained on the data order of seed {data_seed}, and the training "
                                  f"loader given has seed {seed} (on this rank or another): give it the loader "
                                  "of that run")
        if within is not None and within["batch"] >= len(self.train_loader):
            raise CheckpointError(f"{path} was saved after batch {within['batch']} of epoch {epoch + 1}, but the "
                                  f"training loader has {len(self.train_loader)} batches an epoch: give it the "
                                  "loader of that run")
        self._set_net(net_from_checkpoint(ckpt))
        self.optimizer = self._make_optimizer()
        try:
            self.optimizer.load_state_dict(optimizer)
            if self.scaler is not None and ckpt.get("scaler"):
                self.scaler.load_state_dict(ckpt["scaler"])
            _set_rng_state(_own(rng), self.device)
        except (KeyError, TypeError, ValueError, RuntimeError, AttributeError) as exc:  # their contents
            raise damaged(exc) from exc
        self.epoch, self.step, self.history, self.best_top1 = epoch, step, history, best
        self._holds_last = (path.name in ("last.pt", ".next.pt")  # .next.pt: the save to last.pt was cut short
                            and path.parent.resolve() == self.out_dir.resolve())
        self._within, self._midway = within, False
        self._froze_from = saved.graph.get("frozen_from") if saved.gate_kind == "frozen" else None
        self._saved = (epoch, 0 if within is None else within["batch"]) if self._holds_last else None
        self._last_connectivity = self.net.connectivity() if within is None else within["last_connectivity"]
        if self.is_main:
            write_jsonl(self.out_dir / "log.jsonl", self.history)
            snaps = self.out_dir / "gates.jsonl"
            self._snapshot_step = None
            if snaps.exists():
                kept = [r for r in read_jsonl(snaps, "gate snapshots", torn_tail=True) if r["step"] <= self.step]
                write_jsonl(snaps, kept)
                self._snapshot_step = kept[-1]["step"] if kept else None

    def state(self) -> dict[str, Any]:
        """The checkpoint dict of the current training state (with this process's random states)."""
        return self._state(_rng_state(self.device))

    def _state(self, rng: dict[str, Any]) -> dict[str, Any]:
        return make_checkpoint(
            self.net,
            optimizer=self.optimizer.state_dict(),
            scaler=self.scaler.state_dict() if self.scaler is not None else None,
            epoch=self.epoch, step=self.step, recipe=self.recipe.to_dict(), history=self.history,
            best_top1=self.best_top1, meta=plain_facts(self.meta, "meta"),  # entries added since, too
            within_epoch=self._within,
            data_seed=_data_seed(self.train_loader),
            rng=rng,
        )

    def _save(self, best: bool) -> None:
        saved = (self.epoch, 0 if self._within is None else self._within["batch"])
        rng = _every_rank(_rng_state(self.device), self.device)
        if not self.is_main:
            self._saved = saved  # on every rank: rank 0 writes it
            return
        last, previous = self.out_dir / "last.pt", self.out_dir / "previous.pt"
        state = self._state(rng)
        try:
            if best:  # before .next.pt exists, which a resume takes where last.pt is missing: a run stopped
                save_atomic(state, self.out_dir / "best.pt")  # before it redoes this epoch, and writes it again
            tmp = save_atomic(state, self.out_dir / ".next.pt")
            if last.exists():
                os.replace(last, previous)
            os.replace(tmp, last)
        except OSError as exc:  # a full disk, a quota, an I/O error: say what is kept
            def held(at: tuple[int, int]) -> str:
                return f"epoch {at[0]}" + (f" and {at[1]} batches of epoch {at[0] + 1}" if at[1] else "")

            kept = (f"{last} still holds {held(self._saved)}" if self._saved and last.exists()
                    else f"{last} is left as it was" if last.exists()
                    else f"{previous} holds the one before" if previous.exists() else None)
            kept = "no checkpoint was written (make room and run again)" if kept is None else (
                f"{kept} (make room and run again to resume)")
            failed = Path(exc.filename) if exc.filename and Path(exc.filename).name != ".next.pt" else last
            raise CheckpointWriteError(f"cannot write the checkpoint after {held(saved)} to {failed}: "
                                       f"{exc.strerror or exc}; {kept}", exc.errno, str(failed)) from exc
        self._saved = saved

    # ------------------------------------------------------------------ training
    def fit(self, *, resume: bool | str | os.PathLike = "auto", max_epochs: int | None = None,
            time_limit: float | None = None, stop_signals: Iterable[Any] | None = ()) -> list[dict[str, Any]]:
        """Train to the end of the recipe (or ``max_epochs`` more epochs); returns the epoch log.

        ``resume``: ``"auto"`` continues from ``out_dir/last.pt`` when it exists, ``True`` requires it,
        ``False`` starts afresh, a path resumes from that checkpoint. ``time_limit`` (seconds): start no new
        epoch once this much time has passed (each epoch ends with a checkpoint, so a later call resumes);
        under ``torch.distributed`` no rank starts one once any rank's time has passed. A later call on the
        same trainer goes on from the state in memory, which its ``last.pt`` holds: ``net``, ``optimizer`` and
        ``model`` stay the objects they were (the freeze of phase 2 replaces them, and ``load`` does). After an
        exception stopped an epoch (an interrupt), a later call resumes from ``last.pt`` instead (which with
        ``checkpoint_every`` may lie within that epoch), and refuses to go on where there is none.

        ``stop_signals`` (e.g. :data:`connlearn.signals.STOP_SIGNALS`: Ctrl-C, ``SIGTERM``, ``SIGUSR1``): on
        the first of them, training stops at the next step (or after an evaluation under way, and its
        epoch's checkpoint), writes ``last.pt`` there and raises :class:`~connlearn.signals.TrainingStopped`,
        which ends the program with that signal's exit code unless caught; so it does when the signal came in
        the last epoch of this call. A second Ctrl-C interrupts at once (:mod:`connlearn.signals`). Under
        ``torch.distributed`` the ranks check every ``STOP_CHECK_EVERY`` steps whether any of them got one,
        and stop together: give every rank the same ``stop_signals``.
        """
        started = time.perf_counter()
        signals = check_signals(stop_signals)
        if not isinstance(resume, bool) and resume != "auto":
            check_path("resume (True, False, 'auto' or a checkpoint's path)", resume)
            if isinstance(resume, str) and not Path(resume).exists() and closest(resume, ("auto",)):
                raise ConfigError(f"resume {resume!r} is neither 'auto' nor an existing checkpoint; did you mean "
                                  "'auto'?")
        if max_epochs is not None:
            max_epochs = check_int("max_epochs", max_epochs, minimum=0)
        if time_limit is not None:
            time_limit = check_float("time_limit (seconds)", time_limit)  # passed already (< 0): no epoch starts
        if self._diverged is not None:
            raise DivergenceError(f"this trainer's network diverged in epoch {self._diverged}: make a new Trainer "
                                  "(with a lower learning rate, in a new out_dir)")
        with (hold_folder(self.out_dir, "a training run", self.is_main, self.device),
              StopSignals(signals, say=self.is_main) as self._signals):  # from here on, a signal is a request to stop
            if self.is_main:  # held: what a killed save left is no one's
                remove_leftovers(self.out_dir, WRITES)
            try:
                return self._fit(resume, max_epochs, time_limit, started, signals)
            finally:
                self._signals = None
                if self._tb is not None:  # closed: its writer thread would outlive the trainer
                    self._tb.close()
                    self._tb = None

    def _fit(self, resume: bool | str | os.PathLike, max_epochs: int | None, time_limit: float | None,
             started: float, signals: tuple[signal.Signals, ...]) -> list[dict[str, Any]]:
        path = None if resume in (True, "auto") and self._holds_last else self._resume_path(resume)
        # every rank must resume alike: loading wraps the network in DDP again, a collective
        _same_on_every_rank(int(path is not None), self.device, "whether there is a checkpoint to resume from")
        if path is None and self._midway:
            why = "resume=False" if resume is False else "no checkpoint of it to resume from"
            raise CheckpointError(f"this trainer was stopped within epoch {self.epoch + 1} and its network is "
                                  f"part-trained, so it cannot go on ({why}): make a new Trainer (and network)")
        if path is not None:
            self.load(path)
            _same_on_every_rank(self.step, self.device, "the step to resume from")  # every rank has read it
            last = self.out_dir / "last.pt"
            if self.is_main and path == self.out_dir / ".next.pt" and not last.exists():
                os.replace(path, last)  # the save that was cut short between its renames, finished
        _same_on_every_rank(sum(1 << (s % 62) for s in signals), self.device, "the stop_signals (as a bit mask)",
                            "give every rank the same stop_signals")
        if self.tensorboard and self.is_main and self._tb is None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise ConfigError("tensorboard=True needs the tensorboard package: pip install tensorboard") from None
            # epochs are its steps: what a run before left from here on (a kill, an earlier checkpoint) is hidden
            self._tb = SummaryWriter(str(self.out_dir / "tb"), purge_step=self.epoch + 1)
        if self._last_connectivity is None:
            self._last_connectivity = self.net.connectivity()
        if self.step == 0 and self.gate_grad == "renormalized":
            self.updater.renormalize()  # Algorithm 1 normalises before the first forward pass (and snapshot)
        if self.step == 0 and self.is_main:  # a fresh start: snapshots of a run killed before its first checkpoint go
            (self.out_dir / "gates.jsonl").unlink(missing_ok=True)
        if self.step == 0 and self.snapshot_every:
            first = self.recipe.phases[0]
            if self._draws_in(first):
                self.net.sample_temperature = first.temperature_at(0.0)  # the step-0 snapshot records it
            self._snapshot(0.0)
        end = self.recipe.total_epochs if max_epochs is None else min(self.recipe.total_epochs, self.epoch + max_epochs)
        while self.epoch < end and _all_agree(time_limit is None or time.perf_counter() - started < time_limit,
                                              self.device):
            if signum := self._stop_signal(every=1):
                self._stop(signum)
            self._run_epoch(self.epoch)
        if signum := self._stop_signal(every=1):  # in the last epoch: it ends here all the same
            self._stop(signum)
        return self.history

    def _stop_signal(self, every: int | None = None) -> int:
        """The stop signal received (its number; 0: none): by any rank under ``torch.distributed``, where the
        ranks compare theirs at each step that is a multiple of ``every`` (default ``STOP_CHECK_EVERY``) and
        say 0 at the others."""
        if self._signals is None or not self._signals.signals:
            return 0
        if not (dist.is_available() and dist.is_initialized()):
            return self._signals.received
        return 0 if self.step % (every or STOP_CHECK_EVERY) else _spread(self._signals.received, self.device)[1]

    def _stop(self, signum: int) -> None:
        """Raise :class:`TrainingStopped` (on every rank), naming what ``last.pt`` holds."""
        epoch, batch = self._saved or (self.epoch, 0)
        stopped = TrainingStopped(signum, epoch, batch, None if self._saved is None else str(self.out_dir / "last.pt"))
        if self.is_main and self.verbose:
            tqdm.write(f"connlearn: {stopped}", file=sys.stderr)
        raise stopped

    def _run_epoch(self, epoch: int) -> None:
        self._holds_last = False  # from here on, what is in memory is no checkpoint's state
        index, phase = self.recipe.phase_at(epoch)
        if phase.frozen:
            self._freeze(epoch)
        for group in self.optimizer.param_groups:
            group["lr"] = phase.gate_lr if group.get("name") == "gates" else phase.lr
        record: dict[str, Any] = {"epoch": epoch + 1, "phase": index + 1, "lr": phase.lr,
                                  "gate_lr": phase.gate_lr if self.net.gate_parameters() else None}
        record.update(self._train_epoch(epoch, index))
        self._check_finite(epoch, phase, record["train_loss"])
        if self.test_loader is not None:
            t0 = time.perf_counter()
            record.update(evaluate(self.model, self.test_loader, amp=self.amp, channels_last=self.channels_last))
            record["eval_time"] = time.perf_counter() - t0
        graph = self.net.graph()
        record["active_branches"] = {str(m): n for m, n in active_branches(graph).items()}
        record["input_overlap"] = {str(m): v for m, v in input_overlap(graph).items()}
        record["params"] = self.net.num_parameters()
        record.update(gate_statistics(self.net))
        now = self.net.connectivity()
        record["connectivity_changed"] = _changed_rows(self._last_connectivity, now)
        self._last_connectivity = now
        top1 = record.get("test_top1")
        best = top1 is not None and (self.best_top1 is None or top1 > self.best_top1)
        if best:
            self.best_top1 = top1
        record["best_top1"] = self.best_top1
        self.epoch = epoch + 1
        self.history.append(record)
        self._save(best)  # first: a log that cannot be written loses no epoch (a resume rewrites the log)
        self._holds_last, self._midway = True, False  # on every rank: rank 0 wrote it
        if self.is_main:
            write_jsonl(self.out_dir / "log.jsonl", self.history)
            if self.verbose:
                tqdm.write(_summary_line(record, self.recipe.total_epochs))
            self._log_tensorboard(record)

    def _log_tensorboard(self, record: dict[str, Any]) -> None:
        """The epoch's numbers to TensorBoard; a writer that fails (a full disk) is closed with one warning,
        and training goes on: its scalars are a view of ``log.jsonl``, which holds them all."""
        if self._tb is None:
            return
        try:
            for k, v in record.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    self._tb.add_scalar(k, v, self.epoch)
            self._tb.flush()
        except Exception as exc:  # whatever the writer raises: TensorBoard is a view, not the record
            warnings.warn(f"TensorBoard logging to {self.out_dir / 'tb'} failed ({type(exc).__name__}: {exc}); "
                          "it is off for the rest of this run (log.jsonl holds every epoch)", stacklevel=2)
            with contextlib.suppress(Exception):
                self._tb.close()
            self._tb = None

    def _save_within(self, epoch: int, phase: Phase, batch: int, totals: torch.Tensor, seen: int,
                     elapsed: float) -> None:
        """Write ``last.pt`` after ``batch`` batches of ``epoch``: with what a resume needs to end the epoch
        as if it had not stopped (its sums over every rank so far, the draws recorded, the connectivity and
        torch's random state it began with). Weights that are no longer finite are not saved: a
        :class:`DivergenceError` instead."""
        sums = _all_reduce(torch.cat([totals, totals.new_tensor([seen])]))  # a copy: each rank goes on with its own
        self._check_finite(epoch, phase, (sums[0] / sums[2]).item(), batch)
        self._within = {"batch": batch, "sums": sums.cpu(), "elapsed": elapsed,
                        "draws": _packed(self.net._draws) if self.is_main else None,  # rank 0 writes the file
                        "last_connectivity": self._last_connectivity,
                        "rng_at_start": None if self._rng_at_epoch_start is None  # a checkpoint of an older version's
                        else _every_rank(self._rng_at_epoch_start, self.device)}
        try:
            self._save(best=False)
        finally:
            self._within = None

    def _check_finite(self, epoch: int, phase: Phase, loss: float, batch: int | None = None) -> None:
        """A :class:`DivergenceError` (on every rank) if a trained weight or a batch norm's running statistic
        is no longer finite, at the end of ``epoch`` or after its ``batch``. Other buffers are not read: a
        block may keep an infinite one on purpose, such as a mask."""
        named = [(name, p) for name, p in self.net.named_parameters() if p.requires_grad]
        named += [(f"{name}.{stat}", getattr(m, stat)) for name, m in self.net.named_modules()
                  if isinstance(m, _BatchNorm) for stat in ("running_mean", "running_var")
                  if getattr(m, stat, None) is not None]
        finite = torch.stack([torch.isfinite(t).all() for _, t in named]) if named else torch.ones(0, dtype=torch.bool)
        if _all_agree(bool(finite.all()), self.device):
            return
        self._holds_last, self._diverged = False, epoch + 1  # what is in memory is no checkpoint's state
        bad = [name for (name, _), ok in zip(named, finite.tolist(), strict=True) if not ok]
        which = (f"{len(bad)} of its {len(named)} weights and running statistics are no longer finite (the first: "
                 f"{bad[0]})" if bad else "the weights of another rank are no longer finite")
        last = self.out_dir / "last.pt"
        if self._saved is None:
            kept = "this trainer has written no checkpoint"
        elif self._saved[1]:
            kept = (f"{last} holds epoch {self._saved[0]} and {self._saved[1]} batch{'es' * (self._saved[1] > 1)} "
                    f"of epoch {self._saved[0] + 1}")
        else:
            kept = f"{last} holds epoch {self._saved[0]}"
        where = f"epoch {epoch + 1}" + (f" (by its batch {batch})" if batch else "")
        lrs = f"lr {phase.lr:g}" + (f", gate lr {phase.gate_lr:g}" if phase.gate_lr and self.net.gate_parameters()
                                    else "")
        raise DivergenceError(
            f"training diverged in {where} ({lrs}, train loss {loss:.4g}): {which}. Nothing of this epoch after "
            f"that was saved ({kept}). Train again with a lower learning rate (in a new out_dir: a resumed run "
            "keeps its recipe)")

    def _draws_in(self, phase: Phase) -> bool:
        """Whether the network draws its connectivity in ``phase`` (a stochastic gate kind, not frozen)."""
        return not phase.frozen and self.net.stochastic

    def _train_epoch(self, epoch: int, phase_index: int) -> dict[str, Any]:
        self.model.train()
        loader = self.train_loader
        n_batches = len(loader)
        within, self._within = self._within, None
        start = 0 if within is None else within["batch"]
        bar = tqdm(total=n_batches, initial=start, disable=not (self.progress and self.is_main), leave=False,
                   desc=f"epoch {epoch + 1}/{self.recipe.total_epochs} (phase {phase_index + 1})", dynamic_ncols=True)
        totals, seen = torch.zeros(2, device=self.device), 0  # loss sum, correct (on the device); images (host)
        if within is not None and self.is_main:  # the sums over every rank so far: the others add theirs to them
            totals, seen = within["sums"][:2].to(self.device), int(within["sums"][2])
        lr = self.optimizer.param_groups[0]["lr"]
        phase = self.recipe.phases[phase_index]
        sampled = self._draws_in(phase)
        first = (epoch - sum(p.epochs for p in self.recipe.phases[:phase_index])) * n_batches  # its earlier steps
        last = max(phase.epochs * n_batches - 1, 1)
        self.net.record_draws(True)
        if within is not None and self.net._draws is not None:
            self.net._draws.extend(_unpacked(within["draws"], self.device))
        at_start = None if within is None else within.get("rng_at_start")
        self._rng_at_epoch_start = (_rng_state(self.device) if within is None else None if at_start is None
                                    else _own(at_start))
        t0 = time.perf_counter() - (0.0 if within is None else within["elapsed"])
        shown = -math.inf  # when the bar last showed the running loss and accuracy
        try:  # the batches are no local: one that a stop left alive with its DataLoader workers hangs the exit
            for i, (x, y) in enumerate(_batches_from(loader, epoch, start, self._rng_at_epoch_start, self.device),
                                       start):
                self._midway = True  # the network trains from here on
                if sampled:
                    self.net.sample_temperature = phase.temperature_at((first + i) / last)
                if self.channels_last:
                    x = x.contiguous(memory_format=torch.channels_last)
                with _autocast(self.device, self.amp):
                    out = self.model(x)
                    loss = F.cross_entropy(out, y)
                self.optimizer.zero_grad(set_to_none=True)
                if self.scaler is not None:
                    self.scaler.scale(loss).backward()
                    self.scaler.step(self.optimizer)
                    self.scaler.update()
                else:
                    loss.backward()
                    self.optimizer.step()
                self.step += 1
                totals += torch.stack([loss.detach().float() * len(y), (out.argmax(1) == y).sum().float()])
                seen += len(y)
                if self.snapshot_every and self.step % self.snapshot_every == 0:
                    self._snapshot(epoch + (i + 1) / n_batches)
                if i + 1 < n_batches:
                    signum = self._stop_signal()
                    if signum or (self.checkpoint_every and self.step % self.checkpoint_every == 0):
                        self._save_within(epoch, phase, i + 1, totals, seen, time.perf_counter() - t0)
                    if signum:
                        self._stop(signum)
                if not bar.disable and (time.perf_counter() >= shown + 1.0 or i == n_batches - 1):
                    shown = time.perf_counter()  # the totals are read (on a GPU, a wait for the step) once a second
                    loss_sum, correct = totals.tolist()
                    bar.set_postfix(loss=f"{loss_sum / seen:.3f}", acc=f"{100 * correct / seen:.1f}", lr=lr,
                                    img_s=f"{seen / (time.perf_counter() - t0):.0f}", refresh=False)
                bar.update(1)
        except BaseException:  # an interrupt, a stop signal, a diverged network: no epoch end to record
            self.net.record_draws(False)
            raise
        finally:
            bar.close()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        elapsed = time.perf_counter() - t0
        draws = self.net.draw_statistics()
        self.net.record_draws(False)
        loss_sum, correct, seen = _all_reduce(torch.cat([totals, totals.new_tensor([seen])])).tolist()
        if not seen:
            raise ConfigError("the training loader yielded no batch")
        record = {"train_loss": loss_sum / seen, "train_top1": 100 * correct / seen, "epoch_time": elapsed,
                  "images_per_s": seen / elapsed, "step": self.step, **draws}
        if sampled:
            record["temperature"] = self.net.sample_temperature  # at the epoch's last step
        return record

    def _snapshot(self, epoch: float, freeze: bool = False) -> None:
        if not self.is_main:
            return
        learnable = [(m, g) for m, g in self.net.gates() if g.learnable]
        if not learnable:
            return
        record = {"step": self.step, "epoch": epoch, "temperature": self.net.sample_temperature,
                  "gates": {str(m): g.values().float().cpu().tolist() for m, g in learnable}}
        if self.step == 0 or freeze:  # what ranks equal gates in the top-K: at the start and at the freeze
            record["tie_order"] = {str(m): cast(torch.Tensor, g.tie_order).cpu().tolist() for m, g in learnable
                                   if hasattr(g, "tie_order")}
        with open(self.out_dir / "gates.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")
        self._snapshot_step = self.step


def _recipe_differences(saved: dict[str, Any], given: dict[str, Any]) -> str:
    """What differs between two recipes' dicts, as ``name=value there, value here`` (per phase for the
    phases)."""
    said = []
    for key in dict.fromkeys([*saved, *given]):
        there, here = saved.get(key), given.get(key)
        if key == "phases" and len(there or ()) == len(here or ()):
            for number, (a, b) in enumerate(zip(there or (), here or (), strict=True), 1):
                said += [f"phase {number} {k}={a.get(k)!r} there, {b.get(k)!r} here"
                         for k in dict.fromkeys([*a, *b]) if a.get(k) != b.get(k)]
        elif there != here:
            if key == "phases":
                there, here = (f"{len(x or ())} phase{'' if len(x or ()) == 1 else 's'}" for x in (there, here))
            said.append(f"{key}={there!r} there, {here!r} here")
    return "; ".join(said) or "(the same values)"


def _summary_line(r: dict[str, Any], total: int) -> str:
    line = (f"epoch {r['epoch']}/{total} (phase {r['phase']}, lr {r['lr']:g}): train loss {r['train_loss']:.3f} "
            f"top-1 {r['train_top1']:.1f}%")
    if r.get("test_top1") is not None:
        line += f" | eval loss {r['test_loss']:.3f} top-1 {r['test_top1']:.2f}% (best {r['best_top1']:.2f}%)"
    return line + f" | {r['epoch_time']:.0f}s, {r['images_per_s']:.0f} img/s"


def _changed_rows(before: dict[int, torch.Tensor] | None, after: dict[int, torch.Tensor]) -> float | None:
    """Share of blocks whose active inputs differ between two connectivities."""
    if not before or not after:
        return None
    changed = sum(int((before[m] != after[m]).any(dim=1).sum()) for m in after if m in before)
    rows = sum(after[m].shape[0] for m in after)
    return changed / rows if rows else None


def fit(net: ConnectivityNet, train_loader: Loader, test_loader: Loader | None, recipe: Recipe, *,
        out_dir: str | os.PathLike, resume: bool | str | os.PathLike = "auto", **options: Any) -> Trainer:
    """Train ``net`` with ``recipe`` (see :class:`Trainer` for ``options``); returns the trainer, whose
    ``net`` is the trained (possibly frozen) network and ``history`` the epoch log."""
    trainer = Trainer(net, train_loader, test_loader, recipe, out_dir=out_dir, **options)
    trainer.fit(resume=resume)
    return trainer


__all__ = ["TIMING_KEYS", "Trainer", "evaluate", "fit", "gate_statistics", "read_jsonl", "write_jsonl"]
