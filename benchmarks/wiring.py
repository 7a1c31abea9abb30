"""Node graphs: the compiled network against Discovering Neural Wirings' own formulation, written plainly.

DNW computes a static graph with every node's state in one tensor: stage by stage, the stage's nodes run their
operation, and one masked dense 1x1 convolution adds their outputs onto every later node's state.
:class:`MaskedGraph` is that formulation, reading the compiled network's own weights, stages and masks (the
tests hold it to the network's outputs and gradients). ``main`` times a training step of both (forward,
backward, SGD step, median of ``--repeats`` after ``--warmup``, in ``--rounds`` alternating rounds; the ratio is the
median of the rounds') and each one's peak memory, in one run:

    python benchmarks/wiring.py                       # DNW's static graph, 5% of the edges, batch 128
    python benchmarks/wiring.py --gates dnw random --density 0.05 0.2 --json wiring.json
    python benchmarks/wiring.py --masks runs/wiring_masks   # the sigma_conn study's 8 random graphs
    python benchmarks/wiring.py --allocation runs/wiring    # where the learned runs keep their edges

Target: compiled / plain <= 1.15 (forward + backward). Results go in BENCHMARKS.md with the device, date,
command and number of runs.
"""

from __future__ import annotations

import argparse
import collections
import copy
import importlib.util
import json
import platform
import statistics
from datetime import date
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import connlearn
from connlearn.graph import BranchGraph
from connlearn.train.checkpoint import load_checkpoint
from connlearn.wiring import gate_edges


