"""Triton grad_weight of one phase of conv_transpose3d.

Within a phase the forward is the stride-1 correlation y[n, co, q] = sum_{ci, k} x[n, ci, i0 + q + k*dil]
* w[co, ci, k] over the phase's compact grid q (plan.py), where y is the lattice o = o0 + stride*q of the
output. So its weight gradient is one GEMM per group,

    grad_w[co, (k, ci)] = sum over (n, q) of g[n, co, o0 + stride*q] * x[n, ci, i0 + q + k*dil],

with M = output channels, N = taps x input channels and a reduction over every position of the compact
grid (262144 for KernelBench L1/77, against M = 64 and N = 864). The kernel reads a compact copy of
grad_output's lattice and the phase's input window copied once per w tap (one launch makes both:
phase_operands; each copy shifted by its tap, so that every tile starts aligned and loads 16 bytes at a time),
both NCDHW, so that the reduction axis is contiguous in both operand tiles, as Hopper's TF32 tensor-core
instructions read them; in TF32 mode both copies are rounded to TF32 as they are made, so that the tiles go from
shared memory to the MMA as loaded. It splits the reduction into a fixed number of chunks whose partial sums are
added in a fixed order afterwards: no atomics, the same result on every run. On the H200, problem 77: 0.225 ms
with the partial sums (ninth session); copies included, 0.26-0.28 ms in the seventh, against 0.32-0.46 with the
lattice rounded in the kernel, 0.56-0.57 reading the window itself (4-byte loads) and about 1.0-1.2 ms for aten's
strided weight gradient (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

from ...plan import Plan
from .. import cudnn_allow_tf32
from ..cuda import grad_weight_operands_unsupported as cuda_grad_weight_operands_unsupported, phases as cuda_phases
from ..torch_phase import _lattice_geometry, _log_once, _phase_input, phase_grad_input
from . import cdiv, interpreted, next_power_of_2
from .forward import TF32, _round_to_tf32, _sm_count, count_on, precision_for
from .launch import Launcher


@triton.jit
def phase_grad_weight_kernel(
    g_ptr, x_ptr, partial_ptr,
    STEPS, STEPS_PER_SPLIT, QW_BLOCKS, QD, QH, QW,
    sgn, sgc, sgd, sgh, sgw,
    sxn, sxc, sxd, sxh, sxw,
    DIL_D, DIL_H, sxk, TH, TW,
    CO_G, CI_G, N_TOTAL, N_BLOCKS, CO_BLOCKS, GROUPS,
    PRECISION: tl.constexpr, INTERPRETED: tl.constexpr, BLOCK_CO: tl.constexpr, BLOCK_P: tl.constexpr,
    BLOCK_N: tl.constexpr, X_ROUNDED: tl.constexpr, G_ROUNDED: tl.constexpr,
):
    """partial[s, group*CI_G + ci, co, TAPS - 1 - k] = the sum above over split s of the reduction: the layout of
    the weight (C_in, C_out/g, taps), whose taps run in ascending order where the phase's run descending.

    g: the phase's compact grad_output (N, C_out, QD, QH, QW), NCDHW or channels-last; x: the phase's input window
    (N, C_in, ...), padded so that position q with tap k reads window index q + k*dil, always inside; the last
    axis contiguous; w tap kw is read sxk elements further (dil*sxw in the window itself, or the stride between
    its copies per w tap: _window_per_w_tap). Column nn of the GEMM is tap k = nn // CI_G,
    k = (kd*TH + kh)*TW + kw, and input channel ci = nn % CI_G. A reduction step is BLOCK_P consecutive qw of
    one row (n, qd, qh), so both operand tiles are contiguous along the reduction axis, as Hopper's TF32
    tensor-core instructions read them (K-major).
    Offsets inside one sample are 32-bit (the launcher checks), sample bases 64-bit.
    """
    pid = tl.program_id(0)
    split = tl.program_id(1)
    n_block = pid % N_BLOCKS
    co_block = (pid // N_BLOCKS) % CO_BLOCKS
    group = pid // (N_BLOCKS * CO_BLOCKS)

    co = co_block * BLOCK_CO + tl.arange(0, BLOCK_CO)
    co_ok = co < CO_G
    g_rows = (group * CO_G + tl.minimum(co, CO_G - 1)) * sgc
    nn = n_block * BLOCK_N + tl.arange(0, BLOCK_N)
    nn_ok = nn < N_TOTAL
    nn = tl.minimum(nn, N_TOTAL - 1)
    k = nn // CI_G
    x_cols = ((group * CI_G + nn % CI_G) * sxc + (k // (TH * TW)) * DIL_D * sxd + (k // TW % TH) * DIL_H * sxh
              + (k % TW) * sxk)
    q = tl.arange(0, BLOCK_P)

    # The GEMM is computed transposed, acc[nn, co]: the input tile [columns, qw] is operand A and the grad tile
    # [co, qw] operand B, both read as they lie in memory (qw fastest). In the other orientation Triton staged
    # the input tile in shared memory column by column, with 32-way bank conflicts; in K-major layouts, as now,
    # that orientation measured slower too (0.237-0.408 against 0.225-0.297 ms, ninth session).
    acc = tl.zeros((BLOCK_N, BLOCK_CO), dtype=tl.float32)
    first = split * STEPS_PER_SPLIT
    # A step is block qw_block of row (n, qd, qh): divided out of the first step once, then counted on from step to
    # step (forward.count_on), as the forward kernels' K-loops do, rather than divided by four runtime divisors in
    # every step. On the H200, problem 77, the kernel alone: TF32 0.230 -> 0.189 ms, 3xTF32 0.797 -> 0.732, float16
    # 0.189 -> 0.170 (benchmarks/RESULTS.md, twenty-ninth session).
    qw_block = first % QW_BLOCKS
    row = first // QW_BLOCKS
    qh = row % QH
    qd = row // QH % QD
    n = row // (QH * QD)
    for _ in range(first, tl.minimum(first + STEPS_PER_SPLIT, STEPS)):
        qw = qw_block * BLOCK_P + q
        qw_ok = qw < QW  # (masked lanes point at most BLOCK_P elements past a row; no clamp, which would hide
        # from the compiler that qw is contiguous)
        sample = n.to(tl.int64)
        x = tl.load(x_ptr + sample * sxn + qd * sxd + qh * sxh + (x_cols[:, None] + qw[None, :] * sxw),
                    mask=nn_ok[:, None] & qw_ok[None, :], other=0.0)
        g = tl.load(g_ptr + sample * sgn + qd * sgd + qh * sgh + (g_rows[:, None] + qw[None, :] * sgw),
                    mask=co_ok[:, None] & qw_ok[None, :], other=0.0)
        if PRECISION == 1:
            if not X_ROUNDED:  # (else rounded as it was copied: the tile goes from shared memory to the MMA)
                x = _round_to_tf32(x)
            if not G_ROUNDED:
                g = _round_to_tf32(g)
            acc = tl.dot(x, tl.trans(g), acc, input_precision="tf32")
        elif PRECISION == 2:
            acc = tl.dot(x, tl.trans(g), acc, input_precision="tf32x3")
        elif INTERPRETED and g.dtype == tl.bfloat16:
            # The interpreter's dot mishandles bfloat16 (as in forward.py); bfloat16 products are exact in float32.
            acc = tl.dot(x.to(tl.float32), tl.trans(g.to(tl.float32)), acc, input_precision="ieee")
        else:
            acc = tl.dot(x, tl.trans(g), acc)
        qw_block, carry = count_on(qw_block, 0, QW_BLOCKS, True)
        qh, carry = count_on(qh, 0, QH, carry)
        qd, carry = count_on(qd, 0, QD, carry)
        n = tl.where(carry, n + 1, n)
    taps = N_TOTAL // CI_G
    rows = ((split * GROUPS + group) * CI_G + nn % CI_G).to(tl.int64) * CO_G * taps + (taps - 1 - k)
    tl.store(partial_ptr + rows[:, None] + (tl.minimum(co, CO_G - 1) * taps)[None, :], acc,
             mask=co_ok[None, :] & nn_ok[:, None])


_launch_phase_grad_weight = Launcher(phase_grad_weight_kernel)


# (BLOCK_CO, BLOCK_N, num_warps, num_stages, programs per SM, a window copy per w tap): in TF32 mode, the fastest
# measured on the H200 for problem 77 with both operands TF32-rounded beforehand, partial sums included: 0.225-0.226
# ms, against 0.239-0.244 with 3 stages (the seventh session's choice, then 0.263 with the copies included) and
# 0.236-0.297 for (64, 128, 4 or 8 warps, 3, 2) (ninth session; benchmarks/RESULTS.md). The input copied once per w
# tap makes its loads 16-byte (in the F.pad'ed window the taps' odd offsets allow 4-byte ones only: 0.57 ms, sixth
# session). Reduction steps of 64 or 128 positions, spanning rows, measured slower (seventh session); of 16
# positions, 0.367 against 0.255 (ninth).
CONFIG = (64, 256, 8, 4, 1, True)
# 3xTF32 and half precision keep the sixth session's config: measured for 3xTF32 then (0.81-0.88 ms), while the
# TF32 choice above was not timed in those modes (half precision in neither).
CONFIG_OTHER_PRECISIONS = (64, 128, 4, 3, 2, True)


def fits(plan: Plan, phases) -> bool:
    """Whether 32-bit offsets inside one sample and a 32-bit step count serve this phase (the sample's input
    window counted as its copies per w tap, the larger layout)."""
    span_d, span_h, span_w = (p.input_span for p in phases)
    copies_w = len(phases[2].taps) * _padded_width(phases[2].out_count)
    window = plan.in_channels * span_d * span_h * max(span_w, copies_w)
    sample = max(window, plan.out_channels * math.prod(p.out_count for p in phases))
    return sample < 2**31 and plan.batch * math.prod(p.out_count for p in phases) < 2**31


def phase_grad_weight(lattice: torch.Tensor, input: torch.Tensor, plan: Plan, phases,
                      precision: int | None = None, config=None, lattice_rounded: bool = False,
                      windows=None) -> torch.Tensor:
    """Weight gradient of one phase's correlation from `lattice`, grad_output's outputs of that phase (a view):
    the phase's slice of grad_weight, (C_in, C_out/g, taps of each axis phase in ascending order), contiguous.
    Written in that layout by the kernel, so that no copy, flip or scatter follows (each a launch, whose host
    time shows on the GPU machine). windows: the input's copies per w tap as phase_operands makes them (made here
    where None)."""
    precision = precision_for(input.dtype) if precision is None else precision
    if config is None:
        config = CONFIG if precision == TF32 else CONFIG_OTHER_PRECISIONS
    copy_per_w_tap = config[5]
    if windows is not None and not copy_per_w_tap:
        raise ValueError("windows given, but the config reads the input's window itself (copy_per_w_tap False)")
    # The compact lattice as it comes if dense (NCDHW: the reduction axis qw contiguous, as the MMA reads it;
    # channels-last is read right but slowly: 1.88 against 0.37 ms on the H200, seventh session), and the
    # input's window or its copies, qw contiguous.
    dense = lattice.is_contiguous() or lattice.is_contiguous(memory_format=torch.channels_last_3d)
    compact = lattice if dense else lattice.contiguous()
    x_rounded = copy_per_w_tap and precision == TF32  # rounded in the copy, not again in the kernel
    if copy_per_w_tap:
        window = _window_per_w_tap(input, phases, x_rounded) if windows is None else windows
        # (N, w taps, C, D, H, row): the kernel reads the first copy and reaches tap kw at kw * stride(1).
        n_stride, w_tap_stride, *x_strides = window.stride()
        x_strides = (n_stride, *x_strides)
    else:
        window = _phase_input(input, plan, phases).contiguous()
        x_strides, w_tap_stride = window.stride(), phases[2].input_dilation * window.stride(4)
    sms = _sm_count(input.device.index or 0) if input.device.type == "cuda" else 1
    grid, splits, partial_shape, sizes, options = _grad_weight_launch(
        plan, phases, precision, config, sms, x_rounded, lattice_rounded and precision == TF32, interpreted())
    partial = torch.empty(partial_shape, dtype=torch.float32, device=input.device)
    _launch_phase_grad_weight.launch(
        grid, (compact, window, partial),
        (*sizes[:6], *compact.stride(), *x_strides, *sizes[6:8], w_tap_stride, *sizes[8:]), options)
    grad = partial.sum(0) if splits > 1 else partial[0]  # a fixed order: deterministic
    return grad if grad.dtype == input.dtype else grad.to(input.dtype)


@functools.lru_cache(maxsize=256)
def _grad_weight_launch(plan: Plan, phases, precision: int, config, sms: int, x_rounded: bool, g_rounded: bool,
                        under_interpreter: bool):
    """(grid, splits, the partial sums' shape, the kernel's size arguments in its order (strides aside), its
    constexprs and launch options) for one phase: once per layer, since every microsecond of the host's shows."""
    block_co, block_n, num_warps, num_stages, per_sm, _ = config
    groups = plan.groups
    co_g, ci_g = plan.out_channels // groups, plan.in_channels // groups
    taps = [len(p.taps) for p in phases]
    counts = [p.out_count for p in phases]
    n_total = math.prod(taps) * ci_g
    rows = plan.batch * counts[0] * counts[1]
    block_p = 32 if counts[2] > 16 else 16  # the reduction step: consecutive qw of one row
    qw_blocks = cdiv(counts[2], block_p)
    steps = rows * qw_blocks
    block_co = max(16, min(block_co, next_power_of_2(co_g)))
    block_n = max(16, min(block_n, next_power_of_2(n_total)))
    n_blocks, co_blocks = cdiv(n_total, block_n), cdiv(co_g, block_co)
    tiles = groups * co_blocks * n_blocks
    # Enough splits of the reduction to fill the GPU; each at least a few steps long.
    splits = max(1, min(cdiv(per_sm * sms, tiles), cdiv(steps, 8)))
    steps_per_split = cdiv(steps, splits)
    splits = cdiv(steps, steps_per_split)
    sizes = (steps, steps_per_split, qw_blocks, *counts, phases[0].input_dilation, phases[1].input_dilation,
             taps[1], taps[2], co_g, ci_g, n_total, n_blocks, co_blocks, groups)
    options = dict(PRECISION=precision, INTERPRETED=under_interpreter, BLOCK_CO=block_co, BLOCK_P=block_p,
                   BLOCK_N=block_n, X_ROUNDED=x_rounded, G_ROUNDED=g_rounded, num_warps=num_warps,
                   num_stages=num_stages)
    return (tiles, splits), splits, (splits, plan.in_channels, co_g, *taps), sizes, tuple(options.items())


