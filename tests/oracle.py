"""The laws' oracle: a ConnectivityNet's function computed branch by branch, with plain loops, from copies of its
weights (each branch's block through ``select([j])``): one module per branch, one weighted sum per block."""

import copy

import torch
from torch import nn

from connlearn.net import FusedModule, NodeModule


class BranchModule(nn.Module):
    """One block per branch; inputs and outputs are lists of ``[B, ch, *S]``. The nodes of a node graph read
    the plain weighted sum and have no shortcut; the first stage's node j reads the stem's j-th channels."""

    def __init__(self, stage):
        super().__init__()
        self.blocks = nn.ModuleList(stage.block.select([j]) for j in range(stage.branches))
        self.proj, self.gate = copy.deepcopy(stage.proj), copy.deepcopy(stage.gate)
        self.nodes, self.ch = isinstance(stage, NodeModule), stage.in_ch

    def forward(self, inputs, mix):
        if mix is None and self.nodes:
            return [block(inputs[0][:, j * self.ch:(j + 1) * self.ch]) for j, block in enumerate(self.blocks)]
        if mix is None:
            short = inputs[0] if self.proj is None else self.proj(inputs[0])
            return [short + block(inputs[0]) for block in self.blocks]

        def w(j, k):  # a weight, or a weight per example ([B, C, N] mixes)
            return mix[j, k] if mix.dim() == 2 else mix[:, j, k].view(-1, *[1] * (inputs[0].dim() - 1))

        sums = [sum((w(j, k) * y for k, y in enumerate(inputs[1:], 1)), w(j, 0) * inputs[0])
                for j in range(len(self.blocks))]
        if self.nodes:
            return [block(x) for block, x in zip(self.blocks, sums, strict=True)]
        xs = [x.relu() for x in sums]
        if self.proj is None:
            shorts = xs
        elif self.training:  # one call: its batch norm sees every branch's batch, as the network's does
            shorts = list(self.proj(torch.cat(xs)).chunk(len(xs)))
        else:
            shorts = [self.proj(x) for x in xs]
        return [s + block(x) for s, block, x in zip(shorts, self.blocks, xs, strict=True)]


class Oracle(nn.Module):
    """``net``'s function from copies of its weights, gates and mode; ``forward(x, drawn)`` takes the draw of
    the network's last training pass (``net.last_draw``), so both compute with the same connectivity. ResNeXt's
    single stream has no branches: its modules are copied whole."""

    def __init__(self, net):
        super().__init__()
        self.stem, self.head = copy.deepcopy(net.stem), copy.deepcopy(net.head)
        self.stages = nn.ModuleList(BranchModule(s) if isinstance(s, FusedModule) else copy.deepcopy(s)
                                    for s in net.stages)
        self.sources, self.K, self.budgeted, self.nodes = net._sources, net.K, net.budgeted, net.node_graph
        self.train(net.training)

    def forward(self, x, drawn=None):
        h, outputs, reached = self.stem(x), [], []
        for i, (stage, plan) in enumerate(zip(self.stages, self.sources, strict=True)):
            picked = [outputs[pos] if chosen is None else [outputs[pos][c] for c in chosen] for pos, chosen in plan]
            inputs = [y for ys in picked for y in ys] if plan else [h]
            mix = None if stage.gate is None else stage.gate.matrix((drawn or {}).get(i)) / (
                self.K if stage.gate.averaged else 1)
            out = stage(inputs, mix)
            out = out if isinstance(out, list) else [out]
            if self.budgeted:  # a block no path of kept edges reaches from the stem is switched off
                froms = [r for pos, chosen in plan for c, r in enumerate(reached[pos]) if chosen is None or c in chosen]
                reach = [mix is None or any(mix[j, k] != 0 and froms[k] for k in range(len(froms)))
                         for j in range(len(out))]
                out = [y if r else y * 0 for y, r in zip(out, reach, strict=True)]
                reached.append(reach)
            outputs.append(out)
        if self.nodes:
            return self.head(torch.cat(outputs[-1], dim=1))
        return self.head(torch.stack(outputs[-1], dim=1).mean(dim=1).relu())

    def grad_of(self, net, name):
        """The oracle's gradient of ``net``'s parameter ``name``: the branches' ones stacked along dim 0."""
        grads = dict((n, p.grad) for n, p in self.named_parameters())
        if ".block." not in name:
            return grads[name]
        pos, suffix = int(name.split(".")[1]), name.split(".block.", 1)[1]
        if suffix.startswith("branch_modules."):  # a module whose blocks differ: one module per branch already
            j, rest = suffix.removeprefix("branch_modules.").split(".", 1)
            return grads[f"stages.{pos}.blocks.{j}.branch_modules.0.{rest}"]
        parts = [grads[f"stages.{pos}.blocks.{j}.{suffix}"] for j in range(net.stages[pos].branches)]
        return None if parts[0] is None else torch.cat(parts)
