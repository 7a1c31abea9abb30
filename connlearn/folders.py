"""Image folders read from disk, for datasets too large for memory (ImageNet), with ResNeXt's augmentation.

An :class:`ImageFiles` is the list of an image folder's files, with labels and class names (torchvision's
``ImageFolder`` layout: one folder of images per class); :func:`image_files` reads one, and
:func:`load_imagenet` the ``train/`` and ``val/`` folders of ImageNet. A :class:`FolderLoader` decodes
them in ``DataLoader`` workers and augments each image as ResNeXt was trained on ImageNet, which the
paper follows (the steps of fb.resnet.torch, its ResNeXt code, in its order):

- training: a random crop of 8% to 100% of the image's area at an aspect ratio in [3/4, 4/3], resized to
  ``size x size`` (224) (the crop is drawn by the rule of ``torchvision.transforms.RandomResizedCrop``:
  log-uniform ratio, and after 10 misses the centre crop at the nearest allowed ratio; fb.resnet.torch
  draws the ratio uniformly and swaps the sides at random); colour jitter (brightness, contrast and
  saturation, each by a factor in [0.6, 1.4], in a random order); AlexNet's PCA lighting noise (standard
  deviation 0.1); the per-channel ImageNet mean and standard deviation normalised away; a horizontal flip
  with probability 1/2;
- evaluation: torchvision's ``Resize(resize)`` (the shorter side to 256) and ``CenterCrop(size)``
  (224), normalised.

Like the in-memory loaders of :mod:`connlearn.data`, every random choice of epoch ``e`` (the order, and
each image's crop, colour and flip) comes from ``(seed, e)`` and the image's index alone, so an epoch read
again, after a resume or with another number of workers, gives the same batches. In DDP every rank draws
the same order and takes every ``world_size``-th sample.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Iterator
from typing import Any

import attrs
import numpy as np
import torch
from PIL import Image

from connlearn.data import DATA_ENV, ClassBalanced, ShardedBatches, data_location, epoch_generator
from connlearn.errors import ConfigTypeError, DataError, check_bool, check_int, check_path
from connlearn.signals import start_workers, worker_init

#: ImageNet's per-channel mean and standard deviation (RGB, in [0, 1]).
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
#: The eigenvalues and eigenvectors (columns) of ImageNet's RGB covariance, for AlexNet's lighting noise.
_EIGENVALUES = (0.2175, 0.0188, 0.0045)
_EIGENVECTORS = ((-0.5675, 0.7192, 0.4009), (-0.5808, -0.0045, -0.8140), (-0.5836, -0.6948, 0.4203))
#: Its splits, as folders of class folders, under the folder ``--data`` names.
IMAGENET_SPLITS = ("train", "val")
#: Pillow's bilinear filter. Pillow sets its module-level constants at import, unseen by its type hints
#: (``Image.Resampling`` would need Pillow >= 9.1).
_BILINEAR = Image.BILINEAR  # type: ignore[attr-defined]


def _str_tuple(values: Iterable[str]) -> tuple[str, ...]:
    return tuple(values)


@attrs.frozen(eq=False)
class ImageFiles(ClassBalanced):
    """The image files of a dataset: ``paths[i]`` has label ``labels[i]`` (in ``0 .. num_classes - 1``).
    ``subset`` and ``split`` (class-balanced, as :class:`~connlearn.data.ImageDataset`'s) give smaller lists."""

    paths: tuple[str, ...] = attrs.field(converter=_str_tuple)
    labels: np.ndarray = attrs.field(converter=lambda v: np.asarray(v, dtype=np.int64))
    class_names: tuple[str, ...] = attrs.field(converter=_str_tuple)

    def __attrs_post_init__(self) -> None:
        if not self.paths:
            raise DataError("an image list needs at least one file")
        if self.labels.shape != (len(self.paths),):
            raise DataError(f"{len(self.paths)} files but labels of shape {list(self.labels.shape)}")
        if self.labels.min() < 0 or self.labels.max() >= len(self.class_names):
            raise DataError(f"labels must lie in 0 .. {len(self.class_names) - 1} (one per class name), got "
                            f"{self.labels.min()} .. {self.labels.max()}")

    def __len__(self) -> int:
        return len(self.paths)

    def __repr__(self) -> str:
        return f"ImageFiles({len(self)} images, {self.num_classes} classes)"

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def _take(self, keep: np.ndarray) -> ImageFiles:
        return ImageFiles([p for p, k in zip(self.paths, keep, strict=True) if k], self.labels[keep],
                          self.class_names)


def image_files(folder: str | os.PathLike[str]) -> ImageFiles:
    """The files of ``folder`` (one folder of images per class; classes in sorted order, files in sorted
    order within each, as ``torchvision.datasets.ImageFolder`` lists them), without reading them."""
    from torchvision.datasets.folder import IMG_EXTENSIONS, find_classes, make_dataset

    folder = check_path("folder", folder)
    if not folder.is_dir():
        raise DataError(f"{folder} is not a folder (expected one folder of images per class)")
    try:
        classes, index = find_classes(str(folder))
        samples = make_dataset(str(folder), index, extensions=IMG_EXTENSIONS)
    except (FileNotFoundError, OSError) as exc:  # no class folders, or a class folder without images
        raise DataError(f"{folder}: {' '.join(str(exc).split())} (expected one folder of images per class)") from None
    return ImageFiles([p for p, _ in samples], [label for _, label in samples], classes)


#: What Pillow raises for a file that is no readable image (truncated, corrupt, not an image, too large).
_UNREADABLE = (OSError, ValueError, SyntaxError, Image.DecompressionBombError)


def open_rgb(path: str) -> Image.Image:
    """The image at ``path``, decoded, in RGB; a file that is no readable image is a :class:`DataError`
    naming it."""
    try:
        with Image.open(path) as opened:
            return opened.convert("RGB")
    except _UNREADABLE as exc:
        raise _unreadable(path, exc) from None


def header_size(path: str) -> tuple[int, int]:
    """``(width, height)`` of the image at ``path``, read from its header (nothing is decoded)."""
    try:
        with Image.open(path) as opened:
            return opened.size
    except _UNREADABLE as exc:
        raise _unreadable(path, exc) from None


def _unreadable(path: str, exc: BaseException) -> DataError:
    return DataError(f"cannot read image {path}: {' '.join(str(exc).split()) or type(exc).__name__}")


def load_imagenet(data: str | os.PathLike[str] | None = None) -> tuple[ImageFiles, ImageFiles]:
    """``(train, val)`` of ImageNet: the folders ``train/`` and ``val/`` (each one folder of images per
    class; the validation images sorted into their classes) in ``data``, else in ``$CONNLEARN_DATA``."""
    location = data_location(data)
    if location is None:
        raise DataError(f"ImageNet has no download: pass --data FOLDER (holding train/ and val/, each with one "
                        f"folder of images per class) or set {DATA_ENV}")
    root = location[0]
    missing = [split for split in IMAGENET_SPLITS if not (root / split).is_dir()]
    if missing:
        raise DataError(f"{root} has no {' or '.join(f'{m}/' for m in missing)} folder; ImageNet's folder holds "
                        "train/ and val/, each with one folder of images per class")
    train, val = (image_files(root / split) for split in IMAGENET_SPLITS)
    if val.class_names != train.class_names:
        raise DataError(f"{root}: train/ has {train.num_classes} class folders and val/ {val.num_classes}, or "
                        "they are named differently; both need the same class folders")
    return train, val


def crop_box(width: int, height: int, rng: np.random.Generator, scale: tuple[float, float] = (0.08, 1.0),
             ratio: tuple[float, float] = (3 / 4, 4 / 3)) -> tuple[int, int, int, int]:
    """``(left, top, w, h)`` of a random crop covering ``scale`` of the image's area with an aspect ratio
    (w / h) in ``ratio``, log-uniform; after 10 failed tries, the centre crop of the nearest allowed ratio
    (the rule of ``torchvision.transforms.RandomResizedCrop``, drawn from ``rng``)."""
    area = width * height
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * rng.uniform(*scale)
        aspect = math.exp(rng.uniform(*log_ratio))
        w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            return int(rng.integers(0, width - w + 1)), int(rng.integers(0, height - h + 1)), w, h
    aspect = width / height
    if aspect < ratio[0]:
        w, h = width, round(width / ratio[0])
    elif aspect > ratio[1]:
        w, h = round(height * ratio[1]), height
    else:
        w, h = width, height
    return (width - w) // 2, (height - h) // 2, w, h


def resized_size(width: int, height: int, shorter: int) -> tuple[int, int]:
    """``(width, height)`` scaled so that the shorter side is ``shorter``; the longer side is truncated, as
    ``torchvision.transforms.Resize(shorter)`` does."""
    if width <= height:
        return shorter, int(shorter * height / width)
    return int(shorter * width / height), shorter


def _grey(x: np.ndarray) -> np.ndarray:
    """The luma of ``[3, H, W]`` RGB, ``[1, H, W]`` (ITU-R 601, as fb.resnet.torch)."""
    return (np.float32(0.299) * x[0] + np.float32(0.587) * x[1] + np.float32(0.114) * x[2])[None]


def colour_jitter(x: np.ndarray, rng: np.random.Generator, strength: float = 0.4) -> np.ndarray:
    """Brightness, contrast and saturation of float32 ``[3, H, W]`` in [0, 1], each blended by a factor in
    ``[1 - strength, 1 + strength]``, in a random order (fb.resnet.torch's ``ColorJitter``). NumPy, whose
    sums do not depend on the number of threads: the same draws give the same pixels in any worker."""
    for which in rng.permutation(3):
        alpha = np.float32(1.0 + rng.uniform(-strength, strength))
        if which == 0:  # brightness: towards black
            x = x * alpha
        elif which == 1:  # contrast: towards the mean grey
            x = x * alpha + (1 - alpha) * _grey(x).mean()
        else:  # saturation: towards the pixel's grey
            x = x * alpha + (1 - alpha) * _grey(x)
    return x


def lighting(x: np.ndarray, rng: np.random.Generator, std: float = 0.1) -> np.ndarray:
    """AlexNet's PCA lighting noise on float32 ``[3, H, W]``: add ``V (α ⊙ λ)`` to every pixel,
    ``α ~ N(0, std²)`` per component."""
    shift = np.asarray(_EIGENVECTORS) @ (rng.normal(0.0, std, 3) * np.asarray(_EIGENVALUES))
    return x + shift.astype(np.float32)[:, None, None]


class _FolderSamples(torch.utils.data.Dataset):
    """Samples keyed by ``(epoch, index)``: the image decoded, augmented from ``(seed, epoch, index)``."""

    def __init__(self, loader: FolderLoader) -> None:
        self.files, self.train, self.seed = loader.files, loader.train, loader.seed
        self.size, self.resize = loader.size, loader.resize
        self.mean = np.asarray(IMAGENET_MEAN, dtype=np.float32)[:, None, None]
        self.std = np.asarray(IMAGENET_STD, dtype=np.float32)[:, None, None]

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, key: tuple[int, int]) -> tuple[torch.Tensor, int]:
        epoch, index = key
        image = open_rgb(self.files.paths[index])
        width, height = image.size
        if self.train:
            rng = np.random.default_rng([self.seed, epoch, index])
            left, top, w, h = crop_box(width, height, rng)
            image = image.crop((left, top, left + w, top + h)).resize((self.size, self.size), _BILINEAR)
            x = lighting(colour_jitter(_to_array(image), rng), rng)
            x = (x - self.mean) / self.std
            if rng.random() < 0.5:
                x = x[:, :, ::-1]
        else:
            image = image.resize(resized_size(width, height, self.resize), _BILINEAR)
            w, h = image.size
            left, top = round((w - self.size) / 2), round((h - self.size) / 2)
            x = (_to_array(image)[:, top : top + self.size, left : left + self.size] - self.mean) / self.std
        return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)), int(self.files.labels[index])


