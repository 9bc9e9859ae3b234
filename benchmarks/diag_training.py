"""Problem 77's forward+backward under layout variants of the phase path (GPU), timed as `bench --backward` times
it, in interleaved rounds so that the machine's drift hits every variant alike; then the pieces each variant
changes, alone; then the host time of each piece.

    PYTHONPATH=src python3 benchmarks/diag_training.py [--rounds 4] [--iters 50]
        [--only fwdbwd,outliers,pieces,lattice,host] [--variants "as is,lattice not rounded"]

Sections: fwdbwd (the variants below), outliers (the bench's loop call by call, with Python's garbage collector
on and off), pieces (each piece's cold-L2 time), lattice (grad_output's lattice copied out, and grad_weight
configs from it), host (host time per piece).

Variants (monkeypatches of convt3d's backends, restored after each; --variants all for every one):
  Triton's JIT launcher   the backward's three Triton kernels launched through Triton's JIT launcher every call,
               not through the compiled kernel it returned (backends/triton/launch.py).
  fwd CL       the forward's phase convolution given a channels-last input: cuDNN returns a channels-last compact
               result, copied into the NCDHW output, instead of converting input and result itself.
  gi dgrad     grad_input as a stride-1 conv_transpose3d (cuDNN's dgrad kernel, as the forward) instead of conv3d.
  lattice not rounded   grad_output's lattice copied out by torch, unrounded; the grad_weight kernel rounds its
               tile (before the seventh session's change: now the lattice comes TF32-rounded by Triton).
  sixth session's grad_weight   the above with the grad_weight config before the seventh session's.
  sixth session's config, rounded   that config with the rounded lattice.
  grad_weight first   the backward's order before the seventh session (grad_input is computed first now).
  grad_weight on a second stream   beside grad_input's cuDNN convolution.

Measured in the seventh session and dropped from this list: grad_output's lattice copied out channels-last
(cuDNN's grad_input then skips its layout conversion, 0.271 against 0.329 ms, but the Triton grad_weight reads
such a lattice at 1.88 ms against 0.37), and the grad_weight kernel's reduction step spanning rows of the
phase's plane (64 or 128 positions: slower); benchmarks/RESULTS.md. In the eighth: a Triton kernel writing the
forward's whole output once instead of the fill and the strided copy (its variants and pieces are in commits
847d53d..46ce143), and the fill on a second stream beside the phase's convolution: both slower overall.
"""

import argparse
import contextlib
import statistics
import time

import torch
import torch.nn.functional as F

from convt3d.backends import torch_phase as tp
from convt3d.backends.triton import backward as triton_backward
from convt3d.bench.protocol import relative_error, time_cuda
from convt3d.bench.workloads import PROBLEM_77
from convt3d.ops import _cuda_phase_backward

CL = torch.channels_last_3d


def _grad_input_dgrad(g, weight, plan, phases, dilation):
    """tp._phase_grad_input as conv_transpose3d: sum_k g_pad[i + k*dil] w[k] = sum_k' g[i + p - k'*dil] w[K-1-k']
    with p = (K-1)*dil - left pad; the weight's channels swapped (C_out of the layer in, C_in out)."""
    w = tp._taps(weight, phases, descending=False).flip(2, 3, 4).transpose(0, 1)
    pads = tp._grad_input_pads(plan, phases)
    padding = [(len(p.taps) - 1) * d - left for p, d, (left, _) in zip(phases, dilation, pads)]
    return F.conv_transpose3d(g, w, None, 1, padding, 0, plan.groups, dilation)


def _phase_conv_transposed_cl(original):
    def run(input, *args):
        return original(input.contiguous(memory_format=CL), *args)
    return run


