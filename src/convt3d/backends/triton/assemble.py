"""Write a whole output from one phase's compact result in a single pass.

When a single 3D phase is reached by taps (KernelBench L1/77: stride 2, dilation 2, so every tap lands on
odd outputs), the output is that phase's compact result on a lattice o = start + stride*q and the bias (or
zero) everywhere else. Filling the output and then copying the compact result into a strided view of it
writes the lattice's memory twice and the copy's stores are element-strided; here every output element is
written once, in contiguous vector stores, and the compact result is read once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...plan import Plan


@triton.jit
def _on_lattice(o, START, COUNT, STRIDE: tl.constexpr):
    """(o on the lattice START + STRIDE*q, q in [0, COUNT); q clamped into range so masked lanes stay in bounds)."""
    j = o - START
    on = (j >= 0) & (j < STRIDE * COUNT) & (j % STRIDE == 0)
    q = tl.minimum(tl.maximum(j, 0) // STRIDE, COUNT - 1)
    return on, q


@triton.jit
def assemble_kernel(
    out_ptr, part_ptr, bias_ptr, CHUNKS,
    spn, spc, spd, sph, spw,
    START_D, COUNT_D, START_H, COUNT_H, START_W, COUNT_W,
    C: tl.constexpr, OD: tl.constexpr, OH: tl.constexpr, OW: tl.constexpr,
    S_D: tl.constexpr, S_H: tl.constexpr, S_W: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr,
):
    """out (N, C, OD, OH, OW) contiguous; part (N, C, COUNT_D, COUNT_H, COUNT_W) with strides sp*.

    A program writes BLOCK consecutive elements of one (n, c) plane. The plane's sizes are compile-time
    constants, so splitting a flat offset into (od, oh, ow) costs multiplications, not divisions.
    """
    pid = tl.program_id(0)
    nc = pid // CHUNKS
    n = (nc // C).to(tl.int64)
    c = nc % C
    PLANE: tl.constexpr = OD * OH * OW
    p = (pid % CHUNKS) * BLOCK + tl.arange(0, BLOCK)
    inside = p < PLANE
    row = p // OW
    ow = p - row * OW
    od = row // OH
    oh = row - od * OH
    on_d, qd = _on_lattice(od, START_D, COUNT_D, S_D)
    on_h, qh = _on_lattice(oh, START_H, COUNT_H, S_H)
    on_w, qw = _on_lattice(ow, START_W, COUNT_W, S_W)
    on = on_d & on_h & on_w & inside
    part = tl.load(part_ptr + n * spn + c.to(tl.int64) * spc + qd * spd + qh * sph + qw * spw, mask=on)
    if HAS_BIAS:
        fill = tl.load(bias_ptr + c).to(part.dtype)
    else:
        fill = 0.0
    value = tl.where(on, part, fill).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + nc.to(tl.int64) * PLANE + p, value, mask=inside)


BLOCK = 2048


def assemble_single_phase(out: torch.Tensor, part: torch.Tensor, bias, plan: Plan, phases) -> None:
    """out (contiguous) <- part on the lattice of `phases` (one AxisPhase per axis), the bias or zero elsewhere."""
    batch, channels, *spatial = out.shape
    chunks = triton.cdiv(spatial[0] * spatial[1] * spatial[2], BLOCK)
    grid = (batch * channels * chunks,)
    lattice = [v for p in phases for v in (p.out_start, p.out_count)]
    assemble_kernel[grid](
        out, part, bias if bias is not None else part, chunks, *part.stride(), *lattice,
        C=channels, OD=spatial[0], OH=spatial[1], OW=spatial[2], S_D=plan.stride[0], S_H=plan.stride[1],
        S_W=plan.stride[2], HAS_BIAS=bias is not None, BLOCK=BLOCK, num_warps=8,
    )
