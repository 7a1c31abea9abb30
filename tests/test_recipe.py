"""Recipes: the paper's presets, proportional scaling, validation."""

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from connlearn.errors import ConnlearnError, check_temperature
from connlearn.recipe import Phase, Recipe, get_recipe


def test_cifar_preset_is_the_papers_protocol():
    r = get_recipe("cifar")
    assert [p.epochs for p in r.phases] == [120, 100, 50, 50]
    assert [p.lr for p in r.phases] == [0.1, 0.1, 0.01, 0.001]
    assert [p.gate_lr for p in r.phases] == [0.2, 0.0, 0.0, 0.0]
    assert [p.frozen for p in r.phases] == [False, True, True, True]
    assert (r.batch_size, r.momentum, r.weight_decay) == (128, 0.9, 5e-4)


def test_miniimagenet_and_imagenet_presets():
    assert get_recipe("miniimagenet").batch_size == 256
    imagenet = get_recipe("imagenet")
    assert [p.epochs for p in imagenet.phases] == [30, 30, 30, 30]
    assert (imagenet.batch_size, imagenet.weight_decay) == (256, 1e-4)


@pytest.mark.parametrize("total", [4, 5, 12, 24, 30, 100, 320, 641])
def test_scaled_keeps_the_total_and_the_order_of_phase_lengths(total):
    r = get_recipe("cifar").scaled(total)
    epochs = [p.epochs for p in r.phases]
    assert sum(epochs) == total and min(epochs) >= 1
    assert epochs[0] >= epochs[1] >= epochs[2] and epochs[2] == epochs[3]


def test_scaled_below_the_number_of_phases_keeps_the_first_phases():
    assert [p.epochs for p in get_recipe("cifar").scaled(2).phases] == [1, 1]


@given(st.lists(st.integers(1, 500), min_size=4, max_size=4))
def test_a_given_split_keeps_every_phase_but_its_length(epochs):
    paper = get_recipe("cifar")
    r = paper.with_phase_epochs(epochs)
    assert [p.epochs for p in r.phases] == epochs and r.total_epochs == sum(epochs)
    assert [attrs.evolve(p, epochs=1) for p in r.phases] == [attrs.evolve(p, epochs=1) for p in paper.phases]
    assert (r.batch_size, r.momentum, r.weight_decay) == (paper.batch_size, paper.momentum, paper.weight_decay)


@pytest.mark.parametrize(("epochs", "message"), [((10, 3, 2), "4 counts, one per phase .* 120/100/50/50"),
                                                  ("10 3 2 1", "4 counts"),
                                                  ((10, 0, 2, 1), "epochs of phase 2 must be >= 1"),
                                                  ((10, 3, 2.5, 1), "epochs of phase 3 must be an integer")])
def test_a_bad_split_is_refused_naming_the_phase(epochs, message):
    with pytest.raises(ConnlearnError, match=message):
        get_recipe("cifar").with_phase_epochs(epochs)


def test_phase_at_maps_epochs_to_phases():
    r = get_recipe("cifar").scaled(8)  # 3/3/1/1
    assert [r.phase_at(e)[0] for e in range(8)] == [0, 0, 0, 1, 1, 1, 2, 3]


def test_dict_round_trip():
    r = get_recipe("imagenet").scaled(9)
    assert Recipe.from_dict(r.to_dict()) == r


def test_bad_recipes_are_refused():
    with pytest.raises(ConnlearnError, match="epochs must be >= 1"):
        Phase(0, 0.1)
    with pytest.raises(ConnlearnError, match="lr must be >= 0"):
        Phase(1, -0.1)
    with pytest.raises(ConnlearnError, match="every later phase must be frozen"):
        Recipe("x", [Phase(1, 0.1, frozen=True), Phase(1, 0.1)])
    with pytest.raises(ConnlearnError, match="did you mean 'cifar'"):
        get_recipe("cifra")


def test_the_temperature_moves_geometrically_over_a_phase():
    phase = Phase(3, 0.1, gate_lr=0.2, temperature=1.0, temperature_end=0.01)
    assert phase.temperature_at(0.0) == 1.0
    assert phase.temperature_at(0.5) == pytest.approx(0.1)
    assert phase.temperature_at(1.0) == pytest.approx(0.01)
    assert phase.temperature_at(2.0) == pytest.approx(0.01)  # clamped to the phase
    assert Phase(3, 0.1, temperature=0.3).temperature_at(0.7) == 0.3


def test_a_recipe_saved_before_temperatures_reads_as_temperature_one():
    r = get_recipe("cifar").scaled(8)
    old = r.to_dict()
    for phase in old["phases"]:
        del phase["temperature"], phase["temperature_end"]
    assert Recipe.from_dict(old) == r
    hot = Recipe.from_dict(r.to_dict() | {"phases": [dict(old["phases"][0], temperature_end=0.1), *old["phases"][1:]]})
    assert hot != r and Recipe.from_dict(hot.to_dict()) == hot


@pytest.mark.parametrize("bad", [0, -0.5, 1e-5, 1e5, float("inf"), float("nan")])
def test_bad_temperatures_are_refused(bad):
    with pytest.raises(ConnlearnError, match="temperature"):
        Phase(1, 0.1, temperature=bad)
    with pytest.raises(ConnlearnError, match="temperature_end"):
        Phase(1, 0.1, temperature_end=bad)
    with pytest.raises(ConnlearnError, match="temperature must be a number in"):
        Phase(1, 0.1, temperature=None)  # e.g. a null in a saved recipe
    assert Phase(2, 0.1, temperature=1e-4, temperature_end=1e4).temperature_at(0.5) == pytest.approx(1.0)


@pytest.mark.parametrize(("start", "end"), [(1e4, 1e-4), (1e-4, 1e4), (1e4, 0.05), (0.05, 1e4), (1e4, 1e4)])
def test_an_annealed_temperature_stays_within_its_ends_and_the_allowed_range(start, end):
    """exp(log t) can round past t: at the edges of the range that would be refused mid-training."""
    phase = Phase(2, 0.1, temperature=start, temperature_end=end)
    assert (phase.temperature_at(0.0), phase.temperature_at(1.0)) == (start, end)
    for progress in (0.0, 1e-9, 0.25, 0.5, 1 - 1e-9, 1.0):
        check_temperature("t", phase.temperature_at(progress))
        assert min(start, end) <= phase.temperature_at(progress) <= max(start, end)


def test_a_frozen_phase_keeps_the_default_temperature():
    with pytest.raises(ConnlearnError, match="a frozen phase draws no connectivity"):
        Phase(1, 0.1, frozen=True, temperature=0.5)
    with pytest.raises(ConnlearnError, match="a frozen phase draws no connectivity"):
        Phase(1, 0.1, frozen=True, temperature_end=0.5)


def test_the_gate_momentum_defaults_to_the_optimizers_and_old_recipes_load_with_it():
    r = get_recipe("cifar")
    assert r.gate_momentum is None
    old = r.to_dict()
    del old["gate_momentum"]  # a recipe saved before the option existed
    assert Recipe.from_dict(old) == r
    plain = attrs.evolve(r, gate_momentum=0.0)
    assert Recipe.from_dict(plain.to_dict()) == plain != r
    for bad in (-1.0, 2.0, float("inf")):
        with pytest.raises(ConnlearnError, match="gate_momentum"):
            attrs.evolve(r, gate_momentum=bad)
