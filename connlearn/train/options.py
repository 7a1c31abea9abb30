"""Every option of a run, declared once: its name, default, help, allowed values, group, and whether a
resumed run may change it. :class:`RunConfig`, the ``connlearn train`` flags, ``--config`` files,
``compare``'s arms, the resume check and ``summary.json`` all read :data:`OPTIONS`.

The groups:

- ``architecture``: the network; a connectivity file fixes them.
- ``gates``: how the gates train. One a run leaves unset takes its gate kind's tuned value
  (``Gate.trains_with``), else the default here.
- ``shared``: every run of a study shares them: the data, the evaluation, the schedule.
- ``per run``: ``compare`` sets them for each run.
- ``training``: the rest of how a run trains; a study's arms may set them.
- ``machine``: where and how fast it runs, and what it shows.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import attrs
import torch

from connlearn.errors import ConfigError, check_choice, check_float, check_int, closest, number_or_text
from connlearn.files import read_text
from connlearn.gates import GATES
from connlearn.graph import CONV_INITS, RESIDUAL_INITS
from connlearn.topologies import PRESETS
from connlearn.train.loaders import MAX_SEED
from connlearn.train.recipe import GATE_OPTIMIZERS, TEMPERATURES, Recipe, get_recipe
from connlearn.updater import GRAD_MODES

AMP_MODES = ("auto", "bf16", "fp16", "none")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
#: The architecture options of every topology, and of each topology of its own.
COMMON = ("topology", "gate", "K", "density", "edge_init", "connectivity")
NEURAL_GRAPH = ("nodes", "stem_nodes", "features")
RESNEXT = ("preset", "C", "M", "width", "base_channels", "stem_channels", "kernels", "uninformative", "residual_init",
           "conv_init")
ARCHITECTURE, GATE_TRAINING, SHARED, PER_RUN, TRAINING, MACHINE = (
    "architecture", "gates", "shared", "per run", "training", "machine")


@attrs.frozen
class DatasetProtocol:
    """What a dataset's protocol fixes: its presets (the first the default), recipe, stored image size, and the
    crop (random after ``pad`` zero padding in training, the centre one in evaluation)."""

    presets: tuple[str, ...]
    recipe: str
    image_size: int | None  # None: the data's own
    crop: int | None = None
    pad: int = 4


_CIFAR = tuple(p for p in PRESETS if p.startswith("cifar"))
PROTOCOLS = {
    "cifar10": DatasetProtocol(tuple(dict.fromkeys(("cifar-29-8-8", *_CIFAR))), "cifar", 32),
    "cifar100": DatasetProtocol(tuple(dict.fromkeys(("cifar-29-8-8", *_CIFAR))), "cifar", 32),
    "miniimagenet": DatasetProtocol(("miniimagenet-29-8-8", "miniimagenet-20-4-8"), "miniimagenet", 84, 64, 0),
    "imagenet": DatasetProtocol(tuple(p for p in PRESETS if p.startswith("imagenet")), "imagenet", 224, None, 0),
    "custom": DatasetProtocol(tuple(dict.fromkeys(("cifar-20-4-8", *_CIFAR))), "cifar", None),  # --data, any size
}


# ------------------------------------------------------------------------------------- the checks of values
def at_least(low: int, high: int | None = None) -> Callable[[str, Any], Any]:
    return lambda name, value: check_int(name, value, low, high)


def number(low: float, high: float = math.inf, above: bool = False) -> Callable[[str, Any], float]:
    """A finite number in [low, high], or (low, high] ``above`` low."""
    def check(name: str, value: Any) -> float:
        value = check_float(name, value)
        if math.isfinite(value) and low <= value <= high and not (above and value == low):
            return value
        allowed = (f"a finite number {'>' if above else '>='} {low:g}" if high == math.inf
                   else f"in {'(' if above else '['}{low:g}, {high:g}]")
        raise ConfigError(f"{name} must be {allowed}, got {value}")
    return check


def sizes(low: int, high: int) -> Callable[[str, Any], tuple[int, ...]]:
    """One integer or more, each in [low, high]."""
    def check(name: str, value: Any) -> tuple[int, ...]:
        if isinstance(value, str) or not isinstance(value, Iterable) or not list(value):
            raise ConfigError(f"{name} must be a list of integers, got {value!r}")
        return tuple(check_int(f"each of {name}", v, low, high) for v in value)
    return check


def text(name: str, value: Any) -> str:
    if not isinstance(value, str | os.PathLike):
        raise ConfigError(f"{name} must be a path or a name (a string), got {value!r}")
    return os.fspath(value)


def switch(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{name} must be true or false, got {value!r}")
    return value


def gate_kind(name: str, value: Any) -> str:
    GATES.get(value)  # a typo is named with the closest kind
    return str(value)


def gate_init(name: str, value: Any) -> float | str:
    return value if value == "uniform" else check_float(f"{name} (or 'uniform')", value, 0.0, 1.0)


def compile_mode(name: str, value: Any) -> bool | str:
    return value if isinstance(value, bool) else check_choice(name, value, COMPILE_MODES)


def device(name: str, value: Any) -> str:
    """A device this machine has (``cpu``, ``cuda``, ``cuda:1``, ``mps``)."""
    try:
        found = torch.device(text(name, value))
    except RuntimeError:
        raise ConfigError(f"unknown device {value!r}; known: cpu, cuda, cuda:N, mps") from None
    have = {"cpu": 1, "cuda": torch.cuda.device_count(), "mps": int(torch.backends.mps.is_available())}
    if (found.index or 0) >= have.get(found.type, 0):
        listed = ["cpu", *(f"cuda:{i}" for i in range(have["cuda"])), *(["mps"] if have["mps"] else [])]
        raise ConfigError(f"device {value!r}: this machine has {', '.join(listed)}")
    return value


# ------------------------------------------------------------------------------------------------ the table
@attrs.frozen
class Option:
    """One option of a run. ``check``: its value (not None) as allowed, else a one-line ConfigError; ``choices``
    instead where the values are names. ``flag``: argparse's ``type``, ``nargs``, ``metavar``, ``const`` or
    ``action`` of its command-line flag. ``resumable``: a resumed run may change it. ``path``: an input path,
    which a file of options gives relative to its own folder."""

    name: str
    default: Any
    group: str
    help: str
    check: Callable[[str, Any], Any] | None = None
    choices: tuple[Any, ...] = ()
    flag: dict[str, Any] = attrs.field(factory=lambda: {"type": str})
    resumable: bool = False
    path: bool = False

    def validate(self, value: Any) -> Any:
        if value is None:
            return None
        return check_choice(self.name, value, self.choices) if self.choices else (
            self.check(self.name, value) if self.check else value)


INT, FLOAT, BOOL = {"type": int}, {"type": float}, {"action": argparse.BooleanOptionalAction}
_OPTIONS = [
    Option("dataset", "cifar100", SHARED, "a dataset of the paper, or custom: a packed file of your own (--data), "
           "grey or RGB images of any size, signals or vectors", choices=tuple(PROTOCOLS)),
    Option("data", None, SHARED, "a packed .npz file or a folder holding one (default: $CONNLEARN_DATA, ./data, "
           "../shared/data, ~/.cache/connlearn; CIFAR downloads there); custom: the .npz file; imagenet: the folder "
           "of train/, val/", text, resumable=True, path=True),
    Option("synthetic", False, SHARED, "train on a small generated stand-in of the dataset (a smoke run, not a "
           "result)", switch, flag=BOOL),
    Option("epochs", None, SHARED, "total epochs: the paper's schedule scaled to it (default: the paper's, 320 for "
           "CIFAR); below 4, the last phases are left out", at_least(1), flag=INT),
    Option("phases", None, SHARED, "epochs of each of the four phases (phase 1 learns the gates)", sizes(1, 10**6),
           flag={"type": int, "nargs": 4, "metavar": ("P1", "P2", "P3", "P4")}),
    Option("batch_size", None, SHARED, "images a step (default: the recipe's, 128 for CIFAR)", at_least(1), flag=INT),
    Option("train_subset", None, SHARED, "train on a class-balanced subset of this many images", at_least(1),
           flag=INT),
    Option("test_subset", None, SHARED, "evaluate on a class-balanced subset of this many images", at_least(1),
           flag=INT),
    Option("val_split", None, SHARED, "hold out this many training images and evaluate on them instead of the test "
           "set", at_least(1), flag=INT),
    Option("eval_every", 1, SHARED, "evaluate after every this many epochs, and after the last", at_least(1),
           flag=INT),
    Option("seed", 0, PER_RUN, "the weights, gates, data order and augmentation", at_least(0, MAX_SEED), flag=INT),
    Option("out", None, PER_RUN, "the run's folder; the same command again resumes there (default runs/DATASET)",
           text, resumable=True),
    Option("topology", None, ARCHITECTURE, "resnext (default) or neural-graph (one-channel nodes in stages, DNW's "
           "static graph: docs/wiring.md)", choices=("resnext", "neural-graph")),
    Option("nodes", None, ARCHITECTURE, "neural-graph: the nodes of each stage after the stem's (default 192 192 192 "
           "192)", sizes(1, 4096), flag={"type": int, "nargs": "+", "metavar": "N"}),
    Option("stem_nodes", None, ARCHITECTURE, "neural-graph: the stem's nodes, its one-channel outputs (default 32)",
           at_least(1, 4096), flag=INT),
    Option("features", None, ARCHITECTURE, "neural-graph: the last nodes, which the head reads (default 100)",
           at_least(1, 4096), flag=INT),
    Option("preset", None, ARCHITECTURE, "architecture {D,w,C} (default: the dataset's, e.g. cifar-29-8-8)",
           choices=tuple(PRESETS)),
    Option("gate", None, ARCHITECTURE, "topk (GateConnect, default), real, random (Fixed-Random), full (ResNeXt), "
           "or another registered kind (docs/estimators.md)", gate_kind),
    Option("K", None, ARCHITECTURE, "inputs per block (default C/2; C for full)", at_least(1, 256), flag=INT),
    Option("density", None, ARCHITECTURE, "one budget of edges over the network instead of K: the share of all "
           "candidate gate edges kept, in (0, 1] (dnw, dnw_masked, magnitude, random)", number(0.0, 1.0, above=True),
           flag=FLOAT),
    Option("edge_init", None, ARCHITECTURE, "top: a random graph's kept edges start as dnw's do, at |w| uniform in "
           "[1 - density, 1] (the top of uniform weights), not in [0, 1]", choices=("top",)),
    Option("C", None, ARCHITECTURE, "branches per module (default: the preset's)", at_least(1, 256), flag=INT),
    Option("M", None, ARCHITECTURE, "modules, a multiple of 3 (default: the preset's)", at_least(1, 300), flag=INT),
    Option("width", None, ARCHITECTURE, "a branch's bottleneck width in the first stage", at_least(1, 4096),
           flag=INT),
    Option("base_channels", None, ARCHITECTURE, "the first stage's output channels", at_least(1, 65536), flag=INT),
    Option("stem_channels", None, ARCHITECTURE, "the stem's output channels", at_least(1, 65536), flag=INT),
    Option("kernels", None, ARCHITECTURE, "unlike branches: branch j's middle kernel is the j-th of these odd sizes, "
           "cycled (e.g. 1 3 5)", sizes(1, 15), flag={"type": int, "nargs": "+", "metavar": "K"}),
    Option("uninformative", None, ARCHITECTURE, "a planted control: these branches of module 1 output Gaussian "
           "noise at their own scale, in training and evaluation (e.g. 5 6 7 8)", sizes(1, 256),
           flag={"type": int, "nargs": "+", "metavar": "J"}),
    Option("residual_init", None, ARCHITECTURE, "each branch's output starts at sqrt(K): sqrt_k, or auto where the "
           "block can (the default); one: as built; zero", choices=RESIDUAL_INITS),
    Option("conv_init", None, ARCHITECTURE, "a gated branch's inner convolutions start at one branch's scale "
           "(branch, the default) or ResNeXt's (resnext); Fixed-Full keeps ResNeXt's own", choices=CONV_INITS),
    Option("connectivity", None, ARCHITECTURE, "train this checkpoint's (or graph JSON's) connectivity from scratch, "
           "with new weights", text),
    Option("gate_lr", None, GATE_TRAINING, "the gates' learning rate in phase 1 (default: the recipe's, 0.2; 0 "
           "keeps them where they start)", number(0.0), flag=FLOAT),
    Option("gate_optimizer", "sgd", GATE_TRAINING, "sgd (the paper's: the gates in the weights' SGD at --gate-lr) or "
           "adam (the gates alone in Adam at --gate-lr, e.g. 0.01)", choices=GATE_OPTIMIZERS),
    Option("gate_rule", "plain", GATE_TRAINING, "how the gates learn (plain: the paper's)", choices=GRAD_MODES),
    Option("gate_momentum", None, GATE_TRAINING, "the gates' momentum (default: the weights'; 0: Algorithm 1's plain "
           "step)", number(0.0, 1.0), flag=FLOAT),
    Option("gate_init", 0.5, GATE_TRAINING, "initial real gates: a value in [0, 1] or 'uniform'", gate_init,
           flag={"type": number_or_text}),
    Option("gate_warmup", 0, GATE_TRAINING, "epochs at the start of phase 1 in which the gates do not learn (the "
           "draws go on)", at_least(0), flag=INT),
    Option("gate_holdout", None, GATE_TRAINING, "hold out this many training images (apart from --train-subset's) "
           "for the gates: each weight step is followed by a gate step on a held-out batch (first-order bilevel)",
           at_least(1), flag=INT),
    Option("gate_temperature", 1.0, GATE_TRAINING, "sampling temperature of phase 1 (1: the paper's; below 1: closer "
           "to the top-K)", number(*TEMPERATURES), flag=FLOAT),
    Option("gate_temperature_end", None, GATE_TRAINING, "anneal the temperature geometrically over phase 1 to this "
           "value", number(*TEMPERATURES), flag=FLOAT),
    Option("schedule", None, SHARED, "the recipe: the dataset's (the paper's four phases, the connectivity frozen "
           "after the first) or dnw (three phases at lr 0.1, 0.01, 0.001 over 1/2, 1/4, 1/4 of the epochs, weight "
           "decay 1e-4, nothing frozen: Discovering Neural Wirings')", choices=("dnw",)),
    Option("reinit", False, TRAINING, "with connectivity: start from other weights than the seed's (without it, a "
           "retrained connectivity starts from its seed's weights: those of the run that learned it, where that ran "
           "with the same seed)", switch, flag=BOOL),
    Option("rewire", None, TRAINING, "with connectivity: train it rewired, keeping the count of edges between every "
           "two stages (stages: a connectivity under a density) or every node's in- and out-degree (degrees), from "
           "the run's seed",
           choices=("stages", "degrees")),
    Option("lr", None, TRAINING, "the weights' learning rate in phase 1, the later phases' scaled with it (default: "
           "the recipe's, 0.1)", number(0.0, above=True), flag=FLOAT),
    Option("loader", "auto", TRAINING, "auto: batches made on the device; dataloader: torch's DataLoader (--workers)",
           choices=("auto", "dataloader")),
    Option("recalibrate_bn", 0, TRAINING, "before the last evaluation, recompute the batch-norm statistics of the "
           "final connectivity over this many training batches (0: not; 100 for dnw, whose mask moves until the "
           "end)", at_least(0), flag=INT),
    Option("device", None, MACHINE, "cpu, cuda, cuda:1, mps (default: cuda where there is one)", device,
           resumable=True),
    Option("amp", "auto", MACHINE, "mixed precision (auto: bf16 or fp16 on a GPU)", choices=AMP_MODES,
           resumable=True),
    Option("compile", False, MACHINE, "torch.compile the network, in MODE: " + ", ".join(COMPILE_MODES) + " (on a "
           "GPU: reduce-overhead)", compile_mode,
           flag={"nargs": "?", "const": "default", "metavar": "MODE"}, resumable=True),
    Option("channels_last", False, MACHINE, "train in channels-last memory format", switch, flag=BOOL,
           resumable=True),
    Option("activation_checkpointing", False, MACHINE, "recompute each module's activations in the backward pass "
           "(less memory, more time)", switch, flag=BOOL, resumable=True),
    Option("workers", None, MACHINE, "DataLoader processes (with --loader dataloader)", at_least(0), flag=INT,
           resumable=True),
    Option("snapshot_every", 100, MACHINE, "record the gates every this many steps (gates.jsonl; 0: not)",
           at_least(0), flag=INT, resumable=True),
    Option("checkpoint_every", 0, MACHINE, "also write last.pt every this many steps within epochs", at_least(0),
           flag=INT, resumable=True),
    Option("tensorboard", False, MACHINE, "also log to TensorBoard", switch, flag=BOOL, resumable=True),
    Option("progress", True, MACHINE, "a progress bar per epoch", switch, flag=BOOL, resumable=True),
]
#: Every option of a run, by name.
OPTIONS = {o.name: o for o in _OPTIONS}


def names(*groups: str) -> list[str]:
    """The options of ``groups``."""
    return [o.name for o in _OPTIONS if o.group in groups]


def recorded(run: dict[str, Any]) -> dict[str, Any]:
    """The options of a run as ``summary.json`` or a checkpoint recorded them (lists for tuples): one the run
    predates at its default, one since removed (``engine``) left out."""
    return {o.name: list(v) if isinstance(v := run.get(o.name, o.default), tuple) else v for o in _OPTIONS}


def relative_to(folder: Path, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` of a file in ``folder``, a relative ``data`` path from there."""
    paths = [o.name for o in _OPTIONS if o.path]
    return {k: str(folder / v) if k in paths and isinstance(v, str) and not Path(v).expanduser().is_absolute()
            else v for k, v in options.items()}


