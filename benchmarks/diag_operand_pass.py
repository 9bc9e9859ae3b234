"""The Triton forward's operand pass (backends/triton/forward.py, _operand_pass) per input tile on sweep layers (GPU).

    PYTHONPATH=src python3 benchmarks/diag_operand_pass.py [--iters 50] [--layers k3s1p1,...]

Rows: bench.protocol.time_cuda's mean and minimum in ms (L2 flushed before each call: the input comes from memory),
and the bytes the pass reads and writes over the mean. Each variant's operands are checked equal to the library's.
"""

import argparse

import torch

from convt3d.backends.triton import forward as tf
from convt3d.bench.protocol import time_cuda
from convt3d.bench.report import markdown_table
from convt3d.bench.workloads import DTYPES, sweep_layers

# (BLOCK_C, BLOCK_S, num_warps); the second is the library's (32 x 64 before the twentieth session).
TILES = [(32, 64, 4), (32, 128, 4), (64, 64, 4), (64, 128, 4), (64, 128, 8), (32, 256, 8), (128, 64, 8), (16, 128, 4)]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--layers", default="k3s1p1,video_k3s2p1op1,vae_k4s2p1,wide_256to128_k3s2,batch1_small_k3s2,"
                                            "vae_k4s2p1_fp16")
    args = parser.parse_args()
    rows = []
    for layer in sweep_layers(args.layers):
        dtype = DTYPES[layer.dtype]
        plan = layer.plan()
        _, x, w, _, _ = layer.kernel_case("cuda")
        precision = tf.precision_for(dtype)
        flat = x.flatten(2)
        expected = tf._operands(x, w, plan.groups, precision)
        moved = 2 * (x.numel() + w.numel()) * x.element_size()
        for block_c, block_s, warps in TILES:
            x_op, _, w_op, w_lo = tf.allocate_operands(
                tf._operand_steps(tuple(x.shape), tuple(w.shape), plan.groups, flat.stride(), precision)[0], x.dtype,
                x.device)
            ops = (x_op, w_op, w_lo)
            for t in ops:
                t.fill_(float("nan"))
            launch = tf._operand_pass(tuple(x.shape), tuple(w.shape), plan.groups, flat.stride(), precision,
                                      block_c, block_s, warps)
            pointers = (flat, x_op, w.contiguous(), w_op, w_lo)
            launch(pointers)
            same = all(torch.equal(a, b) for a, b in zip(ops, expected))
            t = time_cuda(lambda: launch(pointers), iters=args.iters)
            rows.append((layer.name, f"{block_c}x{block_s} w{warps}", t.mean_ms, t.min_ms,
                         round(moved / t.mean_ms / 1e9, 2), same))
            print(rows[-1], flush=True)
    print(markdown_table(["layer", "tile (channels x positions, warps)", "mean ms", "min ms", "TB/s", "equal"], rows))


if __name__ == "__main__":
    main()
