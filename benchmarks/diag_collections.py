"""Where the garbage collector's work lands in the bench's timed calls (GPU machine).

In the forty-second session (benchmarks/RESULTS.md) video_spatial_k144's `auto` row was slower than eager in a third
sweep running, its slow calls waiting on the host. In one instrumented run the slowest held a 3.9 ms generation-1
collection. A gc.collect() before each implementation's timed calls removed the collections from them, but ~5-8 ms of
slow host calls followed each collection and fell on the row timed next. This script runs the bench's rows
(bench.runner.run_layer) of some layers, each variant in a fresh process, and prints every row's mean and minimum and
its slowest calls (Timing.slow_calls: ms / host ms, gcN where generation N was collected in the call):

- plain: the bench as it is. Since 3afff9a the runner collects once after a layer's checks, before the host idles,
  so that what follows the collection falls in the idle time (the forty-third session's "settle" variant, measured
  at fa1d54c against the bench without it);
- freeze: plain, then gc.freeze() before the idle, so that later collections leave every object alive then
  unexamined;
- autotune: plain, and a gc.collect() after each Triton autotuning (forward._autotune) and each timing of auto's
  candidates (functional._fastest), inside the first call that runs them, which compiles and takes seconds anyway.

    PYTHONPATH=src python3 benchmarks/diag_collections.py [--variants plain,freeze,autotune] [--layers a,b] [--iters 100]
"""

import argparse
import gc
import json
import subprocess
import sys
import time

import torch

from convt3d import functional
from convt3d.backends.triton import forward
from convt3d.bench import runner
from convt3d.bench.report import slow_calls_text
from convt3d.bench.workloads import sweep_layers

FIRST_FIVE = "unet3d_k2s2,unet3d_k2s2_deep,vae_k4s2p1,video_k3s2p1op1,video_spatial_k144"


class _FreezeBeforeSleep:
    """The time module as runner sees it, with sleep preceded by gc.freeze() (after the runner's collection)."""

    def __getattr__(self, name):
        return getattr(time, name)

    @staticmethod
    def sleep(seconds):
        gc.freeze()
        time.sleep(seconds)


def _collecting_after(function):
    def collected(*args, **kwargs):
        result = function(*args, **kwargs)
        gc.collect()
        return result

    return collected


def run_variant(variant: str, layers: str, iters: int) -> list[dict]:
    """The bench's rows of the layers under one variant, in this process."""
    if variant == "freeze":
        runner.time = _FreezeBeforeSleep()
    elif variant == "autotune":
        forward._autotune = _collecting_after(forward._autotune)
        functional._fastest = _collecting_after(functional._fastest)
    elif variant != "plain":
        raise ValueError(f"unknown variant {variant!r}")
    rows = []
    for layer in sweep_layers(layers):
        for row in runner.run_layer(layer, torch.device("cuda"), compile=False, iters=iters):
            if "host_ms" in row:  # the timed implementations (not the floors)
                rows.append(dict(layer=layer.name, **{k: row.get(k) for k in (
                    "implementation", "mean_ms", "min_ms", "host_ms", "slow_calls")}))
    return rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--variants", default="plain,freeze,autotune")
    parser.add_argument("--layers", default=FIRST_FIVE)
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--one", help=argparse.SUPPRESS)  # run one variant here, print its rows as JSON
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_variant(args.one, args.layers, args.iters)))
        return
    for variant in args.variants.split(","):
        done = subprocess.run([sys.executable, __file__, "--one", variant, "--layers", args.layers,
                               "--iters", str(args.iters)], capture_output=True, text=True)
        if done.returncode != 0:
            print(f"{variant}: failed\n{done.stderr[-2000:]}", flush=True)
            continue
        print(f"\n{variant}:\n| layer | implementation | mean ms | min ms | slowest calls (call: ms / host ms) |\n"
              "|---|---|---|---|---|")
        for row in json.loads(done.stdout.splitlines()[-1]):
            print(f"| {row['layer']} | {row['implementation']} | {row['mean_ms']:.4f} | {row['min_ms']:.4f} | "
                  f"{slow_calls_text(row['slow_calls'] or [])} |", flush=True)


if __name__ == "__main__":
    main()
