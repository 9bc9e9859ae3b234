"""Problem 77's phase correlation by the library's two CUDA kernels on the same operands: row_runs.py's (the MMA turned
around: output channels as M, runs of whole window rows as N) and phase_conv.py's (window positions as M), each
into a compact tensor and into the output's lattice, and the forward (backend="torch") with each.

    PYTHONPATH=src python3 benchmarks/diag_turned.py [--iters 100] [--rounds 2]

row_runs.py's kernel was built here (sixty-fourth session, benchmarks/RESULTS.md): d97862f's form of this script held
its first forms, the weight streamed through a ring of one tap a stage and a depth tap's weights at once, with
64- and 128-byte rows, one or two weight buffers and the next plane prefetched, beside phase_conv.py's kernel. The
form that row_runs.py took (a depth tap's weights, one buffer, FP16 rows of 64 bytes, three programs a
multiprocessor, no prefetch) was the fastest in FP16 but for the prefetch, which was within 0.003 ms either way.

--variants adds forms of row_runs.py's kernel, its source patched here: l2prefetch (after a depth tap's MMAs are
issued, each thread asks the L2 for its share of the next plane, prefetch.global.L2, so that the plane's loads, the
kernel's most frequent stall under Nsight Compute, hit the L2) and promote6 (3xFP16's partial sums over 6 k-steps
instead of 4). Neither made the forward faster (sixty-fourth session, call 11): l2prefetch 0.2919-0.2924 ms against
0.2888-0.2900 in FP16, 0.3558 against 0.3471-0.3481 in 3xFP16; promote6 0.3469-0.3477. weights_ca: the weights copied
by cp.async.ca (through the L1, which the programs of a multiprocessor share) instead of .cg; slower (sixty-fifth
session, call 2, on d18b90f's kernel: compact 0.1126 ms against 0.1017 in FP16, 0.1768 against 0.1709 in 3xFP16).
What-ifs, results wrong, timed only: whatif_sameplane (every depth tap reads the first depth tap's plane: the same
loads, a third of the plane's bytes asked of the L2) and whatif_noweights (the first depth tap's weights kept: no copy
after it). Sixty-fifth session, call 1, compact in FP16: 0.0997 and 0.0912 ms against 0.0963.

Rows: bench.protocol.time_cuda's mean and minimum in ms (L2 flushed before each call), the kernels in turns
(cuda.ROW_RUNS and cuda._row_runs_kernel, the launch caches cleared at each switch). The compact results are compared
with each other and with float64; each forward's output, NaN-poisoned first, with float64 and eager (KernelBench's
check).
"""

import argparse

import torch

import convt3d
from convt3d.backends import cuda
from convt3d.backends.cuda import row_runs
from convt3d.backends.triton.window import correlation_operands
from convt3d.bench.protocol import kernelbench_check, relative_error
from p77_correlation import (LIBRARY_ROW_RUNS_KERNEL, P77, Timings, correlation_geometry, modes, patched_row_runs,
                             problem_77, use_row_runs)

KERNELS = {"row_runs": True, "phase_conv": False}
MMAS_ISSUED = r"""        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#if REGION_FILL && !FILL_BESIDE_LOADS
        fill_part(kd);
#endif
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
"""
L2_PREFETCH = r"""        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        if (kd + 1 < KD) {  // (diag_turned l2prefetch) the next plane, a 128-byte line per request
            const float* next = plane0 + (long long)(kd + 1) * DD * XH * XW * C_IN;
            for (int e = tid; e < HH * XW * C_IN / 32; e += THREADS)
                asm volatile("prefetch.global.L2 [%0];\n" :: "l"(next + e * 32));
        }
#if REGION_FILL && !FILL_BESIDE_LOADS
        fill_part(kd);
#endif
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
"""

# Source patches: (text of row_runs.SOURCE, its replacement) per variant (the module docstring says what each does).
PLANE_AT = "const float4* src = (const float4*)(plane0 + (long long)kd * DD * XH * XW * C_IN);"
WEIGHT_COPY = "cp_async16(weights + tap * W_TAP_FLOATS + oc * (ROW / 4) + (SWIZZLE(c, oc) << 2),"
WEIGHT_COPY_CA = ('asm volatile("cp.async.ca.shared.global [%0], [%1], 16;\\n" :: "r"(smem_addr(weights + tap * '
                  'W_TAP_FLOATS + oc * (ROW / 4) + (SWIZZLE(c, oc) << 2))), "l"(')
