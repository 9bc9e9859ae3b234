"""Portable backend: one stride-1 conv3d per non-empty phase, on any device torch supports.

Each non-empty phase is an ordinary correlation of the input (cropped and padded to the
phase's window) with the flipped taps that reach it; its result is copied once into a
strided view of the output. Empty phases get the bias (or zero). No zero-stuffed input,
no col2im.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..plan import AxisPhase, Plan


def _window(phase: AxisPhase, in_size: int) -> tuple[slice, int, int, int]:
    """Input slice, symmetric conv padding, and output offset that realise one axis phase.

    conv3d pads symmetrically, so pad both sides by the larger of the two pads and drop the
    extra outputs that the smaller side produces.
    """
    start, stop = phase.input_start, phase.input_start + phase.input_span
    pad_left, pad_right = max(0, -start), max(0, stop - in_size)
    pad = max(pad_left, pad_right)
    return slice(max(0, start), min(in_size, stop)), pad, pad - pad_left, phase.input_dilation


def conv_transpose3d(input, weight, bias, plan: Plan) -> torch.Tensor:
    """input (N, C_in, D, H, W), weight (C_in, C_out/g, kD, kH, kW): validated tensors."""
    out = torch.empty(plan.output_shape, dtype=input.dtype, device=input.device)
    fill = bias.view(1, -1, 1, 1, 1) if bias is not None else None
    groups = plan.groups
    c_in, c_out_g = weight.shape[0], weight.shape[1]
    for phase in plan.phases:
        target = out[(slice(None), slice(None), *_phase_slices(phase, plan))]
        if target.numel() == 0:
            continue
        if not phase.reads_input:
            if fill is None:
                target.zero_()
            else:
                target.copy_(fill.expand_as(target))
            continue
        windows = [_window(p, a.in_size) for p, a in zip(phase.axes, plan.axes)]
        x = input[(slice(None), slice(None), *(w[0] for w in windows))]
        taps = [list(p.taps) for p in phase.axes]
        # Phase weight for conv3d: (C_out, C_in/g, taps...) with taps in flipped (descending) order.
        w = weight[:, :, taps[0]][:, :, :, taps[1]][:, :, :, :, taps[2]]
        w = w.reshape(groups, c_in // groups, c_out_g, *w.shape[2:]).transpose(1, 2)
        w = w.reshape(groups * c_out_g, c_in // groups, *w.shape[3:])
        y = F.conv3d(
            x, w, bias, stride=1, padding=tuple(w_[1] for w_ in windows),
            dilation=tuple(w_[3] for w_ in windows), groups=groups,
        )
        y = y[(slice(None), slice(None), *(slice(w_[2], w_[2] + p.out_count) for w_, p in zip(windows, phase.axes)))]
        target.copy_(y)
    return out


def _phase_slices(phase, plan: Plan) -> tuple[slice, ...]:
    return tuple(
        slice(p.out_start, p.out_start + a.stride * (p.out_count - 1) + 1, a.stride) if p.out_count else slice(0, 0)
        for p, a in zip(phase.axes, plan.axes)
    )
