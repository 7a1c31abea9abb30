"""Topologies: functions of keyword options that emit a :class:`~connlearn.graph.BranchGraph`.

``resnext`` and ``dense`` build ResNeXt-style networks of M modules of C parallel residual blocks, in
stages of equal resolution. Conventions (they give the paper's gated parameter counts, and ResNeXt for
``gate="full"``): depth D = 2 + 3M; CIFAR and Mini-ImageNet: three stages of M/3 modules, stage s with
``base·2^s`` output channels (base 64, or 256 for w >= 64) and bottleneck width ``w·2^s``, a 3x3 stem of 16
channels (64 for w >= 64), Mini-ImageNet with a max-pool after it; ImageNet: ResNeXt-50/101/152's stage
depths, a 7x7 stride-2 stem of 64 channels and a max-pool, four stages of ``256·2^s`` outputs. Every stage
but the first halves the resolution in its first module.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import torch

from connlearn import wiring
from connlearn.blocks import BLOCKS, takes
from connlearn.errors import ConfigError, check_choice, check_float, check_int
from connlearn.gates import GATES
from connlearn.graph import CONV_INITS, RESIDUAL_INITS, BranchGraph, block_name

#: image size, stem (kernel, stride, max-pool), classes and, for ImageNet, the stage depths of each depth
LAYOUTS: dict[str, dict[str, Any]] = {
    "cifar": {"image_size": 32, "stem": (3, 1, False), "num_classes": 100},
    "miniimagenet": {"image_size": 64, "stem": (3, 1, True), "num_classes": 100},
    "imagenet": {"image_size": 224, "stem": (7, 2, True), "num_classes": 1000,
                 "stages": {50: (3, 4, 6, 3), 101: (3, 4, 23, 3), 152: (3, 8, 36, 3)}},
}

#: The architectures of the paper's tables, ``{layout}-{D}-{w}-{C}``.
PRESETS: dict[str, dict[str, Any]] = {
    f"{layout}-{d}-{w}-{c}": {"layout": layout, "depth": d, "width": w, "C": c}
    for layout, d, w, c in [("cifar", 20, 4, 8), ("cifar", 29, 4, 8), ("cifar", 29, 8, 8), ("cifar", 29, 64, 8),
                            ("miniimagenet", 20, 4, 8), ("miniimagenet", 29, 8, 8), ("imagenet", 50, 4, 32),
                            ("imagenet", 101, 4, 32), ("imagenet", 101, 4, 64)]
}


def resnext(*, C: int | None = None, M: int | None = None, depth: int | None = None, width: int | None = None,
            K: int | None = None, gate: str = "topk", num_classes: int | None = None, preset: str | None = None,
            layout: str | None = None, block: str = "bottleneck", block_params: dict[str, Any] | None = None,
            seed: int = 0, gate_init: float | str = 0.5, stem_channels: int | None = None,
            base_channels: int | None = None, in_channels: int = 3, image_size: int | None = None,
            input_size: tuple[int, ...] | list[int] | None = None,
            residual_init: str = "auto", conv_init: str | None = None, gate_options: dict[str, Any] | None = None,
            kernels: tuple[int, ...] | list[int] | None = None, dense: bool = False,
            uninformative: tuple[int, ...] | list[int] = (), density: float | None = None) -> BranchGraph:
    """The BranchGraph of a gated ResNeXt; by default the paper's Figure 3 model {D=29, w=8, C=8}, CIFAR-100.

    Args:
        C: branches per module. M, or depth = 2 + 3M: modules. width: a branch's bottleneck width in the first
            stage (doubled every stage). K: each block's fan-in, 1..C (default C // 2; ``full``: C).
        gate: gate kind (``list_gates()``). preset: one of :data:`PRESETS`, the defaults of layout, depth,
            width and C. layout: ``cifar`` (32x32), ``miniimagenet`` (64x64) or ``imagenet`` (224x224).
        block: block kind (``list_blocks()``), given the stage's ``width`` where it takes one, and
            ``block_params`` (JSON values, the same in every module).
        seed: the weights, the initial gates, the Fixed-Random draw, the tie orders and the draws.
        gate_init: the initial real gates, a value in [0, 1] or ``"uniform"``.
        stem_channels, base_channels, in_channels, image_size: override the layout's.
        input_size: ``(L,)`` for signals ``[B, in_channels, L]`` (1-D convolutions, the stages halving L),
            ``()`` for vectors ``[B, in_channels]`` (linear maps, block ``vector``); ``(S, S)``: ``image_size=S``.
        residual_init: each branch's output starts at ``sqrt_k``: sqrt(K), the fan-in of the mean reading it
            (C for the last module), so that the mean starts at unit scale as ResNeXt's one BN of the sum does;
            ``auto``: sqrt_k where the block can (the built-in ones); ``one``: as built; ``zero``.
        conv_init: a gated branch's convolutions before its last one start at ``branch`` scale (one branch's
            Kaiming draw, the default) or ``resnext`` (1/sqrt(C) of it); Fixed-Full keeps ResNeXt's own.
        gate_options: the gate kind's knobs (e.g. ``{"tau": 0.5}`` for ``gumbel``; see connlearn.estimators).
        kernels: branch j of every module gets the middle kernel ``kernels[(j - 1) % len(kernels)]`` (odd
            sizes, e.g. ``(1, 3, 5)``): unlike blocks, which run in a loop.
        dense: blocks may read every earlier module of their stage (DenseNet-style).
        uninformative: a planted control: these branches of module 1 output noise at their own scale.
        density: instead of K, one budget over the network: the share of its candidate edges kept (``wiring``).
    """
    base = {"layout": "cifar", "depth": 29, "width": 8, "C": 8, **(PRESETS[check_choice("preset", preset, PRESETS)]
                                                                    if preset is not None else {})}
    lay = LAYOUTS[check_choice("layout", layout or base["layout"], LAYOUTS)]
    C = check_int("C", base["C"] if C is None else C, 1)
    width = check_int("width", base["width"] if width is None else width, 1)
    stages = _stages(lay, M, base["depth"] if M is None and depth is None else depth)
    K = _fan_in(gate, K, C, density)
    gate_init = gate_init if gate_init == "uniform" else check_float("gate_init (or 'uniform')", gate_init, 0.0, 1.0)
    wide = width >= 64 or "stages" in lay  # ResNeXt-29 8x64d and ImageNet: a stem of 64, a first stage of 256
    stem_ch = check_int("stem_channels", stem_channels if stem_channels is not None else 64 if wide else 16, 1)
    base_ch = check_int("base_channels", base_channels if base_channels is not None else 256 if wide else 64, 1)
    shape, size = _input_shape(input_size, lay["image_size"] if image_size is None else image_size)
    block = "vector" if not shape and block == "bottleneck" else block  # the default kind, in its vector form
    g = BranchGraph(gate=gate, K=K, seed=check_int("seed", seed, 0, 2**64 - 1), topology="dense" if dense else
                    "resnext", **_starts(residual_init, conv_init), **_gated(gate, gate_options, density),
                    options={"preset": preset, "layout": layout or base["layout"], "depth": 2 + 3 * sum(stages),
                             "width": width, "C": C})
    _add_input(g, lay["stem"] if shape else (1, 1, False), shape, size, check_int("in_channels", in_channels, 1),
               stem_ch)
    last = _add_modules(g, stages, C, base_ch, bool(shape), dense, gate_init, block,
                        _block_params(block, block_params, width), _kernels(kernels, block))
    g.add_node("output", kind="output", in_channels=base_ch * 2**(len(stages) - 1),
               num_classes=check_int("num_classes", lay["num_classes"] if num_classes is None else num_classes, 1))
    g.add_edges_from(((block_name(last, j), "output") for j in range(1, C + 1)), kind="fixed", active=True)
    return _plant(wiring.spend(g), uninformative, C)


def _add_input(g: BranchGraph, stem: tuple[int, int, bool], shape: tuple[int, ...], size: int, in_channels: int,
               out_channels: int) -> None:
    """The input node: the layout's ``stem`` (kernel, stride, max-pool); for vectors a linear map, as no stage
    can halve a vector."""
    kernel, stride, maxpool = stem
    spatial = {"image_size": size} if len(shape) == 2 else {"input_size": list(shape)}
    g.add_node("input", kind="input", in_channels=in_channels, out_channels=out_channels, **spatial,
               resolution=math.ceil(math.ceil(size / stride) / (2 if maxpool else 1)),
               stem={"kernel": kernel, "stride": stride, "maxpool": maxpool})


def _add_modules(g: BranchGraph, stages: tuple[int, ...], C: int, base_ch: int, halves: bool, dense: bool,
                 gate_init: float | str, block: str, params: dict[str, Any], kernels: tuple[int, ...] | None) -> int:
    """Add the modules of ``stages`` to ``g`` (C blocks each, stage s of ``base_ch·2^s`` outputs, the first
    module of every stage but the first halving the resolution where the input ``halves``), with their edges
    and initial gates; returns the last module."""
    kind, values_rng = wiring.gate_class(g), torch.Generator().manual_seed(g.seed)
    module, prev, res = 0, g.nodes["input"]["out_channels"], g.nodes["input"]["resolution"]
    for s, count in enumerate(stages):
        stage_modules: list[int] = []
        for p in range(count):
            module, step = module + 1, 2 if s > 0 and p == 0 and halves else 1
            res = math.ceil(res / step)
            branch_params = {**params, "width": params["width"] * 2**s} if "width" in params else params
            for j in range(1, C + 1):
                own = {"kernel": kernels[(j - 1) % len(kernels)]} if kernels else {}
                g.add_node(block_name(module, j), kind="block", module=module, branch=j, block=block,
                           in_channels=prev, out_channels=base_ch * 2**s, stride=step, resolution=res,
                           params={**branch_params, **own})
            if module == 1:
                g.add_edges_from((("input", block_name(1, j)) for j in range(1, C + 1)), kind="fixed", active=True)
            else:
                sources = stage_modules if dense and p > 0 else [module - 1]
                cols = [block_name(m, k) for m in sources for k in range(1, C + 1)]
                values, active = kind.initial(C, len(cols), g.K, gate_init, values_rng)
                for j, c in itertools.product(range(C), range(len(cols))):
                    g.add_edge(cols[c], block_name(module, j + 1), kind="gate", gate=float(values[j, c]),
                               active=bool(active[j, c]))
            stage_modules.append(module)
            prev = base_ch * 2**s
    return module


def _starts(residual_init: str, conv_init: str | None) -> dict[str, str]:
    """The graph's attributes of how the branches start: ``conv_init`` only where given."""
    check_choice("residual_init", residual_init, RESIDUAL_INITS)
    return {"residual_init": residual_init} if conv_init is None else {
        "residual_init": residual_init, "conv_init": check_choice("conv_init", conv_init, CONV_INITS)}


