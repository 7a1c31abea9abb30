"""Every file connlearn writes is written whole or not at all, by one writer (connlearn.files)."""

import importlib.util
import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import RandomLoader, disk_full_after, tiny

import connlearn
import connlearn.files
from connlearn import plots, render
from connlearn.checkpoint import save_atomic
from connlearn.data import ImageDataset, load_packed, pack
from connlearn.errors import ConfigError
from connlearn.export import export, onnx_files, onnx_supported
from connlearn.files import (
    NAME_MAX,
    expand_home,
    remove_leftovers,
    temporary_name,
    write_atomic,
    write_bytes_atomic,
)
from connlearn.prune import prune_dead_blocks
from connlearn.recipe import get_recipe
from connlearn.train import Trainer


def _names(folder):
    return sorted(p.name for p in folder.iterdir())


@pytest.mark.parametrize("length", [NAME_MAX - 5, NAME_MAX - 1, NAME_MAX])
def test_a_file_whose_name_is_near_the_longest_allowed_is_written(tmp_path, length):
    path = tmp_path / ("n" * (length - 3) + ".pt")
    save_atomic({"w": torch.ones(2)}, path)
    assert _names(tmp_path) == [path.name]
    assert torch.equal(torch.load(path, weights_only=True)["w"], torch.ones(2))


def test_a_long_name_of_many_byte_characters_is_cut_on_a_characters_boundary(tmp_path):
    name = "é" * 126 + ".txt"  # 256 bytes in UTF-8 with the dot: over the limit with any temporary's tail
    tmp = temporary_name(tmp_path / name)
    assert len(tmp.name.encode()) <= NAME_MAX and tmp.name.startswith(".é") and tmp.name.endswith(".tmp")
    assert tmp.name.encode().decode() == tmp.name  # whole characters only


def test_temporaries_are_hidden_unique_and_name_their_file_and_process(tmp_path):
    names = {temporary_name(tmp_path / "last.pt").name for _ in range(50)}
    assert len(names) == 50
    assert all(n.startswith(f".last.pt.{os.getpid()}.") and n.endswith(".tmp") for n in names)


def test_writers_of_one_file_at_once_each_replace_it_whole(tmp_path):
    """Every rank of a job drawing the same diagram: no writer fails, the file is one writer's whole."""
    path = tmp_path / "shared.bin"
    contents = [bytes([i]) * 200_000 for i in range(8)]
    errors = []

    def writer(data):
        try:
            for _ in range(5):
                write_bytes_atomic(path, data)
        except Exception as exc:  # collected for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(c,)) for c in contents]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert path.read_bytes() in contents
    assert _names(tmp_path) == ["shared.bin"]


