"""Problem 77's forward+backward under layout variants of the phase path (GPU), timed as `bench --backward` times
it, in interleaved rounds so that the machine's drift hits every variant alike; then the pieces each variant
changes, alone; then the host time of each piece.

    PYTHONPATH=src python3 benchmarks/diag_training.py [--rounds 4] [--iters 50] [--only fwdbwd,pieces,host]

Variants (monkeypatches of convt3d.backends.torch_phase, restored after each):
  lattice CL   grad_output's lattice copied out channels-last: cuDNN's grad_input convolution then reads it without
               its own layout conversion; the Triton grad_weight reads it in place.
  fwd CL       the forward's phase convolution given a channels-last input: cuDNN returns a channels-last compact
               result, copied into the NCDHW output, instead of converting input and result itself.
  gi dgrad     grad_input as a stride-1 conv_transpose3d (cuDNN's dgrad kernel, as the forward) instead of conv3d.
  rounded      grad_output's lattice copied out TF32-rounded by Triton, so that the grad_weight kernel hands its
               tile to the MMA as loaded.
  step P       the grad_weight kernel's reduction step P positions long (P > 32 spans rows of the phase's plane).
  grad_weight first   the backward's order before the seventh session (grad_input is computed first now).
"""

import argparse
import contextlib
import functools
import statistics
import time

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from convt3d.backends import torch_phase as tp
from convt3d.backends.triton import backward as triton_backward
from convt3d.backends.triton.forward import _round_to_tf32
from convt3d.bench.protocol import relative_error, time_cuda
from convt3d.bench.workloads import PROBLEM_77

CL = torch.channels_last_3d


