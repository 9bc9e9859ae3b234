"""Problem 77's forward as the compact phase correlation and one pass that writes the whole output from it (the
expand pass, a CUDA kernel here), against the library's fill and correlation into the lattice. Tried in the
thirty-second session and not taken into the library: the expand pass took 0.176 ms against out.zero_()'s 0.125, and
the forward so made 0.317 against 0.315 (benchmarks/RESULTS.md).

    PYTHONPATH=src python3 benchmarks/diag_expand.py [--iters 50]

Why: problem 77 has one phase some tap reaches (1 output element in 8.5). The library fills the whole output, then
the correlation writes the phase's lattice into it, the second time in half-written sectors that the L2 merges with
DRAM. Here the correlation writes a compact result and expand_phase writes every output element once: the compact
value plus bias on the lattice, bias (or zero) elsewhere, in 16-byte stores, reading the compact result once.

A thread takes VEC consecutive elements of the output (flat, rows of W elements). With W >= VEC they span at most two
rows: the thread divides its first element's index by the sizes (compile-time constants) once, finds for both rows
whether they lie on the lattice and where their compact row starts, and per element tests only its column. A first
version stepped every element's (n, c, d, h, w) with carries and tested all three axes: 0.215-0.24 ms, bound by those
integer instructions.

Rows: bench.protocol.time_cuda's mean and minimum in ms (L2 flushed before each call). Every output is NaN-poisoned
before its first call and compared with its reference: the expand pass alone with PyTorch's strided copy of the same
compact tensor (exactly), the whole forward with float64 (relative error) and with F.conv_transpose3d in the same
mode (KernelBench's check).
"""

import argparse

import torch
import torch.nn.functional as F

import convt3d
from convt3d.backends import cuda
from convt3d.backends.cuda import phases as cuda_phases
from convt3d.backends.triton.launch import _current_stream
from convt3d.backends.triton.window import correlation_operands
from convt3d.backends.torch_phase import _regions
from convt3d.bench.protocol import kernelbench_check, relative_error, time_cuda
from convt3d.bench.report import markdown_table
from convt3d.plan import make_plan

THREADS = 256
VEC = 8


def source(out_sizes, lattice_starts, strides, counts, channels: int, has_bias: bool, wide_index: bool,
           vec: int = VEC) -> str:
    """CUDA source of expand_phase for an output of spatial out_sizes (D, H, W) and channels, whose phase lattice
    starts at lattice_starts with strides and counts (QD, QH, QW) per axis; wide_index where the output has 2**32
    elements or more. Needs W >= vec (at most one row change within a thread's elements) and vec a multiple of 4."""
    (d, h, w), (od, oh, ow), (sd, sh, sw), (qd, qh, qw) = out_sizes, lattice_starts, strides, counts
    if w < vec or vec % 4:
        raise ValueError(f"expand_phase needs W >= vec and vec a multiple of 4, got W={w}, vec={vec}")
    index = "unsigned long long" if wide_index else "unsigned int"
    bias = "bias[next ? r1.c : r0.c]" if has_bias else "0.0f"
    return f"""
typedef {index} Index;

// An output row (its n, c, d, h): whether it lies on the lattice, its compact row's first element, its channel.
struct Row {{ bool on; Index base; unsigned c; }};

__device__ __forceinline__ Row row_of(Index nc, unsigned d, unsigned h)
{{
    // Unsigned: a place before the lattice's start wraps to a large number and fails the count test.
    const unsigned rd = d - {od}u, rh = h - {oh}u;
    Row r;
    r.on = rd % {sd}u == 0 && rd / {sd}u < {qd}u && rh % {sh}u == 0 && rh / {sh}u < {qh}u;
    r.base = ((nc * {qd}u + rd / {sd}u) * {qh}u + rh / {sh}u) * {qw}u;
    r.c = (unsigned)(nc % {channels}u);
    return r;
}}

extern "C" __global__ void __launch_bounds__({THREADS}) expand_phase(
    const float* __restrict__ compact, const float* __restrict__ bias, float* __restrict__ out, unsigned long long total)
{{
    const Index first = ((Index)blockIdx.x * {THREADS} + threadIdx.x) * {vec};
    if (first >= total) return;
    const Index row = first / {w}u;
    const unsigned w0 = (unsigned)(first - row * {w}u);
    const Index plane = row / {h}u;
    const unsigned h = (unsigned)(row - plane * {h}u);
    const Index nc = plane / {d}u;
    const unsigned d = (unsigned)(plane - nc * {d}u);
    const Row r0 = row_of(nc, d, h);
    // The next row, where the thread's elements reach it.
    Row r1 = r0;
    if (w0 + {vec} > {w}u) {{
        if (h + 1 < {h}u) r1 = row_of(nc, d, h + 1);
        else if (d + 1 < {d}u) r1 = row_of(nc, d + 1, 0);
        else r1 = row_of(nc + 1, 0, 0);
    }}
    float v[{vec}];
#pragma unroll
    for (int j = 0; j < {vec}; ++j) {{
        const bool next = w0 + j >= {w}u;
        const unsigned rw = (next ? w0 + j - {w}u : w0 + j) - {ow}u;
        float value = {bias};
        if ((next ? r1.on : r0.on) && rw % {sw}u == 0 && rw / {sw}u < {qw}u && first + j < total)
            value += compact[(next ? r1.base : r0.base) + rw / {sw}u];
        v[j] = value;
    }}
    if (first + {vec} <= total) {{
#pragma unroll
        for (int j = 0; j < {vec}; j += 4)
            *reinterpret_cast<float4*>(out + first + j) = make_float4(v[j], v[j + 1], v[j + 2], v[j + 3]);
    }} else {{
        for (int j = 0; first + j < total; ++j) out[first + j] = v[j];
    }}
}}
"""


