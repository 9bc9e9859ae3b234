"""How much of a small layer's cold-L2 mean is the host's, layer by layer of a convt3d call (GPU machine).

    PYTHONPATH=src python3 benchmarks/diag_call_layers.py [--layers k3s1p1,...] [--modes tf32,off] [--rounds 3]

Why: on the small sweep layers convt3d's fastest call is well below its mean (k3s1p1 in TF32 mode, fifty-third
session: minimum 0.031 ms, median 0.045, mean 0.050), the rest being time the GPU waits for the host after the L2
flush. How much of it is the Python between the module and the Triton backend's prepared call? Forms, each timed as
the bench times a row (bench.protocol.time_cuda, KernelBench's protocol):
  eager      nn.ConvTranspose3d
  module     convt3d's module, backend "auto" (what the bench's convt3d row runs)
  full       convt3d.conv_transpose3d with the module's arguments: the functional way (checks, backend choice,
             lookups) to the same kernels, as the module's every call went before its bound forward
             (ops.BoundForward); since the fifty-sixth session it too ends in the phase path's prepared call, as it
             did in the Triton backend's (the fifty-fifth session measured the phase path's by_phases here)
  prepared   the prepared call that the module's bound forward holds: the Triton backend's
             (backends.triton._prepared) or the CUDA phase path's (backends.torch_phase._prepared)
The forms take turns, each in every place of a rotating order over the rounds (diag_row_order.rotating_timings).
Rows: per form, the median over the rounds of the mean, median call, fastest call (ms) and median host time per call
(ms, from a synchronisation).
Before the timing, each form's output is checked against eager's by KernelBench's check. Also: the flush's own GPU time
(CUDA events around it). (The fifty-fourth session's first form also timed the prepared call's two launches alone,
into buffers allocated beforehand; their outputs failed KernelBench's check on three of the eight rows, for a reason
not found, and those forms are gone.)
"""

import argparse
import copy
import statistics

import torch

from convt3d import conv_transpose3d, convert, functional
from convt3d.bench.protocol import FLUSH_BYTES, kernelbench_check
from convt3d.bench.report import markdown_table
from convt3d.bench.runner import _tf32
from convt3d.bench.workloads import DTYPES, sweep_layers
from diag_row_order import rotating_timings

def flush_ms(iters=50):
    flush = torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    samples = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        flush.fill_(1)
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end))
    return statistics.median(samples)


def forms_of(layer):
    dtype = DTYPES[layer.dtype]
    torch.manual_seed(0)
    eager = layer.module().to(device="cuda", dtype=dtype)
    ours = convert(copy.deepcopy(eager))
    x = torch.rand(layer.input_shape, device="cuda", dtype=dtype)
    w, b = ours.weight, ours.bias
    forms = {"eager": lambda: eager(x), "module": lambda: ours(x),
             "full": lambda: conv_transpose3d(x, w, b, ours.stride, ours.padding, ours.output_padding, ours.groups,
                                              ours.dilation, backend=ours.backend)}
    for _ in range(3):  # compile, autotune, let auto choose, prepare, bind
        ours(x)
    chosen = f"auto chose {list(functional._choice.values())[-1]}" if functional._choice else "auto chose nothing"
    bound = [f for f in (ours.__dict__.get("_bound_forwards") or {}).values() if f is not None]
    if not bound:
        return forms, x, eager, chosen + "; no bound forward"
    forms["prepared"] = lambda: bound[0].run(x, w, b)
    return forms, x, eager, chosen + "; bound"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", default="k3s1p1,video_k3s2p1op1,unet3d_k2s2,batch1_small_k3s2")
    parser.add_argument("--modes", default="tf32,off")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iters", type=int, default=100)
    args = parser.parse_args()
    print(f"flush (fill_ of {FLUSH_BYTES >> 20} MiB): {flush_ms():.4f} ms GPU", flush=True)
    rows = []
    for layer in sweep_layers(args.layers):
        for mode in args.modes.split(","):
            if mode == "off" and DTYPES[layer.dtype] != torch.float32:
                continue
            with torch.no_grad(), _tf32(mode == "tf32"):
                forms, x, eager, note = forms_of(layer)
                if note:
                    print(layer.name, mode, note, flush=True)
                expected = eager(x)
                checks = {name: kernelbench_check(fn(), expected) for name, fn in forms.items()}
                print(layer.name, mode, "checks", checks, flush=True)
                names = list(forms)
                samples = rotating_timings(forms, args.rounds, args.iters)
                for name in names:
                    by_round = [s for (form, _), values in samples.items() if form == name for s in values]
                    mean, median, fastest, host = (statistics.median(v) for v in zip(*by_round))
                    rows.append((layer.name, mode, name, checks[name], f"{mean:.4f}", f"{median:.4f}",
                                 f"{fastest:.4f}", f"{host:.4f}"))
                print(markdown_table(["layer", "mode", "form", "KB", "mean", "median call", "min", "host"],
                                     rows[-len(names):]), flush=True)
    print()
    print(markdown_table(["layer", "mode", "form", "KB", "mean", "median call", "min", "host"], rows))


if __name__ == "__main__":
    main()
