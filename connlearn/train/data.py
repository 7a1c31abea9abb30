"""Datasets in memory: the packed file formats, conversions, a generated stand-in, and finding data.

An :class:`ImageDataset` is uint8 images ``[N, H, W, C]`` (any size, C channels: 1 grey, 3 RGB, ...) with
int64 labels. The packed format is one ``.npz``: for each split ``train``/``test``, ``{split}_jpeg`` (the encoded
image files joined end to end, uint8), ``{split}_offsets`` (N+1 integers: image ``i`` is
``buf[off[i]:off[i+1]]``) and ``{split}_labels``; ``class_names``; ``encoding`` (``png``; JPEG where absent).
:func:`pack` writes it from an ImageDataset, a torchvision dataset or an image folder (``connlearn pack``).

An :class:`ArrayDataset` is float32 signals ``[N, C, L]`` or vectors ``[N, F]`` with int64 labels; its packed
format is an ``.npz`` of ``train_x``, ``train_y``, ``test_x``, ``test_y`` and, optionally, ``class_names``
(:func:`pack_arrays`; ``numpy.savez`` writes one too). Such a file of uint8 ``[N, H, W, C]`` arrays loads as
ImageDatasets.

:func:`load_dataset` finds a dataset by name where :func:`data_folders` says, and for CIFAR downloads it
there if it can; nothing found is one DataError saying where it looked and how to fix it. :func:`load_ucr`
reads the UCR/UEA time-series sets that the ``aeon`` package ships in its wheel (``connlearn pack ucr:NAME``).
"""

from __future__ import annotations

import colorsys
import io
import math
import os
import struct
import zipfile
import zlib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from connlearn.errors import ConfigError, DataError, check_choice, check_int
from connlearn.files import memory_available, open_input, path_of, write_atomic

DATA_ENV = "CONNLEARN_DATA"
NUM_CLASSES = {"cifar10": 10, "cifar100": 100, "miniimagenet": 100, "imagenet": 1000}
PACK_MINIIMAGENET = "connlearn pack FOLDER --size 84 --test-per-class 100 -o miniimagenet.npz"
ENCODED_CHANNELS = {"png": (1, 2, 3, 4), "jpeg": (1, 3)}  #: the channel counts each encoding stores
KEPT_MODES = ("L", "LA", "RGB", "RGBA")  #: decoded as they are (1, 2, 3 or 4 channels); others as RGB
CACHE = Path("~/.cache/connlearn")


def balanced(labels: np.ndarray, num_classes: int, n: int, from_end: bool = False) -> np.ndarray:
    """The mask of the first (or, ``from_end``, the last) ``n // num_classes`` samples of every class."""
    per_class = check_int("a class-balanced count", n, num_classes) // num_classes
    counts = np.bincount(labels, minlength=num_classes)
    if counts.min() < per_class:
        raise ConfigError(f"{n} class-balanced samples need {per_class} of each class, but class "
                          f"{int(counts.argmin())} has {counts.min()}; use at most {counts.min() * num_classes}")
    order = np.argsort(labels, kind="stable")
    rank = np.empty(len(labels), dtype=np.int64)
    rank[order] = np.arange(len(labels)) - np.concatenate([[0], np.cumsum(counts)[:-1]])[labels[order]]
    return (counts[labels] - 1 - rank if from_end else rank) < per_class


class ClassBalanced:
    """Class-balanced subsets and hold-outs of a dataset with ``labels``, ``class_names`` and ``_take``."""

    labels: np.ndarray
    class_names: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def subset(self, n: int) -> Any:
        """The first ``n // num_classes`` samples of each class, in order."""
        return self._take(balanced(self.labels, self.num_classes, n))  # type: ignore[attr-defined]

    def split(self, n: int) -> tuple[Any, Any]:
        """``(rest, held_out)``: the last ``n // num_classes`` samples of each class held out (a validation
        split of a training set), and the others, both in order."""
        held = balanced(self.labels, self.num_classes, n, from_end=True)
        if held.all():
            raise ConfigError(f"holding out {n} of {len(held)} samples leaves none to train on")
        return self._take(~held), self._take(held)  # type: ignore[attr-defined]


