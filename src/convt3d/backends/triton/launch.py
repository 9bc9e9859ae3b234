"""Launch a Triton kernel again through the compiled kernel that its first launch with the same arguments' properties
returned, skipping Triton's JIT launcher.

Triton's JIT launcher binds and specialises every argument and builds its cache key on every call. On the H200
machine the weight gradient kernel's launch (about 40 arguments) took 41.6 us of host time through it, 27.1 through
this launcher's first version and 10.7 calling the compiled kernel directly (benchmarks/RESULTS.md, eighth
session): host time that shows wherever the host, not the GPU, sets the pace, as it does in problem 77's backward.
So the caller hands over its arguments already split and its constant part already hashable (computed once per
layer), and a hit calls the compiled kernel's runner for that grid with the stream given (Triton's runner would
look up the current device and its stream again).

The key is finer than Triton's specialisation (Triton 3.x specialises each tensor on its dtype and 16-byte
alignment, each integer on being 1, a multiple of 16 and within 32 bits): the current device, the pointers' dtypes
and alignments, the grid, every other argument by value, the constexprs and launch options by value. So a compiled
kernel serves only calls that Triton would have sent to the same one. Under TRITON_INTERPRET=1 every call goes
through the kernel itself.
"""

from __future__ import annotations

import torch

from . import interpreted

# Distinct keys kept per kernel before starting over (each layer shape and batch size makes its own).
MAX_KEYS = 64

# The current stream of a device as Triton's own launcher gets it (torch's raw-stream call where it exists).
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _current_stream(device: int) -> int:
    return _raw_stream(device) if _raw_stream is not None else torch.cuda.current_stream(device).cuda_stream


class Launcher:
    """launcher.launch(grid, pointers, scalars, options) does what kernel[grid](*pointers, *scalars, **options)
    does. The kernel's pointer arguments (named *_ptr) come first, then its other runtime arguments (scalars, all
    ints), then its constexprs; options is a tuple of (name, value) pairs: constexprs and launch options."""

    def __init__(self, kernel):
        names = kernel.arg_names
        self.pointers = next(i for i, name in enumerate(names) if not name.endswith("_ptr"))
        if any(name.endswith("_ptr") for name in names[self.pointers:]):
            raise ValueError(f"{kernel.__name__}: pointer arguments must come first")
        self.kernel = kernel
        self._compiled = {}

    def launch(self, grid, pointers, scalars, options):
        if interpreted():
            return self.kernel[grid](*pointers, *scalars, **dict(options))
        device = torch.cuda.current_device()
        key = (device, tuple((t.dtype, t.data_ptr() % 16 == 0) for t in pointers), grid, scalars, options)
        hit = self._compiled.get(key)
        if hit is None:
            if len(pointers) != self.pointers or not all(type(value) is int for value in scalars):
                raise TypeError(f"{self.kernel.__name__}: {self.pointers} pointers, then ints (by value in the key, "
                                "where True would equal 1)")
            if len(self._compiled) >= MAX_KEYS:
                self._compiled.clear()
            compiled = self.kernel[grid](*pointers, *scalars, **dict(options))
            # The compiled kernel's runner takes every argument in the kernel's order, constexprs too.
            named = dict(options)
            constexprs = tuple(named[name] for name in self.kernel.arg_names[len(pointers) + len(scalars):])
            self._compiled[key] = (compiled[(*grid, 1, 1)[:3]], constexprs)
            return
        runner, constexprs = hit
        runner(*pointers, *scalars, *constexprs, stream=_current_stream(device))
