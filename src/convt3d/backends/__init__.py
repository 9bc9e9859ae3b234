"""Backends: each takes validated tensors and a Plan and returns the output."""

import torch

# The current CUDA device's index: torch.cuda.current_device() without its Python wrapper (3-4 us a call on the GPU
# machine's host under cProfile). Asked only about CUDA tensors or before CUDA launches, when CUDA is initialised.
current_cuda_device = getattr(torch._C, "_cuda_getDevice", None) or (lambda: torch.cuda.current_device())
# torch.backends.cudnn.allow_tf32 read through the getter under its property (the property's wrapper costs 0.2 us a
# read on the 2-core CPU), for the calls that read it on every forward.
_legacy_cudnn_allow_tf32 = getattr(torch._C, "_get_cudnn_allow_tf32", None) or (
    lambda: torch.backends.cudnn.allow_tf32)
# PyTorch 2.9's per-operator TF32 settings (torch.backends.cudnn.conv.fp32_precision and those above it).
_fp32_precision = getattr(torch._C, "_get_fp32_precision_getter", None)


def cudnn_allow_tf32() -> bool:
    """Whether PyTorch's convolutions may compute float32 in TF32: torch.backends.cudnn.allow_tf32, the setting of
    convolutions and RNNs together. Where PyTorch's per-operator settings have set the two apart (for one,
    torch.backends.cudnn.conv.fp32_precision = "ieee"), reading it raises, and the convolutions' own setting
    decides, as it does for PyTorch's convolutions (resolved through the backend's and the generic setting)."""
    try:
        return _legacy_cudnn_allow_tf32()
    except RuntimeError:
        if _fp32_precision is None:
            raise
        return _fp32_precision("cuda", "conv") == "tf32"


def contiguous_operands(input: torch.Tensor, weight: torch.Tensor, bias) -> bool:
    """Whether input, weight and bias (or none) are contiguous: the operands a backend's prepared call serves."""
    return input.is_contiguous() and weight.is_contiguous() and (bias is None or bias.is_contiguous())


def _channels_last(t: torch.Tensor) -> bool:
    """PyTorch's reading of a 5-D tensor's strides as channels-last (is_channels_last_strides_3d, which its
    suggest_memory_format and so its convolutions ask): the strides grow along C, W, H, D, N, a size-1 dimension
    taking the next one's place. So a tensor with one channel laid out channels-last is channels-last to PyTorch
    while also contiguous."""
    if t.is_contiguous() and not t.is_contiguous(memory_format=torch.channels_last_3d):
        return False  # the common case, decided in the fewest calls (a tensor both ways has size-1 dimensions)
    sizes, strides = t.shape, t.stride()
    if strides[1] == 0:
        return False
    smallest = 0
    for d in (1, 4, 3, 2, 0):
        if sizes[d] == 0 or strides[d] < smallest or (d == 0 and smallest == strides[1]):
            return False
        smallest = strides[d] * sizes[d] if sizes[d] > 1 else strides[d]
    return True


def output_memory_format(input: torch.Tensor, weight: torch.Tensor, plan) -> torch.memory_format:
    """PyTorch's rule for a transposed convolution's output (plan: the layer's Plan): channels_last_3d when the input
    or the weight is and the kernel PyTorch runs keeps that layout (cuDNN, or oneDNN on the CPU, except for float64;
    not PyTorch's own slow transposed kernel), else contiguous (as on the meta device, whose kernel only shapes). The
    custom op's fake implementation follows it too, so that compiled code expects the strides the op returns."""
    if not (_channels_last(input) or _channels_last(weight)):
        return torch.contiguous_format
    if input.dtype == torch.float64 or input.device.type == "meta" or not _layout_keeping_kernel(input, weight, plan):
        return torch.contiguous_format
    return torch.channels_last_3d


def _layout_keeping_kernel(input: torch.Tensor, weight: torch.Tensor, plan) -> bool:
    """Whether PyTorch's transposed convolution runs this layer by a kernel that keeps a channels-last operand's
    layout: cuDNN, or oneDNN on the CPU, rather than its own slow kernel (or, with no elements, none). Its choice
    depends on output_padding against stride (output_padding >= stride, which dilation allows, goes to the slow kernel
    on either device) and on the CPU on the dtype (float16 only where the CPU computes it), the shapes (a small float32
    layer at batch 1 goes to the slow kernel) and the thread count, so it is asked (torch._C._select_conv_backend,
    private) rather than restated. Its Python enum names no oneDNN transposed backend (torch 2.13 returns an unnamed
    value), hence the test against the others. Where the function is missing: CUDA, and on the CPU float32 and half
    precision, as for most layers."""
    select = getattr(torch._C, "_select_conv_backend", None)
    if select is None:
        return input.device.type != "cpu" or input.dtype in (torch.float32, torch.bfloat16, torch.float16)
    backend = select(input, weight, None, list(plan.stride), list(plan.padding), list(plan.dilation), True,
                     list(plan.output_padding), plan.groups)
    return backend not in _LAYOUT_DROPPING_BACKENDS


# PyTorch's convolution backends whose output is contiguous whatever the operands' layout, for a 3-D transposed
# convolution (MIOpen keeps channels-last only in 2-D).
_LAYOUT_DROPPING_BACKENDS = tuple(
    getattr(torch._C._ConvBackend, name)
    for name in ("SlowTranspose3d", "Empty", "Miopen", "MiopenTranspose", "MiopenDepthwise")
    if hasattr(getattr(torch._C, "_ConvBackend", None), name))
