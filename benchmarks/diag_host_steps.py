"""Where the host's time goes in one `backend="triton"` forward call (GPU machine).

    PYTHONPATH=src python3 benchmarks/diag_host_steps.py [--calls 300] [--layers k3s1p1,...] [--profile-top 15]

Per layer: the median host time (from a synchronisation to the return) of the whole module call, under grad mode
as KernelBench times it and under no_grad, and eager's module and functional call beside it; then the steps of the
prepared call (backends.triton._prepared, what a layer's later calls take) one by one on the same tensors: the
output's and operands' allocations, a view, the operand pass's and the main kernel's launches; the main kernel's
launch through each layer of Triton's launcher, from its JIT launcher down to the object around its C launch
function (`launch_layers`), with tensors and with addresses; then Python's profiler over the module's calls,
functions by own time per call (the profiler inflates small functions).
"""

import argparse
import cProfile
import gc
import pstats

import torch

from convt3d import convert, functional
from convt3d.backends import current_cuda_device as _current_device
import convt3d.backends.triton as triton_backend
from convt3d.backends.triton import forward, launch, tensor_scaled, tiled
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
    precision = triton_backend.precision_for(x.dtype)
    with torch.no_grad():
        ours(x)  # compile and autotune; the second call makes the prepared call
        ours(x)
        prepared = triton_backend._prepared[(plan, x.dtype, x.device, precision, b is not None)]
        pieces = {
            "convt3d module": lambda: ours(x),
            "eager module": lambda: module(x),
            "convt3d module, backend eager": lambda: as_eager(x),
            "validate": lambda: functional.validate(x, w, b, ours.stride, ours.padding, ours.output_padding,
                                                    ours.groups, ours.dilation),
            "backends.triton.conv_transpose3d": lambda: functional.run_backend("triton", x, w, b, plan),
            "the prepared call": lambda: prepared(x, w, b),
            "torch.empty (output)": lambda: torch.empty(plan.output_shape, device="cuda", dtype=x.dtype),
        }
        buffer = torch.empty(1 << 16, device="cuda", dtype=x.dtype)
        pieces["as_strided (an operand's view)"] = lambda: buffer.as_strided((64, 64), (64, 1), 64)
        if tiled.unsupported_reason(plan) is not None:  # (the steps of forward.prepare's call)
            out = forward.allocate_output(x, w, b, plan)[0]
            operand_precision = tensor_scaled.operand_precision(x, w, plan.groups, precision)
            main = forward._chosen[forward._chosen_key(x, plan, operand_precision, out, b)]
            layout, operand_pass = forward._operand_steps(
                tuple(x.shape), tuple(w.shape), plan.groups, forward.flat_input(x)[1], operand_precision,
                forward.pass_lets_main_start(x.device), tensor_scaled.cuda_index(x.device))
            x_op, w_op, w_lo = forward._operand_buffers(layout, x.dtype, operand_precision, x.device)
            pass_pointers = (x, x_op, w, w_op, w_lo)
            main_pointers = (x_op, w_op, w_lo, b if b is not None else w_op, out)
            pieces.update({
                "the operands' buffers (forward._operand_buffers)": lambda: forward._operand_buffers(
                    layout, x.dtype, operand_precision, x.device),
                "operand pass launch (BoundLaunch)": lambda: operand_pass(pass_pointers),
                "main kernel launch (BoundLaunch)": lambda: main(main_pointers),
            })
            pieces.update(launch_layers(main, main_pointers))
        times = {name: host_us(fn, calls) for name, fn in pieces.items()}
    # As KernelBench times a module: grad mode on, the parameters requiring grad.
    grad_mode = {"convt3d module, grad mode": lambda: ours(x), "eager module, grad mode": lambda: module(x)}
    return {**{name: host_us(fn, calls) for name, fn in grad_mode.items()}, **times}, ours, x


def launch_layers(bound, pointers):
    """One launch of a bound kernel (launch.BoundLaunch) through each layer of Triton's launcher: its JIT launcher
    (kernel[grid](...)), the compiled kernel's runner (compiled[grid]) and the launcher object
    under it (compiled.run: Python around Triton's C launch function, whose arguments differ between versions); and
    through the driver (launch._driver_launch), as prepared calls launch at addresses unless CONVT3D_DRIVER_LAUNCH=0."""
    args = (*pointers, *bound.scalars, *bound.constexprs)
    compiled = bound.kernel[bound.grid](*pointers, *bound.scalars, **bound.options)
    grid = bound.grid3
    runner = compiled[grid]
    stream = torch.cuda.current_stream().cuda_stream
    layers = {
        "launch: Triton's JIT launcher": lambda: bound.kernel[bound.grid](*pointers, *bound.scalars, **bound.options),
        "launch: compiled[grid] runner": lambda: runner(*args, stream=stream),
        "launch: its key (device, dtypes, alignments)": lambda: (
            _current_device(), *[(t.dtype, t.data_ptr() % 16 == 0) for t in pointers]),
    }
    run = compiled.run
    addresses = [t.data_ptr() for t in pointers]
    layers["launch: compiled.run, tensors"] = lambda: run(*grid, stream, compiled.function, compiled.packed_metadata,
                                                          None, None, None, *args)
    layers["launch: compiled.run, addresses"] = lambda: run(*grid, stream, compiled.function,
                                                            compiled.packed_metadata, None, None, None, *addresses,
                                                            *bound.scalars, *bound.constexprs)
    try:
        layers["launch: compiled.run, tensors"]()
    except Exception as error:  # another version's arguments
        print("compiled.run not timed:", repr(error)[:200])
        del layers["launch: compiled.run, tensors"], layers["launch: compiled.run, addresses"]
    by_driver = launch._driver_launch(compiled, grid, bound.pointers, bound.scalars)
    if by_driver is None:
        print("no driver launch (launch._driver_launch) for", bound.kernel.__name__)
    else:
        layers["launch: the driver (driver.Launch), addresses"] = lambda: by_driver(stream, *addresses)
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
    # How the kernels compiled so far launch at addresses (the driver's unless CONVT3D_DRIVER_LAUNCH=0).
    for bound in (o for o in gc.get_objects() if isinstance(o, launch.BoundLaunch)):
        for key, (_, direct, by_driver) in bound._compiled.items():
            way = "the driver" if by_driver is not None else "Triton's launcher" if direct is not None else "none"
            print(f"{bound.kernel.__name__} {key[1:]}: at addresses by {way}")


if __name__ == "__main__":
    main()
