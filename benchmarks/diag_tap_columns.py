"""The tap_columns kernel (backends/triton/tap_columns.py) per tile config on sweep layers (GPU): the kernel alone,
with --no-gather also without its epilogue's gather (DIAG 1, a wrong result, to time the gather), and its
registers, spills and shared memory, beside eager and two configs of the general kernel. A config's columns are a
budget: the label gives the layout it comes to (BLOCK_CO, KW_A, KW_B), tap_columns.column_layout.

    PYTHONPATH=src python3 benchmarks/diag_tap_columns.py [--iters 30] [--layers vae_k4s2p1,...] [--no-gather]

Rows: bench.protocol.time_cuda's mean and minimum in ms (L2 flushed before each call), on operands laid out
beforehand. Each output is NaN-poisoned before its first call, then checked against eager (KernelBench's check)
and float64 (relative error), TF32 mode.
"""

import argparse

import torch

from convt3d.backends.triton import forward as tf
from convt3d.backends.triton import tap_columns
from convt3d.bench.protocol import kernelbench_check, relative_error, time_cuda
from convt3d.bench.report import markdown_table
from convt3d.bench.workloads import DTYPES, sweep_layers

# (BLOCK_M, BLOCK_N, BLOCK_CI, num_warps, num_stages); BLOCK_N is a budget of columns (tap_columns.column_layout).
TAP_COLUMNS = [
    (128, 128, 32, 4, 3), (128, 128, 32, 8, 3), (64, 128, 32, 4, 3), (128, 192, 32, 8, 3), (64, 192, 32, 4, 3),
    (128, 192, 32, 4, 3), (256, 192, 32, 8, 3),
]
GENERAL = [(128, 64, 32, 4, 3), (128, 64, 64, 4, 2)]  # (BLOCK_M, BLOCK_CO, BLOCK_CI, num_warps, num_stages)


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
    parser.add_argument("--no-gather", action="store_true", help="also time each config without its gather")
    args = parser.parse_args()
    rows = []
    for layer in sweep_layers(args.layers):
        name = layer.name
        dtype = DTYPES[layer.dtype]
        plan = layer.plan()
        module, x, w, b, reference = layer.kernel_case("cuda")
        precision = tf.precision_for(dtype)
        with torch.no_grad():
            expected = module(x)
        operands = tf._operands(x, w, plan.groups, precision)
        t = time_cuda(lambda: module(x), iters=args.iters)
        rows.append((name, "eager", t.mean_ms, t.min_ms, ""))
        configs = [("general {}x{}x{} w{} s{}".format(*c), dict(BLOCK_M=c[0], BLOCK_CO=c[1], BLOCK_CI=c[2],
                                                                  num_warps=c[3], num_stages=c[4], PER_SM=0))
                   for c in GENERAL]
        for c in TAP_COLUMNS:
            cfg = dict(KERNEL="tap_columns", BLOCK_M=c[0], BLOCK_N=c[1], BLOCK_CI=c[2], num_warps=c[3], num_stages=c[4])
            layout = tap_columns.column_layout(plan, c[1])  # (BLOCK_CO, KW_A, KW_B)
            configs += [("tap_columns {}x{}x{} w{} s{} {}".format(*c, layout), cfg)]
            if args.no_gather:
                configs += [("  same, no gather", dict(cfg, DIAG=1))]
        for label, cfg in configs:
            out = torch.full(plan.output_shape, float("nan"), device="cuda", dtype=dtype)
            before = {id(k) for k in compiled_kernels(tap_columns.tap_columns_kernel)}

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
            new = [k for k in compiled_kernels(tap_columns.tap_columns_kernel) if id(k) not in before]
            if new:
                k = new[0]
                text += f"; {k.n_regs} regs, {k.n_spills} spills, {k.metadata.shared // 1024} KB shared"
            rows.append((name, label, t.mean_ms, t.min_ms, text))
            print(rows[-1], flush=True)
        del operands
    print(markdown_table(["layer", "variant", "mean ms", "min ms", "check, rel. err. vs float64; resources"], rows))


if __name__ == "__main__":
    main()
