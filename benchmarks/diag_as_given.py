"""The Triton forward on small layers: operand pass then main kernel, against the main kernel reading the layer's
tensors as given (one launch), in one process (GPU machine).

    PYTHONPATH=src python3 benchmarks/diag_as_given.py [--rounds 3] [--iters 30] [--calls 100]
        [--layers batch1_small_k3s2,...] [--batches 1,4,16] [--tf32 on,off]

Per layer of the sweep, at each batch size given, and per precision mode (backend="triton", grad mode on and the
parameters requiring grad, as KernelBench times a module): the two forms take turns over several rounds, each
autotuning its own tile config on its first call (forward.AS_GIVEN_ELEMENTS 0: always the pass; very large: always
as given). Per form: the median over rounds of the bench's cold-L2 mean and minimum (KernelBench's timing) and of the
median host time of a call; eager's module in the same rounds. Each form's output, NaN-poisoned before its first
call, is checked against eager (KernelBench's check) and against float64, and the two forms' outputs against each
other (the same config gives the same bits; autotuning may choose different configs).
"""

import argparse
import statistics

import torch

import convt3d.backends.triton as triton_backend
from convt3d import convert
from convt3d.backends.triton import forward
from convt3d.bench.protocol import (host_time_cuda, kernelbench_check, nan_poisoned_allocations, relative_error,
                                    time_cuda)
from convt3d.bench.report import markdown_table
from convt3d.bench.workloads import sweep_layers

FORMS = {"operand pass": 0, "as given": 2**62}
LIBRARY_DEFAULT = forward.AS_GIVEN_ELEMENTS


def use_form(form: str) -> None:
    """Later calls take this form: the bound launches and prepared calls of the other forgotten, configs kept (their
    keys differ by form)."""
    forward.AS_GIVEN_ELEMENTS = FORMS[form]
    forward._chosen.clear()
    triton_backend._prepared.clear()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--layers", default="batch1_small_k3s2")
    parser.add_argument("--batches", default="1,4,16")
    parser.add_argument("--tf32", default="on,off")
    args = parser.parse_args()
    rows = []
    for tf32 in args.tf32.split(","):
        torch.backends.cudnn.allow_tf32 = tf32 == "on"
        for base in sweep_layers(args.layers):
            for batch in map(int, args.batches.split(",")):
                layer = base.with_batch(batch)
                module, x, w, _, reference = layer.kernel_case("cuda")
                label = f"{layer.name} N={batch} ({x.numel() + w.numel()} elements), TF32 {tf32}"
                ours = convert(module, backend="triton")
                expected = module(x)
                samples = {form: [] for form in (*FORMS, "eager")}
                checks, outputs = {}, {}
                for round_ in range(args.rounds):
                    for form in FORMS:
                        use_form(form)
                        if round_ == 0:
                            with nan_poisoned_allocations():
                                out = ours(x)  # the whole path, poisoned, then the prepared call
                            checks[form] = (kernelbench_check(out, expected), relative_error(out, reference))
                            outputs[form] = out
                            # (the key's strides: strides_as_given's, None where the pass ran)
                            assert [key[4] is not None for key in forward._chosen] == [form == "as given"]
                        ours(x)
                        ours(x)
                        cold = time_cuda(lambda: ours(x), iters=args.iters)
                        host = host_time_cuda(lambda: ours(x), args.calls) * 1e3
                        samples[form].append((cold.mean_ms, cold.min_ms, host))
                    cold = time_cuda(lambda: module(x), iters=args.iters)
                    samples["eager"].append((cold.mean_ms, cold.min_ms,
                                             host_time_cuda(lambda: module(x), args.calls) * 1e3))
                same = torch.equal(*outputs.values())
                for form, values in samples.items():
                    check, error = checks.get(form, ("", ""))
                    mean, minimum, host = (statistics.median(v[i] for v in values) for i in range(3))
                    rows.append((label, form, f"{mean:.4f}", f"{minimum:.4f}", f"{host:.1f}", check,
                                 error if error == "" else f"{error:.1e}", same if form == "as given" else ""))
                    print(rows[-1], flush=True)
    forward.AS_GIVEN_ELEMENTS = LIBRARY_DEFAULT
    print(markdown_table(["layer", "form", "cold-L2 mean ms", "cold-L2 min ms", "host us", "KernelBench check",
                          "rel. err. fp64", "bitwise as the pass"], rows))


if __name__ == "__main__":
    main()
