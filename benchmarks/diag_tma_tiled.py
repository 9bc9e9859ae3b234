"""The tiled GEMM (backends/triton/tiled.py) with TMA loads of its FP16-scaled operands, on the sweep's float32 k2 s2
layers (GPU, Hopper): one tile per program, or a persistent grid whose tile loop is flattened with the K-loop
(tl.range(..., flatten=True)) so that Triton may pipeline the next tile's loads across an epilogue. JOIN rows keep an
accumulator per kw (KW == 2) and join them for the store, to skip the epilogue's layout conversion. The descriptors
are made on the device (tl.make_tensor_descriptor: triton.set_allocator gives their scratch memory), over the operand
pass's buffers as 2-D arrays; a tile is whole rows of one input plane (W a power of two, H a multiple of the rows).
The kernel alone on operands made beforehand, against the library's kernel; each output NaN-filled first, then
checked (KernelBench's check against eager, error against float64). Results: benchmarks/RESULTS.md, fortieth session.

    PYTHONPATH=src python3 benchmarks/diag_tma_tiled.py [--iters 50] [--layers unet3d_k2s2,unet3d_k2s2_deep]
"""

import argparse
import json
import pathlib
import sys

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from convt3d.backends.triton import tiled
from convt3d.backends.triton.forward import precision_for
from convt3d.bench.protocol import kernelbench_check, relative_error, time_cuda
from convt3d.bench.report import markdown_table
from convt3d.plan import make_plan

SWEEP = pathlib.Path(__file__).with_name("sweep.json")


@triton.jit
def tma_tiled_kernel(
    x_ptr, x_exp_ptr, w_ptr, w_exp_ptr, b_ptr, y_ptr,
    P, C_IN, C_OUT, D, H, W, KD, KH,
    syn, syc, syd, syh, syw,
    H_BLOCKS, N_BLOCKS, NUM_TILES, NUM_PROGRAMS,
    KW: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_Q: tl.constexpr,
    BLOCK_CO: tl.constexpr, BLOCK_K: tl.constexpr, SWAP: tl.constexpr, PERSISTENT: tl.constexpr,
    JOIN: tl.constexpr,
):
    BLOCK_M: tl.constexpr = BLOCK_R * BLOCK_Q  # BLOCK_Q == W: the tile's positions are consecutive rows of x
    BLOCK_N: tl.constexpr = BLOCK_CO * KW
    x_desc = tl.make_tensor_descriptor(x_ptr, shape=[P, C_IN], strides=[C_IN, 1], block_shape=[BLOCK_M, BLOCK_K])
    # JOIN: the weight's rows as (kd, kh, kw, co) (the library's are (kd, kh, co, kw)), an accumulator per kw
    # (KW == 2), joined in registers for the store: no layout conversion through shared memory.
    w_desc = tl.make_tensor_descriptor(w_ptr, shape=[KD * KH * C_OUT * KW, C_IN], strides=[C_IN, 1],
                                       block_shape=[BLOCK_CO if JOIN else BLOCK_N, BLOCK_K])
    # One tile per program where NUM_PROGRAMS == NUM_TILES; else persistent, the tile loop flattened with the K-loop
    # so that Triton pipelines the next tile's loads across this one's epilogue.
    for tile in tl.range(tl.program_id(0), NUM_TILES, NUM_PROGRAMS, flatten=PERSISTENT):
        n_block = tile % N_BLOCKS
        rest = tile // N_BLOCKS
        tap = rest % (KD * KH)
        m_block = rest // (KD * KH)  # (n, d, h block)
        m0 = m_block * BLOCK_M
        r0 = tap * (C_OUT * KW) + n_block * BLOCK_N
        if JOIN:
            _join_tile(x_desc, w_desc, x_exp_ptr, w_exp_ptr, b_ptr, y_ptr, m0, tap, n_block, m_block, C_IN, C_OUT, D,
                       H, KD, KH, syn, syc, syd, syh, syw, H_BLOCKS, HAS_BIAS, BLOCK_R, BLOCK_Q, BLOCK_CO, BLOCK_K,
                       SWAP)
        else:
            if SWAP:
                acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
            else:
                acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for k0 in range(0, C_IN, BLOCK_K):
                a = x_desc.load([m0, k0])
                b = w_desc.load([r0, k0])
                if SWAP:
                    acc = tl.dot(b, a.T, acc)
                else:
                    acc = tl.dot(a, b.T, acc)
            # The epilogue, as tiled.py's.
            h0, n, d, kd, kh = _tile_origin(m_block, tap, D, KH, H_BLOCKS, BLOCK_R)
            m = tl.arange(0, BLOCK_M)
            h = h0 + m // BLOCK_Q
            m_ok = h < H
            j = tl.arange(0, BLOCK_N)
            co = n_block * BLOCK_CO + j // KW
            n_ok = co < C_OUT
            position = m0 + m
            x_hi, x_lo = tiled._inverse_scale_halves(tiled._exponents(x_exp_ptr + position, m_ok))
            w_hi, w_lo = tiled._inverse_scale_halves(tiled._exponents(w_exp_ptr + r0 + j, n_ok))
            if SWAP:
                acc = acc * (w_hi[:, None] * x_hi[None, :]) * (w_lo[:, None] * x_lo[None, :])
                if HAS_BIAS:
                    acc += tl.load(b_ptr + co, mask=n_ok, other=0.0).to(tl.float32)[:, None]
                tile_v = tl.reshape(tl.permute(tl.reshape(acc, (BLOCK_CO, KW, BLOCK_M)), (0, 2, 1)),
                                    (BLOCK_CO, BLOCK_M * KW))
            else:
                acc = acc * (x_hi[:, None] * w_hi[None, :]) * (x_lo[:, None] * w_lo[None, :])
                if HAS_BIAS:
                    acc += tl.load(b_ptr + co, mask=n_ok, other=0.0).to(tl.float32)[None, :]
                tile_v = tl.reshape(tl.permute(tl.reshape(acc, (BLOCK_M, BLOCK_CO, KW)), (1, 0, 2)),
                                    (BLOCK_CO, BLOCK_M * KW))
            e = tl.arange(0, BLOCK_M * KW)
            r = e // (BLOCK_Q * KW)
            ow = e % (BLOCK_Q * KW)
            ok = h0 + r < H
            oh = KH * (h0 + r) + kh
            co_t = n_block * BLOCK_CO + tl.arange(0, BLOCK_CO)
            y_base = y_ptr + n.to(tl.int64) * syn + (KD * d + kd).to(tl.int64) * syd
            ptrs = y_base + co_t[:, None].to(tl.int64) * syc + (oh.to(tl.int64) * syh + ow * syw)[None, :]
            tl.store(ptrs, tile_v.to(y_ptr.dtype.element_ty), mask=(co_t < C_OUT)[:, None] & ok[None, :])


