"""Problem 77's forward+backward timed as `bench --backward` times it, with what the host does meanwhile (GPU).

    PYTHONPATH=src python3 benchmarks/diag_host.py [--iters 100] [--bench-state]

For eager and convt3d: the event-timed mean, median and max of the calls; the host's time per call (no
synchronisation inside the loop, so the host runs ahead whenever it is faster than the GPU); and Python's
garbage collections during the loop by generation, with their total time. Each is run with the collector as it
is, disabled, and after gc.freeze() (which moves every object alive into a generation no collection scans).
--bench-state first runs the bench's forward rows in this process, leaving it in the state `bench --backward`
times forward+backward in.
"""

import argparse
import gc
import statistics
import time

import torch

import convt3d
from convt3d.bench.protocol import FLUSH_BYTES, time_cuda
from convt3d.bench.runner import run_layer
from convt3d.bench.workloads import PROBLEM_77


class Collections:
    """gc callbacks: count and time each collection by generation."""

    def __init__(self):
        self.count, self.seconds, self._start = [0, 0, 0], 0.0, None

    def __call__(self, phase, info):
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.count[info["generation"]] += 1
            self.seconds += time.perf_counter() - self._start


def timed(fn, iters, flush):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    collections = Collections()
    gc.callbacks.append(collections)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    host = []
    for start, end in zip(starts, ends):
        flush.fill_(1)
        start.record()
        t0 = time.perf_counter()
        fn()
        host.append((time.perf_counter() - t0) * 1e3)
        end.record()
    torch.cuda.synchronize()
    gc.callbacks.remove(collections)
    device = [s.elapsed_time(e) for s, e in zip(starts, ends)]
    return device, host, collections


def checkpoints(layer, x, grad, iters):
    """Host time of convt3d's forward+backward in three stretches (medians, each call after a synchronisation):
    the forward call, from its return to the entry of the phase backward, and from there to backward's return."""
    from convt3d import ops
    from convt3d.backends import torch_phase

    marks = {}
    phase_backward = torch_phase.conv_transpose3d_backward

    def marked(*a, **k):
        marks["entry"] = time.perf_counter()
        return phase_backward(*a, **k)

    torch_phase.conv_transpose3d_backward = marked
    try:
        rows = []
        for _ in range(iters):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            y = layer(x)
            t1 = time.perf_counter()
            y.backward(grad)
            t3 = time.perf_counter()
            rows.append((t1 - t0, marks["entry"] - t1, t3 - marks["entry"]))
        torch.cuda.synchronize()
    finally:
        torch_phase.conv_transpose3d_backward = phase_backward
    medians = [statistics.median(r[i] for r in rows) * 1e6 for i in range(3)]
    print(f"convt3d host, us (medians): forward {medians[0]:.0f}, forward's return to the phase backward's entry "
          f"{medians[1]:.0f}, phase backward to backward's return {medians[2]:.0f} "
          f"(backward route via ops: {ops._cuda_phase_backward_serves(x, layer_plan(layer, x))})")


def layer_plan(layer, x):
    from convt3d.functional import validate

    return validate(x, layer.weight, layer.bias, layer.stride, layer.padding, layer.output_padding, layer.groups,
                    layer.dilation)[1]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--bench-state", action="store_true")
    args = parser.parse_args()
    if args.bench_state:
        run_layer(PROBLEM_77, torch.device("cuda"), compile=False)
    eager = PROBLEM_77.module().cuda()
    ours = convt3d.convert(PROBLEM_77.module().cuda())
    ours.load_state_dict(eager.state_dict())
    x = torch.rand(PROBLEM_77.input_shape, device="cuda", requires_grad=True)
    grad = torch.rand(PROBLEM_77.plan().output_shape, device="cuda")
    flush = torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    print(f"{gc.get_count()=} {gc.get_threshold()=} tracked objects {len(gc.get_objects())}")
    print(f"{'case':42s} {'mean':>7s} {'median':>7s} {'max':>7s} {'host med':>8s} {'host max':>8s}  gc (gen0/1/2, ms)")
    for mode in ("gc as is", "gc disabled", "gc frozen"):
        if mode == "gc disabled":
            gc.disable()
        if mode == "gc frozen":
            gc.enable()
            gc.collect()
            gc.freeze()
        for name, layer in (("eager", eager), ("convt3d", ours)):
            device, host, collections = timed(lambda: layer(x).backward(grad), args.iters, flush)
            print(f"{name + ' fwd+bwd, ' + mode:42s} {statistics.fmean(device):7.3f} {statistics.median(device):7.3f} "
                  f"{max(device):7.3f} {statistics.median(host):8.3f} {max(host):8.3f}  "
                  f"{'/'.join(map(str, collections.count))}, {collections.seconds * 1e3:.2f}", flush=True)
    gc.unfreeze()
    gc.enable()
    checkpoints(ours, x, grad, args.iters)
    # The same loop with a flush buffer allocated now rather than first, and bench.protocol.time_cuda itself
    # (which allocates its flush buffer on each call).
    for variant in ("flush buffer allocated first", "flush buffer allocated now", "time_cuda", "first again"):
        for name, layer in (("eager", eager), ("convt3d", ours)):
            fn = lambda: layer(x).backward(grad)
            if variant == "time_cuda":
                timing = time_cuda(fn)
                mean, median, top = timing.mean_ms, float("nan"), timing.max_ms
            else:
                buffer = flush if "first" in variant else torch.empty(FLUSH_BYTES // 4, dtype=torch.int32,
                                                                      device="cuda")
                device, _, _ = timed(fn, args.iters, buffer)
                mean, median, top = statistics.fmean(device), statistics.median(device), max(device)
                del buffer
            print(f"{name + ', ' + variant:42s} {mean:7.3f} {median:7.3f} {top:7.3f}", flush=True)


if __name__ == "__main__":
    main()
