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

import math

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
def _write_columns(y_rows, out_rows, row_on, row_store, bias, W0: tl.constexpr, WIDTH: tl.constexpr,
                   START_W: tl.constexpr, STRIDE_W: tl.constexpr, QW: tl.constexpr, syw, HAS_BIAS: tl.constexpr,
                   LOAD: tl.constexpr):
    """Columns [W0, W0 + WIDTH) of the rows where row_store: y where both the row and the column lie on the
    lattice, else the bias. LOAD False: no row of the block lies on the lattice."""
    w = W0 + tl.arange(0, WIDTH)
    out_ptrs = out_rows[:, None] + w[None, :]
    if LOAD:
        qw, on_w = _phase_index(w, START_W, STRIDE_W, QW)
        on = row_on[:, None] & on_w[None, :]
        value = tl.load(y_rows[:, None] + (qw * syw)[None, :], mask=on, other=0.0)
        if HAS_BIAS:
            value = tl.where(on, value, bias[:, None])
        tl.store(out_ptrs, value.to(out_rows.dtype.element_ty), mask=row_store[:, None])
    else:
        tl.store(out_ptrs, tl.broadcast_to(bias[:, None], (bias.shape[0], WIDTH)).to(out_rows.dtype.element_ty),
                 mask=row_store[:, None])


