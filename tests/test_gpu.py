"""GPU tests of the fused Triton forward (marked `gpu`, skipped without CUDA)."""

import gc
import os
import socket
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

import convt3d
from conftest import assert_autocast_call_matches, assert_close_rel, assert_compiled_calls_match
from convt3d.backends import cuda
from convt3d.backends.cuda import phases as cuda_phases
from convt3d.backends.torch_phase import (_backward_phases, _lattice_geometry, _regions, aten_phase_backward,
                                         phase_grad_input)
from convt3d.plan import make_plan
from test_cuda_phases import LAYERS as CUDA_PHASE_LAYERS, _layer as cuda_phase_layer
from test_cuda_phases import round_tf32, row_aligned as cuda_phase_row_aligned

pytestmark = pytest.mark.gpu

P77 = dict(stride=2, padding=1, dilation=2)


def _p77_layer():
    return torch.nn.ConvTranspose3d(32, 64, 3, bias=False, **P77).cuda()


def _reference(x, weight, **kwargs):
    return F.conv_transpose3d(x.double(), weight.double(), None, **kwargs)


@pytest.mark.parametrize("tf32", [True, False])
def test_problem_77_full_shape(tf32, nan_poisoned_allocator):
    eager = _p77_layer()
    for _ in range(5):
        x = torch.rand(16, 32, 16, 32, 32, device="cuda")
        with torch.backends.cudnn.flags(enabled=True, allow_tf32=tf32):
            ours = convt3d.conv_transpose3d(x, eager.weight, None, backend="triton", **P77)
            expected = eager(x)
        assert not torch.isnan(ours).any()
        err = assert_close_rel(ours, _reference(x, eager.weight, **P77), 1e-3 if tf32 else 1e-6)
        if tf32:
            # KernelBench's check against the eager module in its default (TF32) mode.
            assert torch.allclose(ours, expected, atol=1e-4, rtol=1e-4), err
        else:
            assert err <= 1e-6


def test_repeated_calls_are_bitwise_identical():
    eager = _p77_layer()
    x = torch.rand(4, 32, 16, 32, 32, device="cuda")
    first = convt3d.conv_transpose3d(x, eager.weight, None, backend="triton", **P77)
    for _ in range(3):
        assert torch.equal(convt3d.conv_transpose3d(x, eager.weight, None, backend="triton", **P77), first)


def test_output_over_2_pow_31_elements():
    batch = 2**31 // (64 * 33 * 65 * 65) + 2  # 8.9M outputs per sample
    x = torch.rand(batch, 32, 16, 32, 32, device="cuda")
    weight = torch.randn(32, 64, 3, 3, 3, device="cuda") * 0.05
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        y = convt3d.conv_transpose3d(x, weight, None, backend="triton", **P77)
    assert y.numel() > 2**31
    for n in (0, batch // 2, batch - 1):  # the far end exercises 64-bit offsets
        assert_close_rel(y[n : n + 1], _reference(x[n : n + 1], weight, **P77), 1e-6, f"sample {n}")


@pytest.mark.parametrize("dtype, rel", [(torch.float16, 2e-3), (torch.bfloat16, 1.5e-2)])
def test_half_precision_and_bias(dtype, rel):
    layer = torch.nn.ConvTranspose3d(48, 24, 4, stride=2, padding=1).cuda().to(dtype)
    x = torch.randn(3, 48, 9, 10, 11, device="cuda", dtype=dtype)
    y = convt3d.conv_transpose3d(x, layer.weight, layer.bias, stride=2, padding=1, backend="triton")
    ref = F.conv_transpose3d(x.double(), layer.weight.double(), layer.bias.double(), stride=2, padding=1)
    assert y.dtype == dtype
    assert_close_rel(y, ref, rel)


def test_auto_picks_triton_on_cuda_and_matches_module():
    layer = torch.nn.ConvTranspose3d(16, 8, 3, stride=2, padding=1, output_padding=1, groups=2).cuda()
    ours = convt3d.convert(torch.nn.ConvTranspose3d(16, 8, 3, stride=2, padding=1, output_padding=1, groups=2).cuda())
    ours.load_state_dict(layer.state_dict())
    x = torch.randn(2, 16, 5, 6, 7, device="cuda")
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        expected = F.conv_transpose3d(x.double(), layer.weight.double(), layer.bias.double(), 2, 1, 1, 2)
        assert_close_rel(ours(x), expected, 1e-6)


@pytest.mark.parametrize("tf32", [False, True], ids=["tf32_off", "tf32"])
@pytest.mark.parametrize("kernel_size, stride, padding, output_padding", [(3, 2, 1, 1), (2, 2, 0, 0)],
                         ids=["general", "tiled"])
def test_module_binds_its_later_calls_to_the_prepared_call(kernel_size, stride, padding, output_padding, tf32,
                                                           nan_poisoned_allocator):
    """A module's calls after its first (ops.BoundForward): fresh inputs into NaN-poisoned memory, against float64 and
    bitwise against the full way's result on the same kernels; under grad mode the same gradients as eager's."""
    from convt3d import ops

    eager = torch.nn.ConvTranspose3d(16, 8, kernel_size, stride=stride, padding=padding,
                                     output_padding=output_padding).cuda()
    layer = convt3d.convert(torch.nn.ConvTranspose3d(16, 8, kernel_size, stride=stride, padding=padding,
                                                     output_padding=output_padding).cuda(), backend="triton")
    layer.load_state_dict(eager.state_dict())
    args = dict(stride=stride, padding=padding, output_padding=output_padding)
    rel = 2e-3 if tf32 else 1e-6  # (TF32 keeps 11 significant bits)
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=tf32):
        with torch.no_grad():
            layer(torch.rand(2, 16, 5, 6, 7, device="cuda"))
            assert any(isinstance(f, ops.BoundForward) for f in layer._bound_forwards.values())
            for _ in range(3):
                x = torch.rand(2, 16, 5, 6, 7, device="cuda")
                out = layer(x)
                assert_close_rel(out, F.conv_transpose3d(x.double(), layer.weight.double(), layer.bias.double(),
                                                         **args), rel)
                full = convt3d.conv_transpose3d(x, layer.weight, layer.bias, backend="triton", **args)
                assert torch.equal(out, full)
        x = torch.rand(2, 16, 5, 6, 7, device="cuda", requires_grad=True)
        grad = torch.randn_like(eager(x))
        expected = torch.autograd.grad(eager(x), (x, eager.weight, eager.bias), grad)
        actual = torch.autograd.grad(layer(x), (x, layer.weight, layer.bias), grad)
    for a, e in zip(actual, expected):
        assert_close_rel(a, e, 1e-5 if not tf32 else 2e-3)


