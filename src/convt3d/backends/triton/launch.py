"""Launch a Triton kernel again through the compiled kernel that its first launch with the same arguments' properties
returned, skipping Triton's JIT launcher.

Triton's JIT launcher binds and specialises every argument and builds its cache key on every call. On the H200
machine the weight gradient kernel's launch (about 40 arguments) took 41.6 us of host time through it, 27.1 through
this launcher's first version and 10.7 calling the compiled kernel directly (benchmarks/RESULTS.md, eighth
session): host time that shows wherever the host, not the GPU, sets the pace, as it does in problem 77's backward.
So the caller hands over its arguments already split and its constant part already hashable (computed once per
layer), and a hit calls the compiled kernel's launcher object (compiled.run) with the arguments that the compiled
kernel's runner (compiled[grid]) would give it, the stream given. The runner itself costs more: on the H200 machine
(benchmarks/diag_host_steps.py, twenty-second session) a launch took 14.9 us through the runner and 10.9 through
compiled.run, about 4 us for its launch metadata (a dict built on every call in Triton 3.6 for launch hooks that may
be registered) and its empty hook chains, which Triton's C launcher then calls. So the runner serves wherever a
launch hook is registered (a profiler such as proton's) or this Triton's compiled kernel or hooks look otherwise.

The key is finer than Triton's specialisation (Triton 3.x specialises each tensor on its dtype and 16-byte
alignment, each integer on being 1, a multiple of 16 and within 32 bits): the current device, the pointers' dtypes
and alignments, the grid, every other argument by value, the constexprs and launch options by value. So a compiled
kernel serves only calls that Triton would have sent to the same one. Under TRITON_INTERPRET=1 every call goes
through the kernel itself.
"""

from __future__ import annotations

import torch

from .. import current_cuda_device as _current_device
from . import interpreted

try:
    from triton.knobs import runtime as _runtime_knobs  # Triton 3.4 and later
except ImportError:
    _runtime_knobs = None

# Distinct bindings kept per kernel before starting over (each layer shape and batch size makes its own).
MAX_KEYS = 64

# The current stream of a device as Triton's own launcher gets it (torch's raw-stream call where it exists).
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _current_stream(device: int) -> int:
    return _raw_stream(device) if _raw_stream is not None else torch.cuda.current_stream(device).cuda_stream


def _no_launch_hooks() -> bool:
    """Whether Triton's launch hook chains are known to be empty (Triton 3.4-3.9 keep them as HookChains)."""
    if _runtime_knobs is None:
        return False
    return (not getattr(_runtime_knobs.launch_enter_hook, "calls", True)
            and not getattr(_runtime_knobs.launch_exit_hook, "calls", True))


def _direct(compiled, grid3, tail):
    """The compiled kernel's launch as a function of (stream, *pointers' addresses): compiled.run given what
    compiled[grid3]'s runner would hand it (the kernel's function and packed metadata), no launch metadata and no
    hooks, tail (the other arguments) after the addresses; None where this compiled kernel lacks them. Triton's C
    launcher takes an int as the address itself, where for a tensor it calls data_ptr() and asks the driver whether
    the address is device memory (cuPointerGetAttribute), per pointer and call."""
    try:
        run, function, metadata = compiled.run, compiled.function, compiled.packed_metadata
    except AttributeError:
        return None

    def launch(stream, *addresses):
        run(*grid3, stream, function, metadata, None, None, None, *addresses, *tail)

    return launch


