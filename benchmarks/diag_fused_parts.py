"""Problem 77's forward with the fill warpgroup (row_runs.py's FILL_WARPGROUP, the library's in both precision modes)
taken apart: what each part of the one kernel costs when the others are left out. (GPU)

    PYTHONPATH=src:tests python3 benchmarks/diag_fused_parts.py [--iters 100] [--rounds 2]
    PYTHONPATH=src:tests python3 benchmarks/diag_fused_parts.py --registers   # on a CPU with NVRTC: ptxas's report

Why: on the H200 the library's forward took 0.236-0.26 ms in TF32 mode (eightieth session) where writing the output
alone takes 0.125 and the correlation into a filled output's lattice alone 0.132 (seventieth session): the fill
warpgroup's stores and the computing warpgroup's work overlap by little. If the computing warpgroup alone (no fill)
takes about what the whole kernel takes, the correlation is the critical path and the fill is hidden; if the fill
alone does, the stores are; if each alone is well under the whole, they contend for something (the DRAM, the L2, the
multiprocessor's memory pipeline).

Forms:
- the library's kernel;
- what-ifs (wrong results, timed only): no fill (the fill warpgroup keeps its barriers but stores nothing); fill only
  (the computing warpgroup skips every depth tap: no plane loads, weights or MMAs, and writes its tile of bias
  values); no tile write (the computing warpgroup computes but does not write its lattice tile); the region fill alone
  (both of the last two); and one part of the correlation left out at a time, with the fill or without: the weight
  copies of every depth tap but the first, the plane's loads (zeros stored instead), the MMAs;
- the lattice plane written once, whole, from the staged tile, by the fill warpgroup (LATTICE_BY_FILL below) or by
  both warpgroups (LATTICE_BY_BOTH, and in FP16 with the computing warpgroup's share as its first 16, 32 or 48
  channels) and, as what-ifs, the first two without the correlation;
- persistent programs (PERSISTENT below, right results, checked), with the fill warpgroup's turn for the lattice plane
  as the library's or a depth tap earlier; and as what-ifs, fill only and no tile write in that form;
- the output's zero_() alone (the floor in this process).

What it found (eighty-first and eighty-second sessions, H100s, benchmarks/RESULTS.md; medians in ms, FP16 / 3xFP16,
a few rounds' outliers left out): the library's 0.292-0.295 / 0.342-0.349; no fill 0.171-0.174 / 0.262-0.268; the
region fill alone 0.227-0.229 / 0.241-0.246, against zero_()'s 0.176; fill only 0.265-0.272 / 0.278-0.286; no tile
write 0.261-0.263 / 0.304-0.310. So the kernel takes about what its fill and its tile write take, and the fill alone
takes 30% more than zero_() writing the whole output. Every other way of the fill was slower, and its code is gone
from here: plain stores 0.321-0.324 / 0.385-0.393, the warpgroup over one segment at a time 0.333-0.394 /
0.378-0.444, bulk copies of zeros (the tensor memory accelerator's stores) 0.329-0.406 / 0.401-0.408, the lattice
plane by the computing warpgroup after its last MMAs 0.303-0.368 / 0.358-0.419, the fill in grid order with the
lattice rows written whole by the computing warpgroup 0.523-0.549 / 0.612-0.617 (that fill alone 0.447-0.469 /
0.459-0.463). Persistent programs took 0.311 / 0.360 with the library's turn, 0.351 / 0.454 a depth tap earlier,
0.402-0.410 / 0.476-0.487 with none (below), and their fill only 0.301-0.302 / 0.311: slower than one program a tile.
FP16's fill loop unrolled by 4 had the lower median in 17 of 20 rounds and the faster fastest call in all 20
(0.2865-0.2896 against 0.2882-0.2919): about 1%, row_runs.py's since the eighty-second session. The lattice plane
written whole (eighty-fourth session, H100): by both warpgroups FP16 0.2813-0.2882 against the library's 0.2905-0.2916
in each of 8 rounds (its first 16 or 48 channels by the computing warpgroup 0.2813-0.2857), but 3xFP16 0.408-0.413
against 0.3425-0.3446; by the fill warpgroup alone 0.300 / 0.437-0.439. On the H200 (eighty-seventh session) every
such form lost in both precisions: FP16 0.2551-0.2793 against the library's 0.2316-0.2318, 3xFP16 by 0.07-0.11 ms;
there no fill took 0.157 / 0.251, the region fill alone 0.178 / 0.190, zero_() 0.124. Not the library's.
With the sector edges (ninety-second session, H100): the library's 0.279 / 0.339-0.341, fill only 0.258 / 0.271,
the region fill alone 0.209 / 0.223, no tile write 0.254 / 0.308; without the plane loads the FP16 kernel took the
fill-only time (0.257), without the MMAs or the later weight copies 0.001 ms less at most. The fill's segment loop
unrolled by 2 or 4 (a pragma) changed nothing, the kernel's or the region fill's alone.

Rows: bench.protocol.time_cuda's mean, median and minimum in ms (L2 flushed before each call), the forms taking turns
per round, in FP16 (TF32 mode, reading the input) and 3xFP16 (TF32 off, reading the window).
"""

