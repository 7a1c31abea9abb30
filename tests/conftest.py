import errno
import os
import shutil
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, settings
from torch import nn

import connlearn.files
from connlearn.blocks import BranchBlock

settings.register_profile(
    "default", deadline=None, max_examples=25, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
if "OMP_NUM_THREADS" not in os.environ:  # a machine shared with other jobs sets it, and torch reads it
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))

# the benchmarks' plain ResNeXt is the independent oracle of tests/test_resnext.py
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))

# tests that render .svg/.png/.pdf need Graphviz's program (CI installs it; without it only .dot is written)
needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's 'dot' program is not installed")

SHARED_DATA = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "cifar10_jpeg.npz")


@pytest.fixture
def clean_registries(monkeypatch):
    """Let a test register blocks, gate kinds and topologies: the registries are as found after it."""
    from connlearn.blocks import BLOCKS
    from connlearn.gates import GATES
    from connlearn.topologies import TOPOLOGIES

    for registry in (BLOCKS, GATES, TOPOLOGIES):
        monkeypatch.setattr(registry, "_items", dict(registry._items))


def tiny(**overrides):
    """Options of a small, fast CIFAR-layout net for tests."""
    opts = dict(M=3, C=4, K=2, width=2, num_classes=10, stem_channels=4, base_channels=8, seed=0)
    opts.update(overrides)
    return opts


@pytest.fixture
def images():
    return torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(1))


class RandomLoader:
    """A deterministic in-memory loader of random images: the trainer's loader protocol, nothing more."""

    def __init__(self, n=64, batch=16, seed=0, classes=10):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 3, 32, 32, generator=g)
        self.y = torch.randint(0, classes, (n,), generator=g)
        self.batch, self.seed = batch, seed

    def __len__(self):
        return len(self.x) // self.batch

    def epoch(self, epoch):
        order = torch.randperm(len(self.x), generator=torch.Generator().manual_seed(self.seed * 1000 + epoch))
        for i in range(len(self)):
            idx = order[i * self.batch : (i + 1) * self.batch]
            yield self.x[idx], self.y[idx]


class PlainBlock(BranchBlock):
    """A plug-in block kind with one grouped 3x3 convolution and nothing else: no norm to rescale, no inner
    convolution to start at another scale."""

    params = ("width",)

    def __init__(self, in_ch, out_ch, stride, branches, *, width):
        super().__init__(in_ch, out_ch, stride, branches, width=width)
        self.conv = nn.Conv2d(branches * in_ch, branches * out_ch, 3, stride, 1, groups=branches, bias=False)

    def forward(self, x):
        return self.conv(x)


class FullAfter:
    """A file whose writes fail with ENOSPC once ``room`` bytes are written, as a full disk's do: the error
    comes from ``write`` (or the flush at ``close``) and names no file."""

    def __init__(self, f, room):
        self._f, self._room = f, room

    def write(self, data):
        if len(data) > self._room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self._room -= len(data)
        return self._f.write(data)

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return self._f.__exit__(*exc)


def disk_full_after(monkeypatch, room, nth=1, named=""):
    """Make the ``nth`` file whose name holds ``named`` that connlearn's atomic writes (checkpoints, logs,
    summaries) open run out of space after ``room`` bytes."""
    opened = []

    def fake_open(path, mode="r", *args, **kwargs):
        f = open(path, mode, *args, **kwargs)  # noqa: SIM115 (closed by whoever uses it)
        if named in Path(path).name:
            opened.append(path)
        return FullAfter(f, room) if named in Path(path).name and len(opened) == nth else f

    monkeypatch.setattr(connlearn.files, "open", fake_open, raising=False)
