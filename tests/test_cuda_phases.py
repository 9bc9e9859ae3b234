"""backends/cuda: the CUDA phase correlation's operands and geometry, on the CPU; the kernel itself on the GPU.

Without a GPU the kernel cannot run, so its contract (phase_conv.py's formula, over windows whose extent covers whole
tiles) is emulated here in float64 and substituted for the launch: what these tests check is everything around the
kernel, the Triton operand pass (in the interpreter), the windows' starts and extents, the phases' offsets, tap
orders and lattice strides. test_gpu.py runs the kernel itself against PyTorch on the H200.
"""

import logging
import random

import pytest
import torch
import torch.nn.functional as F

from convt3d.backends import cuda
from convt3d.backends.cuda import phases as cuda_phases, row_runs
from convt3d.backends.torch_phase import (_backward_phases, _lattice_geometry, _regions, aten_phase_backward,
                                         conv_transpose3d_backward, phase_grad_input)
from convt3d.plan import make_plan
from conftest import assert_close_rel, run_in_sample, skip_without_usable_triton

skip_without_usable_triton()
pytestmark = pytest.mark.interpreter
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def round_tf32(t: torch.Tensor) -> torch.Tensor:
    return ((t.view(torch.int32) + 0x1000) & -8192).view(torch.float32)


