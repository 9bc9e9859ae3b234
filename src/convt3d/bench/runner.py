"""Run the protocol over implementations of one layer and return table rows."""

from __future__ import annotations

import contextlib
import copy
import gc
import logging
import time
from contextlib import nullcontext
from typing import Callable

import torch

from ..module import convert
from .protocol import (
    Timing,
    datasheet_bandwidth,
    floor_bytes,
    host_time_cuda,
    kernelbench_check,
    relative_error,
    time_cpu,
    time_cuda,
)
from .workloads import DTYPES, Layer

TRIALS = 5


def _tf32(enabled: bool):
    return torch.backends.cudnn.flags(enabled=True, allow_tf32=enabled)


def _row(name: str, timing: Timing | None, **extra) -> dict:
    row = dict(implementation=name, mean_ms=None, std_ms=None, min_ms=None, max_ms=None, speedup_vs_eager=None,
               ratio_to_floor=None, rel_err_fp64=None, kernelbench_check=None)
    if timing is not None:
        row.update(mean_ms=timing.mean_ms, std_ms=timing.std_ms, min_ms=timing.min_ms, max_ms=timing.max_ms)
        if timing.median_ms is not None:
            row["median_ms"] = timing.median_ms
        if timing.device_allocations is not None:
            row["device_allocations"] = timing.device_allocations
        if timing.host_median_ms is not None:
            row["timed_host_ms"] = timing.host_median_ms
        if timing.slow_calls:
            row["slow_calls"] = [dict(call=i, ms=ms, host_ms=host, gc_generation=generation)
                                 for i, ms, host, generation in timing.slow_calls]
    row.update(extra)
    return row


# Seconds the GPU machine's host is left idle between a layer's checks and its timings. Its Python and C++ ran up to
# twice as slow for a few seconds after the checks' compiling and autotuning (benchmarks/diag_slow_host.py, thirty-
# fourth session: a pure-Python probe 1.1 -> 2.1 us, eager's module call 50 -> 84 us, back to 1.3 and 53 after 3 s
# idle), which fell on whichever implementation was timed next, most often convt3d's right after its own first call.
SETTLE_S = 3.0


def run_layer(layer: Layer, device: torch.device, backward: bool = False, compile: bool = True,
              iters: int | None = None, log=lambda msg: None, settle_s: float | None = None) -> list[dict]:
    """All rows for one layer. On the CPU: eager and convt3d only, wall-clock timing. Every implementation is
    checked first (its first calls compile and autotune), then, after settle_s seconds idle (SETTLE_S on CUDA,
    none on the CPU by default), each is timed."""
    dtype = DTYPES[layer.dtype]
    on_gpu = device.type == "cuda"
    torch.manual_seed(0)
    eager = layer.module().to(device=device, dtype=dtype)
    ours = convert(copy.deepcopy(eager))
    fp32 = dtype == torch.float32

    # The fused kernel and the portable phase path on their own, whichever backend "auto" picks.
    triton_only = convert(copy.deepcopy(eager), backend="triton")
    torch_only = convert(copy.deepcopy(eager), backend="torch")

    # (name, callable, TF32 allowed?)
    impls: list[tuple[str, Callable, bool]] = [("PyTorch eager", eager, True)]
    if on_gpu and compile:
        impls.append(("torch.compile (inductor)", torch.compile(eager), True))
    impls.append(("convt3d", ours, True))
    if on_gpu:
        impls += [("convt3d, backend=triton", triton_only, True), ("convt3d, backend=torch", torch_only, True)]
    if on_gpu and fp32:
        impls += [("PyTorch eager, TF32 off", eager, False), ("convt3d, TF32 off", ours, False),
                  ("convt3d, backend=triton, TF32 off", triton_only, False)]

    rows = []
    with torch.no_grad():
        checked = []
        for name, fn, tf32 in impls:
            with _decisions() as decisions:
                log(f"{name}: checking")
                checked.append((*_correctness(layer, fn, eager, dtype, device, tf32 if on_gpu else None), decisions))
        settle_s = (SETTLE_S if on_gpu else 0.0) if settle_s is None else settle_s
        if settle_s > 0:
            # The checks' compiles and autotuning leave garbage, which Python's collector otherwise took inside some
            # timed call (3.9 ms in one of video_spatial_k144's, forty-second session). Collected here, before the
            # idle, so that the host's slow spell after a collection falls in the idle too: that row's 1-1.7 ms calls
            # went, and no row gained calls of that size (benchmarks/diag_collections.py, forty-third session).
            gc.collect()
            log(f"leaving the host idle for {settle_s:g} s")
            time.sleep(settle_s)
        for (name, fn, tf32), (check, err, decisions) in zip(impls, checked):
            log(f"{name}: timing")
            x = torch.rand(layer.input_shape, device=device, dtype=dtype)
            with _tf32(tf32) if on_gpu else nullcontext():
                timing = _time(lambda: fn(x), on_gpu, iters)
                # The host's share: a timed call starts on an idle GPU after the L2 flush, and once its host time
                # exceeds the flush's GPU time the GPU waits for it. Measured here, beside the timing, so that a
                # slow host can be told apart from slow code.
                host = host_time_cuda(lambda: fn(x), calls=iters or 100) if on_gpu else None
            extra = dict(decisions=decisions) if decisions else {}
            if host is not None:
                extra["host_ms"] = host
            rows.append(_row(name, timing, rel_err_fp64=err, kernelbench_check=check, **extra))
        out_shape = layer.plan().output_shape
        if on_gpu:
            buf = torch.empty(out_shape, device=device, dtype=dtype)
            rows.append(_row("floor: write the output once (measured)", _time(buf.zero_, True, iters)))
            found = datasheet_bandwidth(torch.cuda.get_device_name(device))
            if found is not None:
                nbytes = floor_bytes(layer.input_shape, layer.weight_shape(), out_shape, layer.bias, buf.element_size())
                ms = nbytes / found[1] * 1e3
                label = f"floor: input+weight+output bytes / {found[1] / 1e12:.1f} TB/s ({found[0]} datasheet)"
                rows.append(_row(label, Timing(ms, 0.0, ms, ms)))
    if backward:
        rows += _backward_rows(layer, eager, ours, dtype, device, iters)
    _relate(rows)
    return rows