PATCHES = {
    "weights_ca": (WEIGHT_COPY + "\n                           src + oc * 32 + c * 4);",
                   WEIGHT_COPY_CA + "src + oc * 32 + c * 4));"),
    "l2prefetch": (MMAS_ISSUED, L2_PREFETCH),
    "whatif_sameplane": (PLANE_AT, "const float4* src = (const float4*)plane0;  // (diag_turned whatif_sameplane)"),
    "whatif_noweights": ("            copy_weights(kd);\n", "            // (diag_turned whatif_noweights)\n"),
}


def variant(name: str):
    """A cuda._row_runs_kernel that builds row_runs.py's kernel with the named change (promote6, or PATCHES')."""
    if name == "promote6":
        return patched_row_runs((f"#define PROMOTE {row_runs.PROMOTE}\n", "#define PROMOTE 6\n"))
    return patched_row_runs(PATCHES[name])


def use(kernel: str) -> None:
    """The correlations from here on by kernel ("row_runs", "phase_conv" or a variant's name)."""
    use_row_runs(LIBRARY_ROW_RUNS_KERNEL if kernel in KERNELS else variant(kernel), KERNELS.get(kernel, True))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--variants", default="",
                        help="l2prefetch, promote6, weights_ca, whatif_sameplane, whatif_noweights (','-separated)")
    args = parser.parse_args()
    kernels = [*KERNELS, *filter(None, args.variants.split(","))]
    x, w, plan, phase_list = problem_77()
    timings = Timings(args.iters)
    library_choice = cuda.ROW_RUNS

    for mode, split, reference, eager in modes(x, w):
        compacts = {}
        for kernel in kernels:
            if kernel == "promote6" and split == 3:
                continue
            use(kernel)
            out = torch.empty(plan.output_shape, device="cuda")
            start, extent, geometry = correlation_geometry(plan, phase_list, split, out.stride())
            window, taps, scales = correlation_operands(x, 0, x.shape, x.stride(), start, extent, w, False,
                                                        split=split)
            compact = torch.full((x.shape[0], 64, *geometry["grid"]), float("nan"), device="cuda")
            into_compact = {**geometry, "out_offset": 0, "out_strides": compact.stride()}
            correlate = lambda y, where: cuda.correlate(window, taps, None, y, **where, scales=scales, split=split)
            correlate(compact, into_compact)
            compacts[kernel] = compact
            check = f"{relative_error(compact, reference[:, :, 1::2, 1::2, 1::2]):.2e} off float64"
            timings.row(mode, f"{kernel}: correlation, compact", lambda: correlate(compact, into_compact), check)
            timings.row(mode, f"{kernel}: correlation into the lattice", lambda: correlate(out, geometry))
        for kernel in (k for k in compacts if k != "phase_conv" and not k.startswith("whatif")):
            difference = (compacts[kernel] - compacts["phase_conv"]).abs().max().item()
            print(f"{mode}: max |{kernel} - phase_conv| over the compact results {difference:.2e}", flush=True)
        forward = lambda: convt3d.conv_transpose3d(x, w, None, backend="torch", **P77)
        for round_ in range(args.rounds):
            for kernel in (k for k in compacts if not k.startswith("whatif")):
                use(kernel)
                torch.cuda.empty_cache()
                poisoned = torch.full(plan.output_shape, float("nan"), device="cuda")
                del poisoned  # the caching allocator hands this NaN block to the forward's output
                result = forward()
                check = (f"{relative_error(result, reference):.2e} off float64, KB check "
                         f"{kernelbench_check(result, eager)}")
                del result
                timings.row(mode, f"{kernel}: forward (round {round_ + 1})", forward, check)
        del reference, eager
    use("row_runs" if library_choice else "phase_conv")  # (as the library was: CONVT3D_ROW_RUNS)
    print(timings.table())


if __name__ == "__main__":
    main()
