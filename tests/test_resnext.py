"""`full` is the genuine ResNeXt, and K=C gating computes ResNeXt's function (the paper's K=C limit)."""

import torch
from plain_resnext import PlainResNeXt
from torch import nn

import connlearn
from connlearn.compile import FusedModule


def _plain_copy(net):
    plain = PlainResNeXt(4, 2, 2, 4, 8, 10)
    src, dst = list(net.state_dict().items()), plain.state_dict()
    src = [(k, v) for k, v in src if not k.endswith("_extra_state")]
    assert len(src) == len(dst)
    plain.load_state_dict({k: v for k, (_, v) in zip(dst, src, strict=True)})
    return plain


def _randomise_bn(net):
    g = torch.Generator().manual_seed(3)
    for m in net.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.weight.data = torch.rand(m.weight.shape, generator=g) + 0.5
            m.bias.data = torch.randn(m.bias.shape, generator=g) * 0.1
            m.running_mean = torch.randn(m.running_mean.shape, generator=g) * 0.1
            m.running_var = torch.rand(m.running_var.shape, generator=g) + 0.5


def test_full_equals_a_plainly_written_resnext_in_train_and_eval(images):
    net = connlearn.build(M=6, C=4, width=2, num_classes=10, stem_channels=4, base_channels=8, gate="full")
    _randomise_bn(net)
    plain = _plain_copy(net)
    for mode in (True, False):
        net.train(mode)
        plain.train(mode)
        torch.testing.assert_close(net(images), plain(images), atol=1e-5, rtol=1e-5)


def test_k_equals_c_gating_computes_resnext_from_converted_weights(images):
    """With all C inputs on, x' = ReLU(P(x) + mean_j F_j(x)): ResNeXt up to per-branch last BNs. Give
    each branch C times its slice of ResNeXt's expand conv and a copy of ResNeXt's last BN (eval mode)."""
    common = dict(M=6, C=4, width=2, num_classes=10, stem_channels=4, base_channels=8)
    full = connlearn.build(gate="full", **common)
    _randomise_bn(full)
    gated = connlearn.build(gate="topk", K=4, **common)
    state = gated.state_dict()
    fs = full.state_dict()
    for k in ("stem.conv.weight", "head.fc.weight", "head.fc.bias"):
        state[k] = fs[k]
    for k in [k for k in fs if k.startswith("stem.bn.") or ".proj." in k]:
        state[k] = fs[k]
    for pos, stage in enumerate(gated.stages):
        assert isinstance(stage, FusedModule)
        c, out = stage.branches, stage.out_ch
        pre_f, pre_g = f"stages.{pos}.body.", f"stages.{pos}.block."
        for name in ("conv1.weight", "conv2.weight", "bn1", "bn2"):
            for k in [k for k in fs if k.startswith(pre_f + name)]:
                state[pre_g + k[len(pre_f):]] = fs[k]
        w3 = fs[pre_f + "conv3.weight"]  # [out, C·w, 1, 1]
        state[pre_g + "conv3.weight"] = torch.cat([c * p for p in w3.chunk(c, dim=1)], dim=0)
        for attr in ("weight", "bias", "running_mean", "running_var"):
            state[pre_g + "bn3." + attr] = fs[pre_f + "bn3." + attr].repeat(c)
    gated.load_state_dict(state)
    full.eval()
    gated.eval()
    assert out > 0
    torch.testing.assert_close(gated(images), full(images), atol=1e-5, rtol=1e-4)
