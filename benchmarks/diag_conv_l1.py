"""Experiment: problem 77's compact phase convolution (3x3x3, stride 1, 32 -> 64 channels on 16x32x32, and the
64 -> 32 of its grad_input) as a Triton implicit GEMM that reuses the input tile across taps, against cuDNN.

The fourth session's kernel (conv_kernel with A_CACHE "") reloads each tap's tile from L2 (27 loads per tile;
L2-bound). Two ways to reuse it, both measured slower (RESULTS.md, eleventh session):
- conv_kernel with A_CACHE ".ca": Triton copies 16 bytes at a time with cp.async.cg (L2 only) whatever the cache
  modifier; with the row stride a runtime argument it can only prove 8-byte alignment and emits cp.async.ca (cached
  in L1), so the taps' overlapping tiles can hit L1. --compile-only shows which copies a variant gets (sm_90, no GPU).
- conv_gather_kernel: the output tile is BLOCK_M consecutive positions of the flattened window; one load per depth
  tap of the rows its nine taps read, each tap's operand taken from it with tl.gather.

    python3 benchmarks/diag_conv_l1.py [--compile-only]

Figures: benchmarks/RESULTS.md, eleventh session.
"""

import argparse
import sys

import torch
import triton
import triton.language as tl

from diag_conv_cuda import round_tf32, time_ms  # the same timer for both experiments


