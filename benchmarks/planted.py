"""A planted connectivity: can the gates find the inputs that carry nothing?

On CIFAR-10 a learned connectivity, trained again from scratch, is worth no more than a random one (see
BENCHMARKS.md). That leaves two readings: the gates cannot learn which inputs are better, or at these
budgets no connectivity is much better than another. This script plants a connectivity that is much
better, so that the first reading can be tested on its own: it runs ``connlearn train`` with some branches
of the first module made uninformative. Their outputs are replaced by Gaussian noise at the branch's own
scale (the root mean square of its output over the batch, detached), in training and in evaluation, so
they carry nothing about the image and their scale follows the other branches'. A block of the second
module is then best off reading only the informative branches; a random connectivity gives each block
some noise, and a block whose K inputs are all noise reads nothing of the image.

    python benchmarks/planted.py --uninformative 5 6 7 8 -- --dataset cifar10 --gate topk --K 4 \\
        --out runs/planted/topk4-s0 ...                    # any `connlearn train` options after `--`
    python benchmarks/planted.py --uninformative 5 6 7 8 --oracle -- --gate random --K 4 ...
    python benchmarks/planted.py --report runs/planted/topk4-s0 runs/planted/random4-s0 ...

- ``--uninformative J ...``: the branches of module 1 (1-based) whose outputs are noise.
- ``--oracle`` (with ``--gate random``): every block of module 2 reads K of the informative branches,
  drawn at random among them (all of them when there are K), the planted answer; later modules keep
  their random connectivity.
- ``--report RUN ...``: train nothing; for each run, the share of module 2's top-K inputs that are
  uninformative after each gate snapshot (chance: their share of the branches), at the end of phase 1,
  and the validation top-1, as a markdown table.

The setting is recorded in the run's folder (``planted.json``); a resumed run must name the same one. A
network retrained from a run's connectivity (``--connectivity RUN/last.pt``) needs the same
``--uninformative``, since the noise is not part of the saved network. The noise is a change to the
library's first-module forward made by this script only, for the module-1 layout of the run; the pruned
network a run writes (``pruned.pt``) has lost the uninformative blocks that nothing reads, and is not
meant to be evaluated with this script.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
from matplotlib.figure import Figure

import connlearn
import connlearn.experiment
from connlearn.compile import FusedModule
from connlearn.train import read_jsonl

FIRST_MODULE = 1  # the module whose branches are planted
READER = 2  # the module whose gates choose among them


def plant_noise(uninformative: list[int], branches: int) -> None:
    """Make the fused engine's first module output noise at the scale of each branch in ``uninformative``
    (1-based), for networks whose first module has ``branches`` branches."""
    if getattr(FusedModule._first, "planted", False):
        return
    original = FusedModule._first
    keep = torch.ones(branches)
    keep[[j - 1 for j in uninformative]] = 0.0

    def first(self: FusedModule, stem: torch.Tensor) -> torch.Tensor:
        out = original(self, stem)
        if self.branches != branches:
            raise RuntimeError(f"planted.py: module 1 has {self.branches} branches here, the plant was made for "
                               f"{branches} (a pruned network?)")
        b, _, h, w = out.shape
        y = out.view(b, branches, self.out_ch, h, w)
        rms = y.detach().pow(2).mean(dim=(0, 2, 3, 4), keepdim=True).sqrt()
        k = keep.to(device=y.device, dtype=y.dtype).view(1, branches, 1, 1, 1)
        return (y * k + torch.randn_like(y) * rms * (1 - k)).view_as(out)

    first.planted = True
    FusedModule._first = first


def rewire_oracle(net: connlearn.ConnectivityNet, uninformative: list[int]) -> connlearn.ConnectivityNet:
    """``net`` (a random connectivity) with every block of module 2 reading K informative inputs, drawn at
    random among them from the graph's seed (all of them when there are only K)."""
    graph = net.graph()
    if graph.gate_kind != "random":
        sys.exit(f"planted.py: --oracle needs --gate random, not {graph.gate_kind!r}")
    sources = graph.candidates(READER)
    informative = [u for u in sources if graph.nodes[u]["branch"] not in uninformative]
    if len(informative) < graph.K:
        sys.exit(f"planted.py: --oracle needs at least K={graph.K} informative branches, there are {len(informative)}")
    rng = np.random.default_rng(graph.graph.get("seed", 0))
    for node in graph.branches(READER):
        chosen = set(rng.choice(informative, size=graph.K, replace=False).tolist())
        for u, _, d in graph.gate_edges(node):
            d["active"] = u in chosen
    return connlearn.from_graph(graph.validate(), engine=net.engine)