@pytest.mark.parametrize("tf32", [False, True], ids=["tf32_off", "tf32"])
def test_two_layers_prepared_calls_share_one_operands_buffer(tf32, nan_poisoned_allocator):
    """Two Triton layers of different sizes called in turn (as a decoder calls its layers) through their prepared
    calls: one operands' buffer is kept for the stream and thread (forward._kept_operands), the larger layer's
    operands growing it, and each layer's outputs on fresh inputs, written into NaN-poisoned memory, are bitwise its
    full way's and within TF32's or float32's accuracy of float64."""
    from convt3d.backends.triton import forward

    shapes = [((16, 8, 3, 2, 1, 1), (2, 16, 5, 6, 7)), ((32, 16, 4, 2, 1, 0), (1, 32, 6, 9, 10))]
    layers = [convt3d.convert(torch.nn.ConvTranspose3d(c_in, c_out, k, stride=s, padding=p, output_padding=op),
                              backend="triton").cuda() for (c_in, c_out, k, s, p, op), _ in shapes]
    rel = 2e-3 if tf32 else 1e-6  # (TF32 keeps 11 significant bits)
    forward._kept_operands.clear()
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=tf32), torch.no_grad():
        for layer, (_, x_shape) in zip(layers, shapes):
            layer(torch.rand(x_shape, device="cuda"))  # (the full way, which binds the prepared call)
        for _ in range(3):
            for layer, (_, x_shape) in zip(layers, shapes):
                x = torch.rand(x_shape, device="cuda")
                args = dict(stride=layer.stride, padding=layer.padding, output_padding=layer.output_padding)
                out = layer(x)
                assert torch.equal(out, convt3d.conv_transpose3d(x, layer.weight, layer.bias, backend="triton",
                                                                 **args))
                assert_close_rel(out, F.conv_transpose3d(x.double(), layer.weight.double(), layer.bias.double(),
                                                         **args), rel)
    assert len(forward._kept_operands) == 1, forward._kept_operands


@pytest.mark.parametrize("tf32", [False, True], ids=["tf32_off", "tf32"])
@pytest.mark.parametrize("kernel_size, padding, dilation, bias, c_out",
                         [(3, 1, 2, False, 16), (3, 1, 2, True, 16), (4, 1, 1, True, 16), (3, 1, 2, True, 64)],
                         ids=["p77_like", "p77_like_bias", "k4s2p1", "row_runs_reading_the_input"])
def test_module_binds_its_later_calls_to_the_cuda_phase_path(kernel_size, padding, dilation, bias, c_out, tf32,
                                                             nan_poisoned_allocator):
    """backend="torch" by the CUDA phase correlation (one phase and a fill; eight phases, no fill; row_runs.py's
    kernel reading the input itself): the module's later calls go to torch_phase's prepared call. Fresh inputs into
    NaN-poisoned memory, against float64 and bitwise against the full way; an input 4 bytes off 16-byte alignment
    takes the full way; gradients as eager's."""
    from convt3d import ops
    from convt3d.backends import torch_phase

    args = dict(stride=2, padding=padding, dilation=dilation)
    eager = torch.nn.ConvTranspose3d(32, c_out, kernel_size, bias=bias, **args).cuda()
    layer = convt3d.convert(torch.nn.ConvTranspose3d(32, c_out, kernel_size, bias=bias, **args).cuda(),
                            backend="torch")
    layer.load_state_dict(eager.state_dict())
    shape = (2, 32, 5, 6, 7)
    reference = lambda x: F.conv_transpose3d(x.double(), layer.weight.double(),
                                             None if layer.bias is None else layer.bias.double(), **args)
    rel = 2e-3 if tf32 else 1e-6  # (TF32 keeps 11 significant bits)
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=tf32):
        with torch.no_grad():
            layer(torch.rand(shape, device="cuda"))
            (bound,) = layer._bound_forwards.values()
            assert isinstance(bound, ops.BoundForward)
            assert any(run is bound.run for run in torch_phase._prepared.values())
            for _ in range(3):
                x = torch.rand(shape, device="cuda")
                out = layer(x)
                assert_close_rel(out, reference(x), rel)
                plan = make_plan(shape, tuple(layer.weight.shape), **args)
                assert torch.equal(out, torch_phase.by_phases(x, layer.weight, layer.bias, plan))
            flat = torch.rand(x.numel() + 1, device="cuda")
            misaligned = flat[1:].view(shape)
            assert misaligned.data_ptr() % 16 and misaligned.is_contiguous()
            assert_close_rel(layer(misaligned), reference(misaligned), rel)
        x = torch.rand(shape, device="cuda", requires_grad=True)
        grad = torch.randn_like(eager(x))
        params = [p for p in (eager.weight, eager.bias) if p is not None]
        expected = torch.autograd.grad(eager(x), (x, *params), grad)
        actual = torch.autograd.grad(layer(x), (x, *[p for p in (layer.weight, layer.bias) if p is not None]), grad)
    for a, e in zip(actual, expected):
        assert_close_rel(a, e, 1e-5 if not tf32 else 2e-3)


@pytest.mark.parametrize("tf32", [False, True], ids=["tf32_off", "tf32"])
def test_phase_backend_runs_its_prepared_call_after_the_first(tf32, nan_poisoned_allocator, monkeypatch):
    """backend="torch" called as a function: after a call that the CUDA phase correlation served, the layer's calls
    run its prepared call, not the full way (by_phases): fresh inputs into NaN-poisoned memory, bitwise the full way's
    result and against float64. A change of the CUDA kernels' precision setting reaches the next call."""
    from convt3d.backends import torch_phase

    full_calls = []
    by_phases = torch_phase.by_phases
    monkeypatch.setattr(torch_phase, "by_phases", lambda *a: full_calls.append(1) or by_phases(*a))
    monkeypatch.setattr(torch_phase, "_prepared", {})
    args = dict(stride=2, padding=1, dilation=2)
    w, b = torch.randn(32, 16, 3, 3, 3, device="cuda") * 0.05, torch.randn(16, device="cuda")
    shape = (2, 32, 5, 6, 7)
    plan = make_plan(shape, tuple(w.shape), **args)
    rel = 2e-3 if tf32 else 1e-6  # (TF32 keeps 11 significant bits)
    setting = "TF32_SPLIT" if tf32 else "SPLIT"
    current = getattr(cuda, setting)
    other = {"TF32_SPLIT": {0: 3, 3: 0}, "SPLIT": {1: 2, 2: 1}}[setting][current]  # (FP16 or TF32; 3xFP16 or 3xTF32)
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=tf32), torch.no_grad():
        for split in (current, other):
            monkeypatch.setattr(cuda, setting, split)
            for call in range(3):
                x = torch.rand(shape, device="cuda")
                out = convt3d.conv_transpose3d(x, w, b, backend="torch", **args)
                assert_close_rel(out, F.conv_transpose3d(x.double(), w.double(), b.double(), **args), rel)
                if call:
                    assert torch.equal(out, by_phases(x, w, b, plan))
            assert len(full_calls) == 1, f"{setting} {split}: {len(full_calls)} calls the full way"
            full_calls.clear()


def test_compile_fullgraph_on_gpu():
    torch._dynamo.reset()
    model = torch.nn.Sequential(convt3d.ConvTranspose3d(8, 4, 3, stride=2, padding=1), torch.nn.ReLU()).cuda()
    x = torch.randn(2, 8, 4, 5, 6, device="cuda")
    compiled = torch.compile(model, fullgraph=True)
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        assert_close_rel(compiled(x), model(x), 1e-6)


@pytest.mark.parametrize("backend", ["auto", "torch", "triton"])
@pytest.mark.parametrize("dtype, stride, output_padding, dilation", [
    (torch.float32, 2, 1, 1),  # cuDNN: channels-last kept
    (torch.float32, 1, 1, 2),  # output_padding >= stride: PyTorch's slow kernel, a contiguous output
    (torch.float64, 2, 1, 1),  # cuDNN takes float64 contiguous
])
def test_channels_last_input_gives_pytorchs_layout_on_gpu(dtype, stride, output_padding, dilation, backend):
    if backend == "triton" and dtype == torch.float64:
        pytest.skip("the Triton backend computes float32 and half precision")
    x = torch.randn(2, 16, 4, 5, 6, device="cuda", dtype=dtype).to(memory_format=torch.channels_last_3d)
    w = torch.randn(16, 8, 3, 3, 3, device="cuda", dtype=dtype)
    b = torch.randn(8, device="cuda", dtype=dtype)
    args = (stride, 1, output_padding, 1, dilation)
    with torch.backends.cudnn.flags(allow_tf32=False):
        expected = F.conv_transpose3d(x, w, b, *args)
        actual = convt3d.conv_transpose3d(x, w, b, *args, backend=backend)
    assert actual.stride() == expected.stride()
    assert_close_rel(actual, F.conv_transpose3d(x.double(), w.double(), b.double(), *args), 1e-6)