def test_an_interrupted_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = write_bytes_atomic(tmp_path / "a.txt", b"old")

    def interrupted(f):
        f.write(b"new, half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_atomic(path, interrupted)
    assert path.read_bytes() == b"old" and _names(tmp_path) == ["a.txt"]


def test_a_write_into_a_missing_folder_names_the_file_asked_for(tmp_path):
    with pytest.raises(FileNotFoundError) as caught:
        write_bytes_atomic(tmp_path / "missing" / "a.txt", b"x")
    assert caught.value.filename == str(tmp_path / "missing" / "a.txt")


def test_the_rename_is_flushed_to_disk_with_its_folder(tmp_path, monkeypatch):
    synced = []
    fsync = os.fsync

    def recording(fd):
        synced.append(stat.S_ISDIR(os.fstat(fd).st_mode))
        fsync(fd)

    monkeypatch.setattr(connlearn.files.os, "fsync", recording)
    write_bytes_atomic(tmp_path / "a.txt", b"x")
    assert synced == [False, True]  # the file's data, then the folder's entry


def test_a_written_file_has_the_permissions_of_any_new_file(tmp_path):
    umask = os.umask(0o022)
    try:
        path = write_bytes_atomic(tmp_path / "a.txt", b"x")
    finally:
        os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


# ---------------------------------------------------------------------------- each writer of the library
def test_a_figure_that_cannot_be_written_leaves_the_one_before(tmp_path, monkeypatch):
    log = [{"epoch": e, "train_loss": 1.0 / e, "test_top1": 10.0 * e} for e in (1, 2, 3)]
    path = plots.plot_training_curves(log, tmp_path / "curves.png")
    before = path.read_bytes()
    disk_full_after(monkeypatch, 100)
    with pytest.raises(OSError, match="No space left on device"):
        plots.plot_training_curves(log[:2], path)
    assert path.read_bytes() == before and _names(tmp_path) == ["curves.png"]


def test_a_drawing_that_cannot_be_written_leaves_the_one_before(tmp_path, monkeypatch):
    graph = connlearn.build(**tiny()).graph()
    render.save(graph, tmp_path / "net.dot")
    before = (tmp_path / "net.dot").read_bytes()
    disk_full_after(monkeypatch, 10)
    with pytest.raises(OSError, match="No space left on device") as caught:
        render.save(graph, tmp_path / "net.dot", title="another")
    assert caught.value.filename == str(tmp_path / "net.dot")
    assert (tmp_path / "net.dot").read_bytes() == before and _names(tmp_path) == ["net.dot"]


@pytest.mark.parametrize("form", ["torchscript", "export"])
def test_an_export_that_cannot_be_written_is_named_and_leaves_the_one_before(tmp_path, monkeypatch, form):
    pruned = prune_dead_blocks(connlearn.build(**tiny(gate="random", K=1, M=6)))[0].eval()
    path = export(pruned, tmp_path / f"net.{'ts' if form == 'torchscript' else 'pt2'}", form)
    before = path.read_bytes()
    disk_full_after(monkeypatch, 1000)
    with pytest.raises(ConfigError, match=rf"cannot write .*{path.name}: No space left on device$"):
        export(pruned, path, form)
    assert path.read_bytes() == before and _names(tmp_path) == [path.name]


def test_a_packed_dataset_that_cannot_be_written_leaves_the_one_before(tmp_path, monkeypatch):
    images = np.zeros((4, 8, 8, 3), np.uint8)
    data = ImageDataset(images, np.arange(4) % 2, ("a", "b"))
    path = pack(tmp_path / "d.npz", data, data, format="png")
    before = path.read_bytes()
    disk_full_after(monkeypatch, 50)
    with pytest.raises(OSError, match="No space left on device"):
        pack(path, data, data, format="png")
    assert path.read_bytes() == before and _names(tmp_path) == ["d.npz"]
    assert len(load_packed(path)[0]) == 4


_ONNX = pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in ("onnx", "onnxscript"))
                           or not onnx_supported(), reason="ONNX export needs PyTorch 2.5 or newer and the onnx extra")


@_ONNX
def test_an_onnx_export_that_fails_leaves_the_files_before_and_no_staging_folder(tmp_path, monkeypatch):
    pruned = prune_dead_blocks(connlearn.build(**tiny(gate="random", K=1, M=6)))[0].eval()
    path = export(pruned, tmp_path / "net.onnx", "onnx")
    before = {p.name: p.read_bytes() for p in onnx_files(path)}
    exporter = torch.onnx.export

    def half_written(model, args, f, dynamo=False, **kw):  # the exporter writes its files, then the disk fills
        exporter(model, args, f, dynamo=dynamo, **kw)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch.onnx, "export", half_written)
    other = prune_dead_blocks(connlearn.build(**tiny(gate="random", K=1, M=6, seed=1)))[0].eval()
    with pytest.raises(ConfigError, match=r"cannot write .*net\.onnx: No space left on device$"):
        export(other, path, "onnx")
    assert {p.name: p.read_bytes() for p in onnx_files(path)} == before and _names(tmp_path) == sorted(before)


