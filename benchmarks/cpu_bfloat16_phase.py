"""backend="torch" in bfloat16 on the CPU, forward and backward of two layers: the median of 7 wall-clock steps after 3
warm-up steps. For comparing library versions in alternating processes (PYTHONPATH=<old or new>/src); results:
benchmarks/RESULTS.md, fifty-eighth session.

    PYTHONPATH=src python3 benchmarks/cpu_bfloat16_phase.py
"""

import torch, time, convt3d
torch.manual_seed(0)
for shape, w_shape, args in [((2, 32, 8, 16, 16), (32, 16, 3, 3, 3), (2, 1, 1, 1, 1)), ((2, 64, 8, 8, 8), (64, 32, 2, 2, 2), (2, 0, 0, 1, 1))]:
    x = torch.randn(shape, dtype=torch.bfloat16, requires_grad=True); w = torch.randn(w_shape, dtype=torch.bfloat16, requires_grad=True)
    def step():
        y = convt3d.conv_transpose3d(x, w, None, *args, backend="torch"); y.sum().backward()
    for _ in range(3): step()
    ts = []
    for _ in range(7):
        t = time.perf_counter(); step(); ts.append(time.perf_counter() - t)
    print(shape, f"{sorted(ts)[3]*1e3:.1f} ms")
