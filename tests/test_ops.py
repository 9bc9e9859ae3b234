import os
import random
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

import convt3d
from conftest import (assert_close_rel, assert_compiled_calls_match, eager_called_models, layer_args, make_tensors,
                      random_config, run_in_sample, skip_without_usable_triton)


def test_op_is_registered():
    assert hasattr(torch.ops.convt3d, "conv_transpose3d")
    assert hasattr(torch.ops.convt3d, "conv_transpose3d_backward")


@pytest.mark.parametrize("need", [(True, True), (True, False), (False, True)])
def test_backward_op_matches_autograd_and_its_registration(need):
    """The CUDA backward op (here with its Triton kernel in the interpreter, or natively on a GPU): gradients
    against float64 autograd, an empty tensor for a gradient not asked for, and torch.library.opcheck's checks
    of its schema and fake implementation."""
    skip_without_usable_triton()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    args = ([2, 3, 2], [1, 0, 2], [1, 0, 1], 2, [2, 3, 2])  # stride, padding, output_padding, groups, dilation
    x = torch.randn(2, 4, 3, 4, 5, device=device)
    w = torch.randn(4, 3, 3, 2, 3, device=device)
    x64, w64 = x.double().requires_grad_(), w.double().requires_grad_()
    y64 = F.conv_transpose3d(x64, w64, None, args[0], args[1], args[2], args[3], args[4])
    grad = torch.randn(y64.shape, device=device)
    expected = torch.autograd.grad(y64, (x64, w64), grad.double())
    op = torch.ops.convt3d.conv_transpose3d_backward.default
    with torch.backends.cudnn.flags(allow_tf32=False):  # float32 accuracy (3xTF32 in the kernel)
        actual = op(grad, x, w, *args, *need)
        torch.library.opcheck(op, (grad, x, w, *args, *need))
    for asked, a, e in zip(need, actual, expected):
        if asked:
            assert_close_rel(a, e, 1e-5)
        else:
            assert a.numel() == 0


@pytest.mark.parametrize("backend", ["torch", "auto"])
@pytest.mark.parametrize("seed", range(12))
def test_gradcheck_float64(seed, backend):
    run_in_sample((seed + (backend == "auto")) % 2 == 0)  # each seed through one backend, in turn
    rng = random.Random(1000 + seed)
    cfg = random_config(rng, max_size=3)
    cfg["batch"] = max(cfg["batch"], 1)
    x, w, b = make_tensors(cfg)
    inputs = [t.requires_grad_() for t in (x, w, b) if t is not None]

    def f(x, w, b=None):
        return convt3d.conv_transpose3d(x, w, b, **layer_args(cfg), backend=backend)

    assert torch.autograd.gradcheck(f, inputs), cfg


@pytest.mark.parametrize("seed", range(4))
def test_gradcheck_through_the_registered_op(seed):
    """Eager autograd runs a plain autograd.Function; the op's own registered autograd (what torch.compile
    traces) is checked here directly."""
    cfg = dict(random_config(random.Random(1700 + seed), max_size=3), unbatched=False)
    cfg["batch"] = max(cfg["batch"], 1)
    x, w, b = make_tensors(cfg)
    args = layer_args(cfg)
    plan = convt3d.plan.make_plan(tuple(x.shape), tuple(w.shape), **args)

    def f(x, w, b):
        return torch.ops.convt3d.conv_transpose3d(x, w, b, list(plan.stride), list(plan.padding),
                                                  list(plan.output_padding), plan.groups, list(plan.dilation),
                                                  "torch")

    b = b if b is not None else torch.randn(plan.out_channels, dtype=torch.float64)
    assert torch.autograd.gradcheck(f, [t.requires_grad_() for t in (x, w, b)]), cfg


