"""Problem 77 taken apart (GPU): what each piece of the phase path costs, forward and backward, in NCDHW and
channels-last layouts (p77); Triton fills of the output, aligned or not (fill); the Triton weight gradient's
configs (grad_weight); the output written from the compact result whole or in chunks of samples (assemble);
forward+backward and its parts (fwdbwd); and, over the sweep's layers, the phase
path with its convolutions NCDHW or channels-last (sweep).

    PYTHONPATH=src python3 benchmarks/diag_phases.py [--iters 30] [--only p77,fill,assemble,grad_weight,fwdbwd,sweep]

Every figure is a cold-L2 mean (bench.protocol.time_cuda). Problem 77 has one phase that taps reach (odd
outputs along every axis), so its pieces are: the compact convolution (16x32x16^3-ish -> 16x64x16x32x32), the
bias/zero fill, and the copy of the compact result into the output's lattice.
"""

import argparse

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from convt3d.backends import torch_phase as tp
from convt3d.backends.triton import backward as triton_backward
from convt3d.bench.protocol import relative_error, time_cuda
from convt3d.bench.workloads import PROBLEM_77, load_sweep
from convt3d.ops import conv_transpose3d_backward_op as backward_op

CL = torch.channels_last_3d


@triton.jit
def _fill_flat(out_ptr, TOTAL, BLOCK: tl.constexpr):
    """Zeros in aligned blocks of the flat output: every memory sector written whole by one program."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.zeros([BLOCK], tl.float32), mask=offs < TOTAL)


@triton.jit
def _fill_flat_persistent(out_ptr, TOTAL, BLOCKS, BLOCK: tl.constexpr):
    """As _fill_flat, with one program per multiprocessor slot looping over the blocks."""
    for block in range(tl.program_id(0), BLOCKS, tl.num_programs(0)):
        offs = block.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out_ptr + offs, tl.zeros([BLOCK], tl.float32), mask=offs < TOTAL)


@triton.jit
def _fill_slabs(out_ptr, PLANE, BLOCK: tl.constexpr):
    """Zeros by (n, c, od) slabs of PLANE elements: where PLANE is odd, blocks start unaligned and neighbouring
    programs share memory sectors."""
    e = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + tl.program_id(0).to(tl.int64) * PLANE + e, tl.zeros([BLOCK], tl.float32), mask=e < PLANE)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--only", default="p77,fill,grad_weight,fwdbwd,sweep")
    args = parser.parse_args()
    sections = args.only.split(",")
    plan, phases, x, w = PROBLEM_77.phase_case("cuda")
    g = torch.randn(plan.output_shape, device="cuda")
    ref = F.conv_transpose3d(x.double(), w.double(), None, plan.stride, plan.padding, plan.output_padding,
                             plan.groups, plan.dilation)
    rows = []
    args77 = ([2] * 3, [1] * 3, [0] * 3, 1, [2] * 3)

    def row(name, fn, check=None):
        ms = time_cuda(fn, iters=args.iters).mean_ms
        err = f"{relative_error(check(fn()), ref):.1e}" if check else ""
        rows.append((name, ms, err))
        print(f"{name:58s} {ms:8.4f} {err}", flush=True)

    same = lambda y: y
    x_cl = x.contiguous(memory_format=CL)
    wp = tp._phase_weight(w, phases, 1)
    wp_cl = wp.contiguous(memory_format=CL)
    xp = tp._phase_input(x, plan, phases)
    part = tp._phase_conv(x, w, None, plan, phases)
    lattice = (slice(None), slice(None), *(tp._out_slice(p, a) for p, a in zip(phases, plan.axes)))

    def fill_copy():
        out = torch.empty(plan.output_shape, device="cuda")
        out.zero_()
        out[lattice].copy_(part)
        return out

    # Backward pieces: g's lattice is the compact grad_output of the one phase.
    g_lat = g[lattice]
    g_c = g_lat.contiguous()
    g_c_cl = g_lat.contiguous(memory_format=CL)
    wt = tp._taps(w, phases, descending=False)
    wt_cl = wt.contiguous(memory_format=CL)

    if "p77" in sections:
        row("floor: empty + zero_", lambda: torch.empty(plan.output_shape, device="cuda").zero_())
        row("eager F.conv_transpose3d", lambda: F.conv_transpose3d(x, w, None, 2, 1, 0, 1, 2), same)
        row("eager, channels_last input", lambda: F.conv_transpose3d(x_cl, w, None, 2, 1, 0, 1, 2), same)
        row("phase path (backend=torch)", lambda: tp.conv_transpose3d(x, w, None, plan), same)
        tp.CONV_CHANNELS_LAST["cuda"] = True
        row("phase path, channels-last conv", lambda: tp.conv_transpose3d(x, w, None, plan), same)
        tp.CONV_CHANNELS_LAST["cuda"] = False
        row("compact conv NCDHW", lambda: F.conv3d(xp, wp, None, 1, 0, 1))
        row("compact conv, padding in conv (no F.pad)", lambda: F.conv3d(x, wp, None, 1, 1, 1))
        row("compact conv CL (operands CL beforehand)", lambda: F.conv3d(x_cl, wp_cl, None, 1, 1, 1))
        row("compact conv CL incl. input conversion", lambda: F.conv3d(x.contiguous(memory_format=CL), wp_cl, None,
                                                                       1, 1, 1))
        row("fill + strided copy", fill_copy, same)

        row("bwd aten convolution_backward (both)", lambda: torch.ops.aten.convolution_backward(
            g, x, w, None, [2] * 3, [1] * 3, [2] * 3, True, [0] * 3, 1, [True, True, False]))
        row("bwd aten grad_input only", lambda: torch.ops.aten.convolution_backward(
            g, x, w, None, [2] * 3, [1] * 3, [2] * 3, True, [0] * 3, 1, [True, False, False]))
        row("bwd aten grad_weight only", lambda: torch.ops.aten.convolution_backward(
            g, x, w, None, [2] * 3, [1] * 3, [2] * 3, True, [0] * 3, 1, [False, True, False]))
        row("bwd phase, aten ops only (both)", lambda: tp.conv_transpose3d_backward(g, x, w, plan))
        row("bwd convt3d op: phases + Triton grad_weight (both)", lambda: backward_op(g, x, w, *args77, True, True))
        row("bwd convt3d op, grad_input only", lambda: backward_op(g, x, w, *args77, True, False))
        row("bwd convt3d op, grad_weight only", lambda: backward_op(g, x, w, *args77, False, True))
        # Both gradients from the lattice copied out channels-last: cuDNN's grad_input reads it without its own
        # layout conversion, its result made contiguous after, and the Triton grad_weight reads it in place.

        def both_from(memory_format):
            def run():
                lattice = g_lat.contiguous(memory_format=memory_format)
                grad_input = tp.phase_grad_input(lattice, w, plan, phases).contiguous()
                return grad_input, triton_backward.phase_grad_weight(lattice, x, plan, phases)
            return run

        (gi_a, gw_a), (gi_b, gw_b) = both_from(torch.contiguous_format)(), both_from(CL)()
        agree = (f"grad_weight equal: {torch.equal(gw_a, gw_b)}, "
                 f"grad_input rel diff {relative_error(gi_b, gi_a.double()):.1e}")
        for _ in range(2):
            row("bwd both, lattice NCDHW (as the op)", both_from(torch.contiguous_format))
            row(f"bwd both, lattice channels-last ({agree})", both_from(CL))
        row("bwd extract lattice NCDHW", lambda: g_lat.contiguous())
        row("bwd extract lattice CL", lambda: g_lat.contiguous(memory_format=CL))
        row("bwd grad_input compact NCDHW", lambda: F.conv3d(g_c, wt, None, 1, 1, 1))
        row("bwd grad_input compact CL", lambda: F.conv3d(g_c_cl, wt_cl, None, 1, 1, 1))
        with torch.backends.cudnn.flags(enabled=True, benchmark=True, allow_tf32=True):  # cuDNN's own search
            row("bwd grad_input compact NCDHW, cudnn.benchmark", lambda: F.conv3d(g_c, wt, None, 1, 1, 1))
            row("the forward's compact conv (tp._phase_conv), cudnn.benchmark",
                lambda: tp._phase_conv(x, w, None, plan, phases))
        row("the forward's compact conv (tp._phase_conv)", lambda: tp._phase_conv(x, w, None, plan, phases))
        row("bwd grad_weight compact NCDHW", lambda: torch.ops.aten.convolution_backward(
            g_c, x, wp, None, [1] * 3, [1] * 3, [1] * 3, False, [0] * 3, 1, [False, True, False]))
        row("bwd grad_weight compact CL", lambda: torch.ops.aten.convolution_backward(
            g_c_cl, x_cl, wp_cl, None, [1] * 3, [1] * 3, [1] * 3, False, [0] * 3, 1, [False, True, False]))
        row("bwd grad_bias (sum of g)", lambda: g.sum(dim=(0, 2, 3, 4)))
        gi, gw, _ = torch.ops.aten.convolution_backward(g, x, w, None, [2] * 3, [1] * 3, [2] * 3, True, [0] * 3,
                                                       1, [True, True, False])
        gi_c = F.conv3d(g_c, wt, None, 1, 1, 1)
        _, gw_c, _ = torch.ops.aten.convolution_backward(g_c, x, wp, None, [1] * 3, [1] * 3, [1] * 3, False,
                                                         [0] * 3, 1, [False, True, False])
        oi, ow = backward_op(g, x, w, *args77, True, True)
        print(f"compact grads vs aten: grad_input {relative_error(gi_c, gi.double()):.1e}, grad_weight "
              f"{relative_error(gw_c.transpose(0, 1).flip(2, 3, 4), gw.double()):.1e}; convt3d op vs aten: "
              f"grad_input {relative_error(oi, gi.double()):.1e}, grad_weight {relative_error(ow, gw.double()):.1e}")

    if "fill" in sections:
        n_, c_, od_, oh_, ow_ = plan.output_shape
        y = torch.empty(plan.output_shape, device="cuda")
        row("fill: torch zero_", lambda: y.zero_())
        row("fill: Triton, aligned flat blocks of 1024",
            lambda: _fill_flat[(triton.cdiv(y.numel(), 1024),)](y, y.numel(), BLOCK=1024))
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        for block, per_sm in ((4096, 4), (4096, 8), (8192, 4)):
            row(f"fill: Triton, persistent, blocks of {block}, {per_sm} programs per SM",
                lambda: _fill_flat_persistent[(per_sm * sms,)](y, y.numel(), triton.cdiv(y.numel(), block),
                                                               BLOCK=block, num_warps=8))
        row("fill: Triton, (n, c, od) slabs, blocks of 1024",
            lambda: _fill_slabs[(n_ * c_ * od_, triton.cdiv(oh_ * ow_, 1024))](y, oh_ * ow_, BLOCK=1024))

    if "assemble" in sections:
        # Writing the output from the compact result: one fill of the whole output, then the lattice copy, against
        # the same in chunks of samples, so that the copy's partly written memory sectors may still be in the L2
        # (one sample of problem 77's output is 35.7 MB; the H200's L2 is 50 MB).
        def chunked(samples):
            def run():
                out = torch.empty(plan.output_shape, device="cuda")
                for n0 in range(0, plan.batch, samples):
                    chunk = out[n0:n0 + samples]
                    chunk.zero_()
                    chunk[lattice].copy_(part[n0:n0 + samples])
                return out
            return run

        row("assemble: zero_ whole output + lattice copy", fill_copy, same)
        for samples in (1, 2, 4):
            row(f"assemble: zero_ + lattice copy per {samples} sample(s)", chunked(samples), same)
        # (Triton kernels writing the whole output in one pass, 2-D tiles or flat planes, measured 0.256-1.31 ms
        # here at a5e1da9-b32e91e; the lattice rows written whole after the fill 0.259-0.262 at 8cc8db3, against
        # 0.234 for the fill + strided copy.)

    if "grad_weight" in sections:
        w64 = w.double().requires_grad_()
        F.conv_transpose3d(x.double(), w64, None, 2, 1, 0, 1, 2).backward(g.double())
        ref_gw = w64.grad

        # (BLOCK_CO, BLOCK_N, warps, stages, programs per SM, a window copy per w tap): backward.CONFIG's order.
        before = (64, 256, 8, 3, 2, False)  # the config before the copies per w tap
        configs = (before, triton_backward.CONFIG, (64, 128, 4, 3, 2, True), (64, 128, 4, 3, 1, True),
                   triton_backward.CONFIG, (64, 128, 4, 3, 2, True), (64, 128, 4, 3, 1, True), (64, 128, 4, 4, 2, True))
        variants = [(1, "tf32", c) for c in configs] + [(2, "tf32x3", c) for c in configs[:2]]
        row("grad_weight's input window (F.pad)", lambda: tp._phase_input(x, plan, phases).contiguous())
        row("grad_weight's input window, a copy per w tap, TF32-rounded (Triton)",
            lambda: triton_backward._window_per_w_tap(x, phases, True))
        # From grad_output's compact lattice (g_c), as the op passes it: the lattice copy not included.
        for precision, name, config in variants:
            try:
                part = triton_backward.phase_grad_weight(g_c, x, plan, phases, precision, config)
            except Exception as error:  # noqa: BLE001 (a config that does not fit: report and go on)
                print(f"grad_weight {name} {config}: {type(error).__name__}")
                continue
            err = relative_error(part, ref_gw)  # one phase with every tap: the whole weight gradient
            ms = time_cuda(lambda: triton_backward.phase_grad_weight(g_c, x, plan, phases, precision, config),
                           iters=args.iters).mean_ms
            rows.append((f"Triton grad_weight {name} {config}", ms, f"{err:.1e}"))
            print(f"Triton grad_weight {name} {config}: {ms:.4f} ms, rel err {err:.1e}", flush=True)
        _, aten_gw, _ = torch.ops.aten.convolution_backward(g, x, w, None, [2] * 3, [1] * 3, [2] * 3, True, [0] * 3,
                                                            1, [False, True, False])
        rows.append(("aten grad_weight (TF32) rel err", 0.0, f"{relative_error(aten_gw, ref_gw):.1e}"))

    if "fwdbwd" in sections:
        # Forward+backward of problem 77 as `bench --backward` times it, and its parts in the same process.
        eager_layer, ours_layer, xg, grad = PROBLEM_77.training_case("cuda")
        y_ours = ours_layer(xg)

        def timed(name, fn):
            ms = time_cuda(fn, iters=args.iters).mean_ms
            rows.append((f"fwdbwd: {name}", ms, ""))
            print(f"fwdbwd: {name:60s} {ms:8.4f}", flush=True)

        timed("eager forward+backward", lambda: eager_layer(xg).backward(grad))
        timed("convt3d forward+backward", lambda: ours_layer(xg).backward(grad))
        timed("convt3d forward, no grad", lambda: ours_layer(xg.detach()))
        timed("convt3d forward, graph built", lambda: ours_layer(xg))
        timed("convt3d backward alone (retained graph)", lambda: y_ours.backward(grad, retain_graph=True))
        timed("convt3d backward op alone", lambda: backward_op(grad, xg.detach(), ours_layer.weight.detach(),
                                                               *args77, True, True))
        timed("eager forward+backward (again)", lambda: eager_layer(xg).backward(grad))

    if "sweep" in sections:
        print("\nsweep: eager vs phase path with NCDHW / channels-last convolutions (default precision)")
        for layer in load_sweep(None):
            dtype = getattr(torch, layer.dtype)
            lx = torch.rand(layer.input_shape, device="cuda", dtype=dtype)
            lw = (torch.randn(layer.weight_shape(), device="cuda") * 0.05).to(dtype)
            lplan = layer.plan()
            times = [time_cuda(lambda: F.conv_transpose3d(lx, lw, None, lplan.stride, lplan.padding,
                                                          lplan.output_padding, lplan.groups, lplan.dilation),
                               iters=args.iters).mean_ms]
            for channels_last in (False, True):
                tp.CONV_CHANNELS_LAST["cuda"] = channels_last
                times.append(time_cuda(lambda: tp.conv_transpose3d(lx, lw, None, lplan), iters=args.iters).mean_ms)
            tp.CONV_CHANNELS_LAST["cuda"] = False
            rows.append((f"sweep {layer.name} eager / phase NCDHW / phase CL", times[0],
                         " / ".join(f"{t:.4f}" for t in times[1:])))
            print(rows[-1], flush=True)

    print("\npiece | ms | rel err vs float64 (or more figures)")
    for name, ms, err in rows:
        print(f"{name} | {ms:.4f} | {err}")


if __name__ == "__main__":
    main()
