"""Datasets, the packed file format and the loaders: lossless packing, clear errors for bad files, the real
CIFAR-10 copy, class-balanced subsets, and loaders whose batches depend on (seed, epoch) only."""

import contextlib
import functools
import io
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import SHARED_DATA
from PIL import Image

from connlearn.data import (
    BatchLoader,
    DataLoaderPath,
    ImageDataset,
    as_image_dataset,
    find_data,
    load_dataset,
    load_packed,
    make_loaders,
    pack,
    pixel_mean,
    synthetic,
)
from connlearn.errors import ConfigError, ConnlearnError, DataError, UnknownNameError

CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


def indexed(n: int, size: int = 8, seed: int = 0) -> ImageDataset:
    """Random images whose label is their index, so a batch says which rows it holds."""
    images = np.random.default_rng(seed).integers(0, 256, (n, size, size, 3), dtype=np.uint8)
    return ImageDataset(images, np.arange(n), [f"image{i}" for i in range(n)])


def all_batches(loader, epoch: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return list(loader.epoch(epoch))


def same_batches(a, b) -> bool:
    return len(a) == len(b) and all(
        torch.equal(xa, xb) and torch.equal(ya, yb) for (xa, ya), (xb, yb) in zip(a, b, strict=True)
    )


class FolderStyleDataset:
    """What torchvision's ImageFolder looks like to pack: (PIL image, label) items and .classes."""

    classes = ("cat", "dog", "fish")

    def __init__(self, images: np.ndarray):
        self.images = images

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> tuple[Image.Image, int]:
        return Image.fromarray(self.images[i]), i % 3


# ---------------------------------------------------------------------------------------------------------------
# ImageDataset, synthetic data
# ---------------------------------------------------------------------------------------------------------------


def test_synthetic_has_the_requested_sizes_and_is_deterministic():
    train, test = synthetic(num_classes=4, n_train=40, n_test=12, size=16, seed=3)
    again_train, again_test = synthetic(num_classes=4, n_train=40, n_test=12, size=16, seed=3)
    assert train.images.shape == (40, 16, 16, 3) and test.images.shape == (12, 16, 16, 3)
    assert train.class_names == ("class0", "class1", "class2", "class3")
    assert np.array_equal(train.images, again_train.images) and np.array_equal(test.images, again_test.images)
    assert not np.array_equal(train.images, synthetic(num_classes=4, n_train=40, n_test=12, size=16, seed=4)[0].images)


def test_image_dataset_rejects_a_label_outside_the_classes():
    with pytest.raises(DataError, match=r"label 3 is outside 0\.\.2"):
        ImageDataset(np.zeros((2, 4, 4, 3), np.uint8), [0, 3], ["a", "b", "c"])


def test_image_dataset_rejects_channels_first_images():
    with pytest.raises(DataError, match=r"uint8 \[N, H, W, 3\].*\[2, 3, 4, 4\]"):
        ImageDataset(np.zeros((2, 3, 4, 4), np.uint8), [0, 1], ["a", "b"])


def test_subset_takes_the_first_images_of_each_class_in_original_order():
    labels = np.array([2, 0, 0, 1, 2, 1, 0, 2, 1, 1])
    dataset = ImageDataset(
        np.arange(10, dtype=np.uint8)[:, None, None, None].repeat(3, axis=3), labels, ["a", "b", "c"]
    )
    part = dataset.subset(7)
    assert part.images[:, 0, 0, 0].tolist() == [0, 1, 2, 3, 4, 5]
    assert np.bincount(part.labels).tolist() == [2, 2, 2]


def test_subset_larger_than_the_smallest_class_allows_is_a_config_error():
    dataset = ImageDataset(np.zeros((5, 2, 2, 3), np.uint8), [0, 0, 0, 1, 1], ["a", "b"])
    with pytest.raises(ConfigError, match=r"class 1 \('b'\) has only 2; use n <= 4"):
        dataset.subset(6)


# ---------------------------------------------------------------------------------------------------------------
# The packed file format
# ---------------------------------------------------------------------------------------------------------------


def test_png_pack_round_trip_is_bit_exact(tmp_path):
    train, test = synthetic(num_classes=3, n_train=30, n_test=9, size=12)
    loaded_train, loaded_test = load_packed(pack(tmp_path / "data.npz", train, test))
    for original, loaded in ((train, loaded_train), (test, loaded_test)):
        assert np.array_equal(loaded.images, original.images)
        assert np.array_equal(loaded.labels, original.labels) and loaded.labels.dtype == np.int64
        assert loaded.class_names == original.class_names


def test_a_packed_file_gets_the_permissions_of_any_new_file(tmp_path):
    train, test = synthetic(num_classes=3, n_train=30, n_test=9, size=12)
    umask = os.umask(0o022)
    try:
        path = pack(tmp_path / "data.npz", train, test)
    finally:
        os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o644  # not mkstemp's private 0600


def test_jpeg_pack_round_trip_keeps_labels_and_is_close(tmp_path):
    train, test = synthetic(num_classes=3, n_train=30, n_test=9, size=16)
    loaded_train, loaded_test = load_packed(pack(tmp_path / "data.npz", train, test, format="jpeg", quality=95))
    for original, loaded in ((train, loaded_train), (test, loaded_test)):
        assert loaded.images.shape == original.images.shape
        assert np.array_equal(loaded.labels, original.labels) and loaded.class_names == original.class_names
        assert np.abs(loaded.images.astype(float) - original.images).mean() < 5.0


def test_jpeg_splits_decode_to_exactly_the_pixels_pillow_gives(tmp_path):
    train, test = synthetic(num_classes=3, n_train=40, n_test=9, size=16)
    path = pack(tmp_path / "data.npz", train, test, format="jpeg", quality=90)
    loaded, _ = load_packed(path)
    with np.load(path) as archive:
        buffer, offsets = archive["train_jpeg"].tobytes(), archive["train_offsets"]
    for i in range(len(loaded)):
        with Image.open(io.BytesIO(buffer[offsets[i] : offsets[i + 1]])) as image:
            assert np.array_equal(loaded.images[i], np.asarray(image.convert("RGB")))


def test_a_corrupt_jpeg_is_a_data_error_naming_the_image(tmp_path):
    path = pack(tmp_path / "d.npz", *synthetic(num_classes=2, n_train=6, n_test=2, size=8), format="jpeg")
    with np.load(path) as archive:
        arrays = dict(archive)
    start = arrays["train_offsets"][3]
    arrays["train_jpeg"][start : start + 4] = 0  # image 3 loses its JPEG header
    np.savez(path, **arrays)
    with pytest.raises(DataError, match=r"train split\): image 3 is not a readable JPEG"):
        load_packed(path)


def test_pack_accepts_a_torchvision_style_dataset_of_pil_images(tmp_path):
    images = np.random.default_rng(0).integers(0, 256, (7, 10, 10, 3), dtype=np.uint8)
    loaded, _ = load_packed(pack(tmp_path / "d.npz", FolderStyleDataset(images), FolderStyleDataset(images[:3])))
    assert np.array_equal(loaded.images, images)
    assert loaded.labels.tolist() == [0, 1, 2, 0, 1, 2, 0]
    assert loaded.class_names == ("cat", "dog", "fish")


def test_a_failed_pack_leaves_the_old_file_and_no_temporary_file(tmp_path, monkeypatch):
    train, test = synthetic(num_classes=2, n_train=4, n_test=2, size=8)
    target = pack(tmp_path / "d.npz", train, test)
    before = target.read_bytes()

    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez", fail)
    with pytest.raises(OSError, match="disk full"):
        pack(target, *synthetic(num_classes=2, n_train=4, n_test=2, size=8, seed=1))
    assert target.read_bytes() == before
    assert os.listdir(tmp_path) == ["d.npz"]


def test_load_packed_of_a_missing_file_names_the_path_and_how_to_give_one(tmp_path):
    with pytest.raises(DataError, match=r"nothing\.npz does not exist.*--data.*CONNLEARN_DATA"):
        load_packed(tmp_path / "nothing.npz")


def test_load_packed_of_a_truncated_file_is_a_data_error(tmp_path):
    path = pack(tmp_path / "d.npz", *synthetic(num_classes=2, n_train=8, n_test=4, size=8))
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(DataError, match="truncated or corrupt"):
        load_packed(path)


def test_load_packed_of_a_file_that_is_no_archive_says_so(tmp_path):
    path = tmp_path / "README.md"
    path.write_text("# not data\n")
    with pytest.raises(DataError, match=r"README\.md is not a packed dataset \(an \.npz archive written by connlearn "
                                        r"pack\); pass --data"):
        load_packed(path)


def test_load_packed_of_a_file_without_the_keys_lists_the_missing_ones(tmp_path):
    path = tmp_path / "other.npz"
    np.savez(path, train_jpeg=np.zeros(3, np.uint8))
    with pytest.raises(DataError, match=r"lacks the keys train_offsets, train_labels, test_jpeg"):
        load_packed(path)


def test_load_packed_with_offsets_past_the_buffer_is_a_data_error(tmp_path):
    path = pack(tmp_path / "d.npz", *synthetic(num_classes=2, n_train=4, n_test=2, size=8))
    with np.load(path) as archive:
        arrays = dict(archive)
    arrays["train_offsets"] = arrays["train_offsets"] + 1
    np.savez(path, **arrays)
    with pytest.raises(DataError, match=r"train_offsets must rise strictly from 0"):
        load_packed(path)


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(SHARED_DATA), reason="the shared CIFAR-10 file ../shared/data is absent")
def test_the_shared_cifar10_file_loads_with_the_official_statistics():
    train, test = load_packed(SHARED_DATA)
    assert train.images.shape == (50000, 32, 32, 3) and test.images.shape == (10000, 32, 32, 3)
    assert train.images.dtype == np.uint8
    assert np.bincount(train.labels).tolist() == [5000] * 10
    assert train.class_names == CIFAR10_CLASSES == test.class_names
    channel_means = pixel_mean(train).mean(dim=(1, 2))
    assert torch.allclose(channel_means, torch.tensor([0.4914, 0.4822, 0.4465]), atol=2e-3)


