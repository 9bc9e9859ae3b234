"""phase_conv.py's correlation in FP16 (TF32 mode) with its scale's block maxima read in one round of loads (the
library's since the seventy-fourth session: FP16_HELPERS' planes_max) or plane by plane (before), on sweep layers.

    PYTHONPATH=src python3 benchmarks/diag_fp16_scale_rounds.py [--iters 200] [--rounds 3] [--layers a,b,...]

Why: in row_runs.py's kernel on problem 77, reading every depth tap's block maxima in one round rather than plane by
plane (each round waiting for its loads) took part of a 2% gain (seventy-third session). phase_conv.py's kernel, which
serves the other layers' correlations, read them plane by plane. The maxima are the same either way, so each layer's
output must be bitwise the same.

What it found (seventy-fourth session, benchmarks/RESULTS.md): the one round kept. k3s1p1 and batch1_small_k3s2 took
0.0014-0.0020 ms less by the minima in every round (k3s1p1 0.0554-0.0555 ms against 0.0568-0.0569 by the means), the
others moved within their noise; every output bitwise the same.

Rows, per layer: bench.protocol.time_cuda's mean and minimum in ms of the phase path's forward (backend="torch", L2
flushed before each call), the forms alternating each round; each form's output checked against the first's (bitwise;
the allocator's free memory NaN-filled before its first call) and float64; and how many of phase_conv.py's kernels the
layer's forward built (0: it runs none, and the forms are the same code).
"""

import argparse

DEFAULT_LAYERS = "vae_k4s2p1,video_k3s2p1op1,video_spatial_k144,k3s1p1,wide_256to128_k3s2,batch1_small_k3s2"
ONE_ROUND = """        a_scale = pow2_scale(planes_max(block_max, first_row, KD, (long long)DD * XH, HH, first_block, blocks,
                                        max_blocks, lane), a_inverse);
"""
PLANE_BY_PLANE = """        float amax = 0.f;
        for (int kd = 0; kd < KD; kd++)
            amax = fmaxf(amax, plane_max(block_max, first_row + (long long)kd * DD * XH, HH, first_block, blocks,
                                         max_blocks, lane));
        a_scale = pow2_scale(amax, a_inverse);
"""


def poisoned_call(forward, output_shape):
    """forward's output, every block of the CUDA caching allocator that it can take NaN-filled before: its cache
    emptied, then one NaN tensor of four outputs' size freed, which the call's allocations are split from."""
    import torch
    torch.cuda.empty_cache()
    poisoned = torch.full((4, *output_shape), float("nan"), device="cuda")
    del poisoned
    y = forward()
    torch.cuda.synchronize()
    return y


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--layers", default=DEFAULT_LAYERS)
    args = parser.parse_args()
    import torch
    import convt3d
    from convt3d.backends import cuda, torch_phase
    from convt3d.backends.cuda import phase_conv
    from convt3d.bench.protocol import relative_error
    from convt3d.bench.workloads import sweep_layers
    from p77_correlation import Timings, use_row_runs

    library = phase_conv.SOURCE
    if library.count(ONE_ROUND) != 1:
        raise RuntimeError("phase_conv.py's source changed: the FP16 scale's call no longer matches")
    forms = (("one round (library's)", library), ("plane by plane", library.replace(ONE_ROUND, PLANE_BY_PLANE)))

    def use(text):
        phase_conv.SOURCE = text
        cuda._kernel.cache_clear()
        use_row_runs()  # (clears the launches and prepared calls)

    timings = Timings(args.iters)
    torch.backends.cudnn.allow_tf32 = True
    for layer in sweep_layers(args.layers):
        plan = layer.plan()
        _, x, w, b, reference = layer.kernel_case("cuda")
        forward = lambda: convt3d.conv_transpose3d(x, w, b, plan.stride, plan.padding, plan.output_padding,
                                                   plan.groups, plan.dilation, backend="torch")
        expected = None
        for round_ in range(args.rounds):
            for name, text in forms:
                use(text)
                check = ""
                if round_ == 0:
                    y = poisoned_call(forward, plan.output_shape)
                    expected = y if expected is None else expected
                    check = (f"equal to first {bool(torch.equal(y, expected))}, {relative_error(y, reference):.1e}, "
                             f"{cuda._kernel.cache_info().currsize} phase_conv kernels")
                timings.row(layer.name, f"{name} (round {round_ + 1})", forward, check)
    use(library)
    torch_phase._prepared.clear()
    print(timings.table())


if __name__ == "__main__":
    main()
