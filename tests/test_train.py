"""The trainer: phases, exact resume, atomic checkpoints, logs."""

import shutil
import zipfile

import attrs
import pytest
import torch
from conftest import RandomLoader, tiny

import connlearn
from connlearn.checkpoint import load_checkpoint, save_atomic
from connlearn.errors import CheckpointError, DivergenceError
from connlearn.gates import topk_mask
from connlearn.recipe import Phase, Recipe, get_recipe
from connlearn.train import TIMING_KEYS, Trainer, read_jsonl

RECIPE = get_recipe("cifar").scaled(4)


def _trainer(out, **kw):
    net = connlearn.build(**tiny(gate_init="uniform"))
    return Trainer(net, RandomLoader(), RandomLoader(n=32, seed=1), kw.pop("recipe", RECIPE), out_dir=out,
                   progress=False, **{"snapshot_every": 2, **kw})


def _without_timings(log):
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in log]


def _assert_same_state(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        if torch.is_tensor(sa[k]):
            assert torch.equal(sa[k], sb[k]), k
    assert torch.equal(a.generator.get_state(), b.generator.get_state())


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    t = _trainer(tmp_path_factory.mktemp("full"))
    t.fit()
    return t


@pytest.mark.parametrize("stop_after", [1, 2])
def test_a_stopped_and_resumed_run_ends_bit_identical(uninterrupted, tmp_path, stop_after):
    first = _trainer(tmp_path)
    first.fit(max_epochs=stop_after)
    resumed = _trainer(tmp_path)
    resumed.fit(resume=True)
    _assert_same_state(resumed.net, uninterrupted.net)
    assert _without_timings(resumed.history) == _without_timings(uninterrupted.history)
    assert _without_timings(read_jsonl(tmp_path / "log.jsonl")) == _without_timings(uninterrupted.history)
    assert read_jsonl(tmp_path / "gates.jsonl") == read_jsonl(uninterrupted.out_dir / "gates.jsonl")


def test_calling_fit_again_goes_on_with_the_same_objects_and_ends_bit_identical(uninterrupted, tmp_path):
    t = _trainer(tmp_path)
    t.fit(max_epochs=1)  # phase 1 of the scaled recipe
    net, optimizer = t.net, t.optimizer
    t.fit(max_epochs=0)  # nothing to train: nothing reloaded
    assert t.net is net and t.optimizer is optimizer
    t.fit()
    _assert_same_state(t.net, uninterrupted.net)
    assert _without_timings(t.history) == _without_timings(uninterrupted.history)


def test_snapshots_left_by_a_run_killed_before_its_first_checkpoint_or_torn_by_a_kill_are_not_kept(
        uninterrupted, tmp_path):
    first = _trainer(tmp_path)
    first.fit(max_epochs=1)
    snaps = tmp_path / "gates.jsonl"
    lines = snaps.read_text().splitlines(keepends=True)
    (tmp_path / "last.pt").unlink()
    (tmp_path / "previous.pt").unlink(missing_ok=True)  # killed before its first checkpoint: a fresh start
    _trainer(tmp_path).fit(max_epochs=1)
    assert snaps.read_text().splitlines(keepends=True) == lines  # not appended to the old ones
    with open(snaps, "a") as f:
        f.write(lines[-1][:40])  # an append a kill cut short
    resumed = _trainer(tmp_path)
    resumed.fit()
    assert read_jsonl(snaps) == read_jsonl(uninterrupted.out_dir / "gates.jsonl")


def test_the_gates_the_freeze_reads_are_the_last_snapshot_once_also_across_a_resume(tmp_path):
    """Phase 1 ends at step 4, between snapshots every 3 steps: the freeze adds one at step 4, whose
    top-K (by the tie order of the step-0 snapshot) is the connectivity the run froze."""
    whole = _trainer(tmp_path / "whole", snapshot_every=3)
    whole.fit()
    snaps = read_jsonl(tmp_path / "whole" / "gates.jsonl")
    assert [(s["step"], s["epoch"]) for s in snaps] == [(0, 0.0), (3, 0.75), (4, 1.0)]
    assert snaps[-1]["tie_order"] == snaps[0]["tie_order"]  # the freeze snapshot can be read on its own
    for m, frozen in whole.net.connectivity().items():
        order = torch.tensor(snaps[-1]["tie_order"][str(m)])
        assert torch.equal(topk_mask(torch.tensor(snaps[-1]["gates"][str(m)]), whole.net.K, order), frozen)
    # stopped before the freeze: the resume writes the freeze snapshot as an uninterrupted run does
    _trainer(tmp_path / "resumed", snapshot_every=3).fit(max_epochs=1)
    _trainer(tmp_path / "resumed", snapshot_every=3).fit(resume=True)
    assert read_jsonl(tmp_path / "resumed" / "gates.jsonl") == snaps
    # stopped after the freeze wrote its snapshot but before the next checkpoint: not written twice (what
    # load() remembers of the truncated file)
    crashed = _trainer(tmp_path / "crashed", snapshot_every=3)
    crashed.fit(max_epochs=1)
    shutil.copy(tmp_path / "whole" / "gates.jsonl", tmp_path / "crashed" / "gates.jsonl")
    _trainer(tmp_path / "crashed", snapshot_every=3).fit(resume=True)
    assert read_jsonl(tmp_path / "crashed" / "gates.jsonl") == snaps


def test_a_truncated_checkpoint_is_refused_and_the_previous_one_resumes(uninterrupted, tmp_path):
    _trainer(tmp_path).fit(max_epochs=2)
    last = tmp_path / "last.pt"
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        load_checkpoint(last)
    assert load_checkpoint(tmp_path / "previous.pt")["epoch"] == 1
    resumed = _trainer(tmp_path)
    with pytest.warns(UserWarning, match="resuming from .*previous.pt"):
        resumed.fit(resume=True)
    _assert_same_state(resumed.net, uninterrupted.net)


def test_what_refuses_the_fallback_to_previous_pt_names_previous_pt(tmp_path):
    """After last.pt is found damaged, the checks name the file they read (previous.pt), and a damaged state in
    it does not send the user back to previous.pt."""
    _trainer(tmp_path).fit(max_epochs=2)
    last = tmp_path / "last.pt"
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])
    other = _trainer(tmp_path, recipe=get_recipe("cifar").scaled(8))
    with pytest.raises(CheckpointError, match=r"previous\.pt was trained with another recipe"), \
            pytest.warns(UserWarning, match="resuming from .*previous.pt"):
        other.fit(resume=True)
    previous = load_checkpoint(tmp_path / "previous.pt")
    save_atomic({**previous, "history": 5}, tmp_path / "previous.pt")
    with pytest.raises(CheckpointError, match=r"the training state in .*previous\.pt is damaged.*start a new "
                                              r"out_dir\)?$"), pytest.warns(UserWarning, match="previous.pt"):
        _trainer(tmp_path).fit(resume=True)


