"""The phase decomposition's convolutions through the CUDA kernels (phase_conv.py, grad_weight.py) instead of cuDNN
and Triton.

Forward: one window of the input serves every phase that some tap reaches (each phase reads it from its own offset),
and each phase's correlation writes the output's lattice of that phase directly, bias included: no copy of the
phase's result into the output. grad_input: each phase's part from a window of its grad_output lattice. grad_weight:
each phase's slice straight from the input and grad_output's lattice, no copy of either.
"""

from __future__ import annotations

import functools

import torch

from ...plan import Plan
from .. import cuda, cudnn_allow_tf32
from ..triton import _can_launch_dependents
from ..triton.forward import _sm_count
from ..triton.window import correlation_operands, operands_at_addresses
from . import (compiled_together, correlate, correlate_grad_weight, correlate_phases, correlation_kernel,
               correlation_spec, correlation_unsupported, grad_weight_kernel_unsupported, grad_weight_splits,
               phase_conv_unsupported, phase_launches, reads_input, row_runs, window_extent)


def _split(tf32: bool) -> int:
    """The correlation's precision: cuda.TF32_SPLIT (FP16, or TF32 itself) where tf32
    (torch.backends.cudnn.allow_tf32) allows TF32, else cuda.SPLIT."""
    return cuda.TF32_SPLIT if tf32 else cuda.SPLIT


def _taps(phases, ascending: bool):
    """(taps per axis, first kernel tap per axis, step per axis) of a phase's correlation: the flipped taps (phases
    store them descending) for the forward, ascending for grad_input."""
    counts, firsts, steps = [], [], []
    for p in phases:
        taps = tuple(reversed(p.taps)) if ascending else p.taps
        counts.append(len(taps))
        firsts.append(taps[0])
        steps.append(taps[1] - taps[0] if len(taps) > 1 else 0)
    return tuple(counts), tuple(firsts), tuple(steps)


@functools.lru_cache(maxsize=256)
def forward_unsupported(plan: Plan, phase_list: tuple, device: torch.device, dtype: torch.dtype,
                        tf32: bool) -> str | None:
    """None when the settings, channels, taps and shared memory let every phase of phase_list (the phases some tap
    reaches) run on the CUDA correlation (TF32, or cuda.SPLIT's split where tf32, torch.backends.cudnn.allow_tf32, is
    off), else why not. Compiles nothing: forward_kernels_unsupported does, for a call's operands."""
    for phases in phase_list:
        counts, _, _ = _taps(phases, ascending=False)
        reason = correlation_unsupported(device, dtype, plan.in_channels, plan.out_channels, plan.groups, counts,
                                         tuple(p.input_dilation for p in phases), _split(tf32))
        if reason is not None:
            return reason
    return None


def forward_kernels_unsupported(input: torch.Tensor, bias, plan: Plan, phase_list: tuple, region=None) -> str | None:
    """After forward_unsupported: None when the kernels that write_phases launches for this input and bias (or none) and
    region (region_fill's, or none) compile, else why not. They are compiled here, once per layer, input geometry and
    bias or not, so that a failure falls back to cuDNN; the call then finds them compiled. (Before the seventieth
    session the check compiled phase_conv.py's kernel for every layer, also where row_runs.py's served: on problem 77,
    NVRTC and ptxas on the project's 2-core CPU took 0.45-0.51 s for it in TF32 mode and 0.90-0.92 with TF32 off, beside
    0.34-0.39 and 0.79-0.83 for the kernel the call launches; benchmarks/cpu_first_call_compiles.py.)"""
    split = _split(cudnn_allow_tf32())
    direct = _direct_input(input, plan, phase_list, split, bias is not None, region)
    return _kernels_unsupported(plan, phase_list, split, input.device.index or 0, bias is not None,
                                None if direct is None else direct[1], region)