@pytest.mark.parametrize("seed", range(3))
def test_torch_func_grad_vjp_and_double_backward_match_eager(seed):
    """torch.func.grad and vjp through convt3d, and second derivatives (grad of grad, and create_graph=True),
    against PyTorch's own in float64 on fresh random data."""
    cfg = dict(random_config(random.Random(2300 + seed), max_size=3), unbatched=False, bias=True)
    cfg["batch"] = max(cfg["batch"], 1)
    x, w, b = make_tensors(cfg)
    args = layer_args(cfg)
    ours = lambda x, w, b: convt3d.conv_transpose3d(x, w, b, **args)  # noqa: E731
    eager = lambda x, w, b: F.conv_transpose3d(x, w, b, **args)  # noqa: E731

    def loss(fn):
        return lambda x, w, b: fn(x, w, b).square().sum()

    for got, expected in zip(torch.func.grad(loss(ours), argnums=(0, 1, 2))(x, w, b),
                             torch.func.grad(loss(eager), argnums=(0, 1, 2))(x, w, b)):
        assert_close_rel(got, expected, 1e-12)
    out, vjp = torch.func.vjp(ours, x, w, b)
    cotangent = torch.randn_like(out)
    for got, expected in zip(vjp(cotangent), torch.func.vjp(eager, x, w, b)[1](cotangent)):
        assert_close_rel(got, expected, 1e-12)

    def second(fn):
        return torch.func.grad(lambda x: torch.func.grad(loss(fn), argnums=1)(x, w, b).square().sum())(x)

    assert_close_rel(second(ours), second(eager), 1e-10)
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    results = []
    for fn in (ours, eager):
        (grad_w,) = torch.autograd.grad(loss(fn)(xr, wr, b), wr, create_graph=True)
        results.append(torch.autograd.grad(grad_w.square().sum(), xr)[0])
    assert_close_rel(*results, 1e-10)


@pytest.mark.parametrize("backend", ["auto", "torch", "eager"])
@pytest.mark.parametrize("seed", range(2))
def test_vmap_jvp_and_the_transforms_built_on_them_match_eager(backend, seed):
    """torch.func.vmap (over the input, over the weight, around grad and inside it), jvp, jacrev, jacfwd and hessian
    through convt3d against the same transforms of F.conv_transpose3d, in float64 on fresh random data. Under vmap
    and jvp PyTorch's own kernel runs (which they batch and differentiate); before, every vmap case raised (layout
    queries that vmap does not batch, or an autograd.Function without a vmap rule)."""
    func = torch.func
    cfg = dict(random_config(random.Random(2400 + seed), max_size=3), unbatched=False, bias=True)
    cfg["batch"] = max(cfg["batch"], 1)
    x, w, b = make_tensors(cfg)
    xs, ws = torch.stack([x, torch.randn_like(x)]), torch.stack([w, torch.randn_like(w)])
    args = layer_args(cfg)
    ours = lambda x, w: convt3d.conv_transpose3d(x, w, b, **args, backend=backend)  # noqa: E731
    eager = lambda x, w: F.conv_transpose3d(x, w, b, **args)  # noqa: E731

    def loss(fn):
        return lambda x, w: fn(x, w).sin().sum()

    transforms = {
        "vmap over x": lambda fn: func.vmap(fn, in_dims=(0, None))(xs, w),
        "vmap over w": lambda fn: func.vmap(fn, in_dims=(None, 0))(x, ws),
        "vmap of grad": lambda fn: func.vmap(func.grad(loss(fn), argnums=(0, 1)), in_dims=(0, None))(xs, w),
        "grad of vmap": lambda fn: func.grad(lambda w: func.vmap(fn, in_dims=(0, None))(xs, w).sin().sum())(w),
        "jvp": lambda fn: func.jvp(lambda x: fn(x, w), (x,), (xs[1],))[1],
        "jacrev": lambda fn: func.jacrev(lambda w: fn(x, w).sum(dim=(0, 2, 3, 4)))(w),
        "jacfwd": lambda fn: func.jacfwd(lambda x: fn(x, w).sum(dim=(0, 2, 3, 4)))(x),
        "hessian": lambda fn: func.hessian(lambda dw: loss(fn)(x, w + dw))(torch.zeros_like(w)),
    }
    for name, transform in transforms.items():
        got, expected = transform(ours), transform(eager)
        for got_part, expected_part in zip(*((got, expected) if isinstance(got, tuple) else ((got,), (expected,)))):
            assert_close_rel(got_part, expected_part, 1e-10, name)