from convt3d.backends.cuda import row_runs
from p77_correlation import (LIBRARY_DIRECT_INPUT, LIBRARY_ROW_RUNS_KERNEL, P77, Timings, arguments, chosen, modes,
                             patched_row_runs, print_registers, problem_77, use_row_runs)

NO_FILL = (("fill_segments(0, segments - COB);  // the planes", "// the planes"),
           ("fill_segments(segments - COB, segments);  // the lattice plane", "// the lattice plane"))
FILL_ONLY = (('asm volatile("bar.arrive 3, %0;\\n" :: "n"(2 * THREADS) : "memory");\n#endif\n',
              'asm volatile("bar.arrive 3, %0;\\n" :: "n"(2 * THREADS) : "memory");\n#endif\n        continue;\n'),)
NO_TILE_WRITE = (("    write_tile<ROWS, COB, THREADS>(staged", "    if (0) write_tile<ROWS, COB, THREADS>(staged"),)
# Persistent programs (eighty-second session): two a multiprocessor, each taking tiles b, b + G, ... (G programs),
# so that its fill warpgroup goes on to the next tile's region while the computing warpgroup writes its tile (in the
# library's form the multiprocessor loses that program's fill during the tile write: "fill only" took 0.04 ms more
# than "the region fill alone" in the eighty-first and eighty-second sessions, H100). Per tile, the library's
# barriers: the fill warpgroup fills the planes without lattice points, waits at barrier 3 for the computing
# warpgroup's last depth tap, fills the lattice plane (its zeros still in the L2 when the tile's stores
# come) and arrives at barrier 2, where the computing warpgroup waits before its tile write; neither barrier is ahead
# of the other by more than one tile. A first form let the fill warpgroup fill the next lattice plane as soon as the
# tile before was written (no wait for a depth tap): 0.402-0.410 ms (FP16) and 0.476-0.487 (3xFP16) against the
# library's 0.29 / 0.34, as slow with no barriers at all; without its tile write 0.285 / 0.320: the tile's stores into
# lattice planes filled a whole tile before, their zeros gone from the L2. Problem 77's 2,048 tiles:
# PERSISTENT_TILES (the kernel has no batch argument).
PERSISTENT_TILES = 2048
# The kernel's parameters as row_runs.py declares them, and their names (the persistent wrapper passes them on).
PERSISTENT_PARAMETERS = row_runs.SOURCE.split("\nphase_conv_rows(", 1)[1].split(")\n{", 1)[0]
PERSISTENT_ARGUMENTS = ", ".join(parameter.split()[-1] for parameter in PERSISTENT_PARAMETERS.split(","))
SET_FILL_REGISTERS = '        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\\n" :: "n"(FILL_REGISTERS));\n'
SET_COMPUTE_REGISTERS = '    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\\n" :: "n"(COMPUTE_REGISTERS));\n'
TILE_WRITE = ("    write_tile<ROWS, COB, THREADS>(staged, OCS, XW, y_tile, syc, syh, qh0, QH, lane < QW, warp, lane);"
              "\n}\n")
PERSISTENT = (
    ('extern "C" __global__ void __launch_bounds__(THREADS * (1 + FILL_WARPGROUP), MIN_BLOCKS)\nphase_conv_rows(',
     "__device__ __forceinline__ void one_tile(int tile_index, "),
    ("    int tile = blockIdx.x;\n", "    int tile = tile_index;\n"),
    (SET_FILL_REGISTERS, ""),  # (the wrapper's, once: ptxas gives each warpgroup's code its registers so)
    (SET_COMPUTE_REGISTERS, ""),
    (TILE_WRITE, TILE_WRITE + f"""
extern "C" __global__ void __launch_bounds__(THREADS * (1 + FILL_WARPGROUP), MIN_BLOCKS)
phase_conv_rows({PERSISTENT_PARAMETERS})
{{
    if (threadIdx.x >= THREADS) {{  // the fill warpgroup
{SET_FILL_REGISTERS}        #pragma unroll 1
        for (int tile = blockIdx.x; tile < PERSISTENT_TILES; tile += gridDim.x) one_tile(tile, {PERSISTENT_ARGUMENTS});
        return;
    }}
{SET_COMPUTE_REGISTERS}    #pragma unroll 1
    for (int tile = blockIdx.x; tile < PERSISTENT_TILES; tile += gridDim.x) {{
        one_tile(tile, {PERSISTENT_ARGUMENTS});
        compute_sync();  // the staged tile read before the next tile's copies
    }}
}}
"""),
)
# The fill warpgroup's turn for the lattice plane a depth tap earlier (the computing warpgroup's second to last).
EARLY_TURN = (("        if (kd == KD - 1)  // the fill warpgroup's turn for the lattice plane\n",
               "        if (kd == KD - 2)  // the fill warpgroup's turn for the lattice plane\n"),)
