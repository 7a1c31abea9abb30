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

import math
from typing import Any

import torch

from connlearn.blocks import BLOCKS, takes
from connlearn.errors import ConfigError, check_choice, check_float, check_int
from connlearn.gates import GATES, random_connectivity, random_tie_order, tie_generator, topk_mask
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
            residual_init: str = "auto", conv_init: str = "branch", gate_options: dict[str, Any] | None = None,
            kernels: tuple[int, ...] | list[int] | None = None, dense: bool = False,
            uninformative: tuple[int, ...] | list[int] = ()) -> BranchGraph:
    """The BranchGraph of a gated ResNeXt; by default the paper's Figure 3 model {D=29, w=8, C=8}, CIFAR-100.

    Args:
        C: branches per module. M, or depth = 2 + 3M: modules. width: a branch's bottleneck width in the first
            stage (doubled every stage). K: each block's fan-in, 1..C (default C // 2; C for ``full``).
        gate: gate kind (``list_gates()``). preset: one of :data:`PRESETS`, the defaults of layout, depth,
            width and C. layout: ``cifar`` (32x32), ``miniimagenet`` (64x64) or ``imagenet`` (224x224).
        block: block kind (``list_blocks()``), given the stage's ``width`` where it takes one, and
            ``block_params`` (JSON values, the same in every module).
        seed: the weights, the initial gates, the Fixed-Random draw, the tie orders and the draws.
        gate_init: the initial real gates, a value in [0, 1] or ``"uniform"``.
        stem_channels, base_channels, in_channels, image_size: override the layout's.
        input_size: the data's spatial shape beyond images: ``(L,)`` for signals ``[B, in_channels, L]`` (1-D
            convolutions, the stages halving L), ``()`` for vectors ``[B, in_channels]`` (linear maps, block
            ``vector``); ``(S, S)`` is ``image_size=S``.
        residual_init: each branch's output starts at ``sqrt_k``: sqrt(K), the fan-in of the mean reading it
            (C for the last module), so that the mean starts at unit scale as ResNeXt's one BN of the sum does;
            ``auto``: sqrt_k where the block can (the built-in ones); ``one``: as built; ``zero``.
        conv_init: the convolutions before each branch's last one start at ``branch`` scale (Kaiming, one
            branch's fan-out) or ``resnext`` (1/sqrt(C) of it, ResNeXt's scale for those layers).
        gate_options: the gate kind's knobs (e.g. ``{"tau": 0.5}`` for ``gumbel``; see connlearn.estimators).
        kernels: branches that are not interchangeable: branch j of every module gets the middle kernel
            ``kernels[(j - 1) % len(kernels)]`` (odd sizes, e.g. ``(1, 3, 5)``); its modules then hold unlike
            blocks, which the fused engine runs in a loop.
        dense: blocks may read every earlier module of their stage (DenseNet-style).
        uninformative: a planted control: these branches of module 1 (1-based) output Gaussian noise at the scale
            of the output they replace, in training and evaluation (recorded on their nodes).
    """
    base = {"layout": "cifar", "depth": 29, "width": 8, "C": 8, **(PRESETS[check_choice("preset", preset, PRESETS)]
                                                                    if preset is not None else {})}
    lay = LAYOUTS[check_choice("layout", layout or base["layout"], LAYOUTS)]
    C = check_int("C", base["C"] if C is None else C, 1)
    width = check_int("width", base["width"] if width is None else width, 1)
    stages = _stages(lay, M, base["depth"] if M is None and depth is None else depth)
    K = _fan_in(gate, K, C)
    if gate_init != "uniform":
        gate_init = check_float("gate_init (or 'uniform')", gate_init, 0.0, 1.0)
    check_choice("residual_init", residual_init, RESIDUAL_INITS)
    check_choice("conv_init", conv_init, CONV_INITS)
    seed = check_int("seed", seed, 0, 2**64 - 1)
    kernel, stride, maxpool = lay["stem"]
    wide = width >= 64 or "stages" in lay  # ResNeXt-29 8x64d and ImageNet: a stem of 64, a first stage of 256
    stem_ch = check_int("stem_channels", stem_channels if stem_channels is not None else 64 if wide else 16, 1)
    base_ch = check_int("base_channels", base_channels if base_channels is not None else 256 if wide else 64, 1)
    shape, size = _input_shape(input_size, lay["image_size"] if image_size is None else image_size)
    dims = len(shape)
    if dims == 0:
        kernel, stride, maxpool = 1, 1, False  # a linear stem; no stage can halve a vector
        block = "vector" if block == "bottleneck" else block  # the default kind, in its vector form
    params = _block_params(block, block_params, width)
    kernels = _kernels(kernels, block)
    if gate_options is not None and not isinstance(gate_options, dict):
        raise ConfigError(f"gate_options must be a dict of the gate kind's knobs, got {gate_options!r}")
    knobs = {"gate_options": dict(gate_options)} if gate_options else {}
    g = BranchGraph(gate=gate, K=K, seed=seed, topology="dense" if dense else "resnext", residual_init=residual_init,
                    conv_init=conv_init, **knobs, options={"preset": preset, "layout": layout or base["layout"],
                                                           "depth": 2 + 3 * sum(stages), "width": width, "C": C})
    res = math.ceil(math.ceil(size / stride) / (2 if maxpool else 1))
    spatial = {"image_size": size} if dims == 2 else {"input_size": list(shape)}
    g.add_node("input", kind="input", in_channels=check_int("in_channels", in_channels, 1), out_channels=stem_ch,
               **spatial, resolution=res, stem={"kernel": kernel, "stride": stride, "maxpool": maxpool})
    values_rng, ties = torch.Generator().manual_seed(seed), tie_generator(seed)
    module, prev = 0, stem_ch
    for s, count in enumerate(stages):
        stage_modules: list[int] = []
        for p in range(count):
            module, step = module + 1, 2 if s > 0 and p == 0 and dims else 1
            res = math.ceil(res / step)
            branch_params = {**params, "width": width * 2**s} if "width" in params else params
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
                _add_gates(g, module, cols, _initial_gates(gate, C, len(cols), K, gate_init, values_rng, ties))
            stage_modules.append(module)
            prev = base_ch * 2**s
    classes = check_int("num_classes", lay["num_classes"] if num_classes is None else num_classes, 1)
    g.add_node("output", kind="output", in_channels=prev, num_classes=classes)
    g.add_edges_from(((block_name(module, j), "output") for j in range(1, C + 1)), kind="fixed", active=True)
    _plant(g, uninformative, C, gate)
    return g


