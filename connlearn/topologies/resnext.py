"""ResNeXt-style topologies: M modules of C parallel residual blocks, in stages of equal resolution.

Conventions (they make the gated parameter counts equal the paper's, and ``gate="full"`` equal ResNeXt):
depth D = 2 + 3M. CIFAR and Mini-ImageNet layouts: three stages of M/3 modules; stage s has output
channels ``base·2^s`` (base 64, or 256 for w >= 64 as in ResNeXt-29 8x64d) and bottleneck width ``w·2^s``;
the stem is a 3x3 convolution with 16 channels (64 for w >= 64); Mini-ImageNet adds a 3x3 max-pool of
stride 2 after the stem. ImageNet layout: the ResNeXt-50/101/152 stage depths, a 7x7 stride-2 stem with 64
channels and a max-pool, four stages with output ``256·2^s`` and bottleneck width ``w·2^s``. Every stage
but the first halves the resolution in its first module.
"""

from __future__ import annotations

import functools
import json
import math
from typing import Any

import attrs
import torch

from connlearn.blocks import (
    BLOCKS,
    DEFAULT_CONV_INIT,
    DEFAULT_RESIDUAL_INIT,
    block_parameters,
    check_conv_init,
    check_residual_init,
)
from connlearn.errors import ConfigError, ConfigTypeError, check_float, check_int, check_name, closest
from connlearn.gates import GATES, random_connectivity, random_tie_order, tie_generator, topk_mask
from connlearn.graph import BranchGraph, block_name


@attrs.frozen
class Layout:
    """The dataset-dependent frame of a ResNeXt: input size, stem and number of stages."""

    image_size: int
    stem_kernel: int
    stem_stride: int
    maxpool: bool
    num_classes: int
    stage_depths: dict[int, tuple[int, ...]] | None = None  # fixed per-depth stage sizes (ImageNet)


LAYOUTS: dict[str, Layout] = {
    "cifar": Layout(image_size=32, stem_kernel=3, stem_stride=1, maxpool=False, num_classes=100),
    "miniimagenet": Layout(image_size=64, stem_kernel=3, stem_stride=1, maxpool=True, num_classes=100),
    "imagenet": Layout(
        image_size=224, stem_kernel=7, stem_stride=2, maxpool=True, num_classes=1000,
        stage_depths={50: (3, 4, 6, 3), 101: (3, 4, 23, 3), 152: (3, 8, 36, 3)},
    ),
}

#: Every architecture of the paper's tables, as ``{layout}-{D}-{w}-{C}``.
PRESETS: dict[str, dict[str, Any]] = {
    "cifar-20-4-8": {"layout": "cifar", "depth": 20, "width": 4, "C": 8},
    "cifar-29-4-8": {"layout": "cifar", "depth": 29, "width": 4, "C": 8},
    "cifar-29-8-8": {"layout": "cifar", "depth": 29, "width": 8, "C": 8},
    "cifar-29-64-8": {"layout": "cifar", "depth": 29, "width": 64, "C": 8},
    "miniimagenet-20-4-8": {"layout": "miniimagenet", "depth": 20, "width": 4, "C": 8},
    "miniimagenet-29-8-8": {"layout": "miniimagenet", "depth": 29, "width": 8, "C": 8},
    "imagenet-50-4-32": {"layout": "imagenet", "depth": 50, "width": 4, "C": 32},
    "imagenet-101-4-32": {"layout": "imagenet", "depth": 101, "width": 4, "C": 32},
    "imagenet-101-4-64": {"layout": "imagenet", "depth": 101, "width": 4, "C": 64},
}

DEFAULTS: dict[str, Any] = {"layout": "cifar", "depth": 29, "width": 8, "C": 8}


_MAX_GATE_EDGES = 2**22  # C=256 with 65 modules; C=64, M=9 (the paper's largest CIFAR model) has 36,864


