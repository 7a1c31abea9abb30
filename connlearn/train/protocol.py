"""The paper's protocols (CIFAR-10/100, Mini-ImageNet, ImageNet) and the same for a dataset of your own, as one
call: data, network, phased training, pruning and pictures.

``run(RunConfig(...))`` is what ``connlearn train`` and ``examples/`` run. Everything lands in ``out``:
``log.jsonl``, ``gates.jsonl``, the checkpoints, ``pruned.pt``, ``connectivity.svg`` (``.dot`` beside it),
``resnext_vs_learned.png``, plots and ``summary.json``. The same command again resumes where it stopped.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from typing import Any

import attrs
import torch
import torch.distributed as dist

import connlearn
from connlearn import plots, render
from connlearn.errors import ConfigError, DataError, check_choice
from connlearn.files import path_of, remove_leftovers, write_text
from connlearn.gates import GATES
from connlearn.graph import BranchGraph, active_branches, check_finite_gates, input_overlap, random_overlap
from connlearn.net import ENGINES
from connlearn.prune import freezing_changes_outputs, prune_dead_blocks
from connlearn.topologies import CONV_INITS, PRESETS, RESIDUAL_INITS, resnext
from connlearn.train.checkpoint import environment, folder_lock, load_checkpoint, make_checkpoint, save_checkpoint
from connlearn.train.data import (
    NUM_CLASSES,
    ArrayDataset,
    ImageDataset,
    ImageFiles,
    load_dataset,
    load_packed,
    synthetic,
)
from connlearn.train.folders import folder_loaders, load_imagenet
from connlearn.train.loaders import MAX_SEED, make_loaders
from connlearn.train.recipe import GATE_OPTIMIZERS, Recipe, get_recipe
from connlearn.train.signals import STOP_SIGNALS
from connlearn.train.trainer import AMP_MODES, COMPILE_MODES, Trainer
from connlearn.updater import GRAD_MODES


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
#: The options a resumed run may change (where to run, how fast, what to show); every other must stay.
MAY_CHANGE = ("out", "data", "device", "amp", "compile", "workers", "progress", "tensorboard", "checkpoint_every",
              "activation_checkpointing", "snapshot_every")
#: The gate kind's training options, at the paper's values where a kind has none of its own (``Gate.trains_with``).
GATE_TRAINING = {"gate_rule": "plain", "gate_optimizer": "sgd", "gate_lr": None, "gate_temperature_end": None,
                 "gate_warmup": 0, "gate_holdout": None}
#: The options that a connectivity file fixes (its architecture and gates).
ARCHITECTURE = ("preset", "gate", "K", "C", "M", "width", "base_channels", "stem_channels", "kernels", "residual_init",
                "conv_init", "uninformative")


def _one_of(known: Any, default: Any) -> Any:
    """A field whose value is one of ``known`` (or None); the choices are in its metadata, for ``--help``."""
    return attrs.field(default=default, metadata={"choices": [str(k) for k in known if isinstance(k, str)]},
                       validator=lambda _, a, value: value is None or check_choice(a.name, value, known))


def _at_least(low: int) -> Any:
    return lambda _, a, value: value is None or connlearn.errors.check_int(a.name, value, low)


def _text(_: Any, a: attrs.Attribute, value: Any) -> None:
    if value is not None and not isinstance(value, str):
        raise ConfigError(f"{a.name} must be a path or a name (a string), got {value!r}")


@attrs.frozen
class RunConfig:
    """One run of a dataset's protocol. Options left None take the protocol's value: ``preset`` its first,
    ``gate`` topk, ``epochs`` the paper's schedule (CIFAR: 120/100/50/50), which any other ``epochs`` scales
    (``phases`` gives each phase's epochs instead). ``train_subset``/``test_subset``: class-balanced subsets;
    ``val_split``: hold that many training images out and evaluate on them. ``C``, ``M``, ``width``,
    ``base_channels``, ``stem_channels`` override the preset. ``connectivity`` (a checkpoint or a graph JSON)
    trains that connectivity from scratch: the architecture and each block's top-K inputs from the file, new
    weights from ``seed``. ``synthetic``: train on a small generated stand-in of the dataset (a smoke run)."""

    dataset: str = _one_of(PROTOCOLS, "cifar100")
    preset: str | None = _one_of(PRESETS, None)
    gate: str | None = None
    K: int | None = attrs.field(default=None, validator=_at_least(1))
    epochs: int | None = attrs.field(default=None, validator=_at_least(1))
    phases: tuple[int, ...] | None = attrs.field(default=None, converter=lambda v: None if v is None else tuple(v))
    seed: int = attrs.field(default=0, validator=lambda _, a, v: connlearn.errors.check_int(a.name, v, 0, MAX_SEED))
    data: str | None = attrs.field(default=None, validator=_text)
    out: str | None = attrs.field(default=None, validator=_text)
    batch_size: int | None = attrs.field(default=None, validator=_at_least(1))
    device: str | None = attrs.field(default=None, validator=_text)
    amp: str = _one_of(AMP_MODES, "auto")
    compile: bool | str = _one_of((False, True, *COMPILE_MODES), False)
    activation_checkpointing: bool = False
    engine: str = _one_of(ENGINES, "fused")
    loader: str = _one_of(("auto", "dataloader"), "auto")
    workers: int | None = attrs.field(default=None, validator=_at_least(0))
    gate_rule: str = _one_of(GRAD_MODES, None)
    gate_init: float | str = 0.5
    gate_lr: float | None = None
    gate_momentum: float | None = None
    gate_optimizer: str = _one_of(GATE_OPTIMIZERS, None)
    gate_warmup: int = attrs.field(default=None, validator=_at_least(0))
    gate_holdout: int | None = attrs.field(default=None, validator=_at_least(1))
    gate_temperature: float = 1.0
    gate_temperature_end: float | None = None
    residual_init: str | None = _one_of(RESIDUAL_INITS, None)
    conv_init: str | None = _one_of(CONV_INITS, None)
    connectivity: str | None = attrs.field(default=None, validator=_text)
    train_subset: int | None = attrs.field(default=None, validator=_at_least(1))
    test_subset: int | None = attrs.field(default=None, validator=_at_least(1))
    val_split: int | None = attrs.field(default=None, validator=_at_least(1))
    C: int | None = attrs.field(default=None, validator=_at_least(1))
    M: int | None = attrs.field(default=None, validator=_at_least(1))
    width: int | None = attrs.field(default=None, validator=_at_least(1))
    base_channels: int | None = attrs.field(default=None, validator=_at_least(1))
    stem_channels: int | None = attrs.field(default=None, validator=_at_least(1))
    kernels: tuple[int, ...] | None = attrs.field(default=None, converter=lambda v: None if v is None else tuple(v))
    uninformative: tuple[int, ...] | None = attrs.field(default=None,
                                                        converter=lambda v: None if v is None else tuple(v))
    snapshot_every: int = attrs.field(default=100, validator=_at_least(0))
    checkpoint_every: int = attrs.field(default=0, validator=_at_least(0))
    eval_every: int = attrs.field(default=1, validator=_at_least(1))
    recalibrate_bn: int = attrs.field(default=0, validator=_at_least(0))
    tensorboard: bool = False
    progress: bool = True
    synthetic: bool = False

    def __attrs_post_init__(self) -> None:
        protocol = PROTOCOLS[self.dataset]
        if self.preset is not None and self.preset not in protocol.presets:
            raise ConfigError(f"preset {self.preset!r} is not one of {self.dataset}'s: {', '.join(protocol.presets)}")
        if self.gate is not None:
            GATES.get(self.gate)  # a typo is named before any data is read
        kind = {} if self.connectivity else GATES.get(self.gate or "topk").trains_with
        for name, default in GATE_TRAINING.items():  # what the run leaves unset: its gate kind's, else the paper's
            if getattr(self, name) is None:
                object.__setattr__(self, name, kind.get(name, default))
        fixed = [k for k in ARCHITECTURE if getattr(self, k) is not None]
        if self.connectivity is not None and fixed:
            raise ConfigError(f"connectivity {self.connectivity} fixes the architecture and connectivity: leave out "
                              f"{', '.join(fixed)}")
        if self.gate_holdout is not None and (self.dataset == "imagenet" or self.connectivity is not None or (
                self.gate is not None and not GATES.get(self.gate).learnable)):
            raise ConfigError("gate_holdout gives learned gates held-out batches: it needs a gate kind that learns "
                              "(not a fixed connectivity) and in-memory data (not imagenet)")
        if self.workers is not None and self.loader == "auto" and self.dataset != "imagenet":
            raise ConfigError("workers are DataLoader processes: give loader 'dataloader' too (the default loader "
                              "makes its batches on the device, without workers)")
        if self.dataset == "custom" and self.data is None and not self.synthetic:
            raise ConfigError("dataset 'custom' trains on a packed file of your own: give data (--data FILE.npz)")
        self.recipe()  # a phase split or a temperature out of range is named now
        if self.connectivity is None:  # so is an architecture that cannot be built (M not a multiple of 3, K > C)
            resnext(preset=self.preset or protocol.presets[0], gate=self.gate or "topk", **self.network_options())

    def network_options(self) -> dict[str, Any]:
        """The architecture options this run sets on top of its preset."""
        return {k: getattr(self, k) for k in ("C", "M", "width", "base_channels", "stem_channels", "K", "kernels",
                                              "residual_init", "conv_init", "uninformative")
                if getattr(self, k) is not None}

    @property
    def output(self) -> str:
        return self.out or f"runs/{self.dataset}"

    def recipe(self) -> Recipe:
        """The protocol's recipe scaled to ``epochs`` (or split as ``phases``), with this run's batch size and
        gate settings."""
        paper = get_recipe(PROTOCOLS[self.dataset].recipe)
        recipe = (paper.with_phase_epochs(self.phases) if self.phases
                  else paper.scaled(self.epochs or paper.total_epochs))
        if self.epochs is not None and recipe.total_epochs != self.epochs:
            raise ConfigError(f"phases {self.phases} add up to {recipe.total_epochs} epochs, not epochs={self.epochs}")
        first = attrs.evolve(recipe.phases[0], temperature=self.gate_temperature,
                             temperature_end=self.gate_temperature_end,
                             gate_lr=recipe.phases[0].gate_lr if self.gate_lr is None else self.gate_lr)
        return attrs.evolve(recipe, phases=(first, *recipe.phases[1:]), batch_size=self.batch_size or recipe.batch_size,
                            gate_momentum=self.gate_momentum, gate_rule=self.gate_rule,
                            gate_optimizer=self.gate_optimizer, gate_warmup=self.gate_warmup)

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


def defaults() -> dict[str, Any]:
    """Each option's value where a run leaves it out and its gate kind sets nothing: what a run that predates an
    option trained with."""
    return {**{f.name: f.default for f in attrs.fields(RunConfig)}, **GATE_TRAINING}


def _say(message: str) -> None:
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(message, flush=True)


def load_data(config: RunConfig) -> tuple[Any, Any, str, Any]:
    """The train and evaluation sets of ``config``, where they came from, and the gates' held-out images
    (``gate_holdout``, else None): the last of each class, apart from the training subset, so that the
    weights train on the images they would without it."""
    protocol, classes = PROTOCOLS[config.dataset], NUM_CLASSES.get(config.dataset, 10)
    train: Any
    test: Any
    if config.synthetic:
        size = protocol.image_size or 32
        per_class = 20 if classes <= 100 else 2  # ImageNet's stand-in: 2 images of 224 px per class
        train, test = synthetic(classes, max(2000, per_class * classes), max(500, per_class * classes // 4), size,
                                config.seed)
        source = f"a generated stand-in of {config.dataset}"
    elif config.dataset == "imagenet":
        (train, test), source = load_imagenet(config.data), "imagenet"
    elif config.dataset == "custom":
        (train, test), source = load_packed(str(config.data)), str(config.data)
    else:
        (train, test), source = load_dataset(config.dataset, config.data), config.dataset
    if isinstance(train, ArrayDataset) and protocol.image_size:
        raise DataError(f"the {config.dataset} data found holds arrays of {describe(train)}, not images: train it "
                        "as --dataset custom")
    if isinstance(train, ImageDataset) and protocol.image_size and (train.image_size, train.channels) != (
            (protocol.image_size,) * 2, 3):
        h, w = train.image_size
        raise DataError(f"the {config.dataset} data found has {h}x{w}x{train.channels} images; its protocol takes "
                        f"{protocol.image_size}x{protocol.image_size}x3 (or train it as --dataset custom)")
    if config.val_split:
        train, test = train.split(config.val_split)
        source += f" (a validation split of {len(test)} training images)"
    held = None
    if config.gate_holdout:
        train, held = train.split(config.gate_holdout)
        source += f" (the gates' steps on {len(held)} held-out training images)"
    train = train.subset(config.train_subset) if config.train_subset and config.train_subset < len(train) else train
    test = test.subset(config.test_subset) if config.test_subset and config.test_subset < len(test) else test
    return train, test, source, held


def run_loaders(config: RunConfig, train: Any, test: Any, held: Any = None, *, device: torch.device,
                rank: int = 0, world: int = 1) -> tuple[Any, Any, Any]:
    """The training, evaluation and gates' held-out loaders (None without ``held``) of a run of ``config`` on
    the sets of :func:`load_data`, for process ``rank`` of ``world``."""
    protocol, batch = PROTOCOLS[config.dataset], config.recipe().batch_size // world
    shards: dict[str, Any] = {"rank": rank, "world_size": world,
                              **({} if config.workers is None else {"num_workers": config.workers})}
    eval_batch = max(batch, 256 // world) if device.type == "cuda" else batch  # per image, 256 is 2x slower on a CPU
    common = {"device": device, "seed": config.seed, **shards}
    if isinstance(train, ImageFiles):  # imagenet, which takes no gate_holdout
        return (*folder_loaders(train, test, batch, eval_batch_size=eval_batch, size=protocol.image_size or 224,
                                **common), None)
    common.update(path=config.loader, crop=protocol.crop, pad=protocol.pad)
    gate_loader = None if held is None else make_loaders(held, test, batch, normalised_by=train, **common)[0]
    return (*make_loaders(train, test, batch, eval_batch_size=eval_batch, **common), gate_loader)


def build_net(config: RunConfig, train: ImageDataset | ImageFiles) -> connlearn.ConnectivityNet:
    """The network ``config`` trains: its preset with the overrides, or the connectivity of its file."""
    if config.connectivity is not None:
        path = path_of(config.connectivity)
        if path.resolve().parent == path_of(config.output).resolve():
            raise ConfigError(f"connectivity {path} lies in the run's own folder, whose checkpoints it overwrites")
        text = path.read_text(encoding="utf-8-sig") if path.suffix == ".json" else load_checkpoint(path)["graph"]
        graph = BranchGraph.from_json(text)
        check_finite_gates(graph.validate(), f"connectivity {path}")
        if graph.graph["gate"] in GATES and GATES.get(graph.graph["gate"]).learnable:  # its top-K, as it stands
            graph.graph.update(gate="frozen", frozen_from=graph.graph["gate"], weighted_inputs=False)
            graph.graph.pop("gate_options", None)  # the knobs of the kind that learned it
        net = connlearn.from_graph(graph, engine=config.engine, seed=config.seed).freeze()
        if isinstance(train, ArrayDataset):
            fits = (net.in_channels, net.input_size) == (train.channels, train.input_size)
        else:  # images of any size: the loaders crop them
            fits = net.dims == 2 and net.in_channels == (train.channels if isinstance(train, ImageDataset) else 3)
        if not fits or net.num_classes != train.num_classes:
            raise ConfigError(f"connectivity {path}: its network takes {describe(net.in_channels, net.input_size)} to "
                              f"{net.num_classes} classes; the data is {describe(train)} in {train.num_classes} "
                              "classes")
        return net
    protocol = PROTOCOLS[config.dataset]
    options = config.network_options()
    if isinstance(train, ArrayDataset):  # signals or vectors: their own shape and channels
        options.update(input_size=train.input_size, in_channels=train.channels)
    elif protocol.image_size is None and isinstance(train, ImageDataset):  # a dataset of its own size
        options.update(image_size=min(train.image_size), in_channels=train.channels)  # the loaders crop the square
    elif protocol.crop:
        options["image_size"] = protocol.crop
    return connlearn.build("resnext", preset=config.preset or protocol.presets[0], gate=config.gate or "topk",
                           num_classes=train.num_classes, seed=config.seed, gate_init=config.gate_init,
                           engine=config.engine, **options)


def data_facts(train: Any, test: Any) -> dict[str, Any]:
    """What a run records of its data, to refuse resuming on other data under the same path."""
    names = hashlib.sha256("\n".join(train.class_names).encode()).hexdigest()[:16]
    return {"train_images": len(train), "eval_images": len(test), "class_names_sha256": names,
            "image_size": list(train.image_size) if isinstance(train, ImageDataset) else None,
            **({"input_size": list(train.input_size)} if isinstance(train, ArrayDataset) else {})}


def describe(data: Any, input_size: tuple[int, ...] | None = None) -> str:
    """What a network takes or a dataset holds, in words: ``3x32x32 images``, ``12-channel signals of length
    29``, ``vectors of 64``; ``data`` a dataset, or a channel count with ``input_size``."""
    if input_size is None:
        if not isinstance(data, ArrayDataset):
            return (f"{data.channels}x{'x'.join(map(str, data.image_size))} images" if isinstance(data, ImageDataset)
                    else "image files")
        data, input_size = data.channels, data.input_size
    if len(input_size) == 2:
        return f"{data}x{'x'.join(map(str, input_size))} images"
    return f"{data}-channel signals of length {input_size[0]}" if input_size else f"vectors of {data}"


def _check_settings(ckpt: dict[str, Any], config: RunConfig, facts: dict[str, Any]) -> None:
    started = ckpt["meta"].get("run", {})
    differ = [f"{k}={started[k]!r} there, {v!r} here" for k, v in config.to_dict().items()
              if k not in MAY_CHANGE and k in started and started[k] != v]
    differ += [f"data {k}={ckpt['meta']['data'].get(k)!r} there, {v!r} here" for k, v in facts.items()
               if ckpt["meta"].get("data", {}).get(k) != v]
    if differ:
        raise ConfigError(f"{config.output} holds a run started with other settings ({'; '.join(differ)}): run the "
                          "command that started it to resume it, or give another --out")
    _say(f"connlearn: resuming the run in {config.output} after epoch {ckpt['epoch']}")


def run(config: RunConfig, time_limit: float | None = None, stop_signals: Any = "auto") -> dict[str, Any] | None:
    """Train, prune and draw one run; returns (and writes to ``out/summary.json``) its results, or None where
    ``time_limit`` (seconds) stopped it before the end (calling again resumes). Stop signals (default Ctrl-C,
    SIGTERM, SIGUSR1 in the main thread) stop it at the next step with a checkpoint.

    Under ``torchrun --nproc_per_node N`` every process joins the group and takes the GPU of its LOCAL_RANK
    (gloo on the CPU) and reads 1/N of every batch (the batch size is the global one); rank 0 writes the files
    and returns the results, the others None."""
    started = time.perf_counter()
    device = torch.device(config.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    joined = int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized()
    if joined:
        if device.type == "cuda":
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    if stop_signals == "auto":
        stop_signals = STOP_SIGNALS if threading.current_thread() is threading.main_thread() else ()
    try:
        return _run(config, device, time_limit, stop_signals, started)
    finally:
        if joined:
            dist.destroy_process_group()


def _run(config: RunConfig, device: torch.device, time_limit: float | None, stop_signals: Any,
         started: float) -> dict[str, Any] | None:
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    recipe, out = config.recipe(), path_of(config.output)
    if recipe.batch_size % world:
        raise ConfigError(f"batch size {recipe.batch_size} does not split over {world} processes")
    if rank:  # rank 0 reads (and perhaps downloads) the data first
        dist.barrier()
    train, test, source, held = load_data(config)
    if world > 1 and not rank:
        dist.barrier()
    net = build_net(config, train)
    torch.manual_seed(config.seed)  # the global stream (a planted network's noise) is the run's; a resume restores it
    net.activation_checkpointing = config.activation_checkpointing
    out.mkdir(parents=True, exist_ok=True)
    train_loader, test_loader, gate_loader = run_loaders(config, train, test, held, device=device, rank=rank,
                                                         world=world)
    protocol = PROTOCOLS[config.dataset]
    shape = net.graph().graph["options"]
    _say(f"connlearn: {config.connectivity or config.preset or protocol.presets[0]} {{D={shape['depth']}, "
         f"w={shape['width']}, C={shape['C']}}} gate={net.gate_kind} K={net.K} on "
         f"{source}: {len(train)} train / {len(test)} eval images, {recipe.total_epochs} epochs "
         f"({'/'.join(str(p.epochs) for p in recipe.phases)}), {world} process(es) on {device}")
    facts = data_facts(train, test)
    trainer = Trainer(net, train_loader, test_loader, recipe, out_dir=out, device=device, amp=config.amp,
                      compile=config.compile,
                      snapshot_every=config.snapshot_every, checkpoint_every=config.checkpoint_every,
                      eval_every=config.eval_every, recalibrate_bn=config.recalibrate_bn, gate_loader=gate_loader,
                      tensorboard=config.tensorboard, progress=config.progress,
                      meta={"run": config.to_dict(), "source": source, "data": facts},
                      resume_check=lambda ckpt: _check_settings(ckpt, config, facts))
    left = None if time_limit is None else time_limit - (time.perf_counter() - started)
    history = trainer.fit(time_limit=left, stop_signals=stop_signals)
    if trainer.epoch < recipe.total_epochs:
        _say(f"connlearn: stopped after epoch {trainer.epoch} of {recipe.total_epochs} (time limit); run again to "
             "resume")
        return None
    if rank:
        return None
    with folder_lock(out, "a run's pruning and pictures"):
        remove_leftovers(out)
        return _finish(config, trainer, history, source, out)


def _finish(config: RunConfig, trainer: Trainer, history: list[dict[str, Any]], source: str,
            out: Any) -> dict[str, Any]:
    """Prune, write ``summary.json`` and the pictures, and say what the run gave."""
    net, graph = trainer.net, trainer.net.graph()
    overlap = input_overlap(graph)
    report = None
    if not freezing_changes_outputs(net):
        pruned, report = prune_dead_blocks(net, freeze=True)
        save_checkpoint(make_checkpoint(pruned, meta={"run": config.to_dict(), "source": source, "prune": str(report),
                                                      "params_train": report.params_before,
                                                      "top1": history[-1].get("test_top1")},
                                        epoch=trainer.epoch, best_top1=trainer.best_top1), out / "pruned.pt")
    chance = {m: random_overlap(len(graph.candidates(m)), net.K) for m in overlap}
    gate = "frozen" if config.connectivity else config.gate or "topk"  # as asked for, not as the freeze left it
    summary = {"dataset": source, "preset": config.preset, "gate": gate, "K": net.K,
               "epochs": trainer.recipe.total_epochs, "test_top1": history[-1].get("test_top1"),
               "test_top1_before_recalibration": history[-1].get("test_top1_before_recalibration"),
               "best_top1": trainer.best_top1, "params_train": report.params_before if report else net.num_parameters(),
               "params_test": report.params_after if report else None,
               "active_branches": {str(m): n for m, n in active_branches(graph).items()},
               "input_overlap": {str(m): v for m, v in overlap.items()},
               "input_overlap_chance": {str(m): v for m, v in chance.items()},
               "wall_time_s": sum(r["epoch_time"] + r.get("eval_time", 0.0) for r in history),
               "epoch_time_s": sum(r["epoch_time"] for r in history) / len(history),
               "history": [{k: r.get(k) for k in ("epoch", "test_top1", "train_loss", "gate_mean", "gate_row_std",
                                                  "gate_at_1", "connectivity_changed")} for r in history],
               "run": config.to_dict(), "data": trainer.meta["data"], "environment": environment()}
    pictures = render.save(graph, out / "connectivity.svg")
    if not render.pruned(graph):  # a run of a pruned connectivity has no ResNeXt to draw beside it
        pictures += render.save(graph, out / "resnext_vs_learned.png", beside_resnext=True)
    pictures += plots.plot_run(graph, out, net.K, log=history, snapshots=out / "gates.jsonl",
                               eval_set="validation" if config.val_split else "test")
    summary["files"] = [str(p) for p in pictures]
    write_text(out / "summary.json", json.dumps(summary, indent=2))
    _say(f"top-1: {summary['test_top1']:.2f}% (last epoch), best {summary['best_top1']:.2f}%"
         + (f" -- on {source}, not real data" if config.synthetic else ""))
    _say(f"parameters: {summary['params_train'] / 1e6:.3f}M train" + (
        f", {report.params_after / 1e6:.3f}M test after pruning {report.blocks_before - report.blocks_after} dead "
        "blocks" if report else " (not pruned: its real gates were never frozen)"))
    _say(f"active branches per module: {' '.join(str(n) for n in active_branches(graph).values())}")
    _say(f"connectivity: {', '.join(str(p) for p in pictures[:4] if p.suffix != '.dot')}")
    return summary
