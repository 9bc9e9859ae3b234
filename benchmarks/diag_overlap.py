"""Problem 77's forward with the output's empty part written on a second stream while the correlation runs: does the
fill overlap the correlation when the fill's programs are few and stay resident beside the correlation's?

    PYTHONPATH=src python3 benchmarks/diag_overlap.py [--iters 50]

Why: the library fills the whole output (0.125 ms) and then writes the phase's lattice (0.17 ms): the two times add.
Earlier sessions ran out.zero_() on a second stream beside the correlation (twelfth session: no overlap at all) and
the gaps written by the correlation's own programs (twenty-fourth: their time added). zero_()'s grid takes every
multiprocessor's thread slots until it ends, so the correlation's programs wait for it; here gap_fill runs GRID
programs of 256 threads (about 30 registers each) in a loop over the output's planes, which fit beside two
correlation programs (206 registers x 128 threads and 82 KB of shared memory each) on a multiprocessor.

The output is split by rows. The lattice rows (odd depth and odd height: 136 MB of the 571) are written whole by
expand_rows from the compact correlation (its values on odd columns, bias or zero between them); every other row
(435 MB) by gap_fill. The two write disjoint memory, so they may run at the same time. A third form (complement)
leaves the correlation writing the lattice as the library does and fills every other element, the lattice rows'
even columns included, beside it.

Rows: bench.protocol.time_cuda's mean and minimum in ms (L2 flushed before each call). Every output is NaN-poisoned
before its first call and compared with the library's (bitwise) and with float64 and eager (KernelBench's check).
--only planes (the second call) splits the output by planes instead: plane_fill writes the planes off the lattice
(contiguous, 294 MB), expand_planes the lattice planes whole from the compact correlation; carveout: the fill's
preferred shared-memory carveout at the most (a multiprocessor's L1/shared split is set as it starts a program).

What it found (thirty-third session, benchmarks/RESULTS.md): the rows' split is slow on its own (gap_fill 0.26-0.32
ms for 435 MB: the 260-byte rows leave half-written memory sectors at every row's ends); the fill overlapped the
correlation only where the correlation was launched first and the fill's few programs after it (0.178 ms for both
against 0.113 + 0.133 alone); no form of the forward here beat the library's 0.316-0.320 ms.
"""

import argparse
import ctypes

import torch
import torch.nn.functional as F

import convt3d
from convt3d.backends import cuda, driver
from convt3d.backends.cuda import phases as cuda_phases
from convt3d.backends.triton.launch import _current_stream
from convt3d.backends.triton.window import correlation_operands
from convt3d.backends.torch_phase import _regions, _lattice_geometry
from convt3d.bench.protocol import kernelbench_check, relative_error, time_cuda
from convt3d.bench.report import markdown_table
from convt3d.plan import make_plan

THREADS = 256
P77 = dict(stride=2, padding=1, dilation=2)
OUT_SHAPE = (16, 64, 33, 65, 65)
COMPACT = (16, 64, 16, 32, 32)
# The lattice: start 1, step 2, per axis (depth, height, width).
START, STEP = 1, 2

HEAD = f"""
#define NC {OUT_SHAPE[0] * OUT_SHAPE[1]}u
#define C {OUT_SHAPE[1]}u
#define D {OUT_SHAPE[2]}u
#define H {OUT_SHAPE[3]}u
#define W {OUT_SHAPE[4]}u
#define QD {COMPACT[2]}u
#define QH {COMPACT[3]}u
#define QW {COMPACT[4]}u
#define O {START}u
#define S {STEP}u
#define THREADS {THREADS}
// Unsigned: a place before the lattice's start wraps to a large number and fails the count test.
__device__ __forceinline__ bool on_lattice(unsigned i, unsigned count)
{{
    return (i - O) % S == 0 && (i - O) / S < count;
}}
"""

