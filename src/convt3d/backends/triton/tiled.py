"""Triton forward for layers whose kernel tiles the output: kernel_size == stride, no padding.

Along an axis with kernel k == stride s (dilation 1, or k == 1), padding 0 and output_padding 0, output o = s*i + t
receives exactly one (input, tap) pair: i = o // s, t = o % s. No output is empty and none sums several taps, so
the layer is one GEMM whose result is scattered like a pixel shuffle:

    y[n, co, KD*d + kd, KH*h + kh, KW*w + kw] = bias[co] + sum over ci of x[n, ci, d, h, w] * weight[ci, co, kd, kh, kw]

with M = the input positions (n, d, h, w), K = the input channels and N = (kd, kh, co, kw). A program computes
BLOCK_R rows of BLOCK_Q columns of one input plane (n, d) against BLOCK_CO output channels and every kw of one
(kd, kh); interleaving the kw in registers makes each of its output rows one contiguous run of BLOCK_Q * KW
elements. This is the 3D U-Net decoder's k2 s2 layer, which the general kernel (forward.py) computes as eight
phases of one tap each.

Float32 operands are laid out K-major beforehand (the layout Hopper's tensor cores read TF32 from): the input
channels-last and the weight as (KD*KH, C_out, KW, C_in), split for 3xTF32 as forward.py's precisions say. In TF32
mode they are TF32-rounded and stored as FP16 scaled by powers of two (FP16_SCALED): FP16 keeps TF32's 11 significant
bits, its MMAs run at twice TF32's rate on half the bytes. The scale is one per input position (a GEMM row) and one
per weight row (a GEMM column), taken from that row's largest magnitude, so it factors out of every sum the
kernel forms: the kernel multiplies each sum by the two inverse scales once, in its epilogue. Every value within 2^28
of its row's largest is then exactly its TF32 rounding; smaller ones lie in FP16's subnormals and keep fewer bits.
With CONVT3D_TF32_AS_FP16=0 (or TF32_AS_FP16 = False) the operands stay TF32. Half-precision operands are read as
given.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from ... import environment
from ...plan import Plan
from . import NATIVE, TF32, TF32X3, cdiv, interpreted, next_power_of_2, pass_lets_main_start, precision_for
from .forward import (_channels_last, _fp16_scale_exponent, _operand_layout, _power_of_2, _round_to_tf32,
                      _store_operand, allocate_operands, allocate_output, at_addresses_else, contiguous_views,
                      dependent_options, flat_input, let_next_start, mma, operand_offsets, pick_config,
                      wait_for_previous)
from .launch import Launcher

# TF32 mode's operands as FP16 scaled by powers of two (the module docstring); set before a layer's first call, as
# calls are prepared per layer.
TF32_AS_FP16 = environment.switch("CONVT3D_TF32_AS_FP16", True)
# This module's precision for those operands, beside forward.py's NATIVE, TF32 and TF32X3.
FP16_SCALED = 3


@functools.lru_cache(maxsize=256)
def unsupported_reason(plan: Plan) -> str | None:
    """None when the kernel tiles the output (this module's kernel serves the layer), else why not."""
    if plan.groups != 1:
        return "groups > 1"
    if any(p or op for p, op in zip(plan.padding, plan.output_padding)):
        return "padding or output_padding"
    if any(k != s or (d != 1 and k != 1) for k, s, d in zip(plan.kernel_size, plan.stride, plan.dilation)):
        return "kernel_size differs from stride (or dilation with kernel_size > 1)"
    return None


@triton.jit
def _k_major(w_ptr, hi_ptr, lo_ptr, pid, C_IN, C_OUT, KDH, KW, PRECISION: tl.constexpr, BLOCK_CI: tl.constexpr,
             BLOCK_C: tl.constexpr):
    # The contiguous weight, as (C_in, C_out * KD*KH * KW), -> (KD*KH, C_out, KW, C_in): a tile of columns c =
    # (co, tap, kw) by input channels, loaded along c and stored along the channels.
    COLUMNS = C_OUT * KDH * KW
    c_blocks = tl.cdiv(COLUMNS, BLOCK_C)
    ci = pid // c_blocks * BLOCK_CI + tl.arange(0, BLOCK_CI)
    c = pid % c_blocks * BLOCK_C + tl.arange(0, BLOCK_C)
    ok = (ci[:, None] < C_IN) & (c[None, :] < COLUMNS)
    w = tl.load(w_ptr + ci[:, None] * COLUMNS + c[None, :], mask=ok)
    row = (c // KW % KDH * C_OUT + c // (KDH * KW)) * KW + c % KW
    _store_operand(hi_ptr, lo_ptr, row[None, :] * C_IN + ci[:, None], w, ok, PRECISION)


@triton.jit
def prepare_operands_kernel(
    x_ptr, x_hi_ptr, x_lo_ptr, w_ptr, w_hi_ptr, w_lo_ptr,
    C, S, S_BLOCKS, X_PROGRAMS, sxn, sxc, sxs, C_OUT, KDH, KW,
    PRECISION: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_S: tl.constexpr, LET_NEXT_START: tl.constexpr,
):
    """Both operands in one launch: programs [0, X_PROGRAMS) lay the input out channels-last, the others the
    weight K-major."""
    if LET_NEXT_START:
        let_next_start()
    pid = tl.program_id(0)
    if pid < X_PROGRAMS:
        _channels_last(x_ptr, x_hi_ptr, x_lo_ptr, pid, C, S, S_BLOCKS, sxn, sxc, sxs, PRECISION, BLOCK_C, BLOCK_S)
    else:
        _k_major(w_ptr, w_hi_ptr, w_lo_ptr, pid - X_PROGRAMS, C, C_OUT, KDH, KW, PRECISION, BLOCK_C, BLOCK_S)


@triton.jit
def _rounded_chunk(src_ptr, src_rows, row_ok, k, K, sk):
    """(values, mask): the rows' values at channels k (those below K), TF32-rounded; zeros elsewhere."""
    ok = row_ok[:, None] & (k < K)[None, :]
    return _round_to_tf32(tl.load(src_ptr + src_rows[:, None] + (k * sk)[None, :], mask=ok, other=0.0)), ok


@triton.jit
def _scaled_rows(src_ptr, dst_ptr, exp_ptr, src_rows, dst_rows, row_ok, K, sk, BLOCK_K: tl.constexpr,
                 CHUNKS: tl.constexpr):
    """Rows of K values (at src_rows + k * sk) TF32-rounded, times 2**e per row, stored as FP16 at dst_rows * K + k,
    and e (an int16, its bits in the FP16 buffer) at exp_ptr + dst_rows. e takes the row's largest magnitude into
    [2^14, 2^15), so that every value within 2^28 of it converts to FP16 exactly. e is clamped to [-113, 126] (-114
    below for inf or NaN): 2**e stays within float32's normal range, and so do the kernel's inverse scales
    (_inverse_scale_halves). An inf or NaN makes e -114 and the rest of its row zeros, and stays inf or NaN: every
    output its row reaches sums it (one input position, or one weight row, per output and GEMM column), so those
    outputs are inf or NaN whatever the rest of the row holds."""
    k = tl.arange(0, BLOCK_K)
    if CHUNKS == 1:  # the whole row in registers: one load
        v, ok = _rounded_chunk(src_ptr, src_rows, row_ok, k, K, sk)
        e = _fp16_scale_exponent(tl.max(tl.abs(v), axis=1))
        tl.store(dst_ptr + dst_rows[:, None] * K + k[None, :], (v * _power_of_2(e)[:, None]).to(tl.float16),
                 mask=ok)
    else:  # the row's largest first, then the row again
        largest = tl.zeros(row_ok.shape, dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            v, ok = _rounded_chunk(src_ptr, src_rows, row_ok, k0 + k, K, sk)
            largest = tl.maximum(largest, tl.max(tl.abs(v), axis=1))
        e = _fp16_scale_exponent(largest)
        for k0 in range(0, K, BLOCK_K):
            v, ok = _rounded_chunk(src_ptr, src_rows, row_ok, k0 + k, K, sk)
            tl.store(dst_ptr + dst_rows[:, None] * K + (k0 + k)[None, :],
                     (v * _power_of_2(e)[:, None]).to(tl.float16), mask=ok)
    tl.store(exp_ptr + dst_rows, e.to(tl.int16).to(tl.float16, bitcast=True), mask=row_ok)


@triton.jit
def prepare_scaled_operands_kernel(
    x_ptr, x_op_ptr, x_exp_ptr, w_ptr, w_op_ptr, w_exp_ptr,
    C, S, S_BLOCKS, X_PROGRAMS, sxn, sxc, sxs, C_OUT, KDH, KW,
    BLOCK_K: tl.constexpr, CHUNKS: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_W: tl.constexpr,
    LET_NEXT_START: tl.constexpr,
):
    """FP16_SCALED's operands in one launch (_scaled_rows): programs [0, X_PROGRAMS) take BLOCK_S positions of one
    sample, each a row of C channels, to (N, D, H, W, C_in) with a scale per position; the others BLOCK_W columns
    (co, kd, kh, kw) of the contiguous weight, each a row of C_in channels, to (KD*KH, C_out, KW, C_in) with a scale
    per row. Both read along their rows' contiguous axis."""
    if LET_NEXT_START:
        let_next_start()
    pid = tl.program_id(0)
    if pid < X_PROGRAMS:
        n = (pid // S_BLOCKS).to(tl.int64)
        sp = pid % S_BLOCKS * BLOCK_S + tl.arange(0, BLOCK_S)
        _scaled_rows(x_ptr, x_op_ptr, x_exp_ptr, n * sxn + sp.to(tl.int64) * sxs, n * S + sp, sp < S, C, sxc,
                     BLOCK_K, CHUNKS)
    else:
        columns = C_OUT * KDH * KW  # the weight as (C_in, columns), column c = (co, kd*KH + kh, kw)
        c = (pid - X_PROGRAMS) * BLOCK_W + tl.arange(0, BLOCK_W)
        row = (c // KW % KDH * C_OUT + c // (KDH * KW)) * KW + c % KW
        _scaled_rows(w_ptr, w_op_ptr, w_exp_ptr, c, row, c < columns, C, columns, BLOCK_K, CHUNKS)


@triton.jit
def _exponents(ptr, mask):
    # _scaled_rows' exponents, int16 bits in an FP16 buffer, read as integers: stored as FP16 values, their
    # float-to-integer conversions were 34 F2I instructions per thread of the 128 x 128 x 64 config (compiled for
    # sm_90). On the H200 the kernel took 0.0357 ms on unet3d_k2s2 against 0.0367 in an earlier call; by the gap to
    # a plain epilogue within each call, 0.5 us of the scaling's 4.9 (benchmarks/RESULTS.md, thirty-eighth session).
    return tl.load(ptr, mask=mask, other=0.0).to(tl.int16, bitcast=True).to(tl.int32)


@triton.jit
def _inverse_scale_halves(e):
    """(2**-(e >> 1), 2**-(e - (e >> 1))) for a scale's exponents e in [-114, 126] (_scaled_rows): a row's and a
    column's halves multiply to a power of two within float32's normal range, where 2**-(e_row + e_column) itself
    can leave it."""
    half = e >> 1
    return _power_of_2(-half), _power_of_2(half - e)


@triton.jit
def _load(ptr, lo_ptr, offs, mask, PRECISION: tl.constexpr):
    """An operand tile as the operand pass left it, and its low part under 3xTF32 (PRECISION 2; else the tile)."""
    hi = tl.load(ptr + offs, mask=mask, other=0.0)
    if PRECISION == 2:
        lo = tl.load(lo_ptr + offs, mask=mask, other=0.0)
    else:
        lo = hi
    return hi, lo


@triton.jit
def tiled_kernel(
    x_ptr, x_lo_ptr, w_ptr, w_lo_ptr, b_ptr, y_ptr,
    C_IN, C_OUT, D, H, W, KD, KH,
    sxn, sxc, sxd, sxh, sxw, swi, swo, swd, swh, sww,
    syn, syc, syd, syh, syw,
    H_BLOCKS, W_BLOCKS, CO_BLOCKS,
    KW: tl.constexpr, KW_P2: tl.constexpr, HAS_BIAS: tl.constexpr, PRECISION: tl.constexpr,
    INTERPRETED: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_Q: tl.constexpr,
    BLOCK_CO: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, SWAP: tl.constexpr, SCALED: tl.constexpr,
    PDL: tl.constexpr,
):
    """x (N, C_in, D, H, W) and the weight (C_in, C_out, KD, KH, KW) through strides of those shapes: as the operand
    pass laid them out (float32), or as given (half precision). SCALED: FP16_SCALED's operands, whose scales'
    exponents x_lo_ptr and w_lo_ptr hold (per position, and per weight row (kd, kh, co, kw))."""
    BLOCK_M: tl.constexpr = BLOCK_R * BLOCK_Q
    BLOCK_N: tl.constexpr = BLOCK_CO * KW_P2  # (co, kw), kw fastest; KW_P2 = KW rounded up to a power of two
    if PDL:
        wait_for_previous()
    # Program order: output-channel blocks and (kd, kh) fastest, so that the programs reading one input tile run
    # together and find it in L2.
    pid = tl.program_id(0)
    co_block = pid % CO_BLOCKS
    pid = pid // CO_BLOCKS
    tap = pid % (KD * KH)
    pid = pid // (KD * KH)
    w0 = pid % W_BLOCKS * BLOCK_Q
    pid = pid // W_BLOCKS
    h0 = pid % H_BLOCKS * BLOCK_R
    pid = pid // H_BLOCKS
    d = pid % D
    n = pid // D
    kd = tap // KH
    kh = tap % KH

    # A: BLOCK_M input positions (BLOCK_R rows of BLOCK_Q columns) by BLOCK_K channels. Out-of-range positions
    # are masked, not clamped: clamping would hide the columns' contiguity from the compiler.
    m = tl.arange(0, BLOCK_M)
    h = h0 + m // BLOCK_Q
    w = w0 + m % BLOCK_Q
    m_ok = (h < H) & (w < W)
    a_rows = n.to(tl.int64) * sxn + d.to(tl.int64) * sxd + h.to(tl.int64) * sxh + w * sxw
    # B: BLOCK_N weight rows (co, kw) of tap (kd, kh) by BLOCK_K channels.
    j = tl.arange(0, BLOCK_N)
    co = co_block * BLOCK_CO + j // KW_P2
    kw = j % KW_P2
    n_ok = (co < C_OUT) & (kw < KW)
    b_rows = co * swo + kd * swd + kh * swh + kw * sww
    k = tl.arange(0, BLOCK_K)
    if SWAP:
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, C_IN, BLOCK_K):
        if EVEN_K:  # masks constant along channels
            a_ok = m_ok[:, None]
            b_ok = n_ok[:, None]
        else:
            a_ok = m_ok[:, None] & (k0 + k < C_IN)[None, :]
            b_ok = n_ok[:, None] & (k0 + k < C_IN)[None, :]
        a_offs = a_rows[:, None] + ((k0 + k) * sxc)[None, :]
        b_offs = b_rows[:, None] + ((k0 + k) * swi)[None, :]
        b, b_lo = _load(w_ptr, w_lo_ptr, b_offs, b_ok, PRECISION)
        if SWAP:  # [N, K] x [K, M]: the MMA's M and N exchanged (faster with some tiles)
            a, a_lo = _load(x_ptr, x_lo_ptr, tl.trans(a_offs), tl.trans(a_ok), PRECISION)
            acc = mma(acc, b, b_lo, a, a_lo, PRECISION, INTERPRETED)
        else:
            a, a_lo = _load(x_ptr, x_lo_ptr, a_offs, a_ok, PRECISION)
            acc = mma(acc, a, a_lo, tl.trans(b), tl.trans(b_lo), PRECISION, INTERPRETED)
    if SCALED:  # the sums times the inverse scales of their row and column, in two exact multiplies
        position = ((n.to(tl.int64) * D + d) * H + h) * W + w
        x_hi, x_lo = _inverse_scale_halves(_exponents(x_lo_ptr + position, m_ok))
        w_hi, w_lo = _inverse_scale_halves(_exponents(w_lo_ptr + ((kd * KH + kh) * C_OUT + co) * KW + kw, n_ok))
        if SWAP:
            acc = acc * (w_hi[:, None] * x_hi[None, :]) * (w_lo[:, None] * x_lo[None, :])
        else:
            acc = acc * (x_hi[:, None] * w_hi[None, :]) * (x_lo[:, None] * w_lo[None, :])
    if SWAP:
        if HAS_BIAS:
            acc += tl.load(b_ptr + co, mask=n_ok, other=0.0).to(tl.float32)[:, None]
        tile = tl.reshape(tl.permute(tl.reshape(acc, (BLOCK_CO, KW_P2, BLOCK_M)), (0, 2, 1)),
                          (BLOCK_CO, BLOCK_M * KW_P2))
    else:
        if HAS_BIAS:
            acc += tl.load(b_ptr + co, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        tile = tl.reshape(tl.permute(tl.reshape(acc, (BLOCK_M, BLOCK_CO, KW_P2)), (1, 0, 2)),
                          (BLOCK_CO, BLOCK_M * KW_P2))
    # The kw interleaved: [co, (row, column, kw)]; element e of a channel's row of the tile sits at output column
    # KW * w0 + e % (BLOCK_Q * KW_P2) of row KH * (h0 + e // (BLOCK_Q * KW_P2)) + kh.
    e = tl.arange(0, BLOCK_M * KW_P2)
    r = e // (BLOCK_Q * KW_P2)
    col = e % (BLOCK_Q * KW_P2)
    if KW == KW_P2:
        ow = KW * w0 + col  # written so, the compiler sees the run of BLOCK_Q * KW contiguous columns
        ok = (h0 + r < H) & (ow < KW * W)
    else:
        ow = KW * (w0 + col // KW_P2) + col % KW_P2
        ok = (h0 + r < H) & (w0 + col // KW_P2 < W) & (col % KW_P2 < KW)
    oh = KH * (h0 + r) + kh
    co_t = co_block * BLOCK_CO + tl.arange(0, BLOCK_CO)
    y_base = y_ptr + n.to(tl.int64) * syn + (KD * d + kd).to(tl.int64) * syd
    ptrs = y_base + co_t[:, None].to(tl.int64) * syc + (oh.to(tl.int64) * syh + ow * syw)[None, :]
    tl.store(ptrs, tile.to(y_ptr.dtype.element_ty), mask=(co_t < C_OUT)[:, None] & ok[None, :])


def configs(operand_bytes: int = 4):
    """Tile configs: BLOCK_M positions by BLOCK_N weight rows (co, kw) by BLOCK_K channels; SWAP exchanges the MMA's
    M and N. Measured on the H200 (benchmarks/RESULTS.md, sixteenth session), cold L2: on the k2 s2 layers swapping
    cut the 8-warp 128 x 128 tile from 0.053 to 0.040 ms and changed the others by 1-4%. Operands of 2 bytes add two
    64-channel configs, the fastest on FP16 operands (thirty-seventh session); for TF32's 4 bytes they were slower
    or did not fit."""
    if interpreted():  # two: the MMA's M and N as they are and swapped, so that the tests meet both
        return [dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=16, SWAP=swap, num_warps=4, num_stages=1) for swap in (0, 1)]
    return [
        dict(BLOCK_M=m, BLOCK_N=nn, BLOCK_K=k, SWAP=swap, num_warps=wp, num_stages=s)
        for m, nn, k, swap, wp, s in [
            (128, 128, 32, 1, 8, 3),
            (128, 128, 32, 0, 4, 3),
            (128, 128, 32, 1, 4, 3),
            (128, 64, 32, 1, 4, 4),
            (64, 128, 32, 0, 4, 4),
            (128, 256, 32, 0, 8, 3),
            (256, 128, 32, 0, 8, 3),
            *([(128, 128, 64, 1, 8, 3), (128, 128, 64, 0, 4, 3)] if operand_bytes == 2 else []),
        ]
    ]


def operand_precision(dtype: torch.dtype, precision: int) -> int:
    """The precision this module computes a layer in: FP16_SCALED for TF32 on float32 where TF32_AS_FP16, else
    precision (forward.py's)."""
    return FP16_SCALED if precision == TF32 and dtype == torch.float32 and TF32_AS_FP16 else precision


def _operand_dtype(dtype: torch.dtype, precision: int) -> torch.dtype:
    return torch.float16 if precision == FP16_SCALED else dtype


def _operands(input, weight, precision):
    """(x, x_lo, w, w_lo) laid out by the operand pass: the input channels-last (N, D, H, W, C_in) and the weight
    K-major (KD, KH, C_out, KW, C_in), TF32-rounded or split for float32 (x_lo, w_lo are x, w where unused); under
    FP16_SCALED both FP16 buffers, x_lo and w_lo holding their scales' exponents as int16 bits, (N, D, H, W) and
    (KD, KH, C_out, KW)."""
    flat, flat_strides = flat_input(input)
    layout, operand_pass = _operand_steps(tuple(input.shape), tuple(weight.shape), flat_strides, precision,
                                          pass_lets_main_start(input.device))
    operands = allocate_operands(layout, _operand_dtype(input.dtype, precision), input.device)
    operand_pass((flat, *operands[:2], weight.contiguous(), *operands[2:]))
    return operands


@functools.lru_cache(maxsize=256)
def _operand_steps(input_shape, weight_shape, flat_strides, precision: int, let_next_start: bool = False):
    """(the operands' _operand_layout, the bound operand pass) of a layer, for an input with these strides (as (N, C,
    D*H*W)): what _operands uses on every call and a prepared call keeps."""
    n, c, d, h, w = input_shape
    c_in, c_out, kd, kh, kw = weight_shape
    if precision == FP16_SCALED:
        layout = contiguous_views(((n, d, h, w, c), (n, d, h, w), (kd, kh, c_out, kw, c_in), (kd, kh, c_out, kw)))
        return layout, _scaled_operand_pass(input_shape, weight_shape, flat_strides, let_next_start)
    layout = _operand_layout((n, d, h, w, c), (kd, kh, c_out, kw, c_in), precision == TF32X3, True)
    return layout, _operand_pass(input_shape, weight_shape, flat_strides, precision, let_next_start)


@functools.lru_cache(maxsize=256)
def _scaled_operand_pass(input_shape, weight_shape, flat_strides, let_next_start: bool = False):
    """FP16_SCALED's operand pass of a layer, for an input with these strides (as (N, C, D*H*W)), bound: each
    program's rows whole in registers (8,192 values) up to 512 channels, else in chunks of 512, read twice."""
    n, c, d, h, w = input_shape
    c_in, c_out, kd, kh, kw = weight_shape
    block_k = min(next_power_of_2(c), 512)
    block_rows = min(256, max(16, 8192 // block_k))
    s_blocks = cdiv(d * h * w, block_rows)
    x_programs = n * s_blocks
    w_programs = cdiv(c_out * kd * kh * kw, block_rows)
    return _prepare_scaled.bind(
        (x_programs + w_programs,), (c, d * h * w, s_blocks, x_programs, *flat_strides, c_out, kd * kh, kw),
        (("BLOCK_K", block_k), ("CHUNKS", cdiv(c, block_k)), ("BLOCK_S", block_rows), ("BLOCK_W", block_rows),
         ("LET_NEXT_START", let_next_start), ("num_warps", 8)))


@functools.lru_cache(maxsize=256)
def _operand_pass(input_shape, weight_shape, flat_strides, precision: int, let_next_start: bool = False):
    """The operand pass of a layer, for an input with these strides (as (N, C, D*H*W)), bound (launch.BoundLaunch)."""
    n, c, d, h, w = input_shape
    c_in, c_out, kd, kh, kw = weight_shape
    block_c, block_s = 32, 64
    s_blocks = cdiv(d * h * w, block_s)
    x_programs = n * cdiv(c, block_c) * s_blocks
    w_programs = cdiv(c_in, block_c) * cdiv(c_out * kd * kh * kw, block_s)
    return _prepare.bind(
        (x_programs + w_programs,), (c, d * h * w, s_blocks, x_programs, *flat_strides, c_out, kd * kh, kw),
        (("PRECISION", precision), ("BLOCK_C", block_c), ("BLOCK_S", block_s), ("LET_NEXT_START", let_next_start)))


@functools.lru_cache(maxsize=256)
def _geometry(plan: Plan, block_m: int, block_n: int, block_k: int):
    """(grid, sizes, the operands' strides, blocks, block constexprs) of a config for a layer: once per layer, as
    host time shows."""
    n, c_in, (d, h, w) = plan.batch, plan.in_channels, plan.input_spatial
    c_out, (kd, kh, kw) = plan.out_channels, plan.kernel_size
    kw_p2 = next_power_of_2(kw)
    block_q = min(next_power_of_2(w), block_m)
    block_r = max(1, block_m // block_q)
    block_co = max(16 // kw_p2, 1, min(block_n // kw_p2, next_power_of_2(c_out)))
    block_k = max(16, min(block_k, next_power_of_2(c_in)))
    h_blocks, w_blocks, co_blocks = cdiv(h, block_r), cdiv(w, block_q), cdiv(c_out, block_co)
    grid = (n * d * h_blocks * w_blocks * kd * kh * co_blocks,)
    sizes = (c_in, c_out, d, h, w, kd, kh)
    # _operands' layouts as strides of (N, C_in, D, H, W) and (C_in, C_out, KD, KH, KW).
    strides = (d * h * w * c_in, 1, h * w * c_in, w * c_in, c_in,
               1, kw * c_in, kh * c_out * kw * c_in, c_out * kw * c_in, c_in)
    constexprs = (("KW", kw), ("KW_P2", kw_p2), ("BLOCK_R", block_r), ("BLOCK_Q", block_q), ("BLOCK_CO", block_co),
                  ("BLOCK_K", block_k), ("EVEN_K", c_in % block_k == 0))
    return grid, sizes, strides, (h_blocks, w_blocks, co_blocks), constexprs


def _launch(cfg, plan: Plan, x, x_lo, w, w_lo, bias, out, precision, strides=None):
    """One launch on _operands' results, or on x and w read through strides (theirs, as (N, C_in, D, H, W) and
    (C_in, C_out, KD, KH, KW))."""
    _main_launch(cfg, plan, precision, bias is not None, strides, out.stride(), out.device.index or 0)(
        (x, x_lo, w, w_lo, bias if bias is not None else w, out))


def _main_launch(cfg, plan: Plan, precision: int, has_bias: bool, strides, out_strides, device_index: int):
    """A config's launch for a layer, bound (launch.BoundLaunch): call it with (x, x_lo, w, w_lo, bias, out)."""
    grid, sizes, prepared, blocks, constexprs = _geometry(plan, cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"])
    scaled = precision == FP16_SCALED
    return _tiled.bind(
        grid, (*sizes, *(prepared if strides is None else strides), *out_strides, *blocks),
        (*constexprs, ("HAS_BIAS", has_bias), ("PRECISION", NATIVE if scaled else precision),
         ("INTERPRETED", _tiled.interpreted), ("SWAP", cfg["SWAP"]), ("SCALED", scaled),
         *dependent_options(device_index), ("num_warps", cfg["num_warps"]), ("num_stages", cfg["num_stages"])))


_prepare = Launcher(prepare_operands_kernel)
_prepare_scaled = Launcher(prepare_scaled_operands_kernel)
_tiled = Launcher(tiled_kernel)
_best_config: dict = {}
# The bound launch of the chosen config, per key of _best_config: the host looks up one dict between the two launches.
_chosen: dict = {}


def conv_transpose3d_tiled(input, weight, bias, plan: Plan, precision: int | None = None,
                           config: dict | None = None):
    """The layer by the tiled GEMM; input (N, C_in, D, H, W) and weight validated, any strides, unsupported_reason
    None. Float32 goes through the operand pass, half precision is read as it is. On the H200 (benchmarks/RESULTS.md,
    sixteenth session) float32 read as given, rounded in registers, made the kernel 2.5-5x slower (TF32 tensor-core
    operands must be K-major), while bfloat16 read as given took 0.035-0.036 ms, about the pass and the kernel
    after it together (0.009 + 0.025), in one launch: the host's time between two launches showed in the timings.
    Everything the kernel's launch needs is found before the operand pass is launched."""
    out, finished = allocate_output(input, weight, bias, plan)
    if finished:
        return out
    precision = operand_precision(input.dtype, precision_for(input.dtype) if precision is None else precision)
    strides = _strides_as_given(input, weight)
    key = _chosen_key(input, plan, precision, strides, out, bias)
    main = _chosen.get(key) if config is None else None
    operands = _operands(input, weight, precision) if strides is None else (input, input, weight, weight)
    pointers = (*operands, bias if bias is not None else operands[2], out)
    if main is None:
        device_index = out.device.index or 0
        chosen = config if config is not None else pick_config(
            _best_config, key, configs(operands[0].element_size()),
            lambda cfg: _main_launch(cfg, plan, precision, bias is not None, strides, out.stride(), device_index)(
                pointers),
            input.device)
        main = _main_launch(chosen, plan, precision, bias is not None, strides, out.stride(), device_index)
        if config is None and key in _best_config:
            _chosen[key] = main
    main(pointers)
    return out


def _strides_as_given(input, weight):
    """None for float32, whose operands the operand pass lays out; else the strides of input and weight, through
    which half precision is read as it is."""
    return None if input.dtype == torch.float32 else (*input.stride(), *weight.stride())


def _chosen_key(input, plan: Plan, precision: int, strides, out, bias):
    """The key of _best_config and _chosen for a call."""
    return plan.key, input.dtype, precision, input.device, strides, out.stride(), bias is not None


def prepare(input, weight, bias, plan: Plan, precision: int, out):
    """After a call of conv_transpose3d_tiled with contiguous input and weight that returned out: the same call for
    this layer as a function of (input, weight, bias), its launches and layouts bound, or None where no tile config
    is chosen yet. Launched at addresses where it can be (forward.at_addresses_else)."""
    precision = operand_precision(input.dtype, precision)
    strides = _strides_as_given(input, weight)
    main = _chosen.get(_chosen_key(input, plan, precision, strides, out, bias))
    if main is None:
        return None
    shape, dtype, device = plan.output_shape, input.dtype, input.device
    if strides is not None:  # half precision: the operands as given, one launch
        def call(input, weight, bias):
            out = input.new_empty(shape)
            main((input, input, weight, weight, weight if bias is None else bias, out))
            return out

        def launch_as_given(launches, stream, x_in, w_in, b_in, operands, out):
            launches[0](stream, x_in, x_in, w_in, w_in, b_in or w_in, out)

        return at_addresses_else(call, input, shape, 0, (main,), launch_as_given)
    layout, operand_pass = _operand_steps(tuple(input.shape), tuple(weight.shape), flat_input(input)[1], precision,
                                          pass_lets_main_start(input.device))

    operand_dtype = _operand_dtype(dtype, precision)

    def call(input, weight, bias):
        out = input.new_empty(shape)
        x, x_lo, w, w_lo = allocate_operands(layout, operand_dtype, device)
        operand_pass((input, x, x_lo, weight, w, w_lo))
        main((x, x_lo, w, w_lo, w if bias is None else bias, out))
        return out

    x_at, x_lo_at, w_at, w_lo_at = operand_offsets(layout, operand_dtype.itemsize)

    def launch(launches, stream, x_in, w_in, b_in, operands, out):
        pass_at, main_at = launches
        x, x_lo, w, w_lo = operands + x_at, operands + x_lo_at, operands + w_at, operands + w_lo_at
        pass_at(stream, x_in, x, x_lo, w_in, w, w_lo)
        main_at(stream, x, x_lo, w, w_lo, b_in or w, out)

    # The pointers' dtypes: the input's and the operands', and as the first call gave them, the bias (or w) and out.
    pointer_dtypes = ((dtype, operand_dtype, operand_dtype, dtype, operand_dtype, operand_dtype),
                      (*(operand_dtype,) * 4, dtype if bias is not None else operand_dtype, dtype))
    return at_addresses_else(call, input, shape, layout[0], (operand_pass, main), launch, pointer_dtypes,
                             operand_dtype)