@functools.lru_cache(maxsize=256)
def _kernels_unsupported(plan: Plan, phase_list: tuple, split: int, device: int, has_bias: bool,
                         input_geometry, region=None) -> str | None:
    _, extent, launches = _forward_geometry(plan, phase_list, split)
    window_shape = (plan.batch, *extent, plan.in_channels)
    kernels = [(window_shape, plan.out_channels, split, has_bias, grid, counts, dilation, len(members), input_geometry,
                region) for counts, dilation, grid, members in launches]
    try:
        with compiled_together(device, [correlation_spec(*kernel) for kernel in kernels]):  # (a k3 s2 layer's eight)
            for kernel in kernels:
                correlation_kernel(device, *kernel)
    except Exception as error:  # noqa: BLE001 (NVRTC, the driver or torch's private API: any failure means cuDNN)
        return f"compiling the kernel failed: {error}"
    return None


@functools.lru_cache(maxsize=256)
def _forward_geometry(plan: Plan, phase_list: tuple, split: int):
    """(the window's start and extent, and the launches: per group of phases with the same taps, dilation and grid,
    (taps, dilation, grid, and per phase (phases, offsets, first taps, steps))). One launch serves a group
    (correlate_phases): a k2 s2 or k4 s2 p1 layer's eight phases, not a k3 s2 layer's, whose phases have 1 or 2 taps
    along each axis."""
    starts = [min(phases[axis].input_start for phases in phase_list) for axis in range(3)]
    groups = {}
    for phases in phase_list:
        counts, firsts, steps = _taps(phases, ascending=False)
        offsets = tuple(p.input_start - s for p, s in zip(phases, starts))
        dilation = tuple(p.input_dilation for p in phases)
        grid = tuple(p.out_count for p in phases)
        groups.setdefault((counts, dilation, grid), []).append((phases, offsets, firsts, steps))
    extent = [0, 0, 0]
    for (counts, dilation, grid), members in groups.items():
        for _, offsets, _, _ in members:  # the group's tile rows: its programs number batch x its phases
            reach = window_extent(plan.in_channels, plan.out_channels, grid, counts, dilation, offsets, split,
                                  plan.batch * len(members))
            extent = [max(e, r) for e, r in zip(extent, reach)]
    launches = tuple((*key, tuple(members)) for key, members in groups.items())
    return tuple(starts), tuple(extent), launches


def write_phases(input: torch.Tensor, weight: torch.Tensor, bias, plan: Plan, phase_list: tuple, out: torch.Tensor,
                 lattice_geometry, region=None) -> None:
    """Every phase of phase_list into its lattice of out (lattice_geometry(plan, phases, out.stride()) gives its
    element offset, shape and strides), bias added; split (_split) where torch.backends.cudnn.allow_tf32 is off.
    region (region_fill's): the rest of out filled with the bias (or zero) by the same kernel."""
    split = _split(cudnn_allow_tf32())
    if bias is not None and not bias.is_contiguous():
        bias = bias.contiguous()  # the correlation reads bias[c] at c elements from its start
    start, extent, launches = _forward_launches(plan, phase_list, split, out.stride(), lattice_geometry)
    direct = _direct_input(input, plan, phase_list, split, bias is not None, region)
    # (The pass compiled as prepare_write's, early included, so that its prepared call finds this launch compiled;
    # correlate_phases launches no dependent, and the pass's early start then lets nothing start.)
    window, weight_taps, scales = correlation_operands(input, 0, input.shape, input.stride(), start, extent, weight,
                                                       grad_input_orientation=False, split=split,
                                                       window=direct is None, early=_early(input.device),
                                                       maxima=_pass_maxima(plan, phase_list, split, direct))
    source = window if direct is None else input
    for counts, dilation, grid, strides, fields in launches:
        correlate_phases(source, weight_taps, bias, out, strides, grid, counts, dilation, fields, scales, split,
                         direct=direct, region=region)


