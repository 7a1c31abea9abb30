"""Image folders read from disk (ImageNet): the file lists, the seeded augmentation, the loader's laws and
the ImageNet protocol end to end."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from PIL import Image

from connlearn.cli import train_script
from connlearn.data import DATA_ENV
from connlearn.errors import ConfigError, ConfigTypeError, DataError
from connlearn.experiment import CifarRun, run_cifar
from connlearn.folders import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    FolderLoader,
    ImageFiles,
    colour_jitter,
    crop_box,
    folder_loaders,
    image_files,
    lighting,
    load_imagenet,
)


def _image(path, width, height, seed):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)).save(path)


@pytest.fixture
def imagenet(tmp_path):
    """train/ and val/ of 3 classes, 4 images each, of mixed sizes and formats."""
    for split in ("train", "val"):
        for c, name in enumerate(("n02", "n01", "n03")):
            for i in range(4):
                _image(tmp_path / split / name / f"{i}.{'png' if i % 2 else 'jpg'}", 30 + 7 * i, 20 + 5 * c,
                       seed=100 * c + i + (0 if split == "train" else 50))
    return tmp_path


def test_the_files_are_listed_by_class_and_name_and_split_per_class(imagenet):
    files = image_files(imagenet / "train")
    assert files.class_names == ("n01", "n02", "n03") and len(files) == 12
    assert files.labels.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    assert files.paths[:2] == (str(imagenet / "train" / "n01" / "0.jpg"), str(imagenet / "train" / "n01" / "1.png"))
    rest, held = files.split(3)
    assert len(rest) == 9 and held.paths == tuple(str(imagenet / "train" / n / "3.png") for n in ("n01", "n02", "n03"))
    assert files.subset(6).labels.tolist() == [0, 0, 1, 1, 2, 2]


def test_an_epoch_is_the_same_read_again_with_any_number_of_workers_and_differs_from_the_next(imagenet):
    train = image_files(imagenet / "train")
    batches = {}
    for workers in (0, 2):
        loader = FolderLoader(train, 4, train=True, size=16, resize=20, seed=3, num_workers=workers)
        batches[workers] = [(x, y) for x, y in loader.epoch(1)]
        assert len(batches[workers]) == len(loader) == 3
    again = list(loader.epoch(1))
    for (x0, y0), (x2, y2), (xa, ya) in zip(batches[0], batches[2], again, strict=True):
        assert torch.equal(x0, x2) and torch.equal(x0, xa) and torch.equal(y0, y2) and torch.equal(y0, ya)
        assert x0.shape == (4, 3, 16, 16) and x0.dtype == torch.float32
    other = list(loader.epoch(2))
    assert not all(torch.equal(a[0], b[0]) for a, b in zip(batches[0], other, strict=True))


def test_an_epoch_begun_at_a_batch_gives_the_rest_of_that_epoch(imagenet):
    loader = FolderLoader(image_files(imagenet / "train"), 4, train=True, size=16, resize=20, seed=3, num_workers=0)
    whole = list(loader.epoch(1))
    for start in range(len(loader) + 1):
        rest = list(loader.epoch(1, start=start))
        assert len(rest) == len(whole) - start
        assert all(torch.equal(x, a) and torch.equal(y, b) for (x, y), (a, b) in zip(rest, whole[start:], strict=True))


def test_ranks_share_one_order_and_split_it(imagenet):
    train = image_files(imagenet / "train")
    loaders = [FolderLoader(train, 2, train=True, rank=r, world_size=2, num_workers=0) for r in (0, 1)]
    whole = FolderLoader(train, 2, train=True, num_workers=0).order(4)
    orders = [loader.order(4) for loader in loaders]
    assert torch.equal(orders[0], whole[0::2]) and torch.equal(orders[1], whole[1::2])
    assert set(orders[0].tolist()).isdisjoint(orders[1].tolist())


@pytest.mark.parametrize(("width", "height"), [(300, 200), (201, 333), (257, 256), (90, 60)])
def test_evaluation_is_torchvisions_resize_256_and_centre_crop_224(width, height, tmp_path):
    from torchvision import transforms as T

    _image(tmp_path / "val" / "c" / "a.png", width, height, seed=width)
    files = image_files(tmp_path / "val")
    x, _ = next(iter(FolderLoader(files, 1, train=False, num_workers=0).epoch(0)))
    reference = T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(), T.Normalize(IMAGENET_MEAN, IMAGENET_STD)])
    with Image.open(files.paths[0]) as image:
        torch.testing.assert_close(x[0], reference(image.convert("RGB")), atol=1e-5, rtol=0)


def test_a_training_image_is_cropped_jittered_lit_normalised_then_flipped_from_its_own_draws(imagenet):
    from torchvision.transforms import functional as TF

    files = image_files(imagenet / "train")
    loader = FolderLoader(files, 12, train=True, size=16, seed=5, num_workers=0)
    x, y = next(iter(loader.epoch(3)))
    flipped = 0
    for row, index in enumerate(loader.order(3).tolist()):
        rng = np.random.default_rng([5, 3, index])
        with Image.open(files.paths[index]) as image:
            left, top, w, h = crop_box(*image.size, rng)
            crop = TF.resized_crop(image.convert("RGB"), top, left, h, w, [16, 16], antialias=True)
        expected = np.asarray(crop, dtype=np.float32).transpose(2, 0, 1) / 255
        expected = lighting(colour_jitter(expected, rng), rng)
        expected = (expected - np.asarray(IMAGENET_MEAN, np.float32)[:, None, None]) / np.asarray(
            IMAGENET_STD, np.float32)[:, None, None]
        if rng.random() < 0.5:
            expected, flipped = expected[:, :, ::-1], flipped + 1
        torch.testing.assert_close(x[row], torch.from_numpy(expected.copy()), atol=1e-5, rtol=0)
        assert y[row] == files.labels[index]
    assert 0 < flipped < 12


class _Draws:
    """A stand-in for a NumPy generator that returns given draws."""

    def __init__(self, order, uniforms=(), normals=None):
        self.order, self.uniforms, self.normals = order, list(uniforms), normals

    def permutation(self, n):
        return np.asarray(self.order)

    def uniform(self, low, high):
        return self.uniforms.pop(0)

    def normal(self, mean, std, n):
        return np.asarray(self.normals)


def test_colour_jitter_blends_towards_black_the_mean_grey_and_each_pixels_grey_in_the_drawn_order():
    x = np.array([[[0.2, 0.8]], [[0.4, 0.6]], [[0.6, 0.1]]], dtype=np.float32)  # two pixels
    grey = np.array([0.299 * 0.2 + 0.587 * 0.4 + 0.114 * 0.6, 0.299 * 0.8 + 0.587 * 0.6 + 0.114 * 0.1])
    # brightness only, by 1 + 0.25
    np.testing.assert_allclose(colour_jitter(x, _Draws([0], [0.25])), x * 1.25, rtol=1e-6)
    # saturation by 1 - 0.5: halfway to each pixel's own grey
    np.testing.assert_allclose(colour_jitter(x, _Draws([2], [-0.5])), 0.5 * x + 0.5 * grey[None, None, :],
                               rtol=1e-6)
    # contrast by 1 + 0.5: away from the image's mean grey
    np.testing.assert_allclose(colour_jitter(x, _Draws([1], [0.5])), 1.5 * x - 0.5 * grey.mean(), rtol=1e-6)


def test_lighting_adds_the_eigenvectors_weighted_by_their_eigenvalues_and_draws():
    x = np.zeros((3, 1, 1), dtype=np.float32)
    shifted = lighting(x, _Draws([], normals=[1.0, 0.0, 0.0]))[:, 0, 0]  # the first principal component
    np.testing.assert_allclose(shifted, 0.2175 * np.array([-0.5675, -0.5808, -0.5836]), rtol=1e-6)
    shifted = lighting(x, _Draws([], normals=[0.0, 2.0, 0.0]))[:, 0, 0]
    np.testing.assert_allclose(shifted, 2 * 0.0188 * np.array([0.7192, -0.0045, -0.6948]), rtol=1e-5)


@given(st.integers(1, 400), st.integers(1, 400), st.integers(0, 2**32 - 1))
def test_a_random_crop_lies_inside_the_image(width, height, seed):
    left, top, w, h = crop_box(width, height, np.random.default_rng(seed))
    assert left >= 0 and top >= 0 and w > 0 and h > 0 and left + w <= width and top + h <= height


def test_random_crops_cover_8_to_100_percent_with_ratios_from_3_4_to_4_3():
    rng = np.random.default_rng(0)
    boxes = np.array([crop_box(400, 300, rng) for _ in range(500)])
    area, ratio = boxes[:, 2] * boxes[:, 3] / (400 * 300), boxes[:, 2] / boxes[:, 3]
    assert area.min() >= 0.075 and area.max() <= 1 and 0.35 < area.mean() < 0.6
    assert ratio.min() >= 0.74 and ratio.max() <= 1.34
    assert crop_box(1000, 10, rng) == (493, 0, 13, 10)  # nothing fits the ratio: the centre of the nearest


def test_zero_strength_colour_and_lighting_change_nothing():
    x = np.random.default_rng(0).random((3, 5, 7), dtype=np.float32)
    rng = np.random.default_rng(1)
    assert np.allclose(colour_jitter(x, rng, strength=0.0), x, atol=1e-6)
    assert np.array_equal(lighting(x, rng, std=0.0), x)
    grey = np.full((3, 4, 4), 0.5, dtype=np.float32)  # contrast and saturation keep a grey image grey
    jittered = colour_jitter(grey, np.random.default_rng(2))
    assert np.allclose(jittered, jittered[0, 0, 0], atol=1e-6)


def test_bad_folders_and_files_are_named(imagenet, tmp_path, monkeypatch):
    monkeypatch.delenv(DATA_ENV, raising=False)
    with pytest.raises(DataError, match="ImageNet has no download: pass --data FOLDER"):
        load_imagenet()
    with pytest.raises(DataError, match=r"train has no train/ or val/ folder; ImageNet's folder holds train/ and"):
        load_imagenet(imagenet / "train")
    monkeypatch.setenv(DATA_ENV, str(imagenet))
    assert len(load_imagenet()[1]) == 12
    (imagenet / "val" / "n04").mkdir()
    _image(imagenet / "val" / "n04" / "x.png", 8, 8, 0)
    with pytest.raises(DataError, match="train/ has 3 class folders and val/ 4"):
        load_imagenet(imagenet)
    with pytest.raises(DataError, match="expected one folder of images per class"):
        image_files(tmp_path / "train" / "n01" / "0.jpg")
    with pytest.raises(ConfigTypeError, match="files must be an ImageFiles"):
        FolderLoader([], 2, train=True)
    with pytest.raises(ConfigError, match="fewer than one batch of 20"):
        FolderLoader(image_files(imagenet / "train"), 20, train=True)
    with pytest.raises(DataError, match=r"labels must lie in 0 \.\. 0"):
        ImageFiles(["a.png", "b.png"], [0, 1], ["only"])
    (imagenet / "train" / "n02" / "9.png").write_bytes(b"not an image")
    loader = FolderLoader(image_files(imagenet / "train"), 13, train=True, num_workers=2, drop_last=False)
    with pytest.raises(DataError, match=r"^cannot read image .*n02/9\.png: cannot identify image file"):
        list(loader.epoch(0))


def test_imagenet_runs_take_its_schedule_and_defaults_and_never_fall_back_to_generated_data(tmp_path, monkeypatch):
    run = CifarRun(dataset="imagenet")
    assert (run.preset, run.epochs, run.out) == ("imagenet-50-4-32", 120, "runs/imagenet")
    with pytest.raises(ConfigError, match="imagenet is read from its image folders by DataLoader workers"):
        CifarRun(dataset="imagenet", loader="dataloader")
    with pytest.raises(ConfigError, match="workers apply to the DataLoader path"):
        CifarRun(dataset="cifar10", workers=2)
    monkeypatch.delenv(DATA_ENV, raising=False)
    with pytest.raises(DataError, match="ImageNet has no download"):
        run_cifar(CifarRun(dataset="imagenet", out=str(tmp_path / "run")))
    assert not (tmp_path / "run" / "log.jsonl").exists()


def test_folder_loaders_keep_evaluation_whole_and_in_order(imagenet):
    train, val = load_imagenet(imagenet)
    train_loader, val_loader = folder_loaders(train, val, 5, device="cpu", eval_batch_size=5, size=8, resize=10,
                                              num_workers=0)
    assert len(train_loader) == 2 and len(val_loader) == 3  # 12 // 5 full batches; 5 + 5 + 2 kept
    assert [len(y) for _, y in val_loader.epoch(0)] == [5, 5, 2]
    assert math.isclose(sum(len(y) for _, y in train_loader.epoch(0)), 10)


@pytest.mark.slow
def test_a_tiny_imagenet_run_trains_prunes_and_resumes(tmp_path, capsys):
    for split in ("train", "val"):
        for c in range(1000):  # the protocol wants ImageNet's 1000 classes; one small image each
            _image(tmp_path / "data" / split / f"n{c:05d}" / "a.png", 16, 12, seed=c + (0 if split == "train" else 7))
    out = tmp_path / "run"
    args = ["--data", str(tmp_path / "data"), "--epochs", "1", "--out", str(out), "--M", "16", "--C", "2", "--K", "1",
            "--width", "1", "--base-channels", "8", "--stem-channels", "4", "--batch-size", "50", "--no-progress",
            "--snapshot-every", "0", "--workers", "2"]
    assert train_script("imagenet", None, args) == 0
    printed = capsys.readouterr().out
    assert "imagenet-50-4-32 with M=16" in printed and "on imagenet: 1000 train / 1000 eval images" in printed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["dataset"] == "imagenet" and summary["params_test"] <= summary["params_train"]
    assert (out / "pruned.pt").is_file() and (out / "connectivity.dot").is_file()
    log = (out / "log.jsonl").read_text()
    assert train_script("imagenet", None, args) == 0 and (out / "log.jsonl").read_text() == log


def test_the_folder_loader_benchmark_runs_and_writes_its_json(tmp_path, monkeypatch):
    import sys

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import folder_loader

    out = tmp_path / "r.json"
    monkeypatch.setattr(sys, "argv", ["folder_loader.py", "--images", "12", "--batch-size", "4", "--workers", "0",
                                      "--repeats", "1", "--json", str(out)])
    folder_loader.main()
    runs = json.loads(out.read_text())["runs"]
    assert [(r["workers"], r["train"]) for r in runs] == [(0, True), (0, False)]
    assert all(r["images_per_s"] > 0 for r in runs)