def test_a_checkpoint_whose_tensor_bytes_were_damaged_is_refused_and_the_previous_one_resumes(uninterrupted,
                                                                                              tmp_path):
    _trainer(tmp_path).fit(max_epochs=2)
    last = tmp_path / "last.pt"
    with zipfile.ZipFile(last) as archive:  # the largest tensor, stored uncompressed
        entry = max((i for i in archive.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    data = bytearray(last.read_bytes())
    head = entry.header_offset  # a local file header: 30 bytes, then the name and the extra field
    name_len, extra_len = (int.from_bytes(data[head + k:head + k + 2], "little") for k in (26, 28))
    start = head + 30 + name_len + extra_len
    middle = start + entry.file_size // 2
    data[middle:middle + 4] = b"\xff\xff\xff\x7f"  # a float32 NaN: torch.load alone would take it
    last.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=rf"is corrupt: the bytes of its entry '{entry.filename}' fail"):
        load_checkpoint(last)
    resumed = _trainer(tmp_path)
    with pytest.warns(UserWarning, match="resuming from .*previous.pt"):
        resumed.fit(resume=True)
    _assert_same_state(resumed.net, uninterrupted.net)


def test_a_crash_while_saving_leaves_the_last_checkpoint_intact(tmp_path, monkeypatch):
    t = _trainer(tmp_path)
    t.fit(max_epochs=1)

    def crash(obj, f):
        f.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(OSError, match="disk full"):
        t.fit(max_epochs=1)
    assert load_checkpoint(tmp_path / "last.pt")["epoch"] == 1


def test_after_phase_one_the_connectivity_is_the_top_k_and_stays_fixed(tmp_path):
    t = _trainer(tmp_path)
    t.fit(max_epochs=1)
    expected = {m: topk_mask(g.real, g.K) for m, g in t.net.gates()}
    reals = {m: g.real.detach().clone() for m, g in t.net.gates()}
    t.fit()
    assert t.net.gate_kind == "frozen" and t.net.gate_parameters() == []
    assert all(torch.equal(t.net.connectivity()[m], expected[m]) for m in expected)
    assert all(torch.equal(g.values(), reals[m]) for m, g in t.net.gates())  # no further gate updates
    assert [r["connectivity_changed"] for r in t.history[1:]] == [0.0, 0.0, 0.0]
    assert [g["name"] for g in t.optimizer.param_groups] == ["weights"]


def test_every_phase_runs_at_its_own_learning_rates(tmp_path):
    seen = []
    t = _trainer(tmp_path)
    original = t._train_epoch

    def spy(epoch, phase):
        seen.append({g["name"]: g["lr"] for g in t.optimizer.param_groups})
        return original(epoch, phase)

    t._train_epoch = spy
    t.fit()
    assert seen == [{"weights": 0.1, "gates": 0.2}, {"weights": 0.1}, {"weights": 0.01}, {"weights": 0.001}]
    assert [r["lr"] for r in t.history] == [0.1, 0.1, 0.01, 0.001]


def test_gate_kinds_that_learn_nothing_run_the_same_schedule(tmp_path):
    net = connlearn.build(**tiny(gate="random"))
    t = Trainer(net, RandomLoader(), None, RECIPE, out_dir=tmp_path, progress=False)
    t.fit()
    assert len(t.history) == 4 and all(r["gate_lr"] is None for r in t.history)


def test_the_log_has_the_documented_fields(uninterrupted, tmp_path):
    record = uninterrupted.history[0]
    for key in ("epoch", "phase", "lr", "train_loss", "train_top1", "test_loss", "test_top1", "test_top5",
                "epoch_time", "images_per_s", "active_branches", "gate_entropy", "gate_mean", "best_top1",
                "drawn_distinct", "drawn_topk_share", "input_overlap"):
        assert key in record, key
    assert record["gate_entropy"] > 0
    assert record["drawn_distinct"] >= 1 and 0 <= record["drawn_topk_share"] <= 1
    frozen = uninterrupted.history[-1]  # phase 4: nothing is drawn any more
    assert frozen["drawn_distinct"] is None and frozen["drawn_topk_share"] is None
    snaps = read_jsonl(uninterrupted.out_dir / "gates.jsonl")
    assert snaps[0]["step"] == 0 and set(snaps[0]["gates"]) == {"2", "3"}
    assert [s["step"] for s in snaps] == [0, 2, 4]  # the freeze at step 4 adds none: that step has one
    orders = {str(m): g.tie_order.tolist() for m, g in _trainer(tmp_path).net.gates()}
    assert snaps[0]["tie_order"] == orders and all("tie_order" not in s for s in snaps[1:])


def test_resuming_with_another_architecture_or_recipe_is_refused(uninterrupted, tmp_path):
    shutil.copy(uninterrupted.out_dir / "last.pt", tmp_path / "last.pt")
    other = Trainer(connlearn.build(**tiny(C=3)), RandomLoader(), None, RECIPE, out_dir=tmp_path, progress=False)
    with pytest.raises(CheckpointError, match="another architecture"):
        other.fit(resume=True)
    recipe = Recipe("x", [Phase(2, 0.1, 0.2)])
    with pytest.raises(CheckpointError, match=r"another recipe: name='cifar' there, 'x' here; phases='4 phases' "
                                              r"there, '1 phase' here"):
        _trainer(tmp_path, recipe=recipe).fit(resume=True)
    with pytest.raises(CheckpointError, match=r"another recipe: phase 1 gate_lr=0\.2 there, 0\.1 here; batch_size=128 "
                                              r"there, 20 here$"):
        _trainer(tmp_path, recipe=attrs.evolve(RECIPE, batch_size=20, phases=[
            attrs.evolve(RECIPE.phases[0], gate_lr=0.1), *RECIPE.phases[1:]])).fit(resume=True)


def test_the_recipes_gate_momentum_reaches_the_gates_group_and_a_resume_must_keep_it(uninterrupted, tmp_path):
    plain = attrs.evolve(RECIPE, gate_momentum=0.0)
    t = _trainer(tmp_path / "plain", recipe=plain)
    assert [g.get("momentum") for g in t._make_optimizer().param_groups] == [0.9, 0.0]
    shutil.copy(uninterrupted.out_dir / "last.pt", tmp_path / "last.pt")
    with pytest.raises(CheckpointError, match=r"another recipe: gate_momentum=None there, 0\.0 here$"):
        _trainer(tmp_path, recipe=plain).fit(resume=True)


@pytest.mark.parametrize("given", [dict(gate="random"), dict(K=3), dict(gate="full", K=None), dict(gate="real")])
def test_resuming_with_another_gate_kind_or_k_is_refused(uninterrupted, tmp_path, given):
    # the checkpoint's topk gates froze in training (gate kind frozen): that alone is no difference
    assert uninterrupted.net.gate_kind == "frozen" and uninterrupted.net.graph().graph["frozen_from"] == "topk"
    shutil.copy(uninterrupted.out_dir / "last.pt", tmp_path / "last.pt")
    other = Trainer(connlearn.build(**tiny(**given)), RandomLoader(), None, RECIPE, out_dir=tmp_path, progress=False)
    with pytest.raises(CheckpointError, match=r"was trained with gate=frozen.* K=2") as refused:
        other.fit(resume=True)
    assert ("learned as topk" in str(refused.value)) == (given.get("gate", "topk") in ("topk", "real"))
    assert Trainer(connlearn.build(**tiny()), RandomLoader(), None, RECIPE, out_dir=tmp_path,
                   progress=False).fit(resume=True)  # the network that learned it resumes (here: at its end)


def test_a_resume_check_sees_the_checkpoint_resumed_from_and_can_refuse_it(uninterrupted, tmp_path):
    _trainer(tmp_path).fit(max_epochs=2)
    last = tmp_path / "last.pt"
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])  # the trainer falls back to previous.pt
    seen = []
    with pytest.warns(UserWarning, match="previous.pt"):
        _trainer(tmp_path, resume_check=lambda ckpt: seen.append(ckpt["epoch"])).fit(max_epochs=0)
    assert seen == [1]

    def refuse(ckpt):
        raise CheckpointError("another run")

    refused = _trainer(tmp_path, resume_check=refuse)
    with pytest.raises(CheckpointError, match="another run"), pytest.warns(UserWarning, match="previous.pt"):
        refused.fit()
    assert refused.epoch == 0  # nothing was restored


