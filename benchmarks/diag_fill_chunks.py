"""Problem 77's forward with the output filled by batch chunks on a second stream, each chunk's correlation (into the
lattice, as the library writes it) waiting only for its own chunk's fill: can the fill of chunk k+1 run beside the
correlation of chunk k?

    PYTHONPATH=src python3 benchmarks/diag_fill_chunks.py [--iters 50] [--splits "8,8;4,12;4,4,4,4"]

Why: the library's forward fills the whole output (0.125 ms), runs the operand pass, then the correlation writes the
phase's lattice into the filled output (0.165 in TF32 mode, 0.24 with TF32 off); the three add. Earlier sessions found
fills beside the correlation only of memory the correlation does not write (planes or rows off the lattice: partial
sectors, or an expand pass after a compact correlation, slower than zero_). Here the fill writes whole samples, 35.7
MB each, contiguous, and the correlation of a chunk writes into samples already filled, so no element is written by
both at once; the fill is bandwidth-bound and the correlation mostly MMA-bound.

Forms (--splits: the chunks' sample counts, ";" between splits):
- "queued": every chunk's fill queued on the side stream up front; the main stream runs the operand pass for the
  whole batch, then each chunk's correlation after its fill's event.
- "interleaved": the fill of chunk k+1 launched on the side stream only after chunk k's correlation was launched (so
  that the correlation's programs reach the multiprocessors first).
Fills: "zero_" (PyTorch's), or "span<P>": a CUDA grid-stride fill of P programs of 256 threads, 16-byte stores, its
shared-memory carveout at the most (so that its programs can share a multiprocessor with the correlation's).
"prio": the main stream at high priority, the side stream at low.

What it found (sixty-third session, benchmarks/RESULTS.md): no. No form's mean came below the library's 0.311-0.312 ms
(0.368-0.369 with TF32 off); the fill beside the correlation took as long as the two in turn or longer, with TF32 off
too, and chunks of 4 samples or fewer slowed the correlation itself.

Rows: bench.protocol.time_cuda's mean and minimum in ms (L2 flushed before each call). Every output is NaN-poisoned
before its first call and compared with the library's (bitwise), float64 (relative error) and F.conv_transpose3d in the
same mode (KernelBench's check).
"""

import argparse

import torch
import torch.nn.functional as F

import convt3d
from convt3d.backends import cuda
from convt3d.backends.cuda import phases as cuda_phases
from convt3d.backends.torch_phase import _lattice_geometry, _regions
from convt3d.backends.triton.launch import _current_stream
from convt3d.backends.triton.window import correlation_operands
from convt3d.bench.protocol import time_cuda
from convt3d.bench.report import markdown_table
from convt3d.plan import make_plan
from diag_expand import OUT_SHAPE, P77
from diag_overlap import check_and_time, prefer_shared

SPAN_FILL = r"""
extern "C" __global__ void __launch_bounds__(256) span_fill(float4* __restrict__ out, unsigned long long count)
{
    const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
    for (unsigned long long i = (unsigned long long)blockIdx.x * 256 + threadIdx.x; i < count;
         i += (unsigned long long)gridDim.x * 256)
        out[i] = zero;
}
"""