def _stages(layout_name: str, layout: Layout, M: int | None, depth: int | None) -> tuple[int, ...]:
    if depth is not None:
        depth = check_int("depth", depth, minimum=5)
        if (depth - 2) % 3:
            raise ConfigError(f"depth must be of the form 2 + 3M (e.g. 20, 29, 50, 101), got {depth}")
        from_depth = (depth - 2) // 3
        if M is not None and check_int("M", M, minimum=1) != from_depth:
            raise ConfigError(f"M={M} and depth={depth} disagree: depth = 2 + 3M gives M={from_depth}")
        M = from_depth
    M = check_int("M", M, minimum=1)
    if layout.stage_depths is not None:
        by_m = {(sum(s)): s for s in layout.stage_depths.values()}
        if M not in by_m:
            allowed = ", ".join(f"depth {d} (M={sum(s)})" for d, s in layout.stage_depths.items())
            raise ConfigError(f"the {layout_name!r} layout has fixed stage depths; allowed: {allowed}; got M={M}")
        return by_m[M]
    if M % 3:
        raise ConfigError(
            f"the {layout_name!r} layout has three stages of M/3 modules: M must be a multiple of 3, got M={M}"
        )
    return (M // 3,) * 3


def _block_params(block_params: Any) -> dict[str, Any]:
    """``block_params`` checked: a dict of JSON values keyed by parameter names, without ``width``."""
    if block_params is None:
        return {}
    if not isinstance(block_params, dict) or not all(isinstance(k, str) for k in block_params):
        raise ConfigTypeError(f"block_params must be a dict of keyword parameters, got {block_params!r}")
    if "width" in block_params:
        raise ConfigError("block_params may not set 'width': the topology gives every stage its own; use width=")
    try:
        json.dumps(block_params)
    except (TypeError, ValueError) as exc:
        raise ConfigTypeError(f"block_params must hold JSON values (they are saved in the graph): {exc}") from None
    return dict(block_params)


def _initial_gates(gate: str, rows: int, cols: int, K: int, gate_init: float | str, generator: torch.Generator,
                   ties: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Initial gate values, active flags and (for gates with real values) tie ranks of one module."""
    if gate == "full":
        ones = torch.ones(rows, cols)
        return ones, ones.bool(), None
    if gate == "random":
        mask = random_connectivity(rows, cols, K, generator)
        return mask.float(), mask, None
    if gate_init == "uniform":
        values = torch.rand(rows, cols, generator=generator)
    else:
        values = torch.full((rows, cols), float(gate_init))
    order = random_tie_order(rows, cols, ties)  # equal gates (all of them at a constant start) by this order
    return values, topk_mask(values, K, order), order


def resnext(
    *,
    C: int | None = None,
    M: int | None = None,
    depth: int | None = None,
    width: int | None = None,
    num_classes: int | None = None,
    preset: str | None = None,
    layout: str | None = None,
    block: str = "bottleneck",
    block_params: dict[str, Any] | None = None,
    gate: str = "topk",
    K: int | None = None,
    seed: int = 0,
    gate_init: float | str = 0.5,
    stem_channels: int | None = None,
    base_channels: int | None = None,
    in_channels: int = 3,
    residual_init: str = DEFAULT_RESIDUAL_INIT,
    conv_init: str = DEFAULT_CONV_INIT,
    dense: bool = False,
) -> BranchGraph:
    """The BranchGraph of a gated ResNeXt.

    Args:
        C: branches per module (cardinality). M or depth (= 2 + 3M): number of modules.
        width: bottleneck width w of one branch in the first stage (doubles every stage).
        preset: one of :data:`PRESETS` (e.g. ``"cifar-29-8-8"``); it gives the defaults of layout, depth,
            width and C, which explicit arguments override. Without preset and arguments: {D=29, w=8, C=8}
            on CIFAR-100.
        layout: ``"cifar"`` (32x32), ``"miniimagenet"`` (64x64, max-pool after the stem) or ``"imagenet"``.
        block: block kind name (see ``list_blocks()``). Each block gets ``width`` (the stage's bottleneck
            width) if its kind takes that parameter (:func:`~connlearn.blocks.block_parameters`), and
            ``block_params``: more keyword parameters for the block kind, the same in every module
            (JSON values, since they are part of the graph).
        gate: gate kind (see ``list_gates()``); K: fan-in, 1 <= K <= C (default C // 2; C for ``full``).
        seed: seeds the weights, the initial gates (``gate_init="uniform"``), the Fixed-Random draw, the
            order in which equal gates enter the top-K (each gate edge's ``tie``) and the network's gate
            generator.
        gate_init: initial real gate value in [0, 1], or ``"uniform"`` for U(0, 1) draws.
        stem_channels, base_channels: override the stem width and the first stage's output channels.
        residual_init: how each branch's output scale starts (its last BN's weight): ``"sqrt_k"``: sqrt
            of the number of outputs the mean that reads it averages (K, or C for the last module, which
            the head reads), so that the mean of roughly independent branches starts at unit scale, as
            ResNeXt's one BN of the summed branches does; ``"auto"`` (default): ``"sqrt_k"`` for blocks
            that support it (the built-in ones; see ``connlearn.blocks.scales_residual``), else
            ``"one"``; ``"one"``: every BN at 1, the usual start; ``"zero"``: each block starts as its
            shortcut. Fixed-Full's single stream has one BN of the summed branches and is not changed
            (``full`` with a block without a single-stream form runs gated and starts at sqrt(C)); ``real``
            gates mix every input by its real value over K, and n is K there too.
        conv_init: how the convolutions before each branch's last one start: ``"branch"`` (default): Kaiming
            with one branch's fan-out, as C separate blocks would; ``"resnext"``: 1/sqrt(C) of that, the
            scale at which ResNeXt starts the same layers (one layer of the C branches' outputs, C times the
            fan-out). Each of them feeds a batch norm, so the scale does not change the function, but SGD
            turns larger weights more slowly: with ``"branch"`` they start at about 1/C of ResNeXt's
            effective learning rate. The built-in blocks name these layers in ``inner_convs``. Fixed-Full's
            single stream is ResNeXt's own and is not changed.
        dense: let a block take gated inputs from every earlier module of its stage (same channels and
            resolution), DenseNet-style, instead of only the previous module.
    """
    if preset is not None:
        check_name("preset", preset, PRESETS)
        base = {**DEFAULTS, **PRESETS[preset]}
    else:
        base = dict(DEFAULTS)
    layout_name = layout if layout is not None else base["layout"]
    check_name("layout", layout_name, LAYOUTS)
    lay = LAYOUTS[layout_name]
    if M is None and depth is None:
        depth = base["depth"]
    C = check_int("C", C if C is not None else base["C"], minimum=1)
    width = check_int("width", width if width is not None else base["width"], minimum=1)
    num_classes = check_int("num_classes", num_classes if num_classes is not None else lay.num_classes, minimum=1)
    in_channels = check_int("in_channels", in_channels, minimum=1)
    seed = check_int("seed", seed, minimum=0, maximum=2**64 - 1)
    stages = _stages(layout_name, lay, M, depth)
    modules = sum(stages)
    edges = C * C * (modules - 1) if not dense else C * C * modules * (modules - 1) // 2
    if edges > _MAX_GATE_EDGES:
        raise ConfigError(f"C={C} with {modules} modules makes {edges:,} gate edges, more than the "
                          f"{_MAX_GATE_EDGES:,} this graph form holds (one edge per pair of branches; about 20 us "
                          "each to build)")
    takes = block_parameters(BLOCKS.get(block))  # an unknown (or broken) kind is named here
    takes_width = takes is None or "width" in takes
    extra = _block_params(block_params)
    GATES.get(gate)
    if gate == "frozen":
        raise ConfigError("gate='frozen' is what freeze() leaves; build with 'topk' (then freeze) or 'random'")
    if gate == "full":
        if dense:
            raise ConfigError("gate='full' is ResNeXt's connectivity; use it with topology 'resnext', not 'dense'")
        if K is not None and check_int("K", K, minimum=1) != C:
            raise ConfigError(f"gate='full' connects every input: K must equal C={C} (or be left out), got K={K}")
        K = C
    K = check_int("K", K if K is not None else max(1, C // 2), minimum=1)
    if K > C:
        raise ConfigError(f"K (each block's number of inputs) must be <= C={C} (the branches per module), got {K}")
    if isinstance(gate_init, str) and gate_init != "uniform":
        hint = "; did you mean 'uniform'?" if closest(gate_init, ["uniform"]) else ""
        raise ConfigError(f"gate_init must be a number in [0, 1] or 'uniform', got {gate_init!r}{hint}")
    if gate_init != "uniform":
        gate_init = check_float("gate_init", gate_init, minimum=0.0, maximum=1.0)
    check_residual_init(residual_init)
    check_conv_init(conv_init)

    if layout_name == "imagenet":
        stem_ch = 64 if stem_channels is None else stem_channels
        base_ch = 256 if base_channels is None else base_channels
    else:
        stem_ch = (64 if width >= 64 else 16) if stem_channels is None else stem_channels
        base_ch = (256 if width >= 64 else 64) if base_channels is None else base_channels
    stem_ch = check_int("stem_channels", stem_ch, minimum=1)
    base_ch = check_int("base_channels", base_ch, minimum=1)

    g = BranchGraph()
    g.graph.update(
        gate=gate, K=K, seed=seed, topology="dense" if dense else "resnext", residual_init=residual_init,
        conv_init=conv_init,
        options={"preset": preset, "layout": layout_name, "depth": 2 + 3 * sum(stages), "width": width, "C": C},
    )
    res = math.ceil(lay.image_size / lay.stem_stride)
    if lay.maxpool:
        res = math.ceil(res / 2)
    g.add_node(
        "input", kind="input", in_channels=in_channels, out_channels=stem_ch, image_size=lay.image_size,
        resolution=res, stem={"kernel": lay.stem_kernel, "stride": lay.stem_stride, "maxpool": lay.maxpool},
    )
    generator = torch.Generator().manual_seed(seed)
    ties = tie_generator(seed)
    module, prev_out = 0, stem_ch
    for s, count in enumerate(stages):
        out_ch, w = base_ch * 2**s, width * 2**s
        stage_modules: list[int] = []
        for p in range(count):
            module += 1
            stride = 2 if s > 0 and p == 0 else 1
            res = math.ceil(res / stride)
            for j in range(1, C + 1):
                g.add_node(
                    block_name(module, j), kind="block", module=module, branch=j, block=block,
                    in_channels=prev_out, out_channels=out_ch, stride=stride, resolution=res,
                    params={"width": w, **extra} if takes_width else dict(extra),
                )
            if module == 1:
                for j in range(1, C + 1):
                    g.add_edge("input", block_name(module, j), kind="fixed", active=True)
            else:
                sources = stage_modules if dense and p > 0 else [module - 1]
                cols = [block_name(m, k) for m in sources for k in range(1, C + 1)]
                values, active, order = _initial_gates(gate, C, len(cols), K, gate_init, generator, ties)
                for j in range(1, C + 1):
                    for c, src in enumerate(cols):
                        tie = {} if order is None else {"tie": int(order[j - 1, c])}
                        g.add_edge(src, block_name(module, j), kind="gate",
                                   gate=float(values[j - 1, c]), active=bool(active[j - 1, c]), **tie)
            stage_modules.append(module)
            prev_out = out_ch
    g.add_node("output", kind="output", in_channels=prev_out, num_classes=num_classes)
    for j in range(1, C + 1):
        g.add_edge(block_name(module, j), "output", kind="fixed", active=True)
    return g.validate()


@functools.wraps(resnext, assigned=("__module__",))
def dense(**kwargs: Any) -> BranchGraph:
    """Like :func:`resnext`, but a block may take gated inputs from any earlier module of its stage
    (same channels and resolution): the paper's proposed DenseNet-style skip connectivity."""
    kwargs.pop("dense", None)
    return resnext(**kwargs, dense=True)
