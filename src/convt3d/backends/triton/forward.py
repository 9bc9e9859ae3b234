"""Fused Triton forward of conv_transpose3d: one kernel writes every output element once.

Output index along an axis with stride s and padding p is written o = s*u + v, v in [0, s):
every o with the same v lies in the same phase r = (v + p) mod s and reads input
i = u + (v + p) // s - m_t for each tap t of that phase (t*d = r + s*m_t). A program owns,
for one sample n and one output depth od, a block of BLOCK_R rows oh = s_h*u_h + v_h (one v_h)
and BLOCK_Q columns u_w, and every v_w of them: BLOCK_R * BLOCK_Q * s_w outputs by BLOCK_CO
output channels. Per v_w it runs an implicit GEMM over (taps of the phase) x (input channels)
on tensor cores and stores the tile; rows whose depth or height phase no tap reaches are
filled with the bias in full contiguous rows and run no GEMM at all.

Before it, an operand pass lays the operands out as the GEMM reads them: the input channels-last
(the reduction axis contiguous) and the weight tap-major. For float32 it also rounds them
(PRECISION 1: TF32, to nearest with ties away, as cuDNN's conversion does; one TF32 dot) or
splits the weight (PRECISION 2: TF32 high part and TF32 remainder; three dots, 3xTF32, about
float32 accuracy), so that loads feed the tensor cores directly; under 3xTF32 the kernels split
the input as they load it. PRECISION 0 is the native dot of float16/bfloat16 operands. In TF32 mode float32
operands are by default FP16 scaled per tensor instead (tensor_scaled.py's pass, FP16_TENSOR_SCALED): the kernels
multiply them in FP16 (PRECISION 0) and scale their sums back (SCALED).
Accumulation is float32 always. On Hopper the kernel is launched as the pass's dependent (dependent_launch): its
programs start while the pass's last ones run, and wait for the pass's writes before touching memory.

tap_columns.py holds a second kernel on the same operands, with the taps along W as GEMM columns, and turned.py a
third (Hopper, FP16 operands), this one's GEMMs turned around on TMA loads; conv_transpose3d_triton autotunes
over the configs of all that serve a layer (candidates()).
"""

from __future__ import annotations

import functools
import logging
import math
import threading

import torch
import triton
import triton.language as tl

from ...plan import Plan
from .. import output_memory_format
# (NATIVE and TF32 unused here: the tests, benchmarks and backward.py read the precisions from this module.)
from . import (NATIVE, TF32, TF32X3, cdiv, dependent_launch, interpreted, next_power_of_2, pass_lets_main_start,
               power_of_2_at_most, precision_for)
from .launch import Launcher, ready_stream

logger = logging.getLogger("convt3d")


