import pytest
import torch
from torch import nn

import convt3d
from conftest import assert_close_rel, eager_called_models, skip_without_usable_triton


def test_same_parameters_and_state_dict_as_pytorch():
    torch.manual_seed(0)
    ref = nn.ConvTranspose3d(4, 6, (3, 2, 3), stride=(2, 1, 2), padding=1, output_padding=(1, 0, 0), groups=2,
                             dilation=(1, 2, 1)).double()
    ours = convt3d.ConvTranspose3d(4, 6, (3, 2, 3), stride=(2, 1, 2), padding=1, output_padding=(1, 0, 0), groups=2,
                                   dilation=(1, 2, 1)).double()
    assert isinstance(ours, nn.ConvTranspose3d)
    assert ours.state_dict().keys() == ref.state_dict().keys()
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(2, 4, 3, 4, 5, dtype=torch.float64)
    assert_close_rel(ours(x), ref(x), 1e-12)
    ref.load_state_dict(ours.state_dict())


def test_numpy_integer_arguments_work_as_in_pytorchs_layer():
    """nn.ConvTranspose3d keeps numpy integers given to it (a config read through numpy, say); so do convt3d's
    layers, and a converted model, and their calls give PyTorch's layer's result."""
    np = pytest.importorskip("numpy")
    kwargs = dict(stride=np.int64(2), padding=(np.int64(1), 0, 1), output_padding=np.int32(1), groups=np.int64(2),
                  dilation=(1, np.int64(2), 1))
    torch.manual_seed(0)
    ref = nn.ConvTranspose3d(4, 6, np.int64(3), **kwargs).double()
    ours = convt3d.ConvTranspose3d(4, 6, np.int64(3), **kwargs).double()
    ours.load_state_dict(ref.state_dict())
    converted = convt3d.convert(nn.Sequential(nn.ConvTranspose3d(4, 6, np.int64(3), **kwargs).double()))
    converted.load_state_dict(nn.Sequential(ref).state_dict())
    for _ in range(2):  # the first call and the bound forward's
        x = torch.randn(2, 4, 3, 4, 5, dtype=torch.float64)
        assert_close_rel(ours(x), ref(x), 1e-12)
        assert_close_rel(converted(x), ref(x), 1e-12)


@pytest.mark.parametrize("output_size", [[8, 8, 10], [2, 4, 6, 7, 9]])
def test_forward_with_output_size(output_size):
    ref = nn.ConvTranspose3d(6, 4, 3, stride=(3, 2, 2)).double()
    ours = convt3d.convert(nn.ConvTranspose3d(6, 4, 3, stride=(3, 2, 2)).double())
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(2, 6, 2, 3, 4, dtype=torch.float64)
    assert_close_rel(ours(x, output_size=output_size), ref(x, output_size=output_size), 1e-12)
    with pytest.raises(ValueError, match="output_size"):
        ours(x, output_size=[20, 8, 9])
    with pytest.raises(ValueError, match="output_size"):
        ours(x, output_size=[4, 8, 8, 10])


def test_unbatched_input():
    layer = convt3d.ConvTranspose3d(3, 2, 2, stride=2).double()
    x = torch.randn(3, 2, 3, 4, dtype=torch.float64)
    assert_close_rel(layer(x), nn.functional.conv_transpose3d(x, layer.weight, layer.bias, 2), 1e-12)


@pytest.mark.parametrize("unbatched", [False, True])
def test_jit_script_compiles_pytorchs_op_in_its_place(unbatched):
    """torch.jit.script (before, it failed on convt3d's Python): the scripted layer runs PyTorch's own op, as
    nn.ConvTranspose3d's forward does, so that the script saves and loads without convt3d; against float64 on a fresh
    input, with output_size, its gradients reaching the parameters it shares with the eager model, and the eager model
    left as it was."""
    import io

    model, reference = eager_called_models()  # eager calls first: the modules hold bound forwards
    scripted = torch.jit.script(model)
    first = getattr(scripted, "0")
    assert "aten::conv_transpose3d" in str(first.inlined_graph)
    buffer = io.BytesIO()
    torch.jit.save(scripted, buffer)
    buffer.seek(0)
    loaded = torch.jit.load(buffer)
    x = torch.randn(3, 4, 3, 4, 5)[0 if unbatched else slice(None)]
    assert_close_rel(loaded(x), reference(x.double()), 1e-5)
    actual = scripted(x)
    assert_close_rel(actual, reference(x.double()), 1e-5)
    actual.sum().backward()
    reference(x.double()).sum().backward()
    for ours, theirs in zip(model.parameters(), reference.parameters()):
        assert_close_rel(ours.grad, theirs.grad, 1e-5)
    assert all(type(model[i]) is convt3d.ConvTranspose3d for i in (0, 2))
    assert_close_rel(model(x), reference(x.double()), 1e-5)
    output_size = [5, 8, 10]  # output_padding (0, 0, 1) in place of the layer's (1, 0, 0)
    assert_close_rel(first(x, output_size), reference[0](x.double(), output_size), 1e-5)
    with pytest.raises(Exception, match="output size"):
        first(x, [20, 8, 9])


