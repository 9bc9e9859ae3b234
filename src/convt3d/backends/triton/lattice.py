"""Copy one phase's compact result into an output already filled with the bias (or zero), writing whole rows.

Where a single phase receives every tap (KernelBench L1/77: stride 2, dilation 2, so only odd output indices),
the phase path fills the output once and copies the phase's compact result into its lattice. A strided copy
writes every other element of a lattice row, so each 32-byte memory sector it touches is written in part and
the L2 must read it back from memory first (problem 77 on the H200: the copy 0.105 ms for 67 MB of results).
This kernel writes the lattice rows whole, the positions between lattice points with the fill value again, so
that their sectors are written in full: only the row ends share a sector with a neighbouring row.

Valid only where no other phase shares the lattice rows (one phase some tap reaches): the positions between
lattice points are then exactly the fill. A program owns the lattice rows of one output plane (or a block of
them), so an element costs a few adds, a masked load and a store.
(Writing the whole output this way, zeros included, measured slower than torch's fill plus the strided copy:
0.256-1.3 ms against 0.235, benchmarks/RESULTS.md.)
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...plan import Plan


@triton.jit
def lattice_rows_kernel(
    out_ptr, part_ptr, bias_ptr,
    C, QD, QH, OD, OH, OW, WIDTH,
    spn, spc, spd, sph, spw,
    START_D, START_H, START_W, QW,
    S_D: tl.constexpr, S_H: tl.constexpr, S_W: tl.constexpr,
    HAS_BIAS: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_W: tl.constexpr,
):
    """out[n, c, START_D + S_D*qd, START_H + S_H*qh, ow] for ow < WIDTH = part[n, c, qd, qh, qw] where
    ow = START_W + S_W*qw, else bias[c] (or 0). out contiguous (N, C, OD, OH, OW). Program (plane, block):
    plane = (n*C + c)*QD + qd, decomposed once per program; the block's rows qh need no division."""
    plane = tl.program_id(0)
    qd = plane % QD
    nc = plane // QD
    c = nc % C
    n = nc // C
    qh = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = qh < QH
    out_plane = out_ptr + ((nc.to(tl.int64) * OD + START_D + S_D * qd) * OH + START_H) * OW
    part_plane = part_ptr + n.to(tl.int64) * spn + c.to(tl.int64) * spc + qd.to(tl.int64) * spd
    ow = tl.arange(0, BLOCK_W)
    dw = ow - START_W
    # A negative distance's remainder may read 0 (C semantics): the sign is tested first.
    on = (dw >= 0) & (dw % S_W == 0) & (dw < S_W * QW)
    value = tl.load(part_plane + (qh.to(tl.int64) * sph)[:, None] + ((dw // S_W) * spw)[None, :],
                    mask=row_ok[:, None] & on[None, :], other=0.0)
    if HAS_BIAS:
        value = tl.where(on[None, :], value, tl.load(bias_ptr + c).to(value.dtype))
    tl.store(out_plane + (S_H * qh * OW)[:, None] + ow[None, :], value.to(out_ptr.dtype.element_ty),
             mask=row_ok[:, None] & (ow < WIDTH)[None, :])


def copy_into_lattice(out: torch.Tensor, part: torch.Tensor, bias, plan: Plan, phases) -> None:
    """out (contiguous, filled with bias or zero) gets part, the compact result of the one phase some tap
    reaches (N, C_out, count per axis; any strides), in that phase's lattice."""
    n, c, od, oh, ow = plan.output_shape
    planes, rows = n * c * phases[0].out_count, phases[1].out_count
    if planes * rows == 0 or phases[2].out_count == 0:
        return
    # The row's columns up to its last lattice point (the rest keeps the fill).
    width = phases[2].out_start + plan.axes[2].stride * (phases[2].out_count - 1) + 1
    block_w = triton.next_power_of_2(width)
    block_r = min(triton.next_power_of_2(rows), max(1, 4096 // block_w))
    lattice_rows_kernel[(planes, triton.cdiv(rows, block_r))](
        out, part, part if bias is None else bias,
        c, phases[0].out_count, rows, od, oh, ow, width, *part.stride(),
        *(p.out_start for p in phases), phases[2].out_count, *(a.stride for a in plan.axes),
        HAS_BIAS=bias is not None, BLOCK_R=block_r, BLOCK_W=block_w, num_warps=4,
    )
