"""The operator torch.ops.convt3d.conv_transpose3d: registration, fake impl and autograd.

Registering through torch.library lets torch.compile(fullgraph=True) trace models that use
convt3d without a graph break, and gives the op a fake (meta) implementation for shape
propagation. The backward uses the phase decomposition (stride-1 convolutions on each phase's compact grid):
on CUDA, for layers where no tap reaches most of the output, grad_input on each phase by the CUDA phase
correlation (backends/cuda) or cuDNN and grad_weight by a Triton kernel, inside the op
convt3d::conv_transpose3d_backward so that torch.compile traces it as one call; other CUDA layers take cuDNN's
strided convolution_backward;
off CUDA, aten ops only; where the backward is itself differentiated (create_graph=True, torch.func), the
differentiable aten path everywhere. Eager calls that need autograd run the forward with grad mode off, then
record a plain autograd.Function's node with the same gradients (under torch.func's transforms, a setup_context
twin that computes in its forward), except on CUDA where eager's kernel runs the forward and aten's own backward
would serve: PyTorch's autograd records that call itself. The op's Python dispatch is for torch.compile (and
torch.export) and torch.jit.trace; torch.onnx.export records PyTorch's own op instead, which ONNX has as
ConvTranspose. CUDA tensors on another GPU than the current one run under that GPU (Triton launches on the current
device). A module's later calls like one that a prepared call served (the Triton backend's, or the CUDA phase
correlation's) go straight to that call (BoundForward, bind_forward).
"""

# (No `from __future__ import annotations` here: torch.library.custom_op reads the ops' annotations as types, and in
# torch 2.4 its schema inference rejects them as strings, so that `import convt3d` failed there.)
import functools
import sys
import weakref
from typing import Optional, Sequence

import torch

from .backends import cudnn_allow_tf32, current_cuda_device, output_memory_format, torch_phase
from .plan import Plan, make_plan


# typed: groups reaches the cache unchecked, and True == 1.0 == 1 would otherwise share the plan of groups=1.
@functools.lru_cache(maxsize=256, typed=True)
def cached_plan(input_shape, weight_shape, stride, padding, output_padding, groups, dilation) -> Plan:
    return make_plan(input_shape, weight_shape, stride, padding, output_padding, groups, dilation)


def _plan_of(input, weight, stride, padding, output_padding, groups, dilation) -> Plan:
    if _symbolic(input, weight):  # SymInts do not hash: a plan of its own, for the fake implementation's shape
        return make_plan(tuple(input.shape), tuple(weight.shape), tuple(stride), tuple(padding),
                         tuple(output_padding), groups, tuple(dilation))
    return cached_plan(tuple(input.shape), tuple(weight.shape), tuple(stride), tuple(padding),
                       tuple(output_padding), groups, tuple(dilation))


