"""The Triton weight gradient of one phase, under TRITON_INTERPRET=1 on the CPU (and natively on a GPU)."""

import random

import pytest
import torch
import torch.nn.functional as F

from conftest import (assert_close_rel, layer_args, make_tensors, random_config, run_in_sample,
                      skip_without_usable_triton)
from test_triton_forward import CASES, round_to_tf32

skip_without_usable_triton()
from convt3d.backends import torch_phase  # noqa: E402
from convt3d.backends.torch_phase import _phase_input, conv_transpose3d_backward  # noqa: E402
from convt3d.backends.triton import backward  # noqa: E402
from convt3d.backends.triton.backward import (  # noqa: E402
    CONFIG, _window_per_w_tap, copy_lattice, phase_grad_weight, phase_operands)
from convt3d.backends.triton.forward import NATIVE, TF32, TF32X3  # noqa: E402
from convt3d.plan import make_plan  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def weight_grads(cfg, dtype, precision, round_operands=False, copy_per_w_tap=None, lattice_format=None):
    """(ours through the phase backward with the Triton kernel, float64 autograd reference); copy_per_w_tap
    picks the input's layout (the window, or a copy of it per w tap), None the default; lattice_format, where
    given, the memory format grad_output's lattice is copied into before the kernel reads it."""
    config = None if copy_per_w_tap is None else (*CONFIG[:5], copy_per_w_tap)
    x, w, _ = make_tensors(dict(cfg, unbatched=False, bias=False), torch.float32, DEVICE)
    x, w = x.to(dtype), w.to(dtype)
    args = layer_args(cfg)
    plan = make_plan(tuple(x.shape), tuple(w.shape), **args)
    g = torch.randn(plan.output_shape, device=DEVICE).to(dtype)
    def grad_weight(grad_output, index, input, weight, plan, phases, need_input, need_weight):
        g = grad_output[index]
        g = g if lattice_format is None else g.contiguous(memory_format=lattice_format)
        return None, phase_grad_weight(g, input, plan, phases, precision=precision, config=config)

    _, ours = conv_transpose3d_backward(g, x, w, plan, need_input=False, need_weight=True, phase_backward=grad_weight)
    x64 = (round_to_tf32(x) if round_operands else x).double()
    g64 = (round_to_tf32(g) if round_operands else g).double()
    w64 = w.double().requires_grad_()
    F.conv_transpose3d(x64, w64, None, **args).backward(g64)
    return ours, w64.grad


@pytest.mark.parametrize("copy_per_w_tap", [False, True], ids=["window", "copy_per_w_tap"])
@pytest.mark.parametrize("cfg", CASES, ids=range(len(CASES)))
def test_tf32x3_is_float32_accurate(cfg, copy_per_w_tap):
    run_in_sample((CASES.index(cfg) + copy_per_w_tap) % 2 == 0)  # each case in one form, the other in tf32_rounds
    ours, ref = weight_grads(cfg, torch.float32, TF32X3, copy_per_w_tap=copy_per_w_tap)
    assert ours.dtype == torch.float32
    assert_close_rel(ours, ref, 1e-6)


@pytest.mark.parametrize("copy_per_w_tap", [False, True], ids=["window", "copy_per_w_tap"])
@pytest.mark.parametrize("cfg", CASES[:3], ids=range(3))
def test_tf32_rounds_operands_to_nearest(cfg, copy_per_w_tap):
    run_in_sample((CASES.index(cfg) + copy_per_w_tap) % 2 == 1)  # the form tf32x3 left out
    ours, ref_rounded = weight_grads(cfg, torch.float32, TF32, round_operands=True, copy_per_w_tap=copy_per_w_tap)
    assert_close_rel(ours, ref_rounded, 1e-6)  # exactly the products of the rounded operands, float32 sums


@pytest.mark.parametrize("precision", [TF32, TF32X3], ids=["tf32", "tf32x3"])
@pytest.mark.parametrize("cfg", CASES[:3], ids=range(3))
def test_lattice_in_either_layout(cfg, precision):
    """grad_output's lattice NCDHW or channels-last (read in place, no copy): the same sums, bit for bit. Sampled:
    each case in one precision, in turn."""
    run_in_sample((CASES.index(cfg) + (precision == TF32X3)) % 2 == 0)
    torch.manual_seed(1)
    ncdhw, _ = weight_grads(cfg, torch.float32, precision, lattice_format=torch.contiguous_format)
    torch.manual_seed(1)
    channels_last, ref = weight_grads(cfg, torch.float32, precision, lattice_format=torch.channels_last_3d)
    assert torch.equal(ncdhw, channels_last)
    assert_close_rel(channels_last, ref, 1e-3 if precision == TF32 else 1e-6)


