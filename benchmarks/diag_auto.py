"""Why `auto` can trail eager on a small layer (GPU): its choice, and eager against convt3d's eager backend and
auto, timed in turns with the bench's cold-L2 protocol.

    PYTHONPATH=src python3 benchmarks/diag_auto.py [layer names from benchmarks/sweep.json]
"""

import copy
import sys

import torch

from convt3d import convert, functional
from convt3d.bench.protocol import time_cuda
from convt3d.bench.workloads import load_sweep


def time_cuda_long_flush(fn, iters=50):
    """time_cuda with an 8x larger flush: the GPU is busy long enough that any host time per call is hidden, so a
    gap that remains is GPU work."""
    return time_cuda(fn, iters=iters, flush_bytes=2 << 30)


def main(names):
    layers = [layer for layer in load_sweep(None) if layer.name in names] if names else load_sweep(None)[:3]
    for layer in layers:
        eager = layer.module().cuda()
        impls = {"eager": eager, "convt3d auto": convert(copy.deepcopy(eager)),
                 "convt3d backend=eager": convert(copy.deepcopy(eager), backend="eager")}
        x = torch.rand(layer.input_shape, device="cuda")
        with torch.no_grad():
            impls["convt3d auto"](x)
            print(layer.name, "auto chose", set(functional._choice.values()))
            functional._choice.clear()
            for timer in (time_cuda, time_cuda_long_flush):
                print(f"  {timer.__name__}: " + "  ".join(f"{name} {timer(lambda: fn(x), iters=50).mean_ms:.4f}"
                                                         for name, fn in impls.items()))
            print("  auto's choice now", set(functional._choice.values()))


if __name__ == "__main__":
    main(sys.argv[1:])