def test_gradients_match_eager_on_gpu():
    layer = torch.nn.ConvTranspose3d(8, 6, 3, stride=2, padding=1, groups=2).cuda()
    ours = convt3d.convert(torch.nn.ConvTranspose3d(8, 6, 3, stride=2, padding=1, groups=2).cuda())
    ours.load_state_dict(layer.state_dict())
    x = torch.randn(2, 8, 4, 5, 6, device="cuda", requires_grad=True)
    grad = torch.randn_like(layer(x))
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        expected = torch.autograd.grad(layer(x), (x, layer.weight, layer.bias), grad)
        actual = torch.autograd.grad(ours(x), (x, ours.weight, ours.bias), grad)
    for a, e in zip(actual, expected):
        assert_close_rel(a, e, 1e-5)


@pytest.mark.parametrize("backend", ["eager", "auto"])
def test_eager_kernel_under_autograd_on_gpu(backend, monkeypatch):
    """A forward by eager's kernel (named, or chosen by "auto") with inputs that require grad: recorded by PyTorch's
    own node where the backward would be aten's (ops._eager_autograd_serves), by convt3d's where the backward by
    phases serves (a dilated layer); output and gradients as nn.ConvTranspose3d's either way."""
    monkeypatch.setattr(convt3d.functional, "choose_backend", lambda *a: "eager")
    for dilation, atens_node in ((1, True), (2, False)):
        torch.manual_seed(dilation)
        layer = torch.nn.ConvTranspose3d(8, 6, 3, stride=2, padding=1, dilation=dilation).cuda()
        ours = convt3d.convert(torch.nn.ConvTranspose3d(8, 6, 3, stride=2, padding=1, dilation=dilation).cuda(),
                               backend=backend)
        ours.load_state_dict(layer.state_dict())
        x = torch.randn(2, 8, 4, 5, 6, device="cuda", requires_grad=True)
        with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
            expected, y = layer(x), ours(x)
            assert (type(y.grad_fn) is type(expected.grad_fn)) == atens_node, (dilation, type(y.grad_fn))
            # (Not bitwise: cuDNN's transposed convolution may sum with atomics, two calls differing in the last bit.)
            assert_close_rel(y, expected, 1e-6)
            grad = torch.randn_like(y)
            actual = torch.autograd.grad(y, (x, ours.weight, ours.bias), grad)
            wanted = torch.autograd.grad(expected, (x, layer.weight, layer.bias), grad)
        for a, e in zip(actual, wanted):
            assert_close_rel(a, e, 1e-5)


def test_cuda_graph_capture_and_replay():
    layer = convt3d.ConvTranspose3d(8, 4, 3, stride=2, padding=1).cuda()
    x = torch.randn(2, 8, 4, 5, 6, device="cuda")
    with torch.no_grad():
        layer(x)  # first call: backend timing and autotuning happen outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = layer(x)
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
            expected = layer(x)
    assert_close_rel(y, expected, 1e-3)


@pytest.mark.parametrize("tf32", [False, True], ids=["tf32_off", "tf32"])
@pytest.mark.parametrize("kernel_size, stride, padding, output_padding", [(3, 2, 1, 1), (2, 2, 0, 0)],
                         ids=["general", "tiled"])
def test_triton_forward_replays_in_a_cuda_graph(kernel_size, stride, padding, output_padding, tf32):
    """The Triton forward's operand pass and main kernel (on Hopper launched as the pass's dependent) captured in a
    CUDA graph and replayed on new inputs: against float64 each time. In TF32 mode the general kernel's pass is
    tensor_scaled's cooperative one, whose sync words the capture gets for itself (TF32 keeps 11 significant bits)."""
    layer = convt3d.convert(torch.nn.ConvTranspose3d(16, 8, kernel_size, stride=stride, padding=padding,
                                                     output_padding=output_padding).cuda(), backend="triton")
    x = torch.rand(2, 16, 5, 6, 7, device="cuda")
    args = dict(stride=stride, padding=padding, output_padding=output_padding)
    with torch.no_grad(), torch.backends.cudnn.flags(enabled=True, allow_tf32=tf32):
        layer(x)  # first call: autotuning outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = layer(x)
        for _ in range(2):
            x.copy_(torch.rand_like(x))
            graph.replay()
            torch.cuda.synchronize()
            assert_close_rel(y, F.conv_transpose3d(x.double(), layer.weight.double(), layer.bias.double(), **args),
                             2e-3 if tf32 else 1e-6)


def test_phase_backward_inside_a_cuda_graph():
    """A training step through the phase backward (Triton grad_weight, cuDNN grad_input) captured whole and
    replayed on a new input: the gradients equal eager PyTorch's."""
    layer = torch.nn.ConvTranspose3d(8, 4, 3, stride=2, padding=1, dilation=2).cuda()  # one phase: 91% empty
    ours = convt3d.convert(torch.nn.ConvTranspose3d(8, 4, 3, stride=2, padding=1, dilation=2).cuda())
    ours.load_state_dict(layer.state_dict())
    x = torch.randn(2, 8, 4, 5, 6, device="cuda", requires_grad=True)
    grad = torch.randn(2, 4, 9, 11, 13, device="cuda")
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        warmup = torch.cuda.Stream()  # as PyTorch's docs ask before capturing a backward
        warmup.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(warmup):
            for _ in range(2):
                x.grad = ours.weight.grad = ours.bias.grad = None
                ours(x).backward(grad)
        torch.cuda.current_stream().wait_stream(warmup)
        x.grad = ours.weight.grad = ours.bias.grad = None
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            ours(x).backward(grad)
        with torch.no_grad():
            x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        expected = torch.autograd.grad(layer(x), (x, layer.weight, layer.bias), grad)
    for actual, e in zip((x.grad, ours.weight.grad, ours.bias.grad), expected):
        assert_close_rel(actual, e, 1e-5)


@pytest.mark.parametrize("tf32", [True, False])
def test_problem_77_phase_backend_writes_every_element(tf32, nan_poisoned_allocator):
    """backend="torch" on problem 77: the filled output, then the phase written into it (by the CUDA phase correlation
    on an sm_90 GPU, in TF32 or with TF32 off in 3xFP16; else cuDNN's result copied in)."""
    eager = _p77_layer()
    x = torch.rand(16, 32, 16, 32, 32, device="cuda")
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=tf32):
        ours = convt3d.conv_transpose3d(x, eager.weight, None, backend="torch", **P77)
        expected = eager(x)
    err = assert_close_rel(ours, _reference(x, eager.weight, **P77), 1e-3 if tf32 else 1e-6)
    assert torch.allclose(ours, expected, atol=1e-4, rtol=1e-4), err