def whole_labels(values: Any) -> np.ndarray:
    """``values`` as int64, refused unless every one is a whole number."""
    array = np.asarray(values)
    if array.dtype.kind not in "iubf":
        raise DataError(f"labels must be whole numbers; label 0 is {array.flat[0].item()!r} (for named classes: "
                        "labels 0..C-1 and the names as class_names)")
    if array.dtype.kind == "f" and (array != np.round(array)).any():
        bad = np.flatnonzero(array != np.round(array))[0]
        raise DataError(f"labels must be whole numbers; label {bad} is {array.flat[bad].item()!r}")
    return array.astype(np.int64)


@attrs.frozen(eq=False)
class ImageDataset(ClassBalanced):
    """uint8 ``images [N, H, W, C]`` and int64 ``labels [N]`` in ``0 .. len(class_names) - 1``."""

    images: np.ndarray = attrs.field(converter=np.ascontiguousarray)
    labels: np.ndarray = attrs.field(converter=whole_labels)
    class_names: tuple[str, ...] = attrs.field(converter=lambda v: tuple(map(str, v)))

    def __attrs_post_init__(self) -> None:
        if self.images.dtype != np.uint8 or self.images.ndim != 4 or not len(self.images):
            raise DataError(f"images must be uint8 [N, H, W, C] with N >= 1, got {self.images.dtype} "
                            f"{list(self.images.shape)}")
        _check_labels(self.labels, len(self.images), self.num_classes)

    def __repr__(self) -> str:
        n, h, w, c = self.images.shape
        return f"ImageDataset({n} images of {h}x{w}x{c}, {self.num_classes} classes)"

    @property
    def image_size(self) -> tuple[int, int]:
        return int(self.images.shape[1]), int(self.images.shape[2])

    @property
    def channels(self) -> int:
        return int(self.images.shape[3])

    def _take(self, keep: np.ndarray) -> ImageDataset:
        return ImageDataset(self.images[keep], self.labels[keep], self.class_names)


@attrs.frozen(eq=False)
class ArrayDataset(ClassBalanced):
    """Signals ``x [N, C, L]`` or vectors ``x [N, F]`` (finite float32) with int64 ``labels [N]`` in
    ``0 .. len(class_names) - 1``: time series, audio features, embeddings, tabular rows."""

    x: np.ndarray = attrs.field(converter=lambda v: np.ascontiguousarray(v, dtype=np.float32))
    labels: np.ndarray = attrs.field(converter=whole_labels)
    class_names: tuple[str, ...] = attrs.field(converter=lambda v: tuple(map(str, v)))

    def __attrs_post_init__(self) -> None:
        if self.x.ndim not in (2, 3) or not len(self.x):
            raise DataError(f"arrays must be [N, C, L] (signals) or [N, F] (vectors) with N >= 1, got "
                            f"{list(self.x.shape)}")
        if not np.isfinite(self.x).all():
            first = np.argwhere(~np.isfinite(self.x))[0]
            raise DataError(f"arrays must be finite; x{first.tolist()} is {self.x[tuple(first)]}")
        _check_labels(self.labels, len(self.x), self.num_classes)

    def __repr__(self) -> str:
        return f"ArrayDataset({len(self)} of {'x'.join(map(str, self.x.shape[1:]))}, {self.num_classes} classes)"

    @property
    def channels(self) -> int:
        return int(self.x.shape[1])

    @property
    def input_size(self) -> tuple[int, ...]:
        return tuple(int(n) for n in self.x.shape[2:])

    def _take(self, keep: np.ndarray) -> ArrayDataset:
        return ArrayDataset(self.x[keep], self.labels[keep], self.class_names)


def _check_labels(labels: np.ndarray, count: int, classes: int) -> None:
    if labels.shape != (count,):
        raise DataError(f"labels must be one per example: {count} examples, labels of shape {list(labels.shape)}")
    bad = np.flatnonzero((labels < 0) | (labels >= classes))
    if len(bad):
        raise DataError(f"label {bad[0]} is {labels[bad[0]]}: labels must be in 0..{classes - 1} (one per class "
                        f"name; {len(bad)} are not)")


@attrs.frozen(eq=False)
class ImageFiles(ClassBalanced):
    """The image files of a dataset: ``paths[i]`` has label ``labels[i]``."""

    paths: tuple[str, ...] = attrs.field(converter=lambda v: tuple(map(str, v)))
    labels: np.ndarray = attrs.field(converter=lambda v: np.asarray(v, dtype=np.int64))
    class_names: tuple[str, ...] = attrs.field(converter=lambda v: tuple(map(str, v)))

    def _take(self, keep: np.ndarray) -> ImageFiles:
        return ImageFiles([p for p, k in zip(self.paths, keep, strict=True) if k], self.labels[keep], self.class_names)


