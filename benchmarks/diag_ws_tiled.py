"""The tiled GEMM (backends/triton/tiled.py) warp-specialised, on the sweep's float32 k2 s2 layers (GPU, Hopper).

Triton 3.6 warp-specialises a Hopper K-loop (tl.range(..., warp_specialize=True)) whose loads are TMA descriptor loads:
a producer warp group issues the loads, two consumer warp groups each run half the tile's MMAs (12 warps for
num_warps=4). Compiled for sm_90, it refused the library's epilogue (the pass failed on its permute of the tile), so
this kernel has two forms without one: JOIN keeps an accumulator [co, positions] per kw (the weight's rows reordered
as (kd, kh, kw, co)) and joins the two into the output rows' order; the other stores the accumulator [positions,
(co, kw)] at its own addresses (a thread's two adjacent columns are one channel's kw pair, adjacent in the output
row). Descriptors are made on the host (triton.tools.tensor_descriptor), over the operand pass's FP16-scaled buffers
as 2-D arrays: the fortieth session's device-made descriptors cost each program their making (benchmarks/RESULTS.md).
A tile is whole rows of one input plane (BLOCK_M a multiple of W, H of the rows). The kernel alone on operands made
beforehand, against the library's kernel; each output NaN-filled first, then checked (KernelBench's check against
eager, error against float64). Run the warp-specialised variants one per process (--variants): on the H200 some
faulted, which poisons the CUDA context for the rest. Results: benchmarks/RESULTS.md, forty-fourth session.

    PYTHONPATH=src python3 benchmarks/diag_ws_tiled.py [--iters 50] [--layers unet3d_k2s2_deep,unet3d_k2s2]
        [--variants TEXT] [--plain]
"""

import argparse
import sys

import torch
import triton
import triton.language as tl

from convt3d.backends.triton import tiled
from convt3d.backends.triton.forward import precision_for
from convt3d.bench.report import markdown_table
from convt3d.bench.workloads import sweep_layers
from diag_tma_tiled import ROW_HEADERS, _tile_origin, join_operands, measure  # beside this script (sys.path[0])


