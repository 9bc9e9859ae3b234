"""Compile one of convt3d's kernels for sm_90 on a machine with no GPU; print registers, spills, shared memory,
SASS instruction counts, and (--layouts) how each global-to-shared copy is laid out.

Catches compile errors the interpreter cannot (it runs the kernel as Python) and shows what costs device time
to find otherwise: on the H200 the first grad_weight kernel ran 5x slower than it should, and its TTGIR showed
why (an operand tile staged in shared memory column by column, with bank conflicts).

The GPU machine runs Triton 3.6: to see its build, run this with triton==3.6.0 (for example from a venv made
with --system-site-packages and `pip install triton==3.6.0`); builds differ (sixth session: 167 registers under
3.6 against 255 and a spill under 3.9 for the same grad_weight config).

    python3 scripts/compile_sm90.py forward [BLOCK_M BLOCK_CO BLOCK_CI num_warps num_stages precision diag maxnreg]
    python3 scripts/compile_sm90.py grad_weight [BLOCK_CO BLOCK_N warps stages precision copies lattice_cl BLOCK_P
                                                 g_rounded] [--layouts]
    python3 scripts/compile_sm90.py window [channels BLOCK_P split]
    python3 scripts/compile_sm90.py tap_columns [layer diag] [--layouts]
    python3 scripts/compile_sm90.py tiled [layer precision config]   (precision 3: FP16_SCALED; config: an index
                                                                       into tiled.configs(operand bytes))
"""

import re
import subprocess
import sys
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler.compiler import ASTSource

from convt3d.backends.triton import cdiv, tap_columns as tap_columns_module
from convt3d.backends.triton.backward import phase_grad_weight_kernel
from convt3d.backends.triton.forward import conv_transpose3d_kernel
from convt3d.backends.triton.window import correlation_operands_kernel

# Problem 77, specialised as a real launch specialises it: the pointers and the arguments divisible by 16 marked
# so, the strides equal to 1 made constants.
FORWARD_RUNTIME = ("ITEMS", "U_H_BLOCKS", "U_W_BLOCKS", "CO_BLOCKS", "GROUPS", "KD", "KH", "KW", "D", "H", "W",
                   "OD", "OH", "OW")
GRAD_WEIGHT_DIVISIBLE = ("sgn", "sgc", "sgd", "sgh", "sxn", "sxc", "sxd", "sxh", "CO_G", "CI_G", "N_TOTAL", "QD",
                         "QH", "QW")


def forward(block_m=128, block_co=64, block_ci=32, warps=4, stages=3, precision=1, diag=0, maxnreg=0):
    block_q = 32
    constexprs = dict(S_D=2, S_H=2, S_W=2, P_D=1, P_H=1, P_W=1, DIL_D=2, DIL_H=2, DIL_W=2, STEP_D=1, STEP_H=1,
                      STEP_W=1, HAS_BIAS=False, PRECISION=precision, INTERPRETED=False, BLOCK_R=block_m // block_q,
                      BLOCK_Q=block_q, BLOCK_CO=block_co, BLOCK_CI=block_ci, FILL_W=2 * block_q,
                      CI_BLOCKS=cdiv(32, block_ci), EVEN_CI=32 % block_ci == 0, SCALED=False, DIAG=diag, sxc=1, syw=1,
                      PDL=True)  # launched as the operand pass's dependent, as on the H200
    divisible = [n for n in conv_transpose3d_kernel.arg_names if n not in constexprs and n not in FORWARD_RUNTIME]
    options = dict(num_warps=warps, num_stages=stages, launch_pdl=True, **({"maxnreg": maxnreg} if maxnreg else {}))
    return _compile(conv_transpose3d_kernel, constexprs, divisible, options)


def grad_weight(block_co=64, block_n=256, warps=8, stages=3, precision=1, copy_per_w_tap=0, lattice_cl=0, block_p=32,
                g_rounded=0):
    # In the window the w taps lie 1 element apart (a constant, as a launch specialises 1); with a copy per w tap,
    # a multiple of 16 elements apart. The lattice NCDHW (qw contiguous) or channels-last (co contiguous).
    constexprs = dict(PRECISION=precision, INTERPRETED=False, BLOCK_CO=block_co, BLOCK_P=block_p, BLOCK_N=block_n,
                      sxw=1, X_ROUNDED=bool(copy_per_w_tap) and precision == 1, G_ROUNDED=bool(g_rounded),
                      **({} if copy_per_w_tap else dict(sxk=1)), **(dict(sgc=1) if lattice_cl else dict(sgw=1)))
    divisible = [n for n in phase_grad_weight_kernel.arg_names if n not in constexprs and (
        n.endswith("_ptr") or n in GRAD_WEIGHT_DIVISIBLE or n == "sxk" or (lattice_cl and n == "sgw"))]
    return _compile(phase_grad_weight_kernel, constexprs, divisible, dict(num_warps=warps, num_stages=stages))