def test_convert_keeps_outputs_parameters_and_dtype():
    torch.manual_seed(1)
    model = nn.Sequential(
        nn.Conv3d(2, 4, 3, padding=1),
        nn.ReLU(),
        nn.Sequential(nn.ConvTranspose3d(4, 4, 4, stride=2, padding=1), nn.ReLU()),
        nn.ConvTranspose3d(4, 1, 3, stride=2, padding=1, output_padding=1, bias=False),
    ).double()
    x = torch.randn(2, 2, 3, 4, 4, dtype=torch.float64)
    expected = model(x)
    weight = model[3].weight
    converted = convt3d.convert(model)
    assert converted is model
    assert isinstance(model[2][0], convt3d.ConvTranspose3d) and isinstance(model[3], convt3d.ConvTranspose3d)
    assert model[3].weight is weight and model[3].weight.dtype == torch.float64
    assert_close_rel(model(x), expected, 1e-12)


def test_convert_a_bare_layer_returns_the_replacement():
    layer = nn.ConvTranspose3d(2, 2, 3)
    new = convt3d.convert(layer, backend="torch")
    assert isinstance(new, convt3d.ConvTranspose3d) and new.backend == "torch" and new.weight is layer.weight


def test_padding_mode_other_than_zeros_is_refused():
    layer = convt3d.ConvTranspose3d(2, 2, 3)
    layer.padding_mode = "reflect"
    with pytest.raises(ValueError, match="padding mode"):
        layer(torch.randn(1, 2, 3, 3, 3))


def test_convert_refuses_an_unknown_backend():
    with pytest.raises(ValueError, match="backend"):
        convt3d.convert(nn.Sequential(nn.ConvTranspose3d(2, 2, 3)), backend="cudnn")


# Bound forwards (ops.BoundForward): a module's later calls skip to the Triton backend's prepared call. On the GPU where
# there is one, else on the CPU, where the Triton kernels run in the interpreter.
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def prepared_spy(monkeypatch):
    """Stands in for the Triton backend's prepared calls (backends.triton._prepared): install(layer, x) makes the
    prepared call of layer's call on x (PyTorch's precision flags as they are) F.conv_transpose3d in float64, each call
    counted in the list it returns; the module's calls by the full way (functional.conv_transpose3d) are counted in
    spy.full. The prepared calls' own launches are tested in test_triton_forward.py and test_triton_tiled.py."""
    skip_without_usable_triton()
    import convt3d.backends.triton as triton_backend
    from convt3d import functional, module

    monkeypatch.setattr(triton_backend, "_prepared", {})
    # Float32 accuracy where the Triton kernels themselves run (the full way in some tests): checked at 1e-6.
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    full = []
    real = module.conv_transpose3d
    monkeypatch.setattr(module, "conv_transpose3d", lambda *a, **k: full.append(1) or real(*a, **k))

    def install(layer, x):
        served = []
        plan = functional.validate(x, layer.weight, layer.bias, layer.stride, layer.padding, layer.output_padding,
                                   layer.groups, layer.dilation)[1]

        def prepared(input, weight, bias):
            served.append(1)
            assert not torch.is_grad_enabled()  # the kernels run with grad mode off, as apply runs them
            return nn.functional.conv_transpose3d(
                input.double(), weight.double(), None if bias is None else bias.double(), plan.stride, plan.padding,
                plan.output_padding, plan.groups, plan.dilation).to(input.dtype)

        key = triton_backend._prepared_key(x, layer.bias, plan, triton_backend.precision_for(x.dtype))
        triton_backend._prepared[key] = prepared
        return served

    install.full = full
    return install


def _bound_layer(**kwargs):
    torch.manual_seed(0)
    layer = convt3d.convert(nn.ConvTranspose3d(4, 6, 3, **kwargs), backend="triton").to(DEVICE)
    return layer, torch.randn(2, 4, 3, 4, 5, device=DEVICE)


