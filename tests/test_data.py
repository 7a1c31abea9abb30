"""Data: the packed format round trips (any size and channels), the loaders are functions of (seed, epoch), the
DDP shards split every epoch, the augmentation is the paper's, and missing data is one clear error."""

import numpy as np
import pytest
import torch
from PIL import Image

from connlearn.errors import DataError
from connlearn.train.data import (
    ImageDataset,
    data_folders,
    find_packed,
    image_files,
    load_dataset,
    load_packed,
    pack,
    pixel_mean,
    read_image_folder,
    synthetic,
)
from connlearn.train.loaders import BatchLoader, DataLoaderPath, FolderLoader, make_loaders


@pytest.mark.parametrize("channels", [3, 1, 4, 2])
def test_a_packed_dataset_loads_back_the_same_pixels_and_channels(tmp_path, channels):
    train, test = (ImageDataset(np.concatenate([d.images, 255 - d.images], axis=3)[..., :channels], d.labels,
                                d.class_names) for d in synthetic(num_classes=3, n_train=30, n_test=9, size=28))
    loaded = load_packed(pack(tmp_path / "d.npz", train, test))
    for a, b in zip((train, test), loaded, strict=True):
        assert np.array_equal(a.images, b.images) and np.array_equal(a.labels, b.labels)
        assert b.class_names == a.class_names and b.channels == channels
    if channels in (1, 3):  # what JPEG stores
        jpeg = load_packed(pack(tmp_path / "j.npz", train, test, format="jpeg"))[0]
        assert jpeg.images.shape == train.images.shape and np.abs(jpeg.images.astype(int) - train.images).mean() < 8


def test_a_torchvision_style_dataset_packs_as_it_reads(tmp_path):
    class Folder:
        classes = ("a", "b")

        def __len__(self):
            return 4

        def __getitem__(self, i):
            return Image.fromarray(np.full((8, 8, 3), 60 * i, dtype=np.uint8)), i % 2

    train, _ = load_packed(pack(tmp_path / "f.npz", Folder(), Folder()))
    assert train.images[3].max() == 180 and list(train.labels) == [0, 1, 0, 1] and train.class_names == ("a", "b")


def test_class_balanced_subsets_and_held_out_splits():
    data = ImageDataset(np.zeros((12, 2, 2, 3), np.uint8), np.arange(12) % 3, ["a", "b", "c"])
    assert list(data.subset(6).labels) == [0, 1, 2, 0, 1, 2]
    rest, held = data.split(3)
    assert len(rest) == 9 and sorted(held.labels) == [0, 1, 2] and (held.images == 0).all()


def _batches(loader, epoch, start=0):
    return [(x.clone(), y.clone()) for x, y in loader.epoch(epoch, start)]


def test_an_epoch_is_a_function_of_seed_and_epoch_and_resumes_at_any_batch():
    train, _ = synthetic(n_train=100, n_test=10)
    loader = BatchLoader(train, 16, train=True, seed=3)
    first = _batches(loader, 2)
    assert len(first) == len(loader) == 6
    for (a, y), (b, z) in zip(first, _batches(loader, 2), strict=True):
        assert torch.equal(a, b) and torch.equal(y, z)
    for (a, _), (b, _) in zip(first[4:], _batches(loader, 2, start=4), strict=True):
        assert torch.equal(a, b)
    assert not torch.equal(first[0][0], _batches(loader, 3)[0][0])


def test_eval_batches_are_the_mean_subtracted_images_and_train_batches_their_crops_and_flips():
    train, test = synthetic(n_train=40, n_test=10, size=8)
    loader, evaluation = make_loaders(train, test, 10, device="cpu", pad=2)
    mean = pixel_mean(train)
    x, _ = next(evaluation.epoch(0))
    torch.testing.assert_close(x, torch.from_numpy(test.images).permute(0, 3, 1, 2).float() / 255 - mean)
    indices, corners, flips = loader.plan(0)
    x, y = next(loader.epoch(0))
    for i in range(10):
        image = torch.from_numpy(train.images[indices[i]]).permute(2, 0, 1).float() / 255 - mean
        top, left = corners[i].tolist()
        crop = torch.nn.functional.pad(image, (2, 2, 2, 2))[:, top:top + 8, left:left + 8]
        torch.testing.assert_close(x[i], crop.flip(2) if flips[i] else crop)
        assert y[i] == train.labels[indices[i]]


