"""TF32 mode's float32 operands as FP16 with one scale per tensor, found inside the operand pass (GPU machine): a
prototype, to see what it could give the general and tap_columns kernels before building it into them.

    PYTHONPATH=src python3 benchmarks/diag_fp16_global.py [--iters 50] [--layers video_k3s2p1op1,...]
        [--tile 16384] [--warps 8] [--reread 0]

The thirty-first session's FP16 operands (a47d641, reverted) found the input's and the weight's largest magnitudes in
a launch of their own, and its host time ate the kernels' gain. Here the operand pass finds them itself: a
cooperative grid (all programs resident at once), each program one tile of the input and one chunk of the weight,
which it reads once and keeps in registers. It posts its largest magnitudes (atomic maxima), meets the others at a
grid-wide barrier (an atomic counter, polled), then TF32-rounds its values, scales them by a power of two that puts
the tensor's largest magnitude in [2^14, 2^15), and stores them as FP16 in the layouts the main kernels read (input
channels-last, weight tap-major and K-major). The last program out resets the counters for the next call. With
--reread N, N programs per multiprocessor loop over the tiles instead and read them again (from L2) after the barrier.
(The first form, 1493f74, looped over 32 x 128 tiles, read them again and polled with atomics.)

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
import convt3d.backends.triton as triton_backend
from convt3d.backends.triton import NATIVE, forward, tensor_scaled
from convt3d.backends.triton.forward import _fp16_scale_exponent, let_next_start
from convt3d.backends.triton.tensor_scaled import _scaled
from convt3d.bench.protocol import kernelbench_check, relative_error, time_cuda
from convt3d.bench.report import markdown_table
from convt3d.bench.workloads import sweep_layers


@triton.jit
def _x_tile(x_ptr, t, X_TILES, C, S, C_BLOCKS, S_BLOCKS, sxn, sxc, sxs, BLOCK_C: tl.constexpr,
            BLOCK_S: tl.constexpr):
    """(values, mask, offsets in the channels-last operand) of input tile t (none past X_TILES): BLOCK_C channels
    by BLOCK_S positions, the positions contiguous in the input."""
    n = (t // (S_BLOCKS * C_BLOCKS)).to(tl.int64)
    c = (t // S_BLOCKS % C_BLOCKS) * BLOCK_C + tl.arange(0, BLOCK_C)
    sp = (t % S_BLOCKS) * BLOCK_S + tl.arange(0, BLOCK_S)
    ok = (c[:, None] < C) & (sp[None, :] < S * (t < X_TILES))
    v = tl.load(x_ptr + n * sxn + c[:, None].to(tl.int64) * sxc + sp[None, :].to(tl.int64) * sxs, mask=ok, other=0.0)
    return v, ok, n * S * C + sp[None, :].to(tl.int64) * C + c[:, None]


@triton.jit
def _w_chunk(w_ptr, j, C_IN, C_OUT, TAPS, BLOCK_W: tl.constexpr):
    """(values, mask, offsets) of weight chunk j: BLOCK_W elements in the operand's order (tap, co, ci), read from
    the contiguous weight (C_in, C_out, taps)."""
    f = j * BLOCK_W + tl.arange(0, BLOCK_W)
    ci = f % C_IN
    co = f // C_IN % C_OUT
    tap = f // (C_IN * C_OUT)
    ok = f < TAPS * C_IN * C_OUT
    return tl.load(w_ptr + (ci * C_OUT + co) * TAPS + tap, mask=ok, other=0.0), ok, f


@triton.jit
def fp16_global_pass_kernel(x_ptr, x_op_ptr, w_ptr, w_op_ptr, sync_ptr,
                            C, S, C_BLOCKS, S_BLOCKS, X_TILES, sxn, sxc, sxs, C_IN, C_OUT, TAPS, W_CHUNKS,
                            BLOCK_C: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_W: tl.constexpr,
                            REREAD: tl.constexpr, LET_NEXT_START: tl.constexpr = True):
    """Program p takes input tiles p, p + programs, ... and weight chunks the same (_x_tile, _w_chunk). Without
    REREAD it has at most one of each and keeps them in registers from its first read to its store; with REREAD it
    reads them again after the barrier. sync_ptr: int32 words [largest |x| bits, largest |w| bits, arrivals,
    departures, e_x, e_w], the first four zero on entry and on exit."""
    if LET_NEXT_START:  # (the main kernel's programs may start; they wait for this launch's end)
        let_next_start()
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    if REREAD:
        x_largest = 0.0
        for t in range(pid, X_TILES, programs):
            v, ok, offs = _x_tile(x_ptr, t, X_TILES, C, S, C_BLOCKS, S_BLOCKS, sxn, sxc, sxs, BLOCK_C, BLOCK_S)
            x_largest = tl.maximum(x_largest, tl.max(tl.max(tl.abs(v), axis=1), axis=0))
        w_largest = 0.0
        for j in range(pid, W_CHUNKS, programs):
            v, ok, offs = _w_chunk(w_ptr, j, C_IN, C_OUT, TAPS, BLOCK_W)
            w_largest = tl.maximum(w_largest, tl.max(tl.abs(v), axis=0))
    else:
        x, x_ok, x_offs = _x_tile(x_ptr, pid, X_TILES, C, S, C_BLOCKS, S_BLOCKS, sxn, sxc, sxs, BLOCK_C, BLOCK_S)
        w, w_ok, w_offs = _w_chunk(w_ptr, pid, C_IN, C_OUT, TAPS, BLOCK_W)
        x_largest = tl.max(tl.max(tl.abs(x), axis=1), axis=0)
        w_largest = tl.max(tl.abs(w), axis=0)
    # Non-negative floats order as their bits do.
    tl.atomic_max(sync_ptr, x_largest.to(tl.int32, bitcast=True), sem="relaxed")
    tl.atomic_max(sync_ptr + 1, w_largest.to(tl.int32, bitcast=True), sem="relaxed")
    tl.atomic_add(sync_ptr + 2, 1, sem="release")
    arrived = tl.load(sync_ptr + 2, volatile=True)
    while arrived < programs:
        arrived = tl.load(sync_ptr + 2, volatile=True)
    tl.atomic_add(sync_ptr + 2, 0, sem="acquire")  # every program's maxima, seen below
    e_x = _fp16_scale_exponent(tl.load(sync_ptr, volatile=True).to(tl.float32, bitcast=True))
    e_w = _fp16_scale_exponent(tl.load(sync_ptr + 1, volatile=True).to(tl.float32, bitcast=True))
    if REREAD:
        for t in range(pid, X_TILES, programs):
            v, ok, offs = _x_tile(x_ptr, t, X_TILES, C, S, C_BLOCKS, S_BLOCKS, sxn, sxc, sxs, BLOCK_C, BLOCK_S)
            tl.store(x_op_ptr + offs, _scaled(v, e_x), mask=ok)
        for j in range(pid, W_CHUNKS, programs):
            v, ok, offs = _w_chunk(w_ptr, j, C_IN, C_OUT, TAPS, BLOCK_W)
            tl.store(w_op_ptr + offs, _scaled(v, e_w), mask=ok)
    else:
        tl.store(x_op_ptr + x_offs, _scaled(x, e_x), mask=x_ok)
        tl.store(w_op_ptr + w_offs, _scaled(w, e_w), mask=w_ok)
    departed = tl.atomic_add(sync_ptr + 3, 1, sem="acq_rel")
    if departed == programs - 1:  # the last one out: every other has read the maxima
        tl.store(sync_ptr + 4, e_x)
        tl.store(sync_ptr + 5, e_w)
        for i in tl.static_range(4):
            tl.store(sync_ptr + i, 0)


TILE = 16384  # values of the input per program (64 registers a thread at 8 warps)


def make_pass(x, w, num_warps=8, tile=TILE, reread_programs=0):
    """(run(x_op, w_op), sync words, a description) of the prototype pass for x (N, C, D, H, W) and w (C_in, C_out,
    kD, kH, kW), every program resident (a cooperative launch fails otherwise): one program per input tile and the
    weight in as many chunks, or with reread_programs, that many programs per multiprocessor reading again."""
    n, c = x.shape[:2]
    s = x[0, 0].numel()
    c_in, c_out = w.shape[:2]
    taps = w[0, 0].numel()
    block_c = min(triton.next_power_of_2(c), 64)
    block_s = tile // block_c
    c_blocks, s_blocks = triton.cdiv(c, block_c), triton.cdiv(s, block_s)
    x_tiles = n * c_blocks * s_blocks
    if reread_programs:
        block_w = 2048
        w_chunks = triton.cdiv(w.numel(), block_w)
        sms = torch.cuda.get_device_properties(x.device).multi_processor_count
        grid = (min(max(x_tiles, w_chunks), reread_programs * sms),)
    else:
        block_w = triton.next_power_of_2(triton.cdiv(w.numel(), x_tiles))
        w_chunks = triton.cdiv(w.numel(), block_w)
        grid = (max(x_tiles, w_chunks),)
    sync = torch.zeros(8, dtype=torch.int32, device=x.device)
    flat = x.flatten(2)

    def run(x_op, w_op):
        fp16_global_pass_kernel[grid](flat, x_op, w, w_op, sync, c, s, c_blocks, s_blocks, x_tiles, *flat.stride(),
                                      c_in, c_out, taps, w_chunks, BLOCK_C=block_c, BLOCK_S=block_s, BLOCK_W=block_w,
                                      REREAD=bool(reread_programs), num_warps=num_warps,
                                      launch_cooperative_grid=True)

    form = f"read again, {reread_programs} per SM" if reread_programs else "held"
    return run, sync, f"{grid[0]} programs of {block_c}x{block_s} and {block_w}, {num_warps} warps, {form}"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--layers", default="video_k3s2p1op1,vae_k4s2p1,k3s1p1,wide_256to128_k3s2,video_spatial_k144")
    parser.add_argument("--tile", type=int, default=TILE, help="input values per program of the pass")
    parser.add_argument("--warps", type=int, default=8, help="the pass's warps per program")
    parser.add_argument("--reread", type=int, default=0,
                        help="N > 0: N programs per multiprocessor, each reading its tiles again after the barrier")
    args = parser.parse_args()
    torch.backends.cudnn.allow_tf32 = True
    rows = []
    for layer in sweep_layers(args.layers):
        try:
            rows += measure(layer, args)
        except Exception as error:  # (a cooperative launch whose programs cannot all be resident fails)
            rows.append((layer.name, f"failed: {type(error).__name__}: {str(error)[:200]}", "", "", "", ""))
            print(rows[-1], flush=True)
    print(markdown_table(["layer (pass and main kernel configs)", "what", "cold-L2 mean ms", "min ms",
                          "KernelBench check", "rel. err. fp64"], rows))


def use_library_form(as_fp16: bool) -> None:
    """Later backend="triton" calls take TF32 mode's FP16 operands scaled per tensor, or TF32 ones: prepared calls
    and bound launches forgotten, configs kept (their keys differ by precision)."""
    tensor_scaled.TF32_AS_FP16 = as_fp16
    forward._chosen.clear()
    triton_backend._prepared.clear()


def measure(layer, args):
    """The rows of one layer."""
    rows = []
    module, x, w, b, reference = layer.kernel_case("cuda")
    plan = layer.plan()
    expected = module(x)
    ours = convt3d.convert(module, backend="triton")
    run_pass, sync, pass_shape = make_pass(x, w, args.warps, args.tile, args.reread)
    n, c, d, h, wd = x.shape
    x_op = torch.empty((n, d, h, wd, c), dtype=torch.float16, device="cuda")
    w_op = torch.empty((w[0, 0].numel(), 1, w.shape[1], w.shape[0]), dtype=torch.float16, device="cuda")
    out = torch.full(plan.output_shape, float("nan"), device="cuda")
    pointers = (x_op, w_op, w_op, w_op, out)  # (x, w, w_lo, the bias (none), out)
    run_pass(x_op, w_op)
    torch.cuda.synchronize()
    key = ("fp16 global", plan.key)
    main_for = lambda cfg: forward._main_launch(cfg, plan, NATIVE, False, out.stride(), 0)  # noqa: E731
    cfg = forward.pick_config(forward._best_config, key, forward.candidates(plan),
                              lambda cfg: main_for(cfg)(pointers), x.device)
    main_launch = main_for(cfg)
    out.fill_(float("nan"))
    run_pass(x_op, w_op)
    main_launch(pointers)
    torch.cuda.synchronize()
    e_x, e_w = sync[4].item(), sync[5].item()
    assert sync[:4].tolist() == [0, 0, 0, 0], sync.tolist()
    result = out * 2.0 ** -(e_x + e_w) + (b.view(1, -1, 1, 1, 1) if b is not None else 0)
    check, error = kernelbench_check(result, expected), relative_error(result, reference)
    label = (f"{layer.name} (pass {pass_shape}; main {cfg.get('KERNEL', 'general')} "
             f"{cfg['BLOCK_M']}x{cfg.get('BLOCK_N', cfg.get('BLOCK_CO'))})")

    def both():
        run_pass(x_op, w_op)
        main_launch(pointers)

    for as_fp16 in (False, True):  # the library's two TF32 forms, each prepared afresh
        use_library_form(as_fp16)
        ours(x)
        timing = time_cuda(lambda: ours(x), iters=args.iters)
        name = "backend=triton, " + ("FP16 scaled per tensor (library)" if as_fp16 else "TF32 operands")
        rows.append((label, name, f"{timing.mean_ms:.4f}", f"{timing.min_ms:.4f}", "", ""))
        print(rows[-1], flush=True)
    for name, fn in [("eager", lambda: module(x)),
                     ("FP16 global: pass alone", lambda: run_pass(x_op, w_op)),
                     ("FP16 global: main kernel alone", lambda: main_launch(pointers)),
                     ("FP16 global: pass and main kernel", both)]:
        timing = time_cuda(fn, iters=args.iters)
        extra = (check, f"{error:.1e}") if name.endswith("pass and main kernel") else ("", "")
        rows.append((label, name, f"{timing.mean_ms:.4f}", f"{timing.min_ms:.4f}", *extra))
        print(rows[-1], flush=True)
    assert sync[:4].tolist() == [0, 0, 0, 0], sync.tolist()
    return rows


if __name__ == "__main__":
    main()
