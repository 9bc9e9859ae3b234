"""The Triton forward's two kernels (backends/triton/forward.py and tap_columns.py) on sweep layers (GPU): the
kernel alone per tile config of the library's (the autotuner's candidates), against eager, the `torch` path and
the autotuned Triton call.

    PYTHONPATH=src python3 benchmarks/diag_forward.py [--iters 30] [--layers vae_k4s2p1,...] [--modes tf32,off]

Rows: bench.protocol.time_cuda's mean and minimum in ms (L2 flushed before each call). The kernel rows run on
operands laid out beforehand (the operand pass not counted; its time is its own row). Each output is NaN-poisoned
before its first call, then checked: KernelBench's check against eager in the same mode and the relative error
against float64.
"""

import argparse

import torch

from convt3d.backends.torch_phase import conv_transpose3d as torch_phase_forward
from convt3d.backends.triton import forward as tf
from convt3d.bench.protocol import kernelbench_check, relative_error, time_cuda
from convt3d.bench.report import markdown_table
from convt3d.bench.workloads import DTYPES, sweep_layers

def config_label(cfg):
    if cfg.get("KERNEL") == "tap_columns":
        return "tap_columns {BLOCK_M}x{BLOCK_N}x{BLOCK_CI} w{num_warps} s{num_stages}".format(**cfg)
    return "general {BLOCK_M}x{BLOCK_CO}x{BLOCK_CI} w{num_warps} s{num_stages}".format(**cfg)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--layers", default="vae_k4s2p1,video_k3s2p1op1,video_spatial_k144,k3s1p1,wide_256to128_k3s2,"
                                            "vae_k4s2p1_fp16,grouped_g4")
    parser.add_argument("--modes", default="tf32")
    args = parser.parse_args()
    rows = []
    for layer in sweep_layers(args.layers):
        name = layer.name
        dtype = DTYPES[layer.dtype]
        plan = layer.plan()
        module, x, w, b, reference = layer.kernel_case("cuda")
        for mode in args.modes.split(",") if dtype == torch.float32 else ["tf32"]:
            torch.backends.cudnn.allow_tf32 = mode == "tf32"
            precision = tf.precision_for(dtype)
            with torch.no_grad():
                expected = module(x)
            operands = tf._operands(x, w, plan.groups, precision)

            def note(out):
                return f"KB {kernelbench_check(out, expected)}, {relative_error(out, reference):.1e}"

            def add(label, fn, out=None):
                try:
                    with torch.no_grad():
                        result = fn()
                        text = note(result if out is None else out) if label != "operand pass" else ""
                        t = time_cuda(fn, iters=args.iters)
                except Exception as error:  # a config that does not fit: say so and go on
                    rows.append((name, mode, label, float("nan"), float("nan"), repr(error)[:80]))
                    return
                rows.append((name, mode, label, t.mean_ms, t.min_ms, text))
                print(rows[-1], flush=True)

            add("eager", lambda: module(x))
            add("torch path", lambda: torch_phase_forward(x, w, b, plan))
            add("triton, autotuned (with its pass)", lambda: tf.conv_transpose3d_triton(x, w, b, plan))
            if precision == tf.TF32:
                add("triton 3xTF32, autotuned", lambda: tf.conv_transpose3d_triton(x, w, b, plan, tf.TF32X3))
            add("operand pass", lambda: tf._operands(x, w, plan.groups, precision))
            for cfg in tf.candidates(plan):
                out = torch.full(plan.output_shape, float("nan"), device="cuda", dtype=dtype)
                add(config_label(cfg), lambda cfg=cfg, out=out: tf._launch(cfg, plan, *operands, b, out, precision),
                    out)
            operands = None  # the mode's operand buffers freed before the next mode's
    torch.backends.cudnn.allow_tf32 = True
    print(markdown_table(["layer", "mode", "variant", "mean ms", "min ms", "check, rel. err. vs float64"], rows))


if __name__ == "__main__":
    main()
