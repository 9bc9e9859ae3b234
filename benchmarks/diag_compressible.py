"""Does compressible memory (Compute Data Compression, cuMemCreate's CU_MEM_ALLOCATION_COMP_GENERIC) take the cost of
problem 77's zeros off the DRAM? (GPU)

    PYTHONPATH=src python3 benchmarks/diag_compressible.py [--iters 100]

Why: problem 77's output is 571 MB of which 1 element in 8.5 is not zero. Written to ordinary memory it costs at least
zero_()'s 0.124 ms on the H200, which leaves the 0.15 ms target 0.026 ms for everything else. On devices with Compute
Data Compression, the L2 may write compressible lines (zeros among them) to DRAM in fewer bytes. This script asks the
driver for a compressible allocation of the output's size (the virtual memory API: cuMemCreate, cuMemMap,
cuMemSetAccess), says whether the driver granted it, and times, against an ordinary output of the same shape:
- zero_() and uniform_() (random floats: incompressible, the control);
- a sum over an output with one value in 17 (a reader after the forward);
- the library's forward of problem 77 (convt3d.conv_transpose3d, backend="torch", TF32 mode and off) the full way
  (torch_phase.by_phases: prepared calls take their output from new_empty), its output allocation
  (torch_phase._empty_output) returning the one buffer, compressible or ordinary; and the library's own call.
CUDA events around each call, the L2 flushed (256 MB written) before each (bench.protocol.time_cuda); mean and fastest
in ms. The forward's outputs are checked bitwise against the library's unpatched call, and KernelBench's check
against eager PyTorch.

Not in the library: an output outside PyTorch's caching allocator would surprise users (torch.cuda.memory_allocated,
empty_cache, streams); this only measures whether the hardware would reward one.

What it found (ninety-first session, H100, benchmarks/RESULTS.md): the driver granted the compressible allocation;
zero_() took 0.141 ms in it against 0.176, uniform_() and the sum the same in both, and the forward's means 9-10% less
(0.305 against 0.339 ms in TF32 mode, 0.313 against 0.344 with TF32 off).
"""

import argparse
import ctypes

import torch
import torch.nn.functional as F

import convt3d
from convt3d.backends import driver, torch_phase
from convt3d.bench.protocol import kernelbench_check, relative_error, time_cuda
from convt3d.bench.report import markdown_table

GENERIC_COMPRESSION_SUPPORTED = 107  # CUdevice_attribute
COMP_GENERIC = 1  # CU_MEM_ALLOCATION_COMP_GENERIC
HEADER = ["what", "output memory", "mean ms", "fastest ms", "bitwise the library's", "KB check", "rel. err."]


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocationProp(ctypes.Structure):  # CUmemAllocationProp
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", _Location),
                ("win32HandleMetaData", ctypes.c_void_p), ("compressionType", ctypes.c_ubyte),
                ("gpuDirectRDMACapable", ctypes.c_ubyte), ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class _AccessDesc(ctypes.Structure):  # CUmemAccessDesc
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


def _check(result, what):
    if result != 0:
        raise RuntimeError(f"{what} returned CUresult {result}")