def _symbolic(input: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether a size is symbolic: torch.compile traces with dynamic shapes (as it does by itself once a compiled
    call meets a second shape)."""
    return not all(type(n) is int for n in (*input.shape, *weight.shape))


def _off_current_device(t: torch.Tensor) -> bool:
    """Whether t is a CUDA tensor on another GPU than the current one. Triton launches on the current device (and
    "auto" times with its events), so such calls run under torch.cuda.device(t.device), as PyTorch's own ops do:
    a model placed on cuda:1 runs without the caller switching devices."""
    return t.is_cuda and t.get_device() != current_cuda_device()


def _forward(input, weight, bias, plan: Plan, backend: str) -> torch.Tensor:
    if _off_current_device(input):
        with torch.cuda.device(input.device):
            return _forward(input, weight, bias, plan, backend)
    if backend == "auto":
        backend = functional.choose_backend(input, weight, bias, plan)
    return functional.run_backend(backend, input, weight, bias, plan)


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
    # In the layout the backends give it (PyTorch's): compiled code checks the op's strides against these.
    return torch.empty(plan.output_shape, dtype=input.dtype, device=input.device,
                       memory_format=output_memory_format(input, weight, plan))


def _setup_context(ctx, inputs, output):
    input, weight, bias, stride, padding, output_padding, groups, dilation, _ = inputs
    ctx.save_for_backward(input, weight)
    ctx.has_bias = bias is not None
    ctx.params = (list(stride), list(padding), list(output_padding), groups, list(dilation))


def _cuda_phase_backward_serves(input: torch.Tensor, plan: Plan) -> bool:
    """Whether the CUDA backward by phases applies: only where no tap reaches most of the output (dilated layers
    such as problem 77), whose work cuDNN's strided backward spends in vain; elsewhere that single call was not
    measured against the phases."""
    if not input.is_cuda or input.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        return False
    return input.numel() != 0 and _phase_backward_fits(plan)


@functools.lru_cache(maxsize=256)
def _phase_backward_fits(plan: Plan) -> bool:
    """The plan's part of _cuda_phase_backward_serves, once per layer (its host time shows on a GPU)."""
    from .backends.triton import triton_available

    if plan.empty_fraction < 0.5 or not triton_available() or plan.in_channels * plan.out_channels == 0:
        return False
    from .backends.triton.backward import fits

    return all(fits(plan, phase.axes) for phase in plan.nonempty_phases)


@torch.library.custom_op("convt3d::conv_transpose3d_backward", mutates_args=())
def conv_transpose3d_backward_op(
    grad_output: torch.Tensor,
    input: torch.Tensor,
    weight: torch.Tensor,
    stride: Sequence[int],
    padding: Sequence[int],
    output_padding: Sequence[int],
    groups: int,
    dilation: Sequence[int],
    need_input: bool,
    need_weight: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(grad_input, grad_weight) by phases, grad_weight by the Triton kernel; a gradient not needed is an empty
    tensor (an op cannot return None). Both contiguous, as the fake implementation says (the phases'
    convolutions may hand back channels-last results)."""
    plan = _plan_of(input, weight, stride, padding, output_padding, groups, dilation)
    grad_input, grad_weight = _cuda_phase_backward(grad_output, input, weight, plan, need_input, need_weight)
    return (grad_input.contiguous() if need_input else input.new_empty(0)), (
        grad_weight.contiguous() if need_weight else weight.new_empty(0))


def _cuda_phase_backward(grad_output, input, weight, plan: Plan, need_input: bool, need_weight: bool):
    if _off_current_device(input):  # (autograd's engine sets the device; a direct or compiled call may not)
        with torch.cuda.device(input.device):
            return _cuda_phase_backward(grad_output, input, weight, plan, need_input, need_weight)
    return torch_phase.conv_transpose3d_backward(grad_output, input, weight, plan, need_input, need_weight,
                                                 _triton_phase_backward())


@functools.lru_cache(maxsize=1)
def _triton_phase_backward():
    """The Triton module's phase_backward, imported on first use (Triton stays out of import time), then kept: an
    import statement per call cost about 1 us on the 2-core CPU, host time that the GPU waits through."""
    from .backends.triton.backward import phase_backward

    return phase_backward


@conv_transpose3d_backward_op.register_fake
def _(grad_output, input, weight, stride, padding, output_padding, groups, dilation, need_input, need_weight):
    return (input.new_empty(input.shape) if need_input else input.new_empty(0),
            weight.new_empty(weight.shape) if need_weight else weight.new_empty(0))


def _backward(ctx, grad_output):
    input, weight = ctx.saved_tensors
    stride, padding, output_padding, groups, dilation = ctx.params
    need_input, need_weight, need_bias = ctx.needs_input_grad[:3]
    if _symbolic(input, weight):
        # Traced with dynamic shapes: the phase paths keep per-layer caches, which symbolic sizes cannot key, so
        # PyTorch's own backward serves (the graph's compiler lowers it as it lowers eager's).
        grad_input, grad_weight = _aten_gradients(grad_output, input, weight, stride, padding, output_padding, groups,
                                                  dilation, need_input, need_weight)
        grads = (grad_input, grad_weight, _grad_bias(grad_output, ctx.has_bias and need_bias))
    else:
        plan = _plan_of(input, weight, stride, padding, output_padding, groups, dilation)
        grads = _gradients(grad_output, input, weight, plan, (need_input, need_weight, need_bias), ctx.has_bias,
                           through_op=True)
    return (*grads, None, None, None, None, None, None)


def _aten_gradients(grad_output, input, weight, stride, padding, output_padding, groups, dilation,
                    need_input: bool, need_weight: bool):
    """(grad_input, grad_weight) by PyTorch's convolution_backward, None where not needed."""
    grad_input, grad_weight, _ = torch.ops.aten.convolution_backward(
        grad_output, input, weight, None, list(stride), list(padding), list(dilation), True, list(output_padding),
        groups, [need_input, need_weight, False])
    return grad_input, grad_weight


def _grad_bias(grad_output, needed: bool):
    return grad_output.sum(dim=(0, 2, 3, 4)) if needed else None


def _gradients(grad_output, input, weight, plan: Plan, needs, has_bias: bool, through_op: bool):
    """(grad_input, grad_weight, grad_bias), None where not needed. through_op: call the CUDA phase backward
    through its registered op (so that torch.compile traces it as one call) rather than directly."""
    need_input, need_weight, need_bias = needs
    # The CUDA phase backward's Triton kernels are not differentiable: where the backward itself is recorded
    # (create_graph=True, and torch.func's transforms), the differentiable aten path below serves instead.
    if (need_input or need_weight) and not torch.is_grad_enabled() and _cuda_phase_backward_serves(input, plan):
        # On the H200, problem 77, one run (f39c428): 1.33 ms for both gradients against aten's 1.87; 1.07 ms
        # since cb73314 (benchmarks/RESULTS.md).
        if through_op:
            grad_input, grad_weight = conv_transpose3d_backward_op(
                grad_output, input, weight, list(plan.stride), list(plan.padding), list(plan.output_padding),
                plan.groups, list(plan.dilation), need_input, need_weight)
        else:
            grad_input, grad_weight = _cuda_phase_backward(grad_output, input, weight, plan, need_input,
                                                           need_weight)
        grad_input, grad_weight = (grad_input if need_input else None), (grad_weight if need_weight else None)
    elif grad_output.device.type == "cuda" or _transforms_active() and _kernels_cannot_transform():
        # cuDNN's strided backward: on the H200 it beat the phase decomposition done in aten ops alone on
        # problem 77 (1.80 ms against 2.69 ms for both gradients; benchmarks/diag_p77.py). Under torch.func.vmap
        # (jacrev's backward), aten's, which vmap batches.
        grad_input, grad_weight = _aten_gradients(grad_output, input, weight, plan.stride, plan.padding,
                                                  plan.output_padding, plan.groups, plan.dilation, need_input,
                                                  need_weight)
    else:
        # The phase decomposition: on a 2-core CPU, problem 77 at batch 2, grad_input 3.8-8.3x and grad_weight
        # 2.8x faster than aten's (benchmarks/RESULTS.md).
        grad_input, grad_weight = torch_phase.conv_transpose3d_backward(grad_output, input, weight, plan,
                                                                        need_input, need_weight)
    return grad_input, grad_weight, _grad_bias(grad_output, has_bias and need_bias)


conv_transpose3d_op.register_autograd(_backward, setup_context=_setup_context)


class _EagerConvTranspose3d(torch.autograd.Function):
    """Eager autograd through the same gradients as the registered op, without torch.library's Python dispatch
    layers, which cost more per call than a small layer's kernels (on this project's 2-core CPU, a tiny layer's
    forward+backward: see benchmarks/RESULTS.md). torch.compile goes through the op.

    Its forward only records the node: `out` comes computed (apply() runs the kernels first, with grad mode off),
    and is returned marked as written in place. On a GPU the kernels are then queued before the ~2.7 us (2-core CPU)
    that Function.apply spends before entering a forward, host time the GPU would otherwise wait through."""

    @staticmethod
    def forward(ctx, input, weight, bias, out, plan):
        ctx.save_for_backward(input, weight)
        ctx.plan, ctx.has_bias = plan, bias is not None
        ctx.mark_dirty(out)
        return out

    @staticmethod
    def backward(ctx, grad_output):
        input, weight = ctx.saved_tensors
        grads = _gradients(grad_output, input, weight, ctx.plan, ctx.needs_input_grad[:3], ctx.has_bias,
                           through_op=False)
        return (*grads, None, None)


class _TransformableConvTranspose3d(torch.autograd.Function):
    """The same, computing in its forward and with the context kept apart from it (setup_context), as torch.func's
    transforms require (grad, vjp; under vmap and jvp, apply runs PyTorch's own kernel instead, and a backward that
    vmap batches, as jacrev's, takes aten's: _gradients). Used only under those transforms: torch binds this style's
    arguments by signature on every call, about 33 us of host time (benchmarks/cpu_function_styles.py)."""

    @staticmethod
    def forward(input, weight, bias, plan, backend):
        return _forward(input, weight, bias, plan, backend)

    @staticmethod
    def setup_context(ctx, inputs, output):
        input, weight, bias, plan, _ = inputs
        ctx.save_for_backward(input, weight)
        ctx.plan, ctx.has_bias = plan, bias is not None

    # Its last two arguments (plan, backend) take no gradient, as the other's (out, plan).
    backward = staticmethod(_EagerConvTranspose3d.backward)


# torch's own test for an active torch.func transform (present since torch 2.0; absent: never active).
_transforms_active = getattr(torch._C, "_are_functorch_transforms_active", lambda: False)
_functorch = getattr(torch._C, "_functorch", None)


def _kernels_cannot_transform() -> bool:
    """Whether an active torch.func transform is one that convt3d's kernels cannot serve: any but grad's (vmap
    batches tensors, jvp carries tangents, and a Triton or CUDA kernel does neither; PyTorch's own does both). Where
    this torch cannot say: True, which costs only speed."""
    try:
        grad = _functorch.TransformType.Grad
        return any(level.key() != grad for level in _functorch.get_interpreter_stack() or ())
    except AttributeError:
        return True


def _c_apply(function):
    """function.apply less its Python wrapper (torch.autograd.Function.apply), which checks for a setup_context
    and for torch.func's transforms, then unwraps each argument that a finished transform left wrapped
    (_unwrap_if_dead) and calls this: the C++ apply that records the node. Under the transforms
    _TransformableConvTranspose3d takes the wrapper's way. On the 2-core CPU a tiny layer's record took 7.5 us
    through the wrapper, 5.7 this way with the three unwraps. Where this torch lacks the C++ apply, function.apply."""
    try:
        return torch._C._FunctionBase.__dict__["apply"].__get__(None, function)
    except (AttributeError, KeyError):
        return function.apply


_record_eager_call = _c_apply(_EagerConvTranspose3d)
_unwrap_if_dead = getattr(_functorch, "unwrap_if_dead", lambda t: t)


def _onnx_exporting() -> bool:
    """Whether torch.onnx exports this call: never where Dynamo traces it (torch.compile); torch imports torch.onnx
    lazily, and where nothing imported it no export runs, so the question does not import it."""
    if torch.compiler.is_dynamo_compiling():
        return False
    onnx = sys.modules.get("torch.onnx")
    return onnx is not None and onnx.is_in_onnx_export()


def apply(input: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], plan: Plan, backend: str):
    """Run a validated batched call: through the registered op where torch.compile or torch.jit.trace records it
    (functional.recording), through a plain autograd Function where only autograd needs it, else directly (the op's
    dispatch costs tens of microseconds, as much as a small layer's kernel)."""
    if functional.recording():
        if _onnx_exporting():
            # ONNX has no convt3d op, and its ConvTranspose is this function: PyTorch's own op, which both of
            # torch.onnx's exporters translate to ConvTranspose, stands for the layer in the exported graph.
            return functional.run_backend("eager", input, weight, bias, plan)
        return conv_transpose3d_op(
            input, weight, bias, list(plan.stride), list(plan.padding), list(plan.output_padding), plan.groups,
            list(plan.dilation), backend,
        )
    if functional.without_data(input) or _transforms_active() and _kernels_cannot_transform():
        # PyTorch's own kernel, whatever the backend: for meta and fake tensors it gives the output's shape and layout
        # (and its autograd the gradients'), and no earlier call's choice or bound launch may run on them; under
        # torch.func.vmap and jvp (and jacrev, jacfwd, hessian, built on them) every transform batches and
        # differentiates it.
        return functional.run_backend("eager", input, weight, bias, plan)
    needs_grad = torch.is_grad_enabled() and (
        input.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad))
    if not needs_grad:
        return _forward(input, weight, bias, plan, backend)
    if _transforms_active():
        return _TransformableConvTranspose3d.apply(input, weight, bias, plan, backend)
    # As inside an autograd.Function's forward: no graph for the backend's own operations.
    torch._C._set_grad_enabled(False)
    try:
        if backend == "auto" and not _off_current_device(input):  # (off it, _forward chooses under that GPU)
            backend = functional.choose_backend(input, weight, bias, plan)
        out = None if backend == "eager" and _eager_autograd_serves(input, plan) else _forward(
            input, weight, bias, plan, backend)
    finally:
        torch._C._set_grad_enabled(True)
    if out is None:  # PyTorch's own kernel, recorded by PyTorch's own autograd
        return functional.run_backend("eager", input, weight, bias, plan)
    return _record_eager_call(_unwrap_if_dead(input), _unwrap_if_dead(weight),
                              None if bias is None else _unwrap_if_dead(bias), out, plan)


