"""Where the host's time goes in one `backend="triton"` forward call (GPU machine).

    PYTHONPATH=src python3 benchmarks/diag_host_steps.py [--calls 300] [--layers k3s1p1,...] [--profile-top 15]

Per layer: the median host time (from a synchronisation to the return) of the whole module call, eager's module
and functional call beside it, and of the Triton forward's steps called one by one on the same tensors (output
allocation, operand pass, kernel launch, and a bare torch.empty); the main kernel's launch through each layer of
Triton's launcher, from its JIT launcher down to the object around its C launch function (`launch_layers`); then
Python's profiler over the module's calls, functions by own time per call (the profiler inflates small functions).
"""

import argparse
import cProfile
import pstats

import torch

from convt3d import convert, functional
from convt3d.backends import current_cuda_device as _current_device
from convt3d.backends.triton import forward, interpreted, tiled
from convt3d.bench.protocol import host_time_cuda
from convt3d.bench.report import markdown_table
from convt3d.bench.workloads import sweep_layers


def host_us(fn, calls):
    return host_time_cuda(fn, calls) * 1e3


def steps(layer, calls):
    module, x, w, b, _ = layer.kernel_case("cuda")
    ours = convert(module, backend="triton")
    as_eager = convert(module, backend="eager")  # both share module's parameters; module stays PyTorch's
    plan = layer.plan()
    with torch.no_grad():
        ours(x)  # compile and autotune
        precision = forward.precision_for(x.dtype)
        pieces = {
            "convt3d module": lambda: ours(x),
            "eager module": lambda: module(x),
            "convt3d module, backend eager": lambda: as_eager(x),
            "validate": lambda: functional.validate(x, w, b, ours.stride, ours.padding, ours.output_padding,
                                                    ours.groups, ours.dilation),
            "backends.triton.conv_transpose3d": lambda: functional.run_backend("triton", x, w, b, plan),
            "torch.empty (output)": lambda: torch.empty(plan.output_shape, device="cuda", dtype=x.dtype),
            "interpreted()": interpreted,
        }
        if tiled.unsupported_reason(plan) is not None:
            out = forward.allocate_output(x, w, b, plan)[0]
            config = forward._best_config[(plan.key, x.dtype, precision, x.device, out.stride(), b is not None)]
            operands = forward._operands(x, w, plan.groups, precision)
            pieces.update({
                "allocate_output": lambda: forward.allocate_output(x, w, b, plan),
                "_operands (3-5 allocations, pass launch)": lambda: forward._operands(x, w, plan.groups, precision),
                "_launch (main kernel)": lambda: forward._launch(config, plan, *operands, b, out, precision),
            })
            pieces.update(launch_layers(forward._main_launch(config, plan, precision, b is not None, out.stride(),
                                                             out.device.index or 0),
                                        (*operands, b if b is not None else operands[1], out)))
        return {name: host_us(fn, calls) for name, fn in pieces.items()}, ours, x


def launch_layers(bound, pointers):
    """One launch of a bound kernel (launch.BoundLaunch) through each layer of Triton's launcher: its JIT launcher
    (kernel[grid](...)), the BoundLaunch, the compiled kernel's runner (compiled[grid]) and the launcher object
    under it (compiled.run: Python around Triton's C launch function, whose arguments differ between versions)."""
    args = (*pointers, *bound.scalars, *bound.constexprs)
    compiled = bound.kernel[bound.grid](*pointers, *bound.scalars, **bound.options)
    grid = bound.grid3
    runner = compiled[grid]
    stream = torch.cuda.current_stream().cuda_stream
    layers = {
        "launch: Triton's JIT launcher": lambda: bound.kernel[bound.grid](*pointers, *bound.scalars, **bound.options),
        "launch: BoundLaunch": lambda: bound(pointers),
        "launch: compiled[grid] runner": lambda: runner(*args, stream=stream),
        "launch: its key (device, dtypes, alignments)": lambda: (
            _current_device(), *[(t.dtype, t.data_ptr() % 16 == 0) for t in pointers]),
    }
    run = compiled.run
    layers["launch: compiled.run"] = lambda: run(*grid, stream, compiled.function, compiled.packed_metadata, None,
                                                 None, None, *args)
    try:
        layers["launch: compiled.run"]()
    except Exception as error:  # another version's arguments
        print("compiled.run not timed:", repr(error)[:200])
        del layers["launch: compiled.run"]
    return layers


def profile(ours, x, calls, top):
    profiler = cProfile.Profile()
    with torch.no_grad():
        for _ in range(calls):
            torch.cuda.synchronize()
            profiler.enable()
            ours(x)
            profiler.disable()
    torch.cuda.synchronize()
    stats = pstats.Stats(profiler)
    rows = []
    for (file, line, name), (_, ncalls, tottime, cumtime, _) in stats.stats.items():
        where = f"{file.split('/')[-1]}:{line} {name}"
        rows.append((tottime / calls * 1e6, cumtime / calls * 1e6, ncalls / calls, where))
    rows.sort(reverse=True)
    return [(f"{own:.1f}", f"{cum:.1f}", f"{n:g}", where) for own, cum, n, where in rows[:top]]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--layers", default="k3s1p1,video_k3s2p1op1,unet3d_k2s2,vae_k4s2p1")
    parser.add_argument("--profile-top", type=int, default=15)
    args = parser.parse_args()
    for layer in sweep_layers(args.layers):
        name = layer.name
        times, ours, x = steps(layer, args.calls)
        print(f"\n### {name}: host us, median of {args.calls} calls\n")
        print(markdown_table(["step", "host us"], [(step, f"{us:.1f}") for step, us in times.items()]))
        print(f"\nprofile, per call ({name}):\n")
        print(markdown_table(["own us", "cumulative us", "calls", "function"],
                             profile(ours, x, args.calls, args.profile_top)))


if __name__ == "__main__":
    main()
