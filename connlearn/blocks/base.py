"""The block protocol: one object computes every branch of a module at once.

A block kind is called as ``kind(in_ch, out_ch, stride, branches, **params)`` and returns an ``nn.Module``
that maps ``[B, branches·in_ch, H, W]`` to ``[B, branches·out_ch, H', W']`` (branch-major channels), with

- ``branches``: how many branches it holds;
- ``select(indices)``: a new block holding only those branches, with their weights (the pruner uses it);
- ``merge(blocks)`` (classmethod): one block holding the branches of all ``blocks``, in order;
- ``init_residual_scale(scale)`` (optional): start every branch's output at ``scale`` times its usual scale,
  e.g. by filling the weight of its last normalisation. The network calls it when built with
  ``residual_init`` ``"sqrt_k"`` or ``"zero"``, and with ``"auto"`` (the default) where
  :func:`scales_residual` says the block has it (see :func:`residual_scale`);
- ``init_conv_scale(scale)`` (optional): multiply the weights of the convolutions before each branch's last
  one by ``scale``. The network calls it with 1/sqrt(C) when built with ``conv_init="resnext"``.

:class:`BranchBlock` implements ``select`` and ``merge`` for blocks whose every parameter and buffer is
stacked branch-major along dim 0 (grouped convolutions, batch norms), which is what the built-in blocks do,
``init_residual_scale`` for those that name their last normalisation in ``residual_norm``, and
``init_conv_scale`` for those that name their inner convolutions in ``inner_convs``.
"""

from __future__ import annotations

import copy
import inspect
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import torch
from torch import nn

from connlearn.errors import ConfigError, ConfigTypeError, ConnlearnError, check_int, check_name, closest

#: How a branch's output scale starts (the ``residual_init`` option of a topology).
RESIDUAL_INITS = ("auto", "sqrt_k", "one", "zero")
#: The default of the topologies; a graph without the attribute (written before it existed) means ``"one"``.
DEFAULT_RESIDUAL_INIT = "auto"


def check_residual_init(init: str) -> str:
    """``init`` if it is one of :data:`RESIDUAL_INITS`; else an error naming the allowed values."""
    return check_name("residual_init", init, RESIDUAL_INITS)


#: How the convolutions inside each branch start (the ``conv_init`` option of a topology).
CONV_INITS = ("branch", "resnext")
#: The default of the topologies, and what a graph without the attribute means.
DEFAULT_CONV_INIT = "branch"


def check_conv_init(init: str) -> str:
    """``init`` if it is one of :data:`CONV_INITS`; else an error naming the allowed values."""
    return check_name("conv_init", init, CONV_INITS)


#: The starts of a network whose record lacks the option: it was written before the option existed.
STARTS_BEFORE_THE_OPTIONS = {"residual_init": "one", "conv_init": "branch"}


def starts_of(record: Mapping[str, Any]) -> dict[str, str]:
    """The ``residual_init`` and ``conv_init`` that a graph's attributes (``graph.graph``) or a run's
    recorded options say; one that the record lacks is the start from before the option existed."""
    return {key: record.get(key, before) for key, before in STARTS_BEFORE_THE_OPTIONS.items()}


def residual_scale(init: str, fan_in: int) -> float | None:
    """The starting scale of a branch whose output is read through a mean of ``fan_in`` outputs.

    - ``"sqrt_k"``: ``sqrt(fan_in)``. The mean of ``fan_in`` independent unit-scale branches has scale
      ``1/sqrt(fan_in)``; this start gives it unit scale, as ResNeXt's one normalisation of the summed
      branches has.
    - ``"auto"`` (the default): ``"sqrt_k"`` for the blocks that can start at another scale
      (:func:`scales_residual`), ``"one"`` for the others.
    - ``"one"``: ``None``, the block stays as built (every normalisation at scale 1).
    - ``"zero"``: 0, every residual function starts at zero (the block starts as its shortcut).
    """
    check_residual_init(init)
    check_int("fan_in", fan_in, minimum=1)
    return {"auto": math.sqrt(fan_in), "sqrt_k": math.sqrt(fan_in), "one": None, "zero": 0.0}[init]