@triton.jit
def _round_to_tf32(x):
    # Keep 10 mantissa bits, rounding to nearest with ties away from zero (PTX cvt.rna.tf32.f32).
    bits = x.to(tl.int32, bitcast=True)
    bits = (bits + 0x1000) & -8192  # -8192 == 0xFFFFE000
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _power_of_2(k):
    # 2**k as a float32, for integers k in [-126, 127]: the exponent field itself.
    return ((k + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _fp16_scale_exponent(largest):
    # e with largest * 2**e in [2^14, 2^15), from largest's exponent field; clamped to 126 (zeros, subnormals).
    return fp16_scale_exponent_of_field(exponent_field(largest))


@triton.jit
def exponent_field(v):
    # The exponent field of non-negative float32 v: all that _fp16_scale_exponent(v) depends on, and, as it grows
    # with v, the largest of several values' fields is their largest value's.
    return (v.to(tl.int32, bitcast=True) >> 23) & 0xFF


@triton.jit
def fp16_scale_exponent_of_field(field):
    return tl.minimum(141 - field, 126)


@triton.jit
def inverse_scales(sync_ptr):
    """(a, b) whose product is 2**-(e_x + e_w), the exponents that tensor_scaled.py's last pass left at sync_ptr + 4
    and + 5, each factor within float32's normal range where their product may not be (e_x and e_w lie in [-113,
    126])."""
    e = tl.load(sync_ptr + 4) + tl.load(sync_ptr + 5)
    half = e >> 1
    return _power_of_2(-half), _power_of_2(half - e)


@triton.jit
def _as_operand(x, PRECISION: tl.constexpr):
    """(high, low): x as the GEMM reads it: as is (0), TF32-rounded (1), or as TF32 high and low parts (2); the low
    part is the high one again where unused."""
    # One return at the end: Triton's compiler also compiles what follows a return inside a constexpr branch (here
    # the rounding, on half-precision x, which does not compile).
    if PRECISION == 0:
        hi = x
        lo = x
    else:
        hi = _round_to_tf32(x)
        if PRECISION == 2:
            lo = _round_to_tf32(x - hi)
        else:
            lo = hi
    return hi, lo


@triton.jit
def _store_operand(hi_ptr, lo_ptr, offs, x, mask, PRECISION: tl.constexpr):
    """Store x as the GEMM reads it (_as_operand), its low part under PRECISION 2."""
    hi, lo = _as_operand(x, PRECISION)
    tl.store(hi_ptr + offs, hi, mask=mask)
    if PRECISION == 2:
        tl.store(lo_ptr + offs, lo, mask=mask)


@triton.jit
def prepare_operands_kernel(
    x_ptr, x_op_ptr, w_ptr, w_hi_ptr, w_lo_ptr,
    C, S, S_BLOCKS, X_PROGRAMS, sxn, sxc, sxs, GROUPS, CIN_G, C_OUT_G, TAPS, CI_BLOCKS, K_BLOCKS, W_TILES,
    PRECISION: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_WCI: tl.constexpr,
    BLOCK_WK: tl.constexpr, LET_NEXT_START: tl.constexpr,
):
    """Both GEMM operands as the main kernel reads them, in one launch (a launch costs more host time than this
    work takes on the GPU for a small layer). Programs [0, X_PROGRAMS) lay the input out channels-last,
    x (N, C, S) with strides (sxn, sxc, sxs) -> (N, S, C) contiguous, so that the reduction axis is contiguous
    and each position's channel row loads as wide vectors; the others lay the contiguous weight
    (C_in, C_out/g, taps) out tap-major and K-major, (taps, groups, C_out/g, C_in/g), so that each tap's weight is
    one contiguous tile with the reduction axis contiguous, as TF32 tensor-core operands must be, in tiles of
    BLOCK_WCI channels by BLOCK_WK columns (tap_major_tile; on the H200 this pass took 20-40% less time than with
    chunks in the operand's order on the two sweep layers of large weights: benchmarks/RESULTS.md, fifty-second
    session). Float32 operands are TF32-rounded (PRECISION 1); under 3xTF32 (PRECISION 2) the weight is split and the
    input left as it is: the kernels split A as they load it, which moves half the bytes that loading both parts did
    (the tap_columns kernel took 14-22% less time on four of seven sweep layers and no more on the others:
    benchmarks/RESULTS.md, twenty-first session)."""
    if LET_NEXT_START:
        let_next_start()
    pid = tl.program_id(0)
    if pid < X_PROGRAMS:
        if PRECISION == 2:
            _channels_last(x_ptr, x_op_ptr, x_op_ptr, pid, C, S, S_BLOCKS, sxn, sxc, sxs, 0, BLOCK_C, BLOCK_S)
        else:
            _channels_last(x_ptr, x_op_ptr, x_op_ptr, pid, C, S, S_BLOCKS, sxn, sxc, sxs, PRECISION, BLOCK_C,
                           BLOCK_S)
    else:
        w_offs, ok, offs = tap_major_tile(pid - X_PROGRAMS, W_TILES, GROUPS, CIN_G, C_OUT_G, TAPS, CI_BLOCKS,
                                          K_BLOCKS, BLOCK_WCI, BLOCK_WK)
        _store_operand(w_hi_ptr, w_lo_ptr, offs, tl.load(w_ptr + w_offs, mask=ok), ok, PRECISION)


@triton.jit
def let_next_start():
    """Lets the kernel launched after this one as its dependent (dependent_launch) start once every program of this
    one has begun, rather than once they have all finished: its programs then take the multiprocessors this launch's
    last programs leave, and wait (wait_for_previous) for this launch's writes."""
    tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def wait_for_previous():
    """In a kernel launched as a dependent (dependent_launch): wait until the launch before it has finished and its
    writes are visible. Called before any memory access."""
    tl.extra.cuda.gdc_wait()


@triton.jit
def _channels_last(x_ptr, hi_ptr, lo_ptr, pid, C, S, S_BLOCKS, sxn, sxc, sxs, PRECISION: tl.constexpr,
                   BLOCK_C: tl.constexpr, BLOCK_S: tl.constexpr):
    n = (pid // (S_BLOCKS * tl.cdiv(C, BLOCK_C))).to(tl.int64)
    c = (pid // S_BLOCKS % tl.cdiv(C, BLOCK_C)) * BLOCK_C + tl.arange(0, BLOCK_C)
    sp = (pid % S_BLOCKS) * BLOCK_S + tl.arange(0, BLOCK_S)
    ok = (c[None, :] < C) & (sp[:, None] < S)
    x = tl.load(x_ptr + n * sxn + c[None, :].to(tl.int64) * sxc + sp[:, None].to(tl.int64) * sxs, mask=ok)
    _store_operand(hi_ptr, lo_ptr, n * S * C + sp[:, None].to(tl.int64) * C + c[None, :], x, ok, PRECISION)


@triton.jit
def tap_major_tile(t, W_TILES, GROUPS, CIN_G, C_OUT_G, TAPS, CI_BLOCKS, K_BLOCKS, BLOCK_CI: tl.constexpr,
                   BLOCK_K: tl.constexpr):
    """(offsets in the contiguous weight (C_in, C_out/g * taps), mask, offsets in the tap-major, K-major operand
    (taps, groups, C_out/g, C_in/g)) of weight tile t (none past W_TILES; weight_tiles counts them): BLOCK_CI input
    channels of one group by BLOCK_K columns (co, tap), read along the columns, which lie together in the weight, and
    stored along the channels, which lie together in the operand. (A chunk in the operand's own order read each
    element from a sector of its own, C_out/g * taps elements after the last.)"""
    columns = C_OUT_G * TAPS
    g = t // (CI_BLOCKS * K_BLOCKS)
    ci = (t // K_BLOCKS % CI_BLOCKS) * BLOCK_CI + tl.arange(0, BLOCK_CI)
    k = (t % K_BLOCKS) * BLOCK_K + tl.arange(0, BLOCK_K)
    ok = (ci[:, None] < CIN_G) & (k[None, :] < columns * (t < W_TILES))  # (a scalar mask broadcast)
    co = k // TAPS
    tap = k - co * TAPS
    return (((g * CIN_G + ci) * columns)[:, None] + k[None, :], ok,
            (((tap * GROUPS + g) * C_OUT_G + co) * CIN_G)[None, :] + ci[:, None])


def weight_tiles(groups: int, cin_g: int, columns: int, block_ci: int, block_k: int) -> tuple[int, int, int]:
    """(channel blocks, column blocks, tiles) of a weight of groups x cin_g channels by columns (co, tap) columns in
    tap_major_tile's tiles of block_ci channels by block_k columns."""
    ci_blocks, k_blocks = cdiv(cin_g, block_ci), cdiv(columns, block_k)
    return ci_blocks, k_blocks, groups * ci_blocks * k_blocks


@triton.jit
def _tf32_bits(x):
    # x with its low 13 mantissa bits cleared: a float32 cut to TF32's 10 mantissa bits.
    return (x.to(tl.int32, bitcast=True) & -8192).to(tl.float32, bitcast=True)


@triton.jit
def mma(acc, a, a_lo, b, b_lo, PRECISION: tl.constexpr, INTERPRETED: tl.constexpr):
    """acc + a @ b on tensor cores: TF32 (PRECISION 1), 3xTF32 from the operands' high and low parts (2), or in the
    operands' own type (0), accumulating in float32. The operands of TF32 dots must be TF32 values already (rounded
    or split)."""
    if INTERPRETED and PRECISION != 0:
        # The interpreter's dot multiplies float32 exactly, where tensor cores use a TF32 operand's top 19 bits (by
        # truncation, as commonly described; not checked here). Clearing the rest makes an operand left unrounded
        # change the interpreter's results as well, so that its tests catch it (a kernel changed to skip its split of
        # A passed them without this: twenty-first session).
        a, a_lo, b, b_lo = _tf32_bits(a), _tf32_bits(a_lo), _tf32_bits(b), _tf32_bits(b_lo)
    if PRECISION == 2:
        # 3xTF32: a*b ~ a_lo*b_hi + a_hi*b_lo + a_hi*b_hi. The step's sum is added to acc with an ordinary rounded
        # add: Hopper's tensor cores truncate as they accumulate, which over all K-steps biased problem 77's result
        # by 5e-6 relative, too much for float32 accuracy.
        step = tl.dot(a_lo, b, input_precision="tf32")
        step = tl.dot(a, b_lo, step, input_precision="tf32")
        acc += tl.dot(a, b, step, input_precision="tf32")
    elif PRECISION == 1:
        acc = tl.dot(a, b, acc, input_precision="tf32")
    elif INTERPRETED and a.dtype == tl.bfloat16:
        # The interpreter's dot mishandles bfloat16 (seen with Triton 3.9); bfloat16 products are exact in float32,
        # so a float32 dot of the upcast operands computes what tensor cores do.
        acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        acc = tl.dot(a, b, acc)
    return acc


@triton.jit
def _phase_taps(r, S: tl.constexpr, DIL: tl.constexpr, TAP_STEP: tl.constexpr, K):
    """First tap t0 and number of taps reaching phase r (taps of one phase step by TAP_STEP)."""
    t0 = r * 0 - 1  # none yet
    for t in tl.static_range(TAP_STEP):
        t0 = tl.where(((t * DIL) % S == r) & (t0 < 0), t, t0)
    count = tl.where((t0 >= 0) & (t0 < K), (K - t0 + TAP_STEP - 1) // TAP_STEP, 0)
    t0 = tl.maximum(t0, 0)
    return t0, count


@triton.jit
def _useful_taps(q_lo, q_hi, m0, M_STEP: tl.constexpr, count, size):
    """Tap range [lo, hi) of a phase whose input q - m0 - j*M_STEP lies in [0, size) for some q in [q_lo, q_hi]."""
    top = q_hi - m0
    hi = tl.where(top < 0, 0, tl.minimum(count, top // M_STEP + 1))
    bottom = q_lo - m0 - size + 1
    lo = tl.where(bottom <= 0, 0, (bottom + M_STEP - 1) // M_STEP)
    return lo, tl.maximum(hi, lo)


@triton.jit
def _axis_taps(v, u_first, u_last, SIZE, K, S: tl.constexpr, P: tl.constexpr, DIL: tl.constexpr,
               STEP: tl.constexpr):
    """Along one axis, for the outputs o = S * u + v with u in [u_first, u_last]: their input offset base (tap j of
    their phase reads input u + base - m0 - j * STEP * DIL // S), the phase's first tap t0 and offset m0, and the
    range [j_lo, j_hi) of its taps that read the input for some u (empty when u_last < u_first)."""
    r = (v + P) % S + u_first * 0  # a runtime value, also where v is a constexpr
    base = (v + P) // S
    t0, count = _phase_taps(r, S, DIL, STEP, K)
    m0 = (t0 * DIL - r) // S
    j_lo, j_hi = _useful_taps(u_first + base, u_last + base, m0, STEP * DIL // S, count, SIZE)
    return base, m0, t0, j_lo, tl.where(u_last >= u_first, j_hi, j_lo)


@triton.jit
def _column_taps(v_w: tl.constexpr, u_w0, OW, W, KW, S_W: tl.constexpr, P_W: tl.constexpr, DIL_W: tl.constexpr,
                 STEP_W: tl.constexpr, BLOCK_Q: tl.constexpr):
    """_axis_taps of the output columns ow = S_W * u_w + v_w of the block u_w in [u_w0, u_w0 + BLOCK_Q) that exist
    (ow < OW)."""
    u_w_end = tl.minimum(u_w0 + BLOCK_Q, (OW - v_w + S_W - 1) // S_W)  # one past the block's last column
    return _axis_taps(v_w, u_w0, u_w_end - 1, W, KW, S_W, P_W, DIL_W, STEP_W)


@triton.jit
def load_weights(w_base, w_lo_base, w_rows, w_row_ok, ci0, CIN_G, PRECISION: tl.constexpr, BLOCK_CI: tl.constexpr,
                 EVEN_CI: tl.constexpr):
    """A K-step's B tile: the weight at offsets w_rows by channels ci0 + [0, BLOCK_CI) (contiguous: K-major, as TF32
    tensor-core operands must be), transposed for the dot, with its low part under 3xTF32 (PRECISION 2), else the tile
    again. Rows not ok and channels past CIN_G load as zeros."""
    ci = ci0 + tl.arange(0, BLOCK_CI)
    if EVEN_CI:
        b_offs = w_rows[:, None] + ci[None, :]
        b_ok = w_row_ok[:, None]
    else:
        b_offs = w_rows[:, None] + tl.minimum(ci, CIN_G - 1)[None, :]
        b_ok = w_row_ok[:, None] & (ci < CIN_G)[None, :]
    b = tl.trans(tl.load(w_base + b_offs, mask=b_ok, other=0.0))
    if PRECISION == 2:
        b_lo = tl.trans(tl.load(w_lo_base + b_offs, mask=b_ok, other=0.0))
    else:
        b_lo = b
    return b, b_lo


@triton.jit
def load_operands(x_base, w_base, w_lo_base, rows, row_ok, w_rows, w_row_ok, ci0, CIN_G, sxc,
                  PRECISION: tl.constexpr, BLOCK_CI: tl.constexpr, EVEN_CI: tl.constexpr):
    """One K-step's tiles: A, the input at offsets rows by channels ci0 + [0, BLOCK_CI) (stride sxc), and B
    (load_weights); each with its low part under 3xTF32 (PRECISION 2), else the tile again. Rows not ok and channels
    past CIN_G load as zeros. Under 3xTF32, A is split here (the operand pass leaves the input whole)."""
    ci = ci0 + tl.arange(0, BLOCK_CI)
    if EVEN_CI:  # whole channel blocks: masks constant along channels, so channel rows load as vectors
        a_offs = rows[:, None] + (ci * sxc)[None, :]
        a_ok = row_ok[:, None]
    else:
        a_offs = rows[:, None] + (tl.minimum(ci, CIN_G - 1) * sxc)[None, :]
        a_ok = row_ok[:, None] & (ci < CIN_G)[None, :]
    a = tl.load(x_base + a_offs, mask=a_ok, other=0.0)
    b, b_lo = load_weights(w_base, w_lo_base, w_rows, w_row_ok, ci0, CIN_G, PRECISION, BLOCK_CI, EVEN_CI)
    if PRECISION == 2:
        a, a_lo = _as_operand(a, PRECISION)
    else:
        a_lo = a
    return a, a_lo, b, b_lo


@triton.jit
def count_on(j, j_lo, j_hi, carry, STEP: tl.constexpr = 1):
    """A K-loop's counter j in [j_lo, j_hi) moved on by STEP where carry holds: (its next value, whether it wrapped
    to j_lo, which carries into the next counter). The K-loops count their taps and channel block so from step to
    step rather than dividing them out of the step index: a division by a runtime value is a sequence of many
    instructions, and their programs run few steps (benchmarks/RESULTS.md, twenty-eighth session)."""
    j = tl.where(carry, j + STEP, j)
    wrapped = j >= j_hi
    return tl.where(wrapped, j_lo, j), wrapped


@triton.jit
def _phase_gemm(
    v_w: tl.constexpr, x_base, w_group, w_lo_group, co, co_ok, m, u_h, u_w, u_w0,
    q_d, m0_d, t0_d, jd_lo, jd_hi, base_h, m0_h, t0_h, jh_lo, jh_hi,
    D, H, W, OW, KD, KH, KW, GROUPS, CIN_G, COUT_G, sxc, sxd, sxh, sxw,
    S_W: tl.constexpr, P_W: tl.constexpr, DIL_W: tl.constexpr, STEP_D: tl.constexpr, STEP_H: tl.constexpr,
    STEP_W: tl.constexpr, M_STEP_D: tl.constexpr, M_STEP_H: tl.constexpr,
    PRECISION: tl.constexpr, INTERPRETED: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_CO: tl.constexpr, BLOCK_CI: tl.constexpr,
    CI_BLOCKS: tl.constexpr, EVEN_CI: tl.constexpr, DIAG: tl.constexpr,
):
    """The [BLOCK_M, BLOCK_CO] float32 tile of output columns ow = S_W * u_w + v_w: an implicit GEMM over the
    taps of their phase (in all three axes) and the group's input channels."""
    M_STEP_W: tl.constexpr = STEP_W * DIL_W // S_W
    base_w, m0_w, t0_w, jw_lo, jw_hi = _column_taps(v_w, u_w0, OW, W, KW, S_W, P_W, DIL_W, STEP_W, BLOCK_Q)
    if DIAG == 1:  # diagnostic: no GEMM, only its stores
        jw_hi = jw_lo
    acc = tl.zeros([BLOCK_M, BLOCK_CO], dtype=tl.float32)
    # The K-steps walk (depth, height, width tap, channel block), the channels fastest, counted on (count_on; the
    # configs ran 5-34% faster so on three sweep layers). The software pipeliner forms the addresses of steps past
    # the last one too (masked off; masked-off lanes still form addresses, which faulted on the H200), so every tap
    # and index is clamped into its tensor below.
    ci0 = jd_lo * 0
    jd = jd_lo
    jh = jh_lo
    jw = jw_lo
    if PRECISION != 2:
        rows_hw = u_h * sxh + u_w * sxw  # the rows' own part of their input offsets (below)
    for k in range((jd_hi - jd_lo) * (jh_hi - jh_lo) * (jw_hi - jw_lo) * CI_BLOCKS):
        t_d = tl.minimum(t0_d + jd * STEP_D, KD - 1)
        t_h = tl.minimum(t0_h + jh * STEP_H, KH - 1)
        t_w = tl.minimum(t0_w + jw * STEP_W, KW - 1)
        i_d = q_d - m0_d - jd * M_STEP_D + m * 0  # broadcast: the interpreter cannot mask with scalars
        if PRECISION == 2:
            i_h = u_h + base_h - m0_h - jh * M_STEP_H
            i_w = u_w + base_w - m0_w - jw * M_STEP_W
            row_ok = (i_d >= 0) & (i_d < D) & (i_h >= 0) & (i_h < H) & (i_w >= 0) & (i_w < W)
            rows = (tl.minimum(tl.maximum(i_d, 0), D - 1) * sxd + tl.minimum(tl.maximum(i_h, 0), H - 1) * sxh
                    + tl.minimum(tl.maximum(i_w, 0), W - 1) * sxw)
        else:
            # The step reads input row (i_d, u_h + shift_h, u_w + shift_w): the rows' own part of the offset formed
            # once, the step's a scalar, and rows not ok at offset 0 rather than each index clamped. 14% fewer
            # instructions a step (sm_90); on the H200 the kernel alone 5% faster on vae_k4s2p1_fp16 in the config
            # auto takes there, within about 2% either way on k3s1p1 and video_spatial_k144 (TF32). Under 3xTF32 it
            # ran 7-10% slower on vae_k4s2p1, so that keeps the clamps (benchmarks/RESULTS.md, forty-fourth session).
            shift_h = base_h - m0_h - jh * M_STEP_H
            shift_w = base_w - m0_w - jw * M_STEP_W
            row_ok = ((i_d >= 0) & (i_d < D) & (u_h >= -shift_h) & (u_h < H - shift_h) & (u_w >= -shift_w)
                      & (u_w < W - shift_w))
            rows = tl.where(row_ok, rows_hw + (i_d * sxd + shift_h * sxh + shift_w * sxw), 0)
        tap_row = ((t_d * KH + t_h) * KW + t_w) * GROUPS * CIN_G * COUT_G
        a, a_lo, b, b_lo = load_operands(x_base, w_group, w_lo_group, rows, row_ok,
                                         tap_row + tl.minimum(co, COUT_G - 1) * CIN_G, co_ok, ci0, CIN_G, sxc,
                                         PRECISION, BLOCK_CI, EVEN_CI)
        acc = mma(acc, a, a_lo, b, b_lo, PRECISION, INTERPRETED)
        ci0, carry = count_on(ci0, 0, CI_BLOCKS * BLOCK_CI, True, BLOCK_CI)
        jw, carry = count_on(jw, jw_lo, jw_hi, carry)
        jh, carry = count_on(jh, jh_lo, jh_hi, carry)
        jd = tl.where(carry, jd + 1, jd)
    return acc


@triton.jit
def work_item(item, CO_BLOCKS, U_W_BLOCKS, U_H_BLOCKS, S_H: tl.constexpr, OD):
    """The general kernel's work item `item` (turned.py's too): its output-channel block (of CO_BLOCKS, groups'
    included), column and row blocks, row phase, output plane and sample. Output-channel blocks fastest, so that
    items sharing an input tile run together."""
    co_block = item % CO_BLOCKS
    item = item // CO_BLOCKS
    uw_block = item % U_W_BLOCKS
    item = item // U_W_BLOCKS
    uh_block = item % U_H_BLOCKS
    item = item // U_H_BLOCKS
    v_h = item % S_H
    item = item // S_H
    return co_block, uw_block, uh_block, v_h, item % OD, item // OD


@triton.jit
def conv_transpose3d_kernel(
    x_ptr, w_ptr, w_lo_ptr, b_ptr, y_ptr,
    CIN_G, COUT_G, D, H, W, OD, OH, OW,
    KD, KH, KW,
    sxn, sxc, sxd, sxh, sxw,
    syn, syc, syd, syh, syw,
    U_H_BLOCKS, U_W_BLOCKS, CO_BLOCKS, GROUPS, ITEMS,
    S_D: tl.constexpr, S_H: tl.constexpr, S_W: tl.constexpr,
    P_D: tl.constexpr, P_H: tl.constexpr, P_W: tl.constexpr,
    DIL_D: tl.constexpr, DIL_H: tl.constexpr, DIL_W: tl.constexpr,
    STEP_D: tl.constexpr, STEP_H: tl.constexpr, STEP_W: tl.constexpr,
    HAS_BIAS: tl.constexpr, PRECISION: tl.constexpr, INTERPRETED: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_CO: tl.constexpr, BLOCK_CI: tl.constexpr,
    FILL_W: tl.constexpr, CI_BLOCKS: tl.constexpr, EVEN_CI: tl.constexpr, SCALED: tl.constexpr, PDL: tl.constexpr,
    DIAG: tl.constexpr = 0,
):
    # DIAG (benchmarks only, to see where time goes): 1 skips the GEMM and stores its zero tiles, 2 runs the
    # GEMM but stores none of its tiles. SCALED: FP16 operands scaled per tensor (tensor_scaled.py), w_lo_ptr
    # pointing at their pass's sync words.
    BLOCK_M: tl.constexpr = BLOCK_R * BLOCK_Q
    if PDL:
        wait_for_previous()
    if SCALED:
        scale_a, scale_b = inverse_scales(w_lo_ptr)
    # Each program walks the work items (blocks of output rows) with a stride of the grid size: one item per
    # program with a full grid, or many with a persistent one (configs choose).
    for item in range(tl.program_id(0), ITEMS, tl.num_programs(0)):
        co_block, uw_block, uh_block, v_h, od, n = work_item(item, CO_BLOCKS * GROUPS, U_W_BLOCKS, U_H_BLOCKS, S_H, OD)
        group = co_block // CO_BLOCKS
        co = (co_block % CO_BLOCKS) * BLOCK_CO + tl.arange(0, BLOCK_CO)
        co_ok = co < COUT_G

        y_base = y_ptr + n.to(tl.int64) * syn + od.to(tl.int64) * syd + (group * COUT_G).to(tl.int64) * syc
        if HAS_BIAS:
            bias = tl.load(b_ptr + group * COUT_G + co, mask=co_ok, other=0.0).to(tl.float32)
        else:
            bias = tl.zeros([BLOCK_CO], dtype=tl.float32)

        # Depth: one output plane od = S_D * u_d + v_d, compact index q_d.
        M_STEP_D: tl.constexpr = STEP_D * DIL_D // S_D
        base_d, m0_d, t0_d, jd_lo, jd_hi = _axis_taps(od % S_D, od // S_D, od // S_D, D, KD, S_D, P_D, DIL_D, STEP_D)
        q_d = od // S_D + base_d
        # Height: rows oh = S_H * u_h + v_h of the block.
        M_STEP_H: tl.constexpr = STEP_H * DIL_H // S_H
        u_h0 = uh_block * BLOCK_R
        u_h_end = tl.minimum(u_h0 + BLOCK_R, (OH - v_h + S_H - 1) // S_H)  # one past the block's last row
        base_h, m0_h, t0_h, jh_lo, jh_hi = _axis_taps(v_h, u_h0, u_h_end - 1, H, KH, S_H, P_H, DIL_H, STEP_H)
        u_w0 = uw_block * BLOCK_Q
        # Taps that reach some column of the block, over all column phases: none means no GEMM at all.
        w_taps = 0
        for v_w in tl.static_range(S_W):
            _, _, _, jw_lo, jw_hi = _column_taps(v_w, u_w0, OW, W, KW, S_W, P_W, DIL_W, STEP_W, BLOCK_Q)
            w_taps += jw_hi - jw_lo
        if (jd_hi - jd_lo) * (jh_hi - jh_lo) * w_taps == 0:
            # No tap reaches these rows (or the block's columns): write the bias over whole contiguous rows, one
            # row at a time (a [BLOCK_CO, FILL_W] tile of 64-bit pointers is all the registers it needs).
            e = tl.arange(0, FILL_W)
            fill_ow = S_W * u_w0 + e
            fill = tl.zeros([BLOCK_CO, FILL_W], dtype=tl.float32) + bias[:, None]
            fill = fill.to(y_ptr.dtype.element_ty)
            for rr in range(BLOCK_R):
                fill_oh = S_H * (u_h0 + rr) + v_h
                fill_ok = (fill_ow < OW) & (e < S_W * BLOCK_Q) & (fill_oh + e * 0 < OH)
                tl.store(y_base + co[:, None] * syc + (fill_oh * syh + fill_ow * syw)[None, :], fill,
                         mask=co_ok[:, None] & fill_ok[None, :])
        else:
            m = tl.arange(0, BLOCK_M)
            u_h = u_h0 + m // BLOCK_Q
            u_w = u_w0 + m % BLOCK_Q
            oh = S_H * u_h + v_h
            x_base = x_ptr + n.to(tl.int64) * sxn + (group * CIN_G).to(tl.int64) * sxc
            w_group = w_ptr + group * CIN_G * COUT_G
            w_lo_group = w_lo_ptr + group * CIN_G * COUT_G
            args = (x_base, w_group, w_lo_group, co, co_ok, m, u_h, u_w, u_w0,
                    q_d, m0_d, t0_d, jd_lo, jd_hi, base_h, m0_h, t0_h, jh_lo, jh_hi,
                    D, H, W, OW, KD, KH, KW, GROUPS, CIN_G, COUT_G, sxc, sxd, sxh, sxw)
            for v_w in tl.static_range(S_W):
                out = _phase_gemm(
                    v_w, *args, S_W=S_W, P_W=P_W, DIL_W=DIL_W, STEP_D=STEP_D, STEP_H=STEP_H, STEP_W=STEP_W,
                    M_STEP_D=M_STEP_D, M_STEP_H=M_STEP_H, PRECISION=PRECISION, INTERPRETED=INTERPRETED,
                    BLOCK_M=BLOCK_M, BLOCK_Q=BLOCK_Q, BLOCK_CO=BLOCK_CO, BLOCK_CI=BLOCK_CI, CI_BLOCKS=CI_BLOCKS,
                    EVEN_CI=EVEN_CI, DIAG=DIAG,
                )
                if SCALED:
                    out = out * scale_a * scale_b
                out += bias[None, :]
                if DIAG == 2:  # a mask no element passes, but one the compiler cannot drop with the GEMM
                    co_ok = co_ok & (tl.sum(out, axis=0) != tl.sum(out, axis=0))
                if S_W != 2:
                    ow = S_W * u_w + v_w
                    ok = (oh < OH) & (ow < OW)
                    # Pointers laid out [channel, position] so that neighbouring threads write neighbouring columns.
                    ptrs = y_base + co[:, None] * syc + (oh * syh + ow * syw)[None, :]
                    tl.store(ptrs, tl.trans(out).to(y_ptr.dtype.element_ty), mask=co_ok[:, None] & ok[None, :])
                elif v_w == 0:
                    even = out
                else:
                    # Stride 2: interleave the two column phases in registers, so that every output row is stored
                    # contiguously (stride-2 stores of each phase apart cost more than the GEMM on problem 77).
                    tile = tl.reshape(tl.permute(tl.join(even, out), (1, 0, 2)), (BLOCK_CO, 2 * BLOCK_M))
                    j = tl.arange(0, 2 * BLOCK_M)
                    oh2 = S_H * (u_h0 + j // (2 * BLOCK_Q)) + v_h
                    ow2 = 2 * u_w0 + j % (2 * BLOCK_Q)
                    ok2 = (oh2 < OH) & (ow2 < OW)
                    tl.store(y_base + co[:, None] * syc + (oh2 * syh + ow2 * syw)[None, :],
                             tile.to(y_ptr.dtype.element_ty), mask=co_ok[:, None] & ok2[None, :])


def _configs():
    # Measured on the H200 (problem 77, benchmarks/RESULTS.md) and left out: a persistent grid (2 programs per
    # multiprocessor: 2.2x slower), registers capped at 128 or 168 so that programs share a multiprocessor
    # (2.0-2.6x slower: spills), 64-row tiles with 32-channel blocks (1.7x slower there).
    if interpreted():
        return [dict(BLOCK_M=32, BLOCK_CO=16, BLOCK_CI=16, num_warps=4, num_stages=1, PER_SM=1)]
    return [
        dict(BLOCK_M=m, BLOCK_CO=co, BLOCK_CI=ci, num_warps=w, num_stages=s, PER_SM=0)
        for m, co, ci, w, s in [
            (256, 64, 16, 8, 4),
            (256, 64, 32, 8, 3),
            (128, 64, 32, 8, 3),
            (128, 64, 32, 4, 3),
            (128, 128, 32, 8, 3),
            # One stage: plain loads, which (unlike the pipeline's asynchronous copies) are cached in L1, where
            # the taps of one program re-read the same input rows.
            (128, 64, 32, 4, 1),
            (256, 64, 32, 8, 1),
            # Wider channel blocks, for layers with 64 input channels or more (seventeenth session: the fastest on
            # the sweep's vae, video and fp16 layers; 256 x 64 x 64 in three stages fits half precision only). On
            # FP16 operands (float16, and TF32 mode's per-tensor scaled ones) 128 x 64 x 64 in three stages was the
            # fastest on vae_k4s2p1_fp16, k3s1p1 and video_spatial_k144 (forty-ninth session: the kernel alone
            # 0.048 ms against 0.052 on the first).
            (128, 64, 64, 4, 2),
            (128, 64, 64, 4, 3),
            (64, 64, 64, 4, 3),
            (256, 64, 64, 8, 3),
        ]
    ]


def _operands(input, weight, groups, precision):
    """(x, w, w_lo) as the GEMM reads them, by the operand pass: the input channels-last, (N, D, H, W, C_in), and the
    weight tap-major and K-major, (taps, groups, C_out/g, C_in/g); for float32 both TF32-rounded, or under 3xTF32 the
    weight split into high and low parts and the input as it is (w_lo is w where unused), or under
    FP16_TENSOR_SCALED both FP16 scaled per tensor, w_lo the pass's sync words (tensor_scaled.py)."""
    flat, flat_strides = flat_input(input)
    layout, operand_pass = _operand_steps(tuple(input.shape), tuple(weight.shape), groups, flat_strides, precision,
                                          pass_lets_main_start(input.device), tensor_scaled.cuda_index(input.device))
    x, w, w_lo = _operand_buffers(layout, input.dtype, precision, input.device)
    operand_pass((flat, x, weight.contiguous(), w, w_lo))
    return x, w, w_lo


def _operand_dtype(dtype: torch.dtype, precision: int) -> torch.dtype:
    return torch.float16 if precision == tensor_scaled.FP16_TENSOR_SCALED else dtype


def _operand_buffers(layout, dtype: torch.dtype, precision: int, device) -> tuple:
    """(x, w, w_lo) for the operand pass to fill, allocated by layout; under FP16_TENSOR_SCALED w_lo is the pass's
    sync words on the current stream."""
    x, _, w, w_lo = allocate_operands(layout, _operand_dtype(dtype, precision), device)
    if precision == tensor_scaled.FP16_TENSOR_SCALED:
        w_lo = tensor_scaled.sync_words(device)
    return x, w, w_lo


@functools.lru_cache(maxsize=256)
def _operand_steps(input_shape, weight_shape, groups: int, flat_strides, precision: int, let_next_start: bool = False,
                   device_index=None):
    """(the operands' _operand_layout, the bound operand pass) of a layer, for an input with these strides (as (N, C,
    D*H*W)): what _operands uses on every call and a prepared call keeps."""
    n, c, d, h, w = input_shape
    c_in, c_out_g, kd, kh, kw = weight_shape
    layout = _operand_layout((n, d, h, w, c), (kd * kh * kw, groups, c_out_g, c_in // groups), precision == TF32X3,
                             False)
    if precision == tensor_scaled.FP16_TENSOR_SCALED:
        return layout, tensor_scaled.operand_pass(input_shape, weight_shape, groups, flat_strides, let_next_start,
                                                  device_index)
    return layout, _operand_pass(input_shape, weight_shape, groups, flat_strides, precision,
                                 let_next_start=let_next_start)


def flat_input(input):
    """input as (N, C, D*H*W) for the operand passes: the tensor itself and those strides where it is contiguous (no
    view made: each costs host time), else input.flatten(2) (a view where the strides allow, else a copy)."""
    if input.is_contiguous():
        n, c, d, h, w = input.shape
        return input, (c * d * h * w, d * h * w, 1)
    flat = input.flatten(2)
    return flat, flat.stride()


def allocate_operands(layout, dtype, device):
    """Uninitialised (x, x_lo, w, w_lo) for an operand pass, as an _operand_layout lays them out (x, w again where a
    low part is unused). All are views of one allocation: a torch.empty took 6.7 us of the H200 machine's host time,
    and two to four of them were made per call; a view took about 2.5 us under the profiler
    (benchmarks/diag_host_steps.py, twenty-second session; the separate saving was not measured)."""
    total, x_view, x_lo_view, w_view, w_lo_view = layout
    buffer = torch.empty(total, dtype=dtype, device=device)
    x = buffer.as_strided(*x_view)
    weight_operand = buffer.as_strided(*w_view)
    return (x, buffer.as_strided(*x_lo_view) if x_lo_view else x, weight_operand,
            buffer.as_strided(*w_lo_view) if w_lo_view else weight_operand)


@functools.lru_cache(maxsize=256)
def _operand_layout(x_shape, w_shape, split: bool, split_input: bool):
    """(elements, then (shape, strides, offset) of x, x_lo, w, w_lo, or None where unused): contiguous arrays one after
    the other, each starting at a multiple of 64 elements (as aligned as the kernels' 16-byte loads need, and more)."""
    return contiguous_views((x_shape, x_shape if split and split_input else None, w_shape, w_shape if split else None))


def contiguous_strides(shape) -> tuple:
    """The strides, in elements, of a contiguous array of this shape."""
    strides, size = [], 1
    for extent in reversed(shape):
        strides.insert(0, size)
        size *= extent
    return tuple(strides)


def contiguous_views(shapes):
    """(elements, then (shape, strides, offset) of each shape, or None for None): contiguous arrays one after the
    other in one buffer, each starting at a multiple of 64 elements."""
    views, total = [], 0
    for shape in shapes:
        if shape is None:
            views.append(None)
            continue
        views.append((shape, contiguous_strides(shape), total))
        total += -(-math.prod(shape) // 64) * 64
    return (total, *views)


@functools.lru_cache(maxsize=256)
def _operand_pass(input_shape, weight_shape, groups: int, flat_strides, precision: int, block_c: int = 32,
                  block_s: int = 128, num_warps: int = 4, let_next_start: bool = False):
    """The operand pass of a layer, for an input with these strides (as (N, C, D*H*W)), bound (launch.BoundLaunch);
    its input tiles are block_c channels by block_s positions. Of eight tiles on six sweep layers on the H200, 32 x 128
    was the fastest or within 0.5 us of it on each (benchmarks/diag_operand_pass.py, twentieth session)."""
    n, c, d, h, w = input_shape
    cin_g, c_out_g = weight_shape[0] // groups, weight_shape[1]
    taps = math.prod(weight_shape[2:])
    block_wci, block_wk = operand_pass_weight_tile(cin_g)
    ci_blocks, k_blocks, w_tiles = weight_tiles(groups, cin_g, c_out_g * taps, block_wci, block_wk)
    s_blocks = cdiv(d * h * w, block_s)
    x_programs = n * cdiv(c, block_c) * s_blocks
    return _prepare.bind(
        (x_programs + w_tiles,),
        (c, d * h * w, s_blocks, x_programs, *flat_strides, groups, cin_g, c_out_g, taps, ci_blocks, k_blocks, w_tiles),
        (("PRECISION", precision), ("BLOCK_C", block_c), ("BLOCK_S", block_s), ("BLOCK_WCI", block_wci),
         ("BLOCK_WK", block_wk), ("LET_NEXT_START", let_next_start), ("num_warps", num_warps)))


def operand_pass_weight_tile(cin_g: int) -> tuple[int, int]:
    """(channels, columns) of _operand_pass's weight tiles (tap_major_tile): up to 32 channels, 128 float32 bytes
    stored together, by as many columns as make 1,024 elements."""
    block_ci = min(32, next_power_of_2(cin_g))
    return block_ci, 1024 // block_ci


def channels_last_strides(plan: Plan) -> tuple[int, ...]:
    """The strides of _operands' input, (N, D, H, W, C) contiguous, as (N, C, D, H, W)."""
    c, (d, h, w) = plan.in_channels, plan.input_spatial
    return d * h * w * c, 1, h * w * c, w * c, c


@functools.lru_cache(maxsize=None)
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


_best_config: dict = {}


def allocate_output(input, weight, bias, plan: Plan):
    """(out, finished): the output as PyTorch lays it out, uninitialised, and whether it is already complete without
    a GEMM (no elements, or no input channels: the bias alone)."""
    out = torch.empty(plan.output_shape, dtype=input.dtype, device=input.device,
                      memory_format=output_memory_format(input, weight, plan))
    if out.numel() == 0:
        return out, True
    if plan.in_channels == 0:  # nothing to sum
        if bias is not None:
            out.copy_(bias.view(1, -1, 1, 1, 1).expand_as(out))
        else:
            out.zero_()
        return out, True
    return out, False


def pick_config(cache: dict, key, candidates, launch, device: torch.device):
    """The config cached under key, else the fastest of candidates by _autotune (launch(cfg) runs one), remembered.
    With one candidate, in the interpreter, or inside a CUDA graph capture (no timing there) the first, not
    remembered."""
    config = cache.get(key)
    if config is None:
        if len(candidates) == 1 or interpreted() or (device.type == "cuda"
                                                     and torch.cuda.is_current_stream_capturing()):
            return candidates[0]
        config = cache[key] = _autotune(launch, candidates, key)
    return config


# The bound launch of the chosen config, per key of _best_config: the host looks up one dict between the two launches.
_chosen: dict = {}


def conv_transpose3d_triton(input, weight, bias, plan: Plan, precision: int | None = None, config: dict | None = None):
    """Check, allocate, launch. input (N, C_in, D, H, W) and weight are validated; any strides. Everything the
    kernel's launch needs is found before the operand pass is launched: between the two launches the GPU waits
    for the host once the pass is done."""
    out, finished = allocate_output(input, weight, bias, plan)
    if finished:
        return out
    precision = tensor_scaled.operand_precision(input, weight, plan.groups,
                                                precision_for(input.dtype) if precision is None else precision)
    key = _chosen_key(input, plan, precision, out, bias)
    main = _chosen.get(key) if config is None else None
    x, w, w_lo = _operands(input, weight, plan.groups, precision)
    pointers = (x, w, w_lo, bias if bias is not None else w, out)
    if main is None:
        device_index = out.device.index or 0
        chosen = config if config is not None else pick_config(
            _best_config, key, candidates(plan, _operand_dtype(input.dtype, precision),
                                          None if interpreted() else device_index),
            lambda cfg: _main_launch(cfg, plan, precision, bias is not None, out.stride(), device_index)(pointers),
            input.device)
        main = _main_launch(chosen, plan, precision, bias is not None, out.stride(), device_index)
        if config is None and key in _best_config:
            _chosen[key] = main
    main(pointers)
    return out


def _chosen_key(input, plan: Plan, precision: int, out, bias):
    """The key of _best_config and _chosen for a call."""
    return plan.key, input.dtype, precision, input.device, out.stride(), bias is not None


def prepare(input, weight, bias, plan: Plan, precision: int, out):
    """After a call of conv_transpose3d_triton with contiguous input and weight that returned out: the same call for
    this layer as a function of (input, weight, bias), its launches and layouts bound, or None where there is none to
    bind (no GEMM, or no tile config chosen yet)."""
    precision = tensor_scaled.operand_precision(input, weight, plan.groups, precision)
    main = _chosen.get(_chosen_key(input, plan, precision, out, bias))
    if main is None:
        return None
    layout, operand_pass = _operand_steps(tuple(input.shape), tuple(weight.shape), plan.groups, flat_input(input)[1],
                                          precision, pass_lets_main_start(input.device),
                                          tensor_scaled.cuda_index(input.device))
    shape, dtype, device = plan.output_shape, input.dtype, input.device
    scaled = precision == tensor_scaled.FP16_TENSOR_SCALED
    operand_dtype = _operand_dtype(dtype, precision)

    def call(input, weight, bias):
        out = input.new_empty(shape)
        x, w, w_lo = _operand_buffers(layout, dtype, precision, device)
        operand_pass((input, x, weight, w, w_lo))
        main((x, w, w_lo, w if bias is None else bias, out))
        return out

    x_at, _, w_at, w_lo_at = operand_offsets(layout, operand_dtype.itemsize)

    def launch(launches, stream, x_in, w_in, b_in, operands, out):
        pass_at, main_at = launches
        x, w = operands + x_at, operands + w_at
        sync = tensor_scaled.sync_words(device, stream) if scaled else None  # (kept until the launches are queued)
        w_lo = sync.data_ptr() if scaled else operands + w_lo_at
        pass_at(stream, x_in, x, w_in, w, w_lo)
        main_at(stream, x, w, w_lo, b_in or w, out)

    # The pointers' dtypes: the input's and the operands', the sync words' (int32) under FP16_TENSOR_SCALED, and as the
    # first call gave them, the bias (or w) and out.
    lo_dtype = torch.int32 if scaled else dtype
    pointer_dtypes = ((dtype, operand_dtype, dtype, operand_dtype, lo_dtype),
                      (operand_dtype, operand_dtype, lo_dtype, dtype if bias is not None else operand_dtype, dtype))
    return at_addresses_else(call, input, shape, layout[0], (operand_pass, main), launch, pointer_dtypes,
                             operand_dtype)


# The largest operands' buffer that prepared calls keep rather than allocate on every call: host time that the GPU
# waits through on small layers (larger layers' kernels outlast the host's work). On the H200 machine keeping it took
# 4.0 us less host time per forward call by the median of twelve layer and precision cases; outputs bitwise the same
# on six of them (benchmarks/diag_launch_ways.py, sixty-sixth session).
KEPT_OPERANDS_BYTES = 16 << 20
# The kept buffers, per (device, stream, thread): one for all layers, as large as the largest operands asked of it, as
# tensor_scaled.sync_words shares its words (a model's layers, each keeping its own, held their sum).
_kept_operands: dict = {}
_thread = threading.get_ident
_stream_capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing", torch.cuda.is_current_stream_capturing)


def _capturing(device: torch.device) -> bool:
    """Whether device's current stream is capturing a CUDA graph (torch's C function, without its Python wrapper)."""
    return device.type == "cuda" and _stream_capturing()


def at_addresses_else(call, input, shape, operands_size: int, bounds, launch, dtypes=None, operands_dtype=None):
    """A prepared call whose bound launches (bounds) go at addresses (BoundLaunch.at_addresses, for 16-byte aligned
    pointers, all of input's dtype or, where dtypes is given, of dtypes' tuple for each bound): it allocates the
    output (of shape) and operands_size elements of operands_dtype (input's where None) for the operands (none where
    0) and hands launch (those launches, the stream, the addresses of input, weight, bias (0 for none), the operands
    and the output), where it may now: on input's device, its current stream
    (ready_stream), input, weight and bias 16-byte aligned. Else, and where a bound has no launch at addresses,
    call, which launches through tensors. Launched so, a prepared call makes no views of its operands' buffer and
    no key per launch: on the H200 machine a view took 3.3-3.6 us of host time and a launch through its BoundLaunch
    12-14 us, against 9.2-9.3 for Triton's launcher with addresses (benchmarks/diag_host_steps.py, thirty-fifth
    session). An operands' buffer of at most KEPT_OPERANDS_BYTES is kept per device, stream and thread, for every
    layer's prepared calls (_kept_operands): a call's operand pass writes what it uses of it and its main kernel reads
    that, on one stream, so the next call's pass, of this layer or another (no dependent launch), starts after this
    call's main kernel has finished reading; per thread, so that another thread's pass cannot come between them. Not
    inside a CUDA graph capture, whose replays may run on another stream beside this one's calls."""
    torch_device, device = input.device, input.device.index
    if dtypes is None:
        dtypes = [(input.dtype,) * bound.pointers for bound in bounds]
    launches = tuple(bound.at_addresses(device, pointer_dtypes) for bound, pointer_dtypes in zip(bounds, dtypes))
    if None in launches:
        return call
    operands_dtype = input.dtype if operands_dtype is None else operands_dtype
    operands_bytes = operands_size * operands_dtype.itemsize
    keep = operands_bytes <= KEPT_OPERANDS_BYTES

    def call_at_addresses(input, weight, bias):
        stream = ready_stream(device)
        x, w, b = input.data_ptr(), weight.data_ptr(), 0 if bias is None else bias.data_ptr()
        if stream is None or (x | w | b) % 16:
            return call(input, weight, bias)
        out = input.new_empty(shape)
        operands = 0
        if operands_size:
            if keep and not _capturing(torch_device):  # (a graph's replays may run beside this stream's calls)
                key = device, stream, _thread()
                kept = _kept_operands.get(key)
                operands = kept[1] if kept is not None and kept[0] >= operands_bytes else _keep_operands(
                    torch_device, key, operands_bytes)
            else:
                buffer = input.new_empty(operands_size, dtype=operands_dtype)  # (kept until the launches are queued)
                operands = buffer.data_ptr()
        launch(launches, stream, x, w, b, operands, out.data_ptr())
        return out

    return call_at_addresses


def _keep_operands(device: torch.device, key, size: int) -> int:
    """The address of a new operands' buffer of size bytes, kept for key (device index, stream, thread) in place of
    a smaller one, whose launches were queued on that stream before any that use this one."""
    if key not in _kept_operands and len(_kept_operands) >= 16:  # (many threads or streams come and go: start over)
        _kept_operands.clear()
    buffer = torch.empty(size, dtype=torch.uint8, device=device)
    _kept_operands[key] = size, buffer.data_ptr(), buffer
    return buffer.data_ptr()


def operand_offsets(layout, item_size: int) -> tuple[int, int, int, int]:
    """The byte offsets of x, x_lo, w, w_lo in the operands' buffer as layout (an _operand_layout) places them, x's
    and w's where a low part is unused (as allocate_operands gives x and w for them)."""
    x, x_lo, w, w_lo = (None if view is None else view[2] * item_size for view in layout[1:])
    return x, x if x_lo is None else x_lo, w, w if w_lo is None else w_lo


@functools.lru_cache(maxsize=256)
def _geometry(plan: Plan, block_m: int, block_co: int, block_ci: int, programs_per_sm: int, device_index: int):
    """(grid, the kernel's sizes, blocks and their count, its constexprs) of a config for a layer: once per layer, as
    host time shows."""
    n, c_in, (d, h, w_in) = plan.batch, plan.in_channels, plan.input_spatial
    groups = plan.groups
    cin_g, cout_g = c_in // groups, plan.out_channels // groups
    od, oh, ow = plan.output_spatial
    (s_d, s_h, s_w), (p_d, p_h, p_w), (dl_d, dl_h, dl_w) = plan.stride, plan.padding, plan.dilation
    u_h, u_w = -(-oh // s_h), -(-ow // s_w)
    block_q = min(32, power_of_2_at_most(u_w))
    block_r = max(1, block_m // block_q)
    block_co = max(16, min(block_co, next_power_of_2(cout_g)))
    block_ci = max(16, min(block_ci, next_power_of_2(cin_g)))
    u_h_blocks, u_w_blocks, co_blocks = cdiv(u_h, block_r), cdiv(u_w, block_q), cdiv(cout_g, block_co)
    items = n * od * s_h * u_h_blocks * u_w_blocks * co_blocks * groups
    if interpreted():
        programs = min(items, 3)  # few programs, so that the interpreter walks the persistent loop too
    else:
        # 0: one program per item; else a persistent grid of that many programs per multiprocessor.
        programs = min(items, programs_per_sm * _sm_count(device_index)) if programs_per_sm else items
    sizes = (cin_g, cout_g, d, h, w_in, od, oh, ow, *plan.kernel_size)
    blocks = (u_h_blocks, u_w_blocks, co_blocks, groups, items)
    constexprs = (
        ("S_D", s_d), ("S_H", s_h), ("S_W", s_w), ("P_D", p_d), ("P_H", p_h), ("P_W", p_w),
        ("DIL_D", dl_d), ("DIL_H", dl_h), ("DIL_W", dl_w), ("STEP_D", s_d // math.gcd(s_d, dl_d)),
        ("STEP_H", s_h // math.gcd(s_h, dl_h)), ("STEP_W", s_w // math.gcd(s_w, dl_w)),
        ("BLOCK_R", block_r), ("BLOCK_Q", block_q), ("BLOCK_CO", block_co), ("BLOCK_CI", block_ci),
        ("FILL_W", next_power_of_2(s_w * block_q)), ("CI_BLOCKS", cdiv(cin_g, block_ci)),
        ("EVEN_CI", cin_g % block_ci == 0))
    return (programs,), sizes, blocks, constexprs


def candidates(plan: Plan, operand_dtype: torch.dtype | None = None, device_index: int | None = None) -> list[dict]:
    """The tile configs to autotune among: this kernel's, then tap_columns' where it serves the layer, then turned's
    where it serves the layer on operands of operand_dtype (None: not asked) on CUDA device device_index (None: the
    interpreter's)."""
    configs = _configs()
    if tap_columns.unsupported_reason(plan) is None:
        configs += tap_columns.configs(plan)
    if operand_dtype is not None and turned.unsupported_reason(plan, operand_dtype, device_index) is None:
        configs += turned.configs()
    return configs


def _launch(cfg, plan: Plan, x, w, w_lo, bias, out, precision):
    """One launch of a config on _operands' results."""
    _main_launch(cfg, plan, precision, bias is not None, out.stride(), out.device.index or 0)(
        (x, w, w_lo, bias if bias is not None else w, out))


def _main_launch(cfg, plan: Plan, precision: int, has_bias: bool, out_strides, device_index: int):
    """A config's launch for a layer, bound (launch.BoundLaunch): call it with (x, w, w_lo, bias, out)."""
    if cfg.get("KERNEL") == "tap_columns":
        return tap_columns.bind(cfg, plan, precision, has_bias, out_strides, device_index)
    if cfg.get("KERNEL") == "turned":
        return turned.bind(cfg, plan, precision, has_bias, out_strides, device_index)
    grid, sizes, blocks, constexprs = _geometry(plan, cfg["BLOCK_M"], cfg["BLOCK_CO"], cfg["BLOCK_CI"], cfg["PER_SM"],
                                                device_index)
    return _kernel.bind(
        grid, (*sizes, *channels_last_strides(plan), *out_strides, *blocks),
        (*constexprs, ("HAS_BIAS", has_bias), *mma_precision(precision), ("INTERPRETED", _kernel.interpreted),
         ("DIAG", cfg.get("DIAG", 0)), *dependent_options(device_index), ("num_warps", cfg["num_warps"]),
         ("num_stages", cfg["num_stages"])))


def mma_precision(precision: int) -> tuple:
    """A main kernel's PRECISION and SCALED constexprs for an operand precision: FP16_TENSOR_SCALED's operands
    multiply in FP16 (NATIVE), their sums scaled back in the epilogue."""
    scaled = precision == tensor_scaled.FP16_TENSOR_SCALED
    return ("PRECISION", NATIVE if scaled else precision), ("SCALED", scaled)


def dependent_options(device_index: int) -> tuple:
    """A main kernel's PDL constexpr and launch option: launched as the operand pass's dependent where the device
    allows (dependent_launch)."""
    dependent = dependent_launch(device_index)
    return (("PDL", dependent),) + ((("launch_pdl", True),) if dependent else ())


_prepare = Launcher(prepare_operands_kernel)
_kernel = Launcher(conv_transpose3d_kernel)


def _autotune(launch, candidates, key):
    """Time each config by triton.testing.do_bench (its L2 cleared before each run and the runs queued: the GPU's time
    from a cold L2, not the host's) and keep the fastest; configs that do not fit (shared memory) are skipped.
    The times and the choice go to the debug log: the same code has measured up to twice as slow in one process as
    in another (benchmarks/RESULTS.md, seventeenth session), and the log says whether the choice differed."""
    times = {}
    for index, cfg in enumerate(candidates):
        try:
            times[index] = triton.testing.do_bench(lambda: launch(cfg), warmup=5, rep=20)
        except triton.runtime.errors.OutOfResources:
            continue
    if not times:
        raise RuntimeError("convt3d: no Triton tile config fits this GPU for this layer")
    best = min(times, key=times.get)
    logger.debug("convt3d: Triton config %s for %s (do_bench ms by config: %s)", candidates[best], key,
                 {i: round(ms, 4) for i, ms in times.items()})
    return candidates[best]


# Last: tap_columns, turned and tensor_scaled build on this module's device functions (mma, the phase arithmetic, the
# rounding).
from . import tap_columns  # noqa: E402
from . import tensor_scaled  # noqa: E402
from . import turned  # noqa: E402