@_ONNX
def test_an_onnx_model_holding_its_own_weights_removes_the_weights_file_an_earlier_export_left(tmp_path,
                                                                                              monkeypatch):
    pruned = prune_dead_blocks(connlearn.build(**tiny(gate="random", K=1, M=6)))[0].eval()
    path = export(pruned, tmp_path / "net.onnx", "onnx")
    assert len(onnx_files(path)) == 2
    exporter = torch.onnx.export

    def one_file(model, args, f, dynamo=False, **kw):  # as for a model small enough to hold its weights
        exporter(model, args, f, dynamo=dynamo, external_data=False, **kw)

    monkeypatch.setattr(torch.onnx, "export", one_file)
    export(pruned, path, "onnx")
    assert onnx_files(path) == [path] and _names(tmp_path) == ["net.onnx"]


# ---------------------------------------------------------------------------- a kill mid-write
def test_a_kill_mid_write_leaves_the_old_file_and_the_next_run_removes_the_temporary_left(tmp_path):
    path = write_bytes_atomic(tmp_path / "last.pt", b"old")
    child = subprocess.Popen([sys.executable, "-c", "import sys, time; from connlearn.files import write_atomic\n"
                              "write_atomic(sys.argv[1], lambda f: (f.write(b'new, half'), f.flush(), time.sleep(60)))",
                              str(path)], env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        deadline = time.monotonic() + 60
        while not list(tmp_path.glob(".last.pt.*.tmp")) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        child.kill()
        child.wait()
    left = list(tmp_path.glob(f".last.pt.{child.pid}.*.tmp"))
    assert path.read_bytes() == b"old" and len(left) == 1
    other = tmp_path / f".notes.txt.{child.pid}.0123abcd.tmp"  # not a file the trainer writes: kept
    other.write_bytes(b"")
    Trainer(connlearn.build(**tiny()), RandomLoader(), None, get_recipe("cifar").scaled(4), out_dir=tmp_path,
            progress=False).fit(resume=False, max_epochs=0)
    assert not left[0].exists() and other.exists()


def test_only_the_temporaries_of_the_files_named_are_removed(tmp_path):
    names = [".a.pt.12.0123abcd.tmp", "..next.pt.7.89abcdef.tmp", ".a.pt.tmp", ".b.pt.12.0123abcd.tmp",
             ".a.pt.x.0123abcd.tmp", "a.pt"]
    for name in names:
        (tmp_path / name).write_bytes(b"")
    removed = remove_leftovers(tmp_path, ["a.pt", ".next.pt"])
    assert sorted(p.name for p in removed) == sorted(names[:2])
    assert _names(tmp_path) == sorted(names[2:])


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX file names are bytes")
def test_a_file_whose_name_is_no_utf8_is_written(tmp_path):
    path = tmp_path / os.fsdecode(b"caf\xe9.bin")  # Latin-1, as an old file system may hold
    write_bytes_atomic(path, b"x")
    assert path.read_bytes() == b"x" and os.listdir(os.fsencode(tmp_path)) == [b"caf\xe9.bin"]
    long = tmp_path / os.fsdecode(b"\xe9" * 300)  # too long, and cut short as bytes
    assert len(os.fsencode(temporary_name(long).name)) <= NAME_MAX


def test_a_name_beginning_with_a_tilde_of_no_user_stays_as_it_is(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert expand_home("~no-such-user-here.pt") == Path("~no-such-user-here.pt")
    write_bytes_atomic("~no-such-user-here.pt", b"x")
    assert (tmp_path / "~no-such-user-here.pt").read_bytes() == b"x"


def test_a_run_folder_loses_every_temporary_a_kill_left(tmp_path):
    names = [".curves.png.12.0123abcd.tmp", ".summary.json.7.89abcdef.tmp", ".notes.tmp"]
    for name in names:
        (tmp_path / name).write_bytes(b"")
    assert sorted(p.name for p in remove_leftovers(tmp_path)) == sorted(names[:2])
    assert _names(tmp_path) == [".notes.tmp"]
