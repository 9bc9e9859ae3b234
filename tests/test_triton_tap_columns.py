"""The Triton forward with the W taps as GEMM columns (backends/triton/tap_columns.py), under TRITON_INTERPRET=1 on
the CPU (and natively on a GPU)."""

import random

import pytest
import torch
import torch.nn.functional as F

from conftest import (assert_close_rel, float64_reference, layer_args, random_config, run_in_sample,
                      skip_without_usable_triton)

skip_without_usable_triton()
from convt3d.backends.triton import forward, tap_columns  # noqa: E402
from convt3d.backends.triton.forward import NATIVE, TF32, TF32X3  # noqa: E402
from convt3d.plan import make_plan, plan_axis  # noqa: E402
from test_triton_forward import round_to_tf32, tensors  # noqa: E402


def layer(kernel, stride, padding, spatial, in_channels=5, out_channels=3, batch=1, groups=1, dilation=1,
          output_padding=0, bias=True):
    return dict(batch=batch, in_channels=in_channels, out_channels=out_channels, groups=groups, kernel_size=kernel,
                stride=stride, padding=padding, dilation=dilation, output_padding=output_padding, spatial=spatial,
                bias=bias)


CASES = [
    # k4 s2 p1 (VAE decoder): taps reaching both column phases, shifts -1, 0 and 1; a plane's 12 x (9 + 2) slots over
    # several programs whose tiles overlap by the halo, with every config (32 slots here, 64 and 128 on a GPU).
    layer((4, 4, 4), 2, 1, (2, 12, 9)),
    # k3 s2 p1 output_padding 1 (video decoder), over two groups, channels not a multiple of the K block.
    layer((3, 3, 3), 2, 1, (2, 4, 6), in_channels=20, out_channels=6, groups=2, output_padding=1, batch=2),
    # k3 s1 p1: one column phase, three shifts; more output channels than one block.
    layer((3, 3, 3), 1, 1, (2, 3, 7), in_channels=6, out_channels=40),
    # k3 s1 p1 with three channel blocks of 16, the last partial: a program's K-steps walk every depth tap, height tap
    # and channel block, their counters wrapping at each.
    layer((3, 3, 3), 1, 1, (3, 3, 5), in_channels=36, out_channels=4),
    # Problem 77 in miniature: dilation 2, one column phase of two empty.
    layer((3, 3, 3), 2, 1, (3, 3, 6), in_channels=4, out_channels=8, dilation=2, bias=False),
    # Mixed strides and dilations along D and H, KW = 1 (no shift), width 1.
    layer((2, 3, 1), (3, 2, 1), (1, 0, 0), (2, 3, 1), dilation=(2, 1, 1), output_padding=(1, 1, 0)),
    # Padding larger than the kernel along W: whole column phases read nothing, shifts all positive.
    layer((1, 2, 3), (1, 2, 2), (0, 1, 4), (2, 3, 9), output_padding=(0, 1, 1)),
    # k3 s2 p1 output_padding 1 along W (the video decoder's columns) by 16 output channels: two column groups, taps
    # 1 and 2 (shift 0) and tap 0 (shift 1: its A tile a slot further on, or gathered under 3xTF32).
    layer((1, 2, 3), (1, 2, 2), (0, 1, 1), (2, 3, 7), in_channels=6, out_channels=16, output_padding=(0, 1, 1)),
    # k3 s2 p0 along W: taps 0 and 1 (shift 1) and tap 2 (shift 0), two A tiles a K-step (under 3xTF32 one, taps 0
    # and 1 gathered).
    layer((1, 1, 3), (1, 1, 2), 0, (2, 3, 6), in_channels=6, out_channels=16, output_padding=(0, 0, 1)),
]

# The interpreter's config (on a GPU: the first of the library's, the one with the fewest slots per tile and the one
# with the most columns).
_LIBRARY = tap_columns.configs()
CONFIGS = list({repr(cfg): cfg for cfg in (_LIBRARY[0], min(_LIBRARY, key=lambda cfg: cfg["BLOCK_M"]),
                                           max(_LIBRARY, key=lambda cfg: cfg["BLOCK_N"]))}.values())


