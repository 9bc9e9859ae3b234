"""The CUDA kernels that a first call of problem 77's layer by the phase path compiles, and how long NVRTC and ptxas
take for each here (the project's 2-core CPU, sm_90a): those the check compiled before the seventieth session
(cuda.phase_conv_unsupported: phase_conv.py's kernel without a bias, at one phase's tile rows) and those the call
launches, which the check now compiles itself (cuda.phases.forward_kernels_unsupported). No GPU here: the kernels'
sources are recorded by a stand-in for cuda._Kernel on a pretended sm_90 device, then compiled on the CPU in two
steps timed apart (NVRTC to PTX by tests/test_cuda_compile.py's compile_to_ptx, then Triton's ptxas). The input is
taken as a GPU's would be (its rows contiguous: in FP16 the correlation reads it itself), with a bias or without.

    PYTHONPATH=src:tests python3 benchmarks/cpu_first_call_compiles.py

torch.cuda._compile_kernel compiles with NVRTC straight to SASS, so NVRTC + ptxas here stands for it; on the GPU
machine the first call also loads the module (benchmarks/diag_compile_time.py times that there). Last, the eight
kernels of a k3 s2 layer's forward (one a phase) compiled by NVRTC straight to SASS one after the other, then in a
thread each up to the CPU's cores, as cuda.compiled_together compiles them.
"""

import contextlib
import ctypes
import os
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from convt3d.backends import cuda
from convt3d.backends.cuda import phase_conv
from convt3d.backends.cuda import phases as cuda_phases
from convt3d.backends.torch_phase import _regions
from convt3d.bench.report import markdown_table
from convt3d.plan import make_plan
from test_cuda_compile import NVRTC, PTXAS, compile_to_ptx


def launched_sources(x, bias, plan, phase_list, tf32: bool) -> list:
    """(name, source) of each kernel that forward_kernels_unsupported builds for this call, as cuda._Kernel gets it."""
    built = []

    class Recorder:
        def __init__(self, source, name, shared_bytes, threads):
            built.append((name, source))

    real = (cuda._Kernel, cuda._capability, torch.cuda.device, cuda._compile_kernel, cuda_phases._direct_input)
    cuda._Kernel, cuda._capability = Recorder, lambda index: cuda.ARCHITECTURE
    torch.cuda.device, cuda._compile_kernel = (lambda index: contextlib.nullcontext()), (lambda: object())

    def direct_input(input, plan, phase_list, split, has_bias):  # as for a GPU tensor with contiguous rows
        direct = cuda_phases.input_direct(input, plan, phase_list, split)
        return direct if cuda_phases._reads_input(plan, phase_list, split, 0, has_bias, direct[1]) else None

    cuda_phases._direct_input = direct_input
    try:
        for cache in (cuda._kernel, cuda._row_runs_kernel, cuda_phases._kernels_unsupported, cuda_phases._reads_input):
            cache.cache_clear()
        with torch.backends.cudnn.flags(enabled=True, allow_tf32=tf32):
            assert cuda_phases.forward_unsupported(plan, phase_list, torch.device("cuda", 0), x.dtype, tf32) is None
            assert cuda_phases.forward_kernels_unsupported(x, bias, plan, phase_list) is None
    finally:
        cuda._Kernel, cuda._capability, torch.cuda.device, cuda._compile_kernel, cuda_phases._direct_input = real
        for cache in (cuda._kernel, cuda._row_runs_kernel, cuda_phases._kernels_unsupported, cuda_phases._reads_input):
            cache.cache_clear()
    return built


def old_check_sources(plan, phase_list, split: int) -> list:
    """(name, source) of what phase_conv_unsupported compiled per phase before the seventieth session."""
    sources = []
    for phases in phase_list:
        counts, _, _ = cuda_phases._taps(phases, ascending=False)
        dilation = tuple(p.input_dilation for p in phases)
        grid = tuple(p.out_count for p in phases)
        c_in, c_out = plan.in_channels, plan.out_channels
        rows = cuda.tile_rows(c_in, c_out, counts, dilation, split, plan.batch, grid)
        _, cob, _, unit = cuda.config(c_in, c_out, counts, dilation, split)
        sources.append(("phase_conv", phase_conv.source(c_in, c_out, cob, counts, dilation, rows, False, split, unit)))
    return sources


