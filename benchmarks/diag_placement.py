"""Does where a tensor lies in GPU memory change a kernel's time? (GPU; the seventeenth session saw the same Triton
kernel run up to 10x slower in one module or process than in another, on the GPU side.)

    PYTHONPATH=src python3 benchmarks/diag_placement.py [--iters 30] [--layers video_spatial_k144,...]

Per layer, `backend="triton"`'s forward (autotuned once, then the same config throughout) into outputs, and from
inputs, placed at several addresses: views of one pool at offsets from 0 KB to 6 MB, so that they start at different
offsets within 2 MB pages. Rows: bench.protocol.time_cuda's mean and minimum in ms (L2 flushed
before each call), the address modulo 2 MB, and the first copy again at the end (drift within the process).
"""

import argparse
import logging

import torch

from convt3d.backends.triton import conv_transpose3d
from convt3d.backends.triton import forward as tf
from convt3d.bench.protocol import time_cuda
from convt3d.bench.report import markdown_table
from convt3d.bench.workloads import DTYPES, sweep_layers

OFFSETS_KB = [0, 4, 64, 260, 1024, 2044, 3000, 6144]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--layers", default="video_spatial_k144,k3s1p1,video_k3s2p1op1")
    args = parser.parse_args()
    logging.basicConfig()
    logging.getLogger("convt3d").setLevel(logging.DEBUG)  # the autotuner's times and choice
    rows = []
    for layer in sweep_layers(args.layers):
        name = layer.name
        dtype = DTYPES[layer.dtype]
        plan = layer.plan()
        _, x, w, b, _ = layer.kernel_case("cuda")

        with torch.no_grad():
            expected = conv_transpose3d(x, w, b, plan)  # autotunes once
            # Copies carved out of one pool at OFFSETS_KB (each call writes or reads one of them only).
            out_pool = torch.empty(expected.numel() + max(OFFSETS_KB) * 1024 // expected.element_size(),
                                   dtype=dtype, device="cuda")
            in_pool = torch.empty(x.numel() + max(OFFSETS_KB) * 1024 // x.element_size(), dtype=dtype, device="cuda")
            outputs = [out_pool[kb * 1024 // expected.element_size():][:expected.numel()].view(expected.shape)
                       for kb in OFFSETS_KB]
            inputs = [in_pool[kb * 1024 // x.element_size():][:x.numel()].view(x.shape) for kb in OFFSETS_KB]
            operands = tf._operands(x, w, plan.groups, tf.precision_for(dtype))
            # The config autotuned for this layer (layers of the general kernel or tap_columns only).
            config = next(c for k, c in tf._best_config.items() if k[0] == plan.key)
            for label, tensors in (("output", outputs), ("input", inputs)):
                for kb, t in list(zip(OFFSETS_KB, tensors)) + [(OFFSETS_KB[0], tensors[0])]:
                    if label == "output":
                        def call(t=t, operands=operands):  # (bound now: the name is deleted below)
                            tf._launch(config, plan, *operands, b, t, tf.precision_for(dtype))
                    else:
                        t.copy_(x)

                        def call(t=t):
                            conv_transpose3d(t, w, b, plan)
                    call()
                    timing = time_cuda(call, iters=args.iters)
                    rows.append((name, label, kb, t.data_ptr() % (2 << 20), timing.mean_ms, timing.min_ms,
                                 "kernel alone" if label == "output" else "whole call"))
                    print(rows[-1], flush=True)
            del out_pool, in_pool, outputs, inputs, operands
    print(markdown_table(["layer", "placed", "offset KB", "address mod 2 MB", "mean ms", "min ms", "what"], rows))


if __name__ == "__main__":
    main()
