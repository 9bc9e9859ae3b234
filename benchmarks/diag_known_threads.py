"""The CUDA phase correlation (phase_conv.py) as it was, against its thread index known below 128 (known_threads:
threadIdx.x % THREADS, which the library took in 1a67a05) and against persistent programs of two warpgroups
(persistent), in the library's forward (backend="torch").

    PYTHONPATH=<bda9193's src> python3 benchmarks/diag_known_threads.py --form variants|alternating|kernels

It needs the library of commit bda9193, whose correlate_phases takes known_threads and persistent. Thirty-ninth
session (benchmarks/RESULTS.md, calls 7-9; the three forms ran as scripts/_run6.py, _run7.py and _run8.py, the same
code):
- variants: six sweep layers in both modes, the three kernels in turn, 50 calls each; each output compared bitwise
  with the first's.
- alternating: five layers, default and known_threads in turn twice, 100 calls each.
- kernels: the correlate_phases calls of one forward recorded, then replayed back to back, 20 rounds between CUDA
  events (L2 not flushed, no host wait: GPU time where the host keeps up), default and known_threads in turn three
  times.
Rows (variants, alternating): bench.protocol.time_cuda's mean and minimum in ms (L2 flushed before each call).
"""

import argparse
import functools

import torch

import convt3d
from convt3d.backends import cuda
from convt3d.backends.cuda import phases as cuda_phases
from convt3d.bench.protocol import time_cuda
from convt3d.bench.workloads import sweep_layers

FORMS = {
    "variants": "kernelbench_l1_77_dilated,vae_k4s2p1,video_k3s2p1op1,k3s1p1,video_spatial_k144,wide_256to128_k3s2",
    "alternating": "vae_k4s2p1,video_spatial_k144,k3s1p1,kernelbench_l1_77_dilated,video_k3s2p1op1",
    "kernels": "video_spatial_k144,video_k3s2p1op1,vae_k4s2p1,k3s1p1,kernelbench_l1_77_dilated",
}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--form", choices=tuple(FORMS), required=True)
    args = parser.parse_args()
    original = cuda.correlate_phases
    rows = []
    for layer in sweep_layers(FORMS[args.form]):
        module, x, w, b, reference = layer.kernel_case("cuda")
        p = dict(stride=layer.stride, padding=layer.padding, output_padding=layer.output_padding,
                 dilation=layer.dilation)
        forward = lambda: convt3d.conv_transpose3d(x, w, b, backend="torch", **p)
        for tf32 in (True, False):
            torch.backends.cudnn.allow_tf32 = tf32
            mode = "TF32" if tf32 else "off"
            if args.form == "variants":
                results = {}
                for name, options in (("default", {}), ("known", dict(known_threads=True)),
                                      ("persistent", dict(persistent=True))):
                    cuda_phases.correlate_phases = functools.partial(original, **options)
                    out = forward()
                    torch.cuda.synchronize()
                    results[name] = out
                    t = time_cuda(forward, iters=50)
                    rows.append(f"| {layer.name} | {mode} | {name} | {t.mean_ms:.4f} | {t.min_ms:.4f} | bitwise "
                                f"{torch.equal(out, results['default'])} |")
                    print(rows[-1], flush=True)
            elif args.form == "alternating":
                times = {"default": [], "known": []}
                for _ in range(2):
                    for name, options in (("default", {}), ("known", dict(known_threads=True))):
                        cuda_phases.correlate_phases = functools.partial(original, **options)
                        forward()
                        torch.cuda.synchronize()
                        t = time_cuda(forward, iters=100)
                        times[name].append(f"{t.mean_ms:.4f}/{t.min_ms:.4f}")
                rows.append(f"| {layer.name} | {mode} | {', '.join(times['default'])} | {', '.join(times['known'])} |")
                print(rows[-1], flush=True)
            else:
                calls = []

                def record(*call_args, **call_kwargs):
                    calls.append((call_args, call_kwargs))
                    return original(*call_args, **call_kwargs)
                cuda_phases.correlate_phases = record
                forward()
                cuda_phases.correlate_phases = original
                times = {False: [], True: []}
                for _ in range(3):
                    for known in (False, True):
                        replay = lambda: [original(*a, **k, known_threads=known) for a, k in calls]
                        replay()
                        torch.cuda.synchronize()
                        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        start.record()
                        for _ in range(20):
                            replay()
                        end.record()
                        torch.cuda.synchronize()
                        times[known].append(start.elapsed_time(end) / 20)
                rows.append(f"| {layer.name} | {mode} | {len(calls)} | "
                            + " | ".join(", ".join(f"{t:.4f}" for t in times[k]) for k in (False, True)) + " |")
                print(rows[-1], flush=True)
            cuda_phases.correlate_phases = original
    torch.backends.cudnn.allow_tf32 = True
    print("\n".join(rows))


if __name__ == "__main__":
    main()
