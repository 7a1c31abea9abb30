"""connlearn.plots: connectivity, gate-evolution and training figures, and the gate statistics behind them."""

import json

import matplotlib
import pytest
from conftest import tiny
from hypothesis import given, settings
from hypothesis import strategies as st

import connlearn
from connlearn import plots
from connlearn.errors import ConfigError, DataError

PNG = b"\x89PNG\r\n\x1a\n"


def _graph(**overrides):
    return connlearn.build(**tiny(**overrides)).graph()


def _snapshot(step, epoch, gates):
    return {"step": step, "epoch": epoch, "gates": gates}


@pytest.fixture
def snapshots():
    """Two snapshots of one module with two blocks and two candidate inputs; K=1."""
    return [
        _snapshot(0, 0.0, {"2": [[1.0, 0.0], [0.5, 0.5]]}),
        _snapshot(10, 0.5, {"2": [[0.0, 1.0], [0.5, 0.5]]}),
    ]


@pytest.fixture
def log():
    return [{"epoch": e, "train_loss": 2.0 / e, "test_top1": 40.0 + e} for e in range(1, 6)]


def _write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


# ---------------------------------------------------------------------------- figures are written
def test_active_branches_plot_of_several_runs_is_a_png(tmp_path):
    graphs = {"K=1": _graph(M=6, K=1, gate="random"), "K=4": _graph(M=6, K=4, gate="random")}
    path = plots.plot_active_branches(graphs, tmp_path / "branches.png", title="CIFAR-100")
    assert path == tmp_path / "branches.png"
    assert path.read_bytes().startswith(PNG)


def test_active_branches_plot_takes_a_single_graph(tmp_path):
    path = plots.plot_active_branches(_graph(K=1, gate="random"), tmp_path / "branches.png")
    assert path.read_bytes().startswith(PNG)


def test_gate_heatmaps_plot_is_a_png(tmp_path):
    path = plots.plot_gate_heatmaps(_graph(M=6, gate="topk", gate_init="uniform"), tmp_path / "gates.png")
    assert path.read_bytes().startswith(PNG)


@pytest.mark.parametrize("count", [1, 4, 8, 9, 32, 64, 128])
def test_heatmap_ticks_number_every_row_up_to_eight_and_about_eight_beyond(count):
    ticks = plots._ticks(count)
    assert ticks[0] == 0 and ticks == sorted(set(ticks)) and ticks[-1] < count
    assert len(ticks) == count if count <= 8 else 4 <= len(ticks) <= 8


def test_gate_evolution_plot_is_a_png(snapshots, tmp_path):
    path = plots.plot_gate_evolution(snapshots, tmp_path / "evolution.png", K=1)
    assert path.read_bytes().startswith(PNG)


def test_gate_evolution_plot_reads_the_trainers_jsonl(snapshots, tmp_path):
    source = _write_jsonl(tmp_path / "gates.jsonl", snapshots)
    path = plots.plot_gate_evolution(source, tmp_path / "evolution.png", K=1)
    assert path.read_bytes().startswith(PNG)


def test_training_curves_plot_is_a_png(log, tmp_path):
    path = plots.plot_training_curves(log, tmp_path / "curves.png", keys=("test_top1", "train_loss"))
    assert path.read_bytes().startswith(PNG)


def test_training_curves_plot_compares_runs_given_as_files_or_records(log, tmp_path):
    runs = {"topk": _write_jsonl(tmp_path / "log.jsonl", log), "random": log[:3]}
    path = plots.plot_training_curves(runs, tmp_path / "curves.png")
    assert path.read_bytes().startswith(PNG)


@pytest.mark.parametrize("eval_set", ["test", "validation"])
def test_training_curves_name_the_evaluation_set_on_the_axis(log, tmp_path, eval_set):
    with matplotlib.rc_context({"svg.fonttype": "none"}):  # text as text, to read it back
        path = plots.plot_training_curves(log, tmp_path / "curves.svg", keys=("test_top1", "train_loss"),
                                          eval_set=eval_set)
    text = path.read_text()
    other = "validation" if eval_set == "test" else "test"
    assert f"{eval_set} top-1 (%)" in text and "train loss" in text
    assert f"{other} top-1" not in text and "test_top1" not in text


