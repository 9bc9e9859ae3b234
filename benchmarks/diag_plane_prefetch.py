"""Problem 77's forward in TF32 mode (FP16) with row_runs.py's kernel copying the next input plane into shared memory
while the tensor cores run this depth tap's MMAs.

    PYTHONPATH=src python3 benchmarks/diag_plane_prefetch.py [--iters 100] [--rounds 3]
    PYTHONPATH=src:tests python3 benchmarks/diag_plane_prefetch.py --registers   # on a CPU with NVRTC: ptxas's report

Why: under Nsight Compute (seventy-third session) the library's correlation on problem 77 (127 us) issued on 30% of
its cycles, the tensor pipe about 26% busy, DRAM 51% (2.46 TB/s); its warps waited most on the long scoreboard (2.88
of 9.57 cycles between issues: the input plane's loads into registers), then on fixed latencies (1.30), the MIO queue
(1.13), the short scoreboard (0.91) and barriers (0.81). A program loads depth tap kd's plane only after kd - 1's
MMAs are done (the plane's buffer is one), so each load's latency is the program's, hidden only by the other two
programs of its multiprocessor.

The variant (row_runs.py's PLANE_COPY): right after issuing depth tap kd's MMAs, each thread starts 4-byte
cp.async copies of plane kd + 1 (32 channels x HH x XW floats, zero-filled outside the input) into a float32 buffer
in shared memory; after the MMAs' wait it splits the plane from there as the register form splits it from its
registers. The same values reach the MMAs, so the output must be bitwise the register form's. The buffer (26 KB on
problem 77) leaves three programs a multiprocessor (76 KB each); both forms are also timed compiled for two
(MIN_BLOCKS 2).

What it found (seventy-third session, benchmarks/RESULTS.md; measured as PLANE_COPY in row_runs.py's own source, whose
SASS these patches reproduce instruction for instruction): slower. The forward took 0.2844-0.2857 ms by the minima
with the plane copy against 0.2604-0.2645 with the loads into registers (means 0.2881-0.3083 against 0.2679-0.3014),
every output bitwise the same; the driver gave every form three programs a multiprocessor. Not kept. (Measured before
diag_row_runs_latency.py's patches went into row_runs.py, later in the same session; the patches here now apply over
them.)

Rows: bench.protocol.time_cuda's mean and minimum in ms (L2 flushed before each call), the forms alternating each
round; each form's output, NaN-poisoned before its first call, checked against the register form's (bitwise), float64
and eager (KernelBench's check). Then the programs a multiprocessor holds per form (the driver's occupancy calculator).
"""

import functools

from convt3d.backends.cuda import row_runs
from p77_correlation import (Timings, alternate_forms, arguments, modes, patched_row_runs, patched_row_runs_source,
                             problem_77)

# The plane copy as patches of row_runs.py's source (measured so, as PLANE_COPY in the library's own source, in the
# seventy-third session; reverted there).
PLANE_COPY = (
    ('extern "C" __global__',
     """// 4 bytes from global to shared memory, asynchronously; zeros where inside is false (src not read).
__device__ __forceinline__ void cp_async4(float* dst, const float* src, bool inside) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\\n" :: "r"(smem_addr(dst)), "l"(src), "r"(inside ? 4 : 0));
}

extern "C" __global__"""),
    ("    unsigned* plane = (unsigned*)(weights + KH * KW * W_TAP_FLOATS);  // [PLANE_POS][ROW / 4 words], swizzled\n",
     "    unsigned* plane = (unsigned*)(weights + KH * KW * W_TAP_FLOATS);  // [PLANE_POS][ROW / 4 words], swizzled\n"
     "    float* raw = (float*)(plane + PLANE_POS * (ROW / 4));    // [C_IN][HH * XW]: a depth tap's plane as the input has it\n"),
    ("    copy_weights(0);\n",
     """    copy_weights(0);
    // Depth tap kd's plane into raw (4-byte asynchronous copies, lanes along the input's rows), zero outside the
    // input, as one cp.async group.
    auto copy_plane = [&](int kd) {
        const int x_d = qd + off_d + kd * DD + START_D;
        const bool depth_inside = x_d >= 0 && x_d < X_D;
        const float* x_plane = x + (long long)n * X_SN + (long long)x_d * X_SD;
        #pragma unroll 4
        for (int e = tid; e < C_IN * HH * XW; e += THREADS) {
            const int c = e / (HH * XW), p = e % (HH * XW);
            const int x_h = qh0 + off_h + p / XW + START_H, x_w = p % XW + START_W;
            const bool inside = depth_inside && x_h >= 0 && x_h < X_H && x_w >= 0 && x_w < X_W;
            cp_async4(raw + e, inside ? x_plane + (long long)c * X_SC + (long long)x_h * X_SH + x_w : x, inside);
        }
        cp_commit();
    };
    copy_plane(0);
"""),
    ("            copy_weights(kd);\n        }\n",
     """            copy_weights(kd);
        }
        // Plane kd, copied during the previous depth tap's MMAs (its weights, copied after it, may be on their way).
        if (kd == 0) cp_wait<0>(); else cp_wait<1>();
        __syncthreads();
"""),
    ("""        const int x_d = qd + off_d + kd * DD + START_D;
        const bool depth_inside = x_d >= 0 && x_d < X_D;
        const float* x_plane = x + (long long)n * X_SN + (long long)x_d * X_SD;
#else""", "#else"),
    ("""                    const int x_h = qh0 + off_h + p / XW + START_H, x_w = p % XW + START_W;
                    const bool inside = u < UNITS && depth_inside && x_h >= 0 && x_h < X_H && x_w >= 0 && x_w < X_W;
                    const float* at = x_plane + (long long)(16 * c16) * X_SC + (long long)x_h * X_SH + x_w;
                    #pragma unroll
                    for (int j = 0; j < 16; j++) v[r][h][j] = inside ? at[(long long)j * X_SC] : 0.f;
""", """                    #pragma unroll
                    for (int j = 0; j < 16; j++) v[r][h][j] = u < UNITS ? raw[(16 * c16 + j) * (HH * XW) + p] : 0.f;
"""),
    ("""        asm volatile("wgmma.commit_group.sync.aligned;\\n" ::: "memory");
#if REGION_FILL && !FILL_BESIDE_LOADS
        fill_part(kd);
#endif
    }
""", """        asm volatile("wgmma.commit_group.sync.aligned;\\n" ::: "memory");
        if (kd + 1 < KD) copy_plane(kd + 1);  // raw is free: every thread has split plane kd
#if REGION_FILL && !FILL_BESIDE_LOADS
        fill_part(kd);
#endif
    }
"""),
)