class Launcher:
    """launcher.launch(grid, pointers, scalars, options) does what kernel[grid](*pointers, *scalars, **options)
    does. The kernel's pointer arguments (named *_ptr) come first, then its other runtime arguments (scalars, all
    ints), then its constexprs; options is a tuple of (name, value) pairs: constexprs and launch options.

    launcher.bind(grid, scalars, options) is the same launch with all but the pointers fixed, for callers that keep
    it per layer: calling it hashes only the device and the pointers' dtypes and alignments, not the fifty-odd other
    arguments. With the forward's launches bound once per layer (and the environment and device lookups below
    moved off the call), the median host time of a forward call on the H200 machine fell from 73-87 to 57-61 us in
    seven of eight measurements (benchmarks/RESULTS.md, nineteenth session)."""

    def __init__(self, kernel):
        names = kernel.arg_names
        self.pointers = next(i for i, name in enumerate(names) if not name.endswith("_ptr"))
        if any(name.endswith("_ptr") for name in names[self.pointers:]):
            raise ValueError(f"{kernel.__name__}: pointer arguments must come first")
        self.kernel = kernel
        # Whether the kernel runs in Triton's interpreter: triton.jit decided that when it decorated the kernel,
        # from the same environment variable, at import.
        self.interpreted = interpreted()
        self._bound = {}

    def bind(self, grid, scalars, options) -> "BoundLaunch":
        key = (grid, scalars, options)
        bound = self._bound.get(key)
        if bound is None:
            if not all(type(value) is int for value in scalars):
                raise TypeError(f"{self.kernel.__name__}: {self.pointers} pointers, then ints (by value in the key, "
                                "where True would equal 1)")
            if len(self._bound) >= MAX_KEYS:
                self._bound.clear()
            bound = self._bound[key] = BoundLaunch(self, grid, scalars, options)
        return bound

    def launch(self, grid, pointers, scalars, options):
        self.bind(grid, scalars, options)(pointers)


class BoundLaunch:
    """One launch of a kernel with its grid, scalars and options fixed; call it with the pointers. The compiled
    kernel is kept per current device and the pointers' dtypes and 16-byte alignments."""

    __slots__ = ("kernel", "pointers", "grid", "grid3", "scalars", "options", "constexprs", "interpreted",
                 "_compiled")

    def __init__(self, launcher: Launcher, grid, scalars, options):
        self.kernel, self.pointers, self.interpreted = launcher.kernel, launcher.pointers, launcher.interpreted
        self.grid, self.scalars, self.options = grid, scalars, dict(options)
        self.grid3 = (*grid, 1, 1)[:3]
        # The compiled kernel's runner takes every argument in the kernel's order, constexprs too.
        self.constexprs = tuple(self.options[name] for name in self.kernel.arg_names[self.pointers + len(scalars):])
        self._compiled = {}

    def __call__(self, pointers):
        if self.interpreted:
            return self.kernel[self.grid](*pointers, *self.scalars, **self.options)
        device = _current_device()
        addresses = [t.data_ptr() for t in pointers]
        key = (device, *[(t.dtype, address % 16 == 0) for t, address in zip(pointers, addresses)])
        compiled = self._compiled.get(key)
        if compiled is None:
            if len(pointers) != self.pointers:
                raise TypeError(f"{self.kernel.__name__}: {self.pointers} pointers, then ints")
            kernel = self.kernel[self.grid](*pointers, *self.scalars, **self.options)
            self._compiled[key] = (kernel[self.grid3], _direct(kernel, self.grid3, (*self.scalars, *self.constexprs)))
            return
        runner, direct = compiled
        stream = _current_stream(device)
        if direct is not None and _no_launch_hooks():
            direct(stream, *addresses)
        else:
            runner(*pointers, *self.scalars, *self.constexprs, stream=stream)

    def at_addresses(self, device: int, dtypes):
        """This launch as a function of (stream, *addresses), through the compiled kernel that an earlier call with
        16-byte aligned pointers of these dtypes (one per pointer) on device made; None where there is none, in the
        interpreter, or where this Triton's compiled kernel lacks the direct launch. What __call__ checks per call is
        the caller's to check: the pointers' alignment, and the device and hooks (ready_stream)."""
        compiled = None if self.interpreted else self._compiled.get((device, *[(dtype, True) for dtype in dtypes]))
        return None if compiled is None else compiled[1]


def ready_stream(device: int):
    """The current stream, where launches at addresses (BoundLaunch.at_addresses) on device may go now: it is the
    current device and no launch hook is registered. Else None."""
    if _current_device() != device or not _no_launch_hooks():
        return None
    return _current_stream(device)
