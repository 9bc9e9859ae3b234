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
def _slab(slab, C, OD, START_D, COUNT_D, S_D: tl.constexpr, spn, spc, spd, bias_ptr, HAS_BIAS: tl.constexpr):
    """For the (n, c, od) slab number `slab` (scalars): whether od is on the lattice, the offset of the part's
    row (n, c, qd), and the fill value."""
    od = slab % OD
    nc = slab // OD
    c = nc % C
    on_d, qd = _on_lattice(od, START_D, COUNT_D, S_D)
    base = (nc // C).to(tl.int64) * spn + c.to(tl.int64) * spc + qd * spd
    if HAS_BIAS:
        fill = tl.load(bias_ptr + c).to(tl.float32)
    else:
        fill = 0.0
    return on_d, base, fill


@triton.jit
def assemble_kernel(
    out_ptr, part_ptr, bias_ptr, TOTAL, C, OD,
    spn, spc, spd, sph, spw,
    START_D, COUNT_D, START_H, COUNT_H, START_W, COUNT_W,
    OH: tl.constexpr, OW: tl.constexpr, S_D: tl.constexpr, S_H: tl.constexpr, S_W: tl.constexpr,
    HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr,
):
    """out (N, C, OD, OH, OW) contiguous, TOTAL elements; part (N, C, COUNT_D, COUNT_H, COUNT_W), strides sp*.

    A program writes the BLOCK consecutive elements [pid * BLOCK, (pid + 1) * BLOCK) of the flat output, so
    that every memory sector is written whole by one program in aligned vector stores: writing (n, c, od)
    slabs of OH * OW elements instead (unaligned where OH * OW is odd) ran at a third of the bandwidth on the
    H200. BLOCK <= OH * OW, so a block meets at most two slabs; (n, c, od) is split once per slab (scalars),
    and an element's (oh, ow) by divisions by compile-time constants (multiplications).
    """
    PLANE: tl.constexpr = OH * OW
    start = tl.program_id(0).to(tl.int64) * BLOCK
    slab = start // PLANE
    local = (start - slab * PLANE).to(tl.int32) + tl.arange(0, BLOCK)
    crossed = local >= PLANE  # in the next slab
    local = tl.where(crossed, local - PLANE, local)
    oh = local // OW
    on_h, qh = _on_lattice(oh, START_H, COUNT_H, S_H)
    on_w, qw = _on_lattice(local - oh * OW, START_W, COUNT_W, S_W)
    on_d0, base0, fill0 = _slab(slab, C, OD, START_D, COUNT_D, S_D, spn, spc, spd, bias_ptr, HAS_BIAS)
    on_d1, base1, fill1 = _slab(slab + 1, C, OD, START_D, COUNT_D, S_D, spn, spc, spd, bias_ptr, HAS_BIAS)
    inside = start + tl.arange(0, BLOCK) < TOTAL
    # (the interpreter takes no scalar boolean in a select: compare integers)
    on = (tl.where(crossed, on_d1.to(tl.int32), on_d0.to(tl.int32)) != 0) & on_h & on_w & inside
    offs = tl.where(crossed, (base1 - base0).to(tl.int32), 0) + qh * sph + qw * spw
    part = tl.load(part_ptr + base0 + offs, mask=on)
    value = tl.where(on, part.to(tl.float32), tl.where(crossed, fill1, fill0))
    tl.store(out_ptr + start + tl.arange(0, BLOCK), value.to(out_ptr.dtype.element_ty), mask=inside)


def assemble_single_phase(out: torch.Tensor, part: torch.Tensor, bias, plan: Plan, phases) -> None:
    """out (contiguous) <- part on the lattice of `phases` (one AxisPhase per axis), the bias or zero elsewhere."""
    batch, channels, od, oh, ow = out.shape
    block = min(1024, 1 << ((oh * ow).bit_length() - 1))  # a power of two <= OH * OW
    lattice = [v for p in phases for v in (p.out_start, p.out_count)]
    assemble_kernel[(triton.cdiv(out.numel(), block),)](
        out, part, bias if bias is not None else part, out.numel(), channels, od, *part.stride(), *lattice,
        OH=oh, OW=ow, S_D=plan.stride[0], S_H=plan.stride[1], S_W=plan.stride[2], HAS_BIAS=bias is not None,
        BLOCK=block, num_warps=4,
    )


def fits(out: torch.Tensor) -> bool:
    """Whether 32-bit offsets inside one sample serve this output (and its compact part, which is smaller)."""
    return out[0].numel() < 2**31 if out.shape[0] else False
