"""Problem 77's forward with no fill before the correlation: each of row_runs.py's programs fills the output around
its own lattice tile, the stores issued while it computes (cuda.REGION_FILL: by default with TF32 off, and in TF32
mode by a fill warpgroup). (GPU)

    PYTHONPATH=src python3 benchmarks/diag_region_fill.py [--iters 100] [--rounds 2]
    PYTHONPATH=src:tests python3 benchmarks/diag_region_fill.py --registers   # on a CPU with NVRTC: ptxas's report

Why: the library's forward is out.zero_() (571 MB, 0.124 ms), the operand pass (0.019) and the correlation into the
lattice (about 0.12), which moves about 313 MB through DRAM (seventy-third session): it reads back from DRAM the
lattice's half-written sectors, whose zeros zero_() wrote long before. Running the fill beside the correlation gained
nothing (three correlation programs of 168 registers a thread take 64,512 of a multiprocessor's 65,536 registers,
leaving a fill's programs none). diag_sample_fill.py's programs filled a share of their sample and then waited for the
sample's other programs before writing their lattice (0.12-0.18 ms slower than the library). With REGION_FILL nobody
waits on another program: the output is cut into one region per program, the one around its lattice tile (problem
77's lattice lies at odd depths, rows and columns): planes 2 qd and 2 qd + 1 (with plane 32 for qd 15), rows 2 qh0 to
2 qh0 + 7 (with row 64 for the last row block), every column, the program's 64 channels; 266 KB a program, every
output element in exactly one region (row_runs.py's REGION_FILL). The region is filled in parts, a channel's plane
(contiguous rows) a warp, 16-byte stores where aligned, each part beside a round of the window plane's loads
(3xFP16) or after a depth tap's MMAs are issued (FP16, reading the input: FILL_BESIDE_LOADS); the lattice plane's
segments come last, so that the zeros of the lattice's sectors may still be in the L2 when
write_tile's half-sector stores come. If the fill runs at the DRAM's rate in the correlation's shadow, the forward
moves about 605 MB instead of about 880. In FP16 (row_runs.py's FILL_WARPGROUP, seventy-ninth session) a second
warpgroup of each program fills the region instead, its lattice plane once the computing warpgroup begins its last
depth tap.

Forms, each the library's forward (backend="torch"): a fill first (zero_(), the pass, the correlation); REGION_FILL on,
the library's (the planes without lattice points by evict-first stores, so that the L2 keeps the lattice plane's zeros:
the seventy-sixth session's "streamed" form; in 3xFP16 its parts beside the loads since the seventy-eighth, in FP16 by a
fill warpgroup since the seventy-ninth); in FP16 the fill in the computing warps, three programs a multiprocessor, each
part after a depth tap's MMAs (the library's before the seventy-ninth session: "in the computing warps"); and in 3xFP16
six patches of the library's code: each part after a depth tap's MMAs ("after the MMAs", the library's before the
seventy-eighth session), plain stores throughout (the seventy-sixth session's plain REGION_FILL), every part once the
last depth tap's MMAs are issued ("at the end"), the planes without lattice points stored by bulk copies of zeros from
shared memory ("bulk copies", seventy-fifth session: the tensor memory accelerator's stores instead of the warps'), and
every plane so ("bulk copies, lattice plane too": the warps then store only write_tile's sums, after waiting for the
copies), and the parts issued where the warps wait for a partial sum's MMAs ("at the partial sums' waits",
seventy-eighth session); also in 3xFP16 a fill warpgroup as FP16's, two programs a multiprocessor by setmaxnreg
(prepared in the seventy-ninth session, not run). The FP16 forms of those patches, the next input plane copied during
the MMAs (diag_plane_prefetch.py's PLANE_COPY), the planes without lattice points by whole planes or in memory order by
the whole grid (diag_region_pattern.py), and a fill warpgroup in 3xFP16 without setmaxnreg (one program a
multiprocessor) were measured and dropped in the seventy-sixth to seventy-ninth sessions (benchmarks/RESULTS.md).

Rows: bench.protocol.time_cuda's mean and minimum in ms (L2 flushed before each call), the forms taking turns per
round, in FP16 (TF32 mode, reading the input) and 3xFP16 (TF32 off, reading the window). Every output, NaN-poisoned
before its first call, is compared with the default's (bitwise), float64 and F.conv_transpose3d (KernelBench's check),
and the row says whether the call filled the whole output first (where a REGION_FILL form does, its kernel failed).
With --profile, each mode runs each form's forward once, untimed: under Nsight Compute (gpu_session.sh's
region_fill_ncu step) the correlations' DRAM bytes and times, a launch a form, in the forms' order.
"""