GAP_FILL = HEAD + r"""
// value over [0, n) from base: scalar stores up to the first 16-byte boundary and after the last, 16-byte stores
// between.
__device__ __forceinline__ void fill_range(float* base, unsigned n, float value)
{
    const unsigned head = min(n, (unsigned)((0u - (unsigned)(unsigned long long)base / 4u) & 3u));
    if (threadIdx.x < head) base[threadIdx.x] = value;
    float4* body = reinterpret_cast<float4*>(base + head);
    const unsigned chunks = (n - head) / 4;
    const float4 v = make_float4(value, value, value, value);
    for (unsigned k = threadIdx.x; k < chunks; k += THREADS) body[k] = v;
    for (unsigned e = head + 4 * chunks + threadIdx.x; e < n; e += THREADS) base[e] = value;
}

// Every element outside the lattice rows (COMPLEMENT: outside the lattice itself) gets its channel's bias or zero.
extern "C" __global__ void __launch_bounds__(THREADS) gap_fill(const float* __restrict__ bias,
                                                                float* __restrict__ out)
{
    for (unsigned plane = blockIdx.x; plane < NC * D; plane += gridDim.x) {
        const unsigned nc = plane / D, d = plane - nc * D;
        const float value = HAS_BIAS ? bias[nc % C] : 0.f;
        float* base = out + (unsigned long long)plane * (H * W);
        if (!on_lattice(d, QD)) {
            fill_range(base, H * W, value);
        } else {
            for (unsigned i = threadIdx.x; i < H * W; i += THREADS) {
                const unsigned h = i / W;
                if (!on_lattice(h, QH) || (COMPLEMENT && !on_lattice(i - h * W, QW))) base[i] = value;
            }
        }
    }
}
"""

EXPAND_ROWS = HEAD + r"""
// The lattice rows whole: the compact value (plus bias) on lattice columns, bias or zero between them.
extern "C" __global__ void __launch_bounds__(THREADS) expand_rows(const float* __restrict__ compact,
    const float* __restrict__ bias, float* __restrict__ out)
{
    const unsigned i = blockIdx.x * THREADS + threadIdx.x;
    if (i >= NC * QD * QH * W) return;
    const unsigned r = i / W, w = i - r * W;  // r: the compact row (nc, qd, qh)
    const unsigned nc = r / (QD * QH), qdh = r - nc * (QD * QH), qd = qdh / QH, qh = qdh - qd * QH;
    float value = HAS_BIAS ? bias[nc % C] : 0.f;
    if (on_lattice(w, QW)) value += compact[r * QW + (w - O) / S];
    out[((nc * D + O + S * qd) * H + O + S * qh) * W + w] = value;
}
"""

PLANE_FILL = GAP_FILL.split("// Every element outside")[0] + r"""
// Every plane off the lattice (whole planes, contiguous: whole memory sectors but at their ends) gets bias or zero.
extern "C" __global__ void __launch_bounds__(THREADS) plane_fill(const float* __restrict__ bias,
                                                                  float* __restrict__ out)
{
    for (unsigned plane = blockIdx.x; plane < NC * D; plane += gridDim.x) {
        const unsigned nc = plane / D, d = plane - nc * D;
        if (!on_lattice(d, QD))
            fill_range(out + (unsigned long long)plane * (H * W), H * W, HAS_BIAS ? bias[nc % C] : 0.f);
    }
}
"""

EXPAND_PLANES = HEAD + r"""
// The lattice planes whole: the compact value (plus bias) on the lattice, bias or zero elsewhere in the plane.
extern "C" __global__ void __launch_bounds__(THREADS) expand_planes(const float* __restrict__ compact,
    const float* __restrict__ bias, float* __restrict__ out)
{
    const unsigned i = blockIdx.x * THREADS + threadIdx.x;
    if (i >= NC * QD * H * W) return;
    const unsigned p = i / (H * W), e = i - p * (H * W), h = e / W, w = e - h * W;  // p: the compact plane (nc, qd)
    const unsigned nc = p / QD, qd = p - nc * QD;
    float value = HAS_BIAS ? bias[nc % C] : 0.f;
    if (on_lattice(h, QH) && on_lattice(w, QW)) value += compact[(p * QH + (h - O) / S) * QW + (w - O) / S];
    out[(nc * D + O + S * qd) * (H * W) + e] = value;
}
"""


