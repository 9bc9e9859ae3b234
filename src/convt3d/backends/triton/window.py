"""The operands of the CUDA phase correlation (backends/cuda/phase_conv.py), made by one Triton launch.

window[n, a, b, c, ch] = source[n, ch, a + start_d, b + start_h, c + start_w], zero outside the source: channels-last,
so that each position's channels are one contiguous row for the kernel's 16-byte copies, and padded so that every
tile's reads lie inside it. weight_taps[td, th, tw, o, i] = weight[i, o, td, th, tw] (the forward's orientation:
C_out x C_in per tap) or weight[o, i, td, th, tw] (grad_input's: C_in x C_out), contiguous. For TF32 both are
TF32-rounded to nearest as cuDNN rounds, so that the tensor cores read them as they lie; for 3xTF32 (split) the window
stays as it is (the kernel splits its fragments) and weight_taps gains a leading axis of two: the TF32 parts
hi = tf32(w) and lo = tf32(w - hi).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from . import cdiv, next_power_of_2
from .forward import _round_to_tf32
from .launch import Launcher


@triton.jit
def _window_row(source_ptr, window_ptr, program, COLUMN_BLOCKS, OFFSET, SN, SC, SD, SH, SW, D, H, W, XD, XH, XW,
                START_D, START_H, START_W, C: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_P: tl.constexpr,
                SPLIT: tl.constexpr):
    """BLOCK_P positions of one window row (n, a, b) x their channels: loaded along the source's positions, stored
    along the channels."""
    column_block = program % COLUMN_BLOCKS
    row = program // COLUMN_BLOCKS  # (n * XD + a) * XH + b
    b = row % XH
    a = row // XH % XD
    n = row // XH // XD
    c = column_block * BLOCK_P + tl.arange(0, BLOCK_P)
    ch = tl.arange(0, BLOCK_C)
    d = a + START_D + c * 0  # broadcast: the interpreter cannot mask with scalars
    h = b + START_H + c * 0
    w = c + START_W
    inside = (d >= 0) & (d < D) & (h >= 0) & (h < H) & (w >= 0) & (w < W)
    ok = inside[:, None] & (ch < C)[None, :]
    at = (OFFSET + n.to(tl.int64) * SN + (d.to(tl.int64) * SD + h.to(tl.int64) * SH + w.to(tl.int64) * SW)[:, None]
          + (ch.to(tl.int64) * SC)[None, :])
    value = tl.load(source_ptr + at, mask=ok, other=0.0)
    if not SPLIT:  # (3xTF32: the kernel splits the window's values itself)
        value = _round_to_tf32(value)
    out = row.to(tl.int64) * XW * C + (c * C)[:, None] + ch[None, :]
    tl.store(window_ptr + out, value, mask=(c < XW)[:, None] & (ch < C)[None, :])


@triton.jit
def _weight_taps(weight_ptr, taps_ptr, program, TAP_ELEMENTS, O, I, WO, WI, WD, WH, WW, KH, KW,
                 BLOCK_T: tl.constexpr, SPLIT: tl.constexpr):
    """BLOCK_T elements of weight_taps (kD, kH, kW, O, I), flat, from the weight through its strides; with SPLIT the
    hi parts there and the lo parts TAP_ELEMENTS further."""
    e = program * BLOCK_T + tl.arange(0, BLOCK_T)
    i = e % I
    o = e // I % O
    tap = e // (I * O)
    ok = e < TAP_ELEMENTS
    at = o * WO + i * WI + tap // (KH * KW) * WD + tap // KW % KH * WH + tap % KW * WW
    value = tl.load(weight_ptr + at, mask=ok)
    hi = _round_to_tf32(value)
    tl.store(taps_ptr + e, hi, mask=ok)
    if SPLIT:
        tl.store(taps_ptr + TAP_ELEMENTS + e, _round_to_tf32(value - hi), mask=ok)


@triton.jit
def correlation_operands_kernel(
    source_ptr, window_ptr, weight_ptr, taps_ptr,
    WINDOW_PROGRAMS, COLUMN_BLOCKS, OFFSET, SN, SC, SD, SH, SW, D, H, W, XD, XH, XW, START_D, START_H, START_W,
    TAP_ELEMENTS, O, I, WO, WI, WD, WH, WW, KH, KW,
    C: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_T: tl.constexpr, SPLIT: tl.constexpr,
):
    """Both operands in one launch (a launch's host time shows on the GPU machine): programs below WINDOW_PROGRAMS
    make the window, the others the weight taps."""
    program = tl.program_id(0)
    if program < WINDOW_PROGRAMS:
        _window_row(source_ptr, window_ptr, program, COLUMN_BLOCKS, OFFSET, SN, SC, SD, SH, SW, D, H, W, XD, XH, XW,
                    START_D, START_H, START_W, C, BLOCK_C, BLOCK_P, SPLIT)
    else:
        _weight_taps(weight_ptr, taps_ptr, program - WINDOW_PROGRAMS, TAP_ELEMENTS, O, I, WO, WI, WD, WH, WW, KH, KW,
                     BLOCK_T, SPLIT)


_launch = Launcher(correlation_operands_kernel)

BLOCK_T = 1024


def correlation_operands(source: torch.Tensor, offset: int, shape, strides, start, extent, weight: torch.Tensor,
                         grad_input_orientation: bool, split: bool = False):
    """(window, weight_taps) as above, for TF32 or (split) 3xTF32. The source (N, C, D, H, W) is read through the
    given shape and strides from element `offset` of source.data_ptr() on (a lattice of grad_output, or the input
    itself); extent: the window's (XD, XH, XW); start: the source position of window position 0 along each axis."""
    grid, scalars, options, window_shape = _geometry(offset, tuple(shape), tuple(strides), tuple(start),
                                                     tuple(extent), tuple(weight.shape), weight.stride(),
                                                     grad_input_orientation, split)
    window = torch.empty(window_shape, dtype=torch.float32, device=source.device)
    kd, kh, kw = weight.shape[2:]
    o, i = (weight.shape[0], weight.shape[1]) if grad_input_orientation else (weight.shape[1], weight.shape[0])
    taps = torch.empty((2, kd, kh, kw, o, i) if split else (kd, kh, kw, o, i), dtype=torch.float32,
                       device=weight.device)
    _launch.launch(grid, (source, window, weight, taps), scalars, options)
    return window, taps


@functools.lru_cache(maxsize=1024)
def _geometry(offset, shape, strides, start, extent, weight_shape, weight_strides, grad_input_orientation, split):
    """(grid, scalar arguments, constexprs and options, the window's shape), once per layer."""
    n, c, d, h, w = shape
    xd, xh, xw = extent
    block_p = min(64, next_power_of_2(xw))
    column_blocks = cdiv(xw, block_p)
    window_programs = n * xd * xh * column_blocks
    c_in, c_out, kd, kh, kw = weight_shape
    w_ci, w_co, *w_taps = weight_strides
    o, i, wo, wi = (c_in, c_out, w_ci, w_co) if grad_input_orientation else (c_out, c_in, w_co, w_ci)
    tap_elements = kd * kh * kw * o * i
    scalars = (window_programs, column_blocks, offset, *strides, d, h, w, xd, xh, xw, *start,
               tap_elements, o, i, wo, wi, *w_taps, kh, kw)
    options = (("C", c), ("BLOCK_C", next_power_of_2(c)), ("BLOCK_P", block_p), ("BLOCK_T", BLOCK_T),
               ("SPLIT", split), ("num_warps", 4))
    grid = (window_programs + cdiv(tap_elements, BLOCK_T),)
    return grid, scalars, options, (n, xd, xh, xw, c)
