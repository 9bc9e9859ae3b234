"""Geometry of a 3D transposed convolution: output shape and phase decomposition.

Pure Python, no tensors: every backend consumes the same plan.

Along one spatial axis an input index i and a kernel tap t reach output index

    o = i*s - p + t*d.

Split the outputs by phase r = (o + p) mod s. Tap t reaches phase r exactly when
t*d = r (mod s); writing t*d - r = s*m_t, output o = s*q + r - p reads input
i = q - m_t. So within a phase the transposed convolution is an ordinary stride-1
correlation over the compact grid q with the flipped taps that reach it, whose
input offsets m_t step by d/gcd(s, d). A 3D plan is the product of three 1D plans.
"""

from __future__ import annotations

import functools
import itertools
import math
import operator
from dataclasses import dataclass
from typing import Sequence, Union

IntOrTriple = Union[int, Sequence[int]]

_AXES = ("depth", "height", "width")


def triple(value: IntOrTriple, name: str) -> tuple[int, int, int]:
    """Normalise an int or a length-3 sequence of ints to a 3-tuple of Python ints, naming `name` on error. An int
    is anything PyTorch's convolutions take for one, through __index__ (numpy's integers, a one-element integer
    tensor), but a bool."""
    if isinstance(value, (tuple, list)):
        if len(value) != 3:
            raise ValueError(f"{name} must be an int or a tuple of 3 ints, got {len(value)} values: {tuple(value)!r}")
        try:
            return tuple(integer(v) for v in value)  # type: ignore[return-value]
        except TypeError:
            raise TypeError(f"{name} must be an int or a tuple of 3 ints, got {tuple(value)!r}") from None
    try:
        single = integer(value)
    except TypeError:
        shown = repr(value) if isinstance(value, bool) else type(value).__name__
        raise TypeError(f"{name} must be an int or a tuple of 3 ints, got {shown}") from None
    return (single, single, single)


def single_int(value, name: str) -> int:
    """value as a Python int (as integer), naming `name` on error."""
    try:
        return integer(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__}") from None


def integer(value) -> int:
    """value as a Python int where PyTorch takes it for one (operator.index), a bool aside; else TypeError."""
    if isinstance(value, bool):
        raise TypeError(f"a bool is not taken for an int: {value!r}")
    return value if type(value) is int else operator.index(value)


@dataclass(frozen=True)
class AxisPhase:
    """One output phase along one axis.

    Outputs o = out_start + stride*j for j in [0, out_count). Each reads, for the
    k-th entry of `taps` (kernel tap indices, descending, i.e. flipped), the input
    index input_start + j + k*input_dilation.
    """

    residue: int
    out_start: int
    out_count: int
    taps: tuple[int, ...]
    input_start: int
    input_dilation: int

    def __hash__(self) -> int:
        # Computed once: per-phase caches are looked up on every call, and the generated hash walks every field.
        return self._hash

    @functools.cached_property
    def _hash(self) -> int:
        return hash((self.residue, self.out_start, self.out_count, self.taps, self.input_start, self.input_dilation))

    @property
    def input_span(self) -> int:
        """Number of input positions the correlation window covers (padding included)."""
        return self.out_count + self.input_dilation * (len(self.taps) - 1) if self.taps else 0

    def reads_input(self, in_size: int) -> bool:
        """True when at least one tap of this phase lands inside [0, in_size) for some output."""
        if not self.taps or self.out_count == 0:
            return False
        return self.input_start < in_size and self.input_start + self.input_span > 0


@dataclass(frozen=True)
class AxisPlan:
    in_size: int
    out_size: int
    kernel: int
    stride: int
    padding: int
    dilation: int
    phases: tuple[AxisPhase, ...]


