"""Problem 77 with the Triton phase convolution (GPU): per tile config, the forward (output filled, then the
phase's correlation stored into its lattice) and grad_input (the correlation of grad_output's lattice), against
cuDNN's phase convolutions and eager; accuracy against float64.

    PYTHONPATH=src python3 benchmarks/diag_phase_conv.py [--iters 30]

Every figure is a cold-L2 mean (bench.protocol.time_cuda) of the whole call, operand layout pass included.
"""

import argparse

import torch
import torch.nn.functional as F

from convt3d.backends import torch_phase as tp
from convt3d.backends.triton import backward as triton_backward
from convt3d.backends.triton import phase_conv as pc
from convt3d.backends.triton.forward import TF32, TF32X3, conv_transpose3d_triton
from convt3d.backends.triton.forward import _configs as _fused_configs
from convt3d.bench.protocol import relative_error, time_cuda
from convt3d.bench.workloads import PROBLEM_77, load_sweep


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=30)
    args = parser.parse_args()
    plan = PROBLEM_77.plan()
    (phase,) = plan.nonempty_phases
    phases = phase.axes
    x = torch.rand(PROBLEM_77.input_shape, device="cuda")
    w = torch.randn(PROBLEM_77.weight_shape(), device="cuda") * 0.05
    g = torch.randn(plan.output_shape, device="cuda")
    xd, wd, gd = x.double(), w.double().requires_grad_(), g.double()
    xd.requires_grad_()
    ref = F.conv_transpose3d(xd, wd, None, plan.stride, plan.padding, plan.output_padding, plan.groups, plan.dilation)
    ref.backward(gd)
    ref, ref_gi = ref.detach(), xd.grad
    lattice = (slice(None), slice(None), *(tp._out_slice(p, a) for p, a in zip(phases, plan.axes)))
    g_lat = g[lattice]
    wp = tp._phase_weight(w, phases, 1)
    wt = tp._taps(w, phases, descending=False)
    pads_fwd = [-p.input_start for p in phases]
    pads_bwd = [left for left, _ in tp.grad_input_pads(plan, phases)]
    dil = [p.input_dilation for p in phases]
    rows = []
    # (session 4 explored one-stage and 64-channel configs: none faster; benchmarks/RESULTS.md)
    explore = pc.CONFIGS[:2]

    def row(name, fn, check=None, reference=ref):
        err = f"{relative_error(check(fn()), reference):.1e}" if check else ""
        ms = time_cuda(fn, iters=args.iters).mean_ms
        rows.append((name, ms, err))
        print(f"{name:64s} {ms:8.4f} {err}", flush=True)

    same = lambda y: y

    def forward(cfg, precision=TF32, fill=True):
        out = torch.full(plan.output_shape, float("nan"), device="cuda") if not fill else torch.empty(
            plan.output_shape, device="cuda")
        if fill:
            out.zero_()
        pc.phase_conv(x, pads_fwd, wp, dil, 1, out[lattice], precision=precision, config=cfg)
        return out

    def grad_input(cfg, precision=TF32):
        gi = torch.full(x.shape, float("nan"), device="cuda")
        pc.phase_conv(g_lat, pads_bwd, wt, dil, 1, gi, precision=precision, config=cfg)
        return gi

    row("floor: empty + zero_", lambda: torch.empty(plan.output_shape, device="cuda").zero_())
    row("eager F.conv_transpose3d", lambda: F.conv_transpose3d(x, w, None, 2, 1, 0, 1, 2), same)
    row("phase path, cuDNN (backend=torch)", lambda: tp.conv_transpose3d(x, w, None, plan), same)
    row("fused Triton kernel (backend=triton)", lambda: conv_transpose3d_triton(x, w, None, plan), same)
    row("window pass alone (TF32)", lambda: pc.window(x, pads_fwd, [p.input_span for p in phases], TF32))
    row("window pass of g's lattice (TF32)", lambda: pc.window(g_lat, pads_bwd, x.shape[2:], TF32))
    for cfg in pc.CONFIGS[:2]:
        try:
            row(f"fwd fill + phase conv {cfg}", lambda: forward(cfg), same)
        except Exception as error:  # noqa: BLE001 (a config that does not fit: report and go on)
            print(f"fwd {cfg}: {type(error).__name__}: {error}"[:200])
    compact = torch.empty(g_lat.shape, device="cuda")
    for cfg in explore:
        try:
            row(f"phase conv into a compact tensor {cfg}",
                lambda: pc.phase_conv(x, pads_fwd, wp, dil, 1, compact, config=cfg))
        except Exception as error:  # noqa: BLE001
            print(f"fwd-only {cfg}: {type(error).__name__}: {error}"[:200])
    x_cl, wp_cl = x.contiguous(memory_format=torch.channels_last_3d), wp.contiguous(memory_format=torch.channels_last_3d)
    row("cuDNN compact conv, NCDHW", lambda: F.conv3d(x, wp, None, 1, 1, 1))
    row("cuDNN compact conv, channels-last operands", lambda: F.conv3d(x_cl, wp_cl, None, 1, 1, 1))
    for cfg in pc.CONFIGS[:1]:
        try:
            row(f"fwd 3xTF32 {cfg}", lambda: forward(cfg, TF32X3), same)
        except Exception as error:  # noqa: BLE001
            print(f"fwd 3xTF32 {cfg}: {type(error).__name__}: {error}"[:200])

    row("grad_input: cuDNN on the phase (current)", lambda: tp._phase_grad_input(g_lat, w, plan, phases), same,
        ref_gi)
    for cfg in explore:
        try:
            row(f"grad_input Triton {cfg}", lambda: grad_input(cfg), same, ref_gi)
        except Exception as error:  # noqa: BLE001
            print(f"grad_input {cfg}: {type(error).__name__}: {error}"[:200])
    for cfg in pc.CONFIGS[:1]:
        try:
            row(f"grad_input Triton 3xTF32 {cfg}", lambda: grad_input(cfg, TF32X3), same, ref_gi)
        except Exception as error:  # noqa: BLE001
            print(f"grad_input 3xTF32 {cfg}: {type(error).__name__}: {error}"[:200])

    # The whole backward as the op runs it: cuDNN or Triton grad_input, the Triton grad_weight.
    row("bwd both: cuDNN grad_input + Triton grad_weight", lambda: tp.conv_transpose3d_backward(
        g, x, w, plan, phase_grad_weight=triton_backward.phase_grad_weight))
    row("bwd both: same, one lattice copy shared by both", lambda: tp.conv_transpose3d_backward(
        g, x, w, plan, phase_grad_weight=triton_backward.phase_grad_weight, contiguous_lattice=True))
    row("bwd both: Triton grad_input + Triton grad_weight", lambda: tp.conv_transpose3d_backward(
        g, x, w, plan, phase_grad_weight=triton_backward.phase_grad_weight,
        add_phase_grad_input=pc.add_phase_grad_input))
    row("bwd grad_weight alone (Triton)", lambda: triton_backward.phase_grad_weight(g_lat, x, plan, phases))
    row("bwd lattice copy alone", lambda: g_lat.contiguous())

    # The sweep's layers (default precision, untuned: one config each): eager, the phase path with cuDNN, the fused
    # Triton kernel, and the output filled then each phase written by the Triton phase convolution.
    for layer in load_sweep(None):
        dtype = getattr(torch, layer.dtype)
        lx = torch.rand(layer.input_shape, device="cuda", dtype=dtype)
        lw = (torch.randn(layer.weight_shape(), device="cuda") * 0.05).to(dtype)
        lb = torch.randn(layer.out_channels, device="cuda", dtype=dtype) if layer.bias else None
        lplan = layer.plan()
        lref = F.conv_transpose3d(lx.double(), lw.double(), None if lb is None else lb.double(), lplan.stride,
                                  lplan.padding, lplan.output_padding, lplan.groups, lplan.dilation)

        def write(inp, weight, bias, plan_, phases_, view):
            pc.phase_conv(inp, [-p.input_start for p in phases_], tp._phase_weight(weight, phases_, plan_.groups),
                          [p.input_dilation for p in phases_], plan_.groups, view, bias, config=pc.CONFIGS[0])

        variants = {
            "eager": lambda: F.conv_transpose3d(lx, lw, lb, lplan.stride, lplan.padding, lplan.output_padding,
                                                lplan.groups, lplan.dilation),
            "phase cuDNN": lambda: tp.conv_transpose3d(lx, lw, lb, lplan),
            "fused Triton": lambda: conv_transpose3d_triton(lx, lw, lb, lplan, config=_fused_configs()[0]),
            "phase Triton": lambda: tp.conv_transpose3d(lx, lw, lb, lplan, write_phase=write),
        }
        for name, fn in variants.items():
            row(f"sweep {layer.name} {name}", fn, lambda y: y.double(), lref)

    print("\nsummary (ms, rel err vs float64)")
    for name, ms, err in rows:
        print(f"{name:64s} {ms:8.4f} {err}")


if __name__ == "__main__":
    main()
