"""Problem 77's forward with no fill before the correlation: each of row_runs.py's programs zeroes the output around
its own lattice tile, the stores issued while the tensor cores run its MMAs. (GPU)

    PYTHONPATH=src python3 benchmarks/diag_region_fill.py [--iters 100] [--rounds 2]
    PYTHONPATH=src:tests python3 benchmarks/diag_region_fill.py --registers   # on a CPU with NVRTC: ptxas's report

Why: the library's forward is out.zero_() (571 MB, 0.124 ms), the operand pass (0.019) and the correlation into the
lattice (about 0.12), which moves about 313 MB through DRAM (seventy-third session): it reads back from DRAM the
lattice's half-written sectors, whose zeros zero_() wrote long before. Running the fill beside the correlation gained
nothing (three correlation programs of 168 registers a thread take 64,512 of a multiprocessor's 65,536 registers,
leaving a fill's programs none). diag_sample_fill.py's programs filled a share of their sample and then waited for the
sample's other programs before writing their lattice (0.12-0.18 ms slower than the library). Here nobody waits on
another program: the output is cut into one region per program, the one around its lattice tile (problem 77's lattice
lies at odd depths, rows and columns): planes 2 qd and 2 qd + 1 (with plane 32 for qd 15), rows 2 qh0 to 2 qh0 + 7 (with
row 64 for the last row block), every column, the program's 64 channels; 266 KB a program, every output element in
exactly one region. The region is zeroed in KD parts, a channel's plane (contiguous rows) a warp, 16-byte stores where
aligned; part kd is stored right after depth tap kd's MMAs are issued ("interleaved"; "zeros off the lattice streamed":
those of the planes without lattice points by evict-first stores, so that the L2 keeps the lattice plane's), or every
part once the last depth tap's MMAs are issued ("at the end"). The lattice plane's segments come last, so that the zeros
of the lattice's sectors may still be in the L2 when write_tile's half-sector stores come; the barriers before
write_tile order its stores after every thread's zeros. The forward is then the operand pass and this correlation: if
the fill runs at the DRAM's rate in the correlation's shadow, about 605 MB move instead of about 880.

With --profile, each mode runs the library's forward and then each form's once, untimed: under Nsight Compute
(gpu_session.sh's region_fill_ncu step) the correlations' DRAM bytes and times, launches 1 (the library's) and 2-4
(the forms) of each mode.

Rows: bench.protocol.time_cuda's mean and minimum in ms (L2 flushed before each call), the library's forward and the
forms taking turns per round, in FP16 (TF32 mode, reading the input) and 3xFP16 (TF32 off, reading the window). Every
output, NaN-poisoned before its first call, is compared with the library's (bitwise), float64 and F.conv_transpose3d
(KernelBench's check).
"""

import functools

from p77_correlation import (Timings, arguments, correlation_geometry, library_forward, modes, patched_row_runs,
                             patched_row_runs_source, problem_77, use_row_runs)

# Before row_runs.py's source: a warp's zeros over a contiguous run of floats (16-byte stores between a head and a
# tail of single floats).
ZERO_RUN = r"""
// streaming: as evict-first stores (st.global.cs), for zeros nobody writes again.
__device__ __forceinline__ void zero_run(float* p, int count, int lane, bool streaming) {
    const int head = min((int)((16 - ((unsigned long long)p & 15)) & 15) >> 2, count);
    const int quad_count = (count - head) >> 2, tail = (count - head) & 3;
    float4* quads = (float4*)(p + head);
    float* last = p + head + 4 * quad_count;
    const float4 zeros = make_float4(0.f, 0.f, 0.f, 0.f);
    if (streaming) {
        if (lane < head) __stcs(p + lane, 0.f);
        for (int i = lane; i < quad_count; i += 32) __stcs(quads + i, zeros);
        if (lane < tail) __stcs(last + lane, 0.f);
    } else {
        if (lane < head) p[lane] = 0.f;
        for (int i = lane; i < quad_count; i += 32) quads[i] = zeros;
        if (lane < tail) last[lane] = 0.f;
    }
}
"""
BEFORE_LOOP = "    const unsigned weights_addr = smem_addr(weights), plane_addr = smem_addr((float*)plane);\n"
REGION = r"""    // The region around this program's lattice tile (problem 77: the lattice at odd depths, rows and
    // columns, strides 2): planes 2 qd and 2 qd + 1 (and those past the lattice's last, by its last qd), rows
    // 2 qh0 on to 2 (qh0 + ROWS) (to the last, by the last row block), every column, the block's channels. Segment
    // s: channel s % COB of plane s / COB of the region's planes without lattice points, then of the lattice plane.
    float* const out = y - phase[9];
    const long long plane_floats = syd / 2, row_floats = syh / 2;
    const int row0 = 2 * qh0, region_rows = (qh0 + ROWS >= QH ? OUT_H : 2 * (qh0 + ROWS)) - row0;
    const int other_planes = 1 + (qd == QD - 1 ? OUT_D - 2 * QD : 0);
    const int segments = COB * (other_planes + 1);
    auto fill_part = [&](int part) {
        for (int s = segments * part / KD + warp; s < segments * (part + 1) / KD; s += THREADS / 32) {
            const int other = s / COB, c = s % COB;
            const int d = other == 0 ? 2 * qd : other < other_planes ? 2 * QD + other - 1 : 2 * qd + 1;
            zero_run(out + n * syn + (long long)(ob * COB + c) * syc + d * plane_floats + row0 * row_floats,
                     region_rows * OUT_W, lane, STREAMED_ZEROS && other < other_planes);
        }
    };
"""
LOOP_END = r"""        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    }
"""
LOOP_END_FILLED = r"""        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        if (!FILL_AT_END) fill_part(kd);  // while the tensor cores run this depth tap's MMAs
    }
    if (FILL_AT_END)
        for (int part = 0; part < KD; part++) fill_part(part);
"""
PATCHES = ((BEFORE_LOOP, BEFORE_LOOP + REGION), (LOOP_END, LOOP_END_FILLED))
# The forms: (every part at the end, the planes without lattice points zeroed by evict-first stores).
FORMS = {"interleaved": (False, False), "interleaved, zeros off the lattice streamed": (False, True),
         "at the end": (True, False)}


