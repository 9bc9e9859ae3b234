"""Prototypes: TF32 mode's stride-1 layer (k3s1p1) in one kernel that reads the float32 input as given, with no
operand pass over the input (GPU; the CPU under TRITON_INTERPRET=1 for --check).

The library's TF32 mode runs two kernels on such layers: a pass that lays the input out channels-last as FP16 scaled
by one power of two per tensor (a grid-wide barrier finds the scale), then the GEMM. On the H100 the pass took 10-11.5
us of k3s1p1's and video_k3s2p1op1's 34-37 (benchmarks/RESULTS.md, eighty-eighth session). Here each program finds
its own scale instead: it reads the input planes and rows its outputs reach, all channels, and takes their largest
magnitude. Every value within 2^28 of it is then exactly its TF32 rounding, as in the library's per-tensor form.
Two forms:
- "registers" (passless_kernel) loads its operand tiles from the input itself (NCDHW, positions contiguous) at each
  tap, TF32-rounds and scales them into FP16 in registers, and multiplies them with the weight on tensor cores;
- "staged" (staged_kernel) converts that input region once into a scratch slot of its own, channels-last FP16 with
  zeros outside the input, and runs the GEMM on the slot.
Both accumulate in float32 and scale the sums back in the epilogue, adding the bias. The weight (tap-major, FP16, one
scale per tensor) is made once beforehand here; a real form would need a small pass for it (the "weight prepared by
PyTorch ops" row times one way).

The GEMM is C[co, m] = sum over taps t and input channels ci of W[t, co, ci] X[ci, m shifted by t], m the output
positions of BLOCK_H whole rows of one output plane, so that stores run along the output's rows. Stride 1 only,
groups 1, dilation 1: enough to see whether one kernel reading the input as given can beat the two.

On the H100 (benchmarks/RESULTS.md, eighty-eighth session) neither did, on k3s1p1, queued means: "registers" 0.093 ms
and "staged" 0.056 (its staging alone 0.034, three times the library's pass) against 0.035-0.036 for the library's
whole call. Not kept.

Rows: bench.protocol.time_cuda's cold-L2 mean / minimum and the queued mean in ms; eager; the library
(backend="triton"); the prototype per config (KernelBench's check against eager on 5 fresh inputs, float64 error, the
output NaN-filled first), and for "staged" its staging and its GEMM alone (staged_kernel's PART).

    PYTHONPATH=src python3 benchmarks/diag_passless.py [--layers k3s1p1] [--iters 100]
    TRITON_INTERPRET=1 PYTHONPATH=src python3 benchmarks/diag_passless.py --check   # small shapes, on the CPU
"""

import argparse
import copy

import torch
import triton
import triton.language as tl

from convt3d import convert
from convt3d.backends.triton.forward import _fp16_scale_exponent, _power_of_2, _round_to_tf32
from convt3d.bench.protocol import kernelbench_check, relative_error, time_cuda
from convt3d.bench.report import markdown_table
from convt3d.bench.workloads import Layer, sweep_layers


@triton.jit
def _program_tile(OD, H_BLOCKS, BLOCK_H: tl.constexpr, BLOCK_CO: tl.constexpr):
    """(sample, output plane, first output row, output channels) of this program's tile."""
    pid = tl.program_id(0)
    return (pid // (OD * H_BLOCKS), pid // H_BLOCKS % OD, pid % H_BLOCKS * BLOCK_H,
            tl.program_id(1) * BLOCK_CO + tl.arange(0, BLOCK_CO))


@triton.jit
def _input_row(x_n, c0, ci, i_d, i_h, i_w, CIN, D, H, W):
    """Input channels c0 + ci of sample x_n at plane i_d, row i_h, columns i_w: (channels, columns), zeros outside
    the input. (The plane's and row's tests as a bound on the columns: a scalar and a tensor mask do not combine in
    the interpreter.)"""
    cols_in = W * ((i_d >= 0) & (i_d < D) & (i_h >= 0) & (i_h < H))
    ok = ((c0 + ci)[:, None] < CIN) & ((i_w >= 0) & (i_w < cols_in))[None, :]
    return tl.load(x_n + (c0 + ci)[:, None] * (D * H * W) + i_d * (H * W) + i_h * W + i_w[None, :], mask=ok,
                   other=0.0)


