"""TF32 mode's float32 operands as FP16 with one scale per tensor, found inside the operand pass (GPU machine): a
prototype, to see what it could give the general and tap_columns kernels before building it into them.

    PYTHONPATH=src python3 benchmarks/diag_fp16_global.py [--iters 50] [--layers video_k3s2p1op1,...]

The thirty-first session's FP16 operands (a47d641, reverted) found the input's and the weight's largest magnitudes in
a launch of their own, and its host time ate the kernels' gain. Here the operand pass finds them itself: a
cooperative grid (all programs resident at once) reads its share of both tensors for their largest magnitudes, meets
the others at a grid-wide barrier (atomic counters), then TF32-rounds its share, scales it by a power of two that puts
the tensor's largest magnitude in [2^14, 2^15), and stores it as FP16 in the layouts the main kernels read (input
channels-last, weight tap-major and K-major). Its second read finds the tensors in L2. The last program out resets
the counters for the next call.

The main kernel is the library's (general or tap_columns, autotuned here) on FP16 operands, without bias: the sum it
stores is scaled by 2^(e_x + e_w); this script multiplies that back and adds the bias after timing, to check the
result against eager (KernelBench's check) and float64. The prototype's epilogue lacks that multiply (one per output),
so its times are a bound from below by that much. Groups 1 only.

Rows per layer, TF32 mode, bench.protocol.time_cuda's cold-L2 mean / minimum in ms: eager; backend="triton" (the
library, TF32 operands, end to end); the prototype's pass alone; its main kernel alone on operands made before; pass
and main kernel launched as the library launches them (the main kernel as the pass's dependent).
"""

import argparse

import torch
import triton
import triton.language as tl

import convt3d
from convt3d.backends.triton import NATIVE, forward
from convt3d.backends.triton.tiled import _fp16_scale_exponent, _power_of_2
from convt3d.bench.protocol import kernelbench_check, relative_error, time_cuda
from convt3d.bench.report import markdown_table
from convt3d.bench.workloads import sweep_layers