def train(argv: list[str], uninformative: list[int], oracle: bool) -> int:
    from connlearn.cli import main as connlearn_main

    if "--out" not in argv:
        sys.exit("planted.py: give --out, the run's folder, among the `connlearn train` options")
    out = Path(argv[argv.index("--out") + 1])
    setting = {"uninformative": uninformative, "module": FIRST_MODULE, "oracle": oracle,
               "noise": "Gaussian, at the branch's root mean square over the batch (detached)"}
    record = out / "planted.json"
    if record.is_file() and json.loads(record.read_text()) != setting:
        sys.exit(f"planted.py: {out} was started with {record.read_text().strip()}; resume it with the same setting")
    out.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps(setting) + "\n")

    original = connlearn.experiment.build_net

    def build_net(run, num_classes):
        net = original(run, num_classes)
        branches = len(net.graph().branches(FIRST_MODULE))
        if max(uninformative) > branches:
            sys.exit(f"planted.py: module 1 has {branches} branches; --uninformative names {max(uninformative)}")
        if net.engine != "fused":
            sys.exit(f"planted.py: the plant is made in the fused engine; this network runs {net.engine!r}")
        plant_noise(uninformative, branches)
        return rewire_oracle(net, uninformative) if oracle else net

    connlearn.experiment.build_net = build_net
    return connlearn_main(["train", *argv])


def top_k_share(gates: list[list[float]], K: int, uninformative: list[int]) -> float:
    """The share of the rows' top-K entries that are uninformative columns; entries tied at a row's K-th
    value share its remaining places evenly (the gates start tied, and a freeze breaks ties by a seeded
    order, not by index)."""
    a = np.asarray(gates, dtype=float)
    bad = np.isin(np.arange(1, a.shape[1] + 1), uninformative)
    shares = []
    for row in a:
        kth = np.sort(row)[::-1][K - 1]
        above, tied = row > kth, row == kth
        places = K - above.sum()
        shares.append((bad[above].sum() + places * bad[tied].sum() / tied.sum()) / K)
    return float(np.mean(shares))


def share_curve(folder: Path, K: int, uninformative: list[int]) -> list[tuple[float, float]]:
    """(epoch, uninformative share of module 2's top-K) at every gate snapshot of the run in ``folder``."""
    snaps = read_jsonl(folder / "gates.jsonl") if (folder / "gates.jsonl").is_file() else []
    return [(s["epoch"], top_k_share(s["gates"][str(READER)], K, uninformative)) for s in snaps]


def report(folders: list[str], png: str | None = None) -> str:
    """A markdown table of the planted runs in ``folders``; with ``png``, their share curves drawn there."""
    rows = ["| run | gate | top-1 (last epoch) | uninformative share of module 2's top-K at the end of phase 1 "
            "(chance) | from epoch on at 0 | module 1 branches read at the end |",
            "| --- | --- | --- | --- | --- | --- |"]
    curves = {}
    for folder in folders:
        path = Path(folder)
        setting = json.loads((path / "planted.json").read_text())
        bad = setting["uninformative"]
        if not (path / "summary.json").is_file():
            rows.append(f"| {path.name} | unfinished | | | | |")
            continue
        summary = json.loads((path / "summary.json").read_text())
        shares = curves[path.name] = share_curve(path, summary["K"], bad)
        C = len(read_jsonl(path / "gates.jsonl")[0]["gates"][str(READER)][0]) if shares else None
        end = f"{shares[-1][1]:.3f} ({len(bad) / C:.2f})" if shares else "fixed"
        settled = next((e for i, (e, _) in enumerate(shares) if all(v == 0 for _, v in shares[i:])), None)
        gate = summary["gate"] + (" (oracle)" if setting["oracle"] else "")
        rows.append(f"| {path.name} | {gate} | {summary['test_top1']:.2f} | {end} | "
                    f"{'–' if settled is None else f'{settled:.1f}'} | {summary['active_branches'].get('1')} |")
    if png and any(curves.values()):
        fig = Figure(figsize=(7, 4))
        ax = fig.add_subplot()
        colours: dict[str, str] = {}
        for name, shares in curves.items():
            if not shares:
                continue
            arm = name.rsplit("-s", 1)[0]  # the seeds of one arm share a colour and a label
            label = None if arm in colours else arm
            colour = colours.setdefault(arm, f"C{len(colours)}")
            ax.plot(*zip(*shares, strict=True), color=colour, label=label)
        ax.set_xlabel("epoch (phase 1)")
        ax.set_ylabel("uninformative share of module 2's top-K")
        ax.set_ylim(-0.02, 0.6)
        ax.legend()
        fig.tight_layout()
        fig.savefig(png, dpi=120)
    return "\n".join(rows)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--uninformative", type=int, nargs="+", metavar="J",
                        help="branches of module 1 (1-based) whose outputs are noise")
    parser.add_argument("--oracle", action="store_true",
                        help="with --gate random: module 2 reads only informative branches")
    parser.add_argument("--report", nargs="+", metavar="RUN", help="train nothing: report these planted runs")
    parser.add_argument("--png", help="with --report: draw the runs' share curves in this file")
    own, _, rest = (argv[: argv.index("--")], "--", argv[argv.index("--") + 1:]) if "--" in argv else (argv, "", [])
    args = parser.parse_args(own)
    if args.report:
        print(report(args.report, args.png))
        return 0
    if not args.uninformative:
        parser.error("give --uninformative J ... (and the `connlearn train` options after --), or --report RUN ...")
    if min(args.uninformative) < 1 or len(set(args.uninformative)) != len(args.uninformative):
        parser.error(f"--uninformative takes distinct branch numbers from 1, got {args.uninformative}")
    return train(rest, sorted(args.uninformative), args.oracle)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
