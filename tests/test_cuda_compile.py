"""The CUDA kernels (backends/cuda: the phase correlation and the weight gradient) compile for Hopper (sm_90a) without
spilling registers, through NVRTC on the CPU, as torch.cuda._compile_kernel compiles them on the GPU machine.

On a machine without an sm_90 GPU the library never compiles them, and the tests that run them need the GPU; a
mistake in their C++ (or a change that makes ptxas spill the accumulators to local memory, which costs far more
than it saves) would show only there. NVRTC comes from the nvidia-cuda-nvrtc-cu12 wheel (`pip install
nvidia-cuda-nvrtc-cu12`, about 200 MB) or from CUDA 13's (nvidia/cu13, which torch's CUDA 13 builds install); the
tests skip without either. Each kernel is compiled straight to SASS with the options torch's _nvrtc_compile passes
(sm_90a, as cuda._Kernel asks, and torch's NVRTC flags), its ptxas report read from NVRTC's log. The configurations are
the ones config() and grad_weight_config() choose for the layers of test_cuda_phases.py, problem 77 and the sweep's
float32 layers, in TF32, 3xTF32 and 3xFP16 (with 3 x 3 taps a plane, its split in shared memory; with fewer, in
registers), with and without a bias, and the correlation's fewer rows that tile_rows picks on small grids (without a
bias). By default (conftest.run_in_sample) each channel pair and dilation compiles with its most taps, the largest
unrolled kernel of its kind, with and without a plane split in shared memory (PRESPLIT_TAPS), at the rows config()
chooses; CONVT3D_FULL_TESTS=1 compiles every tap count and the fewer rows too.
"""

import ctypes
import glob
import importlib
import math
import os
import re
from pathlib import Path

import pytest
import torch

from convt3d.backends import cuda
from convt3d.backends.cuda import grad_weight, phase_conv, row_runs
from convt3d.backends.cuda.phases import _taps
from convt3d.plan import make_plan, triple
from conftest import FULL_TESTS, run_in_sample
from test_cuda_phases import LAYERS, P77_INPUT, P77_REGION


def _nvrtc():
    """libnvrtc from the CUDA 12 wheel (nvidia.cuda_nvrtc) or CUDA 13's (nvidia.cu13), the one of torch's CUDA major
    first, with its builtins library loaded beforehand (NVRTC 13 does not find it beside itself)."""
    places = [("nvidia.cuda_nvrtc", "12"), ("nvidia.cu13", "13")]
    places.sort(key=lambda place: place[1] != str(torch.version.cuda).split(".")[0])
    for module, _ in places:
        try:
            package = importlib.import_module(module)
        except ImportError:
            continue
        folder = os.path.join(list(package.__path__)[0], "lib")
        libraries = sorted(glob.glob(os.path.join(folder, "libnvrtc.so*")))
        if libraries:
            for builtins in sorted(glob.glob(os.path.join(folder, "libnvrtc-builtins.so*"))):
                ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)
            return ctypes.CDLL(libraries[0])
    return None


def _ptxas():
    try:
        import triton
    except ImportError:
        return None
    path = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    return path if path.is_file() else None


NVRTC, PTXAS = _nvrtc(), _ptxas()
pytestmark = pytest.mark.skipif(NVRTC is None, reason="needs NVRTC (pip install nvidia-cuda-nvrtc-cu12)")


def _torch_options() -> list:
    """What torch's _nvrtc_compile adds to the architecture: its NVCC flags that NVRTC takes (no half operators or
    conversions, as for PyTorch's own CUDA code)."""
    flags = getattr(torch.cuda._utils, "_get_gpu_rtc_compatible_flags", None)
    if flags is not None:
        return list(flags())
    from torch.utils.cpp_extension import COMMON_NVCC_FLAGS

    return [flag for flag in COMMON_NVCC_FLAGS if flag != "--expt-relaxed-constexpr"]