def scales_residual(block: nn.Module) -> bool:
    """Whether ``block`` can start its output at another scale: a working ``init_residual_scale``."""
    if isinstance(block, LoopedBlock):
        return all(scales_residual(m) for m in block.branch_modules)
    if isinstance(block, BranchBlock) and type(block).init_residual_scale is BranchBlock.init_residual_scale:
        return isinstance(getattr(block._residual_norm(), "weight", None), torch.Tensor)
    return callable(getattr(block, "init_residual_scale", None))


def init_residual_scale(block: nn.Module, scale: float) -> None:
    """Call ``block.init_residual_scale(scale)``, or explain that its kind cannot start at another scale."""
    _call_scale_hook(block, "init_residual_scale", scale, "residual_init can only be 'one' or 'auto'",
                     "a BranchBlock names its last norm in residual_norm")


def init_conv_scale(block: nn.Module, scale: float) -> None:
    """Call ``block.init_conv_scale(scale)``, or explain that its kind cannot start its convolutions so."""
    _call_scale_hook(block, "init_conv_scale", scale, "conv_init can only be 'branch'",
                     "a BranchBlock names its inner convolutions in inner_convs")


def _call_scale_hook(block: nn.Module, name: str, scale: float, consequence: str, how: str) -> None:
    hook = getattr(block, name, None)
    if not callable(hook):
        raise ConfigError(f"block {type(block).__name__} has no {name}(scale), so {consequence}; give the block "
                          f"that method ({how})")
    hook(scale)


def device_and_dtype(module: nn.Module) -> dict[str, Any]:
    """``module``'s device and floating dtype (of its first floating parameter or buffer), as keyword
    arguments of ``nn.Module.to``: a copy built anew is moved there before weights are loaded into it."""
    tensors = [t for t in itertools.chain(module.parameters(), module.buffers()) if t.is_floating_point()]
    if not tensors:
        return {}
    return {"device": tensors[0].device, "dtype": tensors[0].dtype}


def conv(in_ch: int, out_ch: int, kernel: int, branches: int, stride: int = 1) -> nn.Conv2d:
    """A bias-free convolution applied to every branch separately: ``groups = branches``."""
    return nn.Conv2d(
        branches * in_ch, branches * out_ch, kernel, stride=stride, padding=kernel // 2,
        groups=branches, bias=False,
    )


def init_branch_conv(layer: nn.Conv2d, branches: int) -> None:
    """Kaiming-normal (fan-out, ReLU) with the fan-out of ONE branch, so that a grouped layer of C
    branches draws from the same law as C separate layers (the reference engine)."""
    per_branch_out = layer.out_channels // branches
    fan_out = per_branch_out * layer.kernel_size[0] * layer.kernel_size[1]
    nn.init.normal_(layer.weight, 0.0, math.sqrt(2.0 / fan_out))


