"""ConnectivityNet: a BranchGraph compiled into a trainable ``nn.Module``.

Module i, with C_i branches reading the outputs y_k of its candidate sources through gate matrix G::

    x_j = ReLU( (1/K) · Σ_k G_jk · y_k )          first module: x_j = the stem's output for every branch
    y_j = P(x_j) + F_j(x_j)                       P: identity, or one 1x1 conv + BN per module, shared
    logits = Linear( avgpool( ReLU( (1/C_M) · Σ_k y_k ) ) )

One engine: a module's activations are one tensor ``[B, C·ch, *S]`` (branch-major channels), the gate mix
is one batched matmul over the branch axis and the blocks are batched over branches (grouped convolutions); a
module whose blocks differ (kernels 1, 3, 5) runs them in a loop (a :class:`~connlearn.blocks.LoopedBlock`).
Where the gate kind reads every input as one stream (``full``) and the block kind has a ``single_stream``
form (the bottleneck), the compiler emits the genuine ResNeXt, ``y = ReLU(P(x) + F(x))`` with a grouped 3x3
convolution. The tests compute the same function branch by branch, with plain loops (their oracle).
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any, cast

import torch
import torch.distributed as dist
import torch.utils.checkpoint
from torch import nn

from connlearn.blocks import BLOCKS, BranchBlock, LoopedBlock, block_dims, conv, norm
from connlearn.errors import CheckpointError, ConfigError
from connlearn.gates import GATES, EdgeWeights, FrozenGate, Gate, draw_generator, random_tie_order, tie_generator
from connlearn.graph import BranchGraph, ModulePlan, input_shape
from connlearn.wiring import budget, gate_class


def mix_branches(inputs: list[torch.Tensor], mix: torch.Tensor, ch: int, relu: bool = True) -> torch.Tensor:
    """``ReLU(mix @ y)`` (without the ReLU where not ``relu``) over the branch axis: inputs ``[B, N_s·ch, *S]``
    (N = Σ N_s branches; S the spatial shape: ``H, W``, ``L`` or none), ``mix`` ``[C, N]`` (or ``[B, C, N]``: a
    connectivity per example) → ``[B, C·ch, *S]``, in the inputs' memory format: one GEMM (batched for a
    connectivity per example)."""
    b, spatial = inputs[0].shape[0], inputs[0].shape[2:]
    c, n = mix.shape[-2:]
    if mix.dim() == 2 and inputs[0].dim() == 4 and inputs[0].is_contiguous(memory_format=torch.channels_last) and (
            not inputs[0].is_contiguous()):
        h, w = spatial
        parts = [t.permute(0, 2, 3, 1).reshape(b * h * w, t.shape[1] // ch, ch) for t in inputs]
        y = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
        x = torch.bmm(mix.to(y.dtype).expand(y.shape[0], c, n), y)
        return (x.relu() if relu else x).reshape(b, h, w, c * ch).permute(0, 3, 1, 2)
    parts = [t.reshape(b, t.shape[1] // ch, ch * math.prod(spatial)) for t in inputs]
    y = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
    if mix.dim() == 2:  # one GEMM over the batch: [C, N] @ [N, B·ch·S]
        k = y.shape[2]
        x = (mix.to(y.dtype) @ y.transpose(0, 1).reshape(n, b * k)).reshape(c, b, k).transpose(0, 1)
    else:
        x = torch.bmm(mix.to(y.dtype), y)
    return (x.relu() if relu else x).reshape(b, c * ch, *spatial)


def replace_by_noise(y: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """``y`` ``[B, C, ch, *S]`` with the branches where ``noise`` (``[C]`` bool) is set replaced by Gaussian noise
    (the global RNG) at each one's root mean square over the batch, detached: outputs that carry nothing."""
    rms = y.detach().float().pow(2).mean(dim=(0, *range(2, y.dim())), keepdim=True).sqrt().to(y.dtype)
    return torch.where(noise.view(1, -1, *[1] * (y.dim() - 2)), torch.randn_like(y) * rms, y)


