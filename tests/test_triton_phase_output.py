"""The whole output written from its only phase, under TRITON_INTERPRET=1 on the CPU (and natively on a GPU)."""

import random

import pytest
import torch
import torch.nn.functional as F

from conftest import assert_close_rel, layer_args, make_tensors

triton = pytest.importorskip("triton")
from convt3d.backends import torch_phase  # noqa: E402
from convt3d.backends.triton.phase_output import (  # noqa: E402
    LATTICE_ROWS, ROWS_OFF_LATTICE, write_phase_output)
from convt3d.plan import make_plan  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def one_phase_config(rng: random.Random) -> dict:
    """A random layer whose taps all reach one phase: each axis's dilation a multiple of its stride (or stride 1,
    on some axes only, so that other phases stay empty), with random padding, output padding, groups and bias."""
    while True:
        groups = rng.choice([1, 1, 2])
        stride = tuple(rng.choice([1, 2, 2, 3]) for _ in range(3))
        if max(stride) == 1:
            continue
        cfg = dict(
            batch=rng.choice([1, 2]), in_channels=groups * rng.randint(1, 3), out_channels=groups * rng.randint(1, 3),
            groups=groups, kernel_size=tuple(rng.randint(1, 3) for _ in range(3)), stride=stride,
            padding=tuple(rng.randint(0, 3) for _ in range(3)),
            dilation=tuple(s * rng.randint(1, 2) for s in stride),
            spatial=tuple(rng.randint(1, 6) for _ in range(3)), bias=rng.random() < 0.5, unbatched=False,
        )
        cfg["output_padding"] = tuple(rng.randint(0, s - 1) for s in stride)
        try:
            plan = make_plan((cfg["batch"], cfg["in_channels"], *cfg["spatial"]),
                             (cfg["in_channels"], cfg["out_channels"] // groups, *cfg["kernel_size"]),
                             **layer_args(cfg))
        except ValueError:  # an output size below 1
            continue
        if torch_phase._only_phase(plan) is not None:
            return cfg


def written(cfg, dtype, y_layout=torch.contiguous_format):
    """(the output written by the kernel over NaN, the float64 reference, x, w, b, plan)."""
    x, w, b = (t if t is None else t.to(dtype) for t in make_tensors(cfg, torch.float64, DEVICE))
    plan = make_plan(tuple(x.shape), tuple(w.shape), **layer_args(cfg))
    phases = torch_phase._only_phase(plan)
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):  # so that float32 compares at float32's rounding
        y = torch_phase._phase_conv(x, w, b, plan, phases).contiguous(memory_format=y_layout)
    out = torch.full(plan.output_shape, float("nan"), dtype=dtype, device=DEVICE)
    write_phase_output(out, y, b, plan, phases)
    reference = F.conv_transpose3d(x.double(), w.double(), None if b is None else b.double(), **layer_args(cfg))
    return out, reference, x, w, b, plan


@pytest.mark.parametrize("dtype, rel", [(torch.float64, 1e-12), (torch.float32, 1e-5), (torch.float16, 2e-3)])
@pytest.mark.parametrize("seed", range(6))
def test_random_one_phase_layers(seed, dtype, rel):
    """Every element written (over NaN), equal to the phase path's fill and strided copy bit for bit, and to
    float64 within the dtype's rounding of the phase's convolution."""
    out, reference, x, w, b, plan = written(one_phase_config(random.Random(seed)), dtype)
    assert_close_rel(out, reference, rel)
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        assert torch.equal(out, torch_phase.conv_transpose3d(x, w, b, plan))


@pytest.mark.parametrize("bias", [False, True])
def test_problem_77_small(bias):
    """Problem 77's layer (stride 2, padding 1, dilation 2: only odd outputs reach a tap) at a small size, from a
    channels-last compact result: the kernel reads any strides."""
    cfg = dict(batch=2, in_channels=3, out_channels=5, groups=1, kernel_size=(3, 3, 3), stride=2, padding=1,
               dilation=2, output_padding=0, spatial=(3, 4, 5), bias=bias, unbatched=False)
    out, reference, *_ = written(cfg, torch.float64, torch.channels_last_3d)
    assert_close_rel(out, reference, 1e-12)


@pytest.mark.parametrize("seed", range(4))
def test_rows_off_the_lattice_then_the_lattice_rows(seed):
    """The output written in two passes, the rows off the lattice (before y exists) and then the lattice's rows
    whole: the same output as one pass, every element written once (over NaN: the first pass leaves the lattice's
    rows unwritten)."""
    expected, _, x, w, b, plan = written(one_phase_config(random.Random(seed)), torch.float32)
    phases = torch_phase._only_phase(plan)
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        y = torch_phase._phase_conv(x, w, b, plan, phases)
    out = torch.full(plan.output_shape, float("nan"), device=DEVICE)
    write_phase_output(out, None, b, plan, phases, kind=ROWS_OFF_LATTICE)
    index = (slice(None), slice(None), *(slice(p.out_start, None, s) for p, s in zip(phases[:2], plan.stride[:2])))
    assert out[index][:, :, :phases[0].out_count, :phases[1].out_count].isnan().all()
    write_phase_output(out, y, b, plan, phases, kind=LATTICE_ROWS)
    assert torch.equal(out, expected)


def test_only_one_reached_phase_is_served():
    """Layers with several reached phases, or none empty, keep the fill-and-copy path: _only_phase says None."""
    def plan(stride, dilation):
        return make_plan((1, 2, 4, 4, 4), (2, 2, 3, 3, 3), stride, 1, 0, 1, dilation)

    assert torch_phase._only_phase(plan(2, 2)) is not None
    assert torch_phase._only_phase(plan(2, 1)) is None  # taps reach every phase
    assert torch_phase._only_phase(plan(1, 1)) is None  # one phase, nothing empty
