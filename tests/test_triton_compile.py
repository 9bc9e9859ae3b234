"""Every Triton kernel compiles for Hopper (sm_90) in every precision, through Triton's compiler on the CPU.

The interpreter runs a kernel's Python, not the compiler, and the compiler rejects some code that the interpreter
runs: a return inside a constexpr branch followed by TF32 rounding compiled for float16 operands (twenty-first
session, caught only on the GPU). So the library's own host code runs here on CPU tensors with every launch recorded
instead of made (launch.BoundLaunch, through which every kernel is launched, and turned.TurnedLaunch), and each
recorded launch is compiled with its constexprs and launch options, the main kernels as Hopper launches them (the
operand pass's dependents): the forward (the general and tap_columns kernels in each precision, the turned kernel on
its TMA descriptors, the tiled GEMM in each of its forms, their operand passes), the backward's operand copy and weight
gradient, the bias fill and the CUDA phase correlation's operand pass; and for each, the driver's launch
(launch._driver_launch, turned._DriverLaunch) matches the compiled kernel's parameters.
The compile runs in a subprocess without TRITON_INTERPRET, under which triton.jit would have made the kernels
interpreted functions.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import skip_without_usable_triton

skip_without_usable_triton()
import triton  # noqa: E402

SCRIPT = r"""
import sys
import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from convt3d.backends import torch_phase
import convt3d.backends.triton as triton_backend
from convt3d.backends.triton import backward, fill, forward, launch, tap_columns, tensor_scaled, tiled, turned, window
from convt3d.plan import make_plan

recorded = {}
turned_launches = {}


def record(bound, pointers):
    # One compile per kernel, options and pointer dtypes: what the outputs hold does not matter here.
    name = bound.kernel.fn.__module__.rsplit(".", 1)[-1] + "." + bound.kernel.__name__
    dtypes = tuple(t.dtype for t in pointers)
    recorded.setdefault((name, tuple(sorted(bound.options.items())), dtypes), (bound, dtypes))


launch.BoundLaunch.__call__ = record
turned.TurnedLaunch.__call__ = lambda bound, pointers: turned_launches.setdefault(
    (tuple(sorted(bound.options.items())), tuple(t.dtype for t in pointers)), (bound, tuple(t.dtype for t in pointers)))
# As on Hopper: the main kernels launched as their operand pass's dependents, the passes letting them start early.
triton_backend._can_launch_dependents = lambda device_index: True
forward.pass_lets_main_start = tiled.pass_lets_main_start = lambda device: True
tap_columns._sm_count = lambda device_index: 132  # an H200's multiprocessors (tap_columns' plane order)
TYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.int32: "i32"}
torch.manual_seed(0)

