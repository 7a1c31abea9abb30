"""The ``connlearn`` command: train, prune, render, plot, info, export, pack.

Exit codes: 0 success; 1 a ConnlearnError or a file error (one line on stderr, no traceback); 2 bad usage;
130 training stopped by Ctrl-C, 128 + N by another stop signal N (143 for SIGTERM): at the next step, with a
checkpoint there (a second Ctrl-C stops at once); 141 (128 + SIGPIPE), quietly, when the reader of its output
went away (``connlearn info last.pt | head``).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import functools
import json
import os
import re
import select
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import attrs

from connlearn.errors import ConfigError, ConnlearnError, DataError, check_int, closest
from connlearn.files import expand_home


class Parser(argparse.ArgumentParser):
    """argparse's parser, whose refusal of a value that is not among an option's choices (or of an unknown
    subcommand) also names the closest choice, as connlearn's own errors do."""

    def error(self, message: str) -> NoReturn:
        found = re.fullmatch(r"argument .+?: invalid choice: ('.*'|\".*\") \(choose from (.*)\)", message)
        if found is not None and "did you mean" not in message:
            choices = [_unquoted(c) for c in found.group(2).split(", ")]
            hint = closest(_unquoted(found.group(1)), choices)
            if hint:
                message += f"; did you mean {hint[0]!r}?"
        super().error(message)


