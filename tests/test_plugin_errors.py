"""A plug-in written wrong is named in a clear error, at registration, build or its first forward pass,
not in a crash deep inside torch or a silently wrong result; a broken entry point hides no other."""

import re
from importlib import metadata

import networkx as nx
import numpy as np
import pytest
import torch
from conftest import tiny
from torch import nn

import connlearn
from connlearn import export
from connlearn.blocks import BLOCKS, BranchBlock, Looped, check_block_kind, conv
from connlearn.checkpoint import architecture
from connlearn.errors import BlockError, ConfigError, ConfigTypeError, GraphError, ShapeError
from connlearn.gates import Gate, TopKGate
from connlearn.graph import BranchGraph
from connlearn.prune import prune_dead_blocks
from connlearn.registry import Registry
from connlearn.topologies import resnext

pytestmark = pytest.mark.usefixtures("clean_registries")


class Shifted(BranchBlock):
    """A user block that gets the output shape wrong in one of several ways (``fault``)."""

    params = ("width",)
    fault = "none"

    def __init__(self, in_ch, out_ch, stride, branches, *, width):
        super().__init__(in_ch, out_ch, stride, branches, width=width)
        extra = 1 if self.fault == "channels" else 0
        self.c = nn.Conv2d(branches * in_ch, branches * (out_ch + extra), 3, 1 if self.fault == "stride" else stride,
                           0 if self.fault == "padding" else 1, groups=branches)

    def forward(self, x):
        out = self.c(x)
        return out.mean((2, 3), keepdim=True) if self.fault == "pooled" else out


@pytest.mark.parametrize("engine", ["fused", "reference"])
@pytest.mark.parametrize("fault", ["channels", "stride", "padding", "pooled"])
def test_a_block_output_of_the_wrong_shape_names_the_kind_module_and_shapes(fault, engine):
    connlearn.register_block("shifted", type("Faulty", (Shifted,), {"fault": fault}))
    net = connlearn.build(**tiny(block="shifted"), engine=engine)
    module = 2 if fault == "stride" else 1  # the first module has stride 1
    with pytest.raises(ShapeError, match=rf"block kind 'shifted' in module {module} mapped an input .* expected"):
        net(torch.randn(2, 3, 32, 32))


@pytest.mark.parametrize("engine", ["fused", "reference"])
def test_a_block_kind_that_fails_in_its_own_forward_is_named_with_the_protocol(engine):
    # nn.Conv2d takes (in_ch, out_ch, stride, branches) as (in, out, kernel_size, stride): it builds, and
    # fails inside torch on the branch-major input (fused: branches·in_ch channels)
    connlearn.register_block("conv", nn.Conv2d)
    net = connlearn.build(**tiny(block="conv"), engine=engine)
    if engine == "fused":
        with pytest.raises(BlockError, match=r"block kind 'conv' \(Conv2d\) in module 1 failed on an input of shape "
                                             r"\[2, 16, 32, 32\]: .*channels.*A block kind maps \[B, branches·in_ch"):
            net(torch.randn(2, 3, 32, 32))
    else:  # one block per branch: Conv2d(8, 16, kernel_size=2) in module 2 runs, at the wrong resolution
        with pytest.raises(ShapeError, match=r"block kind 'conv' in module 2 mapped an input .* expected"):
            net(torch.randn(2, 3, 32, 32))
    with pytest.raises(RuntimeError):  # still what code written against torch's error catches
        connlearn.build(**tiny(block="conv"))(torch.randn(2, 3, 32, 32))