class BranchBlock(nn.Module):
    """Base class of blocks whose state is stacked branch-major along dim 0 of every tensor."""

    #: Keyword parameters the block accepts besides (in_ch, out_ch, stride, branches).
    params: ClassVar[tuple[str, ...]] = ()
    #: The attribute name of the normalisation whose affine weight scales every branch's output (the last
    #: one); ``None`` if there is none, and then ``residual_init`` can only be ``"one"`` or ``"auto"``.
    residual_norm: ClassVar[str | None] = None
    #: The convolutions before each branch's last one, whose ResNeXt counterpart is one layer of every
    #: branch's outputs together; ``conv_init="resnext"`` starts them at that layer's scale (1/sqrt(C)).
    inner_convs: ClassVar[tuple[str, ...]] = ()

    def __init__(self, in_ch: int, out_ch: int, stride: int, branches: int, **params: Any) -> None:
        super().__init__()
        self.in_ch = check_int("in_ch", in_ch, minimum=1)
        self.out_ch = check_int("out_ch", out_ch, minimum=1)
        self.stride = check_int("stride", stride, minimum=1)
        self.branches = check_int("branches", branches, minimum=1)
        unknown = set(params) - set(self.params)
        if unknown:
            raise ConfigError(
                f"{type(self).__name__} got unknown parameter(s) {sorted(unknown)}; "
                f"it takes {list(self.params) or 'none'}"
            )
        self.block_params = dict(params)

    def init_residual_scale(self, scale: float) -> None:
        """Start every branch's output at ``scale``: fill the weight of the norm named by ``residual_norm``."""
        norm = self._residual_norm()
        weight = getattr(norm, "weight", None)
        if not isinstance(weight, torch.Tensor):
            found = "no such submodule" if norm is None else f"{type(norm).__name__} without an affine weight"
            raise ConfigError(
                f"{type(self).__name__}.residual_norm = {self.residual_norm!r} names no affine last normalisation "
                f"({found}), so residual_init can only be 'one' or 'auto'"
            )
        with torch.no_grad():
            weight.fill_(float(scale))

    def init_conv_scale(self, scale: float) -> None:
        """Multiply the weights of the convolutions named by ``inner_convs`` by ``scale``."""
        if not self.inner_convs:
            raise ConfigError(f"{type(self).__name__}.inner_convs names no convolutions, so conv_init can only be "
                              "'branch'; name the convolutions before each branch's last one there")
        weights = []
        for name in self.inner_convs:
            try:
                layer = self.get_submodule(name)
            except AttributeError:
                layer = None
            weight = getattr(layer, "weight", None)
            if not isinstance(weight, torch.Tensor):
                raise ConfigError(f"{type(self).__name__}.inner_convs names {name!r}, which is not a layer with a "
                                  "weight, so conv_init can only be 'branch'")
            weights.append(weight)
        with torch.no_grad():
            for weight in weights:
                weight.mul_(float(scale))

    def _residual_norm(self) -> nn.Module | None:
        if not self.residual_norm:
            return None
        try:
            return self.get_submodule(self.residual_norm)  # dotted names reach into submodules
        except AttributeError:
            return None

    def _new(self, branches: int) -> BranchBlock:
        return type(self)(self.in_ch, self.out_ch, self.stride, branches, **self.block_params)

    def select(self, indices: Sequence[int]) -> BranchBlock:
        """A copy holding only the branches ``indices`` (0-based, in that order)."""
        indices = [check_int("branch index", i, minimum=0, maximum=self.branches - 1) for i in indices]
        if not indices:
            raise ConfigError("select() needs at least one branch index")
        new = self._new(len(indices)).to(**device_and_dtype(self))
        bad = _unstacked(self)
        if bad is not None:
            raise _stacking_error(f"{type(self).__qualname__}.select()", bad)
        state = {}
        for key, value in self.state_dict().items():
            if value.dim() == 0:
                state[key] = value.clone()
            else:
                chunks = value.chunk(self.branches, dim=0)
                state[key] = torch.cat([chunks[i] for i in indices], dim=0).clone()
        check_same_kinds(self, new, f"{type(self).__qualname__}.select()")
        new.load_state_dict(state)
        carry_settings(self, new)
        return new

    @classmethod
    def merge(cls, blocks: Sequence[BranchBlock]) -> BranchBlock:
        """One block holding the branches of ``blocks`` in order (they must agree in everything else)."""
        first = blocks[0]
        new = first._new(sum(b.branches for b in blocks)).to(**device_and_dtype(first))
        bad = _unstacked(first)
        if bad is not None:
            raise _stacking_error(f"{type(first).__qualname__}.merge()", bad)
        mine = settings_of(first)  # one block holds one setting (an eps, a mode) for all its branches
        for i, block in enumerate(blocks[1:], 1):
            theirs = settings_of(block)
            if theirs != mine:
                a, b = next(((a, b) for a, b in zip(mine, theirs, strict=False) if a != b), (mine[-1], theirs[-1]))
                raise ConfigError(f"{type(first).__qualname__}.merge(): blocks 0 and {i} differ in what was set on "
                                  f"them after they were made (submodule {a[0] or '(the block)'!r}: {a[1:]} against "
                                  f"{b[1:]}), and one block holds one setting for all its branches; set them alike "
                                  "first")
        check_same_kinds(first, new, f"{type(first).__qualname__}.merge()")
        states = [b.state_dict() for b in blocks]
        merged = {}
        for key, value in states[0].items():
            merged[key] = value.clone() if value.dim() == 0 else torch.cat([s[key] for s in states], dim=0)
        new.load_state_dict(merged)
        carry_settings(first, new)
        return new

    def extra_repr(self) -> str:
        extra = "".join(f", {k}={v}" for k, v in self.block_params.items())
        return f"in_ch={self.in_ch}, out_ch={self.out_ch}, stride={self.stride}, branches={self.branches}{extra}"


