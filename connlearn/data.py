"""Image datasets in memory, the packed-image file format, and the loaders that feed training.

An :class:`ImageDataset` is uint8 images ``[N, H, W, 3]`` (HWC) with int64 labels ``[N]``. Datasets come from

- :func:`load_packed`: the packed ``.npz`` format (encoded image files joined end to end, with offsets; its
  keys are in :func:`load_packed`'s docstring), written by :func:`pack` from an ImageDataset or any
  torchvision-style dataset;
- :func:`load_dataset`: CIFAR-10/100 by name, from a packed file (``--data`` / ``CONNLEARN_DATA``), a
  torchvision CIFAR folder, or a torchvision download; Mini-ImageNet from a packed file only (no download
  exists: :func:`read_image_folder` and :func:`pack`, or ``connlearn pack``, make one from its images);
- :func:`synthetic`: a small generated dataset for tests and smoke runs.

Two loaders yield ``(x float32 [B, 3, crop, crop], y int64 [B])`` batches on the target device with the
paper's CIFAR augmentation (per-pixel mean subtracted, 4-pixel zero padding, random crop, horizontal flip):

- :class:`BatchLoader`: the whole dataset as one uint8 tensor on the device, augmented per batch there, no
  workers (GPU-resident on CUDA; also the default on CPU since CIFAR fits in memory);
- :class:`DataLoaderPath`: the standard ``torch.utils.data.DataLoader`` path, augmenting per sample in workers.

Every random choice of epoch ``e`` (the order, every crop and flip) comes from ``(seed, e)`` alone, so
iterating an epoch twice, or after resuming from a checkpoint, gives the same batches bit for bit.
"""

from __future__ import annotations

import colorsys
import inspect
import io
import math
import os
import zipfile
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from connlearn.errors import (
    ConfigError,
    ConfigTypeError,
    DataError,
    check_bool,
    check_device,
    check_file_path,
    check_int,
    check_name,
    check_path,
)
from connlearn.files import expand_home, write_atomic
from connlearn.signals import start_workers, worker_init

DATA_ENV = "CONNLEARN_DATA"
#: The datasets :func:`load_dataset` reads into memory (ImageNet is read from its folders by
#: :mod:`connlearn.folders`).
DATASETS = ("cifar10", "cifar100", "miniimagenet")
#: Classes of each dataset the protocols know.
NUM_CLASSES = {"cifar10": 10, "cifar100": 100, "miniimagenet": 100, "imagenet": 1000}
#: How to make the packed Mini-ImageNet file (the paper's: 100 classes of 600 images, 500 to train and 100
#: to test, resized to 84x84).
PACK_MINIIMAGENET = ("connlearn pack FOLDER --size 84 --test-per-class 100 -o miniimagenet.npz (FOLDER holding "
                     "one folder of images per class)")
ENCODINGS = ("png", "jpeg")
LOADER_PATHS = ("auto", "dataloader")
DEFAULT_CACHE_DIR = Path("~/.cache/connlearn")

_PACKED_KEYS = ("train_jpeg", "train_offsets", "train_labels", "test_jpeg", "test_offsets", "test_labels")
_WHERE_TO_PUT_DATA = f"pass --data PATH (a packed .npz file or a folder holding one) or set {DATA_ENV}"


def _as_image_array(images: Any) -> np.ndarray:
    return np.ascontiguousarray(images)


def _as_label_array(labels: Any) -> np.ndarray:
    labels = np.asarray(labels)
    if np.issubdtype(labels.dtype, np.integer) and labels.dtype != np.int64:
        labels = labels.astype(np.int64)
    return labels


def _as_class_names(names: Any) -> tuple[str, ...]:
    if isinstance(names, str):
        raise ConfigTypeError(f"class_names must be a sequence of names, got the single string {names!r}")
    if not isinstance(names, (list, tuple, np.ndarray)):
        raise ConfigTypeError(f"class_names must be a sequence of names, got {names!r} ({type(names).__name__})")
    return tuple(str(n) for n in names)


class ClassBalanced:
    """Class-balanced subsets and hold-outs of a labelled dataset (``labels``, ``num_classes``, ``len()``),
    made by its ``_take(keep)`` (a boolean mask over its samples)."""

    labels: np.ndarray
    class_names: tuple[str, ...]

    if TYPE_CHECKING:  # what a subclass provides

        @property
        def num_classes(self) -> int: ...

        def __len__(self) -> int: ...

        def _take(self, keep: np.ndarray) -> Any: ...

    def subset(self, n: int, *, name: str = "n") -> Any:
        """A class-balanced subset: the first ``n // num_classes`` images of each class, in their original order.

        The subset has ``(n // num_classes) * num_classes`` images (n rounded down to a multiple of the
        number of classes).

        Raises:
            ConfigError: if ``n < num_classes`` or some class has fewer than ``n // num_classes`` images.
        """
        keep = self._rank_in_class(n, f"subset({name}={n})", name) < n // self.num_classes
        return self._take(keep)

    def split(self, n: int, *, name: str = "n") -> tuple[Any, Any]:
        """``(rest, held_out)``: a class-balanced hold-out of the LAST ``n // num_classes`` images of each
        class (e.g. a validation split of the training set), and the remaining images, both in order.
        ``name`` is what the messages call ``n`` (a caller's option)."""
        counts = np.bincount(self.labels, minlength=self.num_classes)
        from_end = counts[self.labels] - 1 - self._rank_in_class(n, f"split({name}={n})", name)
        held = from_end < n // self.num_classes
        if held.all():
            raise ConfigError(f"split({name}={n}) would hold out every one of the {len(self)} images; use "
                              f"{name} < {len(self)}")
        return self._take(~held), self._take(held)

    def _rank_in_class(self, n: int, what: str, name: str) -> np.ndarray:
        """Each image's position among the images of its class; checks that every class has n // C of them."""
        n = check_int(name, n, minimum=self.num_classes)
        per_class = n // self.num_classes
        counts = np.bincount(self.labels, minlength=self.num_classes)
        if counts.min() < per_class:
            short = int(counts.argmin())
            raise ConfigError(
                f"{what} needs {per_class} images of each class but class {short} ({self.class_names[short]!r}) "
                f"has only {counts[short]}; use {name} <= {counts.min() * self.num_classes}"
            )
        by_class = np.argsort(self.labels, kind="stable")
        first_of_class = np.concatenate([[0], np.cumsum(counts)[:-1]])
        rank_in_class = np.empty(len(self), dtype=np.int64)
        rank_in_class[by_class] = np.arange(len(self)) - first_of_class[self.labels[by_class]]
        return rank_in_class


