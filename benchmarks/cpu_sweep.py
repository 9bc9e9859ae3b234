"""The public sweep's layers on the CPU at batch 1: convt3d (backend="auto") against F.conv_transpose3d.

Interleaved wall-clock timing (median of --repeats), float32, fresh torch.rand input.
    PYTHONPATH=src python3 benchmarks/cpu_sweep.py [--repeats 5]
"""

import argparse
import statistics

import torch
import torch.nn.functional as F

import convt3d
from convt3d.bench.protocol import time_interleaved
from convt3d.bench.workloads import DTYPES, load_sweep


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"{'layer':28s} {'eager ms':>9s} {'convt3d ms':>10s} {'speed-up':>8s}")
    for layer in load_sweep(None):
        layer = layer.with_batch(1)
        if DTYPES[layer.dtype] != torch.float32:
            continue  # CPU half-precision convolutions are not what this path is for
        module = layer.module()
        x = torch.rand(layer.input_shape)
        args_ = (module.weight.detach(), module.bias.detach() if module.bias is not None else None, module.stride,
                 module.padding, module.output_padding, module.groups, module.dilation)
        eager = lambda: F.conv_transpose3d(x, *args_)  # noqa: E731
        ours = lambda: convt3d.conv_transpose3d(x, *args_)  # noqa: E731
        times = time_interleaved({"eager": eager, "ours": ours}, args.repeats)
        e, o = statistics.median(times["eager"]), statistics.median(times["ours"])
        print(f"{layer.name:28s} {e:9.2f} {o:10.2f} {e / o:7.2f}x")


if __name__ == "__main__":
    main()
