"""Problem 77's forward+backward: the GPU's time against the host's (GPU).

    PYTHONPATH=src python3 benchmarks/diag_host.py [--iters 100]

For eager and convt3d, bench.protocol.time_cuda's mean with a synchronisation before each call (the bench's and
KernelBench's timing: the GPU waits whenever the host is late within a call) and without (calls queued back to
back: the GPU's own time), with Python's garbage collections during the timed calls (count by generation, total
ms); then convt3d's host time in three stretches: its forward call, from the forward's return to the entry of
the phase backward (autograd engine and prologue), and from there to backward's return.
"""

import argparse
import gc
import statistics
import time

import torch

from convt3d.bench.protocol import time_cuda
from convt3d.bench.workloads import PROBLEM_77


class Collections:
    """gc callback: count and time each collection by generation."""

    def __init__(self):
        self.count, self.seconds, self._start = [0, 0, 0], 0.0, None

    def __call__(self, phase, info):
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.count[info["generation"]] += 1
            self.seconds += time.perf_counter() - self._start


def checkpoints(layer, x, grad, iters):
    """Medians of convt3d's host time per stretch, in us, each call after a synchronisation."""
    from convt3d.backends import torch_phase

    marks = {}
    phase_backward = torch_phase.conv_transpose3d_backward

    def marked(*a, **k):
        marks["entry"] = time.perf_counter()
        return phase_backward(*a, **k)

    torch_phase.conv_transpose3d_backward = marked  # looked up at call time by ops._cuda_phase_backward
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
    return [statistics.median(r[i] for r in rows) * 1e6 for i in range(3)]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=100)
    args = parser.parse_args()
    eager, ours, x, grad = PROBLEM_77.training_case("cuda")
    print(f"{'forward+backward':12s} {'synchronised ms':>16s} {'queued ms':>10s}  gc (gen0/1/2, ms)")
    for name, layer in (("eager", eager), ("convt3d", ours)):
        collections = Collections()
        gc.callbacks.append(collections)
        means = [time_cuda(lambda: layer(x).backward(grad), iters=args.iters, synchronize=s).mean_ms
                 for s in (True, False)]
        gc.callbacks.remove(collections)
        print(f"{name:12s} {means[0]:16.3f} {means[1]:10.3f}  {'/'.join(map(str, collections.count))}, "
              f"{collections.seconds * 1e3:.2f}", flush=True)
    forward, prologue, backward = checkpoints(ours, x, grad, args.iters)
    print(f"convt3d host, us (medians): forward {forward:.0f}, forward's return to the phase backward's entry "
          f"{prologue:.0f}, phase backward to backward's return {backward:.0f}")


if __name__ == "__main__":
    main()
