"""Triton forward with the taps along W as GEMM columns, so that each input tile is loaded once per (depth, height)
tap instead of once per tap.

The general kernel (forward.py) computes each output-column phase as an implicit GEMM over all of its taps, and
loads an input tile per tap: on the H200 its times followed the bytes those loads move from L2 (benchmarks/
RESULTS.md, eighteenth session). Here a program takes a run of input columns c of some output rows oh (one depth
plane od, one height phase) and computes one GEMM whose columns are (W tap, output channel):

    P[c, (t_w, co)] = sum over the depth and height taps of the rows' phases and the input channels ci of
                      x[n, ci, i_d, i_h, c] * weight[ci, co, t_d, t_h, t_w]

Along W, output column ow = S_W * u + v receives tap t_w from input column u + delta(t_w), where tap t_w reaches
phase v = (DIL_W * t_w - P_W) mod S_W and delta(t_w) = (v + P_W - DIL_W * t_w) / S_W. So

    y[n, co, od, oh, S_W * u + v] = bias[co] + sum over the taps t_w of phase v of P[u + delta(t_w), (t_w, co)]

which the epilogue forms by gathering each tap's column of P from the row delta(t_w) - DMIN further on (DMIN the
smallest delta), in registers. A row of outputs needs its input columns from u + DMIN to u + DMAX, HALO = DMAX -
DMIN more than it has: each output row's input columns are laid out as a virtual row of U_W + HALO slots (slot s holds
input column s + DMIN and output column group u = s), the rows one after another, and a program takes BLOCK_M
consecutive slots, of which the first BLOCK_M - HALO are its outputs; the next program starts there. Where the taps
of a column group (below) share one shift, the group's A tile is read that many slots further on instead, and its
columns need no gather; where no group gathers, the tiles have no halo (tap_groups).

A K-step loads its A tile once for two GEMMs where KW is not a power of two (column_layout): KW = 3 takes 2 + 1 taps'
columns instead of 4, the fourth all zeros, so that a 64-channel block fits in 192 columns and each input tile is
loaded once for all 64 output channels (twice where the two groups read tiles at different shifts).

Operands as the general kernel's operand pass lays them out: the input channels-last and the weight tap-major and
K-major, TF32-rounded or split (precisions as in forward.py; under 3xTF32 A is split as it loads). Stride along W of 1
or 2 only (the output's phases interleave in registers as whole rows).
"""

from __future__ import annotations

import functools
import math

import triton
import triton.language as tl

from ...plan import AxisPlan, Plan
from . import TF32X3, cdiv, interpreted, next_power_of_2, power_of_2_at_most
from .forward import (_axis_taps, _sm_count, channels_last_strides, count_on, dependent_options, inverse_scales,
                      load_operands, load_weights, mma, mma_precision, wait_for_previous)
from .launch import Launcher