@triton.jit
def _region_largest(x_n, od, h0, ci, i_w, CIN, D, H, W, KD: tl.constexpr, KH: tl.constexpr, PD: tl.constexpr,
                    PH: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_CI: tl.constexpr, COLUMNS: tl.constexpr):
    """The largest magnitude among the input planes and rows that a program's outputs (plane od, rows h0 to h0 +
    BLOCK_H - 1) reach (input index = output index + padding - tap), every channel, columns i_w (which cover the
    rows whole; COLUMNS of them)."""
    largest = tl.zeros((BLOCK_CI, COLUMNS), tl.float32)
    for p in range(KD):
        i_d = od + PD - (KD - 1) + p
        for q in range(BLOCK_H + KH - 1):
            i_h = h0 + PH - (KH - 1) + q
            for c0 in range(0, CIN, BLOCK_CI):
                largest = tl.maximum(largest, tl.abs(_input_row(x_n, c0, ci, i_d, i_h, i_w, CIN, D, H, W)))
    return tl.max(tl.max(largest, axis=1), axis=0)


@triton.jit
def _store_output(acc, e_x, w_exp_ptr, b_ptr, out_ptr, n, co, od, oh, ow, COUT, OD, OH, OW, HAS_BIAS: tl.constexpr):
    """The sums scaled back by 2**-(e_x + the weight's exponent), the bias added, stored at (n, co, od, oh, ow)."""
    e = e_x + tl.load(w_exp_ptr)
    half = e >> 1
    out = acc * _power_of_2(-half) * _power_of_2(half - e)  # (each factor in float32's normal range)
    if HAS_BIAS:
        out += tl.load(b_ptr + co, mask=co < COUT, other=0.0)[:, None]
    offs = (n.to(tl.int64) * COUT + co)[:, None] * (OD * OH * OW) + od * (OH * OW) + (oh * OW + ow)[None, :]
    tl.store(out_ptr + offs, out, mask=(co < COUT)[:, None] & ((oh < OH) & (ow < OW))[None, :])


@triton.jit
def passless_kernel(
    x_ptr, w_ptr, w_exp_ptr, b_ptr, out_ptr,
    CIN, COUT, D, H, W, OD, OH, OW, H_BLOCKS,
    KD: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr, PD: tl.constexpr, PH: tl.constexpr, PW: tl.constexpr,
    BLOCK_CO: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_CI: tl.constexpr,
    HALO_W: tl.constexpr, HAS_BIAS: tl.constexpr,
):
    BLOCK_M: tl.constexpr = BLOCK_H * BLOCK_W
    n, od, h0, co = _program_tile(OD, H_BLOCKS, BLOCK_H, BLOCK_CO)
    ci = tl.arange(0, BLOCK_CI)
    x_n = x_ptr + n.to(tl.int64) * CIN * D * H * W

    # The program's scale, from the rows whole (OW = W here).
    e_x = _fp16_scale_exponent(_region_largest(x_n, od, h0, ci, tl.arange(0, HALO_W), CIN, D, H, W, KD, KH, PD, PH,
                                               BLOCK_H, BLOCK_CI, HALO_W))
    scale_x = _power_of_2(e_x)

    m = tl.arange(0, BLOCK_M)
    oh = h0 + m // BLOCK_W
    ow = m % BLOCK_W
    acc = tl.zeros((BLOCK_CO, BLOCK_M), tl.float32)
    ci_steps = tl.cdiv(CIN, BLOCK_CI)
    for k in range(KD * KH * KW * ci_steps):
        tap = k // ci_steps
        c0 = k % ci_steps * BLOCK_CI
        kd = tap // (KH * KW)
        kh = tap // KW % KH
        kw = tap % KW
        i_d = od + PD - kd
        i_h = oh + PH - kh
        i_w = ow + PW - kw
        # (the plane's test as a bound on the rows: a scalar and a tensor mask do not combine in the interpreter)
        rows_in = H * ((i_d >= 0) & (i_d < D))
        ok = ((c0 + ci)[:, None] < CIN) & ((i_h >= 0) & (i_h < rows_in) & (i_w >= 0) & (i_w < W) & (ow < OW)
                                           & (oh < OH))[None, :]
        x = tl.load(x_n + (c0 + ci)[:, None] * (D * H * W) + i_d * (H * W) + (i_h * W + i_w)[None, :], mask=ok,
                    other=0.0)
        b = (_round_to_tf32(x) * scale_x).to(tl.float16)
        a = tl.load(w_ptr + (tap * COUT + co)[:, None] * CIN + (c0 + ci)[None, :],
                    mask=(co[:, None] < COUT) & ((c0 + ci)[None, :] < CIN), other=0.0)
        acc = tl.dot(a, b, acc)
    _store_output(acc, e_x, w_exp_ptr, b_ptr, out_ptr, n, co, od, oh, ow, COUT, OD, OH, OW, HAS_BIAS)


