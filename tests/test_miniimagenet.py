"""Mini-ImageNet: packing an image folder as the paper uses it, and its protocol end to end."""

import json
import shutil

import numpy as np
import pytest
import torch
from PIL import Image

from connlearn import experiment
from connlearn.cli import main, train_script
from connlearn.data import DATA_ENV, load_dataset, load_packed, make_loaders, pack, read_image_folder, synthetic
from connlearn.errors import ConfigError, DataError, UnknownNameError
from connlearn.experiment import PROTOCOLS, CifarRun, run_cifar
from connlearn.recipe import get_recipe

TINY = ["--M", "3", "--C", "2", "--K", "1", "--width", "1", "--base-channels", "4", "--stem-channels", "4",
        "--batch-size", "32", "--no-progress", "--snapshot-every", "0"]


def _colour(c: int, i: int) -> tuple[int, int, int]:
    return (40 * c + 10, 30 * i + 5, 200)


@pytest.fixture
def class_folders(tmp_path):
    """3 classes of 5 solid-colour images each, of mixed sizes; every image's colour names its class and index."""
    root = tmp_path / "images"
    for c, name in enumerate(("cat", "ant", "bee")):  # not in sorted order: ImageFolder sorts the classes
        (root / name).mkdir(parents=True)
        for i in range(5):
            Image.new("RGB", (20 + 3 * i, 16 + c), _colour(c, i)).save(root / name / f"img{i}.png")
    return root


def test_a_folder_of_class_folders_is_resized_and_split_per_class_with_the_last_files_held_out(class_folders,
                                                                                               tmp_path, capsys):
    out = tmp_path / "mini.npz"
    assert main(["pack", str(class_folders), "--size", "12", "--test-per-class", "2", "-o", str(out)]) == 0
    assert "9 train and 6 test images of 12x12, 3 classes" in capsys.readouterr().out
    train, test = load_packed(out)
    assert train.class_names == test.class_names == ("ant", "bee", "cat")
    assert train.image_size == test.image_size == (12, 12)
    folder_class = {"cat": 0, "ant": 1, "bee": 2}  # the colour's class index
    for split, files in ((train, range(3)), (test, range(3, 5))):
        assert np.bincount(split.labels).tolist() == [len(files)] * 3
        for image, label in zip(split.images, split.labels, strict=True):
            c = folder_class[train.class_names[label]]
            assert tuple(image[6, 6]) in {_colour(c, i) for i in files}  # solid colours survive the resize


def test_train_and_test_folders_keep_their_split(class_folders, tmp_path):
    root = tmp_path / "split"
    for split in ("train", "test"):
        shutil.copytree(class_folders, root / split)
    assert main(["pack", str(root), "--size", "8", "-o", str(tmp_path / "m.npz")]) == 0
    train, test = load_packed(tmp_path / "m.npz")
    assert len(train) == len(test) == 15 and train.image_size == (8, 8)


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_bad_folders_and_flags_are_named_in_one_line(class_folders, tmp_path, capsys):
    out = str(tmp_path / "m.npz")
    assert main(["pack", str(class_folders), "-o", out]) == 1
    assert "no train/ and test/ folders: give --test-per-class N" in _one_line(capsys)
    assert main(["pack", str(class_folders), "--test-per-class", "1", "-o", out]) == 1
    line = _one_line(capsys)
    assert f"{class_folders / 'ant' / 'img1.png'} is 23x17 but" in line and "give size (--size on the" in line
    for per_class in (5, 6):  # every class keeps a training image
        assert main(["pack", str(class_folders), "--size", "8", "--test-per-class", str(per_class), "-o", out]) == 1
        assert (f"--test-per-class {per_class} leaves no training image of class 'ant', which has 5"
                in _one_line(capsys))
    assert main(["pack", "cifar10", "--size", "8", "-o", out]) == 1
    assert "--size applies to an image folder, not to cifar10" in _one_line(capsys)
    assert main(["pack", str(tmp_path / "nothing"), "-o", out]) == 1
    assert "neither cifar10/cifar100 nor a folder of images" in _one_line(capsys)
    (class_folders / "bee" / "broken.png").write_bytes(b"not an image")
    assert main(["pack", str(class_folders), "--size", "8", "--test-per-class", "1", "-o", out]) == 1
    assert "broken.png" in _one_line(capsys)
    assert not (tmp_path / "m.npz").exists()
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="expected one folder of images per class"):
        read_image_folder(tmp_path / "empty")


def test_without_a_packed_file_mini_imagenet_says_how_to_make_one(tmp_path, monkeypatch):
    monkeypatch.delenv(DATA_ENV, raising=False)
    with pytest.raises(DataError, match=r"no packed miniimagenet file found: make one with connlearn pack FOLDER "
                                        r"--size 84 --test-per-class 100"):
        load_dataset("miniimagenet")
    with pytest.raises(DataError, match=rf"found in {tmp_path}: make one"):
        load_dataset("miniimagenet", tmp_path)