@contextlib.contextmanager
def patched(**replacements):
    """Replace attributes of torch_phase (or of the Triton backward: names starting with "gw_")."""
    def owner(name):
        return (triton_backward, name[3:]) if name.startswith("gw_") else (tp, name)

    saved = {name: getattr(*owner(name)) for name in replacements}
    for name, value in replacements.items():
        setattr(*owner(name), value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(*owner(name), value)


def _copy_lattice_unrounded(view, round_to_tf32):
    return view.contiguous()


def _grad_weight_rounding_itself(g, *args, lattice_rounded=False):
    return PHASE_GRAD_WEIGHT(g, *args)


PHASE_GRAD_WEIGHT = triton_backward.phase_grad_weight


def _backward_weight_first(grad_output, input, weight, plan, need_input=True, need_weight=True,
                           phase_grad_weight=None, copy_lattice=None):
    """tp.conv_transpose3d_backward in its order before 2026-11-30 (seventh session): grad_weight first."""
    lattices = tp._phase_lattices(grad_output, plan, copy_lattice)
    grad_weight = tp._phase_grad_weights(lattices, input, weight, plan, phase_grad_weight) if need_weight else None
    grad_input = tp._phase_grad_inputs(lattices, weight, plan) if need_input else None
    return grad_input, grad_weight


_SIDE_STREAM = []


def _backward_two_streams(grad_output, input, weight, plan, need_input=True, need_weight=True,
                          phase_grad_weight=None, copy_lattice=None):
    """tp.conv_transpose3d_backward with the weight gradient on a second stream, beside grad_input's cuDNN."""
    if not _SIDE_STREAM:
        _SIDE_STREAM.append(torch.cuda.Stream())
    side, main = _SIDE_STREAM[0], torch.cuda.current_stream()
    lattices = tp._phase_lattices(grad_output, plan, copy_lattice)
    side.wait_stream(main)
    grad_input = tp._phase_grad_inputs(lattices, weight, plan) if need_input else None
    with torch.cuda.stream(side):
        grad_weight = tp._phase_grad_weights(lattices, input, weight, plan, phase_grad_weight) if need_weight else None
    main.wait_stream(side)
    for t in [input, *(g for _, g in lattices)]:  # made on main, read on side
        t.record_stream(side)
    if grad_weight is not None:
        grad_weight.record_stream(main)  # made on side, used on main
    return grad_input, grad_weight


class _JitLaunch:
    """A kernel launched through Triton's JIT launcher every time (before the eighth session's Launcher)."""

    def __init__(self, kernel):
        self.kernel = kernel

    def __getitem__(self, grid):
        return self.kernel[grid]


def variants():
    conv_t = tp._phase_conv_transposed
    unrounded = dict(gw_copy_lattice=_copy_lattice_unrounded, gw_phase_grad_weight=_grad_weight_rounding_itself)
    return {
        "as is": {},
        "Triton's JIT launcher": dict(
            gw__launch_phase_grad_weight=_JitLaunch(triton_backward.phase_grad_weight_kernel),
            gw__launch_window_per_w_tap=_JitLaunch(triton_backward.window_per_w_tap_kernel),
            gw__launch_copy_lattice=_JitLaunch(triton_backward.copy_lattice_kernel)),
        "fwd CL": dict(_phase_conv_transposed=_phase_conv_transposed_cl(conv_t)),
        "gi dgrad": dict(_phase_grad_input=_grad_input_dgrad),
        "grad_weight first": dict(conv_transpose3d_backward=_backward_weight_first),
        "grad_weight on a second stream": dict(conv_transpose3d_backward=_backward_two_streams),
        "lattice not rounded": unrounded,
        "sixth session's grad_weight": dict(unrounded, gw_CONFIG=(64, 128, 4, 3, 2, True)),
        "sixth session's config, rounded": dict(gw_CONFIG=(64, 128, 4, 3, 2, True)),
    }


def _launch_pieces(g, x, plan, phases):
    """The grad_weight kernel's launch alone, with the arguments of a real call: through Triton's JIT launcher
    (binding and specialising ~40 arguments each time), and through the compiled kernel it returned (the
    arguments in signature order, constexprs included)."""
    kernel = triton_backward.phase_grad_weight_kernel
    captured = {}

    class Capture:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                captured.update(grid=grid, args=args, kwargs=kwargs)
                return kernel[grid](*args, **kwargs)
            return launch

    with patched(gw__launch_phase_grad_weight=Capture()):
        triton_backward.phase_grad_weight(g, x, plan, phases)
    grid, args, kwargs = captured["grid"], captured["args"], captured["kwargs"]
    compiled = kernel[grid](*args, **kwargs)
    values = dict(zip(kernel.arg_names, args), **{k: v for k, v in kwargs.items() if k in kernel.arg_names})
    runner = compiled[(*grid, 1, 1)[:3]]  # the compiled kernel's launcher takes all three grid sizes
    ordered = [values[name] for name in kernel.arg_names]
    partial = values["partial_ptr"]
    expected = partial.clone()
    partial.fill_(float("nan"))
    runner(*ordered)
    print(f"compiled-kernel launch writes what the JIT launch wrote: {torch.equal(partial, expected)}", flush=True)
    from convt3d.backends.triton.forward import _sm_count, precision_for

    return {"_sm_count": lambda: _sm_count(0), "precision_for": lambda: precision_for(torch.float32),
            "torch.empty(partial sums)": lambda: torch.empty((38, 32, 64, 3, 3, 3), device="cuda"),
            "grad_weight kernel launch (JIT)": lambda: kernel[grid](*args, **kwargs),
            "grad_weight kernel launch (convt3d's Launcher)": lambda: triton_backward._launch_phase_grad_weight[grid](
                *args, **kwargs),
            "grad_weight kernel launch (compiled kernel)": lambda: runner(*ordered)}


def host_us(fn, calls=50):
    """Host time of one call in us, calls queued without synchronisation (median of 3 loops)."""
    samples = []
    for _ in range(3):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - t0) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(samples)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--only", default="fwdbwd,pieces,host")
    parser.add_argument("--variants", default="as is,lattice not rounded,sixth session's grad_weight",
                        help="comma-separated names from variants(); 'all' for every one")
    args = parser.parse_args()
    sections = args.only.split(",")
    eager, ours, x, grad = PROBLEM_77.training_case("cuda")
    plan = PROBLEM_77.plan()
    (phase,) = plan.nonempty_phases
    phases = phase.axes
    dilation = tuple(p.input_dilation for p in phases)
    w = ours.weight.detach()
    xd = x.detach()

    # float64 reference gradients
    x64, w64 = x.detach().double().requires_grad_(), w.double().requires_grad_()
    F.conv_transpose3d(x64, w64, None, plan.stride, plan.padding, plan.output_padding, plan.groups,
                       plan.dilation).backward(grad.double())
    table = []

    chosen = {name: patches for name, patches in variants().items()
              if args.variants == "all" or name in args.variants.split(",")}
    if "fwdbwd" in sections:
        for name, patches in chosen.items():
            with patched(**patches):
                gx, gw = torch.autograd.grad(ours(x), (x, ours.weight), grad)
                print(f"check {name:24s} grad_input {relative_error(gx, x64.grad):.1e} grad_weight "
                      f"{relative_error(gw, w64.grad):.1e} grad_input layout "
                      f"{'CL' if not gx.is_contiguous() else 'NCDHW'}", flush=True)
        rounds = {name: [] for name in ["eager", *chosen]}
        queued = {name: [] for name in rounds}
        for r in range(args.rounds):
            for name in rounds:
                patches = chosen.get(name, {})
                layer = eager if name == "eager" else ours
                with patched(**patches):
                    rounds[name].append(time_cuda(lambda: layer(x).backward(grad), iters=args.iters).mean_ms)
                    queued[name].append(time_cuda(lambda: layer(x).backward(grad), iters=args.iters,
                                                  synchronize=False).mean_ms)
            print(f"round {r}: " + ", ".join(f"{n} {v[-1]:.3f}" for n, v in rounds.items()), flush=True)
        for name in rounds:
            table.append((f"fwd+bwd {name}: synchronised mean of rounds (min-max) | queued",
                          statistics.fmean(rounds[name]),
                          f"({min(rounds[name]):.3f}-{max(rounds[name]):.3f}) | {statistics.fmean(queued[name]):.3f}"))

    if "outliers" in sections:
        # The bench's timing loop, per call: how the calls spread, and Python's garbage collections among them.
        import gc

        for name, layer in (("eager", eager), ("convt3d", ours)):
            for collect in (True, False):
                samples, collections = [], []
                gc.callbacks.append(lambda phase, info: collections.append((len(samples), info["generation"]))
                                    if phase == "start" else None)
                if not collect:
                    gc.disable()
                flush = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.int32, device="cuda")
                for i in range(205):
                    torch.cuda.synchronize()
                    flush.fill_(1)
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    layer(x).backward(grad)
                    end.record()
                    end.synchronize()
                    if i >= 5:
                        samples.append(start.elapsed_time(end))
                gc.enable()
                gc.callbacks.pop()
                ordered = sorted(samples)
                slow = [i for i, t in enumerate(samples) if t > ordered[len(ordered) // 2] * 1.1]
                table.append((f"outliers {name}, gc {'on' if collect else 'off'}: mean | median, p90, max, "
                              f"calls >1.1x median, gc collections (gen) in those calls / all",
                              statistics.fmean(samples),
                              f"{ordered[100]:.3f}, {ordered[180]:.3f}, {ordered[-1]:.3f}, {len(slow)}, "
                              f"{sum(1 for c, _ in collections if c in slow)} / {len(collections)}"))
                print(table[-1], flush=True)

    lattice_index = tp._backward_phases(plan)[0][1]
    g_nc = grad[lattice_index].contiguous()
    g_cl = grad[lattice_index].contiguous(memory_format=CL)
    part_nc = tp._phase_conv(xd, w, None, plan, phases)
    part_cl = tp._phase_conv_transposed(xd.contiguous(memory_format=CL), w, None, plan, phases)
    out = torch.empty(plan.output_shape, device="cuda")
    splits = torch.rand(38, 32, 64, 27, device="cuda")

    def row(name, fn):
        ms = time_cuda(fn, iters=args.iters).mean_ms
        table.append((name, ms, ""))
        print(f"{name:70s} {ms:.4f}", flush=True)

    if "pieces" in sections:
        gi_conv = tp._phase_grad_input(g_nc, w, plan, phases, dilation).double()
        gi_dgrad = _grad_input_dgrad(g_nc, w, plan, phases, dilation)
        print(f"forward part CL vs NCDHW equal: {torch.equal(part_nc, part_cl)}; "
              f"gi dgrad vs conv3d rel diff {relative_error(gi_dgrad, gi_conv):.1e}")
        row("fwd: phase conv NCDHW (as is)", lambda: tp._phase_conv(xd, w, None, plan, phases))
        row("fwd: input to CL", lambda: xd.contiguous(memory_format=CL))
        row("fwd: phase conv, CL input given", lambda: tp._phase_conv_transposed(
            xd.contiguous(memory_format=CL), w, None, plan, phases))
        row("fwd: copy NCDHW part into lattice", lambda: out[lattice_index].copy_(part_nc))
        row("fwd: copy CL part into lattice", lambda: out[lattice_index].copy_(part_cl))
        row("fwd: zero_ output", lambda: out.zero_())
        row("bwd: lattice out NCDHW", lambda: grad[lattice_index].contiguous())
        row("bwd: lattice out CL", lambda: grad[lattice_index].contiguous(memory_format=CL))
        for lname, g in (("NCDHW", g_nc), ("CL", g_cl)):
            row(f"bwd: grad_input conv3d from {lname}", lambda: tp._phase_grad_input(g, w, plan, phases, dilation))
            row(f"bwd: grad_input conv3d from {lname} + contiguous",
                lambda: tp._phase_grad_input(g, w, plan, phases, dilation).contiguous())
            row(f"bwd: grad_input dgrad from {lname}", lambda: _grad_input_dgrad(g, w, plan, phases, dilation))
            row(f"bwd: Triton grad_weight from {lname}", lambda: triton_backward.phase_grad_weight(g, xd, plan, phases))
        gw_nc = triton_backward.phase_grad_weight(g_nc, xd, plan, phases)
        gw_cl = triton_backward.phase_grad_weight(g_cl, xd, plan, phases)
        print(f"grad_weight from NCDHW and CL lattice equal: {torch.equal(gw_nc, gw_cl)}; rel err "
              f"{relative_error(gw_nc, w64.grad):.1e}", flush=True)
        row("bwd: partial sum of 38 splits (the default's count)", lambda: splits.sum(0))

    if "lattice" in sections:
        # grad_output's lattice copied out, TF32-rounded or not, and the weight gradient from it, by config.
        view = grad[lattice_index]
        g_rounded = triton_backward.copy_lattice(view, True)
        for name, fn in (("torch .contiguous()", lambda: view.contiguous()),
                         ("copy_lattice", lambda: triton_backward.copy_lattice(view, False)),
                         ("copy_lattice, TF32-rounded", lambda: triton_backward.copy_lattice(view, True))):
            row(f"lattice: {name}", fn)
        for config in ((64, 128, 4, 3, 2, True), (64, 256, 8, 2, 1, True), (64, 256, 8, 2, 2, True),
                       (64, 256, 8, 3, 1, True), (64, 128, 8, 3, 2, True), (64, 128, 4, 3, 3, True),
                       (64, 128, 4, 4, 1, True), (32, 256, 4, 3, 2, True)):
            for rounded in (False, True):
                lattice = g_rounded if rounded else g_nc
                try:
                    err = relative_error(triton_backward.phase_grad_weight(lattice, xd, plan, phases, None, config,
                                                                           rounded), w64.grad)
                except Exception as error:  # noqa: BLE001 (a config that does not fit: report and go on)
                    print(f"grad_weight {config}: {type(error).__name__}"[:200])
                    continue
                row(f"grad_weight {config}{', lattice rounded' if rounded else ''} (err {err:.1e})",
                    lambda: triton_backward.phase_grad_weight(lattice, xd, plan, phases, None, config, rounded))

    if "host" in sections:
        pieces = {
            "forward, no grad": lambda: ours(xd),
            "forward, graph built": lambda: ours(x),
            "torch.empty(output)": lambda: torch.empty(plan.output_shape, device="cuda"),
            "zero_ output": lambda: out.zero_(),
            "phase conv (cuDNN)": lambda: tp._phase_conv(xd, w, None, plan, phases),
            "copy part into lattice": lambda: out[lattice_index].copy_(part_nc),
            "lattice out NCDHW": lambda: grad[lattice_index].contiguous(),
            "lattice out by copy_lattice, rounded": lambda: triton_backward.copy_lattice(grad[lattice_index], True),
            "window copies (Triton)": lambda: triton_backward._window_per_w_tap(xd, phases, True),
            "Triton grad_weight, whole": lambda: triton_backward.phase_grad_weight(g_nc, xd, plan, phases),
            "grad_input conv3d (cuDNN)": lambda: tp._phase_grad_input(g_nc, w, plan, phases, dilation),
            "partial sum": lambda: splits.sum(0),
            "backward op (both gradients)": lambda: _cuda_phase_backward(grad, xd, w, plan, True, True),
            "eager forward, graph built": lambda: eager(x),
            "forward+backward": lambda: ours(x).backward(grad),
            "eager forward+backward": lambda: eager(x).backward(grad),
        }
        pieces.update(_launch_pieces(g_nc, xd, plan, phases))
        for name, fn in pieces.items():
            us = host_us(fn)
            table.append((f"host us: {name}", us / 1e3, f"{us:.0f} us"))
            print(f"host {name:40s} {us:8.1f} us", flush=True)

    print("\nwhat | ms | more")
    for name, ms, more in table:
        print(f"{name} | {ms:.4f} | {more}")


if __name__ == "__main__":
    main()
