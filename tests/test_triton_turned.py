"""The Triton forward's GEMMs turned around on TMA loads (backends/triton/turned.py), under TRITON_INTERPRET=1 on the
CPU (and natively on a Hopper GPU, where its launches go through the driver)."""

import pytest
import torch
import torch.nn.functional as F

from conftest import assert_close_rel, float64_reference, layer_args, skip_without_usable_triton

skip_without_usable_triton()
from convt3d.backends.triton import forward, tensor_scaled, turned  # noqa: E402
from convt3d.backends.triton.forward import NATIVE, TF32  # noqa: E402
from convt3d.plan import make_plan  # noqa: E402
from test_triton_forward import DEVICE, tensors  # noqa: E402

if DEVICE == "cuda" and torch.cuda.get_device_capability()[0] < 9:
    pytest.skip("TMA needs Hopper (sm_90) or later", allow_module_level=True)


def layer(kernel, stride, padding, spatial, in_channels=8, out_channels=24, batch=1, dilation=1, output_padding=0,
          bias=True):
    return dict(batch=batch, in_channels=in_channels, out_channels=out_channels, groups=1, kernel_size=kernel,
                stride=stride, padding=padding, dilation=dilation, output_padding=output_padding, spatial=spatial,
                bias=bias)


CASES = [
    # k4 s2 p1 (VAE decoder): both column phases, a plane's rows over several tiles; 24 output channels, the second
    # block of 16 partial (its weight boxes read the next tap's rows, which no store keeps).
    layer((4, 4, 4), 2, 1, (2, 6, 9), in_channels=16),
    # k3 s2 p1 output_padding 1 (video decoder), two channel blocks of 16 per K-step, batch 2.
    layer((3, 3, 3), 2, 1, (2, 4, 6), in_channels=32, out_channels=8, output_padding=1, batch=2),
    # k3 s1 p1: one column phase; 8 input channels in a 16-channel box (the rest comes back as zeros).
    layer((3, 3, 3), 1, 1, (2, 3, 7), out_channels=40),
    # Problem 77 in miniature: dilation 2, one non-empty phase of eight (the others take no K-step: the bias alone,
    # here none).
    layer((3, 3, 3), 2, 1, (3, 3, 6), out_channels=16, dilation=2, bias=False),
    # Mixed strides and dilations along D and H, KW = 1, width 1.
    layer((2, 3, 1), (3, 2, 1), (1, 0, 0), (2, 3, 1), dilation=(2, 1, 1), output_padding=(1, 1, 0)),
    # Padding larger than the kernel along W: whole column phases read nothing, boxes starting left of the input.
    layer((1, 2, 3), (1, 2, 2), (0, 1, 4), (2, 3, 9), output_padding=(0, 1, 1)),
]
CONFIG = turned.configs()[0]


def plan_of(x, w, cfg):
    return make_plan(tuple(x.shape), tuple(w.shape), **layer_args(cfg))


def run(x, w, b, cfg, precision, config=CONFIG):
    plan = plan_of(x, w, cfg)
    y = forward.conv_transpose3d_triton(x, w, b, plan, precision=precision, config=config)
    assert y.shape == plan.output_shape
    return y


@pytest.mark.parametrize("cfg", CASES, ids=range(len(CASES)))
def test_float16_matches_float64(cfg, nan_poisoned_allocator):
    x, w, b = tensors(cfg, torch.float16)
    assert turned.unsupported_reason(plan_of(x, w, cfg), torch.float16, None) is None
    # float16 keeps 11 significant bits: the output's own rounding dominates; a wrong tap or shift leaves O(1).
    assert_close_rel(run(x, w, b, cfg, NATIVE), float64_reference(x, w, b, cfg), 2e-3)


