"""The general fused kernel's phase GEMMs (backends/triton/forward.py) with TMA box loads of the input (GPU, Hopper;
the CPU under TRITON_INTERPRET=1 for --check).

The library's K-loop forms every input row's address and mask at each step (gathers); Nsight Compute found its
integer pipe the busiest (41.6% of cycles against the tensor pipe's 32.5% on vae_k4s2p1_fp16, forty-first session).
Here a step is two TMA loads: the input tile as a box [1, 1, BLOCK_R, BLOCK_Q, BLOCK_CI] of the operand pass's
channels-last input (N, D, H, W, C) at the step's shifted row and column (the box's rows and columns outside the
input come back as zeros, so there is no mask), and the weight tile from its tap-major (taps * C_out, C_in) layout.
Everything else (work items, tap ranges, the stride-2 column interleave, the store) is the library kernel's.

Half precision (the operands as the library's pass leaves them for float16): the kernel alone, cold-L2 mean / minimum
and the mean of the same calls queued (no synchronisation: the GPU's pace), against the library's general kernel on the
same operands in the same tile configs; each output NaN-filled first and checked against float64 and against the
library's output in the first config. The descriptors are made once per config (TensorDescriptor on the host), as a
prepared call would keep them; Triton's launcher still encodes them on each launch. Results: benchmarks/RESULTS.md,
fifty-seventh session. --check runs every sweep layer but grouped_g4 on small shapes (about 7 minutes on a 2-core CPU).

    PYTHONPATH=src python3 benchmarks/diag_tma_phase.py [--iters 50] [--layers vae_k4s2p1,k3s1p1]
    TRITON_INTERPRET=1 PYTHONPATH=src python3 benchmarks/diag_tma_phase.py --check   # small shapes, on the CPU
"""

import argparse
import functools
import json
import pathlib
import sys

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from convt3d.backends.triton import NATIVE, forward
from convt3d.backends.triton.forward import _column_taps, count_on
from convt3d.backends.triton.turned import program_block
from convt3d.bench.protocol import relative_error, time_cuda
from convt3d.bench.report import markdown_table
from convt3d.plan import make_plan

SWEEP = pathlib.Path(__file__).with_name("sweep.json")


