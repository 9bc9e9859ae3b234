"""The operands of the CUDA phase correlation (backends/cuda/phase_conv.py), made by one Triton launch.

window[n, a, b, c, ch] = source[n, ch, a + start_d, b + start_h, c + start_w], zero outside the source: channels-last,
so that each position's channels are one contiguous row for the kernel's 16-byte copies, and padded so that every
tile's reads lie inside it. weight_taps[td, th, tw, o, i] = weight[i, o, td, th, tw] (the forward's orientation:
C_out x C_in per tap) or weight[o, i, td, th, tw] (grad_input's: C_in x C_out), contiguous. For TF32 both are
TF32-rounded to nearest as cuDNN rounds, so that the tensor cores read them as they lie. With TF32 off the window stays
as it is (the kernel splits its fragments); for 3xTF32 (split 1) weight_taps gains a leading axis of two, the TF32
parts hi = tf32(w) and lo = tf32(w - hi); for 3xFP16 (split 2) it holds scaled FP16 parts (_weight_halves), and each
window program also stores its block's largest magnitude, from which the kernel scales the window. For a kernel that
reads the source itself (cuda/row_runs.py's INPUT_DIRECT), the pass makes only those maxima and the weight's parts,
and for one that also finds its planes' scales itself (row_runs.py's OWN_MAXIMA) only the weight's parts.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from . import cdiv, next_power_of_2
from .forward import _round_to_tf32, let_next_start
from .launch import Launcher


@triton.jit
def _finite_magnitude(value):
    """|value| where finite, else 0: the FP16 splits' scales come from these maxima, and inf and NaN pass through the
    scaled MMAs as they are (counted in a maximum, an inf would scale the rest of its tile or channel to zero)."""
    magnitude = tl.abs(value)
    return tl.where(magnitude <= 3.4028234663852886e38, magnitude, 0.0)


@triton.jit
def _window_block(program, COLUMN_BLOCKS, XD, XH):
    """(column block, row, n, a, b) of a window program: row (n * XD + a) * XH + b of the window, its column blocks
    fastest."""
    column_block = program % COLUMN_BLOCKS
    row = program // COLUMN_BLOCKS
    return column_block, row, row // XH // XD, row // XH % XD, row % XH


@triton.jit
def _window_row(source_ptr, window_ptr, block_max_ptr, program, COLUMN_BLOCKS, OFFSET, SN, SC, SD, SH, SW, D, H, W,
                XD, XH, XW, START_D, START_H, START_W, C: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_P: tl.constexpr,
                SPLIT: tl.constexpr):
    """BLOCK_P positions of one window row (n, a, b) x their channels: loaded along the source's positions, stored
    along the channels."""
    column_block, row, n, a, b = _window_block(program, COLUMN_BLOCKS, XD, XH)
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
    if SPLIT == 0:  # (3xTF32, 3xFP16: the kernel splits the window's values itself)
        value = _round_to_tf32(value)
    if SPLIT == 2:  # the block's largest finite magnitude, from which the kernel scales its planes
        tl.store(block_max_ptr + program, tl.max(tl.max(_finite_magnitude(value), 1), 0))
    out = row.to(tl.int64) * XW * C + (c * C)[:, None] + ch[None, :]
    tl.store(window_ptr + out, value, mask=(c < XW)[:, None] & (ch < C)[None, :])


@triton.jit
def _row_maxima(source_ptr, block_max_ptr, program, COLUMN_BLOCKS, OFFSET, SN, SC, SD, SH, SW, D, H, W, XD, XH,
                START_D, START_H, START_W, C: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_P: tl.constexpr,
                BLOCK_W: tl.constexpr):
    """The largest finite magnitude of one window row's block of BLOCK_P positions, without the window: the source's
    columns that the block covers, channels by columns, BLOCK_W columns at a time from a multiple of 4 on, so that a
    row's loads are whole 16-byte words where the source allows. On the H200 (sixty-ninth session) problem 77's pass
    without the window took 0.0186 ms with this tile (the minimum of 100 calls), 0.0235 with _window_row's (positions
    by channels)."""
    column_block, _, n, a, b = _window_block(program, COLUMN_BLOCKS, XD, XH)
    first = START_W + column_block * BLOCK_P  # the block's first column in the source
    low = tl.maximum(first, 0)
    high = tl.minimum(first + BLOCK_P, W)  # (past the window's XW columns too, as _window_row's maxima)
    ch = tl.arange(0, BLOCK_C)
    row_at = OFFSET + n.to(tl.int64) * SN + (a + START_D).to(tl.int64) * SD + (b + START_H).to(tl.int64) * SH
    largest = tl.zeros([BLOCK_C, BLOCK_W], dtype=tl.float32)
    for start in range(low // 4 * 4, high, BLOCK_W):
        w = tl.multiple_of(start, 4) + tl.arange(0, BLOCK_W)
        d = a + START_D + w * 0  # broadcast: the interpreter cannot mask with scalars
        h = b + START_H + w * 0
        inside = (d >= 0) & (d < D) & (h >= 0) & (h < H) & (w >= low) & (w < high)
        value = tl.load(source_ptr + row_at + (ch.to(tl.int64) * SC)[:, None] + (w.to(tl.int64) * SW)[None, :],
                        mask=(ch < C)[:, None] & inside[None, :], other=0.0)
        largest = tl.maximum(largest, _finite_magnitude(value))
    tl.store(block_max_ptr + program, tl.max(tl.max(largest, 1), 0))


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
def _tap_block(weight_ptr, o, first, TAPS, I, WO, WI, WD, WH, WW, KH, KW, BLOCK_I: tl.constexpr,
               BLOCK_TAPS: tl.constexpr):
    """(taps, mask, values): output channel o's row of the taps first.. first + BLOCK_TAPS (0 past the last)."""
    i = tl.arange(0, BLOCK_I)
    tap = first + tl.arange(0, BLOCK_TAPS)
    ok = (tap < TAPS)[:, None] & (i < I)[None, :]
    at = o * WO + (tap // (KH * KW) * WD + tap // KW % KH * WH + tap % KW * WW)[:, None] + (i * WI)[None, :]
    return tap, ok, tl.load(weight_ptr + at, mask=ok, other=0.0)


@triton.jit
def _weight_halves(weight_ptr, halves_ptr, inverse_ptr, o, TAPS, O, I, WO, WI, WD, WH, WW, KH, KW,
                   BLOCK_I: tl.constexpr, BLOCK_TAPS: tl.constexpr):
    """3xFP16: output channel o's row of every tap, scaled by the power of two that takes its largest magnitude into
    [2^14, 2^15) (as phase_conv.py's pow2_scale), as halves hi = f16(w s) and lo = f16(w s - hi), and 1 / s at
    inverse_ptr + o. Each 32 channels' row is 32 hi halves then 32 lo halves, within each 16 channel c at position
    (c & 8) | (c & 3) * 2 | (c >> 2) & 1: the order in which the kernel's A fragments hold the window's channels."""
    amax = tl.zeros([BLOCK_TAPS, BLOCK_I], dtype=tl.float32)
    for first in range(0, TAPS, BLOCK_TAPS):
        _, _, value = _tap_block(weight_ptr, o, first, TAPS, I, WO, WI, WD, WH, WW, KH, KW, BLOCK_I, BLOCK_TAPS)
        amax = tl.maximum(amax, _finite_magnitude(value))
    amax = tl.max(tl.max(amax, 1), 0)
    exponent = tl.minimum(tl.maximum(268 - ((amax.to(tl.int32, bitcast=True) >> 23) & 0xFF), 1), 253)
    scale = (exponent << 23).to(tl.float32, bitcast=True)
    tl.store(inverse_ptr + o, ((254 - exponent) << 23).to(tl.float32, bitcast=True))
    i = tl.arange(0, BLOCK_I)
    position = (i // 32) * 64 + (i // 16 % 2) * 16 + (i & 8) + (i & 3) * 2 + (i >> 2 & 1)
    for first in range(0, TAPS, BLOCK_TAPS):
        tap, ok, value = _tap_block(weight_ptr, o, first, TAPS, I, WO, WI, WD, WH, WW, KH, KW, BLOCK_I, BLOCK_TAPS)
        value = value * scale
        hi = value.to(tl.float16)
        lo = (value - hi.to(tl.float32)).to(tl.float16)
        out = ((tap * O + o) * I * 2)[:, None] + position[None, :]
        tl.store(halves_ptr + out, hi, mask=ok)
        tl.store(halves_ptr + out + 32, lo, mask=ok)


@triton.jit
def correlation_operands_kernel(
    source_ptr, window_ptr, weight_ptr, taps_ptr, block_max_ptr, inverse_ptr,
    WEIGHT_PROGRAMS, COLUMN_BLOCKS, OFFSET, SN, SC, SD, SH, SW, D, H, W, XD, XH, XW, START_D, START_H, START_W,
    TAP_ELEMENTS, O, I, WO, WI, WD, WH, WW, KH, KW,
    C: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_T: tl.constexpr, SPLIT: tl.constexpr,
    WINDOW: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_I: tl.constexpr, BLOCK_TAPS: tl.constexpr,
    EARLY: tl.constexpr,
):
    """Both operands in one launch (a launch's host time shows on the GPU machine): programs below WEIGHT_PROGRAMS make
    the weight taps, the others the window (without it, its block maxima). The weight's programs come first: under
    3xFP16 each reads an output channel's whole row twice, one tile after another. Placed first rather than last,
    with TF32 off (twenty-seventh session): k3s1p1's pass 15.7 -> 13.2 us, vae_k4s2p1's 24-27 -> 23,
    video_spatial_k144's 10.2 -> 10.6. EARLY: the kernel launched after this one as its dependent may start once every
    program here has begun (cuda.DEPENDENT)."""
    if EARLY:
        let_next_start()
    program = tl.program_id(0)
    if program >= WEIGHT_PROGRAMS:
        if WINDOW:
            _window_row(source_ptr, window_ptr, block_max_ptr, program - WEIGHT_PROGRAMS, COLUMN_BLOCKS, OFFSET, SN,
                        SC, SD, SH, SW, D, H, W, XD, XH, XW, START_D, START_H, START_W, C, BLOCK_C, BLOCK_P, SPLIT)
        else:
            _row_maxima(source_ptr, block_max_ptr, program - WEIGHT_PROGRAMS, COLUMN_BLOCKS, OFFSET, SN, SC, SD, SH,
                        SW, D, H, W, XD, XH, START_D, START_H, START_W, C, BLOCK_C, BLOCK_P, BLOCK_W)
    elif SPLIT == 2:
        _weight_halves(weight_ptr, taps_ptr, inverse_ptr, program, TAP_ELEMENTS // (O * I), O, I, WO, WI, WD, WH, WW,
                       KH, KW, BLOCK_I, BLOCK_TAPS)
    else:
        _weight_taps(weight_ptr, taps_ptr, program, TAP_ELEMENTS, O, I, WO, WI, WD, WH, WW, KH, KW, BLOCK_T, SPLIT)


_launch = Launcher(correlation_operands_kernel)

BLOCK_T = 1024


def correlation_operands(source: torch.Tensor, offset: int, shape, strides, start, extent, weight: torch.Tensor,
                         grad_input_orientation: bool, split: int = 0, window: bool = True, early: bool = False,
                         maxima: bool = True):
    """(window, weight_taps, scales) as above, for TF32 (split 0), 3xTF32 (1) or 3xFP16 (2; and FP16, 3, the same:
    weight_taps float16 (kD, kH, kW, O, 2 I) as _weight_halves lays it out; scales (block maxima (N, XD, XH, column
    blocks), the blocks' columns, the weight's inverse scales (O,)), else None). The source (N, C, D, H, W) is read
    through the given shape and strides from element `offset` of source.data_ptr() on (a lattice of grad_output, or
    the input itself); extent: the window's (XD, XH, XW); start: the source position of window position 0 along each
    axis. window False (3xFP16 and FP16 only, for a kernel that reads the source itself): no window is made, only
    its block maxima (the window returned is None), and with maxima False not those either (block maxima returned
    unwritten); early: operands_at_addresses'."""
    split = min(split, 2)  # (FP16, split 3, reads 3xFP16's operands: their lo parts unused)
    if not window and split != 2:
        raise ValueError("convt3d: operands without the window need the FP16 splits' block maxima (split 2 or 3)")
    grid, scalars, options, window_shape, block_p = _geometry(offset, tuple(shape), tuple(strides), tuple(start),
                                                              tuple(extent), tuple(weight.shape), weight.stride(),
                                                              grad_input_orientation, split, window, early,
                                                              maxima)
    device = source.device
    window_values = torch.empty(window_shape, dtype=torch.float32, device=device) if window else None
    kd, kh, kw = weight.shape[2:]
    o, i = (weight.shape[0], weight.shape[1]) if grad_input_orientation else (weight.shape[1], weight.shape[0])
    if split == 2:
        if i % 32:
            raise ValueError(f"convt3d: 3xFP16 operands need a multiple of 32 input channels, got {i}")
        taps = torch.empty((kd, kh, kw, o, 2 * i), dtype=torch.float16, device=device)
        block_max = torch.empty((*window_shape[:3], cdiv(window_shape[3], block_p)), dtype=torch.float32,
                                device=device)
        inverse = torch.empty(o, dtype=torch.float32, device=device)
        scales = (block_max, block_p, inverse)
    else:
        taps = torch.empty((2, kd, kh, kw, o, i) if split else (kd, kh, kw, o, i), dtype=torch.float32, device=device)
        block_max = inverse = taps  # (not read)
        scales = None
    written = window_values if window else block_max  # (without the window: a float32 pointer, not written)
    _launch.launch(grid, (source, written, weight, taps, block_max, inverse), scalars, options)
    return window_values, taps, scales


def operands_at_addresses(device: int, shape, strides, start, extent, weight: torch.Tensor, split: int,
                          window: bool = True, early: bool = False, maxima: bool = True):
    """correlation_operands of a source with these shape and strides (at element 0 of its data) and a weight of
    weight's shape, strides and dtype, in the forward's orientation, with or without the window, for a prepared call:
    (operand_buffer's size, window shape and scale blocks, and a function (stream, source address, weight address,
    buffer address) -> (window (without it: the buffer's start, not written), weight taps, block maxima, inverse
    scales) addresses, that launches the pass there). None where no
    compiled launch at addresses is at hand (an earlier call with 16-byte aligned pointers on device compiles it) or
    in the interpreter. The caller checks what BoundLaunch.at_addresses leaves to it: every address 16-byte aligned,
    device current, no launch hook. early: the kernel launched next, as the pass's dependent, may start once every
    program of the pass has begun (a CUDA device of compute capability 9 or more). maxima False (without the window
    only): no block maxima either, only the weight's parts (for a kernel that finds its scales itself)."""
    split = min(split, 2)
    grid, scalars, options, _, _ = _geometry(0, tuple(shape), tuple(strides), tuple(start), tuple(extent),
                                             tuple(weight.shape), weight.stride(), False, split, window, early,
                                             maxima)
    taps_dtype = torch.float16 if split == 2 else torch.float32
    dtypes = (weight.dtype, torch.float32, weight.dtype, taps_dtype, torch.float32, torch.float32)
    launch = _launch.bind(grid, scalars, options).at_addresses(device, dtypes)
    if launch is None:
        return None
    size, offsets, window_shape, scale_blocks = operand_buffer(shape, strides, start, extent, weight.shape,
                                                               weight.stride(), split, window)

    def run(stream, source, weight, buffer):
        window_at, taps_at, block_max_at, inverse_at = (buffer + offset for offset in offsets)
        launch(stream, source, window_at, weight, taps_at, block_max_at, inverse_at)
        return window_at, taps_at, block_max_at, inverse_at

    return size, window_shape, scale_blocks, run


def operand_buffer(shape, strides, start, extent, weight_shape, weight_strides, split: int, window: bool = True):
    """One buffer for what correlation_operands(source, 0, shape, strides, start, extent, weight, window=window)
    allocates in the forward's orientation: (its bytes, the byte offsets of the window (none without it: 0), the
    weight taps, the block maxima and the
    inverse scales in it, each part 256-byte aligned as an allocation of its own would be (the last two the taps'
    where split < 2: passed, not read), the window's shape, and scale_blocks as cuda.phase_launches takes them:
    (the block maxima's columns per block, their blocks per row) under 3xFP16, else None)."""
    split = min(split, 2)
    _, _, _, window_shape, block_p = _geometry(0, tuple(shape), tuple(strides), tuple(start), tuple(extent),
                                               tuple(weight_shape), tuple(weight_strides), False, split)
    c_in, c_out, kd, kh, kw = weight_shape
    n, xd, xh, xw, c = window_shape
    taps = kd * kh * kw * c_out * c_in
    parts = [4 * n * xd * xh * xw * c if window else 0,
             2 * 2 * taps if split == 2 else 4 * taps * (2 if split else 1)]
    if split == 2:
        parts += [4 * n * xd * xh * cdiv(xw, block_p), 4 * c_out]
    offsets, size = [], 0
    for part in parts:
        offsets.append(size)
        size += cdiv(part, 256) * 256
    if split < 2:
        offsets += [offsets[1], offsets[1]]
    return size, tuple(offsets), window_shape, (block_p, cdiv(xw, block_p)) if split == 2 else None


@functools.lru_cache(maxsize=1024)
def _geometry(offset, shape, strides, start, extent, weight_shape, weight_strides, grad_input_orientation, split,
              window: bool = True, early: bool = False, maxima: bool = True):
    """(grid, scalar arguments, constexprs and options, the window's shape, its column blocks' positions), once per
    layer."""
    n, c, d, h, w = shape
    xd, xh, xw = extent
    block_p = min(64, next_power_of_2(xw))
    column_blocks = cdiv(xw, block_p)
    window_programs = n * xd * xh * column_blocks if window or maxima else 0
    c_in, c_out, kd, kh, kw = weight_shape
    w_ci, w_co, *w_taps = weight_strides
    o, i, wo, wi = (c_in, c_out, w_ci, w_co) if grad_input_orientation else (c_out, c_in, w_co, w_ci)
    tap_elements = kd * kh * kw * o * i
    weight_programs = o if split == 2 else cdiv(tap_elements, BLOCK_T)
    scalars = (weight_programs, column_blocks, offset, *strides, d, h, w, xd, xh, xw, *start,
               tap_elements, o, i, wo, wi, *w_taps, kh, kw)
    block_i = next_power_of_2(i)
    options = (("C", c), ("BLOCK_C", next_power_of_2(c)), ("BLOCK_P", block_p), ("BLOCK_T", BLOCK_T),
               ("SPLIT", int(split)), ("WINDOW", int(window)),
               ("BLOCK_W", 1 if window else min(block_p, next_power_of_2(w))), ("BLOCK_I", block_i),
               ("BLOCK_TAPS", min(next_power_of_2(kd * kh * kw), max(1, 2048 // block_i))), ("EARLY", early),
               ("num_warps", 4))
    grid = (weight_programs + window_programs,)
    return grid, scalars, options, (n, xd, xh, xw, c), block_p