@pytest.mark.parametrize("tf32", [True, False], ids=["fp16", "3xfp16"])
def test_a_k3s2_layers_first_call_compiles_its_kernels_in_threads(tf32, nan_poisoned_allocator, monkeypatch,
                                                                  tmp_path):
    """A k3 s2 layer's first call by the phase path (64 -> 32 channels, eight phases, one kernel each): the check
    compiles the eight kernels with NVRTC in worker threads (cuda.compiled_together), none on the calling thread, which
    loads them, and those kernels write the output, within TF32's or float32's accuracy of float64. (An empty disk
    cache: kernels kept there are not compiled.)"""
    import threading

    from convt3d.backends import torch_phase

    nvrtc_compile = torch.cuda._utils._nvrtc_compile
    compiles = []  # (on the calling thread, kernel name)

    def recorded(source, name, *args, **kwargs):
        compiles.append((threading.get_ident() == threading.main_thread().ident, name))
        return nvrtc_compile(source, name, *args, **kwargs)

    def forget_kernels():  # (so that the layer's kernels are compiled anew)
        for cache in (cuda._kernel, cuda._row_runs_kernel, cuda.tile_rows, cuda.phase_launches,
                      cuda_phases._kernels_unsupported, cuda_phases._forward_geometry, cuda_phases._forward_launches,
                      cuda_phases._reads_input):
            cache.cache_clear()
        cuda._compiled.clear()
        torch_phase._prepared.clear()

    monkeypatch.setattr(torch.cuda._utils, "_nvrtc_compile", recorded)
    monkeypatch.setattr(cuda, "CACHE_DIR", str(tmp_path))
    x = torch.randn(2, 64, 4, 8, 12, device="cuda")
    w = torch.randn(64, 32, 3, 3, 3, device="cuda") * 0.05
    b = torch.randn(32, device="cuda")
    args = dict(stride=2, padding=1, output_padding=1)
    forget_kernels()
    try:
        with torch.backends.cudnn.flags(enabled=True, allow_tf32=tf32):
            ours = convt3d.conv_transpose3d(x, w, b, backend="torch", **args)
    finally:
        forget_kernels()  # (no later test gets kernels compiled through the recorder)
    assert compiles and all(not on_main and name == "phase_conv" for on_main, name in compiles), compiles
    assert len(compiles) == 8
    assert_close_rel(ours, F.conv_transpose3d(x.double(), w.double(), b.double(), **args), 1e-3 if tf32 else 1e-6)


_CACHED_KERNELS_SCRIPT = """
import hashlib, sys, time
import torch, torch.nn.functional as F
import convt3d
from convt3d.backends import cuda

compiles = []
nvrtc_compile = torch.cuda._utils._nvrtc_compile
torch.cuda._utils._nvrtc_compile = lambda *args, **kwargs: compiles.append(args[1]) or nvrtc_compile(*args, **kwargs)
torch.manual_seed(int(sys.argv[1]))
x = torch.randn(2, 64, 4, 8, 12, device="cuda")
w = torch.randn(64, 32, 3, 3, 3, device="cuda") * 0.05
args = dict(stride=2, padding=1, output_padding=1)
start = time.perf_counter()
with torch.backends.cudnn.flags(enabled=True, allow_tf32=sys.argv[2] == "tf32"):
    y = convt3d.conv_transpose3d(x, w, backend="torch", **args)
torch.cuda.synchronize()
seconds = time.perf_counter() - start
error = ((y.double() - F.conv_transpose3d(x.double(), w.double(), **args)).norm() / y.double().norm()).item()
print(len(compiles), len(cuda._compiled), hashlib.sha256(y.cpu().numpy().tobytes()).hexdigest(), error, seconds)
"""


@pytest.mark.parametrize("tf32", [True, False], ids=["fp16", "3xfp16"])
def test_a_later_process_loads_the_kernels_from_the_disk_cache(tf32, tmp_path):
    """Two processes in turn run a k3 s2 layer's first call (eight kernels) with one CONVT3D_CACHE_DIR: the first
    compiles them by NVRTC and writes them there; the second compiles none, loads them, and its output is the
    first's bitwise (the same kernels ran, not cuDNN), within TF32's or float32's accuracy of float64."""
    import subprocess
    import sys

    env = dict(os.environ, CONVT3D_CACHE_DIR=str(tmp_path / "kernels"))
    seed, mode = str(torch.randint(2**31, ()).item()), "tf32" if tf32 else "strict"
    runs = []
    for _ in range(2):
        result = subprocess.run([sys.executable, "-c", _CACHED_KERNELS_SCRIPT, seed, mode], env=env,
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr
        compiles, kernels, digest, error, seconds = result.stdout.split()
        runs.append((int(compiles), int(kernels), digest, float(error), float(seconds)))
    (first_compiles, first_kernels, first_digest, error, _), (compiles, kernels, digest, _, _) = runs
    assert first_compiles == first_kernels == kernels == 8 and len(os.listdir(tmp_path / "kernels")) == 8, runs
    assert compiles == 0 and digest == first_digest, runs
    assert error < (1e-3 if tf32 else 1e-6), runs


@pytest.mark.parametrize("tf32", [True, False], ids=["fp16", "3xfp16"])
@pytest.mark.parametrize("bias", [False, True])
def test_row_runs_kernel_serves_problem_77_as_phase_conv_would(tf32, bias, nan_poisoned_allocator, monkeypatch):
    """Problem 77's geometry at batch 2 with backend="torch": row_runs.py's kernel is what runs (in FP16, TF32 mode,
    and 3xFP16), in FP16 reading the input itself (cuda.DIRECT_INPUT) or the operand pass's window, and its outputs,
    written into NaN-poisoned memory, are the same bitwise (the same values reach the same MMAs), phase_conv.py's
    bitwise in FP16 (the same MMAs in the same order; unless row_runs.PLANE_MAXIMA scales each plane by its own
    maximum) and within float32's accuracy of float64 in 3xFP16 (its partial sums span more k-steps)."""
    from convt3d.backends import torch_phase

    built = []  # (whether it reads the input, kernel) of each row_runs.py kernel asked for
    row_runs_kernel = cuda._row_runs_kernel.__wrapped__

    def recorded(*args):
        built.append((len(args) > 7 and args[7] is not None, row_runs_kernel(*args)))
        return built[-1][1]

    monkeypatch.setattr(cuda, "_row_runs_kernel", recorded)
    x = torch.rand(2, 32, 16, 32, 32, device="cuda")
    w = torch.randn(32, 64, 3, 3, 3, device="cuda") * 0.05
    b = torch.randn(64, device="cuda") if bias else None
    outputs = []

    def forget_launches():  # (worked out once per layer, with the kernel that cuda.ROW_RUNS chose)
        for cache in (cuda.tile_rows, cuda.phase_launches, cuda_phases._forward_geometry,
                      cuda_phases._forward_launches, cuda_phases._reads_input, cuda_phases._kernels_unsupported):
            cache.cache_clear()
        torch_phase._prepared.clear()

    try:
        with torch.backends.cudnn.flags(enabled=True, allow_tf32=tf32):
            for row_runs, direct_input in ((True, True), (True, False), (False, False)):
                monkeypatch.setattr(cuda, "ROW_RUNS", row_runs)
                monkeypatch.setattr(cuda, "DIRECT_INPUT", direct_input)
                forget_launches()
                outputs.append(convt3d.conv_transpose3d(x, w, b, backend="torch", **P77))
            expected = F.conv_transpose3d(x, w, b, **P77)
    finally:
        forget_launches()  # (no later test gets this one's launches by phase_conv.py's kernel)
    # (Reading the input serves FP16 alone: cuda.reads_input.)
    assert {direct for direct, _ in built} == ({True, False} if tf32 else {False})
    assert all(kernel is not None for _, kernel in built)
    reference = F.conv_transpose3d(x.double(), w.double(), None if b is None else b.double(), **P77)
    err = assert_close_rel(outputs[0], reference, 1e-3 if tf32 else 1e-6)
    assert torch.allclose(outputs[0], expected, atol=1e-4, rtol=1e-4), err
    assert torch.equal(outputs[0], outputs[1])
    if tf32 and not cuda.row_runs.PLANE_MAXIMA:
        assert torch.equal(outputs[0], outputs[2])
    else:  # (row_runs.PLANE_MAXIMA: its planes scaled each by its own maximum, phase_conv.py's all by theirs)
        assert_close_rel(outputs[2], reference, 1e-3 if tf32 else 1e-6)


@pytest.mark.parametrize("growth", [2.0 ** 8, 2.0 ** -8], ids=["rising", "falling"])
def test_problem_77_with_depth_planes_of_far_apart_magnitudes(growth, nan_poisoned_allocator):
    """Problem 77's geometry at batch 2 in TF32 mode (FP16 on scaled operands), each input depth plane growth times
    the one before (2^-64 to 2^56, or 2^64 to 2^-56): every output depth plane within TF32's accuracy of float64
    (1e-3 by its norm, as the TF32 tests above), though the three input planes that reach it lie 2^16 apart, and the
    correlation's sums meet planes of larger magnitude along its depth taps (one way or the other)."""
    x = torch.rand(2, 32, 16, 32, 32, device="cuda") * 2 - 1
    x = x * (growth ** (torch.arange(16, device="cuda") - 8.0)).view(1, 1, 16, 1, 1)
    w = torch.randn(32, 64, 3, 3, 3, device="cuda") * 0.05
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=True):
        out = convt3d.conv_transpose3d(x, w, None, backend="torch", **P77)
        out = convt3d.conv_transpose3d(x, w, None, backend="torch", **P77)  # (the prepared call)
    reference = F.conv_transpose3d(x.double(), w.double(), None, **P77)
    for d in range(1, out.shape[2], 2):  # (the planes no tap reaches hold zeros)
        assert_close_rel(out[:, :, d], reference[:, :, d], 1e-3, f"output depth plane {d}")
    assert not out[:, :, 0::2].any()


