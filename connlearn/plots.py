"""Plots of learned connectivity and of training: the paper's Figures 4-5 and the gates' evolution.

Every function writes one figure to ``path`` and returns it as a ``Path``. The format follows the suffix
(``.png``, ``.svg`` or ``.pdf``; no suffix: ``.png`` is appended). Figures are built as
``matplotlib.figure.Figure`` objects and rendered by Agg, without pyplot: nothing is shown, no global figure
is left open and the caller's matplotlib backend is untouched.

Gate snapshots are the records the trainer appends to ``gates.jsonl``:
``{"step": int, "epoch": float, "temperature": float, "gates": {"<module index>": [[row values...], ...]}}``,
one row per block of the module and one column per candidate input, values the real gates ĝ ∈ [0, 1];
``temperature`` is the sampling temperature of the step just taken (of the first step for the snapshot
at step 0; files written before it was recorded lack it: 1). The snapshot at step 0 also holds
``"tie_order": {"<module index>": [[...], ...]}``, the order that ranks equal gates of each row in the
network's top-K (the larger wins; see ``connlearn.gates``); files written before 2026-11-26 lack it. So
does the snapshot the trainer writes at the freeze (the gates whose top-K phase 2 keeps) when it falls
between the regular ones.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from connlearn.errors import (
    ConfigError,
    ConfigTypeError,
    DataError,
    check_file_path,
    check_int,
    check_path,
    check_title,
)
from connlearn.files import write_atomic
from connlearn.graph import BranchGraph, check_graph
from connlearn.prune import active_branches
from connlearn.train import read_jsonl

#: Figure formats, by file suffix.
SUFFIXES = (".png", ".svg", ".pdf")

Records = str | os.PathLike[str] | Sequence[Mapping[str, Any]]


# ---------------------------------------------------------------------------- connectivity
def plot_active_branches(
    graphs: BranchGraph | Mapping[str, BranchGraph], path: str | os.PathLike[str], title: str | None = None
) -> Path:
    """Number of active (live) branches per module against module depth, like the paper's Figures 4-5.

    Args:
        graphs: one graph, or several by label (e.g. ``{"K=1": g1, "K=4": g4}``), one line each; a single
            graph is labelled ``K={K}``.
        path: the figure file.
        title: the axes title.

    x is the module index 1..M, y the count of live blocks (``connlearn.prune.active_branches``), from 0 to
    the largest cardinality C.
    """
    path = _figure_path(path)
    check_title(title)
    if isinstance(graphs, BranchGraph):
        graphs = {f"K={graphs.graph.get('K', '?')}": graphs}
    if not isinstance(graphs, Mapping):
        raise ConfigTypeError(
            f"graphs must be a BranchGraph or a dict label -> BranchGraph, got {type(graphs).__name__}"
        )
    if not graphs:
        raise ConfigError("graphs is empty: give at least one BranchGraph to plot")
    fig = Figure(figsize=(5.5, 3.5), layout="constrained")
    ax = fig.add_subplot()
    cardinality = 0
    for label, graph in graphs.items():
        check_graph(graph, f"graphs[{label!r}]")
        counts = active_branches(graph)
        modules = sorted(counts)
        cardinality = max([cardinality, *(len(graph.branches(m)) for m in modules)])
        ax.plot(modules, [counts[m] for m in modules], marker="o", label=str(label), clip_on=False)
    ax.set_ylim(0, max(cardinality, 1) + 0.5)  # points at C stay inside the frame
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("module depth")
    ax.set_ylabel("active branches")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower left")  # the curves run along the top, at C, until blocks die
    if title:
        ax.set_title(title)
    return _save(fig, path)


def _ticks(count: int) -> list[int]:
    """Tick positions for ``count`` rows or columns: every one up to 8, else about 8 evenly spaced."""
    return list(range(0, count, max(1, math.ceil(count / 8))))


def plot_gate_heatmaps(graph: BranchGraph, path: str | os.PathLike[str]) -> Path:
    """One heatmap per gated module of its real gate matrix (``graph.gate_matrix(i)``), active entries dotted.

    Rows are the module's blocks, columns its candidate inputs; one colour bar in [0, 1] for all. For
    unfrozen ``real`` gates, which weight every input, the dots mark the top-K that ``net.freeze()`` keeps.
    """
    path = _figure_path(path)
    check_graph(graph)
    modules = [m for m in graph.modules() if graph.candidates(m)]
    if not modules:
        raise DataError("the graph has no gated module (no gate edges): there is no gate matrix to draw")
    ncols = min(len(modules), 4)
    nrows = math.ceil(len(modules) / ncols)
    fig = Figure(figsize=(2.3 * ncols + 1.2, 2.2 * nrows + 0.8), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False)
    image = None
    for ax, module in zip(axes.flat, modules, strict=False):
        values, active = graph.gate_matrix(module)
        image = ax.imshow(np.asarray(values), vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto")
        rows, cols = np.nonzero(np.asarray(active))
        ax.scatter(cols, rows, s=14, c="white", edgecolors="black", linewidths=0.5)
        ax.set_title(f"module {module}", fontsize=9)
        rows_n, cols_n = np.asarray(values).shape
        ax.set_xticks(_ticks(cols_n), [str(i + 1) for i in _ticks(cols_n)], fontsize=7)  # numbered from 1
        ax.set_yticks(_ticks(rows_n), [str(i + 1) for i in _ticks(rows_n)], fontsize=7)
    for ax in axes.flat[len(modules):]:
        ax.set_axis_off()
    assert image is not None  # there is a module
    fig.colorbar(image, ax=axes, label="real gate value", shrink=0.8)
    fig.supxlabel("candidate input", fontsize=9)
    fig.supylabel("block", fontsize=9)
    fig.suptitle(f"gate={graph.gate_label()} K={graph.graph.get('K', '?')}: real gates, dots = active")
    return _save(fig, path)


#: Per-epoch gate numbers of the trainer's log that :func:`plot_run` draws in ``draws.png``.
GATE_LOG_KEYS = ("gate_mean", "gate_at_1", "gate_entropy", "drawn_distinct", "drawn_topk_share")
#: The curves of a run's log that :func:`plot_run` draws in ``curves.png`` (those the log holds).
CURVE_KEYS = ("test_top1", "train_loss")


def plot_run(graph: BranchGraph, out: str | os.PathLike[str], K: int, log: Records | None = None,
             snapshots: str | os.PathLike[str] | None = None, eval_set: str = "test") -> list[Path]:
    """The standard pictures of a run in folder ``out``: active branches, gate heatmaps (when the graph has
    gates), top-1 on ``eval_set`` and train loss over epochs (those ``log`` holds, when given), the per-epoch gate
    numbers and draws of sampled gates (``draws.png``, when the log has them) and the gate evolution (when a
    non-empty ``snapshots`` file is given). Returns the files written."""
    _check_eval_set(eval_set)
    out = check_path("out", out)
    check_graph(graph)
    K = check_int("K", K, minimum=1)
    if snapshots is not None:
        snapshots = check_path("snapshots", snapshots)
    files = [plot_active_branches({f"K={K}": graph}, out / "active_branches.png")]
    if any(graph.candidates(m) for m in graph.modules()):
        files.append(plot_gate_heatmaps(graph, out / "gate_heatmaps.png"))
    if log is not None:
        records = _records(log, "log")
        keys = logged(records, CURVE_KEYS)  # a run without evaluations logs no test_top1
        if keys:
            files.append(plot_training_curves(records, out / "curves.png", keys=keys, eval_set=eval_set))
        if logged(records, ("drawn_distinct",)):
            files.append(plot_training_curves(records, out / "draws.png", keys=GATE_LOG_KEYS))
    if snapshots is not None and snapshots.is_file() and snapshots.stat().st_size:
        files.append(plot_gate_evolution(snapshots, out / "gate_evolution.png", K=K))
    return files


def logged(records: Sequence[Mapping[str, Any]], keys: Sequence[str]) -> tuple[str, ...]:
    """Those of ``keys`` that some record holds a value of, in order."""
    return tuple(k for k in keys if any(r.get(k) is not None for r in records))


# ---------------------------------------------------------------------------- gate evolution
def gate_statistics(snapshots: Records, K: int) -> list[dict[str, Any]]:
    """Summary numbers of each gate snapshot, in order; what :func:`plot_gate_evolution` draws.

    Args:
        snapshots: the path of a ``gates.jsonl`` file, or its records (see the module docstring).
        K: the fan-in, for the top-K sets.

    Returns one dict per snapshot with ``step``, ``epoch``, and over all gate entries of all modules:
    ``mean``, ``std`` (sample standard deviation, n-1), ``row_std`` (the mean over blocks of the sample std
    within the block's row, as the trainer logs it; 0 for rows of one entry), ``frac_at_0`` and
    ``frac_at_1`` (the fractions clipped at ≤ 0 and ≥ 1), ``topk_changed``: the fraction of blocks
    whose top-K input set differs from the previous snapshot's (``None`` for the first snapshot), and
    ``final_topk_share``: the share of the last snapshot's top-K inputs that this snapshot's top-K already
    holds (1 at the last snapshot; the trainer snapshots the gates at the freeze, so where a run reached
    phase 2 with this snapshot, the last one's top-K is the connectivity phase 1 froze; in older files and
    unfinished runs it is only the latest snapshot's). Equal gates are ranked as the network ranks
    them, by the ``tie_order`` the snapshots record; where they record none (files written before it, or a
    gate kind without one), ties go to the lower column index.
    """
    K = check_int("K", K, minimum=1)
    records = _records(snapshots, "gate snapshots")
    stats: list[dict[str, Any]] = []
    shapes: dict[str, tuple[int, ...]] | None = None
    topks: list[list[frozenset[int]]] = []  # each snapshot's top-K input set of every block
    orders: dict[str, np.ndarray] = {}
    for index, record in enumerate(records):
        matrices = _gate_matrices(record, index)
        orders.update(_tie_orders(record, index, matrices))
        if shapes is None:
            shapes = {m: a.shape for m, a in matrices.items()}
            narrowest = min(matrices, key=lambda m: shapes[m][1])
            if shapes[narrowest][1] < K:
                raise ConfigError(
                    f"K={K} is larger than the {shapes[narrowest][1]} candidate inputs of module {narrowest}"
                )
        elif {m: a.shape for m, a in matrices.items()} != shapes:
            raise DataError(
                f"gate snapshot {index} (step {record['step']}) has gate matrices of shapes "
                f"{ {m: a.shape for m, a in matrices.items()} }, the first snapshot {shapes}; "
                "snapshots of one run must share their modules and shapes"
            )
        flat = np.concatenate([a.ravel() for a in matrices.values()])
        rows = [row for a in matrices.values() for row in a]
        ranks = [row for m, a in matrices.items() for row in orders.get(m, -np.indices(a.shape)[1])]
        topk = [frozenset(np.lexsort((-rank, -row))[:K].tolist()) for row, rank in zip(rows, ranks, strict=True)]
        changed = None if not topks else float(np.mean([a != b for a, b in zip(topks[-1], topk, strict=True)]))
        stats.append({
            "step": int(record["step"]),
            "epoch": float(record["epoch"]),
            "mean": float(flat.mean()),
            "std": float(flat.std(ddof=1)) if flat.size > 1 else 0.0,
            "row_std": float(np.mean([row.std(ddof=1) if row.size > 1 else 0.0 for row in rows])),
            "frac_at_0": float((flat <= 0).mean()),
            "frac_at_1": float((flat >= 1).mean()),
            "topk_changed": changed,
        })
        topks.append(topk)
    for record, topk in zip(stats, topks, strict=True):
        record["final_topk_share"] = float(np.mean([len(a & b) for a, b in zip(topk, topks[-1], strict=True)]) / K)
    return stats


def settled_epoch(stats: list[dict[str, Any]]) -> float | None:
    """The epoch from which on the top-K of every block is the last snapshot's, in the numbers of
    :func:`gate_statistics`: that of the earliest snapshot from which on every ``final_topk_share`` is 1
    (``None`` for no snapshots). Measured at snapshots only; when it is the last snapshot's epoch, the
    top-K changed until the end."""
    settled = None
    for record in reversed(stats):
        if record["final_topk_share"] < 1:
            break
        settled = record["epoch"]
    return settled


def plot_gate_evolution(snapshots: Records, path: str | os.PathLike[str], K: int) -> Path:
    """The real gates over training, against epoch, in three stacked panels (numbers: :func:`gate_statistics`).

    (a) mean ± std of all gate entries and the mean within-row std; (b) the fractions clipped at 0 and at 1;
    (c) the fraction of blocks whose top-K inputs changed since the previous snapshot, and the share of the
    last snapshot's top-K (in a run: the frozen connectivity) that each snapshot's top-K holds.
    """
    path = _figure_path(path)
    stats = gate_statistics(snapshots, K)
    epoch = np.array([s["epoch"] for s in stats])

    def series(key: str) -> np.ndarray:
        return np.array([np.nan if s[key] is None else s[key] for s in stats], dtype=float)

    mean, std = series("mean"), series("std")
    fig = Figure(figsize=(6.0, 7.0), layout="constrained")
    spread, clipped, changed = fig.subplots(3, 1, sharex=True)
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
    changed.set_ylabel(f"top-{K} (fraction)")
    changed.set_xlabel("epoch")
    for ax in (clipped, changed):
        ax.set_ylim(-0.02, 1.02)
    for ax in (spread, clipped, changed):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return _save(fig, path)


# ---------------------------------------------------------------------------- training
#: Axis labels of the trainer's log keys; ``{eval}`` is the evaluation set's name. Other keys label
#: their axis with the key itself.
LOG_LABELS = {
    "test_top1": "{eval} top-1 (%)", "test_top5": "{eval} top-5 (%)", "test_loss": "{eval} loss",
    "train_top1": "train top-1 (%)", "train_loss": "train loss", "lr": "learning rate",
    "gate_mean": "gate mean", "gate_row_std": "gate std within a row", "gate_at_1": "gates at 1 (fraction)",
    "gate_entropy": "sampling entropy", "drawn_distinct": "distinct draws", "drawn_topk_share": "draws = top-K",
}


def axis_label(key: str, eval_set: str = "test") -> str:
    """The axis label of log key ``key``; ``eval_set`` names the data the ``test_*`` values come from
    (``"validation"`` for a run evaluated on a split of the training set)."""
    return LOG_LABELS[key].format(eval=eval_set) if key in LOG_LABELS else key


def _check_eval_set(eval_set: Any) -> None:
    if not isinstance(eval_set, str) or not eval_set.strip():
        raise ConfigError(f"eval_set must be a non-empty name of the evaluation data, e.g. 'test' or "
                          f"'validation', got {eval_set!r}")


def plot_training_curves(
    log: Records | Mapping[str, Records],
    path: str | os.PathLike[str],
    keys: str | Sequence[str] = ("test_top1",),
    eval_set: str = "test",
) -> Path:
    """Per-epoch values of ``keys`` (one panel each) from the trainer's ``log.jsonl``.

    ``log`` is the log's path or its records (dicts with ``"epoch"`` and the keys), or a dict
    label -> log for several runs in one figure, one line per run (e.g. test accuracy per arm). Records
    without a key (e.g. epochs without a test pass) are skipped for that key. ``eval_set`` names the data
    behind the ``test_*`` keys on the axes (the trainer logs every evaluation under ``test_*``; say
    ``"validation"`` for a run evaluated on a held-out split of the training set).
    """
    path = _figure_path(path)
    keys = (keys,) if isinstance(keys, str) else tuple(keys) if isinstance(keys, (list, tuple)) else keys
    if not isinstance(keys, tuple) or not all(isinstance(k, str) for k in keys):
        raise ConfigTypeError(f"keys must be a logged value's name or a list of them, got {keys!r}")
    if not keys:
        raise ConfigError("keys is empty: name at least one logged value to plot, e.g. 'test_top1'")
    _check_eval_set(eval_set)
    if isinstance(log, Mapping):
        if not log:
            raise ConfigError("log is an empty dict: give at least one run (label -> log path or records)")
        runs = {str(label): _records(source, f"log {label!r}") for label, source in log.items()}
    else:
        runs = {"": _records(log, "log")}
    fig = Figure(figsize=(6.0, 2.6 * len(keys) + 0.6), layout="constrained")
    axes = fig.subplots(len(keys), 1, sharex=True, squeeze=False)[:, 0]
    for ax, key in zip(axes, keys, strict=True):
        for label, records in runs.items():
            epochs, values = _series(records, key, f"log {label!r}" if label else "the log")
            ax.plot(epochs, values, marker=".", label=label or key)
        ax.set_ylabel(axis_label(key, eval_set))
        ax.grid(alpha=0.3)
        if len(runs) > 1:
            ax.legend(fontsize=8)
    axes[-1].set_xlabel("epoch")
    return _save(fig, path)


# ---------------------------------------------------------------------------- input
def _records(source: Any, what: str) -> list[Mapping[str, Any]]:
    """The records of a JSONL file or a list of dicts, checked to be a non-empty list of dicts."""
    if isinstance(source, (str, os.PathLike)):
        what = f"{what} file"
        records: list[Any] = read_jsonl(source, what)
        what = f"{what} {str(source)!r}"
    elif isinstance(source, Sequence):
        records = list(source)
    else:
        raise ConfigTypeError(f"{what} must be a JSONL file path or a list of dicts, got {type(source).__name__}")
    if not records:
        raise DataError(f"{what} holds no records")
    for index, record in enumerate(records):
        if not isinstance(record, Mapping):
            raise DataError(f"{what}: record {index} is a {type(record).__name__}, not a dict")
    return records


def _gate_matrices(record: Mapping[str, Any], index: int) -> dict[str, np.ndarray]:
    """The gate matrices of one snapshot record, by module index (as a string), in module order."""
    for key in ("step", "epoch", "gates"):
        if key not in record:
            raise DataError(f"gate snapshot {index} has no {key!r} (keys: {sorted(record)}); expected "
                            "{'step': int, 'epoch': float, 'gates': {'<module>': [[...], ...]}}")
    gates = record["gates"]
    if not isinstance(gates, Mapping) or not gates:
        raise DataError(f"gate snapshot {index}: 'gates' must be a non-empty dict module -> matrix, got {gates!r}")
    try:
        modules = sorted(gates, key=int)
    except (TypeError, ValueError):
        keys = sorted(map(str, gates))
        raise DataError(f"gate snapshot {index}: the keys of 'gates' must be module indices, got {keys}") from None
    matrices = {}
    for module in modules:
        try:
            matrix = np.asarray(gates[module], dtype=float)
        except (TypeError, ValueError):
            raise DataError(f"gate snapshot {index}, module {module}: not a matrix of numbers") from None
        if matrix.ndim != 2 or matrix.size == 0:
            raise DataError(
                f"gate snapshot {index}, module {module}: expected a non-empty 2-D matrix (rows: blocks, "
                f"columns: candidate inputs), got shape {matrix.shape}"
            )
        if not np.isfinite(matrix).all():
            raise DataError(f"gate snapshot {index}, module {module}: gate values must be finite")
        matrices[str(module)] = matrix
    return matrices


def _tie_orders(record: Mapping[str, Any], index: int, matrices: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The ``tie_order`` matrices a snapshot record holds (usually none), checked against its gates."""
    found = record.get("tie_order") or {}
    if not isinstance(found, Mapping):
        raise DataError(f"gate snapshot {index}: 'tie_order' must be a dict module -> matrix, got {found!r}")
    orders = {}
    for module, matrix in found.items():
        order = np.asarray(matrix, dtype=float)
        if str(module) not in matrices or order.shape != matrices[str(module)].shape:
            raise DataError(f"gate snapshot {index}: the tie order of module {module} (shape {order.shape}) does "
                            "not match a gate matrix of the snapshot")
        orders[str(module)] = order
    return orders


def _series(records: Sequence[Mapping[str, Any]], key: str, where: str) -> tuple[list[float], list[float]]:
    epochs, values = [], []
    for index, record in enumerate(records):
        if "epoch" not in record:
            raise DataError(f"{where}: record {index} has no 'epoch' (keys: {sorted(record)})")
        if record.get(key) is not None:
            for name in ("epoch", key):
                if isinstance(record[name], bool) or not isinstance(record[name], (int, float)):
                    raise DataError(f"{where}: record {index} has {name!r} = {record[name]!r}, not a number")
            epochs.append(float(record["epoch"]))
            values.append(float(record[key]))
    if not values:
        present = sorted({k for record in records for k in record})
        raise DataError(f"{where}: no record has {key!r}; keys present: {', '.join(present)}")
    return epochs, values


# ---------------------------------------------------------------------------- output
def _figure_path(path: str | os.PathLike[str]) -> Path:
    path = check_file_path("path", path, "figure.png")
    if not path.suffix:
        return path.with_name(path.name + ".png")
    if path.suffix.lower() not in SUFFIXES:
        raise ConfigError(
            f"cannot write a figure to {str(path)!r}: unsupported suffix {path.suffix!r}; "
            f"allowed: {' '.join(SUFFIXES)} (none: .png)"
        )
    return path


def _save(fig: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_atomic(path, lambda f: fig.savefig(f, format=path.suffix[1:].lower(), dpi=120))