def _unquoted(text: str) -> str:
    """A value as argparse's message writes it: quoted as Python writes a string (before Python 3.12.8), or
    as it is."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text
    return value if isinstance(value, str) else text


def _value(text: str) -> Any:
    """A flag value as int, float or string (``--gate-init uniform`` and ``--gate-init 0.3`` both work)."""
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def add_train_arguments(parser: argparse.ArgumentParser, dataset: str | None = None) -> None:
    """The flags of the paper's protocol (``connlearn train`` and the examples); ``dataset`` fixes the dataset
    (an example's), else ``--dataset`` chooses it."""
    from connlearn.blocks import CONV_INITS, RESIDUAL_INITS
    from connlearn.compile import ENGINES
    from connlearn.data import LOADER_PATHS
    from connlearn.experiment import DATASETS, PROTOCOLS, TRAIN_PRESETS, CifarRun
    from connlearn.recipe import get_recipe
    from connlearn.train import AMP_MODES, COMPILE_MODES
    from connlearn.updater import GRAD_MODES

    defaults = CifarRun(dataset=dataset or CifarRun().dataset)
    recipe = get_recipe(PROTOCOLS[defaults.dataset].recipe)

    def others(value_of) -> str:
        """``"; imagenet: X"`` for each dataset whose default differs from the default dataset's, where
        ``--dataset`` chooses the dataset (an example's flags name its own defaults only)."""
        if dataset is not None:
            return ""
        mine = value_of(defaults.dataset)
        return "".join(f"; {name}: {value_of(name)}" for name in DATASETS if value_of(name) != mine)

    def schedule(name: str) -> str:
        phases = get_recipe(PROTOCOLS[name].recipe).phases
        return "/".join(str(p.epochs) for p in phases)

    a = parser.add_argument
    a("--config", metavar="FILE", help="JSON (or TOML) file of the options below, keyed by their field names (e.g. "
      "{\"epochs\": 30, \"progress\": false}); flags override it")
    if dataset is None:
        a("--dataset", choices=sorted(DATASETS), help=f"default {defaults.dataset}")
    presets = TRAIN_PRESETS if dataset is None else PROTOCOLS[dataset].presets
    a("--preset", choices=presets, help=f"architecture {{D,w,C}} (default {defaults.preset}"
                                        f"{others(lambda name: PROTOCOLS[name].preset)})")
    a("--gate", help="topk (GateConnect), real, random (Fixed-Random), full (ResNeXt) (default topk)")
    a("--K", type=int, help="fan-in: active inputs per block (default C/2; C for full)")
    a("--epochs", type=int, help=f"total epochs; the paper's schedule ({schedule(defaults.dataset)}"
                                 f"{others(schedule)}) is scaled to it (default {defaults.epochs}"
                                 f"{others(lambda name: CifarRun(dataset=name).epochs)}; or the sum of --phases)")
    a("--phases", type=int, nargs=4, metavar=("P1", "P2", "P3", "P4"),
      help="epochs of each phase instead of the scaled split (phase 1 is where learned gates are trained; "
           "from phase 2 on the connectivity is fixed)")
    a("--seed", type=int, help="seeds the weights, gates, data order and augmentation (and the generated "
                               "stand-in, when no data is found): 0 to 2**40 (default 0)")
    data_help = {None: "a packed .npz file or a folder with the dataset (else $CONNLEARN_DATA, else download "
                        "for CIFAR; ImageNet: the folder holding train/ and val/)",
                 "miniimagenet": "the packed miniimagenet .npz file, or a folder holding it (else $CONNLEARN_DATA)",
                 "imagenet": "the folder holding train/ and val/, each with one folder of images per class (else "
                             "$CONNLEARN_DATA)"}
    a("--data", help=data_help.get(dataset, "a packed .npz file or a folder with the dataset (else "
                                            "$CONNLEARN_DATA, else download)"))
    a("--out", help=f"output folder; running again resumes there (default {defaults.out}"
                    f"{others(lambda name: CifarRun(dataset=name).out)})")
    a("--batch-size", type=int, help=f"default {recipe.batch_size}"
                                     f"{others(lambda name: get_recipe(PROTOCOLS[name].recipe).batch_size)}")
    a("--device", help="cpu, cuda, cuda:1, ... (default: cuda if available)")
    a("--amp", choices=AMP_MODES, help="mixed precision (default auto: bf16 on CUDA)")
    a("--compile", nargs="?", const="default", choices=COMPILE_MODES, metavar="MODE",
      help=f"torch.compile the network; MODE: {', '.join(COMPILE_MODES)} (default: default; on a GPU "
           "use reduce-overhead, CUDA graphs: of the modes measured, the one that shortens an epoch)")
    a("--activation-checkpointing", action="store_true", default=None,
      help="recompute each module's activations in the backward pass instead of keeping them: less memory, "
           "about one more forward pass per step, the same training")
    a("--engine", choices=ENGINES, help="default fused")
    imagenet = " (ImageNet: read from its folders by DataLoader workers)" if dataset is None else ""
    if dataset != "imagenet":  # ImageNet is always read by DataLoader workers, and never generated
        a("--loader", choices=LOADER_PATHS, help=f"auto: device-resident batches{imagenet}; dataloader: torch "
                                                  "DataLoader")
    workers = {"imagenet": "DataLoader workers that read the images (default: the CPUs, at most 8)",
               None: "DataLoader workers, for --loader dataloader (default 2) and ImageNet (default: the CPUs, at "
                     "most 8)"}
    a("--workers", type=int, help=workers.get(dataset, "DataLoader workers, for --loader dataloader (default 2)"))
    a("--gate-grad", choices=GRAD_MODES, help="gate update rule (default plain; see connlearn.updater)")
    a("--gate-init", type=_value, help="initial real gates, a value in [0,1] or 'uniform' (default 0.5)")
    a("--gate-lr", type=float, help="phase-1 gate learning rate (default 0.2)")
    a("--gate-momentum", type=float, metavar="MU",
      help="the gates' own SGD momentum (default: the weights', 0.9, as the paper's setup names one; 0: the "
           "plain clipped step of the paper's Algorithm 1)")
    a("--gate-temperature", type=float, metavar="T",
      help="sampling temperature of phase 1's draws (gate kinds that draw, such as topk): below 1 they "
           "follow the largest gates more closely (default 1, the paper's)")
    a("--gate-temperature-end", type=float, metavar="T",
      help="anneal the temperature geometrically over phase 1, from --gate-temperature to this value")
    a("--residual-init", choices=RESIDUAL_INITS,
      help="starting scale of each branch's last BN: sqrt_k (the mean of K branches starts at unit scale), "
           "auto (default: sqrt_k where the block supports it), one, zero")
    a("--conv-init", choices=CONV_INITS,
      help="starting scale of the convolutions before each branch's last one: branch (default: Kaiming with "
           "one branch's fan-out), resnext (1/sqrt(C) of that: ResNeXt's scale for the same layers)")
    a("--connectivity", metavar="FILE",
      help="train this checkpoint's (or graph JSON's) connectivity from scratch: architecture and fixed "
           "top-K inputs from FILE, new weights")
    a("--train-subset", type=int, help="train on a class-balanced subset of this many images")
    a("--test-subset", type=int, help="evaluate on a class-balanced subset of this many images")
    a("--val-split", type=int, help="hold out this many training images and evaluate on them, not on the test set")
    for name in ("C", "M", "width", "base-channels", "stem-channels"):
        a(f"--{name}", type=int, help="override the preset's value")
    a("--snapshot-every", type=int, help="steps between gate snapshots (default 100; 0: none)")
    a("--checkpoint-every", type=int, metavar="STEPS",
      help="also write last.pt within epochs, every this many steps (default 0: at each epoch's end only); "
           "for long epochs, and jobs that may be stopped at any time")
    a("--tensorboard", action="store_true", default=None, help="also write TensorBoard scalars")
    a("--no-progress", dest="progress", action="store_false", default=None, help="no progress bar")
    if dataset != "imagenet":
        a("--no-fallback", dest="synthetic_fallback", action="store_false", default=None,
          help="fail instead of using a generated dataset when no data is found")


def run_from_args(args: argparse.Namespace, dataset: str | None = None):
    """A :class:`CifarRun` from parsed flags, on top of ``--config``."""
    from connlearn.experiment import CifarRun, phases_total

    fields = {f.name for f in attrs.fields(CifarRun)}
    options: dict[str, Any] = {}
    if args.config:
        options.update(_read_config(expand_home(args.config), fields))
    options.update({k: v for k, v in vars(args).items() if k in fields and v is not None})
    if "epochs" not in options and "phases" in options:
        with contextlib.suppress(ConnlearnError):  # a bad split is left for CifarRun to name
            options["epochs"] = phases_total(options["phases"])
    if dataset is not None:
        options["dataset"] = dataset
    return CifarRun(**options)


def _read_config(path: Path, fields: set[str]) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"no config file at {path}")
    kind = "TOML" if path.suffix == ".toml" else "JSON"
    if kind == "TOML":
        try:
            import tomllib  # type: ignore[import-not-found, unused-ignore]  # Python 3.11 and later
        except ModuleNotFoundError:  # Python 3.10
            raise ConfigError(f"{path}: TOML configs need Python 3.11 or later; write it as JSON") from None
    try:
        text = path.read_text()
        data = tomllib.loads(text) if kind == "TOML" else json.loads(text)
    except (UnicodeDecodeError, ValueError) as exc:  # JSONDecodeError and TOMLDecodeError are ValueErrors
        raise ConfigError(f"{path} is not valid {kind}: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} holds a {type(data).__name__}; a config is one {kind} object of options, e.g. "
                          '{"epochs": 30, "gate": "topk"}')
    options = {k.replace("-", "_"): v for k, v in data.items()}
    unknown = sorted(set(options) - fields)
    if unknown:
        hints = {u: closest(u, fields) for u in unknown}
        detail = "; ".join(f"{u!r}" + (f" (did you mean {h[0]!r}?)" if h else "") for u, h in hints.items())
        raise ConfigError(f"{path} has unknown option(s): {detail}")
    return options