def run(x, w, b, cfg, precision, config):
    plan = make_plan(tuple(x.shape), tuple(w.shape), **layer_args(cfg))
    assert tap_columns.unsupported_reason(plan) is None
    y = forward.conv_transpose3d_triton(x, w, b, plan, precision=precision, config=config)
    assert y.shape == plan.output_shape
    return y


@pytest.mark.parametrize("config", CONFIGS, ids=range(len(CONFIGS)))
@pytest.mark.parametrize("cfg", CASES, ids=range(len(CASES)))
def test_tf32_rounds_operands_to_nearest(cfg, config):
    x, w, b = tensors(cfg, torch.float32)
    y = run(x, w, b, cfg, TF32, config)
    # Exactly the products of the TF32-rounded operands, summed in float32.
    assert_close_rel(y, float64_reference(round_to_tf32(x), round_to_tf32(w), b, cfg), 1e-6)
    assert_close_rel(y, float64_reference(x, w, b, cfg), 2e-3)  # TF32 keeps 11 significant bits


@pytest.mark.parametrize("cfg", CASES, ids=range(len(CASES)))
def test_tf32x3_is_float32_accurate(cfg):
    x, w, b = tensors(cfg, torch.float32)
    assert_close_rel(run(x, w, b, cfg, TF32X3, CONFIGS[0]), float64_reference(x, w, b, cfg), 1e-6)


# float16 keeps 11 significant bits, bfloat16 8: the output's own rounding dominates.
@pytest.mark.parametrize("dtype, rel", [(torch.float16, 2e-3), (torch.bfloat16, 1.5e-2)])
@pytest.mark.parametrize("cfg", CASES[:3], ids=range(3))
def test_half_precision(cfg, dtype, rel):
    run_in_sample((CASES.index(cfg) + (dtype == torch.bfloat16)) % 2 == 0)  # each case in one dtype, in turn
    x, w, b = tensors(cfg, dtype)
    y = run(x, w, b, cfg, NATIVE, CONFIGS[0])
    assert y.dtype == dtype
    assert_close_rel(y, float64_reference(x, w, b, cfg), rel)