@attrs.frozen(eq=False)
class ImageDataset(ClassBalanced):
    """Images and labels held in memory.

    Attributes:
        images: uint8 ``[N, H, W, 3]`` (HWC, RGB), C-contiguous; N >= 1.
        labels: int64 ``[N]``, each in ``0 .. num_classes - 1`` (other integer dtypes are converted).
        class_names: one name per class; ``num_classes = len(class_names)``.

    Raises:
        DataError: on construction, if a shape, dtype or label is not as above.
    """

    images: np.ndarray = attrs.field(converter=_as_image_array)
    labels: np.ndarray = attrs.field(converter=_as_label_array)
    class_names: tuple[str, ...] = attrs.field(converter=_as_class_names)

    def __attrs_post_init__(self) -> None:
        images, labels = self.images, self.labels
        if images.dtype != np.uint8 or images.ndim != 4 or images.shape[-1] != 3:
            raise DataError(
                f"images must be uint8 [N, H, W, 3] (HWC, RGB), got {images.dtype} {list(images.shape)}; "
                "convert them with np.asarray(pil_image.convert('RGB')) or tensor.permute(1, 2, 0)"
            )
        if images.shape[0] == 0 or images.shape[1] == 0 or images.shape[2] == 0:
            raise DataError(f"a dataset needs at least one non-empty image, got images {list(images.shape)}")
        if labels.dtype != np.int64 or labels.shape != images.shape[:1]:
            raise DataError(
                f"labels must be integers [N] with N = {images.shape[0]} (one per image), "
                f"got {labels.dtype} {list(labels.shape)}"
            )
        if not self.class_names:
            raise DataError("class_names is empty; give one name per class")
        low, high = int(labels.min()), int(labels.max())
        if low < 0 or high >= len(self.class_names):
            bad = low if low < 0 else high
            raise DataError(
                f"label {bad} is outside 0..{len(self.class_names) - 1} (one per class name); "
                "check the labels or give every class a name"
            )

    def __len__(self) -> int:
        return int(self.images.shape[0])

    def __repr__(self) -> str:
        height, width = self.image_size
        return f"ImageDataset({len(self)} images of {height}x{width}, {self.num_classes} classes)"

    @property
    def num_classes(self) -> int:
        """Number of classes, ``len(class_names)``."""
        return len(self.class_names)

    @property
    def image_size(self) -> tuple[int, int]:
        """``(H, W)`` of every image."""
        return int(self.images.shape[1]), int(self.images.shape[2])

    def _take(self, keep: np.ndarray) -> ImageDataset:
        return ImageDataset(self.images[keep], self.labels[keep], self.class_names)

def pixel_mean(dataset: ImageDataset) -> torch.Tensor:
    """The per-pixel mean image of ``dataset``: float32 ``[3, H, W]`` in [0, 1] (pixel values / 255)."""
    if not isinstance(dataset, ImageDataset):
        raise ConfigTypeError(f"pixel_mean takes an ImageDataset, got {type(dataset).__name__}; convert it with "
                              "as_image_dataset()")
    mean_hwc = dataset.images.mean(axis=0, dtype=np.float64) / 255.0
    return torch.from_numpy(np.ascontiguousarray(mean_hwc.transpose(2, 0, 1), dtype=np.float32))


# --------------------------------------------------------------------------------------------------------------
# The packed file format
# --------------------------------------------------------------------------------------------------------------


def _worker_count() -> int:
    return max(1, min(8, os.cpu_count() or 1))


def _run_in_chunks(count: int, work: Callable[[int, int], None]) -> None:
    """Call ``work(lo, hi)`` over ``range(count)`` split in chunks across a thread pool (Pillow releases the GIL
    while it decodes and encodes)."""
    workers = _worker_count()
    chunks = min(count, workers * 4)
    bounds = [count * k // chunks for k in range(chunks + 1)]
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(work, bounds[:-1], bounds[1:]))


def _decode_jpeg_fast(buffer: bytes, offsets: list[int]) -> np.ndarray | None:
    """All images of a JPEG split decoded by torchvision's batched decoder (the same libjpeg-turbo pixels as
    Pillow, several times faster on small images, without the GIL); ``None`` if anything is off, so that the
    Pillow path decodes and reports the faulty image."""
    try:
        from torchvision.io import ImageReadMode, decode_jpeg
    except ImportError:
        return None
    data = torch.frombuffer(bytearray(buffer), dtype=torch.uint8)
    shapes: list[tuple[int, ...]] = []
    images: list[tuple[int, list[torch.Tensor]]] = []  # (first index, decoded [3, H, W] images) per chunk

    def decode_range(lo: int, hi: int) -> None:
        decoded = decode_jpeg([data[offsets[i] : offsets[i + 1]] for i in range(lo, hi)], mode=ImageReadMode.RGB)
        shapes.extend({tuple(t.shape) for t in decoded})
        images.append((lo, decoded))

    try:
        _run_in_chunks(len(offsets) - 1, decode_range)
    except RuntimeError:
        return None
    if len(set(shapes)) != 1:
        return None
    c, h, w = shapes[0]
    out = np.empty((len(offsets) - 1, h, w, c), dtype=np.uint8)
    for lo, decoded in images:
        out[lo : lo + len(decoded)] = torch.stack(decoded).permute(0, 2, 3, 1).numpy()
    return out


def _decode_split(buffer: bytes, offsets: list[int], encoding: str, where: str) -> np.ndarray:
    if encoding == "jpeg":
        fast = _decode_jpeg_fast(buffer, offsets)
        if fast is not None:
            return fast
    pillow_format = encoding.upper()

    def decode(i: int) -> np.ndarray:
        try:
            with Image.open(io.BytesIO(buffer[offsets[i] : offsets[i + 1]]), formats=(pillow_format,)) as image:
                return np.asarray(image if image.mode == "RGB" else image.convert("RGB"))
        except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
            raise DataError(f"{where}: image {i} is not a readable {encoding.upper()} file ({exc})") from exc

    first = decode(0)
    images = np.empty((len(offsets) - 1, *first.shape), dtype=np.uint8)

    def decode_range(lo: int, hi: int) -> None:
        for i in range(lo, hi):
            image = decode(i)
            if image.shape != first.shape:
                raise DataError(
                    f"{where}: image {i} is {image.shape[1]}x{image.shape[0]} but image 0 is "
                    f"{first.shape[1]}x{first.shape[0]}; all images of a split must have one size"
                )
            images[i] = image

    _run_in_chunks(len(images), decode_range)
    return images


