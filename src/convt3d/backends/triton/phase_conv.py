"""Triton stride-1 convolution of one phase: the GEMM inside both the forward and grad_input by phases.

Within a phase, conv_transpose3d is a stride-1 dilated correlation on the phase's compact grid (plan.py), and
so is its grad_input (of grad_output's lattice, with the taps in the other order). Both are

    y[n, oc, q] = sum over taps k and channels ic of window[n, q + k*dil, ic] * w[oc, ic, k]    (per group)

an implicit GEMM with M = positions q, N = output channels and K = taps x channels. Two kernels:

- window_kernel lays the operand out as the GEMM reads it, in one pass: channels-last (the reduction axis
  contiguous, as Hopper's TF32 tensor-core instructions read both operands) and padded with zeros to the
  correlation's window, so that the GEMM needs no masks; for float32 it also rounds to TF32 (to nearest, as
  cuDNN) or splits into TF32 high and low parts (3xTF32), so that loads feed the tensor cores directly. Its
  source may be any strided view, e.g. grad_output's lattice of a phase.
- phase_conv_kernel: a program owns BLOCK_H x BLOCK_W positions of one (n, qd) plane and BLOCK_OC channels;
  each step loads a [positions, channels] tile of the window at the tap's offset (a scalar: the window is
  padded) and a [channels out, channels in] tile of the weight, both contiguous along the reduction, and
  stores into y through its strides: a lattice view of the output (the forward) or grad_input.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ...plan import Plan
from ..torch_phase import _phase_weight, _taps, grad_input_pads
from .forward import NATIVE, TF32X3, _autotune, _interpreted, _store_operand, precision_for


@triton.jit
def window_kernel(
    src_ptr, hi_ptr, lo_ptr, C, D, H, W, XD, XH, XW, PAD_D, PAD_H, PAD_W, C_BLOCKS,
    ssn, ssc, ssd, ssh, ssw,
    PRECISION: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """hi[n, xd, xh, xw, c] = src[n, c, xd - PAD_D, xh - PAD_H, xw - PAD_W] where that lies in src (D, H, W), else 0;
    TF32-rounded (PRECISION 1) or split into hi + lo (2) on the way. A program writes one window row (n, xd, xh)
    for BLOCK_C channels: loads run along the source's rows, stores along the channels, and no division per element."""
    pid = tl.program_id(0)
    c_block = pid % C_BLOCKS
    row = pid // C_BLOCKS
    xh = row % XH
    xd = row // XH % XD
    n = (row // (XH * XD)).to(tl.int64)
    c = c_block * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = (c < C)[None, :]
    d, h = xd - PAD_D, xh - PAD_H
    row_inside = (d >= 0) & (d < D) & (h >= 0) & (h < H)
    src_row = src_ptr + n * ssn + tl.where(row_inside, d * ssd + h * ssh, 0) + c[None, :].to(tl.int64) * ssc
    dst_row = ((n * XD + xd) * XH + xh) * XW * C + c[None, :]
    for xw0 in range(0, XW, BLOCK_W):
        xw = xw0 + tl.arange(0, BLOCK_W)[:, None]
        w = xw - PAD_W
        # (the scalar row_inside broadcast first: the interpreter cannot mask with a scalar)
        inside = (w >= 0) & (w < W) & ((xw * 0 + row_inside.to(tl.int32)) != 0) & c_ok
        x = tl.load(src_row + w * ssw, mask=inside, other=0.0)
        _store_operand(hi_ptr, lo_ptr, dst_row + xw * C, x, (xw < XW) & c_ok, PRECISION)


@triton.jit
def phase_conv_kernel(
    x_ptr, x_lo_ptr, w_ptr, w_lo_ptr, b_ptr, y_ptr,
    QD, QH, QW, XD, XH, XW, IC_G, OC_G, GROUPS, TH, TW, DIL_D, DIL_H, DIL_W,
    syn, syc, syd, syh, syw,
    QH_BLOCKS, QW_BLOCKS, OC_BLOCKS, STEPS,
    HAS_BIAS: tl.constexpr, ACCUMULATE: tl.constexpr, PRECISION: tl.constexpr, INTERPRETED: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_OC: tl.constexpr, BLOCK_IC: tl.constexpr,
    EVEN_IC: tl.constexpr,
):
    """y[n, g*OC_G + oc, qd, qh, qw] (+)= bias + sum_{k, ic} x[n, qd + kd*DIL_D, qh + kh*DIL_H, qw + kw*DIL_W,
    g*IC_G + ic] * w[k, g, oc, ic], k = (kd*TH + kh)*TW + kw.

    x: the window (N, XD, XH, XW, C_in) contiguous; w: (taps, groups, OC_G, IC_G) contiguous; y: any strides.
    Offsets inside one sample are 32-bit (the launcher checks), sample bases 64-bit. STEPS = taps x channel blocks.
    """
    BLOCK_M: tl.constexpr = BLOCK_H * BLOCK_W
    pid = tl.program_id(0)
    # Output-channel blocks fastest, so that programs reading the same window tile run together.
    oc_block = pid % (OC_BLOCKS * GROUPS)
    pid = pid // (OC_BLOCKS * GROUPS)
    qw_block = pid % QW_BLOCKS
    pid = pid // QW_BLOCKS
    qh_block = pid % QH_BLOCKS
    pid = pid // QH_BLOCKS
    qd = pid % QD
    n = (pid // QD).to(tl.int64)
    group = oc_block // OC_BLOCKS
    oc = (oc_block % OC_BLOCKS) * BLOCK_OC + tl.arange(0, BLOCK_OC)
    oc_ok = oc < OC_G
    oc_c = tl.minimum(oc, OC_G - 1)

    m = tl.arange(0, BLOCK_M)
    qh = qh_block * BLOCK_H + m // BLOCK_W
    qw = qw_block * BLOCK_W + m % BLOCK_W
    m_ok = (qh < QH) & (qw < QW)
    # Positions past the grid's edge read a real window row (clamped) and are not stored: no load masks.
    c_in = IC_G * GROUPS
    x_rows = ((qd * XH + tl.minimum(qh, QH - 1)) * XW + tl.minimum(qw, QW - 1)) * c_in + group * IC_G
    x_base = x_ptr + n * XD * XH * XW * c_in
    x_lo_base = x_lo_ptr + n * XD * XH * XW * c_in
    ic = tl.arange(0, BLOCK_IC)
    w_rows = (group * OC_G + oc_c) * IC_G
    taps_g = GROUPS * OC_G * IC_G
    IC_BLOCKS = tl.cdiv(IC_G, BLOCK_IC)

    acc = tl.zeros((BLOCK_M, BLOCK_OC), dtype=tl.float32)
    for step in range(STEPS):
        tap = step // IC_BLOCKS
        ic0 = (step % IC_BLOCKS) * BLOCK_IC
        kd = tap // (TH * TW)
        kh = tap // TW % TH
        kw = tap % TW
        shift = ((kd * DIL_D * XH + kh * DIL_H) * XW + kw * DIL_W) * c_in + ic0
        a_offs = x_rows[:, None] + shift + ic[None, :]
        b_offs = tap * taps_g + w_rows[:, None] + ic0 + ic[None, :]
        if EVEN_IC:
            a = tl.load(x_base + a_offs)
            b = tl.load(w_ptr + b_offs)
        else:
            ic_ok = (ic0 + ic < IC_G)[None, :]
            a = tl.load(x_base + a_offs, mask=ic_ok, other=0.0)
            b = tl.load(w_ptr + b_offs, mask=ic_ok, other=0.0)
        if PRECISION == 2:
            # 3xTF32: a*b ~ a_lo*b_hi + a_hi*b_lo + a_hi*b_hi, the step's sum added to acc with an ordinary
            # rounded add (the tensor cores truncate as they accumulate; as in forward.py).
            if EVEN_IC:
                a_lo = tl.load(x_lo_base + a_offs)
                b_lo = tl.load(w_lo_ptr + b_offs)
            else:
                a_lo = tl.load(x_lo_base + a_offs, mask=ic_ok, other=0.0)
                b_lo = tl.load(w_lo_ptr + b_offs, mask=ic_ok, other=0.0)
            part = tl.dot(a_lo, tl.trans(b), input_precision="tf32")
            part = tl.dot(a, tl.trans(b_lo), part, input_precision="tf32")
            acc += tl.dot(a, tl.trans(b), part, input_precision="tf32")
        elif PRECISION == 1:
            acc = tl.dot(a, tl.trans(b), acc, input_precision="tf32")
        elif INTERPRETED and a.dtype == tl.bfloat16:
            # The interpreter's dot mishandles bfloat16 (as in forward.py); bfloat16 products are exact in float32.
            acc = tl.dot(a.to(tl.float32), tl.trans(b.to(tl.float32)), acc, input_precision="ieee")
        else:
            acc = tl.dot(a, tl.trans(b), acc)

    if HAS_BIAS:
        acc += tl.load(b_ptr + group * OC_G + oc_c).to(tl.float32)[None, :]
    # Stored as [channels, positions], so that neighbouring threads write neighbouring positions.
    out = tl.trans(acc)
    ptrs = (y_ptr + n * syn + ((group * OC_G + oc_c) * syc)[:, None]
            + (qd * syd + tl.minimum(qh, QH - 1) * syh + tl.minimum(qw, QW - 1) * syw)[None, :])
    ok = oc_ok[:, None] & m_ok[None, :]
    if ACCUMULATE:
        out += tl.load(ptrs, mask=ok, other=0.0).to(tl.float32)
    tl.store(ptrs, out.to(y_ptr.dtype.element_ty), mask=ok)


def _round_tf32(t: torch.Tensor) -> torch.Tensor:
    """Round float32 to TF32, to nearest with ties away from zero (as _round_to_tf32 in forward.py)."""
    return ((t.view(torch.int32) + 0x1000) & -8192).view(torch.float32)


def _weight_operand(weight: torch.Tensor, precision: int):
    """A conv3d weight (OC, IC_G, taps...) -> (hi, lo) laid out (taps, OC, IC_G), contiguous."""
    w = weight.permute(2, 3, 4, 0, 1).contiguous()
    if precision == NATIVE:
        return w, w
    hi = _round_tf32(w)
    return hi, (_round_tf32(w - hi) if precision == TF32X3 else hi)


def window(src: torch.Tensor, pads, spatial, precision: int):
    """(hi, lo): src (N, C, D, H, W), any strides, shifted by pads (left pad per axis; negative crops) into a
    zero-padded channels-last window (N, XD, XH, XW, C) of the given spatial size, contiguous."""
    n, c = src.shape[:2]
    hi = torch.empty((n, *spatial, c), dtype=src.dtype, device=src.device)
    lo = torch.empty_like(hi) if precision == TF32X3 else hi
    block_w, block_c = min(64, triton.next_power_of_2(spatial[2])), min(64, max(16, triton.next_power_of_2(c)))
    c_blocks = triton.cdiv(c, block_c)
    if hi.numel():
        window_kernel[(n * spatial[0] * spatial[1] * c_blocks,)](
            src, hi, lo, c, *src.shape[2:], *spatial, *pads, c_blocks, *src.stride(),
            PRECISION=precision, BLOCK_W=block_w, BLOCK_C=block_c)
    return hi, lo


# (BLOCK_H x BLOCK_W positions, BLOCK_OC, BLOCK_IC, num_warps, num_stages)
CONFIGS = [
    (128, 64, 32, 4, 3),
    (128, 64, 32, 4, 4),
    (128, 64, 32, 8, 3),
    (256, 64, 32, 8, 3),
    (128, 128, 32, 8, 3),
    (64, 64, 32, 4, 4),
]
_best_config: dict = {}


def phase_conv(src: torch.Tensor, pads, weight: torch.Tensor, dilation, groups: int, out: torch.Tensor,
               bias=None, accumulate: bool = False, precision: int | None = None, config=None) -> None:
    """out (N, OC, QD, QH, QW), any strides, (+)= the stride-1 correlation of src (N, C_in, D, H, W), placed in
    its window by pads (left pad per axis, negative crops), with weight (OC, C_in/groups, TD, TH, TW) dilated by
    dilation, plus bias. The window spans QD + DIL_D*(TD - 1) and so on."""
    precision = precision_for(src.dtype) if precision is None else precision
    taps = weight.shape[2:]
    spatial = tuple(q + d * (t - 1) for q, d, t in zip(out.shape[2:], dilation, taps))
    x_hi, x_lo = window(src, pads, spatial, precision)
    w_hi, w_lo = _weight_operand(weight, precision)
    if out.numel() == 0:
        return
    key = (tuple(out.shape), tuple(weight.shape), tuple(dilation), groups, src.dtype, precision, str(src.device),
           out.stride(), bias is not None, accumulate)

    def launch(cfg):
        _launch(cfg, x_hi, x_lo, w_hi, w_lo, bias, out, dilation, groups, accumulate, precision)

    if config is None:
        config = _best_config.get(key)
    if config is None:
        if _interpreted():
            config = (16, 16, 16, 4, 1)
        elif src.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            config = CONFIGS[0]
        elif accumulate:  # autotuning would add into out: tune on a scratch copy
            scratch = out.clone()
            config = _autotune(lambda cfg: _launch(cfg, x_hi, x_lo, w_hi, w_lo, bias, scratch, dilation, groups,
                                                   accumulate, precision), CONFIGS)
        else:
            config = _autotune(launch, CONFIGS)
        _best_config[key] = config
    launch(config)


def _launch(cfg, x_hi, x_lo, w_hi, w_lo, bias, out, dilation, groups, accumulate, precision):
    block_m, block_oc, block_ic, num_warps, num_stages = cfg
    n, oc, qd, qh, qw = out.shape
    _, xd, xh, xw, c_in = x_hi.shape
    th, tw = w_hi.shape[1:3]
    taps = w_hi.shape[0] * th * tw
    ic_g, oc_g = c_in // groups, oc // groups
    block_w = min(triton.next_power_of_2(qw), block_m)
    block_h = max(1, block_m // block_w)
    block_oc = max(16, min(block_oc, triton.next_power_of_2(oc_g)))
    block_ic = max(16, min(block_ic, triton.next_power_of_2(ic_g)))
    qh_blocks, qw_blocks, oc_blocks = triton.cdiv(qh, block_h), triton.cdiv(qw, block_w), triton.cdiv(oc_g, block_oc)
    steps = taps * triton.cdiv(ic_g, block_ic)
    phase_conv_kernel[(n * qd * qh_blocks * qw_blocks * oc_blocks * groups,)](
        x_hi, x_lo, w_hi, w_lo, bias if bias is not None else w_hi, out,
        qd, qh, qw, xd, xh, xw, ic_g, oc_g, groups, th, tw, *dilation, *out.stride(),
        qh_blocks, qw_blocks, oc_blocks, steps,
        HAS_BIAS=bias is not None, ACCUMULATE=accumulate, PRECISION=precision, INTERPRETED=_interpreted(),
        BLOCK_H=block_h, BLOCK_W=block_w, BLOCK_OC=block_oc, BLOCK_IC=block_ic, EVEN_IC=ic_g % block_ic == 0,
        num_warps=num_warps, num_stages=num_stages,
    )


def write_phase(input, weight, bias, plan: Plan, phases, view) -> None:
    """torch_phase.conv_transpose3d's write_phase: the phase's correlation stored straight into its view of the
    output (no compact result and copy)."""
    phase_conv(input, [-p.input_start for p in phases], _phase_weight(weight, phases, plan.groups),
               [p.input_dilation for p in phases], plan.groups, view, bias)


def add_phase_grad_input(g, weight, plan: Plan, phases, grad_input):
    """torch_phase.conv_transpose3d_backward's add_phase_grad_input: the phase's part of grad_input from g, its
    lattice of grad_output, written into grad_input (allocated for the first phase) or added to it."""
    first = grad_input is None
    if first:
        grad_input = torch.empty((plan.batch, plan.in_channels, *plan.input_spatial), dtype=g.dtype, device=g.device)
    phase_conv(g, [left for left, _ in grad_input_pads(plan, phases)], _taps(weight, phases, descending=False),
               [p.input_dilation for p in phases], plan.groups, grad_input, accumulate=not first)
    return grad_input