class Looped:
    """Adapts any single-branch module to the block protocol: one module per branch, run in a loop.

    ``Looped(factory)`` is a block kind: ``factory(in_ch, out_ch, stride, **params)`` must return an
    ``nn.Module`` mapping ``[B, in_ch, H, W]`` to ``[B, out_ch, H', W']``. Register it with
    ``connlearn.register_block("name", Looped(factory))``. Such blocks work with both engines; the fused
    engine then loops over branches inside the block only.
    """

    def __init__(self, factory: Callable[..., nn.Module]) -> None:
        if not callable(factory):
            raise ConfigTypeError(f"Looped needs a callable factory, got {factory!r}")
        signature = _signature(factory)
        if signature is not None:
            try:
                signature.bind_partial(1, 1, 1)
            except TypeError as exc:
                raise ConfigTypeError(
                    f"Looped({_describe(factory)}): the factory must take (in_ch, out_ch, stride, **params): {exc}"
                ) from None
        self.factory = factory

    def __call__(self, in_ch: int, out_ch: int, stride: int, branches: int, **params: Any) -> LoopedBlock:
        modules = [self.factory(in_ch, out_ch, stride, **params) for _ in range(branches)]
        if not isinstance(modules[0], nn.Module):
            raise ConfigTypeError(
                f"{self!r}: the factory returned {type(modules[0]).__name__}, not an nn.Module"
            )
        return LoopedBlock(modules, in_ch, out_ch, stride)

    def __repr__(self) -> str:
        return f"Looped({getattr(self.factory, '__name__', self.factory)!r})"


