"""The disk cache of the CUDA kernels of our own (backends/cuda/kernel_cache.py), with no GPU needed: torch's two
private steps, NVRTC's compile and the module's load, are stood in for by fakes that record their calls (a compile
returns fresh random bytes, NULs and newlines among them; a load returns the bytes it loaded); the last test holds
the cache to torch's own _compile_kernel on the torch installed (gpu_session.sh runs this file on the GPU machine's)."""

import logging
import os
import random
import threading

import pytest
import torch

from convt3d.backends import cuda
from convt3d.backends.cuda import kernel_cache

SOURCE = 'extern "C" __global__ void axpy(float* y, const float* x) { y[threadIdx.x] += x[threadIdx.x]; }'


class FakeTorchSteps:
    """torch.cuda._utils._nvrtc_compile and _cuda_load_module: each compile is recorded and returns random bytes;
    a load of bytes in refuse raises as the driver does on a damaged image."""

    def __init__(self):
        self.compiled, self.loaded, self.refuse, self.lock = [], [], set(), threading.Lock()

    def nvrtc_compile(self, source, name, compute_capability, *options):  # (torch's _compile_kernel passes 5)
        binary = bytes(random.randrange(256) for _ in range(random.randrange(100, 2000))) + b"\0\n"
        with self.lock:
            self.compiled.append((source, name, compute_capability, binary))
        return binary, name

    def load_module(self, binary, names):
        if binary in self.refuse:
            raise RuntimeError("CUDA error: device kernel image is invalid")
        with self.lock:
            self.loaded.append(binary)
        return {names[0]: ("kernel", names[0], binary)}


@pytest.fixture
def steps(monkeypatch):
    fake = FakeTorchSteps()
    monkeypatch.setattr(torch.cuda._utils, "_nvrtc_compile", fake.nvrtc_compile, raising=False)
    monkeypatch.setattr(torch.cuda._utils, "_cuda_load_module", fake.load_module, raising=False)
    monkeypatch.setattr(kernel_cache, "_nvrtc_version", lambda: "12.9")
    return fake


def _files(directory):
    return sorted(os.listdir(directory))


def test_a_kernel_compiled_once_loads_from_the_file_afterwards(steps, tmp_path):
    """The first compile runs NVRTC and writes one file; every later one (a new process reads the same file: the
    module keeps nothing in memory) loads the bytes NVRTC returned, bitwise, without compiling."""
    first = kernel_cache.compile_kernel(str(tmp_path), SOURCE, "axpy", "90a")
    assert len(steps.compiled) == 1 and first == ("kernel", "axpy", steps.compiled[0][3])
    assert len(_files(tmp_path)) == 1
    for _ in range(2):
        assert kernel_cache.compile_kernel(str(tmp_path), SOURCE, "axpy", "90a") == first
    assert len(steps.compiled) == 1 and steps.loaded == [first[2]] * 3


def test_the_least_recently_used_files_beyond_the_limit_are_removed(steps, tmp_path, monkeypatch):
    """With MAX_FILES kept, a write removes the files least recently written or read beyond it: here kernels a, b, c
    written at times 1, 2, 3 (set), a read again (now), then d written: b goes, and a compiles no more."""
    monkeypatch.setattr(kernel_cache, "MAX_FILES", 3)
    sources = {name: SOURCE.replace("axpy", name) for name in "abcd"}
    path = lambda name: kernel_cache._path(str(tmp_path), sources[name], name, "90a")
    for time, name in enumerate("abc", 1):
        kernel_cache.compile_kernel(str(tmp_path), sources[name], name, "90a")
        os.utime(path(name), ns=(time * 10**9, time * 10**9))
    kernel_cache.compile_kernel(str(tmp_path), sources["a"], "a", "90a")
    assert len(steps.compiled) == 3 and len(_files(tmp_path)) == 3
    kernel_cache.compile_kernel(str(tmp_path), sources["d"], "d", "90a")
    assert _files(tmp_path) == sorted(os.path.basename(path(name)) for name in "acd")
    kernel_cache.compile_kernel(str(tmp_path), sources["a"], "a", "90a")
    assert [name for _, name, _, _ in steps.compiled] == ["a", "b", "c", "d"]