def chunk_bounds(sizes) -> list[tuple[int, int]]:
    """(first, end) samples of chunks of these sizes, in order."""
    ends = [sum(sizes[:k + 1]) for k in range(len(sizes))]
    return list(zip([0] + ends[:-1], ends))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--splits", default="8,8;4,12;4,4,4,4;2,6,8")
    parser.add_argument("--fills", default="zero_,span264")
    parser.add_argument("--modes", default="FP16,3xFP16")
    args = parser.parse_args()
    splits = [tuple(int(n) for n in s.split(",")) for s in args.splits.split(";")]
    torch.manual_seed(0)
    w = torch.randn(32, 64, 3, 3, 3, device="cuda") * 0.02
    x = torch.rand(16, 32, 16, 32, 32, device="cuda")
    plan = make_plan(tuple(x.shape), tuple(w.shape), (2,) * 3, (1,) * 3, (0,) * 3, 1, (2,) * 3)
    phase_list = tuple(p for _, p in _regions(plan, True) if p is not None)
    batch = OUT_SHAPE[0]
    span = cuda._Kernel(SPAN_FILL, "span_fill", 0, 256)
    prefer_shared(span.function)
    rows = []

    def row(mode, what, fn, check=""):
        t = time_cuda(fn, iters=args.iters)
        rows.append((mode, what, f"{t.mean_ms:.4f}", f"{t.min_ms:.4f}", check))
        print(rows[-1], flush=True)

    def fill(kind, out, n0, n1):
        """Zeros into out's samples n0 to n1, on the current stream."""
        part = out[n0:n1]
        if kind == "zero_":
            part.zero_()
        else:
            span.launch(int(kind[4:]), (part.data_ptr(),), (), (part.numel() // 4,),
                        _current_stream(torch.cuda.current_device()))

    out = torch.empty(OUT_SHAPE, device="cuda")
    for kind in args.fills.split(","):
        row("-", f"fill alone: {kind}", lambda: fill(kind, out, 0, batch))
    row("-", "fill alone: zero_ in 2 chunks", lambda: [fill("zero_", out, n0, n0 + 8) for n0 in (0, 8)])

    for mode in args.modes.split(","):
        split = {"FP16": 3, "3xFP16": 2}[mode]
        torch.backends.cudnn.allow_tf32 = split == 3
        reference = F.conv_transpose3d(x.double(), w.double(), None, **P77)
        eager = F.conv_transpose3d(x, w, None, **P77)
        start, extent, launches = cuda_phases._forward_geometry(plan, phase_list, split)
        counts, dilation, grid, ((phases, offsets, firsts, steps),) = launches[0]  # its one phase
        lattice_offset, _, lattice_strides = _lattice_geometry(plan, phases, out.stride())

        def operands():
            return correlation_operands(x, 0, x.shape, x.stride(), start, extent, w, False, split=split)

        def correlate(window, taps, scales, y, n0, n1):
            """The correlation of samples n0 to n1 into y's lattice, on the current stream."""
            part_scales = None if scales is None else (scales[0][n0:n1], *scales[1:])
            cuda.correlate(window[n0:n1], taps, None, y[n0:n1], lattice_offset, lattice_strides, grid, offsets,
                           counts, firsts, steps, dilation, part_scales, split)

        window, taps, scales = operands()
        row(mode, "correlation into the lattice alone, operands made before",
            lambda: correlate(window, taps, scales, out, 0, batch))
        for sizes in splits:
            row(mode, f"the same in chunks {sizes}, one stream",
                lambda: [correlate(window, taps, scales, out, a, b) for a, b in chunk_bounds(sizes)])

        def chunked(sizes, kind, order, priority):
            chunks = chunk_bounds(sizes)
            main_stream = torch.cuda.Stream(priority=-1 if priority else 0)
            side = torch.cuda.Stream(priority=0)
            events = [torch.cuda.Event() for _ in chunks]

            def forward():
                caller = torch.cuda.current_stream()
                main_stream.wait_stream(caller)
                side.wait_stream(caller)
                y = torch.empty(OUT_SHAPE, device="cuda")

                def fill_chunk(k):
                    with torch.cuda.stream(side):
                        fill(kind, y, *chunks[k])
                        events[k].record(side)

                if order == "queued":
                    for k in range(len(chunks)):
                        fill_chunk(k)
                else:
                    fill_chunk(0)
                with torch.cuda.stream(main_stream):
                    window, taps, scales = operands()
                    for k, (a, b) in enumerate(chunks):
                        main_stream.wait_event(events[k])
                        correlate(window, taps, scales, y, a, b)
                        if order == "interleaved" and k + 1 < len(chunks):
                            fill_chunk(k + 1)
                caller.wait_stream(main_stream)
                caller.wait_stream(side)
                y.record_stream(main_stream)
                y.record_stream(side)
                return y
            return forward

        library = lambda: convt3d.conv_transpose3d(x, w, None, backend="torch", **P77)
        torch.cuda.empty_cache()
        expected = library()
        forms = [("library: fill, operand pass, correlation into the lattice", library)]
        for sizes in splits:
            for kind in args.fills.split(","):
                for order in ("queued", "interleaved"):
                    for priority in (False, True):
                        forms.append((f"chunks {sizes}, {kind}, {order}{', prio' if priority else ''}",
                                      chunked(sizes, kind, order, priority)))
        check_and_time(forms, expected, reference, eager, mode, row)
        del expected, reference, eager
    torch.backends.cudnn.allow_tf32 = True
    print(markdown_table(["mode", "what", "mean ms", "min ms", "check"], rows))


if __name__ == "__main__":
    main()