def _read_split(archive: Any, split: str, class_names: tuple[str, ...], encoding: str, path: Path) -> ImageDataset:
    where = f"{path} ({split} split)"
    buffer, offsets, labels = (archive[f"{split}_{key}"] for key in ("jpeg", "offsets", "labels"))
    if labels.ndim != 1:
        raise DataError(f"{where}: {split}_labels must be a 1-D array of class indices, got {labels.dtype} "
                        f"{list(labels.shape)}")
    if buffer.dtype != np.uint8 or buffer.ndim != 1:
        raise DataError(f"{where}: {split}_jpeg must be a 1-D uint8 byte buffer, got {buffer.dtype} {buffer.shape}")
    if not np.issubdtype(offsets.dtype, np.integer) or offsets.ndim != 1 or len(offsets) != len(labels) + 1:
        raise DataError(
            f"{where}: {split}_offsets must be N+1 = {len(labels) + 1} integers (N = number of labels), "
            f"got {offsets.dtype} {list(offsets.shape)}"
        )
    if len(labels) == 0:
        raise DataError(f"{where}: the split holds no images")
    if offsets[0] != 0 or offsets[-1] != len(buffer) or np.any(np.diff(offsets) <= 0):
        raise DataError(
            f"{where}: {split}_offsets must rise strictly from 0 to the buffer length {len(buffer)}, "
            f"got {offsets[0]} .. {offsets[-1]}; the file is damaged, re-create it with connlearn.data.pack"
        )
    images = _decode_split(buffer.tobytes(), offsets.tolist(), encoding, where)
    try:
        return ImageDataset(images, labels, class_names)
    except DataError as exc:
        raise DataError(f"{where}: {exc}") from exc


def load_packed(path: str | os.PathLike[str]) -> tuple[ImageDataset, ImageDataset]:
    """Load ``(train, test)`` from a packed ``.npz`` file (the format :func:`pack` writes).

    Keys: ``{split}_jpeg`` (uint8, the encoded image files joined end to end), ``{split}_offsets`` (N+1
    integers: image ``i`` is ``buf[off[i]:off[i+1]]``), ``{split}_labels`` (int64 ``[N]``) for ``split`` in
    train/test, ``class_names``, and optionally ``encoding`` (``"png"`` or ``"jpeg"``; JPEG when absent).
    Images are decoded with Pillow on a thread pool, to uint8 ``[N, H, W, 3]``.

    Raises:
        DataError: the file is missing, not a packed dataset, truncated or corrupt, lacks keys, or has bad
            offsets, labels or images; the message says which.
    """
    path = check_path("path", path)
    if not path.is_file():
        raise DataError(f"dataset file {path} does not exist; {_WHERE_TO_PUT_DATA}")
    with path.open("rb") as f:
        head = f.read(6)
    if head[:2] != b"PK" and head != b"\x93NUMPY":  # an .npz is a zip archive; a lone array an .npy
        raise DataError(f"{path} is not a packed dataset (an .npz archive written by connlearn pack); "
                        f"{_WHERE_TO_PUT_DATA}")
    try:
        archive = np.load(path, allow_pickle=False)
        if not isinstance(archive, np.lib.npyio.NpzFile):
            raise DataError(f"{path} holds one array, not a packed dataset (an .npz with {', '.join(_PACKED_KEYS)})")
        with archive:
            missing = [key for key in (*_PACKED_KEYS, "class_names") if key not in archive.files]
            if missing:
                raise DataError(
                    f"{path} is not a packed dataset: it lacks the keys {', '.join(missing)} "
                    f"(it has {', '.join(archive.files) or 'none'}); write it with connlearn.data.pack"
                )
            encoding = str(archive["encoding"]) if "encoding" in archive.files else "jpeg"
            if encoding not in ENCODINGS:
                raise DataError(f"{path}: unknown image encoding {encoding!r}; known: {', '.join(ENCODINGS)}")
            class_names = tuple(str(n) for n in np.atleast_1d(archive["class_names"]))
            train = _read_split(archive, "train", class_names, encoding, path)
            test = _read_split(archive, "test", class_names, encoding, path)
    except DataError:
        raise
    except (zipfile.BadZipFile, EOFError, OSError, ValueError) as exc:
        raise DataError(
            f"{path} is truncated or corrupt ({type(exc).__name__}: {exc}); copy or re-create the file"
        ) from exc
    return train, test


def _to_hwc_uint8(image: Any, where: str) -> np.ndarray:
    """One image (PIL image, or uint8/float array or tensor, HWC or CHW or HW) as uint8 ``[H, W, 3]``."""
    if isinstance(image, Image.Image):
        return np.asarray(image if image.mode == "RGB" else image.convert("RGB"))
    channels_first = isinstance(image, torch.Tensor)
    array = image.detach().cpu().numpy() if channels_first else np.asarray(image)
    if array.ndim == 2:
        array = np.repeat(array[:, :, None], 3, axis=2)
    elif array.ndim == 3 and array.shape[0] == 3 and (channels_first or array.shape[2] != 3):
        array = array.transpose(1, 2, 0)
    if array.ndim != 3 or array.shape[2] != 3:
        raise DataError(f"{where}: expected an RGB image (HWC or CHW), got shape {list(array.shape)}")
    if np.issubdtype(array.dtype, np.floating):
        if array.min() < 0 or array.max() > 1:
            raise DataError(
                f"{where}: float images must hold values in [0, 1] (as ToTensor gives), got "
                f"{array.min():.3g}..{array.max():.3g}; drop the Normalize transform"
            )
        array = np.rint(array * 255.0)
    elif array.dtype != np.uint8:
        raise DataError(f"{where}: images must be uint8 or float in [0, 1], got {array.dtype}")
    return np.ascontiguousarray(array, dtype=np.uint8)


def _class_names_of(dataset: Any) -> tuple[str, ...] | None:
    names = getattr(dataset, "class_names", None) or getattr(dataset, "classes", None)
    return None if names is None else tuple(str(n) for n in names)


