"""backends/triton/fill.py: the bias fill, in the interpreter on the CPU (on the GPU through test_gpu's forwards)."""

import pytest
import torch

from conftest import skip_without_usable_triton
from convt3d.backends.torch_phase import _fill

skip_without_usable_triton()
pytestmark = pytest.mark.interpreter
fill = pytest.importorskip("convt3d.backends.triton.fill")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


# Channel planes of exactly one block, of a block and a bit (blocks that meet two planes), of several blocks, and
# outputs that end inside a block.
@pytest.mark.parametrize("shape", [(2, 3, 2, 32, 32), (1, 5, 3, 29, 24), (3, 2, 7, 33, 17)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_fill_channels_writes_each_channel_its_bias(shape, dtype):
    out = torch.full(shape, float("nan"), dtype=dtype, device=DEVICE)
    bias = torch.randn(shape[1], device=DEVICE).to(dtype)
    assert fill.fill_unsupported(out, bias) is None
    fill.fill_channels(out, bias)
    assert torch.equal(out, bias.view(1, -1, 1, 1, 1).expand(shape))


def test_fill_unsupported_reasons():
    bias = torch.randn(3)
    assert "fewer than" in fill.fill_unsupported(torch.empty(2, 3, 2, 4, 5), bias)
    assert "contiguous" in fill.fill_unsupported(torch.empty(2, 3, 8, 16, 32).transpose(3, 4), bias)
    assert "bias" in fill.fill_unsupported(torch.empty(2, 3, 8, 16, 32), bias.double())


def test_phase_path_fill_with_and_without_the_kernel():
    """torch_phase._fill: the kernel where it serves (on CUDA), torch's broadcast copy elsewhere, the same values."""
    for shape in [(2, 3, 2, 32, 32), (2, 3, 2, 4, 5)]:
        out = torch.full(shape, float("nan"), device=DEVICE)
        bias = torch.randn(shape[1], device=DEVICE)
        _fill(out, bias)
        assert torch.equal(out, bias.view(1, -1, 1, 1, 1).expand(shape))