@triton.jit
def _copy_window_block(
    x_ptr, out_ptr, program, ROW_BLOCKS, C, D, H, W, WD, WH, TW,
    sxn, sxc, sxd, sxh, sxw,
    START_D, START_H, START_W, DIL_W, WIDTH, ROW,
    ROUND: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_Q: tl.constexpr,
):
    """out[n, kw, c, d, h, q] = x[n, c, START_D + d, START_H + h, START_W + kw*DIL_W + q] (zero outside x, and
    for q >= WIDTH), TF32-rounded if ROUND; out contiguous with rows of ROW elements. Program = (volume, block):
    volume = (n*TW + kw)*C + c, decomposed once per program; rows d*WH + h of the block, once per row (divisions
    per element, or 64-bit ones per row, made an earlier version 4x slower than F.pad)."""
    volume = program // ROW_BLOCKS
    c = volume % C
    kw = volume // C % TW
    n = volume // C // TW
    r = program % ROW_BLOCKS * BLOCK_R + tl.arange(0, BLOCK_R)
    q = tl.arange(0, BLOCK_Q)
    h = r % WH + START_H
    d = r // WH + START_D
    row_ok = (r < WD * WH) & (d >= 0) & (d < D) & (h >= 0) & (h < H)
    w = START_W + kw * DIL_W + q
    ok = row_ok[:, None] & ((w >= 0) & (w < W) & (q < WIDTH))[None, :]
    rows = x_ptr + n.to(tl.int64) * sxn + c.to(tl.int64) * sxc + (d.to(tl.int64) * sxd + h.to(tl.int64) * sxh)
    value = tl.load(rows[:, None] + (w * sxw)[None, :], mask=ok, other=0.0)
    if ROUND:
        value = _round_to_tf32(value)
    out = out_ptr + volume.to(tl.int64) * WD * WH * ROW
    tl.store(out + r[:, None] * ROW + q[None, :], value, mask=(r < WD * WH)[:, None] & (q < ROW)[None, :])