def test_resume_true_without_a_checkpoint_is_an_error(tmp_path):
    with pytest.raises(CheckpointError, match="no checkpoint"):
        _trainer(tmp_path).fit(resume=True)


def test_a_checkpoint_rebuilds_the_trained_network(uninterrupted):
    net = connlearn.checkpoint.net_from_checkpoint(uninterrupted.out_dir / "last.pt").eval()
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(net(x), uninterrupted.net.eval()(x))


def test_tensorboard_scalars_are_written(tmp_path):
    pytest.importorskip("tensorboard")
    import threading

    def writers():
        return sum(type(thread).__name__ == "_AsyncWriterThread" for thread in threading.enumerate())

    before = writers()
    t = _trainer(tmp_path, tensorboard=True, recipe=get_recipe("cifar").scaled(1))
    t.fit(max_epochs=1)
    t.fit()  # a later call writes on
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))
    assert writers() == before  # each call's writer is closed: no thread of it lives on past the call


def test_an_unknown_amp_mode_names_the_allowed_ones(tmp_path):
    with pytest.raises(connlearn.ConnlearnError, match="did you mean 'bf16'"):
        _trainer(tmp_path, amp="bf61")


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16])
def test_a_network_not_in_float32_is_named_when_the_trainer_is_made(tmp_path, dtype):
    # its loaders give float32 images, and the gates' steps need float32: amp computes in half precision
    net = connlearn.build(**tiny()).to(dtype)
    with pytest.raises(connlearn.ConnlearnError, match=rf"the Trainer trains float32 networks; this one has {dtype} "
                                                       r"weights: give it net.float\(\), and amp='bf16'"):
        Trainer(net, RandomLoader(), None, RECIPE, out_dir=tmp_path, progress=False)


