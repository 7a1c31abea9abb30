"""The planted control's measures: did the gates find the inputs that carry nothing?

A planted network (``connlearn train --uninformative 5 6 7 8``, the study ``benchmarks/studies/planted/``) has
branches of module 1 that output noise at their own scale; a block of module 2 is best off reading only the
others. For each run folder this prints its top-1, the share of module 2's active inputs that are noise in its
final connectivity (chance: their share of the candidates) and, for learned gates, the snapshot from which on
the top-K of module 2's gates held none of them; ``--png`` draws that share at every gate snapshot.

    connlearn compare --arms benchmarks/studies/planted/planted.toml --seeds 0 1 2 --out runs/planted --parallel 2
    python benchmarks/planted.py runs/planted/*-s* --png docs/results/cpu_planted_share.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from connlearn.files import read_jsonl
from connlearn.graph import BranchGraph
from connlearn.train.checkpoint import load_checkpoint

READER = 2  # the module whose gates choose among module 1's branches


def top_k_share(gates: list[list[float]], K: int, noise: np.ndarray) -> float:
    """The share of the rows' top-K entries that are ``noise`` columns; entries tied at a row's K-th value share
    its remaining places evenly (the gates start tied; a freeze breaks ties by a seeded order, not by index)."""
    shares = []
    for row in np.asarray(gates, dtype=float):
        kth = np.sort(row)[::-1][K - 1]
        above, tied = row > kth, row == kth
        shares.append((noise[above].sum() + (K - above.sum()) * noise[tied].sum() / tied.sum()) / K)
    return float(np.mean(shares))


def measures(folder: Path) -> tuple[dict, float, float, list[tuple[float, float]]]:
    """A run's summary, the noise share of module 2's active inputs at the end and its chance value, and the
    share of module 2's top-K at every gate snapshot, by epoch."""
    summary = json.loads((folder / "summary.json").read_text())
    graph = BranchGraph.from_json(load_checkpoint(folder / "last.pt")["graph"])
    candidates = graph.candidates(READER)
    noise = np.array([bool(graph.nodes[u].get("uninformative")) for u in candidates])
    active = [u for node in graph.branches(READER) for u, _, d in graph.gate_edges(node) if d.get("active")]
    final = sum(bool(graph.nodes[u].get("uninformative")) for u in active) / len(active)
    snaps = read_jsonl(folder / "gates.jsonl") if (folder / "gates.jsonl").is_file() else []
    curve = [(s["epoch"], top_k_share(s["gates"][str(READER)], summary["K"], noise)) for s in snaps]
    return summary, final, float(noise.mean()), curve


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="finished run folders of a planted network")
    parser.add_argument("--png", help="draw the share of noise in module 2's top-K at every snapshot here")
    args = parser.parse_args(argv)
    rows = ["| run | gate | top-1 (last epoch) | noise share of module 2's inputs at the end (chance) "
            "| top-K free of them from epoch | module 1 branches read at the end |", "| --- " * 6 + "|"]
    fig = Figure(figsize=(7, 4))
    ax, colours = fig.add_subplot(), {}
    for folder in args.runs:
        summary, final, chance, curve = measures(folder)
        free = next((e for i, (e, _) in enumerate(curve) if all(v == 0 for _, v in curve[i:])), None)
        rows.append(f"| {folder} | {summary['gate']} | {summary['test_top1']:.2f} | {final:.3f} ({chance:.2f}) | "
                    f"{'–' if free is None else f'{free:.1f}'} | {summary['active_branches']['1']} |")
        arm = folder.name.rsplit("-s", 1)[0]  # the seeds of one arm share a colour and a label
        if curve:
            ax.plot(*zip(*curve, strict=True), color=colours.setdefault(arm, f"C{len(colours)}"),
                    label=None if arm in [line.get_label() for line in ax.lines] else arm)
    text = "\n".join(rows)
    print(text)
    if args.png and colours:
        ax.set_xlabel("epoch (phase 1)")
        ax.set_ylabel("noise share of module 2's top-K")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.png, dpi=120)
    return text


if __name__ == "__main__":
    main()