def image_files(folder: str | os.PathLike, classes: Sequence[str] | None = None) -> ImageFiles:
    """The image files of ``folder`` (one folder of images per class), in torchvision ImageFolder's order.
    Labels index ``classes`` where given (another split's names: a class absent here is fine, one not among
    them is refused), else the sorted class folders. Within a class folder a link is followed only to a place
    inside it not reached before, and only regular files are read: anything else is a DataError naming it."""
    root = path_of(folder)
    if not root.is_dir():
        raise DataError(f"{folder}: {'no such folder' if not root.exists() else 'not a folder'} (expected one "
                        "folder of images per class)")
    try:
        found = sorted(e.name for e in os.scandir(root) if e.is_dir())
    except OSError as exc:
        raise DataError(f"cannot read the folder {folder}: {exc.strerror}") from None
    if not found:
        raise DataError(f"{folder} has no class folders (expected one folder of images per class)")
    names = tuple(found) if classes is None else tuple(classes)
    unknown = [c for c in found if c not in names]
    if unknown:
        raise DataError(f"{folder} has class folders the training split lacks: {', '.join(unknown)}")
    paths, labels = [], []
    for name in found:
        files = _class_files(root / name)
        if not files:
            raise DataError(f"the class folder {root / name} holds no image files")
        paths += files
        labels += [names.index(name)] * len(files)
    return ImageFiles(paths, labels, names)


def _class_files(top: Path) -> list[str]:
    """The image files under a class folder, sorted as ImageFolder sorts them (see :func:`image_files`)."""
    from torchvision.datasets.folder import IMG_EXTENSIONS

    base, seen, listed = top.resolve(), set(), []
    pending = [top]
    while pending:
        folder = pending.pop()
        if folder.resolve() in seen:
            raise DataError(f"{folder} leads back to a folder already read (a link loop, or a second link to it)")
        seen.add(folder.resolve())
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError as exc:
            raise DataError(f"cannot read the folder {folder}: {exc.strerror}") from None
        files = []
        for entry in entries:
            path = Path(entry.path)
            if entry.is_symlink() and not path.resolve().is_relative_to(base):
                raise DataError(f"{path} links out of its class folder (to {path.resolve()}); copy the files in")
            if entry.is_dir():
                pending.append(path)
            elif path.suffix.lower() in IMG_EXTENSIONS:
                if not entry.is_file():
                    raise DataError(f"{path} is {'a link to nothing' if not path.exists() else 'not a regular file'}")
                files.append(path)
        listed.append((str(folder), files))
    read: set[Path] = set()
    paths = []
    for _, files in sorted(listed):
        for path in files:
            if path.resolve() not in read:  # a file reached twice, by a link: read once
                read.add(path.resolve())
                paths.append(str(path))
    return paths


def pixel_mean(dataset: ImageDataset) -> torch.Tensor:
    """The per-pixel mean image, float32 ``[C, H, W]`` in [0, 1]."""
    mean = dataset.images.mean(axis=0, dtype=np.float64) / 255.0
    return torch.from_numpy(np.ascontiguousarray(mean.transpose(2, 0, 1), dtype=np.float32))


# ------------------------------------------------------------------------------------------- packed files
def _in_chunks(count: int, work: Callable[[int, int], None]) -> None:
    """``work(lo, hi)`` over ``range(count)`` in chunks on a thread pool (Pillow releases the GIL)."""
    workers = max(1, min(8, os.cpu_count() or 1))
    bounds = [count * k // min(count, workers * 4) for k in range(min(count, workers * 4) + 1)]
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(work, bounds[:-1], bounds[1:]))


