"""KernelBench's measuring protocol, and the floor model.

Correctness: 5 trials with fresh torch.rand inputs, torch.allclose(atol=rtol=1e-4; 1e-2 for half) against the
eager module, and the relative error against a float64 reference. Timing on CUDA, as KernelBench's default
(cuda_event): 5 warm-up calls, then 100 timed calls, each after a synchronisation and an L2 flush (a 256 MB
buffer written on the GPU), with CUDA events around it. On the CPU: wall clock, warm-up, repeats.
"""

from __future__ import annotations

import contextlib
import gc
import math
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch

# KernelBench's allclose tolerance by precision: 1e-4 for float32; half-precision outputs differ by an ulp
# (1e-3 relative) between any two correct kernels, so it uses 1e-2 for them.
KERNELBENCH_TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 1e-2}
FLUSH_BYTES = 256 * 1024 * 1024
# HBM3e bandwidth of the H200 by NVIDIA's datasheet; other GPUs are named but not modelled.
DATASHEET_BANDWIDTH = {"H200": 4.8e12, "H100": 3.35e12, "A100": 2.0e12}
# Timing.slow_calls: a call counts as slow above SLOW times the fastest; at most SLOW_CALLS are kept.
SLOW = 2.0
SLOW_CALLS = 10


@dataclass
class Timing:
    mean_ms: float
    std_ms: float
    min_ms: float
    max_ms: float
    # CUDA: memory the caching allocator had to take from or give back to the driver during the timed calls
    # (cudaMalloc / cudaFree, which synchronise); nonzero means the timings include such calls.
    device_allocations: int | None = None
    # CUDA: the calls that took more than SLOW times the fastest, slowest first (at most SLOW_CALLS of them), as
    # (index among the timed calls, ms, host ms from the call to its return, the oldest generation that Python's
    # garbage collector collected during the call or None). A slow call whose host time is about its CUDA time
    # waited for the host (Python, a garbage collection, the machine); one with little host time was slow on the GPU.
    slow_calls: list[tuple[int, float, float, int | None]] | None = None
    # The median call: unlike the mean (KernelBench's figure), it does not move with a few slow calls.
    median_ms: float | None = None
    # CUDA: the median host time of the timed calls themselves, from the call to its return. A slow spell of the host
    # during the timing shows here even where every call was slow, so that none is listed in slow_calls.
    host_median_ms: float | None = None

    @classmethod
    def of(cls, samples_ms: list[float], host_ms: list[float] | None = None,
           collected: list[int | None] | None = None, **extra) -> "Timing":
        std = statistics.stdev(samples_ms) if len(samples_ms) > 1 else 0.0
        fastest = min(samples_ms)
        if host_ms is not None:
            collected = collected or [None] * len(samples_ms)
            slow = sorted((i for i, ms in enumerate(samples_ms) if ms > SLOW * fastest), key=lambda i: -samples_ms[i])
            extra["slow_calls"] = [(i, samples_ms[i], host_ms[i], collected[i]) for i in slow[:SLOW_CALLS]]
            extra["host_median_ms"] = statistics.median(host_ms)
        return cls(statistics.fmean(samples_ms), std, fastest, max(samples_ms), median_ms=statistics.median(samples_ms),
                   **extra)