def test_the_file_differs_with_each_thing_that_decides_the_binary(steps, tmp_path, monkeypatch):
    """Another source, kernel name, architecture, torch version or NVRTC version compiles anew into its own file."""
    kernel_cache.compile_kernel(str(tmp_path), SOURCE, "axpy", "90a")
    kernel_cache.compile_kernel(str(tmp_path), SOURCE.replace("+=", "-="), "axpy", "90a")
    kernel_cache.compile_kernel(str(tmp_path), SOURCE.replace("axpy", "axpy2"), "axpy2", "90a")
    kernel_cache.compile_kernel(str(tmp_path), SOURCE, "axpy", "100a")
    monkeypatch.setattr(torch, "__version__", torch.__version__ + "+other")
    kernel_cache.compile_kernel(str(tmp_path), SOURCE, "axpy", "90a")
    monkeypatch.setattr(kernel_cache, "_nvrtc_version", lambda: "13.0")
    kernel_cache.compile_kernel(str(tmp_path), SOURCE, "axpy", "90a")
    assert len(steps.compiled) == 6 and len(_files(tmp_path)) == 6


@pytest.mark.parametrize("damage", ["truncated", "other_file", "empty", "refused_by_the_driver"])
def test_a_damaged_file_is_compiled_again_and_replaced(damage, steps, tmp_path):
    kernel_cache.compile_kernel(str(tmp_path), SOURCE, "axpy", "90a")
    (name,) = _files(tmp_path)
    path = tmp_path / name
    data = path.read_bytes()
    if damage == "truncated":
        path.write_bytes(data[:-1])
    elif damage == "other_file":
        path.write_bytes(b"#!/bin/sh\n" + data)
    elif damage == "empty":
        path.write_bytes(b"")
    else:
        steps.refuse.add(steps.compiled[0][3])
    kernel = kernel_cache.compile_kernel(str(tmp_path), SOURCE, "axpy", "90a")
    assert len(steps.compiled) == 2 and kernel == ("kernel", "axpy", steps.compiled[1][3])
    assert _files(tmp_path) == [name]
    assert kernel_cache.compile_kernel(str(tmp_path), SOURCE, "axpy", "90a") == kernel and len(steps.compiled) == 2


def test_what_does_not_compile_or_load_is_raised_and_not_kept(steps, tmp_path, monkeypatch):
    """A source that NVRTC rejects raises as torch's compile would (the caller falls back to cuDNN), once: NVRTC's
    error as torch's _nvrtc_compile words it, not compiled again by torch's own _compile_kernel. A binary that does
    not load is not written, so that no later process reads it (that failure is met twice: the cache's steps, then
    torch's own _compile_kernel, whose error is raised)."""
    if not hasattr(torch.cuda, "_compile_kernel"):  # (then convt3d's CUDA kernels stay off and nothing calls this)
        pytest.skip("this torch has no torch.cuda._compile_kernel (2.7 had none; 2.9 has it)")
    compiles = []

    def failing(*args):
        compiles.append(args)
        raise RuntimeError("Kernel compilation failed:\nkernel.cu(1): error: identifier \"x\" is undefined")

    monkeypatch.setattr(torch.cuda._utils, "_nvrtc_compile", failing)
    with pytest.raises(RuntimeError, match="compilation failed"):
        kernel_cache.compile_kernel(str(tmp_path), SOURCE, "axpy", "90a")
    assert len(compiles) == 1
    monkeypatch.setattr(torch.cuda._utils, "_nvrtc_compile", steps.nvrtc_compile)

    def refusing(binary, names):
        raise RuntimeError("CUDA error: device kernel image is invalid")

    monkeypatch.setattr(torch.cuda._utils, "_cuda_load_module", refusing)
    with pytest.raises(RuntimeError, match="image is invalid"):
        kernel_cache.compile_kernel(str(tmp_path), SOURCE, "axpy", "90a")
    assert len(steps.compiled) == 2 and _files(tmp_path) == []


