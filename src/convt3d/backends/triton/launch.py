"""Launch a Triton kernel again through the compiled kernel that its first launch with the same specialisation
returned, skipping Triton's JIT launcher.

Triton's JIT launcher binds and specialises every argument and builds its cache key on every call: on the H200
machine 22-41 us for the weight gradient kernel's launch against 8-18 us through the compiled kernel (benchmarks/
RESULTS.md, seventh session), host time that shows wherever the host, not the GPU, sets the pace. The key here is
at least as fine as Triton's specialisation (Triton 3.x: each tensor's dtype and 16-byte alignment; each integer's
being 1, being a multiple of 16, and fitting 32 bits; every constexpr and launch option by value), so that a
compiled kernel is reused only for calls that Triton would have sent to the same one. Under TRITON_INTERPRET=1
every call goes through the kernel itself.
"""

from __future__ import annotations

import os

import torch


def _specialisation(value):
    if isinstance(value, torch.Tensor):
        return value.dtype, value.data_ptr() % 16 == 0
    if isinstance(value, int) and not isinstance(value, bool):
        return value == 1, value % 16 == 0, -2**31 <= value < 2**31
    return type(value), value  # (no other kinds are passed by convt3d's launchers; by value is always safe)


class Launcher:
    """launcher[grid](*args, **kwargs) does what kernel[grid](*args, **kwargs) does. Runtime arguments go
    positionally and in the kernel's order, constexprs and launch options by keyword."""

    def __init__(self, kernel):
        self.kernel = kernel
        self._compiled = {}

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self._launch(grid, args, kwargs)

    def _launch(self, grid, args, kwargs):
        if os.environ.get("TRITON_INTERPRET") == "1":
            return self.kernel[grid](*args, **kwargs)
        key = (torch.cuda.current_device(), tuple(map(_specialisation, args)), tuple(kwargs.items()))
        compiled = self._compiled.get(key)
        if compiled is None:
            self._compiled[key] = self.kernel[grid](*args, **kwargs)
            return None
        # The compiled kernel takes all three grid sizes and every argument in the kernel's order, constexprs too.
        constexprs = (kwargs[name] for name in self.kernel.arg_names[len(args):])
        compiled[(*grid, 1, 1)[:3]](*args, *constexprs)
        return None
