"""Why problem 77's forward+backward measures longer than the sum of its kernels (GPU).

    PYTHONPATH=src python3 benchmarks/trace_fwdbwd.py [--calls 10] [--trace DIR] [--only forward+backward,...]

Runs the benchmark's loop (synchronisation, L2 flush, start event, call, end event) for
eager and convt3d, and reports per call: the event-timed mean, the caching allocator's device allocations and
frees in the loop (cudaFree synchronises the device), and from a torch.profiler trace of the same loop, per
call, the span from the L2 flush's end to the last kernel's end against the kernel time in it, with the largest
idle gaps inside calls and whether the host launched the kernel after a gap late (the GPU waited on the host)
or early (the GPU waited on something else).
"""

import argparse
import json
import os
import tempfile

import torch
from torch.profiler import ProfilerActivity, profile

from convt3d.bench.protocol import FLUSH_BYTES
from convt3d.bench.workloads import PROBLEM_77

ALLOCATOR_COUNTERS = ("num_device_alloc", "num_device_free", "num_alloc_retries", "num_sync_all_streams")


def loop(fn, flush, calls):
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(calls)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(calls)]
    for start, end in zip(starts, ends):
        torch.cuda.synchronize()  # as bench.protocol.time_cuda (KernelBench): each call starts on an idle GPU
        torch.cuda._sleep(1)  # a marker kernel ("spin_kernel") that tells the calls apart in the trace
        flush.fill_(1)
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return sum(s.elapsed_time(e) for s, e in zip(starts, ends)) / calls


def gaps(trace_path):
    """Per call, from a chrome trace of loop(): the span from the end of the L2 flush to the end of the call's last
    kernel, the kernel time in it, and the largest idle gaps inside calls."""
    with open(trace_path) as f:
        events = json.load(f)["traceEvents"]
    kernels = sorted((e for e in events if e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy")),
                     key=lambda e: e["ts"])
    launches = {e["args"]["correlation"]: e for e in events
                if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
    calls, current = [], None
    for k in kernels:
        if "spin_kernel" in k["name"]:
            current = []
            calls.append(current)
        elif current is not None:
            current.append(k)
    spans, busy, idle = [], [], []
    for call in calls:
        work = call[1:]  # call[0] is the flush
        if not work:
            continue
        spans.append(work[-1]["ts"] + work[-1]["dur"] - (call[0]["ts"] + call[0]["dur"]))
        busy.append(sum(k["dur"] for k in work))
        for prev, nxt in zip(call, work):
            gap = nxt["ts"] - (prev["ts"] + prev["dur"])
            launch = launches.get(nxt["args"].get("correlation"))
            # The launch call's end against the previous kernel's end: positive means the host was late.
            late = None if launch is None else (launch["ts"] + launch["dur"]) - (prev["ts"] + prev["dur"])
            idle.append((gap, late, prev["name"][:50], nxt["name"][:50]))
    n = max(1, len(spans))
    print(f"  per call: span {sum(spans) / n / 1e3:.3f} ms, kernels {sum(busy) / n / 1e3:.3f} ms, "
          f"idle {(sum(spans) - sum(busy)) / n / 1e3:.3f} ms ({len(spans)} calls)")
    for gap, late, prev, nxt in sorted(idle, key=lambda item: item[0], reverse=True)[:10]:
        who = "?" if late is None else ("host late by %.1f us" % late if late > 0 else "launched %.1f us early" % -late)
        print(f"  gap {gap:7.1f} us ({who}): {prev} -> {nxt}")
    # The call of median span, kernel by kernel, times in us from the flush's end: when the host's launch call
    # returned, when the kernel started, how long it ran.
    spans_by_call = [(span, call) for span, call in zip(spans, (c for c in calls if len(c) > 1))]
    span, call = sorted(spans_by_call, key=lambda item: item[0])[len(spans_by_call) // 2]
    zero = call[0]["ts"] + call[0]["dur"]
    print(f"  the median call ({span:.0f} us): launched / started / ran, us")
    for k in call[1:]:
        launch = launches.get(k["args"].get("correlation"))
        launched = "?" if launch is None else f"{launch['ts'] + launch['dur'] - zero:7.0f}"
        print(f"    {launched:>7s} {k['ts'] - zero:7.0f} {k['dur']:6.0f}  {k['name'][:70]}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--trace", default=None, help="directory for the chrome traces (default: a temporary one)")
    parser.add_argument("--only", default="", help="comma-separated words: run only the cases whose names have one")
    args = parser.parse_args()
    eager, ours, x, grad = PROBLEM_77.training_case("cuda")
    flush = torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    cases = {
        "eager forward+backward": lambda: eager(x).backward(grad),
        "convt3d forward+backward": lambda: ours(x).backward(grad),
        "eager forward": lambda: eager(x.detach()),
        "convt3d forward": lambda: ours(x.detach()),
    }
    folder = args.trace or tempfile.mkdtemp()
    words = [w for w in args.only.split(",") if w]
    for name, fn in cases.items():
        if words and not any(w in name for w in words):
            continue
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        before = torch.cuda.memory_stats()
        mean = loop(fn, flush, 3 * args.calls)
        after = torch.cuda.memory_stats()
        counts = ", ".join(f"{c} +{after.get(c, 0) - before.get(c, 0)}" for c in ALLOCATOR_COUNTERS)
        print(f"\n{name}: event-timed mean {mean:.3f} ms over {3 * args.calls} calls; allocator: {counts}")
        # CUDA activity only (kernels and runtime calls): recording every CPU operator would slow the host.
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            loop(fn, flush, args.calls)
        path = os.path.join(folder, name.replace(" ", "_").replace("+", "_") + ".json")
        prof.export_chrome_trace(path)
        gaps(path)


if __name__ == "__main__":
    main()
