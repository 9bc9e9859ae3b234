"""A Triton module call's host time with this session's two host changes on and off, in one process (GPU machine).

    PYTHONPATH=src python3 benchmarks/diag_prepared_call.py [--rounds 5] [--calls 200] [--layers batch1_small_k3s2,...]

(Its GPU run, benchmarks/RESULTS.md's thirty-fifth session, was at c7c44ec, where it toggled the kernel modules'
launches_at_addresses; these toggle BoundLaunch.at_addresses, with the same effect on prepare().)

Per layer (backend="triton", grad mode on and the parameters requiring grad, as KernelBench times a module), four
forms taking turns over several rounds: the prepared call launched through tensors (BoundLaunch, views of the
operands' buffer) or at addresses (BoundLaunch.at_addresses), and the autograd node recorded through
Function.apply or its C++ apply (ops._c_apply). Per form: the median over rounds of the median host time from a
synchronisation to the call's return, and of the bench's cold-L2 mean (KernelBench's timing, 30 calls).
"""

import argparse
import statistics

import convt3d.backends.triton as triton_backend
from convt3d import convert, ops
from convt3d.backends.triton import launch
from convt3d.bench.protocol import host_time_cuda, time_cuda
from convt3d.bench.report import markdown_table
from convt3d.bench.workloads import sweep_layers


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--layers", default="batch1_small_k3s2,unet3d_k2s2,video_k3s2p1op1")
    args = parser.parse_args()
    records = {"Function.apply": ops._EagerConvTranspose3d.apply, "C++ apply": ops._c_apply(ops._EagerConvTranspose3d)}
    at_addresses = launch.BoundLaunch.at_addresses
    rows = []
    for layer in sweep_layers(args.layers):
        module, x, _, _, _ = layer.kernel_case("cuda")
        ours = convert(module, backend="triton")
        samples = {}
        for round_ in range(args.rounds):
            for by_addresses in (False, True):
                for record_name, record in records.items():
                    # No launch at addresses: prepare() returns the call through tensors.
                    launch.BoundLaunch.at_addresses = at_addresses if by_addresses else (lambda *a: None)
                    triton_backend._prepared.clear()
                    ops._record_eager_call = record
                    ours(x)  # the whole path, which prepares the call in this form
                    ours(x)
                    host = host_time_cuda(lambda: ours(x), args.calls) * 1e3
                    cold = time_cuda(lambda: ours(x), iters=30).mean_ms
                    form = ("addresses" if by_addresses else "tensors", record_name)
                    samples.setdefault(form, []).append((host, cold))
        eager_host = host_time_cuda(lambda: module(x), args.calls) * 1e3
        for (launched_by, record_name), values in samples.items():
            rows.append((layer.name, launched_by, record_name, f"{statistics.median(v[0] for v in values):.1f}",
                         f"{statistics.median(v[1] for v in values):.4f}", f"{eager_host:.1f}"))
            print(rows[-1], flush=True)
    print(markdown_table(["layer", "prepared call launched by", "node recorded by", "host us (median)",
                          "cold-L2 mean ms", "eager module host us"], rows))


if __name__ == "__main__":
    main()
