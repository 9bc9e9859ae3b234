"""The tiled GEMM for kernel_size == stride (backends/triton/tiled.py), under TRITON_INTERPRET=1 on the CPU (and
natively on a GPU)."""

import itertools

import pytest
import torch
import torch.nn.functional as F

import convt3d
from conftest import assert_close_rel, float64_reference, layer_args, run_in_sample, skip_without_usable_triton

skip_without_usable_triton()
import triton  # noqa: E402
from convt3d.backends.triton import tiled  # noqa: E402
from convt3d.backends.triton.forward import NATIVE, TF32, TF32X3  # noqa: E402
from convt3d.plan import make_plan  # noqa: E402
from test_triton_forward import round_to_tf32, tensors  # noqa: E402


def layer(kernel, spatial, in_channels=5, out_channels=3, batch=1, bias=True, dilation=1):
    return dict(batch=batch, in_channels=in_channels, out_channels=out_channels, groups=1, kernel_size=kernel,
                stride=kernel, padding=0, dilation=dilation, output_padding=0, spatial=spatial, bias=bias)


CASES = [
    # The U-Net k2 s2 layer with rows and columns that fill no block.
    layer((2, 2, 2), (3, 3, 4)),
    # Columns over several blocks, output channels over several blocks, channels not a multiple of the K block.
    layer((2, 2, 2), (2, 3, 40), in_channels=20, out_channels=40, batch=2, bias=False),
    # KW = 3: the kw interleave padded to 4; a 1 x 2 x 3 kernel; exactly one K block of channels.
    layer((1, 2, 3), (2, 5, 13), in_channels=16, out_channels=6),
    # Pointwise (kernel 1, stride 1), where dilation changes nothing; width 1.
    layer((1, 1, 1), (2, 3, 1), in_channels=3, out_channels=4, dilation=2),
]

_next_config = itertools.cycle(tiled.configs())


def run(x, w, b, cfg, precision, config=None):
    """The layer through config, or else the next config in turn that fits."""
    plan = make_plan(tuple(x.shape), tuple(w.shape), **layer_args(cfg))
    assert tiled.unsupported_reason(plan) is None
    for _ in tiled.configs():
        try:
            y = tiled.conv_transpose3d_tiled(x, w, b, plan, precision=precision, config=config or next(_next_config))
            break
        except triton.runtime.errors.OutOfResources:  # e.g. the largest tiles with 3xTF32's doubled operands
            continue
    assert y.shape == plan.output_shape
    return y


# The first two configs: the MMA's M and N as they are, and swapped (on a GPU in the other order).
FIRST_TWO = [0, 1]
assert {tiled.configs()[i]["SWAP"] for i in FIRST_TWO} == {0, 1}


# TF32 mode's two forms: operands as FP16 scaled per row (tiled.FP16_SCALED, the default) on every case, and TF32
# itself (CONVT3D_TF32_AS_FP16=0) on two.
@pytest.mark.parametrize("as_fp16, cfg", [(True, cfg) for cfg in CASES] + [(False, cfg) for cfg in CASES[:2]],
                         ids=[f"fp16-{i}" for i in range(len(CASES))] + ["tf32-0", "tf32-1"])
@pytest.mark.parametrize("config", FIRST_TWO)
def test_tf32_rounds_operands_to_nearest(as_fp16, cfg, config, monkeypatch):
    run_in_sample((CASES.index(cfg) + config) % 2 == 0)  # each case in one config, the other in tf32x3
    monkeypatch.setattr(tiled, "TF32_AS_FP16", as_fp16)
    x, w, b = tensors(cfg, torch.float32)
    y = run(x, w, b, cfg, TF32, tiled.configs()[config])
    # Exactly the products of the TF32-rounded operands, summed in float32.
    assert_close_rel(y, float64_reference(round_to_tf32(x), round_to_tf32(w), b, cfg), 1e-6)
    assert_close_rel(y, float64_reference(x, w, b, cfg), 2e-3)  # TF32 keeps 11 significant bits


