"""Where the per-tensor FP16 operand pass's time goes (backends/triton/tensor_scaled.py), beside the TF32 pass it
replaces (forward.py's, which TF32 off also runs as 3xTF32), on sweep layers (GPU).

    PYTHONPATH=src python3 benchmarks/diag_tensor_scaled.py [--iters 100] [--layers video_k3s2p1op1,...]

On the H200 the FP16 pass alone took 0.012-0.015 ms on layers whose main kernel took 0.02-0.05 (forty-sixth and
forty-seventh sessions, benchmarks/RESULTS.md): a third of video_k3s2p1op1's time. Rows per layer, each pass alone,
bench.protocol.time_cuda's cold-L2 mean and minimum in ms and the bytes it reads and writes over the mean:
- the TF32 pass, its operands checked equal to the library's, and the same for the 3xTF32 pass (TF32 off);
- the FP16 pass as the library runs it (DIAG 0), its operands checked equal to the library's and its sync words
  checked zero again;
- DIAG 1: arriving at the grid-wide barrier without waiting there (the wait's cost);
- DIAG 2: no maxima posted and no barrier, scaling by 1 (what reading, rounding and storing cost in a cooperative
  launch).
DIAG 1 and 2 give wrong operands, so they are not checked.
"""

import argparse

import torch

from convt3d.backends.triton import TF32, TF32X3, forward, tensor_scaled
from convt3d.bench.protocol import time_cuda
from convt3d.bench.report import markdown_table
from convt3d.bench.workloads import sweep_layers


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--layers", default="video_k3s2p1op1,vae_k4s2p1,k3s1p1,video_spatial_k144,"
                                            "wide_256to128_k3s2,batch1_small_k3s2")
    args = parser.parse_args()
    rows = []
    for layer in sweep_layers(args.layers):
        rows += measure(layer, args.iters)
    print(markdown_table(["layer", "pass", "mean ms", "min ms", "GB/s", "operands as the library's"], rows))


def measure(layer, iters):
    """The rows of one layer."""
    _, x, w, _, _ = layer.kernel_case("cuda")
    groups = layer.plan().groups
    flat, flat_strides = forward.flat_input(x)
    shapes = (tuple(x.shape), tuple(w.shape))
    device_index = tensor_scaled.cuda_index(x.device)
    rows = []

    def row(name, launch, pointers, operands, expected, read_bytes, written_bytes):
        for t in operands:
            t.fill_(float("nan"))
        launch(pointers)
        same = "" if expected is None else all(torch.equal(a, b) for a, b in zip(operands, expected))
        timing = time_cuda(lambda: launch(pointers), iters=iters)
        rows.append((layer.name, name, f"{timing.mean_ms:.4f}", f"{timing.min_ms:.4f}",
                     round((read_bytes + written_bytes) / timing.mean_ms / 1e6), same))
        print(rows[-1], flush=True)

    elements = x.numel() + w.numel()
    layout, tf32_pass = forward._operand_steps(*shapes, groups, flat_strides, TF32)
    x_op, _, w_op, w_lo = forward.allocate_operands(layout, x.dtype, x.device)
    row("TF32", tf32_pass, (flat, x_op, w.contiguous(), w_op, w_lo), (x_op, w_op),
        forward._operands(x, w, groups, TF32)[:2], 4 * elements, 4 * elements)
    layout, tf32x3_pass = forward._operand_steps(*shapes, groups, flat_strides, TF32X3)
    x_op, _, w_op, w_lo = forward.allocate_operands(layout, x.dtype, x.device)
    row("3xTF32 (TF32 off)", tf32x3_pass, (flat, x_op, w.contiguous(), w_op, w_lo), (x_op, w_op, w_lo),
        forward._operands(x, w, groups, TF32X3), 4 * elements, 4 * elements + 4 * w.numel())

    scaled = tensor_scaled.FP16_TENSOR_SCALED
    if tensor_scaled.operand_precision(x, w, groups, TF32) != scaled:
        rows.append((layer.name, "FP16 per tensor: not held, TF32 operands", "", "", "", ""))
        return rows
    layout = forward._operand_steps(*shapes, groups, flat_strides, scaled, False, device_index)[0]
    x_op, _, w_op, _ = forward.allocate_operands(layout, torch.float16, x.device)
    sync = tensor_scaled.sync_words(x.device)
    pointers = (flat, x_op, w.contiguous(), w_op, sync)
    expected = forward._operands(x, w, groups, scaled)[:2]
    for diag, name in [(0, "FP16 per tensor (library)"), (1, "FP16 per tensor, DIAG 1: no wait at the barrier"),
                       (2, "FP16 per tensor, DIAG 2: no maxima, no barrier")]:
        launch = tensor_scaled.operand_pass(*shapes, groups, flat_strides, False, device_index, diag)
        row(name, launch, pointers, (x_op, w_op), expected if diag == 0 else None, 4 * elements, 2 * elements)
        if diag == 0:
            assert tensor_scaled.cleared(sync), "the pass left its counters or posts set"
    return rows


if __name__ == "__main__":
    main()
