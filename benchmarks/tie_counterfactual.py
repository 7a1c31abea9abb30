"""What a finished run would have frozen with the seeded tie order of today's networks.

A run's checkpoint keeps the real gate values it froze (``FrozenGate.gate_values``). This ranks them again,
equal gates by the tie order that ``resnext`` now draws from the run's seed (module by module), and compares
the two connectivities: how many rows had gates tied across the top-K boundary, the input overlap, the
dead blocks and the parameters left after pruning, "as frozen" (the index order, for runs from before the
seeded order) and under the seeded order. The checkpoints this connlearn reads (version 2) were all frozen
with the seeded order, so for them the two agree: what is left is a check of that.

    python benchmarks/tie_counterfactual.py runs/sweep30/topk4-s0/last.pt ...
"""

from __future__ import annotations

import argparse
import statistics

import torch

from connlearn.gates import random_tie_order, tie_generator, topk_mask
from connlearn.graph import dead_blocks, input_overlap
from connlearn.net import ConnectivityNet
from connlearn.prune import prune_dead_blocks
from connlearn.train.checkpoint import net_from_checkpoint


def measure(net: ConnectivityNet) -> tuple[float, int, int]:
    """Mean input overlap, dead blocks, parameters after pruning."""
    graph = net.graph()
    _, report = prune_dead_blocks(net)
    return statistics.mean(input_overlap(graph).values()), len(dead_blocks(graph)), report.params_after


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoints", nargs="+", help="last.pt of runs whose connectivity was frozen")
    for path in parser.parse_args(argv).checkpoints:
        net = net_from_checkpoint(path)
        K, gated = net.K, [s.gate for s in net.stages if s.gate is not None]
        tied = sum(int((v[:, K - 1] == v[:, K]).sum()) for v in
                   (torch.sort(g.gate_values, dim=-1, descending=True).values for g in gated))
        rows = sum(g.gate_values.shape[0] for g in gated)
        before = measure(net)
        ties = tie_generator(net.graph().seed)
        for gate in gated:  # module by module, as the topology draws them
            gate.mask.copy_(topk_mask(gate.gate_values, K, random_tie_order(*gate.gate_values.shape, ties)))
        after = measure(net)
        print(f"{path}: rows tied across the top-K boundary {tied} of {rows}; "
              f"as frozen: overlap {before[0]:.3f}, dead blocks {before[1]}, parameters {before[2]:,}; "
              f"seeded order: overlap {after[0]:.3f}, dead blocks {after[1]}, parameters {after[2]:,}")


if __name__ == "__main__":
    main()