def cubin(source: str) -> bytes:
    """NVRTC straight to SASS for sm_90a, as torch's _compile_kernel compiles (nvrtcGetCUBIN)."""
    program = ctypes.c_void_p()
    assert NVRTC.nvrtcCreateProgram(ctypes.byref(program), source.encode(), b"kernel.cu", 0, None, None) == 0
    options = [b"--gpu-architecture=sm_90a", b"--std=c++17"]
    assert NVRTC.nvrtcCompileProgram(program, len(options), (ctypes.c_char_p * len(options))(*options)) == 0
    size = ctypes.c_size_t()
    NVRTC.nvrtcGetCUBINSize(program, ctypes.byref(size))
    binary = ctypes.create_string_buffer(size.value)
    NVRTC.nvrtcGetCUBIN(program, binary)
    NVRTC.nvrtcDestroyProgram(ctypes.byref(program))
    return binary.raw


def k3s2_sources(tf32: bool) -> list:
    """The sources of the kernels a k3 s2 p1 op1 layer's forward launches (64 -> 32 channels, a bias): eight, one a
    phase, as cuda.compiled_together gets them."""
    plan = make_plan((1, 64, 8, 64, 64), (64, 32, 3, 3, 3), (2,) * 3, (1,) * 3, (1,) * 3, 1, (1,) * 3)
    phase_list = tuple(p for _, p in _regions(plan, True) if p is not None)
    split = cuda_phases._split(tf32)
    _, extent, launches = cuda_phases._forward_geometry(plan, phase_list, split)
    return [cuda.correlation_spec((plan.batch, *extent, 64), 32, split, True, grid, counts, dilation, len(members))[0]
            for counts, dilation, grid, members in launches]


def compile_seconds(source: str) -> tuple[float, float]:
    """(NVRTC to PTX, ptxas to SASS) seconds for sm_90a."""
    start = time.perf_counter()
    ptx = compile_to_ptx(source)
    middle = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "kernel.ptx"
        path.write_text(ptx)
        subprocess.run([str(PTXAS), "-arch=sm_90a", str(path), "-o", str(path.with_suffix(".cubin"))], check=True)
    return middle - start, time.perf_counter() - middle


def main():
    torch.manual_seed(0)
    x = torch.rand(16, 32, 16, 32, 32)
    plan = make_plan(tuple(x.shape), (32, 64, 3, 3, 3), (2,) * 3, (1,) * 3, (0,) * 3, 1, (2,) * 3)
    phase_list = tuple(p for _, p in _regions(plan, True) if p is not None)
    rows = []
    for tf32, mode in ((True, "TF32 mode (FP16)"), (False, "TF32 off (3xFP16)")):
        split = cuda_phases._split(tf32)
        for bias in (None, torch.randn(64)):
            layer = "problem 77" + ("" if bias is None else " with a bias")
            kernels = [("old check", *s) for s in old_check_sources(plan, phase_list, split)]
            kernels += [("launched", *s) for s in launched_sources(x, bias, plan, phase_list, tf32)]
            for role, name, source in kernels:
                nvrtc, ptxas = compile_seconds(source)
                rows.append((layer, mode, role, name, f"{nvrtc:.2f}", f"{ptxas:.2f}"))
                print(rows[-1], flush=True)
    print(markdown_table(["layer", "mode", "compiled by", "kernel", "NVRTC s", "ptxas s"], rows))
    rows = []
    for tf32, mode in ((True, "TF32 mode (FP16)"), (False, "TF32 off (3xFP16)")):
        sources = k3s2_sources(tf32)
        start = time.perf_counter()
        alone = [cubin(source) for source in sources]
        middle = time.perf_counter()
        with ThreadPoolExecutor(os.cpu_count()) as pool:
            together = list(pool.map(cubin, sources))
        end = time.perf_counter()
        rows.append((mode, len(sources), f"{middle - start:.2f}", f"{end - middle:.2f}", os.cpu_count(),
                     together == alone))
        print(rows[-1], flush=True)
    print(markdown_table(["k3 s2 layer's forward", "kernels", "one after the other (s)", "in threads (s)", "threads",
                          "the same cubins"], rows))


if __name__ == "__main__":
    main()