@pytest.mark.parametrize("engine", ["fused", "reference"])
@pytest.mark.parametrize(("error", "renamed"), [
    (RuntimeError("mat1 and mat2 shapes cannot be multiplied"), True),
    (torch.cuda.OutOfMemoryError("out of memory"), False),  # subclasses are not the block's shapes
    (NotImplementedError("Could not run 'aten::foo' with arguments from the 'MPS' backend"), False),
    (RuntimeError("CUDA error: device-side assert triggered"), False),  # the device's, maybe from elsewhere
    (RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate(handle)"), False),
])
def test_only_a_plain_runtime_error_of_a_block_is_named_as_the_blocks(engine, error, renamed):
    class Failing(BranchBlock):
        def forward(self, x):
            raise error

    connlearn.register_block("failing", Failing)
    net = connlearn.build(**tiny(block="failing"), engine=engine)
    with pytest.raises(type(error)) as info:
        net(torch.randn(2, 3, 32, 32))
    assert isinstance(info.value, BlockError) is renamed
    if renamed:
        in_ch = 16 if engine == "fused" else 4  # fused: the 4 branches' inputs, branch-major
        assert re.match(rf"block kind 'failing' \(.*Failing\) in module 1 failed on an input of shape "
                        rf"\[2, {in_ch}, 32, 32\]: mat1 and mat2", str(info.value))
    else:
        assert info.value is error


@pytest.mark.parametrize("engine", ["fused", "reference"])
def test_a_looped_block_that_fails_is_named_with_one_branchs_input_and_the_factory_contract(engine):
    connlearn.register_block("looped", Looped(lambda i, o, s: nn.Conv2d(i + 1, o, 3, s, 1)))
    with pytest.raises(BlockError, match=r"block kind 'looped' \(Conv2d, one module per branch\) in module 1 failed "
                                         r"on one branch's input of shape \[2, 4, 32, 32\]: .*A Looped factory"):
        connlearn.build(**tiny(block="looped"), engine=engine)(torch.randn(2, 3, 32, 32))


def test_a_block_kind_without_width_is_built_without_it_and_takes_block_params():
    class Kernel(BranchBlock):
        params = ("kernel",)
        residual_norm = "bn"

        def __init__(self, in_ch, out_ch, stride, branches, kernel=3):
            super().__init__(in_ch, out_ch, stride, branches, kernel=kernel)
            self.c, self.bn = conv(in_ch, out_ch, kernel, branches, stride), nn.BatchNorm2d(branches * out_ch)

        def forward(self, x):
            return self.bn(self.c(x))

    connlearn.register_block("kernel", Kernel)
    net = connlearn.build(**tiny(block="kernel", block_params={"kernel": 5}))
    assert net.stages[1].block.c.kernel_size == (5, 5)
    assert net(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    assert net.graph().nodes["m1.b1"]["params"] == {"kernel": 5}  # and the graph round-trips it
    rebuilt = connlearn.from_graph(net.graph().to_json())
    assert rebuilt.stages[1].block.c.kernel_size == (5, 5)
    assert net.to_engine("reference").stages[1].blocks[0].c.kernel_size == (5, 5)
    with pytest.raises(ConfigError, match=r"kind 'kernel' \(.*Kernel\) cannot be built .*'kernal'.* takes: kernel "
                                          r"\('kernal': did you mean 'kernel'\?\)"):
        connlearn.build(**tiny(block="kernel", block_params={"kernal": 5}))
    graph = net.graph()
    for node in graph.block_nodes():
        graph.nodes[node]["params"] = {"kernel": (5, 5)}  # a tuple, which the saved graph holds as a list
    assert architecture(BranchGraph.from_json(graph.to_json())) == architecture(graph)  # so a run resumes
    with pytest.raises(ConfigError, match="block_params may not set 'width'"):
        connlearn.build(**tiny(block_params={"width": 5}))
    with pytest.raises(ConfigTypeError, match="JSON values"):
        connlearn.build(**tiny(block="kernel", block_params={"kernel": torch.tensor(5)}))
    connlearn.register_block("looped-conv", Looped(lambda i, o, s: nn.Conv2d(i, o, 3, s, 1)))
    assert connlearn.build(**tiny(block="looped-conv"))(torch.randn(2, 3, 32, 32)).shape == (2, 10)


@pytest.mark.parametrize("kind, match", [
    (42, "42 is not callable"),
    (int, "int is not an nn.Module subclass"),
    (lambda in_ch, out_ch, stride: nn.Identity(), "cannot take the arguments .*too many positional"),
])
def test_registering_something_that_cannot_be_a_block_kind_is_refused(kind, match):
    with pytest.raises(ConfigTypeError, match=rf"block kind 'mine'.*{match}"):
        connlearn.register_block("mine", kind)
    assert "mine" not in connlearn.list_blocks()


def test_a_looped_factory_of_the_wrong_form_is_named():
    with pytest.raises(ConfigTypeError, match="the factory must take"):
        Looped(lambda in_ch: nn.Identity())
    connlearn.register_block("number", Looped(lambda in_ch, out_ch, stride: 3))
    with pytest.raises(ConfigTypeError, match=r"the factory returned int, not an nn.Module"):
        connlearn.build(**tiny(block="number"))


class Unbatched(nn.Module):
    """A block module without select/merge: it trains, but cannot be pruned or moved to another engine."""

    def __init__(self, in_ch, out_ch, stride, branches, width):
        super().__init__()
        self.c = nn.Conv2d(branches * in_ch, branches * out_ch, 3, stride, 1, groups=branches)

    def forward(self, x):
        return self.c(x)


def test_a_block_without_select_trains_and_says_what_pruning_and_to_engine_need():
    connlearn.register_block("unbatched", Unbatched)
    net = connlearn.build(**tiny(block="unbatched", gate="random", K=1, M=6))
    net(torch.randn(2, 3, 32, 32)).sum().backward()
    with pytest.raises(ConfigError, match=r"to_engine\('reference'\) needs the blocks' select\(\).*Unbatched"):
        net.to_engine("reference")
    with pytest.raises(ConfigError, match=r"pruning dead blocks needs the blocks' select\(\).*Unbatched"):
        prune_dead_blocks(net)


class Wide(TopKGate):
    def matrix(self, drawn=None):
        return torch.cat([super().matrix(drawn), torch.zeros(self.shape[0], 1)], dim=1)


class WrongDraw(TopKGate):
    @classmethod
    def draw(cls, gates, generator, temperature=1.0):
        return [d[:, :-1] for d in super().draw(gates, generator, temperature)]


class FewDraws(TopKGate):
    @classmethod
    def draw(cls, gates, generator, temperature=1.0):
        return super().draw(gates, generator, temperature)[:-1]


def test_gate_matrices_and_draws_of_the_wrong_shape_are_named():
    for name, cls in (("wide", Wide), ("wrong-draw", WrongDraw), ("few-draws", FewDraws)):
        connlearn.register_gate(name, cls)
    with pytest.raises(ShapeError, match=r"gate kind 'wide' in module 2: matrix\(None\) gave \[4, 5\]; expected"):
        connlearn.build(**tiny(gate="wide"))  # when built
    x = torch.randn(2, 3, 32, 32)
    with pytest.raises(ShapeError, match=r"gate kind 'wrong-draw' in module 2: draw\(\) gave \[4, 3\]"):
        connlearn.build(**tiny(gate="wrong-draw"))(x)
    with pytest.raises(ShapeError, match=r"gate kind 'few-draws': draw\(\) gave 1 draws for 2 gates"):
        connlearn.build(**tiny(gate="few-draws"))(x)


class Attached(TopKGate):
    @classmethod
    def draw(cls, gates, generator, temperature=1.0):
        return [d + 0 * g.real for d, g in zip(super().draw(gates, generator, temperature), gates, strict=True)]


def test_a_draw_with_autograd_history_is_named_not_failed_on_in_a_second_backward_pass():
    connlearn.register_gate("attached", Attached)
    net = connlearn.build(**tiny(gate="attached"))
    held = pytest.raises(ConfigTypeError, match=r"gate kind 'attached' in module 2: draw\(\) gave a tensor with "
                                                r"autograd history; draws are values \(detach them\)")
    with held, net.hold_draw():
        for _ in range(2):  # micro-batches: the second backward pass would go through the first's draw
            net(torch.randn(2, 3, 32, 32)).sum().backward()


class Constant(Gate):
    """The least a gate kind defines: its values (zeros) and its active inputs (all)."""

    def values(self):
        return torch.zeros(self.shape)

    def active(self):
        return torch.ones(self.shape, dtype=torch.bool)


def test_registering_an_incomplete_gate_kind_is_refused_and_the_kind_takes_its_name():
    class Empty(Gate):
        pass

    class Undrawn(Constant):
        stochastic = True

    with pytest.raises(ConfigTypeError, match=r"'empty' .*does not define values, active"):
        connlearn.register_gate("empty", Empty)
    with pytest.raises(ConfigTypeError, match=r"'undrawn' .*does not define draw \(it is stochastic\)"):
        connlearn.register_gate("undrawn", Undrawn)
    with pytest.raises(ConfigTypeError, match=r"is not a subclass of connlearn.gates.Gate"):
        connlearn.register_gate("function", lambda *a: None)

    class Renamed(TopKGate):
        pass

    connlearn.register_gate("renamed", Renamed)
    assert Renamed.kind == "renamed" and TopKGate.kind == "topk"


def test_a_gate_kind_built_with_the_wrong_signature_is_named():
    class TwoArgs(TopKGate):
        def __init__(self, values, active):
            super().__init__(values, active, 2)

    connlearn.register_gate("two-args", TwoArgs)
    with pytest.raises(ConfigTypeError, match=r"gate kind 'two-args' could not be built as .*\(values, active, K\)"):
        connlearn.build(**tiny(gate="two-args"))


def test_a_user_sampled_gate_kind_exports_with_its_top_k_frozen(tmp_path):
    class Mine(TopKGate):
        pass

    connlearn.register_gate("mine", Mine)
    net = connlearn.build(**tiny(gate="mine")).eval()
    x = torch.randn(2, 3, 32, 32)
    path = export.export(net, tmp_path / "mine.ts")
    torch.testing.assert_close(torch.jit.load(str(path))(x), net(x))


def _without(key):
    def topology(**options):
        g = resnext(**options)
        del g.graph[key]
        return g
    return topology


def _all_inactive(**options):
    g = resnext(**options)
    for *_, d in g.edges(data=True):
        if d["kind"] == "gate":
            d["active"] = False
    return g


@pytest.mark.parametrize("topology, error, match", [
    (lambda **o: None, ConfigTypeError, "topology 'mine' returned NoneType, not a connlearn.graph.BranchGraph"),
    (lambda **o: nx.DiGraph(), ConfigTypeError, "returned DiGraph"),
    (_without("K"), GraphError, r"no 'K' attribute: set graph.graph\['K'\]"),
    (_without("gate"), GraphError, r"no 'gate' attribute"),
    (_all_inactive, GraphError, "a 'full' connectivity has every input active"),
])
def test_what_a_topology_returns_is_checked(topology, error, match):
    connlearn.register_topology("mine", topology)
    with pytest.raises(error, match=match):
        connlearn.build("mine", **tiny(gate="full", K=4))
    with pytest.raises(ConfigTypeError, match="'abc' is not callable"):
        connlearn.register_topology("text", "abc")


def test_an_option_that_a_kwargs_topology_passes_on_is_named_with_the_options_of_its_target():
    connlearn.register_topology("mine", _without("seed"))  # forwards **options to resnext
    with pytest.raises(ConfigError, match=r"topology 'mine' has no option 'Kk': it passed the option on to "
                                          r"resnext\(\), which does not take it; resnext\(\)'s options: C, M, .*"
                                          r"did you mean 'K'\?"):
        connlearn.build("mine", **tiny(K=None, Kk=2))

    def hidden():
        def inner(*, C, M, K, width, num_classes, stem_channels, base_channels, seed):
            return resnext(C=C, M=M, K=K, width=width, num_classes=num_classes, seed=seed)
        return inner

    def unnamed(**options):  # the function it forwards to cannot be found by name: no list of options
        return hidden()(**options)

    connlearn.register_topology("unnamed", unnamed)
    with pytest.raises(ConfigError, match=r"no option 'Kk': it passed the option on to inner\(\), which does not "
                                          r"take it$"):
        connlearn.build("unnamed", **tiny(Kk=2))

    def faulty(**options):  # a TypeError of the topology's own making is its own, unchanged
        return len(1)

    def via_class(**options):  # a class: named as the class, with its __init__'s options
        return Maker(**options)

    class Maker:
        def __init__(self, C, M, K=2):
            pass

    connlearn.register_topology("via_class", via_class)
    with pytest.raises(ConfigError, match=r"passed the option on to Maker\(\), which does not take it; Maker\(\)'s "
                                          r"options: C, M, K; did you mean 'K'\?"):
        connlearn.build("via_class", C=2, M=3, k=1)

    def via_builtin(**options):  # a callable without a signature: named, no options listed
        return torch.Generator(**options)

    connlearn.register_topology("via_builtin", via_builtin)
    with pytest.raises(ConfigError, match=r"passed the option on to Generator\(\), which does not take it$"):
        connlearn.build("via_builtin", seed=0)

    connlearn.register_topology("faulty", faulty)
    with pytest.raises(TypeError, match="has no len") as info:
        connlearn.build("faulty", **tiny())
    assert not isinstance(info.value, ConfigError)


_ELSEWHERE = """
import connlearn
from connlearn.topologies.resnext import resnext as base

def aliased(**options):
    return base(**options)

def from_the_registry(**options):
    return connlearn.topologies.TOPOLOGIES.get("resnext")(**options)
"""


@pytest.mark.parametrize("forwarder", ["aliased", "from_the_registry"])
def test_a_target_called_under_another_name_is_found_for_its_options(forwarder):
    space: dict = {}
    exec(_ELSEWHERE, space)  # a module of the user's, where no name 'resnext' is bound
    connlearn.register_topology("mine", space[forwarder])
    with pytest.raises(ConfigError, match=r"has no option 'wdith': it passed the option on to resnext\(\), which "
                                          r"does not take it; resnext\(\)'s options: C, M, .*did you mean 'width'\?"):
        connlearn.build("mine", wdith=2)


def test_a_broken_entry_point_is_skipped_with_a_warning_and_named_when_asked_for(monkeypatch):
    group = "connlearn.test-blocks"
    points = [metadata.EntryPoint("broken", "connlearn_no_such_module:Block", group),
              metadata.EntryPoint("wrong", "torch:float32", group),
              metadata.EntryPoint("basic2", "connlearn.blocks.basic:Basic", group)]
    monkeypatch.setattr(metadata, "entry_points", lambda group: [p for p in points if p.group == group])
    registry = Registry("block", group, check=check_block_kind)
    with pytest.warns(RuntimeWarning) as warned:
        assert registry.names() == ["basic2"]
    assert [str(w.message).split(" is installed")[0] for w in warned] == ["block 'broken'", "block 'wrong'"]
    assert registry.get("basic2").__name__ == "Basic"
    with pytest.raises(ConfigError, match=r"block 'broken' is installed \(entry point broken = "
                                          r"connlearn_no_such_module:Block .*ModuleNotFoundError"):
        registry.get("broken")
    with pytest.raises(ConfigError, match=r"'wrong' is installed .*ConfigTypeError.*not callable"):
        registry.get("wrong")


def test_a_broken_entry_point_is_named_by_build_and_from_graph(monkeypatch):
    graph = resnext(**tiny())
    for node in graph.block_nodes():
        graph.nodes[node]["block"] = "gone"
    point = metadata.EntryPoint("gone", "connlearn_no_such_module:Block", "connlearn.blocks")
    monkeypatch.setattr(metadata, "entry_points", lambda group: [point] if group == "connlearn.blocks" else [])
    monkeypatch.setattr(BLOCKS, "_broken", {})
    monkeypatch.setattr(BLOCKS, "_entry_points_loaded", False)
    with pytest.warns(RuntimeWarning, match="'gone' is installed"), \
            pytest.raises(ConfigError, match=r"block 'gone' is installed .*ModuleNotFoundError"):
        connlearn.build(**tiny(block="gone"))
    with pytest.raises(GraphError, match=r"block 'gone' is installed .*at node m1.b1"):
        connlearn.from_graph(graph)


def test_a_branch_block_that_keeps_a_parameter_to_itself_is_refused():
    class Forgetful(BranchBlock):
        params = ("kernel",)

        def __init__(self, in_ch, out_ch, stride, branches, kernel=3):
            super().__init__(in_ch, out_ch, stride, branches)  # kernel not passed on: select() would lose it
            self.c = conv(in_ch, out_ch, kernel, branches, stride)

        def forward(self, x):
            return self.c(x)

    connlearn.register_block("forgetful", Forgetful)
    with pytest.raises(ConfigError, match=r"built with \{'kernel': 5\} but did not pass them to BranchBlock"):
        connlearn.build(**tiny(block="forgetful", block_params={"kernel": 5}))


class Soft(TopKGate):
    """A sampled gate kind whose evaluation weights its top-K by the real gates: freezing would change it."""

    def matrix(self, drawn=None):
        return super().matrix(drawn) * self.real


def test_export_freezes_only_gate_kinds_that_evaluate_their_top_k(tmp_path):
    connlearn.register_gate("soft", Soft)
    net = connlearn.build(**tiny(gate="soft", gate_init="uniform")).eval()
    x = torch.randn(2, 3, 32, 32)
    exported = torch.export.load(str(export.export(net, tmp_path / "soft.pt2", format="export"))).module()
    torch.testing.assert_close(exported(x), net(x))


class Relaxed(TopKGate):
    """Legitimate forms the checks must let through: matrix without a default, draws as one stacked tensor."""

    def matrix(self, drawn):
        return super().matrix(drawn)

    @classmethod
    def draw(cls, gates, generator, temperature=1.0):
        return torch.stack(super().draw(gates, generator, temperature))


class Transposed(TopKGate):
    def matrix(self, drawn=None):
        return super().matrix(drawn).t() if drawn is not None else super().matrix(drawn)


def test_gate_checks_accept_legitimate_forms_and_check_training_matrices_too():
    connlearn.register_gate("relaxed", Relaxed)
    connlearn.register_gate("transposed", Transposed)
    x = torch.randn(2, 3, 32, 32)
    assert connlearn.build(**tiny(gate="relaxed"))(x).shape == (2, 10)
    net = connlearn.build("dense", **tiny(gate="transposed", M=9))  # module 3: [4, 8] drawn, [8, 4] used
    with pytest.raises(ShapeError, match=r"gate kind 'transposed' in module 3: matrix\(\) gave \[8, 4\]"):
        net.train()(x)
    net.eval()(x)  # its evaluation matrix is right


def test_a_graph_with_a_numpy_fan_in_compiles():
    graph = connlearn.build(**tiny()).graph()
    graph.graph["K"] = np.int64(2)
    assert connlearn.from_graph(graph)(torch.randn(2, 3, 32, 32)).shape == (2, 10)


def test_a_block_whose_branches_attribute_is_not_a_count_still_builds():
    class Listed(Unbatched):
        def __init__(self, in_ch, out_ch, stride, branches, width):
            super().__init__(in_ch, out_ch, stride, branches, width)
            self.branches = nn.ModuleList([nn.Identity()])

    connlearn.register_block("listed", Listed)
    assert connlearn.build(**tiny(block="listed"))(torch.randn(2, 3, 32, 32)).shape == (2, 10)


def test_a_block_holding_another_number_of_branches_than_asked_is_named():
    class OneBranch(Unbatched):
        branches = 1

    connlearn.register_block("one-branch", OneBranch)
    with pytest.raises(ConfigError, match="block kind 'one-branch' was asked for 4 branches and its block holds 1"):
        connlearn.build(**tiny(block="one-branch"))


def test_a_gate_kind_whose_flags_do_not_match_what_it_holds_is_refused():
    class Undrawn(TopKGate):  # draws, but its matrix would ignore the draw: the default active() as 0/1
        matrix = Gate.matrix

    class Unlearned(TopKGate):  # gates as parameters, but said not to learn: fixed, prunable, never frozen
        learnable = False

    class NoParameters(Constant):
        learnable = True

    with pytest.raises(ConfigTypeError, match=r"'undrawn' .*does not define matrix \(it is stochastic: the "
                                              r"training forward pass must use the draw"):
        connlearn.register_gate("undrawn", Undrawn)
    with pytest.raises(ConfigTypeError, match=r"'unlearned' .*defines real_parameters but sets learnable = False"):
        connlearn.register_gate("unlearned", Unlearned)
    with pytest.raises(ConfigTypeError, match=r"'no-parameters' .*does not define real_parameters \(it is learnable"):
        connlearn.register_gate("no-parameters", NoParameters)


class Hidden(Gate):
    """Parameters that real_parameters() does not declare."""

    def __init__(self, values, active, K):
        super().__init__(values, active, K)
        self.w = nn.Parameter(values.float().clone())
        self.register_buffer("mask", active.clone())

    def values(self):
        return self.w.detach()

    def active(self):
        return self.mask

    def matrix(self, drawn=None):
        return self.w


class Threshold(TopKGate):
    """Active where the gate is at least 0.5: K per row only while the gates allow it."""

    stochastic = False

    def active(self):
        return self.real.detach() >= 0.5


def test_a_gate_that_holds_undeclared_parameters_or_not_k_active_inputs_is_named():
    connlearn.register_gate("hidden", Hidden)
    with pytest.raises(ConfigTypeError, match=r"gate kind 'hidden' holds parameters but sets learnable = False"):
        connlearn.build(**tiny(gate="hidden"))
    connlearn.register_gate("threshold", Threshold)
    with pytest.raises(ShapeError, match=r"gate kind 'threshold' in module 2: active\(\) gives 4 active inputs in "
                                         r"row 0; every row needs exactly K=2"):
        connlearn.build(**tiny(gate="threshold", gate_init=0.5))
    net = connlearn.build(**tiny(gate="threshold", gate_init=0.5, K=4))  # every gate active: K=4 per row
    _, gate = list(net.gates())[-1]
    with torch.no_grad():
        gate.real[1, 0] = 0.1
    before = [g for _, g in net.gates()]
    with pytest.raises(ShapeError, match=r"gate kind 'threshold' in module 3: active\(\) gives 3 active inputs in "
                                         r"row 1"):
        net.freeze()
    assert net.gate_kind == "threshold" and [g for _, g in net.gates()] == before  # nothing half frozen


def _two_sources(**options):
    """A Fixed-Full graph whose third module reads branch 1 of the first and of the second module (K=2)."""
    g = resnext(**options)
    first, second, third = g.modules()[:3]
    for node in g.branches(third):
        g.remove_edge(g.branches(second)[1], node)
        g.add_edge(g.branches(first)[0], node, kind="gate", gate=1.0, active=True)
    return g


@pytest.mark.parametrize("engine", ["fused", "reference"])
def test_a_full_graph_whose_modules_read_several_modules_runs_gated_and_reads_them_all(engine):
    graph = _two_sources(**tiny(M=9, C=2, K=2, gate="full"))
    net = connlearn.from_graph(graph, engine=engine).eval()
    assert net.engine == engine  # not the single stream, which reads one module
    x = torch.randn(2, 3, 32, 32)
    before = net(x)
    with torch.no_grad():
        for p in net.stages[0].parameters():  # module 1 reaches the output only through module 3's extra edge
            p.add_(1.0)
    assert not torch.allclose(net(x), before)


def test_full_compiles_to_the_single_stream_on_every_engine_where_it_can():
    for engine in ("fused", "reference", "auto"):
        assert connlearn.build(**tiny(gate="full", K=4), engine=engine).engine == "single-stream"


class Rezero(BranchBlock):
    """A block with one scale shared by all its branches: select() could not cut it per branch."""

    def __init__(self, in_ch, out_ch, stride, branches):
        super().__init__(in_ch, out_ch, stride, branches)
        self.c = conv(in_ch, out_ch, 3, branches, stride)
        self.alpha = nn.Parameter(torch.zeros(1))

    def forward(self, x):
        return self.alpha * self.c(x)


class SharedLinear(BranchBlock):
    """A squeeze-excitation shared by all branches (its weight's first dim does not grow with them)."""

    def __init__(self, in_ch, out_ch, stride, branches):
        super().__init__(in_ch, out_ch, stride, branches)
        self.c = conv(in_ch, out_ch, 3, branches, stride)
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return self.c(x)


@pytest.mark.parametrize("engine", ["fused", "reference"])
@pytest.mark.parametrize("kind, tensor", [(Rezero, r"alpha \[1\] \(\[1\] with one branch more\)"),
                                          (SharedLinear, r"fc\.weight \[4, 4\]")])
def test_a_branch_block_with_a_tensor_shared_by_its_branches_is_named_when_built(kind, tensor, engine):
    connlearn.register_block("shared", kind)
    before = torch.random.get_rng_state()
    with pytest.raises(ConfigError, match=rf"block kind 'shared' \(.*\) holds a tensor that is not stacked per "
                                          rf"branch: {tensor}.*along dim 0.*connlearn\.Looped"):
        connlearn.build(**tiny(block="shared", gate="random"), engine=engine)
    assert torch.equal(torch.random.get_rng_state(), before)


def test_a_topology_called_without_its_options_or_given_one_it_sets_is_named():
    def needs_c(*, C):
        return resnext(**tiny(C=C))

    def sets_width(**options):
        return resnext(width=2, **options)

    connlearn.register_topology("needs-c", needs_c)
    connlearn.register_topology("sets-width", sets_width)
    with pytest.raises(ConfigError, match=r"'needs-c' needs the option\(s\) 'C': build\('needs-c', C=\.\.\.\)"):
        connlearn.build("needs-c")
    with pytest.raises(ConfigError, match="topology 'sets-width' sets the option 'width' itself and passes it on to "
                                          r"resnext\(\), so it cannot be given to build\(\) too"):
        connlearn.build("sets-width", width=2)
    with pytest.raises(ConfigTypeError, match="topology 'no-signature': <class 'dict'> has no signature"):
        connlearn.register_topology("no-signature", dict)
