"""Backends: each takes validated tensors and a Plan and returns the output."""

import torch

# The current CUDA device's index: torch.cuda.current_device() without its Python wrapper (3-4 us a call on the GPU
# machine's host under cProfile). Asked only about CUDA tensors or before CUDA launches, when CUDA is initialised.
current_cuda_device = getattr(torch._C, "_cuda_getDevice", None) or (lambda: torch.cuda.current_device())
# torch.backends.cudnn.allow_tf32 read through the getter under its property (the property's wrapper costs 0.2 us a
# read on the 2-core CPU), for the calls that read it on every forward.
cudnn_allow_tf32 = getattr(torch._C, "_get_cudnn_allow_tf32", None) or (lambda: torch.backends.cudnn.allow_tf32)


def contiguous_operands(input: torch.Tensor, weight: torch.Tensor, bias) -> bool:
    """Whether input, weight and bias (or none) are contiguous: the operands a backend's prepared call serves."""
    return input.is_contiguous() and weight.is_contiguous() and (bias is None or bias.is_contiguous())


def _channels_last(t: torch.Tensor) -> bool:
    return not t.is_contiguous() and t.is_contiguous(memory_format=torch.channels_last_3d)


def output_memory_format(input: torch.Tensor, weight: torch.Tensor) -> torch.memory_format:
    """PyTorch's rule for convolution outputs: channels_last_3d when the input or the weight is, where its
    kernels keep that layout (cuDNN; on the CPU oneDNN, which serves float32 and half precision, not float64)."""
    if input.is_contiguous() and weight.is_contiguous():  # the common case, decided in the fewest calls
        return torch.contiguous_format
    keeps_layout = input.device.type != "cpu" or input.dtype in (torch.float32, torch.bfloat16, torch.float16)
    if keeps_layout and (_channels_last(input) or _channels_last(weight)):
        return torch.channels_last_3d
    return torch.contiguous_format
