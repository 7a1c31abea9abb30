"""Laws of checkpoint writing, reading and resuming that the other test files leave open (found by mutating
connlearn/checkpoint.py and the save/resume path of connlearn/train.py): an atomic write is on disk whole
before it is renamed, the OSError behind a failed write is found in any chain of exceptions (and torch's
writer's own error is an EIO), the draws of a checkpoint round-trip, a torn last line of a JSONL file is
dropped only where it is the last line, and what two recipes' dicts differ in is said exactly."""

import errno
import json
import os

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import connlearn.checkpoint
import connlearn.files
from connlearn.checkpoint import save_atomic
from connlearn.errors import DataError
from connlearn.files import write_failure, write_text_atomic
from connlearn.train import _packed, _unpacked, read_jsonl


# An atomic write fsyncs the temporary with every byte in it: what is in Python's buffer is flushed before the
# fsync (a crash after the rename must not leave a short file), and the fsync happens at all.
@pytest.mark.parametrize("write", ["checkpoint", "text"])
def test_an_atomic_write_is_fsynced_whole_before_its_rename(tmp_path, monkeypatch, write):
    import stat

    synced = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        if not stat.S_ISDIR(os.fstat(fd).st_mode):  # the file's, not its folder's after the rename
            synced.append(os.fstat(fd).st_size)  # what the file holds (outside Python's buffer) when synced
        return real_fsync(fd)

    def replace(src, dst):
        assert synced, "renamed before any fsync"
        return real_replace(src, dst)

    monkeypatch.setattr(connlearn.files.os, "fsync", fsync)
    monkeypatch.setattr(connlearn.files.os, "replace", replace)
    path = tmp_path / "out"
    if write == "checkpoint":
        save_atomic({"weights": torch.arange(1000.0)}, path)
    else:
        write_text_atomic(path, "x" * 1000)  # small: it stays in Python's buffer until a flush
    assert synced == [path.stat().st_size]


class _LoopingError(RuntimeError):
    """An exception whose context is another one, whose context is it again (as a handler that re-raises the
    exception it caught while handling it makes); it counts how often its context is read."""

    reads = 0

    @property
    def __context__(self):
        type(self).reads += 1
        assert type(self).reads < 1000, "the chain of exceptions was followed round its loop"
        return self.partner

    @__context__.setter
    def __context__(self, value):
        pass


# write_failure follows the causes and contexts of an exception to the OSError behind it, and ends on a chain
# that loops back on itself (None: no OSError in it) or that ends without one.
def test_write_failure_ends_on_a_chain_that_loops_and_finds_an_oserror_at_its_end():
    a, b = _LoopingError("a"), _LoopingError("b")
    a.partner, b.partner = b, a
    _LoopingError.reads = 0
    assert write_failure(a) is None
    plain = ValueError("no pickle")
    assert write_failure(plain) is None  # a chain that simply ends
    disk = OSError(errno.ENOSPC, "No space left on device")
    try:
        try:
            raise disk
        except OSError:
            raise RuntimeError("wrapped") from None  # from None: a context kept, no cause
    except RuntimeError as exc:
        assert write_failure(exc) is disk
    assert write_failure(KeyboardInterrupt()) is None
    try:  # an error of its own, raised while an unrelated OSError was handled (a missing optional file)
        try:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", "/nonexistent/settings")
        except OSError:
            raise ValueError("format xyz is not supported") from None
    except ValueError as exc:
        assert write_failure(exc) is None


# torch's zip writer's own error with no OSError behind it ("[enforce fail at inline_container.cc] unexpected
# pos", or a PytorchStreamWriter failure) is an EIO naming torch.save; any other RuntimeError, and the same
# words in an error of another type, are no write failure.
@pytest.mark.parametrize("text", ["[enforce fail at inline_container.cc:603] . unexpected pos 64 vs 0",
                                  "PytorchStreamWriter failed writing file data/0: file write failed"])