def min_blocks(blocks: int, split: int = 3):
    """The patch that compiles the kernel for blocks programs a multiprocessor."""
    return (f"#define MIN_BLOCKS {row_runs.programs_per_multiprocessor(split, 34)}\n", f"#define MIN_BLOCKS {blocks}\n")


def shared_bytes(taps, dilation, window_columns: int, split: int, plane_copy: bool) -> int:
    """row_runs.shared_bytes, with the input's float32 plane beside the weights and the split plane (plane_copy)."""
    (_, kh, kw), (_, dh, _) = taps, dilation
    row = 128 if split == 2 else 64
    raw = 4 * 32 * (row_runs.ROWS + (kh - 1) * dh) * window_columns if plane_copy else 0
    return max(kh * kw * 64 * row + row_runs.plane_positions(taps, dilation, window_columns) * row + raw,
               4 * 64 * (row_runs.positions(window_columns) + 4))


def form_patches(plane_copy: bool, patches=()) -> tuple:
    """A form's patches of row_runs.py's source: the plane copy's (plane_copy), then patches."""
    return (*(PLANE_COPY if plane_copy else ()), *patches)


# (name, plane copy, patches)
FORMS = (
    ("loads into registers, 3 a multiprocessor", False, ()),
    ("loads into registers, compiled for 2", False, (min_blocks(2),)),
    ("plane copy, 3 a multiprocessor", True, ()),
    ("plane copy, compiled for 2", True, (min_blocks(2),)),
)


def builder(plane_copy: bool, patches):
    """cuda._row_runs_kernel's stand-in for a form (its signature)."""
    return patched_row_runs(*form_patches(plane_copy, patches), exactly_once=True,
                            shared_bytes=functools.partial(shared_bytes, plane_copy=plane_copy))


def registers() -> None:
    """ptxas's registers and spills per form for problem 77 (NVRTC on this machine, tests/test_cuda_compile.py's)."""
    from test_cuda_compile import P77_INPUT, registers_and_spills
    for name, plane_copy, patches in FORMS:
        text = patched_row_runs_source(form_patches(plane_copy, patches), input_geometry=P77_INPUT, exactly_once=True)
        print(f"{name}: (registers, spilled bytes) {registers_and_spills(text)}, shared bytes "
              f"{shared_bytes((3, 3, 3), (1, 1, 1), 34, 3, plane_copy)}")


def main():
    args = arguments(3, registers)
    import torch
    from diag_programs_per_sm import occupancy

    x, w, _, _ = problem_77()
    builders = {name: builder(plane_copy, patches) for name, plane_copy, patches in FORMS}
    timings = Timings(args.iters)
    mode, _, reference, eager = next(modes(x, w))  # FP16 (TF32 allowed)
    alternate_forms(x, w, [(name, builders[name], True) for name, _, _ in FORMS], timings, mode, args.rounds,
                    reference, eager)
    for name, _, _ in FORMS:
        kernel = builders[name](torch.cuda.current_device(), 64, (3, 3, 3), (1, 1, 1), 34, False, 3,
                                ((16, 32, 32), (-1, -1, -1), tuple(x.stride()[:4])))
        print(f"{name}: {occupancy(kernel)} programs a multiprocessor")
    print(timings.table())


if __name__ == "__main__":
    main()