def region_fill(plan: Plan, phase_list: tuple, out_strides) -> tuple | None:
    """row_runs.source's region for a forward whose correlation may fill the rest of an output of out_strides itself
    (cuda.REGION_FILL on, or None: with TF32 off, and in TF32 mode where a fill warpgroup does it,
    row_runs.fill_warpgroup): the layer's only phase (phase_list's one) on row_runs.py's kernel, into an output whose
    planes and rows are contiguous; else None (the caller fills the output first)."""
    if (cuda.REGION_FILL is not None and not cuda.REGION_FILL) or len(phase_list) != 1:
        return None
    split = _split(cudnn_allow_tf32())
    region = _region(plan, phase_list, split, tuple(out_strides))
    if region is not None and cuda.REGION_FILL is None and split == 3:
        _, (_, _, window_columns), _ = _forward_geometry(plan, phase_list, split)
        if not row_runs.fill_warpgroup(split, window_columns, region):
            return None
    return region


@functools.lru_cache(maxsize=256)
def _region(plan: Plan, phase_list: tuple, split: int, out_strides) -> tuple | None:
    (phases,) = phase_list
    _, _, ((_, _, grid, _),) = _forward_geometry(plan, phase_list, split)
    out_d, out_h, out_w = plan.output_shape[2:]
    if not cuda._row_runs_layer(plan.in_channels, plan.out_channels, split, grid) or \
            out_strides[2:] != (out_h * out_w, out_w, 1):
        return None
    return (out_d, out_h, out_w), tuple(axis.stride for axis in plan.axes), tuple(phase.out_start for phase in phases)


def _direct_input(input: torch.Tensor, plan: Plan, phase_list: tuple, split: int, has_bias: bool, region=None):
    """correlate_phases' direct for the forward's correlations where every one may read the input itself
    (cuda.reads_input; cuda.DIRECT_INPUT on, the input's rows contiguous), else None."""
    if not (cuda.DIRECT_INPUT and input.is_cuda and input.stride(4) == 1):
        return None
    direct = input_direct(input, plan, phase_list, split)
    if not _reads_input(plan, phase_list, split, input.device.index or 0, has_bias, direct[1], region):
        return None
    return direct


def _early(device: torch.device) -> bool:
    """Whether the forward's operand pass lets the kernel after it start early, as its dependent (cuda.DEPENDENT, on
    a device that allows it: Hopper or later, not in the interpreter)."""
    return cuda.DEPENDENT and _can_launch_dependents(device.index or 0)


def _pass_maxima(plan: Plan, phase_list: tuple, split: int, direct) -> bool:
    """Whether the operand pass makes the block maxima where it makes no window (direct given): unless every
    correlation, reading the input itself (row_runs.py's kernel), finds its planes' scales itself
    (row_runs.own_maxima)."""
    if direct is None:
        return True
    _, extent, launches = _forward_geometry(plan, phase_list, split)
    return not all(row_runs.own_maxima(split, counts, dilation, extent[2]) for counts, dilation, _, _ in launches)


def input_direct(input: torch.Tensor, plan: Plan, phase_list: tuple, split: int):
    """correlate_phases' direct for the forward's correlations reading input (its rows contiguous) itself: (the
    window's shape, the input's spatial sizes, the window's start in it and the input's strides N, C, D, H)."""
    start, extent, _ = _forward_geometry(plan, phase_list, split)
    return (plan.batch, *extent, plan.in_channels), (tuple(input.shape[2:]), start, tuple(input.stride()[:4]))


@functools.lru_cache(maxsize=256)
def _reads_input(plan: Plan, phase_list: tuple, split: int, device: int, has_bias: bool, input_geometry,
                 region=None) -> bool:
    """Whether every correlation of the forward may read an input of input_geometry itself (cuda.reads_input)."""
    _, extent, launches = _forward_geometry(plan, phase_list, split)
    return all(reads_input(device, plan.in_channels, plan.out_channels, counts, dilation, extent[2], has_bias, split,
                           grid, input_geometry, region) for counts, dilation, grid, _ in launches)