def plan_axis(in_size: int, kernel: int, stride: int, padding: int, dilation: int, output_padding: int) -> AxisPlan:
    out_size = (in_size - 1) * stride - 2 * padding + dilation * (kernel - 1) + output_padding + 1
    tap_step = stride // math.gcd(stride, dilation)  # consecutive taps of one phase differ by this
    phases = []
    for r in range(stride):
        taps_up = [t for t in range(kernel) if (t * dilation) % stride == r]
        # Outputs of this phase: o = s*q + r - p with 0 <= o < out_size.
        q_lo = -((r - padding) // stride)  # ceil((p - r) / s)
        q_hi = (out_size - 1 + padding - r) // stride + 1
        count = max(0, q_hi - q_lo)
        if taps_up:
            m_last = (taps_up[-1] * dilation - r) // stride
            input_start = q_lo - m_last
            input_dilation = (tap_step * dilation) // stride
        else:
            input_start, input_dilation = 0, 1
        phases.append(
            AxisPhase(
                residue=r,
                out_start=stride * q_lo + r - padding,
                out_count=count,
                taps=tuple(reversed(taps_up)),
                input_start=input_start,
                input_dilation=input_dilation,
            )
        )
    return AxisPlan(in_size, out_size, kernel, stride, padding, dilation, tuple(phases))


@dataclass(frozen=True)
class Phase:
    """One 3D output phase: the product of one phase per axis."""

    axes: tuple[AxisPhase, AxisPhase, AxisPhase]
    reads_input: bool

    @property
    def out_count(self) -> int:
        return math.prod(a.out_count for a in self.axes)


@dataclass(frozen=True)
class Plan:
    batch: int
    in_channels: int
    out_channels: int
    groups: int
    input_spatial: tuple[int, int, int]
    kernel_size: tuple[int, int, int]
    stride: tuple[int, int, int]
    padding: tuple[int, int, int]
    output_padding: tuple[int, int, int]
    dilation: tuple[int, int, int]
    axes: tuple[AxisPlan, AxisPlan, AxisPlan]

    @functools.cached_property
    def key(self) -> tuple[int, ...]:
        """Every number that defines the plan, flat: a cheap key for caches (hashing the dataclass is not)."""
        return (self.batch, self.in_channels, self.out_channels, self.groups, *self.input_spatial, *self.kernel_size,
                *self.stride, *self.padding, *self.output_padding, *self.dilation)

    def __hash__(self) -> int:
        # The key defines the plan, so equal plans hash alike. The generated hash walked the nested axis plans and
        # phases on every lookup of a per-plan cache, some 50 hashes per forward+backward call, whose host time
        # shows on a GPU (benchmarks/RESULTS.md, fifth session). Computed once, as AxisPhase's.
        return self._hash

    @functools.cached_property
    def _hash(self) -> int:
        return hash(self.key)

    @functools.cached_property
    def output_spatial(self) -> tuple[int, int, int]:
        return tuple(a.out_size for a in self.axes)  # type: ignore[return-value]

    @functools.cached_property
    def output_shape(self) -> tuple[int, ...]:
        return (self.batch, self.out_channels, *self.output_spatial)

    @property
    def phases(self) -> tuple[Phase, ...]:
        result = []
        for pd, ph, pw in itertools.product(*(a.phases for a in self.axes)):
            reads = all(p.reads_input(a.in_size) for p, a in zip((pd, ph, pw), self.axes))
            result.append(Phase((pd, ph, pw), reads))
        return tuple(result)

    @property
    def nonempty_phases(self) -> tuple[Phase, ...]:
        return tuple(p for p in self.phases if p.reads_input)

    @property
    def empty_fraction(self) -> float:
        """Fraction of output elements that no kernel tap reaches (bias or zero only)."""
        total = math.prod(self.output_spatial)
        return 1.0 - sum(p.out_count for p in self.nonempty_phases) / total

    @property
    def flops(self) -> int:
        """Useful multiply-adds times two: every (output, tap) pair whose input is inside."""
        per_axis = []
        for a in self.axes:
            pairs = 0
            for ph in a.phases:
                for k in range(len(ph.taps)):
                    first = ph.input_start + k * ph.input_dilation
                    lo, hi = max(0, first), min(a.in_size, first + ph.out_count)
                    pairs += max(0, hi - lo)
            per_axis.append(pairs)
        cin_per_group = self.in_channels // self.groups
        return 2 * self.batch * self.out_channels * cin_per_group * math.prod(per_axis)


def make_plan(
    input_shape: Sequence[int],
    weight_shape: Sequence[int],
    stride: IntOrTriple = 1,
    padding: IntOrTriple = 0,
    output_padding: IntOrTriple = 0,
    groups: int = 1,
    dilation: IntOrTriple = 1,
) -> Plan:
    """Validate the geometry and build the plan. `input_shape` is (N, C, D, H, W)."""
    stride = triple(stride, "stride")
    padding = triple(padding, "padding")
    output_padding = triple(output_padding, "output_padding")
    dilation = triple(dilation, "dilation")
    groups = single_int(groups, "groups")
    if len(input_shape) != 5:
        raise ValueError(f"input must have shape (N, C, D, H, W), got {tuple(input_shape)}")
    if len(weight_shape) != 5:
        raise ValueError(f"weight must have shape (C_in, C_out/groups, kD, kH, kW), got {tuple(weight_shape)}")
    batch, in_channels, *spatial = input_shape
    w_in, w_out_per_group, *kernel = weight_shape
    if any(s < 1 for s in stride):
        raise ValueError(f"stride must be >= 1 along every axis, got {stride}")
    if any(d < 1 for d in dilation):
        raise ValueError(f"dilation must be >= 1 along every axis, got {dilation}")
    if any(p < 0 for p in padding):
        raise ValueError(f"padding must be >= 0 along every axis, got {padding}")
    if any(op < 0 for op in output_padding):
        raise ValueError(f"output_padding must be >= 0 along every axis, got {output_padding}")
    for axis, op, s, d in zip(_AXES, output_padding, stride, dilation):
        if op >= s and op >= d:
            raise ValueError(
                f"output_padding must be smaller than either stride or dilation, got output_padding={output_padding}, "
                f"stride={stride}, dilation={dilation} ({axis})"
            )
    if groups < 1:
        raise ValueError(f"groups must be >= 1, got {groups}")
    if any(k < 1 for k in kernel):
        raise ValueError(f"weight's kernel size must be >= 1 along every axis, got {tuple(kernel)}")
    if in_channels < 1:
        raise ValueError(f"input must have at least one channel, got shape {tuple(input_shape)}")
    if in_channels % groups != 0:
        raise ValueError(f"groups={groups} must divide the input channels {in_channels}")
    if w_in != in_channels:
        raise ValueError(
            f"weight's first dimension must equal the input channels: weight has {w_in}, input has {in_channels} "
            f"(weight is (C_in, C_out/groups, kD, kH, kW))"
        )
    if w_out_per_group < 1:
        raise ValueError(f"weight's second dimension (C_out/groups) must be >= 1, got {w_out_per_group}")
    if any(n < 1 for n in spatial):
        raise ValueError(f"input's spatial size must be >= 1 along every axis, got {tuple(spatial)}")
    axes = tuple(
        plan_axis(n, k, s, p, d, op)
        for n, k, s, p, d, op in zip(spatial, kernel, stride, padding, dilation, output_padding)
    )
    if any(a.out_size < 1 for a in axes):
        raise ValueError(
            f"output size {tuple(a.out_size for a in axes)} is not positive: padding={padding} is too large for "
            f"input size {tuple(spatial)}, kernel {tuple(kernel)}, stride={stride}, dilation={dilation}"
        )
    return Plan(
        batch=batch,
        in_channels=in_channels,
        out_channels=w_out_per_group * groups,
        groups=groups,
        input_spatial=tuple(spatial),
        kernel_size=tuple(kernel),
        stride=stride,
        padding=padding,
        output_padding=output_padding,
        dilation=dilation,
        axes=axes,  # type: ignore[arg-type]
    )


def output_padding_for_size(
    input_shape: Sequence[int],
    output_size: Sequence[int],
    kernel_size: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
) -> tuple[int, int, int]:
    """output_padding that makes the output spatial size `output_size` (ConvTranspose3d.forward(output_size=...)).

    As in PyTorch, output_size holds the 3 spatial sizes, or as many sizes as the input has dimensions.
    """
    output_size = list(output_size)
    if len(output_size) not in (3, len(input_shape)):
        raise ValueError(
            f"output_size must have 3 or {len(input_shape)} elements for {len(input_shape)}-D input, got {output_size}"
        )
    output_size, input_spatial = output_size[-3:], input_shape[-3:]
    result = []
    for axis, n, want, k, s, p, d in zip(_AXES, input_spatial, output_size, kernel_size, stride, padding, dilation):
        smallest = (n - 1) * s - 2 * p + d * (k - 1) + 1
        if not smallest <= want < smallest + s:
            raise ValueError(
                f"output_size {axis} must be in [{smallest}, {smallest + s - 1}] for this input and layer, got {want}"
            )
        result.append(want - smallest)
    return tuple(result)  # type: ignore[return-value]
