"""Loaders: batches ``(x float32 [B, C, crop, crop], y int64 [B])`` on the device, with the paper's CIFAR
augmentation (the per-pixel mean subtracted, zero padding, a random crop, a horizontal flip) at any size.

- :class:`BatchLoader`: the dataset as one uint8 tensor on the device, augmented per batch there, no workers
  (GPU-resident on CUDA, and the default on the CPU: CIFAR fits in memory);
- :class:`DataLoaderPath`: torch's ``DataLoader``, augmenting per sample in workers;
- :class:`FolderLoader`: image files (ImageNet) decoded in DataLoader workers, with ResNeXt's augmentation,
  which the paper follows (fb.resnet.torch's, in its order). Training: a random crop of 8-100% of the area at
  an aspect ratio in [3/4, 4/3] (torchvision's RandomResizedCrop rule) resized to ``size`` (224); colour
  jitter (brightness, contrast, saturation, each by a factor in [0.6, 1.4], in a random order); AlexNet's PCA
  lighting noise (std 0.1); the per-channel mean and std normalised away; a horizontal flip. Evaluation: the
  shorter side resized to ``resize`` (256), the centre ``size`` crop, normalised.

A loader is ``len()`` (batches per epoch) and ``epoch(e, start=0)`` (the batches of epoch ``e`` from batch
``start`` on). Every random choice of an epoch comes from ``(seed, epoch)`` alone: an epoch read again, or
after a resume, gives the same batches. Under DDP rank ``r`` reads positions ``r, r + world_size, ...`` of
every epoch's order: ``count // world_size`` of them in training, every sample between the ranks in evaluation.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from connlearn.errors import ConfigError, DataError, check_choice
from connlearn.files import path_of
from connlearn.train.data import ArrayDataset, ImageDataset, ImageFiles, data_folders, image_files, pixel_mean
from connlearn.train.signals import start_workers, worker_init

MAX_SEED = 2**40


def epoch_generator(seed: int, epoch: int) -> torch.Generator:
    """The generator behind every random choice of ``epoch``."""
    return torch.Generator().manual_seed(seed * 1_000_003 + epoch)


class ShardedBatches:
    """What every loader shares: batch size, train/eval defaults, device, seed, the DDP split, ``len()``."""

    num_workers: int  # of the loaders that read by DataLoader workers
    pin_memory: bool

    def __init__(self, count: int, batch_size: int, *, train: bool, device: str | torch.device = "cpu",
                 seed: int = 0, drop_last: bool | None = None, shuffle: bool | None = None, rank: int = 0,
                 world_size: int = 1, channels_last: bool = False) -> None:
        self.batch_size, self.train, self.device, self.seed = batch_size, train, torch.device(device), seed
        self.drop_last = train if drop_last is None else drop_last
        self.shuffle = train if shuffle is None else shuffle
        self.rank, self.world_size, self.channels_last, self.count = rank, world_size, channels_last, count
        self.num_samples = count // world_size if train else len(range(rank, count, world_size))
        if self.num_samples == 0 or (self.drop_last and self.num_samples < batch_size):
            raise ConfigError(f"each of {world_size} rank(s) gets {self.num_samples} of {count} images, fewer than a "
                              f"batch of {batch_size}: use a smaller batch size or more data")

    def __len__(self) -> int:
        return self.num_samples // self.batch_size if self.drop_last else math.ceil(self.num_samples / self.batch_size)

    def order(self, epoch: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """The samples this rank reads in ``epoch``, in order."""
        generator = epoch_generator(self.seed, epoch) if generator is None else generator
        order = torch.randperm(self.count, generator=generator) if self.shuffle else torch.arange(self.count)
        return order[self._positions()]

    def _positions(self) -> torch.Tensor:
        return torch.arange(self.rank, self.count, self.world_size)[:self.num_samples]

    def _finish(self, x: torch.Tensor) -> torch.Tensor:
        return x.contiguous(memory_format=torch.channels_last if self.channels_last else torch.contiguous_format)

    def _from_workers(self, samples: torch.utils.data.Dataset, epoch: int,
                      keys: list[Any]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The batches of ``samples[key]`` for ``key`` in ``keys``, read by ``self.num_workers`` workers."""
        loader = torch.utils.data.DataLoader(
            samples, batch_size=self.batch_size, sampler=keys, drop_last=self.drop_last,
            num_workers=self.num_workers, pin_memory=self.pin_memory, worker_init_fn=worker_init(),
            generator=epoch_generator(self.seed, epoch))  # not the global RNG
        return ((self._finish(x.to(self.device, non_blocking=True)), y.to(self.device, non_blocking=True))
                for x, y in start_workers(loader))


