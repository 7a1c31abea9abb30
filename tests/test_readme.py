"""The README's code example runs as written."""

import re
from pathlib import Path

from connlearn.blocks import BLOCKS
from connlearn.gates import GATES
from connlearn.topologies import TOPOLOGIES

README = Path(__file__).resolve().parent.parent / "README.md"


def test_the_readme_python_example_runs(tmp_path, monkeypatch):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "the README has no python example"
    monkeypatch.chdir(tmp_path)
    for registry in (BLOCKS, GATES, TOPOLOGIES):  # the example registers kinds: leave the others' registries as found
        monkeypatch.setattr(registry, "_items", dict(registry._items))
    for code in blocks:
        exec(compile(code, str(README), "exec"), {})
    assert (tmp_path / "connectivity.dot").exists()