@triton.jit
def ws_tiled_kernel(
    x_desc, w_desc, x_exp_ptr, w_exp_ptr, b_ptr, y_ptr,
    C_IN, C_OUT, D, H, KD, KH, syn, syc, syd, syh, H_BLOCKS, N_BLOCKS,
    HAS_BIAS: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_CO: tl.constexpr,
    BLOCK_K: tl.constexpr, WS: tl.constexpr, JOIN: tl.constexpr, PLAIN: tl.constexpr,
):
    """KW == 2. JOIN: the weight's rows as (kd, kh, kw, co), an accumulator [co, position] per kw, joined for the
    store into [co, (position, kw)] (no permute). Else the library's rows (kd, kh, co, kw), one accumulator
    [position, (co, kw)] stored at its own addresses. PLAIN: the sums unscaled and no bias (timing only)."""
    BLOCK_M: tl.constexpr = BLOCK_R * BLOCK_Q  # BLOCK_Q == W: the tile's positions are consecutive rows of x
    tile = tl.program_id(0)  # output-channel blocks and (kd, kh) fastest, as tiled.py's order
    n_block = tile % N_BLOCKS
    rest = tile // N_BLOCKS
    tap = rest % (KD * KH)
    m_block = rest // (KD * KH)  # (n, d, row block)
    m0 = m_block * BLOCK_M
    h0, n, d, kd, kh = _tile_origin(m_block, tap, D, KH, H_BLOCKS, BLOCK_R)
    m = tl.arange(0, BLOCK_M)
    h = h0 + m // BLOCK_Q
    m_ok = h < H
    oh = KH * h + kh
    y_base = y_ptr + n.to(tl.int64) * syn + (KD * d + kd).to(tl.int64) * syd
    if not PLAIN:
        x_hi, x_lo = tiled._inverse_scale_halves(tiled._exponents(x_exp_ptr + m0 + m, m_ok))
    if JOIN:
        r0 = tap * (2 * C_OUT) + n_block * BLOCK_CO  # kw = 0's rows; kw = 1's C_OUT further
        acc0 = tl.zeros([BLOCK_CO, BLOCK_M], dtype=tl.float32)
        acc1 = tl.zeros([BLOCK_CO, BLOCK_M], dtype=tl.float32)
        for k0 in tl.range(0, C_IN, BLOCK_K, warp_specialize=WS):
            a = x_desc.load([m0, k0])
            acc0 = tl.dot(w_desc.load([r0, k0]), a.T, acc0)
            acc1 = tl.dot(w_desc.load([r0 + C_OUT, k0]), a.T, acc1)
        c = tl.arange(0, BLOCK_CO)
        co = n_block * BLOCK_CO + c
        n_ok = co < C_OUT
        if not PLAIN:
            w0_hi, w0_lo = tiled._inverse_scale_halves(tiled._exponents(w_exp_ptr + r0 + c, n_ok))
            w1_hi, w1_lo = tiled._inverse_scale_halves(tiled._exponents(w_exp_ptr + r0 + C_OUT + c, n_ok))
            acc0 = acc0 * (w0_hi[:, None] * x_hi[None, :]) * (w0_lo[:, None] * x_lo[None, :])
            acc1 = acc1 * (w1_hi[:, None] * x_hi[None, :]) * (w1_lo[:, None] * x_lo[None, :])
            if HAS_BIAS:
                bias = tl.load(b_ptr + co, mask=n_ok, other=0.0).to(tl.float32)[:, None]
                acc0 += bias
                acc1 += bias
        tile_v = tl.reshape(tl.join(acc0, acc1), (BLOCK_CO, 2 * BLOCK_M))
        e = tl.arange(0, 2 * BLOCK_M)
        r = e // (2 * BLOCK_Q)
        ptrs = (y_base + co[:, None].to(tl.int64) * syc
                + ((KH * (h0 + r) + kh) * syh + e % (2 * BLOCK_Q))[None, :])
        tl.store(ptrs, tile_v.to(y_ptr.dtype.element_ty), mask=n_ok[:, None] & (h0 + r < H)[None, :])
    else:
        BLOCK_N: tl.constexpr = BLOCK_CO * 2
        r0 = tap * (C_OUT * 2) + n_block * BLOCK_N
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in tl.range(0, C_IN, BLOCK_K, warp_specialize=WS):
            acc = tl.dot(x_desc.load([m0, k0]), w_desc.load([r0, k0]).T, acc)
        j = tl.arange(0, BLOCK_N)
        co = n_block * BLOCK_CO + j // 2
        n_ok = co < C_OUT
        if not PLAIN:
            w_hi, w_lo = tiled._inverse_scale_halves(tiled._exponents(w_exp_ptr + r0 + j, n_ok))
            acc = acc * (x_hi[:, None] * w_hi[None, :]) * (x_lo[:, None] * w_lo[None, :])
            if HAS_BIAS:
                acc += tl.load(b_ptr + co, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        ptrs = y_base + (oh * syh + 2 * (m % BLOCK_Q))[:, None] + (co.to(tl.int64) * syc + j % 2)[None, :]
        tl.store(ptrs, acc.to(y_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def ws_launch(cfg, plan, x_op, x_exp, w_op, w_exp, bias, out, descriptors):
    """One launch on the operands (for JOIN, join_operands' weight); descriptors (x's, w's) as make_descriptors makes
    them, or None to make them in this call (host time)."""
    n, c_in, (d, h, w) = plan.batch, plan.in_channels, plan.input_spatial
    c_out, (kd, kh, kw) = plan.out_channels, plan.kernel_size
    block_r, block_co = cfg["BLOCK_M"] // w, cfg["BLOCK_N"] // kw
    assert kw == 2 and block_r * w == cfg["BLOCK_M"] and h % block_r == 0, "KW 2, a tile whole rows of one plane"
    h_blocks, n_blocks = h // block_r, triton.cdiv(c_out, block_co)
    ws_tiled_kernel[(n * d * h_blocks * kd * kh * n_blocks,)](
        *(descriptors or make_descriptors(cfg, plan, x_op, w_op)), x_exp, w_exp, bias if bias is not None else out,
        out, c_in, c_out, d, h, kd, kh, *out.stride()[:4], h_blocks, n_blocks,
        HAS_BIAS=bias is not None, BLOCK_R=block_r, BLOCK_Q=w, BLOCK_CO=block_co, BLOCK_K=cfg["BLOCK_K"],
        WS=cfg["WS"], JOIN=cfg["JOIN"], PLAIN=cfg["PLAIN"], num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])


def make_descriptors(cfg, plan, x_op, w_op):
    from triton.tools.tensor_descriptor import TensorDescriptor

    c_in, block_k = plan.in_channels, cfg["BLOCK_K"]
    w_rows = cfg["BLOCK_N"] // 2 if cfg["JOIN"] else cfg["BLOCK_N"]
    return (TensorDescriptor.from_tensor(x_op.view(-1, c_in), [cfg["BLOCK_M"], block_k]),
            TensorDescriptor.from_tensor(w_op.view(-1, c_in), [w_rows, block_k]))


CONFIGS = [
    # (BLOCK_M, BLOCK_N, BLOCK_K, warp-specialised, num_warps, stages, join)
    (128, 128, 64, 1, 4, 3, 1),
    (128, 128, 64, 1, 4, 2, 1),
    (128, 128, 32, 1, 4, 4, 1),
    (128, 128, 32, 1, 4, 3, 1),
    (128, 128, 64, 0, 8, 3, 1),
    (128, 128, 64, 0, 4, 3, 1),
    (128, 128, 64, 1, 4, 3, 0),
    (128, 128, 64, 0, 8, 3, 0),
]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--layers", default="unet3d_k2s2_deep,unet3d_k2s2")
    parser.add_argument("--variants", default="", help="only the variants whose label contains this text")
    parser.add_argument("--plain", action="store_true", help="also each config with the plain epilogue")
    args = parser.parse_args()
    torch.backends.cudnn.allow_tf32 = True
    rows = []
    for layer in sweep_layers(args.layers):
        module, x, w, b, reference = layer.kernel_case("cuda")
        plan = layer.plan()
        with torch.no_grad():
            expected = module(x)
        precision = tiled.operand_precision(torch.float32, precision_for(torch.float32))
        operands = tiled._operands(x, w, precision)
        joined = join_operands(plan, *operands)
        lib_cfg = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, SWAP=1, num_warps=8, num_stages=3)
        variants = {}
        out = torch.full(plan.output_shape, float("nan"), device="cuda")
        variants["library tiled kernel 128x128x64 swap w8 s3"] = (
            lambda out=out: tiled._launch(lib_cfg, plan, *operands, b, out, precision), out)
        for m, nn, k, ws, wp, st, join in CONFIGS:
            ops = joined if join else operands
            for made, plain in (("before", 0), ("per call", 0), ("before", 1)):
                if (made == "per call" and (m, nn, k, ws, join) != (128, 128, 64, 1, 1)) or (plain and not args.plain):
                    continue
                cfg = dict(BLOCK_M=m, BLOCK_N=nn, BLOCK_K=k, WS=ws, JOIN=join, PLAIN=plain, num_warps=wp,
                           num_stages=st)
                label = (f"{'WS' if ws else 'TMA'} {'join ' if join else ''}{m}x{nn}x{k} w{wp} s{st}, descriptors "
                         f"made {made}" + (", plain epilogue (timing only)" if plain else ""))
                descriptors = make_descriptors(cfg, plan, ops[0], ops[2]) if made == "before" else None
                out = torch.full(plan.output_shape, float("nan"), device="cuda")
                variants[label] = (lambda cfg=cfg, out=out, ops=ops, d=descriptors: ws_launch(
                    cfg, plan, *ops, b, out, d), out)
        for label, (fn, out) in variants.items():
            if args.variants in label:
                rows.append(measure(layer.name, label, fn, out, expected, reference, args.iters))
    print(markdown_table(ROW_HEADERS, rows))


if __name__ == "__main__":
    sys.exit(main())
