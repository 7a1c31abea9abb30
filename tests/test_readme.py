"""The README's code examples run as written, and its commands parse."""

import argparse
import re
import shlex
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


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
