"""tiled.py's FP16-scaled operand pass (TF32 mode's) with other program sizes, values per program and warps (the
library: 8,192 and 8), alone, on the sweep's float32 k2 s2 layers (GPU); beside it eager, backend="triton" and the
library's pass. Each variant's operands are NaN-filled, made once and compared bitwise with the library's; the rows
say DIFFERS where they are not equal. Cold-L2 mean and minimum (bench.protocol.time_cuda). The variants launch through
Triton's own launcher, whose host time shows in their means on this machine: read their minima. Results:
benchmarks/RESULTS.md, fortieth session.

    PYTHONPATH=src python3 benchmarks/diag_scaled_pass.py [--iters 100] [--layers unet3d_k2s2_deep,unet3d_k2s2]
"""

import argparse

import torch

import convt3d
from convt3d.backends.triton import cdiv, next_power_of_2, tiled
from convt3d.backends.triton.forward import allocate_operands, flat_input
from convt3d.bench.protocol import time_cuda
from convt3d.bench.report import markdown_table
from convt3d.bench.workloads import sweep_layers

VARIANTS = [(8192, 8), (4096, 8), (4096, 4), (2048, 4), (2048, 2), (1024, 2), (8192, 4), (16384, 8)]


def pass_variant(x, w, operands, values, warps):
    """The scaled pass with `values` values per program (the library: 8192) and `warps` warps (the library: 8)."""
    n, c, d, h, wd = x.shape
    c_in, c_out, kd, kh, kw = w.shape
    flat, flat_strides = flat_input(x)
    block_k = min(next_power_of_2(c), 512)
    block_rows = min(256, max(16, values // block_k))
    s_blocks = cdiv(d * h * wd, block_rows)
    x_programs = n * s_blocks
    w_programs = cdiv(c_out * kd * kh * kw, block_rows)
    tiled.prepare_scaled_operands_kernel[(x_programs + w_programs,)](
        flat, operands[0], operands[1], w, operands[2], operands[3],
        c, d * h * wd, s_blocks, x_programs, *flat_strides, c_out, kd * kh, kw,
        BLOCK_K=block_k, CHUNKS=cdiv(c, block_k), BLOCK_S=block_rows, BLOCK_W=block_rows, LET_NEXT_START=False,
        num_warps=warps)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--layers", default="unet3d_k2s2_deep,unet3d_k2s2")
    args = parser.parse_args()
    rows = []
    for layer in sweep_layers(args.layers):
        module, x, w, b, _ = layer.kernel_case("cuda")
        x = torch.rand(layer.input_shape, device="cuda")
        reference = tiled._operands(x, w, tiled.FP16_SCALED)
        torch.backends.cudnn.allow_tf32 = True
        fns = {
            "eager": lambda: module(x),
            "backend=triton": lambda: convt3d.conv_transpose3d(x, w, b, layer.stride, layer.padding,
                                                               backend="triton"),
            "library operand pass (tiled._operands)": lambda: tiled._operands(x, w, tiled.FP16_SCALED),
        }
        for values, warps in VARIANTS:
            layout, _ = tiled._operand_steps(tuple(x.shape), tuple(w.shape), flat_input(x)[1], tiled.FP16_SCALED)
            ops = allocate_operands(layout, torch.float16, x.device)
            for t in ops:
                t.fill_(float("nan"))
            pass_variant(x, w, ops, values, warps)
            same = all(torch.equal(a.view(torch.int16), r.view(torch.int16)) for a, r in zip(ops, reference))
            fns[f"pass {values} values/program, {warps} warps{'' if same else ' DIFFERS'}"] = (
                lambda values=values, warps=warps, ops=ops: pass_variant(x, w, ops, values, warps))
        with torch.no_grad():
            for label, fn in fns.items():
                t = time_cuda(fn, iters=args.iters)
                rows.append((layer.name, label, t.mean_ms, t.min_ms))
                print(rows[-1], flush=True)
    print(markdown_table(["layer", "variant", "mean ms", "min ms"], rows))


if __name__ == "__main__":
    main()
