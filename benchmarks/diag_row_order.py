"""Does a bench row's place in the order set its time on a host-bound layer? The modules of a sweep row (eager,
convt3d with backend="auto", convt3d with backend="triton") timed as the bench times them, each module in each place
of a rotating order, several rounds.

    PYTHONPATH=src python3 benchmarks/diag_row_order.py [--layers batch1_small_k3s2] [--modes tf32,off] [--rounds 3]

Why: in the fifty-third session's second sweep (benchmarks/RESULTS.md), batch1_small_k3s2's "convt3d" row (auto,
which ran the Triton kernel) took 0.0418 ms by its median call against backend="triton"'s 0.0236 in TF32 mode, and
0.0392 against 0.0300 with TF32 off, at about the same host time per call (0.046-0.051 ms); its fastest call took
0.010 ms. The bench times eager's row first, then auto's, then backend="triton"'s. On the other layers auto's
median call lay 2.9 us below to 5.8 us above backend="triton"'s. Either the place after eager's row, or something in
auto's own path, costs the host time.

Each module is checked first (KernelBench's check against eager on a fresh input: the first calls compile, autotune
and let `auto` choose), then the host is left idle as the bench leaves it (garbage collected, bench.runner.SETTLE_S).
Rows: per module and place in the order (0: first), over the rounds that put it there, the median of
bench.protocol.time_cuda's mean, median call and fastest call in ms (100 calls each) and of the median host time per
call (bench.protocol.host_time_cuda). Results: benchmarks/RESULTS.md, fifty-fourth session.
"""

import argparse
import copy
import gc
import statistics
import time

import torch

from convt3d import convert
from convt3d.bench.protocol import host_time_cuda, kernelbench_check, time_cuda
from convt3d.bench.report import markdown_table
from convt3d.bench.runner import SETTLE_S, _tf32
from convt3d.bench.workloads import DTYPES, sweep_layers


def rotating_timings(forms: dict, rounds: int, iters: int, log=lambda *message: None) -> dict:
    """{(name, place): [(mean, median call, fastest call, median host time per call), ...]} in ms of each form
    (a callable) timed as the bench times a row, in each place of a rotating order (0: first) over the rounds; before
    each round the host is left idle as the bench leaves it (garbage collected, bench.runner.SETTLE_S)."""
    names = list(forms)
    samples = {(name, place): [] for name in names for place in range(len(names))}
    for round_ in range(rounds):
        gc.collect()
        time.sleep(SETTLE_S)
        shift = round_ % len(names)
        for place, name in enumerate(names[shift:] + names[:shift]):
            timing = time_cuda(forms[name], iters=iters)
            host = host_time_cuda(forms[name], calls=iters)
            samples[name, place].append((timing.mean_ms, timing.median_ms, timing.min_ms, host))
            log(round_, place, name, samples[name, place][-1])
    return samples


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", default="batch1_small_k3s2")
    parser.add_argument("--modes", default="tf32,off")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iters", type=int, default=100)
    args = parser.parse_args()
    rows = []
    for layer in sweep_layers(args.layers):
        dtype = DTYPES[layer.dtype]
        torch.manual_seed(0)
        eager = layer.module().to(device="cuda", dtype=dtype)
        modules = {"eager": eager, "auto": convert(copy.deepcopy(eager)),
                   "triton": convert(copy.deepcopy(eager), backend="triton")}
        for mode in args.modes.split(","):
            with torch.no_grad(), _tf32(mode == "tf32"):
                x = torch.rand(layer.input_shape, device="cuda", dtype=dtype)
                for name, module in modules.items():
                    print(layer.name, mode, name, "check", kernelbench_check(module(x), eager(x)), flush=True)
                forms = {name: (lambda module=module: module(x)) for name, module in modules.items()}
                samples = rotating_timings(forms, args.rounds, args.iters,
                                           lambda *sample: print(layer.name, mode, *sample, flush=True))
            for (name, place), values in samples.items():
                if values:
                    mean, median, fastest, host = (statistics.median(v) for v in zip(*values))
                    rows.append((layer.name, mode, name, place, len(values), mean, median, fastest, host))
    print(markdown_table(["layer", "mode", "module", "place", "rounds", "mean ms", "median call ms", "min ms",
                          "host ms"], rows))


if __name__ == "__main__":
    main()