def _decode(buffer: np.ndarray, offsets: np.ndarray, where: str) -> np.ndarray:
    """The images of a split, decoded: JPEG by torchvision's batched decoder (the same libjpeg-turbo pixels,
    several times faster), anything else or a failure by Pillow, which names the image at fault."""
    data = buffer.tobytes()
    try:
        from torchvision.io import ImageReadMode, decode_jpeg

        raw = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        decoded = decode_jpeg([raw[offsets[i]:offsets[i + 1]] for i in range(len(offsets) - 1)],
                              mode=ImageReadMode.UNCHANGED)
        if len({d.shape for d in decoded}) == 1:
            return torch.stack(decoded).permute(0, 2, 3, 1).contiguous().numpy()
    except RuntimeError:  # not JPEG files
        pass

    def image(i: int) -> np.ndarray:
        try:
            with Image.open(io.BytesIO(data[offsets[i]:offsets[i + 1]])) as opened:
                array = np.asarray(opened if opened.mode in KEPT_MODES else opened.convert("RGB"))
        except UnidentifiedImageError:
            raise DataError(f"{where}: image {i} is not an image file Pillow can identify") from None
        except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
            raise DataError(f"{where}: image {i} is not a readable image file ({exc})") from None
        return array[:, :, None] if array.ndim == 2 else array

    first = image(0)
    images = np.empty((len(offsets) - 1, *first.shape), dtype=np.uint8)

    def decode_range(lo: int, hi: int) -> None:
        for i in range(lo, hi):
            found = image(i)
            if found.shape != first.shape:
                raise DataError(f"{where}: image {i} is {list(found.shape)}, image 0 {list(first.shape)}")
            images[i] = found

    _in_chunks(len(images), decode_range)
    return images


