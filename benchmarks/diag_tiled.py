"""The tiled GEMM (backends/triton/tiled.py) on the sweep's k2 s2 layers (GPU): each tile config, the autotuned
kernel (with its operand pass for float32), the operand pass alone and eager, in both precision modes, and in TF32
mode in both of its forms (operands as FP16 scaled per row, tiled.FP16_SCALED, and TF32 itself). (Sixteenth
session's runs of its earlier forms also read the operands as given, rounding them in registers: commit f7e1679.)

    PYTHONPATH=src python3 benchmarks/diag_tiled.py [--iters 50] [--layers unet3d_k2s2,...]
        [--forms scaled,tf32,off] [--extra-configs 128x256x64s0w8n3,...]

--forms: which of TF32 mode's two forms (scaled: FP16 scaled, tf32) and TF32 off to run (float32 layers; half
precision runs once). --extra-configs: tile configs beside the library's, each BLOCK_MxBLOCK_NxBLOCK_K, s SWAP,
w warps, n stages.

Rows: bench.protocol.time_cuda's mean and minimum in ms (L2 flushed before each call). Each variant's output is
NaN-poisoned before its first call, then checked: KernelBench's check against eager in the same mode and the
relative error against float64.
"""

import argparse
import json
import pathlib
import re

import torch
import torch.nn.functional as F

import convt3d
import convt3d.backends.triton as triton_backend
from convt3d.backends.triton import tiled
from convt3d.backends.triton.forward import precision_for
from convt3d.bench.protocol import kernelbench_check, nan_poisoned_allocations, relative_error, time_cuda
from convt3d.bench.report import markdown_table
from convt3d.plan import make_plan

SWEEP = pathlib.Path(__file__).with_name("sweep.json")


def parse_config(text: str) -> dict:
    """"128x256x64s0w8n3" -> a tiled config dict."""
    match = re.fullmatch(r"(\d+)x(\d+)x(\d+)s([01])w(\d+)n(\d+)", text)
    if match is None:
        raise ValueError(f"--extra-configs: {text!r} is not BLOCK_MxBLOCK_NxBLOCK_KsSWAPwWARPSnSTAGES")
    m, n, k, swap, warps, stages = map(int, match.groups())
    return dict(BLOCK_M=m, BLOCK_N=n, BLOCK_K=k, SWAP=swap, num_warps=warps, num_stages=stages)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--layers", default="unet3d_k2s2,unet3d_k2s2_deep,unet3d_k2s2_bf16")
    parser.add_argument("--forms", default="scaled,tf32,off")
    parser.add_argument("--extra-configs", default="")
    args = parser.parse_args()
    extra = [parse_config(text) for text in args.extra_configs.split(",") if text]
    wanted = {"scaled": (True, True), "tf32": (True, False), "off": (False, False)}
    float32_forms = [wanted[form] for form in args.forms.split(",")]
    as_fp16_default = tiled.TF32_AS_FP16
    layers = {layer["name"]: layer for layer in json.loads(SWEEP.read_text())}
    rows = []
    for name in args.layers.split(","):
        layer = layers[name]
        dtype = getattr(torch, layer.get("dtype", "float32"))
        torch.manual_seed(0)
        module = torch.nn.ConvTranspose3d(layer["in_channels"], layer["out_channels"], layer["kernel_size"],
                                          stride=layer["stride"], bias=layer["bias"]).cuda().to(dtype)
        x = torch.rand(layer["input_shape"], device="cuda", dtype=dtype)
        w, b = module.weight.detach(), module.bias.detach() if module.bias is not None else None
        plan = make_plan(tuple(x.shape), tuple(w.shape), stride=layer["stride"])
        reference = F.conv_transpose3d(x.double(), w.double(), b.double() if b is not None else None,
                                       stride=layer["stride"])
        forms = float32_forms if dtype == torch.float32 else [(True, False)]
        for tf32, as_fp16 in forms:
            torch.backends.cudnn.allow_tf32 = tf32
            tiled.TF32_AS_FP16 = as_fp16
            mode = ("TF32, FP16 scaled" if as_fp16 else "TF32") if tf32 else "TF32 off"
            precision = tiled.operand_precision(dtype, precision_for(dtype))
            with torch.no_grad():
                expected = module(x)
            # As the library runs it: float32 through the operand pass, half precision as given.
            if dtype == torch.float32:
                operands, strides = tiled._operands(x, w, precision), None
            else:
                operands, strides = (x, x, w, w), (*x.stride(), *w.stride())

            def check(out):
                return f"KB {kernelbench_check(out, expected)}, {relative_error(out, reference):.1e}"

            triton_backend._prepared.clear()  # (keyed by PyTorch's precision, which both TF32 forms share)
            variants = {
                "eager": (lambda: module(x), None),
                "tiled, autotuned": (lambda: tiled.conv_transpose3d_tiled(x, w, b, plan), None),
                "backend=triton (its prepared call)": (lambda: convt3d.conv_transpose3d(
                    x, w, b, stride=layer["stride"], backend="triton"), None),
                "tiled operand pass alone": (lambda: tiled._operands(x, w, precision), "unchecked"),
            }
            for cfg in tiled.configs(operands[0].element_size()) + extra:
                label = ("tiled kernel {BLOCK_M}x{BLOCK_N}x{BLOCK_K} swap {SWAP} w{num_warps} s{num_stages}"
                         .format(**cfg))
                out = torch.full(plan.output_shape, float("nan"), device="cuda", dtype=dtype)
                variants[label] = ((lambda cfg=cfg, out=out: tiled._launch(cfg, plan, *operands, b, out, precision,
                                                                            strides)), out)
            for label, (fn, out) in variants.items():
                try:
                    with torch.no_grad():
                        if out is None:
                            with nan_poisoned_allocations():
                                note = check(fn())
                        elif isinstance(out, str):
                            fn()
                            note = ""
                        else:
                            fn()
                            note = check(out)
                        t = time_cuda(fn, iters=args.iters)
                except Exception as error:  # a config that does not fit: say so and go on
                    rows.append((name, mode, label, float("nan"), float("nan"), repr(error)[:80]))
                    continue
                rows.append((name, mode, label, t.mean_ms, t.min_ms, note))
                print(rows[-1], flush=True)
            operands = variants = None  # the form's operand buffers freed before the next form's
    torch.backends.cudnn.allow_tf32 = True
    tiled.TF32_AS_FP16 = as_fp16_default
    print(markdown_table(["layer", "mode", "variant", "mean ms", "min ms", "check, rel. err. vs float64"], rows))


if __name__ == "__main__":
    main()
