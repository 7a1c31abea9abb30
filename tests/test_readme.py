"""The README's code examples run as written, and the commands of the README and the benchmark reports parse."""

import argparse
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def test_the_readme_python_example_runs(tmp_path, monkeypatch, clean_registries):  # the example registers kinds
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "the README has no python example"
    monkeypatch.chdir(tmp_path)
    for code in blocks:
        exec(compile(code, str(README), "exec"), {})
    assert (tmp_path / "connectivity.dot").exists()


def _readme_commands():
    """The README's shell commands that run connlearn: (argv after the program, example dataset or None)."""
    for block in re.findall(r"```bash\n(.*?)```", README.read_text(), flags=re.S):
        for line in block.splitlines():
            words = shlex.split(line, comments=True)
            if words[:1] == ["torchrun"]:  # its own options, then the script
                words = ["python", *words[next(i for i, w in enumerate(words) if w.endswith(".py")):]]
            if words[:1] == ["connlearn"]:
                yield words[1:], None
            elif words[:1] == ["python"] and words[1].startswith("examples/"):
                yield words[2:], Path(words[1]).stem


def test_the_readme_commands_parse_into_valid_runs(tmp_path, monkeypatch):
    # every option the README shows exists, and every train command makes a run the library accepts
    from connlearn.cli import add_train_arguments, build_parser, run_from_args

    monkeypatch.chdir(tmp_path)
    (tmp_path / "run.json").write_text('{"dataset": "cifar10", "epochs": 30}')
    commands = list(_readme_commands())
    assert len(commands) >= 9, commands
    for argv, dataset in commands:
        if dataset is None:
            args = build_parser().parse_args(argv)
            if argv[0] == "train":
                run_from_args(args)
        else:
            parser = argparse.ArgumentParser()
            add_train_arguments(parser, dataset=dataset)
            run_from_args(parser.parse_args(argv), dataset=dataset)


class _ParsedSignal(Exception):  # noqa: N818 - a signal, not an error
    """Raised by the patched ``parse_args`` once a command's options have parsed."""


def _benchmark_commands():
    """The ``python benchmarks/X.py ...`` commands of BENCHMARKS.md and docs/results, as (document, script,
    argv), with their placeholders filled: ``SEED`` is 0, ``ARM`` topk4, ``NAME`` a name, ``FLAGS`` none,
    ``...`` after an option a value (else dropped), ``[--flag]`` the flag; shell redirections end the command."""
    for doc in [ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs" / "results").glob("*.md"))]:
        text = doc.read_text().replace("\\\n", " ")
        for match in re.finditer(r"python3? (benchmarks/\w+\.py)([^`\n]*)", text):
            argv: list[str] = []
            filled = re.sub(r"SEED(?!S)", "0", match.group(2))
            filled = re.sub(r"\bFLAGS\b", "", re.sub(r"\bARM\b", "topk4", re.sub(r"\bNAME\b", "name", filled)))
            for word in shlex.split(filled, comments=True):
                if word in (">", "|", "&&", ";", "2>&1"):
                    break
                if word == "...":
                    if argv and argv[-1].startswith("--"):
                        argv.append("1")
                    continue
                argv.append(word.strip("[]"))
            yield doc.name, match.group(1), argv


def test_the_documented_benchmark_commands_parse(tmp_path, monkeypatch):
    # a reader reruns a measurement with the command printed beside it: its options must still exist
    import importlib.util
    import inspect

    parse_args = argparse.ArgumentParser.parse_args

    def parse_only(self, args=None, namespace=None):
        parse_args(self, args, namespace)
        raise _ParsedSignal

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_only)
    monkeypatch.chdir(tmp_path)  # a script that wrote before parsing (none should) writes here
    from connlearn.blocks.bottleneck import Bottleneck, ResNeXtBottleneck

    for cls in (Bottleneck, ResNeXtBottleneck):  # branch_init.py patches them after parsing (it should not get there)
        monkeypatch.setattr(cls, "__init__", cls.__init__)
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))  # the scripts import each other
    commands = list(_benchmark_commands())
    assert len(commands) >= 40, commands
    for doc, script, argv in commands:
        spec = importlib.util.spec_from_file_location(f"_documented_{Path(script).stem}", ROOT / script)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        monkeypatch.setattr("sys.argv", [script, *argv])
        with pytest.raises(_ParsedSignal):
            try:
                module.main(argv) if inspect.signature(module.main).parameters else module.main()
            except SystemExit as exc:  # argparse's usage error, printed above
                raise AssertionError(f"{doc}: python {script} {shlex.join(argv)} does not parse") from exc
    assert not list(tmp_path.iterdir())  # each script parsed its options before writing anything