def _to_array(image: Image.Image) -> np.ndarray:
    """An RGB PIL image as float32 ``[3, H, W]`` in [0, 1]."""
    return np.asarray(image, dtype=np.uint8).transpose(2, 0, 1).astype(np.float32) / np.float32(255.0)


class FolderLoader(ShardedBatches):
    """Batches of an :class:`ImageFiles` read from disk by ``DataLoader`` workers, augmented as the module
    docstring says: ``len()`` batches per epoch, and :meth:`epoch` gives ``(x float32 [B, 3, size, size],
    y int64 [B])`` on ``device`` (the loader protocol of :class:`~connlearn.train.Trainer`).

    Args:
        files: the images.
        batch_size: samples per batch on this rank.
        train: augment, shuffle and drop the last partial batch (unless ``shuffle``/``drop_last`` say otherwise).
        device: where the batches go (non-blocking when ``pin_memory``).
        seed: with the epoch number and each image's index, the seed of every random choice.
        size: the side of the crops (224); resize: the shorter side before evaluation's centre crop (256).
        rank, world_size: DDP: all ranks share one order and rank ``r`` takes every ``world_size``-th sample,
            ``len(files) // world_size`` samples each in training; in evaluation they read every sample
            between them (see :class:`~connlearn.data.ShardedBatches`).
        num_workers: decoding processes (default: the CPUs, at most 8); pin_memory: default on CUDA.
        channels_last: return batches in channels-last memory format.
    """

    def __init__(self, files: ImageFiles, batch_size: int, *, train: bool, device: str | torch.device = "cpu",
                 seed: int = 0, size: int = 224, resize: int = 256, drop_last: bool | None = None,
                 shuffle: bool | None = None, rank: int = 0, world_size: int = 1, num_workers: int | None = None,
                 pin_memory: bool | None = None, channels_last: bool = False) -> None:
        if not isinstance(files, ImageFiles):
            raise ConfigTypeError(f"files must be an ImageFiles (connlearn.folders.image_files(folder)), got "
                                  f"{type(files).__name__}")
        self.files = files
        self._batching(len(files), batch_size, train=train, device=device, seed=seed, drop_last=drop_last,
                       shuffle=shuffle, rank=rank, world_size=world_size, channels_last=channels_last)
        self.size = check_int("size", size, minimum=1)
        self.resize = check_int("resize", resize, minimum=self.size)
        workers = min(8, os.cpu_count() or 1) if num_workers is None else num_workers
        self.num_workers = check_int("num_workers", workers, minimum=0)
        self.pin_memory = self.device.type == "cuda" if pin_memory is None else check_bool("pin_memory", pin_memory)
        self._samples = _FolderSamples(self)

    def order(self, epoch: int) -> torch.Tensor:
        """The indices this rank reads in ``epoch``, in order (from ``epoch_generator(seed, epoch)``)."""
        epoch = check_int("epoch", epoch, minimum=0)
        return self._order(len(self.files), epoch_generator(self.seed, epoch))[self._positions()]

    def epoch(self, epoch: int, start: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The batches of ``epoch``, from its batch number ``start`` on (a resume within the epoch, which reads
        no image of the batches before); the same ``epoch`` gives the same batches every time."""
        first = self._first_batch(start)
        loader = torch.utils.data.DataLoader(
            self._samples,
            batch_size=self.batch_size,
            sampler=[(epoch, index) for index in self.order(epoch)[first * self.batch_size:].tolist()],
            drop_last=self.drop_last,
            num_workers=self.num_workers,
            worker_init_fn=worker_init(),  # its workers ignore the signals a training run stops on
            pin_memory=self.pin_memory,
            persistent_workers=False,
            generator=epoch_generator(self.seed, epoch),  # not the global RNG
        )
        return self._batches(start_workers(loader))

    def _batches(self, batches: Iterator[Any]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        try:
            for x, y in batches:
                yield self._finish(x.to(self.device, non_blocking=True)), y.to(self.device, non_blocking=True)
        except DataError as exc:  # from a worker, its message is the worker's traceback: keep the error's line
            lines = str(exc).strip().splitlines()
            raise DataError(lines[-1].split("DataError: ", 1)[-1] if lines else "") from None


def folder_loaders(train: ImageFiles, test: ImageFiles, batch_size: int, *, device: str | torch.device,
                   seed: int = 0, eval_batch_size: int | None = None,
                   **options: Any) -> tuple[FolderLoader, FolderLoader]:
    """The train and evaluation :class:`FolderLoader`; ``options`` (``size``, ``resize``, ``rank``,
    ``world_size``, ``num_workers``, ``pin_memory``, ``channels_last``) go to both. The evaluation loader
    keeps the last partial batch and reads in file order."""
    test_options = {k: v for k, v in options.items() if k not in ("drop_last", "shuffle")}
    return (FolderLoader(train, batch_size, train=True, device=device, seed=seed, **options),
            FolderLoader(test, eval_batch_size or batch_size, train=False, device=device, seed=seed, **test_options))


__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "FolderLoader", "ImageFiles", "colour_jitter", "crop_box",
           "folder_loaders", "header_size", "image_files", "lighting", "load_imagenet", "open_rgb", "resized_size"]