def test_torchs_writer_error_alone_is_an_eio_and_other_errors_are_none(text):
    failed = write_failure(RuntimeError(text))
    assert isinstance(failed, OSError) and failed.errno == errno.EIO and "torch.save" in str(failed)
    assert write_failure(RuntimeError("some other failure")) is None
    assert write_failure(ValueError(text)) is None


# An atomic write whose writer fails with torch's writer error alone is an OSError (EIO) that names the file
# asked for, and leaves neither the file nor its temporary.
def test_an_atomic_write_failing_with_torchs_writer_error_names_the_file(tmp_path, monkeypatch):
    def broken_save(obj, f):
        raise RuntimeError("[enforce fail at inline_container.cc:603] . unexpected pos 64 vs 0")

    monkeypatch.setattr(connlearn.checkpoint.torch, "save", broken_save)
    with pytest.raises(OSError) as caught:
        save_atomic({"x": 1}, tmp_path / "last.pt")
    assert caught.value.errno == errno.EIO and caught.value.filename == str(tmp_path / "last.pt")
    assert list(tmp_path.iterdir()) == []


_draws = st.tuples(st.lists(st.tuples(st.integers(1, 3), st.integers(1, 4)), max_size=4), st.integers(0, 5),
                   st.integers(0, 10**6))


# The draws a network recorded round-trip through a checkpoint: _unpacked(_packed(draws)) is the draws, step
# by step and gate by gate (index, mask, agreement), for any number of steps (none too) and gates; and None
# (nothing recorded) unpacks as no draws.
@given(spec=_draws)
def test_packed_draws_unpack_to_the_draws_recorded(spec):
    shapes, steps, seed = spec
    g = torch.Generator().manual_seed(seed)
    draws = [[(j, (torch.rand(shape, generator=g) < 0.5).float(), torch.rand(shape[0], generator=g))
              for j, shape in enumerate(shapes)] for _ in range(steps)]
    back = _unpacked(_packed(draws), torch.device("cpu"))
    if not shapes:  # a net without stochastic gates records empty steps: nothing to keep
        assert back == []
    else:
        assert len(back) == len(draws)
        for got, want in zip(back, draws, strict=True):
            assert [j for j, _, _ in got] == [j for j, _, _ in want]
            for (_, m1, a1), (_, m2, a2) in zip(got, want, strict=True):
                assert torch.equal(m1, m2) and torch.equal(a1, a2)
    assert _packed(None) is None and _unpacked(None, torch.device("cpu")) == []


def _jsonl(records):
    return "".join(json.dumps(r) + "\n" for r in records)


# read_jsonl(torn_tail=True) leaves out a last line cut short (no newline, not JSON) and nothing else: the
# records before it are all read, a complete last line without its newline is kept, and a bad line anywhere
# but last, or a bad last line that ends in a newline, is still a DataError naming its line.
@given(records=st.lists(st.dictionaries(st.sampled_from("abc"), st.integers(-5, 5)), min_size=1, max_size=5),
       cut=st.integers(1, 100), blank=st.booleans())
def test_only_a_torn_last_line_is_left_out(tmp_path_factory, records, cut, blank):
    path = tmp_path_factory.mktemp("jsonl") / "gates.jsonl"
    text = _jsonl(records)
    if blank:
        text = "\n" + text.replace("\n", "\n\n", 1)  # blank lines are skipped, and not counted as records
    last = json.dumps({"step": 99, "values": list(range(20))})
    torn = last[: cut % (len(last) - 1) + 1]  # a proper prefix: not JSON
    path.write_text(text + torn)
    assert read_jsonl(path, torn_tail=True) == records
    with pytest.raises(DataError, match="not JSONL"):
        read_jsonl(path)  # not asked to: the torn line is an error
    path.write_text(text + last)  # whole, only its newline missing
    assert read_jsonl(path, torn_tail=True) == [*records, json.loads(last)]
    path.write_text(text + torn + "\n")  # a bad line ending in a newline is no torn append
    with pytest.raises(DataError, match="not JSONL"):
        read_jsonl(path, torn_tail=True)
    path.write_text(torn + "\n" + text)  # a bad first line, records after it
    with pytest.raises(DataError, match="line 1"):
        read_jsonl(path, torn_tail=True)


