"""Compile the library's CUDA phase correlation (backends/cuda/phase_conv.py, "library") or benchmarks/diag_conv_cuda.py's
CUDA kernels for sm_90 / sm_90a on a machine with no GPU, through a local NVRTC; print ptxas's registers and spills
and the SASS instruction counts (cuobjdump from Triton's package).

Catches what otherwise costs a device call: compile errors, spills, and (eleventh session) the register moves that
two 64-bit fragment loads cost each mma.sync, gone with ldmatrix. NVRTC ships as a wheel (`pip download --no-deps
nvidia-cuda-nvrtc`, unzipped anywhere); point NVRTC_LIB at its libnvrtc.so.*. Its version need not be the GPU
machine's (13.0 there in 2026-11), so take counts as a guide.

    NVRTC_LIB=/path/to/libnvrtc.so.13 PYTHONPATH=src python3 scripts/compile_cuda.py
        {library,library3x,grad_weight,phase_conv,fused_forward} [C_IN C_OUT BH RW]
    (library: the wgmma phase correlation, 3x3x3 taps, RW unused; library3x: the same in 3xTF32; grad_weight: the
    wgmma weight gradient, 3x3x3 taps
    of dilation 2, BH and RW unused)
"""

import collections
import ctypes
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import diag_conv_cuda  # noqa: E402


def compile_cubin(source: str, name: str, arch: str) -> tuple[bytes, str]:
    lib = ctypes.CDLL(os.environ["NVRTC_LIB"])
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"k.cu", 0, None, None):
        sys.exit("nvrtcCreateProgram failed")
    lib.nvrtcAddNameExpression(prog, name.encode())
    options = [f"--gpu-architecture={arch}".encode(), b"-std=c++17", b"--ptxas-options=-v"]
    failed = lib.nvrtcCompileProgram(prog, len(options), (ctypes.c_char_p * len(options))(*options))
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    if failed:
        sys.exit(log.value.decode())
    lib.nvrtcGetCUBINSize(prog, ctypes.byref(size))
    cubin = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetCUBIN(prog, cubin)
    return cubin.raw, log.value.decode()


def sass_counts(cubin: bytes) -> collections.Counter:
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.cubin"
        path.write_bytes(cubin)
        sass = subprocess.run([cuobjdump, "-sass", path], capture_output=True, text=True).stdout
    ops = collections.Counter()
    for line in sass.splitlines():
        match = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_]+)", line)
        if match:
            ops[match.group(2)] += 1
    return ops


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in ("library", "library3x", "grad_weight", "phase_conv", "fused_forward"):
        sys.exit(__doc__)
    kernel = sys.argv[1]
    c_in, c_out, bh, rw = (list(map(int, sys.argv[2:])) + [32, 64, 8, 2][len(sys.argv) - 2:])[:4]
    if kernel in ("library", "library3x"):
        from convt3d.backends.cuda import phase_conv

        source = phase_conv.source(c_in, c_out, min(c_out, 64), (3, 3, 3), (1, 1, 1), bh, has_bias=False,
                                   split=kernel == "library3x")
        kernel = "phase_conv"
    elif kernel == "grad_weight":
        from convt3d.backends.cuda import grad_weight, grad_weight_config

        taps, dilation = (3, 3, 3), (2, 2, 2)
        cob, per_program, _, planes, _ = grad_weight_config(c_in, c_out, taps, dilation)
        source = grad_weight.source(c_in, c_out, cob, taps, dilation, per_program, planes)
        kernel = "phase_grad_weight"
    else:
        source = {"phase_conv": diag_conv_cuda.PHASE_CONV, "fused_forward": diag_conv_cuda.FUSED_FORWARD}[kernel]
        source = source.format(c_in=c_in, c_out=c_out, kd=3, kh=3, kw=3, bh=bh, rows_per_warp=rw, lattice_rows_only=0)
    cubin, log = compile_cubin(source, kernel, "sm_90a" if "wgmma" in source else "sm_90")
    print("\n".join(line for line in log.splitlines() if "registers" in line or "spill" in line or "arning" in line))
    print(sass_counts(cubin).most_common(12))
