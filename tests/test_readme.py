"""The README's example runs as written, its commands parse into runs the library accepts, its quick start is
the two commands of the run script that CI calls, and every command prints its help."""

import argparse
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_the_readme_example_runs(tmp_path, monkeypatch):
    blocks = re.findall(r"```python\n(.*?)```", README, flags=re.S)
    monkeypatch.chdir(tmp_path)
    for code in blocks:
        exec(compile(code, "README.md", "exec"), {})
    assert (tmp_path / "connectivity.svg").is_file() and (tmp_path / "connectivity.dot").is_file()


def test_the_readme_commands_parse_into_runs_the_library_accepts():
    from connlearn.cli import add_train_arguments, build_parser, config_from

    commands = 0
    for block in re.findall(r"```bash\n(.*?)```", README, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words[:1] == ["torchrun"]:
                words = ["python", *words[next(i for i, w in enumerate(words) if w.endswith(".py")):]]
            if words[:1] == ["connlearn"]:
                args = build_parser().parse_args(words[1:])
                config_from(args)
            elif words[:2] and words[0] == "python" and words[1].startswith("examples/"):
                parser = argparse.ArgumentParser()
                add_train_arguments(parser, skip=("dataset",))
                config_from(parser.parse_args(words[2:]), Path(words[1]).stem)
            else:
                continue
            commands += 1
    assert commands >= 5


def test_the_quick_start_is_two_commands_of_the_run_script_and_ci_runs_the_tests():
    quick = re.search(r"## Quick start\n\n```bash\n(.*?)```", README, flags=re.S).group(1).strip().splitlines()
    assert [line.split()[0:2] for line in quick] == [["./run", "demo"], ["./run", "test"]]
    ci = (ROOT / ".ci" / "run").read_text()
    assert "./run test" in ci and "./run docs" in ci
    assert len(README) <= 12_000 and len((ROOT / "BENCHMARKS.md").read_text()) <= 15_000


def test_every_command_prints_its_help(capsys):
    from connlearn.cli import build_parser

    parser = build_parser()
    with pytest.raises(SystemExit):
        parser.parse_args(["--help"])
    commands = re.findall(r"^    (\w+) ", capsys.readouterr().out, flags=re.M)  # the command list of the help
    assert {"train", "compare", "prune", "render", "pack"} <= set(commands)
    for name in commands:
        with pytest.raises(SystemExit) as exit:
            parser.parse_args([name, "--help"])
        assert exit.value.code == 0 and f"usage: connlearn {name}" in capsys.readouterr().out