@pytest.mark.parametrize("tf32", [True, False], ids=["fp16", "3xfp16"])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("input_shape, padding", [((2, 32, 16, 32, 32), 1), ((3, 32, 5, 7, 9), 1),
                                                  ((3, 32, 5, 7, 9), 0)], ids=["p77", "partial_tiles", "unpadded"])
def test_region_fill_writes_what_the_fill_and_the_correlation_write(tf32, bias, input_shape, padding,
                                                                    nan_poisoned_allocator, monkeypatch):
    """cuda.REGION_FILL: row_runs.py's kernel fills the output around the layer's only phase itself (with the bias, or
    zero) rather than after a fill of the whole output. Into NaN-poisoned memory, its output is bitwise the default's,
    in the first call (by_phases) and in a prepared call after it alike, on problem 77's geometry at batch 2 and on
    sizes whose last depth, row block and column block are partial (an input of 5 x 7 x 9: a lattice of 5 x 7 x 9
    in an output of 11 x 15 x 19), and unpadded (a lattice of 7 x 9 x 11 from the first plane on, in an output of
    13 x 17 x 21). The whole output's fill (torch_phase._fill) runs in each default call and in no
    call with the switch on, so that a region kernel that did not compile (the forward then fills first) fails here."""
    from convt3d.backends import torch_phase

    x = torch.rand(*input_shape, device="cuda")
    w = torch.randn(32, 64, 3, 3, 3, device="cuda") * 0.05
    b = torch.randn(64, device="cuda") if bias else None
    layer = dict(P77, padding=padding)
    plan = make_plan(input_shape, tuple(w.shape), (2,) * 3, (padding,) * 3, (0,) * 3, 1, (2,) * 3)
    phase_list = tuple(phases for _, phases in _regions(plan, True) if phases is not None)
    outputs, fills = {}, []
    fill = torch_phase._fill
    monkeypatch.setattr(torch_phase, "_fill", lambda out, bias: (fills.append(out.shape), fill(out, bias)))
    try:
        with torch.backends.cudnn.flags(enabled=True, allow_tf32=tf32):
            for region_fill in (False, True):
                monkeypatch.setattr(cuda, "REGION_FILL", region_fill)
                torch_phase._prepared.clear()
                fills.clear()
                outputs[region_fill] = [convt3d.conv_transpose3d(x, w, b, backend="torch", **layer) for _ in range(2)]
                assert fills == ([] if region_fill else [outputs[False][0].shape] * 2)
            region = cuda_phases.region_fill(plan, phase_list, outputs[True][0].stride())
    finally:
        torch_phase._prepared.clear()  # (no later test gets this one's prepared calls)
    assert region == (plan.output_shape[2:], (2, 2, 2), (padding,) * 3)  # (the lattice: odd, or even unpadded)
    for default, filled in zip(outputs[False], outputs[True]):
        assert torch.equal(default, filled)
    reference = F.conv_transpose3d(x.double(), w.double(), None if b is None else b.double(), **layer)
    assert_close_rel(outputs[True][1], reference, 1e-3 if tf32 else 1e-6)


@pytest.mark.parametrize("tf32", [True, False])
def test_problem_77_gradients(tf32):
    """The CUDA backward by phases (grad_input by the CUDA phase correlation or cuDNN, Triton grad_weight) against
    float64 autograd."""
    layer = _p77_layer()
    ours = convt3d.convert(_p77_layer())
    ours.load_state_dict(layer.state_dict())
    x = torch.rand(4, 32, 16, 32, 32, device="cuda", requires_grad=True)
    grad = torch.randn(4, 64, 33, 65, 65, device="cuda")
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=tf32):
        actual = torch.autograd.grad(ours(x), (x, ours.weight), grad)
    x64, w64 = x.detach().double().requires_grad_(), layer.weight.detach().double().requires_grad_()
    expected = torch.autograd.grad(F.conv_transpose3d(x64, w64, None, **P77), (x64, w64), grad.double())
    for a, e in zip(actual, expected):
        assert_close_rel(a, e, 2e-3 if tf32 else 1e-5)


def _check_cuda_phase_correlation(x, w, b, plan, args, g, tf32: bool, rel: float):
    """Every forward phase by the CUDA phase correlation into a NaN-filled output (the regions no tap reaches filled
    with the bias), and each phase's grad_input from g where the kernel serves it, against float64 PyTorch to rel;
    skips where the kernel does not serve the forward. Runs in the precision mode it is given."""
    regions = _regions(plan, False)
    phase_list = tuple(phases for _, phases in regions if phases is not None)
    reason = cuda_phases.forward_unsupported(plan, phase_list, x.device, x.dtype, tf32)
    if reason is not None:
        pytest.skip(reason)
    out = torch.full(plan.output_shape, float("nan"), device="cuda")
    cuda_phases.write_phases(x, w, b, plan, phase_list, out, _lattice_geometry)
    for index, phases in regions:
        if phases is None:
            out[index] = b.view(1, -1, 1, 1, 1).expand_as(out[index])
    assert_close_rel(out, F.conv_transpose3d(x.double(), w.double(), b.double(), **args), rel, "forward")
    for phases, index in _backward_phases(plan):
        if cuda_phases.grad_input_unsupported(plan, phases, x.device, x.dtype, tf32) is None:
            ours = cuda_phases.phase_grad_input(g[index], w, plan, phases)
            assert_close_rel(ours, phase_grad_input(g[index].double(), w.double(), plan, phases), rel, "grad_input")


