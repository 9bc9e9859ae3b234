"""Host time of a convt3d module call above the Triton backend's prepared call, on the CPU.

    PYTHONPATH=src python3 benchmarks/cpu_module_call.py [--device cuda]

A backend="triton" module (the kernels in Triton's interpreter, TRITON_INTERPRET=1) whose prepared call
(backends.triton._prepared) is replaced by a function returning a tensor made beforehand: what is timed is the Python
from the module's call to that call, under no_grad and in grad mode (parameters requiring grad, as modules have them),
and eager's module for scale. Each figure is the fastest of 40 batches of 1,000 calls, per call. Compare code versions
in alternating processes (PYTHONPATH=<old>/src, then <new>/src). --device cuda: the same on a GPU machine's host, the
first call running the kernels natively (there Triton 3.6's interpreter fails with NumPy 2.5, and the host is the
one whose time KernelBench's timing counts).
"""

import argparse
import os

# Parsed before torch and Triton are imported: the interpreter must be chosen before any kernel is defined.
parser = argparse.ArgumentParser()
parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
DEVICE = parser.parse_args().device
if DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")

import time  # noqa: E402

import torch  # noqa: E402

import convt3d.backends.triton as triton_backend  # noqa: E402
from convt3d import convert, functional  # noqa: E402


def per_call_us(fn, batches=40, calls=1000):
    best = float("inf")
    for _ in range(batches):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls)
    return best * 1e6


def main(device: str):
    torch.manual_seed(0)
    eager = torch.nn.ConvTranspose3d(8, 4, 3, stride=2, padding=1, output_padding=1).to(device)
    ours = convert(torch.nn.ConvTranspose3d(8, 4, 3, stride=2, padding=1, output_padding=1), backend="triton")
    ours.to(device)
    x = torch.rand(1, 8, 3, 4, 4, device=device)
    with torch.no_grad():
        out = ours(x)  # the whole way once
        plan = functional.validate(x, ours.weight, ours.bias, ours.stride, ours.padding, ours.output_padding,
                                   ours.groups, ours.dilation)[1]
        key = (plan, x.dtype, x.device, triton_backend.precision_for(x.dtype), True)
        triton_backend._prepared[key] = lambda input, weight, bias: out
        ours.__dict__.pop("_bound_forwards", None)  # (where the library has them: bound again to the stand-in)
        ours(x), ours(x)
        print(f"convt3d module, no_grad: {per_call_us(lambda: ours(x)):.2f} us")
    print(f"convt3d module, grad mode: {per_call_us(lambda: ours(x)):.2f} us")
    with torch.no_grad():
        print(f"nn.ConvTranspose3d (its kernel included), no_grad: {per_call_us(lambda: eager(x)):.2f} us")


if __name__ == "__main__":
    main(DEVICE)