def test_an_unknown_compile_mode_names_the_allowed_ones(tmp_path):
    with pytest.raises(connlearn.ConnlearnError, match="did you mean 'reduce-overhead'"):
        _trainer(tmp_path, compile="reduce-overhed")


@pytest.mark.slow
def test_a_compiled_trainer_follows_the_eager_one(tmp_path):
    recipe = Recipe("short", [Phase(1, 0.1, gate_lr=0.2), Phase(1, 0.01, frozen=True)])
    eager = _trainer(tmp_path / "eager", recipe=recipe).fit()
    compiled = _trainer(tmp_path / "compiled", recipe=recipe, compile="default").fit()
    for a, b in zip(eager, compiled, strict=True):
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-3)
        assert a["active_branches"] == b["active_branches"]


def test_gate_row_std_counts_gate_matrices_of_every_width():
    from connlearn.train import gate_statistics

    net = connlearn.build("dense", **tiny(M=9, C=3, K=2))  # the third module of a stage reads 6 inputs
    with torch.no_grad():
        for p in net.gate_parameters():
            p.copy_(torch.tensor([0.0, 1.0]).repeat(p.shape[-1])[: p.shape[-1]].expand_as(p) if p.shape[-1] == 6
                    else torch.full_like(p, 0.5))
    rows = [p.shape[0] for p in net.gate_parameters()]
    wide = [p.shape[-1] == 6 for p in net.gate_parameters()]
    assert any(wide) and not all(wide)
    expected = sum(r for r, w in zip(rows, wide, strict=True) if w) * torch.tensor([0.0, 1.0] * 3).std() / sum(rows)
    assert gate_statistics(net)["gate_row_std"] == pytest.approx(expected.item())


