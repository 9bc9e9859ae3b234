"""The reverted fill_gaps experiment (twenty-fourth session, commit 3344d2d): the CUDA phase correlation writing the
whole of problem 77's output, the zeros around its one non-empty phase included, so that no fill comes first. Its
variants were macros of that commit's kernel; this script needs that commit's sources:

    git archive 3344d2d src | tar -x -C /tmp/fill_gaps
    PYTHONPATH=/tmp/fill_gaps/src python3 benchmarks/diag_fill_gaps.py

Variants (TF32; the last ones with TF32 off too): which gaps the bulk copies (cp.async.bulk, shared to global) zero,
A every gap between two lattice rows (512 copies of about 256 bytes per program) or B only the gaps before a plane's
first row (4.3 KB pieces; the epilogue writes the gaps between rows with the row after them), none, or the
epilogue's alone; and what the epilogue writes: the rows whole with their values ("normal"), the same spans of zeros
only (its cheapest form: no value read, not a correct output), or the lattice alone (the library's epilogue: the
gaps then hold NaN). "h": L2 evict-first hints on the writes; "hh": also evict-last on the window's loads. Rows:
cold-L2 mean and minimum in ms, and the error against float64 where the output is complete.
"""

import torch
import torch.nn.functional as F

from convt3d.backends import cuda
from convt3d.backends.cuda import phase_conv, phases as cuda_phases
from convt3d.backends.torch_phase import _lattice_geometry, _regions
from convt3d.backends.triton.window import correlation_operands
from convt3d.bench.protocol import relative_error, time_cuda
from convt3d.bench.report import markdown_table
from convt3d.plan import make_plan

P77 = dict(stride=2, padding=1, dilation=2)
# (label, EPILOGUE_GAPS, DIAG_EPI (0 normal, 1 zero spans, 2 lattice only), DIAG_NOGAPS, DIAG_HINT, with TF32 off)
VARIANTS = [("A gaps, normal", 0, 0, 0, 0, True), ("A gaps, zero spans", 0, 1, 0, 0, True),
            ("no gaps, zero spans", 0, 1, 1, 0, False), ("A gaps, lattice only", 0, 2, 0, 0, True),
            ("no gaps, lattice only", 0, 2, 1, 0, True), ("B gaps, zero spans", 1, 1, 0, 0, True),
            ("B gaps, normal", 1, 0, 0, 0, False), ("no gaps, zero spans, h", 0, 1, 1, 1, False),
            ("no gaps, zero spans, hh", 0, 1, 1, 2, False), ("B gaps, zero spans, h", 1, 1, 0, 1, True),
            ("B gaps, zero spans, hh", 1, 1, 0, 2, True), ("A gaps, zero spans, h", 0, 1, 0, 1, False),
            ("A gaps, zero spans, hh", 0, 1, 0, 2, False)]


def main():
    torch.manual_seed(0)
    w = torch.randn(32, 64, 3, 3, 3, device="cuda") * 0.02
    x = torch.rand(16, 32, 16, 32, 32, device="cuda")
    reference = F.conv_transpose3d(x.double(), w.double(), None, **P77)
    plan = make_plan(tuple(x.shape), tuple(w.shape), (2,) * 3, (1,) * 3, (0,) * 3, 1, (2,) * 3)
    phase_list = tuple(p for _, p in _regions(plan, True) if p is not None)
    rows = []
    for tf32 in (True, False):
        torch.backends.cudnn.allow_tf32 = tf32
        start, extent, launches = cuda_phases._forward_geometry(plan, phase_list, not tf32)
        phases, offsets, counts, firsts, steps, dilation, grid = launches[0]  # (3344d2d's launch tuple)
        window, taps = correlation_operands(x, 0, x.shape, x.stride(), start, extent, w, False, split=not tf32)
        whole = torch.full(plan.output_shape, float("nan"), device="cuda")
        offset, _, strides = _lattice_geometry(plan, phases, whole.stride())
        gaps = (phases[2].out_start, strides[4])
        for label, epilogue_gaps, epilogue, no_gaps, hint, off_too in VARIANTS:
            if not tf32 and not off_too:
                continue
            phase_conv.EPILOGUE_GAPS = bool(epilogue_gaps)
            phase_conv.DIAG = dict(DIAG_EPI=epilogue, DIAG_NOGAPS=no_gaps, DIAG_HINT=hint)
            cuda._kernel.cache_clear()
            whole.fill_(float("nan"))
            run = lambda: cuda.correlate(window, taps, None, whole, offset, strides, grid, offsets, counts, firsts,
                                         steps, dilation, gaps)
            run()
            check = (f"{relative_error(whole, reference):.1e}" if epilogue == 0
                     else f"NaN left: {bool(whole.isnan().any())}")
            t = time_cuda(run, iters=30)
            rows.append(("TF32" if tf32 else "off", label, f"{t.mean_ms:.4f}", f"{t.min_ms:.4f}", check))
            print(rows[-1], flush=True)
    torch.backends.cudnn.allow_tf32 = True
    print(markdown_table(["mode", "variant", "mean ms", "min ms", "check"], rows))


if __name__ == "__main__":
    main()