@triton.jit
def _copy_lattice_block(
    g_ptr, out_ptr, program, TOTAL, G_OFFSET, sn, sc, sd, sh, sw,
    C: tl.constexpr, QD: tl.constexpr, QH: tl.constexpr, QW: tl.constexpr,
    ROUND: tl.constexpr, OFFSETS_64: tl.constexpr, BLOCK: tl.constexpr,
):
    """out[n, c, qd, qh, qw] = g[G_OFFSET + n*sn + c*sc + qd*sd + qh*sh + qw*sw], TF32-rounded if ROUND; out
    contiguous. Flat over out in aligned blocks, so that stores are whole 16-byte vectors; the sizes are constexpr,
    so that the index divisions compile to multiplications and shifts."""
    if OFFSETS_64:
        offs = program.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    else:
        offs = program * BLOCK + tl.arange(0, BLOCK)
    q = offs % QW
    r = offs // QW
    h = r % QH
    r = r // QH
    d = r % QD
    r = r // QD
    c = r % C
    n = r // C
    inside = d * sd + h * sh + q * sw  # 64-bit where OFFSETS_64
    value = tl.load(g_ptr + G_OFFSET + n.to(tl.int64) * sn + c.to(tl.int64) * sc + inside, mask=offs < TOTAL)
    if ROUND:
        value = _round_to_tf32(value)
    tl.store(out_ptr + offs, value, mask=offs < TOTAL)