def _w_deltas(plan: Plan) -> list[int]:
    """delta(t_w) of each W tap."""
    s, p, dil, k = plan.stride[2], plan.padding[2], plan.dilation[2], plan.kernel_size[2]
    return [((dil * t - p) % s + p - dil * t) // s for t in range(k)]


def w_shifts(plan: Plan) -> tuple[int, int]:
    """(DMIN, HALO): the smallest delta(t_w) over the W taps, and the largest less the smallest."""
    deltas = _w_deltas(plan)
    return min(deltas), max(deltas) - min(deltas)


@functools.lru_cache(maxsize=256)
def unsupported_reason(plan: Plan) -> str | None:
    """None when this kernel can serve the layer, else why not."""
    if plan.stride[2] > 2:
        return "stride along W above 2"
    if w_shifts(plan)[1] > 8:  # (so that even the smallest tile, 32 slots, keeps 3/4 of its slots as outputs)
        return "the W taps span more than 8 input columns"
    return None


@triton.jit
def tap_columns_kernel(
    x_ptr, w_ptr, w_lo_ptr, b_ptr, y_ptr,
    CIN_G, COUT_G, D, H, W, OD, OH, OW, KD, KH,
    sxn, sxc, sxd, sxh, sxw,
    syn, syc, syd, syh, syw,
    U_H, TILES, CO_BLOCKS, GROUPS, U_D,
    S_D: tl.constexpr, S_H: tl.constexpr, S_W: tl.constexpr,
    P_D: tl.constexpr, P_H: tl.constexpr, P_W: tl.constexpr,
    DIL_D: tl.constexpr, DIL_H: tl.constexpr, DIL_W: tl.constexpr,
    STEP_D: tl.constexpr, STEP_H: tl.constexpr,
    KW: tl.constexpr, KW_A: tl.constexpr, KW_B: tl.constexpr, T0_A: tl.constexpr, T0_B: tl.constexpr,
    OFFSET_A: tl.constexpr, OFFSET_B: tl.constexpr, GATHER_A: tl.constexpr, GATHER_B: tl.constexpr,
    DMIN: tl.constexpr, HALO: tl.constexpr, U_W: tl.constexpr, CI_BLOCKS: tl.constexpr,
    HAS_BIAS: tl.constexpr, PRECISION: tl.constexpr, INTERPRETED: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_CO: tl.constexpr, BLOCK_CI: tl.constexpr, EVEN_CI: tl.constexpr,
    SCALED: tl.constexpr, PDL: tl.constexpr, BY_TAPS: tl.constexpr, ORDER_D: tl.constexpr, ORDER_H: tl.constexpr,
    DIAG: tl.constexpr = 0,
):
    # GEMM columns (t_w, co), co fastest: a tap's weight rows lie together, and each thread's accumulator holds
    # all taps of its columns, so that summing over taps stays in registers. Tensor shapes are powers of two, so the
    # KW taps are split in two column groups: taps [T0_A, T0_A + KW_A) and [T0_B, T0_B + KW_B) (KW_B 0: one group),
    # the taps past KW padding (zero columns). KW = 3 takes 2 + 1 groups rather than 4 padded columns. A group whose
    # taps share one shift reads its A tile that many slots (OFFSET) further on, so that its columns of P line up with
    # their outputs as computed; the epilogue gathers a group's columns (GATHER) where their shifts differ
    # (tap_groups). Groups of one offset share one A tile.
    # One program per work item: a persistent grid, each program running several items' K-steps as one loop so that
    # the next item's loads overlap an item's epilogue, roughly doubled the registers and took 16-232% more time on
    # every sweep layer tried (benchmarks/RESULTS.md, thirtieth session).
    OUTPUTS: tl.constexpr = BLOCK_M - HALO  # slots whose outputs this program writes
    if PDL:
        wait_for_previous()
    # Program order: output-channel blocks fastest, so that programs reading one input tile run together.
    pid = tl.program_id(0)
    co_block = pid % (CO_BLOCKS * GROUPS)
    pid = pid // (CO_BLOCKS * GROUPS)
    tile = pid % TILES
    pid = pid // TILES
    if BY_TAPS:
        # Then the planes (od, v_h) by their phases, the phases with the most taps first (ORDER_D, ORDER_H: the phases
        # in that order, phase_order), so that the grid ends on its lightest programs (BY_TAPS_WAVES says where); U_D
        # = cdiv(OD, S_D) planes a depth phase, those past OD empty.
        u_d = pid % U_D
        pid = pid // U_D
        v_h = _phase(ORDER_H, pid % S_H)
        pid = pid // S_H
        od = S_D * u_d + _phase(ORDER_D, pid % S_D)
        n = pid // S_D
    else:
        v_h = pid % S_H
        pid = pid // S_H
        od = pid % OD
        n = pid // OD
    group = co_block // CO_BLOCKS
    co0 = (co_block % CO_BLOCKS) * BLOCK_CO

    # The program's slots: virtual rows of U_W + HALO slots, slot s of row u_h holding input column s + DMIN. (U_W is
    # a constexpr, one compile per output width, so that the slots' divisions by the row's length here and in the
    # epilogue are multiplications.)
    row_slots = U_W + HALO
    first = tile * OUTPUTS
    m = tl.arange(0, BLOCK_M)
    u_h = (first + m) // row_slots
    s = (first + m) % row_slots
    c = s + DMIN

    # Depth: one output plane od = S_D * u_d + v_d, compact index q_d; height: the program's rows (as in forward.py).
    M_STEP_D: tl.constexpr = STEP_D * DIL_D // S_D
    base_d, m0_d, t0_d, jd_lo, jd_hi = _axis_taps(od % S_D, od // S_D, od // S_D, D, KD, S_D, P_D, DIL_D, STEP_D)
    q_d = od // S_D + base_d
    M_STEP_H: tl.constexpr = STEP_H * DIL_H // S_H
    u_h_last = tl.minimum((first + BLOCK_M - 1) // row_slots, U_H - 1)
    base_h, m0_h, t0_h, jh_lo, jh_hi = _axis_taps(v_h, first // row_slots, u_h_last, H, KH, S_H, P_H, DIL_H, STEP_H)

    x_base = x_ptr + n.to(tl.int64) * sxn + (group * CIN_G).to(tl.int64) * sxc
    # Each column group's A tile: the input columns c + OFFSET of the slots (masked outside the input).
    OWN_TILE_B: tl.constexpr = (KW_B > 0) & (OFFSET_B != OFFSET_A)
    c_a = c + OFFSET_A
    slot_ok_a = (c_a >= 0) & (c_a < W) & (u_h < U_H)
    if OWN_TILE_B:
        c_b = c + OFFSET_B
        slot_ok_b = (c_b >= 0) & (c_b < W) & (u_h < U_H)
    # B: the weight rows (t_w, co) of each column group, of the taps (t_d, t_h, t_w), in the layout (taps, groups,
    # C_out/g, C_in/g).
    b_rows_a, b_ok_a = _weight_rows(T0_A, KW_A, KW, group, co0, GROUPS, COUT_G, CIN_G, BLOCK_CO)
    acc_a = tl.zeros([BLOCK_M, KW_A * BLOCK_CO], dtype=tl.float32)
    if KW_B > 0:
        b_rows_b, b_ok_b = _weight_rows(T0_B, KW_B, KW, group, co0, GROUPS, COUT_G, CIN_G, BLOCK_CO)
        acc_b = tl.zeros([BLOCK_M, KW_B * BLOCK_CO], dtype=tl.float32)
    # The K-steps walk (depth tap, height tap, channel block), the channels fastest, counted on (forward.count_on)
    # rather than divided out of k: this loop has few steps (video_k3s2p1op1: 2.25 taps of 2 channel blocks). With U_W
    # and CI_BLOCKS constexprs as well, the best config's kernel on the H200 (TF32): k3s1p1 0.048-0.051 -> 0.039-0.040
    # ms, wide_256to128_k3s2 0.061-0.064 -> 0.050-0.052, vae_k4s2p1 0.093-0.095 -> 0.080-0.081, video_k3s2p1op1
    # 0.040-0.042 -> 0.038-0.039 (benchmarks/RESULTS.md, twenty-eighth session).
    ci0 = jd_lo * 0
    jd = jd_lo
    jh = jh_lo
    steps = tl.where(od < OD, (jd_hi - jd_lo) * (jh_hi - jh_lo) * CI_BLOCKS, 0)
    if DIAG == 2:  # diagnostic: one K-step (a wrong result): the program's time but for its other steps
        steps = tl.minimum(steps, 1)
    rows_hc_a = u_h * sxh + c_a * sxw  # the slots' own part of their input offsets (_step_rows)
    if OWN_TILE_B:
        rows_hc_b = u_h * sxh + c_b * sxw
    for k in range(steps):
        t_d = tl.minimum(t0_d + jd * STEP_D, KD - 1)
        t_h = tl.minimum(t0_h + jh * STEP_H, KH - 1)
        i_d = q_d - m0_d - jd * M_STEP_D + m * 0  # broadcast: the interpreter cannot mask with scalars
        shift_h = base_h - m0_h - jh * M_STEP_H  # the step reads input row (i_d, u_h + shift_h, c)
        rows, row_ok = _step_rows(c_a, slot_ok_a, rows_hc_a, u_h, i_d, shift_h, D, H, W, sxd, sxh, sxw, PRECISION)
        tap_base = (t_d * KH + t_h) * KW * GROUPS * COUT_G * CIN_G
        a, a_lo, b, b_lo = load_operands(x_base, w_ptr, w_lo_ptr, rows, row_ok, tap_base + b_rows_a, b_ok_a, ci0,
                                         CIN_G, sxc, PRECISION, BLOCK_CI, EVEN_CI)
        acc_a = mma(acc_a, a, a_lo, b, b_lo, PRECISION, INTERPRETED)
        if OWN_TILE_B:
            rows, row_ok = _step_rows(c_b, slot_ok_b, rows_hc_b, u_h, i_d, shift_h, D, H, W, sxd, sxh, sxw,
                                      PRECISION)
            a, a_lo, b, b_lo = load_operands(x_base, w_ptr, w_lo_ptr, rows, row_ok, tap_base + b_rows_b, b_ok_b,
                                             ci0, CIN_G, sxc, PRECISION, BLOCK_CI, EVEN_CI)
            acc_b = mma(acc_b, a, a_lo, b, b_lo, PRECISION, INTERPRETED)
        elif KW_B > 0:
            b, b_lo = load_weights(w_ptr, w_lo_ptr, tap_base + b_rows_b, b_ok_b, ci0, CIN_G, PRECISION, BLOCK_CI,
                                   EVEN_CI)
            acc_b = mma(acc_b, a, a_lo, b, b_lo, PRECISION, INTERPRETED)
        # (Past the last step jd runs on; the pipeliner forms those steps' addresses too, clamped above.)
        ci0, carry = count_on(ci0, 0, CI_BLOCKS * BLOCK_CI, True, BLOCK_CI)
        jh, carry = count_on(jh, jh_lo, jh_hi, carry)
        jd = tl.where(carry, jd + 1, jd)

    if DIAG == 4:  # diagnostic: no epilogue (a wrong result): the K-steps' time, one value stored per program
        total = tl.sum(tl.sum(acc_a, axis=1), axis=0)
        if KW_B > 0:
            total += tl.sum(tl.sum(acc_b, axis=1), axis=0)
        tl.store(y_ptr + tl.program_id(0), total.to(y_ptr.dtype.element_ty))
        return
    # Each tap's column of P, moved up by its shift delta(t_w) - DMIN (where the group's A tile did not), lines up with
    # the outputs it feeds; summed per column phase.
    out_even, out_odd = _phase_sums(acc_a, T0_A, KW_A, m, S_W, P_W, DIL_W, DMIN, BLOCK_M, BLOCK_CO, GATHER_A, DIAG)
    if KW_B > 0:
        even_b, odd_b = _phase_sums(acc_b, T0_B, KW_B, m, S_W, P_W, DIL_W, DMIN, BLOCK_M, BLOCK_CO, GATHER_B, DIAG)
        out_even += even_b
        out_odd += odd_b
    if SCALED:  # FP16 operands scaled per tensor (tensor_scaled.py), w_lo_ptr pointing at their pass's sync words
        scale_a, scale_b = inverse_scales(w_lo_ptr)
        out_even = out_even * scale_a * scale_b
        out_odd = out_odd * scale_a * scale_b
    co_t = co0 + tl.arange(0, BLOCK_CO)
    co_ok = (co_t < COUT_G) & (od + co_t * 0 < OD)  # (nothing of an empty plane)
    if DIAG == 3:  # diagnostic: a mask that no element passes, but one the compiler cannot drop with the GEMM
        co_ok = co_ok & (tl.sum(out_even, axis=0) != tl.sum(out_even, axis=0))
    if HAS_BIAS:
        bias = tl.load(b_ptr + group * COUT_G + co_t, mask=co_ok, other=0.0).to(tl.float32)
    else:
        bias = tl.zeros([BLOCK_CO], dtype=tl.float32)
    out_even += bias[None, :]
    y_base = y_ptr + n.to(tl.int64) * syn + od.to(tl.int64) * syd + (group * COUT_G).to(tl.int64) * syc
    if S_W == 1:
        oh = S_H * u_h + v_h
        ok = (m < OUTPUTS) & (s < U_W) & (oh < OH)
        ptrs = y_base + co_t[:, None] * syc + (oh * syh + s * syw)[None, :]
        tl.store(ptrs, tl.trans(out_even).to(y_ptr.dtype.element_ty), mask=co_ok[:, None] & ok[None, :])
    else:
        # Stride 2: both column phases interleaved in registers, so that each output row is stored contiguously.
        out_odd += bias[None, :]
        tile_out = tl.reshape(tl.permute(tl.join(out_even, out_odd), (1, 0, 2)), (BLOCK_CO, 2 * BLOCK_M))
        e = tl.arange(0, 2 * BLOCK_M)
        slot = first + e // 2
        oh2 = S_H * (slot // row_slots) + v_h
        ow2 = 2 * (slot % row_slots) + e % 2
        ok2 = (e // 2 < OUTPUTS) & (slot % row_slots < U_W) & (oh2 < OH) & (ow2 < OW)
        tl.store(y_base + co_t[:, None] * syc + (oh2 * syh + ow2 * syw)[None, :],
                 tile_out.to(y_ptr.dtype.element_ty), mask=co_ok[:, None] & ok2[None, :])


@triton.jit
def _phase(ORDER: tl.constexpr, rank):
    """The phase of this rank in an order of phase_order's."""
    if ORDER < 0:
        return rank
    return ORDER >> 4 * rank & 15


@triton.jit
def _step_rows(c, slot_ok, rows_hc, u_h, i_d, shift_h, D, H, W, sxd, sxh, sxw, PRECISION: tl.constexpr):
    """A K-step's input offsets and validity for slots reading input columns c, rows u_h + shift_h of plane i_d
    (rows_hc: u_h * sxh + c * sxw)."""
    if PRECISION == 2:
        i_h = u_h + shift_h
        row_ok = slot_ok & (i_d >= 0) & (i_d < D) & (i_h >= 0) & (i_h < H)
        rows = (tl.minimum(tl.maximum(i_d, 0), D - 1) * sxd + tl.minimum(tl.maximum(i_h, 0), H - 1) * sxh
                + tl.minimum(tl.maximum(c, 0), W - 1) * sxw)
    else:  # as forward.py's _phase_gemm (rows not ok at offset 0): on the H200 3-4% faster by the mean on vae_k4s2p1
        # and video_k3s2p1op1 in TF32, within 2% on the others tried (benchmarks/RESULTS.md, forty-fourth session)
        row_ok = slot_ok & (i_d >= 0) & (i_d < D) & (u_h >= -shift_h) & (u_h < H - shift_h)
        rows = tl.where(row_ok, rows_hc + (i_d * sxd + shift_h * sxh), 0)
    return rows, row_ok


@triton.jit
def _weight_rows(T0: tl.constexpr, TAPS: tl.constexpr, KW, group, co0, GROUPS, COUT_G, CIN_G, BLOCK_CO: tl.constexpr):
    """Offsets (within one (t_d, t_h) tap's block) and validity of the weight rows of the GEMM columns (t_w, co), t_w
    in [T0, T0 + TAPS): the taps past KW and the channels past C_out/g load as zeros, so their columns of P are zero."""
    j = tl.arange(0, TAPS * BLOCK_CO)
    t_w = T0 + j // BLOCK_CO
    co = co0 + j % BLOCK_CO
    ok = (co < COUT_G) & (t_w < KW)
    return ((tl.minimum(t_w, KW - 1) * GROUPS + group) * COUT_G + tl.minimum(co, COUT_G - 1)) * CIN_G, ok


@triton.jit
def _phase_sums(acc, T0: tl.constexpr, TAPS: tl.constexpr, m, S_W: tl.constexpr, P_W: tl.constexpr,
                DIL_W: tl.constexpr, DMIN: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_CO: tl.constexpr,
                GATHER: tl.constexpr, DIAG: tl.constexpr):
    """The sums over the column phases 0 and 1 of a column group's taps t_w in [T0, T0 + TAPS), each tap's column of P
    (acc) moved up by its shift where GATHER (else its A tile was), [BLOCK_M, BLOCK_CO] each (the second zero with S_W
    1)."""
    taps = tl.reshape(acc, (BLOCK_M, TAPS, BLOCK_CO))
    t = T0 + tl.arange(0, TAPS)
    phase = (DIL_W * t + (S_W - 1) * P_W) % S_W  # (DIL_W * t - P_W) mod S_W, on a nonnegative operand
    if DIAG == 1 or not GATHER:  # (DIAG 1, diagnostic: no gather, a wrong result where GATHER, to time it)
        aligned = taps
    else:
        shift = (phase + P_W - DIL_W * t) // S_W - DMIN  # exact divisions
        # (Clamped: the padding taps' shifts may point outside the tile; their columns are zero.)
        source = tl.minimum(tl.maximum(m[:, None, None] + shift[None, :, None], 0), BLOCK_M - 1) + tl.zeros(
            [BLOCK_M, TAPS, BLOCK_CO], dtype=tl.int32)
        aligned = tl.gather(taps, source, 0)
    even = tl.sum(tl.where((phase == 0)[None, :, None], aligned, 0.0), axis=1)
    odd = tl.sum(tl.where((phase == 1)[None, :, None], aligned, 0.0), axis=1)
    return even, odd


def configs(plan: Plan | None = None):
    """Tile configs: BLOCK_M slots by at most BLOCK_N columns (t_w, co) by BLOCK_CI channels; "KERNEL" names this
    module for forward.py's launcher. Given a plan, configs that come to the same tiles for it (column_layout) are
    left out after the first. Measured on the H200 (benchmarks/RESULTS.md, eighteenth and twentieth sessions): 256
    columns took 255 registers (spilling on vae_k4s2p1) and 2-3.6x the time of 128; 64 channels per step and 256
    slots were never the fastest; 192 columns (KW = 3 by 64 channels) were fastest on 64 slots with 4 warps, and slower
    on 128 slots (8 warps: one program per multiprocessor; 4 warps: 255 registers, spilling on wide_256to128_k3s2).
    Twenty-seventh session, twelve new configs (16 or 64 channels a step, 2-4 stages, 64-256 columns): 64 slots by 128
    columns in two stages took video_k3s2p1op1's kernel from 0.0433 to 0.0408 ms (TF32; 192 columns in two stages
    0.0408-0.0410), and on vae_k4s2p1 and its float16 version none beat the current configs."""
    if interpreted():
        # 48 columns: both column layouts on small layers (KW = 3 splits in 2 + 1 taps by 16 channels).
        return [dict(KERNEL="tap_columns", BLOCK_M=32, BLOCK_N=48, BLOCK_CI=16, num_warps=4, num_stages=1)]
    candidates = [
        dict(KERNEL="tap_columns", BLOCK_M=m, BLOCK_N=n, BLOCK_CI=32, num_warps=w, num_stages=s)
        for m, n, w, s in [(128, 128, 4, 3), (128, 128, 8, 3), (64, 128, 4, 3), (64, 128, 4, 2), (64, 192, 4, 3)]
    ]
    if plan is None:
        return candidates
    kept, seen = [], set()
    for cfg in candidates:
        tiles = (cfg["BLOCK_M"], column_layout(plan, cfg["BLOCK_N"]), cfg["BLOCK_CI"], cfg["num_warps"],
                 cfg["num_stages"])
        if tiles not in seen:
            seen.add(tiles)
            kept.append(cfg)
    return kept


def column_layout(plan: Plan, block_n: int) -> tuple[int, int, int]:
    """(BLOCK_CO, KW_A, KW_B): the output channels per program and the two column groups' tap counts (powers of two,
    KW_B 0 for one group) for a budget of block_n columns. The KW taps split into KW_A = the largest power of two up
    to KW and KW_B = the rest rounded up, where that pads fewer columns than one group of KW rounded up; tensor-core
    tiles are at least 16 columns wide."""
    kw = plan.kernel_size[2]
    cout_g = plan.out_channels // plan.groups
    block_co = min(power_of_2_at_most(max(1, block_n // kw)), next_power_of_2(cout_g))
    kw_a = power_of_2_at_most(kw)
    kw_b = next_power_of_2(kw - kw_a) if kw > kw_a else 0
    if kw_b and kw_a + kw_b < next_power_of_2(kw) and kw_b * block_co >= 16:
        return block_co, kw_a, kw_b
    kw_p2 = next_power_of_2(kw)
    return max(block_co, 16 // kw_p2), kw_p2, 0


def tap_groups(plan: Plan, kw_a: int, kw_b: int, shifted_tiles: bool = True) -> tuple[int, int, int, int]:
    """(T0_A, T0_B, SHIFT_A, SHIFT_B): where the two column groups' taps start, and the one shift of each group's
    taps (its A tile is read that many slots further on), or -1 where they differ (the epilogue gathers the group's
    columns). Group A comes first, [0, KW_A) and [KW_A, KW), or group B does, [0, KW_B) and [KW_B, KW) (where KW_B is
    exact), whichever gathers fewer columns, then reads fewer A tiles: k = 3, stride 2, padding 1 (shifts 1, 0, 0)
    puts taps 1 and 2 in group A and tap 0 in group B, read one slot further on, and gathers nothing.
    shifted_tiles false: a group reads the tile as is or is gathered. So under 3xTF32 (split A tiles): on the H200 a
    second tile took video_k3s2p1op1's fastest config's kernel from 0.059 to 0.067 ms by the minima, where with FP16
    operands it took it from 0.028 to 0.026 (benchmarks/RESULTS.md, sixty-first session)."""
    kw = plan.kernel_size[2]
    deltas = _w_deltas(plan)
    tap_shifts = [delta - min(deltas) for delta in deltas]  # slots further on that tap t's column of P is read

    def shift(t0: int, taps: int) -> int:
        shifts = set(tap_shifts[t0:t0 + taps])
        return shifts.pop() if len(shifts) == 1 and (shifted_tiles or 0 in shifts) else -1

    def layout(t0_a: int, t0_b: int):
        return t0_a, t0_b, shift(t0_a, kw_a), shift(t0_b, kw_b) if kw_b else 0

    def cost(groups):
        gathered = kw_a * (groups[2] < 0) + kw_b * (groups[3] < 0)
        return gathered, len({max(groups[2], 0), max(groups[3], 0)})

    layouts = [layout(0, kw_a)] + ([layout(kw_b, 0)] if kw_b and kw_a + kw_b == kw else [])
    return min(layouts, key=cost)


# Planes by their phases' taps (the kernel's BY_TAPS) on grids of at most this many programs per multiprocessor, where
# the last wave is a large part of the time. On the H200 (132 multiprocessors; benchmarks/RESULTS.md, fiftieth
# session), each config alone, old order -> new: wide_256to128_k3s2's best at 640 and 1,280 programs 0.0359-0.0366 ->
# 0.0307-0.0314 ms (TF32) and 0.125-0.126 -> 0.109-0.111 (3xTF32); in 3xTF32 2-4% less at 2,144-2,176 and 4,352
# programs (64-slot tiles: video_k3s2p1op1, batch32_k3s2 at batches 2 and 4) but 1-3% more at 1,152-2,304 (128-slot
# tiles, batch32_k3s2 at batches 2 and 4), 0-5% more at 4,608-34,816 (batch32_k3s2 at batches 8 and 32); in TF32
# within 1% from 1,056 to 18,432 programs but 3-5% less at 1,152 (batch32_k3s2 at batch 2).
BY_TAPS_WAVES = 32


def phase_order(axis: AxisPlan) -> int:
    """An axis's output phases v = o mod stride, those that more taps reach first (ties in the order of v), 4 bits each
    from the lowest: the kernel's ORDER_D / ORDER_H. -1 (the order of v) where that is the order already or the stride
    is above 8 (a 32-bit constant holds 8 phases)."""
    taps = {phase.out_start % axis.stride: len(phase.taps) for phase in axis.phases}
    order = sorted(range(axis.stride), key=lambda v: -taps[v])
    if axis.stride > 8 or order == list(range(axis.stride)):
        return -1
    return sum(v << 4 * rank for rank, v in enumerate(order))


@functools.lru_cache(maxsize=256)
def _geometry(plan: Plan, block_m: int, block_n: int, block_ci: int, multiprocessors: int | None,
              by_taps: bool | None, shifted_tiles: bool = True):
    """(grid, the kernel's sizes, blocks, constexprs) of a config for a layer: once per layer, as host time shows.
    multiprocessors: the GPU's (None under the interpreter: no limit on BY_TAPS). by_taps: BY_TAPS as given, or None
    for where its phases differ and the grid is at most BY_TAPS_WAVES per multiprocessor. shifted_tiles: as
    tap_groups'."""
    n, c_in, (d, h, w_in) = plan.batch, plan.in_channels, plan.input_spatial
    groups = plan.groups
    cin_g, cout_g = c_in // groups, plan.out_channels // groups
    od, oh, ow = plan.output_spatial
    (kd, kh, kw), (s_d, s_h, s_w) = plan.kernel_size, plan.stride
    (p_d, p_h, p_w), (dl_d, dl_h, dl_w) = plan.padding, plan.dilation
    block_co, kw_a, kw_b = column_layout(plan, block_n)
    t0_a, t0_b, shift_a, shift_b = tap_groups(plan, kw_a, kw_b, shifted_tiles)
    d_min, halo = w_shifts(plan)
    if shift_a >= 0 and shift_b >= 0:  # nothing gathered: no slot of a tile needs more input columns than its own
        halo = 0
    block_ci = max(16, min(block_ci, next_power_of_2(cin_g)))
    u_h, u_w = cdiv(oh, s_h), cdiv(ow, s_w)
    tiles = cdiv(u_h * (u_w + halo) - halo, block_m - halo)
    co_blocks = cdiv(cout_g, block_co)
    order_d, order_h = phase_order(plan.axes[0]), phase_order(plan.axes[1])
    u_d = cdiv(od, s_d)
    programs_by_taps = n * s_d * u_d * s_h * tiles * co_blocks * groups
    if by_taps is None:
        by_taps = (max(order_d, order_h) >= 0
                   and (multiprocessors is None or programs_by_taps <= BY_TAPS_WAVES * multiprocessors))
    grid = (programs_by_taps if by_taps else n * od * s_h * tiles * co_blocks * groups,)
    sizes = (cin_g, cout_g, d, h, w_in, od, oh, ow, kd, kh)
    blocks = (u_h, tiles, co_blocks, groups, u_d)
    constexprs = (
        ("S_D", s_d), ("S_H", s_h), ("S_W", s_w), ("P_D", p_d), ("P_H", p_h), ("P_W", p_w),
        ("DIL_D", dl_d), ("DIL_H", dl_h), ("DIL_W", dl_w), ("STEP_D", s_d // math.gcd(s_d, dl_d)),
        ("STEP_H", s_h // math.gcd(s_h, dl_h)), ("KW", kw), ("KW_A", kw_a), ("KW_B", kw_b), ("T0_A", t0_a),
        ("T0_B", t0_b), ("OFFSET_A", max(shift_a, 0)), ("OFFSET_B", max(shift_b, 0)), ("GATHER_A", shift_a < 0),
        ("GATHER_B", shift_b < 0), ("DMIN", d_min),
        ("HALO", halo), ("U_W", u_w), ("CI_BLOCKS", cdiv(cin_g, block_ci)), ("BLOCK_M", block_m),
        ("BLOCK_CO", block_co), ("BLOCK_CI", block_ci), ("EVEN_CI", cin_g % block_ci == 0),
        ("BY_TAPS", by_taps), ("ORDER_D", order_d if by_taps else -1), ("ORDER_H", order_h if by_taps else -1))
    return grid, sizes, blocks, constexprs


def bind(cfg, plan: Plan, precision: int, has_bias: bool, out_strides, device_index: int):
    """A config's launch for a layer on forward._operands' results (x channels-last, w tap-major and K-major),
    bound (launch.BoundLaunch): call it with (x, w, w_lo, bias, out)."""
    multiprocessors = None if _kernel.interpreted else _sm_count(device_index)
    grid, sizes, blocks, constexprs = _geometry(plan, cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_CI"], multiprocessors,
                                                cfg.get("BY_TAPS"), precision != TF32X3)
    return _kernel.bind(
        grid, (*sizes, *channels_last_strides(plan), *out_strides, *blocks),
        (*constexprs, ("HAS_BIAS", has_bias), *mma_precision(precision), ("INTERPRETED", _kernel.interpreted),
         ("DIAG", cfg.get("DIAG", 0)), *dependent_options(device_index), ("num_warps", cfg["num_warps"]),
         ("num_stages", cfg["num_stages"])))


_kernel = Launcher(tap_columns_kernel)
