"""Compile a :class:`BranchGraph` into a trainable :class:`ConnectivityNet`.

The forward computation, for module i with C_i branches and inputs y_k from its candidate sources::

    x_j = ReLU( (1/K) · Σ_k G_jk · y_k )          first module: x_j = stem output for every branch
    y_j = P(x_j) + F_j(x_j)                       P: identity, or one 1x1 conv + BN per module, shared
    logits = Linear( avgpool( ReLU( (1/C_M) · Σ_k y_k ) ) )

Engines (same function from the same weights):

- ``fused`` (default): a module's activations are one tensor ``[B, C·ch, H, W]`` (branch-major channels);
  the gate mix is one contraction over the branch axis, the blocks are grouped convolutions, the shared
  projection runs on the ``[B·C, ch, H, W]`` view. No Python loop over branches.
- ``reference``: one block module per branch and plain loops; the oracle for tests and the fallback for
  modules whose blocks differ in kind or parameters. Its shared projection runs on the branches
  concatenated along the batch, so that its batch statistics equal the fused engine's.
- gate kind ``full`` with a block kind that has a ``single_stream`` form (the bottleneck) compiles to the
  genuine ResNeXt: one stream per module, ``y = ReLU(P(x) + F(x))`` with a grouped 3x3 convolution.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import functools
import inspect
import math
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple, cast

import torch
import torch.utils.checkpoint
from torch import nn

from connlearn.blocks import (
    BLOCKS,
    LoopedBlock,
    build_or_explain,
    check_conv_init,
    check_residual_init,
    device_and_dtype,
    init_conv_scale,
    init_residual_scale,
    make_block,
    require_block_method,
    residual_scale,
    scales_residual,
    starts_of,
)
from connlearn.blocks.base import carry_settings, check_same_kinds
from connlearn.errors import (
    BlockError,
    CheckpointError,
    ConfigError,
    ConfigTypeError,
    ShapeError,
    StateDictError,
    check_bool,
    check_int,
    check_name,
    check_temperature,
    state_dict_mismatch,
)
from connlearn.gates import (
    GATES,
    FrozenGate,
    Gate,
    active_masks,
    check_active_rows,
    check_gate_shape,
    draw_generator,
    random_tie_order,
    tie_generator,
)
from connlearn.graph import BranchGraph, check_graph

ENGINES = ("fused", "reference", "auto")


class Stem(nn.Module):
    """Input convolution → BN → ReLU (→ 3x3 max-pool, stride 2)."""

    def __init__(self, in_ch: int, out_ch: int, kernel: int, stride: int, maxpool: bool) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_ch, out_ch, kernel, stride=stride, padding=kernel // 2, bias=False)
        self.bn = nn.BatchNorm2d(out_ch)
        self.relu = nn.ReLU(inplace=True)
        self.pool = nn.MaxPool2d(3, stride=2, padding=1) if maxpool else nn.Identity()
        nn.init.kaiming_normal_(self.conv.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(self.relu(self.bn(self.conv(x))))


class Projection(nn.Sequential):
    """The shortcut P where the shape changes: one 1x1 conv (stride) + BN, shared by a module's branches."""

    def __init__(self, in_ch: int, out_ch: int, stride: int) -> None:
        conv = nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False)
        super().__init__(conv, nn.BatchNorm2d(out_ch))
        nn.init.kaiming_normal_(conv.weight, mode="fan_out", nonlinearity="relu")