def _layer(dims: int, in_ch: int, out_ch: int, kernel: int, stride: int) -> nn.Module:
    """The blocks' one-branch :func:`~connlearn.blocks.conv` over ``dims`` (0: a linear map of vectors),
    Kaiming-normal (fan-out, ReLU)."""
    layer = conv(in_ch, out_ch, kernel, 1, stride=stride, dims=dims)
    nn.init.kaiming_normal_(cast(torch.Tensor, layer.weight), mode="fan_out", nonlinearity="relu")
    return layer


class Stem(nn.Sequential):
    """Input convolution → BN → ReLU (→ 3-wide max-pool, stride 2); over signals or, for vectors, a linear map."""

    def __init__(self, in_ch: int, out_ch: int, kernel: int, stride: int, maxpool: bool, dims: int = 2) -> None:
        pool = (nn.MaxPool1d if dims == 1 else nn.MaxPool2d)(3, stride=2, padding=1) if maxpool else nn.Identity()
        super().__init__(OrderedDict(conv=_layer(dims, in_ch, out_ch, kernel, stride), bn=norm(out_ch, dims),
                                     relu=nn.ReLU(inplace=True), pool=pool))


class Projection(nn.Sequential):
    """The shortcut P where the shape changes: one 1x1 conv (stride) + BN, shared by a module's branches."""

    def __init__(self, in_ch: int, out_ch: int, stride: int, dims: int = 2) -> None:
        super().__init__(_layer(dims, in_ch, out_ch, 1, stride), norm(out_ch, dims))


class Head(nn.Module):
    """Global average pooling (over whatever spatial axes there are) and a linear classifier."""

    def __init__(self, in_ch: int, num_classes: int) -> None:
        super().__init__()
        self.fc = nn.Linear(in_ch, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.flatten(2).mean(-1) if x.dim() > 2 else x)


class FusedModule(nn.Module):
    """All branches of a module as one tensor ``[B, C·ch, H, W]``."""

    noise: torch.Tensor | None

    def __init__(self, block: nn.Module, proj: nn.Module | None, gate: Gate | None, in_ch: int, out_ch: int,
                 branches: int) -> None:
        super().__init__()
        self.block, self.proj, self.gate = block, proj, gate
        self.in_ch, self.out_ch, self.branches = in_ch, out_ch, branches
        self.register_buffer("noise", None, persistent=False)  # [C] bool: module 1's uninformative branches

    def forward(self, inputs: list[torch.Tensor], mix: torch.Tensor | None) -> torch.Tensor:
        c, ch = self.branches, self.in_ch
        if mix is None:  # the first module: every branch reads the stem, whose shortcut is computed once
            b, spatial = inputs[0].shape[0], inputs[0].shape[2:]
            x = inputs[0].unsqueeze(1).expand(b, c, ch, *spatial).reshape(b, c * ch, *spatial)
            out = self.block(x)
            short = inputs[0] if self.proj is None else self.proj(inputs[0])
            after = short.shape[2:]
            y = out.reshape(b, c, self.out_ch, *after) + short.unsqueeze(1)
            return (y if self.noise is None else replace_by_noise(y, self.noise)).reshape(b, c * self.out_ch, *after)
        x = mix_branches(inputs, mix, ch)
        b, spatial = x.shape[0], x.shape[2:]
        out = self.block(x)
        if self.proj is None:
            return x + out
        short = self.proj(x.reshape(b * c, ch, *spatial))
        return short.reshape(b, c * self.out_ch, *short.shape[2:]) + out


class SingleStreamModule(nn.Module):
    """The genuine ResNeXt module: ``ReLU(P(x) + F(x))``, F the aggregated residual function (one branch wide)."""

    branches = 1

    def __init__(self, body: nn.Module, proj: nn.Module | None) -> None:
        super().__init__()
        self.body, self.proj = body, proj
        self.gate: Gate | None = None

    def forward(self, inputs: list[torch.Tensor], mix: torch.Tensor | None) -> torch.Tensor:
        short = inputs[0] if self.proj is None else self.proj(inputs[0])
        return (short + self.body(inputs[0])).relu()