from convt3d.backends.cuda import row_runs
from p77_correlation import (LIBRARY_DIRECT_INPUT, LIBRARY_ROW_RUNS_KERNEL, P77, Timings, arguments, modes,
                             patched_row_runs, patched_row_runs_source, problem_77, use_row_runs)

# The library's fill: the planes without lattice points by evict-first stores, the lattice plane by plain ones.
LATTICE_PLANE = "            if (k == region_planes - 1) fill_run<false>(at, region_rows * OUT_W, value, lane);\n"
OTHER_PLANES = "            else fill_run<true>(at, region_rows * OUT_W, value, lane);\n"
PLAIN = (OTHER_PLANES, OTHER_PLANES.replace("<true>", "<false>"))
# Where the computing warps' fill parts go (row_runs.py's FILL_BESIDE_LOADS: beside the loads reading the window, the
# library's in 3xFP16): after each depth tap's MMAs instead.
PLACEMENT = "    #define FILL_BESIDE_LOADS (!INPUT_DIRECT)\n"
AFTER_THE_MMAS = (PLACEMENT, PLACEMENT.replace("(!INPUT_DIRECT)", "0"))
# 3xFP16 only: the parts issued where the warps wait for the MMAs of a partial sum (after steps 4, 8, 12 and 16 of a
# depth tap's 18 k-steps at PROMOTE 4), that is while the tensor cores run, instead of beside the loads.
AT_THE_PROMOTIONS = (
    AFTER_THE_MMAS,
    ("    #define FILL_PARTS (FILL_BESIDE_LOADS ? KD * LOAD_ROUNDS : KD)\n",
     "    #define FILL_WAITS ((2 * KH * KW - 1) / PROMOTE)\n    #define FILL_PARTS (KD * FILL_WAITS)\n"),
    ('''                    asm volatile("wgmma.commit_group.sync.aligned;\\n" ::: "memory");
                    asm volatile("wgmma.wait_group.sync.aligned 0;\\n" ::: "memory");
''', '''                    asm volatile("wgmma.commit_group.sync.aligned;\\n" ::: "memory");
#if REGION_FILL
                    if (step > 0) fill_part(kd * FILL_WAITS + step / PROMOTE - 1);
#endif
                    asm volatile("wgmma.wait_group.sync.aligned 0;\\n" ::: "memory");
'''),
    ("#if REGION_FILL && !FILL_BESIDE_LOADS\n        fill_part(kd);\n#endif\n", ""),
)
AT_THE_END = ("""#if REGION_FILL && !FILL_BESIDE_LOADS
        fill_part(kd);
#endif
    }
""", """    }
#if REGION_FILL
    for (int part = 0; part < KD; part++) fill_part(part);
#endif
""")
# The planes without lattice points stored by the tensor memory accelerator instead of the warps (without a bias):
# each channel's run by one bulk copy from a run of zeros in shared memory (its unaligned ends by the lanes), so that
# its stores neither take the warps' issue slots nor queue in front of the next plane's loads. The lattice plane keeps
# the warps' stores, which the barriers order before write_tile's; the last bulk copies are waited for (their reads of
# shared memory) before the program ends.
BULK_RUN = r"""
#define ZERO_AT (((KH * KW * W_TAP_FLOATS + PLANE_POS * (ROW / 4) > COB * OCS ? \
                   KH * KW * W_TAP_FLOATS + PLANE_POS * (ROW / 4) : COB * OCS) + 3) / 4 * 4)
#define ZERO_FLOATS (STRIDE_H * (ROWS + 1) * OUT_W)
__device__ __forceinline__ void fill_run_bulk(float* p, int count, unsigned zeros_addr, int lane) {
    const int head = min((int)((16 - ((unsigned long long)p & 15)) & 15) >> 2, count);
    const int body = (count - head) & ~3, tail = count - head - body;
    if (lane < head) p[lane] = 0.f;
    if (lane == 0 && body > 0)
        asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n"
                     :: "l"(p + head), "r"(zeros_addr), "r"(4 * body) : "memory");
    if (lane < tail) p[head + body + lane] = 0.f;
}
"""
BULK = (
    ("""#if REGION_FILL
    // The output around this program's lattice tile""", """#if REGION_FILL
    float* const zeros = (float*)smem4 + ZERO_AT;  // (made visible to the bulk copies by the fence before the MMAs)
    for (int e = tid; e < ZERO_FLOATS; e += THREADS) zeros[e] = 0.f;
    const unsigned zeros_addr = smem_addr(zeros);
    // The output around this program's lattice tile"""),
    (OTHER_PLANES + """        }
    };
""", OTHER_PLANES.replace("else", "else if (HAS_BIAS)") + """            else fill_run_bulk(at, region_rows * OUT_W, zeros_addr, lane);
        }
        if (lane == 0) asm volatile("cp.async.bulk.commit_group;\\n" ::: "memory");
    };
"""),
    ("""    write_tile<ROWS, COB, THREADS>(staged, OCS, XW, y_tile, syc, syh, qh0, QH, lane < QW, warp, lane);
}
""", """    write_tile<ROWS, COB, THREADS>(staged, OCS, XW, y_tile, syc, syh, qh0, QH, lane < QW, warp, lane);
#if REGION_FILL
    if (lane == 0) asm volatile("cp.async.bulk.wait_group.read 0;\\n" ::: "memory");
#endif
}
"""),
)
# The lattice plane's zeros by bulk copies too: the warps store nothing but write_tile's sums. Those must land after
# the zeros, so each warp's copies are waited for whole (their writes done, not only their reads) and ordered before
# the warps' stores (the proxy fence, then the barriers before write_tile) once the last MMAs are done.
BULK_ALL = (
    BULK[0],
    (LATTICE_PLANE + BULK[1][0], BULK[1][1].replace("else if (HAS_BIAS)", "if (HAS_BIAS)")),
    ("""    if (PARTIALS) add_partial();  // the last partial
""", """    if (PARTIALS) add_partial();  // the last partial
#if REGION_FILL
    if (lane == 0) asm volatile("cp.async.bulk.wait_group 0;\\n" ::: "memory");
    asm volatile("fence.proxy.async.global;\\n" ::: "memory");
#endif
"""),
)
# FP16 only: the fill in the computing warps, as the library did before the seventy-ninth session (three programs of
# one warpgroup a multiprocessor), instead of a fill warpgroup (row_runs.py's FILL_WARPGROUP).
COMPUTING_WARPS = (("#define FILL_WARPGROUP 1\n", "#define FILL_WARPGROUP 0\n"),
                   ("#define MIN_BLOCKS 2\n", "#define MIN_BLOCKS 3\n"))