def test_ddp_shards_split_every_epoch_between_the_ranks():
    train, test = synthetic(n_train=50, n_test=11)
    shards = [BatchLoader(train, 5, train=True, seed=1, rank=r, world_size=2) for r in range(2)]
    orders = [set(s.plan(4)[0].tolist()) for s in shards]
    assert len(orders[0]) == len(orders[1]) == 25 and not orders[0] & orders[1]
    evaluation = [BatchLoader(test, 4, train=False, rank=r, world_size=2) for r in range(2)]
    assert sorted(i for e in evaluation for i in e.plan(0)[0].tolist()) == list(range(11))


def test_the_dataloader_path_reads_the_batch_loaders_batches_whatever_its_workers():
    train, _ = synthetic(n_train=40, n_test=10)
    serial, workers = (DataLoaderPath(train, 8, train=True, seed=2, num_workers=n) for n in (0, 2))
    resident = _batches(BatchLoader(train, 8, train=True, seed=2), 1)
    for batches in (_batches(serial, 1), _batches(workers, 1), _batches(serial, 1, start=2)):
        assert all(torch.equal(x, y) and torch.equal(u, v) for (x, u), (y, v) in zip(batches, resident[-len(batches):],
                                                                                      strict=True))


def test_an_image_folder_reads_and_loads_as_imagenet_does(tmp_path):
    rng = np.random.default_rng(0)
    for c in ("cat", "dog"):
        (tmp_path / c).mkdir()
        for i in range(3):
            Image.fromarray(rng.integers(0, 255, (20 + 4 * i, 30, 3), dtype=np.uint8)).save(tmp_path / c / f"{i}.jpg")
    files = image_files(tmp_path)
    assert files.class_names == ("cat", "dog") and list(files.labels) == [0, 0, 0, 1, 1, 1]
    loader = FolderLoader(files, 2, train=True, size=16, resize=18, num_workers=0, seed=5)
    x, _ = next(loader.epoch(0))
    assert x.shape == (2, 3, 16, 16) and torch.equal(x, next(loader.epoch(0))[0])
    x, _ = next(FolderLoader(files, 6, train=False, size=16, resize=18, num_workers=0).epoch(0))
    assert x.shape == (6, 3, 16, 16)
    assert read_image_folder(tmp_path, size=12).images.shape == (6, 12, 12, 3)


