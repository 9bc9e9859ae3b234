"""The tap_columns kernel (backends/triton/tap_columns.py) per tile config on sweep layers (GPU): the kernel alone, and
its registers, spills and shared memory, beside eager and two configs of the general kernel. A config's columns are
a budget: the label gives the layout it comes to (BLOCK_CO, KW_A, KW_B), tap_columns.column_layout. --diag times
each config again in the kernel's diagnostic forms (wrong results, to see where the time goes): 1 without the
epilogue's gather, 2 with one K-step per program (the program's time but for its other steps), 3 without the stores,
4 without the epilogue (the K-steps alone).

    PYTHONPATH=src python3 benchmarks/diag_tap_columns.py [--iters 30] [--layers vae_k4s2p1,...] [--diag 1,2,3,4]
        [--modes tf32,off] [--configs 128x128x16w8s4,...] [--general 128x64x32w8s3,...]

Rows: bench.protocol.time_cuda's mean and minimum in ms (L2 flushed before each call), on operands laid out
beforehand. Each output is NaN-poisoned before its first call, then checked against eager in the same mode
(KernelBench's check) and float64 (relative error). --modes: TF32 mode (tf32: the library's form, FP16 operands scaled
per tensor where its operand pass holds the layer) and TF32 off (off: 3xTF32) for float32 layers. --configs and
--general replace the tap_columns and general configs below (MxNxCI w<warps> s<stages>).
"""

import argparse
import re

import torch

from convt3d.backends.triton import forward as tf
from convt3d.backends.triton import tap_columns, tensor_scaled
from convt3d.bench.protocol import kernelbench_check, relative_error, time_cuda
from convt3d.bench.report import markdown_table
from convt3d.bench.workloads import DTYPES, sweep_layers

# (BLOCK_M, BLOCK_N, BLOCK_CI, num_warps, num_stages); BLOCK_N is a budget of columns (tap_columns.column_layout).
TAP_COLUMNS = [
    (128, 128, 32, 4, 3), (128, 128, 32, 8, 3), (64, 128, 32, 4, 3), (128, 192, 32, 8, 3), (64, 192, 32, 4, 3),
    (128, 192, 32, 4, 3), (256, 192, 32, 8, 3),
]
GENERAL = [(128, 64, 32, 4, 3), (128, 64, 64, 4, 2)]  # (BLOCK_M, BLOCK_CO, BLOCK_CI, num_warps, num_stages)
DIAG_FORMS = {1: "no gather", 2: "one K-step", 3: "no stores", 4: "no epilogue"}


def parse_configs(text):
    """"128x128x16w8s4,..." -> [(128, 128, 16, 8, 4), ...]"""
    return [tuple(int(v) for v in re.fullmatch(r"(\d+)x(\d+)x(\d+)w(\d+)s(\d+)", c).groups())
            for c in text.split(",")]


def compiled_kernels(fn):
    """Every kernel Triton compiled from fn so far (its JIT caches, whose layout varies between versions)."""
    kernels = []
    for cache in fn.device_caches.values():
        kernels += [k for k in cache[0].values() if hasattr(k, "n_regs")]
    return kernels


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--layers", default="vae_k4s2p1,video_k3s2p1op1,k3s1p1,vae_k4s2p1_fp16")
    parser.add_argument("--diag", default="", help="also time each config in these diagnostic forms (1,2,3,4)")
    parser.add_argument("--modes", default="tf32")
    parser.add_argument("--configs", type=parse_configs, default=TAP_COLUMNS)
    parser.add_argument("--general", type=parse_configs, default=GENERAL)
    args = parser.parse_args()
    rows = []
    for layer in sweep_layers(args.layers):
        dtype = DTYPES[layer.dtype]
        for mode in args.modes.split(",") if dtype == torch.float32 else ["tf32"]:
            torch.backends.cudnn.allow_tf32 = mode == "tf32"
            rows += layer_rows(layer, mode, args)
    torch.backends.cudnn.allow_tf32 = True
    print(markdown_table(["layer", "variant", "mean ms", "min ms", "check, rel. err. vs float64; resources"], rows))


def layer_rows(layer, mode, args):
    rows = []
    name = f"{layer.name} ({mode})"
    dtype = DTYPES[layer.dtype]
    plan = layer.plan()
    module, x, w, b, reference = layer.kernel_case("cuda")
    # The precision the library computes the layer in: in TF32 mode FP16 operands scaled per tensor where the operand
    # pass holds the layer (tensor_scaled.py), else TF32.
    precision = tensor_scaled.operand_precision(x, w, plan.groups, tf.precision_for(dtype))
    name += " FP16-scaled" if precision == tensor_scaled.FP16_TENSOR_SCALED else ""
    with torch.no_grad():
        expected = module(x)
        t = time_cuda(lambda: module(x), iters=args.iters)
    operands = tf._operands(x, w, plan.groups, precision)
    rows.append((name, "eager", t.mean_ms, t.min_ms, ""))
    configs = [("general {}x{}x{} w{} s{}".format(*c), dict(BLOCK_M=c[0], BLOCK_CO=c[1], BLOCK_CI=c[2],
                                                              num_warps=c[3], num_stages=c[4], PER_SM=0))
               for c in args.general]
    for c in args.configs if tap_columns.unsupported_reason(plan) is None else []:
        cfg = dict(KERNEL="tap_columns", BLOCK_M=c[0], BLOCK_N=c[1], BLOCK_CI=c[2], num_warps=c[3], num_stages=c[4])
        layout = tap_columns.column_layout(plan, c[1])  # (BLOCK_CO, KW_A, KW_B)
        configs += [("tap_columns {}x{}x{} w{} s{} {}".format(*c, layout), cfg)]
        for diag in filter(None, args.diag.split(",")):
            configs += [(f"  same, {DIAG_FORMS[int(diag)]}", dict(cfg, DIAG=int(diag)))]
    kernels = (tap_columns.tap_columns_kernel, tf.conv_transpose3d_kernel)
    for label, cfg in configs:
        out = torch.full(plan.output_shape, float("nan"), device="cuda", dtype=dtype)
        before = {id(k) for fn in kernels for k in compiled_kernels(fn)}

        def call(cfg=cfg, out=out):
            tf._launch(cfg, plan, *operands, b, out, precision)

        try:
            call()
            text = "" if cfg.get("DIAG") else (
                f"KB {kernelbench_check(out, expected)}, {relative_error(out, reference):.1e}")
            t = time_cuda(call, iters=args.iters)
        except Exception as error:  # a config that does not fit: say so and go on
            rows.append((name, label, float("nan"), float("nan"), repr(error)[:80]))
            continue
        new = [k for fn in kernels for k in compiled_kernels(fn) if id(k) not in before]
        if new:
            k = new[0]
            text += f"; {k.n_regs} regs, {k.n_spills} spills, {k.metadata.shared // 1024} KB shared"
        rows.append((name, label, t.mean_ms, t.min_ms, text))
        print(rows[-1], flush=True)
    return rows


if __name__ == "__main__":
    main()