def ptxas_report(source: str) -> str:
    """NVRTC's log of the source compiled straight to SASS for sm_90a with torch's options and ptxas's -v."""
    program = ctypes.c_void_p()
    assert NVRTC.nvrtcCreateProgram(ctypes.byref(program), source.encode(), b"kernel.cu", 0, None, None) == 0
    options = [b"--gpu-architecture=sm_90a", b"--ptxas-options=-v", *(flag.encode() for flag in _torch_options())]
    status = NVRTC.nvrtcCompileProgram(program, len(options), (ctypes.c_char_p * len(options))(*options))
    size = ctypes.c_size_t()
    NVRTC.nvrtcGetProgramLogSize(program, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    NVRTC.nvrtcGetProgramLog(program, log)
    NVRTC.nvrtcDestroyProgram(ctypes.byref(program))
    assert status == 0, f"NVRTC failed:\n{log.value.decode()}"
    return log.value.decode()


def compile_to_ptx(source: str) -> str:
    """NVRTC's PTX for compute_90a (benchmarks/cpu_first_call_compiles.py times it and Triton's ptxas apart)."""
    program = ctypes.c_void_p()
    assert NVRTC.nvrtcCreateProgram(ctypes.byref(program), source.encode(), b"kernel.cu", 0, None, None) == 0
    options = [b"--gpu-architecture=compute_90a", b"--std=c++17"]
    status = NVRTC.nvrtcCompileProgram(program, len(options), (ctypes.c_char_p * len(options))(*options))
    size = ctypes.c_size_t()
    NVRTC.nvrtcGetProgramLogSize(program, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    NVRTC.nvrtcGetProgramLog(program, log)
    assert status == 0, f"NVRTC failed:\n{log.value.decode()}"
    NVRTC.nvrtcGetPTXSize(program, ctypes.byref(size))
    ptx = ctypes.create_string_buffer(size.value)
    NVRTC.nvrtcGetPTX(program, ptx)
    NVRTC.nvrtcDestroyProgram(ctypes.byref(program))
    return ptx.value.decode()


def registers_and_spills(source: str) -> tuple[int, int]:
    """(registers per thread, bytes spilled) as ptxas -v reports them for sm_90a."""
    report = ptxas_report(source)
    registers = int(re.search(r"Used (\d+) registers", report).group(1))
    spilled = sum(int(v) for v in re.findall(r"(\d+) bytes spill (?:stores|loads)", report))
    return registers, spilled


def _correlations():
    """(c_in, c_out, taps, dilation) of every forward phase correlation and grad_input the CUDA kernel serves on the
    layers, and (c_in, c_out, taps, dilation) of their weight gradients."""
    layers = LAYERS + [
        (32, 64, 3, 2, 1, 2, 0, (16, 32, 32)),  # problem 77
        (64, 64, 3, 1, 1, 1, 0, (16, 32, 32)),  # the sweep's k3s1p1
        (64, 32, 3, 2, 1, 1, 1, (8, 64, 64)),  # video_k3s2p1op1
    ]
    forward, weight = set(), set()
    for c_in, c_out, kernel, stride, padding, dilation, output_padding, spatial in layers:
        plan = make_plan((1, c_in, *spatial), (c_in, c_out, *triple(kernel, "kernel")), triple(stride, "stride"),
                         triple(padding, "padding"), triple(output_padding, "output_padding"), 1,
                         triple(dilation, "dilation"))
        for phase in plan.nonempty_phases:
            counts = _taps(phase.axes, ascending=False)[0]
            dil = tuple(p.input_dilation for p in phase.axes)
            for a, b in ((c_in, c_out), (c_out, c_in)):  # the forward, grad_input
                if cuda.phase_conv_channels_unsupported(a, b) is None:
                    forward.add((a, b, counts, dil))
            if cuda.grad_weight_channels_unsupported(c_in, c_out) is None:
                weight.add((c_in, c_out, counts, dil))
    return sorted(forward), sorted(weight)


def _sample_key(c_in, c_out, taps, dilation):
    # Under 3xFP16 and FP16, planes of PRESPLIT_TAPS taps or more are split in shared memory, fewer in registers.
    return c_in, c_out, dilation, taps[1] * taps[2] >= phase_conv.PRESPLIT_TAPS


def _most_taps(correlations):
    """The taps with the largest product for each _sample_key: the default sample."""
    most = {}
    for case in correlations:
        if math.prod(case[2]) > math.prod(most.get(_sample_key(*case), (0,))):
            most[_sample_key(*case)] = case[2]
    return most


FORWARD, WEIGHT = _correlations()
MOST_TAPS = _most_taps(FORWARD)


@pytest.mark.parametrize("c_in, c_out, taps, dilation", FORWARD)
@pytest.mark.parametrize("split", [0, 1, 2, 3], ids=["tf32", "3xtf32", "3xfp16", "fp16"])
def test_phase_correlation_compiles_without_spills(c_in, c_out, taps, dilation, split):
    run_in_sample(taps == MOST_TAPS[_sample_key(c_in, c_out, taps, dilation)])
    chosen = cuda.config(c_in, c_out, taps, dilation, split)
    if chosen is None:
        pytest.skip("the window plane does not fit in shared memory: the kernel does not serve it")
    rows, cob, _, unit = chosen
    for has_bias in (False, True):
        source = phase_conv.source(c_in, c_out, cob, taps, dilation, rows, has_bias, split, unit)
        registers, spilled = registers_and_spills(source)
        assert spilled == 0, (registers, spilled)
    while rows > 2 and FULL_TESTS:  # the fewer rows of tile_rows on small grids (smaller accumulators)
        rows //= 2
        registers, spilled = registers_and_spills(
            phase_conv.source(c_in, c_out, cob, taps, dilation, rows, False, split, unit))
        assert spilled == 0, (rows, registers, spilled)


ROW_RUNS = [case for case in FORWARD if case[0] == 32 and case[1] % 64 == 0]


@pytest.mark.parametrize("c_in, c_out, taps, dilation", ROW_RUNS)
@pytest.mark.parametrize("split", [2, 3], ids=["3xfp16", "fp16"])
@pytest.mark.parametrize("input_geometry", [None, P77_INPUT], ids=["window", "input"])
@pytest.mark.parametrize("region", [None, P77_REGION], ids=["lattice", "region_fill"])
def test_row_runs_correlation_compiles_without_spills(c_in, c_out, taps, dilation, split, input_geometry, region):
    """row_runs.py's kernel on the correlations it serves (32 input channels, blocks of 64 output channels), reading
    the window or the input itself, writing the lattice alone or filling the rest of the output too (REGION_FILL; up
    to N = 136 by a second warpgroup, in 3xFP16 where it reads the window, FILL_WARPGROUP: two programs of 256
    threads a multiprocessor), at its narrowest window (32 columns and the taps' reach) and its widest (the most its N
    allows), with and without a bias: no spills, and registers that leave room for its programs per multiprocessor.
    By default (run_in_sample) the most taps of each channel pair and dilation."""
    run_in_sample(taps == max((case[2] for case in ROW_RUNS if case[:2] == (c_in, c_out) and case[3] == dilation),
                              key=math.prod))
    reach = (taps[2] - 1) * dilation[2]
    widest = max(w for w in range(32, 129) if row_runs.positions(w) <= row_runs.MAX_POSITIONS[split])
    for columns, has_bias in ((32 + reach, False), (widest, True)):
        too_wide = columns < 32 + reach or row_runs.positions(columns) > row_runs.MAX_POSITIONS[split]
        if too_wide or row_runs.shared_bytes(taps, dilation, columns, split) > cuda.MAX_SHARED_BYTES // 2 - 1024:
            continue  # (cuda._row_runs_kernel leaves these to phase_conv.py's kernel)
        source = row_runs.source(c_out, taps, dilation, columns, has_bias, split, input_geometry, region)
        registers, spilled = registers_and_spills(source)
        assert spilled == 0, (columns, registers, spilled)
        threads = row_runs.block_threads(split, columns, region, input_geometry)
        programs = row_runs.programs_per_multiprocessor(split, columns, region, input_geometry)
        assert registers * threads * programs <= 65536, registers


@pytest.mark.parametrize("c_in, c_out, taps, dilation", WEIGHT)
def test_weight_gradient_compiles_without_spills(c_in, c_out, taps, dilation):
    chosen = cuda.grad_weight_config(c_in, c_out, taps, dilation)
    if chosen is None:
        pytest.skip("the input's row rings do not fit in shared memory: the kernel does not serve it")
    cob, per_program, _, planes, _ = chosen
    source = grad_weight.source(c_in, c_out, cob, taps, dilation, per_program, planes)
    registers, spilled = registers_and_spills(source)
    assert spilled == 0, (registers, spilled)