@triton.jit
def _x_tile(x_ptr, t, C, S, C_BLOCKS, S_BLOCKS, sxn, sxc, sxs, BLOCK_C: tl.constexpr, BLOCK_S: tl.constexpr):
    """(values, mask, offsets in the channels-last operand) of input tile t: BLOCK_S positions by BLOCK_C channels."""
    n = (t // (S_BLOCKS * C_BLOCKS)).to(tl.int64)
    c = (t // S_BLOCKS % C_BLOCKS) * BLOCK_C + tl.arange(0, BLOCK_C)
    sp = (t % S_BLOCKS) * BLOCK_S + tl.arange(0, BLOCK_S)
    ok = (c[None, :] < C) & (sp[:, None] < S)
    v = tl.load(x_ptr + n * sxn + c[None, :].to(tl.int64) * sxc + sp[:, None].to(tl.int64) * sxs, mask=ok, other=0.0)
    return v, ok, n * S * C + sp[:, None].to(tl.int64) * C + c[None, :]


@triton.jit
def _w_chunk(w_ptr, f0, C_IN, C_OUT, TAPS, BLOCK_W: tl.constexpr):
    """(values, mask, offsets) of BLOCK_W weight elements in the operand's order (tap, co, ci), read from the
    contiguous weight (C_in, C_out, taps)."""
    f = f0 + tl.arange(0, BLOCK_W)
    ci = f % C_IN
    co = f // C_IN % C_OUT
    tap = f // (C_IN * C_OUT)
    ok = f < TAPS * C_IN * C_OUT
    return tl.load(w_ptr + (ci * C_OUT + co) * TAPS + tap, mask=ok, other=0.0), ok, f


@triton.jit
def _rounded(v):
    bits = v.to(tl.int32, bitcast=True)
    return ((bits + 0x1000) & -8192).to(tl.float32, bitcast=True)


@triton.jit
def fp16_global_pass_kernel(x_ptr, x_op_ptr, w_ptr, w_op_ptr, sync_ptr,
                            C, S, C_BLOCKS, S_BLOCKS, X_TILES, sxn, sxc, sxs, C_IN, C_OUT, TAPS, W_CHUNKS,
                            BLOCK_C: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_W: tl.constexpr,
                            LET_NEXT_START: tl.constexpr = True):
    """sync_ptr: int32 words [largest |x| bits, largest |w| bits, arrivals, departures, e_x, e_w], the first four zero
    on entry and on exit."""
    if LET_NEXT_START:  # (the main kernel's programs may start; they wait for this launch's end)
        tl.extra.cuda.gdc_launch_dependents()
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    x_largest = tl.zeros([BLOCK_S, BLOCK_C], dtype=tl.float32)
    for t in range(pid, X_TILES, programs):
        v, ok, offs = _x_tile(x_ptr, t, C, S, C_BLOCKS, S_BLOCKS, sxn, sxc, sxs, BLOCK_C, BLOCK_S)
        x_largest = tl.maximum(x_largest, tl.abs(v))
    w_largest = tl.zeros([BLOCK_W], dtype=tl.float32)
    for j in range(pid, W_CHUNKS, programs):
        v, ok, offs = _w_chunk(w_ptr, j * BLOCK_W, C_IN, C_OUT, TAPS, BLOCK_W)
        w_largest = tl.maximum(w_largest, tl.abs(v))
    # Non-negative floats order as their bits do.
    tl.atomic_max(sync_ptr, tl.max(tl.max(x_largest, axis=1), axis=0).to(tl.int32, bitcast=True), sem="relaxed")
    tl.atomic_max(sync_ptr + 1, tl.max(w_largest, axis=0).to(tl.int32, bitcast=True), sem="relaxed")
    tl.atomic_add(sync_ptr + 2, 1, sem="release")
    arrived = tl.atomic_add(sync_ptr + 2, 0, sem="acquire")
    while arrived < programs:
        arrived = tl.atomic_add(sync_ptr + 2, 0, sem="acquire")
    e_x = _fp16_scale_exponent(tl.atomic_add(sync_ptr, 0, sem="acquire").to(tl.float32, bitcast=True))
    e_w = _fp16_scale_exponent(tl.atomic_add(sync_ptr + 1, 0, sem="acquire").to(tl.float32, bitcast=True))
    x_scale = _power_of_2(e_x)
    w_scale = _power_of_2(e_w)
    for t in range(pid, X_TILES, programs):
        v, ok, offs = _x_tile(x_ptr, t, C, S, C_BLOCKS, S_BLOCKS, sxn, sxc, sxs, BLOCK_C, BLOCK_S)
        tl.store(x_op_ptr + offs, (_rounded(v) * x_scale).to(tl.float16), mask=ok)
    for j in range(pid, W_CHUNKS, programs):
        v, ok, offs = _w_chunk(w_ptr, j * BLOCK_W, C_IN, C_OUT, TAPS, BLOCK_W)
        tl.store(w_op_ptr + offs, (_rounded(v) * w_scale).to(tl.float16), mask=ok)
    departed = tl.atomic_add(sync_ptr + 3, 1, sem="acq_rel")
    if departed == programs - 1:  # the last one out: every other has read the maxima
        tl.store(sync_ptr + 4, e_x)
        tl.store(sync_ptr + 5, e_w)
        for i in tl.static_range(4):
            tl.store(sync_ptr + i, 0)


BLOCK_C, BLOCK_S, BLOCK_W = 32, 128, 1024


def make_pass(x, w, programs_per_sm):
    """(run(x_op, w_op), sync words) of the prototype pass for x (N, C, D, H, W) and w (C_in, C_out, kD, kH, kW)."""
    n, c = x.shape[:2]
    s = x[0, 0].numel()
    c_in, c_out = w.shape[:2]
    taps = w[0, 0].numel()
    c_blocks, s_blocks = triton.cdiv(c, BLOCK_C), triton.cdiv(s, BLOCK_S)
    x_tiles = n * c_blocks * s_blocks
    w_chunks = triton.cdiv(taps * c_in * c_out, BLOCK_W)
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count
    grid = (min(max(x_tiles, w_chunks), programs_per_sm * sms),)
    sync = torch.zeros(8, dtype=torch.int32, device=x.device)
    flat = x.flatten(2)

    def run(x_op, w_op):
        fp16_global_pass_kernel[grid](flat, x_op, w, w_op, sync, c, s, c_blocks, s_blocks, x_tiles, *flat.stride(),
                                      c_in, c_out, taps, w_chunks, BLOCK_C=BLOCK_C, BLOCK_S=BLOCK_S,
                                      BLOCK_W=BLOCK_W, num_warps=4, launch_cooperative_grid=True)

    return run, sync


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--layers", default="video_k3s2p1op1,vae_k4s2p1,k3s1p1,wide_256to128_k3s2,video_spatial_k144")
    parser.add_argument("--per-sm", type=int, default=4, help="the pass's programs per multiprocessor")
    args = parser.parse_args()
    torch.backends.cudnn.allow_tf32 = True
    rows = []
    for layer in sweep_layers(args.layers):
        module, x, w, b, reference = layer.kernel_case("cuda")
        plan = layer.plan()
        expected = module(x)
        ours = convt3d.convert(module, backend="triton")
        run_pass, sync = make_pass(x, w, args.per_sm)
        n, c, d, h, wd = x.shape
        x_op = torch.empty((n, d, h, wd, c), dtype=torch.float16, device="cuda")
        w_op = torch.empty((w[0, 0].numel(), 1, w.shape[1], w.shape[0]), dtype=torch.float16, device="cuda")
        out = torch.full(plan.output_shape, float("nan"), device="cuda")
        run_pass(x_op, w_op)
        torch.cuda.synchronize()
        key = ("fp16 global", plan.key)
        main_for = lambda cfg: forward._main_launch(cfg, plan, NATIVE, False, out.stride(), 0)  # noqa: E731
        cfg = forward.pick_config(forward._best_config, key, forward.candidates(plan),
                                  lambda cfg: main_for(cfg)((x_op, w_op, w_op, w_op, out)), x.device)
        main_launch = main_for(cfg)
        out.fill_(float("nan"))
        run_pass(x_op, w_op)
        main_launch((x_op, w_op, w_op, w_op, out))
        torch.cuda.synchronize()
        e_x, e_w = sync[4].item(), sync[5].item()
        assert sync[:4].tolist() == [0, 0, 0, 0], sync.tolist()
        result = out * 2.0 ** -(e_x + e_w) + (b.view(1, -1, 1, 1, 1) if b is not None else 0)
        check, error = kernelbench_check(result, expected), relative_error(result, reference)
        label = f"{layer.name} ({cfg.get('KERNEL', 'general')} {cfg['BLOCK_M']}x{cfg.get('BLOCK_N', cfg.get('BLOCK_CO'))})"

        def both():
            run_pass(x_op, w_op)
            main_launch((x_op, w_op, w_op, w_op, out))

        for name, fn in [("eager", lambda: module(x)), ("backend=triton, TF32", lambda: ours(x)),
                         ("FP16 global: pass alone", lambda: run_pass(x_op, w_op)),
                         ("FP16 global: main kernel alone", lambda: main_launch((x_op, w_op, w_op, w_op, out))),
                         ("FP16 global: pass and main kernel", both)]:
            timing = time_cuda(fn, iters=args.iters)
            extra = (check, f"{error:.1e}") if name.endswith("pass and main kernel") else ("", "")
            rows.append((label, name, f"{timing.mean_ms:.4f}", f"{timing.min_ms:.4f}", *extra))
            print(rows[-1], flush=True)
        assert sync[:4].tolist() == [0, 0, 0, 0], sync.tolist()
    print(markdown_table(["layer (main kernel config)", "what", "cold-L2 mean ms", "min ms", "KernelBench check",
                          "rel. err. fp64"], rows))


if __name__ == "__main__":
    main()