def _expected(layer, x):
    return nn.functional.conv_transpose3d(
        x.double(), layer.weight.double(), None if layer.bias is None else layer.bias.double(), layer.stride,
        layer.padding, layer.output_padding, layer.groups, layer.dilation)


@pytest.mark.parametrize("bias", [True, False])
def test_later_calls_skip_to_the_prepared_call(prepared_spy, bias):
    layer, x = _bound_layer(stride=2, padding=1, output_padding=1, bias=bias)
    served = prepared_spy(layer, x)
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(2, 4, 3, 4, 5, device=DEVICE)
            assert_close_rel(layer(x), _expected(layer, x), 1e-6)
    assert len(served) == 3 and len(prepared_spy.full) == 1  # the first call by the full way, then bound


def test_each_input_signature_binds_its_own_forward(prepared_spy):
    layer, x = _bound_layer(stride=2)
    other = torch.randn(1, 4, 2, 2, 3, device=DEVICE)
    served = prepared_spy(layer, x), prepared_spy(layer, other)
    with torch.no_grad():
        for _ in range(2):
            for shape in (x.shape, other.shape):
                fresh = torch.randn(shape, device=DEVICE)
                assert_close_rel(layer(fresh), _expected(layer, fresh), 1e-6)
        # Not contiguous: the full way, whose kernels run here.
        strided = torch.randn(2, 4, 3, 4, 10, device=DEVICE)[..., ::2]
        for _ in range(2):
            assert_close_rel(layer(strided), _expected(layer, strided), 1e-6)
    # Each shape's first call by the full way (the prepared call serving it there too), its second bound; the strided
    # input's calls by the full way.
    assert [len(calls) for calls in served] == [2, 2] and len(prepared_spy.full) == 2 + 2


@pytest.mark.parametrize("change", ["stride", "backend", "weight replaced", "weight moved", "tf32", "output_size",
                                    "autocast", "vmap"])
def test_a_change_since_binding_takes_the_full_way(prepared_spy, change):
    """What the bound forward's answers depend on, changed after it was bound: the next call goes the full way (and
    binds anew where the prepared call serves), with the result that change asks for."""
    layer, x = _bound_layer(stride=2, padding=1)
    prepared_spy(layer, x)
    with torch.no_grad():
        layer(x), layer(x)
        assert len(prepared_spy.full) == 1
        calls = 1
        if change == "stride":
            layer.stride = (1, 2, 2)
        elif change == "backend":
            layer.backend = "torch"
        elif change == "weight replaced":
            layer.weight = nn.Parameter(torch.randn_like(layer.weight))
        elif change == "weight moved":  # as module.to() leaves a parameter: the same object, other data
            layer.weight.data = layer.weight.data.to(memory_format=torch.channels_last_3d)
        if change == "tf32":
            with torch.backends.cudnn.flags(enabled=True, allow_tf32=True):
                out = layer(x)
        elif change == "autocast":  # the operands cast as autocast casts them, then bfloat16's kernels
            with torch.autocast(x.device.type, dtype=torch.bfloat16):
                out = layer(x)
            assert out.dtype == torch.bfloat16
        elif change == "vmap":  # examples of x's very signature: the bound forward cannot run batched tensors
            out = torch.func.vmap(layer)(torch.stack([x, 2 * x]))
            assert_close_rel(out, torch.stack([_expected(layer, x), _expected(layer, 2 * x)]), 1e-6)
        elif change == "output_size":
            out = layer(x, output_size=[6, 8, 10])
            calls = 2  # (given an output size, always the full way)
            assert out.shape[2:] == (6, 8, 10)
            assert_close_rel(layer(x, output_size=[6, 8, 10]),
                             nn.functional.conv_transpose3d(x.double(), layer.weight.double(), layer.bias.double(),
                                                            2, 1, (1, 1, 1)), 1e-6)
        else:
            out = layer(x)
    if change not in ("output_size", "vmap"):  # (TF32 keeps 11 significant bits; bfloat16 8)
        assert_close_rel(out, _expected(layer, x), {"tf32": 2e-3, "autocast": 1e-2}.get(change, 1e-6))
    assert len(prepared_spy.full) == 1 + calls


