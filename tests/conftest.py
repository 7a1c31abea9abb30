import os
import shutil

import pytest
import torch
from hypothesis import HealthCheck, reject, settings

import connlearn

settings.register_profile("default", deadline=None, max_examples=20, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed")


def built(topology="resnext", **options):
    """The network, or no example where its budget (a density) joins no path from the stem to the head: such a
    budget is refused."""
    try:
        return connlearn.build(topology, **options)
    except connlearn.GraphError:
        if options.get("density") is None:
            raise
        reject()


def tiny(**overrides):
    """The options of a small, fast CIFAR-layout network."""
    return {"M": 3, "C": 4, "K": 2, "width": 2, "num_classes": 10, "stem_channels": 4, "base_channels": 8,
            "seed": 0, **overrides}


#: The inputs the laws run over, by dimensionality: build options (beside tiny's) and one example's shape.
SHAPES = {2: ({}, (3, 32, 32)), 1: ({"in_channels": 2, "input_size": (12,)}, (2, 12)),
          0: ({"in_channels": 6, "input_size": ()}, (6,))}


def shaped(dims, **overrides):
    """tiny()'s options for inputs of ``dims`` (2: images, 1: signals, 0: vectors, whose block is ``vector``)."""
    block = {"block": "vector"} if dims == 0 and overrides.get("block", "bottleneck") == "bottleneck" else {}
    return tiny(**{**SHAPES[dims][0], **overrides, **block})


def batch(net_or_dims, n=2, seed=7, dtype=torch.float32):
    """A random batch for a network (or a dimensionality's tiny networks)."""
    shape = (SHAPES[net_or_dims][1] if isinstance(net_or_dims, int)
             else (net_or_dims.in_channels, *net_or_dims.input_size))
    return torch.randn(n, *shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


@pytest.fixture
def images():
    return torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(1))


@pytest.fixture
def clean_registries(monkeypatch):
    """Let a test register kinds: the registries are as found after it."""
    from connlearn.blocks import BLOCKS
    from connlearn.gates import GATES
    from connlearn.topologies import TOPOLOGIES

    for registry in (BLOCKS, GATES, TOPOLOGIES):
        monkeypatch.setattr(registry, "_items", dict(registry._items))


class RandomLoader:
    """A deterministic loader of random images: the trainer's loader protocol and nothing more (no ``start``)."""

    def __init__(self, n=64, batch=16, seed=0, classes=10, size=32):
        g = torch.Generator().manual_seed(seed)
        self.x, self.y = torch.randn(n, 3, size, size, generator=g), torch.randint(0, classes, (n,), generator=g)
        self.batch, self.seed = batch, seed

    def __len__(self):
        return len(self.x) // self.batch

    def epoch(self, epoch):
        order = torch.randperm(len(self.x))  # from the global RNG: a resume within an epoch must restore it
        for i in range(len(self)):
            idx = order[i * self.batch:(i + 1) * self.batch]
            yield self.x[idx], self.y[idx]
