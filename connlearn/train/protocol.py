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
from collections import Counter
from typing import Any

import torch
import torch.distributed as dist

import connlearn
from connlearn import plots, render, wiring
from connlearn.blocks import BLOCKS
from connlearn.errors import ConfigError, DataError
from connlearn.files import path_of, read_text, remove_leftovers, write_text
from connlearn.graph import (
    BranchGraph,
    active_branches,
    check_finite_gates,
    input_overlap,
    input_shape,
    random_overlap,
)
from connlearn.prune import freezing_changes_outputs
from connlearn.topologies import PRESETS, neural_graph, resnext
from connlearn.topologies.neural_graph import FEATURES, NODES, STEM_NODES, candidate_edges, stage_sizes
from connlearn.train.checkpoint import environment, folder_lock, load_checkpoint, save_pruned
from connlearn.train.data import (
    NUM_CLASSES,
    ArrayDataset,
    ImageDataset,
    ImageFiles,
    load_dataset,
    load_packed,
    synthetic,
)
from connlearn.train.loaders import folder_loaders, load_imagenet, make_loaders
from connlearn.train.options import NEURAL_GRAPH, OPTIONS, PROTOCOLS, RESNEXT, RunConfig, recorded
from connlearn.train.recipe import get_recipe
from connlearn.train.signals import STOP_SIGNALS
from connlearn.train.trainer import Trainer

__all__ = ["PROTOCOLS", "RunConfig", "build_net", "load_data", "network_graph", "run", "run_loaders"]
#: The largest network a run builds, checked on its graph before any weight exists: the gate edges of the graph
#: (its M modules of C branches make (M - 1)·C² of them) and the parameters of its blocks.
MAX_GATE_EDGES, MAX_PARAMETERS = 2**18, 10**9


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
        source += f" (a validation split of {len(test)} training {noun(train)})"
    held = None
    if config.gate_holdout:
        train, held = train.split(config.gate_holdout)
        source += f" (the gates' steps on {len(held)} held-out training {noun(train)})"
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


def build_net(config: RunConfig, train: ImageDataset | ImageFiles | ArrayDataset) -> connlearn.ConnectivityNet:
    """The network ``config`` trains: its preset with the overrides, or the connectivity of its file."""
    if config.connectivity is not None:
        return _connectivity_net(config, train)
    protocol = PROTOCOLS[config.dataset]
    shape: dict[str, Any] = {"num_classes": train.num_classes}
    if isinstance(train, ArrayDataset):  # signals or vectors: their own shape and channels
        shape.update(input_size=train.input_size, in_channels=train.channels)
    elif protocol.image_size is None and isinstance(train, ImageDataset):  # a dataset of its own size
        shape.update(image_size=min(train.image_size), in_channels=train.channels)  # the loaders crop the square
    elif protocol.crop:
        shape["image_size"] = protocol.crop
    return connlearn.from_graph(network_graph(config, **shape))


def network_graph(config: RunConfig, **shape: Any) -> BranchGraph:
    """The graph of ``config``'s network for data of ``shape`` (``num_classes``, ``in_channels``,
    ``image_size`` or ``input_size``; default the protocol's), refused in one line where it is too large to build
    (:data:`MAX_GATE_EDGES`, :data:`MAX_PARAMETERS`)."""
    graph = _neural_graph(config, **shape) if config.topology == "neural-graph" else _resnext(config, **shape)
    return wiring.start_at_top(graph) if config.edge_init == "top" else graph


def _resnext(config: RunConfig, **shape: Any) -> BranchGraph:
    """The ResNeXt-style graph of ``config``, refused where it is too large to build."""
    preset = config.preset or PROTOCOLS[config.dataset].presets[0]
    C, M = config.C or PRESETS[preset]["C"], config.M or (PRESETS[preset]["depth"] - 2) // 3
    if (M - 1) * C * C > MAX_GATE_EDGES:
        raise ConfigError(f"M={M} modules of C={C} branches make {(M - 1) * C * C:,} gate edges; a run builds up to "
                          f"{MAX_GATE_EDGES:,}: give fewer modules or branches")
    options = {k: getattr(config, k) for k in ("K", "density", *RESNEXT) if k != "preset"}
    graph = resnext(preset=preset, gate=config.gate or "topk", seed=config.seed, gate_init=config.gate_init,
                    **{k: v for k, v in options.items() if v is not None}, **shape)
    count = block_parameters(graph)
    if count > MAX_PARAMETERS:
        raise ConfigError(f"{network_words(config, graph)} would hold {count:,} parameters in its blocks; a run builds "
                          f"up to {MAX_PARAMETERS:,}: give a smaller width, C, M or channels")
    return graph


