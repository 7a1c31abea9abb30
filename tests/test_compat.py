"""The net is a well-behaved nn.Module: state_dict, .to(), autocast, channels_last, torch.compile."""

import copy

import pytest
import torch
from conftest import tiny

import connlearn
from connlearn.compile import ConnectivityNet
from connlearn.errors import CheckpointError


def test_state_dict_round_trip_restores_weights_gates_and_generator(images):
    a = connlearn.build(**tiny(seed=1, gate_init="uniform")).train()
    a(images)  # advance the generator
    b = connlearn.build(**tiny(seed=2))
    b.load_state_dict(a.state_dict())
    torch.testing.assert_close(b.train()(images), a(images))


def test_gates_live_in_the_state_dict_and_the_param_split_is_exact():
    net = connlearn.build(**tiny())
    keys = [k for k in net.state_dict() if k.endswith("gate.real")]
    assert len(keys) == 2
    gates, weights = net.gate_parameters(), net.weight_parameters()
    assert len(gates) + len(weights) == len(list(net.parameters()))
    assert not {id(p) for p in gates} & {id(p) for p in weights}


def test_no_weight_decay_names_the_learnable_gates_as_named_parameters_does():
    net = connlearn.build(**tiny())
    named = dict(net.named_parameters())
    assert net.no_weight_decay() == {"stages.1.gate.real", "stages.2.gate.real"}
    assert {id(named[n]) for n in net.no_weight_decay()} == {id(p) for p in net.gate_parameters()}
    assert net.freeze().no_weight_decay() == set()
    assert connlearn.build(**tiny(gate="random")).no_weight_decay() == set()


@pytest.mark.parametrize("engine", ["fused", "reference"])
@pytest.mark.parametrize("gate", ["topk", "random", "full"])
def test_a_network_built_on_the_meta_device_loads_a_state_and_computes_what_it_came_from(images, engine, gate):
    options = tiny(gate=gate, engine=engine, **({"K": 4} if gate == "full" else {}))
    trained = connlearn.build(**{**options, "seed": 3}).train()
    trained(images)  # the generator moves on
    with torch.device("meta"):  # no storage: the route to loading (or sharding) large networks
        nets = [connlearn.build(**options), connlearn.from_graph(trained.graph(), engine=engine)]
    for net in nets:
        assert {t.device.type for t in [*net.parameters(), *net.buffers()]} == {"meta"}
        net.to_empty(device="cpu").load_state_dict(trained.state_dict())
        torch.testing.assert_close(net.eval()(images), trained.eval()(images), atol=0, rtol=0)
        torch.testing.assert_close(net.train()(images), copy.deepcopy(trained).train()(images))


def test_to_moves_gates_and_dtype(images):
    net = connlearn.build(**tiny()).to(torch.float64)
    assert all(p.dtype == torch.float64 for p in net.gate_parameters())
    assert net.train()(images.double()).dtype == torch.float64


def test_bf16_autocast_and_channels_last(images):
    net = connlearn.build(**tiny()).to(memory_format=torch.channels_last).train()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = net(images.to(memory_format=torch.channels_last))
    out.float().sum().backward()
    assert torch.isfinite(out.float()).all()
    assert all(p.grad is not None for p in net.gate_parameters())


def test_deepcopy_keeps_the_generator_state(images):
    net = connlearn.build(**tiny(seed=3)).train()
    net(images)  # the generator has moved on from its seed
    twin = copy.deepcopy(net)
    assert twin.generator is not net.generator and twin.generator.initial_seed() == net.generator.initial_seed()
    assert torch.equal(twin.generator.get_state(), net.generator.get_state())
    torch.testing.assert_close(net(images), twin(images))
    net(images)  # the copies draw independently
    assert not torch.equal(twin.generator.get_state(), net.generator.get_state())
    assert twin.state_dict().keys() == net.state_dict().keys() and twin.training


def test_a_deepcopy_of_a_compiled_net_runs_its_own_weights(images):
    net = connlearn.build(**tiny()).eval()
    net.compile()  # nn.Module.compile: the module keeps a compiled call, bound to itself
    twin = copy.deepcopy(net)
    assert "_compiled_call_impl" not in vars(twin) or twin._compiled_call_impl is None
    with torch.no_grad():
        for p in twin.parameters():
            p.add_(1.0)
        assert not torch.allclose(twin(images), net.forward(images))


