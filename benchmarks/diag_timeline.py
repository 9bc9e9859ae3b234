"""Where problem 77's forward+backward waits: host or GPU (GPU machine).

    PYTHONPATH=src python3 benchmarks/diag_timeline.py [--calls 100] [--only timeline,graph,steps,grad_weight,cprofile,
        memory,orders] [--configs "64,256,8,4,1;64,128,4,3,2"] [--rounds 3]

timeline: the bench's loop (synchronise, flush the L2, start event, call, end event), with host timestamps after the
    forward and the backward return and an event recorded after the forward: per call the host's time in each and
    the GPU's time to the end of each (the GPU time to an event is the later of the host's arrival there and the
    GPU's own work before it).
graph: the same forward+backward captured in a CUDA graph and replayed after each flush: the GPU's time for the
    same kernels with no host in between (cold L2), the least any host-side change could reach.
steps: the bench's loop with a host timestamp where each step of convt3d's forward and backward ends (wrappers
    around its functions): the host's time per step, medians over the calls.
grad_weight: the Triton weight gradient alone (cold L2) in the configs of --configs, with its error against
    float64.
cprofile: Python's profiler over synchronised calls, functions by own time (inflated by the profiler itself).
memory: peak GPU memory allocated by one forward and by one forward+backward, eager and convt3d, above what the
    inputs, parameters and gradient held before (torch.cuda.max_memory_allocated).
orders: the backward's two gradients in other orders, patched in for the run, in interleaved rounds: as the library
    runs them (grad_input by cuDNN, then the Triton grad_weight), grad_weight first, and grad_weight on a second
    stream beside grad_input; per variant the bench loop's mean (timeline) and the CUDA graph replay.
"""

import argparse
import cProfile
import io
import pstats
import statistics
import time

import torch

from convt3d import ops
from convt3d.backends import torch_phase
from convt3d.backends.triton import backward as triton_backward
from convt3d.bench.protocol import FLUSH_BYTES, relative_error, time_cuda
from convt3d.bench.workloads import PROBLEM_77


def timeline(layer, x, grad, calls):
    flush = torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    rows = []
    for i in range(calls + 5):
        start, after_forward, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        torch.cuda.synchronize()
        flush.fill_(1)
        start.record()
        t0 = time.perf_counter()
        out = layer(x)
        t1 = time.perf_counter()
        after_forward.record()
        out.backward(grad)
        t2 = time.perf_counter()
        end.record()
        end.synchronize()
        if i >= 5:
            rows.append(((t1 - t0) * 1e3, (t2 - t1) * 1e3, start.elapsed_time(after_forward),
                         start.elapsed_time(end)))
    return [statistics.median(column) for column in zip(*rows)], statistics.fmean(r[3] for r in rows)