# The forward: stride 2 with KW = 3 (tap_columns' split column groups), both kernels; the tiled GEMM on k2 s2.
for dtype, precision in [(torch.float16, forward.NATIVE), (torch.bfloat16, forward.NATIVE),
                         (torch.float32, forward.TF32), (torch.float32, forward.TF32X3)]:
    x, w = torch.rand(1, 64, 4, 8, 8, dtype=dtype), torch.rand(64, 32, 3, 3, 3, dtype=dtype)
    b = torch.rand(32, dtype=dtype)
    plan = make_plan(tuple(x.shape), tuple(w.shape), stride=2, padding=1, output_padding=1)
    for config in (forward._configs()[0], tap_columns.configs(plan)[-1], turned.configs()[-1]):
        turned_config = config.get("KERNEL") == "turned"
        if turned_config and dtype == torch.bfloat16 or turned_config and precision == forward.TF32X3:
            continue  # (FP16 operands only: float16's, and TF32 mode's scaled per tensor)
        forward.conv_transpose3d_triton(x, w, b, plan, precision, config=config)
        if precision == forward.TF32 and not turned_config:  # TF32 mode's other form (FP16_TENSOR_SCALED by default)
            tensor_scaled.TF32_AS_FP16 = not tensor_scaled.TF32_AS_FP16
            forward.conv_transpose3d_triton(x, w, b, plan, precision, config=config)
            tensor_scaled.TF32_AS_FP16 = not tensor_scaled.TF32_AS_FP16
    if precision == forward.TF32:  # a layer whose tiles tensor_scaled's pass holds in registers (one here)
        x1, w1 = torch.rand(1, 16, 2, 8, 8), torch.rand(16, 8, 3, 3, 3)
        forward.conv_transpose3d_triton(x1, w1, None, make_plan(tuple(x1.shape), tuple(w1.shape), stride=2),
                                        precision, config=forward._configs()[0])
    w2 = torch.rand(64, 32, 2, 2, 2, dtype=dtype)
    plan2 = make_plan(tuple(x.shape), tuple(w2.shape), stride=2)
    tiled.conv_transpose3d_tiled(x, w2, b, plan2, precision, config=tiled.configs()[0])
    if precision == forward.TF32:  # TF32 mode's other form (FP16_SCALED by default), in a 64-channel config too
        tiled.TF32_AS_FP16 = not tiled.TF32_AS_FP16
        tiled.conv_transpose3d_tiled(x, w2, b, plan2, precision, config=tiled.configs()[0])
        tiled.TF32_AS_FP16 = not tiled.TF32_AS_FP16
        tiled.conv_transpose3d_tiled(x, w2, b, plan2, precision, config=tiled.configs(2)[-1])

# The backward by phases (problem 77's shape in miniature), in each precision mode.
x, w = torch.rand(1, 16, 4, 6, 6), torch.rand(16, 32, 3, 3, 3)
plan = make_plan(tuple(x.shape), tuple(w.shape), stride=2, padding=1, dilation=2)
grad = torch.rand(plan.output_shape)
for dtype, tf32 in [(torch.float32, True), (torch.float32, False), (torch.float16, True), (torch.bfloat16, True)]:
    with torch.backends.cudnn.flags(allow_tf32=tf32):
        torch_phase.conv_transpose3d_backward(grad.to(dtype), x.to(dtype), w.to(dtype), plan,
                                              phase_backward=backward.phase_backward)

fill.fill_channels(torch.empty(1, 4, 8, 16, 16), torch.rand(4))
for split in (0, 1, 2):  # (3xFP16 in grad_input's orientation: its weight halves need 32 input channels)
    window.correlation_operands(x, 0, x.shape, x.stride(), (-1, -1, -1), (6, 8, 8), w, split == 2, split=split)
x32, w32 = torch.rand(1, 32, 4, 6, 6), torch.rand(32, 64, 3, 3, 3)  # (for row_runs.py's input-reading kernel)
window.correlation_operands(x32, 0, x32.shape, x32.stride(), (-1, -1, -1), (6, 8, 8), w32, False, split=2,
                            window=False)

failed = []
for (name, _, _), (bound, dtypes) in recorded.items():
    options = {k: bound.options[k] for k in ("num_warps", "num_stages", "launch_pdl", "launch_cooperative_grid")
               if k in bound.options}
    constexprs = {k: v for k, v in bound.options.items() if k not in options}
    names = bound.kernel.arg_names
    scalars = dict(zip(names[bound.pointers:], bound.scalars))
    signature = {}
    for i, arg in enumerate(names):
        if arg in constexprs:
            signature[arg] = "constexpr"
        elif i < bound.pointers:
            signature[arg] = "*" + TYPES[dtypes[i]]
        else:
            signature[arg] = "i32" if -2**31 <= scalars[arg] < 2**31 else "i64"
    label = f"{name} {dict(constexprs)} {[TYPES[d] for d in dtypes]}"
    try:
        compiled = triton.compile(ASTSource(bound.kernel, signature, constexprs), target=GPUTarget("cuda", 90, 32),
                                  options=options)
        # The driver's launch (launch._driver_launch) agrees with the compiled kernel's parameters: the arguments
        # its signature keeps, then its scratch pointers (function 0: nothing is launched here).
        view = type("Compiled", (), dict(metadata=compiled.metadata, src=compiled.src, asm=compiled.asm, function=0))
        if launch._driver_launch(view(), (1, 1, 1), bound.pointers, bound.scalars) is None:
            raise RuntimeError("launch._driver_launch does not match the compiled kernel's parameters")
        print("compiled", name)
    except Exception as error:
        failed.append(label)
        print("FAILED", label, type(error).__name__, str(error)[-2000:])
