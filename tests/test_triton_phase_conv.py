"""The Triton stride-1 phase convolution, under TRITON_INTERPRET=1 on the CPU (and natively on a GPU)."""

import pytest
import torch
import torch.nn.functional as F

from conftest import assert_close_rel
from test_triton_forward import round_to_tf32

triton = pytest.importorskip("triton")
from convt3d.backends.triton.forward import NATIVE, TF32, TF32X3  # noqa: E402
from convt3d.backends.triton.phase_conv import CONFIGS, phase_conv  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# (batch, C_in, C_out, groups, input spatial, kernel, dilation, left pads, output spatial)
CASES = [
    # Problem 77's phase in miniature: 3x3x3 taps, dilation 1, padding 1 on every side.
    (2, 4, 8, 1, (3, 5, 6), (3, 3, 3), (1, 1, 1), (1, 1, 1), (3, 5, 6)),
    # Tile edges: more channels than a block, odd sizes, dilation, a cropped (negative) pad.
    (1, 20, 40, 1, (4, 7, 13), (2, 3, 2), (2, 1, 3), (0, -1, 2), (2, 5, 12)),
    # Groups, channel counts not multiples of 16.
    (2, 6, 9, 3, (3, 4, 5), (1, 2, 3), (1, 2, 1), (0, 1, 1), (3, 3, 5)),
    # One tap, one position.
    (1, 3, 5, 1, (1, 1, 1), (1, 1, 1), (1, 1, 1), (0, 0, 0), (1, 1, 1)),
]


def reference(x, w, b, dilation, groups, pads, out_spatial):
    """float64 conv3d of x padded (or cropped) to the window."""
    window = [q + d * (t - 1) for q, d, t in zip(out_spatial, dilation, w.shape[2:])]
    pairs = [(p, s - n - p) for p, s, n in zip(pads, window, x.shape[2:])]
    xw = F.pad(x.double(), [v for pair in reversed(pairs) for v in pair])
    return F.conv3d(xw, w.double(), None if b is None else b.double(), 1, 0, dilation, groups)


def run(case, dtype, precision, bias=True, out=None, accumulate=False, config=None, round_operands=False):
    n, c_in, c_out, groups, spatial, kernel, dilation, pads, out_spatial = case
    x = torch.randn(n, c_in, *spatial, device=DEVICE).to(dtype)
    w = torch.randn(c_out, c_in // groups, *kernel, device=DEVICE).to(dtype)
    b = torch.randn(c_out, device=DEVICE).to(dtype) if bias else None
    if out is None:
        out = torch.full((n, c_out, *out_spatial), float("nan"), device=DEVICE, dtype=dtype)
    before = out.double().clone() if accumulate else 0
    phase_conv(x, pads, w, dilation, groups, out, b, accumulate=accumulate, precision=precision, config=config)
    if round_operands:
        x, w = round_to_tf32(x), round_to_tf32(w)
    return out, reference(x, w, b, dilation, groups, pads, out_spatial) + before


@pytest.mark.parametrize("case", CASES, ids=range(len(CASES)))
def test_tf32x3_is_float32_accurate(case):
    out, ref = run(case, torch.float32, TF32X3)
    assert_close_rel(out, ref, 1e-6)


@pytest.mark.parametrize("case", CASES[:3], ids=range(3))
def test_tf32_rounds_operands_to_nearest(case):
    out, ref = run(case, torch.float32, TF32, round_operands=True)
    assert_close_rel(out, ref, 1e-6)  # exactly the products of the rounded operands, float32 sums


# float16 keeps 11 significant bits, bfloat16 8: the output's own rounding dominates.
@pytest.mark.parametrize("dtype, rel", [(torch.float16, 2e-3), (torch.bfloat16, 1.5e-2)])
def test_half_precision(dtype, rel):
    out, ref = run(CASES[1], dtype, NATIVE)
    assert out.dtype == dtype
    assert_close_rel(out, ref, rel)


def test_strided_output_and_accumulate():
    """Writes through a strided view (a lattice of a larger tensor) and leaves the rest alone; adds when asked."""
    case = CASES[0]
    n, _, c_out, _, _, _, _, _, (qd, qh, qw) = case
    big = torch.randn(n, c_out, 2 * qd, 2 * qh + 1, 2 * qw, device=DEVICE)
    keep = big.clone()
    view = big[:, :, 1::2, 1::2, ::2]
    out, ref = run(case, torch.float32, TF32X3, out=view, accumulate=True)
    assert_close_rel(out, ref, 1e-6)
    untouched = torch.ones_like(big, dtype=torch.bool)
    untouched[:, :, 1::2, 1::2, ::2] = False
    assert torch.equal(big[untouched], keep[untouched])


@pytest.mark.skipif(DEVICE != "cuda", reason="tile configs are compiled for the GPU only")
@pytest.mark.parametrize("config", CONFIGS)
def test_every_config(config):
    try:
        out, ref = run(CASES[1], torch.float32, TF32X3, config=config)
    except triton.runtime.errors.OutOfResources:  # the largest tiles with 3xTF32's doubled operands
        out, ref = run(CASES[1], torch.float32, TF32, config=config, round_operands=True)
    assert_close_rel(out, ref, 1e-6)