class LoopedBlock(nn.Module):
    """A block made of one plain module per branch (see :class:`Looped`)."""

    def __init__(self, modules: Sequence[nn.Module], in_ch: int, out_ch: int, stride: int) -> None:
        super().__init__()
        self.branch_modules = nn.ModuleList(modules)
        self.in_ch, self.out_ch, self.stride = in_ch, out_ch, stride

    @property
    def branches(self) -> int:
        return len(self.branch_modules)

    def init_residual_scale(self, scale: float) -> None:
        """Pass ``scale`` to every branch module's own ``init_residual_scale``."""
        for module in self.branch_modules:
            init_residual_scale(module, scale)

    def init_conv_scale(self, scale: float) -> None:
        """Pass ``scale`` to every branch module's own ``init_conv_scale``."""
        for module in self.branch_modules:
            init_conv_scale(module, scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = x.chunk(self.branches, dim=1)
        return torch.cat([m(p) for m, p in zip(self.branch_modules, parts, strict=True)], dim=1)

    def select(self, indices: Sequence[int]) -> LoopedBlock:
        """A copy holding only the branches ``indices`` (0-based, in that order)."""
        indices = [check_int("branch index", i, minimum=0, maximum=self.branches - 1) for i in indices]
        mods = [copy.deepcopy(self.branch_modules[i]) for i in indices]
        return LoopedBlock(mods, self.in_ch, self.out_ch, self.stride)

    @classmethod
    def merge(cls, blocks: Sequence[LoopedBlock]) -> LoopedBlock:
        """One block holding the branches of ``blocks`` in order."""
        mods = [copy.deepcopy(m) for b in blocks for m in b.branch_modules]
        first = blocks[0]
        return LoopedBlock(mods, first.in_ch, first.out_ch, first.stride)


# ---------------------------------------------------------------------- checking block kinds
_PROTOCOL = "a block kind is a BranchBlock subclass, a Looped(factory), or a callable (in_ch, out_ch, stride, " \
            "branches, **params) returning an nn.Module (see connlearn.blocks.base)"


def _describe(obj: Any) -> str:
    return repr(obj) if isinstance(obj, Looped) else getattr(obj, "__qualname__", None) or repr(obj)


def _signature(fn: Any) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins have none: their calls are not checked in advance
        return None


def check_block_kind(name: str, kind: Any) -> Any:
    """``kind`` if it can be a block kind (what ``register_block`` accepts); else a
    :class:`~connlearn.errors.ConfigTypeError` naming ``name`` and the protocol."""
    if isinstance(kind, Looped):
        return kind
    if isinstance(kind, type) and not issubclass(kind, nn.Module):
        raise ConfigTypeError(f"block kind {name!r}: {kind.__qualname__} is not an nn.Module subclass; {_PROTOCOL}")
    if not callable(kind):
        raise ConfigTypeError(f"block kind {name!r}: {kind!r} is not callable; {_PROTOCOL}")
    signature = _signature(kind)
    if signature is not None:
        try:
            signature.bind_partial(1, 1, 1, 1)
        except TypeError as exc:
            raise ConfigTypeError(
                f"block kind {name!r} ({_describe(kind)}) cannot take the arguments (in_ch, out_ch, stride, "
                f"branches): {exc}; {_PROTOCOL}"
            ) from None
    return kind


def block_parameters(kind: Any) -> set[str] | None:
    """The keyword parameters a block kind takes besides ``(in_ch, out_ch, stride, branches)`` (for a
    :class:`Looped` kind: those of its factory); ``None`` when it takes any (``**params``) or has no
    readable signature. A :class:`BranchBlock` that takes ``**params`` takes those of its ``params``."""
    target, positional = (kind.factory, 3) if isinstance(kind, Looped) else (kind, 4)
    signature = _signature(target)
    if signature is None:
        return None
    names: set[str] = set()
    seen = 0
    for p in signature.parameters.values():
        if p.kind is inspect.Parameter.VAR_KEYWORD:
            if isinstance(kind, type) and issubclass(kind, BranchBlock):
                return names | set(kind.params)
            return None
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and seen < positional:
            seen += 1
        elif p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            names.add(p.name)
    return names


def make_block(name: str, kind: Any, in_ch: int, out_ch: int, stride: int, branches: int,
               params: dict[str, Any]) -> nn.Module:
    """Call the block kind ``kind`` (registered as ``name``) for ``branches`` branches; a call it cannot
    take, or a result that is not a module of that many branches, is a clear error naming the kind."""
    if not isinstance(params, dict):
        raise ConfigTypeError(f"the parameters of block kind {name!r} must be a dict, got {params!r}")
    target, args = (kind.factory, (in_ch, out_ch, stride)) if isinstance(kind, Looped) else (
        kind, (in_ch, out_ch, stride, branches))
    signature = _signature(target)
    if signature is not None:
        try:
            signature.bind(*args, **params)
        except TypeError as exc:
            takes = block_parameters(kind)
            takes_text = "any" if takes is None else (", ".join(sorted(takes)) or "none")
            fixed = "its factory's (in_ch, out_ch, stride)" if isinstance(kind, Looped) else \
                "(in_ch, out_ch, stride, branches)"
            unknown = [k for k in params if takes is not None and k not in takes]
            hints = [f"{k!r}: did you mean {hit[0]!r}?" for k in unknown if (hit := closest(k, takes or ()))]
            raise ConfigError(
                f"block kind {name!r} ({_describe(kind)}) cannot be built with the parameters {params}: {exc}; "
                f"besides {fixed} it takes: {takes_text}" + (f" ({'; '.join(hints)})" if hints else "")
            ) from None
    block = build_or_explain(f"block kind {name!r} ({_describe(kind)})", kind, in_ch, out_ch, stride, branches,
                             **params)
    if isinstance(block, BranchBlock):
        lost = {k: v for k, v in params.items() if k not in block.block_params or block.block_params[k] != v}
        if lost:
            raise ConfigError(
                f"block kind {name!r} ({type(block).__qualname__}) was built with {lost} but did not pass them to "
                "BranchBlock.__init__, from which select() and merge() rebuild it: declare them in `params` and "
                "pass them on, e.g. super().__init__(in_ch, out_ch, stride, branches, kernel=kernel)"
            )
        _check_stacked(name, block)
    if not isinstance(block, nn.Module):
        raise ConfigTypeError(f"block kind {name!r} returned {type(block).__name__}, not an nn.Module; {_PROTOCOL}")
    held = getattr(block, "branches", branches)
    if isinstance(held, int) and held != branches:
        raise ConfigError(f"block kind {name!r} was asked for {branches} branches and its block holds {held}")
    return block


_PLAIN = (bool, int, float, str, type(None))


def _plain(value: Any) -> bool:
    return isinstance(value, _PLAIN) or (isinstance(value, tuple) and all(isinstance(v, _PLAIN) for v in value))


def _channels_last(t: torch.Tensor) -> bool:
    return t.dim() == 4 and not t.is_contiguous() and t.is_contiguous(memory_format=torch.channels_last)


def _fresh_modules(block: BranchBlock) -> dict[str, nn.Module]:
    """The submodules of a fresh block of ``block``'s kind and size, as its kind makes them (on the meta
    device, without touching the random state; a kind that needs real tensors is made on the CPU); empty
    if the kind cannot be made again."""
    for device in ("meta", "cpu"):
        try:
            with torch.random.fork_rng(devices=[]), torch.device(device):
                return dict(block._new(block.branches).named_modules())
        except Exception:
            continue
    return {}


def _is_batch_norm(module: nn.Module) -> bool:
    return isinstance(module, nn.modules.batchnorm._BatchNorm)


def check_same_kinds(source: nn.Module, target: nn.Module, what: str) -> None:
    """A :class:`ConfigError` unless every submodule of ``source`` has the type of ``target``'s of the same name
    (a batch norm made ``SyncBatchNorm`` stands for the batch norm it was): ``target`` is rebuilt from the
    kind that made ``source``, so a submodule replaced since cannot be carried over."""
    mine = dict(target.named_modules())
    for name, old in source.named_modules():
        new = mine.get(name)
        if new is None or type(old) is type(new) or (isinstance(old, nn.SyncBatchNorm) and _is_batch_norm(new)):
            continue
        raise ConfigError(f"{what}: the submodule {name or '(itself)'!r} is a {type(old).__qualname__}, but its "
                          f"kind makes a {type(new).__qualname__}; pruning and changing engines rebuild blocks from "
                          "their kind, so a submodule replaced after the block was made cannot be carried over "
                          "(replace it after pruning or changing engines)")


def carry_settings(source: nn.Module, target: nn.Module, reference: dict[str, nn.Module] | None = None) -> None:
    """Give ``target``, rebuilt from the kind that made ``source`` (with other branches, for ``select`` and
    ``merge``), what was set on ``source`` after it was made: plain attributes of its submodules that differ
    from ``reference``'s (a fresh block's submodules by name; by default made from ``source``'s kind), such as
    a batch norm's ``eps`` or ``momentum``; ``requires_grad``; channels-last weights; batch norms made
    ``SyncBatchNorm``; and training mode. Forward hooks are not carried. Call :func:`check_same_kinds` first."""
    if reference is None:
        reference = _fresh_modules(source) if isinstance(source, BranchBlock) else {}
    mine = dict(target.named_modules())
    for name, old in source.named_modules():
        new, made = mine.get(name), reference.get(name)
        if new is None:
            continue
        if isinstance(old, nn.SyncBatchNorm) and _is_batch_norm(new) and not isinstance(new, nn.SyncBatchNorm):
            new = _replace(target, name, nn.SyncBatchNorm.convert_sync_batchnorm(new, old.process_group))
        for key, value in vars(old).items():
            if key.startswith("_") or key == "training" or not _plain(value):
                continue
            if made is not None and getattr(made, key, value) != value:  # without a fresh one: none can tell
                setattr(new, key, value)
        new.training = old.training
        for kind in ("_parameters", "_buffers"):
            theirs = getattr(new, kind)
            for key, t in getattr(old, kind).items():
                if t is None or theirs.get(key) is None:
                    continue
                if _channels_last(t):
                    theirs[key].data = theirs[key].data.contiguous(memory_format=torch.channels_last)
                if kind == "_parameters":
                    theirs[key].requires_grad_(t.requires_grad)


def settings_of(block: nn.Module) -> list[tuple[Any, ...]]:
    """What :func:`carry_settings` carries, per submodule (type, training mode, plain attributes, and per
    tensor ``requires_grad`` and channels-last): blocks that ``merge`` joins must agree in it."""
    found = []
    for name, m in block.named_modules():
        plain = tuple(sorted((k, v) for k, v in vars(m).items() if not k.startswith("_") and _plain(v)))
        tensors = tuple((k, t.requires_grad, _channels_last(t)) for k, t in
                        itertools.chain(m._parameters.items(), m._buffers.items()) if t is not None)
        found.append((name, type(m).__qualname__, m.training, plain, tensors))
    return found


def _replace(root: nn.Module, name: str, module: nn.Module) -> nn.Module:
    parent, _, leaf = name.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, leaf, module)
    return module


