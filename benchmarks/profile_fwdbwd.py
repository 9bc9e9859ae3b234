"""Where problem 77's forward+backward spends its time (GPU): host time to issue each call against its device
time, any call that synchronises with the GPU, the Python functions that take the host time (cProfile), and the
kernels under torch.profiler.

    PYTHONPATH=src python3 benchmarks/profile_fwdbwd.py [--calls 10]

Host time is measured from a synchronised start to the call's return, without the profiler (median); when it
exceeds the device time, the GPU waits on Python and the cold-L2 timings measure host time, not kernels.
"""

import argparse
import cProfile
import pstats
import warnings

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from convt3d.bench.protocol import FLUSH_BYTES, host_time_cuda, time_cuda
from convt3d.bench.workloads import PROBLEM_77
from convt3d.ops import conv_transpose3d_backward_op


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=10)
    args = parser.parse_args()
    eager, ours, x, grad = PROBLEM_77.training_case("cuda")
    w = ours.weight.detach()
    cases = {
        "eager forward": lambda: eager(x.detach()),
        "convt3d forward": lambda: ours(x.detach()),
        "eager forward+backward": lambda: eager(x).backward(grad),
        "convt3d forward+backward": lambda: ours(x).backward(grad),
        "convt3d backward op": lambda: conv_transpose3d_backward_op(grad, x.detach(), w, [2] * 3, [1] * 3, [0] * 3,
                                                                    1, [2] * 3, True, True),
    }
    # The phase's compact convolution both ways cuDNN can run it (torch_phase.PHASE_CONV_TRANSPOSED).
    from convt3d.backends import torch_phase as tp

    (phase,) = PROBLEM_77.plan().nonempty_phases
    wp = tp._phase_weight(w, phase.axes, 1)
    cases["compact conv3d (flipped weight ready)"] = lambda: torch.nn.functional.conv3d(x.detach(), wp, None, 1, 1, 1)
    cases["compact conv_transpose3d, stride 1"] = lambda: torch.nn.functional.conv_transpose3d(
        x.detach(), w, None, 1, 1, 0, 1, 1)
    for fn in cases.values():
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    print(f"{'call':40s} {'host ms':>8s} {'cold mean ms':>12s}")
    for name, fn in cases.items():
        host, cold = host_time_cuda(fn, args.calls), time_cuda(fn, iters=args.calls).mean_ms
        print(f"{name:40s} {host:8.3f} {cold:12.3f}", flush=True)

    # Calls that synchronise with the GPU, named by PyTorch's sync debug mode.
    for name in ("convt3d forward", "convt3d forward+backward"):
        torch.cuda.set_sync_debug_mode("warn")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            cases[name]()
        torch.cuda.set_sync_debug_mode(0)
        print(f"\n{name}: {len(caught)} synchronising calls")
        for item in caught[:8]:
            print("  ", str(item.message)[:200], f"({item.filename}:{item.lineno})")

    # Where the host time goes, by Python function (the GPU runs ahead: only issue time is counted).
    profiler = cProfile.Profile()
    for _ in range(args.calls):
        torch.cuda.synchronize()  # as the benchmark: each call starts on an idle GPU, none waits for a full queue
        profiler.enable()
        cases["convt3d forward+backward"]()
        profiler.disable()
    torch.cuda.synchronize()
    print(f"\nconvt3d forward+backward, Python profile of {args.calls} calls (host time, by own time):")
    pstats.Stats(profiler).sort_stats("tottime").print_stats(30)

    flush = torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(args.calls):
            flush.fill_(1)
            cases["convt3d forward+backward"]()
        torch.cuda.synchronize()
    events = prof.key_averages()
    # Device time is counted on the operators (their kernels' rows would count it twice), as the table's total.
    device_ms = sum(e.self_device_time_total for e in events if e.device_type == DeviceType.CPU) / 1e3
    print(f"\nconvt3d forward+backward, device time per call (flush included): {device_ms / args.calls:.3f} ms")
    print(events.table(sort_by="self_device_time_total", row_limit=16, max_name_column_width=60))
    print(events.table(sort_by="cpu_time_total", row_limit=30, max_name_column_width=60))


if __name__ == "__main__":
    main()
