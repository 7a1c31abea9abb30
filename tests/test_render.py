"""Pictures: the DOT source names the IR's nodes and draws the edges the function reads; every picture is drawn
with Graphviz where it is installed and with matplotlib where it is not; the plots of a run."""

import re
import shutil

import numpy as np
import pytest
from conftest import needs_dot, tiny
from PIL import Image

import connlearn
from connlearn import plots, render
from connlearn.graph import dead_blocks


@pytest.fixture
def learned():
    return connlearn.build(**tiny(K=1, M=6, gate_init="uniform")).freeze().graph()


def _nodes_and_edges(source):
    nodes = set(re.findall(r'^\s*"?([\w./]+)"?\s*\[', source, re.M))
    edges = set(re.findall(r'^\s*"?([\w./]+)"?\s*->\s*"?([\w./]+)"?\s*\[(?!style=invis)', source, re.M))
    return nodes, edges


def test_the_dot_source_draws_what_the_function_reads(learned):
    nodes, edges = _nodes_and_edges(render.to_dot(learned).source)
    assert nodes == {"input", "output", *learned.block_nodes()}
    assert edges == set(learned.used_edges())
    nodes, _ = _nodes_and_edges(render.to_dot(learned, dead="hide").source)
    assert nodes == {"input", "output", *learned.block_nodes()} - dead_blocks(learned)


def test_resnext_beside_the_learned_connectivity_names_both(learned):
    source = render.side_by_side(learned).source
    nodes, edges = _nodes_and_edges(source)
    assert "cluster_resnext" in source and ("resnext/m2.b1", "resnext/m3.b4") in edges
    assert nodes == {f"{side}/{n}" for side in ("resnext", "learned") for n in ["input", "output", *learned.nodes]
                     if n not in ("input", "output")} | {f"{side}/{n}" for side in ("resnext", "learned")
                                                         for n in ("input", "output")}


@pytest.mark.parametrize("suffix", [".svg", ".png", ".pdf"])
def test_a_picture_is_drawn_with_matplotlib_where_graphviz_is_missing(learned, tmp_path, monkeypatch, suffix):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    files = render.save(learned, tmp_path / f"c{suffix}", beside_resnext=True)
    assert files == [tmp_path / "c.dot", tmp_path / f"c{suffix}"] and all(f.stat().st_size for f in files)


def test_the_matplotlib_png_is_a_grid_of_one_row_per_module(learned, tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    image = Image.open(render.save(learned, tmp_path / "c.png", beside_resnext=True)[1])
    assert image.format == "PNG" and image.size == (1020, 780)  # 150 dpi: two panels of 4 branches, 6 modules + 2
    pixels = np.asarray(image.convert("RGB")).astype(int)
    green = (np.abs(pixels - [0x5C, 0xB8, 0x5C]).sum(-1) < 40).any(axis=1)  # the rows holding a live block
    assert int(green[0]) + int((green[1:] & ~green[:-1]).sum()) == len(learned.modules()) + 1 == 7  # + the key's


def test_every_drawing_carries_its_key(learned):
    assert render.KEY in render.to_dot(learned).source and render.KEY in render.side_by_side(learned).source


@needs_dot
def test_graphviz_renders_the_picture_where_it_is_installed(learned, tmp_path):
    files = render.save(learned, tmp_path / "c.svg")
    assert "<svg" in files[1].read_text() and "m1.b1" in files[1].read_text()


def test_a_pruned_connectivity_has_no_resnext_to_draw_beside_it(learned, tmp_path):
    pruned = connlearn.prune_dead_blocks(connlearn.from_graph(learned))[0].graph()
    assert render.pruned(pruned) and not render.pruned(learned)
    with pytest.raises(connlearn.ConfigError, match="pruned"):
        render.save(pruned, tmp_path / "c.dot", beside_resnext=True)


def test_the_plots_of_a_run_and_the_gate_statistics(tmp_path):
    net = connlearn.build(**tiny(gate_init="uniform"))
    graph = net.graph()
    snapshots = [{"step": s, "epoch": s / 4, "gates": {"2": [[0.1, 0.9, 0.5, 0.2]] * 4,
                                                       "3": [[0.4 + s / 10, 0.3, 0.5, 0.7]] * 4}} for s in range(5)]
    stats = plots.gate_statistics(snapshots, K=2)  # ties to the lower column, where no tie order is recorded
    assert [s["topk_changed"] for s in stats] == [None, 0.5, 0.0, 0.0, 0.0]
    assert [s["final_topk_share"] for s in stats] == [0.75, 1.0, 1.0, 1.0, 1.0]
    log = [{"epoch": e, "phase": e, "test_top1": 10.0, "train_loss": 2.0, "drawn_distinct": 3.0, "gate_mean": 0.5,
            "gate_at_1": 0.0, "gate_entropy": 1.0, "drawn_topk_share": 0.2} for e in (1, 2)]
    files = plots.plot_run(graph, tmp_path, K=2, log=log)
    assert {f.name for f in files} == {"active_branches.png", "gate_heatmaps.png", "curves.png", "draws.png"}
    one_epoch_of_draws = [log[0], {**log[1], "drawn_distinct": None}]  # phase 1 of one epoch: no curve to draw
    assert "draws.png" not in {f.name for f in plots.plot_run(graph, tmp_path / "one", K=2, log=one_epoch_of_draws)}
    assert plots.plot_gate_evolution(snapshots, tmp_path / "e.svg", K=2).read_text().startswith("<?xml")