def test_an_unknown_log_key_labels_its_axis_with_the_key():
    assert plots.axis_label("my_metric", "validation") == "my_metric"
    assert plots.axis_label("acc{1}", "validation") == "acc{1}"
    assert plots.axis_label("test_loss", "validation") == "validation loss"


@pytest.mark.parametrize("eval_set", ["", "  ", None])
def test_an_empty_evaluation_set_name_is_a_config_error(log, tmp_path, eval_set):
    with pytest.raises(ConfigError, match="eval_set"):
        plots.plot_training_curves(log, tmp_path / "curves.png", eval_set=eval_set)
    with pytest.raises(ConfigError, match="eval_set"):  # with or without a log
        plots.plot_run(_graph(), tmp_path, K=1, eval_set=eval_set)
    assert not list(tmp_path.iterdir())


def test_format_follows_the_suffix(log, tmp_path):
    path = plots.plot_training_curves(log, tmp_path / "curves.svg")
    assert b"<svg" in path.read_bytes()[:500]


def test_a_path_without_suffix_gets_png(log, tmp_path):
    path = plots.plot_training_curves(log, tmp_path / "curves")
    assert path == tmp_path / "curves.png"
    assert path.read_bytes().startswith(PNG)


@pytest.mark.parametrize(
    "plot",
    [
        lambda path: plots.plot_active_branches(_graph(), path),
        lambda path: plots.plot_gate_heatmaps(_graph(), path),
        lambda path: plots.plot_gate_evolution([_snapshot(0, 0.0, {"2": [[0.5]]})], path, K=1),
        lambda path: plots.plot_training_curves([{"epoch": 1, "test_top1": 1.0}], path),
    ],
    ids=["active_branches", "gate_heatmaps", "gate_evolution", "training_curves"],
)
def test_every_plot_rejects_an_unsupported_suffix(plot, tmp_path):
    with pytest.raises(ConfigError, match=r"\.png \.svg \.pdf"):
        plot(tmp_path / "figure.jpg")
    assert not list(tmp_path.iterdir())


# ---------------------------------------------------------------------------- gate statistics
def test_gate_statistics_has_one_record_per_snapshot_with_step_and_epoch(snapshots):
    stats = plots.gate_statistics(snapshots, K=1)
    assert [(s["step"], s["epoch"]) for s in stats] == [(0, 0.0), (10, 0.5)]


def test_gate_statistics_mean_and_spread(snapshots):
    first = plots.gate_statistics(snapshots, K=1)[0]
    assert first["mean"] == pytest.approx(0.5)
    assert first["std"] == pytest.approx((1 / 6) ** 0.5)  # sample std of 1, 0, .5, .5
    assert first["row_std"] == pytest.approx((0.5**0.5 + 0.0) / 2)  # rows [1, 0] and [.5, .5]


def test_gate_statistics_counts_entries_clipped_at_0_and_1():
    stats = plots.gate_statistics([_snapshot(0, 0.0, {"2": [[1.0, 1.0, 0.0], [0.0, 0.2, 1.0]]})], K=1)
    assert stats[0]["frac_at_1"] == pytest.approx(3 / 6)
    assert stats[0]["frac_at_0"] == pytest.approx(2 / 6)


def test_gate_statistics_topk_changed_is_the_fraction_of_blocks_with_a_new_top_k(snapshots):
    stats = plots.gate_statistics(snapshots, K=1)
    assert stats[0]["topk_changed"] is None  # nothing to compare with
    assert stats[1]["topk_changed"] == pytest.approx(1 / 2)  # block 1 moved from input 1 to 2; block 2 kept a tie


def test_gate_statistics_final_topk_share_is_the_share_of_the_last_top_k_already_held(snapshots):
    stats = plots.gate_statistics(snapshots, K=1)
    # block 1 moves from input 0 to input 1 (not yet held), block 2 keeps input 0 (a tie, by index)
    assert [s["final_topk_share"] for s in stats] == [0.5, 1.0]
    assert plots.settled_epoch(stats) == 0.5