def test_ptx_alone_from_an_older_torch_is_loaded_by_the_kernels_name_and_kept(steps, tmp_path, monkeypatch):
    """Older torch's _nvrtc_compile returned the PTX alone (no mangled name): the kernel is loaded by the name given,
    as that torch's _compile_kernel loaded it (our kernels are extern "C"), and kept like any other."""
    compile_pair = steps.nvrtc_compile
    monkeypatch.setattr(torch.cuda._utils, "_nvrtc_compile", lambda *args: compile_pair(*args)[0])
    first = kernel_cache.compile_kernel(str(tmp_path), SOURCE, "axpy", "90a")
    assert first == ("kernel", "axpy", steps.compiled[0][3])
    assert kernel_cache.compile_kernel(str(tmp_path), SOURCE, "axpy", "90a") == first and len(steps.compiled) == 1


def test_steps_that_fail_unexpectedly_leave_the_compile_to_torch(steps, tmp_path, monkeypatch, caplog):
    """Private steps whose form changed (here a compile that returns three values) cost the cache, not the kernel:
    torch's own _compile_kernel serves, and the reason is logged at debug level."""
    monkeypatch.setattr(torch.cuda._utils, "_nvrtc_compile", lambda *args: (b"cubin", "axpy", "extra"))
    monkeypatch.setattr(torch.cuda, "_compile_kernel", lambda source, name, compute_capability=None: ("torch's", name),
                        raising=False)
    with caplog.at_level(logging.DEBUG, logger="convt3d"):
        assert kernel_cache.compile_kernel(str(tmp_path), SOURCE, "axpy", "90a") == ("torch's", "axpy")
    assert "torch.cuda._compile_kernel compiles it" in caplog.text and _files(tmp_path) == []


def test_a_directory_that_cannot_be_written_costs_only_the_cache(steps, tmp_path, caplog):
    """(A path below a plain file: no directory can be made there, also for root.)"""
    blocker = tmp_path / "a_file"
    blocker.write_bytes(b"")
    with caplog.at_level(logging.DEBUG, logger="convt3d"):
        for _ in range(2):
            kernel = kernel_cache.compile_kernel(str(blocker / "cache"), SOURCE, "axpy", "90a")
            assert kernel == ("kernel", "axpy", steps.compiled[-1][3])
    assert len(steps.compiled) == 2 and "could not keep the compiled kernel" in caplog.text