P77 = dict(stride=2, padding=1, dilation=2)
OUT_SHAPE = (16, 64, 33, 65, 65)
COMPACT = (16, 64, 16, 32, 32)


def expander(vec: int, has_bias: bool):
    kernel = cuda._Kernel(source(OUT_SHAPE[2:], (1, 1, 1), (2, 2, 2), COMPACT[2:], OUT_SHAPE[1], has_bias, False, vec),
                          "expand_phase", 0, THREADS)
    total = torch.Size(OUT_SHAPE).numel()
    blocks = -(-total // (vec * THREADS))

    def run(compact, bias, out):
        kernel.launch(blocks, (compact.data_ptr(), 0 if bias is None else bias.data_ptr(), out.data_ptr()), (),
                      (total,), _current_stream(0))
    return run


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=50)
    args = parser.parse_args()
    torch.manual_seed(0)
    w = torch.randn(32, 64, 3, 3, 3, device="cuda") * 0.02
    x = torch.rand(16, 32, 16, 32, 32, device="cuda")
    bias = torch.randn(64, device="cuda")
    plan = make_plan(tuple(x.shape), tuple(w.shape), (2,) * 3, (1,) * 3, (0,) * 3, 1, (2,) * 3)
    phase_list = tuple(p for _, p in _regions(plan, True) if p is not None)
    rows = []

    def row(mode, what, fn, error=""):
        t = time_cuda(fn, iters=args.iters)
        rows.append((mode, what, f"{t.mean_ms:.4f}", f"{t.min_ms:.4f}", error))
        print(rows[-1], flush=True)

    out = torch.empty(OUT_SHAPE, device="cuda")
    row("-", "out.zero_()", out.zero_)
    compact = torch.randn(COMPACT, device="cuda")
    for has_bias in (False, True):
        b = bias if has_bias else None
        expected = torch.zeros(OUT_SHAPE, device="cuda") if b is None else b.view(1, -1, 1, 1, 1).expand(
            OUT_SHAPE).contiguous()
        expected[:, :, 1::2, 1::2, 1::2] += compact
        for vec in (4, 8, 16):
            run = expander(vec, has_bias)
            out.fill_(float("nan"))
            run(compact, b, out)
            exact = bool(torch.equal(out, expected))
            row("-", f"expand alone, vec {vec}, bias {has_bias}", lambda: run(compact, b, out), f"equal {exact}")
    del expected

    for mode, split in (("FP16", 3), ("3xFP16", 2)):
        tf32 = split == 3
        torch.backends.cudnn.allow_tf32 = tf32
        reference = F.conv_transpose3d(x.double(), w.double(), bias.double(), **P77)
        eager = F.conv_transpose3d(x, w, bias, **P77)
        start, extent, launches = cuda_phases._forward_geometry(plan, phase_list, split)
        counts, dilation, grid, ((phases, offsets, firsts, steps),) = launches[0]  # its one phase
        run = expander(8, True)
        compact = torch.empty(COMPACT, device="cuda")

        def operands():
            return correlation_operands(x, 0, x.shape, x.stride(), start, extent, w, False, split=split)

        window, taps, scales = operands()
        into_compact = lambda: cuda.correlate(window, taps, None, compact, 0, compact.stride(), grid, offsets, counts,
                                              firsts, steps, dilation, scales, split)
        row(mode, "correlation, compact output (operands made before)", into_compact)

        def new_forward():
            y = torch.empty(OUT_SHAPE, device="cuda")
            window, taps, scales = operands()
            result = torch.empty(COMPACT, device="cuda")
            cuda.correlate(window, taps, None, result, 0, result.stride(), grid, offsets, counts, firsts, steps,
                           dilation, scales, split)
            run(result, bias, y)
            return y

        old_forward = lambda: convt3d.conv_transpose3d(x, w, bias, backend="torch", **P77)
        for name, forward in (("forward now: fill, correlation into the lattice", old_forward),
                              ("forward: compact correlation, expand (vec 8)", new_forward)):
            torch.cuda.empty_cache()
            poisoned = torch.full(OUT_SHAPE, float("nan"), device="cuda")
            del poisoned  # the caching allocator hands this NaN block to the output, the forward's first allocation
            y = forward()
            row(mode, name, forward,
                f"{relative_error(y, reference):.1e}, KB check {kernelbench_check(y, eager)}")
    torch.backends.cudnn.allow_tf32 = True
    print(markdown_table(["mode", "what", "mean ms", "min ms", "check"], rows))


if __name__ == "__main__":
    main()