# 3xFP16 only: a fill warpgroup as FP16's (two programs of two warpgroups a multiprocessor, launched at 128 registers a
# thread), the fill warpgroup down to 40 registers and the computing one up to 216, where ptxas spills 8 bytes (at
# 24 / 232, 104 bytes; the computing warpgroup of the library's 3xFP16 kernel takes 243 registers).
FILL_WARPGROUP_3XFP16 = (("#define FILL_WARPGROUP 0\n", "#define FILL_WARPGROUP 1\n"),
                         (f"#define FILL_REGISTERS {row_runs.FILL_REGISTERS}\n", "#define FILL_REGISTERS 40\n"),
                         (f"#define COMPUTE_REGISTERS {row_runs.COMPUTE_REGISTERS}\n", "#define COMPUTE_REGISTERS 216\n"))
# (name, REGION_FILL, patches of row_runs.py's source, the one precision (split) they serve or None for both); the
# bulk forms after the library's placements, the ones most likely to fault.
FORMS = (
    ("default: zero_(), pass, correlation", False, (), None),
    ("REGION_FILL (the library's: evict-first stores off the lattice plane; FP16 by a fill warpgroup)", True, (), None),
    ("REGION_FILL in the computing warps (FP16 only)", True, COMPUTING_WARPS, 3),
    ("REGION_FILL after the MMAs (3xFP16 only)", True, (AFTER_THE_MMAS,), 2),
    ("REGION_FILL, plain stores throughout (3xFP16 only)", True, (PLAIN,), 2),
    ("REGION_FILL at the end (3xFP16 only)", True, (AFTER_THE_MMAS, AT_THE_END), 2),
    ("REGION_FILL, bulk copies (3xFP16 only)", True, BULK, 2),
    ("REGION_FILL, bulk copies, lattice plane too (3xFP16 only)", True, BULK_ALL, 2),
    ("REGION_FILL at the partial sums' waits (3xFP16 only)", True, AT_THE_PROMOTIONS, 2),
    ("REGION_FILL by a fill warpgroup (3xFP16 only)", True, FILL_WARPGROUP_3XFP16, 2),
)
P77_REGION = ((33, 65, 65), (2, 2), 1)


