"""Triton grad_weight of one phase of conv_transpose3d.

Within a phase the forward is the stride-1 correlation y[n, co, q] = sum_{ci, k} x[n, ci, i0 + q + k*dil]
* w[co, ci, k] over the phase's compact grid q (plan.py), where y is the lattice o = o0 + stride*q of the
output. So its weight gradient is one GEMM per group,

    grad_w[co, (k, ci)] = sum over (n, q) of g[n, co, o0 + stride*q] * x[n, ci, i0 + q + k*dil],

with M = output channels, N = taps x input channels and a reduction over every position of the compact
grid (262144 for KernelBench L1/77, against M = 64 and N = 864). The kernel reads grad_output's lattice and
the input where they lie (grad_output's lattice by its strides: no compact copy; the input padded to the phase's window and
channels-last, a small copy that spares a bounds test per loaded element and makes the loads contiguous)
and splits the reduction into a fixed number of chunks whose partial sums are added in a fixed order
afterwards, so that the result is deterministic. cuDNN's weight gradient of the same compact convolution ran
at 1.75 ms on the H200 (benchmarks/diag_phases.py), aten's strided one at 1.13 ms.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ...plan import Plan
from ..torch_phase import _phase_input
from .forward import _interpreted, _round_to_tf32, _sm_count, precision_for


@triton.jit
def phase_grad_weight_kernel(
    g_ptr, x_ptr, partial_ptr,
    P, CHUNK, QD, QH, QW,
    sgn, sgc, sgd, sgh, sgw,
    sxn, sxc, sxd, sxh, sxw,
    DIL_D, DIL_H, DIL_W, TH, TW,
    CO_G, CI_G, N_TOTAL, N_BLOCKS, CO_BLOCKS, GROUPS,
    PRECISION: tl.constexpr, INTERPRETED: tl.constexpr, BLOCK_CO: tl.constexpr, BLOCK_P: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """partial[s, group, co, k*CI_G + ci] = the sum above over chunk s of the positions (n, qd, qh, qw).

    g_ptr points at grad_output's first lattice element, with the lattice's strides (sg*); x_ptr at the
    phase's input window (padded: position q with tap k reads window index q + k*dil, always inside). Column nn
    of the GEMM is tap k = nn // CI_G, k = (kd*TH + kh)*TW + kw, and input channel ci = nn % CI_G. Offsets
    inside one sample are 32-bit (the launcher checks), sample bases 64-bit.
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
              + (k % TW) * DIL_W * sxw)

    acc = tl.zeros((BLOCK_CO, BLOCK_N), dtype=tl.float32)
    start = split * CHUNK
    end = tl.minimum(start + CHUNK, P)
    for p0 in range(start, end, BLOCK_P):
        p = p0 + tl.arange(0, BLOCK_P)
        p_ok = p < end
        p = tl.minimum(p, P - 1)  # keep every lane's address inside the tensors, masked or not
        qw = p % QW
        qh = p // QW % QH
        qd = p // (QW * QH) % QD
        n = (p // (QW * QH * QD)).to(tl.int64)
        g = tl.load((g_ptr + n * sgn)[None, :] + (g_rows[:, None] + (qd * sgd + qh * sgh + qw * sgw)[None, :]),
                    mask=co_ok[:, None] & p_ok[None, :], other=0.0)
        x = tl.load((x_ptr + n * sxn)[:, None] + ((qd * sxd + qh * sxh + qw * sxw)[:, None] + x_cols[None, :]),
                    mask=p_ok[:, None] & nn_ok[None, :], other=0.0)
        if PRECISION == 1:
            acc = tl.dot(_round_to_tf32(g), _round_to_tf32(x), acc, input_precision="tf32")
        elif PRECISION == 2:
            acc = tl.dot(g, x, acc, input_precision="tf32x3")
        elif INTERPRETED and g.dtype == tl.bfloat16:
            # The interpreter's dot mishandles bfloat16 (as in forward.py); bfloat16 products are exact in float32.
            acc = tl.dot(g.to(tl.float32), x.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(g, x, acc)
    rows = ((split * GROUPS + group) * CO_G + tl.minimum(co, CO_G - 1)).to(tl.int64) * N_TOTAL
    tl.store(partial_ptr + rows[:, None] + nn[None, :], acc, mask=co_ok[:, None] & nn_ok[None, :])


# (BLOCK_CO, BLOCK_N, num_warps, num_stages, programs per SM); BLOCK_P (the reduction step) is 32.
CONFIG = (64, 128, 8, 3, 4)
BLOCK_P = 32


def fits(plan: Plan, phases) -> bool:
    """Whether 32-bit offsets inside one sample and a 32-bit position count serve this phase."""
    sample = max(plan.in_channels * math.prod(p.input_span for p in phases),
                 plan.out_channels * math.prod(plan.output_spatial))
    return sample < 2**31 and plan.batch * math.prod(p.out_count for p in phases) < 2**31


def phase_grad_weight(grad_output: torch.Tensor, input: torch.Tensor, plan: Plan, phases,
                      precision: int | None = None, config=CONFIG) -> torch.Tensor:
    """Weight gradient of one phase's correlation: (C_out, C_in/g, taps of each axis phase), taps in the
    phase's (descending) order, as the phase's conv3d weight is laid out (torch_phase._phase_weight)."""
    precision = precision_for(input.dtype) if precision is None else precision
    block_co, block_n, num_warps, num_stages, per_sm = config
    groups = plan.groups
    co_g, ci_g = plan.out_channels // groups, plan.in_channels // groups
    taps = [len(p.taps) for p in phases]
    counts = [p.out_count for p in phases]
    n_total = math.prod(taps) * ci_g
    positions = plan.batch * math.prod(counts)
    block_co = max(16, min(block_co, triton.next_power_of_2(co_g)))
    block_n = max(16, min(block_n, triton.next_power_of_2(n_total)))
    n_blocks, co_blocks = triton.cdiv(n_total, block_n), triton.cdiv(co_g, block_co)
    tiles = groups * co_blocks * n_blocks
    # Enough chunks of the reduction to fill the GPU; each at least a few BLOCK_P steps long.
    sms = _sm_count(input.device.index or 0) if input.device.type == "cuda" else 1
    splits = max(1, min(triton.cdiv(per_sm * sms, tiles), triton.cdiv(positions, 8 * BLOCK_P)))
    chunk = triton.cdiv(triton.cdiv(positions, splits), BLOCK_P) * BLOCK_P
    splits = triton.cdiv(positions, chunk)
    partial = torch.empty((splits, groups, co_g, n_total), dtype=torch.float32, device=input.device)
    lattice = grad_output[(slice(None), slice(None), *(slice(p.out_start, None, a.stride)
                                                        for p, a in zip(phases, plan.axes)))]
    # Channels-last, so that a tile's columns (input channels fastest) are contiguous: with NCDHW each of a
    # warp's lanes read its own memory sector, and the kernel ran 4x slower than aten on problem 77.
    window = _phase_input(input, plan, phases).contiguous(memory_format=torch.channels_last_3d)
    phase_grad_weight_kernel[(tiles, splits)](
        lattice, window, partial,
        positions, chunk, *counts,
        *lattice.stride(), *window.stride(),
        *(p.input_dilation for p in phases), taps[1], taps[2],
        co_g, ci_g, n_total, n_blocks, co_blocks, groups,
        PRECISION=precision, INTERPRETED=_interpreted(), BLOCK_CO=block_co, BLOCK_P=BLOCK_P, BLOCK_N=block_n,
        num_warps=num_warps, num_stages=num_stages,
    )
    grad = partial.sum(0) if splits > 1 else partial[0]  # a fixed order: deterministic
    # (groups, co, taps..., ci) -> (groups * co, ci, taps...)
    grad = grad.reshape(groups * co_g, *taps, ci_g).permute(0, 4, 1, 2, 3)
    return grad.to(input.dtype)