@triton.jit
def copy_operands_kernel(
    g_ptr, lattice_ptr, x_ptr, windows_ptr,
    LATTICE_PROGRAMS, LATTICE_TOTAL, G_OFFSET, sgn, sgc, sgd, sgh, sgw,
    ROW_BLOCKS, XC, D, H, W, WD, WH, TW, sxn, sxc, sxd, sxh, sxw, START_D, START_H, START_W, DIL_W, WIDTH, ROW,
    C: tl.constexpr, QD: tl.constexpr, QH: tl.constexpr, QW: tl.constexpr, ROUND_LATTICE: tl.constexpr,
    OFFSETS_64: tl.constexpr, BLOCK: tl.constexpr,
    ROUND_WINDOWS: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_Q: tl.constexpr,
):
    """The weight gradient's two operands in one launch: programs below LATTICE_PROGRAMS copy grad_output's lattice
    of the phase (_copy_lattice_block), the others the phase's input window once per w tap (_copy_window_block).
    One launch instead of two saves a launch's host time, which shows on the GPU machine, and gives the GPU both
    copies' work at once while the host prepares cuDNN's grad_input."""
    program = tl.program_id(0)
    if program < LATTICE_PROGRAMS:
        _copy_lattice_block(g_ptr, lattice_ptr, program, LATTICE_TOTAL, G_OFFSET, sgn, sgc, sgd, sgh, sgw,
                            C, QD, QH, QW, ROUND_LATTICE, OFFSETS_64, BLOCK)
    else:
        _copy_window_block(x_ptr, windows_ptr, program - LATTICE_PROGRAMS, ROW_BLOCKS, XC, D, H, W, WD, WH, TW,
                           sxn, sxc, sxd, sxh, sxw, START_D, START_H, START_W, DIL_W, WIDTH, ROW, ROUND_WINDOWS,
                           BLOCK_R, BLOCK_Q)