def test_data_is_looked_for_where_the_docs_say_and_missing_data_says_where(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CONNLEARN_DATA", str(tmp_path / "env"))
    monkeypatch.setenv("HOME", str(tmp_path))
    assert data_folders()[:3] == [tmp_path / "env", tmp_path.joinpath("data").relative_to(tmp_path),
                                  tmp_path.joinpath("../shared/data").relative_to(tmp_path)]
    (tmp_path / "data").mkdir()
    train, test = synthetic(n_train=20, n_test=10)
    pack(tmp_path / "data" / "cifar10.npz", train, test)
    assert find_packed("cifar10") == tmp_path.joinpath("data/cifar10.npz").relative_to(tmp_path)
    assert len(load_dataset("cifar10")[0]) == 20
    with pytest.raises(DataError, match=r"no cifar100 data found: cifar100 is the default dataset, --dataset names "
                                        r"another \(looked in .*env, data, \.\./shared/data.*Put "
                                        r"cifar100.npz .*connlearn pack cifar100 -o cifar100.npz.*--data"):
        load_dataset("cifar100", download=False)


def _folder(root, classes, n=2, mode="RGB", size=8):
    for c in classes:
        (root / c).mkdir(parents=True)
        for i in range(n):
            Image.new(mode, (size, size), (30 * i + 10 * len(c)) if mode == "L" else (30 * i, 0, 0)).save(
                root / c / f"{i}.png")
    return root


def test_labels_follow_class_names_across_splits(tmp_path):
    from connlearn.cli import main

    _folder(tmp_path / "d" / "train", ("class0", "class1", "class2"))
    _folder(tmp_path / "d" / "test", ("class1", "class2"), n=1)
    assert main(["pack", str(tmp_path / "d"), "-o", str(tmp_path / "p.npz")]) == 0
    train, test = load_packed(tmp_path / "p.npz")
    assert test.class_names == train.class_names == ("class0", "class1", "class2")
    assert list(test.labels) == [1, 2]


def test_a_link_is_read_once_and_only_within_its_class_folder(tmp_path):
    root = _folder(tmp_path, ("a", "b"))
    (root / "a" / "sub").mkdir()
    (root / "a" / "sub" / "again.png").symlink_to(root / "a" / "0.png")
    (root / "b" / "same.png").symlink_to("1.png")
    files = image_files(root)
    assert [p.removeprefix(str(root)) for p in files.paths] == ["/a/0.png", "/a/1.png", "/b/0.png", "/b/1.png"]


def test_grey_images_pack_as_one_channel_unless_rgb_is_asked_for(tmp_path):
    from connlearn.cli import main

    _folder(tmp_path / "g", ("x", "y"), n=3, mode="L")
    assert main(["pack", str(tmp_path / "g"), "--test-per-class", "1", "-o", str(tmp_path / "g.npz")]) == 0
    assert load_packed(tmp_path / "g.npz")[0].images.shape == (4, 8, 8, 1)
    assert main(["pack", str(tmp_path / "g"), "--test-per-class", "1", "--rgb", "-o", str(tmp_path / "c.npz")]) == 0
    rgb = load_packed(tmp_path / "c.npz")[0].images
    assert rgb.shape == (4, 8, 8, 3) and (rgb[..., 0] == rgb[..., 2]).all()


def test_a_write_through_a_link_replaces_the_file_it_names_and_keeps_the_link(tmp_path):
    from connlearn.files import write_text

    (tmp_path / "real.json").write_text("old")
    (tmp_path / "link.json").symlink_to("real.json")
    write_text(tmp_path / "link.json", "new")
    assert (tmp_path / "link.json").is_symlink() and (tmp_path / "real.json").read_text() == "new"


def test_arrays_and_image_arrays_pack_and_load_back_the_same_values(tmp_path):
    from connlearn.cli import main
    from connlearn.train.data import ArrayDataset, pack_arrays

    rng = np.random.default_rng(0)
    for shape in ((2, 7), (5,)):
        train = ArrayDataset(rng.normal(size=(12, *shape)), np.arange(12) % 3, ["a", "b", "c"])
        test = ArrayDataset(rng.normal(size=(6, *shape)), np.arange(6) % 3, ["a", "b", "c"])
        np.savez(tmp_path / "raw.npz", train_x=train.x, train_y=train.labels, test_x=test.x, test_y=test.labels)
        assert main(["pack", str(tmp_path / "raw.npz"), "-o", str(tmp_path / "packed.npz")]) == 0
        for path in (pack_arrays(tmp_path / "mine.npz", train, test), tmp_path / "packed.npz"):
            loaded = load_packed(path)
            assert all(np.array_equal(a.x, b.x) and np.array_equal(a.labels, b.labels)
                       for a, b in zip((train, test), loaded, strict=True))
        assert loaded[0].input_size == shape[1:] and loaded[0].channels == shape[0]
    images = rng.integers(0, 256, (9, 5, 6, 1), dtype=np.uint8)  # image arrays load, and pack, as images
    np.savez(tmp_path / "raw.npz", train_x=images, train_y=np.arange(9) % 2, test_x=images[:3], test_y=[0, 1, 0])
    assert main(["pack", str(tmp_path / "raw.npz"), "-o", str(tmp_path / "packed.npz")]) == 0
    for path in (tmp_path / "raw.npz", tmp_path / "packed.npz"):
        train, test = load_packed(path)
        assert np.array_equal(train.images, images) and np.array_equal(test.labels, [0, 1, 0])


def test_a_ucr_set_loads_as_the_archive_splits_it():
    pytest.importorskip("aeon")
    from connlearn.train.data import load_ucr, ucr_sets

    assert {"GunPoint", "ItalyPowerDemand", "ArrowHead", "JapaneseVowels"} <= set(ucr_sets())
    train, test = load_ucr("GunPoint")
    assert train.x.shape == (50, 1, 150) and test.x.shape == (150, 1, 150) and train.class_names == ("1", "2")
    vowels, _ = load_ucr("JapaneseVowels")  # unequal lengths, padded at the end to the longest: the UEA's 29
    assert vowels.x.shape[1:] == (12, 29) and vowels.num_classes == 9 and (vowels.x[:, :, -1] == 0).any()


def test_the_array_loaders_standardise_each_channel_by_the_training_set():
    from connlearn.train.data import ArrayDataset

    rng = np.random.default_rng(1)
    train = ArrayDataset(rng.normal(3.0, 2.0, size=(64, 2, 9)), np.arange(64) % 2, ["a", "b"])
    loader, evaluation = make_loaders(train, train, 64, device="cpu", seed=0)
    x, _ = next(evaluation.epoch(0))
    assert torch.allclose(x.mean((0, 2)), torch.zeros(2), atol=1e-5)
    assert torch.allclose(x.std((0, 2), unbiased=False), torch.ones(2), atol=1e-4)
    assert sorted(torch.cat([y for _, y in loader.epoch(3)]).tolist()) == sorted(train.labels.tolist())