PERSISTENT_HEAD = f"#define PERSISTENT_TILES {PERSISTENT_TILES}\n"


class PersistentKernel:
    """A compiled PERSISTENT form, launched with at most programs programs (the library launches one a tile)."""

    def __init__(self, kernel, programs: int):
        self.kernel, self.programs = kernel, programs

    def __getattr__(self, name):
        return getattr(self.kernel, name)

    def launch(self, grid: int, *arguments) -> None:
        if grid != PERSISTENT_TILES:
            raise RuntimeError(f"the persistent form is built for {PERSISTENT_TILES} tiles, launched for {grid}")
        self.kernel.launch(min(grid, self.programs), *arguments)


# The lattice plane written once, whole, from the staged tile (prepared in the eighty-second and eighty-third
# sessions; problem 77's lattice: LATTICE_HEAD): its values at the lattice's rows and columns, zeros or the bias
# between, in 16-byte evict-first stores. No half-written sectors for the L2 to merge and no lattice plane written
# twice (the library's zeros, then its tile write: "fill only" took 0.04 ms more than "the region fill alone"), but
# the lattice plane no longer written while the computing warpgroup runs its last depth tap. The computing warpgroup
# stages its tile and arrives at barrier 3; the fill warpgroup, having filled the planes without lattice points, waits
# there and writes the lattice plane's channels: all of them (lattice_whole()), or its share, the computing warpgroup
# the others as soon as its tile is staged (lattice_whole("interleaved") or lattice_whole(16): its warps idle
# otherwise).
LATTICE_HEAD = "#define LATTICE_H 1\n#define LATTICE_W 1\n#define STRIDE_W 2\n"
WRITE_LATTICE = r"""    // The lattice plane's region, channels first, first + step, ... before end, a warp a channel.
    auto write_lattice = [&](int first, int step, int end) {
        const float* staged = (const float*)smem4;
        const int count = region_rows * OUT_W;
        for (int c = first; c < end; c += step) {
            float* const p = out + n * syn + (long long)(ob * COB + c) * syc
                             + (STRIDE_D * qd + LATTICE_D) * plane_floats + row0 * row_floats;
            const float base = HAS_BIAS ? bias[ob * COB + c] : 0.f;
            const float* tile_c = staged + c * OCS;
            auto value_at = [&](int e) {  // element e of the region's rows
                const int r = e / OUT_W, hr = row0 + r - LATTICE_H, wc = e - r * OUT_W - LATTICE_W;
                const int qr = hr / STRIDE_H - qh0, q = wc / STRIDE_W;
                const bool on = hr >= 0 && hr % STRIDE_H == 0 && qr < ROWS && qh0 + qr < QH && wc >= 0
                                && wc % STRIDE_W == 0 && q < QW;
                return on ? tile_c[qr * XW + q] : base;
            };
            const int head = min((int)((16 - ((unsigned long long)p & 15)) & 15) >> 2, count);
            const int quads = (count - head) >> 2, tail = (count - head) & 3;
            if (lane < head) __stcs(p + lane, value_at(lane));
            float4* at = (float4*)(p + head);
            #pragma unroll 1
            for (int i = lane; i < quads; i += 32) {
                const int e = head + 4 * i;
                __stcs(at + i, make_float4(value_at(e), value_at(e + 1), value_at(e + 2), value_at(e + 3)));
            }
            if (lane < tail) __stcs(p + head + 4 * quads + lane, value_at(head + 4 * quads + lane));
        }
    };
"""