@triton.jit
def _tile_origin(m_block, tap, D, KH, H_BLOCKS, BLOCK_R: tl.constexpr):
    """(first input row, sample, input plane, kd, kh) of a tile: m_block = (n, d, row block), tap = (kd, kh)."""
    nd = m_block // H_BLOCKS
    return m_block % H_BLOCKS * BLOCK_R, nd // D, nd % D, tap // KH, tap % KH


@triton.jit
def _join_tile(x_desc, w_desc, x_exp_ptr, w_exp_ptr, b_ptr, y_ptr, m0, tap, n_block, m_block, C_IN, C_OUT, D, H,
               KD, KH, syn, syc, syd, syh, syw, H_BLOCKS, HAS_BIAS: tl.constexpr, BLOCK_R: tl.constexpr,
               BLOCK_Q: tl.constexpr, BLOCK_CO: tl.constexpr, BLOCK_K: tl.constexpr, SWAP: tl.constexpr):
    BLOCK_M: tl.constexpr = BLOCK_R * BLOCK_Q
    r0 = tap * (2 * C_OUT) + n_block * BLOCK_CO  # kw = 0's rows; kw = 1's C_OUT further
    if SWAP:
        acc0 = tl.zeros([BLOCK_CO, BLOCK_M], dtype=tl.float32)
        acc1 = tl.zeros([BLOCK_CO, BLOCK_M], dtype=tl.float32)
    else:
        acc0 = tl.zeros([BLOCK_M, BLOCK_CO], dtype=tl.float32)
        acc1 = tl.zeros([BLOCK_M, BLOCK_CO], dtype=tl.float32)
    for k0 in range(0, C_IN, BLOCK_K):
        a = x_desc.load([m0, k0])
        b0 = w_desc.load([r0, k0])
        b1 = w_desc.load([r0 + C_OUT, k0])
        if SWAP:
            acc0 = tl.dot(b0, a.T, acc0)
            acc1 = tl.dot(b1, a.T, acc1)
        else:
            acc0 = tl.dot(a, b0.T, acc0)
            acc1 = tl.dot(a, b1.T, acc1)
    h0, n, d, kd, kh = _tile_origin(m_block, tap, D, KH, H_BLOCKS, BLOCK_R)
    m = tl.arange(0, BLOCK_M)
    h = h0 + m // BLOCK_Q
    m_ok = h < H
    c = tl.arange(0, BLOCK_CO)
    co = n_block * BLOCK_CO + c
    n_ok = co < C_OUT
    x_hi, x_lo = tiled._inverse_scale_halves(tiled._exponents(x_exp_ptr + m0 + m, m_ok))
    w0_hi, w0_lo = tiled._inverse_scale_halves(tiled._exponents(w_exp_ptr + r0 + c, n_ok))
    w1_hi, w1_lo = tiled._inverse_scale_halves(tiled._exponents(w_exp_ptr + r0 + C_OUT + c, n_ok))
    if HAS_BIAS:
        bias = tl.load(b_ptr + co, mask=n_ok, other=0.0).to(tl.float32)
    else:
        bias = tl.zeros([BLOCK_CO], dtype=tl.float32)
    # Output offsets of (co, position), kw = 0; kw = 1 is the next column.
    oh = KH * h + kh
    ow = 2 * (m % BLOCK_Q)
    y_base = y_ptr + n.to(tl.int64) * syn + (KD * d + kd).to(tl.int64) * syd
    if SWAP:
        acc0 = acc0 * (w0_hi[:, None] * x_hi[None, :]) * (w0_lo[:, None] * x_lo[None, :]) + bias[:, None]
        acc1 = acc1 * (w1_hi[:, None] * x_hi[None, :]) * (w1_lo[:, None] * x_lo[None, :]) + bias[:, None]
        offs = co[:, None].to(tl.int64) * syc + (oh.to(tl.int64) * syh + ow * syw)[None, :]
        ok = n_ok[:, None] & m_ok[None, :]
    else:
        acc0 = acc0 * (x_hi[:, None] * w0_hi[None, :]) * (x_lo[:, None] * w0_lo[None, :]) + bias[None, :]
        acc1 = acc1 * (x_hi[:, None] * w1_hi[None, :]) * (x_lo[:, None] * w1_lo[None, :]) + bias[None, :]
        offs = co[None, :].to(tl.int64) * syc + (oh.to(tl.int64) * syh + ow * syw)[:, None]
        ok = n_ok[None, :] & m_ok[:, None]
    kw = tl.arange(0, 2)
    tile = tl.join(acc0, acc1).to(y_ptr.dtype.element_ty)
    ptrs = y_base + offs[:, :, None] + kw[None, None, :]
    tl.store(ptrs, tile, mask=ok[:, :, None] & (kw < 2)[None, None, :])