def test_settled_epoch_is_the_first_snapshot_of_the_final_top_k_for_good():
    rows = [[[1.0, 0.0]], [[0.0, 1.0]], [[1.0, 0.0]], [[0.9, 0.1]], [[0.8, 0.2]]]
    stats = plots.gate_statistics([_snapshot(i, float(i), {"2": r}) for i, r in enumerate(rows)], K=1)
    assert [s["final_topk_share"] for s in stats] == [1.0, 0.0, 1.0, 1.0, 1.0]
    assert plots.settled_epoch(stats) == 2.0  # held at epoch 0 too, but lost in between
    assert plots.settled_epoch([]) is None


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 3), st.integers(2, 8), st.data())
def test_final_topk_share_laws(K, snapshots_n, data):
    """In [0, 1] in steps of 1/(K·blocks), 1 at the last snapshot, and 1 from the settled epoch on."""
    blocks, inputs = 2, 4
    value = st.sampled_from([0.0, 0.25, 0.5, 1.0])  # coarse values, so ties occur
    row = st.lists(value, min_size=inputs, max_size=inputs)
    matrices = [data.draw(st.lists(row, min_size=blocks, max_size=blocks)) for _ in range(snapshots_n)]
    stats = plots.gate_statistics([_snapshot(i, i / 2, {"2": m}) for i, m in enumerate(matrices)], K=K)
    shares = [s["final_topk_share"] for s in stats]
    assert shares[-1] == 1.0
    assert all(0 <= v <= 1 and v * K * blocks == pytest.approx(round(v * K * blocks)) for v in shares)
    settled = plots.settled_epoch(stats)
    assert all(s["final_topk_share"] == 1.0 for s in stats if s["epoch"] >= settled)
    before = [s for s in stats if s["epoch"] < settled]
    assert not before or before[-1]["final_topk_share"] < 1


def test_gate_statistics_ranks_ties_by_the_tie_order_of_the_step_0_snapshot():
    first = {**_snapshot(0, 0.0, {"2": [[1.0, 1.0, 0.0]]}), "tie_order": {"2": [[0.1, 0.9, 0.5]]}}
    later = _snapshot(10, 0.5, {"2": [[1.0, 1.0, 1.0]]})  # input 2 joins the tie and ranks below input 1
    moved = _snapshot(20, 1.0, {"2": [[1.0, 0.0, 1.0]]})
    stats = plots.gate_statistics([first, later, moved], K=1)
    assert [s["topk_changed"] for s in stats] == [None, 0.0, 1.0]  # {1}, {1}, then {2}
    by_index = plots.gate_statistics([_snapshot(0, 0.0, {"2": [[1.0, 1.0, 0.0]]}), moved], K=1)
    assert by_index[1]["topk_changed"] == 0.0  # without an order: input 0 both times


def test_gate_statistics_refuses_a_tie_order_that_fits_no_gate_matrix():
    bad = {**_snapshot(0, 0.0, {"2": [[1.0, 1.0]]}), "tie_order": {"2": [[0.1, 0.9, 0.5]]}}
    with pytest.raises(DataError, match="tie order of module 2"):
        plots.gate_statistics([bad], K=1)


def test_gate_statistics_pools_every_module():
    stats = plots.gate_statistics([_snapshot(0, 0.0, {"2": [[1.0, 1.0]], "3": [[0.0, 0.0]]})], K=1)
    assert stats[0]["mean"] == pytest.approx(0.5)
    assert stats[0]["frac_at_1"] == pytest.approx(0.5)


def test_gate_statistics_reads_a_jsonl_file_like_a_list(snapshots, tmp_path):
    source = _write_jsonl(tmp_path / "gates.jsonl", snapshots)
    assert plots.gate_statistics(source, K=1) == plots.gate_statistics(snapshots, K=1)


# ---------------------------------------------------------------------------- bad input
def test_no_snapshots_is_a_data_error():
    with pytest.raises(DataError, match="no records"):
        plots.gate_statistics([], K=1)