# float16 keeps 11 significant bits, bfloat16 8: the gradient's own rounding dominates.
@pytest.mark.parametrize("dtype, rel", [(torch.float16, 2e-3), (torch.bfloat16, 1.5e-2)])
def test_half_precision(dtype, rel):
    ours, ref = weight_grads(CASES[2], dtype, NATIVE)
    assert ours.dtype == dtype
    assert_close_rel(ours, ref, rel)


@pytest.mark.parametrize("copy_per_w_tap", [False, True], ids=["window", "copy_per_w_tap"])
@pytest.mark.parametrize("seed", range(8))
def test_random_configs(seed, copy_per_w_tap):
    run_in_sample((seed + copy_per_w_tap) % 2 == 0)  # each seed in one form
    cfg = random_config(random.Random(9100 + seed))
    cfg["batch"] = max(1, cfg["batch"])
    ours, ref = weight_grads(cfg, torch.float32, TF32X3, copy_per_w_tap=copy_per_w_tap)
    assert_close_rel(ours, ref, 1e-6, str(cfg))


def test_long_reduction_is_split_and_deterministic():
    """Enough positions for several chunks of the reduction: the partial sums add up, and twice alike."""
    cfg = dict(batch=3, in_channels=3, out_channels=5, groups=1, kernel_size=(3, 3, 3), stride=2, padding=1,
               dilation=2, output_padding=0, spatial=(6, 8, 9), bias=False)
    ours, ref = weight_grads(cfg, torch.float32, TF32X3)
    assert_close_rel(ours, ref, 1e-6)
    torch.manual_seed(0)
    first, _ = weight_grads(cfg, torch.float32, TF32)
    torch.manual_seed(0)
    second, _ = weight_grads(cfg, torch.float32, TF32)
    assert torch.equal(first, second)


# Problem 77's geometry in small: one phase of eight, phase width 16.
SMALL_P77 = dict(batch=2, in_channels=3, out_channels=4, groups=1, kernel_size=(3, 3, 3), stride=2, padding=1,
                 dilation=2, output_padding=0, spatial=(2, 3, 16), bias=False)


def test_lattice_rounded_beforehand():
    """lattice_rounded: the kernel takes grad_output's lattice as already TF32-rounded, and the sums are those of
    rounding it inside, bit for bit."""
    cfg = SMALL_P77
    x, w, _ = make_tensors(dict(cfg, unbatched=False, bias=False), torch.float32, DEVICE)
    plan = make_plan(tuple(x.shape), tuple(w.shape), **layer_args(cfg))
    (phase,) = plan.nonempty_phases
    g = torch.randn(plan.output_shape, device=DEVICE)
    ((_, index),) = torch_phase._backward_phases(plan)
    lattice = g[index].contiguous()
    inside = phase_grad_weight(lattice, x, plan, phase.axes, precision=TF32)
    before = phase_grad_weight(round_to_tf32(lattice), x, plan, phase.axes, precision=TF32, lattice_rounded=True)
    assert torch.equal(inside, before)
    assert not torch.equal(inside, phase_grad_weight(lattice, x, plan, phase.axes, precision=TF32,
                                                     lattice_rounded=True))  # the flag does skip the rounding


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("rounded", [False, True], ids=["as_is", "tf32_rounded"])
@pytest.mark.parametrize("cfg", CASES, ids=range(len(CASES)))
def test_copy_lattice(cfg, rounded, dtype):
    """Each phase's lattice of grad_output, NCDHW or channels-last, copied out contiguous: equal to torch's copy
    (TF32-rounded where asked, float32 only)."""
    x, w, _ = make_tensors(dict(cfg, unbatched=False, bias=False), torch.float32, DEVICE)
    plan = make_plan(tuple(x.shape), tuple(w.shape), **layer_args(cfg))
    rounded = rounded and dtype == torch.float32
    for layout in (torch.contiguous_format, torch.channels_last_3d):
        g = torch.randn(plan.output_shape, device=DEVICE).to(dtype).contiguous(memory_format=layout)
        for _, index in torch_phase._backward_phases(plan):
            view = g[index]
            ours = copy_lattice(view, round_to_tf32=rounded)
            assert ours.is_contiguous()
            assert torch.equal(ours, round_to_tf32(view.contiguous()) if rounded else view.contiguous())


def test_copy_lattice_64_bit_offsets(monkeypatch):
    """The kernel's 64-bit index path (taken where a lattice or its reach has 2**31 elements or more), on a small
    lattice: the same copy."""
    monkeypatch.setattr(backward, "OFFSETS_64_FROM", 0)
    g = torch.randn(2, 3, 7, 9, 11, device=DEVICE)
    view = g[:, :, 1::2, 0::3, 2::2]
    assert torch.equal(copy_lattice(view, round_to_tf32=False), view.contiguous())