class DeviceBuffer:
    """nbytes of device memory mapped through the virtual memory API, compressible if asked and granted; exposes
    __cuda_array_interface__ as float32 of the given shape."""

    def __init__(self, shape, compressible: bool, device: int = 0):
        cuda = driver.libcuda()
        self.shape = tuple(shape)
        nbytes = 4 * int(torch.tensor(shape).prod())
        prop = _AllocationProp(type=1, location=_Location(1, device),  # PINNED, on DEVICE
                               compressionType=COMP_GENERIC if compressible else 0)
        granularity = ctypes.c_size_t()
        _check(cuda.cuMemGetAllocationGranularity(ctypes.byref(granularity), ctypes.byref(prop), 1), "granularity")
        self.size = -(-nbytes // granularity.value) * granularity.value
        self.handle = ctypes.c_ulonglong()
        _check(cuda.cuMemCreate(ctypes.byref(self.handle), ctypes.c_size_t(self.size), ctypes.byref(prop),
                                 ctypes.c_ulonglong(0)), "cuMemCreate")
        granted = _AllocationProp()
        _check(cuda.cuMemGetAllocationPropertiesFromHandle(ctypes.byref(granted), self.handle), "properties")
        self.compressible = granted.compressionType == COMP_GENERIC
        self.pointer = ctypes.c_ulonglong()
        _check(cuda.cuMemAddressReserve(ctypes.byref(self.pointer), ctypes.c_size_t(self.size), ctypes.c_size_t(0),
                                         ctypes.c_ulonglong(0), ctypes.c_ulonglong(0)), "reserve")
        _check(cuda.cuMemMap(self.pointer, ctypes.c_size_t(self.size), ctypes.c_size_t(0), self.handle,
                              ctypes.c_ulonglong(0)), "map")
        access = _AccessDesc(_Location(1, device), 3)  # READWRITE
        _check(cuda.cuMemSetAccess(self.pointer, ctypes.c_size_t(self.size), ctypes.byref(access),
                                    ctypes.c_size_t(1)), "access")
        self.__cuda_array_interface__ = dict(shape=self.shape, typestr="<f4", data=(self.pointer.value, False),
                                             version=2, strides=None)

    def tensor(self) -> torch.Tensor:
        t = torch.as_tensor(self, device="cuda")
        assert t.data_ptr() == self.pointer.value and t.shape == self.shape
        return t


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iters", type=int, default=100)
    args = parser.parse_args()
    torch.zeros(1, device="cuda")  # (the primary context, current, before any driver call)
    cuda = driver.libcuda()
    supported = ctypes.c_int()
    _check(cuda.cuDeviceGetAttribute(ctypes.byref(supported), GENERIC_COMPRESSION_SUPPORTED, 0), "attribute")
    print(f"{torch.cuda.get_device_name()}: GENERIC_COMPRESSION_SUPPORTED = {supported.value}")

    torch.manual_seed(0)
    x = torch.rand(16, 32, 16, 32, 32, device="cuda")
    w = torch.rand(32, 64, 3, 3, 3, device="cuda") * 2 - 1
    layer = dict(stride=2, padding=1, dilation=2)
    shape = (16, 64, 33, 65, 65)
    buffers = {"ordinary": DeviceBuffer(shape, False), "compressible": DeviceBuffer(shape, True)}
    for name, b in buffers.items():
        print(f"{name}: {b.size / 2**20:.0f} MiB mapped, compressible granted: {b.compressible}")
    outputs = {name: b.tensor() for name, b in buffers.items()}
    outputs["caching allocator"] = torch.empty(shape, device="cuda")

    rows = []
    for name, out in outputs.items():
        for what, fn in (("zero_()", out.zero_), ("uniform_()", out.uniform_)):
            t = time_cuda(fn, iters=args.iters)
            rows.append([what, name, f"{t.mean_ms:.4f}", f"{t.min_ms:.4f}", "", "", ""])
        out.zero_()
        out.view(-1)[::17].uniform_()  # about problem 77's share of values (1 in 8.5) among zeros
        t = time_cuda(lambda: out.sum(), iters=args.iters)
        rows.append(["sum(), 1 value in 17", name, f"{t.mean_ms:.4f}", f"{t.min_ms:.4f}", "", "", ""])
    print(markdown_table(HEADER, rows), flush=True)  # (the fills' rows, before the forward's)
    fills = len(rows)

    # The forward the full way (by_phases: no prepared call, whose output comes from new_empty), its output the
    # buffer's.
    empty_output, prepared_call = torch_phase._empty_output, torch_phase.prepared_call
    reference64 = F.conv_transpose3d(x.double(), w.double(), **layer)
    for tf32 in (True, False):
        torch.backends.cudnn.allow_tf32 = tf32
        expected = F.conv_transpose3d(x, w, **layer)
        library = convt3d.conv_transpose3d(x, w, **layer, backend="torch")
        t = time_cuda(lambda: convt3d.conv_transpose3d(x, w, **layer, backend="torch"), iters=args.iters)
        mode = f"forward, TF32 {'mode' if tf32 else 'off'}"
        rows.append([mode, "the library's call", f"{t.mean_ms:.4f}", f"{t.min_ms:.4f}", "", "", ""])
        for name, out in outputs.items():
            torch_phase._empty_output = lambda *a, out=out, **k: out
            torch_phase.prepared_call = lambda *a, **k: None
            try:
                out.fill_(float("nan"))
                y = convt3d.conv_transpose3d(x, w, **layer, backend="torch")
                assert y.data_ptr() == out.data_ptr(), "the patched allocation was not used"
                same = torch.equal(y, library)
                ok = kernelbench_check(y, expected)
                err = relative_error(y, reference64)
                t = time_cuda(lambda: convt3d.conv_transpose3d(x, w, **layer, backend="torch"), iters=args.iters)
            finally:
                torch_phase._empty_output, torch_phase.prepared_call = empty_output, prepared_call
            rows.append([mode + ", the full way", name, f"{t.mean_ms:.4f}", f"{t.min_ms:.4f}", f"{same}", f"{ok}",
                         f"{err:.1e}"])
    torch.backends.cudnn.allow_tf32 = True
    print(markdown_table(HEADER, rows[fills:]))


if __name__ == "__main__":
    main()