def window(channels=32, block_p=64, split=0):
    """The CUDA phase correlation's operand pass, reading an NCDHW source (its w stride 1), for split 0 (TF32), 1
    (3xTF32) or 2 (3xFP16 and FP16: the weight's halves)."""
    constexprs = dict(C=channels, BLOCK_C=channels, BLOCK_P=block_p, BLOCK_T=1024, SW=1, SPLIT=split,
                      BLOCK_I=channels, BLOCK_TAPS=2048 // channels)
    divisible = [n for n in correlation_operands_kernel.arg_names if n.endswith("_ptr")]
    return _compile(correlation_operands_kernel, constexprs, divisible, dict(num_warps=4),
                    ("taps_ptr",) if split == 2 else ())


def tap_columns(layer="video_k3s2p1op1", diag=0):
    """A sweep layer's tap_columns kernel (64 x 128 x 32, 4 warps, 3 stages; TF32; float32 pointers), specialised as
    its launch is: runtime arguments equal to 1 constants, those divisible by 16 marked so."""
    from convt3d.bench.workloads import sweep_layers

    plan = sweep_layers(layer)[0].plan()
    cfg = dict(KERNEL="tap_columns", BLOCK_M=64, BLOCK_N=128, BLOCK_CI=32, num_warps=4, num_stages=3, DIAG=int(diag))
    # Launched as the operand pass's dependent, as on the H200 (here no GPU to ask).
    tap_columns_module.dependent_options = lambda device_index: (("PDL", True), ("launch_pdl", True))
    bound = tap_columns_module.bind(cfg, plan, 1, True, _contiguous_output_strides(plan), 0)
    return _compile_bound(tap_columns_module.tap_columns_kernel, bound, cfg)


def tiled(layer="unet3d_k2s2", precision=3, config=-2):
    """A sweep layer's tiled GEMM (TF32 mode's FP16_SCALED by default, in its 128 x 128 x 64 config) as its launch
    after the operand pass is specialised; float32 bias and output, the operands FP16 under FP16_SCALED."""
    from convt3d.backends.triton import tiled as tiled_module
    from convt3d.bench.workloads import sweep_layers

    plan = sweep_layers(layer)[0].plan()
    precision, config = int(precision), int(config)
    scaled = precision == tiled_module.FP16_SCALED
    cfg = tiled_module.configs(2 if scaled else 4)[config]
    print(cfg)
    tiled_module.dependent_options = lambda device_index: (("PDL", True), ("launch_pdl", True))
    bound = tiled_module._main_launch(cfg, plan, precision, True, None, _contiguous_output_strides(plan), 0)
    return _compile_bound(tiled_module.tiled_kernel, bound, cfg,
                          ("x_ptr", "x_lo_ptr", "w_ptr", "w_lo_ptr") if scaled else ())


def _contiguous_output_strides(plan):
    od, oh, ow = plan.output_spatial
    return plan.out_channels * od * oh * ow, od * oh * ow, oh * ow, ow, 1


def _compile_bound(fn, bound, cfg, half_pointers=()):
    """A bound launch's kernel (launch.BoundLaunch) specialised as its launch is: runtime arguments equal to 1
    constants, those divisible by 16 marked so."""
    scalars = dict(zip(fn.arg_names[bound.pointers:], bound.scalars))
    constexprs = {name: value for name, value in bound.options.items() if name in fn.arg_names}
    constexprs.update({name: value for name, value in scalars.items() if value == 1})
    divisible = [name for name in fn.arg_names if name.endswith("_ptr") or (
        name in scalars and name not in constexprs and scalars[name] % 16 == 0)]
    return _compile(fn, constexprs, divisible, dict(num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
                                                    launch_pdl=True), half_pointers)


def _compile(fn, constexprs, divisible, options, half_pointers=()):
    sig = {name: "*fp32" if name.endswith("_ptr") else "i32" for name in fn.arg_names}
    sig.update({name: "*fp16" for name in half_pointers})
    sig.update({name: "constexpr" for name in constexprs})
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names) if name in divisible}
    return triton.compile(ASTSource(fn, sig, constexprs, attrs), target=GPUTarget("cuda", 90, 32), options=options)


def report(kernel, layouts=False):
    bin_dir = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        cubin.write_bytes(kernel.asm["cubin"])
        sass = subprocess.run([bin_dir / "cuobjdump", "-sass", cubin], capture_output=True, text=True).stdout
        usage = subprocess.run([bin_dir / "cuobjdump", "-res-usage", cubin], capture_output=True, text=True).stdout
    counts = {op: sass.count(op) for op in ("HGMMA", "HMMA", "FFMA", "LDGSTS", "LDG.E.128", "STG.E.128", "LDL", "STL",
                                            "STG.E ", "LDG.E ")}
    counts["instructions"] = sum(1 for line in sass.splitlines() if line.strip().startswith("/*") and "*/" in line
                                 and ";" in line)
    print(f"shared={kernel.metadata.shared} B, SASS counts {counts}")
    print(" ".join(line.strip() for line in usage.splitlines() if "REG" in line))
    # A pipelined loop's copies appear in its prologue too, and its waits leave copies in flight (num > 0).
    ir_text = kernel.asm["ttgir"]
    waits = re.findall(r"async_wait[^{]*[{]num = (\d+)", ir_text)
    print(f"TTGIR: {ir_text.count('async_copy_global_to_local')} asynchronous copies, waits leaving {waits} in flight")
    if layouts:
        ir = kernel.asm["ttgir"].splitlines()
        print("\n".join(line for line in ir if line.startswith(("#blocked", "#shared", "#mma"))))
        print("\n".join(line.strip()[:220] for line in ir if "async_copy_global_to_local" in line))


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--layouts"]
    kernels = {"forward": forward, "grad_weight": grad_weight, "window": window, "tap_columns": tap_columns,
               "tiled": tiled}
    if not args or args[0] not in kernels:
        sys.exit(__doc__)
    values = args[1:] if args[0] in ("tap_columns", "tiled") else map(int, args[1:])
    report(kernels[args[0]](*values), layouts="--layouts" in sys.argv)