def read_options(path: Path, what: str) -> dict[str, Any]:
    """The top-level table of a JSON or TOML file (by its suffix)."""
    import tomllib

    text = read_text(path, what, ConfigError)
    try:
        data = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"cannot read the {what} {path}: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold one object of options, e.g. {{\"epochs\": 30}}")
    return data


def check_names(where: str, options: dict[str, Any], allowed: Iterable[str] = OPTIONS) -> dict[str, Any]:
    """``options`` with ``-`` in names as ``_``; an unknown name is a ConfigError naming the closest."""
    options, allowed = {str(k).replace("-", "_"): v for k, v in options.items()}, list(allowed)
    for key in options:
        if key not in allowed:
            hint = closest(key, allowed)
            raise ConfigError(f"{where}unknown train option {key!r}" + (f"; did you mean {hint!r}?" if hint else "")
                              + (" (compare sets seed and out per run)" if key in names(PER_RUN) else ""))
    return options


# ---------------------------------------------------------------------------------------------- RunConfig
class RunConfig:
    """One run of a dataset's protocol: every option of :data:`OPTIONS`, checked, as attributes. Options left
    out take the protocol's value: ``preset`` its first, ``gate`` topk, ``epochs`` the paper's schedule (CIFAR:
    120/100/50/50), which any other ``epochs`` scales (``phases`` gives each phase's epochs instead); the gate
    options a run leaves out take its gate kind's (``Gate.trains_with``). ``C``, ``M``, ``width``,
    ``base_channels``, ``stem_channels`` override the preset. ``connectivity`` (a checkpoint or a graph JSON)
    trains that connectivity from scratch: the architecture and each block's top-K inputs from the file, new
    weights from ``seed``. ``synthetic``: train on a small generated stand-in of the dataset (a smoke run)."""

    def __init__(self, **options: Any) -> None:
        check_names("", options)
        given = {k: OPTIONS[k].validate(v) for k, v in options.items()}
        kind = {} if given.get("connectivity") else GATES.get(given.get("gate") or "topk").trains_with
        values = {o.name: given[o.name] if given.get(o.name) is not None else
                  kind.get(o.name, o.default) if o.group == GATE_TRAINING else o.default for o in _OPTIONS}
        object.__setattr__(self, "_values", values)
        self._check_together()
        self.recipe()  # a phase split or a temperature out of range is named now

    def _check_together(self) -> None:
        protocol = PROTOCOLS[self.dataset]
        if self.preset is not None and self.preset not in protocol.presets:
            raise ConfigError(f"preset {self.preset!r} is not one of {self.dataset}'s: {', '.join(protocol.presets)}")
        fixed = [k for k in names(ARCHITECTURE) if k != "connectivity" and getattr(self, k) is not None]
        if self.connectivity is not None and fixed:
            raise ConfigError(f"connectivity {self.connectivity} fixes the architecture and connectivity: leave out "
                              f"{', '.join(fixed)}")
        own = NEURAL_GRAPH if self.topology == "neural-graph" else RESNEXT
        other = [k for k in names(ARCHITECTURE) if getattr(self, k) is not None and k not in (*COMMON, *own)]
        if other:
            raise ConfigError(f"topology {self.topology or 'resnext'} takes {', '.join((*COMMON[1:], *own))}; not "
                              f"{', '.join(other)}")
        if (self.rewire is not None or self.reinit) and self.connectivity is None:
            raise ConfigError(f"{'reinit' if self.reinit else f'rewire {self.rewire}'} trains a given connectivity "
                              "anew: give connectivity too")
        if self.edge_init is not None and (self.gate != "random" or self.density is None):
            raise ConfigError(f"edge_init {self.edge_init} starts a random graph's kept edges as dnw's start: give "
                              f"gate random and density (got gate {self.gate}, density {self.density})")
        if self.gate_holdout is not None and (self.dataset == "imagenet" or self.connectivity is not None or (
                self.gate is not None and not GATES.get(self.gate).learnable)):
            raise ConfigError("gate_holdout gives learned gates held-out batches: it needs a gate kind that learns "
                              "(not a fixed connectivity) and in-memory data (not imagenet)")
        if self.workers is not None and self.loader == "auto" and self.dataset != "imagenet":
            raise ConfigError("workers are DataLoader processes: give loader 'dataloader' too (the default loader "
                              "makes its batches on the device, without workers)")
        if self.dataset == "custom" and self.data is None and not self.synthetic:
            raise ConfigError("dataset 'custom' trains on a packed file of your own: give data (--data FILE.npz)")

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["_values"][name]
        except KeyError:
            raise AttributeError(f"RunConfig has no option {name!r}") from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("a RunConfig is frozen: make another with the options changed")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RunConfig) and self.to_dict() == other.to_dict()

    def __repr__(self) -> str:
        return f"RunConfig({', '.join(f'{k}={v!r}' for k, v in self.to_dict().items() if v != OPTIONS[k].default)})"

    def to_dict(self) -> dict[str, Any]:
        """Every option's value: what ``summary.json`` and the checkpoints record of the run."""
        return dict(self.__dict__["_values"])

    @property
    def output(self) -> str:
        return self.out or f"runs/{self.dataset}"

    def recipe(self) -> Recipe:
        """The protocol's recipe scaled to ``epochs`` (or split as ``phases``), with this run's batch size, weight
        learning rate (its phases scaled alike) and gate settings."""
        paper = get_recipe(self.schedule or PROTOCOLS[self.dataset].recipe)
        recipe = (paper.with_phase_epochs(self.phases) if self.phases
                  else paper.scaled(self.epochs or paper.total_epochs))
        if self.epochs is not None and recipe.total_epochs != self.epochs:
            raise ConfigError(f"phases {self.phases} add up to {recipe.total_epochs} epochs, not epochs={self.epochs}")
        scale = 1.0 if self.lr is None else self.lr / recipe.phases[0].lr
        phases = [attrs.evolve(p, lr=p.lr * scale) for p in recipe.phases]
        phases[0] = attrs.evolve(phases[0], temperature=self.gate_temperature,
                                 temperature_end=self.gate_temperature_end,
                                 gate_lr=phases[0].gate_lr if self.gate_lr is None else self.gate_lr)
        return attrs.evolve(recipe, phases=phases, batch_size=self.batch_size or recipe.batch_size,
                            gate_momentum=self.gate_momentum, gate_rule=self.gate_rule,
                            gate_optimizer=self.gate_optimizer, gate_warmup=self.gate_warmup)