def kernel(source: str, name: str, carveout: bool = False, **macros):
    """The kernel compiled with these macros; carveout: its preferred shared-memory carveout set to the most (a
    multiprocessor's L1/shared split is set when it starts a program, and programs that want another split cannot
    join it until it drains)."""
    head = "".join(f"#define {k} {int(v)}\n" for k, v in macros.items())
    compiled = cuda._Kernel(head + source, name, 0, THREADS)
    if carveout:
        prefer_shared(compiled.function)
    return compiled


def prefer_shared(function) -> None:
    libcuda = driver.libcuda()
    libcuda.cuFuncSetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    driver.check(libcuda.cuFuncSetAttribute(function, 9, 100))  # CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT


def checked(forward, expected, reference, eager) -> str:
    """forward's output, into memory NaN-poisoned before, against the library's (bitwise), float64 (relative error)
    and eager (KernelBench's check), as a line for the table."""
    torch.cuda.empty_cache()
    poisoned = torch.full(OUT_SHAPE, float("nan"), device="cuda")
    del poisoned  # the caching allocator hands this NaN block to the output, the forward's first allocation
    y = forward()
    torch.cuda.synchronize()
    return (f"equal to library {bool(torch.equal(y, expected))}, {relative_error(y, reference):.1e}, "
            f"KB check {kernelbench_check(y, eager)}")