# ---------------------------------------------------------------------------------------------------------------
# Finding data
# ---------------------------------------------------------------------------------------------------------------


def test_find_data_prefers_the_explicit_path_to_the_environment(tmp_path, monkeypatch):
    explicit, from_env = tmp_path / "a", tmp_path / "b"
    for folder in (explicit, from_env):
        folder.mkdir()
        (folder / "cifar10_jpeg.npz").touch()
    monkeypatch.setenv("CONNLEARN_DATA", str(from_env))
    assert find_data("cifar10", explicit) == explicit / "cifar10_jpeg.npz"
    assert find_data("cifar10") == from_env / "cifar10_jpeg.npz"


def test_find_data_with_a_missing_explicit_path_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        find_data("cifar10", tmp_path / "missing")


def test_load_dataset_reads_the_packed_file_that_data_points_to(tmp_path):
    train, test = synthetic(num_classes=10, n_train=20, n_test=10, size=8)
    pack(tmp_path / "cifar10.npz", train, test)
    loaded_train, _ = load_dataset("cifar10", data=tmp_path, download=False)
    assert np.array_equal(loaded_train.images, train.images)


def test_load_dataset_with_no_data_and_no_network_says_how_to_give_data(tmp_path, monkeypatch):
    import torchvision.datasets

    class OfflineCIFAR10:
        base_folder = "cifar-10-batches-py"

        def __init__(self, root, train, download):
            raise RuntimeError("<urlopen error [Errno -3] Temporary failure in name resolution>")

    monkeypatch.setattr(torchvision.datasets, "CIFAR10", OfflineCIFAR10)
    monkeypatch.delenv("CONNLEARN_DATA", raising=False)
    with pytest.raises(DataError) as error:
        load_dataset("cifar10", cache_dir=tmp_path)
    message = str(error.value)
    assert "--data" in message and "CONNLEARN_DATA" in message and "\n" not in message


