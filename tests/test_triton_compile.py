"""The forward's Triton kernels compile for Hopper (sm_90) in every precision, through Triton's compiler on the CPU.

The interpreter runs a kernel's Python, not the compiler, and the compiler rejects some code that the interpreter
runs: a return inside a constexpr branch followed by TF32 rounding compiled for float16 operands (twenty-first
session, caught only on the GPU). The compile runs in a subprocess without TRITON_INTERPRET, under which triton.jit
would have made the kernels interpreted functions.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")

# Each bound launch of a sweep-like layer (stride 2, KW = 3: tap_columns' split column groups), compiled with the
# launch's constexprs and options; pointers typed by the layer's dtype, every other argument a 32-bit int.
SCRIPT = r"""
import sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from convt3d.backends.triton import forward, tap_columns, tiled
from convt3d.plan import make_plan

LAUNCH_OPTIONS = ("num_warps", "num_stages")
plan = make_plan((1, 64, 4, 8, 8), (64, 32, 3, 3, 3), stride=2, padding=1, output_padding=1)
k2s2 = make_plan((1, 64, 4, 8, 8), (64, 32, 2, 2, 2), stride=2)
out_strides = (1, 2, 3, 4, 5)
failed = []
for precision, dtype in [(forward.NATIVE, "fp16"), (forward.NATIVE, "bf16"), (forward.TF32, "fp32"),
                         (forward.TF32X3, "fp32")]:
    launches = [forward._operand_pass((1, 64, 4, 8, 8), (64, 32, 3, 3, 3), 1, (2048, 32, 1), precision)]
    launches += [forward._main_launch(cfg, plan, precision, True, out_strides, 0)
                 for cfg in (forward._configs()[0], tap_columns.configs(plan)[-1])]
    launches.append(tiled._main_launch(tiled.configs()[0], k2s2, precision, True, None, out_strides))
    if dtype == "fp32":
        launches.append(tiled._operand_pass((1, 64, 4, 8, 8), (64, 32, 2, 2, 2), (2048, 32, 1), precision))
    for bound in launches:
        constexprs = {k: v for k, v in bound.options.items() if k not in LAUNCH_OPTIONS}
        names = bound.kernel.arg_names
        signature = {name: "constexpr" if name in constexprs else "*" + dtype if name.endswith("_ptr") else "i32"
                     for name in names}
        label = f"{bound.kernel.__name__} precision {precision} {dtype}"
        try:
            triton.compile(ASTSource(bound.kernel, signature, constexprs), target=GPUTarget("cuda", 90, 32),
                           options={k: bound.options[k] for k in LAUNCH_OPTIONS if k in bound.options})
            print("compiled", label)
        except Exception as error:
            failed.append(label)
            print("FAILED", label, type(error).__name__, str(error)[-2000:])
sys.exit(1 if failed else 0)
"""


def test_forward_kernels_compile_for_hopper():
    if "nvidia" not in triton.backends.backends:
        pytest.skip("this Triton has no NVIDIA backend")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    src = str(Path(__file__).resolve().parents[1] / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    run = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    assert run.stdout.count("compiled") == 18
