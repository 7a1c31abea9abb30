"""Image folders read from disk (ImageNet), with ResNeXt's augmentation, which the paper follows.

:class:`ImageFiles` lists an image folder's files (torchvision's ImageFolder layout: one folder of images per
class); :func:`load_imagenet` reads ``train/`` and ``val/``. :class:`FolderLoader` decodes them in DataLoader
workers and augments each image as fb.resnet.torch (ResNeXt's code) does, in its order:

- training: a random crop of 8-100% of the area at an aspect ratio in [3/4, 4/3] (the rule of torchvision's
  RandomResizedCrop) resized to ``size`` (224); colour jitter (brightness, contrast and saturation, each by a
  factor in [0.6, 1.4], in a random order); AlexNet's PCA lighting noise (std 0.1); the per-channel mean and
  std normalised away; a horizontal flip;
- evaluation: the shorter side resized to ``resize`` (256), the centre ``size`` crop, normalised.

Every random choice comes from ``(seed, epoch, index)``: an epoch read again, after a resume or with
another number of workers, gives the same batches.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from PIL import Image

from connlearn.errors import DataError
from connlearn.files import path_of
from connlearn.train.data import ImageFiles, data_folders, image_files
from connlearn.train.loaders import ShardedBatches

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
_EIGENVALUES = (0.2175, 0.0188, 0.0045)
_EIGENVECTORS = ((-0.5675, 0.7192, 0.4009), (-0.5808, -0.0045, -0.8140), (-0.5836, -0.6948, 0.4203))


def load_imagenet(data: str | os.PathLike | None = None) -> tuple[ImageFiles, ImageFiles]:
    """``(train, val)``: the folders ``train/`` and ``val/`` (each one folder per class) in ``data``, else in
    the first of :func:`~connlearn.train.data.data_folders` that has an ``imagenet`` folder holding them."""
    roots = [path_of(data)] if data is not None else [f / "imagenet" for f in data_folders()]
    for root in roots:
        if (root / "train").is_dir() and (root / "val").is_dir():
            train, val = image_files(root / "train"), image_files(root / "val")
            if train.class_names != val.class_names:
                raise DataError(f"{root}: train/ and val/ need the same class folders")
            return train, val
    raise DataError(f"no ImageNet found (looked for train/ and val/ in {', '.join(map(str, roots))}); it has no "
                    "download: pass --data FOLDER")


def crop_box(width: int, height: int, rng: np.random.Generator, scale: tuple[float, float] = (0.08, 1.0),
             ratio: tuple[float, float] = (3 / 4, 4 / 3)) -> tuple[int, int, int, int]:
    """``(left, top, w, h)`` of a random crop of ``scale`` of the area at a log-uniform aspect ratio in
    ``ratio``; after 10 misses, the centre crop at the nearest allowed ratio (RandomResizedCrop's rule)."""
    for _ in range(10):
        target = width * height * rng.uniform(*scale)
        aspect = math.exp(rng.uniform(math.log(ratio[0]), math.log(ratio[1])))
        w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            return int(rng.integers(0, width - w + 1)), int(rng.integers(0, height - h + 1)), w, h
    w, h = ((width, round(width / ratio[0])) if width / height < ratio[0] else
            (round(height * ratio[1]), height) if width / height > ratio[1] else (width, height))
    return (width - w) // 2, (height - h) // 2, w, h


def colour_jitter(x: np.ndarray, rng: np.random.Generator, strength: float = 0.4) -> np.ndarray:
    """Brightness, contrast and saturation of float32 ``[3, H, W]``, each blended by a factor in
    ``1 ± strength``, in a random order (fb.resnet.torch's ColorJitter)."""
    for which in rng.permutation(3):
        alpha = np.float32(1.0 + rng.uniform(-strength, strength))
        grey = (np.float32(0.299) * x[0] + np.float32(0.587) * x[1] + np.float32(0.114) * x[2])[None]
        x = x * alpha if which == 0 else x * alpha + (1 - alpha) * (grey.mean() if which == 1 else grey)
    return x


def lighting(x: np.ndarray, rng: np.random.Generator, std: float = 0.1) -> np.ndarray:
    """AlexNet's PCA lighting noise: ``V (α ⊙ λ)`` added to every pixel, ``α ~ N(0, std²)``."""
    shift = np.asarray(_EIGENVECTORS) @ (rng.normal(0.0, std, 3) * np.asarray(_EIGENVALUES))
    return x + shift.astype(np.float32)[:, None, None]


class _FolderSamples(torch.utils.data.Dataset):
    def __init__(self, loader: FolderLoader) -> None:
        self.files, self.train, self.seed, self.size, self.resize = (loader.files, loader.train, loader.seed,
                                                                     loader.size, loader.resize)
        self.mean = np.asarray(IMAGENET_MEAN, dtype=np.float32)[:, None, None]
        self.std = np.asarray(IMAGENET_STD, dtype=np.float32)[:, None, None]

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, key: tuple[int, int]) -> tuple[torch.Tensor, int]:
        epoch, index = key
        try:
            with Image.open(self.files.paths[index]) as opened:
                image = opened.convert("RGB")
        except (OSError, ValueError, SyntaxError) as exc:
            raise DataError(f"cannot read image {self.files.paths[index]}: {exc}") from None
        if self.train:
            rng = np.random.default_rng([self.seed, epoch, index])
            left, top, w, h = crop_box(*image.size, rng)
            image = image.crop((left, top, left + w, top + h)).resize((self.size, self.size), Image.Resampling.BILINEAR)
            x = (lighting(colour_jitter(_array(image), rng), rng) - self.mean) / self.std
            x = x[:, :, ::-1] if rng.random() < 0.5 else x
        else:
            width, height = image.size
            shorter = self.resize
            image = image.resize((shorter, int(shorter * height / width)) if width <= height else
                                 (int(shorter * width / height), shorter), Image.Resampling.BILINEAR)
            left, top = round((image.size[0] - self.size) / 2), round((image.size[1] - self.size) / 2)
            x = (_array(image)[:, top:top + self.size, left:left + self.size] - self.mean) / self.std
        return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)), int(self.files.labels[index])


