"""Would two CUDA streams help problem 77 (GPU)? Independent pieces of the phase path run one after the other
today: the forward's output fill and its compact convolution; the backward's grad_input (cuDNN) and grad_weight
(the Triton kernel, which keeps one 8-warp program per multiprocessor, ncu: 35% SM busy). This times each pair
on one stream and on two, with the bench's timer, and checks that the results agree. (The library ran grad_weight
on a second stream for a while in the sixth session, 153c478-196f876: forward+backward within run-to-run spread,
so it was taken out; benchmarks/RESULTS.md.)

    PYTHONPATH=src python3 benchmarks/diag_streams.py [--iters 30]
"""

import argparse

import torch

from convt3d.backends import torch_phase as tp
from convt3d.backends.triton.backward import phase_grad_weight
from convt3d.bench.protocol import time_cuda
from convt3d.bench.workloads import PROBLEM_77


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=100)
    args = parser.parse_args()
    plan, phases, x, w = PROBLEM_77.phase_case("cuda")
    grad = torch.rand(plan.output_shape, device="cuda")
    ((_, lattice),) = tp._backward_phases(plan)
    side = torch.cuda.Stream()

    def forward(two_streams):
        out = torch.empty(plan.output_shape, device="cuda")
        main = torch.cuda.current_stream()
        if two_streams:
            side.wait_stream(main)  # out's memory may still be in use by earlier work on main
            with torch.cuda.stream(side):
                out.zero_()
            part = tp._phase_conv(x, w, None, plan, phases)
            main.wait_stream(side)
            out.record_stream(side)
        else:
            out.zero_()
            part = tp._phase_conv(x, w, None, plan, phases)
        out[lattice].copy_(part)
        return out

    def backward(two_streams):
        g = grad[lattice].contiguous()
        main = torch.cuda.current_stream()
        if two_streams:
            side.wait_stream(main)
            with torch.cuda.stream(side):
                grad_weight = phase_grad_weight(g, x, plan, phases)
            grad_input = tp.phase_grad_input(g, w, plan, phases)
            main.wait_stream(side)
            for t in (g, x):  # made on main, read on side
                t.record_stream(side)
            grad_weight.record_stream(main)  # made on side, read on main
        else:
            grad_weight = phase_grad_weight(g, x, plan, phases)
            grad_input = tp.phase_grad_input(g, w, plan, phases)
        return grad_input, grad_weight

    for name, fn in (("forward", forward), ("backward", backward)):
        one, two = fn(False), fn(True)
        torch.cuda.synchronize()
        pairs = zip(one, two) if isinstance(one, tuple) else [(one, two)]
        same = all(torch.equal(a, b) for a, b in pairs)
        times = [time_cuda(lambda: fn(s), iters=args.iters).mean_ms for s in (False, True, False, True)]
        print(f"{name}: one stream {times[0]:.4f} / {times[2]:.4f} ms, two streams {times[1]:.4f} / {times[3]:.4f} ms; "
              f"results identical: {same}", flush=True)


if __name__ == "__main__":
    main()