def _neural_graph(config: RunConfig, **shape: Any) -> BranchGraph:
    """The node graph of ``config`` (topology ``neural-graph``), refused where it has too many edges."""
    given = {k: getattr(config, k) for k in ("K", "density", *NEURAL_GRAPH) if getattr(config, k) is not None}
    nodes = given.get("nodes", NODES)
    edges = candidate_edges(stage_sizes(nodes, given.get("stem_nodes", STEM_NODES), given.get("features", FEATURES)))
    if edges > MAX_GATE_EDGES:
        raise ConfigError(f"nodes {list(nodes)} make {edges:,} candidate edges; a run builds up to "
                          f"{MAX_GATE_EDGES:,}: give fewer nodes")
    return neural_graph(gate=config.gate or "dnw", seed=config.seed, gate_init=config.gate_init, **given, **shape)


def block_parameters(graph: BranchGraph) -> int:
    """The parameters of ``graph``'s blocks, counted on the meta device: no memory is taken."""
    dims = len(input_shape(graph.nodes["input"]))
    kinds = Counter(json.dumps([d["block"], d["in_channels"], d["out_channels"], d["stride"], d["params"]])
                    for _, d in graph.nodes(data=True) if d["kind"] == "block")
    total = 0
    with torch.device("meta"):
        for kind, count in kinds.items():
            block, in_ch, out_ch, stride, params = json.loads(kind)
            made = BLOCKS.get(block)(in_ch, out_ch, stride, 1, **params, **({} if dims == 2 else {"dims": dims}))
            total += count * sum(p.numel() for p in made.parameters())
    return total


def _connectivity_net(config: RunConfig, train: Any) -> connlearn.ConnectivityNet:
    """The frozen connectivity of ``config.connectivity``, with new weights from the run's seed (``reinit``:
    from another stream)."""
    path = path_of(config.connectivity)
    if path.resolve().parent == path_of(config.output).resolve():
        raise ConfigError(f"connectivity {path} lies in the run's own folder, whose checkpoints it overwrites")
    text = read_text(path, "graph", ConfigError) if path.suffix == ".json" else load_checkpoint(path)["graph"]
    graph = BranchGraph.from_json(text)
    check_finite_gates(graph.validate(), f"connectivity {path}")
    graph = wiring.fixed(graph)  # its top-K, as it stands
    if config.rewire is not None:
        graph = (wiring.shuffle if config.rewire == "stages" else wiring.rewire)(graph, seed=config.seed)
    init = config.seed ^ 0x9E3779B9 if config.reinit else config.seed  # reinit: other low 32 bits (torch reads those)
    if graph.graph.get("edge_weights"):  # from scratch: new edge weights too, drawn as dnw draws them
        edges = wiring.gate_edges(graph)
        fresh = 2 * torch.rand(len(edges), generator=torch.Generator().manual_seed(init)) - 1
        for e, value in zip(edges, fresh.tolist(), strict=True):
            graph.edges[e]["gate"] = value
    net = connlearn.from_graph(graph, seed=init).freeze()
    if isinstance(train, ArrayDataset):
        fits = (net.in_channels, net.input_size) == (train.channels, train.input_size)
    else:  # images of any size: the loaders crop them
        fits = net.dims == 2 and net.in_channels == (train.channels if isinstance(train, ImageDataset) else 3)
    if not fits or net.num_classes != train.num_classes:
        raise ConfigError(f"connectivity {path}: its network takes {describe(net.in_channels, net.input_size)} to "
                          f"{net.num_classes} classes; the data is {describe(train)} in {train.num_classes} classes")
    return net


