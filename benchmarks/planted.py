"""A planted connectivity: can the gates find the inputs that carry nothing?

On CIFAR-10 a learned connectivity, trained again from scratch, is worth no more than a random one (see
BENCHMARKS.md). That leaves two readings: the gates cannot learn which inputs are better, or at these
budgets no connectivity is much better than another. This script plants a connectivity that is much
better, so that the first reading can be tested on its own: it runs ``connlearn train`` with some branches
of the first module made uninformative. Their outputs are replaced by Gaussian noise at the scale of the
output it replaces (its root mean square over the batch, detached), in training and in evaluation, so
they carry nothing about the image. A block of the second module is then best off reading only the
informative branches; a random connectivity gives each block some noise, and a block whose K inputs are
all noise reads nothing of the image. (The replaced blocks get no gradient, so only weight decay and the
shared shortcut move the scale of their noise.)

    python benchmarks/planted.py --uninformative 5 6 7 8 -- --dataset cifar10 --gate topk --K 4 \\
        --out runs/planted/topk4-s0 ...                    # any `connlearn train` options after `--`
    python benchmarks/planted.py --uninformative 5 6 7 8 --oracle -- --gate random --K 4 ...
    python benchmarks/planted.py --report runs/planted/topk4-s0 runs/planted/random4-s0 ... [--png FILE]

- ``--uninformative J ...``: the branches of module 1 (1-based) whose outputs are noise.
- ``--oracle`` (with ``--gate random``): every block of module 2 reads K of the informative branches,
  drawn at random among them from the run's seed (all of them when there are K), the planted answer;
  later modules keep their random connectivity.
- ``--report RUN ...``: train nothing; for each run, the top-1 of its last epoch (on the run's evaluation
  set: the validation split with ``--val-split``), the share of module 2's inputs that are uninformative
  in its connectivity at the end (chance: their share of the branches) and, for learned gates, from which
  snapshot on the top-K held none of them, as a markdown table; ``--png`` draws that share at every gate
  snapshot.

The setting is recorded in the run's folder (``planted.json``) once the network is built; a resumed run
must name the same one, and a folder holding a run that was not planted is refused. A network retrained
from a run's connectivity (``--connectivity RUN/last.pt``) needs the same ``--uninformative``, since the
noise is not part of the saved network (the source run's record is checked when it lies beside the
file). The noise is a change to the library's fused first-module forward made by this script only; a
pruned network (``pruned.pt``) has lost the uninformative blocks that nothing reads and is refused.
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
import connlearn.train.protocol
from connlearn.files import read_jsonl
from connlearn.graph import BranchGraph
from connlearn.net import FusedModule
from connlearn.train.checkpoint import load_checkpoint

FIRST_MODULE = 1  # the module whose branches are planted
READER = 2  # the module whose gates choose among them


def plant_noise(uninformative: list[int], branches: int) -> None:
    """Make the fused engine's first module output noise at the scale of each branch in ``uninformative``
    (1-based), for networks whose first module has ``branches`` branches. Once per process: a second call
    with another setting raises."""
    setting = (tuple(uninformative), branches)
    planted = getattr(FusedModule.forward, "planted", None)
    if planted is not None:
        if planted != setting:
            raise RuntimeError(f"planted.py: the first module already outputs noise for {planted}; "
                               f"cannot plant {setting} in the same process")
        return
    original = FusedModule.forward
    keep = torch.ones(branches)
    keep[[j - 1 for j in uninformative]] = 0.0

    def forward(self: FusedModule, inputs: list[torch.Tensor], mix: torch.Tensor | None) -> torch.Tensor:
        out = original(self, inputs, mix)
        if mix is not None:  # a gated module; the first one alone reads the stem, without a gate mix
            return out
        if self.branches != branches:
            raise RuntimeError(f"planted.py: module 1 has {self.branches} branches here, the plant was made for "
                               f"{branches} (a pruned network?)")
        b, _, h, w = out.shape
        y = out.view(b, branches, self.out_ch, h, w)
        rms = y.detach().float().pow(2).mean(dim=(0, 2, 3, 4), keepdim=True).sqrt().to(y.dtype)
        k = keep.to(device=y.device, dtype=y.dtype).view(1, branches, 1, 1, 1)
        return (y * k + torch.randn_like(y) * rms * (1 - k)).view_as(out)

    forward.planted = setting
    FusedModule.forward = forward


def rewire_oracle(net: connlearn.ConnectivityNet, uninformative: list[int]) -> connlearn.ConnectivityNet:
    """``net`` (a random connectivity) with every block of module 2 reading K informative inputs, drawn at
    random among them from the graph's seed (all of them when there are only K)."""
    graph = net.graph()
    if graph.gate_kind != "random":
        sys.exit(f"planted.py: --oracle needs --gate random, not {graph.gate_kind!r}")
    noise = _noise_sources(graph, uninformative)
    informative = [u for u in graph.candidates(READER) if u not in noise]
    if len(informative) < graph.K:
        sys.exit(f"planted.py: --oracle needs at least K={graph.K} informative branches, there are {len(informative)}")
    rng = np.random.default_rng(graph.seed)
    for node in graph.branches(READER):
        chosen = set(rng.choice(informative, size=graph.K, replace=False).tolist())
        for u, _, d in graph.gate_edges(node):
            d["active"] = u in chosen
    return connlearn.from_graph(graph.validate(), engine=net.engine)


