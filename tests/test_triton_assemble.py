"""The Triton pass that writes a one-phase layer's whole output, under TRITON_INTERPRET=1 on the CPU (and
natively on a GPU, where the portable backend uses it)."""

import pytest
import torch
import torch.nn.functional as F

from conftest import assert_close_rel, layer_args, make_tensors

triton = pytest.importorskip("triton")
from convt3d.backends import torch_phase  # noqa: E402
from convt3d.backends.triton.assemble import assemble_single_phase  # noqa: E402
from convt3d.plan import make_plan  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# Layers whose taps all reach one 3D phase (dilation a multiple of the stride along each axis).
ONE_PHASE = [
    dict(batch=2, in_channels=3, out_channels=5, groups=1, kernel_size=(3, 3, 3), stride=2, padding=1, dilation=2,
         output_padding=0, spatial=(3, 4, 5), bias=True),
    dict(batch=1, in_channels=4, out_channels=6, groups=2, kernel_size=(3, 2, 1), stride=(2, 3, 1),
         padding=(0, 2, 0), dilation=(4, 3, 1), output_padding=(1, 2, 0), spatial=(2, 3, 4), bias=False),
    # The lattice starts past the output's first elements and ends before its last ones.
    dict(batch=1, in_channels=2, out_channels=3, groups=1, kernel_size=(2, 3, 2), stride=3, padding=(1, 2, 0),
         dilation=3, output_padding=2, spatial=(2, 2, 3), bias=True),
]


@pytest.mark.parametrize("channels_last_part", [False, True])
@pytest.mark.parametrize("cfg", ONE_PHASE, ids=range(len(ONE_PHASE)))
def test_lattice_and_fill_written_once(cfg, channels_last_part):
    x, w, b = make_tensors(dict(cfg, unbatched=False), torch.float32, DEVICE)
    plan = make_plan(tuple(x.shape), tuple(w.shape), **layer_args(cfg))
    (phase,) = plan.nonempty_phases
    with torch.backends.cudnn.flags(allow_tf32=False):  # the compact convolution in float32 on a GPU too
        part = torch_phase._phase_conv(x, w, b, plan, phase.axes)
    if channels_last_part:
        part = part.contiguous(memory_format=torch.channels_last_3d)
    out = torch.full(plan.output_shape, float("nan"), device=DEVICE)  # every element must be written
    assemble_single_phase(out, part, b, plan, phase.axes)
    ref = F.conv_transpose3d(x.double(), w.double(), None if b is None else b.double(), **layer_args(cfg))
    assert_close_rel(out, ref, 1e-5)


@pytest.mark.parametrize("dtype, rel", [(torch.float16, 2e-3), (torch.bfloat16, 1.5e-2)])
def test_half_precision(dtype, rel):
    cfg = ONE_PHASE[0]
    x, w, b = make_tensors(dict(cfg, unbatched=False), torch.float32, DEVICE)
    x, w, b = x.to(dtype), w.to(dtype), b.to(dtype)
    plan = make_plan(tuple(x.shape), tuple(w.shape), **layer_args(cfg))
    (phase,) = plan.nonempty_phases
    out = torch.full(plan.output_shape, float("nan"), device=DEVICE, dtype=dtype)
    assemble_single_phase(out, torch_phase._phase_conv(x, w, b, plan, phase.axes), b, plan, phase.axes)
    ref = F.conv_transpose3d(x.double(), w.double(), b.double(), **layer_args(cfg))
    assert_close_rel(out, ref, rel)