def tma_launch(cfg, plan, x_op, x_exp, w_op, w_exp, bias, out):
    n, c_in, (d, h, w) = plan.batch, plan.in_channels, plan.input_spatial
    c_out, (kd, kh, kw) = plan.out_channels, plan.kernel_size
    block_m, block_n = cfg["BLOCK_M"], cfg["BLOCK_N"]
    block_q = w
    block_r = block_m // block_q
    assert block_q * block_r == block_m and h % block_r == 0, "tile must be whole rows of one plane"
    block_co = block_n // kw
    h_blocks, n_blocks = h // block_r, triton.cdiv(c_out, block_co)
    tiles = n * d * h_blocks * kd * kh * n_blocks
    sms = torch.cuda.get_device_properties(out.device).multi_processor_count
    programs = min(tiles, sms * cfg["per_sm"]) if cfg["persistent"] else tiles
    join = cfg.get("join", 0)  # w_op and w_exp as join_operands returns them
    assert not join or kw == 2
    tma_tiled_kernel[(programs,)](
        x_op, x_exp, w_op, w_exp, bias if bias is not None else w_op, out,
        n * d * h * w, c_in, c_out, d, h, w, kd, kh, *out.stride(), h_blocks, n_blocks, tiles, programs,
        KW=kw, HAS_BIAS=bias is not None, BLOCK_R=block_r, BLOCK_Q=block_q, BLOCK_CO=block_co,
        BLOCK_K=cfg["BLOCK_K"], SWAP=cfg["SWAP"], PERSISTENT=cfg["persistent"], JOIN=join,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])


def join_operands(plan, x_op, x_exp, w_op, w_exp):
    """The operands with the weight's rows (and their exponents) as (kd, kh, kw, co), as JOIN reads them."""
    c_in, c_out, (kd, kh, kw) = plan.in_channels, plan.out_channels, plan.kernel_size
    return (x_op, x_exp, w_op.view(kd, kh, c_out, kw, c_in).transpose(2, 3).contiguous(),
            w_exp.view(kd, kh, c_out, kw).transpose(2, 3).contiguous())


