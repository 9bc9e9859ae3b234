"""Why `auto` can trail eager on a small layer (GPU): its choice, and for eager's module, F.conv_transpose3d,
convt3d's eager backend and auto, the host time per call and the bench's timing.

    PYTHONPATH=src python3 benchmarks/diag_auto.py [layer names from benchmarks/sweep.json]

Host time: perf_counter around one call that starts on an idle GPU (median). Timing: bench.protocol.time_cuda
(KernelBench's: synchronisation, L2 flush, events), run twice so that drift shows.
"""

import copy
import sys

import torch
import torch.nn.functional as F

from convt3d import convert, functional
from convt3d.bench.protocol import host_time_cuda, time_cuda
from convt3d.bench.workloads import DTYPES, load_sweep


def main(names):
    layers = [layer for layer in load_sweep(None) if layer.name in names] if names else load_sweep(None)[:3]
    for layer in layers:
        dtype = DTYPES[layer.dtype]
        eager = layer.module().to(device="cuda", dtype=dtype)
        impls = {"eager module": eager,
                 "F.conv_transpose3d": lambda x: F.conv_transpose3d(x, eager.weight, eager.bias, eager.stride,
                                                                    eager.padding, eager.output_padding,
                                                                    eager.groups, eager.dilation),
                 "convt3d backend=eager": convert(copy.deepcopy(eager), backend="eager"),
                 "convt3d auto": convert(copy.deepcopy(eager))}
        x = torch.rand(layer.input_shape, device="cuda", dtype=dtype)
        with torch.no_grad():
            functional._choice.clear()
            impls["convt3d auto"](x)
            print(f"{layer.name}: auto chose {set(functional._choice.values())}")
            for name, fn in impls.items():
                host = host_time_cuda(lambda: fn(x), calls=200) * 1e3
                cold = [time_cuda(lambda: fn(x), iters=50).mean_ms for _ in range(2)]
                print(f"  {name:24s} host {host:6.1f} us   timed {cold[0]:.4f} / {cold[1]:.4f} ms", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