def _plant(g: BranchGraph, uninformative: tuple[int, ...] | list[int], C: int, gate: str) -> None:
    """Mark the branches of module 1 whose outputs the network replaces by noise (a planted control)."""
    if set(uninformative) - set(range(1, C + 1)) or (uninformative and gate == "full"):
        raise ConfigError(f"uninformative takes branches of module 1, 1 to C={C}, of a gated network; got "
                          f"{list(uninformative)} with gate {gate!r}")
    for j in uninformative:
        g.nodes[block_name(1, j)]["uninformative"] = True


def _input_shape(input_size: Any, image_size: int) -> tuple[tuple[int, ...], int]:
    """``(spatial shape, the stem's input length)`` of ``input_size`` (``()``, ``(L,)``, ``(S, S)``), else of
    square images of ``image_size``."""
    if input_size is None or len(input_size) == 2:
        shape = tuple(input_size or (image_size, image_size))
        if shape[0] != shape[1]:
            raise ConfigError(f"input_size must be (), (L,) or square (S, S); got {input_size!r}")
        side = check_int("image_size" if input_size is None else "input_size", shape[0], 1)
        return (side, side), side
    shape = tuple(check_int("input_size", n, 1) for n in input_size)
    if len(shape) > 1:
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


def _fan_in(gate: str, K: int | None, C: int) -> int:
    """The fan-in K of gate kind ``gate`` (checked) for C branches."""
    GATES.get(gate)
    if gate == "frozen":
        raise ConfigError("gate 'frozen' is what freeze() leaves; build 'topk' (and freeze it) or 'random'")
    if gate == "full" and K not in (None, C):
        raise ConfigError(f"gate 'full' reads every input: K must be C={C} (or left out), got K={K}")
    return check_int("K", C if gate == "full" else max(1, C // 2) if K is None else K, 1, C)


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


def _add_gates(g: BranchGraph, module: int, cols: list[str],
               gates: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]) -> None:
    """The gate edges into ``module`` from ``cols``, of the initial values, flags and ties ``gates``."""
    values, active, order = gates
    for j in range(values.shape[0]):
        for c, src in enumerate(cols):
            tie = {} if order is None else {"tie": int(order[j, c])}
            g.add_edge(src, block_name(module, j + 1), kind="gate", gate=float(values[j, c]),
                       active=bool(active[j, c]), **tie)


def _initial_gates(gate: str, rows: int, cols: int, K: int, gate_init: float | str, values_rng: torch.Generator,
                   ties: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """One module's initial gate values, active flags and (for learned gates) tie ranks."""
    if gate == "full":
        return torch.ones(rows, cols), torch.ones(rows, cols, dtype=torch.bool), None
    if gate == "random":
        mask = random_connectivity(rows, cols, K, values_rng)
        return mask.float(), mask, None
    values = (torch.rand(rows, cols, generator=values_rng) if gate_init == "uniform"
              else torch.full((rows, cols), float(gate_init)))
    order = random_tie_order(rows, cols, ties)
    return values, topk_mask(values, K, order), order