def time_cuda(fn: Callable[[], object], warmup: int = 5, iters: int = 100, device=None,
              flush_bytes: int = FLUSH_BYTES, synchronize: bool = True) -> Timing:
    """CUDA events around each call, the L2 flushed (flush_bytes written on the GPU) before each.

    synchronize=True is KernelBench's default timing (its `time_execution_with_cuda_event`): the host waits for
    the GPU before each call, so a call starts on an idle GPU and its time includes whatever the GPU waits for
    the host (Python, launches) within the call. synchronize=False queues the calls back to back (Triton's
    do_bench): host time then hides behind the GPU work of earlier calls, and the figure is the GPU's.
    """
    device = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    # On the GPU: a flush buffer left on the CPU would evict nothing from the L2 (this was the case here until
    # 2026-11-30, fifth session: benchmarks/RESULTS.md).
    flush = torch.empty(flush_bytes // 4, dtype=torch.int32, device=device)
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize(device)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    host_ms = []  # each call's, from the call to its return: it tells a slow host from a slow GPU (Timing.slow_calls)
    collected = [None] * iters  # the oldest generation the garbage collector collected during each call
    calling = None  # the index of the call running, if one is

    def on_collection(phase, info):
        if phase == "start" and calling is not None:
            collected[calling] = max(info["generation"], collected[calling] or 0)

    gc.callbacks.append(on_collection)
    try:
        before = _driver_allocations(device)
        for call, (start, end) in enumerate(zip(starts, ends)):
            if synchronize:
                torch.cuda.synchronize(device)
            flush.fill_(1)
            start.record()
            calling, t0 = call, time.perf_counter()
            fn()
            host_ms.append((time.perf_counter() - t0) * 1e3)
            calling = None
            end.record()
        torch.cuda.synchronize(device)
    finally:
        gc.callbacks.remove(on_collection)
    return Timing.of([s.elapsed_time(e) for s, e in zip(starts, ends)], host_ms, collected,
                     device_allocations=_driver_allocations(device) - before)


def host_time_cuda(fn: Callable[[], object], calls: int = 100) -> float:
    """Median host time in ms of one call that starts on an idle GPU: from a synchronisation to the call's
    return (its GPU work after the return not counted)."""
    samples = []
    for _ in range(calls):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    return statistics.median(samples)


def _driver_allocations(device) -> int:
    # Segments are what the caching allocator takes from (cudaMalloc) and gives back to (cudaFree) the driver:
    # PyTorch's documented counters (torch 2.11 also counts them as num_device_alloc / num_device_free).
    stats = torch.cuda.memory_stats(device)
    return stats["segment.all.allocated"] + stats["segment.all.freed"]


def time_cpu(fn: Callable[[], object], warmup: int = 1, iters: int = 5) -> Timing:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    return Timing.of(samples)


def time_interleaved(fns: dict[str, Callable[[], object]], repeats: int, warmup: int = 1) -> dict[str, list[float]]:
    """Wall-clock ms of each named callable, called in turn each round so that machine noise hits all alike."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - t0) * 1e3)
    return times


@contextlib.contextmanager
def nan_poisoned_allocations():
    """Within it, every floating-point torch.empty and Tensor.new_empty comes NaN-filled, so that an output element a
    kernel leaves unwritten shows in the checks (integer buffers, such as Triton's do_bench's, stay as they are)."""
    def poisoning(allocate):
        def poisoned(*args, **kwargs):
            t = allocate(*args, **kwargs)
            return t.fill_(float("nan")) if t.is_floating_point() else t
        return poisoned

    empty, new_empty = torch.empty, torch.Tensor.new_empty
    torch.empty, torch.Tensor.new_empty = poisoning(empty), poisoning(new_empty)
    try:
        yield
    finally:
        torch.empty, torch.Tensor.new_empty = empty, new_empty


def relative_error(actual: torch.Tensor, reference64: torch.Tensor) -> float:
    """||actual - ref|| / ||ref|| in float64."""
    diff = actual.double() - reference64
    return (diff.norm() / reference64.norm()).item()


def kernelbench_check(actual: torch.Tensor, expected: torch.Tensor) -> bool:
    tolerance = KERNELBENCH_TOLERANCE[expected.dtype]
    return bool(torch.allclose(actual, expected, atol=tolerance, rtol=tolerance))


def floor_bytes(input_shape, weight_shape, output_shape, bias: bool, element_size: int) -> int:
    """Fewest bytes any implementation moves: input and weight read once, output written once."""
    elements = math.prod(input_shape) + math.prod(weight_shape) + math.prod(output_shape)
    return (elements + (output_shape[1] if bias else 0)) * element_size


def datasheet_bandwidth(device_name: str) -> tuple[str, float] | None:
    """(name, bytes/s) of the GPU's datasheet memory bandwidth, where we know it."""
    for key, bandwidth in DATASHEET_BANDWIDTH.items():
        if key in device_name:
            return key, bandwidth
    return None
