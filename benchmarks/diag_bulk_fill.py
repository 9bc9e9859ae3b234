"""Can the output's fill overlap the forward correlation (GPU, problem 77)? A fill by the copy engine of each
multiprocessor (cp.async.bulk from a zeroed shared-memory buffer: one thread issues every store, so a program of one
warp per multiprocessor can stay beside the correlation's programs) timed alone and beside the compact correlation on
a second stream, against out.zero_() (which takes every multiprocessor, so the twelfth session's two streams did not
overlap: 0.287 ms against 0.157 + 0.125).

    PYTHONPATH=src python3 benchmarks/diag_bulk_fill.py [--iters 50]

Rows: bench.protocol.time_cuda's mean and minimum in ms (L2 flushed, GPU idle before each call). The fill is
checked once (a NaN-filled buffer must come back all zero).
"""

import argparse

import torch

from convt3d.backends import cuda
from convt3d.backends.cuda import phases as cuda_phases
from convt3d.backends.torch_phase import _lattice_geometry, _regions
from convt3d.backends.triton.window import correlation_operands
from convt3d.bench.protocol import time_cuda
from convt3d.bench.workloads import PROBLEM_77

SOURCE = r"""
extern "C" __global__ void bulk_fill(float* out, int chunk_bytes, long long total_bytes) {
#if EVICT_FIRST  // the fill's lines first out of the L2, so that the correlation's input stays there
    unsigned long long policy;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
#endif
    extern __shared__ __align__(128) float zeros[];
    for (int i = threadIdx.x; i < chunk_bytes / 4; i += blockDim.x) zeros[i] = 0.f;
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // the zeros visible to the copy engine
    __syncthreads();
    if (threadIdx.x != 0) return;
    const unsigned source = (unsigned)__cvta_generic_to_shared(zeros);
    const long long chunks = (total_bytes + chunk_bytes - 1) / chunk_bytes;
    for (long long i = blockIdx.x; i < chunks; i += gridDim.x) {
        const long long at = i * chunk_bytes;
        const int bytes = (int)min((long long)chunk_bytes, total_bytes - at);
#if EVICT_FIRST
        asm volatile("cp.async.bulk.global.shared::cta.bulk_group.L2::cache_hint [%0], [%1], %2, %3;\n"
                     :: "l"((char*)out + at), "r"(source), "r"(bytes), "l"(policy) : "memory");
#else
        asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n"
                     :: "l"((char*)out + at), "r"(source), "r"(bytes) : "memory");
#endif
        asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
    }
    asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");  // shared memory stays until every copy is done
}
"""


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=50)
    iters = parser.parse_args().iters
    torch.manual_seed(0)
    eager, _, x, _ = PROBLEM_77.training_case(torch.device("cuda"))
    x = x.detach()
    plan = PROBLEM_77.plan()
    out = torch.full(plan.output_shape, float("nan"), device="cuda")
    stream = lambda: torch.cuda.current_stream().cuda_stream
    kernels = {}

    def bulk_fill(target, programs, chunk, evict_first=False):
        kernel = kernels.get((chunk, evict_first))
        if kernel is None:  # (its shared memory: one chunk of zeros)
            kernel = kernels[chunk, evict_first] = cuda._Kernel(f"#define EVICT_FIRST {int(evict_first)}\n" + SOURCE,
                                                                "bulk_fill", chunk, 32)
        kernel.launch(programs, (target.data_ptr(),), (chunk,), (target.numel() * 4,), stream())

    bulk_fill(out, 132, 16384)
    torch.cuda.synchronize()
    print("bulk fill leaves", int((out != 0).sum()), "non-zero elements of", out.numel(), flush=True)

    phase_list = tuple(p for _, p in _regions(plan, True) if p is not None)
    start, extent, launches = cuda_phases._forward_geometry(plan, phase_list, False)
    window, taps, _ = correlation_operands(x, 0, x.shape, x.stride(), start, extent, eager.weight, False)
    counts, dilation, grid, ((phases, offsets, firsts, steps),) = launches[0]  # its one phase
    compact = torch.empty(16, 64, 16, 32, 32, device="cuda")
    correlate = lambda target, offset, strides: cuda.correlate(window, taps, None, target, offset, strides, grid,
                                                               offsets, counts, firsts, steps, dilation)
    offset, _, strides = _lattice_geometry(plan, phases, out.stride())
    side = torch.cuda.Stream()
    rows = []

    def row(what, fn):
        t = time_cuda(fn, iters=iters)
        rows.append((what, t.mean_ms, t.min_ms))
        print(rows[-1], flush=True)

    def beside(fill, fill_first=True):
        def run():
            side.wait_stream(torch.cuda.current_stream())
            if not fill_first:
                correlate(compact, 0, compact.stride())
            with torch.cuda.stream(side):
                fill()
            if fill_first:
                correlate(compact, 0, compact.stride())
            torch.cuda.current_stream().wait_stream(side)
        return run

    row("out.zero_()", out.zero_)
    for programs in (132,):
        for chunk in (16384,):
            row(f"bulk fill, {programs} programs of one warp, {chunk} B chunks",
                lambda p=programs, c=chunk: bulk_fill(out, p, c))
    row("compact correlation alone", lambda: correlate(compact, 0, compact.stride()))
    row("compact correlation beside out.zero_() (second stream)", beside(out.zero_))
    for programs in (132,):
        row(f"compact correlation beside the bulk fill, {programs} programs, 16 KiB (second stream)",
            beside(lambda p=programs: bulk_fill(out, p, 16384)))
    row("bulk fill, 132 programs, 16 KiB, evict-first", lambda: bulk_fill(out, 132, 16384, True))
    row("compact correlation beside the bulk fill, 132 programs, 16 KiB, evict-first",
        beside(lambda: bulk_fill(out, 132, 16384, True)))
    row("the same, the correlation launched first", beside(lambda: bulk_fill(out, 132, 16384, True), False))
    row("compact correlation beside the bulk fill, 132 programs, 16 KiB, the correlation launched first",
        beside(lambda: bulk_fill(out, 132, 16384), False))
    row("the current design's pieces: out.zero_(), then the correlation into its lattice",
        lambda: (out.zero_(), correlate(out, offset, strides)))
    print("| what | mean ms | min ms |")
    print("|---|---|---|")
    for what, mean, low in rows:
        print(f"| {what} | {mean:.4f} | {low:.4f} |")


if __name__ == "__main__":
    main()
