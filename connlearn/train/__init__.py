"""The training layer: recipes, the trainer, data and loaders, checkpoints, and the paper's protocols.

    >>> from connlearn.train import RunConfig, run
    >>> run(RunConfig(dataset="cifar10", epochs=30))
"""

from connlearn.train.checkpoint import load_checkpoint, make_checkpoint, net_from_checkpoint, save_checkpoint
from connlearn.train.data import ImageDataset, as_image_dataset, load_dataset, load_packed, pack, synthetic
from connlearn.train.loaders import BatchLoader, DataLoaderPath, make_loaders
from connlearn.train.metrics import evaluate
from connlearn.train.protocol import PROTOCOLS, RunConfig, run
from connlearn.train.recipe import Phase, Recipe, get_recipe
from connlearn.train.signals import STOP_SIGNALS, TrainingStopped
from connlearn.train.trainer import Trainer

__all__ = ["PROTOCOLS", "STOP_SIGNALS", "BatchLoader", "DataLoaderPath", "ImageDataset", "Phase", "Recipe",
           "RunConfig", "Trainer", "TrainingStopped", "as_image_dataset", "evaluate", "get_recipe", "load_checkpoint",
           "load_dataset", "load_packed", "make_checkpoint", "make_loaders", "net_from_checkpoint", "pack", "run",
           "save_checkpoint", "synthetic"]