def as_image_dataset(dataset: Any, class_names: Sequence[str] | None = None) -> ImageDataset:
    """``dataset`` as an :class:`ImageDataset`.

    ``dataset`` is an ImageDataset (returned as is, unless ``class_names`` renames its classes) or anything with
    ``__len__`` and ``__getitem__`` returning ``(image, label)``: an image is a PIL image, or an array or tensor
    (HWC or CHW) of uint8, or of floats in [0, 1] as ``ToTensor`` gives; e.g. ``torchvision.datasets.CIFAR10``
    or ``ImageFolder`` (all images of one size).
    ``class_names`` defaults to the dataset's ``class_names`` or ``classes``.

    Raises:
        ConfigError: no class names given or found.
        DataError: an image or label cannot be converted, or images differ in size.
    """
    if isinstance(dataset, ImageDataset):
        return dataset if class_names is None else ImageDataset(dataset.images, dataset.labels, class_names)
    if class_names is None:
        class_names = _class_names_of(dataset)
        if class_names is None:
            raise ConfigError(
                f"{type(dataset).__name__} has no .classes; pass class_names=[...] with one name per class"
            )
    data, targets = getattr(dataset, "data", None), getattr(dataset, "targets", None)
    is_cifar_layout = isinstance(data, np.ndarray) and data.dtype == np.uint8 and data.ndim == 4
    untransformed = getattr(dataset, "transform", None) is None and getattr(dataset, "target_transform", None) is None
    if is_cifar_layout and targets is not None and untransformed:
        return ImageDataset(data, np.asarray(targets), class_names)
    if not hasattr(dataset, "__len__") or not hasattr(dataset, "__getitem__"):
        raise ConfigTypeError(
            f"expected an ImageDataset or an indexable dataset of (image, label) pairs, got {type(dataset).__name__}"
        )
    samples = [dataset[i] for i in range(len(dataset))]
    images = [_to_hwc_uint8(image, f"{type(dataset).__name__}[{i}]") for i, (image, _) in enumerate(samples)]
    for i, image in enumerate(images):
        if image.shape != images[0].shape:
            raise DataError(
                f"{type(dataset).__name__}[{i}] is {image.shape[1]}x{image.shape[0]} but item 0 is "
                f"{images[0].shape[1]}x{images[0].shape[0]}; resize all images to one size (e.g. transform=Resize)"
            )
    labels = np.asarray([int(label) for _, label in samples], dtype=np.int64)
    return ImageDataset(np.stack(images), labels, class_names)


def read_image_folder(folder: str | os.PathLike[str], size: int | None = None) -> ImageDataset:
    """The images of ``folder`` (one subfolder of images per class, listed as
    :func:`connlearn.folders.image_files` lists them), decoded into an :class:`ImageDataset`. ``size``
    resizes every image to ``size x size`` (bilinear, antialiased); without it all images must share one
    size, which is checked from the files' headers before anything is decoded.

    Raises:
        DataError: ``folder`` is not a folder of class folders holding images, an image cannot be read, or
            (without ``size``) the images differ in size.
    """
    from connlearn.folders import _BILINEAR, header_size, image_files, open_rgb

    files = image_files(folder)
    size = None if size is None else check_int("size", size, minimum=1)
    if size is None:
        first = header_size(files.paths[0])
        for path in files.paths[1:]:
            if (found := header_size(path)) != first:
                raise DataError(f"{path} is {found[0]}x{found[1]} but {files.paths[0]} is {first[0]}x{first[1]}; "
                                "give size (--size on the command line) to resize them all to one")

    def decode(path: str) -> np.ndarray:
        image = open_rgb(path)
        return np.asarray(image if size is None else image.resize((size, size), _BILINEAR))

    with ThreadPoolExecutor(_worker_count()) as pool:  # decoding and resizing release the GIL
        arrays = list(pool.map(decode, files.paths))
    return ImageDataset(np.stack(arrays), files.labels, files.class_names)


def _encode_split(images: np.ndarray, encoding: str, quality: int) -> tuple[np.ndarray, np.ndarray]:
    files: list[bytes] = [b""] * len(images)
    # full-resolution colour (4:4:4): halving the chroma of 32-pixel images triples the error at quality 95
    options = {"format": "PNG"} if encoding == "png" else {"format": "JPEG", "quality": quality, "subsampling": 0}

    def encode_range(lo: int, hi: int) -> None:
        for i in range(lo, hi):
            out = io.BytesIO()
            Image.fromarray(images[i], "RGB").save(out, **options)
            files[i] = out.getvalue()

    _run_in_chunks(len(images), encode_range)
    offsets = np.zeros(len(files) + 1, dtype=np.int64)
    np.cumsum([len(f) for f in files], out=offsets[1:])
    return np.frombuffer(b"".join(files), dtype=np.uint8), offsets


def pack(
    path: str | os.PathLike[str],
    train: Any,
    test: Any,
    class_names: Sequence[str] | None = None,
    quality: int = 95,
    format: str = "png",
) -> Path:
    """Write ``train`` and ``test`` to a packed ``.npz`` file that :func:`load_packed` reads; returns its path.

    Args:
        path: the file to write (written to a temporary file in the same folder, then renamed over ``path``).
        train, test: each an :class:`ImageDataset` or a torchvision-style dataset (see :func:`as_image_dataset`).
        class_names: defaults to the train set's ``class_names`` or ``classes``.
        quality: JPEG quality 1..100 (``format="jpeg"`` only).
        format: ``"png"`` (lossless: load_packed gives back the exact pixels; adds the key ``encoding="png"``)
            or ``"jpeg"`` (lossy, smaller, full-resolution colour; the format of the shared CIFAR-10 file, without
            an ``encoding`` key).
    """
    path = check_file_path("path", path, "data.npz")
    check_name("image format", format, ENCODINGS)
    quality = check_int("quality", quality, minimum=1, maximum=100)
    train = as_image_dataset(train, class_names)
    test_names = _class_names_of(test)
    if class_names is None and test_names is not None and test_names != train.class_names:
        raise DataError(
            f"train and test name their classes differently ({list(train.class_names)} vs {list(test_names)}); "
            "pass class_names=[...] to use one list for both"
        )
    test = as_image_dataset(test, train.class_names)
    arrays: dict[str, Any] = {}  # Any: np.savez(out, **arrays) also takes allow_pickle as a keyword
    for split, dataset in (("train", train), ("test", test)):
        arrays[f"{split}_jpeg"], arrays[f"{split}_offsets"] = _encode_split(dataset.images, format, quality)
        arrays[f"{split}_labels"] = dataset.labels
    arrays["class_names"] = np.array(train.class_names, dtype=str)
    if format == "png":
        arrays["encoding"] = np.array("png")
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, lambda f: np.savez(f, **arrays))
    return path


