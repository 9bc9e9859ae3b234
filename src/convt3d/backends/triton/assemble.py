"""Write a whole conv_transpose3d output in one pass from the compact result of its one non-empty phase.

Where a single phase receives every tap (KernelBench L1/77: stride 2, dilation 2, so only odd output indices),
the phase path computes that phase on its compact grid and the rest of the output is zero (or the bias). Filling
the output and then copying the compact result into its strided lattice writes the output twice: the lattice
copy touches every memory sector again, half of it, so the L2 must read back what the fill wrote
(problem 77 on the H200: fill 0.122 + copy 0.105 ms against 0.125 for writing the output once). This kernel
writes each output element once, the lattice from the compact result and the rest the fill value.

A program owns a tile of one output plane (n, c, od): rows oh by columns ow. The plane's phase membership and
source are computed once per program, a row's once per row and a column's once per column, so an element costs
a few adds, a masked load and a store. (Dividing a flat index per element costs far more: integer work runs at
half the rate of float work on Hopper and bounded an earlier flat version, benchmarks/RESULTS.md.)
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...plan import Plan


@triton.jit
def assemble_kernel(
    out_ptr, part_ptr, bias_ptr,
    C, OD, OH, OW, W_BLOCKS, TILES,
    spn, spc, spd, sph, spw,
    START_D, START_H, START_W, QD, QH, QW,
    S_D: tl.constexpr, S_H: tl.constexpr, S_W: tl.constexpr,
    HAS_BIAS: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_W: tl.constexpr,
):
    """out[n, c, o] = part[n, c, q] where o = START + S*q on every axis with 0 <= q < Q, else bias[c] (or 0).
    out contiguous (N, C, OD, OH, OW); program plane*TILES + tile, plane = (n*C + c)*OD + od: a plane's tiles run
    one after the other, so the memory sectors they share (rows start unaligned) meet in the L2."""
    plane = tl.program_id(0) // TILES
    tile = tl.program_id(0) % TILES
    od = plane % OD
    c = plane // OD % C
    n = plane // OD // C
    dd = od - START_D
    # A negative distance's remainder may read 0 (C semantics): the sign is tested first.
    plane_on = (dd >= 0) & (dd % S_D == 0) & (dd < S_D * QD)
    oh = tile // W_BLOCKS * BLOCK_R + tl.arange(0, BLOCK_R)
    ow = tile % W_BLOCKS * BLOCK_W + tl.arange(0, BLOCK_W)
    dh, dw = oh - START_H, ow - START_W
    # (plane_on broadcast to the rows before the &: the interpreter rejects a scalar & a tensor.)
    row_on = (tl.zeros((BLOCK_R,), tl.int32) + plane_on.to(tl.int32) > 0) & (dh >= 0) & (dh % S_H == 0) & (dh < S_H * QH)
    col_on = (dw >= 0) & (dw % S_W == 0) & (dw < S_W * QW)
    on = row_on[:, None] & col_on[None, :]
    source = n.to(tl.int64) * spn + c * spc + (dd // S_D) * spd + ((dh // S_H) * sph).to(tl.int64)
    value = tl.load(part_ptr + source[:, None] + ((dw // S_W) * spw)[None, :], mask=on, other=0.0)
    if HAS_BIAS:
        value = tl.where(on, value, tl.load(bias_ptr + c).to(value.dtype))
    tl.store(out_ptr + plane.to(tl.int64) * OH * OW + (oh[:, None] * OW + ow[None, :]),
             value.to(out_ptr.dtype.element_ty), mask=(oh < OH)[:, None] & (ow < OW)[None, :])


# (BLOCK_R, BLOCK_W, num_warps): problem 77's planes are 65 x 65.
CONFIG = (16, 64, 4)


def assemble(part: torch.Tensor, bias, plan: Plan, phases, config=None) -> torch.Tensor:
    """The whole output (contiguous) from part, the compact result of the one phase some tap reaches (a tensor
    (N, C_out, count per axis), any strides); elsewhere bias[c] or zero."""
    block_r, block_w, num_warps = CONFIG if config is None else config
    out = torch.empty(plan.output_shape, dtype=part.dtype, device=part.device)
    n, c, od, oh, ow = plan.output_shape
    if out.numel() == 0:
        return out
    w_blocks = triton.cdiv(ow, block_w)
    tiles = triton.cdiv(oh, block_r) * w_blocks
    assemble_kernel[(n * c * od * tiles,)](
        out, part, part if bias is None else bias,
        c, od, oh, ow, w_blocks, tiles, *part.stride(),
        *(p.out_start for p in phases), *(p.out_count for p in phases), *(a.stride for a in plan.axes),
        HAS_BIAS=bias is not None, BLOCK_R=block_r, BLOCK_W=block_w, num_warps=num_warps,
    )
    return out


@triton.jit
def assemble_plane_kernel(
    out_ptr, part_ptr, bias_ptr,
    C, OD, OH,
    spn, spc, spd, sph, spw,
    START_D, START_H, START_W, QD, QH, QW,
    OW: tl.constexpr, S_D: tl.constexpr, S_H: tl.constexpr, S_W: tl.constexpr,
    HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr,
):
    """As assemble_kernel, one program per plane walking it flat in blocks: every lane used, and a division
    by the constant OW per element."""
    plane = tl.program_id(0)
    od = plane % OD
    c = plane // OD % C
    n = plane // OD // C
    dd = od - START_D
    plane_on = (dd >= 0) & (dd % S_D == 0) & (dd < S_D * QD)
    base = n.to(tl.int64) * spn + c * spc + (dd // S_D) * spd
    out_plane = out_ptr + plane.to(tl.int64) * OH * OW
    if HAS_BIAS:
        fill = tl.load(bias_ptr + c)
    for start in range(0, OH * OW, BLOCK):
        f = start + tl.arange(0, BLOCK)
        oh = f // OW
        ow = f - oh * OW
        dh, dw = oh - START_H, ow - START_W
        on = ((tl.zeros((BLOCK,), tl.int32) + plane_on.to(tl.int32) > 0) & (dh >= 0) & (dh % S_H == 0)
              & (dh < S_H * QH) & (dw >= 0) & (dw % S_W == 0) & (dw < S_W * QW))
        value = tl.load(part_ptr + base + (dh // S_H) * sph + (dw // S_W) * spw, mask=on, other=0.0)
        if HAS_BIAS:
            value = tl.where(on, value, fill.to(value.dtype))
        tl.store(out_plane + f, value.to(out_ptr.dtype.element_ty), mask=f < OH * OW)


def assemble_planes(part: torch.Tensor, bias, plan: Plan, phases, block=1024, num_warps=4) -> torch.Tensor:
    out = torch.empty(plan.output_shape, dtype=part.dtype, device=part.device)
    n, c, od, oh, ow = plan.output_shape
    if out.numel() == 0:
        return out
    assemble_plane_kernel[(n * c * od,)](
        out, part, part if bias is None else bias,
        c, od, oh, *part.stride(),
        *(p.out_start for p in phases), *(p.out_count for p in phases),
        OW=ow, S_D=plan.axes[0].stride, S_H=plan.axes[1].stride, S_W=plan.axes[2].stride,
        HAS_BIAS=bias is not None, BLOCK=block, num_warps=num_warps,
    )
    return out
