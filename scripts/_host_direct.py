import statistics, time, torch
from convt3d.backends import torch_phase as tp
from convt3d.plan import make_plan
x = torch.rand(16, 32, 16, 32, 32, device="cuda"); w = torch.rand(32, 64, 3, 3, 3, device="cuda")
plan = make_plan(tuple(x.shape), tuple(w.shape), stride=2, padding=1, dilation=2)
((phases, index),) = tp._backward_phases(plan)
lat = torch.randn(plan.output_shape, device="cuda")[index].contiguous()
def host_us(fn, calls=20):
    s = []
    for _ in range(5):
        torch.cuda.synchronize(); t = time.perf_counter()
        for _ in range(calls): fn()
        s.append((time.perf_counter() - t) / calls * 1e6)
    torch.cuda.synchronize(); return statistics.median(s)
real = tp.cudnn_direct
for name, direct in (("aten", False), ("direct", True), ("aten", False), ("direct", True)):
    tp.cudnn_direct = real if direct else (lambda *a: False)
    print(f"host us {name}: forward phase conv {host_us(lambda: tp._phase_conv_transposed(x, w, None, plan, phases)):.1f}, grad_input {host_us(lambda: tp.phase_grad_input(lat, w, plan, phases, direct=True)):.1f}", flush=True)
tp.cudnn_direct = real
