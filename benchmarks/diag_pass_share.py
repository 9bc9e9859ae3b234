"""Problem 77's forward in TF32 mode with its operand pass out of the way (GPU): as before the ninety-third session
(the pass reads the whole input for its block maxima, then the correlation starts), the correlation launched as the
pass's dependent (cuda.DEPENDENT: its fill warpgroup fills while the pass runs), the kernel finding each plane's scale
itself (row_runs.PLANE_MAXIMA: the pass makes the weight's halves alone), and both (the library's since then); with
the pass's and the correlation's launches alone as what-ifs (the forward as before), and zero_() of the output (the
floor).

    PYTHONPATH=src:tests:benchmarks python3 benchmarks/diag_pass_share.py [--iters 100] [--rounds 3]

Why: the pass took 0.024-0.029 ms alone on the H200 (sixty-eighth session), and the correlation started only once it
had finished, where the forward took 0.235 against the 0.15 ms target. Rows: bench.protocol.time_cuda's mean, median
and minimum in ms (L2 flushed before each call), the forms taking turns per round; each checked in the first round
against the first form's (bitwise), float64 and eager (KernelBench's check).

What it found (ninety-third session, an H100, medians of three rounds): before 0.2773-0.2781 ms; as the pass's
dependent 0.2767-0.2773; the planes' own maxima 0.2698-0.2702; both 0.2669-0.2686; the pass alone 0.0207-0.0211, the
correlation alone 0.2628-0.2630; zero_() 0.1762-0.1764. Every form's output was bitwise the first's on this input
(torch.rand: every plane's largest magnitude near 1, so the same scales), 2.9e-4 off float64.
"""

import contextlib

import torch

from convt3d.backends import cuda
from convt3d.backends.cuda import row_runs
from convt3d.backends.triton import window
from p77_correlation import P77, Timings, arguments, modes, problem_77, use_row_runs

import convt3d

# (name, cuda.DEPENDENT, row_runs.PLANE_MAXIMA)
FORMS = (("before: the pass's maxima, launched after it", False, False), ("as the pass's dependent", True, False),
         ("planes' own maxima", False, True), ("both (the library's)", True, True))


def use_form(dependent: bool, plane_maxima: bool) -> None:
    """The forward's kernels and launches from here on as the form says (compiled anew, or from the disk cache)."""
    cuda.DEPENDENT = dependent
    row_runs.PLANE_MAXIMA = plane_maxima
    cuda._row_runs_kernel.cache_clear()
    use_row_runs(direct_input=True)


@contextlib.contextmanager
def without_pass():
    """The operand pass's compiled launches (window._launch's) do nothing inside the block."""
    saved = {}
    for bound in window._launch._bound.values():
        for key, compiled in bound._compiled.items():
            saved[bound, key] = compiled
            runner, direct, by_driver = compiled
            bound._compiled[key] = (runner, direct and (lambda *a: None), by_driver and (lambda *a: None))
    try:
        yield
    finally:
        for (bound, key), compiled in saved.items():
            bound._compiled[key] = compiled


@contextlib.contextmanager
def without_correlation():
    """The CUDA kernels' launches (cuda._Kernel.launch) do nothing inside the block."""
    launch = cuda._Kernel.launch
    cuda._Kernel.launch = lambda self, *a, **k: None
    try:
        yield
    finally:
        cuda._Kernel.launch = launch


def main():
    args = arguments(3)
    from diag_overlap import checked
    x, w, plan, _ = problem_77()
    timings = Timings(args.iters)
    mode, _, reference, eager = next(modes(x, w))  # FP16 (TF32 mode)
    torch.backends.cudnn.allow_tf32 = True
    forward = lambda: convt3d.conv_transpose3d(x, w, None, backend="torch", **P77)
    use_form(False, False)
    expected = forward()
    for round_ in range(args.rounds):
        for name, dependent, plane_maxima in FORMS:
            use_form(dependent, plane_maxima)
            check = checked(forward, expected, reference, eager) if round_ == 0 else ""
            timings.row(mode, f"{name} (round {round_ + 1})", forward, check)
        # What-ifs: the forward as before with its correlation left out, and with its pass left out (the correlation
        # on whatever the last pass left in the operand buffer).
        use_form(False, False)
        forward()  # (its prepared call made)
        with without_correlation():
            timings.row(mode, f"what-if: the pass alone (round {round_ + 1})", forward)
        with without_pass():
            use_form(False, False)  # (its prepared call made anew, with the pass's launch that does nothing)
            timings.row(mode, f"what-if: the correlation alone (round {round_ + 1})", forward)
        use_form(False, False)
        out = forward()
        timings.row(mode, f"zero_() of the output (round {round_ + 1})", out.zero_)
    print(timings.table())


if __name__ == "__main__":
    main()