# ---------------------------------------------------------------------------------------------- commands
def cmd_train(args: argparse.Namespace) -> int:
    from connlearn.experiment import run_cifar

    run_cifar(run_from_args(args))
    return 0


def _load_net(path: str):
    from connlearn.checkpoint import load_checkpoint, net_from_checkpoint

    ckpt = load_checkpoint(path)
    return ckpt, net_from_checkpoint(ckpt)


def cmd_prune(args: argparse.Namespace) -> int:
    from connlearn.checkpoint import make_checkpoint, save_atomic
    from connlearn.prune import freezing_changes_outputs, prune_dead_blocks

    if expand_home(args.output).resolve() == expand_home(args.checkpoint).resolve():
        raise ConfigError(f"--output {args.output} is the checkpoint being pruned; write the pruned network to "
                          "another file (e.g. pruned.pt beside it), so that the run keeps what it resumes from")
    ckpt, net = _load_net(args.checkpoint)
    if freezing_changes_outputs(net):
        raise ConfigError(f"{args.checkpoint} holds {net.gate_kind!r} gates that are not frozen yet (phase 1), which "
                          "weight every input: pruning would change the outputs; prune a checkpoint from phase 2 on "
                          "(a finished run's last.pt)")
    pruned, report = prune_dead_blocks(net, freeze=True)
    meta = ckpt.get("meta") if isinstance(ckpt.get("meta"), dict) else {}
    overlap = {str(m): v for m, v in _recorded_overlap(meta, net.graph()).items()}  # pruned before: it stays
    results = {k: ckpt[k] for k in ("epoch", "best_top1") if k in ckpt}  # what the weights were trained to
    params_train = meta.get("params_train", report.params_before)  # pruned before: the first count stays
    save_atomic(make_checkpoint(pruned, meta={**meta, "prune": str(report), "params_train": params_train,
                                              "top1": _own_top1(ckpt), "input_overlap": overlap}, **results),
                args.output)
    print(f"{report}\nwrote {args.output}")
    return 0


