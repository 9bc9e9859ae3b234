"""Compile convt3d's forward kernel for sm_90 on a machine with no GPU; print registers, spills, shared memory.

Catches compile errors the interpreter cannot (it runs the kernel as Python) without device time.
    python3 scripts/compile_sm90.py [BLOCK_M BLOCK_CO BLOCK_CI num_warps num_stages precision diag maxnreg]
"""

import subprocess
import sys
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler.compiler import ASTSource

from convt3d.backends.triton.forward import conv_transpose3d_kernel


def main(block_m=128, block_co=64, block_ci=32, warps=4, stages=3, precision=1, diag=0, maxnreg=0):
    block_q = 32
    fn = conv_transpose3d_kernel
    ptr = "*fp32"
    sig = {name: ptr if name.endswith("_ptr") else "i32" for name in fn.arg_names}
    constexprs = dict(S_D=2, S_H=2, S_W=2, P_D=1, P_H=1, P_W=1, DIL_D=2, DIL_H=2, DIL_W=2, STEP_D=1, STEP_H=1,
                      STEP_W=1, HAS_BIAS=False, PRECISION=precision, INTERPRETED=False, BLOCK_R=block_m // block_q,
                      BLOCK_Q=block_q, BLOCK_CO=block_co, BLOCK_CI=block_ci, FILL_W=2 * block_q, EVEN_CI=True, DIAG=diag,
                      sxc=1, syw=1)
    for k, v in constexprs.items():
        sig[k] = "constexpr"
    # As a real launch on problem 77 specialises them: pointers and the channel/stride arguments divisible by 16.
    runtime = ("ITEMS", "U_H_BLOCKS", "U_W_BLOCKS", "CO_BLOCKS", "GROUPS", "KD", "KH", "KW", "D", "H", "W", "OD",
               "OH", "OW")
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names)
             if name not in constexprs and name not in runtime}
    src = ASTSource(fn, sig, constexprs, attrs)
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps, num_stages=stages, **({'maxnreg': maxnreg} if maxnreg else {})))
    bin_dir = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        cubin.write_bytes(kernel.asm["cubin"])
        sass = subprocess.run([bin_dir / "cuobjdump", "-sass", cubin], capture_output=True, text=True).stdout
        usage = subprocess.run([bin_dir / "cuobjdump", "-res-usage", cubin], capture_output=True, text=True).stdout
    mma = {op: sass.count(op) for op in ("HGMMA", "HMMA", "FFMA", "LDGSTS.E.BYPASS.128", "LDG.E.128", "LDL", "STL")}
    print(f"BLOCK_M={block_m} BLOCK_CO={block_co} BLOCK_CI={block_ci} warps={warps} stages={stages} "
          f"precision={precision}: shared={kernel.metadata.shared} B, SASS counts {mma}")
    print(" ".join(line.strip() for line in usage.splitlines() if "REG" in line))
    return kernel


if __name__ == "__main__":
    main(*map(int, sys.argv[1:]))
