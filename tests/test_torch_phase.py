"""The portable phase backend's own functions, against PyTorch in float64."""

import random

import pytest
import torch

from conftest import assert_close_rel, layer_args, make_tensors, random_config
from convt3d.backends import torch_phase
from convt3d.backends.torch_phase import conv_transpose3d_backward
from convt3d.plan import make_plan


@pytest.mark.parametrize("seed", range(60))
def test_backward_matches_autograd(seed):
    cfg = dict(random_config(random.Random(500 + seed)), unbatched=False)
    x, w, _ = make_tensors(cfg)
    plan = make_plan(tuple(x.shape), tuple(w.shape), **layer_args(cfg))
    x.requires_grad_()
    w.requires_grad_()
    y = torch.nn.functional.conv_transpose3d(x, w, None, **layer_args(cfg))
    grad = torch.randn_like(y)
    expected = torch.autograd.grad(y, (x, w), grad)
    # Every other seed copies each phase's lattice out first, as the CUDA op does.
    def copied(grad_output, index, *args):
        lattice = grad_output[index].contiguous()
        return torch_phase.aten_phase_backward(lattice, (slice(None),) * 5, *args)

    actual = conv_transpose3d_backward(grad, x.detach(), w.detach(), plan, phase_backward=copied if seed % 2 else None)
    for a, e, name in zip(actual, expected, ("input", "weight")):
        assert a.shape == e.shape, name
        if e.numel():
            assert_close_rel(a, e, 1e-10, f"grad {name} {cfg}")


def test_backward_computes_only_what_is_asked():
    x, w = torch.randn(1, 2, 3, 3, 3), torch.randn(2, 3, 2, 2, 2)
    plan = make_plan(tuple(x.shape), tuple(w.shape), 2, 0, 0, 1, 1)
    grad = torch.randn(plan.output_shape)
    assert conv_transpose3d_backward(grad, x, w, plan, need_input=False)[0] is None
    assert conv_transpose3d_backward(grad, x, w, plan, need_weight=False)[1] is None


@pytest.mark.parametrize("seed", range(20))
def test_forward_with_one_whole_output_fill(seed, monkeypatch):
    """The GPU's way (fill everything, then the phases over it), run on the CPU."""
    monkeypatch.setitem(torch_phase.FILL_WHOLE_OUTPUT, "cpu", True)
    cfg = dict(random_config(random.Random(900 + seed)), unbatched=False)
    x, w, b = make_tensors(cfg)
    plan = make_plan(tuple(x.shape), tuple(w.shape), **layer_args(cfg))
    expected = torch.nn.functional.conv_transpose3d(x, w, b, **layer_args(cfg))
    assert_close_rel(torch_phase.conv_transpose3d(x, w, b, plan), expected, 1e-10, str(cfg))


@pytest.mark.parametrize("seed", range(30))
def test_phase_conv_as_transposed_convolution(seed):
    """The CUDA way of running a phase in TF32 mode (a stride-1 conv_transpose3d where it can express the
    window), run on the CPU in float64: wherever it applies, it computes the phase's conv3d."""
    cfg = dict(random_config(random.Random(1300 + seed)), unbatched=False)
    x, w, b = make_tensors(cfg)
    plan = make_plan(tuple(x.shape), tuple(w.shape), **layer_args(cfg))
    for phase in plan.nonempty_phases:
        out = torch_phase._phase_conv_transposed(x, w, b, plan, phase.axes)
        if out is not None:
            assert_close_rel(out, torch_phase._phase_conv(x, w, b, plan, phase.axes), 1e-10, str(cfg))


def test_phase_conv_as_transposed_convolution_applies_to_problem_77():
    x, w = torch.randn(1, 2, 3, 4, 5, dtype=torch.float64), torch.randn(2, 3, 3, 3, 3, dtype=torch.float64)
    plan = make_plan(tuple(x.shape), tuple(w.shape), 2, 1, 0, 1, 2)
    (phase,) = plan.nonempty_phases
    out = torch_phase._phase_conv_transposed(x, w, None, plan, phase.axes)
    assert out is not None
    assert_close_rel(out, torch_phase._phase_conv(x, w, None, plan, phase.axes), 1e-10)


# (input shape, weight shape, stride, padding, output_padding, groups, dilation): the first, third and fourth
# from random layers where oneDNN's bfloat16 convolutions went wrong, the second and fifth variants of the first.
BFLOAT16_LAYERS = [
    ((2, 1, 2, 3, 3), (1, 1, 3, 3, 3), 2, 2, 0, 1, (1, 2, 1)),
    ((2, 3, 2, 3, 3), (3, 1, 3, 3, 3), 2, 2, 0, 1, (1, 2, 1)),
    ((1, 4, 1, 3, 3), (4, 3, 2, 2, 2), 2, (0, 0, 1), (0, 1, 1), 2, (2, 2, 1)),
    ((1, 2, 1, 2, 1), (2, 2, 3, 3, 3), 1, 0, 0, 2, (2, 1, 1)),
    ((2, 1, 2, 3, 3), (1, 3, 3, 3, 3), 2, 2, 0, 1, (1, 2, 1)),
]


@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last_3d])
@pytest.mark.parametrize("layer", BFLOAT16_LAYERS)
def test_bfloat16_layers_with_depth_one_windows(layer, layout):
    """bfloat16 layers whose phase convolutions have a window of depth 1: oneDNN's bfloat16 convolution (PyTorch 2.13)
    returned wrong sums there, zeros among them, from channels-last operands on the project's first CPU (grad_input
    and grad_weight 0.3-0.9 off float64, a forward 0.96) and from contiguous ones too, inf among them, on an Intel
    Xeon with AMX, so on the CPU the phases compute bfloat16 in float32. Forward and gradients against float64, at
    bfloat16's tolerance."""
    x_shape, w_shape, *args = layer
    torch.manual_seed(len(x_shape) + sum(x_shape) + sum(w_shape))
    x = torch.randn(x_shape).bfloat16().contiguous(memory_format=layout)
    w, b = torch.randn(w_shape).bfloat16(), torch.randn(w_shape[1] * args[3]).bfloat16()
    plan = make_plan(x_shape, w_shape, *args)
    x64, w64, b64 = (t.double().requires_grad_() for t in (x, w, b))
    y64 = torch.nn.functional.conv_transpose3d(x64, w64, b64, *args)
    grad = torch.randn(y64.shape)
    expected = torch.autograd.grad(y64, (x64, w64), grad.double())
    assert_close_rel(torch_phase.conv_transpose3d(x, w, b, plan), y64.detach(), 1e-2, "forward")
    actual = conv_transpose3d_backward(grad.bfloat16(), x, w, plan)
    for a, e, name in zip(actual, expected, ("input", "weight")):
        assert_close_rel(a, e, 1e-2, f"grad {name}")