class _Augmented(ShardedBatches):
    """The crops and flips of the CIFAR augmentation, for :class:`BatchLoader` and :class:`DataLoaderPath`."""

    def __init__(self, dataset: ImageDataset, batch_size: int, *, train: bool, mean: torch.Tensor | None = None,
                 pad: int = 4, crop: int | None = None, **options: Any) -> None:
        super().__init__(len(dataset), batch_size, train=train, **options)
        self.dataset = dataset
        height, width = dataset.image_size
        self.pad = pad if train else 0
        self.crop = min(height, width) if crop is None else crop
        if self.crop > min(height, width) + 2 * self.pad:
            raise ConfigError(f"crop {self.crop} is larger than the {height}x{width} images padded by {self.pad}")
        mean = pixel_mean(dataset) if mean is None else torch.as_tensor(mean, dtype=torch.float32)
        self.mean = (mean.reshape(-1, 1, 1) if mean.dim() == 1 else mean).expand(dataset.channels, height, width)

    def plan(self, epoch: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """This rank's samples, crop corners ``[n, 2]`` (row, column, in the padded image) and flips of
        ``epoch``, drawn for the whole dataset, so that every rank sees the same draws."""
        generator = epoch_generator(self.seed, epoch)
        order, (height, width) = self.order(epoch, generator), self.dataset.image_size
        if self.train:
            tops = torch.randint(0, height + 2 * self.pad - self.crop + 1, (self.count,), generator=generator)
            lefts = torch.randint(0, width + 2 * self.pad - self.crop + 1, (self.count,), generator=generator)
            corners, flips = torch.stack([tops, lefts], dim=1), torch.rand(self.count, generator=generator) < 0.5
        else:
            corners = torch.tensor([(height - self.crop) // 2, (width - self.crop) // 2]).expand(self.count, 2)
            flips = torch.zeros(self.count, dtype=torch.bool)
        at = self._positions()
        return order, corners[at].contiguous(), flips[at]


class BatchLoader(_Augmented):
    """The images as one uint8 tensor on ``device``, augmented per batch there, vectorised over the batch.

    Args: ``dataset``, ``batch_size`` (per rank), ``train`` (augment, shuffle and drop the last partial
    batch, unless ``shuffle``/``drop_last`` say otherwise), ``device``, ``seed``, ``mean`` (``[C, H, W]``, or
    ``[C]`` per channel; default the dataset's pixel mean: give the test loader the train set's), ``pad``,
    ``crop`` (default the image size), ``rank``/``world_size`` (DDP), ``channels_last``.
    """

    def __init__(self, dataset: ImageDataset, batch_size: int, *, train: bool, **options: Any) -> None:
        super().__init__(dataset, batch_size, train=train, **options)
        self._images = torch.from_numpy(dataset.images).to(self.device)
        self._labels = torch.from_numpy(dataset.labels).to(self.device)
        self._mean = self.mean.to(self.device)

    def epoch(self, epoch: int, start: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The batches of ``epoch`` from its batch ``start`` on."""
        indices, corners, flips = (t.to(self.device) for t in self.plan(epoch))
        window = torch.arange(self.crop, device=self.device)
        channels = torch.arange(self.dataset.channels, device=self.device)[None, :, None, None]
        for lo in range(start * self.batch_size, len(self) * self.batch_size, self.batch_size):
            rows = indices[lo:min(lo + self.batch_size, self.num_samples)]
            x = self._images[rows].permute(0, 3, 1, 2).to(torch.float32).div_(255.0).sub_(self._mean)
            if self.pad:
                x = F.pad(x, (self.pad,) * 4)
            top, left = corners[lo:lo + len(rows), 0, None], corners[lo:lo + len(rows), 1, None]
            xs = left + torch.where(flips[lo:lo + len(rows), None], self.crop - 1 - window, window)
            batch = torch.arange(len(rows), device=self.device)[:, None, None, None]
            x = x[batch, channels, (top + window)[:, None, :, None], xs[:, None, None, :]]
            yield self._finish(x), self._labels[rows]


class _Samples(torch.utils.data.Dataset):
    """Samples keyed by ``(index, top, left, flip)``: a crop and flip of :meth:`_Augmented.plan`."""

    def __init__(self, loader: DataLoaderPath) -> None:
        self.images, self.labels, self.mean = loader.dataset.images, loader.dataset.labels, loader.mean.contiguous()
        self.pad, self.crop = loader.pad, loader.crop

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, key: tuple[int, int, int, bool]) -> tuple[torch.Tensor, int]:
        index, top, left, flip = key
        x = torch.from_numpy(self.images[index]).permute(2, 0, 1).to(torch.float32).div_(255.0).sub_(self.mean)
        x = F.pad(x, (self.pad,) * 4)[:, top:top + self.crop, left:left + self.crop]
        return (x.flip(2) if flip else x).contiguous(), int(self.labels[index])


class DataLoaderPath(_Augmented):
    """torch's ``DataLoader``, augmenting per sample in ``num_workers`` workers: :class:`BatchLoader`'s
    arguments and batches, plus ``num_workers`` and ``pin_memory``."""

    def __init__(self, dataset: ImageDataset, batch_size: int, *, train: bool, num_workers: int = 2,
                 pin_memory: bool = False, **options: Any) -> None:
        super().__init__(dataset, batch_size, train=train, **options)
        self.num_workers, self.pin_memory = num_workers, pin_memory

    def epoch(self, epoch: int, start: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        order, corners, flips = self.plan(epoch)
        keys = list(zip(order.tolist(), *corners.T.tolist(), flips.tolist(), strict=True))
        return self._from_workers(_Samples(self), epoch, keys[start * self.batch_size:])


class ArrayLoader(ShardedBatches):
    """Batches ``(x float32 [B, C, L] or [B, F], y int64 [B])`` of an :class:`ArrayDataset` on ``device``, each
    channel (each feature of vectors) standardised by ``mean`` and ``std`` (default the dataset's own, over
    its examples and time steps: give the evaluation loader the training set's), shuffled per ``(seed,
    epoch)`` in training; no augmentation. The other options are :class:`ShardedBatches`'."""

    def __init__(self, dataset: ArrayDataset, batch_size: int, *, train: bool, mean: torch.Tensor | None = None,
                 std: torch.Tensor | None = None, **options: Any) -> None:
        super().__init__(len(dataset), batch_size, train=train, **options)
        self.dataset = dataset
        own_mean, own_std = channel_moments(dataset)
        self.mean, self.std = (own_mean if mean is None else mean), (own_std if std is None else std)
        shape = (1, -1, *[1] * len(dataset.input_size))
        x = (torch.from_numpy(dataset.x) - self.mean.reshape(shape)) / self.std.reshape(shape)
        self._x, self._y = x.to(self.device), torch.from_numpy(dataset.labels).to(self.device)

    def epoch(self, epoch: int, start: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The batches of ``epoch`` from its batch ``start`` on."""
        order = self.order(epoch).to(self.device)
        for lo in range(start * self.batch_size, len(self) * self.batch_size, self.batch_size):
            rows = order[lo:min(lo + self.batch_size, self.num_samples)]
            yield self._x[rows], self._y[rows]


def channel_moments(dataset: ArrayDataset) -> tuple[torch.Tensor, torch.Tensor]:
    """The per-channel mean and standard deviation ``[C]`` of a dataset's arrays, over examples and time (a
    constant channel's std taken as 1)."""
    axes = (0, *range(2, dataset.x.ndim))
    mean, std = dataset.x.mean(axis=axes, dtype=np.float64), dataset.x.std(axis=axes, dtype=np.float64)
    return torch.from_numpy(mean).float(), torch.from_numpy(np.where(std > 0, std, 1.0)).float()


def make_loaders(train: Any, test: Any, batch_size: int, *, device: str | torch.device, seed: int = 0,
                 path: str = "auto", eval_batch_size: int | None = None, normalised_by: Any = None,
                 **options: Any) -> tuple[Any, Any]:
    """The train and test loaders of ImageDatasets: ``path`` ``auto`` (:class:`BatchLoader`) or ``dataloader``
    (:class:`DataLoaderPath`); ``options`` go to both (``drop_last`` and ``shuffle`` to the train loader only).
    Both subtract the pixel mean of ``normalised_by`` (default ``train``: another set's loaders, such as the
    gates' held-out images, take the training set's); the test loader keeps its last partial batch. Of
    ArrayDatasets: two :class:`ArrayLoader`, both standardised by those moments (the image options do not
    apply)."""
    cls = BatchLoader if check_choice("loader path", path, ("auto", "dataloader")) == "auto" else DataLoaderPath
    reference = train if normalised_by is None else normalised_by
    if isinstance(train, ArrayDataset):
        mean, std = channel_moments(reference)
        kept = {k: v for k, v in options.items() if k in ("rank", "world_size", "drop_last", "shuffle")}
        return (ArrayLoader(train, batch_size, train=True, device=device, seed=seed, mean=mean, std=std, **kept),
                ArrayLoader(test, eval_batch_size or batch_size, train=False, device=device, seed=seed, mean=mean,
                            std=std, **{k: v for k, v in kept.items() if k in ("rank", "world_size")}))
    options.setdefault("mean", pixel_mean(reference))
    train_only = {k: options.pop(k) for k in ("drop_last", "shuffle") if k in options}
    return (cls(train, batch_size, train=True, device=device, seed=seed, **train_only, **options),
            cls(test, eval_batch_size or batch_size, train=False, device=device, seed=seed, **options))


# ------------------------------------------------------------------------------------- image folders
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
        keys = [(epoch, i) for i in self.order(epoch)[start * self.batch_size:].tolist()]
        return self._from_workers(_FolderSamples(self), epoch, keys)


def folder_loaders(train: ImageFiles, test: ImageFiles, batch_size: int, *, device: str | torch.device, seed: int = 0,
                   eval_batch_size: int | None = None, **options: Any) -> tuple[FolderLoader, FolderLoader]:
    """The train and evaluation FolderLoaders (the evaluation one keeps the last batch, in file order)."""
    return (FolderLoader(train, batch_size, train=True, device=device, seed=seed, **options),
            FolderLoader(test, eval_batch_size or batch_size, train=False, device=device, seed=seed, **options))