def graph_replay(layer, x, grad, calls):
    params = [p for p in layer.parameters()]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            torch.autograd.grad(layer(x), (x, *params), grad)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        torch.autograd.grad(layer(x), (x, *params), grad)
    flush = torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    samples = []
    for i in range(calls + 5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        flush.fill_(1)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        if i >= 5:
            samples.append(start.elapsed_time(end))
    return statistics.fmean(samples)


STEPS = ((torch_phase, "_empty_output"), (torch_phase, "_fill"), (torch_phase, "_phase_conv"),
         (triton_backward, "phase_operands"), (triton_backward, "phase_grad_input"),
         (triton_backward, "phase_grad_weight"), (ops, "_cuda_phase_backward"))


def steps(layer, x, grad, calls):
    """Median host ms from the call's start to each step's end (a step that runs twice: its last end)."""
    marks = {}
    originals = [(module, name, getattr(module, name)) for module, name in STEPS]

    def wrap(name, fn):
        def timed(*args, **kwargs):
            result = fn(*args, **kwargs)
            marks[name] = time.perf_counter()
            return result
        return timed

    backward = ops._EagerConvTranspose3d.backward

    def timed_backward(ctx, grad_output):
        marks["engine: backward entered"] = time.perf_counter()
        result = backward(ctx, grad_output)
        marks["engine: backward left"] = time.perf_counter()
        return result

    for module, name, fn in originals:
        setattr(module, name, wrap(name, fn))
    ops._EagerConvTranspose3d.backward = staticmethod(timed_backward)
    flush = torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    rows = []
    try:
        for i in range(calls + 5):
            torch.cuda.synchronize()
            flush.fill_(1)
            marks.clear()
            t0 = time.perf_counter()
            out = layer(x)
            marks["forward returned"] = time.perf_counter()
            out.backward(grad)
            marks["backward returned"] = time.perf_counter()
            if i >= 5:
                rows.append({name: (t - t0) * 1e3 for name, t in marks.items()})
    finally:
        for module, name, fn in originals:
            setattr(module, name, fn)
        ops._EagerConvTranspose3d.backward = staticmethod(backward)
    names = sorted(rows[0], key=lambda n: statistics.median(r[n] for r in rows))
    return [(name, statistics.median(r[name] for r in rows)) for name in names]


def peak_memory(layer, x, grad):
    """(forward, forward+backward) peak MB above the memory allocated before the call (after a warm-up call, which
    for convt3d's auto also times its candidates)."""
    layer(x).backward(grad)
    peaks = []
    for backward in (False, True):
        x.grad = None
        layer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = layer(x)
        if backward:
            out.backward(grad)
        del out
        torch.cuda.synchronize()
        peaks.append((torch.cuda.max_memory_allocated() - before) / 2**20)
    return peaks


def _order_variants():
    """{name: phase_backward} for the orders section (each as triton_backward.phase_backward, whose parts it calls)."""
    tb = triton_backward
    side = torch.cuda.Stream()

    def operands(grad_output, input, plan, phases, need_weight):
        precision = tb.precision_for(input.dtype)
        return precision, *tb.phase_operands(grad_output, input if need_weight else None, plan, phases, precision)

    def weight_first(grad_output, index, input, weight, plan, phases, need_input, need_weight):
        precision, lattice, windows = operands(grad_output, input, plan, phases, need_weight)
        part_weight = tb.phase_grad_weight(lattice, input, plan, phases, precision,
                                           lattice_rounded=precision == tb.TF32, windows=windows)
        return tb.phase_grad_input(lattice, weight, plan, phases), part_weight

    def side_stream(grad_output, index, input, weight, plan, phases, need_input, need_weight):
        precision, lattice, windows = operands(grad_output, input, plan, phases, need_weight)
        main = torch.cuda.current_stream()
        side.wait_stream(main)
        with torch.cuda.stream(side):
            part_weight = tb.phase_grad_weight(lattice, input, plan, phases, precision,
                                               lattice_rounded=precision == tb.TF32, windows=windows)
        part_input = tb.phase_grad_input(lattice, weight, plan, phases)
        main.wait_stream(side)
        lattice.record_stream(side)  # (allocated on main, read on side: not reused before side is done)
        windows.record_stream(side)
        part_weight.record_stream(main)
        return part_input, part_weight

    return {"library": tb.phase_backward, "grad_weight first": weight_first,
            "grad_weight on a side stream": side_stream}


def orders(layer, x, grad, calls, rounds):
    """Per variant: the bench loop's means over the rounds, one graph replay, and whether its gradients equal the
    library's bit for bit."""
    variants = _order_variants()
    means = {name: [] for name in variants}
    graphs, same = {}, {}
    reference = None
    original = ops._triton_phase_backward
    try:
        for r in range(rounds):
            for name, variant in variants.items():
                ops._triton_phase_backward = lambda variant=variant: variant
                if r == 0:
                    grads = torch.autograd.grad(layer(x), (x, layer.weight), grad)
                    reference = grads if reference is None else reference
                    same[name] = all(torch.equal(a, b) for a, b in zip(grads, reference))
                means[name].append(timeline(layer, x, grad, calls)[1])
                if r == 0:
                    try:
                        graphs[name] = graph_replay(layer, x, grad, calls)
                    except RuntimeError as failure:  # (reported, not fatal: the means stand without it)
                        print(f"orders: {name}: graph capture failed: {failure}"[:300], flush=True)
                        graphs[name] = float("nan")
    finally:
        ops._triton_phase_backward = original
    return [(name, means[name], graphs[name], same[name]) for name in variants]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--only", default="timeline,graph,steps,cprofile")
    parser.add_argument("--rounds", type=int, default=3, help="orders: interleaved rounds")
    parser.add_argument("--configs", type=lambda text: [(*map(int, c.split(",")), True) for c in text.split(";")],
                        default=[(64, 256, 8, 3, 1, True)], help='"BLOCK_CO,BLOCK_N,warps,stages,per_sm;..."')
    args = parser.parse_args()
    sections = args.only.split(",")
    eager, ours, x, grad = PROBLEM_77.training_case("cuda")
    table = []
    if "timeline" in sections:
        for name, layer in (("eager", eager), ("convt3d", ours)):
            (host_f, host_b, gpu_f, gpu_all), mean = timeline(layer, x, grad, args.calls)
            table.append(f"timeline {name}: medians host forward {host_f:.3f}, host backward {host_b:.3f}, "
                         f"GPU to forward's end {gpu_f:.3f}, GPU to the end {gpu_all:.3f}; mean {mean:.3f} ms")
            print(table[-1], flush=True)
    if "graph" in sections:
        for name, layer in (("eager", eager), ("convt3d", ours)):
            table.append(f"graph replay {name}: {graph_replay(layer, x, grad, args.calls):.3f} ms")
            print(table[-1], flush=True)
    if "steps" in sections:
        previous = 0.0
        for name, ms in steps(ours, x, grad, args.calls):
            table.append(f"steps: {name:28s} ends at {ms:.3f} ms (+{ms - previous:.3f})")
            previous = ms
            print(table[-1], flush=True)
    if "grad_weight" in sections:
        plan = PROBLEM_77.plan()
        ((phases, _),) = torch_phase._backward_phases(plan)
        xd, w = x.detach(), ours.weight.detach()
        precision = triton_backward.precision_for(torch.float32)
        lattice, windows = triton_backward.phase_operands(grad, xd, plan, phases, precision)
        x64, w64 = xd.double(), w.double().requires_grad_()
        torch.nn.functional.conv_transpose3d(x64, w64, None, plan.stride, plan.padding, plan.output_padding,
                                             plan.groups, plan.dilation).backward(grad.double())
        saved = triton_backward.CONFIG
        try:
            for config in args.configs * 2:
                triton_backward.CONFIG = config
                triton_backward._grad_weight_launch.cache_clear()
                def piece():
                    return triton_backward.phase_grad_weight(lattice, xd, plan, phases, precision,
                                                             lattice_rounded=True, windows=windows)
                try:
                    error = relative_error(piece(), w64.grad)
                except Exception as failure:  # noqa: BLE001 (a config that does not compile: report, go on)
                    print(f"{config}: {type(failure).__name__} {failure}"[:300], flush=True)
                    continue
                ms = time_cuda(piece).mean_ms
                table.append(f"grad_weight {config}: {ms:.4f} ms (rel. err. {error:.1e})")
                print(table[-1], flush=True)
        finally:
            triton_backward.CONFIG = saved
            triton_backward._grad_weight_launch.cache_clear()
    if "memory" in sections:
        for name, layer in (("eager", eager), ("convt3d", ours)):
            forward, both = peak_memory(layer, x, grad)
            table.append(f"memory {name}: peak above the inputs: forward {forward:.0f} MB, forward+backward "
                         f"{both:.0f} MB")
            print(table[-1], flush=True)
    if "orders" in sections:
        for name, means, graph, same in orders(ours, x, grad, args.calls, args.rounds):
            table.append(f"orders: {name:30s} means {', '.join(f'{m:.3f}' for m in means)} ms; graph replay "
                         f"{graph:.3f} ms; gradients equal the library's: {same}")
            print(table[-1], flush=True)
    if "cprofile" in sections:
        profile = cProfile.Profile()
        for i in range(args.calls // 2 + 5):
            torch.cuda.synchronize()
            if i >= 5:
                profile.enable()
            ours(x).backward(grad)
            if i >= 5:
                profile.disable()
        stream = io.StringIO()
        pstats.Stats(profile, stream=stream).sort_stats("tottime").print_stats(30)
        print(stream.getvalue())
    print("\n".join(table))


if __name__ == "__main__":
    main()