def _array(image: Image.Image) -> np.ndarray:
    return np.asarray(image, dtype=np.uint8).transpose(2, 0, 1).astype(np.float32) / np.float32(255.0)


class FolderLoader(ShardedBatches):
    """Batches of :class:`ImageFiles` decoded by DataLoader workers and augmented as the module docstring
    says: ``(x float32 [B, 3, size, size], y int64 [B])`` on ``device``; the loader protocol of the Trainer.
    ``num_workers`` defaults to the CPUs (at most 8); the other options are :class:`ShardedBatches`'."""

    def __init__(self, files: ImageFiles, batch_size: int, *, train: bool, size: int = 224, resize: int = 256,
                 num_workers: int | None = None, pin_memory: bool | None = None, **options: Any) -> None:
        super().__init__(len(files), batch_size, train=train, **options)
        self.files, self.size, self.resize = files, size, resize
        self.num_workers = min(8, os.cpu_count() or 1) if num_workers is None else num_workers
        self.pin_memory = self.device.type == "cuda" if pin_memory is None else pin_memory

    def epoch(self, epoch: int, start: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return self._from_workers(_FolderSamples(self), epoch, self.order(epoch)[start * self.batch_size:].tolist())


def folder_loaders(train: ImageFiles, test: ImageFiles, batch_size: int, *, device: str | torch.device, seed: int = 0,
                   eval_batch_size: int | None = None, **options: Any) -> tuple[FolderLoader, FolderLoader]:
    """The train and evaluation FolderLoaders (the evaluation one keeps the last batch, in file order)."""
    return (FolderLoader(train, batch_size, train=True, device=device, seed=seed, **options),
            FolderLoader(test, eval_batch_size or batch_size, train=False, device=device, seed=seed, **options))
