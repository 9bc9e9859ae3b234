"""3xFP16 against 3xTF32 and cuDNN on an input whose magnitude changes across space (GPU, TF32 off).

    PYTHONPATH=src python3 benchmarks/diag_dynamic_range.py [--scales 0,12,20,24,28,32]

Problem 77's layer at batch 2, x = rand with the input rows ih < 16 scaled by 2^-k, w = randn * 0.05. The CUDA
phase correlation's 3xFP16 scales the window per tile (a tile's largest value sets it), so outputs that read only
values far below that largest value lose bits; 3xTF32 splits each value in its own range. Per implementation: the
norm-wise error against float64, and each output's error over conv_transpose3d(|x|, |w|) in float64 (what float32
arithmetic bounds), its maximum over all outputs and over the outputs that read only the scaled rows.
"""

import argparse

import torch

import convt3d
from convt3d.backends import cuda
from convt3d.bench.report import markdown_table
from convt3d.bench.workloads import PROBLEM_77


def phase_path(split: int):
    def run(x, w, args):
        cuda.SPLIT, before = split, cuda.SPLIT
        try:
            return convt3d.conv_transpose3d(x, w, None, *args, backend="torch")
        finally:
            cuda.SPLIT = before
    return run


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--scales", default="0,12,20,24,28,32")
    args = parser.parse_args()
    torch.backends.cudnn.allow_tf32 = False
    layer = PROBLEM_77.with_batch(2)
    plan = layer.plan()
    layer_args = (plan.stride, plan.padding, plan.output_padding, plan.groups, plan.dilation)
    conv = torch.nn.functional.conv_transpose3d
    implementations = {
        "eager (cuDNN)": lambda x, w, a: conv(x, w, None, *a),
        "phase path, 3xFP16": phase_path(2),
        "phase path, 3xTF32": phase_path(1),
        "Triton (3xTF32)": lambda x, w, a: convt3d.conv_transpose3d(x, w, None, *a, backend="triton"),
    }
    rows = []
    for k in map(int, args.scales.split(",")):
        torch.manual_seed(k)
        x = torch.rand(layer.input_shape, device="cuda")
        w = torch.randn(layer.weight_shape(), device="cuda") * 0.05
        scaled = torch.zeros_like(x, dtype=torch.float64)
        scaled[:, :, :, :16] = 1
        x[:, :, :, :16] *= 2.0 ** -k
        reference = conv(x.double(), w.double(), None, *layer_args)
        bound = conv(x.double().abs(), w.double().abs(), None, *layer_args)
        only_scaled = (conv((1 - scaled) * x.double().abs(), w.double().abs(), None, *layer_args) == 0) & (bound > 0)
        for name, run in implementations.items():
            y = run(x, w, layer_args).double()
            error = (y - reference).abs() / bound.clamp_min(1e-300)
            rows.append((k, name, f"{((y - reference).norm() / reference.norm()).item():.2e}",
                         f"{error[bound > 0].max().item():.2e}", f"{error[only_scaled].max().item():.2e}",
                         f"{error[only_scaled].median().item():.2e}"))
            print(rows[-1], flush=True)
    print(markdown_table(["k", "implementation", "norm-wise", "max error / bound, all",
                          "max, outputs reading only the scaled rows", "median, those"], rows))


if __name__ == "__main__":
    main()
