"""The general kernel's phase GEMMs with the product turned around: output channels as the MMA's M and output
positions as its N (GPU, Hopper; the CPU under TRITON_INTERPRET=1 for --check).

The library's general kernel multiplies [positions, channels] input tiles by [channels, C_out] weight tiles: its
MMAs are m64 x n(C_out) x k16, and with C_out = 64 on most sweep layers each one reads a 64-column B tile from shared
memory for a small product; it runs at 330-360 TFLOP/s (benchmarks/RESULTS.md, fifty-seventh session). Here a step
multiplies the weight tile [BLOCK_CO, BLOCK_CI] by the input box transposed, [BLOCK_CI, BLOCK_R * BLOCK_Q]: the MMA's
N is the box's positions (up to 256), and the accumulator's fast axis lies along the output's rows, so the tile is
stored without a transpose (stride-2 columns interleave by a join alone). The tiles load three ways (TILES): as TMA
loads through host-side descriptors, the input as a box as in diag_tma_phase.py (the box's rows and columns outside
the input come back as zeros); the same through tensor maps the kernel makes; and as the library's masked pointer
loads. A fourth form launches the first through the driver with its tensor maps encoded once (driver_launch), as the
library's launches at addresses would; Triton's launcher encodes them on every launch. Everything else (work items
and tap ranges: the library's turned.program_block) is diag_tma_phase.py's, which is the library's.

Half precision (the operands as the library's pass leaves them for float16): the kernel alone, cold-L2 mean / minimum
and queued mean, against the library's general kernel on the same operands; each output NaN-filled first, checked
against float64 and against the library's output. Results: benchmarks/RESULTS.md, eighty-ninth session (not kept) and
ninetieth (the driver form, first run on a GPU).

    PYTHONPATH=src python3 benchmarks/diag_wide_n.py [--iters 50] [--layers k3s1p1,vae_k4s2p1]
    TRITON_INTERPRET=1 PYTHONPATH=src python3 benchmarks/diag_wide_n.py --check [--layers k3s1p1]   # on the CPU
    (small shapes; every sweep layer but grouped_g4 takes about 15 minutes on a 2-core CPU)
"""

import argparse
import ctypes
import functools
import json
import sys

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from convt3d.backends import driver
from convt3d.backends.triton import NATIVE, forward
from convt3d.backends.triton.forward import _column_taps, count_on
from convt3d.backends.triton.launch import _INTEGER_TYPES, _entry_parameter_bytes, _launches_plainly, _scratch_pointers
from convt3d.bench.protocol import relative_error, time_cuda
from convt3d.bench.report import markdown_table
from convt3d.backends.triton.turned import _TensorMap, program_block
from diag_tma_phase import SWEEP, layer_tensors

# How the turned kernel loads its tiles (its TILES), and their names in the tables. "by the driver" is the host TMA
# kernel launched with tensor maps encoded once (driver_launch), on a GPU only.
HOST_TMA, LOADS, DEVICE_TMA = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2)
FORMS = {0: "turned, host TMA", 1: "turned, loads", 2: "turned, device TMA"}
BY_DRIVER = "turned, host TMA by the driver"


