"""Why a bench row's first timed call is slow (GPU machine).

In the forty-eighth session (benchmarks/RESULTS.md) 13 of the 14 rows of a five-layer bench that record slow calls,
and 32 of 37 and 38 of 43 in the forty-seventh session's sweeps, had their first timed call above twice their
fastest, with 0.08-0.16 ms of host time against about 0.04 for the others. That call adds a median 1.3-1.7% to a
row's mean, more to short rows than to long ones. Between the warm-up and that call, bench.protocol.time_cuda
synchronises and reads the allocator's statistics (torch.cuda.memory_stats); KernelBench's timer only synchronises.

This script times eager's module and convt3d's (`auto`, no grad, as the bench) with time_cuda, and with a plain loop
as KernelBench's (a synchronisation, the L2 flush, CUDA events around the call) after the same warm-up, followed by:
- nothing (KernelBench's order);
- memory_stats (what time_cuda adds);
- memory_stats, then one more untimed call.
The variants take turns, for --rounds rounds. Each row: call 0's ms and host ms, the mean of all calls, the mean
without call 0, and the minimum; time_cuda's rows give call 0 only where it was above twice the fastest.

    PYTHONPATH=src python3 benchmarks/diag_first_call.py [--layers video_k3s2p1op1,unet3d_k2s2_deep] [--iters 100]
                                                          [--rounds 2]
"""

import argparse
import copy
import statistics
import time

import torch

from convt3d import convert
from convt3d.bench.protocol import FLUSH_BYTES, time_cuda
from convt3d.bench.report import markdown_table
from convt3d.bench.workloads import sweep_layers


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", default="video_k3s2p1op1,unet3d_k2s2_deep")
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    rows = []
    for layer in sweep_layers(args.layers):
        module, x, _, _, _ = layer.kernel_case("cuda")
        ours = convert(copy.deepcopy(module))
        with torch.no_grad():
            for name, fn in (("eager", lambda: module(x)), ("convt3d", lambda: ours(x))):
                fn()  # (convt3d's first call compiles and chooses its path)
                variants = {"plain loop": lambda: None,
                            "plain loop, memory_stats": torch.cuda.memory_stats,
                            "plain loop, memory_stats, one more call": lambda: (torch.cuda.memory_stats(), fn())}
                for round_ in range(args.rounds):
                    for variant, before in variants.items():
                        rows.append(row(layer.name, name, variant, round_, *plain_loop(fn, before, args.iters)))
                        print(rows[-1], flush=True)
                    timing = time_cuda(fn, iters=args.iters)
                    first = [c for c in timing.slow_calls if c[0] == 0]
                    rows.append((layer.name, name, "time_cuda", round_,
                                 f"{first[0][1]:.4f}" if first else "", f"{first[0][2]:.3f}" if first else "",
                                 f"{timing.mean_ms:.4f}", "", f"{timing.min_ms:.4f}"))
                    print(rows[-1], flush=True)
    print(markdown_table(["layer", "module", "timer", "round", "call 0 ms", "call 0 host ms", "mean ms",
                          "mean without call 0", "min ms"], rows))


def plain_loop(fn, before, iters, warmup=5):
    """(ms, host ms) of each timed call: KernelBench's loop, with before() between the warm-up and the first."""
    flush = torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    before()
    torch.cuda.synchronize()
    samples, host = [], []
    for _ in range(iters):
        torch.cuda.synchronize()
        flush.fill_(1)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        t0 = time.perf_counter()
        fn()
        host.append((time.perf_counter() - t0) * 1e3)
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end))
    return samples, host


def row(layer, name, variant, round_, samples, host):
    return (layer, name, variant, round_, f"{samples[0]:.4f}", f"{host[0]:.3f}", f"{statistics.fmean(samples):.4f}",
            f"{statistics.fmean(samples[1:]):.4f}", f"{min(samples):.4f}")


if __name__ == "__main__":
    main()