@functools.lru_cache(maxsize=None)
def region_fill_row_runs(output_sizes, at_end: bool, streamed: bool):
    """A builder for use_row_runs: row_runs.py's kernel zeroing its region (each configuration compiled once)."""
    return patched_row_runs(*PATCHES, head=head(output_sizes, at_end, streamed), exactly_once=True)


def head(output_sizes, at_end: bool, streamed: bool) -> str:
    """What goes before row_runs.py's source: the output's sizes, the form's switches and zero_run."""
    od, oh, ow = output_sizes
    return (f"#define OUT_D {od}\n#define OUT_H {oh}\n#define OUT_W {ow}\n#define FILL_AT_END {int(at_end)}\n"
            f"#define STREAMED_ZEROS {int(streamed)}\n" + ZERO_RUN)


def registers() -> None:
    """ptxas's registers and spills per form and precision for problem 77 (NVRTC on this machine)."""
    from test_cuda_compile import P77_INPUT, registers_and_spills
    for split, geometry, mode in ((3, P77_INPUT, "FP16, input"), (2, None, "3xFP16, window")):
        for form, switches in FORMS.items():
            text = patched_row_runs_source(PATCHES, split=split, input_geometry=geometry,
                                           head=head((33, 65, 65), *switches), exactly_once=True)
            print(f"{mode}, {form}: (registers, spilled bytes) {registers_and_spills(text)}")


def main():
    args = arguments(2, registers, profile=True)
    import torch
    from convt3d.backends import cuda
    from convt3d.backends.cuda import phases as cuda_phases
    from convt3d.backends.triton.window import correlation_operands
    from diag_overlap import checked

    x, w, plan, phase_list = problem_77()
    out_strides = torch.empty(plan.output_shape, device="meta").stride()
    output_sizes = tuple(plan.output_shape[2:])
    timings = Timings(args.iters)
    for mode, split, reference, eager in modes(x, w):
        _, expected = library_forward(x, w)
        start, extent, geometry = correlation_geometry(plan, phase_list, split, out_strides)
        # The region's cut assumes problem 77's lattice: offset 1, stride 2, every lattice row in one column block.
        assert geometry["out_offset"] == out_strides[2] + out_strides[3] + 1
        assert geometry["grid"][1] % cuda.row_runs.ROWS == 0 and geometry["grid"][2] <= 32

        def fused(switches):
            """The forward with each program zeroing its region: the operand pass and the correlation."""
            use_row_runs(region_fill_row_runs(output_sizes, *switches), direct_input=split == 3)
            direct = cuda_phases._direct_input(x, plan, phase_list, split, False)

            def forward():
                y = torch.empty(plan.output_shape, device="cuda")  # (the first allocation: checked poisons it)
                window, taps, scales = correlation_operands(x, 0, x.shape, x.stride(), start, extent, w, False,
                                                            split=split, window=direct is None)
                cuda.correlate(window if direct is None else x, taps, None, y, **geometry, scales=scales,
                               split=split, direct=direct)
                return y
            return forward

        if args.profile:  # (the library's correlation ran above, in library_forward)
            for switches in FORMS.values():
                fused(switches)()
            torch.cuda.synchronize()
            continue
        for round_ in range(args.rounds):
            library, _ = library_forward(x, w)
            timings.row(mode, f"library forward (round {round_ + 1})", library,
                        checked(library, expected, reference, eager) if round_ == 0 else "")
            for form, switches in FORMS.items():
                forward = fused(switches)
                timings.row(mode, f"region fill, {form} (round {round_ + 1})", forward,
                            checked(forward, expected, reference, eager) if round_ == 0 else "")
    library_forward(x, w)  # (the library's kernel again)
    print(timings.table())


if __name__ == "__main__":
    main()