def _speed() -> Any:  # benchmarks/speed.py, by path (benchmarks/ is no package)
    spec = importlib.util.spec_from_file_location("speed", Path(__file__).resolve().parent / "speed.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


class MaskedGraph(nn.Module):
    """DNW's static graph from a compiled node graph ``net`` of one-channel nodes (its stem, node operations,
    gates and head, shared, not copied): ``[B, nodes, H, W]`` states; stage by stage, ``y = op(states of the
    stage)`` and ``states[later] += conv1x1(y, W[later, stage])``, W the dense matrix of the kept edges' weights.
    Under one budget a node no path of kept edges reaches from the stem is switched off, as in the network."""

    def __init__(self, net: connlearn.ConnectivityNet) -> None:
        super().__init__()
        self.net = net
        sizes = [s.branches for s in net.stages]
        self.bounds = [sum(sizes[:i]) for i in range(len(sizes) + 1)]

    def weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The dense matrix of the forward pass (rows: nodes reading, columns: nodes read) and which nodes a
        path of kept edges reaches from the stem."""
        n, b = self.bounds[-1], self.bounds
        first = self.net.stages[-1].block.conv.weight
        w = first.new_zeros(n, n)
        for i, stage in enumerate(self.net.stages):
            if stage.gate is not None:
                w = w.index_put((torch.arange(b[i], b[i + 1]).view(-1, 1), torch.arange(b[i]).view(1, -1)),
                                stage.gate.matrix())
        reached = first.new_zeros(n).index_fill_(0, torch.arange(b[1]), 1.0)
        for i in range(1, len(self.net.stages)):
            hit = (w[b[i]:b[i + 1]].detach() != 0).to(reached.dtype) @ reached > 0
            reached = reached.index_put((torch.arange(b[i], b[i + 1]),), hit.to(reached.dtype))
        return w, reached if self.net.budgeted else torch.ones_like(reached)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w, reached, b = *self.weights(), self.bounds
        h = self.net.stem(x)
        states = torch.cat([h, h.new_zeros(h.shape[0], b[-1] - h.shape[1], *h.shape[2:])], dim=1)
        for i, stage in enumerate(self.net.stages):
            y = stage.block(states[:, b[i]:b[i + 1]]) * reached[b[i]:b[i + 1]].view(1, -1, 1, 1)
            if i + 1 < len(self.net.stages):
                later = F.conv2d(y, w[b[i + 1]:, b[i]:b[i + 1], None, None])
                states = torch.cat([states[:, :b[i + 1]], states[:, b[i + 1]:] + later], dim=1)
        return self.net.head(y)


def allocation(runs: Path) -> None:
    """For every finished ``learned-sS`` run of ``runs``: the share of its kept edges it did not keep at the start
    (its seed's initial graph); then the mean kept edges per pair of stages against the random graph's expectation."""
    counts, names = [], {1: "stem", 2: "s1", 3: "s2", 4: "s3", 5: "s4", 6: "feat"}
    for summary in sorted(runs.glob("learned-s*/summary.json")):
        seed = int(summary.parent.name.rsplit("-s", 1)[1])
        end = BranchGraph.from_json(load_checkpoint(summary.parent / "last.pt")["graph"])
        start = connlearn.build("neural-graph", gate="dnw", density=0.05, seed=seed, num_classes=10).graph()
        kept = [{e for e in gate_edges(g) if g.edges[e]["active"]} for g in (start, end)]
        print(f"- seed {seed}: {len(kept[1] - kept[0]) / len(kept[1]):.3f} of the {len(kept[1])} kept edges are new")
        stages = {n: d["module"] for n, d in end.nodes(data=True) if d["kind"] == "block"}
        counts.append(collections.Counter((stages[u], stages[v]) for u, v in kept[1]))
        candidates = collections.Counter((stages[u], stages[v]) for u, v in gate_edges(end))
        share = len(kept[1]) / len(gate_edges(end))
    print(f"\n| source → target | candidates | random graph (expected) | learned (mean of {len(counts)} runs) | "
          "learned / random |\n| --- | --- | --- | --- | --- |")
    for p in sorted(candidates):
        mean = sum(c[p] for c in counts) / len(counts)
        print(f"| {names[p[0]]} → {names[p[1]]} | {candidates[p]:,} | {candidates[p] * share:.0f} | {mean:.0f} | "
              f"{mean / (candidates[p] * share):.2f} |")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gates", nargs="+", default=["dnw", "random"])
    parser.add_argument("--density", nargs="+", type=float, default=[0.05])
    parser.add_argument("--nodes", nargs="+", type=int, default=[192, 192, 192, 192])
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--rounds", type=int, default=3, help="each measured this many times, alternately")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--masks", metavar="DIR", help="instead, write 8 random graphs at --density's first (seeds "
                        "1000 to 1007) to DIR/maskI.json: the connectivities of the study's sigma_conn")
    parser.add_argument("--allocation", metavar="RUNS", help="instead, print where the finished learned runs of "
                        "RUNS (a compare folder) keep their edges, and how many moved since the start")
    args = parser.parse_args(argv)
    if args.allocation:
        allocation(Path(args.allocation))
        return {}
    if args.masks:
        Path(args.masks).mkdir(parents=True, exist_ok=True)
        for i in range(8):
            net = connlearn.build("neural-graph", gate="random", density=args.density[0], nodes=args.nodes,
                                  seed=1000 + i)
            Path(args.masks, f"mask{i}.json").write_text(net.graph().to_json())
        return {}
    speed, device = _speed(), torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else (
        f"CPU ({platform.machine()}, {torch.get_num_threads()} threads)")
    results = {}
    for gate, density in ((g, d) for g in args.gates for d in args.density):
        net = connlearn.build("neural-graph", gate=gate, density=density, nodes=args.nodes,
                              features=min(100, args.nodes[-1]))
        plain = MaskedGraph(copy.deepcopy(net))
        rounds = [(speed.measure(net, args, memory=r == 0), speed.measure(plain, args, memory=r == 0))
                  for r in range(args.rounds)]  # alternately: a load that comes and goes falls on both
        row = {"compiled": rounds[0][0], "plain": rounds[0][1]}
        for key, at in (("compiled", 0), ("plain", 1)):
            row[key]["step_s"] = statistics.median(r[at]["step_s"] for r in rounds)
        row["ratio"] = {"step": statistics.median(c["step_s"] / p["step_s"] for c, p in rounds)}
        results[f"{gate} {density:g}"] = row
        print(f"{gate} at {density:g}: compiled {row['compiled']['step_s'] * 1e3:.0f} ms, "
              f"{row['compiled']['peak_mb']:.0f} MB; plain masked 1x1 {row['plain']['step_s'] * 1e3:.0f} ms, "
              f"{row['plain']['peak_mb']:.0f} MB; compiled / plain {row['ratio']['step']:.2f}x", flush=True)
    out = {"device": name, "date": date.today().isoformat(), "torch": torch.__version__, "batch": args.batch,
           "nodes": args.nodes, "results": results}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
