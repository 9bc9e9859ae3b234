"""Problem 77's forward with no fill before the correlation: each of row_runs.py's programs fills the output around
its own lattice tile, the stores issued while it computes (cuda.REGION_FILL: by default with TF32 off, and in TF32
mode, by a fill warpgroup). (GPU)

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
moves about 605 MB instead of about 880. Since the seventy-ninth session (FP16) and the eightieth (3xFP16) a second
warpgroup of each program fills the region instead (row_runs.py's FILL_WARPGROUP), its lattice plane once the
computing warpgroup begins its last depth tap.

Forms, each the library's forward (backend="torch"): a fill first (zero_(), the pass, the correlation); REGION_FILL on,
the library's (the planes without lattice points by evict-first stores, so that the L2 keeps the lattice plane's zeros:
the seventy-sixth session's "streamed" form; by a fill warpgroup, FP16 since the seventy-ninth session, 3xFP16 since
the eightieth); the fill in the computing warps, each part after a depth tap's MMAs in FP16 (three programs a
multiprocessor: the library's before the seventy-ninth session) or beside a round of the window plane's loads in 3xFP16
(the library's before the eightieth). Other placements and kinds of the fill (after the MMAs, at the end or at the
partial sums' waits in 3xFP16, plain stores throughout, bulk copies of zeros from shared memory, whole planes or the
whole grid in memory order, the next input plane copied during the MMAs, a fill warpgroup without setmaxnreg, FP16's
fill warpgroup at 3xFP16's register split) were measured and dropped in the seventy-fifth to eightieth sessions
(benchmarks/RESULTS.md).

Rows: bench.protocol.time_cuda's mean, median and minimum in ms (L2 flushed before each call), the forms taking turns
per round, in FP16 (TF32 mode, reading the input) and 3xFP16 (TF32 off, reading the window). Every output, NaN-poisoned
before its first call, is compared with the default's (bitwise), float64 and F.conv_transpose3d (KernelBench's check),
and the row says whether the call filled the whole output first (where a REGION_FILL form does, its kernel failed).
With --profile, each mode runs each form's forward once, untimed: under Nsight Compute (gpu_session.sh's
region_fill_ncu step) the correlations' DRAM bytes and times, a launch a form, in the forms' order.
"""

from convt3d.backends.cuda import row_runs
from p77_correlation import (LIBRARY_DIRECT_INPUT, LIBRARY_ROW_RUNS_KERNEL, P77, Timings, arguments, modes,
                             patched_row_runs, print_registers, problem_77, use_row_runs)

# The fill in the computing warps instead of a fill warpgroup (row_runs.py's FILL_WARPGROUP): FP16 three programs of
# one warpgroup a multiprocessor, 3xFP16 two, fill_run's loop unrolled as NVRTC unrolls it unasked (no pragma, FP16's
# unroll by 4 since the eighty-second session left out), as before the eightieth session.
WITHOUT_FILL_WARPGROUP = ("#define FILL_WARPGROUP 1\n", "#define FILL_WARPGROUP 0\n")
UNROLLED_UNASKED = ("    #pragma unroll 4\n", "")
COMPUTING_WARPS_FP16 = (WITHOUT_FILL_WARPGROUP, ("#define MIN_BLOCKS 2\n", "#define MIN_BLOCKS 3\n"), UNROLLED_UNASKED)
COMPUTING_WARPS_3XFP16 = (WITHOUT_FILL_WARPGROUP, ("#if SPLIT == 2\n", "#if 0\n"), UNROLLED_UNASKED)
# (name, REGION_FILL, patches of row_runs.py's source, the one precision (split) they serve or None for both).
FORMS = (
    ("default: zero_(), pass, correlation", False, (), None),
    ("REGION_FILL, the library's: a fill warpgroup", True, (), None),
    ("REGION_FILL in the computing warps (FP16: the library's before the 79th session)", True, COMPUTING_WARPS_FP16, 3),
    ("REGION_FILL in the computing warps (3xFP16: the library's before the 80th session)", True,
     COMPUTING_WARPS_3XFP16, 2),
)


def builder(patches):
    """cuda._row_runs_kernel's stand-in for a form: the library's own where it patches nothing."""
    if not patches:
        return LIBRARY_ROW_RUNS_KERNEL
    threads = row_runs.THREADS if WITHOUT_FILL_WARPGROUP in patches else 2 * row_runs.THREADS
    return patched_row_runs(*patches, exactly_once=True, threads=threads)


def registers() -> None:
    """ptxas's registers and spills per form and precision for problem 77 (NVRTC on this machine)."""
    from test_cuda_compile import P77_REGION
    print_registers((name, patches, P77_REGION if region_fill else None, "", only)
                    for name, region_fill, patches, only in FORMS)


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