def test_load_dataset_of_an_unknown_name_suggests_the_closest():
    with pytest.raises(UnknownNameError, match="did you mean 'cifar10'"):
        load_dataset("cifar-10")


# ---------------------------------------------------------------------------------------------------------------
# BatchLoader
# ---------------------------------------------------------------------------------------------------------------


def test_batch_loader_gives_identical_batches_for_the_same_seed_and_epoch_whatever_came_before():
    loader = BatchLoader(indexed(50), 8, train=True, seed=5)
    first = all_batches(loader, 2)
    all_batches(loader, 7)
    assert same_batches(first, all_batches(loader, 2))
    assert same_batches(first, all_batches(BatchLoader(indexed(50), 8, train=True, seed=5), 2))


@pytest.mark.parametrize("path", ["batch", "dataloader"])
@pytest.mark.parametrize("drop_last", [True, False])
def test_an_epoch_begun_at_a_batch_gives_the_rest_of_that_epoch(path, drop_last):
    make = BatchLoader if path == "batch" else functools.partial(DataLoaderPath, num_workers=0)
    loader = make(indexed(37), 8, train=True, seed=5, drop_last=drop_last)
    whole = all_batches(loader, 3)
    for start in range(len(loader) + 1):
        assert same_batches(list(loader.epoch(3, start=start)), whole[start:])
    with pytest.raises(ConfigError, match=rf"start \(the batch of the epoch to begin at\) must be .*{len(loader)}"):
        loader.epoch(3, start=len(loader) + 1)


