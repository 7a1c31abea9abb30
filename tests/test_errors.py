"""Bad input is a ConnlearnError that names the value, what is allowed and the closest valid name."""

import pytest
import torch
from conftest import tiny

import connlearn
from connlearn.errors import ConfigError, ConfigTypeError, ConnlearnError, ShapeError, UnknownNameError
from connlearn.recipe import Phase, Recipe
from connlearn.train import Trainer


def test_c_below_one():
    with pytest.raises(ConfigError, match="C must be >= 1, got 0"):
        connlearn.build(C=0)


def test_k_below_one():
    with pytest.raises(ConfigError, match="K must be >= 1, got 0"):
        connlearn.build(K=0)


def test_k_above_c():
    with pytest.raises(ConfigError, match=r"K \(each block's number of inputs\) must be <= C=8 .*got 9"):
        connlearn.build(C=8, K=9)


def test_depth_not_of_the_form_2_plus_3m():
    with pytest.raises(ConfigError, match="2 \\+ 3M"):
        connlearn.build(depth=21)


def test_m_not_fitting_the_stages():
    with pytest.raises(ConfigError, match="multiple of 3"):
        connlearn.build(M=4)


def test_unknown_topology_lists_known_names_and_closest():
    with pytest.raises(UnknownNameError, match=r"known topologys: dense, resnext; did you mean 'resnext'"):
        connlearn.build("resnxt")


def test_unknown_block():
    with pytest.raises(UnknownNameError, match="did you mean 'bottleneck'"):
        connlearn.build(block="botleneck")


def test_unknown_gate_kind():
    with pytest.raises(UnknownNameError, match="did you mean 'topk'"):
        connlearn.build(gate="top-k")


def test_unknown_preset():
    with pytest.raises(UnknownNameError, match=r"did you mean .cifar-29-8-8."):
        connlearn.build(preset="cifar-29-8")


def test_unknown_option_suggests_the_closest():
    with pytest.raises(ConfigError, match="did you mean 'width'"):
        connlearn.build(widht=4)


def test_unknown_engine():
    with pytest.raises(UnknownNameError, match="did you mean 'fused'"):
        connlearn.build(engine="fuse")


def test_non_integer_size():
    with pytest.raises(ConfigTypeError, match=r"C must be an integer, got 2\.5"):
        connlearn.build(C=2.5)


def test_negative_size():
    with pytest.raises(ConfigError, match="width must be >= 1, got -4"):
        connlearn.build(width=-4)


def test_full_with_a_fan_in_other_than_c():
    with pytest.raises(ConfigError, match="K must equal C"):
        connlearn.build(gate="full", C=8, K=4)


def test_forward_input_with_the_wrong_channel_count():
    net = connlearn.build(**tiny())
    with pytest.raises(ShapeError, match=r"expected images of shape \[B, 3, H, W\], got \[2, 1, 32, 32\]"):
        net(torch.randn(2, 1, 32, 32))


def test_forward_input_with_the_wrong_rank():
    net = connlearn.build(**tiny())
    with pytest.raises(ShapeError, match="got \\[3, 32, 32\\]"):
        net(torch.randn(3, 32, 32))


def test_errors_are_builtin_exception_subclasses_too():
    assert issubclass(ConfigError, ValueError) and issubclass(ConfigTypeError, TypeError)
    assert issubclass(UnknownNameError, ConnlearnError)


@pytest.mark.parametrize("option", ["stem_channels", "base_channels"])
def test_zero_channels_are_refused_not_replaced_by_the_default(option):
    with pytest.raises(connlearn.ConfigError, match=f"{option} must be >= 1, got 0"):
        connlearn.build(**tiny(**{option: 0}))


def test_integer_images_are_refused_by_name():
    with pytest.raises(connlearn.ConnlearnError, match=r"expected floating-point images .*torch.uint8"):
        connlearn.build(**tiny())(torch.zeros(2, 3, 32, 32, dtype=torch.uint8))


def test_a_negative_snapshot_interval_is_refused(tmp_path):
    recipe = Recipe("r", [Phase(1, 0.1, gate_lr=0.2)], batch_size=4)
    with pytest.raises(ConfigError, match="snapshot_every must be >= 0, got -1"):
        Trainer(connlearn.build(**tiny()), [], None, recipe, out_dir=tmp_path, progress=False, snapshot_every=-1)