def test_the_renormalized_rule_starts_from_normalised_gates_and_resumes_exactly(tmp_path):
    recipe = Recipe("r", [Phase(2, 0.1, gate_lr=0.2)], batch_size=16)
    whole = _trainer(tmp_path / "whole", recipe=recipe, gate_grad="renormalized")
    log = whole.fit()
    first = read_jsonl(tmp_path / "whole" / "gates.jsonl")[0]
    for rows in first["gates"].values():  # the step-0 snapshot already holds rows that sum to 1
        assert all(abs(sum(row) - 1) < 1e-6 for row in rows)
    parts = _trainer(tmp_path / "parts", recipe=recipe, gate_grad="renormalized")
    parts.fit(max_epochs=1)
    resumed = _trainer(tmp_path / "parts", recipe=recipe, gate_grad="renormalized")
    assert _without_timings(resumed.fit(resume=True)) == _without_timings(log)
    _assert_same_state(resumed.net, whole.net)


def test_an_annealed_temperature_is_logged_snapshotted_and_resumed_exactly(tmp_path):
    annealed = Phase(2, 0.1, gate_lr=0.2, temperature=1.0, temperature_end=0.01)
    recipe = Recipe("t", [annealed, Phase(1, 0.01, frozen=True)], batch_size=16)
    whole = _trainer(tmp_path / "whole", recipe=recipe)
    log = whole.fit()
    steps = len(RandomLoader())  # 4 per epoch: 8 in phase 1, the last at temperature 0.01
    assert [r.get("temperature") for r in log] == pytest.approx([0.01 ** (3 / 7), 0.01, None])
    snapshots = read_jsonl(tmp_path / "whole" / "gates.jsonl")
    assert [s["step"] for s in snapshots[:3]] == [0, 2, 4] and steps == 4
    assert [s["temperature"] for s in snapshots[:3]] == pytest.approx([1.0, 0.01 ** (1 / 7), 0.01 ** (3 / 7)])
    parts = _trainer(tmp_path / "parts", recipe=recipe)
    parts.fit(max_epochs=1)
    resumed = _trainer(tmp_path / "parts", recipe=recipe)
    assert _without_timings(resumed.fit(resume=True)) == _without_timings(log)
    _assert_same_state(resumed.net, whole.net)
    plain = _trainer(tmp_path / "plain", recipe=attrs.evolve(recipe, phases=[
        attrs.evolve(recipe.phases[0], temperature_end=None), recipe.phases[1]]))
    assert [r.get("temperature") for r in plain.fit()] == [1.0, 1.0, None]
    # the gates start at U(0,1) draws: at temperature 0.01 nearly every draw is the top-K, at 1 few are
    assert log[1]["drawn_topk_share"] > 0.9 > 0.5 > plain.history[1]["drawn_topk_share"]


