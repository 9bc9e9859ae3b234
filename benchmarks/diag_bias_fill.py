"""The phase path's fill of the output with the bias (GPU): where some phase has no taps, the output is first filled
with the bias (backends/torch_phase._fill), and on problem 77 with a bias that fill made the forward 0.22 ms slower
than with zeros (benchmarks/RESULTS.md, fifteenth session). Ways to write problem 77's output (571 MB) with a
per-channel value, against zero_().

    PYTHONPATH=src python3 benchmarks/diag_bias_fill.py [--iters 50]

Rows: bench.protocol.time_cuda's mean and minimum in ms (L2 flushed, GPU idle before each call); each variant is
checked once against the 5-D broadcast copy. Then problem 77's forward with a bias (the layer's default
initialisation), backend="torch", against eager, with KernelBench's check and the error against float64.
"""

import argparse

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

import convt3d
from convt3d.backends.triton.fill import fill_channels
from convt3d.bench.protocol import kernelbench_check, relative_error, time_cuda


@triton.jit
def _fill_rows(out, values, row_length, BLOCK: tl.constexpr):
    """Row program_id(0) of out (rows of row_length elements, contiguous) set to values[row]."""
    row = tl.program_id(0)
    offsets = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    value = tl.load(values + row)
    tl.store(out + row.to(tl.int64) * row_length + offsets, tl.full([BLOCK], 0, tl.float32) + value,
             mask=offsets < row_length)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=50)
    iters = parser.parse_args().iters
    n, c, spatial = 16, 64, (33, 65, 65)
    out = torch.empty(n, c, *spatial, device="cuda")
    bias = torch.randn(c, device="cuda")
    length = out[0, 0].numel()
    per_row = bias.repeat(n)

    def triton_fill(block):
        return lambda: _fill_rows[(n * c, triton.cdiv(length, block))](out, per_row, length, BLOCK=block)

    variants = {
        "zero_()": out.zero_,
        "copy_ from bias.view(1, C, 1, 1, 1).expand (5-D, current)":
            lambda: out.copy_(bias.view(1, -1, 1, 1, 1).expand_as(out)),
        "copy_ into out.view(N, C, -1) from a 3-D expand": lambda: out.view(n, c, -1).copy_(
            bias.view(1, -1, 1).expand(n, c, length)),
        "copy_ into out.view(N * C, -1) from a 2-D expand": lambda: out.view(n * c, -1).copy_(
            per_row.view(-1, 1).expand(n * c, length)),
        "Triton, a row of N * C per program row, 4096 per program": triton_fill(4096),
        "Triton, 16384 per program": triton_fill(16384),
        "backends/triton/fill.py (aligned flat blocks of 2048)": lambda: fill_channels(out, bias),
    }
    out.copy_(bias.view(1, -1, 1, 1, 1).expand_as(out))
    expected = out.clone()
    rows = []
    for name, fill in variants.items():
        out.fill_(float("nan"))
        fill()
        same = "" if name == "zero_()" else bool(torch.equal(out, expected))
        t = time_cuda(fill, iters=iters)
        rows.append((name, t.mean_ms, t.min_ms, same))
        print(rows[-1], flush=True)
    # Problem 77 with a bias: the phase path's forward (the fill above, then the CUDA correlation) against eager.
    torch.manual_seed(0)
    eager = torch.nn.ConvTranspose3d(32, 64, 3, stride=2, padding=1, dilation=2).cuda()
    x = torch.rand(16, 32, 16, 32, 32, device="cuda")
    ours = convt3d.conv_transpose3d(x, eager.weight, eager.bias, backend="torch", stride=2, padding=1, dilation=2)
    reference = F.conv_transpose3d(x.double(), eager.weight.double(), eager.bias.double(), stride=2, padding=1,
                                   dilation=2)
    check = (kernelbench_check(ours, eager(x)), relative_error(ours, reference))
    del ours, reference
    forward = lambda: convt3d.conv_transpose3d(x, eager.weight, eager.bias, backend="torch", stride=2, padding=1,
                                               dilation=2)
    for name, fn in (("problem 77 with a bias: eager", lambda: eager(x)),
                     ("problem 77 with a bias: backend torch", forward)):
        t = time_cuda(fn, iters=iters)
        rows.append((name, t.mean_ms, t.min_ms, f"KernelBench check {check[0]}, {check[1]:.1e} off float64"
                     if "torch" in name else ""))
    print("| fill | mean ms | min ms | equal to the 5-D copy |")
    print("|---|---|---|---|")
    for name, mean, low, same in rows:
        print(f"| {name} | {mean:.4f} | {low:.4f} | {same} |")


if __name__ == "__main__":
    main()
