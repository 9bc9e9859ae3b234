"""Host time of a module call that runs eager's kernel with parameters that require grad: recorded by convt3d's
autograd.Function (the path before the thirty-third session, and still the CPU's) or by PyTorch's own autograd (what
ops.apply does on CUDA where the backward would be aten's), beside nn.ConvTranspose3d itself; and the same three
under torch.no_grad (no node at all), as the benchmark calls them. "auto" is made to choose eager's kernel, as it did
for batch1_small_k3s2 on the H200. On the CPU a tiny layer, so that the figure is the Python and autograd around the
kernel; with --device cuda the sweep's batch1_small_k3s2, each call's host time from a synchronisation to its return
(median), the GPU idle at its start as in the benchmark.

    PYTHONPATH=src python3 benchmarks/cpu_eager_autograd.py [--device cuda]
"""

import argparse
import statistics
import time

import torch

import convt3d
from convt3d import ops
from convt3d.bench.protocol import host_time_cuda
from convt3d.bench.workloads import sweep_layers


def per_call_us(module, x, calls=2000):
    t0 = time.perf_counter()
    for _ in range(calls):
        module(x)
    return (time.perf_counter() - t0) / calls * 1e6


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    device = parser.parse_args().device
    if device == "cpu":
        torch.set_num_threads(1)
        x = torch.rand(1, 4, 2, 2, 2)
        eager = torch.nn.ConvTranspose3d(4, 4, 3, stride=2, padding=1, output_padding=1)
        timer = per_call_us
    else:
        (layer,) = sweep_layers("batch1_small_k3s2")
        torch.manual_seed(0)
        eager = layer.module().to(device)
        x = torch.rand(layer.input_shape, device=device)
        timer = lambda module, x: host_time_cuda(lambda: module(x), calls=300) * 1e3  # noqa: E731
    ours = convt3d.convert(type(eager)(eager.in_channels, eager.out_channels, eager.kernel_size, eager.stride,
                                       eager.padding, eager.output_padding).to(device))
    ours.load_state_dict(eager.state_dict())
    convt3d.functional.choose_backend = lambda *args: "eager"
    forms = {"nn.ConvTranspose3d": (eager, None), "convt3d, its autograd.Function": (ours, False),
             "convt3d, PyTorch's autograd": (ours, True)}
    samples = {(name, grad): [] for name in forms for grad in (True, False)}
    for round_ in range(16 if device == "cpu" else 6):
        for (name, grad) in samples:
            module, eager_autograd = forms[name]
            ops._eager_autograd_serves = lambda input, plan: eager_autograd
            with torch.set_grad_enabled(grad):
                us = timer(module, x)
            if round_:  # the first round warms up
                samples[name, grad].append(us)
    for (name, grad), times in samples.items():
        if grad or name != "convt3d, PyTorch's autograd":  # without grad, the two convt3d forms are one path
            print(f"{name + ('' if grad else ', no_grad'):42s} median {statistics.median(times):6.1f} us, "
                  f"min {min(times):6.1f} us a call ({len(times)} rounds)")


if __name__ == "__main__":
    main()