@triton.jit
def staged_kernel(
    x_ptr, w_ptr, w_exp_ptr, b_ptr, out_ptr, scratch_ptr,
    CIN, COUT, D, H, W, OD, OH, OW, H_BLOCKS, HALO_COLS,
    KD: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr, PD: tl.constexpr, PH: tl.constexpr, PW: tl.constexpr,
    BLOCK_CO: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_CI: tl.constexpr,
    HALO_P2: tl.constexpr, HAS_BIAS: tl.constexpr, PART: tl.constexpr = 0,
):
    """passless_kernel's program, its input region converted once: the KD planes by BLOCK_H + KH - 1 rows by
    HALO_COLS (W + KW - 1) columns its outputs reach, zeros outside the input, stored channels-last as FP16 in a
    scratch slot of its own (L2-resident), then the GEMM reads its tiles from there (rows of C_in contiguous FP16, no
    masks for the input's edges). PART (timing only; the output is then wrong): 1 the staging alone, 2 the GEMM
    alone on what the slot holds, scaled by 1."""
    QR: tl.constexpr = BLOCK_H + KH - 1
    BLOCK_M: tl.constexpr = BLOCK_H * BLOCK_W
    n, od, h0, co = _program_tile(OD, H_BLOCKS, BLOCK_H, BLOCK_CO)
    ci = tl.arange(0, BLOCK_CI)
    x_n = x_ptr + n.to(tl.int64) * CIN * D * H * W
    slot = scratch_ptr + (tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)).to(tl.int64) * (KD * QR * HALO_COLS * CIN)
    j = tl.arange(0, HALO_P2)
    i_w = j + PW - (KW - 1)

    if PART == 2:
        e_x = tl.full((), 0, tl.int32)
    else:
        e_x = _fp16_scale_exponent(_region_largest(x_n, od, h0, ci, i_w, CIN, D, H, W, KD, KH, PD, PH, BLOCK_H,
                                                   BLOCK_CI, HALO_P2))
    scale_x = _power_of_2(e_x)
    for p in range(KD if PART < 2 else 0):
        i_d = od + PD - (KD - 1) + p
        for q in range(QR):
            i_h = h0 + PH - (KH - 1) + q
            for c0 in range(0, CIN, BLOCK_CI):
                v = _input_row(x_n, c0, ci, i_d, i_h, i_w, CIN, D, H, W)
                tl.store(slot + ((p * QR + q) * HALO_COLS + j)[None, :] * CIN + (c0 + ci)[:, None],
                         (_round_to_tf32(v) * scale_x).to(tl.float16),
                         mask=((c0 + ci)[:, None] < CIN) & (j < HALO_COLS)[None, :])
    tl.debug_barrier()  # (the slot's stores seen by every thread of the program before the GEMM reads them)

    m = tl.arange(0, BLOCK_M)
    r = m // BLOCK_W
    oh = h0 + r
    ow = m % BLOCK_W
    acc = tl.zeros((BLOCK_CO, BLOCK_M), tl.float32)
    ci_steps = tl.cdiv(CIN, BLOCK_CI)
    for k in range(KD * KH * KW * ci_steps if PART != 1 else 0):
        tap = k // ci_steps
        c0 = k % ci_steps * BLOCK_CI
        kd = tap // (KH * KW)
        kh = tap // KW % KH
        kw = tap % KW
        position = ((KD - 1 - kd) * QR + r + KH - 1 - kh) * HALO_COLS + ow + KW - 1 - kw
        b = tl.load(slot + position[None, :] * CIN + (c0 + ci)[:, None],
                    mask=((c0 + ci)[:, None] < CIN) & (ow < OW)[None, :], other=0.0)
        a = tl.load(w_ptr + (tap * COUT + co)[:, None] * CIN + (c0 + ci)[None, :],
                    mask=(co[:, None] < COUT) & ((c0 + ci)[None, :] < CIN), other=0.0)
        acc = tl.dot(a, b, acc)
    _store_output(acc, e_x, w_exp_ptr, b_ptr, out_ptr, n, co, od, oh, ow, COUT, OD, OH, OW, HAS_BIAS)


