"""Whether Triton's interpreter (TRITON_INTERPRET=1) can run this backend's kernels here.

Their loops run to bounds that are kernel arguments (`range(n)`, `range(pid, tiles, programs)`), which the interpreter
turns into Python ints. Triton 3.6's interpreter does so by int() of a one-element NumPy array, which newer NumPy
refuses ("only 0-dimensional arrays can be converted to Python scalars"): every kernel then fails deep inside the
interpreter. Seen on this project's machines: Triton 3.6 with NumPy 2.4.6 and 2.5.2 fails, Triton 3.6 with NumPy
2.3.5 and Triton 3.9 with NumPy 2.4.6 run the kernels.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _count_kernel(out_ptr, n):
    count = 0
    for _ in range(n):
        count += 1
    tl.store(out_ptr, count)


def interpreter_runs_loops() -> bool:
    """Whether the interpreter runs a loop bounded by a kernel argument (call it with TRITON_INTERPRET=1 set)."""
    out = torch.zeros(1, dtype=torch.int32)
    try:
        _count_kernel[(1,)](out, 3)
    except Exception:  # noqa: BLE001 (the interpreter wraps what failed in its own error types)
        return False
    return int(out) == 3
