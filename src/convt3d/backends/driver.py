"""Kernel launches through the CUDA driver's cuLaunchKernelEx, called by ctypes with an argument array built once per
launch's fixed arguments: on a call only the pointers and the stream are written into it. The CUDA kernels of our own
(cuda._Kernel) go this way, and so do the Triton kernels' launches at addresses (triton.launch) unless
CONVT3D_DRIVER_LAUNCH=0.

libcuda is opened on the first launch, not at import.
"""

from __future__ import annotations

import ctypes
import functools
import threading

# CUlaunchAttributeIDs: CU_LAUNCH_ATTRIBUTE_COOPERATIVE, every program resident at once (a kernel that waits for all
# of its programs, as tensor_scaled's pass does); CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, the kernel
# may start before the one before it in the stream has finished (programmatic dependent launch, which a kernel waits
# out by griddepcontrol.wait, Triton's gdc_wait).
COOPERATIVE = 2
PROGRAMMATIC_STREAM_SERIALIZATION = 6


class _LaunchAttribute(ctypes.Structure):  # CUlaunchAttribute: the id, padding to 8 bytes, a 64-byte value union
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int),
                ("rest", ctypes.c_char * 60)]


class _LaunchConfig(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [("grid_x", ctypes.c_uint), ("grid_y", ctypes.c_uint), ("grid_z", ctypes.c_uint),
                ("block_x", ctypes.c_uint), ("block_y", ctypes.c_uint), ("block_z", ctypes.c_uint),
                ("shared_bytes", ctypes.c_uint), ("stream", ctypes.c_void_p),
                ("attributes", ctypes.POINTER(_LaunchAttribute)), ("attribute_count", ctypes.c_uint)]


@functools.lru_cache(maxsize=1)
def libcuda():
    # cuLaunchKernelEx without argtypes: a Launch passes it ctypes objects only (a reference to its configuration,
    # the function as c_void_p, its argument array, None), which need no conversion; with argtypes ctypes checked
    # and converted each on every call. On the H200 machine a launch took 5.4 us this way against 6.1 with them and
    # the lookups per call (benchmarks/diag_driver_call.py, sixty-seventh session).
    lib = ctypes.CDLL("libcuda.so.1")
    lib.cuLaunchKernelEx.restype = ctypes.c_int
    return lib


def check(result: int) -> None:
    if result != 0:
        message = ctypes.c_char_p()
        libcuda().cuGetErrorString(result, ctypes.byref(message))
        raise RuntimeError(f"convt3d: cuLaunchKernelEx failed: {message.value.decode() if message.value else result}")


class Launch:
    """A kernel's launch with its grid, block, shared memory, attributes and every argument but its pointers fixed:
    launch(stream, *addresses) writes the pointers (the first arguments, 64-bit) and launches. values: the other
    arguments as ctypes values, in the kernel's order after the pointers."""

    def __init__(self, function: int, grid, threads: int, shared_bytes: int, pointers: int, values,
                 dependent: bool = False, cooperative: bool = False):
        self.function = function if isinstance(function, ctypes.c_void_p) else ctypes.c_void_p(function)
        self.slots = [ctypes.c_uint64(0) for _ in range(pointers)]
        self.values = list(values)
        arguments = self.slots + self.values
        self.array = (ctypes.c_void_p * len(arguments))(*(ctypes.addressof(v) for v in arguments))
        ids = [id_ for id_, wanted in ((COOPERATIVE, cooperative), (PROGRAMMATIC_STREAM_SERIALIZATION, dependent))
               if wanted]
        self.attributes = (_LaunchAttribute * max(len(ids), 1))()
        for attribute, id_ in zip(self.attributes, ids):
            attribute.id, attribute.value = id_, 1
        grid = (*grid, 1, 1)[:3]
        self.config = _LaunchConfig(*grid, threads, 1, 1, shared_bytes, None,
                                    ctypes.cast(self.attributes, ctypes.POINTER(_LaunchAttribute)), len(ids))
        self.config_reference = ctypes.byref(self.config)
        self.launch_kernel = None  # cuLaunchKernelEx, looked up on the first call (libcuda opens then)
        self.lock = threading.Lock()

    def __call__(self, stream: int, *addresses) -> None:
        if self.launch_kernel is None:
            self.launch_kernel = libcuda().cuLaunchKernelEx
        with self.lock:  # the driver reads the array and the configuration during the call
            for slot, address in zip(self.slots, addresses):
                slot.value = address
            self.config.stream = stream
            result = self.launch_kernel(self.config_reference, self.function, self.array, None)
        if result:
            check(result)