# --------------------------------------------------------------------------------------------------------------
# Generated and named datasets
# --------------------------------------------------------------------------------------------------------------


def _synthetic_split(num_classes: int, n: int, size: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    labels = np.arange(n, dtype=np.int64) % num_classes
    colours = np.array([colorsys.hsv_to_rgb(c / num_classes, 0.8, 0.9) for c in range(num_classes)]) * 255
    grid = math.ceil(math.sqrt(num_classes))
    cells = np.stack([np.arange(num_classes) // grid, np.arange(num_classes) % grid], axis=1)
    centres = (cells[labels] + 0.5) * size / grid + rng.uniform(-size / 16, size / 16, (n, 2))
    radius = max(size / (2 * grid), 2.0)
    rows, cols = np.mgrid[0:size, 0:size]
    blob = (rows - centres[:, 0, None, None]) ** 2 + (cols - centres[:, 1, None, None]) ** 2 <= radius**2
    background = rng.uniform(40, 215, (n, 1, 1, 1)) * np.ones(3)
    brightness = rng.uniform(0.8, 1.2, (n, 1, 1, 1))
    images = np.where(blob[..., None], colours[labels][:, None, None, :] * brightness, background)
    images += rng.normal(0.0, 16.0, images.shape)
    return np.clip(np.rint(images), 0, 255).astype(np.uint8), labels


def synthetic(
    num_classes: int = 10, n_train: int = 500, n_test: int = 200, size: int = 32, seed: int = 0
) -> tuple[ImageDataset, ImageDataset]:
    """A small generated ``(train, test)`` pair that a small CNN learns in a few epochs.

    Class ``c`` is a disc of its own colour (hue ``c / num_classes``) at its own position on a grid, jittered,
    on a grey background of random level, plus Gaussian noise. Labels cycle ``0, 1, .., num_classes - 1`` so
    every prefix of ``k * num_classes`` images is class-balanced. Class names are ``"class0"``, ``"class1"``, ...
    The same arguments give the same pixels.

    Returns:
        train with ``n_train`` and test with ``n_test`` images, uint8 ``[N, size, size, 3]``.
    """
    num_classes = check_int("num_classes", num_classes, minimum=1)
    n_train = check_int("n_train", n_train, minimum=1)
    n_test = check_int("n_test", n_test, minimum=1)
    size = check_int("size", size, minimum=4)
    seed = check_int("seed", seed, minimum=0)
    names = tuple(f"class{c}" for c in range(num_classes))
    splits = []
    for split_index, n in enumerate((n_train, n_test)):
        rng = np.random.default_rng([seed, split_index])
        splits.append(ImageDataset(*_synthetic_split(num_classes, n, size, rng), names))
    return splits[0], splits[1]


def _packed_file_in(name: str, location: Path, source: str) -> Path | None:
    if not location.exists():
        raise DataError(f"{source} {location} does not exist; give an existing .npz file or folder")
    if location.is_file():
        return location
    for file_name in (f"{name}_jpeg.npz", f"{name}.npz"):
        if (location / file_name).is_file():
            return location / file_name
    return None


def data_location(data: str | os.PathLike[str] | None) -> tuple[Path, str] | None:
    """Where the data is: ``(data, "data path")`` when given, else ``($CONNLEARN_DATA, "CONNLEARN_DATA")``
    when set (``~`` expanded), else None."""
    if data is not None:
        return check_path("data", data), "data path"
    from_env = os.environ.get(DATA_ENV)
    if from_env:
        return expand_home(from_env), DATA_ENV
    return None


def find_data(name: str, data: str | os.PathLike[str] | None = None) -> Path | None:
    """The packed ``.npz`` file of dataset ``name``, or None.

    ``data`` (the ``--data`` flag) is a packed file, or a folder holding ``{name}_jpeg.npz`` or ``{name}.npz``.
    Without ``data``, the ``CONNLEARN_DATA`` environment variable is read by the same rules. An explicit
    ``data`` is never combined with ``CONNLEARN_DATA``: a folder without a packed file gives None.

    Raises:
        DataError: ``data`` (or ``CONNLEARN_DATA``) names a path that does not exist.
    """
    location = data_location(data)
    if location is None:
        return None
    return _packed_file_in(name, *location)


def _from_torchvision(cifar: Any) -> ImageDataset:
    return ImageDataset(np.asarray(cifar.data), np.asarray(cifar.targets), tuple(cifar.classes))


def load_dataset(
    name: str,
    data: str | os.PathLike[str] | None = None,
    download: bool = True,
    cache_dir: str | os.PathLike[str] | None = None,
) -> tuple[ImageDataset, ImageDataset]:
    """``(train, test)`` of ``"cifar10"``, ``"cifar100"`` or ``"miniimagenet"``, from the first source that has it.

    1. the packed file that :func:`find_data` finds from ``data`` or ``CONNLEARN_DATA``;
    2. a torchvision CIFAR folder at that location (holding ``cifar-10-batches-py`` / ``cifar-100-python``);
    3. torchvision's CIFAR class with ``root = cache_dir`` (default ``~/.cache/connlearn``), downloading the
       files there when ``download`` and they are absent.

    Mini-ImageNet has no download: only 1. finds it (see :data:`PACK_MINIIMAGENET` for making the file).

    Raises:
        UnknownNameError: an unknown ``name``.
        DataError: nothing found and the download failed or was not allowed (one line naming ``--data`` and
            ``CONNLEARN_DATA``), or the file found is damaged or has the wrong number of classes.
    """
    check_name("dataset", name, DATASETS)
    num_classes = NUM_CLASSES[name]
    location = data_location(data)
    packed = None if location is None else _packed_file_in(name, *location)  # what find_data finds
    if packed is not None:
        train, test = load_packed(packed)
        if train.num_classes != num_classes:
            raise DataError(
                f"{packed} has {train.num_classes} classes but {name} has {num_classes}; "
                f"point --data or {DATA_ENV} at the {name} file"
            )
        return train, test
    if name == "miniimagenet":
        where = "" if location is None else f" in {location[0]}"
        raise DataError(f"no packed miniimagenet file found{where}: make one with {PACK_MINIIMAGENET}, then pass "
                        f"--data miniimagenet.npz or set {DATA_ENV}")

    import torchvision.datasets

    cifar_class = getattr(torchvision.datasets, "CIFAR10" if name == "cifar10" else "CIFAR100")
    if location is not None:
        folder = location[0]
        for root in (folder, folder.parent):
            if (root / cifar_class.base_folder).is_dir():
                try:
                    splits = [cifar_class(root=str(root), train=is_train, download=False) for is_train in (True, False)]
                except Exception as exc:
                    raise DataError(f"the torchvision {name} folder in {root} is unreadable ({exc})") from exc
                return _from_torchvision(splits[0]), _from_torchvision(splits[1])

    root = expand_home(cache_dir if cache_dir is not None else DEFAULT_CACHE_DIR)
    try:
        splits = [cifar_class(root=str(root), train=is_train, download=download) for is_train in (True, False)]
    except Exception as exc:  # torchvision raises URLError, RuntimeError, OSError, ... when it cannot download
        reason = " ".join(str(exc).split()) or type(exc).__name__
        tried = f"the download into {root} failed" if download else f"{root} holds none (download=False)"
        looked = ("" if location is None else f"{location[1]} {location[0]} holds no {name}_jpeg.npz, {name}.npz or "
                  f"torchvision {cifar_class.base_folder} folder, and ")
        raise DataError(
            f"no {name} data found: {looked}{tried} ({reason}). Pass --data PATH (a packed .npz file, or a folder "
            f"holding one or the torchvision CIFAR files) or set {DATA_ENV}; on a machine with internet, "
            f"'connlearn pack {name} -o {name}.npz' downloads and packs it into one file to copy here"
        ) from None
    return _from_torchvision(splits[0]), _from_torchvision(splits[1])


# --------------------------------------------------------------------------------------------------------------
# Loaders
# --------------------------------------------------------------------------------------------------------------


#: The largest seed of the data order and augmentation: :func:`epoch_generator` seeds torch's generator with
#: ``seed * 1_000_003 + epoch``, which must stay below 2**64.
MAX_SEED = 2**40


def epoch_generator(seed: int, epoch: int) -> torch.Generator:
    """The CPU generator behind every random choice of ``epoch`` (a function of ``(seed, epoch)`` only)."""
    return torch.Generator().manual_seed(seed * 1_000_003 + epoch)


@attrs.frozen(eq=False)
class EpochPlan:
    """What one rank reads in one epoch, in order: CPU tensors ``[num_samples]``.

    Attributes:
        indices: int64 dataset rows.
        offsets: int64 ``[num_samples, 2]`` top-left corner (row, column) of each crop in the padded image.
        flips: bool, whether each sample is flipped left-right.
    """

    indices: torch.Tensor
    offsets: torch.Tensor
    flips: torch.Tensor


class ShardedBatches:
    """What every loader shares: batch size, train/eval defaults, the device, the seed, the DDP split of
    ``count`` samples and ``len()`` in batches. Subclasses call :meth:`_batching` first in their
    ``__init__``.

    In DDP, rank ``r`` reads positions ``r, r + world_size, ...`` of every epoch's order. For training every
    rank reads ``count // world_size`` of them (the remainder is dropped), since DDP needs as many steps on
    every rank. For evaluation (``train=False``) the ranks read every sample between them, one more on
    the first ``count % world_size`` ranks, so that metrics summed over ranks cover the whole set."""

    def _batching(self, count: int, batch_size: int, *, train: bool, device: str | torch.device, seed: int,
                  drop_last: bool | None, shuffle: bool | None, rank: int, world_size: int,
                  channels_last: bool) -> None:
        self.batch_size = check_int("batch_size", batch_size, minimum=1)
        self.train = bool(train)
        self.device = check_device(device)
        self.seed = check_int("seed", seed, minimum=0, maximum=MAX_SEED)
        self.drop_last = self.train if drop_last is None else check_bool("drop_last", drop_last)
        self.shuffle = self.train if shuffle is None else check_bool("shuffle", shuffle)
        self.world_size = check_int("world_size", world_size, minimum=1)
        self.rank = check_int("rank", rank, minimum=0, maximum=self.world_size - 1)
        self.channels_last = check_bool("channels_last", channels_last)
        self.count = count
        self.num_samples = count // self.world_size if self.train else len(range(self.rank, count, self.world_size))
        if self.num_samples == 0 or (self.drop_last and self.num_samples < self.batch_size):
            raise ConfigError(
                f"each of {self.world_size} rank(s) gets {self.num_samples} of the {count} images, fewer than "
                f"one batch of {self.batch_size}{' (drop_last=True)' if self.drop_last else ''}; "
                "use a smaller batch_size or more data"
            )

    def __len__(self) -> int:
        """Batches per epoch on this rank."""
        if self.drop_last:
            return self.num_samples // self.batch_size
        return math.ceil(self.num_samples / self.batch_size)

    def _order(self, count: int, generator: torch.Generator) -> torch.Tensor:
        """The epoch's order of all ``count`` samples (one draw from ``generator``, the same on every rank)."""
        return torch.randperm(count, generator=generator) if self.shuffle else torch.arange(count)

    def _positions(self) -> torch.Tensor:
        """This rank's ``num_samples`` positions in an epoch's order: ``rank, rank + world_size, ...``."""
        return torch.arange(self.rank, self.count, self.world_size)[: self.num_samples]

    def _first_batch(self, start: int) -> int:
        """``start``, the batch an epoch begins at (a resume within it), checked: ``0 .. len(self)``."""
        return check_int("start (the batch of the epoch to begin at)", start, minimum=0, maximum=len(self))

    def _finish(self, x: torch.Tensor) -> torch.Tensor:
        return x.contiguous(memory_format=torch.channels_last if self.channels_last else torch.contiguous_format)


class _EpochLoader(ShardedBatches):
    """Arguments, checks and the per-epoch plan shared by :class:`BatchLoader` and :class:`DataLoaderPath`."""

    def __init__(
        self,
        dataset: ImageDataset,
        batch_size: int,
        *,
        train: bool,
        device: str | torch.device = "cpu",
        seed: int = 0,
        mean: torch.Tensor | None = None,
        drop_last: bool | None = None,
        shuffle: bool | None = None,
        rank: int = 0,
        world_size: int = 1,
        channels_last: bool = False,
        pad: int = 4,
        crop: int | None = None,
    ) -> None:
        if not isinstance(dataset, ImageDataset):
            raise ConfigTypeError(
                f"dataset must be an ImageDataset, got {type(dataset).__name__}; convert it with as_image_dataset()"
            )
        self.dataset = dataset
        self._batching(len(dataset), batch_size, train=train, device=device, seed=seed, drop_last=drop_last,
                       shuffle=shuffle, rank=rank, world_size=world_size, channels_last=channels_last)
        height, width = dataset.image_size
        self.pad = check_int("pad", pad, minimum=0) if self.train else 0
        largest_crop = min(height, width) + 2 * self.pad
        self.crop = largest_crop - 2 * self.pad if crop is None else check_int("crop", crop, minimum=1)
        if self.crop > largest_crop:
            raise ConfigError(
                f"crop {self.crop} is larger than the {'padded ' if self.pad else ''}images "
                f"({height}x{width}{f' + {self.pad} padding' if self.pad else ''}); use crop <= {largest_crop}"
            )
        self.mean = self._check_mean(pixel_mean(dataset) if mean is None else mean)

    def _check_mean(self, mean: Any) -> torch.Tensor:
        height, width = self.dataset.image_size
        try:
            mean = torch.as_tensor(mean, dtype=torch.float32).cpu()
        except (TypeError, ValueError, RuntimeError):
            raise ConfigTypeError(f"mean must be a tensor or array of numbers (e.g. pixel_mean(train_set)), got "
                                  f"{mean!r}") from None
        try:
            return mean.expand(3, height, width)
        except RuntimeError:
            raise ConfigError(
                f"mean must broadcast to [3, {height}, {width}] (the images' [3, H, W]), got {list(mean.shape)}; "
                "pass pixel_mean(train_set)"
            ) from None

    def plan(self, epoch: int) -> EpochPlan:
        """The samples, crops and flips of ``epoch`` on this rank, drawn from ``epoch_generator(seed, epoch)``.

        The order and the augmentation are drawn for the whole dataset, so every rank sees the same draws;
        rank ``r`` takes positions ``r, r + world_size, ...`` (see :class:`ShardedBatches`).
        """
        epoch = check_int("epoch", epoch, minimum=0)
        count = len(self.dataset)
        generator = epoch_generator(self.seed, epoch)
        order = self._order(count, generator)
        height, width = self.dataset.image_size
        if self.train:
            tops = torch.randint(0, height + 2 * self.pad - self.crop + 1, (count,), generator=generator)
            lefts = torch.randint(0, width + 2 * self.pad - self.crop + 1, (count,), generator=generator)
            offsets = torch.stack([tops, lefts], dim=1)
            flips = torch.rand(count, generator=generator) < 0.5
        else:
            centre = torch.tensor([(height - self.crop) // 2, (width - self.crop) // 2])
            offsets = centre.expand(count, 2)
            flips = torch.zeros(count, dtype=torch.bool)
        positions = self._positions()
        return EpochPlan(order[positions], offsets[positions].contiguous(), flips[positions])

    def _batch_bounds(self, first: int = 0) -> Iterator[tuple[int, int]]:
        for start in range(first * self.batch_size, len(self) * self.batch_size, self.batch_size):
            yield start, min(start + self.batch_size, self.num_samples)


class BatchLoader(_EpochLoader):
    """In-memory loader: the uint8 images held as one tensor on ``device``, augmented per batch there, no workers.

    On CUDA this is the GPU-resident path; it is also the default on CPU (CIFAR fits in memory). Training
    batches get the paper's CIFAR augmentation: the per-pixel mean is subtracted (``x / 255 - mean``), the
    image is zero-padded by ``pad`` on each side (zero after the mean subtraction, as in the original ResNet
    recipe), a random ``crop x crop`` window is cut and flipped left-right with probability 1/2, all vectorised
    over the batch. Evaluation batches (``train=False``) are only mean-subtracted and, when ``crop`` is smaller
    than the images (Mini-ImageNet: 84 -> 64), centre-cropped; they come in dataset order.

    Args:
        dataset: the images.
        batch_size: samples per batch on this rank.
        train: augment, shuffle and drop the last partial batch (unless ``shuffle``/``drop_last`` say otherwise).
        device: where the images live and the batches are made.
        seed: with the epoch number, the seed of every random choice (see :meth:`plan`).
        mean: float ``[3, H, W]`` (or broadcastable, e.g. ``[3, 1, 1]``) in [0, 1]; defaults to
            ``pixel_mean(dataset)``. Pass the train set's mean to the test loader.
        drop_last: drop the last partial batch; default ``train``.
        shuffle: visit the samples in a new random order each epoch; default ``train``.
        rank, world_size: DDP: all ranks share one order and rank ``r`` takes every ``world_size``-th sample,
            ``len(dataset) // world_size`` samples each in training; in evaluation they read every sample
            between them (see :class:`ShardedBatches`).
        channels_last: return batches in channels-last memory format.
        pad: zero padding on each side before the random crop (training only).
        crop: side of the square crop; default the image size.
    """

    def __init__(self, dataset: ImageDataset, batch_size: int, *, train: bool, **options: Any) -> None:
        super().__init__(dataset, batch_size, train=train, **options)
        images = dataset.images if dataset.images.flags.writeable else dataset.images.copy()
        self._images = torch.from_numpy(images).to(self.device)
        self._labels = torch.from_numpy(dataset.labels).to(self.device)
        self._mean = self.mean.to(self.device)

    def epoch(self, epoch: int, start: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The batches of ``epoch``: ``(x float32 [B, 3, crop, crop], y int64 [B])`` on ``device``; from its
        batch number ``start`` on (a resume within the epoch), without making the ones before.

        The same ``epoch`` gives the same batches every time, whatever was iterated before.
        """
        first = self._first_batch(start)
        plan = self.plan(epoch)
        return self._batches(plan.indices.to(self.device), plan.offsets.to(self.device), plan.flips.to(self.device),
                             first)

    def _batches(
        self, indices: torch.Tensor, offsets: torch.Tensor, flips: torch.Tensor, first: int
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        window = torch.arange(self.crop, device=self.device)
        channels = torch.arange(3, device=self.device)[None, :, None, None]
        for start, stop in self._batch_bounds(first):
            rows = indices[start:stop]
            x = self._images[rows].permute(0, 3, 1, 2).to(torch.float32).div_(255.0).sub_(self._mean)
            if self.pad:
                x = F.pad(x, (self.pad, self.pad, self.pad, self.pad))
            top, left, flip = offsets[start:stop, 0, None], offsets[start:stop, 1, None], flips[start:stop, None]
            ys = top + window
            xs = left + torch.where(flip, self.crop - 1 - window, window)
            batch = torch.arange(len(rows), device=self.device)[:, None, None, None]
            x = x[batch, channels, ys[:, None, :, None], xs[:, None, None, :]]
            yield self._finish(x), self._labels[rows]


class _AugmentedImages(torch.utils.data.Dataset):
    """Samples keyed by ``(epoch, index)``; the crop and flip of a sample come from ``(seed, epoch, index)``."""

    def __init__(self, loader: DataLoaderPath) -> None:
        self.images = loader.dataset.images
        self.labels = loader.dataset.labels
        self.mean = loader.mean.contiguous()
        self.train, self.pad, self.crop, self.seed = loader.train, loader.pad, loader.crop, loader.seed

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, key: tuple[int, int]) -> tuple[torch.Tensor, int]:
        epoch, index = key
        height, width = self.images.shape[1:3]
        x = torch.from_numpy(self.images[index]).permute(2, 0, 1).to(torch.float32).div_(255.0).sub_(self.mean)
        if self.train:
            rng = np.random.default_rng([self.seed, epoch, index])
            top = int(rng.integers(0, height + 2 * self.pad - self.crop + 1))
            left = int(rng.integers(0, width + 2 * self.pad - self.crop + 1))
            x = F.pad(x, (self.pad, self.pad, self.pad, self.pad))[:, top : top + self.crop, left : left + self.crop]
            if rng.random() < 0.5:
                x = x.flip(2)
        else:
            top, left = (height - self.crop) // 2, (width - self.crop) // 2
            x = x[:, top : top + self.crop, left : left + self.crop]
        return x.contiguous(), int(self.labels[index])


class DataLoaderPath(_EpochLoader):
    """The standard ``torch.utils.data.DataLoader`` path, for comparison and for data that does not fit on the device.

    Same arguments, length and :meth:`epoch` as :class:`BatchLoader`, plus ``num_workers`` and ``pin_memory``.
    Samples come in the same order as BatchLoader's; the augmentation (same kind) is applied per sample on the
    CPU in the workers, its random crop and flip drawn from ``(seed, epoch, index)``, so the batches depend
    on ``(seed, epoch)`` only, not on the number of workers or their scheduling (they differ from
    BatchLoader's). Batches are moved to ``device`` (non-blocking when pinned).
    """

    def __init__(
        self,
        dataset: ImageDataset,
        batch_size: int,
        *,
        train: bool,
        num_workers: int = 2,
        pin_memory: bool = False,
        **options: Any,
    ) -> None:
        super().__init__(dataset, batch_size, train=train, **options)
        self.num_workers = check_int("num_workers", num_workers, minimum=0)
        self.pin_memory = check_bool("pin_memory", pin_memory)
        self._samples = _AugmentedImages(self)

    def epoch(self, epoch: int, start: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The batches of ``epoch``: ``(x float32 [B, 3, crop, crop], y int64 [B])`` on ``device``; from its
        batch number ``start`` on, without reading the images of the ones before."""
        first = self._first_batch(start)
        plan = self.plan(epoch)
        loader = torch.utils.data.DataLoader(
            self._samples,
            batch_size=self.batch_size,
            sampler=[(epoch, index) for index in plan.indices[first * self.batch_size:].tolist()],
            drop_last=self.drop_last,
            num_workers=self.num_workers,
            worker_init_fn=worker_init(),  # its workers ignore the signals a training run stops on
            pin_memory=self.pin_memory,
            # the loader draws its worker base seed from this generator, not from (and advancing) the global RNG
            generator=epoch_generator(self.seed, epoch),
        )
        return ((self._finish(x.to(self.device, non_blocking=True)), y.to(self.device, non_blocking=True))
                for x, y in start_workers(loader))


def make_loaders(
    train: ImageDataset,
    test: ImageDataset,
    batch_size: int,
    *,
    device: str | torch.device,
    seed: int = 0,
    path: str = "auto",
    eval_batch_size: int | None = None,
    **options: Any,
) -> tuple[BatchLoader | DataLoaderPath, BatchLoader | DataLoaderPath]:
    """The train and test loaders.

    Args:
        path: ``"auto"``: :class:`BatchLoader` (GPU-resident on CUDA; also used on CPU, CIFAR fits in memory);
            ``"dataloader"``: :class:`DataLoaderPath`.
        eval_batch_size: the test loader's batch size; default ``batch_size``.
        **options: further loader arguments (``rank``, ``world_size``, ``channels_last``, ``pad``, ``crop``,
            and for ``"dataloader"`` ``num_workers``, ``pin_memory``), given to both loaders; ``drop_last`` and
            ``shuffle`` apply to the train loader only.

    The test loader subtracts the train set's pixel mean (unless ``mean`` is given), is not augmented,
    keeps the last partial batch, and in DDP the ranks read every test sample between them.
    """
    check_name("loader path", path, LOADER_PATHS)
    loader_class = BatchLoader if path == "auto" else DataLoaderPath
    given = {"train", "device", "seed"}  # set here (the dataset and batch size are positional)
    known = {name for cls in (_EpochLoader, BatchLoader, DataLoaderPath)
             for name, p in inspect.signature(cls).parameters.items() if p.kind is p.KEYWORD_ONLY} - given
    for key in options:
        check_name("make_loaders option", key, known)
    if path == "auto" and {"num_workers", "pin_memory"} & options.keys():
        raise ConfigError("num_workers and pin_memory apply to path='dataloader' only; drop them or set that path")
    if "mean" not in options:
        options["mean"] = pixel_mean(train)
    train_only = {key: options.pop(key) for key in ("drop_last", "shuffle") if key in options}
    train_loader = loader_class(train, batch_size, train=True, device=device, seed=seed, **train_only, **options)
    test_batch_size = batch_size if eval_batch_size is None else eval_batch_size
    test_loader = loader_class(test, test_batch_size, train=False, device=device, seed=seed, **options)
    return train_loader, test_loader