@pytest.mark.parametrize("precision", [TF32, TF32X3], ids=["tf32", "tf32x3"])
@pytest.mark.parametrize("cfg", CASES[:4], ids=range(4))
def test_phase_operands_in_one_launch(cfg, precision):
    """The lattice (read in place from grad_output, NCDHW or channels-last) and the windows from one launch: equal
    to each copied alone, TF32-rounded in TF32 mode. Sampled: each case in one precision, in turn."""
    run_in_sample((CASES.index(cfg) + (precision == TF32X3)) % 2 == 0)
    x, w, _ = make_tensors(dict(cfg, unbatched=False, bias=False), torch.float32, DEVICE)
    plan = make_plan(tuple(x.shape), tuple(w.shape), **layer_args(cfg))
    rounded = precision == TF32
    for layout in (torch.contiguous_format, torch.channels_last_3d):
        g = torch.randn(plan.output_shape, device=DEVICE).contiguous(memory_format=layout)
        for phases, index in torch_phase._backward_phases(plan):
            lattice, windows = phase_operands(g, x, plan, phases, precision)
            assert torch.equal(lattice, copy_lattice(g[index], round_to_tf32=rounded))
            assert torch.equal(windows, _window_per_w_tap(x, phases, round_to_tf32=rounded))


@pytest.mark.parametrize("rounded", [False, True], ids=["as_is", "tf32_rounded"])
@pytest.mark.parametrize("cfg", CASES, ids=range(len(CASES)))
def test_window_per_w_tap_copies_the_padded_window(cfg, rounded):
    """The input's window copied once per w tap, shifted by the tap: equal to slicing the F.pad'ed window, for
    every phase some tap reaches, from a non-contiguous input."""
    x, w, _ = make_tensors(dict(cfg, unbatched=False, bias=False), torch.float32, DEVICE)
    x = x.transpose(3, 4).contiguous().transpose(3, 4)  # same values, w not the contiguous axis
    plan = make_plan(tuple(x.shape), tuple(w.shape), **layer_args(cfg))
    for phase in plan.nonempty_phases:
        phases = phase.axes
        width, dilation = phases[2].out_count, phases[2].input_dilation
        copies = _window_per_w_tap(x, phases, round_to_tf32=rounded)[..., :width]
        window = _phase_input(x, plan, phases)
        expected = torch.stack([window[..., k * dilation:k * dilation + width] for k in range(len(phases[2].taps))], 1)
        assert torch.equal(copies, round_to_tf32(expected) if rounded else expected)


@pytest.mark.parametrize("allow_tf32", [True, False], ids=["tf32", "tf32_off"])
def test_the_cuda_phase_backward_as_wired(allow_tf32):
    """ops._cuda_phase_backward (on the CPU through the interpreter): in TF32 mode grad_output's lattice is copied
    out rounded and both gradients are those of the rounded operands; with TF32 off, of the operands as they are."""
    from convt3d.ops import _cuda_phase_backward

    cfg = SMALL_P77
    x, w, _ = make_tensors(dict(cfg, unbatched=False, bias=False), torch.float32, DEVICE)
    plan = make_plan(tuple(x.shape), tuple(w.shape), **layer_args(cfg))
    g = torch.randn(plan.output_shape, device=DEVICE)
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=allow_tf32):
        grad_input, grad_weight = _cuda_phase_backward(g, x, w, plan, True, True)
    x64, w64 = (round_to_tf32(x) if allow_tf32 else x).double().requires_grad_(), w.double().requires_grad_()
    F.conv_transpose3d(x64, w64, None, **layer_args(cfg)).backward((round_to_tf32(g) if allow_tf32 else g).double())
    assert_close_rel(grad_weight, w64.grad, 1e-6)
    # grad_input by the device's convolution from the rounded lattice: exact float32 on the CPU; on a GPU, cuDNN in
    # TF32 also rounds the weight, which the reference does not.
    assert_close_rel(grad_input, x64.grad, 1e-3 if allow_tf32 and DEVICE == "cuda" else 1e-6)


@pytest.mark.parametrize("needs", [(True, False), (False, True)], ids=["grad_input_only", "grad_weight_only"])
def test_the_cuda_phase_backward_computes_only_what_is_asked(needs):
    """One gradient asked: the other comes back None, and the one asked equals its value when both are asked."""
    from convt3d.ops import _cuda_phase_backward

    cfg = SMALL_P77
    x, w, _ = make_tensors(dict(cfg, unbatched=False, bias=False), torch.float32, DEVICE)
    plan = make_plan(tuple(x.shape), tuple(w.shape), **layer_args(cfg))
    g = torch.randn(plan.output_shape, device=DEVICE)
    both = _cuda_phase_backward(g, x, w, plan, True, True)
    one = _cuda_phase_backward(g, x, w, plan, *needs)
    for asked, ours, full in zip(needs, one, both):
        assert (ours is None) is not asked
        if asked:
            assert torch.equal(ours, full)

