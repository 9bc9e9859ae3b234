"""Problem 77's forward with the phase correlation writing its lattice rows whole (each value with the zero beside it,
8-byte stores over whole sectors) instead of every other element (4-byte stores, each sector half written).

    PYTHONPATH=src python3 benchmarks/diag_full_rows.py [--iters 100] [--rounds 2]

Why: the correlation into the output's lattice took 0.165 ms in TF32 mode against 0.113 into a compact tensor
(benchmarks/RESULTS.md, thirty-third session): each warp's store of a lattice row's 32 values touches 8 sectors and
writes half of each, which the L2 merges with the filled output in DRAM. A lattice row of problem 77 is the output
row's odd columns (1, 3, ..., 63 of 65), and no other phase writes that row, so writing the row's even columns too
(zeros, as the fill left them) changes no value: lane l stores the float2 (column 2l, 2l + 1) where that is 8-byte
aligned, else (2l + 1, 2l + 2), and the lane at the row's open end its last zero.

What it found (sixty-third session, benchmarks/RESULTS.md): slower. Problem 77's forward took 0.343-0.344 ms against
the library's 0.310-0.316 in TF32 mode, 0.404 against 0.367-0.368 with TF32 off (means, two rounds each), the outputs
bitwise equal.

The variant is the library's kernel source (phase_conv.source) with the final store loop replaced, patched in as
cuda._kernel for problem 77's forward only, so that the library's own forward (fill, operand pass, correlation) runs
it; the library's caches of launches and prepared calls are cleared at each switch. Rows: bench.protocol.time_cuda's
mean and minimum in ms (L2 flushed before each call), library and variant in turns; every output NaN-poisoned before
its first call and compared with the library's (bitwise), float64 (relative error) and F.conv_transpose3d in the same
mode (KernelBench's check).
"""

import argparse

import torch
import torch.nn.functional as F

import convt3d
from convt3d.backends import cuda, torch_phase
from convt3d.backends.cuda import phase_conv
from convt3d.bench.protocol import time_cuda
from convt3d.bench.report import markdown_table
from diag_expand import P77
from diag_overlap import checked

# The store loop of the tile's write (phase_conv.TILE_HELPERS' write_tile).
STORE = """        float* out = y_tile + (long long)oc0 * syc + (long long)qh * syh;
        #pragma unroll
        for (int k = 0; k < OC_RUN; k++)
            if (column_inside) out[k * syc] = v[k];
"""
FULL_ROWS_STORE = """        float* out = y_tile + (long long)oc0 * syc + (long long)qh * syh;
        // (diag_full_rows: the lattice is the row's odd columns, syw == 2, the row 2 QW + 1 long, QW = 32 and one
        // column block, so lane l is column l and every lane's column inside)
        #pragma unroll
        for (int k = 0; k < OC_RUN; k++) {
            float* o = out + k * syc;
            const bool pair_before = ((unsigned long long)(o - 1) & 7) == 0;  // (the same for every lane)
            if (pair_before) {
                *(float2*)(o - 1) = make_float2(0.f, v[k]);
                if (lane == 31) o[1] = 0.f;
            } else {
                *(float2*)o = make_float2(v[k], 0.f);
                if (lane == 0) o[-1] = 0.f;
            }
        }
"""


def full_rows_source(*args, **kwargs) -> str:
    text = phase_conv.source(*args, **kwargs)
    if STORE not in text:
        raise RuntimeError("phase_conv's store loop changed: diag_full_rows.STORE no longer matches")
    return text.replace(STORE, FULL_ROWS_STORE)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    torch.manual_seed(0)
    w = torch.randn(32, 64, 3, 3, 3, device="cuda") * 0.02
    x = torch.rand(16, 32, 16, 32, 32, device="cuda")
    library_kernel = cuda._kernel
    cuda.ROW_RUNS = False  # (problem 77's correlation by phase_conv.py's kernel, as when this ran; not row_runs.py's)
    variants = {}

    def full_rows_kernel(device_index, c_in, c_out, taps, dilation, has_bias, split, rows):
        key = (device_index, c_in, c_out, taps, dilation, has_bias, split, rows)
        if key not in variants:
            _, cob, _, unit = cuda.config(c_in, c_out, taps, dilation, split)
            smem = phase_conv.shared_bytes(c_in, cob, taps, dilation, rows, split, unit)
            with torch.cuda.device(device_index):
                variants[key] = cuda._Kernel(full_rows_source(c_in, c_out, cob, taps, dilation, rows, has_bias,
                                                              split, unit), "phase_conv", smem, 128)
        return variants[key]

    def use(kernel):
        cuda._kernel = kernel
        cuda.phase_launches.cache_clear()
        torch_phase._prepared.clear()

    rows = []
    forward = lambda: convt3d.conv_transpose3d(x, w, None, backend="torch", **P77)
    for mode in ("TF32", "off"):
        torch.backends.cudnn.allow_tf32 = mode == "TF32"
        reference = F.conv_transpose3d(x.double(), w.double(), None, **P77)
        eager = F.conv_transpose3d(x, w, None, **P77)
        use(library_kernel)
        expected = forward()
        for round_ in range(args.rounds):
            for name, kernel in (("library", library_kernel), ("full rows", full_rows_kernel)):
                use(kernel)
                check = checked(forward, expected, reference, eager)
                t = time_cuda(forward, iters=args.iters)
                rows.append((mode, round_ + 1, name, f"{t.mean_ms:.4f}", f"{t.median_ms:.4f}", f"{t.min_ms:.4f}",
                             check))
                print(rows[-1], flush=True)
        del expected, reference, eager
    use(library_kernel)
    torch.backends.cudnn.allow_tf32 = True
    print(markdown_table(["mode", "round", "correlation", "mean ms", "median ms", "min ms", "check"], rows))


if __name__ == "__main__":
    main()
