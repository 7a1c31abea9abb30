"""Plots of a learned connectivity and of training: the paper's Figures 4-5 and the gates' evolution.

Every function writes one figure (``.png``, ``.svg`` or ``.pdf``, by the suffix) and returns its path;
figures are drawn by Agg without pyplot, so the caller's matplotlib state is untouched. Gate snapshots are the
records the trainer appends to ``gates.jsonl``: ``{"step", "epoch", "temperature", "gates": {"<module>":
[[...], ...]}}`` (one row per block, one column per candidate input), and at step 0 and at the freeze
``"tie_order"``, the ranks that order equal gates in the top-K.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from connlearn.errors import DataError
from connlearn.files import path_of, read_jsonl, write_atomic
from connlearn.graph import BranchGraph, active_branches

Records = str | os.PathLike | Sequence[Mapping[str, Any]]
#: The per-epoch gate numbers of the trainer's log that :func:`plot_run` draws in ``draws.png``.
GATE_LOG_KEYS = ("gate_mean", "gate_at_1", "gate_entropy", "drawn_distinct", "drawn_topk_share")
#: The curves :func:`plot_run` draws in ``curves.png``.
CURVE_KEYS = ("test_top1", "train_loss")
LOG_LABELS = {"test_top1": "{eval} top-1 (%)", "test_top5": "{eval} top-5 (%)", "test_loss": "{eval} loss",
              "train_top1": "train top-1 (%)", "train_loss": "train loss", "lr": "learning rate",
              "gate_mean": "gate mean", "gate_row_std": "gate std within a row", "gate_at_1": "gates at 1 (fraction)",
              "gate_entropy": "sampling entropy (nats)", "drawn_distinct": "input sets drawn per block",
              "drawn_topk_share": "draws that were the top-K"}


def _records(source: Records) -> list[Mapping[str, Any]]:
    records = list[Mapping[str, Any]](read_jsonl(source) if isinstance(source, str | os.PathLike) else source)
    if not records:
        raise DataError(f"{_named(source)} hold no records")
    return records


def _named(source: object) -> str:
    return str(source) if isinstance(source, str | os.PathLike) else "the records"


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _gate_matrices(record: Mapping[str, Any], where: str) -> dict[str, np.ndarray]:
    """A gate snapshot's matrices by module, checked: ``step``, ``epoch`` and ``gates`` ``{"<module>": rows}``."""
    gates = record.get("gates")
    if not (isinstance(record.get("step"), int) and _number(record.get("epoch")) and isinstance(gates, dict) and gates
            and all(str(m).isdigit() for m in gates)):
        raise DataError(f"{where} is not a gate snapshot: it needs step, epoch and gates {{\"<module>\": [[gate, ...], "
                        "...]}, as gates.jsonl holds")
    try:
        matrices = {m: np.asarray(v, dtype=float) for m, v in sorted(gates.items(), key=lambda kv: int(kv[0]))}
    except (TypeError, ValueError):  # rows of unequal length, or not numbers
        matrices = {}
    if not matrices or any(a.ndim != 2 or not a.size for a in matrices.values()):
        raise DataError(f"{where}: the gates of each module must be rows of numbers, one row per block")
    return matrices


def _save(fig: Figure, path: str | os.PathLike) -> Path:
    path = path_of(path)
    path = path if path.suffix else path.with_suffix(".png")
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_atomic(path, lambda f: fig.savefig(f, format=path.suffix[1:].lower(), dpi=120))


def plot_active_branches(graphs: BranchGraph | Mapping[str, BranchGraph], path: str | os.PathLike,
                         title: str | None = None) -> Path:
    """Live branches per module against module depth (Figures 4-5), a line per graph (``{"K=1": g, ...}``)."""
    graphs = {f"K={graphs.K}": graphs} if isinstance(graphs, BranchGraph) else graphs
    fig = Figure(figsize=(5.5, 3.5), layout="constrained")
    ax = fig.add_subplot()
    widest = 1
    for label, graph in graphs.items():
        counts = active_branches(graph)
        widest = max(widest, *(len(graph.branches(m)) for m in counts))
        ax.plot(list(counts), list(counts.values()), marker="o", label=str(label), clip_on=False)
    ax.set_ylim(0, widest + 0.5)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(xlabel="module (depth)", ylabel="active branches",
           title=title or "Active branches: blocks whose output reaches the head")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower left")
    return _save(fig, path)


