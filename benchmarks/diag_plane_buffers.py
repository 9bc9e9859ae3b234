"""The CUDA phase correlation (backends/cuda/phase_conv.py) with one or two window plane buffers and other tile row
counts than config()'s, on problem 77's forward phase (32 -> 64 channels) and its grad_input (64 -> 32), in TF32 and
3xTF32 (GPU).

    PYTHONPATH=src python3 benchmarks/diag_plane_buffers.py [--iters 50]

Rows: bench.protocol.time_cuda's mean and minimum in ms (L2 flushed before each call) of the correlation alone into a
compact output (NaN-poisoned before its first call) on operands made beforehand, its relative error against float64,
and for the forward also the whole forward (backend="torch": operand pass, fill, correlation into the lattice) with
that variant, with KernelBench's check against the eager module in the same mode.
"""

import argparse

import torch
import torch.nn.functional as F

import convt3d
from convt3d.backends import cuda
from convt3d.backends.cuda import phases as cuda_phases
from convt3d.backends.torch_phase import _regions
from convt3d.backends.triton.window import correlation_operands
from convt3d.bench.protocol import kernelbench_check, relative_error, time_cuda
from convt3d.plan import make_plan

P77 = dict(stride=2, padding=1, dilation=2)
TAPS, DILATION = (3, 3, 3), (1, 1, 1)


def force_config(rows: int, planes: int):
    """cuda.config answering (rows, planes) for every correlation (None: the library's own)."""
    real = force_config.real
    cuda._kernel.cache_clear()
    cuda_phases._forward_geometry.cache_clear()
    if rows is None:
        cuda.config = real
        return
    def forced(c_in, c_out, taps, dilation, split=False):
        cob, unit = min(c_out, 64), c_in if c_in <= 64 else 64
        smem = cuda.phase_conv.shared_bytes(c_in, cob, taps, dilation, rows, split, unit, planes)
        return rows, cob, smem, unit, planes
    cuda.config = forced


force_config.real = cuda.config


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=50)
    iters = parser.parse_args().iters
    torch.manual_seed(0)
    eager = torch.nn.ConvTranspose3d(32, 64, 3, bias=False, **P77).cuda()
    weight = eager.weight.detach()
    x = torch.rand(16, 32, 16, 32, 32, device="cuda")
    lattice = torch.randn(16, 64, 16, 32, 32, device="cuda")
    reference = F.conv_transpose3d(x.double(), weight.double(), None, **P77)
    forward_reference = reference[:, :, 1::2, 1::2, 1::2]
    grad_input_reference = F.conv3d(lattice.double(), weight.double(), None, 1, 1)
    plan = make_plan(tuple(x.shape), tuple(weight.shape), (2,) * 3, (1,) * 3, (0,) * 3, 1, (2,) * 3)
    phase_list = tuple(p for _, p in _regions(plan, True) if p is not None)
    rows_out = []
    for split in (False, True):
        torch.backends.cudnn.allow_tf32 = not split
        torch.backends.cuda.matmul.allow_tf32 = False
        expected = eager(x)
        mode = "3xTF32" if split else "TF32"
        # Operands made with the library's config; their extents serve 2, 4 and 8 rows alike (32 rows: whole tiles).
        force_config(None, None)
        start, extent, launches = cuda_phases._forward_geometry(plan, phase_list, split)
        _, offsets, counts, firsts, steps, dilation, grid = launches[0]
        window, taps = correlation_operands(x, 0, x.shape, x.stride(), start, extent, weight, False, split=split)
        g_start, g_extent, g_counts, g_firsts, g_steps, g_dilation, g_grid = cuda_phases._grad_input_geometry(
            plan, launches[0][0], split)
        g_window, g_taps = correlation_operands(lattice, 0, lattice.shape, lattice.stride(), g_start, g_extent,
                                                weight, True, split=split)
        for direction, c_in, c_out in (("forward", 32, 64), ("grad_input", 64, 32)):
            library = force_config.real(c_in, c_out, TAPS, DILATION, split)
            for rows in (8, 4, 2):
                for planes in (1, 2):
                    if split and rows // 2 * min(c_out, 64) * c_in // 32 > 64:
                        continue  # config()'s register limit under 3xTF32
                    smem = cuda.phase_conv.shared_bytes(c_in, min(c_out, 64), TAPS, DILATION, rows, split, c_in,
                                                        planes)
                    if smem > cuda.MAX_SHARED_BYTES:
                        continue
                    force_config(rows, planes)
                    per_sm = 2 if smem <= cuda.MAX_SHARED_BYTES // 2 - 1024 else 1
                    label = (f"{mode} {direction} {rows} rows, {planes} plane(s), {smem // 1024} KiB, {per_sm}/SM"
                             + (" (library)" if library[0] == rows and library[4] == planes else ""))
                    if direction == "forward":
                        out = torch.full((16, 64, 16, 32, 32), float("nan"), device="cuda")
                        run = lambda out=out: cuda.correlate(window, taps, None, out, 0, out.stride(), grid, offsets,
                                                             counts, firsts, steps, dilation)
                        ref = forward_reference
                    else:
                        out = torch.full((16, 32, 16, 32, 32), float("nan"), device="cuda")
                        run = lambda out=out: cuda.correlate(g_window, g_taps, None, out, 0, out.stride(), g_grid,
                                                             (0, 0, 0), g_counts, g_firsts, g_steps, g_dilation)
                        ref = grad_input_reference
                    try:
                        run()
                        error = relative_error(out, ref)
                        t = time_cuda(run, iters=iters)
                    except RuntimeError as failure:
                        print(label, "failed:", failure, flush=True)
                        continue
                    whole = ""
                    if direction == "forward":
                        forward = lambda: convt3d.conv_transpose3d(x, weight, None, backend="torch", **P77)
                        check = kernelbench_check(forward(), expected)
                        tw = time_cuda(forward, iters=iters)
                        whole = f"{tw.mean_ms:.4f} / {tw.min_ms:.4f} ({check})"
                    rows_out.append((label, f"{t.mean_ms:.4f} / {t.min_ms:.4f}", f"{error:.1e}", whole))
                    print(rows_out[-1], flush=True)
    force_config(None, None)
    torch.backends.cudnn.allow_tf32 = True
    print("| variant | correlation mean / min ms | rel. err. vs float64 | whole forward mean / min ms (KB check) |")
    print("|---|---|---|---|")
    for row in rows_out:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