def lattice_whole(computing_channels=None) -> tuple:
    """The patches of the lattice plane written whole: by the fill warpgroup (computing_channels None), or by both
    warpgroups, the computing one every other group of four channels ("interleaved") or the block's first
    computing_channels (a number), the fill warpgroup the others."""
    warps = row_runs.THREADS // 32
    if computing_channels is None:
        compute_part, fill_part = "", f"write_lattice(warp, {warps}, COB);"
    else:
        if computing_channels == "interleaved":
            compute_writes, fill_writes = f"warp, {2 * warps}, COB", f"{warps} + warp, {2 * warps}, COB"
        else:
            compute_writes = f"warp, {warps}, {computing_channels}"
            fill_writes = f"{computing_channels} + warp, {warps}, COB"
        compute_part = f"    compute_sync();  // every thread's values staged\n    write_lattice({compute_writes});\n"
        fill_part = f"write_lattice({fill_writes});"
    return (
        ("    if (threadIdx.x >= THREADS) {  // the fill warpgroup\n",
         WRITE_LATTICE + "    if (threadIdx.x >= THREADS) {  // the fill warpgroup\n"),
        ("        if (kd == KD - 1)  // the fill warpgroup's turn for the lattice plane\n"
         '            asm volatile("bar.arrive 3, %0;\\n" :: "n"(2 * THREADS) : "memory");\n', ""),
        ('    asm volatile("bar.sync 2, %0;\\n" :: "n"(2 * THREADS) : "memory");  // and the fill warpgroup\'s '
         'stores done\n',
         "    __threadfence_block();\n"
         '    asm volatile("bar.arrive 3, %0;\\n" :: "n"(2 * THREADS) : "memory");  // the tile staged\n'
         + compute_part + "    return;\n"),
        ('asm volatile("bar.sync 3, %0;\\n" :: "n"(2 * THREADS) : "memory");  // the last depth tap begun\n',
         'asm volatile("bar.sync 3, %0;\\n" :: "n"(2 * THREADS) : "memory");  // the tile staged\n'),
        ("        fill_segments(segments - COB, segments);  // the lattice plane\n"
         "        __threadfence_block();\n"
         '        asm volatile("bar.arrive 2, %0;\\n" :: "n"(2 * THREADS) : "memory");\n',
         f"        {fill_part}  // the lattice plane\n"),
    )


LATTICE_BY_FILL, LATTICE_BY_BOTH = lattice_whole(), lattice_whole("interleaved")
# The correlation's parts left out one at a time (ninety-second session): the weight copies of every depth tap but the
# first, the plane's loads (FP16's from the input, 3xFP16's from the window; zeros go to shared memory instead), and
# the MMAs.
NO_LATER_WEIGHTS = (("            copy_weights(kd);\n", ""),)
NO_PLANE_LOADS = (("const bool inside = u < UNITS && depth_inside", "const bool inside = u < 0 && depth_inside"),
                  ("const float4 quad = u < UNITS ? src[u * 4 + q]", "const float4 quad = u < 0 ? src[u * 4 + q]"))
NO_MMAS = (("                    wgmma_ss(d, a_hi, b_hi);", "                    if (0) wgmma_ss(d, a_hi, b_hi);"),
           ("wgmma_ss(partial, a_hi, b_hi, step", "if (0) wgmma_ss(partial, a_hi, b_hi, step"),
           ("wgmma_ss(partial, a_lo, b_hi);", "if (0) wgmma_ss(partial, a_lo, b_hi);"),
           ("wgmma_ss(partial, a_hi, b_lo);", "if (0) wgmma_ss(partial, a_hi, b_lo);"))
# (the correlation left out: the computing warpgroup skips every depth tap)
NO_CORRELATION = (("#if FILL_WARPGROUP\n#endif\n", "        continue;\n"),)
# The tile's lattice rows written in whole sectors (ninety-third session): besides each lattice value, the zero (problem
# 77 has no bias) in the column before it, which the fill wrote already, so that each store of a row covers 64
# consecutive floats, not every other one (problem 77's lattice: every second column from column 1 on, y_tile at
# lane 2 lane + 1). Does the tile write cost less where its sectors are whole (the L2 then need not merge them)? On an
# H100 (ninety-third session) the kernel took 0.2681 ms so against 0.2688-0.2694 in FP16, 0.3386-0.3392 against 0.3404
# in 3xFP16, and fill only 0.2336-0.2338 against 0.2370-0.2379: no, the tile write's 0.046 ms is not that.
WHOLE_SECTOR_TILE = (("            if (column_inside) out[k * syc] = v[k];",
                      "            if (column_inside) { out[k * syc - 1] = 0.f; out[k * syc] = v[k]; }"),)
