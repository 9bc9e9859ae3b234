"""Fused Triton forward. Triton is imported only when this backend is used."""

from __future__ import annotations

import functools
import math
import os
import re

import torch

from ...plan import Plan
from .. import contiguous_operands, cudnn_allow_tf32

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# The GEMMs' precision modes: the operands' own type (half precision), TF32, and 3xTF32 (float32 accuracy).
NATIVE, TF32, TF32X3 = 0, 1, 2


# Host-side sizes for the launchers. triton.cdiv and triton.next_power_of_2 are constexpr functions whose every
# call goes through Triton's wrapper (about 1.5-3 us each; a weight gradient made 13 such calls per backward).
def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def power_of_2_at_most(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


def interpreted() -> bool:
    """Whether Triton kernels run in its interpreter (TRITON_INTERPRET=1: on the CPU, as CI tests them), as Triton
    itself reads the variable when triton.jit decorates a kernel: since Triton 3.4 through its knobs, which also take
    true, on and yes; before that only "1"."""
    knobs = _triton_knobs()
    if knobs is None:
        return os.environ.get("TRITON_INTERPRET", "0") == "1"
    return bool(knobs.runtime.interpret)


@functools.lru_cache(maxsize=1)
def _triton_knobs():
    try:
        from triton import knobs
    except ImportError:  # no Triton, or one before 3.4
        return None
    return knobs if hasattr(getattr(knobs, "runtime", None), "interpret") else None


# The oldest Triton that convt3d's kernels run on. Seen on the CPU (seventy-fifth session, each with the PyTorch it
# installs with): Triton 3.5 (torch 2.9) compiles every kernel for sm_90 (tests/test_triton_compile.py); Triton 3.4
# (torch 2.8) fails there, its gdc_wait called with an argument it does not take; 3.3 (torch 2.7) lacks the grid
# dependency control the kernels name, and its interpreter, though it runs them, says nothing of the GPU; 3.2 (torch
# 2.6) lacks tl.gather (tap_columns.py); 3.0 (torch 2.4) the cooperative launch (tensor_scaled.py) too.
OLDEST_TRITON = (3, 5)


@functools.lru_cache(maxsize=1)
def triton_unusable() -> str | None:
    """None where convt3d's Triton kernels may run (Triton installed, OLDEST_TRITON or later), else why not. Where
    not, the paths without them serve: the portable phase decomposition and cuDNN."""
    try:
        import triton
    except ImportError:
        return "triton is not installed"
    version = tuple(int(part) for part in re.findall(r"\d+", triton.__version__)[:2])
    if version < OLDEST_TRITON:
        oldest = ".".join(map(str, OLDEST_TRITON))
        return f"Triton {triton.__version__} is older than {oldest}, the oldest that convt3d's Triton kernels run on"
    return None


def triton_available() -> bool:
    """Whether convt3d's Triton kernels may run here (triton_unusable)."""
    return triton_unusable() is None


def unsupported_reason(input: torch.Tensor, plan: Plan):
    """None when the Triton kernel can serve this call, else a short reason."""
    unusable = triton_unusable()
    if unusable is not None:
        return unusable
    if input.device.type != "cuda" and not interpreted():
        return f"device {input.device.type} needs TRITON_INTERPRET=1"
    if interpreted() and not _interpreter_runs_loops():
        return ("Triton's interpreter here cannot run a loop bounded by a kernel argument (seen with Triton 3.6 and "
                "NumPy 2.4.6 or 2.5.2; Triton 3.9, or NumPy 2.3.5, runs them)")
    if input.dtype not in SUPPORTED_DTYPES:
        return f"dtype {input.dtype} (supported: float32, float16, bfloat16)"
    return _too_large(plan)


@functools.lru_cache(maxsize=1)
def _interpreter_runs_loops() -> bool:
    from .probe import interpreter_runs_loops  # (a kernel of its own: imports Triton, runs once)

    return interpreter_runs_loops()


@functools.lru_cache(maxsize=256)
def _too_large(plan: Plan):
    # Offsets inside one sample (and inside the weight) are 32-bit; sample and channel-group bases are 64-bit.
    sample_in = plan.in_channels * math.prod(plan.input_spatial)
    sample_out = plan.out_channels * math.prod(plan.output_spatial)
    if max(sample_in, sample_out, plan.in_channels * plan.out_channels // plan.groups
           * math.prod(plan.kernel_size)) >= 2**31:
        return "one sample of the input or output, or the weight, has 2**31 elements or more"
    return None


# How a main kernel follows its operand pass on Hopper and later: "early" (launched as the pass's dependent, which
# lets it start as soon as the pass's last programs run), "wait" (launched as its dependent, starting as the pass
# ends), "off" (an ordinary launch). benchmarks/diag_dependent_launch.py sets it to compare them.
dependent_launch_mode = "early"


def dependent_launch(device_index: int) -> bool:
    """Whether a main kernel on this CUDA device is launched as the operand pass's dependent (programmatic dependent
    launch): it may start while the pass still runs, and waits for the pass's writes (forward.wait_for_previous)
    before it reads or writes memory, so that only its launch and setup overlap the pass."""
    return dependent_launch_mode != "off" and _can_launch_dependents(device_index)


def pass_lets_main_start(device) -> bool:
    """Whether the operand pass on this device lets the main kernel start as its last programs run
    (forward.let_next_start)."""
    return device.type == "cuda" and dependent_launch_mode == "early" and _can_launch_dependents(device.index)


@functools.lru_cache(maxsize=None)
def _can_launch_dependents(device_index: int) -> bool:
    # Grid dependency control is Hopper's (sm_90) and later; the interpreter runs no PTX.
    if interpreted() or not torch.cuda.is_available():
        return False
    try:
        from triton.language.extra.cuda import gdc_wait  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.get_device_capability(device_index)[0] >= 9


def precision_for(dtype: torch.dtype) -> int:
    """PyTorch's rule for convolutions: TF32 when torch.backends.cudnn.allow_tf32, else full float32."""
    if dtype != torch.float32:
        return NATIVE
    return TF32 if cudnn_allow_tf32() else TF32X3


# Per layer, dtype, device, precision and bias or not: the call with contiguous input and weight as the kernel module
# bound it after its first such call (its prepare()), so that later calls skip the checks, lookups and layout
# arithmetic between the entry and the launches: host time, which the GPU waits through on small layers.
_prepared: dict = {}


def conv_transpose3d(input, weight, bias, plan: Plan, precision: int | None = None):
    """The layer by the tiled GEMM where it applies, else by the general fused kernel. precision None follows
    PyTorch's flags (precision_for); TF32X3 asks for float32 accuracy whatever they say."""
    precision = precision_for(input.dtype) if precision is None else precision
    if bias is not None and not bias.is_contiguous():
        bias = bias.contiguous()  # the kernels read bias[c] at c elements from its start
    contiguous = input.is_contiguous() and weight.is_contiguous()
    if contiguous:
        key = _prepared_key(input, bias, plan, precision)
        call = _prepared.get(key)
        if call is not None:
            return call(input, weight, bias)
    reason = unsupported_reason(input, plan)
    if reason is not None:
        raise RuntimeError(f"convt3d: backend='triton' cannot run this call: {reason}")
    forward, tiled = _kernel_modules()
    if tiled.unsupported_reason(plan) is None:  # kernel == stride: one GEMM, no phases
        module, out = tiled, tiled.conv_transpose3d_tiled(input, weight, bias, plan, precision)
    else:
        module, out = forward, forward.conv_transpose3d_triton(input, weight, bias, plan, precision)
    if contiguous and out.numel() and plan.in_channels:
        call = module.prepare(input, weight, bias, plan, precision, out)
        if call is not None:
            if len(_prepared) >= 256:  # many layers: start over rather than grow without bound
                _prepared.clear()
            _prepared[key] = call
    return out


def _prepared_key(input, bias, plan: Plan, precision: int):
    return plan, input.dtype, input.device, precision, bias is not None


def prepared_call(input, weight, bias, plan: Plan, precision: int | None = None):
    """The prepared call (_prepared) that conv_transpose3d(input, weight, bias, plan, precision) would run now, or
    None where it would take another way (a first call, a non-contiguous operand)."""
    if not contiguous_operands(input, weight, bias):
        return None
    precision = precision_for(input.dtype) if precision is None else precision
    return _prepared.get(_prepared_key(input, bias, plan, precision))


@functools.lru_cache(maxsize=1)
def _kernel_modules():
    """The forward kernels' modules, imported on first use (Triton stays out of import time), then kept: import
    statements on every call cost host time that a GPU waits through."""
    from . import forward, tiled

    return forward, tiled