_launch_copy_operands = Launcher(copy_operands_kernel)

LATTICE_BLOCK = 2048
# The lattice copy indexes in 64 bits where the lattice, or its reach in grad_output, has this many elements.
OFFSETS_64_FROM = 2**31


def phase_backward(grad_output, index, input, weight, plan: Plan, phases, need_input: bool, need_weight: bool):
    """One phase's parts of the gradients on CUDA (torch_phase.conv_transpose3d_backward's phase_backward).

    Where the CUDA kernels serve both (sm_90, TF32; backends/cuda), they read grad_output's lattice and the input in
    place: no copy (on the H200, problem 77: grad_input 0.307 ms, grad_weight 0.25 ms, against 0.063 for the lattice
    copy alone, then 0.283 and 0.33 with its windows; benchmarks/RESULTS.md, thirteenth session). Elsewhere one
    launch copies the lattice out (and the input's windows for the Triton weight gradient), then grad_input (the
    CUDA phase correlation, in 3xTF32 with TF32 off, or cuDNN), then grad_weight (CUDA or Triton).

    grad_input by cuDNN: on the H200 (problem 77) 0.55 ms against 0.74-0.93 for a Triton implicit GEMM on the
    phase's channels-last padded lattice (commit b8c8054, removed since; benchmarks/RESULTS.md). It comes first:
    its convolution is a long kernel that keeps the GPU busy while the host prepares the weight gradient; on a
    second stream beside it the weight gradient measured within run-to-run spread (sixth session)."""
    tf32 = cudnn_allow_tf32()
    offset, shape, strides = _lattice_geometry(plan, phases, grad_output.stride())
    input_by_cuda = need_input and _cuda_serves(
        "grad_input", plan, cuda_phases.grad_input_unsupported(plan, phases, input.device, input.dtype, tf32), "cuDNN")
    weight_by_cuda = need_weight and _cuda_serves(
        "grad_weight", plan, cuda_phases.grad_weight_unsupported(plan, phases, input.device, input.dtype, tf32)
        or cuda_grad_weight_operands_unsupported(input, shape, strides), "Triton")
    if input_by_cuda == need_input and weight_by_cuda == need_weight:
        part_input = cuda_phases.phase_grad_input_in_place(grad_output, offset, strides, weight, plan, phases) \
            if need_input else None
        part_weight = cuda_phases.phase_grad_weight(grad_output, offset, strides, input, plan, phases) \
            if need_weight else None
        return part_input, part_weight
    precision = precision_for(input.dtype)
    lattice, windows = phase_operands(grad_output, input if need_weight and not weight_by_cuda else None, plan,
                                      phases, precision)
    part_input = part_weight = None
    if input_by_cuda:
        part_input = cuda_phases.phase_grad_input(lattice, weight, plan, phases)
    elif need_input:
        part_input = phase_grad_input(lattice, weight, plan, phases)
    if weight_by_cuda:
        part_weight = cuda_phases.phase_grad_weight(lattice, 0, lattice.stride(), input, plan, phases)
    elif need_weight:
        part_weight = phase_grad_weight(lattice, input, plan, phases, precision, lattice_rounded=precision == TF32,
                                        windows=windows)
    return part_input, part_weight