def _as_pickled_by_an_older_version(net):
    """``net`` without what later versions added: the pickle format mark, the sampling temperature, the
    modules' names and the gates' tie orders."""
    for name in ("_pickle_format", "_temperature", "_draws"):
        vars(net).pop(name)
    for stage in net.stages:
        for name in ("kind", "module"):
            vars(stage).pop(name, None)
        if stage.gate is not None:
            del stage.gate._buffers["tie_order"]
    return net


@pytest.mark.parametrize("gate", ["topk", "real", "full"])
def test_a_whole_network_pickled_by_an_older_version_loads_rebuilt_with_its_weights(images, gate, tmp_path):
    net = connlearn.build(**tiny(gate=gate, gate_init="uniform", K=4 if gate == "full" else 2)).eval()
    expected = net(images)
    torch.save(_as_pickled_by_an_older_version(copy.deepcopy(net)), tmp_path / "old.pt")
    loaded = torch.load(tmp_path / "old.pt", weights_only=False)
    assert type(loaded) is ConnectivityNet and not loaded.training and loaded.engine == net.engine
    torch.testing.assert_close(loaded(images), expected, atol=0, rtol=0)
    if gate != "full":  # ties to the lower index, as then
        assert loaded.stages[1].gate.tie_order[0].tolist() == [3, 2, 1, 0]
    loaded.train()(images).sum().backward()  # and it trains (its batch norms' running statistics move)
    torch.save(loaded.eval(), tmp_path / "new.pt")  # a pickle of today's loads as it is
    again = torch.load(tmp_path / "new.pt", weights_only=False)
    torch.testing.assert_close(again(images), loaded(images), atol=0, rtol=0)


def test_an_old_whole_network_pickle_that_cannot_be_rebuilt_says_what_to_do(tmp_path):
    net = _as_pickled_by_an_older_version(connlearn.build(**tiny()))
    net._graph.graph["gate"] = "gone"  # a gate kind this version no longer has
    torch.save(net, tmp_path / "old.pt")
    with pytest.raises(CheckpointError, match=r"pickled whole .* by an older connlearn and cannot be rebuilt"):
        torch.load(tmp_path / "old.pt", weights_only=False)


def test_a_whole_network_pickles_with_its_generator_and_draws_on_from_where_it_was(images, tmp_path):
    # torch pickles a torch.Generator only from 2.4: the network pickles its generator's seed and state
    net = connlearn.build(**tiny(seed=5, gate_init="uniform")).train()
    net(images)  # the generator has moved on from its seed
    torch.save(net, tmp_path / "net.pt")
    loaded = torch.load(tmp_path / "net.pt", weights_only=False)
    assert isinstance(loaded.generator, torch.Generator)
    assert loaded.generator.initial_seed() == net.generator.initial_seed()
    assert torch.equal(loaded.generator.get_state(), net.generator.get_state())
    torch.testing.assert_close(loaded(images), net(images), atol=0, rtol=0)  # the same draw


def test_deepcopy_of_a_holder_shares_the_copied_generator_with_its_net():
    net = connlearn.build(**tiny())
    holder = copy.deepcopy({"net": net, "generator": net.generator})
    assert holder["generator"] is holder["net"].generator is not net.generator


@pytest.mark.slow
def test_torch_compile_matches_eager(images):
    net = connlearn.build(**tiny()).train()
    eager = copy.deepcopy(net)
    compiled = torch.compile(net)
    torch.testing.assert_close(compiled(images), eager(images), atol=1e-4, rtol=1e-4)
    compiled(images).sum().backward()
    assert all(p.grad is not None for p in net.gate_parameters())


@pytest.mark.parametrize("gate", ["topk", "random"])
def test_a_training_forward_is_one_graph_for_torch_compile(images, gate):
    # The draw of the connectivity runs eagerly, before the stem: the rest of the network is one graph, so
    # CUDA graphs (mode="reduce-overhead") capture the whole forward pass instead of pieces of it.
    net = connlearn.build(**tiny(gate=gate)).train()
    explained = torch._dynamo.explain(net)(images)
    assert explained.graph_count == 1


