"""Where the tiled GEMM's TF32 mode (FP16 scaled operands, tiled.FP16_SCALED) spends its time beyond plain FP16, on
the sweep's two float32 k2 s2 layers (GPU):

    PYTHONPATH=src python3 benchmarks/diag_scaled_epilogue.py

The same config (128 x 128 x 64, swapped, 8 warps, 3 stages) on (a) the scaled operands with the scaled epilogue, as
the library runs it; (b) the same operands with the plain epilogue (a wrong result: timing only); (c) the TF32 operand
pass's operands cast to FP16, with the plain epilogue (the layer's own values, x in [0, 1) and w about 0.05); and
(e) backend="triton" (its prepared call: operand pass and kernel). a against b is the scaling's cost, b against c
whether the operands' magnitudes change the MMAs' time. Two rounds; bench.protocol.time_cuda's mean and minimum in
ms (L2 flushed before each call); a, c and e, their outputs NaN-filled first, checked against eager
(KernelBench's check) and float64.
"""

import torch

import convt3d
from convt3d.backends.triton import tiled
from convt3d.backends.triton.forward import NATIVE, TF32
from convt3d.bench.protocol import kernelbench_check, nan_poisoned_allocations, relative_error, time_cuda
from convt3d.bench.workloads import sweep_layers

CONFIG = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, SWAP=1, num_warps=8, num_stages=3)


def main():
    torch.backends.cudnn.allow_tf32 = True
    for name in ("unet3d_k2s2", "unet3d_k2s2_deep"):
        layer = sweep_layers(name)[0]
        module, x, w, b, reference = layer.kernel_case("cuda")
        plan = layer.plan()
        with torch.no_grad():
            expected = module(x)
        xs, xe, ws, we = tiled._operands(x, w, tiled.FP16_SCALED)
        xt, _, wt, _ = tiled._operands(x, w, TF32)
        xh, wh = xt.half(), wt.half()
        out = torch.empty(plan.output_shape, device="cuda")
        forms = {
            "a scaled operands, scaled epilogue (library)":
                lambda: tiled._launch(CONFIG, plan, xs, xe, ws, we, b, out, tiled.FP16_SCALED),
            "b scaled operands, plain epilogue": lambda: tiled._launch(CONFIG, plan, xs, xs, ws, ws, b, out, NATIVE),
            "c layer's values in FP16, plain epilogue":
                lambda: tiled._launch(CONFIG, plan, xh, xh, wh, wh, b, out, NATIVE),
            "e backend=triton, prepared call": lambda: convt3d.conv_transpose3d(
                x, w, b, layer.stride, layer.padding, layer.output_padding, layer.groups, layer.dilation,
                backend="triton"),
        }
        checks = {}
        for label, fn in forms.items():
            out.fill_(float("nan"))
            with torch.no_grad(), nan_poisoned_allocations():  # (e's own output NaN-filled before it writes it)
                result = fn()
            if result is not None:
                out.copy_(result)
            checks[label] = (f"KB {kernelbench_check(out, expected)}, {relative_error(out, reference):.1e}"
                             if not label.startswith("b") else "(timing only)")
        for round_ in range(2):
            for label, fn in forms.items():
                with torch.no_grad():
                    t = time_cuda(fn, iters=50)
                print(f"| {name} | {round_} | {label} | {t.mean_ms:.4f} | {t.min_ms:.4f} | {checks[label]} |",
                      flush=True)


if __name__ == "__main__":
    main()
