"""The ``connlearn`` command: train, prune, render, plot, info, export, pack.

Exit codes: 0 success; 1 a ConnlearnError or a file error (one line on stderr); 2 bad usage; 128 + N when a
stop signal N ended training with a checkpoint (130 for Ctrl-C, 143 for SIGTERM); 141 when the reader of the
output went away (``connlearn info last.pt | head``).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from connlearn.errors import ConfigError, ConnlearnError, DataError, check_int
from connlearn.files import check_target, path_of


def add_train_arguments(parser: argparse.ArgumentParser, skip: Sequence[str] = ()) -> None:
    """A flag for every run option (:data:`~connlearn.train.options.OPTIONS`) but those in ``skip``."""
    from connlearn.train.options import OPTIONS

    parser.add_argument("--config", metavar="FILE", help="a JSON or TOML file of these options by their names "
                                                          "(a relative data path from its folder); flags override it")
    for option in OPTIONS.values():
        if option.name in skip:
            continue
        named = all(str(c) in option.help for c in option.choices)  # a help that names its choices lists them no more
        choices = "" if named else f"; one of {', '.join(map(str, option.choices))}"
        default = "" if option.default is None or option.default is False else f" (default {option.default})"
        parser.add_argument("--" + option.name.replace("_", "-"), default=None, help=option.help + choices + default,
                            **option.flag)


def config_from(args: argparse.Namespace, only_given: bool = False) -> Any:
    """The RunConfig of parsed flags, on top of ``--config`` (``only_given``: just the options they set)."""
    from connlearn.train.options import OPTIONS, RunConfig, check_names, read_options, relative_to

    path = path_of(args.config or ".")
    options = relative_to(path.parent, check_names(f"{path}: ", read_options(path, "config"))) if args.config else {}
    options.update({k: v for k, v in vars(args).items() if k in OPTIONS and v is not None})
    return options if only_given else RunConfig(**options)


# ---------------------------------------------------------------------------------------------- commands
def cmd_train(args: argparse.Namespace) -> int:
    from connlearn.train.protocol import run

    run(config_from(args))
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from connlearn.train import compare
    from connlearn.train.options import number

    margin = number(0.0, above=True)("--margin", args.margin)
    if args.report:
        if args.arm:
            raise ConfigError("--report reads finished runs: give it the folders (and --arms FILE to report that "
                              "file's arms only), without --arm")
        found, unfinished = compare.collect(args.report)
        _, arms, named = compare.read_study(args.arms) if args.arms else ({}, found, None)
        baseline, out = args.baseline or named or compare.recorded_baseline(args.report), args.out
        if baseline is None:
            raise ConfigError(f"--report: give --baseline NAME (no {compare.STUDY_FILE} in these folders names the "
                              f"study's); arms: {', '.join(found)}")
    else:
        study = _study(args)
        if args.print_commands:
            study.record()
            print("\n".join(shlex.join(study.command(arm, seed)) for arm, seed in study.runs()))
            return 0
        failed = compare.run_study(study, check_int("--parallel", args.parallel, 1),
                                   check_int("--threads", args.threads, 1), args.rerun_changed)
        found, unfinished = compare.collect([study.out])
        arms, baseline, out = study.arms, study.baseline, study.out
        unfinished += [name for name in failed if name not in unfinished]
    question = {*arms, baseline}  # one question's arms (Holm within the question), not every arm of the folders
    found = {arm: runs for arm, runs in found.items() if arm in question}
    unfinished = [name for name in unfinished if name.rsplit("-s", 1)[0] in question]
    if not found:
        raise DataError(f"no run has finished ({len(unfinished)} unfinished): nothing to report")
    result = compare.report(found, baseline, margin)
    print(compare.markdown(result), end="")
    if unfinished:
        print(f"not finished (left out): {', '.join(sorted(set(unfinished)))}")
    if out is not None:
        print("wrote " + ", ".join(map(str, compare.write_report(result, out))))
    return 1 if unfinished and not args.report else 0


def _study(args: argparse.Namespace) -> Any:
    """The study of ``compare``'s flags: the arms of ``--arms`` and ``--arm``, on the train flags given."""
    from connlearn.train import compare
    from connlearn.train.options import PER_RUN, names

    common: dict[str, Any] = {}
    arms: dict[str, dict[str, Any]] = {}
    baseline = args.baseline
    if args.arms:
        common, arms, baseline = compare.read_study(args.arms)
        baseline = args.baseline or baseline
    for text in args.arm or ():
        name, options = compare.parse_arm(text)
        if name in arms:
            raise ConfigError(f"arm {name!r} is given twice: name each arm once")
        arms[name] = options
    if not arms:
        raise ConfigError("no arms: give --arms FILE.toml or --arm 'NAME key=value ...' (at least two)")
    common.update({k: v for k, v in config_from(args, only_given=True).items() if k not in names(PER_RUN)})
    out = path_of(args.out or "runs/compare")  # a study added to keeps the baseline it was run with
    study = compare.Study(arms, common, tuple(args.seeds), out,
                          baseline or compare.recorded_baseline([out]) or next(iter(arms)))
    study.check_comparable()
    return study


def cmd_prune(args: argparse.Namespace) -> int:
    from connlearn.train.checkpoint import load_checkpoint, save_pruned

    output = check_target(args.output or path_of(args.checkpoint).with_suffix(".pruned.pt"), args.checkpoint)
    print(f"{save_pruned(load_checkpoint(args.checkpoint), output)}\nwrote {output}")
    return 0