@pytest.fixture(params=["rows for the grid", "most rows"])
def tile_rule(request, monkeypatch):
    """Both tiles the CUDA correlation runs with: tile_rows' (fewer rows on the small grids of these layers) and
    config()'s most rows (as on large layers)."""
    if request.param == "most rows":
        monkeypatch.setattr(cuda, "FULL_GRID", 0)
    caches = (cuda.tile_rows, cuda_phases._forward_geometry, cuda_phases._forward_launches,
              cuda_phases._grad_input_geometry)
    for cache in caches:
        cache.cache_clear()
    yield
    for cache in caches:
        cache.cache_clear()


@pytest.mark.parametrize("layer", CUDA_PHASE_LAYERS)
@pytest.mark.parametrize("tf32_split", [0, 3], ids=["tf32", "fp16"])
def test_cuda_phase_correlation_kernel(layer, tf32_split, tile_rule, monkeypatch):
    """The CUDA kernels themselves (test_cuda_phases.py emulates them on the CPU) on their layers, in TF32 mode's two
    precisions: every forward phase into a NaN-filled output, each phase's grad_input and grad_weight, against float64
    PyTorch. The operands are TF32-exact, and so FP16-exact once scaled, so only the float32 sums differ (Hopper's
    tensor cores also truncate as they accumulate: 1e-5)."""
    monkeypatch.setattr(cuda, "TF32_SPLIT", tf32_split)
    x, w, b, plan, args = cuda_phase_layer(*layer, seed=torch.seed() % 2**31)
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=True):
        g = round_tf32(torch.randn(plan.output_shape, device="cuda"))
        _check_cuda_phase_correlation(x, w, b, plan, args, g, True, 1e-5)
        for phases, index in _backward_phases(plan):
            if cuda_phases.grad_weight_unsupported(plan, phases, x.device, x.dtype, True) is not None:
                continue
            offset, shape, strides = _lattice_geometry(plan, phases, g.stride())
            aligned = cuda_phase_row_aligned(x)  # (the kernel reads 16-byte aligned input rows)
            assert cuda.grad_weight_operands_unsupported(aligned, shape, strides) is None
            ours = cuda_phases.phase_grad_weight(g, offset, strides, aligned, plan, phases)
            _, expected = aten_phase_backward(g.double(), index, x.double(), w.double(), plan, phases, False, True)
            assert_close_rel(ours, expected, 1e-5, "grad_weight")


@pytest.mark.parametrize("layer", CUDA_PHASE_LAYERS)
@pytest.mark.parametrize("split", [1, 2], ids=["3xtf32", "3xfp16"])
def test_cuda_phase_correlation_kernel_with_tf32_off(layer, split, tile_rule, monkeypatch):
    """The CUDA phase correlation with TF32 off (3xTF32, 3xFP16) on operands that are not TF32-exact: every forward
    phase into a NaN-filled output and each phase's grad_input, against float64 PyTorch to float32's accuracy (TF32
    alone misses 1e-6 by two orders)."""
    monkeypatch.setattr(cuda, "SPLIT", split)
    x, w, b, plan, args = cuda_phase_layer(*layer, seed=torch.seed() % 2**31, tf32_exact=False)
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        g = torch.randn(plan.output_shape, device="cuda")
        _check_cuda_phase_correlation(x, w, b, plan, args, g, False, 1e-6)


@pytest.mark.parametrize("layer", [layer for layer in CUDA_PHASE_LAYERS if layer[0] == 32 and layer[1] % 64 == 0])
@pytest.mark.parametrize("view", ["contiguous", "cropped", "channels_last"])
def test_forward_reading_the_input_is_the_windows_bitwise(layer, view, monkeypatch):
    """row_runs.py's kernel reading the input itself (cuda.DIRECT_INPUT, FP16 in TF32 mode) writes the same output
    bitwise as reading the operand pass's window, into NaN-filled outputs, and TF32's accuracy against float64: on a
    contiguous input, on a view whose rows are contiguous but that starts 4 bytes past a row of a larger tensor (other
    strides, an unaligned start), and on a channels_last_3d input, which keeps the window, as does a layer whose grid
    is too wide for row_runs.py's kernel (cuda._row_runs_layer)."""
    split, tf32 = 3, True
    monkeypatch.setattr(cuda, "TF32_SPLIT", split)
    x, w, b, plan, args = cuda_phase_layer(*layer, seed=torch.seed() % 2**31, tf32_exact=False)
    if view == "cropped":
        larger = torch.randn(x.shape[0], x.shape[1] + 1, x.shape[2] + 1, x.shape[3] + 2, x.shape[4] + 3, device="cuda")
        larger[:, 1:, 1:, 2:, 3:] = x
        x = larger[:, 1:, 1:, 2:, 3:]
    elif view == "channels_last":
        x = x.to(memory_format=torch.channels_last_3d)
    phase_list = tuple(phases for _, phases in _regions(plan, True) if phases is not None)
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=tf32):
        reason = cuda_phases.forward_unsupported(plan, phase_list, x.device, x.dtype, tf32)
        if reason is not None:
            pytest.skip(reason)
        _, _, launches = cuda_phases._forward_geometry(plan, phase_list, split)
        row_runs_serves = all(cuda._row_runs_layer(32, plan.out_channels, split, grid) for _, _, grid, _ in launches)
        direct = cuda_phases._direct_input(x, plan, phase_list, split, True)
        assert (direct is None) == (view == "channels_last" or not row_runs_serves)
        outputs = []
        for direct_input in (True, False):
            monkeypatch.setattr(cuda, "DIRECT_INPUT", direct_input)
            out = torch.full(plan.output_shape, float("nan"), device="cuda")
            cuda_phases.write_phases(x, w, b, plan, phase_list, out, _lattice_geometry)
            outputs.append(out)
    written = ~outputs[0].isnan()  # (the regions no tap reaches: the fill's, not written here)
    assert torch.equal(written, ~outputs[1].isnan()) and torch.equal(outputs[0][written], outputs[1][written])
    reference = F.conv_transpose3d(x.double(), w.double(), b.double(), **args)
    expected = reference[written]
    error = (outputs[0][written].double() - expected).norm() / expected.norm()
    assert error <= 1e-3, error.item()  # (FP16 on scaled operands: TF32's 11 significant bits)


@pytest.mark.parametrize("layer", CUDA_PHASE_LAYERS[:3] + CUDA_PHASE_LAYERS[-3:])
@pytest.mark.parametrize("x_scale, w_scale", [(2.0**-40, 2.0**30), (2.0**30, 2.0**-40)])
@pytest.mark.parametrize("split", [2, 3], ids=["3xfp16", "fp16"])
def test_cuda_phase_correlation_in_fp16_scales_out_of_fp16_range(layer, x_scale, w_scale, split, monkeypatch):
    """3xFP16 (TF32 off) and FP16 (TF32 mode) scale the window and the weight by powers of two into FP16's range
    (2^-24 to 65504): operands far outside it on either side keep float32's accuracy (3xFP16) or TF32's (FP16: 11
    significant bits, as TF32's; 1e-3 against float64, as the TF32 tests above allow)."""
    tf32 = split == 3
    monkeypatch.setattr(cuda, "TF32_SPLIT" if tf32 else "SPLIT", split)
    x, w, b, plan, args = cuda_phase_layer(*layer, seed=torch.seed() % 2**31, tf32_exact=False)
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=tf32):
        g = torch.randn(plan.output_shape, device="cuda") * x_scale
        _check_cuda_phase_correlation(x * x_scale, w * w_scale, b * x_scale * w_scale, plan, args, g, tf32,
                                      1e-3 if tf32 else 1e-6)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