@pytest.mark.parametrize("seed", range(8))
def test_random_layers_tf32x3(seed):
    run_in_sample(seed % 2 == 0)
    rng = random.Random(9100 + seed)
    cfg = random_config(rng)
    while tap_columns.unsupported_reason(make_plan(
            (1, cfg["in_channels"], *cfg["spatial"]),
            (cfg["in_channels"], cfg["out_channels"] // cfg["groups"], *cfg["kernel_size"]), **layer_args(cfg))):
        cfg = random_config(rng)
    cfg["batch"] = max(1, cfg["batch"])
    x, w, b = tensors(cfg, torch.float32)
    assert_close_rel(run(x, w, b, cfg, TF32X3, CONFIGS[0]), float64_reference(x, w, b, cfg), 1e-6, str(cfg))


def test_every_element_written_and_inputs_untouched(nan_poisoned_allocator):
    """The output is allocated uninitialised: poison what the allocator hands out and check no NaN survives."""
    cfg = CASES[1]
    x, w, b = tensors(cfg, torch.float32)
    x_before, w_before = x.clone(), w.clone()
    y = run(x, w, b, cfg, TF32X3, CONFIGS[0])
    assert_close_rel(y, float64_reference(x, w, b, cfg), 1e-6)
    assert torch.equal(x, x_before) and torch.equal(w, w_before)


def test_channels_last_input_keeps_pytorchs_memory_format():
    cfg = CASES[0]
    x, w, b = tensors(cfg, torch.float32)
    x_cl = x.to(memory_format=torch.channels_last_3d)
    y = run(x_cl, w, b, cfg, TF32X3, CONFIGS[0])
    assert y.stride() == F.conv_transpose3d(x_cl, w, b, **layer_args(cfg)).stride()
    assert y.is_contiguous(memory_format=torch.channels_last_3d)  # the kernel's channels-last store, exercised
    assert_close_rel(y, float64_reference(x, w, b, cfg), 1e-6)


@pytest.mark.parametrize("kernel, args, reason", [
    ((3, 3, 3), dict(stride=3), "stride along W"),
    ((1, 1, 10), dict(), "span more than 8"),
])
def test_layers_it_does_not_serve_say_why(kernel, args, reason):
    plan = make_plan((1, 4, 3, 3, 12), (4, 2, *kernel), **args)
    assert reason in tap_columns.unsupported_reason(plan)
    assert not any(cfg.get("KERNEL") == "tap_columns" for cfg in forward.candidates(plan))


@pytest.mark.parametrize("kw, out_channels, block_n, layout", [
    (3, 64, 192, (64, 2, 1)),  # 2 + 1 taps by 64 channels: 192 columns, none padding
    (3, 64, 128, (32, 2, 1)),
    (4, 64, 192, (32, 4, 0)),  # a power of two: one group
    (3, 8, 128, (8, 4, 0)),  # 1 tap by 8 channels is narrower than a tensor-core tile: one padded group
    (5, 64, 128, (16, 4, 1)),
    (7, 64, 128, (16, 8, 0)),  # 4 + 4 pads as many columns as 8
    (1, 3, 48, (16, 1, 0)),  # at least 16 columns
])
def test_column_layout(kw, out_channels, block_n, layout):
    plan = make_plan((1, 4, 3, 3, 12), (4, out_channels, 1, 1, kw))
    assert tap_columns.column_layout(plan, block_n) == layout


def test_configs_that_come_to_the_same_tiles_are_timed_once(monkeypatch):
    monkeypatch.setattr(tap_columns, "interpreted", lambda: False)  # the library's GPU configs
    library = tap_columns.configs()

    def tiles(plan, cfg):
        return (cfg["BLOCK_M"], tap_columns.column_layout(plan, cfg["BLOCK_N"]), cfg["BLOCK_CI"], cfg["num_warps"],
                cfg["num_stages"])

    for kernel in (3, 4):
        plan = make_plan((1, 4, 3, 3, 12), (4, 64, kernel, kernel, kernel), stride=2, padding=1)
        kept = tap_columns.configs(plan)
        assert len({tiles(plan, cfg) for cfg in kept}) == len(kept)
        assert {tiles(plan, cfg) for cfg in kept} == {tiles(plan, cfg) for cfg in library}
    # KW = 4 by 64 channels: a 192-column budget comes to 4 taps by 32 channels, as 128 columns do.
    assert len(tap_columns.configs(plan)) < len(library)


def test_cases_cover_both_column_layouts():
    layouts = [tap_columns.column_layout(make_plan((1, c["in_channels"], *c["spatial"]), (
        c["in_channels"], c["out_channels"] // c["groups"], *c["kernel_size"]), **layer_args(c)), CONFIGS[0]["BLOCK_N"])
        for c in CASES]
    assert any(kw_b for _, _, kw_b in layouts)
    assert any(not kw_b and c["kernel_size"][2] == 3 for (_, _, kw_b), c in zip(layouts, CASES))


@pytest.mark.parametrize("precision, rel", [(TF32X3, 1e-6), (TF32, 2e-3)])
def test_five_taps_in_groups_of_four_and_one(precision, rel):
    cfg = layer((1, 2, 5), (1, 2, 1), (0, 1, 2), (2, 3, 9), in_channels=6, out_channels=20)
    config = dict(CONFIGS[0], BLOCK_N=80)  # 16 channels by 4 + 1 taps
    plan = make_plan((1, 6, 2, 3, 9), (6, 20, 1, 2, 5), **layer_args(cfg))
    assert tap_columns.column_layout(plan, 80) == (16, 4, 1)
    x, w, b = tensors(cfg, torch.float32)
    assert_close_rel(run(x, w, b, cfg, precision, config), float64_reference(x, w, b, cfg), rel)


def test_shifts_and_halo():
    # k4 s2 p1: taps 1, 3 reach even columns from input columns u and u - 1, taps 0, 2 odd ones from u + 1 and u.
    assert tap_columns.w_shifts(make_plan((1, 1, 2, 2, 2), (1, 1, 4, 4, 4), stride=2, padding=1)) == (-1, 2)
    # k2 s2 (kernel == stride): every tap from input column u.
    assert tap_columns.w_shifts(make_plan((1, 1, 2, 2, 2), (1, 1, 2, 2, 2), stride=2)) == (0, 0)


@pytest.mark.parametrize("kernel, stride, padding, shifted_tiles, groups, halo", [
    (3, 2, 1, True, (1, 0, 0, 1), 0),  # shifts 1, 0, 0: taps 1 and 2 on the tile, tap 0 one slot further on
    (3, 2, 1, False, (1, 0, 0, -1), 1),  # (3xTF32) taps 1 and 2 on the tile, tap 0 gathered
    (3, 2, 0, True, (0, 2, 1, 0), 0),  # shifts 1, 1, 0: taps 0 and 1 one slot further on, tap 2 on the tile
    (3, 2, 0, False, (0, 2, -1, 0), 1),  # (3xTF32) taps 0 and 1 gathered, tap 2 on their tile
    (3, 1, 1, True, (0, 2, -1, 0), 2),  # shifts 2, 1, 0: taps 0 and 1 gathered, tap 2 on their tile
    (4, 2, 1, True, (0, 4, -1, 0), 2),  # shifts 2, 1, 1, 0: one group of four, gathered
])
def test_tap_groups_read_shifted_tiles_where_a_groups_shifts_agree(kernel, stride, padding, shifted_tiles, groups,
                                                                   halo):
    plan = make_plan((1, 32, 2, 2, 8), (32, 16, 1, 1, kernel), stride=(1, 1, stride), padding=(0, 0, padding))
    _, kw_a, kw_b = tap_columns.column_layout(plan, 128)
    assert tap_columns.tap_groups(plan, kw_a, kw_b, shifted_tiles) == groups
    assert dict(tap_columns._geometry(plan, 64, 128, 32, None, None, shifted_tiles)[3])["HALO"] == halo


@pytest.mark.parametrize("kernel, stride, padding, dilation, order", [
    (3, 2, 1, 1, 1),  # k3 s2 p1: phase 1 has taps 0 and 2, phase 0 tap 1
    (3, 2, 1, 2, 1),  # problem 77: every tap in phase 1
    (4, 2, 1, 1, -1),  # two taps a phase: the order of v
    (3, 1, 1, 1, -1),  # one phase
    (2, 3, 1, 2, 1 | 2 << 4),  # taps in phases 2 and 1, none in 0: (1, 2, 0)
    (3, 9, 0, 1, -1),  # above 8 phases
])
def test_phase_order(kernel, stride, padding, dilation, order):
    assert tap_columns.phase_order(plan_axis(4, kernel, stride, padding, dilation, 0)) == order


def test_planes_by_taps_on_small_grids_only():
    plan = make_plan((1, 64, 8, 64, 64), (64, 32, 3, 3, 3), stride=2, padding=1, output_padding=1)

    def by_taps(multiprocessors):
        return dict(tap_columns._geometry(plan, 128, 128, 32, multiprocessors, None)[3])["BY_TAPS"]

    programs = 16 * 2 * 32  # (od, v_h) planes by 32 tiles of 128 output slots (no halo), one channel block
    assert by_taps(None) and by_taps(-(-programs // tap_columns.BY_TAPS_WAVES))
    assert not by_taps(programs // tap_columns.BY_TAPS_WAVES - 1)
    balanced = make_plan((1, 64, 8, 64, 64), (64, 32, 4, 4, 4), stride=2, padding=1)
    assert not dict(tap_columns._geometry(balanced, 128, 128, 32, None, None)[3])["BY_TAPS"]


# The old plane order (a GPU's on large grids) on the cases whose phases differ. Under the interpreter the other tests
# take them in the new order, depth planes past the output's included (CASES[4]: OD odd; CASES[5]: S_D = 3, one phase
# empty).
@pytest.mark.parametrize("cfg", [CASES[1], CASES[4], CASES[5]], ids=range(3))
def test_old_plane_order(cfg):
    x, w, b = tensors(cfg, torch.float32)
    plan = make_plan(tuple(x.shape), tuple(w.shape), **layer_args(cfg))
    assert dict(tap_columns._geometry(plan, 32, 48, 16, None, None)[3])["BY_TAPS"]
    assert_close_rel(run(x, w, b, cfg, TF32X3, dict(CONFIGS[0], BY_TAPS=False)), float64_reference(x, w, b, cfg), 1e-6)