def test_a_checkpoint_with_any_entry_damaged_or_missing_is_refused_by_name_on_resume(tmp_path):
    """Law: a last.pt whose entries were edited or lost (and no previous.pt to fall back to) stops the resume
    with a ConnlearnError, never a KeyError or TypeError from inside."""
    import contextlib

    from connlearn.errors import ConnlearnError

    recipe = Recipe(name="r", phases=(Phase(epochs=1, lr=0.1, gate_lr=0.1), Phase(epochs=1, lr=0.01, frozen=True)),
                    batch_size=8)

    def trainer(out):
        return Trainer(connlearn.build(**tiny()), RandomLoader(n=16, batch=8), RandomLoader(n=8, batch=8), recipe,
                       out_dir=out, progress=False, verbose=False)

    trainer(tmp_path / "base").fit(max_epochs=1)
    saved = torch.load(tmp_path / "base" / "last.pt", weights_only=False)
    for key in sorted(saved):
        for value in (None, "x", {"a": 1}, torch.zeros(3), "<missing>"):
            out = tmp_path / f"{key}-{len(str(value))}"
            shutil.copytree(tmp_path / "base", out)
            damaged = {k: v for k, v in saved.items() if k != key or value != "<missing>"}
            if value != "<missing>":
                damaged[key] = value
            torch.save(damaged, out / "last.pt")
            with contextlib.suppress(ConnlearnError):
                trainer(out).fit()
    for name, edit in (("cuda", lambda c: c["rng"].update(cuda=torch.zeros(8, dtype=torch.uint8))),
                       ("cuda-list", lambda c: c["rng"].update(cuda=["x"])),
                       ("ranks", lambda c: c["rng"].update(ranks=[{"torch": "x"}])),
                       ("ranks-empty", lambda c: c["rng"].update(ranks=[])),
                       ("state", lambda c: c["optimizer"].update(state=[]))):
        damaged = torch.load(tmp_path / "base" / "last.pt", weights_only=False)
        edit(damaged)
        out = tmp_path / f"nested-{name}"
        shutil.copytree(tmp_path / "base", out)
        torch.save(damaged, out / "last.pt")
        with pytest.raises(CheckpointError, match="is damaged or of another version"):
            trainer(out).fit()


def test_a_checkpoint_that_cannot_be_written_is_named_as_asked_not_by_its_temporary(tmp_path, monkeypatch):
    import connlearn.files
    from connlearn.checkpoint import save_atomic

    def full(path, mode="r"):
        raise OSError(28, "No space left on device", str(path))

    monkeypatch.setattr(connlearn.files, "open", full, raising=False)
    with pytest.raises(OSError, match="No space left on device") as caught:
        save_atomic({}, tmp_path / "last.pt")
    assert caught.value.filename == str(tmp_path / "last.pt") and not list(tmp_path.iterdir())


@pytest.mark.parametrize("stop_before", [1, 2, 3, 4])  # the file moves of one save: best.pt, .next.pt, last.pt twice
def test_a_run_stopped_while_saving_a_new_best_ends_with_the_best_checkpoint_of_an_uninterrupted_run(
        uninterrupted, tmp_path, monkeypatch, stop_before):
    import os

    bests = [r["epoch"] for i, r in enumerate(uninterrupted.history)
             if r["test_top1"] > max([0.0] + [q["test_top1"] for q in uninterrupted.history[:i]])]
    stop_at = bests[-1]  # the last epoch that sets a new best
    t = _trainer(tmp_path)
    original_save, original_replace, moves = t._save, os.replace, []

    def save(best):
        moves.clear()
        moves.append(t.epoch == stop_at and best)
        original_save(best)

    def replace(src, dst):
        if moves and moves[0]:
            moves.append(dst)
            if len(moves) - 1 == stop_before:
                raise KeyboardInterrupt
        original_replace(src, dst)

    t._save = save
    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(KeyboardInterrupt):
        t.fit()
    monkeypatch.undo()
    _trainer(tmp_path).fit()
    ours, theirs = load_checkpoint(tmp_path / "best.pt"), load_checkpoint(uninterrupted.out_dir / "best.pt")
    assert (ours["epoch"], ours["best_top1"]) == (theirs["epoch"], theirs["best_top1"]) == (
        stop_at, uninterrupted.best_top1)


def _diverging_in(phase):  # a learning rate no network survives, from the given phase on
    return attrs.evolve(RECIPE, phases=tuple(attrs.evolve(p, lr=1e8) if i >= phase - 1 else p
                                             for i, p in enumerate(RECIPE.phases)))


def test_a_run_that_diverges_stops_there_and_keeps_the_last_finite_epoch(tmp_path):
    t = _trainer(tmp_path, recipe=_diverging_in(2))
    with pytest.raises(DivergenceError, match=r"diverged in epoch 2 \(lr 1e\+08\b.*running statistics are no longer "
                                              r"finite \(the first: stem\.conv\.weight\).*last\.pt holds epoch 1\)"):
        t.fit()
    assert [r["epoch"] for r in read_jsonl(tmp_path / "log.jsonl")] == [1]
    for name in ("last.pt", "best.pt"):
        assert load_checkpoint(tmp_path / name)["epoch"] == 1
        assert all(torch.isfinite(v).all() for v in load_checkpoint(tmp_path / name)["model"].values()
                   if torch.is_tensor(v) and v.is_floating_point())
    with pytest.raises(DivergenceError, match="make a new Trainer"):  # what is in memory is not trained on
        t.fit()
    with pytest.raises(DivergenceError, match="diverged in epoch 2"):  # resumed from epoch 1, the same again
        _trainer(tmp_path, recipe=_diverging_in(2)).fit()


