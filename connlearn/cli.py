"""The ``connlearn`` command: train, prune, render, plot, info, export, pack.

Exit codes: 0 success; 1 a ConnlearnError or a file error (one line on stderr); 2 bad usage; 128 + N when a
stop signal N ended training with a checkpoint (130 for Ctrl-C, 143 for SIGTERM); 141 when the reader of the
output went away (``connlearn info last.pt | head``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs

from connlearn.errors import ConfigError, ConnlearnError, DataError, check_int, closest, number_or_text
from connlearn.files import path_of

HELP = {
    "dataset": "cifar10, cifar100, miniimagenet, imagenet, or custom: a packed file of your own (--data), "
               "grey or RGB images of any size (default cifar100)",
    "preset": "architecture {D,w,C} (default: the dataset's, e.g. cifar-29-8-8)",
    "gate": "topk (GateConnect, default), real, random (Fixed-Random), full (ResNeXt), or a registered kind",
    "K": "inputs per block (default C/2; C for full)",
    "epochs": "total epochs: the paper's schedule scaled to it (default: the paper's, 320 for CIFAR)",
    "phases": "epochs of each of the four phases (phase 1 learns the gates)",
    "seed": "the weights, gates, data order and augmentation (default 0)",
    "data": "a packed .npz file or a folder holding one (default: $CONNLEARN_DATA, ./data, ../shared/data, "
            "~/.cache/connlearn; CIFAR downloads there); custom: the .npz file; imagenet: the folder of train/, val/",
    "out": "the run's folder; the same command again resumes there (default runs/DATASET)",
    "device": "cpu, cuda, cuda:1 (default: cuda where there is one)",
    "compile": "torch.compile the network, in MODE (on a GPU: reduce-overhead)",
    "gate_rule": "how the gates learn: plain (the paper's), centered, normalized, double-centered, renormalized",
    "gate_init": "initial real gates: a value in [0, 1] or 'uniform' (default 0.5)",
    "gate_optimizer": "sgd (the paper's: the gates in the weights' SGD at --gate-lr) or adam (the gates alone in "
                      "Adam at --gate-lr, e.g. 0.01)",
    "gate_holdout": "hold out this many training images (apart from --train-subset's) for the gates: each "
                    "weight step is followed by a gate step on a held-out batch (first-order bilevel)",
    "gate_warmup": "epochs at the start of phase 1 in which the gates do not learn (the draws go on; default 0). "
                   "The gate options a run leaves unset take its gate kind's settings (docs/estimators.md)",
    "gate_temperature": "sampling temperature of phase 1 (default 1, the paper's; below 1: closer to the top-K)",
    "gate_temperature_end": "anneal the temperature geometrically over phase 1 to this value",
    "residual_init": "each branch's output starts at sqrt(K): sqrt_k, or auto where the block can (the default); "
                     "one: as built; zero",
    "kernels": "unlike branches: branch j's middle kernel is the j-th of these sizes, cycled (e.g. 1 3 5)",
    "uninformative": "a planted control: these branches of module 1 output noise at their own scale (e.g. 5 6 7 8)",
    "conv_init": "the inner convolutions start at one branch's scale (branch, the default) or ResNeXt's (resnext)",
    "connectivity": "train this checkpoint's (or graph JSON's) connectivity from scratch, with new weights",
    "train_subset": "train on a class-balanced subset of this many images",
    "test_subset": "evaluate on a class-balanced subset of this many images",
    "val_split": "hold out this many training images and evaluate on them instead of the test set",
    "synthetic": "train on a small generated stand-in of the dataset (a smoke run, not a result)",
    "checkpoint_every": "also write last.pt every this many steps within epochs",
    "eval_every": "evaluate after every this many epochs, and after the last (default 1)",
    "recalibrate_bn": "before the last evaluation, recompute the batch-norm statistics of the final "
                      "connectivity over this many training batches (default 0: not)",
}


def add_train_arguments(parser: argparse.ArgumentParser, skip: Sequence[str] = ()) -> None:
    """A flag for every option of :class:`~connlearn.train.protocol.RunConfig` but those in ``skip``."""
    from connlearn.train.protocol import RunConfig

    parser.add_argument("--config", metavar="FILE", help="a JSON or TOML file of these options by their field "
                                                          "names; flags override it")
    for field in attrs.fields(RunConfig):
        if field.name in skip:
            continue
        text, choices = HELP.get(field.name, ""), field.metadata.get("choices", [])
        if not all(c in text for c in choices):  # the choices the help does not name yet
            default = f" (default {field.default})" if isinstance(field.default, str) else ""
            text = f"{text}{'; ' if text else ''}one of {', '.join(choices)}{default}"
        flag, options = "--" + field.name.replace("_", "-"), dict[str, Any](help=text or None, default=None)
        if field.name == "phases":
            options.update(type=int, nargs=4, metavar=("P1", "P2", "P3", "P4"))
        elif field.name in ("kernels", "uninformative"):
            options.update(type=int, nargs="+", metavar="K")
        elif field.name == "compile":
            options.update(nargs="?", const="default", metavar="MODE")
        elif isinstance(field.default, bool):
            options.update(action=argparse.BooleanOptionalAction)
        else:  # a value of the field's type: "--out 007" is the folder 007
            kinds = str(field.type)
            options.update(type=number_or_text if field.name == "gate_init" else int if kinds.startswith("int") else
                           float if kinds.startswith("float") else str)
        parser.add_argument(flag, **options)


def config_from(args: argparse.Namespace, dataset: str | None = None, only_given: bool = False) -> Any:
    """The RunConfig of parsed flags, on top of ``--config`` (``only_given``: just the options they set)."""
    from connlearn.train.protocol import RunConfig

    fields = [f.name for f in attrs.fields(RunConfig)]
    options: dict[str, Any] = _read_config(path_of(args.config), fields) if args.config else {}
    options.update({k: v for k, v in vars(args).items() if k in fields and v is not None})
    if dataset:
        options["dataset"] = dataset
    return options if only_given else RunConfig(**options)


def _read_config(path: Path, fields: list[str]) -> dict[str, Any]:
    import tomllib

    try:
        data = tomllib.loads(path.read_text()) if path.suffix == ".toml" else json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read the config {path}: {exc}") from None
    options = {str(k).replace("-", "_"): v for k, v in data.items()} if isinstance(data, dict) else None
    if options is None:
        raise ConfigError(f"{path} must hold one object of options, e.g. {{\"epochs\": 30}}")
    for key in options:
        if key not in fields:
            hint = closest(key, fields)
            raise ConfigError(f"{path}: unknown option {key!r}" + (f"; did you mean {hint!r}?" if hint else ""))
    return options


# ---------------------------------------------------------------------------------------------- commands
def cmd_train(args: argparse.Namespace) -> int:
    from connlearn.train.protocol import run

    run(config_from(args))
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from connlearn.train import compare

    if args.report:
        if args.arms or args.arm:
            raise ConfigError("--report reads finished runs: give it the folders, without --arms or --arm")
        found, unfinished = compare.collect(args.report)
        baseline = args.baseline or next(iter(found))
        out = args.out or next((d for d in args.report if not compare._run_name(path_of(d).name)), None)
    else:
        common: dict[str, Any] = {}
        arms: dict[str, dict[str, Any]] = {}
        baseline = args.baseline
        if args.arms:
            common, arms, baseline = compare.read_study(args.arms)
            baseline = args.baseline or baseline
        for text in args.arm or ():
            name, options = compare.parse_arm(text)
            arms[name] = options
        if not arms:
            raise ConfigError("no arms: give --arms FILE.toml or --arm 'NAME key=value ...' (at least two)")
        common.update({k: v for k, v in config_from(args, only_given=True).items() if k not in compare.PER_RUN})
        study = compare.Study(arms, common, tuple(args.seeds), path_of(args.out or "runs/compare"),
                              baseline or next(iter(arms)))
        if args.print_commands:
            compare.print_commands(study)
            return 0
        failed = compare.run_study(study, args.parallel, args.threads)
        found, unfinished = compare.collect([study.out])
        baseline, out = study.baseline, study.out
        unfinished += [name for name in failed if name not in unfinished]
    if not found:
        raise DataError(f"no run has finished ({len(unfinished)} unfinished): nothing to report")
    result = compare.report(found, baseline, args.margin)
    print(compare.markdown(result), end="")
    if unfinished:
        print(f"not finished (left out): {', '.join(sorted(set(unfinished)))}")
    if out is not None:
        print("wrote " + ", ".join(map(str, compare.write_report(result, out))))
    return 1 if unfinished and not args.report else 0


def cmd_prune(args: argparse.Namespace) -> int:
    from connlearn.prune import prune_dead_blocks
    from connlearn.train.checkpoint import load_checkpoint, make_checkpoint, net_from_checkpoint, save_checkpoint

    output = args.output or path_of(args.checkpoint).with_suffix(".pruned.pt")
    if path_of(output).resolve() == path_of(args.checkpoint).resolve():
        raise ConfigError(f"--output {output} is the checkpoint itself: write the pruned network to another file")
    ckpt = load_checkpoint(args.checkpoint)
    pruned, report = prune_dead_blocks(net_from_checkpoint(ckpt), freeze=True)
    meta = {**ckpt.get("meta", {}), "prune": str(report), "params_train": ckpt.get("meta", {}).get(
        "params_train", report.params_before), "top1": _top1(ckpt)}
    save_checkpoint(make_checkpoint(pruned, meta=meta, **{k: ckpt[k] for k in ("epoch", "best_top1") if k in ckpt}),
                    output)
    print(f"{report}\nwrote {output}")
    return 0


def cmd_render(args: argparse.Namespace) -> int:
    from connlearn import render
    from connlearn.train.checkpoint import net_from_checkpoint

    files = render.save(net_from_checkpoint(args.checkpoint).graph(), args.output, beside_resnext=args.side_by_side,
                        weighted=args.weighted, dead=args.dead)
    print("wrote " + ", ".join(map(str, files)))
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from connlearn import plots
    from connlearn.files import read_jsonl
    from connlearn.train.checkpoint import load_checkpoint, net_from_checkpoint

    source, out = path_of(args.source), path_of(args.output)
    if source.suffix == ".jsonl":
        records = read_jsonl(source)
        if "gates" in records[0]:
            if args.K is None:
                raise ConfigError("plotting gate snapshots needs --K (the fan-in)")
            files = [plots.plot_gate_evolution(records, out / "gate_evolution.png", K=args.K)]
        else:
            files = [plots.plot_training_curves(records, out / "curves.png", plots.logged(records, plots.CURVE_KEYS)
                                                or plots.CURVE_KEYS, eval_set=args.eval_set)]
    else:
        ckpt = load_checkpoint(source)
        net, log = net_from_checkpoint(ckpt), source.parent / "log.jsonl"
        eval_set = "validation" if ckpt.get("meta", {}).get("run", {}).get("val_split") else args.eval_set
        files = plots.plot_run(net.graph(), out, net.K, log=read_jsonl(log) if log.is_file() else None,
                               snapshots=source.parent / "gates.jsonl", eval_set=eval_set)
    print("wrote " + ", ".join(map(str, files)))
    return 0


def _top1(ckpt: dict[str, Any]) -> float | None:
    """The top-1 of a checkpoint's own weights: what a pruned one recorded, else its log's last epoch."""
    meta = ckpt.get("meta", {})
    return meta["top1"] if "top1" in meta else (ckpt.get("history") or [{}])[-1].get("test_top1")


def cmd_info(args: argparse.Namespace) -> int:
    from connlearn.graph import active_branches, input_overlap
    from connlearn.prune import freezing_changes_outputs, prune_dead_blocks
    from connlearn.train.checkpoint import load_checkpoint, net_from_checkpoint

    ckpt = load_checkpoint(args.checkpoint)
    net = net_from_checkpoint(ckpt)
    graph, meta = net.graph(), ckpt.get("meta", {})
    options = graph.graph.get("options", {})
    report = None if freezing_changes_outputs(net) else prune_dead_blocks(net, freeze=True)[1]
    info = {"architecture": f"{graph.graph.get('topology')} {options.get('preset') or ''} {{D={options.get('depth')}, "
                            f"w={options.get('width')}, C={options.get('C')}}}".replace("  ", " "),
            "input": "x".join(map(str, (net.in_channels, *net.input_size))), "engine": net.engine,
            "gate": graph.gate_label(), "K": net.K,
            "residual_init": graph.graph.get("residual_init", "one"),
            "conv_init": graph.graph.get("conv_init", "branch"),
            "classes": net.num_classes, "params_train": meta.get("params_train", net.num_parameters()),
            "params_test": report.params_after if report else "n/a (not frozen)",
            "active_branches": " ".join(map(str, active_branches(graph).values())),
            "input_overlap": ", ".join(f"m{m}: {v:.2f}" for m, v in input_overlap(graph).items()),
            "epochs_done": ckpt.get("epoch"), "best_top1": ckpt.get("best_top1"), "top1": _top1(ckpt),
            "evaluated_on": ("validation" if meta.get("run", {}).get("val_split") else "test") if "run" in meta
            else "unknown"}
    print(json.dumps(info) if args.json else "\n".join(f"{k:15s} {v}" for k, v in info.items()))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from connlearn.export import FORMATS, export
    from connlearn.prune import prune_dead_blocks
    from connlearn.train.checkpoint import net_from_checkpoint

    net = net_from_checkpoint(args.checkpoint)
    net = net if args.no_prune else prune_dead_blocks(net, freeze=True)[0]
    files = export(net, args.output or path_of(args.checkpoint).with_suffix(FORMATS[args.format]), args.format)
    print("wrote " + ", ".join(map(str, files)) + (" (keep them together)" if len(files) > 1 else ""))
    return 0


def cmd_pack(args: argparse.Namespace) -> int:
    from connlearn.train.data import (
        ArrayDataset,
        load_dataset,
        load_packed,
        pack,
        pack_arrays,
        read_image_folder,
    )
    from connlearn.train.ucr import load_ucr

    train: Any
    test: Any
    source, channels = path_of(args.source), 3 if args.rgb else None
    size = None if args.size is None else check_int("--size", args.size, 1)
    per_class = None if args.test_per_class is None else check_int("--test-per-class", args.test_per_class, 1)
    if args.source in ("cifar10", "cifar100"):
        train, test = load_dataset(args.source, args.data)
    elif args.source.startswith("ucr:"):
        train, test = load_ucr(args.source.removeprefix("ucr:"))
    elif not source.exists():
        raise DataError(f"{args.source}: no such folder (nor cifar10 or cifar100)")
    elif source.is_file():  # an .npz of arrays (or a packed file): checked, then written in the packed form
        train, test = load_packed(source)
    elif (source / "train").is_dir() and (source / "test").is_dir():
        train = read_image_folder(source / "train", size, channels=channels)
        test = read_image_folder(source / "test", size, classes=train.class_names, channels=train.channels)
    elif source.is_dir() and per_class is not None:
        images = read_image_folder(source, size, channels=channels)
        train, test = images.split(per_class * images.num_classes)
    else:
        raise DataError(f"{args.source!r} is neither cifar10/cifar100, a folder of train/ and test/, nor a folder of "
                        "class folders with --test-per-class N")
    arrays = isinstance(train, ArrayDataset)
    written = pack_arrays(args.output, train, test) if arrays else pack(args.output, train, test, format=args.format)
    what, shape = ("arrays", train.x.shape[1:]) if arrays else ("images", train.images.shape[1:])
    print(f"wrote {written}: {len(train)} train and {len(test)} test {what} of {'x'.join(map(str, shape))}, "
          f"{train.num_classes} classes")
    for split, data in (("train", train), ("test", test)):
        missing = [n for c, n in enumerate(train.class_names) if c not in set(data.labels.tolist())]
        if missing:
            print(f"note: {split} has no {what} of {', '.join(missing)}")
    return 0


# ---------------------------------------------------------------------------------------------- parser
def add_compare_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of ``compare``: the arms, the seeds, how to run them, and the train options common to every arm."""
    p.add_argument("--arms", metavar="FILE", help="a TOML file: common train options, baseline = NAME, and a "
                                                  "table [arms.NAME] of train options per arm")
    p.add_argument("--arm", action="append", metavar="'NAME key=value ...'",
                   help="an arm on the command line (repeatable), e.g. 'gumbel gate=gumbel K=4'; 'again "
                        "retrain=gumbel' trains the connectivity each seed of arm gumbel learned from scratch")
    p.add_argument("--baseline", help="the arm the others are compared with (default: the file's, else the first)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4], help="paired seeds (default 0 1 2 3 4)")
    p.add_argument("--parallel", type=int, default=1, help="runs at a time, as local processes (default 1)")
    p.add_argument("--threads", type=int, default=1, help="CPU threads per run (default 1)")
    p.add_argument("--print-commands", action="store_true",
                   help="print one connlearn train command per run (for SLURM, submitit, ...) and run nothing")
    p.add_argument("--report", nargs="+", metavar="DIR", help="only report the finished runs in these folders "
                                                              "(made anywhere)")
    p.add_argument("--margin", type=float, default=1.0, help="the equivalence margin of TOST, in points of "
                                                             "top-1 (default 1)")
    p.add_argument("--out", help="the study's folder: run ARM of seed S in OUT/ARM-sS, the report beside them "
                                 "(default runs/compare)")
    add_train_arguments(p, skip=("seed", "out"))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="connlearn", description="Learn the connectivity of multi-branch networks.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, func: Callable[[argparse.Namespace], int], help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help)
        p.set_defaults(func=func)
        return p

    add_train_arguments(command("train", cmd_train, "train, prune and draw a run of a dataset's protocol; the same "
                                                    "command resumes it; Ctrl-C or SIGTERM stops it with a checkpoint"))
    p = command("compare", cmd_compare, "train named arms x paired seeds (each run a connlearn train folder, "
                                        "resumable) and report each arm against a baseline: paired differences, "
                                        "95%% intervals, Holm, TOST, the detectable difference")
    add_compare_arguments(p)
    p = command("prune", cmd_prune, "remove the dead blocks of a checkpoint")
    p.add_argument("checkpoint")
    p.add_argument("-o", "--output", help="default: the checkpoint's name with .pruned.pt")
    p = command("render", cmd_render, "draw a checkpoint's connectivity (.dot, .svg, .png or .pdf)")
    p.add_argument("checkpoint")
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--weighted", action=argparse.BooleanOptionalAction, help="edge width follows the gate value")
    p.add_argument("--dead", choices=("hollow", "hide"), default="hollow", help="how dead blocks are drawn")
    p.add_argument("--side-by-side", action="store_true", help="ResNeXt's connectivity beside the learned one")
    p = command("plot", cmd_plot, "plots of a checkpoint (with its run's log and gate snapshots) or of a .jsonl")
    p.add_argument("source")
    p.add_argument("-o", "--output", required=True, help="a folder")
    p.add_argument("--K", type=int, help="the fan-in, for gates.jsonl")
    p.add_argument("--eval-set", default="test", help="the name of the evaluation data on the axes")
    p = command("info", cmd_info, "describe a checkpoint: architecture, gates, parameters, accuracy")
    p.add_argument("checkpoint")
    p.add_argument("--json", action="store_true")
    p = command("export", cmd_export, "export a checkpoint's network (dead blocks pruned) for deployment")
    p.add_argument("checkpoint")
    p.add_argument("--format", choices=("torchscript", "onnx", "export"), default="torchscript")
    p.add_argument("-o", "--output", help="default: the checkpoint's name with .ts, .onnx or .pt2")
    p.add_argument("--no-prune", action="store_true")
    p = command("pack", cmd_pack, "pack cifar10/cifar100, an image folder (train/ and test/, or class folders "
                                  "and --test-per-class), a UCR/UEA time-series set (ucr:GunPoint, shipped with "
                                  "the aeon package) or an .npz of arrays (train_x uint8 [N, H, W, C] images, "
                                  "[N, C, L] or [N, F]; train_y, test_x, test_y) into one checked .npz")
    p.add_argument("source")
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--format", choices=("png", "jpeg"), default="png", help="png is lossless")
    p.add_argument("--data", help="where cifar10/cifar100 are (else they are looked for, or downloaded)")
    p.add_argument("--size", type=int, help="resize every image to SIZE x SIZE")
    p.add_argument("--rgb", action="store_true", help="store grey images as RGB (by default a folder of grey "
                                                      "images packs as 1 channel)")
    p.add_argument("--test-per-class", type=int, metavar="N", help="hold out the last N images of each class")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The ``connlearn`` console script; returns the exit code."""
    args = build_parser().parse_args(argv)
    return guarded(args.func, args)


def train_script(dataset: str, description: str | None, argv: Sequence[str] | None = None) -> int:
    """The scripts of ``examples/``: the ``train`` flags, the dataset fixed."""
    from connlearn.train.protocol import run

    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_train_arguments(parser, skip=("dataset",))
    def train(args: argparse.Namespace) -> int:
        run(config_from(args, dataset))
        return 0

    return guarded(train, parser.parse_args(argv))


def guarded(func: Callable[[argparse.Namespace], int | None], args: argparse.Namespace) -> int:
    """Run a command: its errors and warnings as one line each on stderr."""
    warnings.formatwarning = lambda message, *_, **__: f"connlearn: warning: {' '.join(str(message).split())}\n"
    try:
        code = func(args) or 0
        sys.stdout.flush()
        return code
    except BrokenPipeError:  # the reader of the output went away: quietly, as a shell tool does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except (ConnlearnError, OSError) as exc:
        rank = os.environ.get("RANK", "0")
        sys.stderr.write(f"connlearn{'' if rank == '0' else f' (rank {rank})'}: error: {' '.join(str(exc).split())}\n")
        return 1
    except KeyboardInterrupt:
        sys.stderr.write("connlearn: interrupted; run the same command again to resume\n")
        return 130


if __name__ == "__main__":
    sys.exit(main())
