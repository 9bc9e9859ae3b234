"""The Triton forward's main kernel launched as its operand pass's dependent, or not, in one process (GPU machine).

    PYTHONPATH=src python3 benchmarks/diag_dependent_launch.py [--rounds 5] [--iters 30] [--calls 100]
        [--layers batch1_small_k3s2,...] [--tf32 on|off]

Per layer (backend="triton", grad mode on and the parameters requiring grad, as KernelBench times a module), the
three values of backends.triton.dependent_launch_mode take turns over several rounds: "off" (an ordinary launch),
"wait" (the main kernel launched as the pass's dependent, starting as the pass ends), "early" (the pass lets it start
once its last programs run). The tile config is the one autotuned on the layer's first call, the same in every mode.
Per mode: the median over rounds of the bench's cold-L2 mean and minimum (KernelBench's timing) and of the median
host time of a call; eager's module in the same rounds. Each mode's output, NaN-poisoned before its first call, is
checked against eager (KernelBench's check) and against float64.
"""

import argparse
import statistics

import torch

import convt3d.backends.triton as triton_backend
from convt3d import convert
from convt3d.backends.triton import forward, tiled
from convt3d.bench.protocol import (host_time_cuda, kernelbench_check, nan_poisoned_allocations, relative_error,
                                    time_cuda)
from convt3d.bench.report import markdown_table
from convt3d.bench.workloads import sweep_layers

MODES = ("off", "wait", "early")


def use_mode(mode: str) -> None:
    """Later calls launch in this mode: the bound launches and prepared calls of the other modes forgotten, the
    configs kept."""
    triton_backend.dependent_launch_mode = mode
    for cache in (forward._chosen, tiled._chosen, triton_backend._prepared):
        cache.clear()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--layers", default="batch1_small_k3s2,unet3d_k2s2,video_k3s2p1op1,vae_k4s2p1_fp16")
    parser.add_argument("--tf32", choices=("on", "off"), default="on")
    args = parser.parse_args()
    torch.backends.cudnn.allow_tf32 = args.tf32 == "on"
    rows = []
    for layer in sweep_layers(args.layers):
        module, x, _, _, reference = layer.kernel_case("cuda")
        ours = convert(module, backend="triton")
        expected = module(x)
        samples = {mode: [] for mode in (*MODES, "eager")}
        checks = {}
        for round_ in range(args.rounds):
            for mode in MODES:
                use_mode(mode)
                if round_ == 0:
                    with nan_poisoned_allocations():
                        out = ours(x)  # the whole path, poisoned, then the prepared call
                    checks[mode] = (kernelbench_check(out, expected), relative_error(out, reference))
                ours(x)
                ours(x)
                cold = time_cuda(lambda: ours(x), iters=args.iters)
                host = host_time_cuda(lambda: ours(x), args.calls) * 1e3
                samples[mode].append((cold.mean_ms, cold.min_ms, host))
            cold = time_cuda(lambda: module(x), iters=args.iters)
            samples["eager"].append((cold.mean_ms, cold.min_ms, host_time_cuda(lambda: module(x), args.calls) * 1e3))
        use_mode("early")
        for mode, values in samples.items():
            check, error = checks.get(mode, ("", ""))
            mean, minimum, host = (statistics.median(v[i] for v in values) for i in range(3))
            rows.append((layer.name, mode, f"{mean:.4f}", f"{minimum:.4f}", f"{host:.1f}", check,
                         error if error == "" else f"{error:.1e}"))
            print(rows[-1], flush=True)
    print(markdown_table(["layer", "mode", "cold-L2 mean ms", "cold-L2 min ms", "host us", "KernelBench check",
                          "rel. err. fp64"], rows))


if __name__ == "__main__":
    main()