def test_backward_that_is_recorded_avoids_the_cuda_phase_path(monkeypatch):
    """The CUDA phase backward (Triton kernels, not differentiable) serves plain backward passes only; under
    create_graph=True the differentiable path runs. Here on the CPU, with the CUDA path's choice forced on."""
    from convt3d import ops
    from convt3d.backends.torch_phase import conv_transpose3d_backward

    calls = []

    def phase_backward(grad_output, input, weight, plan, need_input, need_weight):
        calls.append(torch.is_grad_enabled())
        return conv_transpose3d_backward(grad_output, input, weight, plan, need_input, need_weight)

    monkeypatch.setattr(ops, "_cuda_phase_backward_serves", lambda input, plan: True)
    monkeypatch.setattr(ops, "_cuda_phase_backward", phase_backward)
    x = torch.randn(1, 2, 3, 3, 3, dtype=torch.float64, requires_grad=True)
    w = torch.randn(2, 3, 3, 3, 3, dtype=torch.float64, requires_grad=True)
    y = convt3d.conv_transpose3d(x, w, None, stride=2, padding=1, dilation=2, backend="torch")
    plain = torch.autograd.grad(y.sum(), (x, w), retain_graph=True)
    recorded = torch.autograd.grad(y.sum(), (x, w), create_graph=True)
    assert calls == [False]  # the plain pass only
    for a, b in zip(plain, recorded):
        assert_close_rel(a, b.detach(), 1e-12)


@pytest.mark.parametrize("eager_autograd", [False, True])
def test_eager_kernel_is_recorded_by_pytorch_where_its_backward_is_atens(eager_autograd, monkeypatch):
    """A forward by eager's kernel ("eager", or what "auto" chose) goes to PyTorch's own autograd where
    ops._eager_autograd_serves (on CUDA: no backward by phases); elsewhere to convt3d's node. Here on the CPU with that
    choice forced either way: the same output and gradients as F.conv_transpose3d, through the expected node."""
    from convt3d import ops

    monkeypatch.setattr(ops, "_eager_autograd_serves", lambda input, plan: eager_autograd)
    torch.manual_seed(random.randrange(2**31))
    x = torch.randn(2, 4, 3, 4, 5, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, 3, 3, 2, 3, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, dtype=torch.float64, requires_grad=True)
    args = dict(stride=2, padding=1, output_padding=1, dilation=(1, 2, 1))
    expected = F.conv_transpose3d(x, w, b, **args)
    grad = torch.randn(expected.shape, dtype=torch.float64)
    monkeypatch.setattr(convt3d.functional, "choose_backend", lambda *a: "eager")
    for backend in ("eager", "auto"):
        y = convt3d.conv_transpose3d(x, w, b, backend=backend, **args)
        assert (type(y.grad_fn) is type(expected.grad_fn)) == eager_autograd, type(y.grad_fn)
        assert torch.equal(y, expected)
        for a, e in zip(torch.autograd.grad(y, (x, w, b), grad), torch.autograd.grad(expected, (x, w, b), grad,
                                                                                     retain_graph=True)):
            assert_close_rel(a, e, 1e-12)


def test_float32_gradients_match_eager():
    torch.manual_seed(0)
    x = torch.randn(2, 4, 5, 4, 6, requires_grad=True)
    layer = nn.ConvTranspose3d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2, dilation=(1, 2, 1))
    ours = convt3d.convert(nn.ConvTranspose3d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2,
                                              dilation=(1, 2, 1)))
    ours.load_state_dict(layer.state_dict())
    grad = torch.randn(layer(x).shape)
    expected = torch.autograd.grad(layer(x), (x, layer.weight, layer.bias), grad)
    actual = torch.autograd.grad(ours(x), (x, ours.weight, ours.bias), grad)
    for a, e, name in zip(actual, expected, ("input", "weight", "bias")):
        assert_close_rel(a, e, 1e-5, f"grad {name}")