# plain_facts makes JSON-like facts of Python's own types: a plain dict or list is changed in place and is the
# very object returned (whoever holds it sees the change), a dict of another class (a defaultdict) becomes a
# plain dict, a tuple a tuple, NumPy's numbers Python's own, at any depth; plain values are themselves.
@given(ints=st.lists(st.integers(-10**6, 10**6), min_size=1, max_size=4), real=st.floats(-1e6, 1e6),
       flag=st.booleans())
def test_plain_facts_makes_numpy_numbers_and_dict_classes_plain_in_place(ints, real, flag):
    import collections

    import numpy as np

    from connlearn.checkpoint import plain_facts

    inner = collections.defaultdict(list, {"n": np.int64(ints[0]), "flag": np.bool_(flag)})
    listed = [np.float64(real), *map(np.int32, ints)]
    facts = {"inner": inner, "list": listed, "pair": (np.float32(1.5), "s"), "plain": [1, "a", None, 2.5, True]}
    got = plain_facts(facts, "meta")
    assert got is facts and got["list"] is listed  # in place
    assert type(got["inner"]) is dict and got["inner"] == {"n": ints[0], "flag": flag}
    assert [type(v) for v in got["inner"].values()] == [int, bool]
    assert got["list"] == [real, *ints] and [type(v) for v in got["list"]] == [float] + [int] * len(ints)
    assert got["pair"] == (1.5, "s") and type(got["pair"]) is tuple and type(got["pair"][0]) is float
    assert got["plain"] == [1, "a", None, 2.5, True]
    for value in ("text", 3, 2.5, None, False):
        assert plain_facts(value, "x") is value


# _check_rng takes exactly torch's random states as the trainer writes them: a dict whose "torch" is a uint8
# tensor, whose "cuda" is None or a list of tensors, and whose "ranks", where present, is a non-empty list of
# such states; anything else is a TypeError before anything is restored.
def test_check_rng_takes_exactly_the_random_states_the_trainer_writes():
    from connlearn.train import _check_rng, _rng_state

    good = _rng_state(torch.device("cpu"))
    _check_rng(good, "rng")
    _check_rng({**good, "cuda": [torch.zeros(8, dtype=torch.uint8)]}, "rng")
    _check_rng({**good, "ranks": [dict(good), dict(good)]}, "rng")
    for bad in ({"cuda": None}, {"torch": good["torch"].float(), "cuda": None}, {"torch": "x"},
                {**good, "cuda": "x"}, {**good, "cuda": ["x"]}, {**good, "cuda": torch.zeros(3)},
                {**good, "ranks": []}, {**good, "ranks": [{"torch": "x"}]}, {**good, "ranks": [good, {}]},
                {**good, "ranks": (good,)}, [good], None):
        with pytest.raises(TypeError, match="random state"):
            _check_rng(bad, "rng")


def _within(**changes):
    """A within_epoch entry as Trainer._save_within writes it (two gates' draws over three steps)."""
    from connlearn.train import _rng_state

    draws = [[(j, torch.ones(2, 3), torch.ones(2)) for j in range(2)] for _ in range(3)]
    within = {"batch": 3, "sums": torch.tensor([1.0, 2.0, 16.0]), "elapsed": 1.5, "draws": _packed(draws),
              "last_connectivity": {0: torch.ones(2, 3, dtype=torch.bool)},
              "rng_at_start": _rng_state(torch.device("cpu"))}
    within.update(changes)
    return within