def prepare_write(input: torch.Tensor, weight: torch.Tensor, bias, plan: Plan, phase_list: tuple, out: torch.Tensor,
                  lattice_geometry, region=None):
    """write_phases for later calls of this layer in this precision mode with input, weight, bias (or none) and out
    laid out as these are, for a prepared call: a function (stream, input, weight, bias (0: none) and out addresses)
    that allocates the operands and launches the operand pass and the correlations there, with the launch arguments
    computed here, once; region: write_phases'. None where the operand pass has no launch at addresses
    (operands_at_addresses). The caller checks that every address is 16-byte aligned, the device current
    (launch.ready_stream) and the tensors as these."""
    split = _split(cudnn_allow_tf32())
    device = input.device.index or 0
    start, extent, launches = _forward_launches(plan, phase_list, split, out.stride(), lattice_geometry)
    direct = _direct_input(input, plan, phase_list, split, bias is not None, region)
    early = _early(input.device)
    operands = operands_at_addresses(device, input.shape, input.stride(), start, extent, weight, split,
                                     window=direct is None, early=early,
                                     maxima=_pass_maxima(plan, phase_list, split, direct))
    if operands is None:
        return None
    size, window_shape, scale_blocks, operand_pass = operands
    kd, kh, kw = weight.shape[2:]
    lo_offset = 4 * kd * kh * kw * plan.out_channels * plan.in_channels if split == 1 else None
    input_geometry = None if direct is None else direct[1]
    correlations = [launch for counts, dilation, grid, strides, fields in launches
                    for launch in phase_launches(device, window_shape, (kh, kw, plan.out_channels), split,
                                                 bias is not None, strides, grid, counts, dilation, fields,
                                                 scale_blocks, input_geometry, region)]
    device_of_buffer = input.device

    def write(stream, input, weight, bias, out):
        buffer = torch.empty(size, dtype=torch.uint8, device=device_of_buffer)  # (kept until the launches are queued)
        window, taps, block_max, inverse = operand_pass(stream, input, weight, buffer.data_ptr())
        source = window if input_geometry is None else input
        pointers = (source, taps, 0 if lo_offset is None else taps + lo_offset, bias,
                    *((block_max, inverse) if split >= 2 else (0, 0)), out)
        for k, (kernel, programs, ints, longs, table) in enumerate(correlations):
            # (the first launch after the pass as its dependent where cuda.DEPENDENT says and the kernel waits)
            dependent = k == 0 and early and kernel.waits_for_previous
            kernel.launch(programs, pointers, ints, longs, stream, table, dependent=dependent)

    return write


@functools.lru_cache(maxsize=256)
def _forward_launches(plan: Plan, phase_list: tuple, split: int, out_strides, lattice_geometry):
    """_forward_geometry's window start and extent, and per launch (taps, dilation, grid, the lattices' strides, the
    same for every phase of a launch, and per phase correlate_phases' fields) into an output of out_strides: one
    lookup per call."""
    start, extent, launches = _forward_geometry(plan, phase_list, split)
    fields_of_launches = []
    for counts, dilation, grid, members in launches:
        fields, all_strides = [], set()
        for phases, offsets, firsts, steps in members:
            offset, _, strides = lattice_geometry(plan, phases, out_strides)
            fields.append((*offsets, *firsts, *steps, offset))
            all_strides.add(tuple(strides))
        (strides,) = all_strides
        fields_of_launches.append((counts, dilation, grid, strides, tuple(fields)))
    return start, extent, tuple(fields_of_launches)


@functools.lru_cache(maxsize=256)
def grad_input_unsupported(plan: Plan, phases, device: torch.device, dtype: torch.dtype, tf32: bool) -> str | None:
    """None when the CUDA correlation computes this phase's part of grad_input (TF32, or cuda.SPLIT's split where tf32
    is off), else why not."""
    counts, _, _ = _taps(phases, ascending=True)
    return phase_conv_unsupported(device, dtype, plan.out_channels, plan.in_channels, plan.groups, counts,
                                  tuple(p.input_dilation for p in phases), _split(tf32), plan.batch,
                                  plan.input_spatial)