@pytest.mark.parametrize("config", FIRST_TWO)
def test_fp16_scales_follow_each_row_far_outside_fp16s_range(config):
    """FP16_SCALED scales each input position and each weight row on its own: positions and weight rows 2^-40 to
    2^30 apart (FP16 itself spans 2^-24 to 2^16) still give exactly the TF32-rounded operands' sums, checked per
    output block so that the small ones count. A row of zeros stays zeros; one row with a value 2^28 below its
    largest checks where FP16's subnormals start (that value still converts exactly)."""
    cfg = CASES[1]  # 20 channels (a K block and a part), 40 output channels, no bias
    x, w, _ = tensors(cfg, torch.float32)
    position_scale = torch.tensor([2.0**-40, 1.0, 2.0**30], device=x.device)[torch.arange(x.shape[-1]) % 3]
    x = x * position_scale  # along W: neighbouring GEMM rows of one tile far apart
    x[:, :, 0, 0, 0] = 0.0
    x[:, 0, 1, 1, 1] *= 2.0**-28
    channel_scale = torch.tensor([2.0**-30, 2.0**20], device=w.device)[torch.arange(w.shape[1]) % 2]
    w = w * channel_scale[:, None, None, None]
    y = run(x, w, None, cfg, TF32, tiled.configs()[config])
    expected = float64_reference(round_to_tf32(x), round_to_tf32(w), None, cfg)
    kw = cfg["kernel_size"][2]
    for p in range(3):
        for c in range(2):
            block = (slice(None), slice(c, None, 2), slice(None), slice(None), slice(p * kw, None, 3 * kw))
            assert_close_rel(y[block], expected[block], 1e-6, f"positions {p}, channels {c}")
    assert_close_rel(y, expected, 1e-6)


@pytest.mark.parametrize("x_scale, w_scale, bias", [(2.0**120, 2.0**-110, True), (2.0**-120, 2.0**110, True),
                                                     (2.0**-60, 2.0**-60, False)])
def test_fp16_scaled_products_of_operands_near_float32s_ends(x_scale, w_scale, bias):
    """Input and weight near float32's ends whose products are ordinary numbers: the kernel's inverse scales (2^106
    and 2^-124 in the first case) must not be applied one after the other to the sums (2^136 on the way: inf). In the
    last, each sum's whole inverse scale (about 2^-150) is no normal float32 while the sums (about 2^-120) are: its
    two halves must each be. No bias there, which would hide the sums."""
    cfg = CASES[0]
    x, w, b = tensors(cfg, torch.float32)
    x, w, b = x * x_scale, w * w_scale, b if bias else None
    y = run(x, w, b, cfg, TF32, tiled.configs()[1])
    assert_close_rel(y, float64_reference(round_to_tf32(x), round_to_tf32(w), b, cfg), 1e-6)


def test_fp16_scaled_passes_inf_and_nan_through():
    """An inf or NaN input reaches the outputs it reaches in PyTorch (inf times weights of both signs: NaN), and only
    those."""
    cfg = CASES[0]
    x, w, b = tensors(cfg, torch.float32)
    x[0, 1, 1, 1, 1] = float("inf")
    x[0, 2, 2, 2, 2] = float("nan")
    y = run(x, w, b, cfg, TF32, tiled.configs()[0])
    expected = float64_reference(round_to_tf32(x), round_to_tf32(w), b, cfg)
    assert torch.equal(y.isnan(), expected.isnan()) and torch.equal(y.isinf(), expected.isinf())
    finite = expected.isfinite()
    assert finite.sum() > finite.numel() // 2
    assert_close_rel(y[finite], expected[finite], 1e-6)


def test_fp16_scaled_rows_longer_than_one_chunk():
    """More than 512 input channels: the operand pass finds a row's largest over chunks, then reads it again."""
    cfg = layer((2, 2, 2), (1, 2, 3), in_channels=600, out_channels=3)
    x, w, b = tensors(cfg, torch.float32)
    x[..., 1] *= 2.0**-20  # the rows' own scales differ
    y = run(x, w, b, cfg, TF32, tiled.configs()[1])
    assert_close_rel(y, float64_reference(round_to_tf32(x), round_to_tf32(w), b, cfg), 1e-6)


@pytest.mark.parametrize("config", FIRST_TWO)
@pytest.mark.parametrize("cfg", CASES, ids=range(len(CASES)))
def test_tf32x3_is_float32_accurate(cfg, config):
    run_in_sample((CASES.index(cfg) + config) % 2 == 1)  # the config tf32_rounds left out
    x, w, b = tensors(cfg, torch.float32)
    assert_close_rel(run(x, w, b, cfg, TF32X3, tiled.configs()[config]), float64_reference(x, w, b, cfg), 1e-6)


