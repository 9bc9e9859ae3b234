"""Problem 77's forward with the CUDA phase correlation writing the whole output (phase_conv.py, FILL: its zeros by
the copy engine, the empty planes while the MMAs run) against the fill + lattice path it replaces (GPU).

    PYTHONPATH=src python3 benchmarks/diag_whole_output.py [--iters 100]

Rows: bench.protocol.time_cuda's mean and minimum in ms (L2 flushed, GPU idle before each call), the relative error
against float64 and KernelBench's check against the eager module (TF32 mode). "fill + lattice" is the same code
with the whole-output mode off (the output filled by zero_() first, the kernel writing the lattice). The variants
rebuild the kernel from edited source (VARIANTS).
"""

import argparse

import torch
import torch.nn.functional as F

import convt3d
from convt3d.backends import cuda
from convt3d.backends.cuda import phase_conv
from convt3d.backends.cuda import phases as cuda_phases
from convt3d.bench.protocol import kernelbench_check, relative_error, time_cuda

from diag_cuda_phases import P77


ZEROS = "    for (int k = tid; k < COB * (others + rows); k += THREADS) {"
LATTICE_ROWS = "    for (int job = warp; job < COB * BH; job += THREADS / 32) {"  # (the FILL one comes first)


def _zeros_after_the_mmas(source: str) -> str:
    start = source.index(ZEROS)
    end = source.index("commit_group", start)
    end = source.index("\n", end) + 1
    loop = source[start:end]
    source = source[:start] + source[end:]
    at = source.index(LATTICE_ROWS)
    return source[:at] + loop + source[at:]


# Timing only (they leave elements unwritten): what each part of the whole-output kernel costs.
VARIANTS = {
    "no zero copies (timing only)": lambda s: s.replace(ZEROS, ZEROS.replace("k < COB", "k < 0 * COB"), 1),
    "no lattice rows (timing only)": lambda s: s.replace(LATTICE_ROWS, LATTICE_ROWS.replace("job < COB", "job < 0 * COB"), 1),
    "zero copies issued after the MMAs": _zeros_after_the_mmas,
}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=100)
    iters = parser.parse_args().iters
    torch.manual_seed(0)
    eager = torch.nn.ConvTranspose3d(32, 64, 3, bias=False, **P77).cuda()
    x = torch.rand(16, 32, 16, 32, 32, device="cuda")
    bias = torch.randn(64, device="cuda")
    ref = F.conv_transpose3d(x.double(), eager.weight.double(), None, **P77)
    ref_bias = ref + bias.double().view(1, -1, 1, 1, 1)
    expected = eager(x)
    whole_output, real_source = cuda_phases._whole_output, phase_conv.source
    rows = []

    def row(what, fn, reference=None, eager_out=None):
        t = time_cuda(fn, iters=iters)
        out = fn() if reference is not None else None
        err = relative_error(out, reference) if out is not None else float("nan")
        check = kernelbench_check(out, eager_out) if eager_out is not None else ""
        rows.append((what, t.mean_ms, t.min_ms, err, check))
        print(rows[-1], flush=True)

    def whole(on: bool):
        cuda_phases._whole_output = whole_output if on else (lambda *args: None)

    forward = lambda b=None: lambda: convt3d.conv_transpose3d(x, eager.weight, b, backend="torch", **P77)
    row("eager forward", lambda: eager(x), ref, expected)
    for tf32 in (True, False):
        with torch.backends.cudnn.flags(enabled=True, allow_tf32=tf32):
            mode = "TF32" if tf32 else "TF32 off"
            for on in (True, False):
                whole(on)
                name = "whole output" if on else "fill + lattice"
                row(f"{mode}: {name}", forward(), ref, expected if tf32 else None)
                row(f"{mode}: {name}, with bias", forward(bias), ref_bias)
            whole(True)
            for name, edit in VARIANTS.items():
                phase_conv.source = lambda *a, edit=edit, **k: edit(real_source(*a, **k))
                cuda._kernel.cache_clear()
                row(f"{mode}: whole output, {name}", forward())
            phase_conv.source = real_source
            cuda._kernel.cache_clear()
    out = torch.empty_like(expected)
    row("out.zero_() (the fill)", out.zero_)

    print("| what | mean ms | min ms | rel. err. vs float64 | KernelBench check |")
    print("|---|---|---|---|---|")
    for what, mean, low, err, check in rows:
        print(f"| {what} | {mean:.4f} | {low:.4f} | {err:.1e} | {check} |")


if __name__ == "__main__":
    main()
