"""File-system faults: a full disk while writing checkpoints and run records, two processes in one folder."""

import errno
import json
import os
import re
import sys
import threading
import time

import pytest
import torch
from conftest import RandomLoader, disk_full_after, tiny

import connlearn
import connlearn.files
from connlearn.checkpoint import load_checkpoint, save_atomic
from connlearn.errors import CheckpointWriteError, ConfigError
from connlearn.recipe import get_recipe
from connlearn.train import Trainer

RECIPE = get_recipe("cifar").scaled(4)


@pytest.mark.parametrize("room", [0, 100, 20_000])  # torch's zip writer fails differently at each
def test_a_disk_full_while_writing_a_checkpoint_is_an_oserror_naming_it_and_keeps_the_old_one(
        tmp_path, monkeypatch, room):
    net = connlearn.build(**tiny())
    old = {"weights": torch.zeros(3)}
    save_atomic(old, tmp_path / "last.pt")
    disk_full_after(monkeypatch, room)
    with pytest.raises(OSError) as caught:
        save_atomic({"weights": torch.ones(10_000), "model": net.state_dict()}, tmp_path / "last.pt")
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == str(tmp_path / "last.pt")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]  # no temporary left
    assert torch.equal(torch.load(tmp_path / "last.pt", weights_only=True)["weights"], old["weights"])


def test_a_disk_full_at_a_trainers_save_names_the_checkpoint_and_what_it_still_holds_and_resume_is_exact(
        tmp_path, monkeypatch):
    def trainer(out):
        return Trainer(connlearn.build(**tiny()), RandomLoader(), None, RECIPE, out_dir=out, progress=False)

    reference = trainer(tmp_path / "reference")
    reference.fit()
    disk_full_after(monkeypatch, 100, nth=3, named=".next.pt")  # epoch 3 (no evaluation: no best.pt)
    t = trainer(tmp_path / "run")
    with pytest.raises(CheckpointWriteError, match=r"cannot write the checkpoint after epoch 3 to .*last\.pt: No "
                                                   r"space left on device; .*last\.pt still holds epoch 2") as caught:
        t.fit()
    assert isinstance(caught.value, OSError) and caught.value.errno == errno.ENOSPC  # what callers caught before
    assert load_checkpoint(tmp_path / "run" / "last.pt")["epoch"] == 2
    monkeypatch.undo()
    resumed = trainer(tmp_path / "run")
    resumed.fit()
    for a, b in zip(reference.history, resumed.history, strict=True):
        assert a["train_loss"] == b["train_loss"]


def _offline(monkeypatch):
    from connlearn import experiment
    from connlearn.data import DATA_ENV
    from connlearn.errors import DataError

    monkeypatch.delenv(DATA_ENV, raising=False)

    def nothing(name, data=None, **kw):
        raise DataError("no data")

    monkeypatch.setattr(experiment, "load_dataset", nothing)