# float16 keeps 11 significant bits, bfloat16 8: the output's own rounding dominates.
@pytest.mark.parametrize("dtype, rel", [(torch.float16, 2e-3), (torch.bfloat16, 1.5e-2)])
@pytest.mark.parametrize("config", FIRST_TWO)
@pytest.mark.parametrize("cfg", CASES[:3], ids=range(3))
def test_half_precision(cfg, dtype, rel, config):
    run_in_sample((CASES.index(cfg) + config + (dtype == torch.bfloat16)) % 2 == 0)  # each case in both configs
    x, w, b = tensors(cfg, dtype)
    y = run(x, w, b, cfg, NATIVE, tiled.configs()[config])
    assert y.dtype == dtype
    assert_close_rel(y, float64_reference(x, w, b, cfg), rel)


def test_every_element_written_and_inputs_untouched(nan_poisoned_allocator):
    """The output is allocated uninitialised: poison what the allocator hands out and check no NaN survives."""
    cfg = CASES[1]
    x, w, b = tensors(cfg, torch.float32)
    w = torch.randn_like(w)
    x_before, w_before = x.clone(), w.clone()
    y = run(x, w, b, cfg, TF32X3)
    assert_close_rel(y, float64_reference(x, w, b, cfg), 1e-6)
    assert torch.equal(x, x_before) and torch.equal(w, w_before)


def test_strided_and_channels_last_operands_keep_pytorchs_memory_format():
    # Batch 2: PyTorch's kernel (oneDNN on the CPU, where a float32 layer this small at batch 1 goes to its slow
    # kernel; cuDNN) keeps the channels-last layout, so the kernel stores into a channels-last output.
    cfg = dict(CASES[0], batch=2)
    x, w, b = tensors(cfg, torch.float32)
    ref = float64_reference(x, w, b, cfg)
    x_cl = x.to(memory_format=torch.channels_last_3d)
    y = run(x_cl, w, b, cfg, TF32X3)
    assert y.stride() == F.conv_transpose3d(x_cl, w, b, **layer_args(cfg)).stride()
    assert y.is_contiguous(memory_format=torch.channels_last_3d)
    assert_close_rel(y, ref, 1e-6)
    x_t = x.transpose(3, 4).contiguous().transpose(3, 4)
    w_t = w.transpose(0, 1).contiguous().transpose(0, 1)
    assert_close_rel(run(x_t, w_t, b, cfg, TF32X3), ref, 1e-6)
    # Half precision reads the operands through their own strides.
    for xs, ws in ((x_cl, w), (x_t, w_t)):
        y = run(xs.bfloat16(), ws.bfloat16(), b.bfloat16(), cfg, NATIVE)
        assert_close_rel(y, float64_reference(xs.bfloat16(), ws.bfloat16(), b.bfloat16(), cfg), 1.5e-2)


@pytest.mark.parametrize("args, reason", [
    (dict(stride=2, padding=1), "padding"),
    (dict(stride=2, output_padding=1), "padding"),
    (dict(stride=(2, 2, 1)), "kernel_size differs"),
    (dict(stride=2, dilation=2), "dilation"),
    (dict(stride=2, groups=2), "groups"),
])
def test_layers_it_does_not_tile_say_why(args, reason):
    plan = make_plan((1, 4, 3, 3, 3), (4, 2, 2, 2, 2), **args)
    assert reason in tiled.unsupported_reason(plan)


def test_backend_triton_takes_it(monkeypatch):
    cfg = CASES[0]
    x, w, b = tensors(cfg, torch.float32)
    calls = []
    real = tiled.conv_transpose3d_tiled
    monkeypatch.setattr(tiled, "conv_transpose3d_tiled", lambda *a, **k: calls.append(1) or real(*a, **k))
    with torch.backends.cudnn.flags(allow_tf32=False):
        y = convt3d.conv_transpose3d(x, w, b, **layer_args(cfg), backend="triton")
    assert calls
    assert_close_rel(y, float64_reference(x, w, b, cfg), 1e-6)
    empty = convt3d.conv_transpose3d(x[:0], w, b, **layer_args(cfg), backend="triton")
    assert empty.shape == (0, *y.shape[1:])