def test_a_run_that_diverges_in_its_first_epoch_writes_no_checkpoint(tmp_path):
    with pytest.raises(DivergenceError, match=r"in epoch 1 .*this trainer has written no checkpoint"):
        _trainer(tmp_path, recipe=_diverging_in(1)).fit()
    assert not (tmp_path / "last.pt").exists() and not (tmp_path / "best.pt").exists()


class _StoppingLoader:
    """``loader`` that stops the run (as a kill would) when it is asked for its ``stop_at``-th batch of the run."""

    def __init__(self, stop_at, loader=None):
        self.loader = RandomLoader() if loader is None else loader
        self.left = stop_at

    def __len__(self):
        return len(self.loader)

    def epoch(self, epoch):
        for batch in self.loader.epoch(epoch):
            self.left -= 1
            if self.left < 0:
                raise KeyboardInterrupt
            yield batch


# 4 batches an epoch, a checkpoint every 3 steps: the last written within epoch 2, 3 or 4, after its batch 2, 1 or 3
@pytest.mark.parametrize(("stop_at", "step", "batch"), [(7, 6, 2), (10, 9, 1), (15, 15, 3)])
def test_a_run_stopped_within_an_epoch_resumes_from_its_last_step_checkpoint_and_ends_bit_identical(
        uninterrupted, tmp_path, stop_at, step, batch):
    net = connlearn.build(**tiny(gate_init="uniform"))
    first = Trainer(net, _StoppingLoader(stop_at), RandomLoader(n=32, seed=1), RECIPE, out_dir=tmp_path,
                    progress=False, snapshot_every=2, checkpoint_every=3)
    with pytest.raises(KeyboardInterrupt):
        first.fit()
    saved = load_checkpoint(tmp_path / "last.pt")
    assert (saved["step"], saved["epoch"], saved["within_epoch"]["batch"]) == (step, (step - batch) // 4, batch)
    shutil.copytree(tmp_path, tmp_path / "copy")
    first.train_loader = RandomLoader()  # the trainer that stopped goes on from last.pt, not from its memory
    for resumed in (first, _trainer(tmp_path / "copy", checkpoint_every=3)):  # and so does a new one
        resumed.fit()
        _assert_same_state(resumed.net, uninterrupted.net)
        assert _without_timings(resumed.history) == _without_timings(uninterrupted.history)
        assert _without_timings(read_jsonl(resumed.out_dir / "log.jsonl")) == _without_timings(uninterrupted.history)
        assert read_jsonl(resumed.out_dir / "gates.jsonl") == read_jsonl(uninterrupted.out_dir / "gates.jsonl")


def test_a_run_that_diverges_between_checkpoints_within_an_epoch_keeps_the_last_finite_one(tmp_path):
    with pytest.raises(DivergenceError, match=r"diverged in epoch 2 \(by its batch [1-3]\)"):
        _trainer(tmp_path, recipe=_diverging_in(2), checkpoint_every=1).fit()
    saved = load_checkpoint(tmp_path / "last.pt")
    assert saved["epoch"] == 1 and all(torch.isfinite(v).all() for v in saved["model"].values()
                                       if torch.is_tensor(v) and v.is_floating_point())


def test_a_trainer_stopped_within_its_first_epoch_before_any_checkpoint_refuses_to_go_on(tmp_path):
    t = Trainer(connlearn.build(**tiny()), _StoppingLoader(2), None, RECIPE, out_dir=tmp_path, progress=False)
    with pytest.raises(KeyboardInterrupt):
        t.fit()
    with pytest.raises(CheckpointError, match=r"stopped within epoch 1 .*part-trained.*no checkpoint of it to"):
        t.fit()
    with pytest.raises(CheckpointError, match=r"stopped within epoch 1 .*\(resume=False\)"):
        t.fit(resume=False)


class _Unready(RandomLoader):
    """Fails before its first batch, once."""

    failed = False

    def epoch(self, epoch):
        if not self.failed:
            self.failed = True
            raise OSError("not mounted yet")
        yield from super().epoch(epoch)


def test_a_trainer_whose_loader_failed_before_any_step_can_fit_again(uninterrupted, tmp_path):
    t = _trainer(tmp_path)
    t.train_loader = _Unready()
    with pytest.raises(OSError, match="not mounted yet"):
        t.fit()
    t.fit()
    _assert_same_state(t.net, uninterrupted.net)


class _GlobalRandomLoader(RandomLoader):
    """Shuffles from torch's global random state, as a DataLoader(shuffle=True) without a generator does."""

    def epoch(self, epoch):
        order = torch.randperm(len(self.x))
        for i in range(len(self)):
            yield self.x[order[i * self.batch:(i + 1) * self.batch]], self.y[order[i * self.batch:(i + 1) * self.batch]]


def test_a_resume_with_a_loader_of_another_seed_is_refused(tmp_path):
    # the data order and augmentation come from (seed, epoch): another seed would mix two orders in one run
    from connlearn.data import make_loaders, synthetic

    train, _ = synthetic(num_classes=10, n_train=64, n_test=8, seed=0)

    def trainer(seed):
        loader = make_loaders(train, train, 16, device=torch.device("cpu"), seed=seed)[0]
        return Trainer(connlearn.build(**tiny()), loader, None, RECIPE, out_dir=tmp_path, progress=False)

    trainer(5).fit(max_epochs=1)
    assert load_checkpoint(tmp_path / "last.pt")["data_seed"] == 5
    with pytest.raises(CheckpointError, match=r"trained on the data order of seed 5, and the training loader "
                                              r"given has seed 6 \(on this rank or another\): give it the loader"):
        trainer(6).fit()
    trainer(5).fit(max_epochs=1)  # its own seed resumes
    # a loader of the user's may be seeded otherwise (by rank, say): neither recorded nor checked
    _trainer(tmp_path / "own").fit(max_epochs=1)
    assert load_checkpoint(tmp_path / "own" / "last.pt")["data_seed"] is None


def test_a_loader_without_a_start_that_shuffles_from_the_global_random_state_resumes_exactly_within_an_epoch(
        tmp_path):
    def trainer(out, loader):
        torch.manual_seed(0)
        return Trainer(connlearn.build(**tiny(gate_init="uniform")), loader, None, RECIPE, out_dir=out,
                       progress=False, checkpoint_every=3)

    whole = trainer(tmp_path / "whole", _GlobalRandomLoader())
    whole.fit()
    with pytest.raises(KeyboardInterrupt):
        trainer(tmp_path / "parts", _StoppingLoader(7, _GlobalRandomLoader())).fit()  # within epoch 2
    torch.manual_seed(123)  # whatever the state the resuming process starts with
    resumed = trainer(tmp_path / "parts", _GlobalRandomLoader())
    resumed.fit()
    _assert_same_state(resumed.net, whole.net)
    assert _without_timings(resumed.history) == _without_timings(whole.history)


def test_a_trainer_stopped_in_the_epoch_it_froze_goes_on_from_the_checkpoint_before_the_freeze(uninterrupted,
                                                                                                 tmp_path):
    t = _trainer(tmp_path)
    t.train_loader = _StoppingLoader(5)  # within epoch 2, which froze the connectivity at its start
    with pytest.raises(KeyboardInterrupt):
        t.fit()
    assert t.net.fixed_connectivity and load_checkpoint(tmp_path / "last.pt")["epoch"] == 1
    t.train_loader = RandomLoader()
    t.fit()
    _assert_same_state(t.net, uninterrupted.net)
    assert _without_timings(t.history) == _without_timings(uninterrupted.history)


def test_a_trainer_resumed_after_the_freeze_may_go_back_to_a_checkpoint_from_before_it(uninterrupted, tmp_path):
    first = _trainer(tmp_path, checkpoint_every=3)
    first.train_loader = _StoppingLoader(7)  # last.pt: within epoch 2 (frozen); previous.pt: epoch 1 (not yet)
    with pytest.raises(KeyboardInterrupt):
        first.fit()
    shutil.copy(tmp_path / "previous.pt", tmp_path / "before.pt")
    t = _trainer(tmp_path, checkpoint_every=3)
    t.fit(max_epochs=0)  # resumes the frozen network, trains nothing
    assert t.net.fixed_connectivity
    t.fit(resume=tmp_path / "before.pt")
    _assert_same_state(t.net, uninterrupted.net)


def test_tensorboard_shows_each_epoch_once_after_a_resume_from_an_earlier_checkpoint(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    recipe = get_recipe("cifar").scaled(4)
    _trainer(tmp_path, tensorboard=True, recipe=recipe).fit(max_epochs=2)
    again = _trainer(tmp_path, tensorboard=True, recipe=recipe)
    again.fit(resume=tmp_path / "previous.pt", max_epochs=2)  # epoch 1's state: epoch 2 is trained and logged again
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    logged = events.Scalars("train_loss")
    assert [e.step for e in logged] == [1, 2, 3]
    assert [e.value for e in logged] == pytest.approx([r["train_loss"] for r in again.history])
