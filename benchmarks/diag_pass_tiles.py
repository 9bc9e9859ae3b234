"""The per-tensor FP16 operand pass (backends/triton/tensor_scaled.py) in other tile shapes and warp counts, against
plain conversions of the same input, on sweep layers (GPU).

    PYTHONPATH=src python3 benchmarks/diag_pass_tiles.py [--iters 100] [--rounds 2] [--layers video_k3s2p1op1,...]
        [--variants 256x8x1,128x4x2,...]

A variant BLOCK_S x NUM_WARPS x PROGRAMS_PER_SM sets those of tensor_scaled.py (input tiles of 64 channels by BLOCK_S
positions, held in registers by programs of NUM_WARPS warps, up to PROGRAMS_PER_SM of them resident per
multiprocessor); the library's is 256x8x1. Rows per layer and variant, bench.protocol.time_cuda's cold-L2 mean and
minimum in ms (the median over rounds, variants taking turns in each round): the pass alone (its operands checked
equal to the library's, its sync words cleared), and the whole backend="triton" call with that pass. Beside them, as
references, the same input converted to float16 by PyTorch: as it is (x.half(), 6 bytes an element moved) and into
the channels-last layout the pass writes.
"""

import argparse
import statistics

import torch

import convt3d
from convt3d.backends import triton as triton_backend
from convt3d.backends.triton import forward, tensor_scaled
from convt3d.bench.protocol import time_cuda
from convt3d.bench.report import markdown_table
from convt3d.bench.workloads import sweep_layers

LIBRARY = (tensor_scaled.BLOCK_S, tensor_scaled.NUM_WARPS, tensor_scaled.PROGRAMS_PER_SM)


def use(variant):
    """Make the pass of later calls this variant's: the module's constants set, the caches that hold passes emptied."""
    tensor_scaled.BLOCK_S, tensor_scaled.NUM_WARPS, tensor_scaled.PROGRAMS_PER_SM = variant
    tensor_scaled._geometry.cache_clear()
    tensor_scaled.operand_pass.cache_clear()
    forward._operand_steps.cache_clear()
    triton_backend._prepared.clear()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--layers", default="video_k3s2p1op1,k3s1p1,vae_k4s2p1,video_spatial_k144,"
                                            "wide_256to128_k3s2,batch1_small_k3s2")
    parser.add_argument("--variants", default="256x8x1,256x16x1,128x4x2,128x8x2,64x4x4")
    args = parser.parse_args()
    variants = [tuple(int(v) for v in text.split("x")) for text in args.variants.split(",")]
    torch.backends.cudnn.allow_tf32 = True
    rows = []
    for layer in sweep_layers(args.layers):
        rows += measure(layer, variants, args)
    use(LIBRARY)
    print(markdown_table(["layer", "what", "pass mean / min ms", "call mean / min ms", "note"], rows))


def measure(layer, variants, args):
    module, x, w, b, _ = layer.kernel_case("cuda")
    plan = layer.plan()
    args_ = (layer.stride, layer.padding, layer.output_padding, layer.groups, layer.dilation)
    rows = []
    half = time_cuda(lambda: x.half(), iters=args.iters)
    channels_last = torch.empty(x.shape, dtype=torch.float16, device=x.device, memory_format=torch.channels_last_3d)
    copy = time_cuda(lambda: channels_last.copy_(x), iters=args.iters)
    rows.append((layer.name, "x.half()", f"{half.mean_ms:.4f} / {half.min_ms:.4f}", "", ""))
    rows.append((layer.name, "channels-last float16 copy_", f"{copy.mean_ms:.4f} / {copy.min_ms:.4f}", "", ""))
    use(LIBRARY)
    if tensor_scaled.operand_precision(x, w, plan.groups, triton_backend.TF32) != tensor_scaled.FP16_TENSOR_SCALED:
        rows.append((layer.name, "the pass does not hold this layer", "", "", ""))
        return rows
    expected = [t.clone() for t in forward._operands(x, w, plan.groups, tensor_scaled.FP16_TENSOR_SCALED)[:2]]
    flat, flat_strides = forward.flat_input(x)
    shapes = (tuple(x.shape), tuple(w.shape))
    device_index = tensor_scaled.cuda_index(x.device)
    timings = {v: ([], []) for v in variants}
    notes = {}
    for _ in range(args.rounds):
        for variant in variants:
            if variant in notes and notes[variant].startswith("failed"):
                continue
            use(variant)
            try:
                x_op, w_op, sync = forward._operands(x, w, plan.groups, tensor_scaled.FP16_TENSOR_SCALED)
                same = all(torch.equal(a, b) for a, b in zip((x_op, w_op), expected))
                launch = tensor_scaled.operand_pass(*shapes, plan.groups, flat_strides, False, device_index)
                pointers = (flat, x_op, w.contiguous(), w_op, sync)
                pass_time = time_cuda(lambda: launch(pointers), iters=args.iters)
                assert tensor_scaled.cleared(sync), "the pass left its counters or posts set"
                call = lambda: convt3d.conv_transpose3d(x, w, b, *args_, backend="triton")  # noqa: E731
                call()
                call_time = time_cuda(call, iters=args.iters)
                programs = tensor_scaled._geometry(*shapes, plan.groups, device_index, True)[0]
                notes[variant] = f"operands {'equal' if same else 'DIFFER'}; {programs} programs"
            except Exception as error:  # a variant whose programs cannot all be resident: say so and go on
                notes[variant] = f"failed: {repr(error)[:80]}"
                continue
            timings[variant][0].append(pass_time)
            timings[variant][1].append(call_time)
    for variant in variants:
        passes, calls = timings[variant]
        label = "{}x{}x{}".format(*variant) + (" (library)" if variant == LIBRARY else "")
        if not passes:
            rows.append((layer.name, label, "", "", notes.get(variant, "")))
            continue
        rows.append((layer.name, label, summary(passes), summary(calls), notes[variant]))
        print(rows[-1], flush=True)
    return rows


def summary(timings):
    return "{:.4f} / {:.4f}".format(statistics.median(t.mean_ms for t in timings),
                                    statistics.median(t.min_ms for t in timings))


if __name__ == "__main__":
    main()
