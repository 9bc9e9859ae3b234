"""What the diagnostic scripts that time the library's CUDA correlation on problem 77 share (diag_turned,
diag_side_fill, diag_fill_flags): the problem's tensors, plan and phase, its precision modes with their reference
outputs, the correlation's geometry in a precision, row_runs.py's kernel with their changes patched into its source
and switching to it, forms of it timed in turns, and the rows of timings they print. GPU only (but
patched_row_runs_source).
"""

import argparse
import functools

import torch
import torch.nn.functional as F

import convt3d
from convt3d.backends import cuda, torch_phase
from convt3d.backends.cuda import phases as cuda_phases
from convt3d.backends.cuda import row_runs
from convt3d.backends.torch_phase import _lattice_geometry, _regions
from convt3d.bench.protocol import time_cuda
from convt3d.bench.report import markdown_table
from convt3d.plan import make_plan

P77 = dict(stride=2, padding=1, dilation=2)
LIBRARY_ROW_RUNS_KERNEL = cuda._row_runs_kernel
LIBRARY_DIRECT_INPUT = cuda.DIRECT_INPUT


def problem_77():
    """(x, w, plan, phase_list): problem 77's input (torch.rand) and a weight of the module's scale, seeded, on the
    GPU; its plan; the phases some tap reaches (one)."""
    torch.manual_seed(0)
    w = torch.randn(32, 64, 3, 3, 3, device="cuda") * 0.02
    x = torch.rand(16, 32, 16, 32, 32, device="cuda")
    plan = make_plan(tuple(x.shape), tuple(w.shape), (2,) * 3, (1,) * 3, (0,) * 3, 1, (2,) * 3)
    return x, w, plan, tuple(p for _, p in _regions(plan, True) if p is not None)


def modes(x, w):
    """Per precision mode of the library's correlation, PyTorch's TF32 flag set for it: (mode, split, the float64
    reference, eager's output in the mode); after the last mode, TF32 on again (PyTorch's default)."""
    for mode, split in (("FP16", 3), ("3xFP16", 2)):
        torch.backends.cudnn.allow_tf32 = split == 3
        yield (mode, split, F.conv_transpose3d(x.double(), w.double(), None, **P77),
               F.conv_transpose3d(x, w, None, **P77))
    torch.backends.cudnn.allow_tf32 = True


def library_forward(x, w, direct_input: bool = LIBRARY_DIRECT_INPUT):
    """(the library's forward of problem 77 on x and w, its output now): its CUDA phase path, with row_runs.py's kernel
    as the library builds it, reading the input itself (its default since the sixty-eighth session) or, with
    direct_input False, the operand pass's window as before."""
    use_row_runs(direct_input=direct_input)
    forward = lambda: convt3d.conv_transpose3d(x, w, None, backend="torch", **P77)
    return forward, forward()


def use_row_runs(builder=LIBRARY_ROW_RUNS_KERNEL, enabled: bool = True, direct_input: bool = False) -> None:
    """The correlations from here on by row_runs.py's kernel as builder makes it (cuda._row_runs_kernel's signature),
    reading the operand pass's window (the kernel the diagnostics' patches were written for) or the input itself
    (direct_input), or by phase_conv.py's (enabled False): the library's caches of launches and prepared calls
    cleared."""
    cuda.ROW_RUNS = enabled
    cuda.DIRECT_INPUT = direct_input
    cuda._row_runs_kernel = builder
    for cache in (cuda.tile_rows, cuda.phase_launches, cuda_phases._forward_geometry, cuda_phases._forward_launches,
                  cuda_phases._reads_input, cuda_phases._kernels_unsupported):
        cache.cache_clear()
    torch_phase._prepared.clear()


def patched_row_runs(*patches, head: str = "", has_bias=None, exactly_once: bool = False, shared_bytes=None,
                     threads: int = row_runs.THREADS):
    """A builder for use_row_runs: row_runs.py's kernel compiled as the library compiles it, its source as
    patched_row_runs_source gives it, and compiled with or without a bias as has_bias says where given (else as the
    launch asks), with shared_bytes(taps, dilation, window_columns, split) of shared memory where given (else
    row_runs.shared_bytes'), launched in blocks of threads. Each configuration is compiled once."""
    @functools.lru_cache(maxsize=None)
    def build(device_index, c_out, taps, dilation, window_columns, launch_has_bias, split, input_geometry=None,
              region=None):
        text = patched_row_runs_source(patches, c_out, taps, dilation, window_columns,
                                       launch_has_bias if has_bias is None else has_bias, split, input_geometry,
                                       region, head=head, exactly_once=exactly_once)
        with torch.cuda.device(device_index):
            return cuda._Kernel(text, "phase_conv_rows",
                                (shared_bytes or row_runs.shared_bytes)(taps, dilation, window_columns, split),
                                threads)
    return build


def patched_row_runs_source(patches, c_out=64, taps=(3, 3, 3), dilation=(1, 1, 1), window_columns=34, has_bias=False,
                            split=3, input_geometry=None, region=None, head: str = "",
                            exactly_once: bool = False) -> str:
    """row_runs.source (problem 77's by default) with each (old, new) of patches replaced, and head put before it: an
    error where old is missing (row_runs.py changed under the patch) or, with exactly_once, where it is there more
    than once."""
    text = row_runs.source(c_out, taps, dilation, window_columns, has_bias, split, input_geometry, region)
    for old, new in patches:
        if text.count(old) == 0 or (exactly_once and text.count(old) != 1):
            raise RuntimeError(f"row_runs.py's source changed: a diagnostic patch no longer matches {old[:60]!r}")
        text = text.replace(old, new)
    return head + text