def network_words(config: RunConfig, graph: BranchGraph) -> str:
    """The network in words: ``cifar-29-8-8 {D=29, w=8, C=8}``, the preset named only where the network is
    the preset's (``{D=11, w=2, C=4}`` where options changed it; the file's name for a connectivity)."""
    words = shape_words(graph)
    if graph.graph.get("node_graph"):
        return f"neural-graph {words}"
    changed = any(getattr(config, k) is not None for k in ("C", "M", "width", "base_channels", "stem_channels",
                                                             "kernels"))
    name = config.connectivity or (None if changed else config.preset or PROTOCOLS[config.dataset].presets[0])
    return f"{name} {words}" if name else words


def shape_words(graph: BranchGraph) -> str:
    """The network's shape in words: ``{D=29, w=8, C=8}``, a node graph's ``{nodes 32+192+192+192+192}``."""
    shape = graph.graph.get("options", {})
    if graph.graph.get("node_graph"):
        return f"{{nodes {shape.get('stem_nodes')}+{'+'.join(map(str, shape.get('nodes', [])))}}}"
    return f"{{D={shape.get('depth')}, w={shape.get('width')}, C={shape.get('C')}}}"


def schedule_words(config: RunConfig) -> str:
    """The schedule in words: ``320 epochs (120/100/50/50)``, the phases that too few epochs leave out, and the
    batch norms recomputed before the last evaluation."""
    recipe, paper = config.recipe(), get_recipe(config.schedule or PROTOCOLS[config.dataset].recipe)
    epochs = f"{recipe.total_epochs} epoch{'s' * (recipe.total_epochs > 1)}"
    words = f"{epochs} ({'/'.join(str(p.epochs) for p in recipe.phases)})"
    left = len(paper.phases) - len(recipe.phases)
    return (words + (f"; {left} of the {len(paper.phases)} phases left out: each phase needs an epoch (give at least "
                     f"{len(paper.phases)} epochs)" if left else "")
            + (f", batch norms recomputed over {config.recalibrate_bn} batches before the last evaluation"
               if config.recalibrate_bn else ""))


def noun(data: Any) -> str:
    """What a dataset holds: images, or examples (signals, vectors)."""
    return "examples" if isinstance(data, ArrayDataset) else "images"


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
    started = recorded(ckpt["meta"].get("run", {}))
    differ = [f"{k}={started[k]!r} there, {v!r} here" for k, v in recorded(config.to_dict()).items()
              if not OPTIONS[k].resumable and started[k] != v]
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
    graph = net.graph()
    net.activation_checkpointing = config.activation_checkpointing
    out.mkdir(parents=True, exist_ok=True)
    train_loader, test_loader, gate_loader = run_loaders(config, train, test, held, device=device, rank=rank,
                                                         world=world)
    _say(f"connlearn: {network_words(config, graph)} {graph.gate_words()} on {source}: {len(train)} train "
         f"/ {len(test)} eval {noun(train)}, {schedule_words(config)}; {world} process(es) on {device}")
    facts = data_facts(train, test)
    here = RunConfig(**{**config.to_dict(), "device": str(device)})  # this process's GPU under torchrun
    trainer = Trainer(net, train_loader, test_loader, recipe, here, gate_loader=gate_loader,
                      meta={"run": config.to_dict(), "source": source, "data": facts,
                            "params_train": net.num_parameters()},  # as it trains: a freeze comes later
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
    report = None if freezing_changes_outputs(net) else save_pruned(trainer.state(), out / "pruned.pt")
    chance = {} if graph.graph.get("density") else {  # K of C in every block; a budget has no such chance
        m: random_overlap(len(graph.candidates(m)), net.K) for m in overlap}
    gate = "frozen" if config.connectivity else config.gate or "topk"  # as asked for, not as the freeze left it
    summary = {"dataset": source, "preset": config.preset, "gate": gate, "K": net.K,
               "epochs": trainer.recipe.total_epochs, "test_top1": history[-1].get("test_top1"),
               "test_top1_before_recalibration": history[-1].get("test_top1_before_recalibration"),
               "best_top1": trainer.best_top1, "params_train": trainer.meta["params_train"],
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
    if not render.pruned(graph) and not graph.graph.get("node_graph"):  # else there is no ResNeXt to draw beside it
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
