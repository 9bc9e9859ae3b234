"""The phase backend: one stride-1 convolution per non-empty phase, on any device torch supports.

Each non-empty phase is an ordinary correlation of the input (cropped and padded to the
phase's window) with the flipped taps that reach it; its result is copied once into a
strided view of the output (on an sm_90 GPU in float32, where it serves, the CUDA phase
correlation of backends/cuda computes it, in TF32 or 3xTF32, and writes that view itself). Empty regions get
the bias (or zero): on the CPU filled as whole planes or rows where a depth or height phase
is empty, since large contiguous fills are far cheaper than element-strided ones; on GPUs
the whole output is filled once first. No zero-stuffed input, no col2im. The backward
(grad_input, grad_weight) uses the same phases.
"""

from __future__ import annotations

import collections
import ctypes
import functools
import itertools
import logging
import sys

import torch
import torch.nn.functional as F

from ..plan import AxisPhase, AxisPlan, Plan
from . import contiguous_operands, cudnn_allow_tf32, output_memory_format
from .triton import triton_available, triton_unusable  # (imports no Triton)

logger = logging.getLogger("convt3d")

_HUGE_PAGE = 1 << 21
_MADV_HUGEPAGE = 14  # Linux


@functools.lru_cache(maxsize=1)
def _madvise():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        return libc.madvise
    except (OSError, AttributeError):
        return None


