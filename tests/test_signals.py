"""Stopping on a signal: training stops at the next step with a checkpoint, and a resume ends as if it had not."""

import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch
from conftest import RandomLoader, tiny
from PIL import Image
from test_train import RECIPE, _assert_same_state, _without_timings

import connlearn
from connlearn.checkpoint import load_checkpoint
from connlearn.data import DataLoaderPath, synthetic
from connlearn.errors import ConfigError, ConfigTypeError
from connlearn.folders import FolderLoader, image_files
from connlearn.signals import STOP_SIGNALS, StopSignals, TrainingStopped, check_signals
from connlearn.train import Trainer, read_jsonl


class _Signalling(RandomLoader):
    """Sends this process ``signals`` when asked for its ``at``-th batch of the run (counting from 1)."""

    def __init__(self, at, *signals):
        super().__init__()
        self.left, self.signals = at, signals

    def epoch(self, epoch):
        for batch in super().epoch(epoch):
            self.left -= 1
            if self.left == 0:
                for s in self.signals:
                    os.kill(os.getpid(), s)
            yield batch


def _trainer(out, loader=None):
    net = connlearn.build(**tiny(gate_init="uniform"))
    return Trainer(net, loader or RandomLoader(), RandomLoader(n=32, seed=1), RECIPE, out_dir=out, progress=False,
                   snapshot_every=2)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    t = _trainer(tmp_path_factory.mktemp("full"))
    t.fit()
    return t


def _assert_same_run(t, uninterrupted):
    _assert_same_state(t.net, uninterrupted.net)
    assert _without_timings(t.history) == _without_timings(uninterrupted.history)
    assert _without_timings(read_jsonl(t.out_dir / "log.jsonl")) == _without_timings(uninterrupted.history)
    assert read_jsonl(t.out_dir / "gates.jsonl") == read_jsonl(uninterrupted.out_dir / "gates.jsonl")


# 4 batches an epoch. A signal while batch 6 is read stops after it (epoch 2, batch 2); one while the epoch's
# last batch is read lets the epoch end, with its evaluation and checkpoint, and stops before the next.
@pytest.mark.parametrize(("sig", "at", "epoch", "batch"), [(signal.SIGTERM, 6, 1, 2), (signal.SIGINT, 1, 0, 1),
                                                           (signal.SIGUSR1, 8, 2, 0)])
def test_a_signal_stops_training_at_the_next_step_with_a_checkpoint_and_a_resume_ends_bit_identical(
        uninterrupted, tmp_path, sig, at, epoch, batch):
    before = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    first = _trainer(tmp_path, _Signalling(at, sig))
    with pytest.raises(TrainingStopped) as stopped:
        first.fit(stop_signals=STOP_SIGNALS)
    assert isinstance(stopped.value, SystemExit) and not isinstance(stopped.value, Exception)
    assert (stopped.value.signal, stopped.value.code, stopped.value.epoch, stopped.value.batch) == (
        sig, 128 + sig, epoch, batch)
    assert str(tmp_path / "last.pt") in str(stopped.value)
    assert {s: signal.getsignal(s) for s in STOP_SIGNALS} == before
    saved = load_checkpoint(tmp_path / "last.pt")
    assert (saved["epoch"], saved["step"]) == (epoch, 4 * epoch + batch)
    assert (saved.get("within_epoch") or {}).get("batch", 0) == batch
    shutil.copytree(tmp_path, tmp_path / "copy")
    first.train_loader = RandomLoader()  # the trainer that stopped goes on, and so does a new one
    for resumed in (first, _trainer(tmp_path / "copy")):
        resumed.fit(stop_signals=STOP_SIGNALS)
        _assert_same_run(resumed, uninterrupted)


def test_a_second_ctrl_c_interrupts_at_once_and_the_handlers_are_put_back(tmp_path):
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):  # Python's own handler of the second Ctrl-C
        _trainer(tmp_path, _Signalling(2, signal.SIGINT, signal.SIGINT)).fit(stop_signals=STOP_SIGNALS)
    assert signal.getsignal(signal.SIGINT) is before
    assert not (tmp_path / "last.pt").exists()  # stopped at once, within the first epoch, with no checkpoint