@pytest.mark.parametrize("cfg", CASES, ids=range(len(CASES)))
def test_tf32_mode_sums_what_the_general_kernel_sums(cfg):
    """In TF32 mode float32 operands are FP16 scaled per tensor (tensor_scaled.py): both kernels multiply the same
    operands, so they differ only by the order of float32 additions."""
    x, w, b = tensors(cfg, torch.float32)
    x = x * 1e3  # (far from 1, so that a scale not undone shows)
    assert tensor_scaled.operand_precision(x, w, 1, TF32) == tensor_scaled.FP16_TENSOR_SCALED
    y = run(x, w, b, cfg, TF32)
    assert_close_rel(y, run(x, w, b, cfg, TF32, forward._configs()[0]), 1e-6)
    assert_close_rel(y, float64_reference(x, w, b, cfg), 2e-3)  # TF32's 11 significant bits


def test_inputs_untouched_and_channels_last_layout_kept():
    cfg = CASES[1]
    x, w, b = tensors(cfg, torch.float16)
    x = x.to(memory_format=torch.channels_last_3d)
    x_before, w_before = x.clone(), w.clone()
    y = run(x, w, b, cfg, NATIVE)
    assert torch.equal(x, x_before) and torch.equal(w, w_before)
    assert y.stride() == F.conv_transpose3d(x, w, b, **layer_args(cfg)).stride()
    assert_close_rel(y, float64_reference(x, w, b, cfg), 2e-3)


@pytest.mark.parametrize("change, dtype, reason", [
    (dict(groups=2, out_channels=8), torch.float16, "groups"),
    (dict(), torch.bfloat16, "not float16"),
    (dict(), torch.float32, "not float16"),
    (dict(in_channels=12), torch.float16, "multiple of 8"),
])
def test_layers_it_does_not_serve_say_why(change, dtype, reason):
    cfg = dict(CASES[1], **change)
    x, w, _ = tensors(cfg, torch.float32)
    plan = plan_of(x, w, cfg)
    assert reason in turned.unsupported_reason(plan, dtype, None)
    assert not any(c.get("KERNEL") == "turned" for c in forward.candidates(plan, dtype, None))


def test_candidates_include_it_where_it_serves():
    cfg = CASES[1]
    x, w, _ = tensors(cfg, torch.float16)
    plan = plan_of(x, w, cfg)
    assert turned.configs()[0] in forward.candidates(plan, torch.float16, None)
    assert not any(c.get("KERNEL") == "turned" for c in forward.candidates(plan))  # (no operand dtype given)


@pytest.mark.skipif(DEVICE != "cuda", reason="the driver's launch: on a GPU")
def test_driver_launch_is_tritons_bitwise_and_follows_moved_operands(nan_poisoned_allocator):
    """The launch through the driver (tensor maps encoded once per operand address) against Triton's own launcher,
    on two operand buffers in turn, so that the maps must be encoded again."""
    cfg = layer((3, 3, 3), 2, 1, (4, 16, 16), in_channels=64, out_channels=64, output_padding=1, batch=2)
    x, w, b = tensors(cfg, torch.float16)
    plan = plan_of(x, w, cfg)
    config = turned.configs()[-1]
    bound = turned.bind(config, plan, NATIVE, True, tuple(forward.contiguous_strides(plan.output_shape)),
                        torch.cuda.current_device())
    results, addresses = [], []
    for scale in (1.0, -2.0):
        xs = x * scale
        x_op, w_op, w_lo = forward._operands(xs, w, 1, NATIVE)
        addresses.append(x_op.data_ptr())  # (the first operands are alive still: the second lie elsewhere)
        through_triton = torch.full(plan.output_shape, float("nan"), dtype=x.dtype, device="cuda")
        bound._through_triton(x_op, w_op, w_lo, b, through_triton)
        by_driver = torch.full_like(through_triton, float("nan"))
        bound((x_op, w_op, w_lo, b, by_driver))  # (the first call compiles, then the driver serves)
        by_driver.fill_(float("nan"))
        bound((x_op, w_op, w_lo, b, by_driver))
        assert bound.at_addresses(torch.cuda.current_device(), [t.dtype for t in (x_op, w_op, w_lo, b, by_driver)])
        torch.cuda.synchronize()
        assert torch.equal(by_driver, through_triton)
        assert_close_rel(by_driver, float64_reference(xs, w, b, cfg), 2e-3)
        results.append(by_driver)
    assert addresses[0] != addresses[1] and not torch.equal(results[0], results[1])