# (name, patches, checked: whether its result is right, the one precision (split) it serves or None for both, the
# head put before its source)
FORMS = (
    ("the library's", (), True, None, ""),
    ("what-if: no fill", NO_FILL, False, None, ""),
    ("what-if: fill only (and the tile of bias values)", FILL_ONLY, False, None, ""),
    ("what-if: no tile write", NO_TILE_WRITE, False, None, ""),
    ("what-if: the region fill alone (no correlation, no tile write)", FILL_ONLY + NO_TILE_WRITE, False, None, ""),
    ("the tile written in whole sectors (problem 77: the zeros between again)", WHOLE_SECTOR_TILE, True, None, ""),
    ("what-if: fill only, the tile in whole sectors", FILL_ONLY + WHOLE_SECTOR_TILE, False, None, ""),
    *((f"what-if: {what}", parts, False, None, "") for what, parts in (
        ("no weight copies after the first", NO_LATER_WEIGHTS), ("no plane loads", NO_PLANE_LOADS),
        ("no MMAs", NO_MMAS))),
    *((f"what-if: no fill, {what}", NO_FILL + parts, False, None, "") for what, parts in (
        ("no weight copies after the first", NO_LATER_WEIGHTS), ("no plane loads", NO_PLANE_LOADS),
        ("no MMAs", NO_MMAS))),
    ("the lattice plane written whole by the fill warpgroup", LATTICE_BY_FILL, True, None, LATTICE_HEAD),
    ("what-if: the lattice plane written whole by the fill warpgroup, no correlation",
     LATTICE_BY_FILL + NO_CORRELATION, False, None, LATTICE_HEAD),
    ("the lattice plane written whole by both warpgroups", LATTICE_BY_BOTH, True, None, LATTICE_HEAD),
    ("what-if: the lattice plane written whole by both warpgroups, no correlation",
     LATTICE_BY_BOTH + NO_CORRELATION, False, None, LATTICE_HEAD),
    *((f"the lattice plane written whole, its first {channels} channels by the computing warpgroup",
       lattice_whole(channels), True, 3, LATTICE_HEAD) for channels in (16, 32, 48)),
    ("persistent programs", PERSISTENT, True, None, PERSISTENT_HEAD),
    ("persistent, the lattice plane's turn a depth tap earlier", PERSISTENT + EARLY_TURN, True, None,
     PERSISTENT_HEAD),
    ("what-if: persistent, fill only", PERSISTENT + FILL_ONLY, False, None, PERSISTENT_HEAD),
    ("what-if: persistent, no tile write", PERSISTENT + NO_TILE_WRITE, False, None, PERSISTENT_HEAD),
)


def builder(patches, head):
    if not patches:
        return LIBRARY_ROW_RUNS_KERNEL
    build = patched_row_runs(*patches, head=head, exactly_once=True, threads=2 * row_runs.THREADS)
    if patches[:len(PERSISTENT)] != PERSISTENT:
        return build
    import torch
    programs = 2 * torch.cuda.get_device_properties(0).multi_processor_count  # (two a multiprocessor: MIN_BLOCKS)
    return lambda *key: PersistentKernel(build(*key), programs)


def registers() -> None:
    """ptxas's registers and spills per form and precision for problem 77 (NVRTC on this machine)."""
    from test_cuda_compile import P77_REGION
    print_registers((name, patches, P77_REGION, head, only) for name, patches, _, only, head in FORMS)


def main():
    args = arguments(2, registers, forms=True)
    forms = chosen(FORMS, args.forms)
    import convt3d
    from convt3d.backends import cuda
    from diag_overlap import checked

    x, w, _, _ = problem_77()
    forward = lambda: convt3d.conv_transpose3d(x, w, None, backend="torch", **P77)
    builders = [(name, builder(patches, head), right, only) for name, patches, right, only, head in forms]
    timings = Timings(args.iters)
    library_region_fill = cuda.REGION_FILL
    cuda.REGION_FILL = True
    try:
        for mode, split, reference, eager in modes(x, w):
            direct_input = split == 3  # as the library reads them (cuda.reads_input)
            use_row_runs(LIBRARY_ROW_RUNS_KERNEL, direct_input=direct_input)
            expected = forward()
            for round_ in range(args.rounds):
                for name, build, right, only in builders:
                    if only not in (None, split):
                        continue
                    use_row_runs(build, direct_input=direct_input)
                    check = checked(forward, expected, reference, eager) if round_ == 0 and right else ""
                    timings.row(mode, f"{name} (round {round_ + 1})", forward, check)
                timings.row(mode, f"zero_() of the output alone (round {round_ + 1})", expected.zero_)
    finally:
        cuda.REGION_FILL = library_region_fill
        use_row_runs(LIBRARY_ROW_RUNS_KERNEL, direct_input=LIBRARY_DIRECT_INPUT)
    print(timings.table())


if __name__ == "__main__":
    main()