def test_each_dataset_has_its_presets_and_its_own_default():
    assert CifarRun().preset == "cifar-29-8-8"
    assert CifarRun(dataset="miniimagenet").preset == "miniimagenet-29-8-8"
    with pytest.raises(ConfigError, match="preset 'cifar-20-4-8' is not one of miniimagenet's; its presets: "
                                          "miniimagenet-20-4-8, miniimagenet-29-8-8"):
        CifarRun(dataset="miniimagenet", preset="cifar-20-4-8")
    with pytest.raises(UnknownNameError, match="did you mean 'miniimagenet-20-4-8'"):
        CifarRun(dataset="miniimagenet", preset="miniimagenet-20-4-9")
    run = CifarRun(dataset="miniimagenet", epochs=8)
    assert experiment.make_recipe(run) == get_recipe("miniimagenet").scaled(8)
    assert experiment.make_recipe(run).batch_size == 256


def test_the_loaders_cut_a_random_64_crop_for_training_and_the_centre_one_for_testing():
    protocol = PROTOCOLS["miniimagenet"]
    train, test = synthetic(num_classes=4, n_train=8, n_test=4, size=protocol.image_size)
    train_loader, test_loader = make_loaders(train, test, 4, device="cpu", crop=protocol.crop, pad=protocol.pad)
    x, _ = next(iter(train_loader.epoch(0)))
    assert x.shape == (4, 3, 64, 64)
    plan = train_loader.plan(0)
    assert plan.offsets.min() >= 0 and plan.offsets.max() <= 84 - 64 and len(set(plan.offsets[:, 0].tolist())) > 1
    x, _ = next(iter(test_loader.epoch(0)))
    mean = test_loader.mean
    expected = torch.from_numpy(test.images[:4]).permute(0, 3, 1, 2).float() / 255 - mean
    torch.testing.assert_close(x, expected[:, :, 10:74, 10:74])


def test_a_mini_imagenet_run_trains_on_a_packed_file_and_resumes(tmp_path, capsys):
    train, test = synthetic(num_classes=100, n_train=300, n_test=100, size=84)
    data = pack(tmp_path / "miniimagenet.npz", train, test, format="jpeg")
    out = tmp_path / "run"
    args = ["--epochs", "1", "--data", str(tmp_path), "--out", str(out), *TINY]
    assert train_script("miniimagenet", None, args) == 0
    printed = capsys.readouterr().out
    assert "miniimagenet-29-8-8" in printed and "on miniimagenet: 300 train / 100 eval images" in printed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["dataset"] == "miniimagenet" and summary["preset"] == "miniimagenet-29-8-8"
    assert summary["run"]["data"] == str(tmp_path) and data.is_file()
    from connlearn.checkpoint import net_from_checkpoint

    net = net_from_checkpoint(out / "last.pt")
    assert net.graph().nodes["input"]["image_size"] == 64 and net.num_classes == 100
    log = (out / "log.jsonl").read_text()
    assert train_script("miniimagenet", None, args) == 0  # resumes: nothing to do
    assert (out / "log.jsonl").read_text() == log
    pack(data, train.subset(200), test, format="jpeg")  # the same path, other contents: refused
    assert train_script("miniimagenet", None, [*args[:-len(TINY)], *TINY, "--epochs", "2"]) == 1
    assert "data train_images=300 there, 200 here" in capsys.readouterr().err


def test_mini_imagenet_data_of_another_image_size_is_refused_before_training(tmp_path, capsys):
    train, test = synthetic(num_classes=100, n_train=100, n_test=100, size=64)
    pack(tmp_path / "miniimagenet.npz", train, test)
    assert train_script("miniimagenet", None, ["--data", str(tmp_path), "--out", str(tmp_path / "run"), *TINY]) == 1
    assert ("the miniimagenet data found has 64x64 images; its protocol takes 84x84; pack them again with connlearn "
            "pack FOLDER --size 84") in capsys.readouterr().err
    assert not (tmp_path / "run" / "log.jsonl").exists()


def test_offline_a_mini_imagenet_run_falls_back_to_generated_84_pixel_images(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(DATA_ENV, raising=False)
    run = CifarRun(dataset="miniimagenet", epochs=1, train_subset=200, test_subset=100, M=3, C=2, K=1, width=1,
                   base_channels=4, stem_channels=4, batch_size=32, progress=False, snapshot_every=0,
                   out=str(tmp_path / "run"))
    seen = {}
    make = experiment.make_loaders

    def spy(train, test, *args, **kwargs):
        seen.update(size=train.image_size, crop=kwargs["crop"], pad=kwargs["pad"])
        return make(train, test, *args, **kwargs)

    monkeypatch.setattr(experiment, "make_loaders", spy)
    summary = run_cifar(run)
    assert "generated dataset" in capsys.readouterr().out and summary["dataset"] == "generated"
    assert seen == {"size": (84, 84), "crop": 64, "pad": 0}
