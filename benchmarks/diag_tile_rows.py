"""The CUDA phase correlation's tile rows on the sweep's float32 layers: backend="torch" (the phase path, whose
correlations run on the CUDA kernel where it serves them) with tile_rows' choice (fewer rows where a correlation would
have fewer than FULL_GRID programs) against config()'s most rows (FULL_GRID = 0, the code before), beside eager, in
one process, TF32 and TF32 off.

    PYTHONPATH=src python3 benchmarks/diag_tile_rows.py [--iters 30] [--layers k3s1p1,...]

Rows: bench.protocol.time_cuda's cold-L2 mean and minimum in ms; KernelBench's check against eager in the same mode
and the error relative to float64 of each convt3d row.
"""

import argparse

import torch

import convt3d
from convt3d.backends import cuda
from convt3d.backends.cuda import phases as cuda_phases
from convt3d.bench.protocol import kernelbench_check, relative_error, time_cuda
from convt3d.bench.report import markdown_table
from convt3d.bench.workloads import sweep_layers

LAYERS = ("unet3d_k2s2,vae_k4s2p1,video_k3s2p1op1,video_spatial_k144,k3s1p1,batch1_small_k3s2,"
          "kernelbench_l1_77_dilated")


def set_full_grid(programs: int) -> None:
    cuda.FULL_GRID = programs
    for cache in (cuda.tile_rows, cuda_phases._forward_geometry, cuda_phases._forward_launches,
                  cuda_phases._grad_input_geometry):
        cache.cache_clear()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--layers", default=LAYERS)
    args = parser.parse_args()
    full_grid = cuda.FULL_GRID
    rows = []
    for layer in sweep_layers(args.layers):
        module, x, w, b, reference = layer.kernel_case("cuda")
        conv_args = (layer.stride, layer.padding, layer.output_padding, layer.groups, layer.dilation)
        for tf32 in (True, False):
            torch.backends.cudnn.allow_tf32 = tf32
            mode = "TF32" if tf32 else "off"
            expected = module(x)
            eager = time_cuda(lambda: module(x), iters=args.iters)
            rows.append((layer.name, mode, "eager", f"{eager.mean_ms:.4f}", f"{eager.min_ms:.4f}", ""))
            print(rows[-1], flush=True)
            for name, backend, programs in (("torch, most rows", "torch", 0), ("torch, tile_rows", "torch", full_grid)):
                set_full_grid(programs)
                run = lambda: convt3d.conv_transpose3d(x, w, b, *conv_args, backend=backend)
                y = run()
                t = time_cuda(run, iters=args.iters)
                check = f"{relative_error(y, reference):.1e}, KB {kernelbench_check(y, expected)}"
                rows.append((layer.name, mode, name, f"{t.mean_ms:.4f}", f"{t.min_ms:.4f}", check))
                print(rows[-1], flush=True)
    set_full_grid(full_grid)
    torch.backends.cudnn.allow_tf32 = True
    print(markdown_table(["layer", "mode", "what", "mean ms", "min ms", "rel. err., KernelBench check"], rows))


if __name__ == "__main__":
    main()
