"""An experiment (GPU): the tap_columns kernel rounding or splitting its operands as it loads them, against the
library's operand pass that does it beforehand.

    PYTHONPATH=src python3 benchmarks/diag_raw_input.py [--iters 30] [--layers k3s1p1,...] [--modes tf32,off]

Per layer, mode and tap_columns config of the library's: the kernel alone on the pass's operands; on the input as
given (NCDHW: RAW_A); on the pass's layouts left unrounded (the pass run as for half precision), A or A and B rounded or
split in the kernel (RAW_A, RAW_B); and the whole of the library's call against the unrounded pass and the kernel that
splits both. bench.protocol.time_cuda's mean and minimum in ms (L2 flushed before each call). Each output is
NaN-poisoned before its first call, then checked: KernelBench's check against eager in the same mode and the relative
error against float64.
"""

import argparse

import torch

from convt3d.backends.triton import cdiv, forward as tf, tap_columns
from convt3d.bench.protocol import kernelbench_check, relative_error, time_cuda
from convt3d.bench.report import markdown_table
from convt3d.bench.workloads import DTYPES, sweep_layers


def weight_pass(x, w, groups, precision):
    """The operand pass's programs for the weight alone (forward._operand_pass without its input programs), bound."""
    c_in, c_out_g = w.shape[:2]
    taps = w[0, 0].numel()
    block_w = 1024
    return tf._prepare.bind((cdiv(taps * c_in * c_out_g, block_w),),
                            (x.shape[1], x[0, 0].numel(), 1, 0, 0, 0, 0, c_in, c_in // groups, c_out_g, taps),
                            (("PRECISION", precision), ("BLOCK_C", 32), ("BLOCK_S", 128), ("BLOCK_W", block_w)))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--layers", default="k3s1p1,video_k3s2p1op1,wide_256to128_k3s2,vae_k4s2p1,video_spatial_k144,"
                                            "batch1_small_k3s2,grouped_g4")
    parser.add_argument("--modes", default="tf32,off")
    args = parser.parse_args()
    rows = []
    for layer in sweep_layers(args.layers):
        dtype = DTYPES[layer.dtype]
        plan = layer.plan()
        module, x, w, b, reference = layer.kernel_case("cuda")
        for mode in args.modes.split(",") if dtype == torch.float32 else ["tf32"]:
            torch.backends.cudnn.allow_tf32 = mode == "tf32"
            precision = tf.precision_for(dtype)
            with torch.no_grad():
                expected = module(x)
            operands = tf._operands(x, w, plan.groups, precision)
            weights = weight_pass(x, w, plan.groups, precision)
            w_pointers = (x, x, x, w.contiguous(), *operands[2:])

            def add(label, fn, out=None):
                try:
                    fn()
                    text = "" if out is None else (
                        f"KB {kernelbench_check(out, expected)}, {relative_error(out, reference):.1e}")
                    t = time_cuda(fn, iters=args.iters)
                except Exception as error:  # a variant that does not compile or fit: say so and go on
                    rows.append((layer.name, mode, label, float("nan"), float("nan"), repr(error)[:80]))
                    return
                rows.append((layer.name, mode, label, t.mean_ms, t.min_ms, text))
                print(rows[-1], flush=True)

            add("eager", lambda: module(x))
            add("operand pass", lambda: tf._operands(x, w, plan.groups, precision))
            add("unrounded operand pass", lambda: tf._operands(x, w, plan.groups, tf.NATIVE))
            add("weight's part of the pass", lambda: weights(w_pointers))
            x_cl, _, w_native, _ = tf._operands(x, w, plan.groups, tf.NATIVE)
            bias = b if b is not None else operands[2]
            cl_strides = tf.channels_last_strides(plan)
            for cfg in tap_columns.configs(plan):
                label = "{BLOCK_M}x{BLOCK_N} w{num_warps}".format(**cfg)

                def poisoned():
                    return torch.full(plan.output_shape, float("nan"), device="cuda", dtype=dtype)

                outs = [poisoned() for _ in range(4)]
                kernel = tap_columns.bind(cfg, plan, precision, b is not None, outs[0].stride())
                raw = tap_columns.bind(cfg, plan, precision, b is not None, outs[0].stride(), x.stride())
                split_a = tap_columns.bind(cfg, plan, precision, b is not None, outs[0].stride(), cl_strides)
                split_ab = tap_columns.bind(cfg, plan, precision, b is not None, outs[0].stride(), cl_strides, True)
                add(f"{label}: kernel", lambda: kernel((*operands, bias, outs[0])), outs[0])
                add(f"{label}: NCDHW input, A split here", lambda: raw((x, x, *operands[2:], bias, outs[1])), outs[1])
                add(f"{label}: A split here", lambda: split_a((x_cl, x_cl, *operands[2:], bias, outs[2])), outs[2])
                add(f"{label}: A, B split here", lambda: split_ab((x_cl, x_cl, w_native, w_native, bias, outs[3])),
                    outs[3])
                add(f"{label}: pass + kernel",
                    lambda: kernel((*tf._operands(x, w, plan.groups, precision), bias, outs[0])))
                add(f"{label}: unrounded pass + A, B split here",
                    lambda: split_ab((*tf._operands(x, w, plan.groups, tf.NATIVE), bias, outs[3])))
            del operands
    torch.backends.cudnn.allow_tf32 = True
    print(markdown_table(["layer", "mode", "variant", "mean ms", "min ms", "check, rel. err. vs float64"], rows))


if __name__ == "__main__":
    main()