def signature(input: torch.Tensor) -> tuple:
    """What a BoundForward depends on of a call besides its weight and bias: the input's shape, dtype, device and
    layout, and the precision mode (auto's choice and the kernels' precision follow it)."""
    return input.shape, input.dtype, input.device, input.is_contiguous(), cudnn_allow_tf32()


class BoundForward:
    """The forward of later calls with the same weight and bias objects and an input of the same signature as the one it
    was bound after, where a prepared call served that call (the Triton backend's, or on CUDA the phase backend's by the
    CUDA phase correlation, torch_phase.prepared_call): it runs the prepared call straight away, skipping the checks,
    the backend choice and the lookups between a module and it, whose answers cannot have changed. On the H200 machine
    those took 15-29 us of host time a call, which the GPU waits through after the L2 flush of KernelBench's timing:
    they added 2-31 us to the cold-L2 means of four sweep layers (benchmarks/RESULTS.md, fifty-fourth session); on the
    phase path, 0.047 ms to vae_k4s2p1's with TF32 off (fifty-fifth session). The caller finds it by the input's
    signature, which it does not check again; a call returns None where it would not serve (another weight or bias, or
    the same parameters holding other data, as module.to() leaves them; another current device; torch.func's
    transforms; an input of a tensor subclass, such as FakeTensorMode's): the caller then takes the full way (apply).
    Under grad mode it records the same autograd node as apply. It refers to the weight and bias weakly, so that a
    module's replaced parameters are not kept alive by it."""

    __slots__ = ("run", "plan", "dtype", "device", "cuda_index", "weight", "weight_shape", "bias", "bias_shape")

    def __init__(self, run, input, weight, bias, plan: Plan):
        self.run, self.plan = run, plan
        self.weight, self.bias = weakref.ref(weight), None if bias is None else weakref.ref(bias)
        self.dtype, self.device = input.dtype, input.device
        self.cuda_index = input.get_device() if input.is_cuda else None
        self.weight_shape, self.bias_shape = weight.shape, None if bias is None else bias.shape

    def __call__(self, input, weight, bias):
        device = self.device
        if (_transforms_active() or type(input) is not torch.Tensor or weight is not self.weight()
                or weight.dtype is not self.dtype or weight.device != device or weight.shape != self.weight_shape
                or not weight.is_contiguous()
                or self.cuda_index is not None and current_cuda_device() != self.cuda_index):
            return None
        if bias is None:
            if self.bias is not None:
                return None
        elif (self.bias is None or bias is not self.bias() or bias.dtype is not self.dtype or bias.device != device
              or bias.shape != self.bias_shape or not bias.is_contiguous()):
            return None
        if not (torch.is_grad_enabled() and (
                input.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad))):
            return self.run(input, weight, bias)
        # As apply does: the kernels run with grad mode off, then the node is recorded.
        torch._C._set_grad_enabled(False)
        try:
            out = self.run(input, weight, bias)
        finally:
            torch._C._set_grad_enabled(True)
        return _record_eager_call(_unwrap_if_dead(input), _unwrap_if_dead(weight),
                                  None if bias is None else _unwrap_if_dead(bias), out, self.plan)


