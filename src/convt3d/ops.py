"""The operator torch.ops.convt3d.conv_transpose3d: registration, fake impl and autograd.

Registering through torch.library lets torch.compile(fullgraph=True) trace models that use
convt3d without a graph break, and gives the op a fake (meta) implementation for shape
propagation. The backward is made of traceable aten ops: cuDNN's strided convolution_backward
on CUDA, the phase decomposition (stride-1 convolutions on each phase's compact grid)
elsewhere; no fused Triton backward yet.
"""

from __future__ import annotations

import functools
from typing import Optional, Sequence

import torch

from .plan import Plan, make_plan


@functools.lru_cache(maxsize=256)
def cached_plan(input_shape, weight_shape, stride, padding, output_padding, groups, dilation) -> Plan:
    return make_plan(input_shape, weight_shape, stride, padding, output_padding, groups, dilation)


def _plan_of(input, weight, stride, padding, output_padding, groups, dilation) -> Plan:
    return cached_plan(tuple(input.shape), tuple(weight.shape), tuple(stride), tuple(padding),
                       tuple(output_padding), groups, tuple(dilation))


def _forward(input, weight, bias, plan: Plan, backend: str) -> torch.Tensor:
    from .functional import choose_backend, run_backend

    if backend == "auto":
        backend = choose_backend(input, weight, bias, plan)
    return run_backend(backend, input, weight, bias, plan)


@torch.library.custom_op("convt3d::conv_transpose3d", mutates_args=())
def conv_transpose3d_op(
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],
    stride: Sequence[int],
    padding: Sequence[int],
    output_padding: Sequence[int],
    groups: int,
    dilation: Sequence[int],
    backend: str,
) -> torch.Tensor:
    plan = _plan_of(input, weight, stride, padding, output_padding, groups, dilation)
    return _forward(input, weight, bias, plan, backend)


@conv_transpose3d_op.register_fake
def _(input, weight, bias, stride, padding, output_padding, groups, dilation, backend):
    plan = _plan_of(input, weight, stride, padding, output_padding, groups, dilation)
    return input.new_empty(plan.output_shape)


def _setup_context(ctx, inputs, output):
    input, weight, bias, stride, padding, output_padding, groups, dilation, _ = inputs
    ctx.save_for_backward(input, weight)
    ctx.has_bias = bias is not None
    ctx.params = (list(stride), list(padding), list(output_padding), groups, list(dilation))


def _backward(ctx, grad_output):
    input, weight = ctx.saved_tensors
    stride, padding, output_padding, groups, dilation = ctx.params
    need_input, need_weight, need_bias = ctx.needs_input_grad[:3]
    if grad_output.device.type == "cuda":
        # cuDNN's strided backward: on the H200 it beat the phase decomposition on problem 77 (1.80 ms against
        # 2.69 ms for both gradients; benchmarks/diag_p77.py).
        grad_input, grad_weight, _ = torch.ops.aten.convolution_backward(
            grad_output, input, weight, None, stride, padding, dilation, True, output_padding, groups,
            [need_input, need_weight, False])
    else:
        # The phase decomposition: on a 2-core CPU, problem 77 at batch 2, grad_input 3.8-8.3x and grad_weight
        # 2.8x faster than aten's (benchmarks/RESULTS.md).
        from .backends.torch_phase import conv_transpose3d_backward

        plan = _plan_of(input, weight, stride, padding, output_padding, groups, dilation)
        grad_input, grad_weight = conv_transpose3d_backward(grad_output, input, weight, plan, need_input,
                                                            need_weight)
    grad_bias = grad_output.sum(dim=(0, 2, 3, 4)) if ctx.has_bias and need_bias else None
    return grad_input, grad_weight, grad_bias, None, None, None, None, None, None


conv_transpose3d_op.register_autograd(_backward, setup_context=_setup_context)


def apply(input: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], plan: Plan, backend: str):
    """Run a validated batched call: through the registered op where autograd or torch.compile needs it,
    else directly (the op's dispatch costs tens of microseconds, as much as a small layer's kernel)."""
    needs_grad = torch.is_grad_enabled() and (
        input.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad))
    if not needs_grad and not torch.compiler.is_compiling():
        return _forward(input, weight, bias, plan, backend)
    return conv_transpose3d_op(
        input, weight, bias, list(plan.stride), list(plan.padding), list(plan.output_padding), plan.groups,
        list(plan.dilation), backend,
    )
