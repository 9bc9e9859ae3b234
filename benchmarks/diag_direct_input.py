"""Problem 77's forward with row_runs.py's kernel reading the input itself (cuda.DIRECT_INPUT, the default) against
reading the operand pass's window (as before the sixty-eighth session), in one process, rounds alternating, in both
precision modes; then the first call's time on new input shapes, which compile the kernel anew (it has the input's
sizes and strides as macros).

    PYTHONPATH=src python3 benchmarks/diag_direct_input.py [--iters 100] [--rounds 3]

Rows: bench.protocol.time_cuda's mean and minimum in ms (L2 flushed before each call). Each form's output, NaN-poisoned
before its first call, is checked against the window's (bitwise), float64 and eager (KernelBench's check).
"""

import argparse
import time

import torch

import convt3d
from diag_overlap import checked
from p77_correlation import P77, Timings, library_forward, modes, problem_77


def first_calls(w, shapes) -> list[str]:
    """The wall time of the first and second call on each new input shape (TF32 mode), in ms."""
    lines = []
    for shape in shapes:
        x = torch.rand(shape, device="cuda")
        times = []
        for _ in range(2):
            torch.cuda.synchronize()
            start = time.perf_counter()
            convt3d.conv_transpose3d(x, w, None, backend="torch", **P77)
            torch.cuda.synchronize()
            times.append((time.perf_counter() - start) * 1e3)
        lines.append(f"input {tuple(shape)}: first call {times[0]:.1f} ms, second {times[1]:.2f} ms")
    return lines


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    x, w, _, _ = problem_77()
    timings = Timings(args.iters)
    for mode, _, reference, eager in modes(x, w):
        _, expected = library_forward(x, w, direct_input=False)
        for round_ in range(args.rounds):
            for name, direct_input in (("reading the input", True), ("reading the window", False)):
                forward, _ = library_forward(x, w, direct_input=direct_input)
                timings.row(mode, f"{name} (round {round_ + 1})", forward,
                            checked(forward, expected, reference, eager) if round_ == 0 else "")
        del expected, reference, eager
    library_forward(x, w)
    print(timings.table())
    print("\n".join(first_calls(w, [(16, 32, 17, 32, 32), (16, 32, 18, 30, 32), (8, 32, 18, 30, 32)])))


if __name__ == "__main__":
    main()