@pytest.mark.parametrize("backend", ["torch", "eager"])
def test_output_behaves_as_eager_under_autograd_and_in_place_use(backend):
    # The eager autograd node is recorded after the kernels ran (ops.apply): the output must still be an ordinary
    # result, with grad_fn, usable in place and through views, its gradients eager's, the input untouched.
    torch.manual_seed(1)
    x = torch.randn(2, 3, 4, 3, 5, dtype=torch.float64, requires_grad=True)
    layer = nn.ConvTranspose3d(3, 4, 3, stride=2, padding=1, dilation=2).double()
    ours = convt3d.convert(nn.ConvTranspose3d(3, 4, 3, stride=2, padding=1, dilation=2).double(), backend)
    ours.load_state_dict(layer.state_dict())
    x_before = x.detach().clone()
    grad = torch.randn(layer(x).shape, dtype=torch.float64)
    results = []
    for model in (layer, ours):
        y = model(x)
        assert y.requires_grad and y.grad_fn is not None and not y.is_leaf
        y[:, :, 1].mul_(3)  # in place through a view, then on the whole
        y.add_(1)
        results.append((y.detach().clone(), *torch.autograd.grad(y, (x, model.weight, model.bias), grad)))
    for a, e, name in zip(results[1], results[0], ("output", "input", "weight", "bias")):
        assert_close_rel(a, e, 1e-12, f"{name} (grad)" if name != "output" else name)
    assert torch.equal(x.detach(), x_before)


def test_node_is_recorded_through_the_cpp_apply_or_function_apply(monkeypatch):
    """ops records its node through autograd.Function's C++ apply, skipping the Python wrapper; a torch without it
    gets Function.apply. A tensor that a finished torch.func transform left wrapped goes in as PyTorch's own
    layer takes it: the same output and weight gradient."""
    from convt3d import ops

    record = ops._c_apply(ops._EagerConvTranspose3d)
    assert record is not ops._EagerConvTranspose3d.apply and record.__self__ is ops._EagerConvTranspose3d
    monkeypatch.setattr(torch._C, "_FunctionBase", type("WithoutApply", (), {}))
    assert ops._c_apply(ops._EagerConvTranspose3d) == ops._EagerConvTranspose3d.apply
    monkeypatch.undo()

    leaked = []
    torch.func.grad(lambda t: leaked.append(t) or t.sum())(torch.randn(1, 2, 3, 3, 3, dtype=torch.float64))
    x = leaked[0]
    w = torch.randn(2, 3, 3, 3, 3, dtype=torch.float64, requires_grad=True)
    y, expected = (f(x, w, None, stride=2) for f in (convt3d.conv_transpose3d, F.conv_transpose3d))
    assert type(y.grad_fn).__name__ == "_EagerConvTranspose3dBackward"
    assert_close_rel(y, expected, 1e-12)
    grad = torch.randn(y.shape, dtype=torch.float64)
    assert_close_rel(torch.autograd.grad(y, w, grad)[0], torch.autograd.grad(expected, w, grad)[0], 1e-12)


@pytest.mark.parametrize("backend", ["torch", "auto"])
def test_deterministic_mode_runs_and_repeats_bitwise(backend):
    """Under torch.use_deterministic_algorithms(True) forward and backward run (no op of ours is refused) and
    two runs give bitwise-identical outputs and gradients."""
    torch.manual_seed(0)
    x = torch.randn(2, 4, 3, 4, 5, requires_grad=True)
    w = torch.randn(4, 3, 3, 2, 3, requires_grad=True)
    b = torch.randn(3, requires_grad=True)
    grad = torch.randn(2, 3, 5, 7, 9)
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        runs = []
        for _ in range(2):
            y = convt3d.conv_transpose3d(x, w, b, stride=2, padding=1, dilation=(1, 2, 1), backend=backend)
            runs.append((y, *torch.autograd.grad(y, (x, w, b), grad)))
    finally:
        torch.use_deterministic_algorithms(previous)
    assert runs[0][0].shape == grad.shape
    for first, second in zip(*runs):
        assert torch.equal(first, second)


def test_compile_fullgraph_matches_eager():
    torch._dynamo.reset()
    model = nn.Sequential(convt3d.ConvTranspose3d(3, 4, 3, stride=2, padding=1), nn.ReLU())
    x = torch.randn(2, 3, 4, 5, 3)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    assert_close_rel(compiled(x), model(x), 1e-6)
    x.requires_grad_()
    compiled(x).sum().backward()
    expected = torch.autograd.grad(model(x).sum(), x)[0]
    assert_close_rel(x.grad, expected, 1e-6)