def test_threads_compiling_one_kernel_leave_one_whole_file(steps, tmp_path):
    """Eight threads at once (as cuda.compiled_together's, or the ranks of a data-parallel job): each gets a kernel,
    and one whole file is left, no temporary one."""
    kernels = [None] * 8
    barrier = threading.Barrier(8)

    def compile_one(index):
        barrier.wait()
        kernels[index] = kernel_cache.compile_kernel(str(tmp_path), SOURCE, "axpy", "90a")

    threads = [threading.Thread(target=compile_one, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(kernel is not None for kernel in kernels)
    (name,) = _files(tmp_path)
    assert kernel_cache._read(str(tmp_path / name))[1] in {binary for *_, binary in steps.compiled}


def test_a_load_that_gives_a_module_is_taken_as_torch_takes_it(steps, tmp_path, monkeypatch):
    """_cuda_load_module may give a module with the kernels as attributes rather than a dict of them
    (torch.cuda._compile_kernel takes either): the kernel is that attribute, compiled or read from the file."""
    import types

    load = steps.load_module
    monkeypatch.setattr(torch.cuda._utils, "_cuda_load_module",
                        lambda binary, names: types.SimpleNamespace(**load(binary, names)))
    first = kernel_cache.compile_kernel(str(tmp_path), SOURCE, "axpy", "90a")
    assert first == ("kernel", "axpy", steps.compiled[0][3])
    assert kernel_cache.compile_kernel(str(tmp_path), SOURCE, "axpy", "90a") == first and len(steps.compiled) == 1


def test_the_cuda_backend_compiles_through_the_cache_where_it_is_set(tmp_path, monkeypatch):
    """cuda._compile_kernel(): the cache in CACHE_DIR where set and torch has both steps; else torch's own
    _compile_kernel; None where torch lacks that."""
    def torch_compile_kernel(source, name, compute_capability=None):
        return ("torch's", name)

    monkeypatch.setattr(torch.cuda, "_compile_kernel", torch_compile_kernel, raising=False)
    monkeypatch.setattr(torch.cuda._utils, "_nvrtc_compile", lambda *args: (b"cubin", args[1]), raising=False)
    monkeypatch.setattr(torch.cuda._utils, "_cuda_load_module", lambda binary, names: {names[0]: ("cached", binary)},
                        raising=False)
    monkeypatch.setattr(cuda, "CACHE_DIR", str(tmp_path))
    assert cuda._compile_kernel()(SOURCE, "axpy", compute_capability="90a") == ("cached", b"cubin")
    assert len(_files(tmp_path)) == 1
    monkeypatch.setattr(cuda, "CACHE_DIR", "")
    assert cuda._compile_kernel() is torch_compile_kernel
    monkeypatch.setattr(cuda, "CACHE_DIR", str(tmp_path))
    monkeypatch.delattr(torch.cuda._utils, "_nvrtc_compile")
    assert cuda._compile_kernel() is torch_compile_kernel
    monkeypatch.delattr(torch.cuda, "_compile_kernel")
    assert cuda._compile_kernel() is None


def test_the_default_directory_follows_xdg(monkeypatch, tmp_path):
    """$XDG_CACHE_HOME/convt3d where that is absolute, else ~/.cache/convt3d; none where there is no home."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert kernel_cache.default_directory() == str(tmp_path / "convt3d")
    home_cache = os.path.join(os.path.expanduser("~"), ".cache", "convt3d")
    monkeypatch.setenv("XDG_CACHE_HOME", "relative")
    assert kernel_cache.default_directory() == home_cache
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert kernel_cache.default_directory() == home_cache
    monkeypatch.setattr(os.path, "expanduser", lambda path: path)  # (no home: not a folder named ~ in the cwd)
    assert kernel_cache.default_directory() == ""


def test_the_cache_compiles_and_loads_as_torchs_own_compile_kernel(monkeypatch, tmp_path):
    """With the torch installed (2.13 here, 2.11 on the GPU machine): torch.cuda._compile_kernel and the cache, on a
    miss, make the same calls of the two steps (NVRTC's compile with the same arguments, defaults filled in, so that
    an option torch added would show; the load of what it returned) and return the kernel the load gave: a cached
    kernel is the one torch would have compiled."""
    import inspect

    if getattr(torch.cuda, "_compile_kernel", None) is None or not kernel_cache.available():
        pytest.skip("this torch has no _compile_kernel or not the two steps it takes")
    signature = inspect.signature(torch.cuda._utils._nvrtc_compile)
    # What this torch's step returns, as it declares: (binary, mangled name) since torch 2.11; the PTX alone before
    # (torch 2.9, whose _compile_kernel loads it by the name as given).
    returns_name = "tuple" in str(signature.return_annotation)
    calls = []

    def nvrtc_compile(*args, **kwargs):
        arguments = signature.bind(*args, **kwargs)
        arguments.apply_defaults()
        calls.append(("compile", dict(arguments.arguments)))
        binary = b"binary of " + arguments.arguments["kernel_name"].encode()
        return (binary, "mangled") if returns_name else binary

    def load_module(binary, names):
        calls.append(("load", binary, list(names)))
        return {names[0]: ("loaded", binary)}

    monkeypatch.setattr(torch.cuda._utils, "_nvrtc_compile", nvrtc_compile)
    monkeypatch.setattr(torch.cuda._utils, "_cuda_load_module", load_module)
    torchs = torch.cuda._compile_kernel(SOURCE, "axpy", compute_capability="90a")
    torchs_calls = list(calls)
    calls.clear()
    ours = kernel_cache.compile_kernel(str(tmp_path), SOURCE, "axpy", "90a")
    assert ours == torchs == ("loaded", b"binary of axpy")
    assert calls == torchs_calls and [c[0] for c in calls] == ["compile", "load"], (calls, torchs_calls)