def test_a_disk_full_while_writing_summary_json_leaves_the_one_before_whole(tmp_path, monkeypatch):
    from connlearn.experiment import CifarRun, run_cifar

    _offline(monkeypatch)
    run = CifarRun(dataset="cifar10", gate="topk", K=1, M=3, C=2, width=1, base_channels=4, stem_channels=4,
                   epochs=4, train_subset=64, test_subset=32, batch_size=32, out=str(tmp_path), progress=False)
    run_cifar(run)
    before = (tmp_path / "summary.json").read_text()
    disk_full_after(monkeypatch, len(before) // 2, named="summary.json")  # the disk fills halfway through it
    with pytest.raises(OSError, match="No space left on device") as caught:
        run_cifar(run)  # finished: it prunes, draws and writes its summary again
    assert caught.value.filename == str(tmp_path / "summary.json")
    assert (tmp_path / "summary.json").read_text() == before
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_a_sweep_takes_a_run_whose_summary_json_was_cut_short_as_unfinished(tmp_path, capsys):
    from accuracy import collect

    (tmp_path / "topk4-s0").mkdir()
    (tmp_path / "topk4-s0" / "summary.json").write_text('{\n  "dataset": "cifar10",\n  "pres')
    (tmp_path / "full-s0").mkdir()
    (tmp_path / "full-s0" / "summary.json").write_text(json.dumps({"test_top1": 50.0}))
    (tmp_path / "random4-s0").mkdir()
    (tmp_path / "random4-s0" / "summary.json").write_text("[]")  # JSON, but no run's summary
    state = collect(tmp_path, {"runs": {"topk4-s0": {"test_top1": 1.0}}})  # taken as finished by an earlier read
    assert sorted(state["runs"]) == ["full-s0"]
    out = capsys.readouterr().out
    assert "topk4-s0 counts as unfinished" in out and "random4-s0 counts as unfinished" in out


def test_a_second_process_training_in_the_same_folder_is_refused_by_name_and_a_killed_one_leaves_no_lock(tmp_path):
    import signal
    import subprocess
    import sys

    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from connlearn.checkpoint import folder_lock\n"
         f"with folder_lock({str(tmp_path)!r}, 'a sweep'):\n    print('held', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / ".lock").exists() or b"sweep" not in (tmp_path / ".lock").read_bytes():
            assert holder.poll() is None and time.monotonic() < deadline, "the holder did not take the folder"
            time.sleep(0.05)
        t = Trainer(connlearn.build(**tiny()), RandomLoader(), None, RECIPE, out_dir=tmp_path, progress=False)
        with pytest.raises(ConfigError, match=rf"{re.escape(str(tmp_path))} is in use by process {holder.pid} on "
                                              ".*, running a sweep there: .*another output folder"):
            t.fit()
        assert not (tmp_path / "last.pt").exists() and not (tmp_path / "log.jsonl").exists()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    t.fit(max_epochs=1)  # the killed holder's lock went with it
    assert load_checkpoint(tmp_path / "last.pt")["epoch"] == 1


def test_a_disk_full_while_rewriting_a_log_names_it_and_leaves_no_temporary(tmp_path, monkeypatch):
    from connlearn.train import write_jsonl

    write_jsonl(tmp_path / "log.jsonl", [{"epoch": 1}])
    disk_full_after(monkeypatch, 20)  # the disk fills halfway through the file
    with pytest.raises(OSError) as caught:
        write_jsonl(tmp_path / "log.jsonl", [{"epoch": 1}, {"epoch": 2}])
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == str(tmp_path / "log.jsonl")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log.jsonl"]
    assert (tmp_path / "log.jsonl").read_text() == '{"epoch": 1}\n'


def test_a_save_stopped_between_its_two_renames_resumes_from_the_newer_checkpoint_exactly(tmp_path, recwarn):
    import shutil

    def trainer(out):
        return Trainer(connlearn.build(**tiny()), RandomLoader(), None, RECIPE, out_dir=out, progress=False)

    reference = trainer(tmp_path / "reference")
    reference.fit(max_epochs=3)
    run = tmp_path / "run"  # as _save leaves it when killed after moving last.pt to previous.pt
    run.mkdir()
    shutil.copy(tmp_path / "reference" / "last.pt", run / ".next.pt")  # epoch 3, whole
    shutil.copy(tmp_path / "reference" / "previous.pt", run / "previous.pt")  # epoch 2
    resumed = trainer(run)
    resumed.fit()
    reference.fit()
    assert resumed.epoch == RECIPE.total_epochs
    assert not [w for w in recwarn.list if "resuming from" in str(w.message)]  # from .next.pt, not previous.pt
    assert [r["train_loss"] for r in resumed.history] == [r["train_loss"] for r in reference.history]
    assert sorted(p.name for p in run.iterdir() if p.suffix == ".pt") == ["last.pt", "previous.pt"]


def test_a_failing_tensorboard_writer_is_turned_off_with_a_warning_and_training_goes_on(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    from torch.utils import tensorboard

    class FullDisk(tensorboard.SummaryWriter):
        def add_scalar(self, *args, **kwargs):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(tensorboard, "SummaryWriter", FullDisk)
    t = Trainer(connlearn.build(**tiny()), RandomLoader(), None, RECIPE, out_dir=tmp_path, progress=False,
                tensorboard=True)
    with pytest.warns(UserWarning, match=r"TensorBoard logging to .*tb failed \(OSError: .*No space left.*\); it is "
                                         "off for the rest of this run"):
        t.fit()
    assert t.epoch == RECIPE.total_epochs
    assert len((tmp_path / "log.jsonl").read_text().splitlines()) == RECIPE.total_epochs


def test_a_disk_full_while_writing_best_pt_names_best_pt(tmp_path, monkeypatch):
    disk_full_after(monkeypatch, 100, named="best.pt")  # a save with an evaluation writes best.pt first
    t = Trainer(connlearn.build(**tiny()), RandomLoader(), RandomLoader(seed=1), RECIPE, out_dir=tmp_path,
                progress=False)
    with pytest.raises(CheckpointWriteError, match=rf"after epoch 1 to {re.escape(str(tmp_path / 'best.pt'))}: No "
                                                   "space left on device; no checkpoint was written") as caught:
        t.fit()
    assert caught.value.filename == str(tmp_path / "best.pt") and caught.value.errno == errno.ENOSPC


def test_another_thread_of_the_process_is_refused_a_held_folder_and_the_same_thread_nests(tmp_path):
    from connlearn.checkpoint import folder_lock

    errors = []

    def other():
        try:
            with folder_lock(tmp_path):
                pass
        except ConfigError as exc:
            errors.append(str(exc))

    with folder_lock(tmp_path, "a sweep"), folder_lock(tmp_path):  # nested in one thread: one hold
        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
    assert len(errors) == 1 and "another thread of this process" in errors[0]
    with folder_lock(tmp_path):  # released
        pass


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_child_holds_nothing_of_its_parents_and_cannot_take_a_folder_the_parent_holds(tmp_path):
    from connlearn.checkpoint import folder_lock

    with folder_lock(tmp_path):
        pid = os.fork()
        if pid == 0:  # the child (a DataLoader worker, say): the parent's hold is not its own
            try:
                with folder_lock(tmp_path):
                    os._exit(0)
            except ConfigError:
                os._exit(3)
            os._exit(1)
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 3


@pytest.mark.skipif(sys.platform == "win32", reason="no flock on Windows")
def test_a_file_system_that_refuses_flock_runs_unguarded_and_says_so(tmp_path, monkeypatch):
    import fcntl

    from connlearn.checkpoint import folder_lock

    def refused(fd, op):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", refused)
    said = rf"cannot hold {re.escape(str(tmp_path))} \(No locks available: its file system refuses flock\): nothing"
    with pytest.warns(UserWarning, match=said), folder_lock(tmp_path):
        pass