@triton.jit
def tma_phase_kernel(
    x_desc, w_desc, b_ptr, y_ptr,
    CIN, COUT, D, H, W, OD, OH, OW, KD, KH, KW,
    syn, syc, syd, syh, syw,
    U_H_BLOCKS, U_W_BLOCKS, CO_BLOCKS,
    S_D: tl.constexpr, S_H: tl.constexpr, S_W: tl.constexpr,
    P_D: tl.constexpr, P_H: tl.constexpr, P_W: tl.constexpr,
    DIL_D: tl.constexpr, DIL_H: tl.constexpr, DIL_W: tl.constexpr,
    STEP_D: tl.constexpr, STEP_H: tl.constexpr, STEP_W: tl.constexpr,
    HAS_BIAS: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_CO: tl.constexpr,
    BLOCK_CI: tl.constexpr, CI_BLOCKS: tl.constexpr,
):
    BLOCK_M: tl.constexpr = BLOCK_R * BLOCK_Q
    (n, v_h, co0, co, co_ok, y_base, bias, q_d, m0_d, t0_d, jd_lo, jd_hi, u_h0, base_h, m0_h, t0_h, jh_lo, jh_hi,
     u_w0) = program_block(y_ptr, b_ptr, COUT, D, H, OD, OH, KD, KH, syn, syd, U_H_BLOCKS, U_W_BLOCKS, CO_BLOCKS, S_D,
                           S_H, P_D, P_H, DIL_D, DIL_H, STEP_D, STEP_H, HAS_BIAS, BLOCK_R, BLOCK_Q, BLOCK_CO)
    M_STEP_D: tl.constexpr = STEP_D * DIL_D // S_D
    M_STEP_H: tl.constexpr = STEP_H * DIL_H // S_H
    m = tl.arange(0, BLOCK_M)
    u_h = u_h0 + m // BLOCK_Q
    u_w = u_w0 + m % BLOCK_Q
    oh = S_H * u_h + v_h
    M_STEP_W: tl.constexpr = STEP_W * DIL_W // S_W
    for v_w in tl.static_range(S_W):
        base_w, m0_w, t0_w, jw_lo, jw_hi = _column_taps(v_w, u_w0, OW, W, KW, S_W, P_W, DIL_W, STEP_W, BLOCK_Q)
        acc = tl.zeros([BLOCK_M, BLOCK_CO], dtype=tl.float32)
        ci0 = jd_lo * 0
        jd = jd_lo
        jh = jh_lo
        jw = jw_lo
        for k in range((jd_hi - jd_lo) * (jh_hi - jh_lo) * (jw_hi - jw_lo) * CI_BLOCKS):
            t_d = t0_d + jd * STEP_D
            t_h = t0_h + jh * STEP_H
            t_w = t0_w + jw * STEP_W
            i_d = q_d - m0_d - jd * M_STEP_D
            # The box's rows and columns: the block's first, shifted by the tap; those outside the input load zeros.
            a = x_desc.load([n, i_d, u_h0 + base_h - m0_h - jh * M_STEP_H, u_w0 + base_w - m0_w - jw * M_STEP_W,
                             ci0]).reshape(BLOCK_M, BLOCK_CI)
            b = w_desc.load([((t_d * KH + t_h) * KW + t_w) * COUT + co0, ci0])
            acc = tl.dot(a, tl.trans(b), acc)
            ci0, carry = count_on(ci0, 0, CI_BLOCKS * BLOCK_CI, True, BLOCK_CI)
            jw, carry = count_on(jw, jw_lo, jw_hi, carry)
            jh, carry = count_on(jh, jh_lo, jh_hi, carry)
            jd = tl.where(carry, jd + 1, jd)
        out = acc + bias[None, :]
        if S_W != 2:
            ow = S_W * u_w + v_w
            ok = (oh < OH) & (ow < OW)
            ptrs = y_base + co[:, None] * syc + (oh * syh + ow * syw)[None, :]
            tl.store(ptrs, tl.trans(out).to(y_ptr.dtype.element_ty), mask=co_ok[:, None] & ok[None, :])
        elif v_w == 0:
            even = out
        else:
            tile = tl.reshape(tl.permute(tl.join(even, out), (1, 0, 2)), (BLOCK_CO, 2 * BLOCK_M))
            j = tl.arange(0, 2 * BLOCK_M)
            oh2 = S_H * (u_h0 + j // (2 * BLOCK_Q)) + v_h
            ow2 = 2 * u_w0 + j % (2 * BLOCK_Q)
            ok2 = (oh2 < OH) & (ow2 < OW)
            tl.store(y_base + co[:, None] * syc + (oh2 * syh + ow2 * syw)[None, :],
                     tile.to(y_ptr.dtype.element_ty), mask=co_ok[:, None] & ok2[None, :])


def tma_launch(cfg, plan, x_op, w_op, bias, out):
    """A launch on the library's operands, x_op (N, D, H, W, C_in) and w_op (taps, 1, C_out, C_in), contiguous, into
    out, bound: the descriptors made once, as a prepared call would keep them."""
    grid, sizes, blocks, constexprs = forward._geometry(plan, cfg["BLOCK_M"], cfg["BLOCK_CO"], cfg["BLOCK_CI"], 0,
                                                        out.device.index or 0)
    c = dict(constexprs)
    box_x = [1, 1, c["BLOCK_R"], c["BLOCK_Q"], c["BLOCK_CI"]]
    x_desc = TensorDescriptor(x_op, list(x_op.shape), list(x_op.stride()), box_x)
    w2 = w_op.view(-1, w_op.shape[-1])
    w_desc = TensorDescriptor(w2, list(w2.shape), list(w2.stride()), [c["BLOCK_CO"], c["BLOCK_CI"]])
    u_h_blocks, u_w_blocks, co_blocks, groups, items = blocks
    args = (x_desc, w_desc, bias if bias is not None else w_op, out, *sizes, *out.stride(), u_h_blocks, u_w_blocks,
            co_blocks)
    options = dict(S_D=c["S_D"], S_H=c["S_H"], S_W=c["S_W"], P_D=c["P_D"], P_H=c["P_H"], P_W=c["P_W"],
                   DIL_D=c["DIL_D"], DIL_H=c["DIL_H"], DIL_W=c["DIL_W"], STEP_D=c["STEP_D"], STEP_H=c["STEP_H"],
                   STEP_W=c["STEP_W"], HAS_BIAS=bias is not None, BLOCK_R=c["BLOCK_R"], BLOCK_Q=c["BLOCK_Q"],
                   BLOCK_CO=c["BLOCK_CO"], BLOCK_CI=c["BLOCK_CI"], CI_BLOCKS=c["CI_BLOCKS"],
                   num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    return lambda: tma_phase_kernel[(items,)](*args, **options)


def layer_tensors(layer, dtype, device):
    """(plan, x, w, b, float64 reference) of a sweep layer, fresh torch.rand input."""
    shape = layer["input_shape"]
    args = dict(stride=layer["stride"], padding=layer.get("padding", 0), output_padding=layer.get("output_padding", 0),
                dilation=layer.get("dilation", 1))
    module = torch.nn.ConvTranspose3d(layer["in_channels"], layer["out_channels"], layer["kernel_size"],
                                      bias=layer["bias"], **args)
    x = torch.rand(shape, device=device).to(dtype)
    w = module.weight.detach().to(device, dtype)
    b = module.bias.detach().to(device, dtype) if layer["bias"] else None
    plan = make_plan(tuple(x.shape), tuple(w.shape), **args)
    reference = F.conv_transpose3d(x.double(), w.double(), None if b is None else b.double(), **args)
    return plan, x, w, b, reference


CONFIGS = [  # BLOCK_M, BLOCK_CO, BLOCK_CI, warps, stages: the library's general-kernel configs fastest on FP16 operands
    # (forty-first and forty-ninth sessions), and 128 x 64 x 64 in four stages
    (128, 64, 64, 4, 3),
    (128, 64, 64, 4, 4),
    (256, 64, 64, 8, 3),
    (128, 64, 64, 4, 2),
]


def check():
    """Interpreter check on small shapes: every sweep layer's arithmetic (batch 1, spatial sizes cut), the TMA kernel
    against float64."""
    layers = json.loads(SWEEP.read_text())
    failures = 0
    for layer in layers:
        if layer.get("groups", 1) != 1:
            continue
        layer = dict(layer, input_shape=[1, layer["in_channels"], 3, 5, 6])
        plan, x, w, b, reference = layer_tensors(layer, torch.float16, "cpu")
        x_op, w_op, _ = forward._operands(x, w, 1, NATIVE)
        out = torch.full(plan.output_shape, float("nan"), dtype=x.dtype)
        tma_launch(dict(BLOCK_M=32, BLOCK_CO=16, BLOCK_CI=16, num_warps=4, num_stages=1), plan, x_op, w_op, b, out)()
        error = relative_error(out, reference)
        # The float16 output's rounding alone leaves about 2e-4; a wrong tap or shift leaves errors of order 1.
        ok = error < 2e-3 and not out.isnan().any()
        failures += not ok
        print(f"{layer['name']}: rel. err. {error:.1e} {'ok' if ok else 'FAILED'}", flush=True)
    return failures


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--layers", default="vae_k4s2p1,k3s1p1,video_spatial_k144")
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    if args.check:
        return 1 if check() else 0
    layers = {layer["name"]: layer for layer in json.loads(SWEEP.read_text())}
    rows = []
    for name in args.layers.split(","):
        torch.manual_seed(0)
        plan, x, w, b, reference = layer_tensors(layers[name], torch.float16, "cuda")
        x_op, w_op, w_lo = forward._operands(x, w, 1, NATIVE)
        library_out = None  # the first config's library output, which the others are compared with
        for m, co, ci, wp, st in CONFIGS:
            cfg = dict(BLOCK_M=m, BLOCK_CO=co, BLOCK_CI=ci, num_warps=wp, num_stages=st, PER_SM=0)
            label = f"{m}x{co}x{ci} w{wp} s{st}"
            lib = forward._main_launch(cfg, plan, NATIVE, b is not None, reference.stride(), 0)
            for form in ("library", "TMA"):
                out = torch.full(plan.output_shape, float("nan"), dtype=x.dtype, device="cuda")
                try:
                    if form == "library":
                        fn = functools.partial(lib, (x_op, w_op, w_lo, b if b is not None else w_op, out))
                    else:
                        fn = tma_launch(cfg, plan, x_op, w_op, b, out)
                    fn()
                    torch.cuda.synchronize()
                    if library_out is None:
                        library_out = out.clone()
                    difference = (out.float() - library_out.float()).abs().max().item()
                    note = (f"{relative_error(out, reference):.1e}, vs library {difference:.1e}, "
                            f"nan {out.isnan().any().item()}")
                    t = time_cuda(fn, iters=args.iters)
                    queued = time_cuda(fn, iters=args.iters, synchronize=False)
                    row = (name, form, label, t.mean_ms, t.min_ms, queued.mean_ms, note)
                except Exception as error:  # noqa: BLE001 (a config that does not compile or fit: its row says why)
                    row = (name, form, label, float("nan"), float("nan"), float("nan"), repr(error)[:120])
                print(row, flush=True)
                rows.append(row)
    print(markdown_table(["layer (float16)", "form", "config", "mean ms", "min ms", "queued mean ms",
                          "rel. err. vs float64, max diff vs library, NaN left"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