def test_batch_loader_epochs_differ():
    loader = BatchLoader(indexed(50), 8, train=True)
    assert not same_batches(all_batches(loader, 0), all_batches(loader, 1))


def test_batch_loader_yields_float_images_and_int64_labels_of_the_batch_size():
    loader = BatchLoader(indexed(50), 8, train=True)
    batches = all_batches(loader, 0)
    assert len(batches) == len(loader) == 6
    for x, y in batches:
        assert x.shape == (8, 3, 8, 8) and x.dtype == torch.float32 and x.is_contiguous()
        assert y.shape == (8,) and y.dtype == torch.int64


def test_batch_loader_epoch_without_drop_last_visits_every_image_once():
    loader = BatchLoader(indexed(37), 8, train=True, drop_last=False)
    labels = torch.cat([y for _, y in loader.epoch(0)])
    assert len(loader) == 5
    assert sorted(labels.tolist()) == list(range(37))
    assert labels.tolist() != list(range(37))


def test_batch_loader_train_images_are_flipped_or_unflipped_windows_of_the_zero_padded_image():
    image = np.random.default_rng(1).integers(0, 256, (1, 8, 8, 3), dtype=np.uint8)
    dataset = ImageDataset(image.repeat(64, axis=0), np.zeros(64, np.int64), ["only"])
    loader = BatchLoader(dataset, 64, train=True, mean=torch.zeros(3, 1, 1), pad=2)
    padded = F.pad(torch.from_numpy(image[0]).permute(2, 0, 1).float() / 255, (2, 2, 2, 2))
    windows = {}
    for top in range(5):
        for left in range(5):
            window = padded[:, top : top + 8, left : left + 8]
            windows[top, left, False], windows[top, left, True] = window, window.flip(2)
    ((x, _),) = all_batches(loader, 0)
    seen = set()
    for sample in x:
        matches = [key for key, window in windows.items() if torch.equal(sample, window)]
        assert len(matches) == 1
        seen.add(matches[0])
    assert {flip for _, _, flip in seen} == {False, True}
    assert len({(top, left) for top, left, _ in seen}) > 5


def test_batch_loader_eval_subtracts_the_mean_in_dataset_order_without_augmentation():
    dataset = indexed(20)
    mean = torch.rand(3, 8, 8)
    x = torch.cat([x for x, _ in BatchLoader(dataset, 8, train=False, mean=mean).epoch(0)])
    expected = torch.from_numpy(dataset.images).permute(0, 3, 1, 2).float() / 255 - mean
    assert torch.equal(x, expected)


def test_batch_loader_eval_with_a_smaller_crop_takes_the_centre():
    dataset = indexed(4, size=10)
    ((x, _),) = all_batches(BatchLoader(dataset, 4, train=False, mean=torch.zeros(3, 1, 1), crop=6), 0)
    expected = torch.from_numpy(dataset.images).permute(0, 3, 1, 2).float()[:, :, 2:8, 2:8] / 255
    assert torch.equal(x, expected)


def test_batch_loader_ranks_take_disjoint_shards_of_equal_size():
    shards = [
        torch.cat([y for _, y in BatchLoader(indexed(37), 4, train=True, rank=r, world_size=2).epoch(3)])
        for r in (0, 1)
    ]
    assert len(shards[0]) == len(shards[1]) == 16
    assert not set(shards[0].tolist()) & set(shards[1].tolist())


def test_loaders_leave_the_global_random_state_alone():
    state = torch.get_rng_state()
    all_batches(BatchLoader(indexed(20), 4, train=True), 0)
    all_batches(DataLoaderPath(indexed(20), 4, train=True, num_workers=0), 0)
    assert torch.equal(state, torch.get_rng_state())


# ---------------------------------------------------------------------------------------------------------------
# DataLoaderPath, make_loaders
# ---------------------------------------------------------------------------------------------------------------


def test_dataloader_path_is_deterministic_per_seed_and_epoch():
    loader = DataLoaderPath(indexed(30), 8, train=True, num_workers=0, seed=2)
    assert same_batches(all_batches(loader, 1), all_batches(loader, 1))
    assert not same_batches(all_batches(loader, 1), all_batches(loader, 2))


