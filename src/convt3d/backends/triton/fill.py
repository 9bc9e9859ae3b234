"""The bias (or zero) on every output row but the lattice rows of a layer's only reached phase, by one Triton launch.

Beside the CUDA phase correlation writing those lattice rows whole (backends/cuda, ROWS), on another stream: the two
kernels write disjoint rows of the output at the same time, every element once.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from . import cdiv
from .launch import Launcher


@triton.jit
def fill_rows_kernel(
    out_ptr, bias_ptr, C, OD, QD, QH,
    S_D: tl.constexpr, S_H: tl.constexpr, L_D: tl.constexpr, L_H: tl.constexpr, OH: tl.constexpr,
    OW: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr,
):
    """A program per output plane (n, c, od) of a contiguous NCDHW output: the bias over the whole plane, or, on a
    lattice plane (od = S_D * qd + L_D, qd < QD), over its rows other than the lattice rows (oh = S_H * qh + L_H,
    qh < QH). Flat over the plane, so that consecutive lanes write consecutive elements across row ends."""
    program = tl.program_id(0)
    od = program % OD
    c = program // OD % C
    if HAS_BIAS:
        value = tl.load(bias_ptr + c).to(out_ptr.dtype.element_ty)
    else:
        value = tl.zeros((), dtype=out_ptr.dtype.element_ty)
    plane = out_ptr + program.to(tl.int64) * (OH * OW)
    for start in range(0, OH * OW, BLOCK):
        e = start + tl.arange(0, BLOCK)
        oh = e // OW
        od_e = od + e * 0  # broadcast: the interpreter cannot mask with scalars
        lattice_plane = (od_e >= L_D) & ((od_e - L_D) % S_D == 0) & ((od_e - L_D) // S_D < QD)
        lattice_row = (oh >= L_H) & ((oh - L_H) % S_H == 0) & ((oh - L_H) // S_H < QH)
        write = (e < OH * OW) & ~(lattice_row & lattice_plane)
        tl.store(plane + e, tl.zeros([BLOCK], dtype=out_ptr.dtype.element_ty) + value, mask=write)


_launch = Launcher(fill_rows_kernel)


def fill_all_but_lattice_rows(out: torch.Tensor, bias, stride, first, grid) -> None:
    """out (N, C, OD, OH, OW), contiguous: the bias (zero where None) on every row except the lattice rows of the
    phase whose first output position is `first` (per axis), of the given stride, over its compact grid."""
    n, c, od, oh, ow = out.shape
    launch, scalars, options = _geometry(n, c, od, oh, ow, tuple(stride), tuple(first), tuple(grid), bias is not None)
    _launch.launch(launch, (out, bias if bias is not None else out), scalars, options)


@functools.lru_cache(maxsize=256)
def _geometry(n, c, od, oh, ow, stride, first, grid, has_bias):
    options = (("S_D", stride[0]), ("S_H", stride[1]), ("L_D", first[0]), ("L_H", first[1]), ("OH", oh), ("OW", ow),
               ("HAS_BIAS", has_bias), ("BLOCK", 1024), ("num_warps", 4))
    return (n * c * od,), (c, od, grid[0], grid[1]), options
