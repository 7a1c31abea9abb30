"""The paper's protocols (CIFAR, Mini-ImageNet, ImageNet) as one call: data, network, phased training,
pruning and pictures.

``run_cifar(CifarRun(...))`` is what ``connlearn train`` and the scripts in ``examples/`` run. Everything
lands in ``out``: ``log.jsonl``, ``gates.jsonl``, the training checkpoints, ``pruned.pt``,
``connectivity.dot``/``.svg``, ``resnext_vs_learned.svg``, plots and ``summary.json``. Running the same
command again resumes where it stopped.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import numbers
import os
import signal
import threading
import time
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs
import torch
import torch.distributed as dist

import connlearn
from connlearn import plots, render
from connlearn.blocks import DEFAULT_CONV_INIT, DEFAULT_RESIDUAL_INIT, check_conv_init, check_residual_init, starts_of
from connlearn.checkpoint import (
    architecture,
    environment,
    load_checkpoint,
    make_checkpoint,
    save_atomic,
)
from connlearn.data import (
    DATA_ENV,
    LOADER_PATHS,
    MAX_SEED,
    NUM_CLASSES,
    PACK_MINIIMAGENET,
    ImageDataset,
    load_dataset,
    make_loaders,
    synthetic,
)
from connlearn.errors import (
    ConfigError,
    ConfigTypeError,
    DataError,
    GraphError,
    check_device,
    check_int,
    check_name,
    check_temperature,
)
from connlearn.files import expand_home, remove_leftovers, write_text_atomic
from connlearn.folders import ImageFiles, folder_loaders, load_imagenet
from connlearn.gates import GATES
from connlearn.graph import BranchGraph, check_finite_gates
from connlearn.prune import (
    active_branches,
    freezing_changes_outputs,
    input_overlap,
    prune_dead_blocks,
    random_overlap,
)
from connlearn.recipe import Recipe, check_gate_momentum, flag_check, get_recipe
from connlearn.signals import STOP_SIGNALS, check_signals
from connlearn.topologies import PRESETS
from connlearn.train import Loader, Trainer, hold_folder

CIFAR_PRESETS = tuple(p for p in PRESETS if p.startswith("cifar-"))
MINIIMAGENET_PRESETS = tuple(p for p in PRESETS if p.startswith("miniimagenet-"))
IMAGENET_PRESETS = tuple(p for p in PRESETS if p.startswith("imagenet-"))


@attrs.frozen
class Protocol:
    """What the paper's protocol of a dataset fixes: its presets (``preset`` the default), recipe, stored
    image size, and the training crop (random, after zero padding of ``pad``; evaluation takes the centre
    ``crop``). A dataset not ``in_memory`` (ImageNet) is read from its folders by :mod:`connlearn.folders`,
    which crops to ``image_size``."""

    presets: tuple[str, ...]
    preset: str
    recipe: str
    image_size: int
    crop: int | None = None
    pad: int = 4
    in_memory: bool = True

    @property
    def input_size(self) -> int:
        """The side of the images the network sees."""
        return self.image_size if self.crop is None else self.crop


#: The paper's protocol of each dataset (CIFAR: 32x32, 4-pixel padding, random 32x32 crop; Mini-ImageNet:
#: 84x84 images, a random 64x64 crop without padding, the centre crop at test, batch 256; ImageNet: image
#: folders, ResNeXt's 224x224 augmentation, 4 x 30 epochs, batch 256, weight decay 1e-4).
PROTOCOLS = {
    "cifar10": Protocol(CIFAR_PRESETS, "cifar-29-8-8", "cifar", 32),
    "cifar100": Protocol(CIFAR_PRESETS, "cifar-29-8-8", "cifar", 32),
    "miniimagenet": Protocol(MINIIMAGENET_PRESETS, "miniimagenet-29-8-8", "miniimagenet", 84, crop=64, pad=0),
    "imagenet": Protocol(IMAGENET_PRESETS, "imagenet-50-4-32", "imagenet", 224, pad=0, in_memory=False),
}
DATASETS = tuple(PROTOCOLS)
TRAIN_PRESETS = CIFAR_PRESETS + MINIIMAGENET_PRESETS + IMAGENET_PRESETS


def _protocol_of(dataset: object) -> Protocol:
    """The protocol of ``dataset``; CIFAR's for a name that is not one (which the run's check then names)."""
    return PROTOCOLS[dataset] if isinstance(dataset, str) and dataset in PROTOCOLS else PROTOCOLS["cifar100"]


def _optional_int(name: str, minimum: int = 1):
    def check(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
        if value is not None:
            check_int(name, value, minimum=minimum)

    return check


def _seed(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    check_int("seed (of the weights, the gates and the data order)", value, minimum=0,
              maximum=MAX_SEED)


def _text(name: str, default: Any, *, path: bool = True) -> Any:
    """A field that holds a path (a ``Path`` becomes its string, as JSON records it) or a device name: a
    non-empty string, or ``None`` where that is the default."""
    optional = default is None

    def check(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
        if value is None and optional:
            return
        if not isinstance(value, str) or not value:
            allowed = ("a path" if path else "a device name such as 'cuda:1'") + (" or None" if optional else "")
            raise ConfigTypeError(f"{name} must be {allowed}, got {value!r} ({type(value).__name__})")

    def fspath(value: Any) -> Any:
        return os.fspath(value) if path and isinstance(value, os.PathLike) else value

    return attrs.field(default=default, converter=fspath, validator=check)


def phases_total(phases: Any) -> int:
    """The epochs of the paper's CIFAR schedule split as ``phases`` (one count per phase); a bad split is a
    :class:`ConfigError` naming the phase."""
    return get_recipe("cifar").with_phase_epochs(phases).total_epochs


def _as_tuple(value: Any) -> Any:
    """A list (from JSON or the command line) as a tuple, NumPy integers as ints (they must reach
    ``summary.json``); anything else is left for the check to name."""
    if not isinstance(value, (list, tuple)):
        return value
    return tuple(int(e) if isinstance(e, numbers.Integral) and not isinstance(e, bool) else e for e in value)


@attrs.frozen
class CifarRun:
    """One run of the paper's CIFAR, Mini-ImageNet or ImageNet protocol (``dataset``; :data:`PROTOCOLS`).
    ``preset`` defaults to ``cifar-29-8-8`` (``miniimagenet-29-8-8``, ``imagenet-50-4-32``). ``epochs``
    scales the paper's four-phase schedule (120/100/50/50, 320 epochs; ImageNet: 30/30/30/30, and 120 by
    default), keeping its proportions; ``phases`` gives each phase's
    epochs instead (four counts that add up to ``epochs``: ``phases=(10, 3, 2, 1), epochs=16`` learns the
    connectivity for 10 epochs). ``train_subset`` /
    ``test_subset`` take class-balanced subsets for short runs; ``val_split`` holds out that many training
    images and evaluates on them instead of the test set (for choosing settings without the test set).
    ``C``, ``M``, ``width``, ``base_channels``, ``stem_channels`` override the preset.

    ``connectivity`` (a checkpoint or a BranchGraph JSON file, e.g. a finished run's ``last.pt``) trains
    that network's connectivity from scratch: the architecture, gates, ``residual_init`` and ``conv_init``
    come from the file (learned gates fixed to their top-K), the weights are new from ``seed``, and
    ``preset``, ``gate``, ``K``, ``residual_init``, ``conv_init`` and the architecture overrides are not
    used."""

    dataset: str = "cifar100"
    preset: str = attrs.field(default=attrs.Factory(lambda run: _protocol_of(run.dataset).preset, takes_self=True))
    gate: str = "topk"
    K: int | None = attrs.field(default=None, validator=_optional_int("K"))
    epochs: int = attrs.field(default=attrs.Factory(lambda run: get_recipe(_protocol_of(run.dataset).recipe)
                                                    .total_epochs, takes_self=True), validator=_optional_int("epochs"))
    phases: tuple[int, ...] | None = attrs.field(default=None, converter=_as_tuple)
    seed: int = attrs.field(default=0, validator=_seed)
    data: str | None = _text("data", None)
    # one folder a dataset: a folder resumes only the dataset it started with
    out: str = _text("out", attrs.Factory(lambda run: f"runs/{run.dataset}" if isinstance(run.dataset, str)
                                          and run.dataset in PROTOCOLS else "runs/cifar100", takes_self=True))
    batch_size: int | None = attrs.field(default=None, validator=_optional_int("batch_size"))
    device: str | None = _text("device", None, path=False)
    amp: str = "auto"
    compile: bool | str = False
    activation_checkpointing: bool = attrs.field(default=False, validator=flag_check("activation_checkpointing"))
    engine: str = "fused"
    loader: str = "auto"
    workers: int | None = attrs.field(default=None, validator=_optional_int("workers", minimum=0))
    gate_grad: str = "plain"
    gate_init: float | str = 0.5
    gate_lr: float | None = None
    gate_momentum: float | None = None
    gate_temperature: float = 1.0
    gate_temperature_end: float | None = None
    residual_init: str = DEFAULT_RESIDUAL_INIT
    conv_init: str = DEFAULT_CONV_INIT
    connectivity: str | None = _text("connectivity", None)
    train_subset: int | None = attrs.field(default=None, validator=_optional_int("train_subset"))
    test_subset: int | None = attrs.field(default=None, validator=_optional_int("test_subset"))
    val_split: int | None = attrs.field(default=None, validator=_optional_int("val_split"))
    C: int | None = None
    M: int | None = None
    width: int | None = None
    base_channels: int | None = None
    stem_channels: int | None = None
    snapshot_every: int = 100
    checkpoint_every: int = attrs.field(default=0, validator=_optional_int("checkpoint_every", minimum=0),
                                        converter=lambda v: 0 if v is None else v)
    tensorboard: bool = attrs.field(default=False, validator=flag_check("tensorboard"))
    progress: bool = attrs.field(default=True, validator=flag_check("progress"))
    synthetic_fallback: bool = attrs.field(default=True, validator=flag_check("synthetic_fallback"))

    def __attrs_post_init__(self) -> None:
        check_name("dataset", self.dataset, DATASETS)
        protocol = PROTOCOLS[self.dataset]
        presets = protocol.presets
        if isinstance(self.preset, str) and self.preset in TRAIN_PRESETS and self.preset not in presets:
            raise ConfigError(f"preset {self.preset!r} is not one of {self.dataset}'s; its presets: "
                              f"{', '.join(presets)}")
        check_name(f"{self.dataset} preset", self.preset, presets)
        check_name("loader", self.loader, LOADER_PATHS)
        GATES.get(self.gate)  # a typo is named before any data is looked for
        if not protocol.in_memory and self.loader != "auto":
            raise ConfigError(f"{self.dataset} is read from its image folders by DataLoader workers; loader "
                              f"{self.loader!r} does not apply (leave it 'auto'; workers sets their number)")
        if self.workers is not None and self.loader == "auto" and protocol.in_memory:
            raise ConfigError(f"workers apply to the DataLoader path (loader='dataloader') and to ImageNet; "
                              f"{self.dataset} with loader='auto' makes its batches in memory, without workers")
        check_residual_init(self.residual_init)
        check_conv_init(self.conv_init)
        if self.phases is not None:
            total = phases_total(self.phases)
            if total != self.epochs:
                split = "/".join(str(e) for e in self.phases)
                raise ConfigError(f"phases {split} add up to {total} epochs, but epochs is {self.epochs}: give "
                                  f"{total}, or leave the total number of epochs out to take their sum")
        check_gate_momentum(self.gate_momentum)
        check_temperature("gate_temperature", self.gate_temperature)
        if self.gate_temperature_end is not None:
            check_temperature("gate_temperature_end", self.gate_temperature_end)

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


def _say(message: str) -> None:
    """Print ``message`` (on rank 0 only, under ``torch.distributed``)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0:
        print(message, flush=True)


def _join_torchrun(device: torch.device) -> tuple[int, int, torch.device, bool]:
    """``(rank, world_size, device, joined)``. In a process group that exists already, its rank and size.
    Launched by ``torchrun`` with more than one process (``WORLD_SIZE`` > 1), this process joins the group
    (NCCL on CUDA, gloo on the CPU; ``joined`` says it did). Either way a CUDA run takes the GPU of its
    ``LOCAL_RANK`` (else the current one). Alone: ``(0, 1, device, False)``."""
    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        local = int(os.environ["LOCAL_RANK"]) if "LOCAL_RANK" in os.environ else None
    except ValueError:
        raise ConfigError(f"WORLD_SIZE={os.environ.get('WORLD_SIZE')!r} and LOCAL_RANK="
                          f"{os.environ.get('LOCAL_RANK')!r} must be integers (torchrun sets them)") from None
    grouped = dist.is_available() and dist.is_initialized()
    if not grouped and world <= 1:
        return 0, 1, device, False
    if device.type == "cuda":
        if device.index is not None:
            raise ConfigError(f"device {str(device)!r}: in a process group every process takes the GPU of its "
                              "LOCAL_RANK; give --device cuda (or leave it out)")
        index = torch.cuda.current_device() if local is None else local
        device = check_device(f"cuda:{index}", "the GPU of LOCAL_RANK")
        torch.cuda.set_device(device)
    if not grouped:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return dist.get_rank(), dist.get_world_size(), device, not grouped


def load_data(run: CifarRun) -> tuple[ImageDataset | ImageFiles, ImageDataset | ImageFiles, str]:
    """Train and evaluation sets of ``run``, and a description of where they came from. ImageNet comes as
    the lists of its files (:class:`~connlearn.folders.ImageFiles`), and has no generated stand-in."""
    classes, protocol = NUM_CLASSES[run.dataset], PROTOCOLS[run.dataset]
    in_memory, size = protocol.in_memory, protocol.image_size
    try:
        train, test = load_dataset(run.dataset, run.data) if in_memory else load_imagenet(run.data)
        source = run.dataset
    except DataError as exc:
        # a location the user named is never silently replaced
        if not run.synthetic_fallback or run.data is not None or os.environ.get(DATA_ENV) or not in_memory:
            raise
        _say(f"connlearn: {exc} -- running the same flow on a small generated dataset instead")
        train, test = synthetic(num_classes=classes, n_train=max(2000, 20 * classes), n_test=max(500, 5 * classes),
                                size=size, seed=run.seed)
        source = "generated"
    if train.num_classes != classes:
        raise DataError(f"{run.dataset} needs {classes} classes, the data found has {train.num_classes}")
    if (in_memory and isinstance(train, ImageDataset) and isinstance(test, ImageDataset)  # as in memory they are
            and not train.image_size == test.image_size == (size, size)):
        found = " and ".join(dict.fromkeys("x".join(map(str, d.image_size)) for d in (train, test)))
        again = f"; pack them again with {PACK_MINIIMAGENET}" if run.dataset == "miniimagenet" else ""
        raise DataError(f"the {run.dataset} data found has {found} images; its protocol takes {size}x{size}{again}")
    if run.val_split:
        train, test = train.split(run.val_split, name="val_split")
        source += f" (validation split of {len(test)} training images)"
    for name, n, images in (("train_subset", run.train_subset, train), ("test_subset", run.test_subset, test)):
        if n and n >= len(images):
            _say(f"connlearn: {name}={n} is not below the {len(images)} images there: taking all of them")
    if run.train_subset and run.train_subset < len(train):
        train = train.subset(run.train_subset, name="train_subset")
    if run.test_subset and run.test_subset < len(test):
        test = test.subset(run.test_subset, name="test_subset")
    return train, test, source


def build_net(run: CifarRun, num_classes: int) -> connlearn.ConnectivityNet:
    """The network ``run`` trains: its preset with the run's overrides and gates, or with ``--connectivity``
    the architecture and fixed connectivity of that file, with new weights from the run's seed."""
    if run.connectivity is not None:
        return _net_of_connectivity(run, num_classes)
    overrides = {k: getattr(run, k) for k in ("C", "M", "width", "base_channels", "stem_channels")
                 if getattr(run, k) is not None}
    return connlearn.build(
        "resnext", preset=run.preset, gate=run.gate, K=run.K, num_classes=num_classes, seed=run.seed,
        gate_init=run.gate_init, residual_init=run.residual_init, conv_init=run.conv_init, engine=run.engine,
        **overrides,
    )


def _net_of_connectivity(run: CifarRun, num_classes: int) -> connlearn.ConnectivityNet:
    """A new network (weights from ``run.seed``) with the fixed connectivity of ``run.connectivity``."""
    assert run.connectivity is not None  # build_net calls this only then
    path = expand_home(run.connectivity)
    if not path.is_file():
        raise ConfigError(f"connectivity: no file at {path} (a checkpoint such as a run's last.pt, or a graph JSON)")
    if path.resolve().parent == expand_home(run.out).resolve():
        raise ConfigError(f"connectivity: {path} lies in this run's own output folder {run.out}, whose checkpoints "
                          "the run resumes from and overwrites; give the run another --out")
    with path.open("rb") as f:
        is_json = f.read(64).lstrip(b"\xef\xbb\xbf \t\r\n")[:1] == b"{"  # after a byte order mark or blanks
    if is_json:
        try:
            graph = BranchGraph.from_json(path.read_text(encoding="utf-8-sig"))
        except UnicodeDecodeError as exc:
            raise ConfigError(f"connectivity: {path} is not a UTF-8 text file ({exc.reason} at byte {exc.start}); "
                              "give a graph JSON file or a checkpoint") from None
        except GraphError as exc:
            raise GraphError(f"connectivity: {path}: {exc}") from None
    else:
        graph = BranchGraph.from_json(load_checkpoint(path)["graph"])
    try:
        graph.validate()
    except GraphError as exc:
        raise GraphError(f"connectivity: {path} does not describe a network: {exc}") from None
    check_finite_gates(graph, f"connectivity: {path}")  # its top-K is what the run trains
    stem, size = graph.nodes["input"], PROTOCOLS[run.dataset].input_size
    if stem.get("in_channels") != 3 or stem.get("image_size", 32) != size:
        raise ConfigError(f"connectivity: the network in {path} takes {stem.get('in_channels')}-channel "
                          f"{stem.get('image_size')} px images; {run.dataset} runs on 3-channel {size} px images")
    graph.graph["seed"] = run.seed  # what the new weights come from
    kind = graph.graph.get("gate")
    if kind in GATES and GATES.get(kind).learnable:  # the connectivity the file records (its top-K), as is
        graph.graph.update(gate="frozen", frozen_from=kind)
        graph.graph.pop("weighted_inputs", None)
    net = connlearn.from_graph(graph, engine=run.engine).freeze()
    if net.num_classes != num_classes:
        raise ConfigError(f"connectivity: the network in {path} has {net.num_classes} classes; "
                          f"{run.dataset} has {num_classes}")
    return net


def _shape(graph: BranchGraph) -> dict[str, Any]:
    """The options that shape a built network, named as :class:`CifarRun` names them (``depth`` as the
    topology's options do; ``base_channels``: the first module's output channels)."""
    options = graph.graph.get("options") or {}
    modules = graph.modules()
    first = graph.branches(modules[0]) if modules else []
    return {"M": len(modules), "depth": options.get("depth"), "width": options.get("width"),
            "C": options.get("C"), "K": graph.K, "stem_channels": graph.nodes["input"].get("out_channels"),
            "base_channels": graph.nodes[first[0]].get("out_channels") if first else None}


def _as_built(run: CifarRun, net: connlearn.ConnectivityNet) -> CifarRun:
    """``run`` with the gate, K, residual_init, conv_init, preset, M, C, width and channels of a network built from
    ``run.connectivity`` (``base_channels`` is the first stage's output channels)."""
    graph = net.graph()
    preset = (graph.graph.get("options") or {}).get("preset")
    shape = {k: v for k, v in _shape(graph).items() if k != "depth"}  # a CifarRun gives M instead
    if shape["stem_channels"] is None:
        shape["stem_channels"] = run.stem_channels
    asked = {k: getattr(run, k) for k, v in shape.items() if getattr(run, k) is not None and getattr(run, k) != v}
    if asked:  # the file fixes them: a value given beside it would be silently dropped
        there = ", ".join(f"{k}={shape[k]}" for k in asked)
        given = ", ".join(f"{k}={v}" for k, v in asked.items())
        raise ConfigError(f"connectivity: the network in {run.connectivity} has {there}; {given} asks for another: "
                          "leave it out (the file fixes the architecture and each block's inputs)")
    return attrs.evolve(run, gate=net.gate_kind, **starts_of(graph.graph),  # type: ignore[arg-type]  # str options
                        preset=preset if preset in PROTOCOLS[run.dataset].presets else run.preset, **shape)


# what a resumed run must share with the command that started it (the trainer itself checks the
# architecture, gate kind, K and recipe; _architecture_differences names what differs in the first two as
# built, so that an option given at its default and one left out agree); residual_init and conv_init are
# kept from the checkpoint instead (see run_cifar)
RESUME_KEYS = ("dataset", "loader", "gate", "seed", "gate_grad", "gate_init", "gate_temperature",
               "gate_temperature_end", "train_subset", "test_subset", "val_split")


def _architecture_differences(saved: BranchGraph, given: BranchGraph) -> list[tuple[str, Any, Any]]:
    """What differs between two built networks in the options that shape them (:func:`_shape`); empty when
    their architectures are the same or differ elsewhere."""
    if architecture(saved) == architecture(given):
        return []
    there, here = _shape(saved), _shape(given)
    return [(k, there[k], here[k]) for k in there  # M only where the depth does not say it
            if there[k] != here[k] and not (k == "M" and there["depth"] != here["depth"])]


def data_facts(train: ImageDataset | ImageFiles, test: ImageDataset | ImageFiles) -> dict[str, Any]:
    """What a run records of its data, to refuse resuming on other data (another packed file, split or
    folder under the same path): the image counts, the image size (for data in memory) and a digest of
    the class names."""
    names = hashlib.sha256("\n".join(train.class_names).encode()).hexdigest()[:16]
    size = list(train.image_size) if isinstance(train, ImageDataset) else None
    return {"train_images": len(train), "eval_images": len(test), "image_size": size, "class_names_sha256": names}


def _check_same_run(ckpt: dict[str, Any], run: CifarRun, net: connlearn.ConnectivityNet, out: Path,
                    source: str, recipe: Recipe, record: dict[str, Any] | None = None,
                    facts: dict[str, Any] | None = None, world: int = 1) -> None:
    """Refuse to resume the run in ``out`` (``ckpt``: the checkpoint the trainer is about to resume from)
    when ``run`` asks for other data, seed, gate options or connectivity than the one that started it:
    resuming would mix two runs under one record. ``record`` (the run options the trainer writes into its
    checkpoints) takes the starts the resumed network was built with."""
    meta = ckpt.get("meta") or {}
    started = meta.get("run") or {}
    asked = run.to_dict()
    differ = [(k, started[k], asked[k]) for k in RESUME_KEYS if k in started and started[k] != asked[k]]
    built, given = BranchGraph.from_json(ckpt["graph"]), net.graph()
    differ += _architecture_differences(built, given)
    if isinstance(ckpt.get("engine"), str) and ckpt["engine"] != net.engine:  # as built: 'auto' resolves
        differ.append(("engine", ckpt["engine"], net.engine))
    if "source" in meta and (meta["source"] == "generated") != (source == "generated"):
        differ.append(("data", meta["source"], source))
    saved_facts = found if isinstance(found := meta.get("data"), dict) else {}  # runs of older versions: none
    differ += [(f"data {k}", saved_facts[k], v) for k, v in (facts or {}).items()
               if k in saved_facts and saved_facts[k] != v]
    saved = [p.get("epochs") for p in (ckpt.get("recipe") or {}).get("phases", [])]
    asked_split = [p.epochs for p in recipe.phases]
    if saved and saved != asked_split:  # the trainer refuses any other recipe; this names the split
        differ.append(("phases", "/".join(map(str, saved)), "/".join(map(str, asked_split))))
    if started and (started.get("connectivity") is None) != (run.connectivity is None):
        differ.append(("connectivity", started.get("connectivity"), run.connectivity))
    elif run.connectivity is not None and architecture(built) == architecture(given) and any(  # else named above
            built.gate_matrix(m)[1] != given.gate_matrix(m)[1] for m in given.modules() if given.candidates(m)):
        differ.append(("connectivity", f"{started.get('connectivity')}", f"{run.connectivity} (another top-K)"))
    if differ:
        listed = "; ".join(f"{k}={old!r} there, {new!r} here" for k, old, new in differ)
        raise ConfigError(f"{out} holds a run started with other settings ({listed}); run the command that "
                          "started it to resume it, or give another --out")
    if record is not None:  # the weights come from the checkpoint, and with them the starts it was built with
        record.update(starts_of(built.graph))
    within = ckpt.get("within_epoch")
    where = (f"batch {within.get('batch')} of epoch {ckpt.get('epoch', 0) + 1}" if isinstance(within, dict)
             and isinstance(ckpt.get("epoch"), int) else f"epoch {ckpt.get('epoch')}")
    _say(f"connlearn: resuming the run in {out} after {where} of {recipe.total_epochs}")
    before = meta.get("world_size")  # runs of older versions: not recorded
    if isinstance(before, int) and before != world:
        _say(f"connlearn: this run trained its last epoch in {before} process{'es' * (before != 1)} and goes on in "
             f"{world}: each batch norm now normalises over 1/{world} of every batch, not 1/{before}, so the run "
             "will not end as one in either alone")


def make_recipe(run: CifarRun) -> Recipe:
    """The dataset's paper recipe, scaled to ``run.epochs`` (or split as ``run.phases``), with the run's batch
    size, phase-1 gate learning rate and sampling temperature, and gate momentum."""
    paper = get_recipe(PROTOCOLS[run.dataset].recipe)
    recipe = paper.scaled(run.epochs) if run.phases is None else paper.with_phase_epochs(run.phases)
    if run.batch_size is not None:
        recipe = attrs.evolve(recipe, batch_size=run.batch_size)
    first = attrs.evolve(recipe.phases[0], temperature=run.gate_temperature, temperature_end=run.gate_temperature_end)
    if run.gate_lr is not None:
        first = attrs.evolve(first, gate_lr=run.gate_lr)
    return attrs.evolve(recipe, phases=(first, *recipe.phases[1:]), gate_momentum=run.gate_momentum)


def run_cifar(run: CifarRun, time_limit: float | None = None,
              stop_signals: Iterable[Any] | str | None = "auto") -> dict[str, Any] | None:
    """Train, prune and draw one run; returns (and writes to ``out/summary.json``) its results.

    With ``time_limit`` (seconds) it starts no new epoch after that time and returns ``None`` if the run
    is not finished; calling it again resumes. On one of ``stop_signals`` training stops at the next step
    with a checkpoint and :class:`~connlearn.signals.TrainingStopped` ends the program (see
    :meth:`Trainer.fit`); ``"auto"``: :data:`~connlearn.signals.STOP_SIGNALS` (Ctrl-C, ``SIGTERM``,
    ``SIGUSR1``) in the main thread, none in another (where Python cannot catch signals).

    Launched by ``torchrun --nproc_per_node N`` (a script of ``examples/`` or ``connlearn train``), it
    trains with DistributedDataParallel: every process joins the group and takes the GPU of its
    ``LOCAL_RANK``, and each reads ``1/N`` of every batch (the recipe's batch size is the global one, so
    the batches and the learning rates are those of one process). Rank 0 writes the files and returns the
    results; the other ranks return ``None``. In a process group its caller made, it takes that group's
    ranks and leaves the group open. An error on one rank ends a ``torchrun`` job (torchrun stops the
    other processes); in a group of the caller's, the other ranks wait at their next collective until
    the group's timeout."""
    started = time.perf_counter()
    device = check_device(run.device)  # a device this machine lacks is named before any data is read
    rank, world, device, joined = _join_torchrun(device)
    try:
        if stop_signals == "auto":
            stop_signals = STOP_SIGNALS if threading.current_thread() is threading.main_thread() else ()
        with contextlib.ExitStack() as held:  # _run holds the output folder from when it makes it
            return _run(run, time_limit, check_signals(stop_signals), started, device, rank, world, held)
    finally:
        if joined:
            _leave_group()


def _leave_group() -> None:
    """Destroy the process group this process joined. Before torch 2.8, destroying a gloo group holds
    Python's lock while it waits for the group's threads, and a thread still freeing the tensors of the
    last collective needs that lock: a deadlock (a resumed run that had finished hung there). Waiting a
    moment first, with the lock released, lets the threads finish."""
    if dist.get_backend() == "gloo" and torch.__version__ < "2.8":
        time.sleep(0.2)
    dist.destroy_process_group()


def _run(run: CifarRun, time_limit: float | None, stop_signals: tuple[signal.Signals, ...], started: float,
         device: torch.device, rank: int, world: int, held: contextlib.ExitStack) -> dict[str, Any] | None:
    recipe = make_recipe(run)  # what _as_built changes below (gate, K, architecture) does not reach it
    if recipe.batch_size % world:  # before any rank reads the data
        raise ConfigError(f"batch size {recipe.batch_size} does not split over {world} processes; give a "
                          f"multiple of {world} (--batch-size)")
    out = expand_home(run.out)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"out: {out} is a file; the output is a folder (of logs and checkpoints)")
    if rank != 0:  # rank 0 reads (and for CIFAR perhaps downloads) the data first, the others then find it
        dist.barrier()
    train, test, source = load_data(run)
    if world > 1 and rank == 0:
        dist.barrier()
    net = build_net(run, train.num_classes)
    if run.connectivity is not None:  # what is recorded is what runs
        run = _as_built(run, net)
    out.mkdir(parents=True, exist_ok=True)  # once the options have built a network
    held.enter_context(hold_folder(out, "a training run", rank == 0, device))  # to the end: pruning, drawings too
    if rank == 0:  # held, and the run's own: what a killed write left in it is no one's
        remove_leftovers(out)
    if (run.gate_temperature != 1.0 or run.gate_temperature_end is not None) and not net.stochastic:
        _say(f"connlearn: gate={run.gate} draws no connectivity: the sampling temperature has no effect")
    if run.gate_grad != "plain" and not net.gate_parameters():
        _say(f"connlearn: gate={run.gate} learns no gates: gate_grad={run.gate_grad} has no effect")
    protocol, options = PROTOCOLS[run.dataset], {"rank": rank, "world_size": world}
    options.update({} if run.workers is None else {"num_workers": run.workers})
    batch, eval_batch = recipe.batch_size // world, max(1, max(recipe.batch_size, 256) // world)
    train_loader: Loader
    test_loader: Loader
    if protocol.in_memory:
        assert isinstance(train, ImageDataset) and isinstance(test, ImageDataset)  # what load_data gives then
        train_loader, test_loader = make_loaders(
            train, test, batch, device=device, seed=run.seed, path=run.loader, eval_batch_size=eval_batch,
            crop=protocol.crop, pad=protocol.pad, **options,
        )
    else:
        assert isinstance(train, ImageFiles) and isinstance(test, ImageFiles)  # the lists of ImageNet's files
        train_loader, test_loader = folder_loaders(train, test, batch, device=device, seed=run.seed,
                                                   eval_batch_size=eval_batch, size=protocol.image_size, **options)
    origin = f" (connectivity of {run.connectivity})" if run.connectivity else ""
    changed = {k: getattr(run, k) for k in ("M", "C", "width", "base_channels", "stem_channels")
               if getattr(run, k) is not None and not run.connectivity}
    origin += f" with {', '.join(f'{k}={v}' for k, v in changed.items())}" if changed else ""
    conv = "" if run.conv_init == DEFAULT_CONV_INIT else f" conv_init={run.conv_init}"
    _say(f"connlearn: {run.preset}{origin} gate={run.gate} K={net.K} residual_init={run.residual_init}{conv} "
         f"on {source}: {len(train)} train / {len(test)} eval images, {recipe.total_epochs} epochs "
         f"({'/'.join(str(p.epochs) for p in recipe.phases)}), "
         + (f"{world} processes on {device.type} ({batch} images each per batch)" if world > 1 else f"{device}"))
    net.activation_checkpointing = run.activation_checkpointing
    meta: dict[str, Any] = {"run": run.to_dict(), "source": source, "data": (facts := data_facts(train, test)),
                            "world_size": world}
    trainer = Trainer(
        net, train_loader, test_loader, recipe, out_dir=out, device=device, amp=run.amp, compile=run.compile,
        gate_grad=run.gate_grad, snapshot_every=run.snapshot_every, checkpoint_every=run.checkpoint_every,
        tensorboard=run.tensorboard,
        progress=run.progress,
        meta=meta,
        resume_check=functools.partial(_check_same_run, run=run, net=net, out=out, source=source, recipe=recipe,
                                       record=meta["run"], facts=facts, world=world),
    )
    # the time limit counts from this call: loading the data is part of it
    history = trainer.fit(time_limit=None if time_limit is None else time_limit - (time.perf_counter() - started),
                          stop_signals=stop_signals)
    if trainer.epoch < recipe.total_epochs:
        _say(f"connlearn: stopped after epoch {trainer.epoch} of {recipe.total_epochs} (time limit); "
             "run again to resume")
        return None
    if rank != 0:  # rank 0 prunes, draws and writes the summary
        return None
    trained = trainer.net
    graph = trained.graph()
    preset = (graph.graph.get("options") or {}).get("preset")
    if isinstance(preset, str) and preset != run.preset:  # the same architecture asked for by another name
        _say(f"connlearn: this run was built as {preset} (its checkpoint), not {run.preset}; recorded as {preset}")
        run = attrs.evolve(run, preset=preset)
    for key, started_with in starts_of(graph.graph).items():  # a resumed run keeps its own starts
        if started_with != getattr(run, key):
            _say(f"connlearn: this run started with {key}={started_with} (its checkpoint), not "
                 f"{getattr(run, key)}; recorded as {started_with}")
            run = attrs.evolve(run, **{key: started_with})  # type: ignore[arg-type]  # key: a str option
    overlap = input_overlap(graph)  # of the unpruned network, dead blocks included: pruned.pt records it too
    if not freezing_changes_outputs(trained):
        pruned, report = prune_dead_blocks(trained, freeze=True)  # freezes a copy: ``graph`` stays the trained one
        # best_top1 is the run's best epoch; top1 is these weights' own (the last epoch's, unchanged by pruning)
        save_atomic(make_checkpoint(pruned, meta={"run": run.to_dict(), "source": source, "prune": str(report),
                                                  "params_train": report.params_before,
                                                  "top1": history[-1].get("test_top1"),
                                                  "input_overlap": {str(m): v for m, v in overlap.items()}},
                                    epoch=trainer.epoch, best_top1=trainer.best_top1), out / "pruned.pt")
    else:  # real gates never frozen (a schedule of phase 1 only): their outputs depend on every input
        report = None
    last = history[-1]
    chance = {m: random_overlap(len(graph.candidates(m)), trained.K) for m in overlap}  # independent draws
    summary = {
        "dataset": source, "preset": run.preset, "gate": run.gate, "K": trained.K, "epochs": recipe.total_epochs,
        "test_top1": last.get("test_top1"), "best_top1": trainer.best_top1,
        "params_train": trained.num_parameters() if report is None else report.params_before,
        "params_test": None if report is None else report.params_after,
        "active_branches": {str(m): n for m, n in active_branches(graph).items()},
        "input_overlap": {str(m): v for m, v in overlap.items()},
        "input_overlap_chance": {str(m): v for m, v in chance.items()},
        "wall_time_s": sum(r["epoch_time"] + r.get("eval_time", 0.0) for r in history),
        "epoch_time_s": sum(r["epoch_time"] for r in history) / len(history),
        "history": [{k: r.get(k) for k in ("epoch", "test_top1", "train_loss", "gate_mean", "gate_row_std",
                                           "gate_at_1", "connectivity_changed")} for r in history],
        "files": [],
        "run": run.to_dict(),
        "environment": environment(),  # of the process that finished it; each checkpoint holds its writer's
    }
    write_text_atomic(out / "summary.json", json.dumps(summary, indent=2))  # before the drawings, which need Graphviz
    pictures = _draw(out, graph, history, trained.K, eval_set=eval_set_of(run.to_dict()))
    summary["files"] = [str(p) for p in pictures]
    write_text_atomic(out / "summary.json", json.dumps(summary, indent=2))
    _say(f"top-1: {summary['test_top1']:.2f}% (last epoch), best {summary['best_top1']:.2f}%")
    if source == "generated":
        _say(f"connlearn: these numbers are on a small generated dataset, not on {run.dataset}: no {run.dataset} data "
             "was found (see the message at the start)")
    if report is None:
        _say(f"parameters: {summary['params_train'] / 1e6:.3f}M; not pruned: the {run.gate} gates were never frozen "
             "(no phase 2 in this schedule), and they weight every input")
    else:
        _say(f"parameters: {report.params_before / 1e6:.3f}M train, {report.params_after / 1e6:.3f}M test after "
             f"pruning dead blocks ({report.blocks_before - report.blocks_after} of {report.blocks_before} blocks "
             "removed)")
    _say(f"active branches per module: {' '.join(str(n) for n in active_branches(graph).values())}")
    chances = {round(v, 2) for v in chance.values()}
    if overlap and chances != {1.0}:  # below 1 only where blocks choose among their inputs
        random_draws = f"; independent random draws: {next(iter(chances)):.2f}" if len(chances) == 1 else ""
        _say(f"input overlap per module: {' '.join(f'{v:.2f}' for v in overlap.values())} "
             f"(1: every block reads the same inputs{random_draws})")
    _say(f"connectivity: {', '.join(str(p) for p in pictures if 'connectivity' in p.name)}")
    return summary