def cmd_render(args: argparse.Namespace) -> int:
    from connlearn import render
    from connlearn.train.checkpoint import net_from_checkpoint

    for target in (path_of(args.output), path_of(args.output).with_suffix(".dot")):
        check_target(target, args.checkpoint)
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
        if not records:
            raise DataError(f"{source} holds no records: nothing to plot")
        if "gates" in records[0]:
            if args.K is None:
                raise ConfigError("plotting gate snapshots needs --K (the fan-in)")
            files = [plots.plot_gate_evolution(source, out / "gate_evolution.png", K=args.K)]
        else:
            files = [plots.plot_training_curves(source, out / "curves.png", plots.logged(records, plots.CURVE_KEYS)
                                                or plots.CURVE_KEYS, eval_set=args.eval_set)]
    else:
        ckpt = load_checkpoint(source)
        net, log = net_from_checkpoint(ckpt), source.parent / "log.jsonl"
        eval_set = "validation" if ckpt.get("meta", {}).get("run", {}).get("val_split") else args.eval_set
        files = plots.plot_run(net.graph(), out, net.K, log=read_jsonl(log) if log.is_file() else None,
                               snapshots=source.parent / "gates.jsonl", eval_set=eval_set)
    print("wrote " + ", ".join(map(str, files)))
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    from connlearn.graph import active_branches, input_overlap
    from connlearn.prune import freezing_changes_outputs, prune_dead_blocks
    from connlearn.topologies import PRESETS
    from connlearn.train.checkpoint import load_checkpoint, net_from_checkpoint, top1
    from connlearn.train.protocol import shape_words

    ckpt = load_checkpoint(args.checkpoint)
    net = net_from_checkpoint(ckpt)
    graph, meta = net.graph(), ckpt.get("meta", {})
    options = graph.graph.get("options", {})
    preset = PRESETS.get(options.get("preset"), {})  # named only where the network is the preset's
    named = options["preset"] if preset and all(preset[k] == options.get(k) for k in ("depth", "width", "C")) else ""
    report = None if freezing_changes_outputs(net) else prune_dead_blocks(net, freeze=True)[1]
    info = {"architecture": f"{graph.graph.get('topology')} {named} {shape_words(graph)}".replace("  ", " "),
            "input": "x".join(map(str, (net.in_channels, *net.input_size))),
            "gate": graph.gate_label(),
            **({"density": graph.graph["density"]} if "density" in graph.graph else {"K": net.K}),
            "residual_init": graph.graph.get("residual_init", "one"),
            "conv_init": graph.graph.get("conv_init", "each block's own"),
            "classes": net.num_classes, "params_train": meta.get("params_train", net.num_parameters()),
            "params_test": report.params_after if report else "n/a (not frozen)",
            "active_branches": " ".join(map(str, active_branches(graph).values())),
            "input_overlap": ", ".join(f"m{m}: {v:.2f}" for m, v in input_overlap(graph).items()),
            "epochs_done": ckpt.get("epoch"), "best_top1": ckpt.get("best_top1"), "top1": top1(ckpt),
            "evaluated_on": ("validation" if meta.get("run", {}).get("val_split") else "test") if "run" in meta
            else "unknown"}
    print(json.dumps(info) if args.json else "\n".join(f"{k:15s} {v}" for k, v in info.items()))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from connlearn.export import FORMATS, export
    from connlearn.prune import prune_dead_blocks
    from connlearn.train.checkpoint import net_from_checkpoint

    output = path_of(args.output or path_of(args.checkpoint).with_suffix(FORMATS[args.format]))
    for target in (output, output.with_name(output.name + ".data")) if args.format == "onnx" else (output,):
        check_target(target, args.checkpoint)
    net = net_from_checkpoint(args.checkpoint)
    net = net if args.no_prune else prune_dead_blocks(net, freeze=True)[0]
    files = export(net, output, args.format)
    print("wrote " + ", ".join(map(str, files)) + (" (keep them together)" if len(files) > 1 else ""))
    return 0


def cmd_pack(args: argparse.Namespace) -> int:
    from connlearn.train.data import (
        ArrayDataset,
        load_dataset,
        load_packed,
        load_ucr,
        pack,
        pack_arrays,
        read_image_folder,
    )

    train: Any
    test: Any
    source, channels = path_of(args.source), 3 if args.rgb else None
    check_target(args.output, args.source, *([args.data] if args.data else []))
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
    p.add_argument("--baseline", help="the arm the others are compared with (default: the file's, else the first; "
                                      "with --report, the one the study recorded)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4], help="paired seeds (default 0 1 2 3 4)")
    p.add_argument("--parallel", type=int, default=1, help="runs at a time, as local processes (default 1)")
    p.add_argument("--threads", type=int, default=1, help="CPU threads per run (default 1)")
    p.add_argument("--print-commands", action="store_true",
                   help="print one connlearn train command per run (for SLURM, submitit, ...) and run nothing")
    p.add_argument("--report", nargs="+", metavar="DIR", help="only report the finished runs in these folders "
                                                              "(made anywhere; with --arms, that file's arms only); "
                                                              "it writes nothing without --out")
    p.add_argument("--margin", type=float, default=1.0, help="the equivalence margin of TOST, in points of "
                                                             "top-1 (default 1)")
    p.add_argument("--rerun-changed", action="store_true", help="train again the finished runs whose recorded "
                   "settings differ from this command's (by default they are refused); their folders are kept as "
                   "NAME.replaced-N")
    p.add_argument("--out", help="the study's folder: run ARM of seed S in OUT/ARM-sS, the report beside them "
                                 "(default runs/compare); with --report, where the report goes")
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
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_train_arguments(parser, skip=("dataset",))
    parser.set_defaults(dataset=dataset)
    return guarded(cmd_train, parser.parse_args(argv))


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