def load_packed(path: str | os.PathLike) -> tuple[Any, Any]:
    """``(train, test)`` of a packed ``.npz`` file (the formats of this module's docstring): ImageDatasets, or
    ArrayDatasets for a file of arrays."""
    path = path_of(path)
    file = open_input(path, "packed dataset")
    try:
        archive = np.load(file, allow_pickle=False)
        if not isinstance(archive, np.lib.npyio.NpzFile):
            raise DataError(f"{path} holds one array (a .npy file), not a packed dataset; write one with "
                            "connlearn pack")
        with archive:
            if "train_x" in archive.files:
                return _arrays(path, archive)
            if "train_jpeg" not in archive.files:
                raise DataError(f"{path} holds {', '.join(archive.files) or 'nothing'}; a packed dataset holds "
                                "train_x, train_y, test_x, test_y (and optionally class_names), or what connlearn "
                                "pack writes")
            names = tuple(str(n) for n in np.atleast_1d(archive["class_names"]))
            splits = []
            for split in ("train", "test"):
                buffer, offsets, labels = (archive[f"{split}_{k}"] for k in ("jpeg", "offsets", "labels"))
                if len(offsets) != len(labels) + 1 or offsets[0] != 0 or offsets[-1] != len(buffer):
                    raise DataError(f"{path}: the {split} offsets do not cut its buffer into {len(labels)} images")
                images = _decode(buffer, offsets, f"{path} ({split})")
                try:
                    splits.append(ImageDataset(images, labels, names))
                except DataError as exc:
                    raise DataError(f"{path} ({split}): {exc}") from None
            if splits[0].images.shape[1:] != splits[1].images.shape[1:]:
                raise DataError(f"{path}: the train images are {list(splits[0].images.shape[1:])}, the test images "
                                f"{list(splits[1].images.shape[1:])}; one size and channel count for both")
    except (OSError, KeyError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        if isinstance(exc, DataError):
            raise
        raise DataError(f"{path} is not a readable packed dataset ({type(exc).__name__}: {exc}); write one with "
                        "connlearn pack") from None
    finally:
        file.close()
    return splits[0], splits[1]


def _arrays(path: Path, archive: Any) -> tuple[Any, Any]:
    """``(train, test)`` of a packed file of arrays: ``train_x``, ``train_y``, ``test_x``, ``test_y`` and,
    optionally, ``class_names`` (else ``0 .. classes - 1``); ImageDatasets where the arrays are 4-D."""
    labels = []
    for split in ("train", "test"):
        try:
            labels.append(whole_labels(archive[f"{split}_y"]))
        except DataError as exc:
            raise DataError(f"{path} ({split}): {exc}") from None
    classes = int(max(np.max(y) for y in labels)) + 1 if all(len(y) for y in labels) else 1
    names = (tuple(str(n) for n in np.atleast_1d(archive["class_names"])) if "class_names" in archive.files
             else tuple(str(c) for c in range(classes)))
    splits = []
    xs = [archive[f"{split}_x"] for split in ("train", "test")]
    if xs[0].ndim == 4 and xs[0].shape[3] > xs[0].shape[1]:  # more channels than rows: [N, C, H, W] read wrongly
        raise DataError(f"{path}: train_x is {list(xs[0].shape)}, images of {xs[0].shape[3]} channels and "
                        f"{xs[0].shape[1]} rows; images are [N, H, W, C] (from [N, C, H, W]: x.transpose(0, 2, 3, 1))")
    if xs[0].ndim == 3 and xs[0].dtype == np.uint8:  # grey images without their channel axis, not signals
        raise DataError(f"{path}: train_x is uint8 {list(xs[0].shape)}, which reads as {xs[0].shape[1]}-channel "
                        "signals; images need [N, H, W, C] (grey ones: x[..., None]); signals: store them as floats")
    for split, x, y in zip(("train", "test"), xs, labels, strict=True):
        try:
            splits.append(ImageDataset(x, y, names) if xs[0].ndim == 4 else ArrayDataset(x, y, names))
        except DataError as exc:
            raise DataError(f"{path} ({split}): {exc}") from None
    if xs[0].shape[1:] != xs[1].shape[1:]:
        raise DataError(f"{path}: the train arrays are {list(xs[0].shape[1:])} each, the test arrays "
                        f"{list(xs[1].shape[1:])}; one shape for both")
    return splits[0], splits[1]


def pack_arrays(path: str | os.PathLike, train: ArrayDataset, test: ArrayDataset) -> Path:
    """Write ``train`` and ``test`` as a packed ``.npz`` of arrays; returns its path."""
    path = path_of(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays: dict[str, Any] = {"train_x": train.x, "train_y": train.labels, "test_x": test.x, "test_y": test.labels,
                              "class_names": np.array(train.class_names, dtype=str)}
    return write_atomic(path, lambda f: np.savez(f, **arrays))


def as_image_dataset(dataset: Any, class_names: Sequence[str] | None = None) -> ImageDataset:
    """``dataset`` as an ImageDataset: an ImageDataset, or an indexable dataset of ``(image, label)`` (a
    torchvision dataset; images PIL (grey or RGB), uint8 or [0, 1] float arrays HWC or HW, or tensors CHW as
    ``ToTensor`` gives; one size)."""
    if isinstance(dataset, ImageDataset):
        return dataset if class_names is None else ImageDataset(dataset.images, dataset.labels, class_names)
    names = class_names or getattr(dataset, "classes", None)
    if names is None:
        raise ConfigError(f"{type(dataset).__name__} has no .classes: give class_names")
    data = getattr(dataset, "data", None)
    stored = isinstance(data, np.ndarray) and data.dtype == np.uint8 and data.ndim == 4
    if stored and getattr(dataset, "transform", None) is None:
        return ImageDataset(data, np.asarray(dataset.targets), names)  # torchvision's CIFAR, as stored
    images, labels = [], []
    for image, label in (dataset[i] for i in range(len(dataset))):
        if isinstance(image, Image.Image):
            array = np.asarray(image if image.mode in ("L", "RGB") else image.convert("RGB"))
        else:
            array = image.numpy() if isinstance(image, torch.Tensor) else np.asarray(image)
            if isinstance(image, torch.Tensor) and array.ndim == 3:
                array = array.transpose(1, 2, 0)
            array = np.rint(array * 255.0) if np.issubdtype(array.dtype, np.floating) else array
        images.append((array[:, :, None] if array.ndim == 2 else array).astype(np.uint8))
        labels.append(int(label))
    if len({a.shape for a in images}) > 1:
        raise DataError(f"{type(dataset).__name__}'s images differ in size; resize them to one (transform=Resize)")
    return ImageDataset(np.stack(images), labels, names)


GREY_MODES = ("1", "L", "I", "I;16", "F")


def read_image_folder(folder: str | os.PathLike, size: int | None = None, classes: Sequence[str] | None = None,
                      channels: int | None = None) -> ImageDataset:
    """The images of ``folder`` (one folder of images per class: :func:`image_files`, ``classes`` as there),
    resized to ``size x size`` if given (else they must share one size); ``channels`` 1 (grey) or 3 (RGB),
    by default 1 where every image is grey. The memory it takes is checked against the machine's first."""
    size = None if size is None else check_int("size", size, 1)
    files = image_files(folder, classes)
    headers = [_header(p) for p in files.paths]
    if channels is None:
        channels = 1 if all(mode in GREY_MODES for mode, _ in headers) else 3
    channels = check_choice("channels", channels, (1, 3))
    shape = (size, size) if size else headers[0][1][::-1]
    need, free = 3 * len(headers) * shape[0] * shape[1] * channels, memory_available()  # images, encodings, join
    if free is not None and need > free:
        raise DataError(f"{len(headers)} images of {shape[0]}x{shape[1]}x{channels} need about {need / 2**30:.1f} GiB "
                        f"of memory; {free / 2**30:.1f} GiB are available (pack fewer or smaller images: --size)")

    def read(path: str) -> np.ndarray:
        try:
            with Image.open(path) as opened:
                image = opened.convert("L" if channels == 1 else "RGB")
                cut = opened.format == "PNG" and _png_rows_missing(path)
            array = np.asarray(image if size is None else image.resize((size, size), Image.Resampling.BILINEAR))
        except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
            raise DataError(f"{path} is not a readable image ({exc})") from None
        if cut:
            raise DataError(f"{path}: its image data ends before the rows its header declares (a cut PNG, which "
                            "would pack with black rows); re-save or remove it")
        return array[:, :, None] if array.ndim == 2 else array

    with ThreadPoolExecutor(max(1, min(8, os.cpu_count() or 1))) as pool:
        arrays = list(pool.map(read, files.paths))
    if len({a.shape for a in arrays}) > 1:
        raise DataError(f"the images of {folder} differ in size; give size (--size) to resize them to one")
    return ImageDataset(np.stack(arrays), files.labels, files.class_names)


_ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2))


