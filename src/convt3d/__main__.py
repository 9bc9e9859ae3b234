"""`python -m convt3d bench` (also the `convt3d` command)."""

from __future__ import annotations

import argparse
import sys

import torch

from .bench.report import environment, summary_text, sweep_summary, table, write_json, write_plot
from .bench.runner import run_layer
from .bench.workloads import PROBLEM_77, load_sweep, parse_config, sweep_layers

CPU_BATCH = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="convt3d", description="convt3d: fast ConvTranspose3d for PyTorch")
    sub = parser.add_subparsers(dest="command", required=True)
    bench = sub.add_parser("bench", help="measure convt3d against PyTorch the way KernelBench does")
    what = bench.add_mutually_exclusive_group()
    what.add_argument("--config", help="a layer as JSON (inline or file): fields of convt3d.bench.workloads.Layer; "
                                       "default: KernelBench level-1 problem 77")
    what.add_argument("--sweep", nargs="?", const="", metavar="PATH",
                      help="run the public sweep (convt3d/bench/sweep.json, benchmarks/sweep.json in a checkout) "
                           "or the layers of the JSON file PATH")
    bench.add_argument("--layers", metavar="NAMES",
                       help="with --sweep: only the sweep's layers of these comma-separated names, in that order")
    bench.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                       help="cuda (default; falls back to cpu without a GPU) or cpu")
    bench.add_argument("--backward", action="store_true", help="also time forward+backward")
    bench.add_argument("--no-compile", action="store_true", help="leave out the torch.compile row")
    bench.add_argument("--iters", type=int, default=None, help="timed calls (default 100 on CUDA, 5 on the CPU)")
    bench.add_argument("--cpu-batch", type=int, default=CPU_BATCH,
                       help=f"batch size used on the CPU (default {CPU_BATCH})")
    bench.add_argument("--settle", type=float, default=None, metavar="SECONDS",
                       help="seconds the host is left idle between a layer's checks (compiling, autotuning) and its "
                            "timings, after collecting Python's garbage (default 3 on CUDA, 0 on the CPU: no "
                            "collection, no idle)")
    bench.add_argument("--json", metavar="PATH", help="write environment and rows as JSON")
    bench.add_argument("--plot", metavar="PATH", help="write a PNG chart of the latencies")
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.layers is not None and args.sweep is None:
            raise ValueError("--layers names layers of a sweep: pass --sweep too")
        if args.sweep is None:
            layers = [parse_config(args.config) if args.config else PROBLEM_77]
        elif args.layers is None:
            layers = load_sweep(args.sweep or None)
        else:
            layers = sweep_layers(args.layers, args.sweep or None)
        if args.iters is not None and args.iters < 2:
            raise ValueError(f"--iters must be at least 2, got {args.iters}")
        if args.settle is not None and args.settle < 0:
            raise ValueError(f"--settle must be 0 or more seconds, got {args.settle}")
        if args.cpu_batch < 1:
            raise ValueError(f"--cpu-batch must be at least 1, got {args.cpu_batch}")
    except (ValueError, TypeError) as error:
        print(f"convt3d bench: error: {error}", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("convt3d bench: no CUDA device here; running on the CPU instead. GPU timings need CUDA.", file=sys.stderr)
        device = torch.device("cpu")
    if device.type == "cpu":
        layers = [layer.with_batch(min(args.cpu_batch, layer.input_shape[0])) for layer in layers]
        print(f"CPU mode: batch reduced to {layers[0].input_shape[0]} (--cpu-batch); wall-clock timing, "
              f"{torch.get_num_threads()} threads. GPU timings need CUDA.")
    env = environment(device)
    settings = "".join(f" | {name}={value}" for name, value in env["settings"].items())
    print(f"{env['device']} | torch {env['torch']} | triton {env['triton']} | cuDNN {env['cudnn']} | {env['date']}"
          f"{settings}")
    rows = []
    for i, layer in enumerate(layers, 1):
        print(f"[{i}/{len(layers)}] {layer.describe()}", file=sys.stderr, flush=True)
        layer_rows = run_layer(layer, device, backward=args.backward, compile=not args.no_compile, iters=args.iters,
                               log=lambda msg: print(f"    {msg}", file=sys.stderr, flush=True),
                               settle_s=args.settle)
        if len(layers) > 1:
            for r in layer_rows:
                r["layer"] = layer.name
        rows += layer_rows
        if args.json and len(layers) > 1:  # the layers so far, should a long sweep be cut short
            write_json(args.json, env, rows, [vars(done) for done in layers[:i]], sweep_summary(rows))
    if len(layers) == 1:
        print(layers[0].describe())
    print(table(rows))
    summary = sweep_summary(rows) if len(layers) > 1 else None
    if summary:
        print(summary_text(summary))
    workload = [vars(layer) for layer in layers] if len(layers) > 1 else vars(layers[0])
    if args.json:
        write_json(args.json, env, rows, workload, summary)
        print(f"wrote {args.json}")
    if args.plot:
        title = layers[0].describe() if len(layers) == 1 else f"{len(layers)} layers"
        write_plot(args.plot, rows, f"{title}\n{env['device']}, torch {env['torch']}")
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