def cmd_render(args: argparse.Namespace) -> int:
    import warnings

    from connlearn import render

    _, net = _load_net(args.checkpoint)
    graph = net.graph()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if args.side_by_side:
            files = render.save(render.side_by_side(graph, weighted=args.weighted, dead=args.dead), args.output)
        else:
            files = render.save(graph, args.output, weighted=args.weighted, dead=args.dead)
    # without Graphviz only the .dot file comes: a drawing asked for as .svg/.png/.pdf is missing, so the command
    # failed (with the warning that names the fix as its error)
    out = expand_home(args.output)
    done = out.suffix.lower() == ".dot" or out in files
    for w in caught:
        print(f"connlearn: {'warning' if done else 'error'}: {w.message}", file=sys.stderr)
    print("wrote " + ", ".join(str(f) for f in files))
    return 0 if done else 1


def cmd_plot(args: argparse.Namespace) -> int:
    from connlearn import plots
    from connlearn.train import read_jsonl

    source, out = expand_home(args.source), expand_home(args.output)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"-o: {out} is a file; the figures go into a folder")
    if source.suffix == ".jsonl":
        records = read_jsonl(source)
        if records and "gates" in records[0]:
            if args.K is None:
                raise ConfigError("plotting gate snapshots needs --K (the fan-in)")
            files = [plots.plot_gate_evolution(records, out / "gate_evolution.png", K=args.K)]
        else:
            eval_set = args.eval_set or _eval_set(_run_options(source.parent))
            keys = plots.logged(records, plots.CURVE_KEYS) or plots.CURVE_KEYS
            files = [plots.plot_training_curves(records, out / "curves.png", keys=keys, eval_set=eval_set)]
    else:
        ckpt, net = _load_net(str(source))
        log = source.parent / "log.jsonl"
        log_records = read_jsonl(log, "log file") if log.is_file() and log.stat().st_size else None
        eval_set = args.eval_set or _eval_set(_options_in(ckpt))
        files = plots.plot_run(net.graph(), out, net.K, log=log_records, snapshots=source.parent / "gates.jsonl",
                               eval_set=eval_set)
    print("wrote " + ", ".join(str(f) for f in files))
    return 0


