"""The whole output of a layer where one phase holds every tap, written once from that phase's compact result.

Where a single phase receives taps (KernelBench L1/77: stride 2, dilation 2, so only odd outputs along each
axis), every other output is the bias or zero. The phase path computes the phase as a compact stride-1
convolution y (N, C_out, QD, QH, QW); this kernel then writes

    out[n, c, o] = y[n, c, q]   where o = start + stride*q along every axis, 0 <= q < count,
                 = bias[c] (or 0) elsewhere,

flat over the contiguous output in aligned blocks, so that every store is a whole 16-byte vector and every
memory sector of the output is written once. Before it, a fill of the whole output and a strided copy of the
phase over it wrote the phase's sectors twice, each time in part.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...plan import Plan
from . import cdiv


@triton.jit
def _phase_index(o, START: tl.constexpr, STRIDE: tl.constexpr, COUNT: tl.constexpr):
    """(q, whether output index o lies on the phase's lattice o = START + STRIDE*q, 0 <= q < COUNT); q is 0 off
    the lattice, so that no lane forms an address outside y."""
    j = o - START
    on = (j >= 0) & (j % STRIDE == 0) & (j < STRIDE * COUNT)
    return tl.where(on, j // STRIDE, 0), on


@triton.jit
def _write_columns(y_rows, out_rows, row_on, row_ok, bias, W0: tl.constexpr, WIDTH: tl.constexpr,
                   START_W: tl.constexpr, STRIDE_W: tl.constexpr, QW: tl.constexpr, syw, HAS_BIAS: tl.constexpr,
                   LOAD: tl.constexpr):
    """Columns [W0, W0 + WIDTH) of the rows: y where both the row and the column lie on the lattice, else the
    bias. LOAD False: no row of the block lies on the lattice."""
    w = W0 + tl.arange(0, WIDTH)
    out_ptrs = out_rows[:, None] + w[None, :]
    if LOAD:
        qw, on_w = _phase_index(w, START_W, STRIDE_W, QW)
        on = row_on[:, None] & on_w[None, :]
        value = tl.load(y_rows[:, None] + (qw * syw)[None, :], mask=on, other=0.0)
        if HAS_BIAS:
            value = tl.where(on, value, bias[:, None])
        tl.store(out_ptrs, value.to(out_rows.dtype.element_ty), mask=row_ok[:, None])
    else:
        tl.store(out_ptrs, tl.broadcast_to(bias[:, None], (bias.shape[0], WIDTH)).to(out_rows.dtype.element_ty),
                 mask=row_ok[:, None])


@triton.jit
def _write_rows(y_rows, out_rows, row_on, row_ok, bias, W: tl.constexpr, START_W: tl.constexpr,
                STRIDE_W: tl.constexpr, QW: tl.constexpr, syw, HAS_BIAS: tl.constexpr, BLOCK_W: tl.constexpr,
                LOAD: tl.constexpr):
    """Whole rows of W columns, in pieces of BLOCK_W columns and then the remainder's powers of two (65 = 64 + 1),
    so that no lane idles past the row's end."""
    for k in tl.static_range(W // BLOCK_W):
        _write_columns(y_rows, out_rows, row_on, row_ok, bias, k * BLOCK_W, BLOCK_W, START_W, STRIDE_W, QW, syw,
                       HAS_BIAS, LOAD)
    for bit in tl.static_range(BLOCK_W.bit_length() - 1, -1, -1):
        if (W % BLOCK_W >> bit) & 1:
            _write_columns(y_rows, out_rows, row_on, row_ok, bias, W - W % (1 << (bit + 1)), 1 << bit, START_W,
                           STRIDE_W, QW, syw, HAS_BIAS, LOAD)


@triton.jit
def phase_output_kernel(
    y_ptr, bias_ptr, out_ptr, ROWS, syn, syc, syd, syh, syw,
    C: tl.constexpr, D: tl.constexpr, H: tl.constexpr, W: tl.constexpr,
    START_D: tl.constexpr, START_H: tl.constexpr, START_W: tl.constexpr,
    STRIDE_D: tl.constexpr, STRIDE_H: tl.constexpr, STRIDE_W: tl.constexpr,
    QD: tl.constexpr, QH: tl.constexpr, QW: tl.constexpr,
    HAS_BIAS: tl.constexpr, OFFSETS_64: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_W: tl.constexpr,
    SKIP_EMPTY: tl.constexpr,
):
    """out (N, C, D, H, W) contiguous as in the module docstring; y any strides. A program writes BLOCK_R whole
    rows (n, c, d, h) of the output: the index arithmetic is per row and per column, not per element (decomposing
    a flat index per element made the kernel bound by integer arithmetic). The sizes and the lattice are
    constexpr, so that the divisions compile to multiplications and shifts."""
    if OFFSETS_64:
        r = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    else:
        r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = r < ROWS
    h = r % H
    t = r // H
    d = t % D
    t = t // D
    c = t % C
    n = t // C
    qd, on_d = _phase_index(d, START_D, STRIDE_D, QD)
    qh, on_h = _phase_index(h, START_H, STRIDE_H, QH)
    row_on = row_ok & on_d & on_h
    y_rows = y_ptr + (n.to(tl.int64) * syn + c.to(tl.int64) * syc + (qd * syd + qh * syh))
    out_rows = out_ptr + r * W
    if HAS_BIAS:
        bias = tl.load(bias_ptr + c, mask=row_ok, other=0.0)
    else:
        bias = tl.zeros((BLOCK_R,), dtype=out_ptr.dtype.element_ty)
    if SKIP_EMPTY:
        if tl.max(row_on.to(tl.int32), axis=0) > 0:
            _write_rows(y_rows, out_rows, row_on, row_ok, bias, W, START_W, STRIDE_W, QW, syw, HAS_BIAS, BLOCK_W,
                        True)
        else:
            _write_rows(y_rows, out_rows, row_on, row_ok, bias, W, START_W, STRIDE_W, QW, syw, HAS_BIAS, BLOCK_W,
                        False)
    else:
        _write_rows(y_rows, out_rows, row_on, row_ok, bias, W, START_W, STRIDE_W, QW, syw, HAS_BIAS, BLOCK_W, True)


@triton.jit
def phase_output_flat_kernel(
    y_ptr, bias_ptr, out_ptr, TOTAL, syn, syc, syd, syh, syw,
    C: tl.constexpr, D: tl.constexpr, H: tl.constexpr, W: tl.constexpr,
    START_D: tl.constexpr, START_H: tl.constexpr, START_W: tl.constexpr,
    STRIDE_D: tl.constexpr, STRIDE_H: tl.constexpr, STRIDE_W: tl.constexpr,
    QD: tl.constexpr, QH: tl.constexpr, QW: tl.constexpr,
    HAS_BIAS: tl.constexpr, OFFSETS_64: tl.constexpr, BLOCK: tl.constexpr,
):
    """out (N, C, D, H, W) contiguous as in the module docstring; y any strides. The sizes and the lattice are
    constexpr, so that the index divisions compile to multiplications and shifts."""
    if OFFSETS_64:
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    else:
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < TOTAL
    w = offs % W
    r = offs // W
    h = r % H
    r = r // H
    d = r % D
    r = r // D
    c = r % C
    n = r // C
    qd, on_d = _phase_index(d, START_D, STRIDE_D, QD)
    qh, on_h = _phase_index(h, START_H, STRIDE_H, QH)
    qw, on_w = _phase_index(w, START_W, STRIDE_W, QW)
    on = inside & on_d & on_h & on_w
    y_offs = n.to(tl.int64) * syn + c.to(tl.int64) * syc + (qd * syd + qh * syh + qw * syw)
    value = tl.load(y_ptr + y_offs, mask=on, other=0.0)
    if HAS_BIAS:
        value = tl.where(on, value, tl.load(bias_ptr + c, mask=inside, other=0.0))
    tl.store(out_ptr + offs, value.to(out_ptr.dtype.element_ty), mask=inside)


# (rows per program, columns per step, warps, skip loads in blocks of no lattice row), or ("flat", elements per
# program, warps) for the flat kernel.
CONFIG = (32, 64, 4, True)


def write_phase_output(out: torch.Tensor, y: torch.Tensor, bias, plan: Plan, phases) -> None:
    """Write the whole of out (contiguous, plan.output_shape) from y, the compact result of `phases`, the plan's
    only phase that some tap reaches (its bias included), and bias (or zero) everywhere else."""
    total = out.numel()
    if total == 0:
        return
    reach = sum((size - 1) * stride for size, stride in zip(y.shape, y.stride()))
    lattice = dict(
        C=plan.out_channels, D=plan.output_spatial[0], H=plan.output_spatial[1], W=plan.output_spatial[2],
        START_D=phases[0].out_start, START_H=phases[1].out_start, START_W=phases[2].out_start,
        STRIDE_D=plan.stride[0], STRIDE_H=plan.stride[1], STRIDE_W=plan.stride[2],
        QD=phases[0].out_count, QH=phases[1].out_count, QW=phases[2].out_count, HAS_BIAS=bias is not None)
    if CONFIG[0] == "flat":
        _, block, num_warps = CONFIG
        phase_output_flat_kernel[(cdiv(total, block),)](
            y, out if bias is None else bias, out, total, *y.stride(), **lattice,
            OFFSETS_64=max(total + block, reach) >= 2**31, BLOCK=block, num_warps=num_warps)
        return
    block_r, block_w, num_warps, skip_empty = CONFIG
    rows = total // plan.output_spatial[2]
    phase_output_kernel[(cdiv(rows, block_r),)](
        y, out if bias is None else bias, out, rows, *y.stride(), **lattice,
        OFFSETS_64=max(total + block_r * plan.output_spatial[2], reach) >= 2**31, BLOCK_R=block_r,
        BLOCK_W=block_w, SKIP_EMPTY=skip_empty, num_warps=num_warps)