def test_a_snapshot_without_gates_is_a_data_error_naming_the_key():
    with pytest.raises(DataError, match="'gates'"):
        plots.gate_statistics([{"step": 0, "epoch": 0.0}], K=1)


def test_snapshots_that_change_shape_are_a_data_error(snapshots):
    snapshots.append(_snapshot(20, 1.0, {"2": [[0.5, 0.5, 0.5]]}))
    with pytest.raises(DataError, match="shapes"):
        plots.gate_statistics(snapshots, K=1)


def test_k_larger_than_the_candidate_inputs_is_a_config_error(snapshots):
    with pytest.raises(ConfigError, match="K=3"):
        plots.gate_statistics(snapshots, K=3)


def test_a_missing_snapshot_file_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match="cannot read"):
        plots.gate_statistics(tmp_path / "gates.jsonl", K=1)


def test_a_snapshot_file_that_is_not_jsonl_is_a_data_error(tmp_path):
    (tmp_path / "gates.jsonl").write_text('{"step": 0,\n')
    with pytest.raises(DataError, match="not JSONL"):
        plots.gate_statistics(tmp_path / "gates.jsonl", K=1)


@pytest.mark.parametrize(("text", "message"), [
    ('{"step": 0}\n\n[1, 2]\n', r"line 3 is a list"),
    ('{"step": 0}\n{"step": 1,\n', r"line 2: Expecting"),
    (b'{"step": 0}\n\xff\xfe\n', r"'utf-8' codec can't decode"),
])
def test_one_jsonl_reader_names_the_file_and_the_bad_line_for_the_library_and_the_command(text, message, tmp_path,
                                                                                           capsys):
    from connlearn.cli import main
    from connlearn.train import read_jsonl

    path = tmp_path / "log.jsonl"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    bad = rf"log file '{path}' is not JSONL \(one JSON object a line\): {message}"
    with pytest.raises(DataError, match=bad):
        read_jsonl(path, "log file")
    with pytest.raises(DataError, match=bad):
        plots.plot_training_curves(path, tmp_path / "c.png")
    assert main(["plot", str(path), "-o", str(tmp_path / "plots")]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"file '{path}' is not JSONL" in err
    (tmp_path / "blank.jsonl").write_text("\n \n")
    assert read_jsonl(tmp_path / "blank.jsonl") == []


def test_a_graph_without_gated_modules_is_a_data_error(tmp_path):
    g = _graph()
    g.remove_edges_from([(u, v) for u, v, d in g.edges(data=True) if d["kind"] == "gate"])
    with pytest.raises(DataError, match="no gated module"):
        plots.plot_gate_heatmaps(g, tmp_path / "gates.png")


def test_a_key_missing_from_the_log_is_a_data_error_listing_the_keys(log, tmp_path):
    with pytest.raises(DataError, match=r"no record has 'test_top5'.*test_top1"):
        plots.plot_training_curves(log, tmp_path / "curves.png", keys=("test_top5",))


def test_a_log_record_without_epoch_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match="'epoch'"):
        plots.plot_training_curves([{"test_top1": 50.0}], tmp_path / "curves.png")


def test_an_empty_list_of_graphs_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="at least one"):
        plots.plot_active_branches({}, tmp_path / "branches.png")


def test_the_pictures_of_a_run_trained_without_evaluations_plot_the_train_loss(tmp_path):
    """A trainer without a test loader logs no ``test_top1``: the curves are those the log holds."""
    log = [{"epoch": e, "train_loss": 2.0 / e, "train_top1": 10.0 * e} for e in (1, 2, 3)]
    files = plots.plot_run(_graph(), tmp_path, K=1, log=log)
    assert tmp_path / "curves.png" in files
    assert plots.logged(log, ("test_top1", "train_loss")) == ("train_loss",)
    assert plots.plot_run(_graph(), tmp_path / "none", K=1, log=[{"epoch": 1}])  # nothing to draw curves of
    assert not (tmp_path / "none" / "curves.png").exists()
