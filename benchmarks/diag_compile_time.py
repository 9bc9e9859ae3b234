"""A layer's first call by the CUDA phase path in a fresh process: its wall time and each CUDA kernel it compiles
(GPU machine).

    PYTHONPATH=src python3 benchmarks/diag_compile_time.py [--rounds 2]

Why (seventieth session): the phase path's check compiled phase_conv.py's kernel for every layer (without a bias, at
one phase's tile rows), also where row_runs.py's kernel then served, or where the call compiled it again with a bias
or other rows; and a layer whose forward launches several kernels (a k3 s2 layer's eight phases, one tap shape each)
compiled them one after the other. The check now compiles the kernels the call launches
(cuda.phases.forward_kernels_unsupported), once each, several at a time in threads (cuda.compiled_together). On the
project's 2-core CPU (benchmarks/cpu_first_call_compiles.py), NVRTC and ptxas took 0.45-0.51 s for the old check's
kernel on problem 77 in FP16 and 0.90-0.92 in 3xFP16, beside 0.34-0.39 and 0.79-0.83 for the kernel launched; two of a
k3 s2 layer's kernels compiled in 0.62 s together against 1.19 one after the other. Since the seventy-first session
the kernels are also kept on disk (cuda/kernel_cache.py), so that a later process loads them instead.

Each row runs in its own process, so that no CUDA kernel is compiled yet (Triton's kernels, cached on disk, are
compiled by a warm-up process first; each row but the last kind starts from an empty CONVT3D_CACHE_DIR), and makes
the layer's first call (convt3d.conv_transpose3d, backend="torch"):
- "library": as the library makes it;
- "old check first" (problem 77): first compiles what the check compiled before the seventieth session
  (cuda.phase_conv_unsupported per phase, as cuda.phases.forward_unsupported called it), then makes the call;
- "one at a time" (the k3 s2 layer): with cuda.compiled_together off, so that its kernels compile one after the other;
- "disk cache": as "library", in the CONVT3D_CACHE_DIR that the "library" row before it filled.
Each row gives the old check's time (0 without it), the first call's wall time (after a synchronisation, to one after
it), the kernels built in the process with their build times (cuda._Kernel: NVRTC, loading, the shared-memory setting;
a precompiled kernel's build is only its loading's end) and the output's error against float64 (NaN-poisoned before
the call: every element must be written).
"""

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time

# name: (in and out channels, kernel, stride, padding, output_padding, dilation, input shape)
LAYERS = {"problem 77": (32, 64, 3, 2, 1, 0, 2, (16, 32, 16, 32, 32)),
          "video k3 s2 p1 op1 (64 -> 32)": (64, 32, 3, 2, 1, 1, 1, (1, 64, 8, 64, 64))}
CASES = [("problem 77", bias, tf32, way) for tf32 in (True, False) for bias in (False, True)
         for way in ("library", "disk cache", "old check first")]
CASES += [("video k3 s2 p1 op1 (64 -> 32)", True, tf32, way) for tf32 in (True, False)
          for way in ("library", "disk cache", "one at a time")]


def run_case(layer: str, bias: bool, tf32: bool, way: str) -> dict:
    import torch
    import torch.nn.functional as F

    import convt3d
    from convt3d.backends import cuda
    from convt3d.backends.cuda import phases as cuda_phases
    from convt3d.backends.torch_phase import _regions
    from convt3d.bench.protocol import nan_poisoned_allocations
    from convt3d.plan import make_plan

    builds = []
    build = cuda._Kernel.__init__

    def timed_build(self, source, name, shared_bytes, threads):
        start = time.perf_counter()
        build(self, source, name, shared_bytes, threads)
        builds.append((name, round(time.perf_counter() - start, 3)))

    cuda._Kernel.__init__ = timed_build
    if way == "one at a time":
        cuda_phases.compiled_together = lambda device, specs: contextlib.nullcontext()
    torch.backends.cudnn.allow_tf32 = tf32
    torch.manual_seed(0)
    c_in, c_out, k, s, pad, op, d, shape = LAYERS[layer]
    x = torch.rand(*shape, device="cuda")
    w = torch.randn(c_in, c_out, k, k, k, device="cuda") / 16
    b = torch.randn(c_out, device="cuda") if bias else None
    args = dict(stride=s, padding=pad, output_padding=op, dilation=d)
    torch.cuda.synchronize()
    start = time.perf_counter()
    if way == "old check first":
        plan = make_plan(tuple(x.shape), tuple(w.shape), (s,) * 3, (pad,) * 3, (op,) * 3, 1, (d,) * 3)
        phase_list = tuple(phases for _, phases in _regions(plan, True) if phases is not None)
        for phases in phase_list:
            counts, _, _ = cuda_phases._taps(phases, ascending=False)
            reason = cuda.phase_conv_unsupported(x.device, x.dtype, c_in, c_out, 1, counts,
                                                 tuple(p.input_dilation for p in phases), cuda_phases._split(tf32),
                                                 plan.batch, tuple(p.out_count for p in phases))
            assert reason is None, reason
    check_seconds = time.perf_counter() - start
    torch.cuda.synchronize()
    start = time.perf_counter()
    with nan_poisoned_allocations():
        y = convt3d.conv_transpose3d(x, w, b, backend="torch", **args)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    expected = F.conv_transpose3d(x.double(), w.double(), None if b is None else b.double(), **args)
    error = ((y.double() - expected).norm() / expected.norm()).item()
    return dict(old_check_s=round(check_seconds, 3), first_call_s=round(seconds, 3), builds=builds, error=error)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--case", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        print(json.dumps(run_case(*json.loads(args.case))))
        return
    filled = {}  # (layer, bias, tf32): the CONVT3D_CACHE_DIR of its last "library" row

    def fresh(case):
        layer, bias, tf32, way = case
        if way == "disk cache":
            directory = filled[(layer, bias, tf32)]
        else:
            directory = filled[(layer, bias, tf32)] = tempfile.mkdtemp(prefix="convt3d_kernels_")
        environment = dict(os.environ, PYTHONUNBUFFERED="1", CONVT3D_CACHE_DIR=directory)
        out = subprocess.run([sys.executable, __file__, "--case", json.dumps(case)], capture_output=True, text=True,
                             env=environment, check=True)
        return json.loads(out.stdout.strip().splitlines()[-1])

    for case in CASES:  # Triton's kernels compiled and cached on disk
        if case[3] == "library":
            fresh(case)
    rows = []
    for round_ in range(args.rounds):
        for case in CASES:
            rows.append((round_ + 1, *case, fresh(case)))
            print(rows[-1], flush=True)
    print("\n| round | layer | bias | mode | way | old check (s) | first call (s) | kernels built (s) | error |")
    print("|---|---|---|---|---|---|---|---|---|")
    for round_, layer, bias, tf32, way, result in rows:
        builds = ", ".join(f"{name} {seconds}" for name, seconds in result["builds"])
        print(f"| {round_} | {layer} | {bias} | {'TF32' if tf32 else 'off'} | {way} | {result['old_check_s']} | "
              f"{result['first_call_s']} | {builds} | {result['error']:.1e} |")


if __name__ == "__main__":
    main()
