"""Host time of one driver.Launch call on the GPU, as it is against the call before 5c4ed00 (cuLaunchKernelEx with
ctypes argtypes, byref(config) and libcuda() looked up on every call).

    PYTHONPATH=src python3 benchmarks/diag_driver_call.py [--launches 20000] [--rounds 3]

An empty kernel of two pointers, an int and a long long, launched on the current stream; per round and form the mean
host time of a launch over --launches launches (the GPU synchronised before and after each batch, so that the
queue does not fill), the forms alternating. On the H200 machine (sixty-seventh session, benchmarks/RESULTS.md): 5.38
against 6.12 us by the medians of three rounds; on this project's CPU with a stand-in C function 1.2-1.5 against
1.8-2.1 us.
"""

import argparse
import ctypes
import statistics
import time

import torch

from convt3d.backends import cuda, driver

EMPTY = 'extern "C" __global__ void empty(float* a, float* b, int n, long long m) {}'


class ArgtypesLaunch(driver.Launch):
    """The call before 5c4ed00: its own libcuda handle with cuLaunchKernelEx's argtypes set, the function looked up
    per call on that handle (before 5c4ed00 through libcuda()'s cached call, a little more)."""

    handle = None

    def __call__(self, stream: int, *addresses) -> None:
        if ArgtypesLaunch.handle is None:
            handle = ctypes.CDLL("libcuda.so.1")
            handle.cuLaunchKernelEx.argtypes = [ctypes.POINTER(driver._LaunchConfig), ctypes.c_void_p,
                                                ctypes.c_void_p, ctypes.c_void_p]
            handle.cuLaunchKernelEx.restype = ctypes.c_int
            ArgtypesLaunch.handle = handle
        with self.lock:
            for slot, address in zip(self.slots, addresses):
                slot.value = address
            self.config.stream = stream
            driver.check(ArgtypesLaunch.handle.cuLaunchKernelEx(ctypes.byref(self.config), self.function,
                                                                self.array, None))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--launches", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    kernel = cuda._Kernel(EMPTY, "empty", 0, 32)
    a = torch.empty(16, device="cuda")
    values = [ctypes.c_int(3), ctypes.c_longlong(2**40)]
    forms = {"as now": driver.Launch(kernel.function, (1,), 32, 0, 2, values),
             "before 5c4ed00": ArgtypesLaunch(kernel.function, (1,), 32, 0, 2, values)}
    stream, address = torch.cuda.current_stream().cuda_stream, a.data_ptr()
    results = {name: [] for name in forms}
    for launch in forms.values():
        launch(stream, address, address)
    for _ in range(args.rounds):
        for name, launch in forms.items():
            total = 0.0
            for _ in range(args.launches // 1000):
                torch.cuda.synchronize()
                start = time.perf_counter()
                for _ in range(1000):
                    launch(stream, address, address)
                total += time.perf_counter() - start
            torch.cuda.synchronize()
            results[name].append(total / (args.launches // 1000 * 1000) * 1e6)
            print(name, f"{results[name][-1]:.3f} us a launch", flush=True)
    for name, times in results.items():
        print(f"{name}: median {statistics.median(times):.3f} us a launch over {args.rounds} rounds "
              f"({', '.join(f'{t:.3f}' for t in times)})")


if __name__ == "__main__":
    main()