def _noise_sources(graph: BranchGraph, uninformative: list[int]) -> set[str]:
    """The candidate inputs of module 2 that are uninformative branches of module 1."""
    return {u for u in graph.candidates(READER) if graph.nodes[u]["branch"] in uninformative}


def _check_folder(out: Path, setting: dict, connectivity: str | None) -> None:
    record = out / "planted.json"
    if record.is_file():
        if json.loads(record.read_text()) != setting:
            sys.exit(f"planted.py: {out} was started with {record.read_text().strip()}; resume it with the same "
                     "setting")
    elif any((out / name).is_file() for name in ("last.pt", "previous.pt")):
        sys.exit(f"planted.py: {out} holds a run that was not planted; give another --out")
    if connectivity is not None:
        source = Path(connectivity).parent / "planted.json"
        if source.is_file() and json.loads(source.read_text())["uninformative"] != setting["uninformative"]:
            sys.exit(f"planted.py: the connectivity of {connectivity} was learned with {source.read_text().strip()}; "
                     f"give the same --uninformative")


def train(argv: list[str], uninformative: list[int], oracle: bool) -> int:
    from connlearn.cli import main as connlearn_main

    setting = {"uninformative": uninformative, "module": FIRST_MODULE, "oracle": oracle,
               "noise": "Gaussian, at the branch's root mean square over the batch (detached)"}
    protocol = connlearn.train.protocol
    # the library's own, also when an earlier call in this process replaced it
    original = getattr(protocol.build_net, "unplanted", protocol.build_net)

    def build_net(config, train):
        out = Path(config.output)
        _check_folder(out, setting, config.connectivity)
        if oracle and config.connectivity is not None:
            sys.exit("planted.py: --oracle rewires a new random connectivity; it does not take --connectivity")
        net = original(config, train)
        graph = net.graph()
        numbers = [graph.nodes[n]["branch"] for n in graph.branches(FIRST_MODULE)]
        if numbers != list(range(1, len(numbers) + 1)):
            sys.exit(f"planted.py: module 1 holds branches {numbers}, not 1 to {len(numbers)} (a pruned network?); "
                     "the plant numbers the branches of the network as built")
        if max(uninformative) > len(numbers):
            sys.exit(f"planted.py: module 1 has {len(numbers)} branches; --uninformative names {max(uninformative)}")
        if net.engine != "fused":
            sys.exit(f"planted.py: the plant is made in the fused engine; this network runs {net.engine!r}")
        plant_noise(uninformative, len(numbers))
        torch.manual_seed(config.seed)  # the noise comes from the global RNG: seeded by the run, restored by a resume
        if oracle:
            net = rewire_oracle(net, uninformative)
        out.mkdir(parents=True, exist_ok=True)  # the run makes its folder only once this returns
        (out / "planted.json").write_text(json.dumps(setting) + "\n")
        return net

    build_net.unplanted = original
    protocol.build_net = build_net
    return connlearn_main(["train", *argv])


