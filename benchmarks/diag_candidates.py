"""backend="triton" end to end with the tap_columns kernel's candidate configs as the library has them and with extra
configs among them, each form autotuning its own choice, on sweep layers (GPU).

    PYTHONPATH=src python3 benchmarks/diag_candidates.py [--iters 100] [--rounds 2] [--modes tf32,off]
        [--layers video_k3s2p1op1,...] [--extra 64x128x64w4s2,128x128x64w8s2]

--extra: tap_columns configs (BLOCK_M x BLOCK_N x BLOCK_CI w<warps> s<stages>) added to the library's candidates in the
form "extra". The two forms take turns in each round; before each, the Triton backend's chosen configs and prepared
calls are forgotten, so that the form's first call autotunes among its own candidates. Rows: bench.protocol.time_cuda's
cold-L2 mean and minimum in ms (the median over rounds), the config chosen in each round, and KernelBench's check
against eager in the same mode with the float64 error.
"""

import argparse
import pathlib
import statistics
import sys

import torch

import convt3d
from convt3d.backends import triton as triton_backend
from convt3d.backends.triton import forward, next_power_of_2, tap_columns
from convt3d.bench.protocol import kernelbench_check, relative_error, time_cuda
from convt3d.bench.report import markdown_table
from convt3d.bench.workloads import DTYPES, sweep_layers

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from diag_tap_columns import parse_configs  # noqa: E402

LIBRARY_CONFIGS = tap_columns.configs
FORMS = {"library": LIBRARY_CONFIGS}


def with_extra(extra):
    """The library's configs function with these (BLOCK_M, BLOCK_N, BLOCK_CI, warps, stages) added, deduplicated as
    the library deduplicates its own (by what they come to for the layer)."""
    def configs(plan=None):
        candidates = LIBRARY_CONFIGS() + [
            dict(KERNEL="tap_columns", BLOCK_M=m, BLOCK_N=n, BLOCK_CI=ci, num_warps=w, num_stages=st)
            for m, n, ci, w, st in extra]
        if plan is None:
            return candidates
        kept, seen = [], set()
        for cfg in candidates:
            block_ci = max(16, min(cfg["BLOCK_CI"], next_power_of_2(plan.in_channels // plan.groups)))
            tiles = (cfg["BLOCK_M"], tap_columns.column_layout(plan, cfg["BLOCK_N"]), block_ci, cfg["num_warps"],
                     cfg["num_stages"])
            if tiles not in seen:
                seen.add(tiles)
                kept.append(cfg)
        return kept
    return configs


def use(form):
    tap_columns.configs = FORMS[form]
    forward._best_config.clear()
    forward._chosen.clear()
    triton_backend._prepared.clear()


def label(cfg):
    if cfg.get("KERNEL") == "tap_columns":
        return "tap {BLOCK_M}x{BLOCK_N}x{BLOCK_CI} w{num_warps} s{num_stages}".format(**cfg)
    return "general {BLOCK_M}x{BLOCK_CO}x{BLOCK_CI} w{num_warps} s{num_stages}".format(**cfg)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--modes", default="tf32")
    parser.add_argument("--layers", default="video_k3s2p1op1,k3s1p1,vae_k4s2p1,video_spatial_k144,wide_256to128_k3s2,"
                                            "vae_k4s2p1_fp16,batch1_small_k3s2,batch32_k3s2")
    parser.add_argument("--extra", type=parse_configs, default=parse_configs("64x128x64w4s2,128x128x64w8s2"))
    args = parser.parse_args()
    FORMS["extra"] = with_extra(args.extra)
    rows = []
    for layer in sweep_layers(args.layers):
        for mode in args.modes.split(",") if DTYPES[layer.dtype] == torch.float32 else ["tf32"]:
            torch.backends.cudnn.allow_tf32 = mode == "tf32"
            rows += measure(layer, mode, args)
    torch.backends.cudnn.allow_tf32 = True
    use("library")
    print(markdown_table(["layer (mode)", "candidates", "mean / min ms", "chosen", "check, rel. err."], rows))


def measure(layer, mode, args):
    module, x, w, b, reference = layer.kernel_case("cuda")
    layer_args = (layer.stride, layer.padding, layer.output_padding, layer.groups, layer.dilation)
    with torch.no_grad():
        expected = module(x)
    call = lambda: convt3d.conv_transpose3d(x, w, b, *layer_args, backend="triton")  # noqa: E731
    timings = {form: [] for form in FORMS}
    chosen = {form: [] for form in FORMS}
    checks = {}
    for _ in range(args.rounds):
        for form in FORMS:
            use(form)
            out = call()
            checks[form] = f"KB {kernelbench_check(out, expected)}, {relative_error(out, reference):.1e}"
            chosen[form] += sorted({label(cfg) for cfg in forward._best_config.values()})
            timings[form].append(time_cuda(call, iters=args.iters))
    rows = []
    for form in FORMS:
        mean = statistics.median(t.mean_ms for t in timings[form])
        fastest = statistics.median(t.min_ms for t in timings[form])
        rows.append((f"{layer.name} ({mode})", form, f"{mean:.4f} / {fastest:.4f}", "; ".join(chosen[form]),
                     checks[form]))
        print(rows[-1], flush=True)
    return rows


if __name__ == "__main__":
    main()
