"""The tiled kernel's FP16-scaled call (TF32 mode) with the main kernel waiting per input block instead of for the
whole operand pass (GPU): each pass program, once its rows are stored, sets a flag (weight programs count up one
word, and run first); each main-kernel program, launched as the pass's dependent, waits only for the weight and the
pass programs that hold its own input rows, so that the main kernel's first programs run while the pass's last
ones still do. The last main-kernel program past its wait clears the flags for the next launch.

Rows (cold L2, bench.protocol.time_cuda, rounds taking turns): eager; the library's prepared call
(tiled.prepare); the same two kernels launched here with the library's whole-pass wait (gdc_wait), and with the
flags. Three fresh inputs per form, each output checked against float64 and by KernelBench's check against
eager (outputs from torch.empty, not NaN-poisoned: every k2 s2 output is some tile's). Results:
benchmarks/RESULTS.md, fifty-eighth session (not kept: slower than the whole-pass wait).

    PYTHONPATH=src python3 benchmarks/diag_ready_flags.py [--iters 100] [--rounds 3] [--layers ...]
    TRITON_INTERPRET=1 PYTHONPATH=src python3 benchmarks/diag_ready_flags.py --check   (small layers on the CPU)
"""

import argparse

import torch
import triton
import triton.language as tl

from convt3d.backends.triton import cdiv, next_power_of_2, tiled
from convt3d.backends.triton.forward import allocate_operands, dependent_options, flat_input, let_next_start
from convt3d.backends.triton.launch import Launcher
from convt3d.bench.protocol import time_cuda
from convt3d.bench.report import markdown_table
from convt3d.bench.workloads import sweep_layers
from convt3d.plan import make_plan


