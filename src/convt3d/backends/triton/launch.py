"""Launch a Triton kernel again through the compiled kernel that its first launch with the same arguments' properties
returned, skipping Triton's JIT launcher (and, at addresses, Triton's launcher too: _driver_launch, unless
CONVT3D_DRIVER_LAUNCH=0).

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

import ctypes
import re

import torch

from ... import environment
from .. import current_cuda_device as _current_device
from .. import driver
from . import interpreted

try:
    from triton.knobs import runtime as _runtime_knobs  # Triton 3.4 and later
except ImportError:
    _runtime_knobs = None

# Distinct bindings kept per kernel before starting over (each layer shape and batch size makes its own).
MAX_KEYS = 64
# Whether launches at addresses go through the driver (driver.Launch, _driver_launch) rather than Triton's launcher:
# on unless CONVT3D_DRIVER_LAUNCH=0 (or launch.DRIVER_LAUNCH = False, before a kernel is first compiled for a
# binding). On the H200 machine every kernel of twelve layer and precision cases compiled by Triton 3.6 took it, and it
# took 3.4 us less host time per forward call (two launches) by the median of those cases; prepared calls' outputs
# were bitwise as through Triton's launcher on six of them (benchmarks/diag_launch_ways.py, sixty-sixth session).
DRIVER_LAUNCH = environment.switch("CONVT3D_DRIVER_LAUNCH", True)

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


# Triton's types of integer arguments, as the driver takes them.
_INTEGER_TYPES = {"i32": ctypes.c_int32, "u32": ctypes.c_uint32, "i64": ctypes.c_int64, "u64": ctypes.c_uint64}


def _entry_parameter_bytes(ptx: str):
    """The sizes in bytes of the PTX kernel's parameters, in order; None unless it has one entry whose parameters
    are all integers, pointers or byte arrays (a TMA descriptor's tensor map: .align 64 .b8 name[128])."""
    entries = re.findall(r"\.entry\s+[\w$]+\s*\(([^)]*)\)", ptx)
    if len(entries) != 1:
        return None
    sizes = []
    for parameter in entries[0].split(","):
        found = re.search(r"\.param\s+(?:\.align\s+\d+\s+)?\.[bsu](8|16|32|64)\b[^\[]*(?:\[(\d+)\])?", parameter)
        if found is None:
            return None
        sizes.append(int(found.group(1)) // 8 * int(found.group(2) or 1))
    return sizes


def _launches_plainly(metadata) -> bool:
    """Whether a compiled kernel asks for nothing that a launch by the driver here leaves out: no cluster of programs,
    no scratch memory."""
    return (getattr(metadata, "num_ctas", 1) == 1 and not getattr(metadata, "global_scratch_size", 0)
            and not getattr(metadata, "profile_scratch_size", 0))


def _scratch_pointers(metadata) -> list:
    """The null scratch pointers that Triton passes after a kernel's arguments: the global one and, from Triton 3.5 on,
    the profile's."""
    return [ctypes.c_uint64(0) for _ in range(1 + hasattr(metadata, "profile_scratch_size"))]


def _driver_launch(compiled, grid3, pointers: int, scalars):
    """The compiled kernel's launch through the driver (driver.Launch), its scalars packed once, as a function of
    (stream, *addresses); None where its parameters are not as expected, then Triton's launcher serves. Triton passes
    a kernel the arguments that its signature (compiled.src.signature) does not make constexpr (it makes integers
    equal to 1 constexpr), then its scratch pointers, the global one and from Triton 3.5 on the profile's (null:
    none of ours asks for scratch memory), and launches cooperative (launch_cooperative_grid) and programmatically
    dependent (launch_pdl) where the kernel was compiled so; the PTX's parameter list must agree. On the GPU
    machine's host Triton's launcher took about 9 us a launch with addresses (thirty-fifth session), which the GPU
    waits through on small layers."""
    try:
        metadata, function = compiled.metadata, compiled.function
        types = list(compiled.src.signature.values())[pointers:pointers + len(scalars)]
        sizes = _entry_parameter_bytes(compiled.asm["ptx"])
    except Exception:  # noqa: BLE001 (another Triton's compiled kernel: its own launcher serves)
        return None
    if sizes is None or len(types) != len(scalars) or not _launches_plainly(metadata):
        return None
    values = []
    for kind, value in zip(types, scalars):
        if kind != "constexpr":
            if kind not in _INTEGER_TYPES:
                return None
            values.append(_INTEGER_TYPES[kind](value))
    scratch = _scratch_pointers(metadata)
    if (len(sizes) != pointers + len(values) + len(scratch)
            or any(size != 8 for size in sizes[:pointers] + sizes[-len(scratch):])
            or sizes[pointers:pointers + len(values)] != [ctypes.sizeof(v) for v in values]):
        return None
    values += scratch
    return driver.Launch(function, grid3, 32 * metadata.num_warps, metadata.shared, pointers, values,
                         dependent=bool(getattr(metadata, "launch_pdl", False)),
                         cooperative=bool(getattr(metadata, "launch_cooperative_grid", False)))


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
            self._compiled[key] = (kernel[self.grid3], _direct(kernel, self.grid3, (*self.scalars, *self.constexprs)),
                                   _driver_launch(kernel, self.grid3, self.pointers, self.scalars)
                                   if DRIVER_LAUNCH else None)
            return
        runner, direct, _ = compiled
        stream = _current_stream(device)
        if direct is not None and _no_launch_hooks():
            direct(stream, *addresses)
        else:
            runner(*pointers, *self.scalars, *self.constexprs, stream=stream)

    def at_addresses(self, device: int, dtypes):
        """This launch as a function of (stream, *addresses), through the compiled kernel that an earlier call with
        16-byte aligned pointers of these dtypes (one per pointer) on device made: by the driver (_driver_launch)
        where DRIVER_LAUNCH asks for it and the kernel allows, else by Triton's launcher (_direct); None where there
        is none, in the interpreter, or where this Triton's compiled kernel lacks the direct launch. What __call__
        checks per call is the caller's to check: the pointers' alignment, and the device and hooks
        (ready_stream)."""
        compiled = None if self.interpreted else self._compiled.get((device, *[(dtype, True) for dtype in dtypes]))
        if compiled is None:
            return None
        _, direct, by_driver = compiled
        return by_driver if by_driver is not None and direct is not None else direct


def ready_stream(device: int):
    """The current stream, where launches at addresses (BoundLaunch.at_addresses) on device may go now: it is the
    current device and no launch hook is registered. Else None."""
    if _current_device() != device or not _no_launch_hooks():
        return None
    return _current_stream(device)