def _plant(g: BranchGraph, uninformative: tuple[int, ...] | list[int], C: int) -> BranchGraph:
    """``g`` with the branches of module 1 marked whose outputs the network replaces by Gaussian noise at the
    scale of the output they replace, in training and evaluation (a planted control)."""
    if set(uninformative) - set(range(1, C + 1)) or (uninformative and GATES.get(g.gate_kind).single_stream):
        raise ConfigError(f"uninformative takes branches of module 1, 1 to C={C}, of a network with branches; got "
                          f"{list(uninformative)} with gate {g.gate_kind!r}")
    for j in uninformative:
        g.nodes[block_name(1, j)]["uninformative"] = True
    return g


def _input_shape(input_size: Any, image_size: int) -> tuple[tuple[int, ...], int]:
    """``(spatial shape, the stem's input length)`` of ``input_size`` (``()``, ``(L,)``, ``(S, S)``), else of
    square images of ``image_size``."""
    name, sizes = ("image_size", (image_size,) * 2) if input_size is None else ("input_size", input_size)
    shape = tuple(check_int(name, n, 1) for n in sizes)
    if len(shape) > 2 or len(set(shape)) > 1:
        raise ConfigError(f"input_size must be (), (L,) or square (S, S); got {input_size!r}")
    return shape, shape[0] if shape else 1