@triton.jit
def wide_n_kernel(
    x_desc, w_desc, x_ptr, w_ptr, b_ptr, y_ptr,
    CIN, COUT, D, H, W, OD, OH, OW, KD, KH, KW, BATCH,
    syn, syc, syd, syh, syw,
    U_H_BLOCKS, U_W_BLOCKS, CO_BLOCKS,
    S_D: tl.constexpr, S_H: tl.constexpr, S_W: tl.constexpr,
    P_D: tl.constexpr, P_H: tl.constexpr, P_W: tl.constexpr,
    DIL_D: tl.constexpr, DIL_H: tl.constexpr, DIL_W: tl.constexpr,
    STEP_D: tl.constexpr, STEP_H: tl.constexpr, STEP_W: tl.constexpr,
    HAS_BIAS: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_CO: tl.constexpr,
    BLOCK_CI: tl.constexpr, CI_BLOCKS: tl.constexpr, TILES: tl.constexpr,
):
    # TILES: HOST_TMA loads through x_desc and w_desc (tensor maps the launcher makes from host-side descriptors),
    # LOADS masked pointer loads from the same operands (the library's way, which the software pipeliner turns into
    # asynchronous copies), DEVICE_TMA loads through tensor maps this kernel makes (no host-side descriptor).
    BLOCK_P: tl.constexpr = BLOCK_R * BLOCK_Q
    if TILES == DEVICE_TMA:
        x_desc = tl.make_tensor_descriptor(x_ptr, shape=[BATCH, D, H, W, CIN],
                                           strides=[D * H * W * CIN, H * W * CIN, W * CIN, CIN, 1],
                                           block_shape=[1, 1, BLOCK_R, BLOCK_Q, BLOCK_CI])
        w_desc = tl.make_tensor_descriptor(w_ptr, shape=[KD * KH * KW * COUT, CIN], strides=[CIN, 1],
                                           block_shape=[BLOCK_CO, BLOCK_CI])
    (n, v_h, co0, co, co_ok, y_base, bias, q_d, m0_d, t0_d, jd_lo, jd_hi, u_h0, base_h, m0_h, t0_h, jh_lo, jh_hi,
     u_w0) = program_block(y_ptr, b_ptr, COUT, D, H, OD, OH, KD, KH, syn, syd, U_H_BLOCKS, U_W_BLOCKS, CO_BLOCKS, S_D,
                           S_H, P_D, P_H, DIL_D, DIL_H, STEP_D, STEP_H, HAS_BIAS, BLOCK_R, BLOCK_Q, BLOCK_CO)
    M_STEP_D: tl.constexpr = STEP_D * DIL_D // S_D
    M_STEP_H: tl.constexpr = STEP_H * DIL_H // S_H
    p = tl.arange(0, BLOCK_P)
    u_h = u_h0 + p // BLOCK_Q
    u_w = u_w0 + p % BLOCK_Q
    oh = S_H * u_h + v_h
    M_STEP_W: tl.constexpr = STEP_W * DIL_W // S_W
    for v_w in tl.static_range(S_W):
        base_w, m0_w, t0_w, jw_lo, jw_hi = _column_taps(v_w, u_w0, OW, W, KW, S_W, P_W, DIL_W, STEP_W, BLOCK_Q)
        acc = tl.zeros([BLOCK_CO, BLOCK_P], dtype=tl.float32)
        ci0 = jd_lo * 0
        jd = jd_lo
        jh = jh_lo
        jw = jw_lo
        for k in range((jd_hi - jd_lo) * (jh_hi - jh_lo) * (jw_hi - jw_lo) * CI_BLOCKS):
            t_d = t0_d + jd * STEP_D
            t_h = t0_h + jh * STEP_H
            t_w = t0_w + jw * STEP_W
            i_d = q_d - m0_d - jd * M_STEP_D
            shift_h = base_h - m0_h - jh * M_STEP_H
            shift_w = base_w - m0_w - jw * M_STEP_W
            tap = (t_d * KH + t_h) * KW + t_w
            if TILES == LOADS:
                i_h = u_h + shift_h
                i_w = u_w + shift_w
                ok = (i_d + p * 0 >= 0) & (i_d + p * 0 < D) & (i_h >= 0) & (i_h < H) & (i_w >= 0) & (i_w < W)
                rows = tl.where(ok, ((n * D + i_d) * H + i_h) * W + i_w, 0).to(tl.int64) * CIN
                ci = ci0 + tl.arange(0, BLOCK_CI)
                a = tl.load(x_ptr + rows[:, None] + ci[None, :], mask=ok[:, None] & (ci < CIN)[None, :], other=0.0)
                b = tl.load(w_ptr + ((tap * COUT + co) * CIN)[:, None] + ci[None, :],
                            mask=co_ok[:, None] & (ci < CIN)[None, :], other=0.0)
            else:
                a = x_desc.load([n, i_d, u_h0 + shift_h, u_w0 + shift_w, ci0]).reshape(BLOCK_P, BLOCK_CI)
                b = w_desc.load([tap * COUT + co0, ci0])
            acc = tl.dot(b, tl.trans(a), acc)  # [C_out, C_in] x [C_in, positions]
            ci0, carry = count_on(ci0, 0, CI_BLOCKS * BLOCK_CI, True, BLOCK_CI)
            jw, carry = count_on(jw, jw_lo, jw_hi, carry)
            jh, carry = count_on(jh, jh_lo, jh_hi, carry)
            jd = tl.where(carry, jd + 1, jd)
        out = acc + bias[:, None]
        if S_W != 2:
            ow = S_W * u_w + v_w
            ok = (oh < OH) & (ow < OW)
            tl.store(y_base + co[:, None] * syc + (oh * syh + ow * syw)[None, :], out.to(y_ptr.dtype.element_ty),
                     mask=co_ok[:, None] & ok[None, :])
        elif v_w == 0:
            even = out
        else:
            # [C_out, positions, column phase]: position p's two columns side by side, as they lie in the row.
            tile = tl.reshape(tl.join(even, out), (BLOCK_CO, 2 * BLOCK_P))
            j = tl.arange(0, 2 * BLOCK_P)
            oh2 = S_H * (u_h0 + j // (2 * BLOCK_Q)) + v_h
            ow2 = 2 * u_w0 + j % (2 * BLOCK_Q)
            ok2 = (oh2 < OH) & (ow2 < OW)
            tl.store(y_base + co[:, None] * syc + (oh2 * syh + ow2 * syw)[None, :],
                     tile.to(y_ptr.dtype.element_ty), mask=co_ok[:, None] & ok2[None, :])


def wide_n_arguments(cfg, plan, x_op, w_op, bias, out, tiles):
    """(grid, the kernel's runtime arguments in its order, its constexprs and launch options) of a launch on the
    library's operands, x_op (N, D, H, W, C_in) and w_op (taps, 1, C_out, C_in), contiguous, into out."""
    grid, sizes, blocks, constexprs = forward._geometry(plan, cfg["BLOCK_M"], cfg["BLOCK_CO"], cfg["BLOCK_CI"], 0,
                                                        out.device.index or 0)
    c = dict(constexprs)
    x_desc = TensorDescriptor(x_op, list(x_op.shape), list(x_op.stride()),
                              [1, 1, c["BLOCK_R"], c["BLOCK_Q"], c["BLOCK_CI"]])
    w2 = w_op.view(-1, w_op.shape[-1])
    w_desc = TensorDescriptor(w2, list(w2.shape), list(w2.stride()), [c["BLOCK_CO"], c["BLOCK_CI"]])
    u_h_blocks, u_w_blocks, co_blocks, groups, items = blocks
    if tiles == DEVICE_TMA.value:
        x_desc = w_desc = None
        # The kernel's tensor maps live in a scratch buffer Triton asks for at each launch.
        triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, device=out.device))
    args = (x_desc, w_desc, x_op, w_op, bias if bias is not None else w_op, out, *sizes, plan.batch, *out.stride(),
            u_h_blocks, u_w_blocks, co_blocks)
    names = ("S_D", "S_H", "S_W", "P_D", "P_H", "P_W", "DIL_D", "DIL_H", "DIL_W", "STEP_D", "STEP_H", "STEP_W",
             "BLOCK_R", "BLOCK_Q", "BLOCK_CO", "BLOCK_CI", "CI_BLOCKS")
    options = {name: c[name] for name in names}
    options.update(HAS_BIAS=bias is not None, TILES=tiles, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    return (items,), args, options


def wide_n_launch(cfg, plan, x_op, w_op, bias, out, tiles=HOST_TMA.value):
    """A launch (wide_n_arguments') as a function of no arguments, bound: the host-side descriptors made once. It
    returns Triton's compiled kernel."""
    grid, args, options = wide_n_arguments(cfg, plan, x_op, w_op, bias, out, tiles)
    return lambda: wide_n_kernel[grid](*args, **options)


def driver_launch(cfg, plan, x_op, w_op, bias, out):
    """The host TMA form's launch through the driver (convt3d's driver.Launch) with its tensor maps encoded once,
    as the library's launches at addresses would keep them: Triton's launcher (the other TMA form) encodes them on
    every launch. The kernel is compiled by a first launch through Triton; its parameters are packed as Triton's
    launcher passes a host-side descriptor with descriptor metadata (Triton 3.9's: the tensor map, then the
    descriptor's shape as i32 and strides as i64), then the scratch pointers, and checked against the PTX's parameter
    list (with Triton 3.9 on the CPU they matched a kernel compiled for sm_90; another layout is reported, not
    launched). Returns a function of no arguments, or a string saying why there is none."""
    grid, args, options = wide_n_arguments(cfg, plan, x_op, w_op, bias, out, HOST_TMA.value)
    compiled = wide_n_kernel[grid](*args, **options)
    metadata = compiled.metadata
    descriptor_metadata = getattr(metadata, "tensordesc_meta", None)
    if not descriptor_metadata or not _launches_plainly(metadata):
        return "no descriptor metadata, or scratch memory or clusters asked for"
    values, keep = [], []
    descriptors = iter(descriptor_metadata)
    # (The signature lists every parameter in order, constexprs (and integers equal to 1) as "constexpr"; the
    # runtime arguments come first.)
    for (name, kind), value in zip(compiled.src.signature.items(), args):
        if kind == "constexpr":
            continue
        if kind.startswith("tensordesc"):
            meta = next(descriptors)
            if meta.get("elem_size") != 2 or meta.get("fp4_padded") or meta.get("is_im2col"):
                return f"{name}: not a plain float16 descriptor"
            tensor_map = _TensorMap(list(value.base.shape), list(value.base.stride()), meta["block_size"],
                                    meta["swizzle"], value.base.dtype)
            tensor_map.encode(value.base.data_ptr())
            keep.append(tensor_map)
            values += [tensor_map.value, *(ctypes.c_int32(v) for v in value.shape),
                       *(ctypes.c_int64(v) for v in value.strides)]
        elif kind.startswith("*"):
            values.append(ctypes.c_uint64(value.data_ptr()))
        elif kind in _INTEGER_TYPES:
            values.append(_INTEGER_TYPES[kind](value))
        else:
            return f"{name}: argument type {kind}"
    values += _scratch_pointers(metadata)
    sizes = _entry_parameter_bytes(compiled.asm["ptx"])
    if sizes != [ctypes.sizeof(v) for v in values]:
        return f"parameters {sizes} against packed {[ctypes.sizeof(v) for v in values]}"
    launch = driver.Launch(compiled.function, grid, 32 * metadata.num_warps, metadata.shared, 0, values,
                           dependent=bool(getattr(metadata, "launch_pdl", False)))
    stream = torch.cuda.current_stream(out.device).cuda_stream
    run = functools.partial(launch, stream)
    run.tensor_maps = keep  # (their buffers live as long as the launch)
    return run


# BLOCK_M (positions), BLOCK_CO, BLOCK_CI, warps, stages (the script's first run, eighty-ninth session, also had
# 256 x 64 x 64 and 256 x 64 x 32 in 4 warps: 3 to 10 times slower on four of five layers)
CONFIGS = [
    (256, 64, 64, 8, 3),
    (128, 64, 64, 4, 3),
    (128, 64, 64, 4, 4),
    (128, 64, 64, 8, 3),
    (64, 64, 64, 4, 4),
]
LIBRARY_CONFIGS = [(128, 64, 64, 4, 3), (256, 64, 64, 8, 3)]  # its fastest on FP16 operands (forty-ninth session)


def check(names=None):
    """Interpreter check on small shapes: the sweep layers named (None: all but grouped_g4), against float64."""
    failures = 0
    for layer in json.loads(SWEEP.read_text()):
        if layer.get("groups", 1) != 1 or (names is not None and layer["name"] not in names):
            continue
        layer = dict(layer, input_shape=[1, layer["in_channels"], 3, 5, 6])
        plan, x, w, b, reference = layer_tensors(layer, torch.float16, "cpu")
        x_op, w_op, _ = forward._operands(x, w, 1, NATIVE)
        out = torch.full(plan.output_shape, float("nan"), dtype=x.dtype)
        for tiles in FORMS:
            out.fill_(float("nan"))
            wide_n_launch(dict(BLOCK_M=32, BLOCK_CO=16, BLOCK_CI=16, num_warps=4, num_stages=1), plan, x_op, w_op, b,
                          out, tiles)()
            error = relative_error(out, reference)
            # The float16 output's rounding alone leaves about 2e-4; a wrong tap or shift leaves errors of order 1.
            ok = error < 2e-3 and not out.isnan().any()
            failures += not ok
            print(f"{layer['name']}, {FORMS[tiles]}: rel. err. {error:.1e} {'ok' if ok else 'FAILED'}",
                  flush=True)
    return failures


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--layers", help="comma-separated sweep layers (default: five for timing, all for --check)")
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    if args.check:
        return 1 if check(args.layers and args.layers.split(",")) else 0
    args.layers = args.layers or "k3s1p1,vae_k4s2p1,video_spatial_k144,video_k3s2p1op1,wide_256to128_k3s2"
    layers = {layer["name"]: layer for layer in json.loads(SWEEP.read_text())}
    rows = []
    for name in args.layers.split(","):
        torch.manual_seed(0)
        plan, x, w, b, reference = layer_tensors(layers[name], torch.float16, "cuda")
        x_op, w_op, w_lo = forward._operands(x, w, 1, NATIVE)
        first = None  # the library's output in its first config, which every other is compared with
        runs = ([("library", cfg) for cfg in LIBRARY_CONFIGS] + [(tiles, cfg) for tiles in FORMS for cfg in CONFIGS]
                + [(BY_DRIVER, cfg) for cfg in CONFIGS])
        for form, (m, co, ci, wp, st) in runs:
            cfg = dict(BLOCK_M=m, BLOCK_CO=co, BLOCK_CI=ci, num_warps=wp, num_stages=st, PER_SM=0)
            label = f"{m}x{co}x{ci} w{wp} s{st}"
            out = torch.full(plan.output_shape, float("nan"), dtype=x.dtype, device="cuda")
            try:
                if form == "library":
                    lib = forward._main_launch(cfg, plan, NATIVE, b is not None, reference.stride(), 0)
                    fn = functools.partial(lib, (x_op, w_op, w_lo, b if b is not None else w_op, out))
                elif form == BY_DRIVER:
                    fn = driver_launch(cfg, plan, x_op, w_op, b, out)
                    if isinstance(fn, str):
                        raise RuntimeError(f"no launch by the driver: {fn}")
                    out.fill_(float("nan"))  # (driver_launch's compiling launch wrote it)
                else:
                    fn = wide_n_launch(cfg, plan, x_op, w_op, b, out, form)
                fn()
                torch.cuda.synchronize()
                if first is None:
                    first = out.clone()
                difference = (out.float() - first.float()).abs().max().item()
                note = (f"{relative_error(out, reference):.1e}, vs library {difference:.1e}, "
                        f"nan {out.isnan().any().item()}")
                t = time_cuda(fn, iters=args.iters)
                queued = time_cuda(fn, iters=args.iters, synchronize=False)
                row = (name, FORMS.get(form, form), label, t.mean_ms, t.min_ms, queued.mean_ms, note)
            except Exception as error:  # noqa: BLE001 (a config that does not compile or fit: its row says why)
                row = (name, FORMS.get(form, form), label, float("nan"), float("nan"), float("nan"), repr(error)[:120])
            print(row, flush=True)
            rows.append(row)
    print(markdown_table(["layer (float16)", "form", "config", "mean ms", "min ms", "queued mean ms",
                          "rel. err. vs float64, max diff vs library's first, NaN left"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