def can_bind(input) -> bool:
    """Whether a forward may be bound after a call on input: not while torch.compile or torch.jit.trace records it,
    not under torch.func's transforms, not for an input of a tensor subclass (FakeTensorMode's among them) or on
    another GPU than the current one. Such calls pass: a module leaves its bound forward for their signature, which a
    plain tensor may share, as it was."""
    return not (functional.recording() or _transforms_active() or type(input) is not torch.Tensor
                or input.device.type == "cuda" and input.get_device() != current_cuda_device())


def bind_forward(input, weight, bias, plan: Plan, backend: str):
    """A BoundForward for later calls with this weight and bias and an input of this one's signature (validated,
    batched; can_bind(input) true) with this backend, where a prepared call (the Triton backend's or the CUDA phase
    path's) would serve this call now; else None. Call it after the call, which chooses and prepares."""
    if backend == "auto":
        backend = functional.chosen_backend(input, bias, plan)
    if backend == "torch" and input.is_cuda:
        run = torch_phase.prepared_call(input, weight, bias, plan)
    elif backend in ("triton", "triton_float32"):
        from .backends.triton import TF32X3, prepared_call

        run = prepared_call(input, weight, bias, plan, TF32X3 if backend == "triton_float32" else None)
    else:
        return None
    return None if run is None else BoundForward(run, input, weight, bias, plan)


def _eager_autograd_serves(input: torch.Tensor, plan: Plan) -> bool:
    """Whether PyTorch's own autograd gives the gradients _gradients would, for a forward by eager's kernel: on CUDA
    where the backward by phases does not serve, _gradients is aten's convolution_backward, as eager's autograd. It
    records its node without the Python autograd.Function, whose host time, with convt3d's checks and dispatch, left
    a layer that "auto" runs by eager's kernel 2.6x slower than eager on the H200 (batch1_small_k3s2 in the
    thirty-third session's sweep: 0.087 ms against 0.034, 0.091 ms of host time per call against 0.051); on the
    2-core CPU a tiny layer's module call took 26.7 us that way and 17.1 this way, eager's 14.3
    (benchmarks/cpu_eager_autograd.py). On the CPU _gradients takes the phase decomposition, faster than aten's
    there."""
    return input.is_cuda and not _cuda_phase_backward_serves(input, plan)


# Last: functional imports this module (apply, cached_plan), and _forward looks its functions up at call time (an
# import statement inside _forward cost 0.5 us a call on a 2-core CPU, some 5 us on the H200 machine's host).
from . import functional  # noqa: E402