@triton.jit
def _write_rows(y_rows, out_rows, row_on, row_store, bias, W: tl.constexpr, START_W: tl.constexpr,
                STRIDE_W: tl.constexpr, QW: tl.constexpr, syw, HAS_BIAS: tl.constexpr, BLOCK_W: tl.constexpr,
                LOAD: tl.constexpr):
    """Whole rows of W columns, in pieces of BLOCK_W columns and then the remainder's powers of two (65 = 64 + 1),
    so that no lane idles past the row's end."""
    for k in tl.static_range(W // BLOCK_W):
        _write_columns(y_rows, out_rows, row_on, row_store, bias, k * BLOCK_W, BLOCK_W, START_W, STRIDE_W, QW, syw,
                       HAS_BIAS, LOAD)
    for bit in tl.static_range(BLOCK_W.bit_length() - 1, -1, -1):
        if (W % BLOCK_W >> bit) & 1:
            _write_columns(y_rows, out_rows, row_on, row_store, bias, W - W % (1 << (bit + 1)), 1 << bit, START_W,
                           STRIDE_W, QW, syw, HAS_BIAS, LOAD)


ALL_ROWS, ROWS_OFF_LATTICE, LATTICE_ROWS = 0, 1, 2


@triton.jit
def phase_output_kernel(
    y_ptr, bias_ptr, out_ptr, syn, syc, syd, syh, syw,
    C: tl.constexpr, D: tl.constexpr, H: tl.constexpr, W: tl.constexpr,
    START_D: tl.constexpr, START_H: tl.constexpr, START_W: tl.constexpr,
    STRIDE_D: tl.constexpr, STRIDE_H: tl.constexpr, STRIDE_W: tl.constexpr,
    QD: tl.constexpr, QH: tl.constexpr, QW: tl.constexpr,
    HAS_BIAS: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_W: tl.constexpr, KIND: tl.constexpr,
):
    """out (N, C, D, H, W) contiguous as in the module docstring; y any strides. A program writes one plane
    (n, c, d) of the output, BLOCK_R whole rows at a time: its sample, channel and depth are scalars, each row's
    index arithmetic is one addition and its phase test, each column's is hoisted out of the loop (a flat index
    decomposed per element made an earlier version bound by integer arithmetic). KIND: every row (ALL_ROWS;
    one program per plane), the rows off the lattice (ROWS_OFF_LATTICE: bias only, y not read; one program
    per plane), or the lattice's rows (LATTICE_ROWS: one program per plane of the lattice (n, c, qd), its rows
    written whole). The sizes and the lattice are constexpr, so that the divisions compile to multiplications
    and shifts."""
    plane = tl.program_id(0)
    if KIND == 2:
        qd = plane % QD
        nc = plane // QD
        d = START_D + STRIDE_D * qd
        on_d = True
    else:
        d = plane % D
        nc = plane // D
        qd, on_d = _phase_index(d, START_D, STRIDE_D, QD)
    c = nc % C
    n = nc // C
    y_plane = y_ptr + (n.to(tl.int64) * syn + c.to(tl.int64) * syc + qd * syd)
    out_plane = out_ptr + (nc * D + d).to(tl.int64) * (H * W)
    if HAS_BIAS:
        bias = tl.zeros((BLOCK_R,), dtype=out_ptr.dtype.element_ty) + tl.load(bias_ptr + c)
    else:
        bias = tl.zeros((BLOCK_R,), dtype=out_ptr.dtype.element_ty)
    if KIND == 2:
        for qh0 in range(0, QH, BLOCK_R):
            qh = qh0 + tl.arange(0, BLOCK_R)
            row_ok = qh < QH
            _write_rows(y_plane + qh * syh, out_plane + (START_H + STRIDE_H * qh) * W, row_ok, row_ok, bias, W,
                        START_W, STRIDE_W, QW, syw, HAS_BIAS, BLOCK_W, True)
    elif on_d:
        for h0 in range(0, H, BLOCK_R):
            h = h0 + tl.arange(0, BLOCK_R)
            qh, on_h = _phase_index(h, START_H, STRIDE_H, QH)
            row_ok = h < H
            if KIND == 1:
                _write_rows(y_plane, out_plane + h * W, on_h, row_ok & ~on_h, bias, W, START_W, STRIDE_W, QW, syw,
                            HAS_BIAS, BLOCK_W, False)
            else:
                _write_rows(y_plane + qh * syh, out_plane + h * W, on_h & row_ok, row_ok, bias, W, START_W,
                            STRIDE_W, QW, syw, HAS_BIAS, BLOCK_W, True)
    else:
        for h0 in range(0, H, BLOCK_R):
            h = h0 + tl.arange(0, BLOCK_R)
            row_ok = h < H
            _write_rows(y_plane, out_plane + h * W, row_ok, row_ok, bias, W, START_W, STRIDE_W, QW, syw, HAS_BIAS,
                        BLOCK_W, False)


# (rows per step, columns per piece, warps): not yet measured.
CONFIG = (8, 64, 4)


def write_phase_output(out: torch.Tensor, y, bias, plan: Plan, phases, kind: int = ALL_ROWS) -> None:
    """Write out (contiguous, plan.output_shape) from y, the compact result of `phases`, the plan's only phase that
    some tap reaches (its bias included), and bias (or zero) everywhere else: every row, the rows off the
    lattice (y unused: None will do), or the lattice's rows, as kind says. Offsets inside one plane of y, and the
    plane count, must fit in 32 bits (fits)."""
    if out.numel() == 0:
        return
    if y is None:
        y = out  # not read
    planes = plan.batch * plan.out_channels * (phases[0].out_count if kind == LATTICE_ROWS else plan.output_spatial[0])
    if planes == 0:
        return
    block_r, block_w, num_warps = CONFIG
    phase_output_kernel[(planes,)](
        y, out if bias is None else bias, out, *y.stride(),
        C=plan.out_channels, D=plan.output_spatial[0], H=plan.output_spatial[1], W=plan.output_spatial[2],
        START_D=phases[0].out_start, START_H=phases[1].out_start, START_W=phases[2].out_start,
        STRIDE_D=plan.stride[0], STRIDE_H=plan.stride[1], STRIDE_W=plan.stride[2],
        QD=phases[0].out_count, QH=phases[1].out_count, QW=phases[2].out_count, HAS_BIAS=bias is not None,
        BLOCK_R=block_r, BLOCK_W=block_w, KIND=kind, num_warps=num_warps)


def fits(plan: Plan, phases) -> bool:
    """Whether write_phase_output serves this layer: a plane count under 2**31 (the grid's first axis) and 32-bit
    offsets inside one sample of y (its layout may be channels-last)."""
    planes = plan.batch * plan.out_channels * plan.output_spatial[0]
    return planes < 2**31 and plan.out_channels * math.prod(p.out_count for p in phases) < 2**31