@pytest.mark.parametrize("gate", ["frozen", "random", "full"])
def test_a_fixed_connectivity_compiles_without_a_graph_break(images, gate):
    # nothing to draw: phases 2-4 of a learned net, Fixed-Random and Fixed-Full are one graph with no break
    net = connlearn.build(**tiny(gate="topk" if gate == "frozen" else gate, K=4 if gate == "full" else 2))
    net = (net.freeze() if gate == "frozen" else net).train()
    explained = torch._dynamo.explain(net)(images)
    assert explained.graph_count == 1 and explained.graph_break_count == 0


@pytest.mark.parametrize("dynamic", [False, True])
def test_under_torch_compile_a_batch_that_batch_norm_cannot_train_on_is_named_as_in_eager(dynamic):
    from connlearn.errors import ShapeError

    net = connlearn.build(**tiny(gate="random"))
    compiled = torch.compile(net, backend="eager", dynamic=dynamic)
    x = torch.randn(1, 3, 4, 4)
    with pytest.raises(ShapeError, match=r"a training batch of 1 image of 4x4 ends in 1x1 feature maps"):
        compiled(x)
    torch.testing.assert_close(compiled.eval()(x), net.eval()(x))
    assert compiled(torch.randn(3, 3, 4, 4)).shape == (3, 10)


@pytest.mark.parametrize("training", [False, True])
def test_a_single_image_batch_norm_can_normalise_compiles_to_one_graph_without_a_break(training):
    # inference on one image, or training on one large one: nothing to check eagerly
    net = connlearn.build(**tiny(gate="random")).train(training)
    explained = torch._dynamo.explain(net)(torch.randn(1, 3, 32, 32))
    assert explained.graph_count == 1 and explained.graph_break_count == 0


def test_annealing_the_temperature_and_new_draws_never_recompile(images):
    # The trainer sets sample_temperature at every step of an annealed phase 1 and every step draws anew.
    # Were either guarded on by the compiled graph, each step would recompile until torch gave up and ran
    # the network eagerly, losing CUDA graphs (reduce-overhead) with no more than a logged warning.
    net = connlearn.build(**tiny(gate="topk")).train()
    compiled = torch.compile(net, backend="eager")
    compiled(images)  # the one compilation
    with torch._dynamo.config.patch(error_on_recompile=True):
        for step in range(4):
            net.sample_temperature = 1.0 / (step + 2)
            compiled(images).sum().backward()


@pytest.mark.parametrize("gate", ["topk", "random"])
def test_networks_of_one_architecture_share_their_compiled_forward_passes(images, gate):
    # A seed sweep or a notebook compiles many networks in one process. Were the compiled code guarded on
    # each network's own gates, every network would compile anew, and after torch's recompile limit (8)
    # the rest would run eagerly.
    torch._dynamo.reset()
    for seed in range(3):
        net = connlearn.build(**tiny(gate=gate, seed=seed))
        compiled = torch.compile(net, backend="eager")
        with torch._dynamo.config.patch(error_on_recompile=seed > 0):
            compiled(images).sum().backward()
            with torch.no_grad():
                compiled.eval()(images)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_a_checkpoint_rebuilds_the_network_in_its_dtype_bit_for_bit(dtype):
    from connlearn.checkpoint import make_checkpoint, net_from_checkpoint

    net = connlearn.build(**tiny(gate_init="uniform")).to(dtype)
    ckpt = make_checkpoint(net)
    rebuilt = net_from_checkpoint(ckpt)
    assert {p.dtype for p in rebuilt.parameters()} == {dtype}
    for (name, a), b in zip(net.state_dict().items(), rebuilt.state_dict().values(), strict=True):
        if torch.is_tensor(a):
            assert torch.equal(a, b), name
    del ckpt["dtype"]  # as written before it was recorded: float32
    assert {p.dtype for p in net_from_checkpoint(ckpt).parameters()} == {torch.float32}