# _checked_within takes what Trainer._save_within writes (after batch 1 or later; draws or none; a random
# state or none) and refuses, as a TypeError or ValueError, a batch before the first, sums that are not a
# tensor of 3 numbers, draws whose gates do not all hold as many steps (or whose lists differ in length), a
# connectivity that is not a dict of tensors, and a random state that is not one.
def test_checked_within_takes_a_saved_within_epoch_entry_and_refuses_a_damaged_one():
    from connlearn.train import _checked_within

    assert _checked_within(None) is None
    for ok in (_within(), _within(batch=1), _within(draws=None), _within(rng_at_start=None),
               _within(draws=_packed([]))):
        got = _checked_within(ok)
        assert got["batch"] == ok["batch"] and type(got["batch"]) is int and got["elapsed"] == 1.5
        assert got["sums"] is ok["sums"] and got["draws"] is ok["draws"]
    one_gate = _packed([[(0, torch.ones(2, 3), torch.ones(2))]] * 3)
    for bad in (_within(batch=0), _within(sums=torch.zeros(4)), _within(sums=torch.zeros(2)),
                _within(sums=[0.0, 0.0, 1.0]), _within(sums=torch.zeros(1, 3)),
                _within(draws={"masks": one_gate["masks"], "agree": one_gate["agree"] * 2}),
                _within(draws={"masks": one_gate["masks"], "agree": [one_gate["agree"][0][:2]]}),
                _within(draws={"masks": one_gate["masks"], "agree": "x"}),
                _within(draws={"masks": ["x"], "agree": ["y"]}),
                _within(last_connectivity=[torch.ones(2)]), _within(last_connectivity={0: [1, 0]}),
                _within(rng_at_start={"torch": "x"}), ["batch", 3]):
        with pytest.raises((TypeError, ValueError)):
            _checked_within(bad)


# _recipe_differences names every entry in which two recipes' dicts differ and no other, in the saved dict's
# order, as "name=value there, value here": per phase (numbered from 1) where both have as many phases, by the
# number of phases where they do not; two equal dicts are "(the same values)".
def test_recipe_differences_name_exactly_what_differs():
    from connlearn.recipe import get_recipe
    from connlearn.train import _recipe_differences

    saved = get_recipe("cifar").scaled(4).to_dict()
    assert _recipe_differences(saved, dict(saved)) == "(the same values)"
    phases = [dict(p) for p in saved["phases"]]
    phases[1]["lr"], phases[2]["frozen"] = 0.5, False
    given = {**saved, "name": "cifaR", "phases": tuple(phases), "batch_size": 64, "extra": 1}
    assert _recipe_differences(saved, given) == (
        "name='cifar' there, 'cifaR' here; phase 2 lr=0.1 there, 0.5 here; phase 3 frozen=True there, False here; "
        "batch_size=128 there, 64 here; extra=None there, 1 here")
    assert _recipe_differences(saved, {**saved, "phases": saved["phases"][:1]}) == (
        "phases='4 phases' there, '1 phase' here")
    assert _recipe_differences({**saved, "phases": ()}, {**saved, "phases": saved["phases"][:2]}) == (
        "phases='0 phases' there, '2 phases' here")


# _changed_rows is the share of blocks (rows of every module's connectivity) whose active inputs differ between
# two connectivities, counting a row once however many of its inputs changed; None when either is missing.
@given(shapes=st.lists(st.tuples(st.integers(1, 4), st.integers(2, 5)), min_size=1, max_size=3),
       seed=st.integers(0, 10**6))
def test_changed_rows_is_the_share_of_rows_with_another_input(shapes, seed):
    from connlearn.train import _changed_rows

    g = torch.Generator().manual_seed(seed)
    before = {m: torch.rand(shape, generator=g) < 0.5 for m, shape in enumerate(shapes)}
    after = {m: torch.where(torch.rand(c.shape, generator=g) < 0.3, ~c, c) for m, c in before.items()}
    want = sum(int(not torch.equal(b, a)) for m in after for b, a in zip(before[m], after[m], strict=True))
    assert _changed_rows(before, after) == want / sum(shape[0] for shape in shapes)
    assert _changed_rows(before, before) == 0.0
    assert _changed_rows(None, after) is None and _changed_rows({}, after) is None
    assert _changed_rows(before, {}) is None