@pytest.mark.parametrize("where", ["vmap", "fake"])
def test_a_call_under_vmap_or_on_fake_tensors_leaves_the_bound_forward(prepared_spy, where):
    """Calls whose input has the very signature of a bound one but cannot run it (vmap's per-example tensors;
    FakeTensorMode's, which have no data) take the full way, which runs PyTorch's kernel, and leave the bound forward
    to the next plain call. Before, the bound forward ran the prepared call on the fake tensor, and each of them left
    the signature marked as one that never binds."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    layer, x = _bound_layer(stride=2, padding=1)
    served = prepared_spy(layer, x)
    with torch.no_grad():
        layer(x), layer(x)
        assert len(served) == 2 and len(prepared_spy.full) == 1
        if where == "vmap":
            out = torch.func.vmap(layer)(torch.stack([x, 2 * x]))
            assert_close_rel(out, torch.stack([_expected(layer, x), _expected(layer, 2 * x)]), 1e-6)
        else:
            with FakeTensorMode(allow_non_fake_inputs=True) as mode:
                out = layer(mode.from_tensor(x))
            assert out.shape == _expected(layer, x).shape
        assert len(served) == 2 and len(prepared_spy.full) == 2
        assert_close_rel(layer(x), _expected(layer, x), 1e-6)
    assert len(served) == 3 and len(prepared_spy.full) == 2  # bound again at once


def test_bound_forward_records_the_same_gradients(prepared_spy):
    layer, x = _bound_layer(stride=2, padding=1, output_padding=1)
    served = prepared_spy(layer, x)
    layer(x)  # binds
    x = torch.randn(2, 4, 3, 4, 5, device=DEVICE, requires_grad=True)
    out = layer(x)
    assert len(served) == 2 and len(prepared_spy.full) == 1
    grad = torch.randn_like(out)
    actual = torch.autograd.grad(out, (x, layer.weight, layer.bias), grad)
    x64, w64, b64 = (t.detach().double().requires_grad_() for t in (x, layer.weight, layer.bias))
    expected = torch.autograd.grad(nn.functional.conv_transpose3d(x64, w64, b64, 2, 1, 1), (x64, w64, b64),
                                   grad.double())
    for a, e in zip(actual, expected):
        assert_close_rel(a, e, 1e-5)


def test_a_replaced_parameter_is_not_kept_alive_by_a_bound_forward(prepared_spy):
    import gc
    import weakref

    layer, x = _bound_layer(stride=2)
    prepared_spy(layer, x)
    with torch.no_grad():
        layer(x)
        old = weakref.ref(layer.weight)
        layer.weight = nn.Parameter(torch.randn_like(layer.weight))
        gc.collect()
        assert old() is None
        assert_close_rel(layer(x), _expected(layer, x), 1e-6)


def test_a_bound_module_copies_and_pickles_without_its_bound_forwards(prepared_spy):
    import copy
    import io

    layer, x = _bound_layer(stride=2)
    prepared_spy(layer, x)
    with torch.no_grad():
        layer(x)
        assert layer.__dict__.get("_bound_forwards")
        buffer = io.BytesIO()
        torch.save(layer, buffer)
        buffer.seek(0)
        for other in (copy.deepcopy(layer), torch.load(buffer, weights_only=False, map_location=DEVICE)):
            assert "_bound_forwards" not in other.__dict__ and other.weight is not layer.weight
            assert_close_rel(other(x), _expected(layer, x), 1e-6)
        assert layer.__dict__.get("_bound_forwards")



def test_data_parallel_replicas_leave_the_modules_bound_forwards_alone(prepared_spy):
    """nn.DataParallel replicates a module for every call (_replicate_for_data_parallel) with copies of its parameters
    on each GPU: a replica takes the full way, binds nothing, and leaves the module's bound forwards as they were
    (before, it shared them and rebound them to its own copies)."""
    layer, x = _bound_layer(stride=2)
    prepared_spy(layer, x)
    with torch.no_grad():
        layer(x)
        bounds = dict(layer.__dict__["_bound_forwards"])
        replica = layer._replicate_for_data_parallel()
        replica.weight, replica.bias = layer.weight.clone(), layer.bias.clone()  # as replicate() sets its copies
        assert_close_rel(replica(x), _expected(layer, x), 1e-6)
        assert replica.__dict__["_bound_forwards"] is None
        assert layer.__dict__["_bound_forwards"] == bounds
        assert_close_rel(layer(x), _expected(layer, x), 1e-6)
    assert len(prepared_spy.full) == 2  # the module's first call and the replica's


@pytest.mark.parametrize("value", ["x", None, [1.0, 2.0]])
def test_an_input_that_is_no_tensor_is_named(value):
    """As nn.ConvTranspose3d: a TypeError naming the input (before, an AttributeError from the bound forwards'
    lookup)."""
    with pytest.raises(TypeError, match="input"):
        convt3d.ConvTranspose3d(2, 3, 3)(value)