def _empty_output(shape, dtype, device, memory_format) -> torch.Tensor:
    """torch.empty, asking Linux for transparent huge pages on a large CPU output before its first touch.

    A fresh multi-megabyte CPU tensor is new memory: with 4 KB pages, faulting it in cost more than all the
    arithmetic of KernelBench L1/77 at batch 2 (71 MB: 21 ms to allocate and zero, 4 ms with huge pages, on a
    2-core x86 machine whose THP mode is "madvise"). Only this fresh allocation is advised; the hint changes
    nothing where THP is off.
    """
    out = torch.empty(shape, dtype=dtype, device=device, memory_format=memory_format)
    if not out.is_cpu:
        return out
    nbytes = out.numel() * out.element_size()
    madvise = _madvise() if nbytes >= 4 * _HUGE_PAGE else None
    if madvise is not None:
        start = -(-out.data_ptr() // _HUGE_PAGE) * _HUGE_PAGE
        end = (out.data_ptr() + nbytes) // _HUGE_PAGE * _HUGE_PAGE
        madvise(start, end - start, _MADV_HUGEPAGE)  # advice only: a failure leaves ordinary pages
    return out


def _out_slice(phase: AxisPhase, axis: AxisPlan) -> slice:
    return slice(phase.out_start, phase.out_start + axis.stride * (phase.out_count - 1) + 1, axis.stride)


def _pads(phase: AxisPhase, in_size: int) -> tuple[int, int]:
    """(left, right) padding of the input that gives exactly the phase's window; negative crops."""
    return -phase.input_start, phase.input_start + phase.input_span - in_size


def _fill(target: torch.Tensor, bias) -> None:
    if bias is None:
        target.zero_()
        return
    fill = _triton_fill() if target.is_cuda else None
    if fill is not None and fill.fill_unsupported(target, bias) is None:
        fill.fill_channels(target, bias)  # (torch's broadcast copy ran at a third of the bandwidth)
    else:
        target.copy_(bias.view(1, -1, 1, 1, 1).expand_as(target))


@functools.lru_cache(maxsize=1)
def _triton_fill():
    """backends/triton/fill.py, imported on first use and then kept (as _cuda_module), or None without a Triton that
    convt3d's kernels run on (triton.triton_available)."""
    if not triton_available():
        return None
    from .triton import fill

    return fill


def _taps(weight: torch.Tensor, phases, descending: bool = True) -> torch.Tensor:
    """weight restricted to the taps of each axis phase, flipped (descending) or not: slices and one flip (index
    tensors would each cost a host-to-device copy on CUDA); the weight itself where the phases have every tap
    ascending (a view op costs host time too)."""
    w = weight if _every_tap(phases, weight.shape[2:]) else weight[_tap_index(phases)]
    return w.flip(2, 3, 4) if descending else w


@functools.lru_cache(maxsize=1024)
def _every_tap(phases, kernel_size) -> bool:
    return all(len(p.taps) == k for p, k in zip(phases, kernel_size))


def _phase_weight(weight: torch.Tensor, phases: tuple[AxisPhase, ...], groups: int) -> torch.Tensor:
    """(C_out, C_in/g, taps...) in the flipped tap order of each axis phase."""
    w = _taps(weight, phases)
    c_in, c_out_g = w.shape[:2]
    w = w.reshape(groups, c_in // groups, c_out_g, *w.shape[2:]).transpose(1, 2)
    return w.reshape(groups * c_out_g, c_in // groups, *w.shape[3:])


def _phase_input(input, plan: Plan, phases: tuple[AxisPhase, ...]) -> torch.Tensor:
    """The input cropped and padded to exactly the phase's correlation window."""
    return _pad(input, _input_pads(plan, phases))


def _pad(t: torch.Tensor, pads) -> torch.Tensor:
    # F.pad takes the last axis first.
    return F.pad(t, [v for pair in reversed(pads) for v in pair]) if any(v for pair in pads for v in pair) else t


def _padded_operand(t: torch.Tensor, pads):
    """(t, conv3d padding) giving t padded by pads, (left, right) per axis (negative crops)."""
    copy_pads, padding = _conv_padding(pads)
    return (t if copy_pads is None else _pad(t, copy_pads)), padding


def _conv_padding(pads):
    """(pads for a padded copy, or None; conv3d's padding) for an operand padded by pads: the padding inside the
    convolution where it is symmetric, else a padded copy. Each copy or fill is a launch whose host time shows on a
    GPU (by our estimate some 50 us per operation on the H200 machine; benchmarks/RESULTS.md)."""
    if all(left == right >= 0 for left, right in pads):
        return None, tuple(left for left, _ in pads)
    return pads, (0,) * len(pads)


# Per device type: run the phases' convolutions channels-last.
# CPU: oneDNN's channels-last convolution ran problem 77 (batch 2) 1.5-2x faster than NCDHW on a 2-core x86
# machine; the layout conversions cost far less than that. CUDA: on the H200, cuDNN's channels-last phase
# convolutions were faster on 5 of the sweep's 13 layers and slower on 8 (benchmarks/RESULTS.md), so NCDHW.
CONV_CHANNELS_LAST = collections.defaultdict(lambda: False, cpu=True)


def _in_float32(t: torch.Tensor) -> bool:
    """Whether the phases' convolutions take t's dtype in float32, their results rounded back once: bfloat16 on the
    CPU, as PyTorch's bfloat16 convolutions accumulate in float32 and round once. oneDNN's own bfloat16 convolutions
    returned wrong sums on small layers whose correlation window has depth 1 (PyTorch 2.13): from channels-last
    operands on the project's first CPU (grad_input and grad_weight 0.3-0.9 off float64, a forward 0.96), and from
    contiguous ones too, inf among them, on an Intel Xeon with AMX (ninety-second session; tests/test_torch_phase.py
    has the layers). There a layer's forward and backward took about a fifth longer so (benchmarks/RESULTS.md)."""
    return t.dtype == torch.bfloat16 and t.device.type == "cpu"


def _conv3d(x, w, bias, padding, dilation, groups) -> torch.Tensor:
    """F.conv3d (stride 1) of a phase's operands, channels-last where CONV_CHANNELS_LAST says for their device, the
    result in x's dtype."""
    if _in_float32(x):
        return _conv3d(x.float(), w.float(), None if bias is None else bias.float(), padding, dilation,
                       groups).to(x.dtype)
    if CONV_CHANNELS_LAST[x.device.type]:
        x, w = x.contiguous(memory_format=torch.channels_last_3d), w.contiguous(memory_format=torch.channels_last_3d)
    return F.conv3d(x, w, bias, 1, padding, dilation, groups)


# Per device type: run a float32 phase's correlation in TF32 mode as a stride-1 conv_transpose3d where it can
# express it, instead of conv3d with flipped taps (whose weight costs a flip and a copy, each a launch whose host
# time shows). Measured on the H200, problem 77's forward, one process, each twice: TF32 0.538-0.569 ms against
# 0.653-0.663 with conv3d, but TF32 off 1.518-1.532 against 1.093-1.113 (cuDNN's full-float32 kernel for the
# transposed form is the slower), so TF32 only; half precision not measured, so conv3d. CPU: 20.3 ms against
# 16.4 for conv3d channels-last (problem 77 at batch 2, 2 cores), so conv3d (benchmarks/RESULTS.md).
PHASE_CONV_TRANSPOSED = collections.defaultdict(lambda: False, cuda=True)


def _phase_conv(input, weight, bias, plan: Plan, phases: tuple[AxisPhase, ...]) -> torch.Tensor:
    if (PHASE_CONV_TRANSPOSED[input.device.type] and input.dtype == torch.float32
            and cudnn_allow_tf32()):
        out = _phase_conv_transposed(input, weight, bias, plan, phases)
        if out is not None:
            return out
    x, padding = _padded_operand(input, _input_pads(plan, phases))
    w = _phase_weight(weight, phases, plan.groups)
    return _conv3d(x, w, bias, padding, tuple(p.input_dilation for p in phases), plan.groups)


def _phase_conv_transposed(input, weight, bias, plan: Plan, phases: tuple[AxisPhase, ...]):
    """The phase's correlation as a stride-1 transposed convolution with the phase's taps in ascending order, so
    that the weight needs no flip or copy (a view; the weight itself where the phase has every tap): output q
    reads input q + input_start + (T - 1 - t)*dil for ascending tap t, which is conv_transpose3d's q + padding -
    t*dil. None where conv_transpose3d cannot express the window (negative padding, or output padding out of
    its range)."""
    window = _transposed_window(plan, phases)
    if window is None:
        return None
    padding, output_padding, dilation = window
    return F.conv_transpose3d(input, _taps(weight, phases, descending=False), bias, 1, padding, output_padding,
                              plan.groups, dilation)


@functools.lru_cache(maxsize=1024)
def _transposed_window(plan: Plan, phases: tuple[AxisPhase, ...]):
    """(padding, output_padding, dilation) of _phase_conv_transposed's conv_transpose3d, or None."""
    padding, output_padding = [], []
    for p, a in zip(phases, plan.axes):
        pad = p.input_start + (len(p.taps) - 1) * p.input_dilation
        extra = p.out_count - (a.in_size - 1 - 2 * pad + p.input_dilation * (len(p.taps) - 1) + 1)
        if pad < 0 or not 0 <= extra < max(1, p.input_dilation):
            return None
        padding.append(pad)
        output_padding.append(extra)
    return padding, output_padding, [p.input_dilation for p in phases]


# Per device type: fill the whole output once before writing the phases (True), or only the empty regions.
FILL_WHOLE_OUTPUT = collections.defaultdict(lambda: True, cpu=False)


def conv_transpose3d(input, weight, bias, plan: Plan) -> torch.Tensor:
    """input (N, C_in, D, H, W), weight (C_in, C_out/g, kD, kH, kW): validated tensors. On CUDA, a layer's calls after
    one that the CUDA phase correlation served go to its prepared call (_prepared), as the Triton backend's do: the
    full way's checks and lookups cost 0.08-0.11 ms of host time a call on the H200's machine against about 0.04
    (benchmarks/RESULTS.md, fifty-fifth session), and "auto" times this backend by these calls."""
    if input.is_cuda:
        call = prepared_call(input, weight, bias, plan)
        if call is not None:
            return call(input, weight, bias)
    return by_phases(input, weight, bias, plan)


def by_phases(input, weight, bias, plan: Plan) -> torch.Tensor:
    """conv_transpose3d the full way: the phases' plan, its checks and the launches' arguments worked out anew."""
    out = _empty_output(plan.output_shape, input.dtype, input.device, output_memory_format(input, weight, plan))
    # On a GPU one contiguous fill of the whole output, then the phases' results over it, beat filling only the
    # empty regions (strided writes that share memory sectors with the phases' writes): on the H200,
    # problem 77 took 1.30 ms with region fills. On the CPU the region fills were the faster. Triton kernels
    # that wrote the output in one pass, or the lattice rows whole after the fill, measured slower than the
    # fill + strided copy (0.256-1.31 and 0.259-0.262 against 0.234 ms; benchmarks/RESULTS.md, sixth session); with the
    # CUDA correlation, a CUDA pass writing the output once from its compact result made the forward no faster (0.317
    # against 0.315 ms: the pass took 0.176 against the fill's 0.125; thirty-second session, diag_expand.py). Nor did
    # a fill on a second stream beside the correlation, of the planes or rows it does not write (0.44-0.64 ms against
    # 0.316-0.320), or with the correlation writing its lattice planes whole (0.47 against 0.329; thirty-third
    # session, diag_overlap.py and diag_whole_planes.py), or a compact correlation by batch chunks with each chunk's
    # expand on a second stream (0.34-0.68 against 0.311; fifty-third session, diag_pipeline.py), or the fill by
    # batch chunks on a second stream beside each chunk's correlation (0.314-0.545 against 0.311-0.312), or the
    # correlation writing its lattice rows whole, zeros between (0.343 against 0.310; sixty-third session,
    # diag_fill_chunks.py and diag_full_rows.py).
    fill_all = FILL_WHOLE_OUTPUT[out.device.type] and _has_empty_region(plan)
    regions = _regions(plan, fill_all)
    cuda_phases, region = _cuda_phases(input, bias, plan, regions, out, fill_all) if input.is_cuda else (None, None)
    if fill_all and region is None:  # (with a region, the correlation's kernel fills the output itself)
        _fill(out, bias)
    if cuda_phases is not None:
        _cuda_module().write_phases(input, weight, bias, plan, cuda_phases, out, _lattice_geometry, region)
        key = _prepared_key(input, bias, plan)
        if key not in _prepared and contiguous_operands(input, weight, bias) and len(cuda_phases) == len(regions):
            if len(_prepared) >= 256:  # many layers: start over rather than grow without bound
                _prepared.clear()
            _prepared[key] = _prepare(input, weight, bias, plan, cuda_phases, out, fill_all and region is None,
                                      region)
    for index, phases in regions:
        if phases is None:
            _fill(out[index], bias)
        elif cuda_phases is None:
            # The phase's lattice as one as_strided view: indexing with five slices cost 2.7 us on the 2-core CPU
            # against 0.9, host time that a GPU waits through.
            offset, shape, strides = _lattice_geometry(plan, phases, out.stride())
            out.as_strided(shape, strides, offset).copy_(_phase_conv(input, weight, bias, plan, phases))
    return out


# Per layer, dtype, device, precision mode, the CUDA kernels' settings and bias or not, where the CUDA phase
# correlation served a call with contiguous operands: the same call as a function of (input, weight, bias), its
# launches' arguments computed once (_prepare), for later calls (conv_transpose3d's, a module's ops.BoundForward),
# which skip the checks and lookups of by_phases.
_prepared: dict = {}


def _prepared_key(input, bias, plan: Plan):
    # The settings that pick the kernels and their launches (cuda.ENABLED, cuda.SPLIT, cuda.TF32_SPLIT,
    # cuda.DIRECT_INPUT, cuda.REGION_FILL, cuda.DEPENDENT) are part of the key, so that a change to them reaches the
    # next call as it did before calls were prepared.
    cuda = _cuda_module().cuda
    return (plan, input.dtype, input.device, cudnn_allow_tf32(), bias is not None, cuda.ENABLED, cuda.SPLIT,
            cuda.TF32_SPLIT, cuda.DIRECT_INPUT, cuda.REGION_FILL, cuda.DEPENDENT)


def prepared_call(input, weight, bias, plan: Plan):
    """The prepared call (_prepared) of conv_transpose3d(input, weight, bias, plan) in this precision mode, or None
    where there is none (no earlier call by the CUDA phase correlation, a non-contiguous operand). (With none prepared
    the key is not made: it imports the CUDA module, which needs Triton.)"""
    if not _prepared or not contiguous_operands(input, weight, bias):
        return None
    return _prepared.get(_prepared_key(input, bias, plan))


def _prepare(input, weight, bias, plan: Plan, phase_list, out, fill_all: bool, region):
    """conv_transpose3d(input, weight, bias, plan) for later calls with operands laid out as these (contiguous), or
    None where the CUDA module has no prepared write (cuda.phases.prepare_write); fill_all: whether the call fills
    the output first; region: by_phases'. A call whose addresses are not 16-byte aligned, or made while another
    device is current, takes the full way (by_phases)."""
    write = _cuda_module().prepare_write(input, weight, bias, plan, phase_list, out, _lattice_geometry, region)
    if write is None:
        return None
    from .triton.launch import ready_stream

    shape, device = plan.output_shape, input.device.index

    def call(input, weight, bias):
        stream = ready_stream(device)
        x, w, b = input.data_ptr(), weight.data_ptr(), 0 if bias is None else bias.data_ptr()
        if stream is None or (x | w | b) % 16:
            return by_phases(input, weight, bias, plan)
        out = input.new_empty(shape)
        if fill_all:
            _fill(out, bias)
        write(stream, x, w, b, out.data_ptr())
        return out

    return call


def _cuda_phases(input, bias, plan: Plan, regions, out, fill_all: bool):
    """(the phases of regions, the region that the correlation fills itself or None: cuda.phases.region_fill's where
    the output would be filled first, fill_all), where the CUDA phase correlation (backends/cuda) serves them all and
    its kernels for this input and bias compile, else (None, None) (cuDNN): on
    the H200 problem 77's forward took 0.340-0.342 ms with it against 0.441 with cuDNN, whose result is then copied
    into the output's lattice (twelfth session); with TF32 off (3xTF32) 0.593 against 0.935 (benchmarks/RESULTS.md,
    fourteenth session)."""
    phase_list = tuple(phases for _, phases in regions if phases is not None)
    unusable = triton_unusable()
    if unusable is not None:  # (the CUDA correlation's operands come from a Triton pass: backends/cuda/phases.py)
        _log_once("forward", plan, unusable)
        return None, None
    module = _cuda_module()
    reason = module.forward_unsupported(plan, phase_list, input.device, input.dtype, cudnn_allow_tf32())
    region = module.region_fill(plan, phase_list, out.stride()) if fill_all and reason is None else None
    if region is not None:
        region_reason = module.forward_kernels_unsupported(input, bias, plan, phase_list, region)
        if region_reason is None:
            return phase_list, region
        _log_once("the output's fill (REGION_FILL)", plan, region_reason, "a fill before the correlation")
        region = None
    reason = reason or module.forward_kernels_unsupported(input, bias, plan, phase_list)
    if reason is not None:
        _log_once("forward", plan, reason)
        return None, None
    return phase_list, region


@functools.lru_cache(maxsize=1)
def _cuda_module():
    """backends/cuda/phases.py, imported on first use (it imports Triton) and then kept: an import statement per call
    costs host time that the GPU waits through (ops._triton_phase_backward)."""
    from .cuda import phases

    return phases


@functools.lru_cache(maxsize=256)
def _log_once(what: str, plan: Plan, reason: str, fallback: str = "cuDNN") -> None:
    logger.debug("convt3d: %s of %s by %s, not the CUDA kernel: %s", what, plan.key, fallback, reason)


@functools.lru_cache(maxsize=1024)
def _lattice_geometry(plan: Plan, phases, strides):
    """(offset, shape, strides) of the phases' lattice in an output of these strides (storage offset 0)."""
    offset = sum(p.out_start * stride for p, stride in zip(phases, strides[2:]))
    shape = (plan.batch, plan.out_channels, *(p.out_count for p in phases))
    return offset, shape, (*strides[:2], *(a.stride * stride for a, stride in zip(plan.axes, strides[2:])))


# The geometry below is computed once per layer (plans are immutable and hashable): on a GPU the Python time of
# each call shows wherever the kernels are short.
@functools.lru_cache(maxsize=256)
def _has_empty_region(plan: Plan) -> bool:
    return any(not p.reads_input(a.in_size) for a in plan.axes for p in a.phases if p.out_count)


@functools.lru_cache(maxsize=256)
def _regions(plan: Plan, fill_all: bool) -> tuple:
    """The output's regions in writing order: (index, phases) for each phase some tap reaches, and (index, None)
    for each empty region to fill unless the whole output was filled first; where a depth or height phase is
    empty, its whole planes or rows are one region (large contiguous fills are far cheaper than strided ones)."""
    regions = []
    axis_d, axis_h, axis_w = plan.axes
    everything = (slice(None), slice(None))
    for pd in axis_d.phases:
        if pd.out_count == 0:
            continue
        sd = _out_slice(pd, axis_d)
        if not pd.reads_input(axis_d.in_size):
            if not fill_all:
                regions.append(((*everything, sd), None))
            continue
        for ph in axis_h.phases:
            if ph.out_count == 0:
                continue
            sh = _out_slice(ph, axis_h)
            if not ph.reads_input(axis_h.in_size):
                if not fill_all:
                    regions.append(((*everything, sd, sh), None))
                continue
            for pw in axis_w.phases:
                if pw.out_count == 0:
                    continue
                index = (*everything, sd, sh, _out_slice(pw, axis_w))
                if pw.reads_input(axis_w.in_size):
                    regions.append((index, (pd, ph, pw)))
                elif not fill_all:
                    regions.append((index, None))
    return tuple(regions)


@functools.lru_cache(maxsize=256)
def _backward_phases(plan: Plan) -> tuple:
    """(phases, index of their lattice in grad_output) for each phase some tap reaches."""
    return tuple((phases, (slice(None), slice(None), *(_out_slice(p, a) for p, a in zip(phases, plan.axes))))
                 for phases in itertools.product(*(a.phases for a in plan.axes))
                 if all(p.reads_input(a.in_size) for p, a in zip(phases, plan.axes)))


def conv_transpose3d_backward(grad_output, input, weight, plan: Plan, need_input: bool = True,
                              need_weight: bool = True, phase_backward=None):
    """(grad_input, grad_weight) by the same decomposition, each None where not needed.

    Each phase some tap reaches is the stride-1 correlation y_phase = conv3d(x_phase, w_phase) of the forward,
    so its gradients are those of an ordinary convolution on the phase's compact grid of grad_output: no
    strided convolution over the positions no tap reaches. grad_input is the sum over phases; every kernel tap
    belongs to exactly one phase, so grad_weight is assembled from disjoint slices (taps that reach no phase
    get zero).

    phase_backward(grad_output, index, input, weight, plan, phases, need_input, need_weight) gives one phase's
    parts from grad_output[index], grad_output's lattice of that phase: (its part of grad_input, or None; its slice
    weight[_tap_index(phases)] of grad_weight, (C_in, C_out/g, the phase's taps in ascending order), or None).
    By default aten operations only (aten_phase_backward), which torch.compile traces; on CUDA the Triton one
    (backends/triton/backward.py), inside the op convt3d::conv_transpose3d_backward (ops.py). Phase by phase, so
    that each phase's copies are freed before the next phase's are made.
    """
    phase_backward = aten_phase_backward if phase_backward is None else phase_backward
    grad_input, weight_parts = None, []
    for phases, index in _backward_phases(plan):
        part_input, part_weight = phase_backward(grad_output, index, input, weight, plan, phases, need_input,
                                                 need_weight)
        if part_input is not None:
            grad_input = part_input if grad_input is None else grad_input.add_(part_input)
        if part_weight is not None:
            weight_parts.append((_tap_index(phases), part_weight))
    if need_input and grad_input is None:  # no tap reaches any input: the output does not depend on it
        grad_input = weight.new_zeros((plan.batch, plan.in_channels, *plan.input_spatial))
    return grad_input, (_assemble_grad_weight(weight, weight_parts) if need_weight else None)


def aten_phase_backward(grad_output, index, input, weight, plan: Plan, phases, need_input: bool, need_weight: bool):
    """One phase's parts of the gradients (as conv_transpose3d_backward's phase_backward) by aten operations."""
    lattice = grad_output[index]
    part_input = phase_grad_input(lattice, weight, plan, phases) if need_input else None
    part_weight = None
    if need_weight:
        x, padding = _padded_operand(input, _input_pads(plan, phases))
        operands = (lattice, x, _phase_weight(weight, phases, plan.groups))
        if _in_float32(x):
            operands = tuple(t.float() for t in operands)
        _, part, _ = torch.ops.aten.convolution_backward(
            *operands, None, [1, 1, 1], list(padding), [p.input_dilation for p in phases], False, [0, 0, 0],
            plan.groups, [False, True, False])
        part = part.to(weight.dtype)
        # (groups * C_out/g, C_in/g, taps...) in flipped tap order -> the weight's (C_in, C_out/g, taps...).
        cout_g = plan.out_channels // plan.groups
        part = part.reshape(plan.groups, cout_g, -1, *part.shape[2:]).transpose(1, 2)
        part_weight = part.reshape(plan.in_channels, cout_g, *part.shape[3:]).flip(2, 3, 4)
    return part_input, part_weight


def _assemble_grad_weight(weight, weight_parts) -> torch.Tensor:
    """grad_weight from (index of the weight's taps, that slice of grad_weight) for each phase some tap reaches."""
    if len(weight_parts) == 1 and weight_parts[0][1].shape == weight.shape:
        return weight_parts[0][1]  # one phase has every tap (problem 77): no fill, no copy
    grad_weight = torch.zeros_like(weight, memory_format=torch.contiguous_format)
    for index, part in weight_parts:  # disjoint slices; taps that reach no phase keep zero
        grad_weight[index] = part
    return grad_weight


@functools.lru_cache(maxsize=1024)
def _tap_index(phases) -> tuple[slice, ...]:
    """Index of a weight (C_in, C_out/g, kD, kH, kW) to the taps of the given axis phases, ascending. Each
    phase's taps are an arithmetic progression (stored descending), so slices do: no index tensors."""
    def ascending(phase: AxisPhase) -> slice:
        step = phase.taps[0] - phase.taps[1] if len(phase.taps) > 1 else 1
        return slice(phase.taps[-1], phase.taps[0] + 1, step)

    return (slice(None), slice(None), *(ascending(p) for p in phases))


@functools.lru_cache(maxsize=1024)
def _grad_input_pads(plan: Plan, phases) -> tuple[tuple[int, int], ...]:
    """(left, right) padding of a phase's lattice of grad_output (negative crops) for its part of grad_input."""
    pads = []
    for p, a in zip(phases, plan.axes):
        start = -p.input_start - (len(p.taps) - 1) * p.input_dilation
        span = a.in_size + (len(p.taps) - 1) * p.input_dilation
        pads.append((-start, start + span - p.out_count))
    return tuple(pads)


@functools.lru_cache(maxsize=1024)
def _input_pads(plan: Plan, phases) -> tuple[tuple[int, int], ...]:
    """(left, right) padding of the input (negative crops) that gives exactly a phase's window."""
    return tuple(_pads(p, a.in_size) for p, a in zip(phases, plan.axes))


def phase_grad_input(g, weight, plan: Plan, phases) -> torch.Tensor:
    """One phase's part of grad_input from g, grad_output's lattice of the phase: output j of the phase reads input
    input_start + j + k*dilation for its k-th (flipped) tap, so input i receives grad_output j = i - input_start -
    k*dilation: a correlation of the padded compact grid with the taps in ascending order."""
    w = _taps(weight, phases, descending=False)
    pads, padding, dilation = _grad_input_conv(plan, phases)
    if pads is not None:
        g = _pad(g, pads)
    return _conv3d(g, w, None, padding, dilation, plan.groups)


@functools.lru_cache(maxsize=1024)
def _grad_input_conv(plan: Plan, phases):
    """(pads of a copy of the lattice or None, conv3d's padding, its dilation) for phase_grad_input (_conv_padding
    once per layer)."""
    return (*_conv_padding(_grad_input_pads(plan, phases)), tuple(p.input_dilation for p in phases))
