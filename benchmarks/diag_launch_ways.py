"""Ways of a prepared call's launches against each other, in one process (GPU machine): Triton's launcher or the
driver's (launch.DRIVER_LAUNCH, CONVT3D_DRIVER_LAUNCH), the operands' buffer allocated per call or kept
(forward.KEPT_OPERANDS_BYTES).

    PYTHONPATH=src python3 benchmarks/diag_launch_ways.py [--layers a,b] [--rounds 2] [--iters 100]
        [--ways allocated,kept,kept+driver]

Per layer and precision mode, after the layer's first calls (compile, autotune): the way is switched (switch), then
per round and way: whether each of the layer's kernels launches through the driver,
the module's median host time per call (--iters calls, grad mode, as KernelBench calls it), its mean and median time
by time_cuda (cold L2, a synchronisation before each call: KernelBench's protocol) and eager's in the same round. Each
way's output of its third call (the prepared call, a kept buffer reused) is checked bitwise against the first way's
and against the float64 reference; the input is fresh random data, the output NaN-poisoned before the kernels write
it.
"""

import argparse
import gc

import torch

from convt3d import convert
import convt3d.backends.triton as triton_backend
from convt3d.backends.triton import forward, launch
from convt3d.bench.protocol import host_time_cuda, nan_poisoned_allocations, relative_error, time_cuda
from convt3d.bench.report import markdown_table
from convt3d.bench.workloads import sweep_layers


def bound_launches():
    return [o for o in gc.get_objects() if isinstance(o, launch.BoundLaunch)]


# Each way: (launches through the driver, the largest operands' buffer kept).
WAYS = {"allocated": (False, 0), "driver": (True, 0), "kept": (False, forward.KEPT_OPERANDS_BYTES),
        "kept+driver": (True, forward.KEPT_OPERANDS_BYTES)}
DEFAULT = launch.DRIVER_LAUNCH, forward.KEPT_OPERANDS_BYTES


def switch(module, way):
    """From module's next call on, launches at addresses go through the driver or Triton's launcher and operands'
    buffers up to a size are kept, as way says: the module's bound forwards, the prepared calls and every bound
    kernel's launches at addresses are dropped, so that the next call makes them anew."""
    launch.DRIVER_LAUNCH, forward.KEPT_OPERANDS_BYTES = way
    module.__dict__["_bound_forwards"] = None
    for bound in bound_launches():
        bound._compiled.clear()
    triton_backend._prepared.clear()


def ways_of_launch():
    """Per kernel launched so far: how its launch at addresses goes."""
    ways = []
    for bound in bound_launches():
        for _, direct, by_driver in bound._compiled.values():
            ways.append(f"{bound.kernel.__name__}: "
                        + ("driver" if by_driver is not None else "Triton's launcher" if direct is not None else "none"))
    return sorted(set(ways))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", default="batch1_small_k3s2,video_k3s2p1op1,k3s1p1,unet3d_k2s2_deep")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--tf32", default="on,off", help="precision modes: on, off or both (on,off)")
    parser.add_argument("--ways", default="allocated,kept,kept+driver", help=f"of {', '.join(WAYS)}")
    args = parser.parse_args()
    rows = []
    for layer in sweep_layers(args.layers):
        for mode in args.tf32.split(","):
            if mode == "off" and layer.dtype != "float32":
                continue
            with torch.backends.cudnn.flags(enabled=True, allow_tf32=mode == "on"):
                rows += compare(layer, mode, args.rounds, args.iters, args.ways.split(","))
    print()
    print(markdown_table(["layer", "TF32", "round", "way", "host ms", "convt3d mean (median)",
                          "eager mean (median)"], rows))


def compare(layer, mode, rounds, iters, ways):
    module, _, _, _, _ = layer.kernel_case("cuda")
    x = torch.rand(layer.input_shape, device="cuda", dtype=module.weight.dtype)
    b = module.bias.detach().double() if module.bias is not None else None
    plan = layer.plan()
    reference = torch.nn.functional.conv_transpose3d(x.double(), module.weight.detach().double(), b, plan.stride,
                                                     plan.padding, plan.output_padding, plan.groups, plan.dilation)
    ours = convert(module, backend="triton")
    ours(x), ours(x)  # compile and autotune, then the prepared call
    rows, first = [], None
    for round in range(1, rounds + 1):
        for way in ways:
            switch(ours, WAYS[way])
            ours(x), ours(x)  # the whole way (which prepares), then the prepared call (which keeps its operands)
            with nan_poisoned_allocations():
                out = ours(x).detach()  # the prepared call again: a kept buffer is reused
            first = out if first is None else first
            same = torch.equal(out, first)
            error = relative_error(out, reference)
            launches_by = ways_of_launch()
            print(f"{layer.name} TF32 {mode} round {round} {way}: bitwise as the first way {same}, "
                  f"relative error {error:.2e}; {'; '.join(launches_by)}")
            host = host_time_cuda(lambda: ours(x), iters)
            timing = time_cuda(lambda: ours(x), iters=iters)
            eager = time_cuda(lambda: module(x), iters=iters)
            rows.append((layer.name, mode, round, way, f"{host:.4f}",
                         f"{timing.mean_ms:.4f} ({timing.median_ms:.4f})",
                         f"{eager.mean_ms:.4f} ({eager.median_ms:.4f})"))
    switch(ours, DEFAULT)
    return rows


if __name__ == "__main__":
    main()
