"""An output filled with its bias, channel by channel (the phase path's fill where some phase has no taps).

torch's broadcast copy (`out.copy_(bias.view(1, -1, 1, 1, 1).expand_as(out))`) wrote problem 77's output (571 MB)
in 0.340 ms on the H200, against 0.125 for zero_(); it ran no faster as a 3-D or 2-D view (benchmarks/RESULTS.md,
fifteenth session). Here each program writes a block of the flat output, aligned, so that the stores are 16-byte
vectors, taking each element's value from the one or two channel planes the block meets.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from . import cdiv
from .launch import Launcher

# Elements per program; also the smallest channel plane (D x H x W) served, so that a block meets two planes at most.
BLOCK = 2048


@triton.jit
def _fill_channels_kernel(out_ptr, bias_ptr, plane, channels, total, BLOCK: tl.constexpr):
    start = tl.program_id(0).to(tl.int64) * BLOCK
    offsets = start + tl.arange(0, BLOCK)
    first = start // plane  # the (sample, channel) plane the block starts in; it ends in that one or the next
    value = tl.where(offsets < (first + 1) * plane, tl.load(bias_ptr + first % channels),
                     tl.load(bias_ptr + (first + 1) % channels))
    tl.store(out_ptr + offsets, value, mask=offsets < total)


_launcher = Launcher(_fill_channels_kernel)


def fill_unsupported(out: torch.Tensor, bias: torch.Tensor) -> str | None:
    """None when fill_channels serves out and bias, else why not."""
    if not out.is_contiguous() or out.dim() != 5:
        return "the output is not a contiguous (N, C, D, H, W) tensor"
    if math.prod(out.shape[2:]) < BLOCK:
        return f"a channel plane has fewer than {BLOCK} elements"
    if bias.dtype != out.dtype or bias.shape != (out.shape[1],) or not bias.is_contiguous():
        return "the bias is not a contiguous (C,) tensor of the output's dtype"
    return None


def fill_channels(out: torch.Tensor, bias: torch.Tensor) -> None:
    """out[:, c] = bias[c] for every channel c, where fill_unsupported(out, bias) is None."""
    total = out.numel()
    if total:
        _launcher.launch((cdiv(total, BLOCK),), (out, bias), (math.prod(out.shape[2:]), out.shape[1], total),
                         (("BLOCK", BLOCK),))