def eval_set_of(run: Mapping[str, Any]) -> str:
    """The name of the data a run was evaluated on, from its options (``CifarRun.to_dict()``, as its
    checkpoints' ``meta["run"]`` and its ``summary.json``'s ``"run"`` hold them): ``"validation"`` when it
    held out a split of the training set, else ``"test"``."""
    if not isinstance(run, Mapping):
        raise ConfigError(f"run options must be a dict (CifarRun.to_dict()), got {type(run).__name__}")
    return "validation" if run.get("val_split") else "test"


def _draw(out: Path, graph, history: list[dict[str, Any]], K: int, eval_set: str) -> list[Path]:
    """Diagrams and plots of a finished run; a missing Graphviz only costs the SVGs (one message)."""
    files: list[Path] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        files += render.save(graph, out / "connectivity.svg")
        pruned = render.pruned_away(graph)  # trained from a pruned connectivity: no ResNeXt to draw beside it
        if pruned is None:
            files += render.save(render.side_by_side(graph), out / "resnext_vs_learned.svg")
        else:
            _say(f"connlearn: this run's connectivity was pruned ({pruned}), so ResNeXt cannot be derived from it: "
                 "no resnext_vs_learned.svg")
    for message in {str(w.message) for w in caught}:
        _say(f"connlearn: {message}")
    files += plots.plot_run(graph, out, K, log=history, snapshots=out / "gates.jsonl", eval_set=eval_set)
    return files

