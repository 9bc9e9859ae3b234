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
    out_ptr, part_ptr, bias_ptr, C, OD, OH,
    spn, spc, spd, sph, spw,
    START_D, COUNT_D, START_H, COUNT_H, START_W, COUNT_W,
    OW: tl.constexpr, S_D: tl.constexpr, S_H: tl.constexpr, S_W: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """out (N, C, OD, OH, OW) contiguous; part (N, C, COUNT_D, COUNT_H, COUNT_W) with strides sp*.

    A program writes BLOCK consecutive elements of one (n, c, od) slab of OH * OW. Where od is off the lattice
    the slab is the fill alone: no loads, no per-element arithmetic. Elsewhere each element splits into (oh,
    ow) by a division by the compile-time OW (a multiplication). Per-element instructions matter here: at
    the H200's bandwidth there are about 30 instruction slots per output element.
    """
    slab = tl.program_id(0)
    od = slab % OD
    nc = slab // OD
    c = nc % C
    e = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = e < OH * OW
    if HAS_BIAS:
        fill = tl.load(bias_ptr + c).to(out_ptr.dtype.element_ty)
    else:
        fill = 0.0
    out_ptr += slab.to(tl.int64) * OH * OW
    on_d, qd = _on_lattice(od, START_D, COUNT_D, S_D)
    if on_d:
        oh = e // OW
        on_h, qh = _on_lattice(oh, START_H, COUNT_H, S_H)
        on_w, qw = _on_lattice(e - oh * OW, START_W, COUNT_W, S_W)
        on = on_h & on_w & inside
        part_ptr += (nc // C).to(tl.int64) * spn + c.to(tl.int64) * spc + qd * spd
        part = tl.load(part_ptr + qh * sph + qw * spw, mask=on)
        tl.store(out_ptr + e, tl.where(on, part, fill).to(out_ptr.dtype.element_ty), mask=inside)
    else:
        tl.store(out_ptr + e, (tl.zeros([BLOCK], tl.float32) + fill).to(out_ptr.dtype.element_ty), mask=inside)


BLOCK = 1024


def assemble_single_phase(out: torch.Tensor, part: torch.Tensor, bias, plan: Plan, phases) -> None:
    """out (contiguous) <- part on the lattice of `phases` (one AxisPhase per axis), the bias or zero elsewhere."""
    batch, channels, od, oh, ow = out.shape
    grid = (batch * channels * od, triton.cdiv(oh * ow, BLOCK))
    lattice = [v for p in phases for v in (p.out_start, p.out_count)]
    assemble_kernel[grid](
        out, part, bias if bias is not None else part, channels, od, oh, *part.stride(), *lattice,
        OW=ow, S_D=plan.stride[0], S_H=plan.stride[1], S_W=plan.stride[2], HAS_BIAS=bias is not None,
        BLOCK=BLOCK, num_warps=4,
    )


def fits(out: torch.Tensor) -> bool:
    """Whether the kernel's 32-bit plane offsets and the launch grid's limits serve this output."""
    batch, channels, od, oh, ow = out.shape
    return channels * od * oh * ow < 2**31 and triton.cdiv(oh * ow, BLOCK) <= 65535
