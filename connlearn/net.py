"""ConnectivityNet: a BranchGraph compiled into a trainable ``nn.Module``.

Module i, with C_i branches reading the outputs y_k of its candidate sources through gate matrix G::

    x_j = ReLU( (1/K) · Σ_k G_jk · y_k )          first module: x_j = the stem's output for every branch
    y_j = P(x_j) + F_j(x_j)                       P: identity, or one 1x1 conv + BN per module, shared
    logits = Linear( avgpool( ReLU( (1/C_M) · Σ_k y_k ) ) )

Engines compute the same function from the same weights:

- ``fused`` (default): a module's activations are one tensor ``[B, C·ch, H, W]`` (branch-major channels);
  the gate mix is one batched matmul over the branch axis, the blocks are grouped convolutions;
  a module whose blocks differ (kernels 1, 3, 5) runs them in a loop (:class:`Unlike`);
- ``reference``: one block per branch and plain loops: the oracle of the tests;
- ``single-stream``: gate ``full`` with a block kind that has a ``single_stream`` form (the bottleneck)
  compiles to the genuine ResNeXt, ``y = ReLU(P(x) + F(x))`` with a grouped 3x3 convolution.
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

from connlearn.blocks import BLOCKS, LoopedBlock, block_dims, conv, has_start, norm
from connlearn.errors import CheckpointError, ConfigError, check_choice
from connlearn.gates import GATES, FrozenGate, Gate, draw_generator, random_tie_order, tie_generator
from connlearn.graph import BranchGraph, input_shape

ENGINES = ("fused", "reference")


def mix_branches(inputs: list[torch.Tensor], mix: torch.Tensor, ch: int) -> torch.Tensor:
    """``ReLU(mix @ y)`` over the branch axis: inputs ``[B, N_s·ch, *S]`` (N = Σ N_s branches; S the spatial
    shape: ``H, W``, ``L`` or none), ``mix`` ``[C, N]`` (or ``[B, C, N]``: a connectivity per example) →
    ``[B, C·ch, *S]``, in the inputs' memory format: one batched GEMM."""
    b, spatial = inputs[0].shape[0], inputs[0].shape[2:]
    c, n = mix.shape[-2:]
    size = math.prod(spatial)
    if mix.dim() == 3:
        y = torch.cat([t.reshape(b, t.shape[1] // ch, ch * size) for t in inputs], dim=1)
        return torch.bmm(mix.to(y.dtype), y).relu().reshape(b, c * ch, *spatial)
    if inputs[0].dim() == 4 and inputs[0].is_contiguous(memory_format=torch.channels_last) and not inputs[
            0].is_contiguous():
        h, w = spatial
        parts = [t.permute(0, 2, 3, 1).reshape(b * h * w, t.shape[1] // ch, ch) for t in inputs]
        y = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
        x = torch.bmm(mix.to(y.dtype).expand(y.shape[0], c, n), y).relu()
        return x.reshape(b, h, w, c * ch).permute(0, 3, 1, 2)
    parts = [t.reshape(b, t.shape[1] // ch, ch * size) for t in inputs]
    y = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
    return torch.bmm(mix.to(y.dtype).expand(b, c, n), y).relu().reshape(b, c * ch, *spatial)


# -- planted control (topology option uninformative)
def replace_by_noise(y: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """``y`` ``[B, C, ch, *S]`` with the branches where ``noise`` (``[C]`` bool) is set replaced by Gaussian noise
    (the global RNG) at each one's root mean square over the batch, detached: outputs that carry nothing."""
    rms = y.detach().float().pow(2).mean(dim=(0, *range(2, y.dim())), keepdim=True).sqrt().to(y.dtype)
    return torch.where(noise.view(1, -1, *[1] * (y.dim() - 2)), torch.randn_like(y) * rms, y)
# -- end planted control


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


class Unlike(LoopedBlock):
    """The blocks of a fused module that differ (in kind or params): the reference engine's, in a loop."""


class ReferenceModule(nn.Module):
    """One block per branch and plain loops; inputs and outputs are lists of ``[B, ch, H, W]``."""

    def __init__(self, blocks: list[nn.Module], proj: nn.Module | None, gate: Gate | None) -> None:
        super().__init__()
        self.blocks, self.proj, self.gate = nn.ModuleList(blocks), proj, gate

    def forward(self, inputs: list[torch.Tensor], mix: torch.Tensor | None) -> list[torch.Tensor]:
        if mix is None:
            short = inputs[0] if self.proj is None else self.proj(inputs[0])
            return [short + block(inputs[0]) for block in self.blocks]
        def w(j: int, k: int) -> torch.Tensor:  # a weight, or a weight per example ([B, C, N] mixes)
            return mix[j, k] if mix.dim() == 2 else mix[:, j, k].view(-1, *[1] * (inputs[0].dim() - 1))

        xs = [sum((w(j, k) * y for k, y in enumerate(inputs[1:], 1)), w(j, 0) * inputs[0]).relu()
              for j in range(len(self.blocks))]
        if self.proj is None:
            shorts = xs
        elif self.training:  # one call: its batch norm sees every branch's batch, as the fused engine's does
            shorts = list(self.proj(torch.cat(xs)).chunk(len(xs)))
        else:
            shorts = [self.proj(x) for x in xs]
        return [s + block(x) for s, block, x in zip(shorts, self.blocks, xs, strict=True)]


class SingleStreamModule(nn.Module):
    """The genuine ResNeXt module: ``ReLU(P(x) + F(x))``, F the aggregated residual function."""

    def __init__(self, body: nn.Module, proj: nn.Module | None) -> None:
        super().__init__()
        self.body, self.proj = body, proj
        self.gate: Gate | None = None

    def forward(self, inputs: list[torch.Tensor], mix: torch.Tensor | None) -> torch.Tensor:
        short = inputs[0] if self.proj is None else self.proj(inputs[0])
        return (short + self.body(inputs[0])).relu()


Stage = FusedModule | ReferenceModule | SingleStreamModule


class ConnectivityNet(nn.Module):
    """A multi-branch network compiled from a :class:`BranchGraph`: ``[B, in_channels, H, W]`` images →
    ``[B, num_classes]`` logits.

    In training mode a stochastic gate kind (``topk``) draws every module's connectivity once per forward
    pass, in one batched call, from the network's own CPU generator (seeded from the graph's seed and saved
    in ``state_dict``): checkpoints resume the same draws and DDP's ranks draw alike. ``sample_temperature``
    (1: the paper's) sharpens the draws below 1. In eval mode the connectivity is each block's top-K.
    ``activation_checkpointing`` recomputes each module in the backward pass, with the forward pass's draw.
    """

    def __init__(self, graph: BranchGraph, engine: str = "fused") -> None:
        super().__init__()
        graph.validate()
        self._graph, self.K, self.gate_kind = copy.deepcopy(graph), graph.K, graph.gate_kind
        gate_cls = GATES.get(self.gate_kind)
        inp, out = graph.nodes["input"], graph.nodes["output"]
        self.in_channels, self.num_classes = inp["in_channels"], out["num_classes"]
        self.input_size, self.dims = input_shape(inp), len(input_shape(inp))
        self.stem = Stem(inp["in_channels"], inp["out_channels"], **inp["stem"], dims=self.dims)
        self.module_ids = graph.modules()
        position = {m: p for p, m in enumerate(self.module_ids)}
        self._sources = [_sources(graph, m, position) for m in self.module_ids]
        self.engine = _engine(graph, check_choice("engine", engine, ENGINES), self._sources)
        self.stages = cast("list[Stage]", nn.ModuleList(self._stage(graph, m, gate_cls) for m in self.module_ids))
        self._init_residuals(graph)
        self._init_convs(graph)
        noise = [bool(graph.nodes[n].get("uninformative")) for n in graph.branches(self.module_ids[0])]
        if any(noise):  # planted control: these branches of module 1 output noise (topology option uninformative)
            self.stages[0].noise = torch.tensor(noise)
        self.head = Head(out["in_channels"], out["num_classes"])
        self.generator = draw_generator(graph.seed)
        ties = tie_generator(graph.seed)
        for module, gate in self.gates():
            if hasattr(gate, "tie_order"):  # the graph's ties; a graph without them: from the seed
                given = graph.tie_matrix(module)
                rows, cols = gate.shape
                order = random_tie_order(rows, cols, ties) if given is None else torch.tensor(given)
                cast(torch.Tensor, gate.tie_order).copy_(order)
        self.sample_temperature = 1.0
        self.activation_checkpointing = False
        self.last_draw: dict[int, torch.Tensor] = {}  # the latest training draw, by stage position
        self._hold: list[dict[int, torch.Tensor]] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # the draw runs eagerly, first: under torch.compile the rest of the pass is one graph
        drawn = self._draw(x.shape[0]) if self.training and self.stochastic else {}
        mixes = [None if s.gate is None else s.gate.matrix(drawn.get(i)) / self.K for i, s in enumerate(self.stages)]
        h = self.stem(x)
        outputs: list[Any] = []
        for stage, plan, mix in zip(self.stages, self._sources, mixes, strict=True):
            inputs = [h] if not plan else [t for pos, chosen in plan for t in self._pick(outputs[pos], chosen, stage)]
            if self.activation_checkpointing and torch.is_grad_enabled():
                outputs.append(torch.utils.checkpoint.checkpoint(_Recomputable(stage), inputs, mix,
                                                                 use_reentrant=False))
            else:
                outputs.append(stage(inputs, mix))
        last = outputs[-1]
        if self.engine == "fused":
            b, n, spatial = last.shape[0], last.shape[1], last.shape[2:]
            c = cast(FusedModule, self.stages[-1]).branches
            last = last.reshape(b, c, n // c, *spatial).mean(dim=1).relu()
        elif self.engine == "reference":
            last = torch.stack(last, dim=1).mean(dim=1).relu()
        return self.head(last)

    def _pick(self, out: Any, chosen: list[int] | None, stage: nn.Module) -> list[torch.Tensor]:
        """The branches ``chosen`` (None: all) of a source module's output, as the engine's inputs."""
        if self.engine == "reference":
            return list(out) if chosen is None else [out[i] for i in chosen]
        if chosen is None:
            return [out]
        b, n, spatial = out.shape[0], out.shape[1], out.shape[2:]
        ch = cast(FusedModule, stage).in_ch
        return [out.reshape(b, n // ch, ch, *spatial)[:, chosen].reshape(b, len(chosen) * ch, *spatial)]

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
        drawn: dict[int, torch.Tensor] = {}
        for cls in dict.fromkeys(type(g) for g in at.values()):
            index = [i for i, g in at.items() if type(g) is cls]
            rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
            per_example = {"batch": batch * world} if cls.per_example else {}  # DDP: the global batch's draws
            draws = cls.draw([at[i] for i in index], self.generator, temperature=self.sample_temperature,
                             **per_example)
            if cls.per_example:  # this rank's examples
                draws = [d[rank * batch:(rank + 1) * batch] for d in draws]
            drawn.update(zip(index, draws, strict=True))
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

    def evaluates_top_k(self) -> bool:
        """Whether every gate evaluates with its binary top-K (then freezing keeps the eval outputs); not so
        for unfrozen ``real`` gates, which weight every input."""
        with torch.no_grad():
            return all(torch.equal(g.matrix(None).float(), g.active().float()) for _, g in self.gates())

    def surrogate_loss(self, losses: torch.Tensor) -> torch.Tensor:
        """The term to add to the loss for gate kinds whose gradient needs the loss itself (``score``): given
        the per-example losses ``[B]`` of the last training forward pass; 0 for every other kind."""
        terms = [cast(Any, s.gate).surrogate(self.last_draw[i], losses) for i, s in enumerate(self.stages)
                 if i in self.last_draw and hasattr(s.gate, "surrogate")]
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
        """Trainable parameters, without the gates unless ``gates``."""
        return sum(p.numel() for p in (self.parameters() if gates else self.weight_parameters()))

    def connectivity(self) -> dict[int, torch.Tensor]:
        """The evaluation connectivity: module → boolean ``[C_i, N_i]`` (columns: ``graph().candidates(i)``)."""
        if self.engine == "single-stream":
            return {m: torch.tensor(self._graph.gate_matrix(m)[1]) for m in self.module_ids
                    if self._graph.candidates(m)}
        return {m: g.active().cpu() for m, g in self.gates()}

    def graph(self) -> BranchGraph:
        """The IR with the current gate values and active connections; ``weighted_inputs`` where the function
        weights every input by its gate (unfrozen ``real`` gates)."""
        g = copy.deepcopy(self._graph)
        g.graph["gate"] = self.gate_kind
        g.graph.pop("weighted_inputs", None)
        if self.engine == "single-stream":
            return g
        if not self.evaluates_top_k():
            g.graph["weighted_inputs"] = True
        for module, gate in self.gates():
            values, active = gate.values().cpu().tolist(), gate.active().cpu().tolist()
            ties = cast(torch.Tensor, gate.tie_order).cpu().tolist() if hasattr(gate, "tie_order") else None
            for j, node in enumerate(g.branches(module)):
                for k, src in enumerate(g.candidates(module)):
                    edge = g.edges[src, node]
                    edge.update(gate=float(values[j][k]), active=bool(active[j][k]))
                    edge.pop("tie", None) if ties is None else edge.update(tie=int(ties[j][k]))
        return g

    # ------------------------------------------------------------------------------------------ changes
    def freeze(self, connectivity: dict[int, torch.Tensor] | None = None) -> ConnectivityNet:
        """Fix the connectivity (gate kind ``frozen``): every block keeps the top-K of its gates, or the
        ``connectivity`` given (module → boolean ``[rows, cols]``, as :meth:`connectivity` gives; e.g. the
        trained network's, for an EMA copy made before the freeze). Returns ``self``."""
        mine = self.connectivity()
        if connectivity is not None and (not isinstance(connectivity, dict) or set(connectivity) != set(mine) or any(
                connectivity[m].dtype != torch.bool or connectivity[m].shape != mine[m].shape
                or (connectivity[m].sum(dim=1) != self.K).any() for m in mine)):
            raise ConfigError(f"connectivity must give modules {sorted(mine)} a boolean [rows, cols] tensor with K="
                              f"{self.K} ones per row, as net.connectivity() does")
        if self.fixed_connectivity:
            if connectivity is not None and any(not torch.equal(connectivity[m].cpu(), mine[m]) for m in mine):
                raise ConfigError(f"this network's connectivity is fixed ({self.gate_kind}); it cannot take another")
            return self
        for module, stage in zip(self.module_ids, self.stages, strict=True):
            if stage.gate is not None:
                values = stage.gate.values()
                active = mine[module] if connectivity is None else connectivity[module]
                stage.gate = FrozenGate(values, active.to(values.device), self.K).to(values.device)
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
            raise CheckpointError(f"this state is of a network with K={state.get('K')} gate={state.get('gate')}; "
                                  f"this one has K={self.K} gate={self.gate_kind}")
        self.generator.set_state(state["generator"])
        self.sample_temperature = state["temperature"]

    # ------------------------------------------------------------------------------------------ building
    def _stage(self, graph: BranchGraph, module: int, gate_cls: type[Gate]) -> Stage:
        nodes = graph.branches(module)
        d = graph.nodes[nodes[0]]
        in_ch, out_ch, stride, kind = d["in_channels"], d["out_channels"], d["stride"], BLOCKS.get(d["block"])
        for name in dict.fromkeys(graph.nodes[n]["block"] for n in nodes):
            if self.dims not in block_dims(BLOCKS.get(name)):
                raise ConfigError(f"block kind {name!r} works on {_in_words(block_dims(BLOCKS.get(name)))}; this "
                                  f"network's input is {_in_words((self.dims,))}" + ("; use 'vector'" if self.dims == 0
                                                                                     else ""))
        dims = {"dims": self.dims} if self.dims != 2 else {}  # images: the default of every kind
        proj = Projection(in_ch, out_ch, stride, self.dims) if in_ch != out_ch or stride != 1 else None
        if self.engine == "single-stream":
            return SingleStreamModule(kind.single_stream(in_ch, out_ch, stride, len(nodes), **d["params"], **dims),
                                      proj)
        gate = None
        if graph.candidates(module):
            values, active = graph.gate_matrix(module)
            options = graph.graph.get("gate_options", {})
            for name in options:
                check_choice(f"gate option of {self.gate_kind!r}", name, gate_cls.knobs)
            gate = gate_cls(torch.tensor(values), torch.tensor(active), graph.K, **options)
        if self.engine == "fused" and _alike(graph, module):
            return FusedModule(kind(in_ch, out_ch, stride, len(nodes), **d["params"], **dims), proj, gate, in_ch,
                               out_ch, len(nodes))
        blocks = [BLOCKS.get(graph.nodes[n]["block"])(in_ch, out_ch, stride, 1, **graph.nodes[n]["params"], **dims)
                  for n in nodes]
        if self.engine == "reference":
            return ReferenceModule(blocks, proj, gate)
        return FusedModule(Unlike(blocks), proj, gate, in_ch, out_ch, len(nodes))

    def _blocks(self) -> Iterator[tuple[int, nn.Module]]:
        for module, stage in zip(self.module_ids, self.stages, strict=True):
            for block in [stage.block] if isinstance(stage, FusedModule) else getattr(stage, "blocks", []):
                yield module, block

    def _init_residuals(self, graph: BranchGraph) -> None:
        """Each branch's output starts at the scale ``residual_init`` says (see ``topologies.resnext``)."""
        init = graph.graph.get("residual_init", "one")
        if init == "one":
            return
        head = len(graph.in_edges("output"))
        for module, block in self._blocks():
            edges = (d for n in graph.branches(module) for *_, d in graph.out_edges(n, data=True))
            gated = any(d.get("kind") == "gate" for d in edges)
            if self._start(graph, module, block, "init_residual_scale", init, "auto"):
                cast(Any, block).init_residual_scale(0.0 if init == "zero" else math.sqrt(graph.K if gated else head))

    def _init_convs(self, graph: BranchGraph) -> None:
        """With ``conv_init="resnext"`` the inner convolutions start at 1/sqrt(C) of one branch's scale."""
        if graph.graph.get("conv_init", "branch") == "resnext":
            for module, block in self._blocks():
                if self._start(graph, module, block, "init_conv_scale", "resnext", "branch"):
                    cast(Any, block).init_conv_scale(1.0 / math.sqrt(len(graph.branches(module))))

    @staticmethod
    def _start(graph: BranchGraph, module: int, block: nn.Module, hook: str, init: str, fallback: str) -> bool:
        """Whether to call ``hook`` on ``block``: a block kind without it is skipped under ``auto``, else refused."""
        if has_start(block, hook) or init == "auto":
            return has_start(block, hook)
        kind = graph.nodes[graph.branches(module)[0]]["block"]
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


def _sources(graph: BranchGraph, module: int, position: dict[int, int]) -> list[tuple[int, list[int] | None]]:
    """For each source module of ``module``: its position and which of its branches are candidates (None:
    all)."""
    cols = set(graph.candidates(module))
    plan: list[tuple[int, list[int] | None]] = []
    for src in sorted({graph.nodes[c]["module"] for c in cols}):
        chosen = [i for i, n in enumerate(graph.branches(src)) if n in cols]
        plan.append((position[src], None if len(chosen) == len(graph.branches(src)) else chosen))
    return plan


def _alike(graph: BranchGraph, module: int) -> bool:
    """Whether the blocks of ``module`` share kind and params (one batched block computes them)."""
    return len({(graph.nodes[n]["block"], repr(graph.nodes[n]["params"])) for n in graph.branches(module)}) == 1


def _engine(graph: BranchGraph, engine: str, sources: list[list[tuple[int, list[int] | None]]]) -> str:
    """The engine a graph compiles to: single-stream for a full ResNeXt whose block has that form."""
    kinds = {graph.nodes[n]["block"] for n in graph.block_nodes()}
    one_stream = all(len(plan) <= 1 and all(c is None for _, c in plan) for plan in sources)
    alike = all(_alike(graph, m) for m in graph.modules())
    if graph.gate_kind == "full" and one_stream and alike and len(kinds) == 1 and hasattr(BLOCKS.get(kinds.pop()),
                                                                                          "single_stream"):
        return "single-stream"
    return engine


def to_engine(net: ConnectivityNet, engine: str) -> ConnectivityNet:
    """A copy of ``net`` on ``engine`` (fused or reference), with the same weights, gates and draws. A Fixed-Full
    network on ResNeXt's single stream has no branches to move: it comes back as a copy, single-stream."""
    if net.engine in (check_choice("engine", engine, ENGINES), "single-stream"):
        return copy.deepcopy(net)
    param = next(net.parameters())
    with torch.random.fork_rng(devices=[]):  # its weights are replaced: the global RNG is left alone
        new = ConnectivityNet(net.graph(), engine).to(param.device, param.dtype)
    for old, stage in zip(cast(list[Any], net.stages), cast(list[Any], new.stages), strict=True):
        if engine == "reference":
            stage.blocks = nn.ModuleList(copy.deepcopy(old.block.branch_modules[j]) if isinstance(old.block, Unlike)
                                         else old.block.select([j]) for j in range(old.branches))
        else:
            stage.block = Unlike(copy.deepcopy(list(old.blocks))) if isinstance(stage.block, Unlike) else type(
                old.blocks[0]).merge(list(old.blocks))
    new.load_state_dict({**new.state_dict(), **{k: v for k, v in net.state_dict().items()
                                                 if k.split(".")[2:3] not in (["block"], ["blocks"])}})
    new.train(net.training)
    new.activation_checkpointing = net.activation_checkpointing
    return new