class Head(nn.Module):
    """Global average pooling and a linear classifier, on the aggregated ``[B, ch, H, W]``."""

    def __init__(self, in_ch: int, num_classes: int) -> None:
        super().__init__()
        self.fc = nn.Linear(in_ch, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


class FusedModule(nn.Module):
    """All branches of a module as one tensor ``[B, C·ch, H, W]``; see the module docstring."""

    def __init__(self, block: nn.Module, proj: nn.Module | None, gate: Gate | None, info: dict[str, Any]):
        super().__init__()
        self.block, self.proj, self.gate = block, proj, gate
        self.branches, self.in_ch, self.out_ch = info["branches"], info["in_channels"], info["out_channels"]
        self.kind, self.module = info["block"], info["module"]

    def forward(self, inputs: list[torch.Tensor], mix: torch.Tensor | None) -> torch.Tensor:
        c, ch = self.branches, self.in_ch
        if mix is None:
            return self._first(inputs[0])
        x = mix_branches(inputs, mix, ch)
        b, _, h, w = x.shape
        out = call_block(self, self.block, x)
        if self.proj is None:
            check_block_output(self, out, x, (b, c * self.out_ch, h, w))
            return x + out
        short = self.proj(x.reshape(b * c, ch, h, w))
        check_block_output(self, out, x, (b, c * self.out_ch, *short.shape[-2:]))
        return short.reshape(b, c * self.out_ch, *short.shape[-2:]) + out

    def _first(self, stem: torch.Tensor) -> torch.Tensor:
        """The first module: every branch reads the stem, so its shortcut is computed once."""
        b, _, h, w = stem.shape
        c = self.branches
        x = stem.unsqueeze(1).expand(b, c, self.in_ch, h, w).reshape(b, c * self.in_ch, h, w)
        out = call_block(self, self.block, x)
        short = stem if self.proj is None else self.proj(stem)
        oh, ow = short.shape[-2:]
        check_block_output(self, out, x, (b, c * self.out_ch, oh, ow))
        return (out.reshape(b, c, self.out_ch, oh, ow) + short.unsqueeze(1)).reshape(b, c * self.out_ch, oh, ow)


#: What a block kind computes, for the errors of a block that does not.
BLOCK_CONTRACT = ("A block kind maps [B, branches·in_ch, H, W] (branch-major channels) to [B, branches·out_ch, "
                  "H/stride, W/stride]; see connlearn.blocks.base")
LOOPED_CONTRACT = ("A Looped factory (in_ch, out_ch, stride) returns a module that maps one branch's [B, in_ch, H, W] "
                   "to [B, out_ch, H/stride, W/stride]; see connlearn.blocks.base")
#: Errors of the device or its libraries, which no block kind causes by its shapes: they pass unchanged.
_NOT_THE_BLOCKS = ("CUDA error", "CUBLAS_STATUS", "CUDNN_STATUS", "out of memory")


def call_block(stage: nn.Module, block: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``block(x)``; a plain ``RuntimeError`` it raises (a block kind that does not follow the block
    protocol fails inside torch, e.g. a plain ``nn.Conv2d`` given ``branches·in_ch`` channels) becomes a
    :class:`~connlearn.errors.BlockError` naming the block kind, the module and the input's shape. Its
    subclasses (out of memory, ``NotImplementedError``, ...), errors of the device or its libraries, and
    everything while compiling or tracing pass unchanged."""
    if torch.jit.is_tracing() or torch.compiler.is_compiling():
        return block(x)
    try:
        return block(x)
    except RuntimeError as exc:
        text = str(exc).strip()
        if type(exc) is not RuntimeError or any(mark in text for mark in _NOT_THE_BLOCKS):
            raise
        error = _block_error(stage, block, x, text)
    raise error from None  # outside the except clause: no cycle holds the failed call's frames


def _block_error(stage: nn.Module, block: nn.Module, x: torch.Tensor, text: str) -> BlockError:
    if isinstance(block, LoopedBlock):
        b, channels, h, w = x.shape
        shape, contract = [b, channels // block.branches, h, w], LOOPED_CONTRACT
        where = f"{type(block.branch_modules[0]).__qualname__}, one module per branch"
        what = "one branch's input"
    else:
        shape, contract, where, what = list(x.shape), BLOCK_CONTRACT, type(block).__qualname__, "an input"
    return BlockError(f"block kind {stage.kind!r} ({where}) in module {stage.module} failed on {what} of shape "
                      f"{shape}: {text}. {contract}")


def check_block_output(stage: nn.Module, out: Any, x: torch.Tensor, expected: tuple[int, ...]) -> None:
    """A :class:`~connlearn.errors.ShapeError` naming the block kind and module unless the block of
    ``stage`` mapped ``x`` to a tensor of shape ``expected`` (the shortcut's: channels and resolution)."""
    if torch.jit.is_tracing():
        return
    if not isinstance(out, torch.Tensor) or out.shape != expected:
        got = list(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ShapeError(
            f"block kind {stage.kind!r} in module {stage.module} mapped an input of shape {list(x.shape)} to "
            f"{got}; expected {list(expected)}: {stage.out_ch} output channels per branch at the shortcut's "
            "resolution (stride applied)"
        )


def mix_branches(inputs: list[torch.Tensor], mix: torch.Tensor, ch: int) -> torch.Tensor:
    """``ReLU(mix @ y)`` over the branch axis: inputs ``[B, N_s·ch, H, W]`` (concatenated along branches,
    N = Σ N_s), ``mix`` ``[C, N]`` → ``[B, C·ch, H, W]``, in the inputs' memory format, without copies
    for a single input. One batched GEMM with the gate matrix expanded over the batch (a broadcast
    ``matmul`` would transpose the activations first)."""
    b, _, h, w = inputs[0].shape
    c, n = mix.shape
    if inputs[0].is_contiguous(memory_format=torch.channels_last) and not inputs[0].is_contiguous():
        # [B, H, W, N, ch] in memory: contract N per pixel and keep channels last
        parts = [t.permute(0, 2, 3, 1).reshape(b * h * w, t.shape[1] // ch, ch) for t in inputs]
        y = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
        x = torch.bmm(mix.to(y.dtype).expand(y.shape[0], c, n), y).relu()
        return x.reshape(b, h, w, c * ch).permute(0, 3, 1, 2)
    parts = [t.reshape(b, t.shape[1] // ch, ch * h * w) for t in inputs]  # sizes, not -1: a batch may be empty
    y = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
    return torch.bmm(mix.to(y.dtype).expand(b, c, n), y).relu().reshape(b, c * ch, h, w)


class ReferenceModule(nn.Module):
    """One block per branch and plain loops; inputs and outputs are lists of ``[B, ch, H, W]``."""

    def __init__(self, blocks: list[nn.Module], proj: nn.Module | None, gate: Gate | None, info: dict[str, Any]):
        super().__init__()
        self.blocks, self.proj, self.gate = nn.ModuleList(blocks), proj, gate
        self.branches, self.out_ch = info["branches"], info["out_channels"]
        self.kind, self.module = info["block"], info["module"]

    def gated_sums(self, inputs: list[torch.Tensor], mix: torch.Tensor) -> list[torch.Tensor]:
        """The pre-ReLU gated sums s_j = Σ_k mix_jk · y_k, one per branch."""
        sums = []
        for j in range(self.branches):
            acc = mix[j, 0] * inputs[0]
            for k in range(1, len(inputs)):
                acc = acc + mix[j, k] * inputs[k]
            sums.append(acc)
        return sums

    def forward(self, inputs: list[torch.Tensor], mix: torch.Tensor | None) -> list[torch.Tensor]:
        if mix is None:  # the first module: every branch reads the stem, its shortcut is computed once
            stem = inputs[0]
            short = stem if self.proj is None else self.proj(stem)
            return [short + self._run(blk, stem, short) for blk in self.blocks]
        xs = [s.relu() for s in self.gated_sums(inputs, mix)]
        if self.proj is None:
            shorts = xs
        elif self.training:  # one call, so that its batch norm sees every branch's batch, as the fused engine's
            shorts = list(self.proj(torch.cat(xs, dim=0)).chunk(self.branches, dim=0))
        else:  # the same function in eval mode, without a split that ties the traced graph to one batch size
            shorts = [self.proj(x) for x in xs]
        return [s + self._run(blk, x, s) for s, blk, x in zip(shorts, self.blocks, xs, strict=True)]

    def _run(self, block: nn.Module, x: torch.Tensor, short: torch.Tensor) -> torch.Tensor:
        out = call_block(self, block, x)
        check_block_output(self, out, x, (x.shape[0], self.out_ch, *short.shape[-2:]))
        return out


class SingleStreamModule(nn.Module):
    """The genuine ResNeXt module: ``ReLU(P(x) + F(x))`` with F the aggregated residual function."""

    def __init__(self, body: nn.Module, proj: nn.Module | None) -> None:
        super().__init__()
        self.body, self.proj = body, proj
        self.gate: Gate | None = None

    def forward(self, inputs: list[torch.Tensor], mix: torch.Tensor | None) -> torch.Tensor:
        x = inputs[0]
        short = x if self.proj is None else self.proj(x)
        return (short + self.body(x)).relu()


if TYPE_CHECKING:

    class _Stages(nn.ModuleList):
        """A network's ``stages``, for type checkers: one of these modules per module of its graph."""

        def __iter__(self) -> Iterator[FusedModule | ReferenceModule | SingleStreamModule]: ...


def _module_info(graph: BranchGraph, module: int) -> dict[str, Any]:
    nodes = graph.branches(module)
    d = graph.nodes[nodes[0]]
    return {
        "nodes": nodes,
        "module": module,
        "block": d["block"],
        "branches": len(nodes),
        "in_channels": d["in_channels"],
        "out_channels": d["out_channels"],
        "stride": d["stride"],
        "homogeneous": all(
            graph.nodes[n]["block"] == d["block"] and graph.nodes[n].get("params", {}) == d.get("params", {})
            for n in nodes
        ),
    }


def _make_block(graph: BranchGraph, nodes: list[str], info: dict[str, Any]) -> nn.Module:
    d = graph.nodes[nodes[0]]
    return make_block(d["block"], BLOCKS.get(d["block"]), info["in_channels"], info["out_channels"], info["stride"],
                      len(nodes), d.get("params", {}))


@contextlib.contextmanager
def _naming_kind(graph: BranchGraph, module: int, start: str) -> Iterator[None]:
    """Prefix a :class:`ConfigError` raised inside with the start asked for and module ``module``'s block
    kind (the registered name the user chose, where the error names the block's class)."""
    try:
        yield
    except ConfigError as exc:
        kind = graph.nodes[graph.branches(module)[0]]["block"]
        raise ConfigError(f"{start} with block kind {kind!r} (module {module}): {exc}") from None


def _make_gate(gate_cls: type[Gate], values: torch.Tensor, active: torch.Tensor, K: int, module: int) -> Gate:
    """One module's gate of kind ``gate_cls`` (a registered kind: ``check_gate_kind`` has vetted it), with
    the shapes of what it gives checked once here."""
    try:
        gate = gate_cls(values, active, K)
    except TypeError as exc:
        raise ConfigTypeError(f"gate kind {gate_cls.kind!r} could not be built as {gate_cls.__qualname__}(values, "
                              f"active, K): {exc}") from None
    with torch.no_grad():
        given = {"values()": gate.values(), "active()": gate.active(), "matrix(None)": gate.matrix(None)}
        for what, value in given.items():
            check_gate_shape(gate, what, value, module)
        check_active_rows(gate, given["active()"], module)
    if not gate.learnable and any(True for _ in gate.parameters()):
        raise ConfigTypeError(f"gate kind {gate_cls.kind!r} holds parameters but sets learnable = False; set "
                              "learnable = True and return them from real_parameters()")
    if gate.learnable and not gate.real_parameters():
        raise ConfigTypeError(f"gate kind {gate_cls.kind!r} is learnable, but real_parameters() returns no "
                              "parameter")
    return gate


class _PickledGenerator(NamedTuple):
    """A :class:`ConnectivityNet`'s ``torch.Generator`` in its pickle: torch pickles generators only from 2.4."""

    device: str
    seed: int
    state: torch.Tensor

    @classmethod
    def of(cls, generator: torch.Generator) -> _PickledGenerator:
        return cls(str(generator.device), generator.initial_seed(), generator.get_state())

    def restore(self) -> torch.Generator:
        generator = torch.Generator(device=self.device).manual_seed(self.seed)
        generator.set_state(self.state)
        return generator


#: The layout of a pickled :class:`ConnectivityNet`; older pickles lack it and are rebuilt when loaded.
PICKLE_FORMAT = 1


def _eager(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.compiler.disable(fn)``, made at the first call: importing ``torch._dynamo`` takes seconds, which
    every ``import connlearn`` (and ``connlearn --help``) would pay. torch's own lazy form of it, where this
    torch has one."""
    lazy = getattr(torch, "_disable_dynamo", None)
    return lazy(fn) if callable(lazy) else torch.compiler.disable(fn)


class ConnectivityNet(nn.Module):
    """A multi-branch network compiled from a :class:`BranchGraph`.

    Input ``[B, in_channels, H, W]`` images, output ``[B, num_classes]`` logits. In training mode a stochastic
    gate kind (``topk``) draws every module's connectivity once per forward, in one batched call, from the
    network's own CPU ``torch.Generator`` (:func:`~connlearn.gates.draw_generator` of the graph's ``seed``;
    its state is part of ``state_dict``, so checkpoints resume the same draws). In eval mode the connectivity
    is deterministic. ``sample_temperature`` (default 1, the paper's draws) sharpens (below 1) or flattens the
    draws of training mode (see :mod:`connlearn.gates`); a :class:`~connlearn.train.Trainer` sets it at every
    step from its recipe. :meth:`hold_draw` keeps one draw over several forward passes (gradient
    accumulation), and :attr:`activation_checkpointing` recomputes each module's activations in the backward
    pass instead of keeping them.
    """

    _checkpointing = False  # activation_checkpointing; a class default, which networks pickled before it lack
    #: The draw :meth:`hold_draw` keeps (a list of at most one draw) while one is held; ``None`` otherwise.
    _hold: list[dict[int, torch.Tensor]] | None = None

    def __init__(self, graph: BranchGraph, engine: str = "fused") -> None:
        super().__init__()
        check_name("engine", engine, ENGINES)
        check_graph(graph, "the graph a network is compiled from").validate()
        self._graph = copy.deepcopy(graph)
        self.K = graph.K
        self.gate_kind = graph.gate_kind
        gate_cls = GATES.get(self.gate_kind)
        inp, out = graph.nodes["input"], graph.nodes["output"]
        self.in_channels = inp["in_channels"]
        self.num_classes = out["num_classes"]
        stem = inp["stem"]
        self.stem = Stem(inp["in_channels"], inp["out_channels"], stem["kernel"], stem["stride"], stem["maxpool"])
        self.module_ids = graph.modules()
        infos = [_module_info(graph, m) for m in self.module_ids]
        homogeneous = all(i["homogeneous"] for i in infos)
        kinds = {graph.nodes[n]["block"] for n in graph.block_nodes()}
        position = {m: p for p, m in enumerate(self.module_ids)}
        sources = [_source_plan(graph, m, position) for m in self.module_ids]
        # one stream carries the sum of a module's branches: each module must read every branch of one module
        one_stream = all(len(plan) <= 1 and all(chosen is None for _, chosen in plan) for plan in sources)
        if (self.gate_kind == "full" and one_stream and len(kinds) == 1
                and hasattr(BLOCKS.get(next(iter(kinds))), "single_stream")):
            engine = "single-stream"
        elif engine == "auto":
            engine = "fused" if homogeneous else "reference"
        elif engine == "fused" and not homogeneous:
            raise ConfigError(
                "the fused engine needs the blocks of each module to share kind and parameters; "
                "use engine='reference' or 'auto'"
            )
        self.engine = engine
        self.stages = cast("_Stages", nn.ModuleList(
            self._make_module(graph, m, info, gate_cls) for m, info in zip(self.module_ids, infos, strict=True)
        ))
        self._sources = sources
        # every stride on the way to the last feature map (each layer gives ceil(size / stride))
        self._strides = [stem["stride"]] + [2] * bool(stem["maxpool"]) + [i["stride"] for i in infos]
        self._init_residuals(graph)
        self._init_convs(graph)
        self.head = Head(out["in_channels"], out["num_classes"])
        seed = graph.seed
        self.generator = draw_generator(seed)
        ties = tie_generator(seed)
        for module, stage in zip(self.module_ids, self.stages, strict=True):
            gate = stage.gate
            if gate is not None and hasattr(gate, "tie_order"):  # the graph's ties; a graph without: from the seed
                given = graph.tie_matrix(module)
                rows, cols = gate.shape
                order = random_tie_order(rows, cols, ties) if given is None else torch.tensor(given)
                cast(torch.Tensor, gate.tie_order).copy_(order)
        self._draws: collections.deque | None = None
        self._temperature = 1.0
        self._pickle_format = PICKLE_FORMAT

    def __getstate__(self) -> dict[str, Any]:
        """nn.Module's (without a compiled call), with the generator as its device, seed and state, so that a
        whole network pickles (``torch.save(net)``) on every torch this library supports, and loads on any."""
        state = self._module_state()
        if isinstance(state.get("generator"), torch.Generator):
            state["generator"] = _PickledGenerator.of(state["generator"])
        return state

    def _module_state(self) -> dict[str, Any]:
        """nn.Module's state (without a compiled call), less a held draw: that belongs to the block of code that
        holds it, not to a copy."""
        state = super().__getstate__()
        state.pop("_hold", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Unpickle a whole network (``torch.save(net)``); one pickled by an older connlearn, which lacks
        attributes of today's classes, is rebuilt from its graph and state dict, as a checkpoint is."""
        if isinstance(state.get("generator"), _PickledGenerator):
            state = {**state, "generator": state["generator"].restore()}
        super().__setstate__(state)
        if state.get("_pickle_format") != PICKLE_FORMAT:
            self.__dict__.update(self._rebuilt().__dict__)

    def _rebuilt(self) -> ConnectivityNet:
        vars(self).setdefault("_temperature", 1.0)  # the draws of every version before the option
        try:
            state = self.state_dict()
            for name, module in self.named_modules():  # gates pickled before tie orders: ties to the lower index
                if "real" in module._parameters and "tie_order" not in module._buffers:
                    state._metadata[name]["version"] = 1  # type: ignore[attr-defined]  # torch's hint lacks it
            with torch.random.fork_rng(devices=[]):
                net = ConnectivityNet(self._graph, engine=engine_to_rebuild(self.engine))
            net.to(**device_and_dtype(self))
            net.load_state_dict(state)
        except Exception as exc:
            raise CheckpointError(
                "this network was pickled whole (torch.save(net)) by an older connlearn and cannot be rebuilt "
                f"from its graph and weights ({type(exc).__name__}: {str(exc).strip()[:300]}); load it with the "
                "connlearn version that wrote it and save a checkpoint (connlearn.checkpoint) instead"
            ) from exc
        return net.train(self.training)

    @property
    def activation_checkpointing(self) -> bool:
        """Recompute each module's activations in the backward pass instead of keeping them from the forward
        pass (``torch.utils.checkpoint``, non-reentrant), whenever gradients are recorded (default ``False``).
        A gated network's modules hold C times ResNeXt's activations; this trades that memory for about one
        more forward pass. The recomputation uses the forward pass's connectivity (the draw is an input of
        each module, not drawn again) and leaves the batch norms' running statistics as the forward pass left
        them, so training computes what it computes without it. Under ``torch.compile`` the checkpointed
        modules are compiled on PyTorch 2.9 and later (a module that breaks the graph is checkpointed
        eagerly), and run eagerly, with a warning, before, where a compiled checkpoint counts a batch twice
        in the running statistics. A setting, not part of the ``state_dict``; copies, :meth:`to_engine` and
        pruning keep it."""
        return self._checkpointing

    @activation_checkpointing.setter
    def activation_checkpointing(self, value: bool) -> None:
        self._checkpointing = check_bool("activation_checkpointing", value)

    @property
    def sample_temperature(self) -> float:
        """The temperature of the training-mode draws (1: the paper's; below 1: closer to the top-K)."""
        return self._temperature

    @sample_temperature.setter
    def sample_temperature(self, value: float) -> None:
        self._temperature = self.check_temperature(value)

    def check_temperature(self, value: float, name: str = "sample_temperature") -> float:
        """``value`` as a float if this network's gate kinds can draw at that temperature, else a clear
        error (a user gate kind whose ``draw`` takes no ``temperature`` draws at 1 only)."""
        value = check_temperature(name, value)
        if value != 1.0:
            for gate in {type(s.gate) for s in self.stages if s.gate is not None and s.gate.stochastic}:
                if not _draws_with_temperature(gate):  # type: ignore[arg-type]  # a class is hashable
                    raise ConfigError(f"gate kind {gate.kind!r} draws without a temperature (its draw takes no "
                                      f"'temperature' argument); {name} must stay 1, got {value!r}")
        return value

    def _make_module(self, graph: BranchGraph, module: int, info: dict[str, Any], gate_cls: type) -> nn.Module:
        needs_proj = info["in_channels"] != info["out_channels"] or info["stride"] != 1
        proj = Projection(info["in_channels"], info["out_channels"], info["stride"]) if needs_proj else None
        nodes = info["nodes"]
        if self.engine == "single-stream":
            d = graph.nodes[nodes[0]]
            body = build_or_explain(
                f"the single stream of block kind {d['block']!r}", BLOCKS.get(d["block"]).single_stream,
                info["in_channels"], info["out_channels"], info["stride"], len(nodes), **d.get("params", {})
            )
            return SingleStreamModule(body, proj)
        gate = None
        if graph.candidates(module):
            values, active = graph.gate_matrix(module)
            gate = _make_gate(gate_cls, torch.tensor(values), torch.tensor(active), graph.K, module)
        if self.engine == "fused":
            return FusedModule(_make_block(graph, nodes, info), proj, gate, info)
        blocks = [_make_block(graph, [n], info) for n in nodes]
        return ReferenceModule(blocks, proj, gate, info)

    def _init_residuals(self, graph: BranchGraph) -> None:
        """Apply the graph's ``residual_init``: each branch's output starts at ``residual_scale(init, n)``,
        n the fan-in of the mean that reads it (K for gated readers, the head's inputs for the last module);
        ``"auto"`` leaves the blocks that cannot rescale as built."""
        init = check_residual_init(starts_of(graph.graph)["residual_init"])
        if init == "one" or self.engine == "single-stream":
            return
        head_fan_in = len(graph.in_edges("output"))
        for module, stage in zip(self.module_ids, self.stages, strict=True):
            out_edges = (d for n in graph.branches(module) for *_, d in graph.out_edges(n, data=True))
            gated = any(d.get("kind") == "gate" for d in out_edges)
            scale = residual_scale(init, graph.K if gated else max(1, head_fan_in))
            assert scale is not None  # None only for init "one"
            for block in [stage.block] if isinstance(stage, FusedModule) else cast(ReferenceModule, stage).blocks:
                if init != "auto" or scales_residual(block):
                    with _naming_kind(graph, module, f"residual_init={init!r}"):
                        init_residual_scale(block, scale)

    def _init_convs(self, graph: BranchGraph) -> None:
        """Apply the graph's ``conv_init``: with ``"resnext"``, every block's inner convolutions start at
        1/sqrt(C) of their per-branch draw, C the branches of its module: the scale of ResNeXt's one layer of
        the C branches' outputs (its fan-out is C times one branch's)."""
        init = check_conv_init(starts_of(graph.graph)["conv_init"])
        if init == "branch" or self.engine == "single-stream":
            return
        for module, stage in zip(self.module_ids, self.stages, strict=True):
            scale = 1.0 / math.sqrt(len(graph.branches(module)))
            for block in [stage.block] if isinstance(stage, FusedModule) else cast(ReferenceModule, stage).blocks:
                with _naming_kind(graph, module, f"conv_init={init!r}"):
                    init_conv_scale(block, scale)

    # ------------------------------------------------------------------- forward
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, in_channels, H, W]`` images → ``[B, num_classes]`` logits."""
        if not isinstance(x, torch.Tensor):
            if isinstance(x, torch.fx.Proxy):  # symbolic tracing, not a bad input
                raise ConfigError(
                    "torch.fx symbolic tracing (and torchvision's create_feature_extractor, which uses it) cannot "
                    "trace a ConnectivityNet: its forward pass checks the input's shape and draws the connectivity "
                    "eagerly. Read intermediate features with forward hooks (net.stem, net.stages[i]), or capture "
                    "the network with torch.export.export")
            raise ConfigTypeError(f"expected a tensor of images [B, {self.in_channels}, H, W], got {type(x).__name__}")
        if not torch.jit.is_tracing() and (x.dim() != 4 or x.shape[1] != self.in_channels):
            raise ShapeError(
                f"expected images of shape [B, {self.in_channels}, H, W], got {list(x.shape)}"
            )
        if not x.is_floating_point():
            raise ConfigTypeError(f"expected floating-point images (normalised, e.g. x.float() / 255), got {x.dtype}")
        if not torch.jit.is_tracing() and self._size_fails(x):  # compiled sizes of 0 and 1 are fixed
            self._refuse_size(x)
        # Images of another dtype than the weights fail in the stem unless autocast casts them. A weight that is
        # not a plain tensor, or empty (sharded by FSDP, which casts it later), is not checked; nor is float32,
        # which runs with autocast or without, nor the meta device, which autocast does not know.
        weight: Any = getattr(getattr(self.stem, "conv", None), "weight", None)
        checked = (not torch.jit.is_tracing() and type(weight) in (torch.Tensor, nn.Parameter) and weight.numel() > 0
                   and not x.dtype == weight.dtype == torch.float32 and x.device.type != "meta")
        if checked and _autocast_enabled(x.device.type):
            if not torch.compiler.is_compiling():
                _check_autocast(x.dtype, weight.dtype, _autocast_dtype(x.device.type))
        elif checked and x.dtype != weight.dtype:
            raise ConfigTypeError(f"the images are {x.dtype} and the network's weights {weight.dtype}: cast the "
                                  f"images (x.to({weight.dtype})) or the network (net.to({x.dtype})), or run it "
                                  "under torch.autocast")
        # Drawing first keeps the one graph break of torch.compile (the draw runs eagerly) at the start of
        # the forward pass, so the rest compiles to a single graph. Calling gate_matrices() here instead
        # would move the break into a nested frame and split the graph again (see the one-graph test).
        # A fixed connectivity (frozen, random, full) has nothing to draw, and compiles without the break.
        # The draw is a statement of its own: were it an argument of _scaled, the code that resumes after the
        # break would find a new bound method on its stack every step, which PyTorch 2.8 recompiles for.
        drawn = self._draw() if self.training and self.stochastic else {}
        mixes = self._scaled(drawn)
        if torch.compiler.is_compiling() or torch.jit.is_tracing():
            h = self.stem(x)
        else:
            try:
                h = self.stem(x)
            except RuntimeError as exc:  # named here, not before: a hook may bring the weights (offloading)
                weight = getattr(getattr(self.stem, "conv", None), "weight", None)
                if isinstance(weight, torch.Tensor) and weight.device != x.device:
                    raise ConfigError(f"the images are on {x.device} and the network on {weight.device}: move the "
                                      f"images (x.to({str(weight.device)!r})) or the network "
                                      f"(net.to({str(x.device)!r}))") from exc
                raise
        outputs: list[Any] = []
        for stage, plan, mix in zip(self.stages, self._sources, mixes, strict=True):
            if not plan:
                inputs = [h]
            elif self.engine == "single-stream":
                inputs = [outputs[plan[0][0]]]
            else:
                inputs = []
                for pos, chosen in plan:
                    inputs.extend(self._pick(outputs[pos], chosen, stage))
            outputs.append(self._run_stage(stage, inputs, mix))
        last = outputs[-1]
        if self.engine == "single-stream":
            pooled = last
        elif self.engine == "fused":
            b, _, hh, ww = last.shape
            c = self.stages[-1].branches
            pooled = last.reshape(b, c, last.shape[1] // c, hh, ww).mean(dim=1).relu()
        else:
            pooled = torch.stack(last, dim=1).mean(dim=1).relu()
        return self.head(pooled)

    def _run_stage(self, stage: nn.Module, inputs: list[Any], mix: torch.Tensor | None) -> Any:
        if not (self._checkpointing and torch.is_grad_enabled()):
            return stage(inputs, mix)
        if torch.compiler.is_compiling() and not _COMPILES_CHECKPOINTS:
            return _checkpoint_eagerly(stage, inputs, mix)
        return _checkpointed(stage, inputs, mix)

    def _size_fails(self, x: torch.Tensor) -> bool:
        """Whether images ``x`` have no pixels, or are a training batch whose last feature map holds one value
        per channel (which batch norm cannot normalise): :meth:`_refuse_size` names them here rather than a
        layer deep inside."""
        return 0 in x.shape[-2:] or (self.training and x.shape[0] == 1 and self._end_size(x) == (1, 1))

    def _end_size(self, x: torch.Tensor) -> tuple[int, int]:
        """The size of the last feature map of images ``x`` (each layer gives ceil(size / stride))."""
        h, w = x.shape[-2:]
        for stride in getattr(self, "_strides", ()):
            h, w = -(-h // stride), -(-w // stride)
        return h, w

    @_eager
    def _refuse_size(self, x: torch.Tensor) -> None:
        """The error of images that :meth:`_size_fails`; eager, so that under torch.compile only such batches
        break the graph."""
        h, w = x.shape[-2:]
        if h == 0 or w == 0:
            raise ShapeError(f"expected images of at least 1x1 pixels, got {h}x{w}")
        raise ShapeError(f"a training batch of 1 image of {h}x{w} ends in 1x1 feature maps, one value per channel, "
                         "which batch norm cannot normalise in training mode: train on batches of at least 2 images, "
                         "or run it in eval mode (net.eval())")

    def _pick(self, out: Any, chosen: list[int] | None, stage: Any) -> list[Any]:  # stage: a FusedModule if used
        if self.engine == "reference":
            return list(out) if chosen is None else [out[i] for i in chosen]
        if chosen is None:
            return [out]
        b, _, h, w = out.shape
        ch = stage.in_ch
        return [out.reshape(b, out.shape[1] // ch, ch, h, w)[:, chosen].reshape(b, len(chosen) * ch, h, w)]

    def gate_matrices(self) -> list[torch.Tensor | None]:
        """The gate matrices used by this forward pass, scaled by 1/K (``None`` for modules without gates).

        In training mode, stochastic gate kinds draw a new connectivity (one batched draw per kind).
        """
        return self._scaled(self._draw() if self.training and self.stochastic else {})

    def _scaled(self, drawn: dict[int, torch.Tensor]) -> list[torch.Tensor | None]:
        mixes: list[torch.Tensor | None] = []
        for index, (module, stage) in enumerate(zip(self.module_ids, self.stages, strict=True)):
            g = stage.gate
            if g is None:
                mixes.append(None)
                continue
            matrix = g.matrix(drawn.get(index))
            check_gate_shape(g, "matrix()", matrix, module)
            mixes.append(matrix / self.K)
        return mixes

    @contextlib.contextmanager
    def hold_draw(self) -> Iterator[ConnectivityNet]:
        """Within the ``with`` block, every training-mode forward pass uses one connectivity: the one the
        first of them draws. For gradient accumulation: the paper draws once per mini-batch (and DDP's ranks
        share one draw per global batch), so hold the draw over the micro-batches of one optimizer step::

            with net.hold_draw():
                for x, y in micro_batches:
                    F.cross_entropy(net(x), y).backward()
            opt.step()

        Also for ``torch.utils.checkpoint`` around the whole network, whose recomputation in the backward pass
        calls the forward pass again: run the backward pass inside the block (it then counts each batch twice
        in the batch norms' running statistics, as for any network; :attr:`activation_checkpointing`
        checkpoints each module with the forward pass's draw and does not). A block inside another holds
        the outer block's draw. Yields the network.
        """
        if self._hold is not None:
            yield self
            return
        self._hold = []
        try:
            yield self
        finally:
            self._hold = None

    @_eager
    def _draw(self) -> dict[int, torch.Tensor]:
        if self._hold:
            return self._hold[0]
        if _in_backward():  # a first draw in a backward pass: a recomputation drawing anew
            raise ConfigError(
                "a training-mode forward pass ran during a backward pass (torch.utils.checkpoint recomputing the "
                "whole network?): it would draw another connectivity than the forward pass did, and the gradients "
                "would be wrong. Set net.activation_checkpointing = True (it checkpoints each module, with the "
                "forward pass's draw), or run the forward and backward passes inside `with net.hold_draw():`")
        # keyed by the stage's position, not by the gate's id(): torch.compile would guard on the gate object
        # itself, and compile again for every network, up to its limit of recompilations, then run eagerly
        at = {i: s.gate for i, s in enumerate(self.stages) if s.gate is not None and s.gate.stochastic}
        gates = list(at.values())
        drawn: dict[int, torch.Tensor] = {}
        for cls in dict.fromkeys(type(g) for g in gates):
            indices = [i for i, g in at.items() if type(g) is cls]
            group = [at[i] for i in indices]
            # the default temperature is not passed: gate kinds without one keep working
            draws = cls.draw(group, self.generator, **({"temperature": t} if (t := self._temperature) != 1.0 else {}))
            try:
                draws = list(draws)
            except TypeError:
                raise ShapeError(f"gate kind {cls.kind!r}: draw() gave a {type(draws).__name__}; it returns a "
                                 "list of one [rows, cols] tensor per gate, in order") from None
            if len(draws) != len(group):
                raise ShapeError(f"gate kind {cls.kind!r}: draw() gave {len(draws)} draws for {len(group)} gates; "
                                 "it returns a list of one [rows, cols] tensor per gate, in order")
            for i, g, d in zip(indices, group, draws, strict=True):
                check_gate_shape(g, "draw()", d, self.module_ids[i])
                if d.requires_grad:  # it would be used again in the backward passes of a held draw, and fail there
                    raise ConfigTypeError(
                        f"gate kind {cls.kind!r} in module {self.module_ids[i]}: draw() gave a tensor with autograd "
                        "history; draws are values (detach them), and matrix(drawn) carries the gradient to the "
                        "real gates")
            drawn.update(zip(indices, draws, strict=True))
        if self._hold is not None:
            self._hold.append(drawn)
        if self._draws is not None and gates:
            actives = active_masks(gates)
            if len({drawn[i].shape for i in at}) == 1:  # alike (ResNeXt's): in one stack
                stacked = torch.stack([drawn[i] for i in at]).detach().bool()
                masks = stacked.unbind(0)
                agree = (stacked == torch.stack(actives)).all(dim=-1).unbind(0)
            else:
                masks = tuple(drawn[i].detach().bool() for i in at)
                agree = tuple((m == a).all(dim=1) for m, a in zip(masks, actives, strict=True))
            self._draws.append(list(zip(range(len(masks)), masks, agree, strict=True)))
        return drawn

    # ------------------------------------------------------------------ draw statistics
    def record_draws(self, on: bool = True, limit: int = 2000) -> None:
        """Start (or stop, with ``on=False``) recording the connectivities that stochastic gates draw in
        training; :meth:`draw_statistics` summarises them. The draws of the last ``limit`` steps stay on
        the device (no synchronisation per step) until the statistics are taken."""
        self._draws = collections.deque(maxlen=check_int("limit", limit, minimum=1)) if check_bool("on", on) else None

    def draw_statistics(self) -> dict[str, float | None]:
        """What the stochastic gates drew since :meth:`record_draws` (at most its ``limit`` last steps), and
        restart the record:

        - ``drawn_distinct``: the number of distinct input sets a block drew, averaged over blocks;
        - ``drawn_topk_share``: the share of draws equal to the block's top-K at that moment (near 1 when
          sampling follows the gates; ``1 / binom(N, K)`` when it is uniform over N candidates).

        Both are ``None`` when nothing was drawn (no stochastic gates, eval mode, or not recording).
        """
        draws = self._draws
        if draws is not None:
            self._draws = collections.deque(maxlen=draws.maxlen)
        if not draws:
            return {"drawn_distinct": None, "drawn_topk_share": None}
        by_gate: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        for step in draws:
            for index, mask, agree in step:
                by_gate.setdefault(index, []).append((mask, agree))
        distinct, agreement, rows = 0, 0.0, 0
        for pairs in by_gate.values():
            masks = torch.stack([m for m, _ in pairs]).cpu()  # [draws, rows, cols]
            agree = torch.stack([a for _, a in pairs]).float()
            distinct += sum(torch.unique(masks[:, r], dim=0).shape[0] for r in range(masks.shape[1]))
            agreement += agree.mean(dim=0).sum().item()
            rows += masks.shape[1]
        return {"drawn_distinct": distinct / rows, "drawn_topk_share": agreement / rows}

    # ------------------------------------------------------------------ queries
    def gates(self) -> Iterator[tuple[int, Gate]]:
        """``(module index, gate)`` for every module that has gates."""
        for module, stage in zip(self.module_ids, self.stages, strict=True):
            if stage.gate is not None:
                yield module, stage.gate

    @property
    def stochastic(self) -> bool:
        """Whether training-mode forward passes draw the connectivity (a stochastic gate kind such as ``topk``)."""
        return any(g.stochastic for _, g in self.gates())

    @property
    def fixed_connectivity(self) -> bool:
        """Whether the connectivity is fixed (gate kinds ``frozen``, ``random``, ``full``; the single-stream
        engine): no gate is learned or sampled, and :meth:`freeze` has nothing to do."""
        return self.engine == "single-stream" or not any(g.learnable or g.stochastic for _, g in self.gates())

    def evaluates_top_k(self) -> bool:
        """Whether every gate's evaluation matrix is its binary top-K (``active()``), as for ``topk`` and its
        subclasses and for fixed connectivities: then :meth:`freeze` leaves the eval outputs unchanged. Not so
        for ``real`` gates, which weight every input by its real value."""
        with torch.no_grad():
            return all(torch.equal(g.matrix(None).float(), g.active().float()) for _, g in self.gates())

    def gate_parameters(self) -> list[nn.Parameter]:
        """The learnable real gates (an own optimizer param group: no weight decay, own lr)."""
        return [p for _, g in self.gates() for p in g.real_parameters()]

    def no_weight_decay(self) -> set[str]:
        """The names of the learnable gates in ``named_parameters()`` (``stages.<i>.gate.real``), which the paper
        trains without weight decay: for optimizer builders that ask the model for them (timm's do) beside
        their rule for 1-D tensors, which misses the 2-D gates. ``connlearn.updater.param_groups`` leaves
        them out of weight decay itself and gives them their own learning rate."""
        gates = {id(p) for p in self.gate_parameters()}
        return {name for name, p in self.named_parameters() if id(p) in gates}

    def weight_parameters(self) -> list[nn.Parameter]:
        """Every parameter that is not a gate."""
        gate_ids = {id(p) for p in self.gate_parameters()}
        return [p for p in self.parameters() if id(p) not in gate_ids]

    def num_parameters(self, gates: bool = False) -> int:
        """Number of trainable parameters, without the gates unless ``gates=True``."""
        params = self.parameters() if gates else self.weight_parameters()
        return sum(p.numel() for p in params)

    def connectivity(self) -> dict[int, torch.Tensor]:
        """The evaluation-time connectivity: module index → boolean ``[C_i, N_i]`` (rows: blocks,
        columns: the module's candidate inputs, as ``graph().candidates(i)``)."""
        if self.engine == "single-stream":
            g = self._graph
            return {m: torch.tensor(g.gate_matrix(m)[1]) for m in self.module_ids if g.candidates(m)}
        return {m: g.active().cpu() for m, g in self.gates()}

    def graph(self) -> BranchGraph:
        """The IR of this network with the current gate values and active connections (a gate's top-K).
        Where the function weights every input by its gate value instead (``real`` gates before
        :meth:`freeze`), the graph says so: ``graph.graph["weighted_inputs"]`` is True."""
        g = copy.deepcopy(self._graph)
        g.graph["gate"] = self.gate_kind
        g.graph.pop("weighted_inputs", None)
        if self.engine == "single-stream":
            return g
        if not self.evaluates_top_k():  # real gates: eval mode weights every input by its value, not the top-K
            g.graph["weighted_inputs"] = True
        for module, gate in self.gates():
            values, active = gate.values().cpu().tolist(), gate.active().cpu().tolist()
            ties = cast(torch.Tensor, gate.tie_order).cpu().tolist() if hasattr(gate, "tie_order") else None
            cols = g.candidates(module)
            for j, node in enumerate(g.branches(module)):
                for k, src in enumerate(cols):
                    edge = g.edges[src, node]
                    edge["gate"] = float(values[j][k])
                    edge["active"] = bool(active[j][k])
                    if ties is None:
                        edge.pop("tie", None)
                    else:
                        edge["tie"] = int(ties[j][k])
        return g

    # ------------------------------------------------------------------ changes
    def freeze(self, connectivity: dict[int, torch.Tensor] | None = None) -> ConnectivityNet:
        """Fix the connectivity: every block keeps the top-K of its real gates (gate kind ``frozen``).

        ``connectivity`` (module index → boolean ``[rows, cols]``, as :meth:`connectivity` gives) fixes
        that one instead, e.g. another copy's: an ``AveragedModel`` (EMA, SWA) made before the freeze holds
        averaged gates of its own, and ``ema.module.freeze(net.connectivity())`` after ``net.freeze()``
        gives it the trained network's connectivity (and the same parameters, which its updates pair up).
        The real gates leave the module (and ``gate_parameters()``); their values stay visible in
        ``graph()``. A net that is already fixed is returned unchanged. Returns ``self``.
        """
        if self.fixed_connectivity:
            mine = self.connectivity()
            if connectivity is not None and not (  # a fixed connectivity stays: another one is refused, not ignored
                    isinstance(connectivity, dict) and set(connectivity) == set(mine)
                    and all(isinstance(connectivity[m], torch.Tensor) and connectivity[m].shape == mine[m].shape
                            and torch.equal(connectivity[m].cpu(), mine[m].cpu()) for m in mine)):
                raise ConfigError(f"this network's connectivity is fixed already ({self.gate_kind} gates), and the "
                                  "given one is another; freeze a copy made before the freeze, or build the network "
                                  "again")
            return self
        given = None if connectivity is None else self._given_connectivity(connectivity)
        kept = {}
        for module, stage in zip(self.module_ids, self.stages, strict=True):  # all checked before any is replaced
            g = stage.gate
            if g is not None:
                kept[stage] = g.values(), g.active() if given is None else given[module].to(g.values().device)
                check_active_rows(g, kept[stage][1], module, "active()" if given is None else "the given connectivity")
        for stage, (values, active) in kept.items():
            assert stage.gate is not None  # kept holds the stages with gates
            stage.gate = FrozenGate(values, active, stage.gate.K).to(values.device)
        self._graph.graph["frozen_from"] = self.gate_kind  # what learned it (a resumed trainer checks it)
        self.gate_kind = "frozen"
        self._graph = self.graph()
        return self

    def _given_connectivity(self, connectivity: Any) -> dict[int, torch.Tensor]:
        """``connectivity`` checked against this network's gates: one boolean ``[rows, cols]`` per gated module."""
        if not isinstance(connectivity, dict):
            raise ConfigTypeError(f"connectivity must be a dict of module index -> boolean [rows, cols] tensor (as "
                                  f"net.connectivity() gives), got {type(connectivity).__name__}")
        gated = dict(self.gates())
        if set(connectivity) != set(gated):
            raise ConfigError(f"connectivity names modules {sorted(connectivity, key=str)}; this network's gated "
                              f"modules are {sorted(gated)}")
        for module, mask in connectivity.items():
            if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
                raise ConfigTypeError(f"connectivity of module {module} must be a boolean tensor, got "
                                      f"{getattr(mask, 'dtype', type(mask).__name__)}")
            check_gate_shape(gated[module], "the given connectivity", mask, module)
        return connectivity

    def to_engine(self, engine: str) -> ConnectivityNet:
        """A copy of this network running on ``engine`` ('fused' or 'reference'), with the same weights,
        gates and generator state, and what was set on its modules after they were made (a batch norm's
        ``eps``, frozen parameters, channels-last weights, ``SyncBatchNorm``, training modes; not forward
        hooks). A Fixed-Full network on ResNeXt's single stream has no per-branch weights to move: it comes
        back as a copy, still single-stream."""
        check_name("engine", engine, ("fused", "reference"))
        if self.engine == "single-stream":
            return copy.deepcopy(self)
        with torch.random.fork_rng(devices=[]):  # the new weights are overwritten: leave the global RNG alone
            new = ConnectivityNet(self.graph(), engine=engine)
        new = new.to(**device_and_dtype(self))  # before loading, so that no weight is rounded on the way
        # the blocks that change form come from select()/merge(), which carry what was set on them after they
        # were made; the other modules are paired with the new network's to carry it (a batch norm's eps, frozen
        # parameters, channels-last weights, SyncBatchNorm, training modes); forward hooks do not go over
        converted: list[int] = []
        pairs = [(name, getattr(self, name), getattr(new, name)) for name in ("stem", "head")]
        # (select() and merge() are methods of the block kinds, not of nn.Module: require_block_method checks them)
        for pos, (old, stage) in enumerate(zip(self.stages, new.stages, strict=True)):
            stage.training = old.training
            pairs += [(f"stages.{pos}.proj", old.proj, stage.proj), (f"stages.{pos}.gate", old.gate, stage.gate)]
            if isinstance(old, FusedModule) and isinstance(stage, ReferenceModule):
                require_block_method(old.block, "select", "to_engine('reference')")
                stage.blocks = nn.ModuleList(old.block.select([j]) for j in range(old.branches))  # type: ignore[operator]
                stage.blocks.training = old.training
                converted.append(pos)
            elif isinstance(old, ReferenceModule) and isinstance(stage, FusedModule):
                require_block_method(old.blocks[0], "merge", "to_engine('fused')")
                stage.block = type(old.blocks[0]).merge(list(old.blocks))  # type: ignore[attr-defined]
                converted.append(pos)
            else:
                name = "blocks" if isinstance(old, ReferenceModule) else "block"
                pairs.append((f"stages.{pos}.{name}", getattr(old, name), getattr(stage, name)))
        pairs = [(name, mine, yours) for name, mine, yours in pairs if mine is not None]
        for name, mine, yours in pairs:
            check_same_kinds(mine, yours, f"to_engine(): {name}")
        blocks = tuple(f"stages.{pos}.{name}." for pos in converted for name in ("block", "blocks"))
        state = {k: v for k, v in self.state_dict().items() if not k.startswith(blocks)}
        state.update({k: v for k, v in new.state_dict().items() if k.startswith(blocks)})
        new.load_state_dict(state)
        for _, mine, yours in pairs:
            carry_settings(mine, yours, dict(yours.named_modules()))
        new.training = self.training
        new.activation_checkpointing = self.activation_checkpointing
        return new

    # ------------------------------------------------------------------ state
    def get_extra_state(self) -> dict[str, Any]:
        return {"generator": self.generator.get_state(), "temperature": self._temperature, "K": self.K,
                "gate": self.gate_kind}

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False) -> Any:
        """As ``nn.Module.load_state_dict``; a state of another network (other shapes, missing or unexpected
        keys) is a :class:`CheckpointError` that names the first difference, and a value that is no tensor
        names its key."""
        if not isinstance(state_dict, Mapping):  # torch's own check, as a TypeError of connlearn's
            raise ConfigTypeError(f"load_state_dict: the state dict must be a mapping of names to tensors (what "
                                  f"net.state_dict() gives), got {type(state_dict).__name__}")
        try:
            return super().load_state_dict(state_dict, strict=strict, assign=assign)
        except RuntimeError as exc:
            if not str(exc).startswith("Error(s) in loading state_dict"):
                raise
            gist = state_dict_mismatch(exc)
            keys = [str(k) for k in state_dict]
            wrapped = next((p for p in ("_orig_mod.", "module.") if any(k.startswith(p) for k in keys)), None)
            # torch names such a value by its name within its module ("weight"), not by its key
            own = self.state_dict(keep_vars=True)
            untensored = next((k for k in keys if k in own and not k.endswith("_extra_state")
                               and not isinstance(state_dict[k], torch.Tensor)), None)
            if untensored is not None:
                gist = f"{untensored!r} holds a value of type {type(state_dict[untensored]).__name__}, not a tensor"
                hint = "every value but the _extra_state entries is a tensor, as net.state_dict() gives"
            elif wrapped:
                hint = (f"its keys start with {wrapped!r}: it is the state of a wrapped network (torch.compile, "
                        "DDP); load the state of the network inside")
            else:
                hint = ("build the network it came from (a checkpoint holds its graph: "
                        "connlearn.checkpoint.net_from_checkpoint)")
            raise StateDictError(f"the state dict does not fit this network: {gist}; {hint}", gist) from None

    def set_extra_state(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict) or not isinstance(state.get("generator"), torch.Tensor):
            raise CheckpointError(f"this state dict's _extra_state is {state!r}, not a ConnectivityNet's (a dict "
                                  "holding the gate generator's state)")
        # K and the gate kind change the function without changing a tensor's shape: a state of another
        # network would load silently (states saved before they were recorded are not checked)
        theirs = {k: state[k] for k in ("K", "gate") if k in state}
        mine = {k: v for k, v in (("K", self.K), ("gate", self.gate_kind)) if k in theirs}
        if theirs != mine:
            said = ", ".join(f"{k}={v!r}" for k, v in theirs.items())
            raise CheckpointError(f"this state dict is of a network with {said}, this network has "
                                  f"{', '.join(f'{k}={v!r}' for k, v in mine.items())}; build the network it "
                                  "came from (a checkpoint holds its graph: connlearn.checkpoint.net_from_checkpoint)")
        self.generator.set_state(state["generator"])
        self.sample_temperature = state.get("temperature", 1.0)  # checkpoints before it: the default

    def __deepcopy__(self, memo: dict[int, Any]) -> ConnectivityNet:
        """``copy.deepcopy`` as for any module, with the generator copied by its seed and state: a
        ``torch.Generator`` cannot be deep-copied before torch 2.4."""
        if id(self.generator) not in memo:  # shared with whatever else in the copy holds it
            memo[id(self.generator)] = _PickledGenerator.of(self.generator).restore()
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        new.__setstate__(copy.deepcopy(self._module_state(), memo))
        return new


class _Recomputable:
    """``stage(inputs, mix)`` for ``torch.utils.checkpoint``. Its first call is the forward pass; a later one,
    the recomputation in the backward pass, leaves the stage's buffers as it found them, so that the batch
    norms' running statistics count each batch once, as without checkpointing."""

    def __init__(self, stage: nn.Module) -> None:
        self.stage, self.calls = stage, 0

    def __call__(self, inputs: list[Any], mix: torch.Tensor | None) -> Any:
        if torch.compiler.is_compiling():  # traced: the compiled recomputation updates no buffer
            return self.stage(inputs, mix)
        self.calls += 1
        if self.calls == 1:
            return self.stage(inputs, mix)
        with torch.no_grad():
            kept = [(b, b.clone()) for b in self.stage.buffers()]
        try:
            return self.stage(inputs, mix)
        finally:
            with torch.no_grad():
                for buffer, value in kept:
                    buffer.copy_(value)


def _checkpointed(stage: nn.Module, inputs: list[Any], mix: torch.Tensor | None) -> Any:
    """``stage(inputs, mix)`` under a non-reentrant checkpoint. Compiled, the recomputation is part of the graph;
    a module the compiler leaves to eager mode (a graph break) is checkpointed eagerly, where
    :class:`_Recomputable` keeps its buffers."""
    return torch.utils.checkpoint.checkpoint(_Recomputable(stage), inputs, mix, use_reentrant=False)


#: Whether torch.compile keeps a checkpointed batch norm's running statistics as eager training does. Before
#: PyTorch 2.9 they came out otherwise (2.4) or counted the batch twice (2.5-2.8), or the backward pass
#: failed (2.3).
_COMPILES_CHECKPOINTS = torch.__version__ >= "2.9"


@_eager
def _checkpoint_eagerly(stage: nn.Module, inputs: list[Any], mix: torch.Tensor | None) -> Any:
    """A checkpointed module, run outside the compiled graph: where torch.compile cannot checkpoint it as
    eager training does."""
    warnings.warn(f"activation checkpointing under torch.compile runs each checkpointed module eagerly on PyTorch "
                  f"{torch.__version__}: before 2.9, a compiled checkpoint counts a batch twice in the batch norms' "
                  "running statistics (or fails); PyTorch 2.9 or later compiles them", stacklevel=2)
    return _checkpointed(stage, inputs, mix)


def _in_backward() -> bool:
    """Whether autograd is running a backward pass on this thread (where a forward pass can only be a
    recomputation for activation checkpointing). False on a torch that cannot tell."""
    task = getattr(torch._C, "_current_graph_task_id", None)
    return callable(task) and task() != -1


def engine_to_rebuild(engine: str) -> str:
    """The ``engine`` argument that rebuilds a network whose ``.engine`` is ``engine``: a single-stream
    network is built with 'fused' (a Fixed-Full graph whose blocks have that form always compiles to it)."""
    return "fused" if engine == "single-stream" else engine


@functools.cache
def _draws_with_temperature(gate: type[Gate]) -> bool:
    """Whether a gate kind's ``draw`` takes a ``temperature`` (by name or through ``**kwargs``)."""
    params = inspect.signature(gate.draw).parameters
    return "temperature" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def _source_plan(graph: BranchGraph, module: int, position: dict[int, int]) -> list[tuple[int, list[int] | None]]:
    """For each source module of ``module``: its position and which of its branches are candidates
    (``None``: all of them)."""
    cols = set(graph.candidates(module))
    plan: list[tuple[int, list[int] | None]] = []
    for src in sorted({graph.nodes[c]["module"] for c in cols}):
        nodes = graph.branches(src)
        chosen = [i for i, n in enumerate(nodes) if n in cols]
        plan.append((position[src], None if len(chosen) == len(nodes) else chosen))
    return plan


def _takes_device_type() -> bool:
    try:
        torch.is_autocast_enabled("cpu")
    except TypeError:  # PyTorch before 2.4 takes no device type
        return False
    return True


_AUTOCAST_TAKES_DEVICE_TYPE = _takes_device_type()  # decided once, so that forward stays one graph to compile


def _autocast_enabled(device_type: str) -> bool:
    """Whether autocast is on for ``device_type`` (it then casts the images where the layers need it)."""
    if _AUTOCAST_TAKES_DEVICE_TYPE:
        return torch.is_autocast_enabled(device_type)
    return torch.is_autocast_cpu_enabled() if device_type == "cpu" else torch.is_autocast_enabled()


def _autocast_dtype(device_type: str) -> torch.dtype:
    """The dtype autocast runs in on ``device_type`` (when it is on)."""
    if hasattr(torch, "get_autocast_dtype"):  # PyTorch 2.4
        return torch.get_autocast_dtype(device_type)
    return torch.get_autocast_cpu_dtype() if device_type == "cpu" else torch.get_autocast_gpu_dtype()


def _check_autocast(images: torch.dtype, weights: torch.dtype, autocast: torch.dtype) -> None:
    """A :class:`ConfigTypeError` for images and weights of dtypes that autocast (running in ``autocast``)
    leaves apart, which fail deep inside a layer: it never casts float64 (a float64 network with float64
    images runs in float64), and the normalisation layers take float32 weights, or weights of its own dtype,
    only."""
    if images == weights == torch.float64:
        return
    if weights == torch.float64:
        raise ConfigTypeError(f"the network is torch.float64, which torch.autocast does not cast, and the images "
                              f"{images}: give it float64 images (x.double()), or cast it to float32 (net.float())")
    if images == torch.float64:
        raise ConfigTypeError(f"the images are torch.float64, which torch.autocast does not cast, and the network "
                              f"{weights}: cast them to float32 (x.float())")
    if weights not in (torch.float32, autocast):
        raise ConfigTypeError(f"the network's weights are {weights}, and torch.autocast runs in {autocast}: under "
                              f"autocast keep the network in float32 (net.float()), or run autocast in {weights}")


def check_net(obj: object, what: str = "net") -> ConnectivityNet:
    """``obj`` if it is a :class:`ConnectivityNet`; else a clear error (for a graph: compile it first)."""
    if isinstance(obj, ConnectivityNet):
        return obj
    hint = "; build one from it with connlearn.from_graph()" if isinstance(obj, BranchGraph) else ""
    for attr in ("module", "_orig_mod"):  # DistributedDataParallel, AveragedModel; torch.compile
        if isinstance(getattr(obj, attr, None), ConnectivityNet):
            hint = f"; it wraps one: pass {what}.{attr}"
        elif isinstance(getattr(getattr(obj, attr, None), "module", None), ConnectivityNet):
            hint = f"; it wraps one: pass {what}.{attr}.module"
    raise ConfigTypeError(f"{what} must be a connlearn ConnectivityNet, got {type(obj).__name__}{hint}")


def compile_graph(graph: BranchGraph, engine: str = "fused") -> ConnectivityNet:
    """Compile ``graph`` into a :class:`ConnectivityNet` (weights freshly initialised)."""
    return ConnectivityNet(graph, engine=engine)