@triton.jit(do_not_specialize=["C_PAIRS"])
def conv_kernel(
    x_ptr, w_ptr, y_ptr, QD, QH, QW, XD, XH, XW, syn, syc, syd, syh, syw, QH_BLOCKS, QW_BLOCKS, C_PAIRS,
    C_IN: tl.constexpr, C_OUT: tl.constexpr, TAPS_D: tl.constexpr, TAPS_H: tl.constexpr, TAPS_W: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr, A_CACHE: tl.constexpr, W_CACHE: tl.constexpr,
    TAP_ORDER: tl.constexpr,
):
    """y[n, oc, qd, qh, qw] = sum_{k, ic} x[n, qd + kd, qh + kh, qw + kw, ic] * w[k, oc, ic]; x is the zero-padded
    channels-last window (N, XD, XH, XW, C_IN), TF32-rounded; w (taps, C_OUT, C_IN), TF32-rounded."""
    BLOCK_M: tl.constexpr = BLOCK_H * BLOCK_W
    pid = tl.program_id(0)
    qw_block = pid % QW_BLOCKS
    pid = pid // QW_BLOCKS
    qh_block = pid % QH_BLOCKS
    pid = pid // QH_BLOCKS
    qd = pid % QD
    n = (pid // QD).to(tl.int64)
    m = tl.arange(0, BLOCK_M)
    qh = qh_block * BLOCK_H + m // BLOCK_W
    qw = qw_block * BLOCK_W + m % BLOCK_W
    m_ok = (qh < QH) & (qw < QW)
    # Positions C_PAIRS * 2 elements apart, C_PAIRS a runtime argument not specialised: the compiler can only prove
    # 8-byte alignment, copies 8 bytes at a time, and such copies (cp.async.ca) are cached in L1 where 16-byte
    # ones (cp.async.cg) are not. With A_CACHE == "" the row stride is the constant C_IN (16-byte copies).
    if A_CACHE == ".ca":
        x_rows = ((qd * XH + tl.minimum(qh, QH - 1)) * XW + tl.minimum(qw, QW - 1)) * C_PAIRS * 2
        row_step = C_PAIRS * 2
    else:
        x_rows = ((qd * XH + tl.minimum(qh, QH - 1)) * XW + tl.minimum(qw, QW - 1)) * C_IN
        row_step = C_IN
    x_base = x_ptr + n * XD * XH * XW * C_IN
    ic = tl.arange(0, C_IN)
    oc = tl.arange(0, C_OUT)
    acc = tl.zeros((BLOCK_M, C_OUT), dtype=tl.float32)
    TAPS: tl.constexpr = TAPS_D * TAPS_H * TAPS_W
    for step in range(TAPS):
        if TAP_ORDER == 0:  # kd, kh, kw: the w tap fastest
            kd = step // (TAPS_H * TAPS_W)
            kh = step // TAPS_W % TAPS_H
            kw = step % TAPS_W
        else:  # kw, kh, kd: the d tap fastest
            kw = step // (TAPS_H * TAPS_D)
            kh = step // TAPS_D % TAPS_H
            kd = step % TAPS_D
        tap = (kd * TAPS_H + kh) * TAPS_W + kw
        shift = ((kd * XH + kh) * XW + kw) * row_step
        a = tl.load(x_base + x_rows[:, None] + shift + ic[None, :], cache_modifier=A_CACHE)
        b = tl.load(w_ptr + tap * C_OUT * C_IN + oc[:, None] * C_IN + ic[None, :], cache_modifier=W_CACHE)
        acc = tl.dot(a, tl.trans(b), acc, input_precision="tf32")
    out = tl.trans(acc)
    ptrs = (y_ptr + n * syn + (oc * syc)[:, None]
            + (qd * syd + tl.minimum(qh, QH - 1) * syh + tl.minimum(qw, QW - 1) * syw)[None, :])
    tl.store(ptrs, out, mask=m_ok[None, :])


@triton.jit
def conv_gather_kernel(
    x_ptr, w_ptr, y_ptr, QD, QH, QW, TILES, rows_per_sample, syn, syc, syd, syh, syw,
    XH: tl.constexpr, XW: tl.constexpr, C_IN: tl.constexpr, C_OUT: tl.constexpr, BLOCK_M: tl.constexpr,
    HALO: tl.constexpr,
):
    """As conv_kernel, but the output tile is BLOCK_M consecutive positions of the flattened window (margins
    computed, not stored): per depth tap one load of the HALO rows its nine (kh, kw) taps read, each tap's operand
    gathered from it (tl.gather) instead of loaded again."""
    pid = tl.program_id(0)
    n = pid // TILES
    p0 = (pid % TILES) * BLOCK_M
    x_sample = x_ptr + n.to(tl.int64) * rows_per_sample * C_IN
    r = tl.arange(0, HALO)
    ic = tl.arange(0, C_IN)
    oc = tl.arange(0, C_OUT)
    m = tl.arange(0, BLOCK_M)
    acc = tl.zeros((BLOCK_M, C_OUT), dtype=tl.float32)
    for kd in range(3):
        rows = p0 + kd * XH * XW + r
        ok = (r < BLOCK_M + 2 * XW + 2) & (rows < rows_per_sample)
        halo = tl.load(x_sample + rows.to(tl.int64)[:, None] * C_IN + ic[None, :], mask=ok[:, None], other=0.0)
        for j in tl.static_range(9):
            shift = (j // 3) * XW + j % 3
            idx = tl.broadcast_to((m + shift)[:, None], (BLOCK_M, C_IN))
            a = tl.gather(halo, idx, 0)
            b = tl.load(w_ptr + (kd * 9 + j) * C_OUT * C_IN + oc[:, None] * C_IN + ic[None, :])
            acc = tl.dot(a, tl.trans(b), acc, input_precision="tf32")
    out = tl.trans(acc)
    p = p0 + m
    pw = p % XW
    ph = p // XW % XH
    pd = p // (XH * XW)
    ok = (pd < QD) & (ph < QH) & (pw < QW)
    tl.store(y_ptr + n.to(tl.int64) * syn + (oc * syc)[:, None] + (pd * syd + ph * syh + pw * syw)[None, :], out,
             mask=ok[None, :])


def launch_gather(x_win, w_km, y, block_m, halo, warps, stages):
    n, c_out, qd, qh, qw = y.shape
    _, xd, xh, xw, c_in = x_win.shape
    tiles = triton.cdiv(qd * xh * xw, block_m)
    conv_gather_kernel[(n * tiles,)](x_win, w_km, y, qd, qh, qw, tiles, xd * xh * xw, *y.stride(), XH=xh, XW=xw,
                                     C_IN=c_in, C_OUT=c_out, BLOCK_M=block_m, HALO=halo, num_warps=warps,
                                     num_stages=stages)


def launch(x_win, w_km, y, block_h, block_w, warps, stages, a_cache, w_cache, tap_order):
    n, oc, qd, qh, qw = y.shape
    _, xd, xh, xw, c_in = x_win.shape
    qh_blocks, qw_blocks = triton.cdiv(qh, block_h), triton.cdiv(qw, block_w)
    conv_kernel[(n * qd * qh_blocks * qw_blocks,)](
        x_win, w_km, y, qd, qh, qw, xd, xh, xw, *y.stride(), qh_blocks, qw_blocks, c_in // 2,
        C_IN=c_in, C_OUT=oc, TAPS_D=3, TAPS_H=3, TAPS_W=3, BLOCK_H=block_h, BLOCK_W=block_w,
        A_CACHE=a_cache, W_CACHE=w_cache, TAP_ORDER=tap_order, num_warps=warps, num_stages=stages)


# (BLOCK_H, BLOCK_W, warps, stages, A cache, W cache, tap order)
VARIANTS = [
    (4, 32, 4, 3, "", "", 0),  # the fourth session's kernel, for reference
    (8, 32, 8, 3, "", "", 0),
    (4, 32, 4, 3, ".ca", "", 0),
    (4, 32, 4, 4, ".ca", "", 0),
    (4, 32, 8, 3, ".ca", "", 0),
    (8, 32, 8, 3, ".ca", "", 0),
    (2, 32, 4, 4, ".ca", "", 0),
    (4, 32, 4, 3, ".ca", "", 1),
]
# (BLOCK_M, HALO, warps, stages) of conv_gather_kernel
GATHER_VARIANTS = [(128, 256, 8, 1), (128, 256, 4, 1), (256, 512, 8, 1), (128, 256, 8, 2), (64, 256, 4, 1)]


def compile_only():
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import ASTSource
    names = conv_kernel.arg_names
    for bh, bw, warps, stages, a_cache, w_cache, order in VARIANTS:
        constexprs = dict(C_IN=32, C_OUT=64, TAPS_D=3, TAPS_H=3, TAPS_W=3, BLOCK_H=bh, BLOCK_W=bw, A_CACHE=a_cache,
                          W_CACHE=w_cache, TAP_ORDER=order, syw=1)
        sig = {k: "*fp32" if k.endswith("_ptr") else "i32" for k in names}
        sig.update({k: "constexpr" for k in constexprs})
        attrs = {(i,): [["tt.divisibility", 16]] for i, k in enumerate(names) if k not in constexprs and k != "C_PAIRS"}
        k = triton.compile(ASTSource(conv_kernel, sig, constexprs, attrs), target=GPUTarget("cuda", 90, 32),
                           options=dict(num_warps=warps, num_stages=stages))
        ptx = k.asm["ptx"]
        print((bh, bw, warps, stages, a_cache, w_cache, order), "shared", k.metadata.shared,
              "cp.async.ca", ptx.count("cp.async.ca"), "cp.async.cg", ptx.count("cp.async.cg"),
              "wgmma", ptx.count("wgmma.mma_async"), "ld.global", ptx.count("ld.global"),
              "regs", k.n_regs if hasattr(k, "n_regs") else "?", "spills", getattr(k, "n_spills", "?"))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--compile-only", action="store_true")
    args = parser.parse_args()
    if args.compile_only:
        return compile_only()
    torch.manual_seed(0)
    torch.backends.cudnn.allow_tf32 = True
    rows = []
    # (C_in, C_out): problem 77's forward phase and its grad_input.
    for c_in, c_out in ((32, 64), (64, 32)):
        x = torch.rand(16, c_in, 16, 32, 32, device="cuda")
        w = torch.rand(c_out, c_in, 3, 3, 3, device="cuda") - 0.5  # conv3d weight
        ref = torch.nn.functional.conv3d(x.double(), w.double(), padding=1)
        err = lambda y: ((y.double() - ref).norm() / ref.norm()).item()
        f = torch.nn.functional
        x_cl, w_cl = x.to(memory_format=torch.channels_last_3d), w.to(memory_format=torch.channels_last_3d)
        w_t = w.flip(2, 3, 4).transpose(0, 1).contiguous()
        for name, fn in (("cudnn conv3d NCDHW", lambda: f.conv3d(x, w, padding=1)),
                         ("cudnn conv3d CL", lambda: f.conv3d(x_cl, w_cl, padding=1)),
                         ("cudnn conv_transpose3d NCDHW", lambda: f.conv_transpose3d(x, w_t, padding=1))):
            rows.append(((c_in, c_out), name, time_ms(fn), err(fn())))
            print(rows[-1], flush=True)
        x_win = round_tf32(f.pad(x, (1, 1) * 3).permute(0, 2, 3, 4, 1).contiguous())
        w_km = round_tf32(w.permute(2, 3, 4, 0, 1).reshape(27, c_out, c_in).contiguous())
        y = torch.empty(16, c_out, 16, 32, 32, device="cuda")
        for v in VARIANTS:
            y.fill_(float("nan"))
            launch(x_win, w_km, y, *v)
            rows.append(((c_in, c_out), str(v), time_ms(lambda: launch(x_win, w_km, y, *v)), err(y)))
            print(rows[-1], flush=True)
        for v in GATHER_VARIANTS:
            try:
                y.fill_(float("nan"))
                launch_gather(x_win, w_km, y, *v)
                rows.append(((c_in, c_out), f"gather {v}", time_ms(lambda: launch_gather(x_win, w_km, y, *v)),
                             err(y)))
            except Exception as e:  # report and go on
                rows.append(((c_in, c_out), f"gather {v}: {type(e).__name__} {str(e)[:150]}", float("nan"), 0.0))
            print(rows[-1], flush=True)
        if c_out == 64:  # the forward: into the lattice of a zero-filled output, against cuDNN + strided copy
            out = torch.zeros(16, 64, 33, 65, 65, device="cuda")
            lattice = out[:, :, 1::2, 1::2, 1::2]
            compact = f.conv3d(x, w, padding=1)
            rows.append(((c_in, c_out), "lattice.copy_(compact)", time_ms(lambda: lattice.copy_(compact)), 0.0))
            for v in GATHER_VARIANTS[:3]:
                try:
                    out.zero_()
                    launch_gather(x_win, w_km, lattice, *v)
                    rows.append(((c_in, c_out), f"gather into lattice {v}",
                                 time_ms(lambda: launch_gather(x_win, w_km, lattice, *v)), err(lattice)))
                except Exception as e:  # report and go on
                    rows.append(((c_in, c_out), f"gather into lattice {v}: {type(e).__name__}", float("nan"), 0.0))
                print(rows[-1], flush=True)
            rows.append(((c_in, c_out), "out.zero_()", time_ms(out.zero_), 0.0))
    print("| C_in, C_out | what | ms | rel. err. vs float64 |")
    print("|---|---|---|---|")
    for shape, name, ms, e in rows:
        print(f"| {shape} | {name} | {ms:.4f} | {e:.1e} |")


if __name__ == "__main__":
    sys.exit(main())