def fp16_weight(weight: torch.Tensor):
    """(w as FP16, tap-major (taps, C_out, C_in), TF32-rounded and scaled by 2**e; e as an int32 tensor): the
    library's per-tensor rule (tensor_scaled.py), by PyTorch ops."""
    c_in, c_out = weight.shape[:2]
    bits = weight.view(torch.int32)
    rounded = ((bits + 0x1000) & -8192).view(torch.float32)
    field = (rounded.abs().max().view(torch.int32) >> 23) & 0xFF
    e = torch.clamp(141 - field, max=126).to(torch.int32)
    scaled = rounded * torch.pow(2.0, e.float())
    return scaled.permute(2, 3, 4, 1, 0).reshape(-1, c_out, c_in).contiguous().half(), e.reshape(1)


_scratch = {}


def launch(config, x, w16, w_exp, bias, out, layer: Layer, part: int = 0):
    """config: (form, BLOCK_CO, BLOCK_H, BLOCK_CI, warps, stages), form "registers" (passless_kernel) or "staged"
    (staged_kernel, its scratch kept per size; part its PART)."""
    form, block_co, block_h, block_ci, warps, stages = config
    n, c_in, d, h, w = x.shape
    c_out, od, oh, ow = out.shape[1:]
    kd, kh, kw = layer.plan().kernel_size
    pd, ph, pw = layer.plan().padding
    h_blocks = triton.cdiv(oh, block_h)
    grid = (n * od * h_blocks, triton.cdiv(c_out, block_co))
    bias_or_any = bias if bias is not None else out
    common = dict(KD=kd, KH=kh, KW=kw, PD=pd, PH=ph, PW=pw, BLOCK_CO=block_co, BLOCK_H=block_h,
                  BLOCK_W=triton.next_power_of_2(ow), BLOCK_CI=block_ci, HAS_BIAS=bias is not None, num_warps=warps,
                  num_stages=stages)
    if form == "registers":
        passless_kernel[grid](x, w16, w_exp, bias_or_any, out, c_in, c_out, d, h, w, od, oh, ow, h_blocks,
                              HALO_W=triton.next_power_of_2(w), **common)
        return out
    halo_cols = w + kw - 1
    size = grid[0] * grid[1] * kd * (block_h + kh - 1) * halo_cols * c_in
    scratch = _scratch.get((size, x.device))
    if scratch is None:
        scratch = _scratch[size, x.device] = torch.empty(size, dtype=torch.float16, device=x.device)
    staged_kernel[grid](x, w16, w_exp, bias_or_any, out, scratch, c_in, c_out, d, h, w, od, oh, ow, h_blocks,
                        halo_cols, HALO_P2=triton.next_power_of_2(halo_cols), PART=part, **common)
    return out


def supported(layer: Layer) -> bool:
    plan = layer.plan()
    return (plan.stride == (1, 1, 1) and plan.dilation == (1, 1, 1) and plan.groups == 1
            and plan.output_spatial[2] == plan.input_spatial[2] and layer.dtype == "float32")


def tf32_rounded(t: torch.Tensor) -> torch.Tensor:
    """t rounded to TF32 as the kernels round it (to nearest, ties away from zero)."""
    return ((t.contiguous().view(torch.int32) + 0x1000) & -8192).view(torch.float32)


def check(config, layer: Layer, device) -> tuple[bool, float, float]:
    """KernelBench's check against eager (TF32 allowed) on 5 fresh inputs, the worst float64 error, and the worst
    error against float64 on TF32-rounded operands (what the FP16 products compute exactly: float32 sums only)."""
    torch.manual_seed(0)
    eager = layer.module().to(device)
    w16, w_exp = fp16_weight(eager.weight.detach())
    bias = eager.bias.detach() if eager.bias is not None else None
    passed, worst, worst_rounded = True, 0.0, 0.0
    for _ in range(5):
        x = torch.rand(layer.input_shape, device=device)
        out = torch.full(layer.plan().output_shape, float("nan"), device=device)
        launch(config, x, w16, w_exp, bias, out, layer)
        with torch.no_grad():
            expected = eager(x)
        reference = torch.nn.functional.conv_transpose3d(
            x.double(), eager.weight.double(), bias.double() if bias is not None else None, padding=layer.padding)
        rounded = torch.nn.functional.conv_transpose3d(
            tf32_rounded(x).double(), tf32_rounded(eager.weight.detach()).double(),
            bias.double() if bias is not None else None, padding=layer.padding)
        passed &= kernelbench_check(out, expected) and not out.isnan().any().item()
        worst = max(worst, relative_error(out, reference))
        worst_rounded = max(worst_rounded, relative_error(out, rounded))
    return passed, worst, worst_rounded