CONFIGS = [
    # (BLOCK_M, BLOCK_N, BLOCK_K, SWAP, warps, stages, persistent, programs per SM, join)
    (128, 128, 64, 1, 8, 3, 0, 0, 0),
    (128, 128, 64, 1, 8, 3, 1, 1, 0),
    (128, 128, 64, 1, 8, 4, 1, 1, 0),
    (128, 128, 64, 0, 8, 3, 1, 1, 0),
    (128, 128, 64, 0, 4, 3, 1, 2, 0),
    (128, 128, 64, 1, 4, 4, 1, 1, 0),
    (128, 128, 64, 1, 4, 3, 1, 2, 0),
    (128, 256, 64, 0, 8, 3, 1, 1, 0),
    (128, 256, 64, 0, 8, 3, 0, 0, 0),
    (128, 64, 64, 1, 4, 4, 1, 2, 0),
    (128, 64, 64, 1, 4, 4, 0, 0, 0),
    (128, 128, 64, 1, 8, 3, 0, 0, 1),
    (128, 128, 64, 1, 8, 3, 1, 1, 1),
]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--layers", default="unet3d_k2s2,unet3d_k2s2_deep")
    args = parser.parse_args()
    triton.set_allocator(lambda size, alignment, stream: torch.empty(size, device="cuda", dtype=torch.int8))
    layers = {layer["name"]: layer for layer in json.loads(SWEEP.read_text())}
    rows = []
    for name in args.layers.split(","):
        layer = layers[name]
        torch.manual_seed(0)
        module = torch.nn.ConvTranspose3d(layer["in_channels"], layer["out_channels"], layer["kernel_size"],
                                          stride=layer["stride"], bias=layer["bias"]).cuda()
        x = torch.rand(layer["input_shape"], device="cuda")
        w, b = module.weight.detach(), module.bias.detach()
        plan = make_plan(tuple(x.shape), tuple(w.shape), stride=layer["stride"])
        reference = F.conv_transpose3d(x.double(), w.double(), b.double(), stride=layer["stride"])
        torch.backends.cudnn.allow_tf32 = True
        with torch.no_grad():
            expected = module(x)
        precision = tiled.operand_precision(torch.float32, precision_for(torch.float32))
        operands = tiled._operands(x, w, precision)
        lib_cfg = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, SWAP=1, num_warps=8, num_stages=3)
        variants = {}
        out = torch.full(plan.output_shape, float("nan"), device="cuda")
        variants["library tiled kernel 128x128x64 swap w8 s3"] = (
            lambda out=out: tiled._launch(lib_cfg, plan, *operands, b, out, precision), out)
        for m, nn, k, swap, wp, st, pers, per_sm, join in CONFIGS:
            cfg = dict(BLOCK_M=m, BLOCK_N=nn, BLOCK_K=k, SWAP=swap, num_warps=wp, num_stages=st,
                       persistent=pers, per_sm=per_sm, join=join)
            label = (f"TMA {m}x{nn}x{k} swap {swap} w{wp} s{st} " + (f"persistent {per_sm}/SM" if pers else "grid")
                     + (" join" if join else ""))
            out = torch.full(plan.output_shape, float("nan"), device="cuda")
            ops = join_operands(plan, *operands) if join else operands
            variants[label] = (lambda cfg=cfg, out=out, ops=ops: tma_launch(cfg, plan, *ops, b, out), out)
        for label, (fn, out) in variants.items():
            rows.append(measure(name, label, fn, out, expected, reference, args.iters))
    print(markdown_table(ROW_HEADERS, rows))


ROW_HEADERS = ["layer", "variant", "mean ms", "min ms", "check, rel. err. vs float64"]


def measure(layer_name, label, fn, out, expected, reference, iters):
    """A variant's row, printed: fn run once (out, which it writes, NaN-filled beforehand), checked against eager
    (KernelBench's check) and float64, then timed (cold L2); where it fails, a row naming the error."""
    try:
        fn()
        torch.cuda.synchronize()
        note = f"KB {kernelbench_check(out, expected)}, {relative_error(out, reference):.1e}"
        t = time_cuda(fn, iters=iters)
        row = (layer_name, label, t.mean_ms, t.min_ms, note)
    except Exception as error:
        row = (layer_name, label, float("nan"), float("nan"), repr(error)[:100])
    print(row, flush=True)
    return row


if __name__ == "__main__":
    sys.exit(main())