def _eval_set(options: dict[str, Any]) -> str:
    """The name of the data a run was evaluated on, from its options; "eval" where there are none."""
    from connlearn.experiment import eval_set_of

    return eval_set_of(options) if options else "eval"


def _options_in(record: Any) -> dict[str, Any]:
    """The run options a checkpoint (``meta["run"]``) or ``summary.json`` (``"run"``) holds; empty if none."""
    holder = record.get("meta", record) if isinstance(record, dict) else None
    options = holder.get("run") if isinstance(holder, dict) else None
    return options if isinstance(options, dict) else {}


def _run_options(folder: Path) -> dict[str, Any]:
    """The options of the run whose files lie in ``folder``: from its ``summary.json`` (written when the
    run finished), else from its ``last.pt``; empty when neither is there or readable."""
    from connlearn.checkpoint import load_checkpoint

    try:
        options = _options_in(json.loads((folder / "summary.json").read_text()))
    except (OSError, ValueError):
        options = {}
    if not options:
        with contextlib.suppress(ConnlearnError):
            options = _options_in(load_checkpoint(folder / "last.pt"))
    return options


def cmd_info(args: argparse.Namespace) -> int:
    from connlearn.blocks import starts_of
    from connlearn.prune import active_branches, freezing_changes_outputs, prune_dead_blocks

    ckpt, net = _load_net(args.checkpoint)
    graph = net.graph()
    opts = graph.graph.get("options", {})
    meta = ckpt.get("meta") if isinstance(ckpt.get("meta"), dict) else {}
    params_test: int | str
    if freezing_changes_outputs(net):  # real gates in phase 1: nothing is pruned until their top-K is frozen
        report, params_test = None, "n/a (not frozen)"
    else:
        report = prune_dead_blocks(net, freeze=True)[1]
        params_test = report.params_after
    info = {
        "architecture": _architecture(graph.graph.get("topology"), opts),
        "engine": net.engine,
        "gate": net.gate_kind,
        "K": net.K,
        **starts_of(graph.graph),
        "classes": net.num_classes,
        # a pruned checkpoint records what it was pruned from
        "params_train": meta.get("params_train", net.num_parameters() if report is None else report.params_before),
        "params_test": params_test,
        "active_branches": " ".join(str(n) for n in active_branches(graph).values()),
        # a pruned checkpoint records it of the network it was pruned from, whose dead blocks count too
        "input_overlap": ", ".join(f"m{m}: {v:.2f}" for m, v in _recorded_overlap(meta, graph).items()),
        "epochs_done": ckpt.get("epoch"),
        "best_top1": ckpt.get("best_top1"),  # the run's best epoch, which need not be these weights
        "top1": _own_top1(ckpt),  # these weights' own: the epoch they were saved at
        # the checkpoint's own run options say which data best_top1 is on; without them nobody can
        "evaluated_on": _eval_set(options) if (options := _options_in(ckpt)) else "unknown",
    }
    if meta.get("source") == "generated":  # a run that found no data trained on a generated stand-in
        info["evaluated_on"] += " (of a generated dataset)"
    if args.json:
        print(json.dumps(info))
    else:
        for k, v in info.items():
            print(f"{k:15s} {v}")
    return 0


def _recorded_overlap(meta: dict[str, Any], graph: Any) -> dict[Any, float]:
    """The input overlap a pruned checkpoint recorded of the network it was pruned from, else ``graph``'s."""
    from connlearn.prune import input_overlap

    recorded = meta.get("input_overlap")
    if isinstance(recorded, dict) and all(isinstance(v, (int, float)) for v in recorded.values()):
        return recorded
    return input_overlap(graph)


def _own_top1(ckpt: dict[str, Any]) -> float | None:
    """The top-1 of a checkpoint's own weights: what a pruned one recorded, else its log's last epoch."""
    meta = found if isinstance(found := ckpt.get("meta"), dict) else {}
    if "top1" in meta:
        return meta["top1"]
    history = ckpt.get("history")
    last = history[-1] if isinstance(history, list) and history and isinstance(history[-1], dict) else {}
    return last.get("test_top1")