def _kernels(kernels: Any, block: str) -> tuple[int, ...] | None:
    """The branches' kernel sizes, checked (see :func:`resnext`)."""
    if kernels is None:
        return None
    kernels = tuple(kernels)
    if not kernels or not all(isinstance(k, int) and k >= 1 and k % 2 for k in kernels):
        raise ConfigError(f"kernels must be odd sizes, e.g. (1, 3, 5); got {kernels!r}")
    if not takes(BLOCKS.get(block), "kernel"):
        raise ConfigError(f"kernels: block kind {block!r} takes no 'kernel' (bottleneck does)")
    return kernels


def _block_params(block: str, block_params: dict[str, Any] | None, width: int) -> dict[str, Any]:
    """The params of every block: ``block_params``, and the first stage's ``width`` where the kind takes one."""
    params = dict(block_params or {})
    if "width" in params:
        raise ConfigError("block_params may not set 'width': every stage has its own; use width=")
    return {**params, "width": width} if takes(BLOCKS.get(block), "width") else params


def _gated(gate: str, gate_options: dict[str, Any] | None, density: float | None) -> dict[str, Any]:
    """The graph's attributes of its gates beside their kind: their knobs, where given, and their weighting."""
    return {**({"gate_options": dict(gate_options)} if gate_options else {}),
            **wiring.weighting_attributes(gate, density)}


def _fan_in(gate: str, K: int | None, C: int, density: float | None = None) -> int:
    """The fan-in K of gate kind ``gate`` for C branches: as given (default C // 2), or what the kind keeps;
    under a ``density``, its share of C (the budget's spend then sets the mean a block keeps)."""
    if density is not None:
        return wiring.check_density(gate, K, density, C)
    kept = GATES.get(gate).kept(max(1, C // 2) if K is None else check_int("K", K, 1, C), C)
    if K is not None and kept != K:
        raise ConfigError(f"gate {gate!r} reads {kept} of C={C} inputs: K must be {kept} (or left out), got K={K}")
    return kept


def _stages(lay: dict[str, Any], M: int | None, depth: int | None) -> tuple[int, ...]:
    if depth is not None:
        if (check_int("depth", depth, 5) - 2) % 3 or (M is not None and (depth - 2) // 3 != M):
            raise ConfigError(f"depth must be 2 + 3M (20, 29, 50, 101, ...), got depth={depth}" +
                              (f" with M={M}" if M is not None else ""))
        M = (depth - 2) // 3
    M = check_int("M", M, 1)
    if "stages" in lay:
        by_m = {sum(s): s for s in lay["stages"].values()}
        if M not in by_m:
            raise ConfigError(f"the imagenet layout has depths {', '.join(map(str, lay['stages']))}; got M={M}")
        return by_m[M]
    if M % 3:
        raise ConfigError(f"three stages of M/3 modules: M must be a multiple of 3, got M={M}")
    return (M // 3,) * 3