# The lock file of a held folder says exactly who holds it: a longer text left by an earlier holder (another
# host's name, a longer "what") is gone, not left after the new one.
def test_a_held_folders_lock_file_names_only_its_holder(tmp_path):
    import socket

    from connlearn.checkpoint import folder_lock

    (tmp_path / ".lock").write_text("process 1 on a-much-longer-host-name-than-this-one, running a long sweep there\n"
                                    * 3)
    with folder_lock(tmp_path, "a run"):
        holder = f"process {os.getpid()} on {socket.gethostname()}, running a run there\n"
        assert (tmp_path / ".lock").read_text() == holder


# load_checkpoint reads only its own checkpoint version: a checkpoint of another (later) version is refused by
# its number, as one whose version is not a number at all.
@pytest.mark.parametrize("version", [2, 0, "1", None])
def test_a_checkpoint_of_another_version_is_refused(tmp_path, version):
    from conftest import tiny

    import connlearn
    from connlearn.checkpoint import load_checkpoint, make_checkpoint
    from connlearn.errors import CheckpointError

    ckpt = make_checkpoint(connlearn.build(**tiny()))
    load_checkpoint(save_atomic(ckpt, tmp_path / "ok.pt"))
    ckpt["version"] = version
    with pytest.raises(CheckpointError, match=f"has checkpoint version {version!r}; this connlearn reads 1"):
        load_checkpoint(save_atomic(ckpt, tmp_path / "model.pt"))


class _Batches:
    """The images and labels in batches of ``batch`` (the last one short): the trainer's loader protocol."""

    def __init__(self, x, y, batch):
        self.x, self.y, self.batch = x, y, batch

    def __len__(self):
        return -(-len(self.x) // self.batch)

    def epoch(self, epoch):
        for i in range(0, len(self.x), self.batch):
            yield self.x[i : i + self.batch], self.y[i : i + self.batch]


# evaluate's top-5 accuracy is the share of images whose label is among the model's five highest outputs
# (all of them with fewer than five classes), whatever the batches: batches smaller than five images, a
# short last batch, or one batch give the same top-1, top-5 and mean loss, the ones computed directly; a
# channels_last that is not a bool is refused.
@pytest.mark.parametrize("classes", [3, 10])
def test_evaluate_top5_and_loss_do_not_depend_on_the_batch_size(classes):
    from connlearn.train import evaluate

    g = torch.Generator().manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, classes))
    x, y = torch.randn(13, 3, 2, 2, generator=g), torch.randint(0, classes, (13,), generator=g)
    with torch.no_grad():
        out = model(x)
    top5 = (out.topk(min(5, classes), dim=1).indices == y[:, None]).any(1).float().mean().item() * 100
    top1 = (out.argmax(1) == y).float().mean().item() * 100
    loss = torch.nn.functional.cross_entropy(out, y).item()
    for batch in (1, 2, 4, 13):
        got = evaluate(model, _Batches(x, y, batch))
        assert got["test_top5"] == pytest.approx(top5) and got["test_top1"] == pytest.approx(top1)
        assert got["test_loss"] == pytest.approx(loss, rel=1e-5)
    from connlearn.errors import ConfigTypeError

    with pytest.raises(ConfigTypeError, match="channels_last"):  # "no" would count as true
        evaluate(model, _Batches(x, y, 4), channels_last="no")


class _ShuffledByTorch:
    """A loader that shuffles with torch's global random state when an epoch's first batch is read, through an
    ``epoch`` whose signature Python cannot read (as some wrapped or compiled callables)."""

    class _Epoch:
        __signature__ = "unreadable"  # inspect.signature raises a TypeError

        def __init__(self, x):
            self.x = x

        def __call__(self, epoch):
            order = torch.randperm(len(self.x))
            for i in range(0, len(self.x), 2):
                yield self.x[order[i : i + 2]]

    def __init__(self, n=10):
        self.epoch = self._Epoch(torch.arange(n))

    def __len__(self):
        return 5