def _architecture(topology: str | None, opts: dict[str, Any]) -> str:
    """``resnext cifar-29-8-8 {D=29, w=8, C=8}``; a preset whose D, w or C were changed is named as the
    origin, not as the network."""
    from connlearn.topologies.resnext import PRESETS

    shape = {"depth": opts.get("depth"), "width": opts.get("width"), "C": opts.get("C")}
    dims = f"{{D={shape['depth']}, w={shape['width']}, C={shape['C']}}}"
    preset = opts.get("preset")
    if not preset:
        return f"{topology} {dims}"
    if preset in PRESETS and any(PRESETS[preset][k] != v for k, v in shape.items()):
        return f"{topology} {dims} (changed from {preset})"
    return f"{topology} {preset} {dims}"


def cmd_export(args: argparse.Namespace) -> int:
    from connlearn.export import FORMATS, export, onnx_files
    from connlearn.prune import freezing_changes_outputs, prune_dead_blocks

    _, net = _load_net(args.checkpoint)
    if not args.no_prune:
        if freezing_changes_outputs(net):
            raise ConfigError(f"this network's {net.gate_kind!r} gates are not frozen and evaluate with their real "
                              "values: pruning would change its outputs; export it with --no-prune")
        net, _ = prune_dead_blocks(net, freeze=True)
    output = args.output or str(Path(args.checkpoint).with_suffix(FORMATS[args.format]))
    written = export(net, output, args.format)
    files = onnx_files(written) if args.format == "onnx" else [written]
    together = " (keep them together: the model reads its weights from the second)" if len(files) > 1 else ""
    print(f"wrote {', '.join(str(f) for f in files)}{together}")
    return 0


def cmd_pack(args: argparse.Namespace) -> int:
    import numpy as np

    from connlearn.data import load_dataset, pack, read_image_folder

    source = expand_home(args.source)
    folder_only = [flag for flag, value in (("--size", args.size), ("--test-per-class", args.test_per_class))
                   if value is not None]
    if args.source in ("cifar10", "cifar100"):
        if folder_only:
            raise ConfigError(f"{' and '.join(folder_only)} {'applies' if len(folder_only) == 1 else 'apply'} to an "
                              f"image folder, not to {args.source}")
        train, test = load_dataset(args.source, args.data)
    elif not source.is_dir():
        raise DataError(f"{args.source!r} is neither cifar10/cifar100 nor a folder of images")
    elif (source / "train").is_dir() and (source / "test").is_dir():
        if args.test_per_class is not None:
            raise ConfigError(f"{source} is split into train/ and test/ already; drop --test-per-class")
        train, test = (read_image_folder(source / split, args.size) for split in ("train", "test"))
    elif args.test_per_class is None:
        raise DataError(f"{source} has no train/ and test/ folders: give --test-per-class N to hold out N images "
                        "of each class folder for testing")
    else:
        per_class = check_int("--test-per-class", args.test_per_class, minimum=1)
        images = read_image_folder(source, args.size)
        counts = np.bincount(images.labels, minlength=images.num_classes)
        if counts.min() <= per_class:  # every class keeps at least one training image
            short = int(counts.argmin())
            raise DataError(f"--test-per-class {per_class} leaves no training image of class "
                            f"{images.class_names[short]!r}, which has {counts[short]}; every class needs more "
                            "images than the test takes")
        train, test = images.split(per_class * images.num_classes)
    written = pack(args.output, train, test, format=args.format)
    shape = "x".join(map(str, train.image_size))
    print(f"wrote {written}: {len(train)} train and {len(test)} test images of {shape}, {train.num_classes} classes")
    return 0


