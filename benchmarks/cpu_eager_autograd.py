"""Host time (CPU) of a module call that runs eager's kernel with parameters that require grad: recorded by convt3d's
autograd.Function (the path before the thirty-third session, and still the CPU's) or by PyTorch's own autograd (what
ops.apply does on CUDA where the backward would be aten's), beside nn.ConvTranspose3d itself. A tiny layer, so that
the figure is the Python and autograd around the kernel; "auto" is made to choose eager's kernel, as it did for
batch1_small_k3s2 on the H200.

    PYTHONPATH=src python3 benchmarks/cpu_eager_autograd.py
"""

import statistics
import time

import torch

import convt3d
from convt3d import ops


def per_call_us(module, x, calls=2000):
    t0 = time.perf_counter()
    for _ in range(calls):
        module(x)
    return (time.perf_counter() - t0) / calls * 1e6


def main():
    torch.set_num_threads(1)
    x = torch.rand(1, 4, 2, 2, 2)
    eager = torch.nn.ConvTranspose3d(4, 4, 3, stride=2, padding=1, output_padding=1)
    ours = convt3d.convert(torch.nn.ConvTranspose3d(4, 4, 3, stride=2, padding=1, output_padding=1))
    ours.load_state_dict(eager.state_dict())
    convt3d.functional.choose_backend = lambda *args: "eager"
    forms = {"nn.ConvTranspose3d": (eager, None), "convt3d, its autograd.Function": (ours, False),
             "convt3d, PyTorch's autograd": (ours, True)}
    samples = {name: [] for name in forms}
    for round_ in range(16):
        for name, (module, eager_autograd) in forms.items():
            ops._eager_autograd_serves = lambda input, plan: eager_autograd
            if round_:  # the first round warms up
                samples[name].append(per_call_us(module, x))
    for name, times in samples.items():
        print(f"{name:32s} median {statistics.median(times):5.1f} us, min {min(times):5.1f} us a call (15 rounds)")


if __name__ == "__main__":
    main()