def plot_gate_heatmaps(graph: BranchGraph, path: str | os.PathLike) -> Path:
    """A heatmap per gated module of its real gates, or its signed edge weights (rows: blocks, columns: inputs),
    active entries dotted."""
    modules = [m for m in graph.modules() if graph.candidates(m)]
    if not modules:
        raise DataError("the graph has no gated module: there is no gate matrix to draw")
    ncols = min(len(modules), 4)
    nrows = math.ceil(len(modules) / ncols)
    fig = Figure(figsize=(2.3 * ncols + 1.2, 2.2 * nrows + 0.8), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False)
    image, signed = None, bool(graph.graph.get("edge_weights"))
    matrices = [[np.asarray(a) for a in graph.gate_matrix(m)] for m in modules]
    top = (max(float(np.abs(values).max()) for values, _ in matrices) or 1.0) if signed else 1.0
    for ax, module, (values, active) in zip(axes.flat, modules, matrices, strict=False):
        image = ax.imshow(values, vmin=-top if signed else 0.0, vmax=top, cmap="coolwarm" if signed else "viridis",
                          aspect="auto")
        rows, cols = np.nonzero(active)
        ax.scatter(cols, rows, s=14, c="white", edgecolors="black", linewidths=0.5)
        ax.set_title(f"module {module}", fontsize=9)
        for axis, n in ((ax.xaxis, values.shape[1]), (ax.yaxis, values.shape[0])):
            ticks = list(range(0, n, max(1, math.ceil(n / 8))))
            axis.set_ticks(ticks, [str(t + 1) for t in ticks], fontsize=7)
    for ax in axes.flat[len(modules):]:
        ax.set_axis_off()
    fig.colorbar(cast(Any, image), ax=axes, label="edge weight" if signed else "real gate value", shrink=0.8)
    source = "node of an earlier stage" if graph.graph.get("node_graph") else "block of the module before"
    fig.supxlabel(f"candidate input (a {source})", fontsize=9)
    fig.supylabel("block (branch) of the module", fontsize=9)
    fig.suptitle(f"{'Edge weights' if signed else 'Real gates'} per module ({graph.gate_words()})\n"
                 "dots: the inputs each block uses", fontsize=10)
    return _save(fig, path)


def logged(records: Sequence[Mapping[str, Any]], keys: Sequence[str]) -> tuple[str, ...]:
    """Those of ``keys`` that some record holds a value of."""
    return tuple(k for k in keys if any(r.get(k) is not None for r in records))


def plot_run(graph: BranchGraph, out: str | os.PathLike, K: int, log: Records | None = None,
             snapshots: str | os.PathLike | None = None, eval_set: str = "test") -> list[Path]:
    """The pictures of a run in folder ``out``: active branches, gate heatmaps (where there are gates), the
    curves its ``log`` holds (``curves.png``, and ``draws.png`` for sampled gates) and the gate evolution (from
    a non-empty ``snapshots`` file). Returns the files written."""
    out = path_of(out)
    files = [plot_active_branches({f"K={K}": graph}, out / "active_branches.png")]
    if any(graph.candidates(m) for m in graph.modules()):
        files.append(plot_gate_heatmaps(graph, out / "gate_heatmaps.png"))
    if log is not None:
        records = _records(log)
        if keys := logged(records, CURVE_KEYS):
            files.append(plot_training_curves(records, out / "curves.png", keys=keys, eval_set=eval_set))
        if sum(r.get("drawn_distinct") is not None for r in records) > 1:  # one epoch of draws is no curve
            files.append(plot_training_curves(records, out / "draws.png", keys=GATE_LOG_KEYS, title=(
                "Gate values and draws, epoch by epoch")))
    if snapshots is not None and path_of(snapshots).is_file() and path_of(snapshots).stat().st_size:
        files.append(plot_gate_evolution(snapshots, out / "gate_evolution.png", K=K))
    return files


def gate_statistics(snapshots: Records, K: int) -> list[dict[str, Any]]:
    """Per gate snapshot: ``step``, ``epoch``, over all gates ``mean``, ``std`` (n-1), ``row_std`` (the mean std
    within a row), ``frac_at_0`` and ``frac_at_1``; ``topk_changed``, the share of blocks whose top-K inputs
    differ from the previous snapshot's (None at the first), and ``final_topk_share``, the share of the last
    snapshot's top-K (in a finished run: the frozen connectivity) that each one's holds. Equal gates are ranked
    by the snapshots' ``tie_order`` (the lower column first where there is none)."""
    stats: list[dict[str, Any]] = []
    topks: list[list[frozenset[int]]] = []
    orders: dict[str, np.ndarray] = {}
    shapes = None
    for number, record in enumerate(_records(snapshots), 1):
        matrices = _gate_matrices(record, f"{_named(snapshots)} record {number}")
        orders.update({m: np.asarray(v, dtype=float) for m, v in record.get("tie_order", {}).items()})
        if shapes is not None and shapes != {m: a.shape for m, a in matrices.items()}:
            raise DataError(f"gate snapshot of step {record['step']} has other gate matrices than the first")
        shapes = {m: a.shape for m, a in matrices.items()}
        flat = np.concatenate([a.ravel() for a in matrices.values()])
        rows = [row for a in matrices.values() for row in a]
        ranks = [row for m, a in matrices.items() for row in orders.get(m, -np.indices(a.shape)[1])]
        topk = [frozenset(np.lexsort((-rank, -row))[:K].tolist()) for row, rank in zip(rows, ranks, strict=True)]
        stats.append({"step": int(record["step"]), "epoch": float(record["epoch"]), "mean": float(flat.mean()),
                      "std": float(flat.std(ddof=1)) if flat.size > 1 else 0.0,
                      "row_std": float(np.mean([r.std(ddof=1) if r.size > 1 else 0.0 for r in rows])),
                      "frac_at_0": float((flat <= 0).mean()), "frac_at_1": float((flat >= 1).mean()),
                      "topk_changed": None if not topks else float(np.mean([a != b for a, b in zip(topks[-1], topk,
                                                                                                  strict=True)]))})
        topks.append(topk)
    for record, topk in zip(stats, topks, strict=True):
        record["final_topk_share"] = float(np.mean([len(a & b) for a, b in zip(topk, topks[-1], strict=True)]) / K)
    return stats