def fp16_parts(weight_taps: torch.Tensor):
    """3xFP16 weight_taps' hi and lo parts (kD, kH, kW, O, I) in float64, in channel order (window._weight_halves
    stores each 32 channels' hi, then lo halves, in the order of the kernel's A fragments)."""
    c = torch.arange(weight_taps.shape[-1] // 2)
    position = (c // 32) * 64 + (c // 16 % 2) * 16 + (c & 8) + (c & 3) * 2 + (c >> 2 & 1)
    return weight_taps[..., position].double(), weight_taps[..., position + 32].double()


def pow2_scale(amax: float) -> float:
    """phase_conv.py's pow2_scale: the power of two that takes amax into [2^14, 2^15), within 2^+-126."""
    exponent = min(max(268 - ((torch.tensor(amax, dtype=torch.float32).view(torch.int32).item() >> 23) & 0xFF), 1),
                   253)
    return 2.0 ** (exponent - 127)


def emulated_correlate(window, weight_taps, bias, out, out_offset, out_strides, grid, offsets, taps, first_taps,
                       tap_steps, dilation, scales=None, split=None):
    """cuda.correlate, emulated: one phase of emulated_correlate_phases."""
    emulated_correlate_phases(window, weight_taps, bias, out, out_strides, grid, taps, dilation,
                              ((*offsets, *first_taps, *tap_steps, out_offset),), scales, split)


def emulated_correlate_phases(window, weight_taps, bias, out, out_strides, grid, taps, dilation, phases, scales=None,
                              split=None, direct=None, region=None):
    """What the kernel computes (phase_conv.py) for each phase of a launch (cuda.correlate_phases), in float64; it also
    checks that every read of every whole tile lies inside the window, as the kernel assumes (its tile rows chosen
    for all the launch's phases). 3xTF32 (weight_taps' hi and lo parts): the window's values split as the kernel
    splits them, and the three products it adds. 3xFP16 (float16 weight_taps): the same with the window scaled by the
    power of two of its largest magnitude (the kernel takes each plane's from the block maxima, which are checked
    here) and the result by the weight's inverse scales; FP16 (split 3, 3xFP16's operands) the same with the hi parts
    alone. (Without an sm_90 GPU no correlation reads the input itself: direct is None; nor fills the output itself,
    cuda.REGION_FILL being off: region is None.)"""
    assert direct is None and region is None and 1 <= len(phases) and all(len(phase) == 10 for phase in phases)
    n, c_in = window.shape[0], window.shape[4]
    if split is None:
        split = 2 if weight_taps.dtype == torch.float16 else int(weight_taps.dim() == 6)
    c_out = weight_taps.shape[3 + (split == 1)]
    rows = cuda.tile_rows(c_in, c_out, tuple(taps), tuple(dilation), split, n * len(phases), tuple(grid))
    for phase in phases:
        _emulated_phase(window, weight_taps, bias, out, phase[9], out_strides, grid, phase[:3], taps, phase[3:6],
                        phase[6:9], dilation, scales, split, c_out, rows)


def _emulated_phase(window, weight_taps, bias, out, out_offset, out_strides, grid, offsets, taps, first_taps,
                    tap_steps, dilation, scales, split, c_out, rows):
    n, xd, xh, xw, c_in = window.shape
    (qd, qh, qw), (kd, kh, kw), (dd, dh, dw) = grid, taps, dilation
    assert xd >= offsets[0] + qd + (kd - 1) * dd
    assert xh >= offsets[1] + -(-qh // rows) * rows + (kh - 1) * dh
    assert xw >= offsets[2] + -(-qw // 32) * 32 + (kw - 1) * dw
    index = [[f + k * s for k in range(count)] for f, s, count in zip(first_taps, tap_steps, taps)]

    def correlation(window, weight_taps):
        x = window.permute(0, 4, 1, 2, 3).double()[:, :, offsets[0]:, offsets[1]:, offsets[2]:]
        w = weight_taps.double()[index[0]][:, index[1]][:, :, index[2]].permute(3, 4, 0, 1, 2)
        return F.conv3d(x, w, dilation=dilation)[:, :, :qd, :qh, :qw]

    if split >= 2:
        block_max, block_p, inverse = scales
        padded = F.pad(window.abs(), (0, 0, 0, -xw % block_p))
        assert torch.equal(block_max, padded.view(n, xd, xh, -1, block_p * c_in).amax(-1))
        scale = pow2_scale(block_max.max().item())
        x = window.double() * scale
        x_hi = x.half().double()
        x_lo = (x - x_hi).half().double()
        w_hi, w_lo = fp16_parts(weight_taps)
        y = correlation(x_hi, w_hi)
        if split == 2:
            y = y + correlation(x_hi, w_lo) + correlation(x_lo, w_hi)
        y = y / scale
        y = y * inverse.double().view(1, -1, 1, 1, 1)
    elif split == 1:
        x_hi = round_tf32(window)
        x_lo = round_tf32(window - x_hi)
        w_hi, w_lo = weight_taps
        y = correlation(x_hi, w_hi) + correlation(x_hi, w_lo) + correlation(x_lo, w_hi)
    else:
        y = correlation(window, weight_taps)
    if bias is not None:
        y = y + bias.double().view(1, -1, 1, 1, 1)
    out.as_strided((n, c_out, qd, qh, qw), out_strides, out.storage_offset() + out_offset).copy_(y)


def row_aligned(x: torch.Tensor) -> torch.Tensor:
    """x as a view whose rows start 16 bytes apart (padded to a multiple of 4 elements, the padding NaN), as the CUDA
    weight gradient reads them."""
    padded = x.new_full((*x.shape[:4], -(-x.shape[4] // 4) * 4), float("nan"))
    padded[..., :x.shape[4]] = x
    return padded[..., :x.shape[4]]


def emulated_correlate_grad_weight(input, grad_output, lattice_offset, lattice_strides, grid, starts, taps, dilation,
                                   splits):
    """What grad_weight.py's kernel computes, in float64: grad[i, o, T - 1 - k] = sum over n and q of
    round(x[n, i, start + q + k * dil]) * round(g[n, o, q]) (zero outside the input), per axis."""
    assert splits >= 1
    n, c_in = input.shape[:2]
    c_out = grad_output.shape[1]
    g = round_tf32(grad_output.as_strided((n, c_out, *grid), lattice_strides,
                                          grad_output.storage_offset() + lattice_offset)).double()
    pad = [max(0, -s) for s in starts]
    far = [max(0, s + q + (t - 1) * d - size)
           for s, q, t, d, size in zip(starts, grid, taps, dilation, input.shape[2:])]
    x = F.pad(round_tf32(input).double(), (pad[2], far[2], pad[1], far[1], pad[0], far[0]))
    grad = torch.zeros((c_in, c_out, *taps), dtype=torch.float64, device=input.device)
    for kd in range(taps[0]):
        for kh in range(taps[1]):
            for kw in range(taps[2]):
                at = [s + p + k * d for s, p, k, d in zip(starts, pad, (kd, kh, kw), dilation)]
                shifted = x[:, :, at[0]:at[0] + grid[0], at[1]:at[1] + grid[1], at[2]:at[2] + grid[2]]
                grad[:, :, taps[0] - 1 - kd, taps[1] - 1 - kh, taps[2] - 1 - kw] = torch.einsum(
                    "nidhw,nodhw->io", shifted, g)
    return grad.float()


# (C_in, C_out, kernel, stride, padding, dilation, output_padding, spatial): problem 77's geometry (one phase, every
# tap), phases of 2 and 1 taps (k3 s2 p1 op1), k4 s2 p1 (8 phases of 2x2x2 taps), stride 1, tap dilation in a
# phase (k3 s1 d2), tiles cut at the edges (spatial not a multiple of 8 rows or 32 columns), a window start beyond
# the input (large padding), a 3D U-Net's k2 s2 (8 phases of one tap) with two blocks of 64 output channels; then
# more with one phase that has taps: problem 77's geometry with a partial row block and one column block, stride and
# dilation 3 with output_padding, and stride 1 along one axis; last, 128 input channels (weight stages of part of
# them): a 3D U-Net's k2 s2, a VAE decoder's k4 s2 p1 and a video decoder's spatial k(1, 4, 4) s(1, 2, 2).
LAYERS = [
    (32, 64, 3, 2, 1, 2, 0, (3, 9, 33)),
    (32, 16, 3, 2, 1, 1, 1, (2, 5, 7)),
    (64, 8, 4, 2, 1, 1, 0, (2, 3, 4)),
    (32, 24, (1, 3, 2), 1, 0, 1, 0, (2, 10, 3)),
    (32, 8, 3, (1, 2, 1), (1, 0, 1), 2, 0, (3, 4, 5)),
    (64, 32, 2, 3, (2, 1, 1), 1, 0, (3, 4, 4)),
    (32, 128, 2, 2, 0, 1, 0, (2, 3, 4)),
    (32, 64, 3, 2, 1, 2, 0, (3, 9, 20)),
    (32, 16, 3, 3, 2, 3, 1, (2, 5, 7)),
    (64, 8, 2, (2, 1, 2), 0, (2, 1, 2), (1, 0, 1), (2, 6, 5)),
    (128, 64, 2, 2, 0, 1, 0, (2, 3, 4)),
    (128, 16, 4, 2, 1, 1, 0, (2, 3, 5)),
    (128, 64, (1, 4, 4), (1, 2, 2), (0, 1, 1), 1, 0, (2, 3, 5)),
]


def _layer(c_in, c_out, kernel, stride, padding, dilation, output_padding, spatial, seed, tf32_exact=True):
    """x, w (TF32-exact unless tf32_exact is False), b, the plan and conv_transpose3d's arguments of a layer."""
    gen = torch.Generator().manual_seed(seed)
    kernel = (kernel,) * 3 if isinstance(kernel, int) else kernel
    exact = round_tf32 if tf32_exact else lambda t: t
    x = exact(torch.randn(2, c_in, *spatial, generator=gen)).to(DEVICE)
    w = exact(torch.randn(c_in, c_out, *kernel, generator=gen)).to(DEVICE)
    b = torch.randn(c_out, generator=gen).to(DEVICE)
    args = [(v,) * 3 if isinstance(v, int) else v for v in (stride, padding, output_padding, dilation)]
    plan = make_plan(tuple(x.shape), tuple(w.shape), *args[:3], 1, args[3])
    return x, w, b, plan, dict(stride=stride, padding=padding, output_padding=output_padding, dilation=dilation)


PRECISIONS = ["tf32", "fp16", "3xtf32", "3xfp16"]


@pytest.fixture(params=PRECISIONS)
def tf32(request, monkeypatch):
    """Whether TF32 is on for a test: in TF32 mode in each of its precisions (cuda.TF32_SPLIT 0 and 3), or with TF32
    off in each split (cuda.SPLIT 1 and 2)."""
    monkeypatch.setattr(cuda, "TF32_SPLIT", 3 if request.param == "fp16" else 0)
    if request.param.startswith("3x"):
        monkeypatch.setattr(cuda, "SPLIT", 1 if request.param == "3xtf32" else 2)
    return not request.param.startswith("3x")


@pytest.mark.parametrize("layer", LAYERS)
@pytest.mark.parametrize("with_bias", [False, True])
def test_forward_phases_match_conv_transpose3d(layer, with_bias, tf32, monkeypatch, request):
    """In TF32 mode on TF32-exact operands (so the emulated kernel's float64 sums match float64 PyTorch closely); with
    TF32 off (3xTF32, 3xFP16) on operands that are not, which only the split reaches to 1e-6 (TF32 alone: about
    3e-4). Sampled: every layer in every precision, with or without a bias in turn."""
    run_in_sample((LAYERS.index(layer) + with_bias + PRECISIONS.index(request.node.callspec.params["tf32"])) % 2 == 0)
    monkeypatch.setattr(cuda_phases, "correlate", emulated_correlate)
    monkeypatch.setattr(cuda_phases, "correlate_phases", emulated_correlate_phases)
    x, w, b, plan, args = _layer(*layer, seed=random.randrange(2**31), tf32_exact=tf32)
    b = b if with_bias else None
    expected = F.conv_transpose3d(x.double(), w.double(), None if b is None else b.double(), **args)
    out = torch.full(plan.output_shape, float("nan"), device=DEVICE)
    regions = _regions(plan, False)
    phase_list = tuple(phases for _, phases in regions if phases is not None)
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=tf32):
        cuda_phases.write_phases(x, w, b, plan, phase_list, out, _lattice_geometry)
    for index, phases in regions:  # the regions no tap reaches, as the backend fills them
        if phases is None:
            out[index] = 0 if b is None else b.view(1, -1, 1, 1, 1).expand_as(out[index])
    assert_close_rel(out, expected, 1e-6, "forward")


@pytest.mark.parametrize("layer", LAYERS)
def test_grad_input_phases_match_aten(layer, tf32, monkeypatch, request):
    """Sampled: each layer in one precision, in turn."""
    run_in_sample((PRECISIONS.index(request.node.callspec.params["tf32"]) - LAYERS.index(layer)) % 4 == 0)
    monkeypatch.setattr(cuda_phases, "correlate", emulated_correlate)
    monkeypatch.setattr(cuda_phases, "correlate_phases", emulated_correlate_phases)
    x, w, _, plan, _ = _layer(*layer, seed=random.randrange(2**31), tf32_exact=tf32)
    if cuda_phases._split(tf32) >= 2 and cuda.phase_conv_channels_unsupported(plan.out_channels, plan.in_channels):
        pytest.skip("FP16 weight halves come in blocks of 32 channels, as the kernel reads them")
    g = torch.randn(plan.output_shape, device=DEVICE)
    g = round_tf32(g) if tf32 else g
    for phases, index in _backward_phases(plan):
        lattice = g[index]  # a strided view: the window pass reads through its strides
        with torch.backends.cudnn.flags(enabled=True, allow_tf32=tf32):
            ours = cuda_phases.phase_grad_input(lattice, w, plan, phases)
        expected = phase_grad_input(lattice.double(), w.double(), plan, phases)
        assert_close_rel(ours, expected, 1e-6, f"grad_input of phase {phases}")


@pytest.mark.parametrize("layer", LAYERS)
def test_grad_weight_phases_match_aten(layer, monkeypatch):
    monkeypatch.setattr(cuda_phases, "correlate_grad_weight", emulated_correlate_grad_weight)
    x, w, _, plan, _ = _layer(*layer, seed=random.randrange(2**31))
    g = round_tf32(torch.randn(plan.output_shape, device=DEVICE))
    for phases, index in _backward_phases(plan):
        offset, _, strides = _lattice_geometry(plan, phases, g.stride())
        ours = cuda_phases.phase_grad_weight(g, offset, strides, x, plan, phases)
        _, expected = aten_phase_backward(g.double(), index, x.double(), w.double(), plan, phases, False, True)
        assert_close_rel(ours, expected, 1e-6, f"grad_weight of phase {phases}")


BY_CUDA = [(True, True), (False, True), (True, False)]


@pytest.mark.parametrize("layer", LAYERS[:3])
@pytest.mark.parametrize("input_by_cuda, weight_by_cuda", BY_CUDA)
def test_phase_backward_with_the_cuda_kernels(layer, input_by_cuda, weight_by_cuda, monkeypatch):
    """The Triton module's phase_backward with the CUDA kernels (emulated) serving both gradients (then grad_output's
    lattices are read in place: no copy may be made), or one of them (then the lattice is copied, and grad_input is
    aten's or grad_weight Triton's, in the interpreter): the whole layer's gradients against aten's in float64.
    Sampled: each layer in one of the three, in turn."""
    run_in_sample((LAYERS.index(layer) + BY_CUDA.index((input_by_cuda, weight_by_cuda))) % 3 == 0)
    from convt3d.backends.triton import backward

    monkeypatch.setattr(cuda_phases, "correlate", emulated_correlate)
    monkeypatch.setattr(cuda_phases, "correlate_phases", emulated_correlate_phases)
    monkeypatch.setattr(cuda_phases, "correlate_grad_weight", emulated_correlate_grad_weight)
    monkeypatch.setattr(cuda_phases, "grad_input_unsupported", lambda *args: None if input_by_cuda else "off")
    monkeypatch.setattr(cuda_phases, "grad_weight_unsupported", lambda *args: None if weight_by_cuda else "off")
    # TF32 itself: FP16's operands come in blocks of 32 channels, which these layers' forced grad_input lacks.
    monkeypatch.setattr(cuda, "TF32_SPLIT", 0)
    if input_by_cuda and weight_by_cuda:
        monkeypatch.setattr(backward, "phase_operands", None)
    x, w, _, plan, args = _layer(*layer, seed=random.randrange(2**31))
    x = row_aligned(x)
    g = round_tf32(torch.randn(plan.output_shape, device=DEVICE))
    grad_input, grad_weight = conv_transpose3d_backward(g, x, w, plan, phase_backward=backward.phase_backward)
    x64, w64 = x.double().requires_grad_(), w.double().requires_grad_()
    F.conv_transpose3d(x64, w64, **args).backward(g.double())
    # grad_input by aten on a GPU is cuDNN's TF32 convolution, whose tensor cores truncate as they accumulate (3.2e-6
    # on the H200, fourteenth session, layer 0); the emulated kernels and the CPU's float32 stay within 1e-6.
    cudnn = DEVICE == "cuda" and not input_by_cuda
    assert_close_rel(grad_input, x64.grad, 1e-5 if cudnn else 1e-6, "grad_input")
    assert_close_rel(grad_weight, w64.grad, 1e-6, "grad_weight")


def test_grad_weight_operands_check():
    x = torch.randn(2, 32, 3, 4, 9)
    g_shape, g_strides = (2, 64, 3, 4, 9), (6912, 108, 36, 9, 1)
    assert "aligned" in cuda.grad_weight_operands_unsupported(x, g_shape, g_strides)  # rows of 9 floats
    assert cuda.grad_weight_operands_unsupported(row_aligned(x), g_shape, g_strides) is None
    assert "aligned" in cuda.grad_weight_operands_unsupported(row_aligned(x).transpose(3, 4), g_shape, g_strides)
    assert "2**31" in cuda.grad_weight_operands_unsupported(row_aligned(x), (2, 64, 3, 4, 9), (0, 2**30, 36, 9, 1))


def test_grad_weight_config():
    # Problem 77: 27 taps x 32 channels = 13.5 tiles of 64 rows, two programs of 7 (two depth taps each).
    cob, per_program, groups, planes, smem = cuda.grad_weight_config(32, 64, (3, 3, 3), (2, 2, 2))
    assert (cob, per_program, groups, planes) == (64, 7, 2, 2)
    assert smem <= cuda.MAX_SHARED_BYTES
    assert cuda.grad_weight_config(32, 64, (1, 1, 1), (1, 1, 1))[1:4] == (1, 1, 1)  # a U-Net k2 s2 phase
    assert cuda.grad_weight_config(64, 64, (3, 3, 3), (1, 8, 8)) is None  # rings past shared memory
    # Splits: whole (n, qd, column block) planes per run where there are more planes than programs wanted.
    assert cuda.grad_weight_splits(32, 64, (3, 3, 3), (2, 2, 2), (16, 32, 32), 16, 132) == 64
    assert cuda.grad_weight_splits(32, 64, (3, 3, 3), (2, 2, 2), (2, 5, 7), 1, 132) == 10


def test_operands_pass_pads_transposes_and_rounds():
    from convt3d.backends.triton.window import correlation_operands

    gen = torch.Generator().manual_seed(random.randrange(2**31))
    # A strided source (every other w), and a window that starts before it and ends past it in some axes.
    source = torch.randn(2, 32, 3, 5, 70, generator=gen).to(DEVICE)[:, :, :, :, 1:68:2]
    weight = torch.randn(32, 32, 2, 3, 1, generator=gen).to(DEVICE)
    start, extent = (-1, 2, -3), (6, 4, 41)
    pad = 10
    padded = F.pad(source, (pad,) * 6)
    window_of_source = padded[:, :, pad + start[0]:pad + start[0] + extent[0],
                              pad + start[1]:pad + start[1] + extent[1], pad + start[2]:pad + start[2] + extent[2]]
    for orientation in (False, True):
        expected_window = window_of_source.permute(0, 2, 3, 4, 1).contiguous()
        expected_taps = (weight.permute(2, 3, 4, 0, 1) if orientation else weight.permute(2, 3, 4, 1, 0)).contiguous()
        window, taps, scales = correlation_operands(source, 0, source.shape, source.stride(), start, extent, weight,
                                                    grad_input_orientation=orientation)
        assert torch.equal(window, round_tf32(expected_window))
        assert torch.equal(taps, round_tf32(expected_taps)) and scales is None
        # 3xTF32: the window as it is, the weight's TF32 hi and lo parts.
        window, taps, scales = correlation_operands(source, 0, source.shape, source.stride(), start, extent, weight,
                                                    grad_input_orientation=orientation, split=1)
        assert torch.equal(window, expected_window)
        hi = round_tf32(expected_taps)
        assert taps.shape == (2, *hi.shape) and scales is None
        assert torch.equal(taps[0], hi) and torch.equal(taps[1], round_tf32(expected_taps - hi))
        # 3xFP16: the window as it is and its blocks' largest magnitudes (checked in emulated_correlate); per output
        # channel the weight scaled into [2^14, 2^15) as FP16 hi and lo parts, and the inverse scale.
        window, taps, (_, _, inverse) = correlation_operands(source, 0, source.shape, source.stride(), start, extent,
                                                             weight, grad_input_orientation=orientation, split=2)
        assert torch.equal(window, expected_window)
        scaled = expected_taps.double() / inverse.double().view(-1, 1)
        largest = scaled.abs().amax((0, 1, 2, 4))
        assert ((2**14 <= largest) & (largest < 2**15)).all()
        w_hi, w_lo = fp16_parts(taps)
        assert torch.equal(w_hi, scaled.half().double()) and torch.equal(w_lo, (scaled - w_hi).half().double())


@pytest.mark.parametrize("split", [0, 1, 2], ids=["tf32", "3xtf32", "3xfp16"])
def test_operand_buffer_holds_what_the_operand_pass_allocates(split):
    """The phase path's prepared call puts the operand pass's outputs in one buffer (window.operand_buffer): each of
    correlation_operands' tensors fits at its offset, 256-byte aligned, before the next part; the window's shape and
    the scale blocks are the pass's."""
    from convt3d.backends.triton.window import correlation_operands, operand_buffer

    source = torch.randn(2, 32, 3, 5, 7).to(DEVICE)
    weight = torch.randn(32, 24, 3, 2, 3).to(DEVICE)
    start, extent = (-1, 0, -2), (6, 8, 70)  # (70 columns: a partial block of the maxima under 3xFP16)
    window, taps, scales = correlation_operands(source, 0, source.shape, source.stride(), start, extent, weight,
                                                grad_input_orientation=False, split=split)
    size, offsets, window_shape, scale_blocks = operand_buffer(tuple(source.shape), source.stride(), start, extent,
                                                               tuple(weight.shape), weight.stride(), split)
    parts = [window, taps, *([scales[0], scales[2]] if split == 2 else [])]
    assert window_shape == tuple(window.shape)
    assert all(offset % 256 == 0 for offset in offsets)
    ends = [offset + part.numel() * part.element_size() for offset, part in zip(offsets, parts)]
    assert all(end <= after for end, after in zip(ends, [*offsets[1:len(parts)], size]))
    assert size - ends[-1] < 256
    if split == 2:
        assert scale_blocks == (scales[1], scales[0].shape[-1])
    else:
        assert scale_blocks is None and offsets[2] == offsets[3] == offsets[1]


@pytest.mark.parametrize("split", [2, 3], ids=["3xfp16", "fp16"])
def test_operands_without_the_window_are_the_window_passs_scales_and_weights(split):
    """For row_runs.py's kernel reading the input itself, the operand pass without the window (window=False) writes
    the window's block maxima, the weight's halves and inverse scales bitwise as with it, over a window that crops the
    source and pads it, in several column blocks (70 columns); its buffer (operand_buffer) holds no window."""
    from convt3d.backends.triton.window import correlation_operands, operand_buffer

    gen = torch.Generator().manual_seed(random.randrange(2**31))
    source = torch.randn(2, 32, 4, 6, 90, generator=gen).to(DEVICE)
    weight = torch.randn(32, 64, 2, 3, 1, generator=gen).to(DEVICE)
    start, extent = (-1, 2, 3), (6, 5, 70)
    args = (source, 0, source.shape, source.stride(), start, extent, weight, False)
    window, taps, (block_max, block_p, inverse) = correlation_operands(*args, split=split)
    nothing, taps_alone, (block_max_alone, block_p_alone, inverse_alone) = correlation_operands(
        *args, split=split, window=False)
    assert nothing is None and block_p_alone == block_p and block_max.shape[-1] == 2
    assert torch.equal(taps_alone, taps) and torch.equal(inverse_alone, inverse)
    assert torch.equal(block_max_alone, block_max)
    geometry = (tuple(source.shape), source.stride(), start, extent, tuple(weight.shape), weight.stride(), split)
    with_window, without = operand_buffer(*geometry), operand_buffer(*geometry, window=False)
    assert without[1][0] == 0 and without[0] == with_window[0] - with_window[1][1]  # all but the window's bytes
    assert without[2:] == with_window[2:]
    with pytest.raises(ValueError, match="block maxima"):
        correlation_operands(*args, split=1, window=False)


@pytest.mark.parametrize("split", [2, 3], ids=["3xfp16", "fp16"])
def test_operands_without_maxima_are_the_weights_alone(split):
    """For row_runs.py's kernel finding its planes' scales itself (OWN_MAXIMA), the pass without the window and the
    maxima (maxima=False) launches the weight's programs alone and writes its halves and inverse scales bitwise as
    with them."""
    from convt3d.backends.triton.window import _geometry, correlation_operands

    gen = torch.Generator().manual_seed(random.randrange(2**31))
    source = torch.randn(2, 32, 4, 6, 90, generator=gen).to(DEVICE)
    weight = torch.randn(32, 64, 2, 3, 1, generator=gen).to(DEVICE)
    start, extent = (-1, 2, 3), (6, 5, 70)
    args = (source, 0, source.shape, source.stride(), start, extent, weight, False)
    _, taps, (_, _, inverse) = correlation_operands(*args, split=split, window=False)
    nothing, taps_alone, (_, _, inverse_alone) = correlation_operands(*args, split=split, window=False, maxima=False)
    assert nothing is None
    assert torch.equal(taps_alone, taps) and torch.equal(inverse_alone, inverse)
    geometry = (0, tuple(source.shape), source.stride(), start, extent, tuple(weight.shape), weight.stride(), False,
                min(split, 2), False)
    assert _geometry(*geometry, False, True)[0] == (64 + 2 * 6 * 5 * 2,)  # the weight's programs and the maxima's
    assert _geometry(*geometry, False, False)[0] == (64,)  # (one a weight row: its 64 output channels)


def test_own_maxima_where_the_held_loads_fit():
    """row_runs.own_maxima: FP16 only, up to three load rounds of a plane and N up to 136 (problem 77's window, 34
    columns: two rounds, N 136), so that the held loads fit beside the sums."""
    assert row_runs.own_maxima(3, (3, 3, 3), (1, 1, 1), 34)
    assert not row_runs.own_maxima(2, (3, 3, 3), (1, 1, 1), 34)  # (3xFP16: the window pass's maxima)
    assert not row_runs.own_maxima(3, (3, 3, 3), (1, 1, 1), 64)  # N 256
    assert not row_runs.own_maxima(3, (3, 3, 3), (1, 4, 1), 34)  # 12 rows of 34, two units each: four rounds
    assert row_runs.own_maxima(3, (3, 3, 3), (1, 3, 1), 34)  # 10 rows: three rounds


def test_fp16_window_scales_ignore_inf_and_nan():
    """The FP16 splits scale the window by its blocks' largest finite magnitudes: an inf or NaN counted there would
    scale every other value of its tile to zero in FP16, where they pass through the MMAs as they are."""
    from convt3d.backends.triton.window import correlation_operands

    gen = torch.Generator().manual_seed(random.randrange(2**31))
    source = torch.randn(1, 32, 2, 3, 4, generator=gen)
    source[0, 5, 1, 2, 3] = float("inf")
    source[0, 7, 0, 1, 1] = float("nan")
    source = source.to(DEVICE)
    weight = torch.randn(32, 32, 1, 1, 1, generator=gen).to(DEVICE)
    window, _, (block_max, _, _) = correlation_operands(source, 0, source.shape, source.stride(), (0, 0, 0),
                                                        (2, 3, 4), weight, grad_input_orientation=False, split=3)
    finite = torch.where(window.isfinite(), window.abs(), 0)
    assert torch.equal(block_max, finite.amax((3, 4)).unsqueeze(-1))
    assert window.isinf().sum() == 1 and window.isnan().sum() == 1  # the window itself as it was


def test_3xfp16_weight_scales_span_float32():
    """3xFP16's per-channel weight scales: channels of 1e-30 and 1e30 (FP16 spans 2^-24 to 65504) split to float32's
    accuracy, an all-zero channel into zeros with a finite inverse scale, and channels holding an inf or a NaN keep
    their other values' accuracy (the scale comes from the largest finite magnitude: an inf counted there would scale
    the rest of its channel to zero in FP16, where eager's outputs that the inf tap does not reach stay finite)."""
    from convt3d.backends.triton.window import correlation_operands

    gen = torch.Generator().manual_seed(random.randrange(2**31))
    source = torch.randn(1, 32, 2, 3, 4, generator=gen).to(DEVICE)
    weight = torch.randn(32, 64, 2, 2, 1, generator=gen)
    weight[:, 0] = 0
    weight[:, 1] *= 1e-30
    weight[:, 2] *= 1e30
    weight[5, 3, 1, 0, 0] = float("inf")
    weight[7, 4, 0, 1, 0] = float("nan")
    weight = weight.to(DEVICE)
    _, taps, (_, _, inverse) = correlation_operands(source, 0, source.shape, source.stride(), (0, 0, 0), (2, 3, 4),
                                                    weight, grad_input_orientation=False, split=2)
    w_hi, w_lo = fp16_parts(taps)
    rebuilt = (w_hi + w_lo) * inverse.double().view(-1, 1)
    expected = weight.permute(2, 3, 4, 1, 0).double()
    finite = expected.isfinite()
    assert torch.isfinite(inverse).all() and not rebuilt[..., 0, :].any()
    for o in range(1, 64):
        keep = finite[..., o, :]
        error = (rebuilt[..., o, :] - expected[..., o, :])[keep].norm() / expected[..., o, :][keep].norm()
        assert error <= 1e-6, (o, error.item())


def test_unsupported_reasons_name_the_cause(monkeypatch):
    cpu = torch.device("cpu")
    assert "sm_90" in cuda.phase_conv_unsupported(cpu, torch.float32, 32, 64, 1, (3, 3, 3), (1, 1, 1))
    assert "sm_90" in cuda.grad_weight_kernel_unsupported(cpu, torch.float32, 32, 64, 1, (3, 3, 3), (1, 1, 1))
    monkeypatch.setattr(cuda, "ENABLED", False)
    assert "CONVT3D_CUDA_KERNELS" in cuda.phase_conv_unsupported(cpu, torch.float32, 32, 64, 1, (3, 3, 3), (1, 1, 1))
    assert cuda.config(32, 64, (3, 3, 3), (1, 1, 1))[0] == 8  # problem 77's forward: 8 rows, two programs per SM
    assert cuda.config(64, 32, (3, 3, 3), (1, 1, 1))[0] == 4  # its grad_input: 4 rows fit twice
    assert cuda.config(64, 64, (1, 1, 40), (1, 1, 8)) is None  # a plane wider than shared memory
    # 3xTF32: the weight ring doubles, and the partial sums' registers allow 2 rows of 64 channels: two programs per
    # SM on problem 77's forward; 8 rows of 16 channels.
    rows, _, smem, _ = cuda.config(32, 64, (3, 3, 3), (2, 2, 2), split=True)
    assert rows == 2 and smem <= cuda.MAX_SHARED_BYTES // 2 - 1024
    assert cuda.config(32, 16, (3, 3, 3), (1, 1, 1), split=True)[0] == 8
    # 128 input channels: weight stages of 64 or 32 channels, so that two programs still share an SM on a 3D U-Net's
    # k2 s2 phases (one tap) and in TF32 a VAE decoder's k4 s2 p1 phases (2 x 2 x 2); in 3xTF32 those take one.
    assert cuda.config(32, 64, (3, 3, 3), (1, 1, 1))[3] == 32 and cuda.config(64, 32, (3, 3, 3), (1, 1, 1))[3] == 64
    for taps, split, programs in [((1, 1, 1), False, 2), ((2, 2, 2), False, 2), ((1, 1, 1), True, 2),
                                  ((2, 2, 2), True, 1)]:
        rows, _, smem, unit = cuda.config(128, 64, taps, (1, 1, 1), split)
        assert unit in (64, 32) and smem <= cuda.MAX_SHARED_BYTES, (taps, split)
        assert (smem <= cuda.MAX_SHARED_BYTES // 2 - 1024) == (programs == 2), (taps, split)


def test_tile_rows_spread_small_layers_over_the_gpu():
    # Problem 77's forward (1024 programs of 8 rows) and grad_input (2048 of 4) keep config()'s rows.
    assert cuda.tile_rows(32, 64, (3, 3, 3), (1, 1, 1), False, 16, (16, 32, 32)) == 8
    assert cuda.tile_rows(64, 32, (3, 3, 3), (1, 1, 1), False, 16, (16, 32, 32)) == 4
    # The sweep's k3s1p1 (2 x 16 planes of 32 x 32): 128 programs of 8 rows, 256 of 4, 512 of 2.
    assert cuda.tile_rows(64, 64, (3, 3, 3), (1, 1, 1), False, 2, (16, 32, 32)) == 2
    # Two blocks of 64 output channels double the programs: 4 rows give 2 x 8 x 16 x 2 = 512.
    assert cuda.tile_rows(64, 128, (2, 2, 2), (1, 1, 1), False, 2, (8, 64, 32)) == 4
    assert cuda.tile_rows(64, 64, (3, 3, 3), (1, 1, 1), False, 1, (1, 1, 1)) == 2  # never fewer than 2


def test_row_runs_kernel_takes_32_channels_into_blocks_of_64_in_fp16(monkeypatch):
    """Which correlations may run row_runs.py's kernel (tile_rows then gives its rows, whatever the grid's programs):
    32 input channels into whole blocks of 64 output channels, FP16 or 3xFP16, one column block; and where the window
    is too wide for its N or its shared memory too large, none is built (phase_conv.py's kernel serves)."""
    for split in (2, 3):
        assert cuda.tile_rows(32, 64, (3, 3, 3), (1, 1, 1), split, 16, (16, 32, 32)) == row_runs.ROWS
        assert cuda.tile_rows(32, 128, (1, 1, 1), (1, 1, 1), split, 1, (1, 2, 3)) == row_runs.ROWS
    for c_in, c_out, split, grid in ((32, 64, 0, (16, 32, 32)), (32, 64, 1, (16, 32, 32)), (64, 64, 3, (4, 8, 8)),
                                     (32, 96, 3, (4, 8, 8)), (32, 32, 2, (4, 8, 8)), (32, 64, 3, (4, 8, 33))):
        assert not cuda._row_runs_layer(c_in, c_out, split, grid), (c_in, c_out, split, grid)
    assert cuda._row_runs_kernel(0, 64, (3, 3, 3), (1, 1, 1), 35, False, 2) is None  # N = 140 > 136
    assert cuda._row_runs_kernel(0, 64, (3, 3, 3), (1, 1, 1), 65, False, 3) is None  # N = 264 > 256
    assert cuda._row_runs_kernel(0, 64, (5, 5, 5), (1, 1, 1), 36, False, 2) is None  # 25 taps' weights: 200 KB
    monkeypatch.setattr(cuda, "ROW_RUNS", False)
    assert not cuda._row_runs_layer(32, 64, 3, (16, 32, 32))


def _only_phases(input_shape, weight_shape, stride, padding, dilation, output_padding=0):
    """(plan, the phases some tap reaches) of a layer."""
    triple = lambda v: (v,) * 3
    plan = make_plan(input_shape, weight_shape, triple(stride), triple(padding), triple(output_padding), 1,
                     triple(dilation))
    return plan, tuple(phases for _, phases in _regions(plan, True) if phases is not None)


def test_region_fill_serves_a_layers_only_phase_on_row_runs_kernel(monkeypatch):
    """Where the correlation fills the rest of the output itself (cuda.REGION_FILL; by default, None, with TF32 off
    and, in TF32 mode, where a fill warpgroup does it: row_runs.fill_warpgroup): problem 77's geometry, one phase on
    row_runs.py's kernel, into a contiguous output, in both precisions by default or with the switch on: the output's
    sizes, the lattice's steps and its first position (its phase's, at 1 with padding 1 and at 0 with padding 0).
    With 5 x 5 x 5 taps (the window 36 columns wide: N 144, past a fill warpgroup's) in TF32 mode only with the
    switch on. None into a channels_last_3d output (rows not contiguous), for a layer of several phases
    (k3 s2), where phase_conv.py's kernel serves (64 input channels), in 3xTF32 (CONVT3D_SPLIT=1: phase_conv.py's
    kernel), or with the switch off."""
    plan, phases = _only_phases((2, 32, 16, 32, 32), (32, 64, 3, 3, 3), 2, 1, 2)
    strides = torch.empty(plan.output_shape, device="meta").stride()
    expected = ((33, 65, 65), (2, 2, 2), (1, 1, 1))
    k5, k5_phases = _only_phases((2, 32, 8, 16, 16), (32, 64, 5, 5, 5), 2, 2, 2)
    k5_strides = torch.empty(k5.output_shape, device="meta").stride()
    k5_expected = ((19, 35, 35), (2, 2, 2), (0, 0, 0))
    for region_fill, in_tf32, tf32_off, k5_in_tf32 in ((False, None, None, None), (0, None, None, None),
                                                       (None, expected, expected, None),
                                                       (True, expected, expected, k5_expected)):
        monkeypatch.setattr(cuda, "REGION_FILL", region_fill)
        for tf32, region, k5_region in ((True, in_tf32, k5_in_tf32), (False, tf32_off, tf32_off and k5_expected)):
            with torch.backends.cudnn.flags(enabled=True, allow_tf32=tf32):
                assert cuda_phases.region_fill(plan, phases, strides) == region, (region_fill, tf32)
                assert cuda_phases.region_fill(k5, k5_phases, k5_strides) == k5_region, (region_fill, tf32)
    monkeypatch.setattr(cuda, "SPLIT", 1)
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        assert cuda_phases.region_fill(plan, phases, strides) is None
    monkeypatch.setattr(cuda, "SPLIT", 2)
    monkeypatch.setattr(cuda, "REGION_FILL", True)
    # (Unpadded, the lattice takes the even positions: 32 of its columns where the input has 30.)
    unpadded, unpadded_phases = _only_phases((2, 32, 16, 30, 30), (32, 64, 3, 3, 3), 2, 0, 2)
    unpadded_strides = torch.empty(unpadded.output_shape, device="meta").stride()
    assert cuda_phases.region_fill(unpadded, unpadded_phases, unpadded_strides) == ((35, 63, 63), (2, 2, 2), (0, 0, 0))
    channels_last = torch.empty(plan.output_shape, device="meta").to(memory_format=torch.channels_last_3d).stride()
    assert cuda_phases.region_fill(plan, phases, channels_last) is None
    k3s2, k3s2_phases = _only_phases((2, 32, 8, 16, 16), (32, 64, 3, 3, 3), 2, 1, 1, output_padding=1)
    assert len(k3s2_phases) == 8
    assert cuda_phases.region_fill(k3s2, k3s2_phases, torch.empty(k3s2.output_shape, device="meta").stride()) is None
    wide, wide_phases = _only_phases((2, 64, 16, 32, 32), (64, 64, 3, 3, 3), 2, 1, 2)
    assert cuda_phases.region_fill(wide, wide_phases, torch.empty(wide.output_shape, device="meta").stride()) is None


@pytest.mark.parametrize("input_shape, padding, sector_edges", [((2, 32, 16, 32, 32), 1, 1), ((3, 32, 5, 7, 9), 0, 1),
                                                                ((1, 32, 3, 4, 5), 1, 0)],
                         ids=["p77", "unpadded", "rows_under_16"])
def test_region_macros_hold_every_lattice_point_and_move_segment_ends_where_rows_allow(input_shape, padding,
                                                                                       sector_edges, monkeypatch):
    """row_runs.region_macros, from region_fill's region: the lattice's residues and last column, which the kernel's
    sector_edge takes as a superset of the phase's lattice (every lattice position of the plan inside it, the last
    column the last of its residue in a row), and SECTOR_EDGES in FP16 (split 3) where rows are 16 floats or more
    (problem 77's 65, unpadded 21; not 11) unless CONVT3D_SECTOR_EDGES is off; never in 3xFP16 (split 2)."""
    plan, phases = _only_phases(input_shape, (32, 64, 3, 3, 3), 2, padding, 2)
    region = cuda_phases._region(plan, phases, 3, torch.empty(plan.output_shape, device="meta").stride())
    macros = row_runs.region_macros(region, 3)
    out_w = plan.output_shape[4]
    (phase,) = phases
    lattice = [[p.out_start + p_step * j for j in range(p.out_count)]
               for p, p_step in zip(phase, (axis.stride for axis in plan.axes))]
    assert all(d % macros["STRIDE_D"] == macros["LATTICE_D"] for d in lattice[0])
    assert all(h % macros["STRIDE_H"] == macros["LATTICE_H"] for h in lattice[1])
    assert all(w % macros["STRIDE_W"] == macros["LATTICE_W"] for w in lattice[2])
    last = macros["LAST_LATTICE_W"]
    assert max(lattice[2]) <= last < out_w <= last + macros["STRIDE_W"] and last % macros["STRIDE_W"] == \
        macros["LATTICE_W"]
    assert macros["SECTOR_EDGES"] == sector_edges
    assert row_runs.region_macros(region, 2)["SECTOR_EDGES"] == 0
    monkeypatch.setattr(row_runs, "SECTOR_EDGES", False)
    assert row_runs.region_macros(region, 3)["SECTOR_EDGES"] == 0


# Problem 77's input (N, 32, 16, 32, 32), contiguous, for the kernel that reads it itself: its sizes, the window's start
# in it, its strides.
P77_INPUT = ((16, 32, 32), (-1, -1, -1), (32 * 16 * 32 * 32, 16 * 32 * 32, 32 * 32, 32))
# (row_runs.source's region: cuda.phases.region_fill's for problem 77)
P77_REGION = ((33, 65, 65), (2, 2, 2), (1, 1, 1))


def test_fill_warpgroup_where_its_registers_hold_the_kernel():
    """row_runs.fill_warpgroup: a program that fills its region does it by a second warpgroup (256 threads, two
    programs a multiprocessor) up to N = 136, in FP16 reading the window or the input and in 3xFP16 reading the window;
    not without a region, past N = 136 (a window 36 columns wide), or in 3xFP16 reading the input, where its computing
    warpgroup spilled (one warpgroup then, FP16 three programs a multiprocessor up to N = 136, else two)."""
    cases = [(3, 34, P77_REGION, None, True), (3, 34, P77_REGION, P77_INPUT, True), (2, 34, P77_REGION, None, True),
             (2, 34, P77_REGION, P77_INPUT, False), (3, 34, None, None, False), (3, 36, P77_REGION, P77_INPUT, False)]
    for split, columns, region, input_geometry, expected in cases:
        case = (split, columns, region, input_geometry)
        assert row_runs.fill_warpgroup(*case) is expected, case
        assert row_runs.block_threads(*case) == row_runs.THREADS * (2 if expected else 1), case
        one_warpgroup = 3 if split == 3 and columns == 34 else 2
        assert row_runs.programs_per_multiprocessor(*case) == (2 if expected else one_warpgroup), case


def test_only_the_weight_gradient_needs_tf32(monkeypatch):
    """With TF32 off the phase correlation serves (in 3xTF32) and the weight gradient does not; checked on a
    pretended sm_90 device up to the first check that needs one."""
    monkeypatch.setattr(cuda, "_capability", lambda index: cuda.ARCHITECTURE)
    gpu = torch.device("cuda", 0)
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        assert "TF32" in cuda.grad_weight_kernel_unsupported(gpu, torch.float32, 32, 64, 1, (3, 3, 3), (1, 1, 1))
        assert "channels" in cuda.phase_conv_unsupported(gpu, torch.float32, 16, 64, 1, (3, 3, 3), (1, 1, 1), True)
        assert "float32" in cuda.phase_conv_unsupported(gpu, torch.float16, 32, 64, 1, (3, 3, 3), (1, 1, 1), True)


class FakeKernels:
    """cuda._Kernel on a pretended sm_90 GPU (no GPU here): each kernel built is recorded by its name and source, and
    so is each launch; names in fail, and sources that hold a text of fail_sources, raise as a failed compile does."""

    def __init__(self, fail=()):
        self.built, self.launched, self.fail, self.fail_sources = [], [], fail, ()
        fake = self

        class Kernel:
            def __init__(self, source, name, shared_bytes, threads):
                if name in fake.fail or any(text in source for text in fake.fail_sources):
                    raise RuntimeError(f"{name} did not compile")
                self.name, self.source = name, source
                fake.built.append(self)

            def launch(self, grid, pointers, ints, longs, stream, table=()):
                fake.launched.append(self)

        self.Kernel = Kernel


@pytest.fixture
def fake_kernels(monkeypatch):
    """A FakeKernels in place of cuda._Kernel on a pretended sm_90 device, with the caches that hold kernels or the
    answers about them cleared before and after."""
    import contextlib

    fake = FakeKernels()
    monkeypatch.setattr(cuda, "_Kernel", lambda *args: fake.Kernel(*args))
    monkeypatch.setattr(cuda, "_capability", lambda index: cuda.ARCHITECTURE)
    monkeypatch.setattr(cuda, "_compile_kernel", lambda: object())
    monkeypatch.setattr(cuda, "_current_stream", lambda device: 0)
    monkeypatch.setattr(torch.cuda, "device", lambda index: contextlib.nullcontext())
    caches = (cuda._kernel, cuda._row_runs_kernel, cuda.phase_launches, cuda_phases.forward_unsupported,
              cuda_phases._kernels_unsupported, cuda_phases._reads_input)
    for cache in caches:
        cache.cache_clear()
    yield fake
    for cache in caches:
        cache.cache_clear()


@pytest.mark.parametrize("layer", [LAYERS[0], LAYERS[7], LAYERS[6], LAYERS[2]],
                         ids=["phase_conv", "row_runs", "row_runs_8_phases", "phase_conv_8_phases"])
@pytest.mark.parametrize("with_bias", [False, True])
def test_forward_check_compiles_the_kernels_its_call_launches(layer, with_bias, tf32, fake_kernels):
    """forward_unsupported compiles nothing; forward_kernels_unsupported compiles each kernel that write_phases then
    launches, once, and no other (before, the check compiled phase_conv.py's kernel without a bias at one phase's tile
    rows: also where row_runs.py's served, and again in a call with a bias, or in a launch of several phases at more
    rows, as the sweep's unet3d_k2s2 takes: 4 against the check's 2)."""
    x, w, b, plan, _ = _layer(*layer, seed=random.randrange(2**31))
    b = b if with_bias else None
    phase_list = tuple(phases for _, phases in _regions(plan, True) if phases is not None)
    split = cuda_phases._split(tf32)
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=tf32):
        assert cuda_phases.forward_unsupported(plan, phase_list, torch.device("cuda", 0), x.dtype, tf32) is None
        assert fake_kernels.built == []
        assert cuda_phases.forward_kernels_unsupported(x, b, plan, phase_list) is None
        built = list(fake_kernels.built)
        out = torch.full(plan.output_shape, float("nan"))
        cuda_phases.write_phases(x, w, b, plan, phase_list, out, _lattice_geometry)
    assert fake_kernels.built == built and {id(k) for k in fake_kernels.launched} == {id(k) for k in built}
    _, extent, launches = cuda_phases._forward_geometry(plan, phase_list, split)
    row_runs_serves = [cuda._row_runs_layer(plan.in_channels, plan.out_channels, split, grid)
                       for _, _, grid, _ in launches]
    assert len(built) == len(launches) and [k.name == "phase_conv_rows" for k in built] == row_runs_serves
    assert any(row_runs_serves) == (layer in (LAYERS[7], LAYERS[6]) and split in (2, 3))


def test_forward_check_compiles_the_kernel_that_reads_the_input(fake_kernels):
    """Where the forward reads the input itself (FP16, row_runs.py's kernel for the input's geometry), the check
    compiles that kernel alone, and the launches take it."""
    x, w, b, plan, _ = _layer(*LAYERS[7], seed=random.randrange(2**31))
    phase_list = tuple(phases for _, phases in _regions(plan, True) if phases is not None)
    window_shape, geometry = cuda_phases.input_direct(x, plan, phase_list, 3)
    assert cuda_phases._kernels_unsupported(plan, phase_list, 3, 0, True, geometry) is None
    assert [k.name for k in fake_kernels.built] == ["phase_conv_rows"]
    _, _, ((counts, dilation, grid, strides, fields),) = cuda_phases._forward_launches(plan, phase_list, 3, (1,) * 5,
                                                                                       _lattice_geometry)
    (kernel, *_), = cuda.phase_launches(0, window_shape, (*w.shape[3:], plan.out_channels), 3, True, strides, grid,
                                        counts, dilation, fields, (32, 1), geometry)
    assert kernel is fake_kernels.built[0] and len(fake_kernels.built) == 1


def test_forward_falls_back_when_a_kernel_does_not_compile(fake_kernels, caplog, monkeypatch):
    """A kernel that does not compile: row_runs.py's gives way to phase_conv.py's; phase_conv.py's to cuDNN, which
    the phase path then takes (torch_phase._cuda_phases: no phases), with the reason at debug level. (The input, on the
    CPU, is checked as if on the pretended GPU.)"""
    from convt3d.backends.torch_phase import _cuda_phases, _log_once

    on_gpu = cuda_phases.forward_unsupported
    monkeypatch.setattr(cuda_phases, "forward_unsupported",
                        lambda plan, phases, device, *args: on_gpu(plan, phases, torch.device("cuda", 0), *args))
    x, w, b, plan, _ = _layer(*LAYERS[7], seed=random.randrange(2**31))
    regions = _regions(plan, True)
    phase_list = tuple(phases for _, phases in regions if phases is not None)
    fake_kernels.fail = ("phase_conv_rows",)
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=True):
        assert cuda_phases.forward_kernels_unsupported(x, b, plan, phase_list) is None
        assert [k.name for k in fake_kernels.built] == ["phase_conv"]
        cuda_phases._kernels_unsupported.cache_clear()
        cuda._kernel.cache_clear()
        fake_kernels.fail = ("phase_conv_rows", "phase_conv")
        _log_once.cache_clear()
        with caplog.at_level(logging.DEBUG, logger="convt3d"):
            out = torch.empty(plan.output_shape)
            assert _cuda_phases(x, b, plan, regions, out, True) == (None, None)
    assert "phase_conv did not compile" in caplog.text


def test_without_a_usable_triton_the_forward_takes_cudnn_and_says_why(caplog, monkeypatch):
    """The CUDA correlation's operands come from a Triton pass (backends/cuda/phases.py imports Triton): without a
    Triton that convt3d's kernels run on, torch_phase._cuda_phases gives no phases (cuDNN serves, as where a kernel
    does not compile) and logs why, and a module's binding finds no prepared call, without importing that module
    (which raised ImportError there before)."""
    from convt3d.backends import torch_phase

    def no_cuda_module():
        raise ImportError("import of triton halted")

    monkeypatch.setattr(torch_phase, "triton_unusable", lambda: "triton is not installed")
    monkeypatch.setattr(torch_phase, "_cuda_module", no_cuda_module)
    x, w, b, plan, _ = _layer(*LAYERS[7], seed=random.randrange(2**31))
    torch_phase._log_once.cache_clear()
    with caplog.at_level(logging.DEBUG, logger="convt3d"):
        assert torch_phase._cuda_phases(x, b, plan, _regions(plan, True), torch.empty(plan.output_shape), True) == \
            (None, None)
    assert "by cuDNN, not the CUDA kernel: triton is not installed" in caplog.text
    monkeypatch.setattr(torch_phase, "_prepared", {})  # (none prepared: no call was served by the CUDA kernels)
    assert torch_phase.prepared_call(x, w, b, plan) is None


def test_region_fill_compiles_its_kernel_or_leaves_the_fill_to_the_forward(fake_kernels, caplog, monkeypatch):
    """With cuda.REGION_FILL on, a layer whose only phase runs on row_runs.py's kernel (problem 77's geometry) gets
    the region (torch_phase._cuda_phases), and the check compiles that kernel with it (REGION_FILL 1) alone; where
    that kernel does not compile, the kernel without it, and the forward fills the output first as by default (not
    cuDNN), saying so at debug level. (The input, on the CPU, is checked as if on the pretended GPU.)"""
    from convt3d.backends.torch_phase import _cuda_phases, _log_once

    monkeypatch.setattr(cuda, "REGION_FILL", True)
    on_gpu = cuda_phases.forward_unsupported
    monkeypatch.setattr(cuda_phases, "forward_unsupported",
                        lambda plan, phases, device, *args: on_gpu(plan, phases, torch.device("cuda", 0), *args))
    x, w, b, plan, _ = _layer(*LAYERS[7], seed=random.randrange(2**31))
    regions = _regions(plan, True)
    out = torch.empty(plan.output_shape)
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=True):
        phase_list, region = _cuda_phases(x, b, plan, regions, out, True)
        assert len(phase_list) == 1 and region == (plan.output_shape[2:], (2, 2, 2), (1, 1, 1))
        assert [kernel.source.count("#define REGION_FILL 1\n") for kernel in fake_kernels.built] == [1]
        cuda_phases._kernels_unsupported.cache_clear()
        cuda._row_runs_kernel.cache_clear()
        fake_kernels.fail_sources = ("#define REGION_FILL 1\n",)
        _log_once.cache_clear()
        with caplog.at_level(logging.DEBUG, logger="convt3d"):
            assert _cuda_phases(x, b, plan, regions, out, True) == (phase_list, None)
        assert [kernel.source.count("#define REGION_FILL 0\n") for kernel in fake_kernels.built[1:]] == [1]
    assert "the output's fill (REGION_FILL)" in caplog.text and "a fill before the correlation" in caplog.text


@pytest.mark.parametrize("cache", ["kept on disk", "no cache"])
def test_forward_check_compiles_several_kernels_at_once(monkeypatch, tmp_path, cache):
    """A layer whose forward launches several kernels (a k3 s2 layer's eight phases, one tap shape each): the check
    compiles them with NVRTC in threads at the same time (cuda.compiled_together), each once, loads each on the
    calling thread (a worker thread has no CUDA context current: on the H200 loads there failed), and the _Kernels
    the launches take are those; where a compile in a thread fails, that kernel's _Kernel compiles it again itself.
    With the disk cache, a second process's check compiles none. (Stand-ins for torch's two steps, NVRTC's compile
    and the module's load, on a pretended sm_90 device: each compile waits 0.2 s, in one of eight threads.)"""
    import contextlib
    import threading
    import time

    compiles, loads, failing = [], [], set()

    class Compiled:
        def __init__(self, binary):
            self.func, self.binary = len(loads), binary

        def set_shared_memory_config(self, shared_bytes):
            pass

    def nvrtc_compile(source, name, compute_capability, *options):
        compiles.append((threading.get_ident(), name))
        time.sleep(0.2)
        if threading.get_ident() != threading.main_thread().ident and name in failing:
            raise RuntimeError("failed in a thread")
        return f"{len(compiles)} {source}".encode(), name

    def load_module(binary, names):
        loads.append(threading.get_ident())
        return {names[0]: Compiled(binary)}

    monkeypatch.setattr(torch.cuda._utils, "_nvrtc_compile", nvrtc_compile, raising=False)
    monkeypatch.setattr(torch.cuda._utils, "_cuda_load_module", load_module, raising=False)
    monkeypatch.setattr(torch.cuda, "_compile_kernel", lambda source, name, compute_capability: load_module(
        nvrtc_compile(source, name, compute_capability)[0], [name])[name], raising=False)  # (its two steps)
    monkeypatch.setattr(cuda, "CACHE_DIR", str(tmp_path) if cache == "kept on disk" else "")
    monkeypatch.setattr(cuda, "_capability", lambda index: cuda.ARCHITECTURE)
    monkeypatch.setattr(torch.cuda, "device", lambda index: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(cuda.os, "cpu_count", lambda: 8)  # (the threads wait, they do not compute)
    caches = (cuda._kernel, cuda._row_runs_kernel, cuda_phases._kernels_unsupported)
    x, w, b, plan, _ = _layer(*LAYERS[1], seed=random.randrange(2**31))  # 32 -> 16, k3 s2 p1 op1: eight launches
    phase_list = tuple(phases for _, phases in _regions(plan, True) if phases is not None)
    main = threading.main_thread().ident
    try:
        for fail, anew in ((set(), False), ({"phase_conv"}, False), (set(), True)):
            for kept in caches:
                kept.cache_clear()
            compiles.clear(), loads.clear(), cuda._compiled.clear(), failing.clear(), failing.update(fail)
            if anew and cache == "no cache":
                continue
            if not anew:  # (anew: a later process, the files of the run before on disk)
                for file in tmp_path.iterdir():
                    file.unlink()
            start = time.perf_counter()
            with torch.backends.cudnn.flags(enabled=True, allow_tf32=True):
                assert cuda_phases.forward_kernels_unsupported(x, b, plan, phase_list) is None
            seconds = time.perf_counter() - start
            _, extent, launches = cuda_phases._forward_geometry(plan, phase_list, cuda_phases._split(True))
            assert len(launches) == 8 and len(cuda._compiled) == 8 and not cuda._precompiled  # (all taken)
            in_threads = [name for thread, name in compiles if thread != main]
            on_main = [name for thread, name in compiles if thread == main]
            assert len(in_threads) == (0 if anew else 8) and len(on_main) == (8 if fail else 0), (fail, compiles)
            assert len(loads) == 8 and set(loads) == {main}, loads
            if not fail and not anew:
                assert seconds < 8 * 0.2 / 2, seconds  # (one after the other: 1.6 s)
            kernels = {id(cuda.correlation_kernel(0, (plan.batch, *extent, 32), 16, cuda_phases._split(True), True,
                                                  grid, counts, dilation, len(members)))
                       for counts, dilation, grid, members in launches}
            assert len(kernels) == 8 and len(compiles) == len(in_threads) + len(on_main)  # (none compiled again)
            assert len(list(tmp_path.iterdir())) == (8 if cache == "kept on disk" else 0)
    finally:
        for kept in caches:
            kept.cache_clear()
        cuda._compiled.clear()
        cuda._precompiled.clear()


def test_launcher_passes_every_argument_by_address(monkeypatch):
    """_Kernel.launch's launch (driver.Launch), read back as cuLaunchKernelEx reads it (test_driver's fake driver: no
    GPU here): pointers as 64-bit addresses (updated per call, the launch kept per grid, ints and longs), then 32-bit
    ints, then 64-bit ints; no launch attributes."""
    import ctypes

    from convt3d.backends import driver
    from test_driver import ARGUMENTS, FakeDriver

    fake = FakeDriver()
    monkeypatch.setattr(driver, "libcuda", lambda: fake)
    kernel = cuda._Kernel.__new__(cuda._Kernel)
    kernel.function, kernel.shared_bytes, kernel.threads = 7, 1024, 128
    kernel._launches = {}
    kernel.launch(5, (2**40 + 16, 32), (-3,), (2**33,), 99)
    kernel.launch(5, (48, 2**41), (-3,), (2**33,), 99)
    common = dict(grid=(5, 1, 1), block=(128, 1, 1), shared=1024, stream=99, attributes=[], function=7)
    assert fake.launches == [dict(common, arguments=(2**40 + 16, 32, -3, 2**33)),
                             dict(common, arguments=(48, 2**41, -3, 2**33))]
    assert len(kernel._launches) == 1  # one launch for the same grid, ints and longs

    # A table: its long longs by value, one argument after the longs (the kernel's struct Phases).
    fake = FakeDriver((*ARGUMENTS, ctypes.c_int64 * 3))
    kernel.launch(5, (2**40 + 16, 32), (-3,), (2**33,), 99, (-1, 2**40, 7))
    assert fake.launches[0]["arguments"] == (2**40 + 16, 32, -3, 2**33, (-1, 2**40, 7))


def test_phases_of_the_same_geometry_share_a_launch():
    """_forward_geometry groups the phases whose taps, dilation and grid agree: a k4 s2 p1 layer's eight phases (2 x 2
    x 2 taps each) in one launch, a k3 s2 p1 op1 layer's eight (1 or 2 taps along each axis) in eight."""
    for layer, launches in ((LAYERS[2], [8]), (LAYERS[1], [1] * 8), (LAYERS[0], [1])):
        plan = _layer(*layer, seed=0)[3]
        phase_list = tuple(phases for _, phases in _regions(plan, True) if phases is not None)
        _, _, groups = cuda_phases._forward_geometry(plan, phase_list, 0)
        assert [len(members) for *_, members in groups] == launches, layer


def test_correlate_phases_launches_at_most_max_phases_at_once(monkeypatch):
    """correlate_phases on the 27 one-tap phases of a k3 s3 layer: launches of 8, 8, 8 and 3 phases (phase_conv's
    MAX_PHASES), each over its phases' programs, with each phase's fields in the table and zeros after them."""
    launches = []

    class FakeKernel:
        def launch(self, grid, pointers, ints, longs, stream, table=()):
            launches.append((grid, ints[-1], table))

    monkeypatch.setattr(cuda, "_kernel", lambda *args: FakeKernel())
    monkeypatch.setattr(cuda, "_current_stream", lambda device: 0)
    window = torch.zeros(2, 3, 34, 34, 32)
    weight_taps = torch.zeros(3, 3, 3, 16, 32)
    out = torch.zeros(2, 16, 9, 96, 96)
    phases = tuple((0, 1, 2, kd, kh, kw, 0, 0, 0, (kd * 96 + kh) * 96 + kw)
                   for kd in range(3) for kh in range(3) for kw in range(3))
    cuda.correlate_phases(window, weight_taps, None, out, out.stride(), (3, 32, 32), (1, 1, 1), (1, 1, 1), phases)
    rows = cuda.tile_rows(32, 16, (1, 1, 1), (1, 1, 1), 0, 2 * 27, (3, 32, 32))
    programs = 2 * 3 * -(-32 // rows) * 1
    assert [(grid, count) for grid, count, _ in launches] == [(8 * programs, 8)] * 3 + [(3 * programs, 3)]
    fields = [value for phase in phases for value in phase]
    for k, (_, count, table) in enumerate(launches):
        assert len(table) == 80
        assert list(table[:10 * count]) == fields[80 * k:80 * k + 10 * count] and not any(table[10 * count:])