def top_k_share(gates: list[list[float]], K: int, uninformative: list[int]) -> float:
    """The share of the rows' top-K entries that are uninformative columns; entries tied at a row's K-th
    value share its remaining places evenly (the gates start tied, and a freeze breaks ties by a seeded
    order, not by index)."""
    a = np.asarray(gates, dtype=float)
    if not 1 <= K <= a.shape[1]:
        raise ValueError(f"K={K} does not fit rows of {a.shape[1]} gates")
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


def connectivity_share(graph: BranchGraph, uninformative: list[int]) -> tuple[float, float]:
    """The share of module 2's active inputs that are uninformative branches, and its chance value."""
    bad = _noise_sources(graph, uninformative)
    active = [u for node in graph.branches(READER) for u, _, d in graph.gate_edges(node) if d.get("active")]
    return sum(u in bad for u in active) / len(active), len(bad) / len(graph.candidates(READER))


def report(folders: list[str], png: str | None = None) -> str:
    """A markdown table of the planted runs in ``folders``; with ``png``, their share curves drawn there."""
    rows = ["| run | gate | top-1 (last epoch) | uninformative share of module 2's inputs at the end (chance) "
            "| top-K free of them from epoch | module 1 branches read at the end |",
            "| --- | --- | --- | --- | --- | --- |"]
    curves = {}
    for folder in folders:
        path = Path(folder)
        if not (path / "planted.json").is_file():
            sys.exit(f"planted.py: {path} has no planted.json: not a run of this script")
        setting = json.loads((path / "planted.json").read_text())
        bad = setting["uninformative"]
        if not (path / "summary.json").is_file():
            rows.append(f"| {path} | unfinished | | | | |")
            continue
        summary = json.loads((path / "summary.json").read_text())
        share, chance = connectivity_share(BranchGraph.from_json(load_checkpoint(path / "last.pt")["graph"]), bad)
        shares = curves[str(path)] = share_curve(path, summary["K"], bad)
        settled = next((e for i, (e, _) in enumerate(shares) if all(v == 0 for _, v in shares[i:])), None)
        run = summary["run"]  # the gate it trained with; summary["gate"] is the network's at the end ("frozen")
        gate = ("frozen" if run["connectivity"] else run["gate"] or "topk") + (" (oracle)" if setting["oracle"] else "")
        rows.append(f"| {path} | {gate} | {summary['test_top1']:.2f} | {share:.3f} ({chance:.2f}) | "
                    f"{'–' if settled is None else f'{settled:.1f}'} | {summary['active_branches'].get('1')} |")
    if png and any(curves.values()):
        fig = Figure(figsize=(7, 4))
        ax = fig.add_subplot()
        colours: dict[str, str] = {}
        for name, shares in curves.items():
            if not shares:
                continue
            arm = Path(name).name.rsplit("-s", 1)[0]  # the seeds of one arm share a colour and a label
            label = None if arm in colours else arm
            colour = colours.setdefault(arm, f"C{len(colours)}")
            ax.plot(*zip(*shares, strict=True), color=colour, label=label)
        ax.set_xlabel("epoch (phase 1)")
        ax.set_ylabel("uninformative share of module 2's top-K")
        ax.set_ylim(-0.02, max(v for shares in curves.values() for _, v in shares) + 0.05)
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
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    rest = argv[split + 1:]
    if args.report and (args.uninformative or args.oracle or rest):
        parser.error("--report trains nothing: give it run folders only (and --png)")
    if args.png and not args.report:
        parser.error("--png draws a --report")
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
