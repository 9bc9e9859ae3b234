"""Host time (2-core CPU) of the Triton forward's Python around its launches: a module call through the prepared
call (backends.triton._prepared, what later calls of a layer take) against the whole path (checks, lookups, layout
arithmetic: what every call took before), interleaved in one process. No GPU here: the kernels are neither compiled
nor run. Each launch stops where it would call Triton's launcher (the direct launch that launch._direct makes
around compiled.run, replaced by a no-op), so the launcher's Python above it (launch.BoundLaunch) counts; the current
device and stream are stood in for.

    PYTHONPATH=src python3 benchmarks/cpu_triton_host.py
"""

import statistics
import time

import torch

import convt3d
import convt3d.backends.triton as triton_backend
from convt3d.backends.triton import forward, launch, tiled


def fake_launches():
    launch._current_device = lambda: 0
    launch._current_stream = lambda device: 0
    launch._no_launch_hooks = lambda: True
    real_call = launch.BoundLaunch.__call__

    def call(bound, pointers):
        key = (0, *[(t.dtype, t.data_ptr() % 16 == 0) for t in pointers])
        bound._compiled.setdefault(key, (None, lambda *args: None))
        return real_call(bound, pointers)

    launch.BoundLaunch.__call__ = call
    triton_backend.unsupported_reason = lambda input, plan: None  # CPU tensors, no interpreter
    for module in (forward, tiled):  # the first config, remembered as the autotuner would
        module.pick_config = lambda cache, key, candidates, run, device: cache.setdefault(key, candidates[0])


def per_call_us(fn, calls=2000):
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


def main():
    fake_launches()
    torch.set_num_threads(1)
    layers = {
        "k2 s2 (tiled)": (nn_layer(16, 8, 2, 2, 0, 0), torch.rand(1, 16, 2, 4, 4)),
        "k3 s2 p1 op1 (general)": (nn_layer(16, 8, 3, 2, 1, 1), torch.rand(1, 16, 2, 4, 4)),
    }
    prepare = {forward: forward.prepare, tiled: tiled.prepare}
    samples = {(name, form): [] for name in layers for form in ("whole path", "prepared call")}
    with torch.no_grad():
        for round_ in range(12):
            for (name, form), times in samples.items():
                module, x = layers[name]
                triton_backend._prepared.clear()
                for kernel_module, real in prepare.items():
                    kernel_module.prepare = real if form == "prepared call" else (lambda *args: None)
                module(x)  # the first call: the whole path, and the prepared call made where enabled
                us = per_call_us(lambda: module(x))
                if round_:  # the first round warms up
                    times.append(us)
    for (name, form), times in samples.items():
        print(f"{name:24s} {form:14s} median {statistics.median(times):5.1f} us, min {min(times):5.1f} us a module "
              f"call ({len(times)} rounds)")


def nn_layer(c_in, c_out, kernel, stride, padding, output_padding):
    return convt3d.convert(torch.nn.ConvTranspose3d(c_in, c_out, kernel, stride=stride, padding=padding,
                                                    output_padding=output_padding), backend="triton")


if __name__ == "__main__":
    main()
