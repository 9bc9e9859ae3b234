"""Host time of convt3d's two autograd.Function styles (CPU): the plain one eager calls use, and its
setup_context twin that torch.func's transforms require, each forward+backward of a tiny layer through PyTorch's
own kernel, so that the figure is the Python and autograd around it.

    PYTHONPATH=src python3 benchmarks/cpu_function_styles.py
"""

import statistics
import time

import torch

from convt3d import ops
from convt3d.ops import cached_plan


def main():
    torch.set_num_threads(1)
    x = torch.rand(1, 2, 2, 2, 2, requires_grad=True)
    w = torch.rand(2, 2, 3, 3, 3, requires_grad=True)
    plan = cached_plan(tuple(x.shape), tuple(w.shape), (2,) * 3, (1,) * 3, (0,) * 3, 1, (2,) * 3)
    styles = {"plain (eager calls)": ops._EagerConvTranspose3d,
              "setup_context (under torch.func)": ops._TransformableConvTranspose3d}
    samples = {name: [] for name in styles}
    for round_ in range(8):
        for name, function in styles.items():
            t0 = time.perf_counter()
            for _ in range(1000):
                function.apply(x, w, None, plan, "eager").sum().backward()
            if round_:  # the first round warms up
                samples[name].append((time.perf_counter() - t0) * 1e3)
    for name, times in samples.items():
        print(f"{name:34s} {statistics.median(times):6.1f} us per forward+backward (median of 7 rounds of 1000)")


if __name__ == "__main__":
    main()