def _png_rows_missing(path: str) -> bool:
    """Whether a PNG file's image data ends before the rows its header declares: Pillow reads such a file
    without a word and leaves the missing rows black. The IDAT chunks, inflated, against the bytes the rows
    need (a filter byte and the packed pixels per row, per Adam7 pass where interlaced)."""
    with open_input(path, "image") as f:
        data = f.read()
    header, parts, at = b"", [], 8
    while at + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[at:at + 8])
        header = data[at + 8:at + 21] if kind == b"IHDR" else header
        parts += [data[at + 8:at + 8 + length]] if kind == b"IDAT" else []
        at += 12 + length
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", header)
    bits = depth * {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}.get(colour, 1)
    passes = [(-(-(width - x) // dx), -(-(height - y) // dy)) for x, y, dx, dy in _ADAM7] if interlace else [
        (width, height)]
    need = sum(h * (1 + (w * bits + 7) // 8) for w, h in passes if w > 0 and h > 0)
    try:
        return len(zlib.decompressobj().decompress(b"".join(parts), need)) < need
    except zlib.error:
        return True


def _header(path: str) -> tuple[str, tuple[int, int]]:
    """``(mode, (width, height))`` of an image file, from its header alone."""
    try:
        with Image.open(path) as opened:
            return opened.mode, opened.size
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
        raise DataError(f"{path} is not a readable image ({exc})") from None


def pack(path: str | os.PathLike, train: Any, test: Any, format: str = "png", quality: int = 95) -> Path:
    """Write ``train`` and ``test`` (ImageDatasets or torchvision datasets) as a packed ``.npz`` file;
    ``png`` is lossless (1 to 4 channels), ``jpeg`` smaller (1 or 3). Returns its path."""
    check_choice("image format", format, ENCODED_CHANNELS)
    train = as_image_dataset(train)
    test = as_image_dataset(test, train.class_names)
    if train.channels not in ENCODED_CHANNELS[format]:
        raise DataError(f"{format} holds images of {' or '.join(map(str, ENCODED_CHANNELS[format]))} channels, not "
                        f"{train.channels}: " + ("pack them as png" if train.channels in ENCODED_CHANNELS["png"] else
                                                 "keep them as an .npz of uint8 arrays train_x [N, H, W, C], "
                                                 "train_y, test_x, test_y, which trains as it is"))
    arrays: dict[str, Any] = {"class_names": np.array(train.class_names, dtype=str), "encoding": np.array(format)}
    for split, dataset in (("train", train), ("test", test)):
        files: list[bytes] = [b""] * len(dataset)
        options = {"format": "PNG"} if format == "png" else {"format": "JPEG", "quality": quality, "subsampling": 0}

        def encode(lo: int, hi: int, dataset: ImageDataset = dataset, files: list[bytes] = files,
                   options: dict[str, Any] = options) -> None:
            for i in range(lo, hi):
                out = io.BytesIO()
                Image.fromarray(dataset.images[i].squeeze(2) if dataset.channels == 1 else dataset.images[i]).save(
                    out, **options)
                files[i] = out.getvalue()

        _in_chunks(len(dataset), encode)
        arrays[f"{split}_jpeg"] = np.frombuffer(b"".join(files), dtype=np.uint8)
        arrays[f"{split}_offsets"] = np.concatenate([[0], np.cumsum([len(f) for f in files])]).astype(np.int64)
        arrays[f"{split}_labels"] = dataset.labels
    path = path_of(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_atomic(path, lambda f: np.savez(f, **arrays))


def synthetic(num_classes: int = 10, n_train: int = 500, n_test: int = 200, size: int = 32, seed: int = 0,
              channels: int = 3) -> tuple[ImageDataset, ImageDataset]:
    """A small generated ``(train, test)`` that a small CNN learns in a few epochs: class ``c`` is a disc of
    its own colour at its own place on a grid, jittered, on a random grey, with noise. Labels cycle, so every
    prefix of ``k · num_classes`` images is class-balanced."""
    colours = np.array([colorsys.hsv_to_rgb(c / num_classes, 0.8, 0.9) for c in range(num_classes)]) * 255
    grid = math.ceil(math.sqrt(num_classes))
    cells = np.stack([np.arange(num_classes) // grid, np.arange(num_classes) % grid], axis=1)
    splits = []
    for index, n in enumerate((n_train, n_test)):
        rng = np.random.default_rng([seed, index])
        labels = np.arange(n, dtype=np.int64) % num_classes
        centres = (cells[labels] + 0.5) * size / grid + rng.uniform(-size / 16, size / 16, (n, 2))
        rows, cols = np.mgrid[0:size, 0:size]
        blob = (rows - centres[:, 0, None, None]) ** 2 + (cols - centres[:, 1, None, None]) ** 2 <= max(
            size / (2 * grid), 2.0) ** 2
        background = rng.uniform(40, 215, (n, 1, 1, 1)) * np.ones(3)
        images = np.where(blob[..., None], colours[labels][:, None, None, :] * rng.uniform(0.8, 1.2, (n, 1, 1, 1)),
                          background)
        images = np.clip(np.rint(images + rng.normal(0.0, 16.0, images.shape)), 0, 255).astype(np.uint8)
        if channels == 1:
            images = np.rint(images @ np.array([0.299, 0.587, 0.114]))[..., None].astype(np.uint8)
        splits.append(ImageDataset(images, labels, [f"class{c}" for c in range(num_classes)]))
    return splits[0], splits[1]


# ------------------------------------------------------------------------------------------ finding data
def data_folders(data: str | os.PathLike | None = None) -> list[Path]:
    """Where datasets are looked for, in order: ``data`` alone when given; else ``$CONNLEARN_DATA``, the
    folders ``data`` and ``../shared/data`` of the current directory (a checkout's), and the cache
    ``~/.cache/connlearn``, where CIFAR downloads go."""
    if data is not None:
        return [path_of(data)]
    env = os.environ.get(DATA_ENV)
    return [*([path_of(env)] if env else []), Path("data"), Path("../shared/data"), path_of(CACHE)]


def find_packed(name: str, data: str | os.PathLike | None = None) -> Path | None:
    """The packed file of dataset ``name``: ``data`` itself where it is a file, else ``{name}_jpeg.npz`` or
    ``{name}.npz`` in the first of :func:`data_folders` that holds one."""
    if data is not None and path_of(data).is_file():
        return path_of(data)
    if data is not None and not path_of(data).exists():
        raise DataError(f"--data {data}: no such file or folder")
    if data is not None and not path_of(data).is_dir():
        raise DataError(f"--data {data} is neither a regular file nor a folder (a FIFO or a device?); give a packed "
                        ".npz file or the folder that holds it")
    for folder in data_folders(data):
        for file in (folder / f"{name}_jpeg.npz", folder / f"{name}.npz"):
            if file.is_file():
                return file
    return None


def load_dataset(name: str, data: str | os.PathLike | None = None,
                 download: bool = True) -> tuple[ImageDataset, ImageDataset]:
    """``(train, test)`` of ``cifar10``, ``cifar100`` or ``miniimagenet``: its packed file (:func:`find_packed`),
    else for CIFAR torchvision's files in one of :func:`data_folders`, downloaded into the cache if needed."""
    classes = NUM_CLASSES[check_choice("dataset", name, ("cifar10", "cifar100", "miniimagenet"))]
    packed = find_packed(name, data)
    if packed is not None:
        train, test = load_packed(packed)
        if train.num_classes != classes:
            raise DataError(f"{packed} has {train.num_classes} classes, not {name}'s {classes}; to train on data of "
                            "your own give --dataset custom")
        return train, test
    folders = data_folders(data)
    looked = f"looked in {', '.join(map(str, folders))}"
    if name == "miniimagenet":
        raise DataError(f"no miniimagenet.npz found ({looked}): make it once with {PACK_MINIIMAGENET}")
    import torchvision.datasets

    cifar = torchvision.datasets.CIFAR10 if name == "cifar10" else torchvision.datasets.CIFAR100
    for root in folders:
        if (root / cifar.base_folder).is_dir():
            splits = [cifar(str(root), train=t, download=False) for t in (True, False)]
            return as_image_dataset(splits[0]), as_image_dataset(splits[1])
    try:
        if not download:
            raise OSError("download=False")
        splits = [cifar(str(path_of(CACHE)), train=t, download=True) for t in (True, False)]
    except Exception as exc:  # torchvision raises URLError, RuntimeError, OSError... when it cannot download
        default = ": cifar100 is the default dataset, --dataset names another" if name == "cifar100" else ""
        failed = " ".join(str(exc).split())[:200]
        raise DataError(f"no {name} data found{default} ({looked}; the download failed: {failed}). "
                        f"Put {name}.npz (or {name}_jpeg.npz) in one of {', '.join(map(str, folders))} (or set "
                        f"{DATA_ENV} to its folder); make it where there is internet with: connlearn pack {name} -o "
                        f"{name}.npz; or pass --data FILE_OR_FOLDER") from None
    return as_image_dataset(splits[0]), as_image_dataset(splits[1])


# ------------------------------------------------------------------------------------------ UCR/UEA sets
def ucr_sets() -> list[str]:
    """The UCR/UEA classification sets the installed ``aeon`` package ships inside its wheel (no download)."""
    root = _aeon_data()
    return sorted(d.name for d in root.iterdir() if (d / f"{d.name}_TRAIN.ts").is_file()
                  and (d / f"{d.name}_TEST.ts").is_file() and _classification(d / f"{d.name}_TRAIN.ts"))


def _classification(path: Path) -> bool:
    """Whether a .ts file's header says its series have class labels (not regression targets)."""
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.lower().startswith("@data"):
                return False
            if line.lower().split()[:2] == ["@classlabel", "true"]:
                return True
    return False


def _aeon_data() -> Path:
    try:
        import aeon.datasets
    except ImportError:
        raise DataError("the UCR/UEA sets come with the aeon package: pip install 'connlearn[timeseries]' (or "
                        "pip install aeon)") from None
    return Path(aeon.datasets.__file__).parent / "data"


def load_ucr(name: str) -> tuple[ArrayDataset, ArrayDataset]:
    """``(train, test)`` of a UCR/UEA time-series classification set that ``aeon`` ships (:func:`ucr_sets`:
    GunPoint, ArrowHead, ItalyPowerDemand, BasicMotions, JapaneseVowels, OSULeaf, ...) as the archive splits
    it. Series of unequal length are padded with zeros at their end to the longest of both splits (the UEA
    archive's JapaneseVowels: 29); class names are the archive's labels, in natural order."""
    from aeon.datasets import load_from_ts_file

    root = _aeon_data() / check_choice("UCR/UEA set (shipped with aeon)", name, ucr_sets())
    splits = [load_from_ts_file(str(root / f"{name}_{split}.ts")) for split in ("TRAIN", "TEST")]
    length = max(x.shape[-1] for xs, _ in splits for x in xs)
    labels = sorted({str(v) for _, y in splits for v in y}, key=lambda v: (not v.isdigit(), int(v) if v.isdigit()
                                                                          else 0, v))
    index = {v: i for i, v in enumerate(labels)}
    out = []
    for xs, y in splits:
        x = np.zeros((len(xs), xs[0].shape[0], length), dtype=np.float32)
        for i, series in enumerate(xs):
            x[i, :, :series.shape[-1]] = np.nan_to_num(np.asarray(series, dtype=np.float32))
        out.append(ArrayDataset(x, [index[str(v)] for v in y], labels))
    return out[0], out[1]
