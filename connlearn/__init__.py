"""connlearn: learn how the branches of a multi-branch network connect, jointly with the weights.

GateConnect (Ahmed & Torresani, "Connectivity Learning in Multi-Branch Networks"): ResNeXt-style modules
of C parallel residual blocks, each block taking the mean of K of the previous module's branch outputs,
chosen by binary gates sampled from learned real-valued gates.

    >>> import connlearn
    >>> net = connlearn.build(topology="resnext", C=8, M=9, gate="topk", K=1)
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import Any

import torch

from connlearn.blocks import BLOCKS, Looped
from connlearn.compile import ConnectivityNet, compile_graph
from connlearn.errors import ConfigError, ConfigTypeError, ConnlearnError, check_int, check_pattern, closest
from connlearn.gates import GATES, Gate
from connlearn.graph import BranchGraph, check_finite_gates, check_graph
from connlearn.topologies import PRESETS, TOPOLOGIES

__version__ = "0.1.0"


def build(topology: str = "resnext", *, engine: str = "fused", **options: Any) -> ConnectivityNet:
    """Build a network: ``topology`` emits the BranchGraph, which is compiled on ``engine``.

    Args:
        topology: a registered topology (``list_topologies()``): ``"resnext"`` or ``"dense"``.
        engine: ``"fused"`` (default), ``"reference"`` or ``"auto"``. Gate ``"full"`` compiles to ResNeXt's
            single stream (``net.engine == "single-stream"``) where every module reads all branches of one
            module and the block kind has that form (the bottleneck), whatever the engine: for the gated form
            of every input on an engine of your choice, use ``gate="topk"`` with ``K=C``.
        **options: the topology's keyword arguments (its docstring says what each means); for ``resnext``:
            ``C``, ``M`` or ``depth``, ``width``, ``num_classes``, ``preset``, ``layout``, ``block``,
            ``block_params``, ``gate``, ``K``, ``seed``, ``gate_init``, ``stem_channels``, ``base_channels``,
            ``in_channels``, ``residual_init``, ``conv_init``, ``dense``.
            The defaults give the paper's Figure 3 model {D=29, w=8, C=8} for CIFAR-100 with ``topk`` gates.

    Weights are initialised from ``seed`` without touching the global torch RNG.
    """
    fn = TOPOLOGIES.get(topology)
    _check_options(topology, fn, options)
    try:
        with torch.device("cpu"):  # a graph holds plain values: none of its making runs on meta (or a GPU)
            graph = fn(**options)
    except TypeError as exc:
        error = _option_error(topology, exc, options)
        if error is None:
            raise
    else:
        error = None
    if error is not None:  # raised outside the except clause: no cycle keeps the topology's frames alive
        raise error
    if not isinstance(graph, BranchGraph):
        raise ConfigTypeError(f"topology {topology!r} returned {type(graph).__name__}, not a "
                              "connlearn.graph.BranchGraph; see connlearn.topologies")
    check_finite_gates(graph, f"topology {topology!r}'s graph")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(graph.seed)
        return compile_graph(graph, engine=engine)


def from_graph(graph: BranchGraph | str, *, engine: str = "fused", seed: int | None = None) -> ConnectivityNet:
    """Compile a BranchGraph (or its JSON) into a network, its weights initialised from ``seed`` (default:
    the graph's own seed, which gives the weights that ``build`` gave the graph's network)."""
    if isinstance(graph, str):
        graph = BranchGraph.from_json(graph)
    graph = check_graph(graph, "from_graph's graph (a BranchGraph or its JSON)")
    check_finite_gates(graph, "from_graph's graph")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(graph.seed if seed is None else check_int("seed", seed, minimum=0, maximum=2**64 - 1))
        return compile_graph(graph, engine=engine)


def _check_options(topology: str, fn: Callable[..., Any], options: dict[str, Any]) -> None:
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    allowed = _options_of(fn)
    for name in options:
        if name not in allowed:
            raise _no_such_option(f"topology {topology!r} has no option {name!r}", "its", name, allowed)


def _option_error(topology: str, exc: TypeError, options: dict[str, Any]) -> ConfigError | None:
    """A clear error for an option that a topology taking ``**kwargs`` passed on to a function without it
    (its signature could not be checked in advance); ``None`` for any other ``TypeError``."""
    if isinstance(exc, ConnlearnError):
        return None
    own = exc.__traceback__ is not None and exc.__traceback__.tb_next is None  # raised by calling the topology
    missing = re.search(r"\(\) missing \d+ required (?:keyword-only |positional )?arguments?: (.+)$", str(exc))
    if own and missing is not None:
        names = re.findall(r"'(\w+)'", missing.group(1))
        example = ", ".join(f"{n}=..." for n in names)
        return ConfigError(f"topology {topology!r} needs the option(s) {missing.group(1)}: "
                           f"build({topology!r}, {example})")
    twice = re.search(r"([\w.<>]+)\(\) got multiple values for (?:keyword )?argument '(\w+)'", str(exc))
    if twice is not None and twice.group(2) in options:
        return ConfigError(f"topology {topology!r} sets the option {twice.group(2)!r} itself and passes it on to "
                           f"{twice.group(1).rsplit('.', 1)[-1]}(), so it cannot be given to build() too")
    found = re.search(r"([\w.<>]+)\(\) got an unexpected keyword argument '(\w+)'", str(exc))
    if found is None or found.group(2) not in options:
        return None
    qualname, name = found.groups()
    parts = qualname.rsplit("<locals>.", 1)[-1].split(".")  # as named where it was defined
    if len(parts) > 1 and parts[-1] == "__init__":  # a class was called
        parts = parts[:-1]
    callee = ".".join(parts)
    return _no_such_option(f"topology {topology!r} has no option {name!r}: it passed the option on to {callee}(), "
                           "which does not take it", f"{callee}()'s", name,
                           _options_of(_function_named(exc, parts, qualname)))


def _no_such_option(message: str, whose: str, name: str, allowed: list[str]) -> ConfigError:
    """``message``, then the ``allowed`` options (``whose`` options) and the one closest to ``name``."""
    if allowed:
        message += f"; {whose} options: {', '.join(allowed)}"
    hint = closest(name, allowed)
    return ConfigError(message + (f"; did you mean {hint[0]!r}?" if hint else ""))


def _function_named(exc: BaseException, parts: list[str], qualname: str) -> Any:
    """The callable that the call which failed (the innermost frame of ``exc``'s traceback) named: what the
    dotted name ``parts`` means there, else one within reach whose own name is ``qualname`` (called under
    another name, as an attribute or from a registry); ``None`` if none is found."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return None
    frame = tb.tb_frame
    target = frame.f_locals.get(parts[0], frame.f_globals.get(parts[0]))
    for part in parts[1:]:
        target = getattr(target, part, None)
    if target is not None:
        return target
    seen = [*frame.f_locals.values(), *frame.f_globals.values()]
    reach = [*seen, *(v for m in seen if inspect.ismodule(m) for v in vars(m).values()),
             *(TOPOLOGIES.get(n) for n in TOPOLOGIES.names())]
    own = (qualname, qualname.removesuffix(".__init__"))  # a function's, or a class's whose __init__ was called
    return next((c for c in reach if callable(c) and _qualname(c) in own), None)


def _qualname(obj: Any) -> str | None:
    try:  # an object's own attribute lookup may raise anything
        name = getattr(obj, "__qualname__", None)
    except Exception:
        return None
    return name if isinstance(name, str) else None


def _options_of(target: Any) -> list[str]:
    """The keyword options of a callable (``dense`` left out: whether a ResNeXt is dense is said by the
    topology's name, not by an option); none if it has no readable signature."""
    if not callable(target):
        return []
    try:
        params = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "dense"]