@pytest.mark.parametrize("backend", ["torch", "auto"])
@pytest.mark.parametrize("stride, output_padding, dilation", [(2, 1, 1), (1, 1, 2)])
def test_opcheck_with_channels_last_input(stride, output_padding, dilation, backend):
    """torch.library.opcheck on a channels-last input: the fake implementation gives the strides the op returns
    (compiled code checks them) and traces with dynamic shapes. Output_padding above stride (the second case) sends
    PyTorch's CPU convolution to its slow kernel, whose output is contiguous; the op's strides are PyTorch's."""
    torch.manual_seed(0)
    x = torch.randn(2, 4, 3, 4, 5).to(memory_format=torch.channels_last_3d)
    w = torch.randn(4, 3, 3, 2, 3)
    args = ([stride] * 3, [1] * 3, [output_padding] * 3, 1, [dilation] * 3)
    op = torch.ops.convt3d.conv_transpose3d.default
    torch.library.opcheck(op, (x, w, None, *args, backend))
    actual = op(x, w, None, *args, backend)
    assert actual.stride() == F.conv_transpose3d(x, w, None, stride, 1, output_padding, 1, dilation).stride()
    expected = F.conv_transpose3d(x.double(), w.double(), None, stride, 1, output_padding, 1, dilation)
    assert_close_rel(actual, expected, 1e-5)