@pytest.mark.parametrize("backend", ["triton", "torch", "auto"])
def test_layer_on_another_gpu_than_the_current_one(backend):
    """A model on cuda:1 called while cuda:0 is current, as PyTorch allows: the Triton launches follow the tensors."""
    torch.cuda.set_device(0)
    layer = torch.nn.ConvTranspose3d(8, 6, 3, stride=2, padding=1, dilation=2).to("cuda:1")
    ours = convt3d.convert(torch.nn.ConvTranspose3d(8, 6, 3, stride=2, padding=1, dilation=2), backend).to("cuda:1")
    ours.load_state_dict(layer.state_dict())
    x = torch.rand(2, 8, 5, 6, 7, device="cuda:1", requires_grad=True)
    grad = torch.randn_like(layer(x))
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        expected = torch.autograd.grad(layer(x), (x, layer.weight, layer.bias), grad)
        out = ours(x)
        actual = torch.autograd.grad(out, (x, ours.weight, ours.bias), grad)
    assert out.device == torch.device("cuda:1") and torch.cuda.current_device() == 0
    for a, e in zip(actual, expected):
        assert_close_rel(a, e, 1e-5)
    # The CUDA phase backward called directly (as the registered op is), not through autograd's device thread.
    from convt3d import ops
    plan = ops.cached_plan(tuple(x.shape), tuple(layer.weight.shape), (2, 2, 2), (1, 1, 1), (0, 0, 0), 1, (2, 2, 2))
    if ops._cuda_phase_backward_serves(x, plan):
        with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
            grad_input, grad_weight = ops._cuda_phase_backward(grad, x.detach(), ours.weight.detach(), plan, True, True)
        assert_close_rel(grad_input, expected[0], 1e-5)
        assert_close_rel(grad_weight, expected[1], 1e-5)


def _dilated_model():
    torch.manual_seed(0)  # the same weights in every process
    return torch.nn.Sequential(convt3d.ConvTranspose3d(4, 6, 3, stride=2, padding=1, dilation=2), torch.nn.Tanh(),
                               convt3d.ConvTranspose3d(6, 2, 3, stride=2, padding=1))


def _nccl_worker(rank, world, port, data, result_path):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    torch.backends.cudnn.allow_tf32 = False
    dist.init_process_group("nccl", rank=rank, world_size=world)
    try:
        model = torch.nn.parallel.DistributedDataParallel(_dilated_model().cuda(rank), device_ids=[rank])
        x, target = (t.cuda(rank) for t in data)
        shard = slice(rank * len(x) // world, (rank + 1) * len(x) // world)
        F.mse_loss(model(x[shard]), target[shard]).backward()
        if rank == 0:
            torch.save([p.grad.cpu() for p in model.parameters()], result_path)
    finally:
        dist.destroy_process_group()
    os._exit(0)  # (as the CPU DDP test's worker: no C++ static destructors at exit)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_ddp_over_nccl_matches_single_gpu(tmp_path):
    """DistributedDataParallel on two GPUs with NCCL, as the README documents, against one process on one GPU; the
    first layer takes the CUDA phase backward (Triton grad_weight)."""
    torch.manual_seed(1)
    x = torch.rand(4, 4, 3, 4, 5)
    reference = _dilated_model().cuda()
    target = torch.randn(reference(x.cuda()).shape)
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        F.mse_loss(reference(x.cuda()), target.cuda()).backward()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    path = tmp_path / "grads.pt"
    mp.spawn(_nccl_worker, args=(2, port, (x, target), str(path)), nprocs=2, join=True)
    for got, want in zip(torch.load(path), (p.grad.cpu() for p in reference.parameters())):
        assert_close_rel(got, want, 1e-5, "DDP gradient")


def test_compile_fullgraph_training_step_on_gpu():
    torch._dynamo.reset()
    model = torch.nn.Sequential(convt3d.ConvTranspose3d(8, 4, 3, stride=2, padding=1, dilation=2), torch.nn.ReLU())
    model = model.cuda()
    x = torch.randn(2, 8, 4, 5, 6, device="cuda")
    compiled = torch.compile(model, fullgraph=True)
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        compiled(x).square().sum().backward()
        compiled_grad = model[0].weight.grad.clone()
        model.zero_grad()
        model(x).square().sum().backward()
    assert_close_rel(compiled_grad, model[0].weight.grad, 1e-6)


def test_compile_meets_new_shapes_and_channels_last_inputs_on_gpu():
    """Inductor on the GPU: a second input shape retraces with dynamic shapes (plans built uncached, the backward by
    aten's convolution_backward) and a channels-last input gives the output strides the eager call gives; forward
    and gradients of each call against a float64 nn.ConvTranspose3d model."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Sequential(convt3d.ConvTranspose3d(8, 6, 3, stride=2, padding=1, output_padding=1),
                                torch.nn.ReLU(), convt3d.ConvTranspose3d(6, 4, 2, stride=2)).cuda()
    reference = torch.nn.Sequential(torch.nn.ConvTranspose3d(8, 6, 3, stride=2, padding=1, output_padding=1),
                                    torch.nn.ReLU(), torch.nn.ConvTranspose3d(6, 4, 2, stride=2)).cuda().double()
    reference.load_state_dict(model.state_dict())
    compiled = torch.compile(model, fullgraph=True)
    inputs = [torch.rand(batch, 8, depth, 6, 7, device="cuda") for batch, depth in [(2, 3), (3, 5), (1, 4), (5, 2)]]
    inputs[2:] = [x.contiguous(memory_format=torch.channels_last_3d) for x in inputs[2:]]
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        assert_compiled_calls_match(compiled, model, reference, inputs)



@pytest.mark.parametrize("backend", ["auto", "torch", "triton"])
def test_autocast_on_gpu_computes_in_float16_as_pytorch(backend):
    """torch.autocast on CUDA (float16): output dtype as PyTorch's, values and gradients against float64 on the cast
    operands, the gradients in float32."""
    torch.manual_seed(0)
    x = torch.randn(2, 16, 4, 5, 6, device="cuda", requires_grad=True)
    w = torch.randn(16, 8, 3, 3, 3, device="cuda", requires_grad=True)
    b = torch.randn(8, device="cuda", requires_grad=True)
    assert_autocast_call_matches(x, w, b, (2, 1, 1), torch.float16, backend, 1e-3)


@pytest.mark.parametrize("precision", ["ieee", "tf32"])
@pytest.mark.parametrize("kernel_size, dilation", [(2, 1), (3, 2)])  # the tiled GEMM's layer, problem 77's geometry
def test_per_operator_tf32_setting_on_gpu(precision, kernel_size, dilation, nan_poisoned_allocator):
    """torch.backends.cudnn.conv.fp32_precision set apart from the RNNs' (PyTorch 2.9+) gives each backend the
    results that the legacy allow_tf32 flag of the same meaning gives: "ieee" float32 accuracy (the issue's 1e-6
    against float64), "tf32" TF32's rounding."""
    stride, padding = 2, 1 if kernel_size == 3 else 0
    torch.manual_seed(0)
    layer = torch.nn.ConvTranspose3d(32, 16, kernel_size, stride, padding, dilation=dilation).cuda()
    x = torch.rand(2, 32, 5, 9, 10, device="cuda")
    w, b = layer.weight.detach(), layer.bias.detach()
    args = (stride, padding, 0, 1, dilation)
    reference = F.conv_transpose3d(x.double(), w.double(), b.double(), *args)
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=precision == "tf32"):
        legacy = {backend: convt3d.conv_transpose3d(x, w, b, *args, backend=backend) for backend in ("torch", "triton")}
    conv, rnn = torch.backends.cudnn.conv, torch.backends.cudnn.rnn
    before = conv.fp32_precision, rnn.fp32_precision
    try:
        conv.fp32_precision = precision
        rnn.fp32_precision = "tf32" if precision == "ieee" else "ieee"
        for backend in ("auto", "torch", "triton"):
            actual = convt3d.conv_transpose3d(x, w, b, *args, backend=backend)
            error = assert_close_rel(actual, reference, 1e-6 if precision == "ieee" else 1e-3, backend)
            if backend in legacy:
                assert torch.equal(actual, legacy[backend]), backend
        if precision == "tf32":
            assert error > 1e-6, error  # the Triton kernel rounded as TF32 does: the setting reached it
    finally:
        conv.fp32_precision, rnn.fp32_precision = before