def print_registers(forms) -> None:
    """ptxas's registers and spills (NVRTC on this machine, tests/test_cuda_compile.py's) of each (name, patches,
    region, head, only) of forms: patched_row_runs_source's problem 77 with that region, in FP16 reading the input and
    in 3xFP16 reading the window (as the library reads them), or only in the one precision (split) only names."""
    from test_cuda_compile import P77_INPUT, registers_and_spills
    forms = tuple(forms)
    for split, geometry, mode in ((3, P77_INPUT, "FP16, input"), (2, None, "3xFP16, window")):
        for name, patches, region, head, only in forms:
            if only in (None, split):
                text = patched_row_runs_source(patches, split=split, input_geometry=geometry, region=region,
                                               head=head, exactly_once=True)
                print(f"{mode}, {name}: (registers, spilled bytes) {registers_and_spills(text)}")


def arguments(rounds: int, registers=None, profile: bool = False, forms: bool = False) -> argparse.Namespace:
    """The command line of a diagnostic that times forms in turns: --iters, --rounds, where it has registers (a
    function printing ptxas's report of its forms) --registers, which runs that alone (on a CPU with NVRTC), where
    profile --profile (each form once, untimed, for Nsight Compute), and where forms --forms (words: only the forms
    whose names hold one of them, besides the first; see chosen)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=rounds)
    if registers is not None:
        parser.add_argument("--registers", action="store_true", help="only ptxas's report, on a CPU with NVRTC")
    if profile:
        parser.add_argument("--profile", action="store_true", help="each form once, untimed (for Nsight Compute)")
    if forms:
        parser.add_argument("--forms", nargs="+", metavar="WORD",
                            help="only the forms whose names hold one of these words, and the first (the baseline)")
    args = parser.parse_args()
    if registers is not None and args.registers:
        registers()
        raise SystemExit(0)
    return args


def chosen(forms, words) -> tuple:
    """forms' first (the baseline) and those whose name (each form's first item) holds one of words; all where words
    is None (no --forms)."""
    if words is None:
        return tuple(forms)
    kept = tuple(form for k, form in enumerate(forms) if k == 0 or any(word in form[0] for word in words))
    if len(kept) == 1 and len(forms) > 1:
        raise SystemExit(f"--forms {' '.join(words)}: no form's name holds any of these words")
    return kept


def alternate_forms(x, w, forms, timings, mode: str, rounds: int, reference, eager) -> None:
    """Problem 77's forward on x and w (the library's, backend="torch") with row_runs.py's kernel from each (name,
    builder, direct_input) of forms in turn, rounds times, as timings' rows: each form's output checked in the first
    round against the first form's (bitwise), float64 and eager (diag_overlap.checked); the library's kernel again
    after."""
    from diag_overlap import checked
    forward = lambda: convt3d.conv_transpose3d(x, w, None, backend="torch", **P77)
    use_row_runs(forms[0][1], direct_input=forms[0][2])
    expected = forward()
    for round_ in range(rounds):
        for name, builder, direct_input in forms:
            use_row_runs(builder, direct_input=direct_input)
            check = checked(forward, expected, reference, eager) if round_ == 0 else ""
            timings.row(mode, f"{name} (round {round_ + 1})", forward, check)
    use_row_runs(direct_input=LIBRARY_DIRECT_INPUT)


def correlation_geometry(plan, phase_list, split: int, out_strides):
    """The phase's correlation as the library's forward launches it in a precision (split) into an output of
    out_strides: (window start and extent, and the keyword arguments of cuda.correlate but for the window, weight
    taps, bias, output and scales: its lattice's offset and strides, grid, offsets, taps, first taps, steps,
    dilation)."""
    start, extent, launches = cuda_phases._forward_geometry(plan, phase_list, split)
    counts, dilation, grid, ((phases, offsets, firsts, steps),) = launches[0]
    lattice_offset, _, lattice_strides = _lattice_geometry(plan, phases, out_strides)
    return start, extent, dict(out_offset=lattice_offset, out_strides=lattice_strides, grid=grid, offsets=offsets,
                               taps=counts, first_taps=firsts, tap_steps=steps, dilation=dilation)


class Timings:
    """The rows a script prints: (mode, what, mean ms, median ms, min ms, check), each printed as it is measured
    (a median well under the mean: a few slow calls, or two kinds of call)."""

    def __init__(self, iters: int):
        self.iters = iters
        self.rows = []

    def row(self, mode, what, fn, check=""):
        t = time_cuda(fn, iters=self.iters)
        self.rows.append((mode, what, f"{t.mean_ms:.4f}", f"{t.median_ms:.4f}", f"{t.min_ms:.4f}", check))
        print(self.rows[-1], flush=True)

    def table(self) -> str:
        return markdown_table(["mode", "what", "mean ms", "median ms", "min ms", "check"], self.rows)


def composed(plan, fill, correlate, side=None, first=None):
    """A forward that allocates the output (torch.empty, the call's first allocation, so that diag_overlap.checked's
    NaN-poisoned block is it), runs first() (where given) and then fill(y, stream) on the current stream, or on side
    (a second stream) beside the rest, then correlate(y) on the current stream, which waits for side at the end."""
    def forward():
        y = torch.empty(plan.output_shape, device="cuda")
        main = torch.cuda.current_stream()
        if first is not None:
            first()
        if side is None:
            fill(y, main.cuda_stream)
        else:
            side.wait_stream(main)
            fill(y, side.cuda_stream)
        correlate(y)
        if side is not None:
            main.wait_stream(side)
            y.record_stream(side)
        return y
    return forward