# ---------------------------------------------------------------------------------------------- parser
def build_parser() -> argparse.ArgumentParser:
    """The ``connlearn`` command's parser, with its subcommands (``train``, ``prune``, ``render``, ``plot``,
    ``info``, ``export``, ``pack``)."""
    from connlearn.export import FORMATS, format_name

    parser = Parser(
        prog="connlearn", description="Learn the connectivity of multi-branch networks (GateConnect)."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("train", help="the paper's CIFAR / Mini-ImageNet / ImageNet protocol",
                       description="Train, prune and draw a run of the paper's CIFAR, Mini-ImageNet or ImageNet "
                                   "protocol. Ctrl-C, SIGTERM or SIGUSR1 stops it at the next step with a "
                                   "checkpoint; the same command resumes.")
    add_train_arguments(p)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("prune", help="remove dead blocks", description="Prune the dead blocks of a checkpoint.")
    p.add_argument("checkpoint")
    p.add_argument("-o", "--output", required=True, help="where to write the pruned checkpoint")
    p.set_defaults(func=cmd_prune)

    p = sub.add_parser("render", help="draw the connectivity", description="Draw a checkpoint's connectivity.")
    p.add_argument("checkpoint")
    p.add_argument("-o", "--output", required=True, help=".dot, .svg, .png or .pdf (the .dot is always written)")
    p.add_argument("--weighted", action=argparse.BooleanOptionalAction, default=None,
                   help="edge width follows the real gate value (default: where the network weights its inputs "
                        "so, real gates before freezing)")
    p.add_argument("--dead", choices=("hollow", "hide"), default="hollow", help="how to draw dead blocks")
    p.add_argument("--side-by-side", action="store_true", help="ResNeXt's full connectivity beside the learned one")
    p.set_defaults(func=cmd_render)

    p = sub.add_parser("plot", help="plots of a checkpoint or log",
                       description="Active branches and gate heatmaps of a checkpoint (plus its run's log and gate "
                                   "snapshots when beside it), or the curves of a log.jsonl / gates.jsonl. The "
                                   "accuracy axis names the data the run was evaluated on (validation or test), "
                                   "read from the run's options in the checkpoint, summary.json or last.pt.")
    p.add_argument("source", help="a checkpoint (.pt), log.jsonl or gates.jsonl")
    p.add_argument("-o", "--output", required=True, help="output folder")
    p.add_argument("--K", type=int, help="fan-in, for gates.jsonl")
    p.add_argument("--eval-set", choices=("test", "validation"),
                   help="the data the log's evaluations ran on, where the run's options cannot say "
                        "(default: read from them; 'eval' when they are not found)")
    p.set_defaults(func=cmd_plot)

    p = sub.add_parser("info", help="describe a checkpoint", description="Architecture, gates, parameters, accuracy.")
    p.add_argument("checkpoint")
    p.add_argument("--json", action="store_true", help="one JSON object")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("export", help="TorchScript / ONNX / torch.export",
                       description="Export a checkpoint's network (dead blocks pruned) for deployment.")
    p.add_argument("checkpoint")
    p.add_argument("--format", type=format_name, choices=list(FORMATS), default="torchscript",
                   help="the suffix of a format's files names it too (ts, pt2)")
    p.add_argument("-o", "--output", help="default: the checkpoint's name with .ts / .onnx / .pt2")
    p.add_argument("--no-prune", action="store_true", help="keep dead blocks")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("pack", help="write a packed .npz dataset",
                       description="Pack CIFAR (cifar10/cifar100, with --data) or an image folder into the offline "
                                   ".npz format. An image folder holds train/ and test/, each with one folder of "
                                   "images per class, or the class folders themselves and --test-per-class. "
                                   "Mini-ImageNet as the paper uses it (100 classes of 600 images, 500 to train "
                                   "and 100 to test, 84x84): connlearn pack FOLDER --size 84 --test-per-class 100 "
                                   "-o miniimagenet.npz")
    p.add_argument("source", help="cifar10, cifar100, or a folder of images")
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--format", choices=("png", "jpeg"), default="png", help="png is lossless")
    p.add_argument("--data", help="where the CIFAR files are (else $CONNLEARN_DATA, else download)")
    p.add_argument("--size", type=int, help="resize every image to SIZE x SIZE (default: keep; all must match)")
    p.add_argument("--test-per-class", type=int, metavar="N",
                   help="for a folder of class folders: hold out the last N images of each class (in file-name "
                        "order) as the test set")
    p.set_defaults(func=cmd_pack)
    return parser


_PACKAGE = str(Path(__file__).resolve().parent)


def _show_warning(outer, message: Warning | str, category: type[Warning], filename: str, lineno: int,
                  file: Any = None, line: str | None = None) -> None:
    """A warning of connlearn's own as one line, as the command's errors are; others go to ``outer``, the
    ``warnings.showwarning`` in force when the command started."""
    if str(Path(filename).resolve()).startswith(_PACKAGE):
        print(f"connlearn: warning: {message}", file=sys.stderr if file is None else file)
    else:
        outer(message, category, filename, lineno, file, line)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``connlearn`` console script; returns the exit code."""
    args = build_parser().parse_args(argv)
    return _guarded(args.func, args)


def train_script(dataset: str, description: str | None, argv: Sequence[str] | None = None) -> int:
    """Entry point of the scripts in ``examples/`` (``cifar10.py``, ``cifar100.py``, ``miniimagenet.py``,
    ``imagenet.py``): the ``train`` flags, dataset fixed."""
    from connlearn.experiment import run_cifar

    parser = Parser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_train_arguments(parser, dataset=dataset)
    args = parser.parse_args(argv)

    def train(a: argparse.Namespace) -> int:
        run_cifar(run_from_args(a, dataset=dataset))
        return 0

    return _guarded(train, args)


def _guarded(func, args: argparse.Namespace) -> int:
    try:
        with warnings.catch_warnings():
            warnings.showwarning = functools.partial(_show_warning, warnings.showwarning)
            code = func(args)
            sys.stdout.flush()  # here, where a reader that went away is caught below, not at the interpreter's exit
            return code
    except BrokenPipeError as exc:
        if not _reader_gone():  # another pipe (a worker's, a socket): an error like any other
            _tell(f"error: {_one_line(exc)}")
            return 1
        return 141  # the reader of the output went away (`connlearn info last.pt | head`): 128 + SIGPIPE, quietly
    except (ConnlearnError, OSError) as exc:
        _tell(f"error: {_one_line(exc)}")
        return 1
    except KeyboardInterrupt:
        _tell("interrupted; run the same command again to resume")
        return 130


def _reader_gone() -> bool:
    """Whether stdout is a pipe whose reader went away; then stdout is pointed at the null device, where the
    interpreter's last flush of it cannot fail again. Where that cannot be told (no ``poll``: Windows), a
    broken pipe is taken to be stdout's."""
    try:
        fd = sys.stdout.fileno()
    except (OSError, AttributeError, ValueError):  # no file behind stdout (a caller replaced it): not its pipe
        return False
    if hasattr(select, "poll"):
        watch = select.poll()
        watch.register(fd, select.POLLOUT)
        if not any(events & select.POLLERR for _, events in watch.poll(0)):
            return False
    with contextlib.suppress(OSError):
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, fd)
        finally:
            os.close(null)
    return True


def _tell(message: str) -> None:
    """``message`` on stderr in one write, so that the lines of several torchrun processes do not run
    together; each process but rank 0 says which it is."""
    rank = os.environ.get("RANK", "0") if os.environ.get("WORLD_SIZE", "1") not in ("", "1") else "0"
    sys.stderr.write(f"connlearn{f' (rank {rank})' if rank != '0' else ''}: {message}\n")
    sys.stderr.flush()


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    if isinstance(exc, OSError) and not isinstance(exc, ConnlearnError) and exc.filename:
        text = f"{exc.strerror or text}: {exc.filename}"
    return " ".join(text.split())


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["add_train_arguments", "build_parser", "main", "run_from_args", "train_script"]