# A resume within an epoch from a loader that takes no start (its epoch's signature unreadable, too) reads
# the epoch from its beginning under torch's random state of that beginning and drops the batches already
# trained on: the batches that follow are those of the uninterrupted epoch, and torch's random state is left
# as it was.
@given(seed=st.integers(0, 10**6), start=st.integers(1, 4))
def test_a_resume_within_an_epoch_reads_the_rest_of_the_epoch_it_began(seed, start):
    from connlearn.train import _batches_from, _rng_state

    loader, cpu = _ShuffledByTorch(), torch.device("cpu")
    torch.manual_seed(seed)
    at_start = _rng_state(cpu)
    whole = [b.tolist() for b in loader.epoch(0)]
    torch.manual_seed(seed + 1)  # training drew since
    now = torch.get_rng_state()
    rest = [b.tolist() for b in _batches_from(loader, 0, start, at_start, cpu)]
    assert rest == whole[start:]
    assert torch.equal(torch.get_rng_state(), now)


class _Gates:
    def __init__(self, gates):
        self.gates = gates

    def gate_parameters(self):
        return self.gates


# gate_statistics over every row of every gate matrix (``[rows, cols]``, of any width): the mean gate, the mean
# of the rows' standard deviations (0 for a one-entry row), the shares at or below 0 and at or above 1, and the
# mean entropy of the rows' sampling distributions (negative gates count as 0; a row with nothing positive is
# uniform over its entries); all None without learnable gates.
@given(shapes=st.lists(st.tuples(st.integers(1, 4), st.integers(1, 4)), min_size=1, max_size=3),
       seed=st.integers(0, 10**6), zero_row=st.booleans())
def test_gate_statistics_are_those_of_every_row(shapes, seed, zero_row):
    import math

    from connlearn.train import gate_statistics

    g = torch.Generator().manual_seed(seed)
    gates = [torch.randn(shape, generator=g, dtype=torch.float64) for shape in shapes]
    if zero_row:
        gates[0].reshape(-1, shapes[0][-1])[0] = -gates[0].reshape(-1, shapes[0][-1])[0].abs()  # nothing positive
    rows = [row for gate in gates for row in gate.reshape(-1, gate.shape[-1]).tolist()]
    values = [v for row in rows for v in row]

    def entropy(row):
        w = [max(v, 0.0) for v in row]
        p = [v / sum(w) for v in w] if sum(w) > 0 else [1 / len(row)] * len(row)
        return -sum(q * math.log(q) for q in p if q > 0)

    def std(row):
        mean = sum(row) / len(row)
        return math.sqrt(sum((v - mean) ** 2 for v in row) / (len(row) - 1)) if len(row) > 1 else 0.0

    got = gate_statistics(_Gates(gates))
    assert got["gate_mean"] == pytest.approx(sum(values) / len(values), abs=1e-5)
    assert got["gate_row_std"] == pytest.approx(sum(map(std, rows)) / len(rows), abs=1e-5)
    assert got["gate_at_0"] == pytest.approx(sum(v <= 0 for v in values) / len(values))
    assert got["gate_at_1"] == pytest.approx(sum(v >= 1 for v in values) / len(values))
    assert got["gate_entropy"] == pytest.approx(sum(map(entropy, rows)) / len(rows), abs=1e-5)
    assert set(gate_statistics(_Gates([])).values()) == {None}
    one_row = gate_statistics(_Gates([gates[0].reshape(-1)]))  # a gate kind's 1-D gate is one row
    assert one_row == gate_statistics(_Gates([gates[0].reshape(1, -1)]))


