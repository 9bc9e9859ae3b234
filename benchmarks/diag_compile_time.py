"""A layer's first call by the CUDA phase path in a fresh process: its wall time and each CUDA kernel it compiles
(GPU machine).

    PYTHONPATH=src python3 benchmarks/diag_compile_time.py [--rounds 2]

Why: before the seventieth session the phase path's check compiled phase_conv.py's kernel for every layer (without a
bias, at the tile rows of one phase), also where row_runs.py's kernel then served, or where the call compiled it again
with a bias or other rows. Compiled on the project's 2-core CPU (NVRTC 12.9 and ptxas for sm_90a), problem 77's
phase_conv.py kernel took about 0.5 s in FP16 and 0.9 s in 3xFP16, row_runs.py's 0.3 and 0.8. The check now compiles
the kernels the call launches (cuda.phases.forward_kernels_unsupported), once.

Each row runs in its own process, so that no kernel is compiled yet (Triton's kernels, cached on disk, are compiled
by a warm-up process first): "library" makes the first call (convt3d.conv_transpose3d, backend="torch") as it is;
"old check first" first compiles what the check compiled before the seventieth session (cuda.phase_conv_unsupported
per phase, as cuda.phases.forward_unsupported called it), then makes the same call. Each row gives the old check's
time (0 for "library"), the first call's wall time (after a synchronisation, to one after it), the kernels built in
the process with their build times (cuda._Kernel: NVRTC, loading, the shared-memory setting), and the output's error
against float64 (NaN-poisoned before the call: every element must be written).
"""

import argparse
import json
import os
import subprocess
import sys
import time

CASES = [("problem 77", False, True), ("problem 77", False, False), ("problem 77 with a bias", True, True),
         ("problem 77 with a bias", True, False)]


def run_case(bias: bool, tf32: bool, old_check: bool) -> dict:
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
    torch.backends.cudnn.allow_tf32 = tf32
    torch.manual_seed(0)
    x = torch.rand(16, 32, 16, 32, 32, device="cuda")
    w = torch.randn(32, 64, 3, 3, 3, device="cuda") / 16
    b = torch.randn(64, device="cuda") if bias else None
    args = dict(stride=2, padding=1, dilation=2)
    torch.cuda.synchronize()
    start = time.perf_counter()
    if old_check:
        plan = make_plan(tuple(x.shape), tuple(w.shape), (2,) * 3, (1,) * 3, (0,) * 3, 1, (2,) * 3)
        phase_list = tuple(phases for _, phases in _regions(plan, True) if phases is not None)
        for phases in phase_list:
            counts, _, _ = cuda_phases._taps(phases, ascending=False)
            reason = cuda.phase_conv_unsupported(x.device, x.dtype, 32, 64, 1, counts,
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
        print(json.dumps(run_case(*(bool(int(v)) for v in args.case.split(",")))))
        return
    environment = dict(os.environ, PYTHONUNBUFFERED="1")

    def fresh(bias, tf32, old_check):
        out = subprocess.run([sys.executable, __file__, "--case", f"{int(bias)},{int(tf32)},{int(old_check)}"],
                             capture_output=True, text=True, env=environment, check=True)
        return json.loads(out.stdout.strip().splitlines()[-1])

    for _, bias, tf32 in CASES:  # Triton's kernels compiled and cached on disk
        fresh(bias, tf32, False)
    rows = []
    for round_ in range(args.rounds):
        for label, bias, tf32 in CASES:
            for old_check in (False, True):
                result = fresh(bias, tf32, old_check)
                rows.append((round_ + 1, label, "TF32" if tf32 else "off", "old check first" if old_check else
                             "library", result))
                print(rows[-1], flush=True)
    print("\n| round | layer | mode | way | old check (s) | first call (s) | kernels built (s) | error off float64 |")
    print("|---|---|---|---|---|---|---|---|")
    for round_, label, mode, way, result in rows:
        builds = ", ".join(f"{name} {seconds}" for name, seconds in result["builds"])
        print(f"| {round_} | {label} | {mode} | {way} | {result['old_check_s']} | {result['first_call_s']} | {builds} "
              f"| {result['error']:.1e} |")


if __name__ == "__main__":
    main()