def _cuda_serves(what: str, plan: Plan, reason: str | None, fallback: str) -> bool:
    """Whether the CUDA kernel computes `what` of this phase (reason: why not, or None); why not is logged at debug
    level. grad_input by the CUDA phase correlation: on the H200, problem 77's took 0.285-0.295 ms with its operand
    pass against 0.323-0.324 for cuDNN's convolution alone, whose layout conversions it also saves
    (benchmarks/RESULTS.md, twelfth session)."""
    if reason is not None:
        _log_once(what, plan, reason, fallback)
    return reason is None


def phase_operands(grad_output, input, plan: Plan, phases, precision: int):
    """(lattice, windows) in one launch, both TF32-rounded in TF32 mode (as the tensor cores of both gradients read
    them); windows None where input is None.

    lattice: grad_output's lattice of the phase copied out contiguous, once for both gradients (on the H200,
    problem 77, both took 1.005 ms with one copy against 1.122 with one each), so that the grad_weight kernel
    hands its tile to the MMA as loaded (lattice_rounded) and cuDNN's grad_input reads the operand it would round
    anyway: 0.063 ms against 0.072 for torch's .contiguous(), and the weight gradient 0.284 against 0.321 ms when
    it need not round (benchmarks/RESULTS.md, seventh session).

    windows: copies[n, kw, c, d, h, q] = the phase's input window at (n, c, d, h, q + kw*dilation) (zero where
    the window pads the input), each row padded to a multiple of 16 elements (zero; never read). Every w tap's
    tile then starts where a row does, 64-byte aligned, so the grad_weight kernel loads the input 16 bytes at a
    time; in the window itself the taps' offsets (odd on problem 77) allow only 4-byte loads.

    The lattice is read in place from grad_output (its offset and strides computed, not sliced: a view is an
    operation whose host time shows on the GPU machine)."""
    rounded = precision == TF32
    offset, shape, strides = _lattice_geometry(plan, phases, grad_output.stride())
    return _copy(grad_output, offset, shape, strides, input, phases, rounded, rounded)