def test_compile_meets_new_shapes_and_channels_last_inputs():
    """A compiled model called with a second shape is traced again with dynamic shapes (symbolic sizes, which the
    plan caches cannot key on), and a channels-last input changes the output's strides: forward and gradients of
    each call against a float64 nn.ConvTranspose3d model."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = nn.Sequential(convt3d.ConvTranspose3d(4, 3, 3, stride=2, padding=1, output_padding=1), nn.ReLU(),
                          convt3d.ConvTranspose3d(3, 2, 2, stride=2))
    reference = nn.Sequential(nn.ConvTranspose3d(4, 3, 3, stride=2, padding=1, output_padding=1), nn.ReLU(),
                              nn.ConvTranspose3d(3, 2, 2, stride=2)).double()
    reference.load_state_dict(model.state_dict())
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    inputs = [torch.rand(batch, 4, depth, 4, 5) for batch, depth in [(2, 3), (3, 5), (1, 4), (5, 2)]]
    inputs[2:] = [x.contiguous(memory_format=torch.channels_last_3d) for x in inputs[2:]]
    assert_compiled_calls_match(compiled, model, reference, inputs)



def test_compile_under_autocast():
    """A compiled model under torch.autocast: the casts are traced with the op (fullgraph), the output in autocast's
    dtype as eager PyTorch's, and outside autocast float32 again (a guard on the autocast state)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = nn.Sequential(convt3d.ConvTranspose3d(4, 3, 3, stride=2, padding=1), nn.ReLU())
    reference = nn.Sequential(nn.ConvTranspose3d(4, 3, 3, stride=2, padding=1), nn.ReLU())
    reference.load_state_dict(model.state_dict())
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    x = torch.randn(2, 4, 3, 4, 5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        actual, expected = compiled(x), reference(x)
    assert actual.dtype == expected.dtype == torch.bfloat16
    assert_close_rel(actual, expected, 1e-2)
    assert compiled(x).dtype == torch.float32


@pytest.mark.parametrize("unbatched", [False, True])
def test_jit_trace_records_the_op(unbatched):
    """torch.jit.trace (nn.ConvTranspose3d traces): the registered op in the graph, no TracerWarning (the checks see
    the sizes as numbers), and the traced model, saved and loaded, on a new shape: forward and gradients against
    float64. Before, the trace failed on the eager autograd node ("not supported in the JIT")."""
    import io
    import warnings

    model, reference = eager_called_models()
    example = torch.rand(2, 4, 3, 4, 5)[0 if unbatched else slice(None)]
    with warnings.catch_warnings():
        warnings.simplefilter("error", torch.jit.TracerWarning)
        traced = torch.jit.trace(model, example)
    assert str(traced.inlined_graph).count("convt3d::conv_transpose3d(") == 2
    buffer = io.BytesIO()
    torch.jit.save(traced, buffer)
    buffer.seek(0)
    loaded = torch.jit.load(buffer)
    x = torch.rand(3, 4, 4, 3, 5)[0 if unbatched else slice(None)].requires_grad_()
    actual = loaded(x)
    x64 = x.detach().double().requires_grad_()
    expected = reference(x64)
    assert_close_rel(actual, expected, 1e-5)
    grad = torch.randn(expected.shape)
    assert_close_rel(torch.autograd.grad(actual, x, grad)[0], torch.autograd.grad(expected, x64, grad.double())[0],
                     1e-5)


def test_export_with_a_dynamic_batch():
    """torch.export.export of a model that has run eager calls and been traced (whose bound forwards' keys held
    traced sizes before, which export then failed on): the exported program on another batch size against float64."""
    model, reference = eager_called_models()
    torch.jit.trace(model, torch.rand(2, 4, 3, 4, 5))
    batch = torch.export.Dim("batch", min=1, max=8)
    exported = torch.export.export(model, (torch.rand(2, 4, 3, 4, 5),), dynamic_shapes=({0: batch},))
    x = torch.rand(5, 4, 3, 4, 5)
    assert_close_rel(exported.module()(x), reference(x.double()), 1e-5)


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript_exporter", "dynamo_exporter"])
@pytest.mark.parametrize("unbatched", [False, True])
def test_onnx_export_writes_convtranspose(dynamo, unbatched):
    """torch.onnx.export, both exporters: ONNX has no convt3d op, so the exported graph holds ONNX's ConvTranspose
    (PyTorch's own op recorded in convt3d's place; before, both exporters failed on convt3d::conv_transpose3d), and
    onnxruntime runs it on a fresh input against float64. The model has run eager calls first (bound forwards)."""
    onnx = pytest.importorskip("onnx")
    onnxruntime = pytest.importorskip("onnxruntime")
    if dynamo:
        pytest.importorskip("onnxscript")
    import io
    import warnings

    model, reference = eager_called_models()
    example = torch.rand(2, 4, 3, 4, 5)[0 if unbatched else slice(None)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation, the dynamo exporter's notes
        if dynamo:
            proto = torch.onnx.export(model, (example,), dynamo=True, verbose=False).model_proto
        else:
            buffer = io.BytesIO()
            torch.onnx.export(model, (example,), buffer, dynamo=False)
            proto = onnx.load_from_string(buffer.getvalue())
    assert [node.op_type for node in proto.graph.node if node.op_type.startswith("Conv")] == ["ConvTranspose"] * 2
    assert all(node.domain in ("", "ai.onnx") for node in proto.graph.node)
    session = onnxruntime.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    x = torch.randn(example.shape)
    (actual,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    assert_close_rel(torch.from_numpy(actual), reference(x.double()), 1e-5)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _model():
    torch.manual_seed(0)
    return nn.Sequential(convt3d.ConvTranspose3d(2, 3, 3, stride=2, padding=1), nn.Tanh(),
                         convt3d.ConvTranspose3d(3, 1, 2, stride=(1, 2, 2)))


def _ddp_worker(rank, world, port, data, result_path):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        model = nn.parallel.DistributedDataParallel(_model())
        x, target = data
        shard = slice(rank * len(x) // world, (rank + 1) * len(x) // world)
        F.mse_loss(model(x[shard]), target[shard]).backward()
        if rank == 0:
            torch.save([p.grad for p in model.parameters()], result_path)
    finally:
        dist.destroy_process_group()
    # Leave without running C++ static destructors: at a normal exit a worker aborted in about one run of ten
    # here ("terminate called without an active exception"), after its work was done and saved.
    os._exit(0)


def test_ddp_gradients_match_single_process(tmp_path):
    torch.manual_seed(1)
    x = torch.randn(4, 2, 3, 3, 3)
    reference = _model()
    target = torch.randn_like(reference(x))
    F.mse_loss(reference(x), target).backward()
    path = tmp_path / "grads.pt"
    mp.spawn(_ddp_worker, args=(2, _free_port(), (x, target), str(path)), nprocs=2, join=True)
    for got, want in zip(torch.load(path), (p.grad for p in reference.parameters())):
        assert_close_rel(got, want, 1e-5, "DDP gradient")