def _unstacked(block: BranchBlock) -> str | None:
    """The first tensor of ``block`` that is not stacked per branch along dim 0, as a copy with one branch
    more shows (made on the meta device without touching the random state), or ``None``; also ``None`` for
    a kind that cannot be made there. Tensors of no dimension (batch-norm counters) are shared by design."""
    try:
        with torch.random.fork_rng(devices=[]), torch.device("meta"):
            other = block._new(block.branches + 1)
    except Exception:  # a kind that needs real tensors to be made is not checked
        return None
    mine, more = block.state_dict(), other.state_dict()
    for key, value in mine.items():
        bigger = more.get(key)
        if value.dim() == 0 and (bigger is None or bigger.dim() == 0):
            continue
        if (bigger is None or value.dim() == 0 or bigger.dim() != value.dim() or value.shape[1:] != bigger.shape[1:]
                or value.shape[0] % block.branches
                or bigger.shape[0] != value.shape[0] // block.branches * (block.branches + 1)):
            more_shape = list(bigger.shape) if bigger is not None else "absent"
            return f"{key} {list(value.shape)} ({more_shape} with one branch more)"
    return None


def _check_stacked(name: str, block: BranchBlock) -> None:
    """A :class:`ConfigError` unless every tensor of ``block`` holds its branches stacked along dim 0, which
    ``select`` and ``merge`` (pruning, ``to_engine``) rely on (see :func:`_unstacked`)."""
    bad = _unstacked(block)
    if bad is not None:
        raise _stacking_error(f"block kind {name!r} ({type(block).__qualname__})", bad)


def _stacking_error(what: str, detail: str) -> ConfigError:
    return ConfigError(
        f"{what} holds a tensor that is not stacked per branch: {detail}; every parameter and buffer of a "
        "BranchBlock must hold its branches' parts one after another along dim 0 (select() and merge() cut and "
        "join them there), or have no dimension. Give each branch its own copy, or wrap a one-branch module "
        "with connlearn.Looped"
    )


def build_or_explain(what: str, factory: Callable[..., Any], in_ch: int, out_ch: int, stride: int, branches: int,
                     **params: Any) -> Any:
    """``factory(in_ch, out_ch, stride, branches, **params)``; a failure of its own (channels that its groups
    do not divide, a parameter it lacks) is a :class:`ConfigError` naming ``what`` and the arguments."""
    try:
        return factory(in_ch, out_ch, stride, branches, **params)
    except ConnlearnError:
        raise
    except Exception as exc:
        raise ConfigError(
            f"{what} failed to build a module of {branches} branches from {in_ch} to {out_ch} channels at stride "
            f"{stride} with the parameters {params}: {type(exc).__name__}: {exc}"
        ) from exc


def require_block_method(block: nn.Module, method: str, purpose: str) -> None:
    """A clear error if ``block`` lacks ``method`` of the block protocol, which ``purpose`` needs."""
    if not callable(getattr(block, method, None)):
        raise ConfigError(
            f"{purpose} needs the blocks' {method}() (the block protocol of connlearn.blocks.base), and "
            f"{type(block).__qualname__} has none: subclass BranchBlock, or register the kind as Looped(factory)"
        )