class NodeModule(FusedModule):
    """A stage of a node graph (graph attribute ``node_graph``) as one tensor: node j computes
    ``F_j(Σ_k G_jk y_k)``, with no ReLU before its block (which starts with its own norm and ReLU) and no
    shortcut; in the first stage, node j reads the stem's channels ``j·ch .. (j+1)·ch - 1``."""

    def forward(self, inputs: list[torch.Tensor], mix: torch.Tensor | None) -> torch.Tensor:
        return self.block(inputs[0] if mix is None else mix_branches(inputs, mix, self.in_ch, relu=False))


Stage = FusedModule | SingleStreamModule


class ConnectivityNet(nn.Module):
    """A multi-branch network compiled from a :class:`BranchGraph`: ``[B, in_channels, H, W]`` images →
    ``[B, num_classes]`` logits.

    In training mode a stochastic gate kind (``topk``) draws every module's connectivity once per forward
    pass, in one batched call, from the network's own CPU generator (seeded from the graph's seed and saved
    in ``state_dict``): checkpoints resume the same draws and DDP's ranks draw alike. ``sample_temperature``
    (1: the paper's) sharpens the draws below 1. In eval mode the connectivity is each block's top-K.
    ``activation_checkpointing`` recomputes each module in the backward pass, with the forward pass's draw.
    """

    def __init__(self, graph: BranchGraph) -> None:
        super().__init__()
        plans, inp, out = graph.validate().plan(), graph.nodes["input"], graph.nodes["output"]
        self.input_size, self.dims = input_shape(inp), len(input_shape(inp))
        self._graph, self.K, self.gate_kind = copy.deepcopy(graph), graph.K, graph.gate_kind
        self.in_channels, self.num_classes = inp["in_channels"], out["num_classes"]
        self.module_ids, self._sources = [p.module for p in plans], [p.sources for p in plans]
        self.stem = Stem(inp["in_channels"], inp["out_channels"], **inp["stem"], dims=self.dims)
        single = _single_stream(graph.gate_kind, plans)
        self.stages = cast("list[Stage]", nn.ModuleList(_stage(p, graph, self.dims, single) for p in plans))
        noise = [bool(graph.nodes[n].get("uninformative")) for n in graph.branches(self.module_ids[0])]
        if any(noise):  # planted control: these branches of module 1 output noise (topology option uninformative)
            self.stages[0].noise = torch.tensor(noise)
        self.head = Head(out["in_channels"], out["num_classes"])
        self.node_graph = bool(graph.graph.get("node_graph"))
        shared, count = [g for _, g in self.gates()], budget(graph)
        self.budgeted = count is not None
        if count is not None:  # one budget over the network
            for gate in shared:
                gate.share(shared, count)
        self.generator = draw_generator(graph.seed)
        ties = tie_generator(graph.seed)
        for plan, stage in zip(plans, self.stages, strict=True):
            order = None if stage.gate is None else stage.gate.ties()
            if order is not None:  # the graph's ties; a graph without them: from the seed
                rows, cols = order.shape
                order.copy_(random_tie_order(rows, cols, ties) if plan.ties is None else torch.tensor(plan.ties))
        self.sample_temperature = 1.0
        self.activation_checkpointing = False
        self.last_draw: dict[int, torch.Tensor] = {}  # the latest training draw, by stage position
        self._hold: list[dict[int, torch.Tensor]] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # the draw runs eagerly, first: under torch.compile the rest of the pass is one graph
        drawn = self._draw(x.shape[0]) if self.training and self.stochastic else {}
        mixes = self._mixes(drawn)
        on = self._reached(mixes) if self.budgeted else [None] * len(mixes)
        h = self.stem(x)
        outputs: list[torch.Tensor] = []
        for stage, plan, mix, live in zip(self.stages, self._sources, mixes, on, strict=True):
            inputs = [h] if not plan else [_pick(outputs[pos], chosen, stage) for pos, chosen in plan]
            if self.activation_checkpointing and torch.is_grad_enabled():
                out = torch.utils.checkpoint.checkpoint(_Recomputable(stage), inputs, mix, use_reentrant=False)
            else:
                out = stage(inputs, mix)
            if live is not None:
                out = out * live.to(out.dtype).repeat_interleave(out.shape[1] // live.numel()).view(
                    1, -1, *[1] * (out.dim() - 2))
            outputs.append(out)
        last, c = outputs[-1], self.stages[-1].branches
        if self.node_graph:  # the last stage's nodes side by side
            return self.head(last)
        return self.head(last.reshape(last.shape[0], c, last.shape[1] // c, *last.shape[2:]).mean(dim=1).relu())

    def _mixes(self, drawn: dict[int, torch.Tensor]) -> list[torch.Tensor | None]:
        """Every stage's matrix of this pass (None: it reads the stem), each gate kind's in one call."""
        mixes: list[torch.Tensor | None] = [None] * len(self.stages)
        at = {i: s.gate for i, s in enumerate(self.stages) if s.gate is not None}
        for cls in dict.fromkeys(type(g) for g in at.values()):
            index = [i for i, g in at.items() if type(g) is cls]
            matrices = cls.matrices([at[i] for i in index], [drawn.get(i) for i in index])
            for i, m in zip(index, matrices, strict=True):
                mixes[i] = m / (self.K if at[i].averaged else 1)
        return mixes

    def _reached(self, mixes: list[torch.Tensor | None]) -> list[torch.Tensor]:
        """Under one budget, which blocks a path of kept edges reaches from the stem (``[C_i]``, 1 or 0, without
        autograd history): the others read nothing and are switched off (their outputs are 0), so that no batch
        norm normalises a constant."""
        reached: list[torch.Tensor] = []
        for stage, plan, mix in zip(self.stages, self._sources, mixes, strict=True):
            if mix is None:
                reached.append(torch.ones(stage.branches, device=self.head.fc.weight.device))
                continue
            sources = torch.cat([reached[pos] if chosen is None else reached[pos][chosen] for pos, chosen in plan])
            reached.append(((mix.detach() != 0).to(sources.dtype) @ sources > 0).to(sources.dtype))
        return reached

    @torch._disable_dynamo
    def _draw(self, batch: int) -> dict[int, torch.Tensor]:
        if self._hold:
            if any(d.dim() == 3 and d.shape[0] != batch for d in self._hold[0].values()):
                raise ConfigError(f"a held draw of one connectivity per example holds {batch} examples' no more: "
                                  "give every micro-batch inside hold_draw() the size of the first")
            return self._hold[0]
        if torch._C._current_graph_task_id() != -1:  # a forward pass inside a backward pass: a recomputation
            raise ConfigError("a training forward pass ran in a backward pass (torch.utils.checkpoint around the "
                              "network?): it would draw another connectivity; set net.activation_checkpointing = "
                              "True, or run forward and backward inside `with net.hold_draw():`")
        # keyed by stage position, not by gate: torch.compile would guard on each gate object
        at = {i: s.gate for i, s in enumerate(self.stages) if s.gate is not None and s.gate.stochastic}
        rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
        drawn: dict[int, torch.Tensor] = {}
        for cls in dict.fromkeys(type(g) for g in at.values()):
            index = [i for i, g in at.items() if type(g) is cls]
            draws = cls.draw([at[i] for i in index], self.generator, self.sample_temperature, batch * world)
            # a draw per example ([B, rows, cols]) is of the global batch under DDP: this rank's examples
            drawn.update((i, d[rank * batch:(rank + 1) * batch] if d.dim() == 3 else d)
                         for i, d in zip(index, draws, strict=True))
        if self._hold is not None:
            self._hold.append(drawn)
        self.last_draw = drawn
        return drawn

    @contextlib.contextmanager
    def hold_draw(self) -> Iterator[ConnectivityNet]:
        """Within the block every training forward pass uses the first one's draw: for gradient accumulation
        over the micro-batches of one step (the paper draws once per mini-batch)."""
        if self._hold is not None:
            yield self
            return
        self._hold = []
        try:
            yield self
        finally:
            self._hold = None

    # ------------------------------------------------------------------------------------------ queries
    def gates(self) -> Iterator[tuple[int, Gate]]:
        """``(module index, gate)`` of every module with gates."""
        for module, stage in zip(self.module_ids, self.stages, strict=True):
            if stage.gate is not None:
                yield module, stage.gate

    @property
    def stochastic(self) -> bool:
        """Whether training forward passes draw the connectivity."""
        return any(g.stochastic for _, g in self.gates())

    @property
    def fixed_connectivity(self) -> bool:
        """Whether no gate is learned or drawn (``frozen``, ``random``, ``full``): freeze has nothing to do."""
        return not any(g.learnable or g.stochastic for _, g in self.gates())

    @property
    def weighted(self) -> bool:
        """Whether a gate weights its inputs by its values (unfrozen ``real``) rather than selecting K of them."""
        return any(g.weighted for _, g in self.gates())

    def surrogate_loss(self, losses: torch.Tensor) -> torch.Tensor:
        """The term to add to the loss for gate kinds whose gradient needs the loss itself (``score``): given
        the per-example losses ``[B]`` of the last training forward pass; 0 for every other kind."""
        terms = [cast(Gate, self.stages[i].gate).surrogate(d, losses) for i, d in self.last_draw.items()]
        return sum(terms, losses.new_zeros(()))

    def gate_parameters(self) -> list[nn.Parameter]:
        """The learnable gates: their own param group (own lr, no weight decay)."""
        return [p for _, g in self.gates() for p in g.real_parameters()]

    def weight_parameters(self) -> list[nn.Parameter]:
        """Every parameter that is not a gate."""
        gates = {id(p) for p in self.gate_parameters()}
        return [p for p in self.parameters() if id(p) not in gates]

    def no_weight_decay(self) -> set[str]:
        """The names of the gates in ``named_parameters()``, for optimizer builders that ask (timm's)."""
        gates = {id(p) for p in self.gate_parameters()}
        return {name for name, p in self.named_parameters() if id(p) in gates}

    def num_parameters(self, gates: bool = False) -> int:
        """Trainable parameters, without the gates unless ``gates``; a fixed set of edge weights (a random graph, a
        frozen ``dnw``) counts its kept edges: the others are multiplied by 0 and never train."""
        unread = sum(int((~g.mask).sum()) for _, g in self.gates() if isinstance(g, EdgeWeights))
        return sum(p.numel() for p in (self.parameters() if gates else self.weight_parameters())) - unread

    def connectivity(self) -> dict[int, torch.Tensor]:
        """The evaluation connectivity: module → boolean ``[C_i, N_i]`` (columns: ``graph().candidates(i)``)."""
        return {m: torch.tensor(self._graph.gate_matrix(m)[1]) if s.gate is None else s.gate.active().cpu()
                for m, s in zip(self.module_ids, self.stages, strict=True) if self._graph.candidates(m)}

    def graph(self) -> BranchGraph:
        """The IR with the current gate values and active connections; ``weighted_inputs`` where the function
        weights every input by its gate (unfrozen ``real`` gates)."""
        g = copy.deepcopy(self._graph)
        g.graph["gate"] = self.gate_kind
        g.graph.pop("weighted_inputs", None)
        if self.weighted:
            g.graph["weighted_inputs"] = True
        for module, gate in self.gates():
            if gate.values().is_meta:  # no values to read: the IR's stand
                continue
            values, active = gate.values().cpu().tolist(), gate.active().cpu().tolist()
            order = gate.ties()
            ties = None if order is None else order.cpu().tolist()
            candidates = g.candidates(module)
            for j, node in enumerate(g.branches(module)):
                for k, src in enumerate(candidates):
                    edge = g.succ[src][node]
                    edge.update(gate=float(values[j][k]), active=bool(active[j][k]))
                    edge.pop("tie", None) if ties is None else edge.update(tie=int(ties[j][k]))
        return g

    # ------------------------------------------------------------------------------------------ changes
    def freeze(self, connectivity: dict[int, torch.Tensor] | None = None) -> ConnectivityNet:
        """Fix the connectivity (gate kind ``frozen``): every block keeps the top-K of its gates, or the
        ``connectivity`` given (module → boolean ``[rows, cols]``, as :meth:`connectivity` gives; e.g. the
        trained network's, for an EMA copy made before the freeze). Returns ``self``."""
        mine = self.connectivity()
        if connectivity is not None and (set(connectivity) != set(mine) or any(
                connectivity[m].dtype != torch.bool or connectivity[m].shape != mine[m].shape
                or (not self.budgeted and (connectivity[m].sum(dim=1) != self.K).any()) for m in mine)):
            raise ConfigError(f"connectivity must give modules {sorted(mine)} a boolean [rows, cols] tensor with K="
                              f"{self.K} ones per row (any number under a density), as net.connectivity() does")
        if self.fixed_connectivity:
            if connectivity is not None and any(not torch.equal(connectivity[m].cpu(), mine[m]) for m in mine):
                raise ConfigError(f"this network's connectivity is fixed ({self.gate_kind}); it cannot take another")
            return self
        for module, stage in zip(self.module_ids, self.stages, strict=True):
            if stage.gate is not None:
                active = mine[module] if connectivity is None else connectivity[module]
                stage.gate = stage.gate.freeze(active.to(stage.gate.values().device))
        self._graph.graph["frozen_from"] = self.gate_kind
        self._graph.graph.pop("gate_options", None)  # the knobs of the kind that learned it
        self.gate_kind, self.last_draw = "frozen", {}
        self._graph = self.graph()
        return self

    def get_extra_state(self) -> dict[str, Any]:
        return {"generator": self.generator.get_state(), "temperature": self.sample_temperature, "K": self.K,
                "gate": self.gate_kind}

    def set_extra_state(self, state: dict[str, Any]) -> None:
        if (state.get("K"), state.get("gate")) != (self.K, self.gate_kind):
            frozen = state.get("gate") in GATES and GATES.get(state["gate"]) is FrozenGate
            raise CheckpointError(f"this state is of a network with K={state.get('K')} gate={state.get('gate')}; "
                                  f"this one has K={self.K} gate={self.gate_kind}"
                                  + ("; call freeze() on this one first" if frozen else ""))
        self.generator.set_state(state["generator"])
        self.sample_temperature = state["temperature"]


def _pick(out: torch.Tensor, chosen: list[int] | None, stage: nn.Module) -> torch.Tensor:
    """The branches ``chosen`` (None: all) of a source module's output ``[B, N·ch, *S]``."""
    if chosen is None:
        return out
    b, n, spatial = out.shape[0], out.shape[1], out.shape[2:]
    ch = cast(FusedModule, stage).in_ch
    return out.reshape(b, n // ch, ch, *spatial)[:, chosen].reshape(b, len(chosen) * ch, *spatial)


def state_of_branches(net: ConnectivityNet, state: dict[str, Any]) -> dict[str, Any]:
    """A state dict saved by a network of one block module per branch (``stages.{i}.blocks.{j}.*``, the
    per-branch engine connlearn once had) in ``net``'s keys: the branches' tensors stacked along dim 0, or
    the modules of a loop in order."""
    out: dict[str, Any] = {}
    stacked: dict[str, list[torch.Tensor]] = {}
    for key, value in state.items():
        stage, found, rest = key.partition(".blocks.")
        if not found:
            out[key] = value
            continue
        j, name = rest.split(".", 1)
        if isinstance(net.get_submodule(f"{stage}.block"), LoopedBlock):
            out[f"{stage}.block.branch_modules.{j}.{name}"] = value
        else:
            stacked.setdefault(f"{stage}.block.{name}", []).append(value)
    return {**out, **{k: v[0] if v[0].dim() == 0 else torch.cat(v) for k, v in stacked.items()}}


# ---------------------------------------------------------------------------------------------- compiling
def _single_stream(gate_kind: str, plans: list[ModulePlan]) -> bool:
    """Whether the compiler emits ResNeXt's single stream: the gate kind reads every input as one stream
    (``full``), every module reads the whole of the one before, and its one block kind has that form."""
    kinds = {(d["block"], repr(d["params"])) for p in plans for d in p.nodes}
    return (GATES.get(gate_kind).single_stream and len({k for k, _ in kinds}) == 1
            and hasattr(BLOCKS.get(next(iter(kinds))[0]), "single_stream") and all(_alike(p) for p in plans)
            and all(len(p.sources) <= 1 and all(c is None for _, c in p.sources) for p in plans))


def _alike(plan: ModulePlan) -> bool:
    """Whether the blocks of a module share kind and params (one batched block computes them)."""
    return len({(d["block"], repr(d["params"])) for d in plan.nodes}) == 1


def _stage(plan: ModulePlan, graph: BranchGraph, dims: int, single: bool) -> Stage:
    """The module of ``plan`` (inputs of ``dims`` spatial axes), on ResNeXt's single stream where ``single``,
    its gated blocks started as ``graph``'s ``residual_init`` and ``conv_init`` say."""
    d, c = plan.nodes[0], len(plan.nodes)
    in_ch, out_ch, stride = d["in_channels"], d["out_channels"], d["stride"]
    for name in dict.fromkeys(n["block"] for n in plan.nodes):
        if dims not in block_dims(BLOCKS.get(name)):
            raise ConfigError(f"block kind {name!r} works on {_in_words(block_dims(BLOCKS.get(name)))}; this "
                              f"network's input is {_in_words((dims,))}" + ("; use 'vector'" if dims == 0 else ""))
    shape = {"dims": dims} if dims != 2 else {}  # images: the default of every kind
    nodes = bool(graph.graph.get("node_graph"))
    proj = Projection(in_ch, out_ch, stride, dims) if (in_ch != out_ch or stride != 1) and not nodes else None
    residual, conv_init = graph.graph.get("residual_init", "one"), graph.graph.get("conv_init")
    if single:  # ResNeXt's own start, as published, whatever the starts of gated blocks say
        body = cast(Any, BLOCKS.get(d["block"])).single_stream(in_ch, out_ch, stride, c, **d["params"], **shape)
        return SingleStreamModule(body, proj)
    gate = None
    if plan.gates is not None:
        values, active = plan.gates
        gate = gate_class(graph)(torch.tensor(values), torch.tensor(active), graph.K,
                                 **graph.graph.get("gate_options", {}))
    if _alike(plan):
        block = BLOCKS.get(d["block"])(in_ch, out_ch, stride, c, **d["params"], **shape)
    else:  # blocks that differ (in kind or params): one module per branch, in a loop
        block = LoopedBlock([BLOCKS.get(n["block"])(in_ch, out_ch, stride, 1, **n["params"], **shape)
                             for n in plan.nodes])
    if residual != "one" and _can(block, "init_residual_scale", residual, "auto", d["block"]):
        cast(Any, block).init_residual_scale(0.0 if residual == "zero" else math.sqrt(plan.read_by))
    if conv_init == "resnext" and _can(block, "init_conv_scale", "resnext", "branch", d["block"]):
        cast(Any, block).init_conv_scale(1.0 / math.sqrt(c))
    return (NodeModule if nodes else FusedModule)(block, proj, gate, in_ch, out_ch, c)


def _can(block: nn.Module, hook: str, init: str, fallback: str, kind: str) -> bool:
    """Whether to call the start ``hook`` on ``block``: a block kind without it is skipped under ``auto``, else
    refused."""
    if isinstance(block, LoopedBlock):
        has = all(_can(m, hook, "auto", fallback, kind) for m in block.branch_modules)
    elif isinstance(block, BranchBlock):
        has = bool(block.residual_norm if hook == "init_residual_scale" else block.inner_convs)
    else:
        has = callable(getattr(block, hook, None))
    if has or init == "auto":
        return has
    raise ConfigError(f"{init!r} start: block kind {kind!r} has no {hook}; use {fallback!r}")


def _in_words(dims: tuple[int, ...]) -> str:
    return " and ".join({0: "vectors (0-D)", 1: "signals (1-D)", 2: "images (2-D)"}[d] for d in dims)


class _Recomputable:
    """``stage(inputs, mix)`` for ``torch.utils.checkpoint``: the recomputation in the backward pass leaves
    the stage's buffers as it found them, so the batch norms count each batch once."""

    def __init__(self, stage: nn.Module) -> None:
        self.stage, self.calls = stage, 0

    def __call__(self, inputs: list[Any], mix: torch.Tensor | None) -> Any:
        self.calls += 1
        if self.calls == 1 or torch.compiler.is_compiling():
            return self.stage(inputs, mix)
        kept = [(b, b.detach().clone()) for b in self.stage.buffers()]
        try:
            return self.stage(inputs, mix)
        finally:
            with torch.no_grad():
                for buffer, value in kept:
                    buffer.copy_(value)
