import gc, sys, torch
import convt3d.bench.runner as runner
from convt3d.bench.workloads import PROBLEM_77
plain = runner._time
def emptied(fn, on_gpu, iters):
    gc.collect(); torch.cuda.empty_cache()
    return plain(fn, on_gpu, iters)
for label, timer in (("as bench", plain), ("cache emptied before each row", emptied), ("as bench again", plain)):
    runner._time = timer
    rows = runner.run_layer(PROBLEM_77, torch.device("cuda"), backward=True, compile=False)
    print(f"\n{label}")
    for r in rows:
        print(f"  {r['implementation'][:45]:45s} {r['mean_ms']:.4f} ± {r['std_ms']:.4f}  driver allocs {r.get('device_allocations')}", flush=True)
