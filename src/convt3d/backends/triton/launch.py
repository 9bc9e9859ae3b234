"""Launch a Triton kernel again through the compiled kernel that its first launch with the same arguments' properties
returned, skipping Triton's JIT launcher.

Triton's JIT launcher binds and specialises every argument and builds its cache key on every call. On the H200
machine the weight gradient kernel's launch (about 40 arguments) took 41.6 us of host time through it, 27.1 through
this launcher and 10.7 calling the compiled kernel directly (benchmarks/RESULTS.md, eighth session): host time that
shows wherever the host, not the GPU, sets the pace. The key here is finer than Triton's specialisation (Triton 3.x
specialises each tensor on its dtype and 16-byte alignment, each integer on being 1, a multiple of 16 and within 32
bits): the pointers' dtypes and alignments, every other argument by value, the constexprs and launch options by
value, and the current device. So a compiled kernel serves only calls that Triton would have sent to the same one.
Under TRITON_INTERPRET=1 every call goes through the kernel itself. A key made of each argument's class instead
(isinstance on each) cost more host time than Triton's own launcher: 44.3 us (eighth session).
"""

from __future__ import annotations

import torch

from . import interpreted

# Distinct keys kept per kernel before starting over (each layer shape and batch size makes its own).
MAX_KEYS = 64


class Launcher:
    """launcher[grid](*args, **kwargs) does what kernel[grid](*args, **kwargs) does. The kernel's pointer
    arguments (named *_ptr) come first, then its other runtime arguments, all ints (by value in the key, where
    True would equal 1); all of them positionally, constexprs and launch options by keyword."""

    def __init__(self, kernel):
        names = kernel.arg_names
        self.pointers = next(i for i, name in enumerate(names) if not name.endswith("_ptr"))
        if any(name.endswith("_ptr") for name in names[self.pointers:]):
            raise ValueError(f"{kernel.__name__}: pointer arguments must come first")
        self.kernel = kernel
        self._compiled = {}

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self._launch(grid, args, kwargs)

    def _launch(self, grid, args, kwargs):
        if interpreted():
            return self.kernel[grid](*args, **kwargs)
        pointers = args[:self.pointers]
        key = (torch.cuda.current_device(), tuple((t.dtype, t.data_ptr() % 16 == 0) for t in pointers),
               args[self.pointers:], tuple(kwargs.items()))
        compiled = self._compiled.get(key)
        if compiled is None:
            if not all(type(value) is int for value in args[self.pointers:]):
                raise TypeError(f"{self.kernel.__name__}: runtime arguments after the pointers must be ints")
            if len(self._compiled) >= MAX_KEYS:
                self._compiled.clear()
            self._compiled[key] = self.kernel[grid](*args, **kwargs)
            return
        # The compiled kernel takes all three grid sizes and every argument in the kernel's order, constexprs too.
        constexprs = (kwargs[name] for name in self.kernel.arg_names[len(args):])
        compiled[(*grid, 1, 1)[:3]](*args, *constexprs)