def test_a_second_sigterm_is_the_same_request_as_the_first(tmp_path):
    """A scheduler and torchrun may both send one, moments apart: the second must not kill the process."""
    with pytest.raises(TrainingStopped) as stopped:
        _trainer(tmp_path, _Signalling(6, signal.SIGTERM, signal.SIGUSR1, signal.SIGTERM)).fit(
            stop_signals=STOP_SIGNALS)
    assert (stopped.value.signal, stopped.value.epoch, stopped.value.batch) == (signal.SIGTERM, 1, 2)
    assert load_checkpoint(tmp_path / "last.pt")["within_epoch"]["batch"] == 2


def test_after_another_stop_signal_ctrl_c_interrupts_at_once(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        _trainer(tmp_path, _Signalling(2, signal.SIGTERM, signal.SIGINT)).fit(stop_signals=STOP_SIGNALS)
    assert not (tmp_path / "last.pt").exists()


@pytest.mark.parametrize(("at", "max_epochs", "epochs"), [(16, None, 4), (4, 1, 1)])
def test_a_signal_in_the_last_epoch_of_a_fit_still_stops_the_program(tmp_path, at, max_epochs, epochs):
    t = _trainer(tmp_path, _Signalling(at, signal.SIGTERM))
    with pytest.raises(TrainingStopped, match=rf"stopped after epoch {epochs};"):
        t.fit(max_epochs=max_epochs, stop_signals=STOP_SIGNALS)
    assert t.epoch == epochs and load_checkpoint(tmp_path / "last.pt")["epoch"] == epochs


def test_a_signal_before_the_first_step_of_a_resume_names_what_last_pt_holds(tmp_path):
    with pytest.raises(TrainingStopped):
        _trainer(tmp_path, _Signalling(6, signal.SIGTERM)).fit(stop_signals=STOP_SIGNALS)
    again = _trainer(tmp_path)
    again.resume_check = lambda checkpoint: os.kill(os.getpid(), signal.SIGTERM)  # while it loads
    with pytest.raises(TrainingStopped, match=r"within epoch 2, after its batch 2;") as stopped:
        again.fit(stop_signals=STOP_SIGNALS)
    assert (stopped.value.epoch, stopped.value.batch, again.step) == (1, 2, 6)


def test_an_ignored_signal_stays_ignored_and_one_handled_outside_python_is_left_to_its_handler(tmp_path,
                                                                                             monkeypatch):
    ignored = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a shell starts a command with &
    getsignal = signal.getsignal  # None: a handler that was there, set in C, when Python started
    monkeypatch.setattr(signal, "getsignal", lambda s: None if s == signal.SIGUSR1 else getsignal(s))
    try:
        t = _trainer(tmp_path, _Signalling(2, signal.SIGINT))
        with pytest.warns(RuntimeWarning, match=r"SIGUSR1 has a handler set outside Python"):
            t.fit(max_epochs=1, stop_signals=STOP_SIGNALS)
        assert t.epoch == 1
        assert getsignal(signal.SIGINT) is signal.SIG_IGN and getsignal(signal.SIGUSR1) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGINT, ignored)


def test_without_stop_signals_the_handlers_are_left_alone(tmp_path):
    t = _trainer(tmp_path, _Signalling(2, signal.SIGUSR1))
    caught = []
    previous = signal.signal(signal.SIGUSR1, lambda s, f: caught.append(s))
    try:
        t.fit(max_epochs=1)
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert caught == [signal.SIGUSR1] and t.epoch == 1


