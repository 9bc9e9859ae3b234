"""Problem 77's forward as a pipeline over batch chunks: the compact phase correlation of chunk k+1 runs while a second
stream expands chunk k into the whole output (every element written once: the compact value plus bias on the lattice,
bias or zero elsewhere). Does the write-bound expand hide behind the MMA-bound correlation?

    PYTHONPATH=src python3 benchmarks/diag_pipeline.py [--iters 50] [--chunks 1,2,4,8] [--programs 132,264]

Why: the library fills the whole output (0.125 ms), then the correlation writes the phase's lattice into it (0.165);
the times add. The thirty-second session's expand pass (diag_expand.py: the compact correlation, then one pass that
writes the output once) made a forward no faster (0.317 against 0.315 ms): the pass took 0.176 and ran after the
correlation. The thirty-third (diag_overlap.py) found a fill on a second stream overlapping the compact correlation
when the correlation was launched first and the fill ran few programs with its shared-memory carveout at the most
(0.178 ms for both against 0.113 + 0.133 alone). Here the expand of a chunk can only start once that chunk's
correlation is done, so the batch is cut into chunks and the two streams take turns.

The expand kernel is diag_expand.py's (8 elements per thread, one division per thread, 16-byte stores) with a
grid-stride loop, so that it can run on few programs (--programs; "all": one thread per 8 elements, no loop).

What it found (fifty-third session, benchmarks/RESULTS.md): no. No form beat the library's 0.311 ms (0.367 with TF32
off). The expand ran at 0.187 ms on a full grid and 0.254 / 0.377 on 264 / 132 programs, so few programs make it slow;
on a full grid beside the correlation it overlapped nothing; and the correlation itself lost its speed in chunks (0.110
ms whole, 0.156 in 4 chunks and 0.195 in 8, TF32 mode).

Rows: bench.protocol.time_cuda's mean and minimum in ms (L2 flushed before each call). Every forward's output is
NaN-poisoned before its first call and compared with the library's (bitwise), with float64 (relative error) and with
F.conv_transpose3d in the same mode (KernelBench's check).
"""

import argparse

import torch
import torch.nn.functional as F

import convt3d
from convt3d.backends import cuda
from convt3d.backends.cuda import phases as cuda_phases
from convt3d.backends.torch_phase import _regions
from convt3d.backends.triton.launch import _current_stream
from convt3d.backends.triton.window import correlation_operands
from convt3d.bench.protocol import time_cuda
from convt3d.bench.report import markdown_table
from convt3d.plan import make_plan
from diag_expand import COMPACT, OUT_SHAPE, P77, THREADS, source
from diag_overlap import check_and_time, prefer_shared

VEC = 8