@pytest.mark.parametrize("backend", ["auto", "triton"])
def test_jit_trace_and_export_on_gpu(backend):
    """torch.jit.trace and torch.export on CUDA after eager calls, TF32 off: the traced and the exported model on a
    new batch size against a float64 nn.ConvTranspose3d model (the op dispatches to the GPU kernels)."""
    torch.manual_seed(0)
    model = convt3d.convert(torch.nn.ConvTranspose3d(16, 8, 3, stride=2, padding=1, output_padding=1), backend).cuda()
    reference = torch.nn.ConvTranspose3d(16, 8, 3, stride=2, padding=1, output_padding=1).cuda().double()
    reference.load_state_dict(model.state_dict())
    example, x = torch.rand(2, 16, 4, 6, 5, device="cuda"), torch.rand(3, 16, 4, 6, 5, device="cuda")
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        model(example)
        model(example)
        traced = torch.jit.trace(model, example)
        batch = torch.export.Dim("batch", min=1, max=8)
        exported = torch.export.export(model, (example,), dynamic_shapes=({0: batch},)).module()
        expected = reference(x.double())
        assert_close_rel(traced(x), expected, 1e-6, "traced")
        assert_close_rel(exported(x), expected, 1e-6, "exported")


@pytest.mark.parametrize("backend", ["auto", "triton"])
def test_transforms_and_fake_tensors_on_gpu(backend):
    """On CUDA tensors, TF32 off: torch.func's vmap, vmap of grad, jvp and jacrev through convt3d against the same
    transforms of F.conv_transpose3d in float64 (under vmap and jvp PyTorch's kernel runs, whatever the backend), and
    FakeTensorMode's CUDA tensors: the output's and gradients' shape, dtype, device and strides as PyTorch's."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    func = torch.func
    torch.manual_seed(0)
    args = dict(stride=2, padding=1, output_padding=1)
    x = torch.rand(2, 8, 4, 5, 6, device="cuda")
    w = torch.randn(8, 4, 3, 3, 3, device="cuda") * 0.2
    b = torch.randn(4, device="cuda")
    xs = torch.stack([x, torch.rand_like(x)])

    def transforms(fn, x, w, b, xs):
        loss = lambda x, w: fn(x, w, b).sin().sum()  # noqa: E731
        return {
            "vmap over x": func.vmap(lambda x: fn(x, w, b))(xs),
            "vmap of grad": func.vmap(func.grad(loss, argnums=(0, 1)), in_dims=(0, None))(xs, w),
            "jvp": func.jvp(lambda x: fn(x, w, b), (x,), (xs[1],))[1],
            "jacrev": func.jacrev(lambda w: fn(x, w, b).sum(dim=(0, 2, 3, 4)))(w),
        }

    ours = lambda x, w, b: convt3d.conv_transpose3d(x, w, b, **args, backend=backend)  # noqa: E731
    eager = lambda x, w, b: F.conv_transpose3d(x, w, b, **args)  # noqa: E731
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        got = transforms(ours, x, w, b, xs)
    expected = transforms(eager, x.double(), w.double(), b.double(), xs.double())
    for name in got:
        for got_part, expected_part in zip(*((got[name], expected[name]) if isinstance(got[name], tuple)
                                             else ((got[name],), (expected[name],)))):
            assert_close_rel(got_part, expected_part, 1e-5, name)

    def shapes(fn):
        xf = torch.empty(2, 8, 4, 5, 6, device="cuda").to(memory_format=torch.channels_last_3d).requires_grad_()
        wf = torch.empty(8, 4, 3, 3, 3, device="cuda", requires_grad=True)
        y = fn(xf, wf, None)
        y.sum().backward()
        return [(t.shape, t.dtype, t.device, t.stride()) for t in (y, xf.grad, wf.grad)]

    with FakeTensorMode():
        assert shapes(ours) == shapes(eager)


def test_bench_timer_flushes_the_l2_from_the_gpu():
    """time_cuda's flush buffer lives on the GPU while the calls run (until the fifth session it was allocated on
    the CPU, so its writes never reached the GPU's L2)."""
    from convt3d.bench.protocol import time_cuda

    flush_bytes = 64 * 1024 * 1024
    base = torch.cuda.memory_allocated()
    seen = []
    time_cuda(lambda: seen.append(torch.cuda.memory_allocated() - base), warmup=1, iters=3, flush_bytes=flush_bytes)
    assert len(seen) == 4 and min(seen) >= flush_bytes


def test_bench_timer_names_a_call_that_waited_for_the_host():
    """A timed call that stalls on the host shows among Timing.slow_calls with its host time about its CUDA time."""
    from convt3d.bench.protocol import time_cuda

    calls = []

    def stall_on_the_ninth():  # 5 warm-up calls, then the timed ones: the ninth call is timed call 3
        calls.append(None)
        if len(calls) == 9:
            time.sleep(0.005)

    slowest = time_cuda(stall_on_the_ninth, warmup=5, iters=10).slow_calls[0]
    assert slowest[0] == 3 and slowest[1] >= 5.0 and slowest[2] >= 5.0 and slowest[3] is None


def test_bench_timer_names_a_garbage_collection_in_a_call():
    """A collection by Python's garbage collector inside a timed call is named with its generation."""
    from convt3d.bench.protocol import time_cuda

    calls = []

    def collect_on_the_eighth():  # timed call 2
        calls.append(None)
        if len(calls) == 8:
            gc.collect(1)
            time.sleep(0.005)  # so that the call is among the slow ones whatever the collection takes

    slowest = time_cuda(collect_on_the_eighth, warmup=5, iters=10).slow_calls[0]
    assert slowest[0] == 2 and slowest[3] == 1


def test_bench_timer_counts_driver_allocations():
    """A call that makes the caching allocator go to the driver is counted (the bench marks such rows)."""
    from convt3d.bench.protocol import time_cuda

    def allocate_and_release():
        torch.empty(64 * 1024 * 1024, device="cuda")
        torch.cuda.empty_cache()

    # Without this, the 256 MB may be carved from a segment that earlier tests left cached beside the timer's
    # flush buffer: no driver call, and empty_cache cannot release a segment in use (the count read 0 on the
    # H200 after the whole file's tests, 6 or more when run after test_triton_backward.py only).
    torch.cuda.empty_cache()
    assert time_cuda(lambda: None, warmup=1, iters=3).device_allocations == 0
    assert time_cuda(allocate_and_release, warmup=1, iters=3).device_allocations >= 6