def copy_lattice(lattice: torch.Tensor, round_to_tf32: bool) -> torch.Tensor:
    """A lattice (any strided view N, C, QD, QH, QW) copied out contiguous, as phase_operands does."""
    return _copy(lattice, 0, tuple(lattice.shape), lattice.stride(), None, None, round_to_tf32, False)[0]


def _window_per_w_tap(input: torch.Tensor, phases, round_to_tf32: bool) -> torch.Tensor:
    """The input's windows alone, as phase_operands makes them: (N, w taps, C, D, H, row)."""
    return _copy(None, 0, None, None, input, phases, False, round_to_tf32)[1]


def _copy(source, offset, lattice_shape, lattice_strides, input, phases, round_lattice, round_windows):
    """(lattice or None, windows or None) by copy_operands_kernel: the lattice of source at offset, of the given
    shape and strides (lattice_shape None: none), and the windows of input (None: none)."""
    grid, scalars, options, windows_shape = _copy_launch(
        offset, lattice_shape, lattice_strides, None if input is None else (tuple(input.shape), input.stride()),
        phases, round_lattice, round_windows)
    lattice = windows = None
    if lattice_shape is not None:
        lattice = torch.empty(lattice_shape, dtype=source.dtype, device=source.device)
    if input is not None:
        windows = torch.empty(windows_shape, dtype=input.dtype, device=input.device)
    if grid[0]:
        anything = lattice if lattice is not None else windows  # (a pointer for the part without programs)
        pointers = tuple(anything if t is None else t for t in (source, lattice, input, windows))
        _launch_copy_operands.launch(grid, pointers, scalars, options)
    return lattice, windows


@functools.lru_cache(maxsize=1024)
def _copy_launch(offset, lattice_shape, lattice_strides, input_geometry, phases, round_lattice, round_windows):
    """(grid, scalar arguments, constexprs and launch options, the windows' shape) of copy_operands_kernel, once
    per layer."""
    lattice_programs, lattice_scalars = 0, (0,) * 7
    lattice_constexprs = dict(C=1, QD=1, QH=1, QW=1, OFFSETS_64=False)
    if lattice_shape is not None:
        total = math.prod(lattice_shape)
        lattice_programs = cdiv(total, LATTICE_BLOCK)
        reach = offset + sum((size - 1) * stride for size, stride in zip(lattice_shape[2:], lattice_strides[2:]))
        lattice_scalars = (total, offset, *lattice_strides)
        lattice_constexprs = dict(zip(("C", "QD", "QH", "QW"), lattice_shape[1:]),
                                  OFFSETS_64=max(total + LATTICE_BLOCK, reach) >= OFFSETS_64_FROM)
    window_programs, window_scalars, windows_shape = 0, (0,) * 19, None
    block_r = block_q = 1
    if input_geometry is not None:
        (n, c, *spatial), strides = input_geometry
        (span_d, span_h, _), width = (p.input_span for p in phases), phases[2].out_count
        w_taps = len(phases[2].taps)
        row = _padded_width(width)
        windows_shape = (n, w_taps, c, span_d, span_h, row)
        block_q = next_power_of_2(row)
        block_r = max(1, 4096 // block_q)
        row_blocks = cdiv(span_d * span_h, block_r)
        window_programs = n * w_taps * c * row_blocks if math.prod(windows_shape) else 0
        window_scalars = (row_blocks, c, *spatial, span_d, span_h, w_taps, *strides,
                          *(p.input_start for p in phases), phases[2].input_dilation, width, row)
    options = dict(lattice_constexprs, ROUND_LATTICE=round_lattice, BLOCK=LATTICE_BLOCK, ROUND_WINDOWS=round_windows,
                   BLOCK_R=block_r, BLOCK_Q=block_q, num_warps=8)
    return ((lattice_programs + window_programs,), (lattice_programs, *lattice_scalars, *window_scalars),
            tuple(options.items()), windows_shape)


def _padded_width(width: int) -> int:
    return cdiv(width, 16) * 16