@triton.jit
def ready_pass_kernel(
    x_ptr, x_op_ptr, x_exp_ptr, w_ptr, w_op_ptr, w_exp_ptr, ready_ptr,
    C, S, S_BLOCKS, X_PROGRAMS, sxn, sxc, sxs, C_OUT, KDH, KW,
    BLOCK_K: tl.constexpr, CHUNKS: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_W: tl.constexpr,
    LET_NEXT_START: tl.constexpr, READY: tl.constexpr,
):
    """tiled.prepare_scaled_operands_kernel, READY: the weight's programs first, and each program's flag set after
    its stores (word 0 counts the weight's programs, word 2 + p is input program p's)."""
    if LET_NEXT_START:
        let_next_start()
    pid = tl.program_id(0)
    if READY:
        pid = (pid + X_PROGRAMS) % tl.num_programs(0)
    if pid < X_PROGRAMS:
        n = (pid // S_BLOCKS).to(tl.int64)
        sp = pid % S_BLOCKS * BLOCK_S + tl.arange(0, BLOCK_S)
        tiled._scaled_rows(x_ptr, x_op_ptr, x_exp_ptr, n * sxn + sp.to(tl.int64) * sxs, n * S + sp, sp < S, C, sxc,
                           BLOCK_K, CHUNKS)
    else:
        columns = C_OUT * KDH * KW
        c = (pid - X_PROGRAMS) * BLOCK_W + tl.arange(0, BLOCK_W)
        row = (c // KW % KDH * C_OUT + c // (KDH * KW)) * KW + c % KW
        tiled._scaled_rows(w_ptr, w_op_ptr, w_exp_ptr, c, row, c < columns, C, columns, BLOCK_K, CHUNKS)
    if READY:
        tl.debug_barrier()  # every thread's stores before the release
        if pid < X_PROGRAMS:
            tl.atomic_xchg(ready_ptr + 2 + pid, 1, sem="release", scope="gpu")
        else:
            tl.atomic_add(ready_ptr, 1, sem="release", scope="gpu")


@triton.jit
def ready_tiled_kernel(
    x_ptr, x_lo_ptr, w_ptr, w_lo_ptr, b_ptr, y_ptr, ready_ptr,
    C_IN, C_OUT, D, H, W, KD, KH,
    sxn, sxc, sxd, sxh, sxw, swi, swo, swd, swh, sww,
    syn, syc, syd, syh, syw,
    H_BLOCKS, W_BLOCKS, CO_BLOCKS,
    KW: tl.constexpr, KW_P2: tl.constexpr, HAS_BIAS: tl.constexpr, PRECISION: tl.constexpr,
    INTERPRETED: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_Q: tl.constexpr,
    BLOCK_CO: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, SWAP: tl.constexpr, SCALED: tl.constexpr,
    PDL: tl.constexpr, READY: tl.constexpr, PASS_S: tl.constexpr, PASS_S_BLOCKS: tl.constexpr,
    PASS_W: tl.constexpr, PASS_X: tl.constexpr, FLAGS: tl.constexpr,
):
    """tiled.tiled_kernel, READY: waiting for the weight's programs and its own input rows' programs only."""
    if READY:
        pid = tl.program_id(0) // (CO_BLOCKS * KD * KH)  # as tiled_kernel splits it
        w0 = pid % W_BLOCKS * BLOCK_Q
        pid = pid // W_BLOCKS
        h0 = pid % H_BLOCKS * BLOCK_R
        pid = pid // H_BLOCKS
        d = pid % D
        n = pid // D
        first = (d * H + h0) * W + w0
        last = (d * H + tl.minimum(h0 + BLOCK_R, H) - 1) * W + tl.minimum(w0 + BLOCK_Q, W) - 1
        f = first // PASS_S + tl.arange(0, FLAGS)
        need = f <= last // PASS_S
        flags = ready_ptr + 2 + n * PASS_S_BLOCKS + f
        got = tl.min(tl.where(need, tl.atomic_add(flags, 0, mask=need, sem="acquire", scope="gpu"), 1))
        weight = tl.atomic_add(ready_ptr, 0, sem="acquire", scope="gpu")
        while (got == 0) | (weight < PASS_W):
            got = tl.min(tl.where(need, tl.atomic_add(flags, 0, mask=need, sem="acquire", scope="gpu"), 1))
            weight = tl.atomic_add(ready_ptr, 0, sem="acquire", scope="gpu")
        tl.debug_barrier()
        if tl.atomic_add(ready_ptr + 1, 1, sem="relaxed", scope="gpu") == tl.num_programs(0) - 1:
            # The last program past its wait (every program has read its flags): clear them for the next launch.
            for i in range(0, PASS_X + 2, 1024):
                o = i + tl.arange(0, 1024)
                tl.store(ready_ptr + o, 0, mask=o < PASS_X + 2)
    tiled.tiled_kernel(
        x_ptr, x_lo_ptr, w_ptr, w_lo_ptr, b_ptr, y_ptr, C_IN, C_OUT, D, H, W, KD, KH,
        sxn, sxc, sxd, sxh, sxw, swi, swo, swd, swh, sww, syn, syc, syd, syh, syw, H_BLOCKS, W_BLOCKS, CO_BLOCKS,
        KW, KW_P2, HAS_BIAS, PRECISION, INTERPRETED, BLOCK_R, BLOCK_Q, BLOCK_CO, BLOCK_K, EVEN_K, SWAP, SCALED,
        PDL and not READY)


_pass = Launcher(ready_pass_kernel)
_main = Launcher(ready_tiled_kernel)


def build(plan, x, w, cfg, ready: bool):
    """(call(x, w, b) -> out) with the library's geometry: the pass, then the main kernel as its dependent."""
    n, c, d, h, wd = x.shape
    c_in, c_out, kd, kh, kw = w.shape
    flat, flat_strides = flat_input(x)
    block_k = min(next_power_of_2(c), 512)
    block_rows = min(256, max(16, 8192 // block_k))
    s_blocks = cdiv(d * h * wd, block_rows)
    x_programs, w_programs = n * s_blocks, cdiv(c_out * kd * kh * kw, block_rows)
    pass_launch = _pass.bind(
        (x_programs + w_programs,), (c, d * h * wd, s_blocks, x_programs, *flat_strides, c_out, kd * kh, kw),
        (("BLOCK_K", block_k), ("CHUNKS", cdiv(c, block_k)), ("BLOCK_S", block_rows), ("BLOCK_W", block_rows),
         ("LET_NEXT_START", not _pass.interpreted), ("READY", ready), ("num_warps", 8)))
    grid, sizes, prepared, blocks, constexprs = tiled._geometry(plan, cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"])
    block_r, block_q = dict(constexprs)["BLOCK_R"], dict(constexprs)["BLOCK_Q"]
    span = (block_r - 1) * wd + block_q
    main_launch = _main.bind(
        grid, (*sizes, *prepared, *torch.empty(plan.output_shape, device="meta").stride(), *blocks),
        (*constexprs, ("HAS_BIAS", True), ("PRECISION", 0), ("INTERPRETED", _main.interpreted), ("SWAP", cfg["SWAP"]),
         ("SCALED", True), *dependent_options(x.device.index or 0), ("READY", ready), ("PASS_S", block_rows),
         ("PASS_S_BLOCKS", s_blocks), ("PASS_W", w_programs), ("PASS_X", x_programs),
         ("FLAGS", next_power_of_2(span // block_rows + 2)), ("num_warps", cfg["num_warps"]),
         ("num_stages", cfg["num_stages"])))
    layout, _ = tiled._operand_steps(tuple(x.shape), tuple(w.shape), flat_strides, tiled.FP16_SCALED)
    words = torch.zeros(x_programs + 2, dtype=torch.int32, device=x.device)

    def call(x, w, b):
        out = torch.empty(plan.output_shape, device=x.device)
        ops = allocate_operands(layout, torch.float16, x.device)
        pass_launch((flat_input(x)[0], *ops[:2], w, *ops[2:], words))
        main_launch((*ops, b, out, words))
        return out

    return call, words


def check():
    """Both forms on small k2 s2 layers under the interpreter, every tile config, twice each: the relative error
    against float64 and the flags left (0 when cleared)."""
    for shape, c_out in [((2, 40, 3, 5, 6), 24), ((1, 16, 2, 3, 20), 8)]:
        w, b = torch.randn(shape[1], c_out, 2, 2, 2) * 0.1, torch.randn(c_out)
        plan = make_plan(shape, tuple(w.shape), 2, 0)
        for cfg in tiled.configs():
            for ready in (False, True):
                call, words = build(plan, torch.empty(shape), w, cfg, ready)
                for _ in range(2):
                    x = torch.rand(shape)
                    reference = torch.nn.functional.conv_transpose3d(x.double(), w.double(), b.double(), 2)
                    y = call(x, w, b)
                    err = ((y.double() - reference).norm() / reference.norm()).item()
                    print(f"{shape} SWAP {cfg['SWAP']} ready {ready}: rel err {err:.2e}, "
                          f"flags left {int(words.abs().sum())}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--layers", default="unet3d_k2s2_deep,unet3d_k2s2")
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    if args.check:
        return check()
    torch.backends.cudnn.allow_tf32 = True
    rows = []
    for layer in sweep_layers(args.layers):
        module, x, w, b, reference = layer.kernel_case("cuda")
        plan = make_plan(tuple(x.shape), tuple(w.shape), layer.stride, layer.padding)
        with torch.no_grad():
            out = tiled.conv_transpose3d_tiled(x, w, b, plan)
            key = tiled._chosen_key(x, plan, tiled.FP16_SCALED, None, out, b)
            cfg = tiled._best_config[key]
            library = tiled.prepare(x, w, b, plan, tiled.TF32, out)
            fns = {"eager": lambda: module(x), "library prepared call": lambda: library(x, w, b)}
            for ready in (False, True):
                call, words = build(plan, x, w, cfg, ready)
                label = "flags per block" if ready else "whole-pass wait (gdc_wait)"
                for trial in range(3):
                    xt = torch.rand_like(x)
                    torch.cuda.synchronize()
                    y = call(xt, w, b)
                    ref = torch.nn.functional.conv_transpose3d(xt.double(), w.double(), b.double(), layer.stride,
                                                               layer.padding)
                    err = ((y.double() - ref).norm() / ref.norm()).item()
                    kb = torch.allclose(y, module(xt), atol=1e-4, rtol=1e-4)
                    print(f"{layer.name} {label} trial {trial}: rel err {err:.2e}, KB check {kb}, "
                          f"words left {int(words.abs().sum())}", flush=True)
                fns[label] = lambda call=call: call(x, w, b)
            times = {label: [] for label in fns}
            for _ in range(args.rounds):
                for label, fn in fns.items():
                    times[label].append(time_cuda(fn, iters=args.iters))
            for label, ts in times.items():
                means = sorted(t.mean_ms for t in ts)
                mins = sorted(t.min_ms for t in ts)
                rows.append((layer.name, label, f"{means[len(means) // 2]:.4f}", f"{mins[len(mins) // 2]:.4f}",
                             " ".join(f"{m:.4f}" for m in (t.mean_ms for t in ts))))
                print(rows[-1], flush=True)
    print(markdown_table(["layer", "call", "median of round means ms", "median of round minima ms", "round means"],
                         rows))


if __name__ == "__main__":
    main()
