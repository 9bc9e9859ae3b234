"""How fast the multiprocessors can read from the L2: every program reads a buffer that the L2 holds (read once
before, no flush), REPEAT times over, and keeps a sum so that nothing is optimised away. The figure to hold a
kernel's bytes from the L2 against (row_runs.py's correlation reads about 190 KB a program).

    PYTHONPATH=src python3 benchmarks/diag_l2_bandwidth.py [--mb 16 24] [--programs 132 264 528]
"""

import argparse

import torch
import triton
import triton.language as tl


@triton.jit
def _read(x_ptr, out_ptr, numel, REPEAT: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for r in range(REPEAT):
        # program pid starts at its own offset, so that the programs spread over the L2's slices
        for start in range(0, numel, BLOCK):
            offs = (start + (pid * BLOCK * 7 + r * BLOCK) % numel + tl.arange(0, BLOCK)) % numel
            acc += tl.load(x_ptr + offs)
    tl.store(out_ptr + pid * BLOCK + tl.arange(0, BLOCK), acc)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, nargs="+", default=[8, 24])
    parser.add_argument("--programs", type=int, nargs="+", default=[132, 264, 528])
    args = parser.parse_args()
    block, repeat = 4096, 1
    for mb in args.mb:
        numel = mb * 2 ** 20 // 4
        x = torch.rand(numel, device="cuda")
        for programs in args.programs:
            out = torch.empty(programs * block, device="cuda")
            run = lambda: _read[(programs,)](x, out, numel, REPEAT=repeat, BLOCK=block, num_warps=8)
            for _ in range(3):
                run()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(20):
                run()
            end.record()
            torch.cuda.synchronize()
            ms = start.elapsed_time(end) / 20
            tb_s = programs * numel * 4 * repeat / (ms * 1e-3) / 1e12
            print(f"buffer {mb} MB, {programs} programs each reading it whole: {ms:.4f} ms, {tb_s:.2f} TB/s", flush=True)


if __name__ == "__main__":
    main()
