"""Problem 77's operand pass in FP16 as the library runs it since the sixty-eighth session (no window: the window rows'
largest magnitudes and the weight's halves), taken apart: where do its 0.024 ms go, when diag_window_free.py's pass of
the same results took 0.017 (its minima, sixty-eighth session)?

    PYTHONPATH=src python3 benchmarks/diag_pass_maxima.py [--iters 100] [--rounds 2]

Rows: bench.protocol.time_cuda's mean and minimum in ms (L2 flushed before each call), of one launch each:
- "library pass": window.correlation_operands(..., window=False), the weight's programs then the window rows';
- "weights alone": the same launch's first O programs (the weight's halves);
- "maxima alone": its window rows' programs alone (WEIGHT_PROGRAMS 0);
- "diag_window_free's pass": one program per window row, reading the input row as 32 channels by its columns.
Each pass's outputs are compared with the library pass's (bitwise) before the timings.
"""

import argparse

import torch

from convt3d.backends.cuda import phases as cuda_phases
from convt3d.backends.triton import cdiv
from convt3d.backends.triton import window as window_module
from convt3d.backends.triton.window import correlation_operands
from diag_window_free import window_free_operands
from p77_correlation import Timings, problem_77


def pass_parts(x, w, start, extent, split: int):
    """(weights alone, maxima alone): functions that launch the library pass's weight programs, or its window rows'
    programs, into fresh outputs and return (taps, block maxima, inverse scales)."""
    grid, scalars, options, window_shape, block_p = window_module._geometry(
        0, tuple(x.shape), tuple(x.stride()), tuple(start), tuple(extent), tuple(w.shape), w.stride(), False, split,
        False)
    weight_programs = scalars[0]
    kd, kh, kw = w.shape[2:]

    def launch(programs, weights: bool):
        taps = torch.empty((kd, kh, kw, w.shape[1], 2 * w.shape[0]), dtype=torch.float16, device=x.device)
        block_max = torch.empty((*window_shape[:3], cdiv(window_shape[3], block_p)), dtype=torch.float32,
                                device=x.device)
        inverse = torch.empty(w.shape[1], dtype=torch.float32, device=x.device)
        launch_scalars = scalars if weights else (0, *scalars[1:])
        window_module._launch.launch((programs,), (x, block_max, w, taps, block_max, inverse), launch_scalars,
                                     options)
        return taps, block_max, inverse

    return (lambda: launch(weight_programs, True)), (lambda: launch(grid[0] - weight_programs, False))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    x, w, plan, phase_list = problem_77()
    split = 3
    start, extent, _ = cuda_phases._forward_geometry(plan, phase_list, split)
    library = lambda: correlation_operands(x, 0, x.shape, x.stride(), start, extent, w, False, split=split,
                                           window=False)
    weights_alone, maxima_alone = pass_parts(x, w, start, extent, 2)
    diag_pass = window_free_operands(x, w, start, extent)

    _, taps, (block_max, _, inverse) = library()
    parts_taps, _, parts_inverse = weights_alone()
    _, parts_max, _ = maxima_alone()
    diag_taps, (diag_max, _, diag_inverse) = diag_pass(poisoned=True)
    print("weights alone equal:", torch.equal(parts_taps, taps), torch.equal(parts_inverse, inverse),
          "| maxima alone equal:", torch.equal(parts_max, block_max),
          "| diag_window_free's equal:", torch.equal(diag_taps, taps), torch.equal(diag_max, block_max),
          torch.equal(diag_inverse, inverse), flush=True)

    timings = Timings(args.iters)
    for round_ in range(args.rounds):
        for name, fn in (("library pass", library), ("weights alone", weights_alone), ("maxima alone", maxima_alone),
                         ("diag_window_free's pass", diag_pass)):
            timings.row("FP16", f"{name} (round {round_ + 1})", fn)
    print(timings.table())


if __name__ == "__main__":
    main()