def head(patches) -> str:
    """What a form's patches put before row_runs.py's source."""
    return BULK_RUN if patches in (BULK, BULK_ALL) else ""


def bulk_shared_bytes(taps, dilation, window_columns, split) -> int:
    """row_runs.shared_bytes and the bulk form's run of zeros after it (ZERO_AT, ZERO_FLOATS on problem 77)."""
    (_, _, out_w), (_, stride_h), _ = P77_REGION
    return row_runs.shared_bytes(taps, dilation, window_columns, split) + 16 + 4 * stride_h * (row_runs.ROWS + 1) * out_w


def builder(patches):
    """cuda._row_runs_kernel's stand-in for a form: the library's own where it patches nothing."""
    if not patches:
        return LIBRARY_ROW_RUNS_KERNEL
    shared_bytes = bulk_shared_bytes if patches in (BULK, BULK_ALL) else None
    threads = 2 * row_runs.THREADS if patches is FILL_WARPGROUP_3XFP16 else row_runs.THREADS
    return patched_row_runs(*patches, head=head(patches), exactly_once=True, shared_bytes=shared_bytes,
                            threads=threads)


def registers() -> None:
    """ptxas's registers and spills per form and precision for problem 77 (NVRTC on this machine)."""
    from test_cuda_compile import P77_INPUT, registers_and_spills
    for split, geometry, mode in ((3, P77_INPUT, "FP16, input"), (2, None, "3xFP16, window")):
        for name, region_fill, patches, only in FORMS:
            if only not in (None, split):
                continue
            text = patched_row_runs_source(patches, split=split, input_geometry=geometry,
                                           region=P77_REGION if region_fill else None,
                                           head=head(patches), exactly_once=True)
            print(f"{mode}, {name}: (registers, spilled bytes) {registers_and_spills(text)}")


def fills_first(forward) -> bool:
    """Whether a call of forward fills the whole output before its correlation (torch_phase._fill on it): the
    default's way, and a REGION_FILL form's whose kernel did not compile."""
    from convt3d.backends import torch_phase
    fill, fills = torch_phase._fill, []
    torch_phase._fill = lambda out, bias: (fills.append(out.shape), fill(out, bias))
    try:
        forward()
    finally:
        torch_phase._fill = fill
    return bool(fills)


def main():
    args = arguments(2, registers, profile=True)
    import torch
    import convt3d
    from convt3d.backends import cuda
    from diag_overlap import checked

    x, w, _, _ = problem_77()
    forward = lambda: convt3d.conv_transpose3d(x, w, None, backend="torch", **P77)
    builders = [(name, region_fill, builder(patches), only) for name, region_fill, patches, only in FORMS]
    timings = Timings(args.iters)
    library_region_fill = cuda.REGION_FILL

    def use(region_fill, build, direct_input):
        cuda.REGION_FILL = region_fill
        use_row_runs(build, direct_input=direct_input)  # (clears the launches and prepared calls)

    try:
        for mode, split, reference, eager in modes(x, w):
            direct_input = split == 3  # as the library reads them (cuda.reads_input)
            if not args.profile:
                use(False, LIBRARY_ROW_RUNS_KERNEL, direct_input)
                expected = forward()
            for round_ in range(1 if args.profile else args.rounds):
                for name, region_fill, build, only in builders:
                    if only not in (None, split):
                        continue
                    use(region_fill, build, direct_input)
                    if args.profile:
                        forward()
                        torch.cuda.synchronize()
                        continue
                    check = ""
                    if round_ == 0:  # (a form that fills first where it should not says so: its kernel failed)
                        check = f"{checked(forward, expected, reference, eager)}, fills first {fills_first(forward)}"
                    timings.row(mode, f"{name} (round {round_ + 1})", forward, check)
    finally:
        use(library_region_fill, LIBRARY_ROW_RUNS_KERNEL, LIBRARY_DIRECT_INPUT)
    print(timings.table())


if __name__ == "__main__":
    main()