@contextlib.contextmanager
def _decisions():
    """The choices convt3d logs (at debug level) while the block runs: which backend `auto` took, which Triton tile
    config the autotuner kept and its candidates' times. Made on a layer's first call in each mode, they go into the
    row of the implementation that made them, so that a figure can be read with what produced it."""
    messages = []

    class Collect(logging.Handler):
        def emit(self, record):
            messages.append(record.getMessage())

    logger = logging.getLogger("convt3d")
    handler, level, propagate = Collect(logging.DEBUG), logger.level, logger.propagate
    # Debug lines the caller's logging would not have shown stay here (handlers up the tree see every level).
    logger.propagate = propagate and logger.isEnabledFor(logging.DEBUG)
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield messages
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate


def _time(fn, on_gpu: bool, iters: int | None) -> Timing:
    if on_gpu:
        return time_cuda(fn, iters=iters or 100)
    return time_cpu(fn, iters=iters or 5)


def _correctness(layer, fn, eager, dtype, device, tf32):
    """KernelBench's check against the eager module (same precision flags) on fresh inputs, and the float64 error."""
    passed, worst = True, 0.0
    weight64 = eager.weight.detach().double()
    bias64 = eager.bias.detach().double() if eager.bias is not None else None
    for _ in range(TRIALS):
        x = torch.rand(layer.input_shape, device=device, dtype=dtype)
        with _tf32(tf32) if tf32 is not None else nullcontext():
            expected, actual = eager(x), fn(x)
        reference = torch.nn.functional.conv_transpose3d(
            x.double(), weight64, bias64, eager.stride, eager.padding, eager.output_padding, eager.groups,
            eager.dilation)
        passed &= kernelbench_check(actual, expected)
        worst = max(worst, relative_error(actual, reference))
    return passed, worst


def _backward_rows(layer, eager, ours, dtype, device, iters):
    on_gpu = device.type == "cuda"
    x = torch.rand(layer.input_shape, device=device, dtype=dtype, requires_grad=True)
    grad = torch.rand(layer.plan().output_shape, device=device, dtype=dtype)
    rows = []
    for name, fn in (("PyTorch eager, forward+backward", eager), ("convt3d, forward+backward", ours)):
        def step():
            fn(x).backward(grad)
        rows.append(_row(name, _time(step, on_gpu, iters)))
    return rows


def _relate(rows: list[dict]) -> None:
    """Fill speed-up over eager (default precision) and ratio to the measured floor."""
    eager = next(r["mean_ms"] for r in rows if r["implementation"] == "PyTorch eager")
    eager_bwd = next((r["mean_ms"] for r in rows if r["implementation"] == "PyTorch eager, forward+backward"), None)
    floor = next((r["mean_ms"] for r in rows if r["implementation"].startswith("floor: write")), None)
    for r in rows:
        base = eager_bwd if "forward+backward" in r["implementation"] else eager
        r["speedup_vs_eager"] = base / r["mean_ms"]
        if floor is not None and "forward+backward" not in r["implementation"]:
            r["ratio_to_floor"] = r["mean_ms"] / floor
