"""The Triton copy of a lone phase's result into the output's lattice rows, under TRITON_INTERPRET=1 on the CPU
(and natively on a GPU), through the phase path's forward with the GPU's whole-output fill."""

import random

import pytest
import torch

from conftest import assert_close_rel, layer_args, make_tensors, random_config
from test_triton_forward import CASES

pytest.importorskip("triton")
from convt3d.backends import torch_phase  # noqa: E402
from convt3d.backends.triton.lattice import copy_into_lattice  # noqa: E402
from convt3d.plan import make_plan  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def one_phase_configs(count: int, seed: int):
    """Random layers whose output one phase receives, the rest empty (dilation a multiple of the stride, or
    a kernel narrower than the stride): the case the kernel serves."""
    rng, found = random.Random(seed), []
    while len(found) < count:
        cfg = dict(random_config(rng), unbatched=False)
        cfg["batch"] = max(1, cfg["batch"])
        plan = make_plan((cfg["batch"], cfg["in_channels"], *cfg["spatial"]),
                         (cfg["in_channels"], cfg["out_channels"] // cfg["groups"], *cfg["kernel_size"]),
                         **layer_args(cfg))
        if len(plan.nonempty_phases) == 1 and plan.empty_fraction > 0:
            found.append(cfg)
    return found


def forward(x, w, b, cfg, monkeypatch):
    """(the phase path's output with the lattice rows written by the kernel, how many times it ran)."""
    monkeypatch.setitem(torch_phase.FILL_WHOLE_OUTPUT, x.device.type, True)
    calls = []

    def writer(*args):
        calls.append(1)
        copy_into_lattice(*args)

    plan = make_plan(tuple(x.shape), tuple(w.shape), **layer_args(cfg))
    return torch_phase.conv_transpose3d(x, w, b, plan, copy_into_lattice=writer), len(calls)


@pytest.mark.parametrize("cfg", [dict(CASES[0], unbatched=False), *one_phase_configs(12, 77)], ids=range(13))
def test_matches_pytorch(cfg, monkeypatch):
    x, w, b = make_tensors(cfg, torch.float64, DEVICE)
    ours, calls = forward(x, w, b, cfg, monkeypatch)
    assert calls == 1
    assert_close_rel(ours, torch.nn.functional.conv_transpose3d(x, w, b, **layer_args(cfg)), 1e-10, str(cfg))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_same_bits_as_the_strided_copy(dtype, monkeypatch):
    """A copy: the output equals the strided copy's bit for bit, bias and half precision included."""
    cfg = dict(CASES[0], bias=True, unbatched=False)
    x, w, b = (t.to(dtype) for t in make_tensors(cfg, torch.float32, DEVICE))
    ours, calls = forward(x, w, b, cfg, monkeypatch)
    strided = torch_phase.conv_transpose3d(x, w, b, make_plan(tuple(x.shape), tuple(w.shape), **layer_args(cfg)))
    assert calls == 1 and ours.dtype == dtype
    assert torch.equal(ours, strided)


def test_reads_a_result_of_any_strides():
    cfg = dict(CASES[0], unbatched=False)
    x, w, _ = make_tensors(cfg, torch.float64, DEVICE)
    plan = make_plan(tuple(x.shape), tuple(w.shape), **layer_args(cfg))
    ((_, phases),) = torch_phase._regions(plan, True)
    part = torch_phase._phase_conv(x, w, None, plan, phases)
    outs = []
    for p in (part, part.contiguous(memory_format=torch.channels_last_3d)):
        out = torch.zeros(plan.output_shape, dtype=x.dtype, device=DEVICE)
        copy_into_lattice(out, p, None, plan, phases)
        outs.append(out)
    assert torch.equal(*outs)
    assert_close_rel(outs[0], torch.nn.functional.conv_transpose3d(x, w, None, **layer_args(cfg)), 1e-10)