# turned.py's kernel takes TMA descriptors: they compile as tensordesc arguments, and its launch by the driver
# (turned._DriverLaunch) must pack the parameters as the compiled kernel lists them.
for options, dtypes in turned_launches:
    bound = turned_launches[(options, dtypes)][0]
    options = dict(options)
    launch_options = {k: options.pop(k) for k in ("num_warps", "num_stages", "launch_pdl") if k in options}
    names = turned.turned_kernel.arg_names
    boxes = {"x_desc": bound.x_box, "w_desc": bound.w_box}
    signature = {}
    for i, arg in enumerate(names):
        if arg in options:
            signature[arg] = "constexpr"
        elif arg in boxes:
            signature[arg] = f"tensordesc<fp16[{', '.join(map(str, boxes[arg]))}]>"
        elif arg.endswith("_ptr"):
            signature[arg] = "*" + TYPES[dtypes[i]]
        else:
            value = bound.scalars[i - 5]
            signature[arg] = "constexpr" if value == 1 else "i32"
    constexprs = dict(options, **{arg: 1 for arg, kind in signature.items() if kind == "constexpr" and arg not in options})
    label = f"turned.turned_kernel {options} {[TYPES[d] for d in dtypes]}"
    try:
        compiled = triton.compile(ASTSource(turned.turned_kernel, signature, constexprs),
                                  target=GPUTarget("cuda", 90, 32), options=launch_options)
        view = type("Compiled", (), dict(metadata=compiled.metadata, src=compiled.src, asm=compiled.asm, function=0))
        if turned._DriverLaunch.of(view(), bound.grid, bound.scalars, dtypes[0], bound) is None:
            raise RuntimeError("turned._DriverLaunch does not match the compiled kernel's parameters")
        print("compiled turned.turned_kernel")
    except Exception as error:
        failed.append(label)
        print("FAILED", label, type(error).__name__, str(error)[-2000:])
sys.exit(1 if failed else 0)
"""

# Each kernel, at least this many distinct launches (options, dtypes) among those the script makes.
EXPECTED = {
    "forward.prepare_operands_kernel": 4,  # float16, bfloat16, TF32, 3xTF32
    "tensor_scaled.fp16_operands_kernel": 2,  # TF32 mode's FP16_TENSOR_SCALED: held, read again
    "forward.conv_transpose3d_kernel": 5,  # float16, bfloat16, TF32 (FP16 scaled per tensor, and TF32), 3xTF32
    "tap_columns.tap_columns_kernel": 5,
    "turned.turned_kernel": 2,  # float16, TF32 mode's FP16 scaled per tensor
    "tiled.tiled_kernel": 6,
    "tiled.prepare_operands_kernel": 2,  # TF32, 3xTF32: half precision reads its operands as given
    "tiled.prepare_scaled_operands_kernel": 1,  # TF32 mode's FP16_SCALED
    "backward.copy_operands_kernel": 4,
    "backward.phase_grad_weight_kernel": 4,
    "fill._fill_channels_kernel": 1,
    "window.correlation_operands_kernel": 4,  # TF32, 3xTF32, 3xFP16 with and without the window
}


def test_every_kernel_compiles_for_hopper():
    if "nvidia" not in triton.backends.backends:
        pytest.skip("this Triton has no NVIDIA backend")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    src = str(Path(__file__).resolve().parents[1] / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    run = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    compiled = [line.split()[1] for line in run.stdout.splitlines() if line.startswith("compiled ")]
    counts = {name: compiled.count(name) for name in EXPECTED}
    assert all(counts[name] >= n for name, n in EXPECTED.items()), (counts, run.stdout[-3000:])
