"""Time every Triton tile config of convt3d's forward on one layer (default: KernelBench L1/77).

Cold L2, CUDA events (convt3d.bench.protocol.time_cuda). Usage:
    PYTHONPATH=src python3 benchmarks/tune_configs.py [--iters 20] [--config JSON]
"""

import argparse

import torch

from convt3d.backends.triton.forward import TF32, TF32X3, _configs, conv_transpose3d_triton
from convt3d.bench.protocol import relative_error, time_cuda
from convt3d.bench.workloads import PROBLEM_77, parse_config


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--config", default=None)
    args = parser.parse_args()
    layer = parse_config(args.config) if args.config else PROBLEM_77
    plan = layer.plan()
    x = torch.rand(layer.input_shape, device="cuda")
    w = torch.randn(layer.weight_shape(), device="cuda") * 0.05
    ref = torch.nn.functional.conv_transpose3d(x.double(), w.double(), None, plan.stride, plan.padding,
                                               plan.output_padding, plan.groups, plan.dilation)
    floor = time_cuda(lambda: torch.zeros(plan.output_shape, device="cuda"), iters=args.iters).mean_ms
    print(f"{layer.describe()}\nwrite-output floor {floor:.4f} ms")
    print("precision | BLOCK_M | BLOCK_CO | BLOCK_CI | warps | stages | ms | x floor | rel err")
    for precision in (TF32, TF32X3):
        for cfg in _configs():
            try:
                run = lambda: conv_transpose3d_triton(x, w, None, plan, precision=precision, config=cfg)  # noqa: E731
                err = relative_error(run(), ref)
                ms = time_cuda(run, iters=args.iters).mean_ms
            except Exception as error:  # a tile that does not fit is skipped, with the reason
                print(f"{precision} {cfg}: {type(error).__name__}: {str(error)[:100]}")
                continue
            print(f"{'tf32' if precision == TF32 else '3xtf32'} | {cfg['BLOCK_M']} | {cfg['BLOCK_CO']} | "
                  f"{cfg['BLOCK_CI']} | {cfg['num_warps']} | {cfg['num_stages']} | {ms:.4f} | {ms / floor:.2f} | "
                  f"{err:.1e}")


if __name__ == "__main__":
    main()