CONFIGS = [  # (form, BLOCK_CO, BLOCK_H, BLOCK_CI, warps, stages)
    ("registers", 64, 4, 64, 4, 2),
    ("staged", 64, 4, 64, 4, 2), ("staged", 64, 4, 64, 4, 3), ("staged", 64, 8, 64, 8, 3), ("staged", 64, 2, 64, 4, 3),
]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", default="k3s1p1")
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--check", action="store_true", help="small shapes on the CPU (TRITON_INTERPRET=1)")
    args = parser.parse_args()
    if args.check:
        cases = [Layer(name="small", in_channels=16, out_channels=32, kernel_size=3, stride=1, padding=1,
                       dilation=1, bias=True, input_shape=[2, 16, 3, 6, 8]),
                 Layer(name="k2p0", in_channels=24, out_channels=16, kernel_size=(2, 3, 1), stride=1,
                       padding=(0, 1, 0), dilation=1, bias=False, input_shape=[1, 24, 4, 5, 4])]
        for layer in cases:
            assert supported(layer), layer
            for config in [("registers", 32, 2, 16, 4, 2), ("registers", 16, 4, 16, 4, 2), ("staged", 32, 2, 16, 4, 2),
                           ("staged", 16, 4, 16, 4, 2)]:
                _, err, err_rounded = check(config, layer, "cpu")
                print(layer.name, config, f"float64 error {err:.1e}, on TF32-rounded operands {err_rounded:.1e}")
                # (float32 sums of exact products: a few float32 ulps; the TF32 rounding itself: about 3e-4)
                assert err_rounded < 1e-6 and err < 1e-3, (err_rounded, err)
        return
    torch.backends.cudnn.allow_tf32 = True
    rows = []
    for layer in sweep_layers(args.layers):
        if not supported(layer):
            print(f"{layer.name}: not stride 1 with whole input rows; skipped")
            continue
        torch.manual_seed(0)
        eager = layer.module().cuda()
        library = convert(copy.deepcopy(eager), backend="triton")
        x = torch.rand(layer.input_shape, device="cuda")
        with torch.no_grad():
            for label, fn in (("eager", eager), ('backend="triton"', library)):
                passed = kernelbench_check(fn(x), eager(x))
                cold, queued = time_cuda(lambda: fn(x), iters=args.iters), time_cuda(
                    lambda: fn(x), iters=args.iters, synchronize=False)
                rows.append((layer.name, label, cold.mean_ms, cold.min_ms, queued.mean_ms, passed, "-"))
                print(rows[-1], flush=True)
            weight = eager.weight.detach()
            prep = time_cuda(lambda: fp16_weight(weight), iters=args.iters)
            rows.append((layer.name, "weight prepared by PyTorch ops", prep.mean_ms, prep.min_ms, "-", "-", "-"))
            w16, w_exp = fp16_weight(weight)
            bias = eager.bias.detach() if eager.bias is not None else None
            out = torch.empty(layer.plan().output_shape, device="cuda")
            for config in CONFIGS:
                try:
                    passed, err, _ = check(config, layer, "cuda")
                    cold = time_cuda(lambda: launch(config, x, w16, w_exp, bias, out, layer), iters=args.iters)
                    queued = time_cuda(lambda: launch(config, x, w16, w_exp, bias, out, layer), iters=args.iters,
                                       synchronize=False)
                except Exception as error:  # noqa: BLE001 (a config that does not compile: say so, go on)
                    print(layer.name, config, "failed:", str(error).splitlines()[0][:200], flush=True)
                    continue
                rows.append((layer.name, f"prototype {config}", cold.mean_ms, cold.min_ms, queued.mean_ms, passed,
                             f"{err:.1e}"))
                print(rows[-1], flush=True)
                for part, what in ((1, "staging alone"), (2, "GEMM alone")) if config[0] == "staged" else ():
                    cold = time_cuda(lambda: launch(config, x, w16, w_exp, bias, out, layer, part), iters=args.iters)
                    queued = time_cuda(lambda: launch(config, x, w16, w_exp, bias, out, layer, part),
                                       iters=args.iters, synchronize=False)
                    rows.append((layer.name, f"  {what}", cold.mean_ms, cold.min_ms, queued.mean_ms, "-", "-"))
                    print(rows[-1], flush=True)
    print(markdown_table(["layer", "implementation", "cold mean", "cold min", "queued mean", "KB check",
                          "float64 error"], rows))


if __name__ == "__main__":
    main()
