"""Problem 77's correlation into its lattice when the output's zeros are still in the L2 against when they are not:
does the L2 merge the correlation's half-written sectors with lines the fill just wrote, without reading them back
from DRAM? (GPU)

    PYTHONPATH=src python3 benchmarks/diag_l2_merge.py [--iters 100] [--batches 1,2,4,16]
    ncu --cache-control none --clock-control none -k regex:phase_conv_rows --metrics \
        dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum \
        python3 benchmarks/diag_l2_merge.py --profile 1
    (--profile: at that batch, in FP16 then 3xFP16, the library's forward, then the correlation cold, then resident:
    three launches of the kernel a mode)

Why: the library's forward is out.zero_() (571 MB, 0.124 ms), the operand pass (0.019) and the correlation into the
lattice (0.124). Under Nsight Compute the correlation read 174.5 MB from DRAM and wrote 138.8 MB (sixty-ninth session):
each lattice row's stores write every other float, so each of its sectors is half written, and the L2 reads the rest
back from DRAM, where zero_()'s zeros went long before (571 MB against an L2 of 50 MB). Fill and correlation then move
about 880 MB through DRAM in about 0.25 ms; a copy of a tensor of the output's size (1.14 GB read and written) took
0.280 ms (GUIDE.md), about 4.1 TB/s, at which 880 MB take about 0.21 ms. The fills beside the correlation tried so far
(sixty-fifth session's diag_fill_flags among them) wrote the same bytes the same way and took as long as fill and
correlation in turn (their DRAM bytes were not measured). A forward whose lattice writes found their lines still in the
L2 (a fill just before, region by region, inside the correlation's own programs) would move about 605 MB: at zero_()'s
rate about 0.14 ms. This script measures the premise before any such kernel is written: the library's correlation alone
(its operands prepared first) into an output that zero_() filled
- "cold": before the L2 flush (the library's case);
- "resident": after the flush, just before the correlation, at batches whose output fits the L2 (1: 35.7 MB) and
  whose output does not (2, 4, 16);
and zero_() alone, and zero_() then the correlation timed together. CUDA events around the timed part of each
iteration, the L2 flushed (256 MB written) before each; mean and minimum in ms. Each form's output (NaN before the
fill) is compared bitwise with the library's forward (convt3d.conv_transpose3d, backend="torch").
"""

import argparse

import torch

import convt3d
from convt3d.backends import cuda
from convt3d.backends.cuda import phases as cuda_phases
from convt3d.backends.torch_phase import _regions
from convt3d.backends.triton.window import correlation_operands
from convt3d.bench.protocol import FLUSH_BYTES
from convt3d.bench.report import markdown_table
from convt3d.plan import make_plan
from p77_correlation import P77, correlation_geometry


def correlation(x, w, split: int):
    """(the output, NaN-filled, and a function that correlates into it once it is filled), with the library's
    operands and geometry for x (the operand pass run here, once)."""
    plan = make_plan(tuple(x.shape), tuple(w.shape), (2,) * 3, (1,) * 3, (0,) * 3, 1, (2,) * 3)
    phase_list = tuple(p for _, p in _regions(plan, True) if p is not None)
    assert cuda_phases.forward_unsupported(plan, phase_list, x.device, x.dtype, split == 3) is None
    direct = cuda_phases._direct_input(x, plan, phase_list, split, False)
    out = torch.full(plan.output_shape, float("nan"), device="cuda")
    start, extent, geometry = correlation_geometry(plan, phase_list, split, out.stride())
    window, weight_taps, scales = correlation_operands(x, 0, x.shape, x.stride(), start, extent, w,
                                                       grad_input_orientation=False, split=split,
                                                       window=direct is None)
    source = window if direct is None else x
    return out, lambda: cuda.correlate(source, weight_taps, None, out, scales=scales, split=split, direct=direct,
                                       **geometry)


def timed(iters: int, before, timed_part, after_flush=None):
    """(mean, min) ms of timed_part over iters iterations: each runs before(), the L2 flush, after_flush() where
    given, then timed_part() between CUDA events."""
    flush = torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for k in range(iters + 3):  # three warm-up iterations
        torch.cuda.synchronize()
        before()
        flush.fill_(1)
        if after_flush is not None:
            after_flush()
        if k >= 3:
            starts[k - 3].record()
        timed_part()
        if k >= 3:
            ends[k - 3].record()
    torch.cuda.synchronize()
    times = [s.elapsed_time(e) for s, e in zip(starts, ends)]
    return sum(times) / len(times), min(times)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--batches", default="1,2,4,16")
    parser.add_argument("--profile", type=int, help="batch: run the correlation cold, then resident, once each")
    args = parser.parse_args()
    torch.manual_seed(0)
    w = torch.randn(32, 64, 3, 3, 3, device="cuda") * 0.02
    rows = []
    for batch in ([args.profile] if args.profile else [int(b) for b in args.batches.split(",")]):
        x = torch.rand(batch, 32, 16, 32, 32, device="cuda")
        for mode, split in (("FP16", 3), ("3xFP16", 2)):
            torch.backends.cudnn.allow_tf32 = split == 3
            out, correlate = correlation(x, w, split)
            expected = convt3d.conv_transpose3d(x, w, None, backend="torch", **P77)
            if args.profile:
                flush = torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
                out.zero_(), flush.fill_(1), correlate()  # cold
                flush.fill_(1), out.zero_(), correlate()  # resident
                torch.cuda.synchronize()
                assert torch.equal(out, expected), mode
                continue
            nothing = lambda: None
            forms = [("zero_ alone", nothing, out.zero_, None),
                     ("cold: zero_, flush, correlation", out.zero_, correlate, None),
                     ("resident: flush, zero_, correlation", nothing, correlate, out.zero_),
                     ("zero_ then correlation, timed together", nothing, lambda: (out.zero_(), correlate()), None)]
            for what, before, part, after_flush in forms:
                out.fill_(float("nan"))
                mean, minimum = timed(args.iters, before, part, after_flush)
                same = "" if what == "zero_ alone" else ("bitwise" if torch.equal(out, expected) else "DIFFERS")
                rows.append((batch, mode, what, f"{mean:.4f}", f"{minimum:.4f}", same))
                print(rows[-1], flush=True)
    torch.backends.cudnn.allow_tf32 = True
    if rows:
        print(markdown_table(["batch", "mode", "what", "mean ms", "min ms", "output"], rows))


if __name__ == "__main__":
    main()