# load_checkpoint refuses, as a CheckpointError that says so, anything torch can load that is not a connlearn
# checkpoint (a bare state dict, a list) and any zip archive torch did not write (entries at its top level).
def test_files_that_are_no_connlearn_checkpoint_are_refused_as_such(tmp_path):
    import zipfile

    from connlearn.checkpoint import load_checkpoint
    from connlearn.errors import CheckpointError

    for i, obj in enumerate(({"weight": torch.zeros(2)}, [torch.zeros(2)], {"format": "other"})):
        torch.save(obj, tmp_path / f"{i}.pt")
        with pytest.raises(CheckpointError, match="is not a connlearn checkpoint"):
            load_checkpoint(tmp_path / f"{i}.pt")
    for entries in (["notes.txt", "folder/data.pkl"], ["folder/notes.txt"]):
        with zipfile.ZipFile(tmp_path / "plain.pt", "w") as archive:
            for entry in entries:
                archive.writestr(entry, "not torch's")
        with pytest.raises(CheckpointError, match="not a readable checkpoint"):
            load_checkpoint(tmp_path / "plain.pt")


# A checkpoint written with a gradient scaler (fp16 training on a GPU) resumes on a trainer without one (full
# precision, on the CPU): the scaler's state is read only by a trainer that has a scaler, and the run goes on
# as the uninterrupted one.
def test_a_checkpoint_with_a_scaler_state_resumes_on_a_trainer_without_one(tmp_path):
    from conftest import RandomLoader, tiny

    import connlearn
    from connlearn.recipe import Phase, Recipe
    from connlearn.train import Trainer

    recipe = Recipe(name="r", phases=(Phase(epochs=2, lr=0.1, gate_lr=0.1),), batch_size=8)

    def trainer(out):
        return Trainer(connlearn.build(**tiny()), RandomLoader(n=16, batch=8), None, recipe, out_dir=out,
                       progress=False, verbose=False)

    whole = trainer(tmp_path / "whole")
    whole.fit()
    trainer(tmp_path / "run").fit(max_epochs=1)
    ckpt = torch.load(tmp_path / "run" / "last.pt", weights_only=True)
    assert ckpt["scaler"] is None
    ckpt["scaler"] = {"scale": 65536.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2000,
                      "_growth_tracker": 0}
    save_atomic(ckpt, tmp_path / "run" / "last.pt")
    resumed = trainer(tmp_path / "run")
    resumed.fit()
    assert [r["train_loss"] for r in resumed.history] == [r["train_loss"] for r in whole.history]


def _small_trainer(out, recipe=None, **kw):
    from conftest import RandomLoader, tiny

    import connlearn
    from connlearn.recipe import Phase, Recipe
    from connlearn.train import Trainer

    recipe = recipe or Recipe(name="r", phases=(Phase(epochs=2, lr=0.1, gate_lr=0.1),), batch_size=8)
    return Trainer(connlearn.build(**tiny()), RandomLoader(n=16, batch=8), None, recipe, out_dir=out,
                   progress=False, verbose=False, **kw)


# A trainer whose network diverged refuses to train on, naming the epoch in which it diverged (the one its
# DivergenceError named), not another; one resumed from the end of an epoch says last.pt holds that epoch
# (and no batches of the next).
@pytest.mark.parametrize("epoch", [1, 2])
def test_a_diverged_trainer_names_the_epoch_it_diverged_in_when_asked_to_go_on(tmp_path, epoch):
    import attrs
    from conftest import RandomLoader, tiny

    import connlearn
    from connlearn.errors import DivergenceError
    from connlearn.recipe import get_recipe
    from connlearn.train import Trainer

    recipe = get_recipe("cifar").scaled(4)  # a learning rate no network survives from ``epoch`` on
    recipe = attrs.evolve(recipe, phases=tuple(attrs.evolve(p, lr=1e8) if i >= epoch - 1 else p
                                               for i, p in enumerate(recipe.phases)))
    t = Trainer(connlearn.build(**tiny(gate_init="uniform")), RandomLoader(), None, recipe, out_dir=tmp_path,
                progress=False, verbose=False)
    with pytest.raises(DivergenceError, match=f"training diverged in epoch {epoch} "):
        t.fit()
    with pytest.raises(DivergenceError, match=f"this trainer's network diverged in epoch {epoch}: make a new"):
        t.fit()
    if epoch > 1:  # a new trainer resumes from the end of the epoch before, which is what last.pt holds
        resumed = Trainer(connlearn.build(**tiny(gate_init="uniform")), RandomLoader(), None, recipe,
                          out_dir=tmp_path, progress=False, verbose=False)
        with pytest.raises(DivergenceError, match=rf"in epoch {epoch} .*last\.pt holds epoch {epoch - 1}\)"):
            resumed.fit()