def test_dataloader_path_gives_the_same_batches_with_and_without_workers():
    without_workers = all_batches(DataLoaderPath(indexed(30), 8, train=True, num_workers=0), 4)
    with_workers = all_batches(DataLoaderPath(indexed(30), 8, train=True, num_workers=2), 4)
    assert same_batches(without_workers, with_workers)


def test_make_loaders_gives_the_test_loader_the_train_pixel_mean():
    train, test = synthetic(num_classes=2, n_train=20, n_test=6, size=8)
    train_loader, test_loader = make_loaders(train, test, 4, device="cpu", eval_batch_size=3)
    assert torch.equal(test_loader.mean, pixel_mean(train)) and torch.equal(train_loader.mean, pixel_mean(train))
    assert (test_loader.batch_size, test_loader.train, train_loader.train) == (3, False, True)


def test_make_loaders_with_an_unknown_path_suggests_the_closest():
    train, test = synthetic(num_classes=2, n_train=20, n_test=6, size=8)
    with pytest.raises(UnknownNameError, match="did you mean 'dataloader'"):
        make_loaders(train, test, 4, device="cpu", path="data_loader")


def test_split_holds_out_the_last_images_of_each_class_and_keeps_the_rest():
    data = ImageDataset(np.arange(12, dtype=np.uint8).reshape(12, 1, 1, 1).repeat(3, axis=3),
                        np.array([0, 1, 2] * 4), ("a", "b", "c"))
    rest, held = data.split(6)
    assert sorted(held.images[:, 0, 0, 0].tolist()) == [6, 7, 8, 9, 10, 11]
    assert rest.images[:, 0, 0, 0].tolist() == [0, 1, 2, 3, 4, 5]
    assert np.bincount(held.labels).tolist() == [2, 2, 2]


def _small_set():
    rng = np.random.default_rng(0)
    return ImageDataset(rng.integers(0, 256, (12, 8, 8, 3), dtype=np.uint8), np.arange(12) % 3, ("a", "b", "c"))


_WRONG = (None, True, -1, 1.5, float("nan"), "", "x", [1], {"a": 1}, np.zeros((2, 2)))


def test_data_functions_name_arguments_of_the_wrong_kind(tmp_path, monkeypatch):
    """Law: the data API given a value of another kind raises a ConnlearnError (or works)."""
    monkeypatch.chdir(tmp_path)  # a string given as a path ('x') lands here
    ds = _small_set()
    good = {"images": ds.images, "labels": ds.labels, "class_names": ds.class_names}
    calls = [lambda v, k=k: ImageDataset(**{**good, k: v}) for k in good]
    calls += [ds.subset, ds.split, as_image_dataset, pixel_mean, load_packed,
              lambda v: find_data("cifar10", v), lambda v: synthetic(num_classes=v), lambda v: synthetic(seed=v),
              lambda v: pack(v, ds, ds), lambda v: pack(tmp_path / "p.npz", v, ds),
              lambda v: pack(tmp_path / "q.npz", ds, ds, quality=v)]
    calls.append(lambda v: BatchLoader(ds, v, train=True))
    for option in ("seed", "rank", "world_size", "pad", "crop", "device", "mean"):
        calls.append(lambda v, o=option: list(BatchLoader(ds, 4, train=True, **{o: v}).epoch(0)))
    for option in ("batch_size", "eval_batch_size", "seed", "path"):
        calls.append(lambda v, o=option: [list(loader.epoch(0)) for loader in
                                          make_loaders(ds, ds, **{"batch_size": 4, "device": "cpu", o: v})])
    calls.append(lambda v: list(BatchLoader(ds, 4, train=True).epoch(v)))
    for call in calls:
        for value in _WRONG:
            with contextlib.suppress(ConnlearnError):
                call(value)


@pytest.mark.parametrize("key", ["train_jpeg", "train_offsets", "train_labels", "test_labels", "class_names"])
def test_a_packed_file_with_a_damaged_array_is_a_data_error(tmp_path, key):
    good = pack(tmp_path / "good.npz", _small_set(), _small_set())
    arrays = dict(np.load(good, allow_pickle=False))
    for damaged in (np.zeros(0, np.uint8), np.array(["x"]), np.zeros((3, 3)), np.array(5), None):
        bad = tmp_path / "bad.npz"
        np.savez(bad, **{k: v for k, v in arrays.items() if k != key}, **({} if damaged is None else {key: damaged}))
        with contextlib.suppress(DataError):
            load_packed(bad)