def plot_gate_evolution(snapshots: Records, path: str | os.PathLike, K: int) -> Path:
    """The real gates over training in three panels: mean ± std and the mean std within a row; the shares
    clipped at 0 and 1; the blocks whose top-K changed, and the share of the last top-K already held."""
    stats = gate_statistics(snapshots, K)
    epoch = np.array([s["epoch"] for s in stats])

    def series(key: str) -> np.ndarray:
        return np.array([np.nan if s[key] is None else s[key] for s in stats], dtype=float)

    fig = Figure(figsize=(6.0, 7.4), layout="constrained")
    spread, clipped, changed = fig.subplots(3, 1, sharex=True)
    fig.suptitle(f"The real gates over training (K={K})")
    spread.set_title("all gates: mean, spread, and spread within a block's row", fontsize=9)
    clipped.set_title("gates clipped at 0 and at 1", fontsize=9)
    changed.set_title(f"each block's top-{K} inputs: changed since the snapshot before; already the final ones",
                      fontsize=9)
    mean, std = series("mean"), series("std")
    spread.fill_between(epoch, mean - std, mean + std, alpha=0.25, label="mean ± std")
    spread.plot(epoch, mean, marker=".", label="mean")
    spread.plot(epoch, series("row_std"), marker=".", label="mean within-row std")
    spread.set_ylabel("real gate value")
    clipped.plot(epoch, series("frac_at_0"), marker=".", label="at 0")
    clipped.plot(epoch, series("frac_at_1"), marker=".", label="at 1")
    clipped.set_ylabel("fraction clipped")
    changed.plot(epoch, series("topk_changed"), marker=".", color="C3", label="blocks whose top-K changed")
    changed.plot(epoch, series("final_topk_share"), marker=".", color="C2",
                 label="share of the last top-K already in it")
    changed.set(ylabel=f"top-{K} (fraction)", xlabel="epoch")
    for ax in (spread, clipped, changed):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    for ax in (clipped, changed):
        ax.set_ylim(-0.02, 1.02)
    return _save(fig, path)


def plot_training_curves(log: Records | Mapping[str, Records], path: str | os.PathLike,
                         keys: str | Sequence[str] = ("test_top1",), eval_set: str = "test",
                         title: str = "Training, epoch by epoch") -> Path:
    """Per-epoch values of ``keys`` (a panel each) from a ``log.jsonl`` (its path or records), or from several
    (``{label: log}``), a line each, under ``title``. Records without a key are skipped for it; where the
    records hold the recipe's ``phase``, dashed lines mark where each phase begins (the first log's)."""
    keys = (keys,) if isinstance(keys, str) else tuple(keys)
    runs = ({str(k): _records(v) for k, v in log.items()} if isinstance(log, Mapping) else {"": _records(log)})
    fig = Figure(figsize=(6.0, 2.6 * len(keys) + 0.8), layout="constrained")
    axes = fig.subplots(len(keys), 1, sharex=True, squeeze=False)[:, 0]
    phased = False
    for ax, key in zip(axes, keys, strict=True):
        for label, records in runs.items():
            points = [(r.get("epoch"), r[key]) for r in records if r.get(key) is not None]
            if not points:
                raise DataError(f"no record of {label or _named(log)} has {key!r}")
            if not all(_number(x) and _number(y) for x, y in points):
                raise DataError(f"{label or _named(log)}: a record with {key!r} needs it and its epoch as numbers, as "
                                "log.jsonl holds them")
            ax.plot(*zip(*points, strict=True), marker=".", label=label or key)
        ax.set_ylabel(LOG_LABELS.get(key, key).format(eval=eval_set))
        ax.grid(alpha=0.3)
        first = next(iter(runs.values()))
        for before, after in itertools.pairwise(first):
            if before.get("phase") is not None and after.get("phase") != before.get("phase") and _number(
                    before.get("epoch")):
                phased = True
                ax.axvline(before["epoch"] + 0.5, color="0.5", lw=0.8, ls="--")
                if ax is axes[0]:
                    ax.annotate(f"phase {after['phase']}", (before["epoch"] + 0.5, 1.0), xytext=(2, -2), fontsize=7,
                                xycoords=("data", "axes fraction"), textcoords="offset points", va="top", color="0.35")
        if len(runs) > 1:
            ax.legend(fontsize=8)
    axes[-1].set_xlabel("epoch")
    fig.suptitle(title + ("\n(dashed lines: a phase of the recipe begins)" if phased else ""))
    return _save(fig, path)