def check_and_time(forms, expected, reference, eager, mode, row):
    """Each (name, forward) of forms: checked, then row(mode, name, forward, check)."""
    for name, forward in forms:
        row(mode, name, forward, checked(forward, expected, reference, eager))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--only", default="rows,planes", help="rows (split by rows), planes (split by planes)")
    args = parser.parse_args()
    parts = args.only.split(",")
    torch.manual_seed(0)
    w = torch.randn(32, 64, 3, 3, 3, device="cuda") * 0.02
    x = torch.rand(16, 32, 16, 32, 32, device="cuda")
    plan = make_plan(tuple(x.shape), tuple(w.shape), (2,) * 3, (1,) * 3, (0,) * 3, 1, (2,) * 3)
    phase_list = tuple(p for _, p in _regions(plan, True) if p is not None)
    side = torch.cuda.Stream()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    planes = OUT_SHAPE[0] * OUT_SHAPE[1] * OUT_SHAPE[2]
    nc, qd, qh = COMPACT[0] * COMPACT[1], *COMPACT[2:4]
    blocks = {"expand_rows": -(-(nc * qd * qh * OUT_SHAPE[4]) // THREADS),
              "expand_planes": -(-(nc * qd * OUT_SHAPE[3] * OUT_SHAPE[4]) // THREADS)}
    sources = {"gap_fill": GAP_FILL, "plane_fill": PLANE_FILL, "expand_rows": EXPAND_ROWS,
               "expand_planes": EXPAND_PLANES}
    kernels = {}

    def compiled(name, bias, carveout=False, complement=False):
        key = (name, bias is not None, carveout, complement)
        if key not in kernels:
            kernels[key] = kernel(sources[name], name, carveout, HAS_BIAS=bias is not None, COMPLEMENT=complement)
        return kernels[key]

    def fill(name, out, bias, grid, carveout=False, complement=False):
        """gap_fill or plane_fill over grid programs."""
        compiled(name, bias, carveout, complement).launch(
            grid, (0 if bias is None else bias.data_ptr(), out.data_ptr()), (), (), _current_stream(0))

    def expand(name, compact, bias, out):
        compiled(name, bias).launch(blocks[name], (compact.data_ptr(), 0 if bias is None else bias.data_ptr(),
                                                   out.data_ptr()), (), (), _current_stream(0))

    def forked(side_work, main_work):
        """side_work on the second stream, launched first, beside main_work on the current one; joined."""
        main = torch.cuda.current_stream()
        side.wait_stream(main)
        with torch.cuda.stream(side):
            side_work()
        result = main_work()
        main.wait_stream(side)
        return result

    rows = []

    def row(mode, what, fn, check=""):
        t = time_cuda(fn, iters=args.iters)
        rows.append((mode, what, f"{t.mean_ms:.4f}", f"{t.min_ms:.4f}", check))
        print(rows[-1], flush=True)

    out = torch.empty(OUT_SHAPE, device="cuda")
    row("-", "out.zero_()", out.zero_)
    if "rows" in parts:
        for grid in (sms, 2 * sms, 4 * sms, planes):
            row("-", f"gap_fill alone, {grid} programs", lambda: fill("gap_fill", out, None, grid))
        row("-", f"complement fill alone, {2 * sms} programs",
            lambda: fill("gap_fill", out, None, 2 * sms, False, True))
    if "planes" in parts:
        for grid, carveout in ((sms, True), (2 * sms, False), (planes, False)):
            row("-", f"plane_fill alone, {grid} programs{', carveout' if carveout else ''}",
                lambda: fill("plane_fill", out, None, grid, carveout))

    # Each form's output, with and without bias, against the strided reference (NaN-poisoned first).
    bias = torch.randn(64, device="cuda")
    compact = torch.randn(COMPACT, device="cuda")
    for b in (None, bias):
        expected = torch.zeros(OUT_SHAPE, device="cuda") if b is None else b.view(1, -1, 1, 1, 1).expand(
            OUT_SHAPE).contiguous()
        expected[:, :, 1::2, 1::2, 1::2] += compact
        if "rows" in parts:
            out.fill_(float("nan"))
            fill("gap_fill", out, b, 2 * sms)
            expand("expand_rows", compact, b, out)
            print("gap_fill + expand_rows equal to the strided reference, bias", b is not None,
                  bool(torch.equal(out, expected)), flush=True)
            out.fill_(float("nan"))
            fill("gap_fill", out, b, 2 * sms, False, True)
            out[:, :, 1::2, 1::2, 1::2] = expected[:, :, 1::2, 1::2, 1::2]
            print("complement fill equal, bias", b is not None, bool(torch.equal(out, expected)), flush=True)
        if "planes" in parts:
            out.fill_(float("nan"))
            fill("plane_fill", out, b, sms, True)
            expand("expand_planes", compact, b, out)
            print("plane_fill + expand_planes equal to the strided reference, bias", b is not None,
                  bool(torch.equal(out, expected)), flush=True)
    del expected
    if "rows" in parts:
        row("-", "expand_rows alone", lambda: expand("expand_rows", compact, None, out))
    if "planes" in parts:
        row("-", "expand_planes alone", lambda: expand("expand_planes", compact, None, out))

    for mode, split in (("FP16", 3), ("3xFP16", 2)):
        torch.backends.cudnn.allow_tf32 = split == 3
        reference = F.conv_transpose3d(x.double(), w.double(), None, **P77)
        eager = F.conv_transpose3d(x, w, None, **P77)
        start, extent, launches = cuda_phases._forward_geometry(plan, phase_list, split)
        counts, dilation, grid, ((phases, offsets, firsts, steps),) = launches[0]  # its one phase
        lattice_offset, _, lattice_strides = _lattice_geometry(plan, phases, out.stride())

        def operands():
            return correlation_operands(x, 0, x.shape, x.stride(), start, extent, w, False, split=split)

        def correlate(window, taps, scales, y, offset, strides):
            cuda.correlate(window, taps, None, y, offset, strides, grid, offsets, counts, firsts, steps, dilation,
                           scales, split)

        window, taps, scales = operands()
        compact = torch.empty(COMPACT, device="cuda")
        into_compact = lambda: correlate(window, taps, scales, compact, 0, compact.stride())
        row(mode, "correlation, compact output (operands made before)", into_compact)
        row(mode, "correlation into the lattice (operands made before)",
            lambda: correlate(window, taps, scales, out, lattice_offset, lattice_strides))
        if "rows" in parts:
            for g in (sms, 2 * sms):
                row(mode, f"gap_fill ({g}) on a second stream beside the compact correlation",
                    lambda: forked(lambda: fill("gap_fill", out, None, g), into_compact))
        if "planes" in parts:
            row(mode, f"plane_fill ({sms}, carveout) on a second stream beside the compact correlation",
                lambda: forked(lambda: fill("plane_fill", out, None, sms, True), into_compact))
            row(mode, f"gap_fill ({sms}, carveout) on a second stream beside the compact correlation",
                lambda: forked(lambda: fill("gap_fill", out, None, sms, True), into_compact))
            row(mode, f"the compact correlation, then plane_fill ({sms}, carveout) on a second stream",
                lambda: forked(into_compact, lambda: fill("plane_fill", out, None, sms, True)))

        def split(fill_name, expand_name, g, carveout=False, fork=True):
            """The forward with the output split between fill_name (g programs) and expand_name (from the compact
            correlation), the fill on a second stream (fork) or first on the same one."""
            def forward():
                y = torch.empty(OUT_SHAPE, device="cuda")
                result = torch.empty(COMPACT, device="cuda")

                def main_work():
                    window, taps, scales = operands()
                    correlate(window, taps, scales, result, 0, result.stride())
                    expand(expand_name, result, None, y)
                if fork:
                    forked(lambda: fill(fill_name, y, None, g, carveout), main_work)
                else:
                    fill(fill_name, y, None, g, carveout)
                    main_work()
                return y
            return forward

        def complement(g):
            def forward():
                y = torch.empty(OUT_SHAPE, device="cuda")

                def main_work():
                    window, taps, scales = operands()
                    correlate(window, taps, scales, y, lattice_offset, lattice_strides)
                forked(lambda: fill("gap_fill", y, None, g, False, True), main_work)
                return y
            return forward

        library = lambda: convt3d.conv_transpose3d(x, w, None, backend="torch", **P77)
        torch.cuda.empty_cache()
        expected = library()
        forms = [("library: fill, correlation into the lattice", library)]
        if "rows" in parts:
            for g in (sms, 2 * sms):
                forms.append((f"split rows, gap_fill ({g}) on a second stream", split("gap_fill", "expand_rows", g)))
            forms.append((f"split rows, one stream ({2 * sms})", split("gap_fill", "expand_rows", 2 * sms,
                                                                        fork=False)))
            for g in (sms, 2 * sms):
                forms.append((f"complement fill ({g}) on a second stream, correlation into the lattice",
                              complement(g)))
        if "planes" in parts:
            forms.append((f"split planes, plane_fill ({sms}, carveout) on a second stream",
                          split("plane_fill", "expand_planes", sms, carveout=True)))
            forms.append((f"split planes, one stream ({planes})",
                          split("plane_fill", "expand_planes", planes, fork=False)))
        check_and_time(forms, expected, reference, eager, mode, row)
        if "planes" in parts:
            # Last in the mode (the attribute stays): the correlation's own carveout at the most as well.
            rows_per_tile = cuda.tile_rows(32, 64, counts, dilation, split, COMPACT[0], grid)
            prefer_shared(cuda._kernel(0, 32, 64, counts, dilation, False, split, rows_per_tile).function)
            row(mode, f"plane_fill ({sms}) beside the compact correlation, both carveouts at the most",
                lambda: forked(lambda: fill("plane_fill", out, None, sms, True), into_compact))
            forward = split("plane_fill", "expand_planes", sms, carveout=True)
            y = forward()
            torch.cuda.synchronize()
            row(mode, "split planes on two streams, both carveouts at the most", forward,
                f"equal to library {bool(torch.equal(y, expected))}")
            del y
        del expected, reference, eager
    torch.backends.cudnn.allow_tf32 = True
    print(markdown_table(["mode", "what", "mean ms", "min ms", "check"], rows))


if __name__ == "__main__":
    main()