def register_block(name: str, kind: Any = None, *, overwrite: bool = False) -> Any:
    """Register a block kind (a class or callable ``(in_ch, out_ch, stride, branches, **params)``, or a
    :class:`Looped` adapter). Without ``kind``, returns a decorator."""
    return BLOCKS.register(name, kind, overwrite=overwrite)


def register_topology(name: str, fn: Any = None, *, overwrite: bool = False) -> Any:
    """Register a topology: a function of keyword arguments returning a BranchGraph."""
    return TOPOLOGIES.register(name, fn, overwrite=overwrite)


def register_gate(name: str, cls: Any = None, *, overwrite: bool = False) -> Any:
    """Register a gate kind: a :class:`Gate` subclass."""
    return GATES.register(name, cls, overwrite=overwrite)


def list_blocks(pattern: str = "*") -> list[str]:
    """Registered block kinds matching ``pattern``."""
    return BLOCKS.names(pattern)


def list_topologies(pattern: str = "*") -> list[str]:
    """Registered topologies matching ``pattern``."""
    return TOPOLOGIES.names(pattern)


def list_gates(pattern: str = "*") -> list[str]:
    """Registered gate kinds matching ``pattern``."""
    return GATES.names(pattern)


def list_presets(pattern: str = "*") -> list[str]:
    """Architecture presets of the paper's tables (``resnext(preset=...)``)."""
    import fnmatch

    pattern = check_pattern(pattern)
    return sorted(p for p in PRESETS if fnmatch.fnmatchcase(p, pattern))


_SUBMODULES = ("checkpoint", "data", "experiment", "export", "files", "folders", "plots", "prune", "recipe", "render",
               "signals", "train", "updater")


def __getattr__(name: str) -> Any:
    # submodules load on first use (``connlearn.prune.prune_dead_blocks``), keeping ``import connlearn`` light
    if name in _SUBMODULES:
        import importlib

        return importlib.import_module(f"connlearn.{name}")
    raise AttributeError(f"module 'connlearn' has no attribute {name!r}")


__all__ = [
    "BranchGraph", "ConfigError", "ConnectivityNet", "ConnlearnError", "Gate", "Looped", "__version__", "build",
    "from_graph", "list_blocks", "list_gates", "list_presets", "list_topologies", "register_block",
    "register_gate", "register_topology",
]