# A checkpoint whose epoch or step is negative is damaged: the resume refuses it by name rather than training
# a negative number of epochs.
@pytest.mark.parametrize("key", ["epoch", "step"])
def test_a_checkpoint_with_a_negative_epoch_or_step_is_refused(tmp_path, key):
    from connlearn.errors import ConnlearnError

    _small_trainer(tmp_path).fit(max_epochs=1)
    ckpt = torch.load(tmp_path / "last.pt", weights_only=True)
    ckpt[key] = -1
    save_atomic(ckpt, tmp_path / "last.pt")
    with pytest.raises(ConnlearnError, match=f"the checkpoint's {key} must be >= 0, got -1"):
        _small_trainer(tmp_path).fit()


# save_atomic makes the folders the file goes in.
def test_save_atomic_makes_missing_folders(tmp_path):
    from conftest import tiny

    import connlearn
    from connlearn.checkpoint import load_checkpoint, make_checkpoint

    path = save_atomic(make_checkpoint(connlearn.build(**tiny())), tmp_path / "a" / "b" / "model.pt")
    assert path == tmp_path / "a" / "b" / "model.pt" and load_checkpoint(path)["version"] == 1


# A checkpoint that holds the network but not both the optimizer's state and the recipe (a pruned.pt, or a
# make_checkpoint with only one of them) is no training state: loading it into a trainer says so.
@pytest.mark.parametrize("kept", [(), ("optimizer",), ("recipe",)])
def test_a_checkpoint_without_optimizer_or_recipe_is_no_training_state(tmp_path, kept):
    from connlearn.checkpoint import make_checkpoint
    from connlearn.errors import CheckpointError

    t = _small_trainer(tmp_path / "run")
    extra = {"optimizer": t.optimizer.state_dict(), "recipe": t.recipe.to_dict()}
    path = save_atomic(make_checkpoint(t.net, **{k: extra[k] for k in kept}), tmp_path / "model.pt")
    with pytest.raises(CheckpointError, match="holds a network but no training state; it cannot be resumed"):
        t.load(path)


# A batch norm's running statistic that is no longer finite is a divergence even while every trained weight is
# finite (training reads the batch's statistics, evaluation would read the running ones).
def test_a_running_statistic_no_longer_finite_is_a_divergence(tmp_path):
    from connlearn.errors import DivergenceError

    t = _small_trainer(tmp_path)
    norm = next(m for m in t.net.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm))
    norm.running_var[0] = float("inf")
    with pytest.raises(DivergenceError, match=r"running statistics are no longer finite \(the first: .*running_var"):
        t.fit(max_epochs=1)


# evaluate leaves the model in the mode it was given in, also when the model fails or the user interrupts it
# mid-way (a training loop that catches the error goes on training, not in eval mode).
@pytest.mark.parametrize("error", [RuntimeError("out of memory"), KeyboardInterrupt()])
def test_evaluate_restores_the_training_mode_when_the_model_fails(error):
    from connlearn.train import evaluate

    class Failing(torch.nn.Module):
        def forward(self, x):
            raise error

    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 3), Failing()).train()
    x, y = torch.randn(4, 3, 2, 2), torch.tensor([0, 1, 2, 0])
    with pytest.raises(type(error)):
        evaluate(model, _Batches(x, y, 2))
    assert model.training and all(m.training for m in model)