@triton.jit
def _lattice_flat(g_ptr, out_ptr, TOTAL, sn, sc, sd, sh, sw, C: tl.constexpr, QD: tl.constexpr, QH: tl.constexpr,
                  QW: tl.constexpr, ROUND: tl.constexpr, BLOCK: tl.constexpr):
    """out (N, C, QD, QH, QW contiguous) = the strided lattice g, TF32-rounded if ROUND: flat over out, aligned
    blocks; the sizes constexpr so that the index divisions are cheap."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    q = offs % QW
    r = offs // QW
    h = r % QH
    r = r // QH
    d = r % QD
    r = r // QD
    c = r % C
    n = r // C
    v = tl.load(g_ptr + n.to(tl.int64) * sn + c.to(tl.int64) * sc + (d * sd + h * sh + q * sw), mask=offs < TOTAL)
    if ROUND:
        v = _round_to_tf32(v)
    tl.store(out_ptr + offs, v, mask=offs < TOTAL)


@triton.jit
def _round_in_place(x_ptr, TOTAL, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, _round_to_tf32(tl.load(x_ptr + offs, mask=offs < TOTAL)), mask=offs < TOTAL)


def lattice_flat(view, round_to_tf32, block=2048):
    out = torch.empty(view.shape, device=view.device)
    n, c, qd, qh, qw = view.shape
    _lattice_flat[(triton.cdiv(out.numel(), block),)](view, out, out.numel(), *view.stride(), C=c, QD=qd, QH=qh,
                                                       QW=qw, ROUND=round_to_tf32, BLOCK=block, num_warps=8)
    return out


def lattice_then_round(view, block=4096):
    out = view.contiguous()
    _round_in_place[(triton.cdiv(out.numel(), block),)](out, out.numel(), BLOCK=block, num_warps=8)
    return out


def _lattices_cl(grad_output, plan, contiguous=False):
    return [(phases, grad_output[index].contiguous(memory_format=CL)) for phases, index in tp._backward_phases(plan)]


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


def _lattices_rounded(grad_output, plan, contiguous=False):
    return [(phases, triton_backward.compact_lattice(grad_output[index], True))
            for phases, index in tp._backward_phases(plan)]


def _backward_weight_first(grad_output, input, weight, plan, need_input=True, need_weight=True,
                           phase_grad_weight=None, contiguous_lattice=False):
    """tp.conv_transpose3d_backward in its order before 2026-11-30 (seventh session): grad_weight first."""
    lattices = tp._phase_lattices(grad_output, plan, contiguous_lattice)
    grad_weight = tp._phase_grad_weights(lattices, input, weight, plan, phase_grad_weight) if need_weight else None
    grad_input = tp._phase_grad_inputs(lattices, weight, plan) if need_input else None
    return grad_input, grad_weight


def variants():
    conv_t = tp._phase_conv_transposed
    gw = triton_backward.phase_grad_weight
    rounded = dict(_phase_lattices=_lattices_rounded, gw_phase_grad_weight=functools.partial(gw, lattice_rounded=True))
    config = triton_backward.CONFIG[:6]
    return {
        "as is": {},
        "lattice CL": dict(_phase_lattices=_lattices_cl),
        "fwd CL": dict(_phase_conv_transposed=_phase_conv_transposed_cl(conv_t)),
        "lattice CL + fwd CL": dict(_phase_lattices=_lattices_cl, _phase_conv_transposed=_phase_conv_transposed_cl(conv_t)),
        "gi dgrad": dict(_phase_grad_input=_grad_input_dgrad),
        "lattice CL + gi dgrad": dict(_phase_lattices=_lattices_cl, _phase_grad_input=_grad_input_dgrad),
        "grad_weight 4 programs/SM": dict(gw_CONFIG=(64, 128, 4, 3, 4, True)),
        "grad_weight first": dict(conv_transpose3d_backward=_backward_weight_first),
        "rounded": rounded,
        "step 64": dict(gw_CONFIG=(*config, 64)),
        "rounded + step 64": dict(rounded, gw_CONFIG=(*config, 64)),
        "rounded + step 128": dict(rounded, gw_CONFIG=(*config[:3], 2, *config[4:], 128)),  # 3 stages: no room
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

    with patched(gw_phase_grad_weight_kernel=Capture()):
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
    parser.add_argument("--variants", default="as is,grad_weight first,rounded",
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
        print(f"forward part CL vs NCDHW equal: {torch.equal(part_nc, part_cl)}; "
              f"gi dgrad vs conv3d rel diff {relative_error(_grad_input_dgrad(g_nc, w, plan, phases, dilation), tp._phase_grad_input(g_nc, w, plan, phases, dilation).double()):.1e}")
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
        row("bwd: lattice out by Triton", lambda: triton_backward.compact_lattice(grad[lattice_index], False))
        row("bwd: lattice out by Triton, TF32-rounded", lambda: triton_backward.compact_lattice(grad[lattice_index], True))
        g_rounded = triton_backward.compact_lattice(grad[lattice_index], True)
        for config in ((64, 128, 4, 3, 2, True, 32), (64, 128, 4, 3, 2, True, 64), (64, 128, 4, 2, 1, True, 128),
                       (64, 128, 4, 4, 2, True, 64), (64, 128, 8, 3, 2, True, 64), (64, 256, 8, 3, 1, True, 64),
                       (64, 128, 4, 2, 2, True, 128)):
            for rounded in (False, True):
                lattice = g_rounded if rounded else g_nc
                try:
                    result = triton_backward.phase_grad_weight(lattice, xd, plan, phases, None, config, rounded)
                    err = relative_error(result, w64.grad)
                except Exception as error:  # noqa: BLE001 (a config that does not fit: report and go on)
                    print(f"grad_weight {config}: {type(error).__name__}: {error}"[:200])
                    continue
                row(f"bwd: Triton grad_weight {config}{', lattice rounded' if rounded else ''} (err {err:.1e})",
                    lambda: triton_backward.phase_grad_weight(lattice, xd, plan, phases, None, config, rounded))
        gw_nc = triton_backward.phase_grad_weight(g_nc, xd, plan, phases)
        gw_cl = triton_backward.phase_grad_weight(g_cl, xd, plan, phases)
        print(f"grad_weight from NCDHW and CL lattice equal: {torch.equal(gw_nc, gw_cl)}; rel err "
              f"{relative_error(gw_nc, w64.grad):.1e}", flush=True)
        row("bwd: partial sum of 38 splits (the default's count)", lambda: splits.sum(0))

    if "lattice" in sections:
        # Copying grad_output's lattice out TF32-rounded, for the grad_weight kernel's G_ROUNDED path.
        view = grad[lattice_index]
        reference = triton_backward.compact_lattice(view, True)
        for name, fn in (("torch .contiguous() (not rounded)", lambda: view.contiguous()),
                         ("compact_lattice (window kernel), rounded", lambda: triton_backward.compact_lattice(view, True)),
                         ("flat, constexpr sizes, rounded, block 2048", lambda: lattice_flat(view, True)),
                         ("flat, constexpr sizes, rounded, block 1024", lambda: lattice_flat(view, True, 1024)),
                         ("flat, constexpr sizes, rounded, block 4096", lambda: lattice_flat(view, True, 4096)),
                         (".contiguous() then rounded in place", lambda: lattice_then_round(view))):
            same = torch.equal(fn(), reference) if "not rounded" not in name else ""
            row(f"lattice: {name} {same}", fn)
        g_rounded = triton_backward.compact_lattice(view, True)
        for config in ((64, 128, 4, 3, 2, True), (64, 256, 8, 2, 1, True), (64, 256, 8, 2, 2, True),
                       (64, 256, 8, 3, 1, True), (64, 128, 8, 3, 2, True), (64, 128, 4, 3, 3, True),
                       (64, 128, 4, 4, 1, True), (32, 256, 4, 3, 2, True)):
            for rounded in (False, True):
                lattice = g_rounded if rounded else g_nc
                try:
                    triton_backward.phase_grad_weight(lattice, xd, plan, phases, None, config, rounded)
                except Exception as error:  # noqa: BLE001 (a config that does not fit: report and go on)
                    print(f"grad_weight {config}: {type(error).__name__}"[:200])
                    continue
                row(f"grad_weight {config}{', lattice rounded' if rounded else ''}",
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
            "lattice out by Triton, rounded": lambda: triton_backward.compact_lattice(grad[lattice_index], True),
            "window copies (Triton)": lambda: triton_backward._window_per_w_tap(xd, phases, True),
            "Triton grad_weight, whole": lambda: triton_backward.phase_grad_weight(g_nc, xd, plan, phases),
            "grad_input conv3d (cuDNN)": lambda: tp._phase_grad_input(g_nc, w, plan, phases, dilation),
            "partial sum": lambda: splits.sum(0),
            "backward op (both gradients)": lambda: tp.conv_transpose3d_backward(
                grad, xd, w, plan, True, True, phase_grad_weight=triton_backward.phase_grad_weight,
                contiguous_lattice=True),
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