def looped_source(has_bias: bool) -> str:
    """diag_expand's expand_phase with a grid-stride loop around its body: any number of programs."""
    text = source(OUT_SHAPE[2:], (1, 1, 1), (2, 2, 2), COMPACT[2:], OUT_SHAPE[1], has_bias, False, VEC)
    head = (f"const Index first = ((Index)blockIdx.x * {THREADS} + threadIdx.x) * {VEC};\n"
            "    if (first >= total) return;")
    if head not in text:
        raise RuntimeError("diag_expand's source changed: its first lines are not as expected")
    loop = (f"for (Index first = ((Index)blockIdx.x * {THREADS} + threadIdx.x) * {VEC}; first < total;\n"
            f"         first += (Index)gridDim.x * {THREADS * VEC}) {{")
    return text.replace(head, loop).rstrip() + "\n}\n"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--chunks", default="1,2,4,8")
    parser.add_argument("--programs", default="132,264,all")
    parser.add_argument("--modes", default="FP16,3xFP16")
    args = parser.parse_args()
    chunk_counts = [int(c) for c in args.chunks.split(",")]
    torch.manual_seed(0)
    w = torch.randn(32, 64, 3, 3, 3, device="cuda") * 0.02
    x = torch.rand(16, 32, 16, 32, 32, device="cuda")
    bias = None  # problem 77 has none
    plan = make_plan(tuple(x.shape), tuple(w.shape), (2,) * 3, (1,) * 3, (0,) * 3, 1, (2,) * 3)
    phase_list = tuple(p for _, p in _regions(plan, True) if p is not None)
    batch = OUT_SHAPE[0]
    per_sample = torch.Size(OUT_SHAPE[1:]).numel()
    kernel = cuda._Kernel(looped_source(bias is not None), "expand_phase", 0, THREADS)
    kernel_carveout = cuda._Kernel(looped_source(bias is not None), "expand_phase", 0, THREADS)
    prefer_shared(kernel_carveout.function)
    side = torch.cuda.Stream()
    rows = []

    def row(mode, what, fn, check=""):
        t = time_cuda(fn, iters=args.iters)
        rows.append((mode, what, f"{t.mean_ms:.4f}", f"{t.min_ms:.4f}", check))
        print(rows[-1], flush=True)

    def expand(compact, out, samples, programs, carveout):
        """out's first samples from compact's, on the current stream."""
        total = samples * per_sample
        grid = -(-total // (VEC * THREADS)) if programs == "all" else int(programs)
        (kernel_carveout if carveout else kernel).launch(
            grid, (compact.data_ptr(), 0 if bias is None else bias.data_ptr(), out.data_ptr()), (), (total,),
            _current_stream(torch.cuda.current_device()))

    out = torch.empty(OUT_SHAPE, device="cuda")
    compact = torch.randn(COMPACT, device="cuda")
    expected = torch.zeros(OUT_SHAPE, device="cuda")
    expected[:, :, 1::2, 1::2, 1::2] = compact
    for programs in args.programs.split(","):
        out.fill_(float("nan"))
        expand(compact, out, batch, programs, programs != "all")
        row("-", f"expand alone, {programs} programs", lambda: expand(compact, out, batch, programs, programs != "all"),
            f"equal {bool(torch.equal(out, expected))}")
    del expected
    row("-", "out.zero_()", out.zero_)

    for mode in args.modes.split(","):
        split = {"FP16": 3, "3xFP16": 2}[mode]
        torch.backends.cudnn.allow_tf32 = split == 3
        reference = F.conv_transpose3d(x.double(), w.double(), None, **P77)
        eager = F.conv_transpose3d(x, w, None, **P77)
        start, extent, launches = cuda_phases._forward_geometry(plan, phase_list, split)
        counts, dilation, grid, ((phases, offsets, firsts, steps),) = launches[0]  # its one phase

        def operands():
            return correlation_operands(x, 0, x.shape, x.stride(), start, extent, w, False, split=split)

        def correlate(window, taps, scales, result, n0, n1):
            """The compact correlation of samples n0 to n1 (the window's and block maxima's samples, the result's)."""
            part_scales = None if scales is None else (scales[0][n0:n1], *scales[1:])
            cuda.correlate(window[n0:n1], taps, None, result[n0:n1], 0, result.stride(), grid, offsets, counts,
                           firsts, steps, dilation, part_scales, split)

        window, taps, scales = operands()
        row(mode, "correlation, compact output, operands made before",
            lambda: correlate(window, taps, scales, compact, 0, batch))
        for chunks in chunk_counts[1:]:
            size = batch // chunks
            row(mode, f"the same in {chunks} chunks, one stream",
                lambda: [correlate(window, taps, scales, compact, n0, n0 + size) for n0 in range(0, batch, size)])
        events = [torch.cuda.Event() for _ in range(max(chunk_counts))]

        def pipeline(chunks, programs, two_streams=True, carveout=True):
            size = batch // chunks

            def forward():
                y = torch.empty(OUT_SHAPE, device="cuda")
                result = torch.empty(COMPACT, device="cuda")
                window, taps, scales = operands()
                main = torch.cuda.current_stream()
                for k, n0 in enumerate(range(0, batch, size)):
                    correlate(window, taps, scales, result, n0, n0 + size)
                    if two_streams:
                        events[k].record(main)
                        side.wait_event(events[k])
                        with torch.cuda.stream(side):
                            expand(result[n0:], y[n0:], size, programs, carveout)
                    else:
                        expand(result[n0:], y[n0:], size, programs, carveout)
                if two_streams:
                    main.wait_stream(side)
                return y
            return forward

        library = lambda: convt3d.conv_transpose3d(x, w, None, backend="torch", **P77)
        torch.cuda.empty_cache()
        expected = library()
        forms = [("library: fill, operand pass, correlation into the lattice", library),
                 ("operand pass, compact correlation, expand (all programs), one stream", pipeline(1, "all", False))]
        for chunks in chunk_counts:
            for programs in args.programs.split(","):
                forms.append((f"{chunks} chunks, expand on a second stream, {programs} programs"
                              f"{', carveout' if programs != 'all' else ''}",
                              pipeline(chunks, programs, True, programs != "all")))
        check_and_time(forms, expected, reference, eager, mode, row)
        del expected, reference, eager
    torch.backends.cudnn.allow_tf32 = True
    print(markdown_table(["mode", "what", "mean ms", "min ms", "check"], rows))


if __name__ == "__main__":
    main()
