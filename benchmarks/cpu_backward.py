"""Problem 77's backward on the CPU (batch 2): aten's convolution_backward against the phase decomposition,
each gradient alone, and their relative difference.

    PYTHONPATH=src python3 benchmarks/cpu_backward.py [--repeats 3]
"""

import argparse
import time

import torch

from convt3d.backends.torch_phase import conv_transpose3d_backward
from convt3d.bench.workloads import PROBLEM_77


def mean_ms(fn, repeats):
    fn()  # warm-up
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats * 1e3


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    layer = PROBLEM_77.with_batch(2)
    plan = layer.plan()
    x = torch.rand(layer.input_shape)
    w = torch.randn(layer.weight_shape()) * 0.05
    g = torch.randn(plan.output_shape)

    def aten(mask):
        return torch.ops.aten.convolution_backward(g, x, w, None, list(plan.stride), list(plan.padding),
                                                   list(plan.dilation), True, list(plan.output_padding),
                                                   plan.groups, mask)

    for name, fn in [("grad_weight, aten", lambda: aten([False, True, False])),
                     ("grad_weight, phases", lambda: conv_transpose3d_backward(g, x, w, plan, False, True)),
                     ("grad_input, aten", lambda: aten([True, False, False])),
                     ("grad_input, phases", lambda: conv_transpose3d_backward(g, x, w, plan, True, False))]:
        print(f"{name:20s} {mean_ms(fn, args.repeats):8.2f} ms")
    (gi_a, gw_a, _), (gi_p, gw_p) = aten([True, True, False]), conv_transpose3d_backward(g, x, w, plan)
    print(f"relative difference: grad_input {((gi_p - gi_a).norm() / gi_a.norm()).item():.1e}, "
          f"grad_weight {((gw_p - gw_a).norm() / gw_a.norm()).item():.1e}")


if __name__ == "__main__":
    main()