@functools.lru_cache(maxsize=256)
def _grad_input_geometry(plan: Plan, phases, split: int):
    """(the window's start and extent, taps, first taps, steps, dilation, grid) of a phase's grad_input: input i
    receives lattice position j = i + start + k * dilation for the k-th ascending tap (torch_phase.phase_grad_input)."""
    counts, firsts, steps = _taps(phases, ascending=True)
    dilation = tuple(p.input_dilation for p in phases)
    start = tuple(-p.input_start - (len(p.taps) - 1) * p.input_dilation for p in phases)
    grid = plan.input_spatial
    extent = window_extent(plan.out_channels, plan.in_channels, grid, counts, dilation, (0, 0, 0), split, plan.batch)
    return start, extent, counts, firsts, steps, dilation, grid


def phase_grad_input(lattice: torch.Tensor, weight: torch.Tensor, plan: Plan, phases) -> torch.Tensor:
    """The phase's part of grad_input from lattice, grad_output's lattice of the phase (any strides): (N, C_in, D,
    H, W), contiguous."""
    return phase_grad_input_in_place(lattice, 0, lattice.stride(), weight, plan, phases)


def phase_grad_input_in_place(grad_output: torch.Tensor, lattice_offset: int, lattice_strides, weight: torch.Tensor,
                              plan: Plan, phases) -> torch.Tensor:
    """phase_grad_input of the lattice that starts at element lattice_offset of grad_output with lattice_strides
    (torch_phase._lattice_geometry's): read in place, with no view made (a view's host time shows on the GPU). Split
    (_split) where torch.backends.cudnn.allow_tf32 is off."""
    split = _split(cudnn_allow_tf32())
    start, extent, counts, firsts, steps, dilation, grid = _grad_input_geometry(plan, phases, split)
    shape = (plan.batch, plan.out_channels, *(p.out_count for p in phases))
    window, weight_taps, scales = correlation_operands(grad_output, lattice_offset, shape, lattice_strides, start,
                                                       extent, weight, grad_input_orientation=True, split=split)
    grad_input = torch.empty((plan.batch, plan.in_channels, *grid), dtype=grad_output.dtype,
                             device=grad_output.device)
    correlate(window, weight_taps, None, grad_input, 0, grad_input.stride(), grid, (0, 0, 0), counts, firsts, steps,
              dilation, scales, split)
    return grad_input


@functools.lru_cache(maxsize=256)
def grad_weight_unsupported(plan: Plan, phases, device: torch.device, dtype: torch.dtype, tf32: bool) -> str | None:
    """None when grad_weight.py's kernel computes this phase's slice of grad_weight, else why not."""
    del tf32
    counts, _, _ = _taps(phases, ascending=False)
    return grad_weight_kernel_unsupported(device, dtype, plan.in_channels, plan.out_channels, plan.groups, counts,
                                          tuple(p.input_dilation for p in phases))


@functools.lru_cache(maxsize=256)
def _grad_weight_geometry(plan: Plan, phases, sms: int):
    """(grid, input starts, taps, dilation, splits) of a phase's weight gradient."""
    counts, _, _ = _taps(phases, ascending=False)
    dilation = tuple(p.input_dilation for p in phases)
    grid = tuple(p.out_count for p in phases)
    splits = grad_weight_splits(plan.in_channels, plan.out_channels, counts, dilation, grid, plan.batch, sms)
    return grid, tuple(p.input_start for p in phases), counts, dilation, splits


def phase_grad_weight(grad_output: torch.Tensor, lattice_offset: int, lattice_strides, input: torch.Tensor,
                      plan: Plan, phases) -> torch.Tensor:
    """The phase's slice of grad_weight, (C_in, C_out, the phase's taps in ascending order), from the input and the
    lattice that starts at element lattice_offset of grad_output with lattice_strides, both read in place."""
    sms = _sm_count(input.device.index or 0) if input.is_cuda else 1
    grid, starts, taps, dilation, splits = _grad_weight_geometry(plan, phases, sms)
    return correlate_grad_weight(input, grad_output, lattice_offset, lattice_strides, grid, starts, taps, dilation,
                                 splits)