def test_stop_signals_are_checked_and_named():
    assert check_signals(["SIGTERM", "int", 10, signal.SIGTERM]) == (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
    assert check_signals(None) == () and check_signals("TERM") == (signal.SIGTERM,)
    with pytest.raises(ConfigError, match=r"'SIGTREM' is no signal .*did you mean 'SIGTERM'"):
        check_signals(["SIGTREM"])
    with pytest.raises(ConfigError, match=r"SIGKILL cannot be caught"):
        check_signals([signal.SIGKILL])
    for fault in ("SIGSEGV", "SIGCHLD"):
        with pytest.raises(ConfigError, match=rf"{fault} reports a fault or a child process"):
            check_signals([fault])
    with pytest.raises(ConfigError, match=r"no signal number"):
        check_signals([10_000])
    with pytest.raises(ConfigTypeError, match=r"a stop signal is a number.*got 1.5"):
        check_signals([1.5])
    with pytest.raises(ConfigTypeError, match=r"sequence of signals"):
        check_signals(1.5)
    said = []

    def in_a_thread():
        try:
            check_signals(["SIGTERM"])
        except ConfigError as exc:
            said.append(str(exc))

    thread = threading.Thread(target=in_a_thread)
    thread.start(), thread.join()
    assert len(said) == 1 and "main thread only" in said[0]


def test_a_bad_stop_signal_is_named_before_anything_trains(tmp_path):
    t = _trainer(tmp_path)
    with pytest.raises(ConfigError, match="SIGTREM"):
        t.fit(stop_signals=["SIGTREM"])
    assert t.step == 0 and not (tmp_path / "last.pt").exists()


@pytest.mark.skipif(multiprocessing.get_start_method() != "fork", reason="the workers must inherit the patched torch")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.parametrize("kind", ["dataloader", "folders"])
def test_a_dataloader_worker_signalled_while_it_starts_lives_on(monkeypatch, tmp_path, sig, kind):
    """A worker sets its own ``SIGTERM`` handler (and has Python's ``SIGINT`` one) before it runs the loader's
    ``worker_init_fn``: a signal to the process group in between ended it, and the loader raised. While
    training stops on them, the workers start with them blocked."""
    parent, set_num_threads = os.getpid(), torch.set_num_threads

    def signalled_while_starting(n):  # torch's worker loop calls it between the two
        if os.getpid() != parent:
            os.kill(os.getpid(), sig)
        set_num_threads(n)

    monkeypatch.setattr(torch, "set_num_threads", signalled_while_starting)
    if kind == "dataloader":
        loader = DataLoaderPath(synthetic(num_classes=10, n_train=40, n_test=10)[0], 10, train=True, num_workers=1)
    else:
        for i in range(8):
            (tmp_path / f"c{i % 2}").mkdir(exist_ok=True)
            Image.new("RGB", (24, 20), (30 * i, 0, 0)).save(tmp_path / f"c{i % 2}" / f"{i}.png")
        loader = FolderLoader(image_files(tmp_path), 2, train=True, size=16, resize=20, num_workers=1)
    with StopSignals(STOP_SIGNALS, say=False):
        assert len(list(loader.epoch(0))) == len(loader) == 4


def test_a_program_that_ends_with_a_loaders_workers_alive_ends(tmp_path):
    """Python ends the workers of a loader still alive at its exit with ``SIGTERM`` (``Process.terminate``),
    then waits for them: the workers, which ignore others' stop signals, still end at their parent's."""
    script = tmp_path / "ends.py"
    script.write_text(
        "from connlearn.data import DataLoaderPath, synthetic\n"
        "from connlearn.signals import STOP_SIGNALS, StopSignals\n"
        "loader = DataLoaderPath(synthetic(num_classes=10, n_train=40, n_test=10)[0], 10, train=True, num_workers=1)\n"
        "with StopSignals(STOP_SIGNALS):\n"
        "    batches = loader.epoch(0)\n"
        "    next(batches)\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_the_command_stopped_by_a_signal_to_its_process_group_saves_and_exits_with_the_signals_code(tmp_path, sig):
    """As a scheduler (every process of the job) or Ctrl-C (the terminal's process group) signals it: the
    DataLoader workers ignore it, the training process stops at its next step and exits quietly."""
    data = tmp_path / "data.npz"
    connlearn.data.pack(data, *connlearn.data.synthetic(num_classes=10, n_train=200, n_test=50))
    command = [sys.executable, "-m", "connlearn.cli", "train", "--dataset", "cifar10", "--data", str(data),
               "--epochs", "200", "--out", str(tmp_path / "run"), "--M", "3", "--C", "2", "--K", "1", "--width", "1",
               "--base-channels", "4", "--stem-channels", "4", "--batch-size", "20", "--loader", "dataloader",
               "--workers", "1", "--no-progress"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    deadline = time.monotonic() + 120
    while not (tmp_path / "run" / "log.jsonl").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()
    os.killpg(proc.pid, sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, err
    assert f"{sig.name}: stopped " in err and "Traceback" not in err and "DataLoader worker" not in err
    saved = load_checkpoint(tmp_path / "run" / "last.pt")
    assert 1 <= saved["epoch"] < 200
