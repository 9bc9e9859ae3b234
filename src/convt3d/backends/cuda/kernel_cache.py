"""NVRTC's output for the CUDA kernels of our own, kept on disk, so that a new process loads a kernel compiled before
rather than compiling it again (0.3-0.8 s a kernel on the project's 2-core CPU, 0.8-0.9 s for a new input shape's
first call on the H200's machine), as Triton keeps its kernels.

compile_kernel does what torch.cuda._compile_kernel does, in its two steps, torch.cuda._utils._nvrtc_compile (the
source to a cubin and its mangled name, or to PTX alone on older torch) and _cuda_load_module, with the file between
them; where those steps fail, torch's _compile_kernel itself compiles the kernel, uncached. A file is named by a
hash of all that decides its bytes: the source, the kernel's name, the architecture, torch's version and CUDA's,
and NVRTC's own version. It is written under a temporary name and renamed into place, so that another thread or
process (each rank of a data-parallel job compiles the same kernels) never reads half of one. A file that does not
read back or load is compiled again and replaced; a directory that cannot be written costs only the cache. A directory
keeps at most MAX_FILES kernels: each write removes the least recently used beyond them.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import tempfile

import torch
from torch.cuda import _utils as torch_utils  # (torch's NVRTC and module-loading helpers; importing it starts no CUDA)

logger = logging.getLogger("convt3d")

_MAGIC = b"convt3d cuda kernel 1\n"
# The kernel files a directory keeps: row_runs.py's forward is compiled per input shape where it reads the input
# itself, so that a process of ever new shapes would otherwise fill the disk (problem 77's kernels: 30-47 KB each).
MAX_FILES = 1000
# How torch's _nvrtc_compile's error begins where NVRTC rejected the source (its log follows).
_REJECTED = "Kernel compilation failed"


def default_directory() -> str:
    """$XDG_CACHE_HOME/convt3d, or ~/.cache/convt3d (the XDG base directories: a relative XDG_CACHE_HOME is ignored);
    "" (no cache) where there is no home to put it in."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):
        base = os.path.expanduser(os.path.join("~", ".cache"))
    return os.path.join(base, "convt3d") if os.path.isabs(base) else ""


def available() -> bool:
    """Whether this torch has the two steps compile_kernel takes (private API: each version may lack them)."""
    return all(callable(getattr(torch_utils, name, None)) for name in ("_nvrtc_compile", "_cuda_load_module"))


def compile_kernel(directory: str, source: str, name: str, compute_capability: str):
    """torch.cuda._compile_kernel(source, name, compute_capability=...)'s kernel, its binary read from directory
    where an earlier compile wrote it there, else compiled by NVRTC and written there. Where that fails (torch's
    private steps may change with its version) torch's own _compile_kernel compiles it, so that the cache never
    costs a kernel. A source that NVRTC rejects is raised at once: torch's compile would reject it too, after as
    long again."""
    try:
        return _compile_kept(directory, source, name, compute_capability)
    except Exception as error:  # noqa: BLE001 (any other failure on the way: torch's own compile decides)
        if isinstance(error, RuntimeError) and str(error).startswith(_REJECTED):
            raise
        logger.debug("convt3d: the kernel cache did not give %s (%s); torch.cuda._compile_kernel compiles it", name,
                     error)
    return torch.cuda._compile_kernel(source, name, compute_capability=compute_capability)


def _compile_kept(directory: str, source: str, name: str, compute_capability: str):
    path = _path(directory, source, name, compute_capability)
    cached = _read(path)
    if cached is not None:
        _touch(path)  # (used now: the last that _prune removes)
        mangled_name, binary = cached
        try:
            return _load(binary, mangled_name)
        except Exception as error:  # noqa: BLE001 (a damaged or foreign file: compile it again)
            logger.debug("convt3d: the cached kernel %s did not load (%s); compiling it again", path, error)
    return load_binary(directory, source, name, compute_capability, *compile_binary(source, name, compute_capability))


def compile_binary(source: str, name: str, compute_capability: str) -> tuple[bytes, str]:
    """NVRTC's binary of the kernel and its mangled name, torch's first step: work for the CPU alone, which needs no
    CUDA context, so that threads can run it side by side (cuda.compiled_together)."""
    compiled = torch_utils._nvrtc_compile(source, name, compute_capability)
    # (binary, mangled name); before that torch returned the PTX alone, loaded by the name as given (extern "C").
    return compiled if isinstance(compiled, tuple) else (compiled, name)


def load_binary(directory: str, source: str, name: str, compute_capability: str, binary: bytes, mangled_name: str):
    """The kernel of a binary that compile_binary made, loaded on the calling thread (it needs the device's context
    current), and kept in directory where one is set (only what loaded)."""
    kernel = _load(binary, mangled_name)
    if directory:
        _write(_path(directory, source, name, compute_capability), mangled_name, binary)
    return kernel


def cached(directory: str, source: str, name: str, compute_capability: str) -> bool:
    """Whether directory holds the kernel's file (files appear whole: _write renames them into place). Not read here:
    its load reads it, and one that is damaged is compiled again there."""
    return bool(directory) and os.path.isfile(_path(directory, source, name, compute_capability))


def _load(binary: bytes, mangled_name: str):
    """The kernel from the loaded module, as torch.cuda._compile_kernel takes it: _cuda_load_module gives a dict of
    the kernels named, or (as torch's code allows) a module that has them as attributes."""
    loaded = torch_utils._cuda_load_module(binary, [mangled_name])
    return loaded[mangled_name] if isinstance(loaded, dict) else getattr(loaded, mangled_name)


def _path(directory: str, source: str, name: str, compute_capability: str) -> str:
    return os.path.join(directory, _key(source, name, compute_capability) + ".bin")


def _key(source: str, name: str, compute_capability: str) -> str:
    fields = (source, name, compute_capability, torch.__version__, str(torch.version.cuda), _nvrtc_version())
    return hashlib.sha256("\0".join(fields).encode()).hexdigest()


@functools.lru_cache(maxsize=1)
def _nvrtc_version() -> str:
    """The NVRTC library's version as torch finds it (a system one may differ from torch's CUDA), or "unknown"."""
    try:
        major, minor = ctypes.c_int(), ctypes.c_int()
        if torch_utils._get_nvrtc_library().nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)) == 0:
            return f"{major.value}.{minor.value}"
    except Exception:  # noqa: BLE001 (private API or no NVRTC here: the compile itself reports what fails)
        pass
    return "unknown"


def _read(path: str):
    """(mangled name, binary) from a file _write wrote, or None where there is none or it is not whole."""
    try:
        with open(path, "rb") as file:
            data = file.read()
    except OSError:
        return None
    if not data.startswith(_MAGIC):
        return None
    header, separator, binary = data[len(_MAGIC):].partition(b"\n")
    try:
        mangled_name, size = header.decode().split(" ")
        size = int(size)
    except ValueError:
        return None
    if not separator or not binary or size != len(binary):
        return None
    return mangled_name, binary


def _write(path: str, mangled_name: str, binary: bytes) -> None:
    directory = os.path.dirname(path)
    try:
        os.makedirs(directory, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=directory, prefix=".writing-")
        try:
            with os.fdopen(handle, "wb") as file:
                file.write(_MAGIC + f"{mangled_name} {len(binary)}\n".encode() + binary)
            os.replace(temporary, path)
        except BaseException:
            os.unlink(temporary)
            raise
    except OSError as error:
        logger.debug("convt3d: could not keep the compiled kernel in %s (%s)", directory, error)
        return
    _prune(directory)


def _touch(path: str) -> None:
    try:
        os.utime(path)
    except OSError:
        pass


def _prune(directory: str) -> None:
    """Removes the least recently used kernel files beyond MAX_FILES (by their times: written, or last read by
    _compile_kept). Another process may remove or read them meanwhile: a file gone is skipped, and a kernel whose file
    is gone is compiled again."""
    try:
        entries = [entry for entry in os.scandir(directory) if entry.name.endswith(".bin")]
        if len(entries) <= MAX_FILES:
            return
        times = {}
        for entry in entries:
            try:
                times[entry.path] = entry.stat().st_mtime_ns
            except OSError:
                pass
        for path in sorted(times, key=times.get)[:len(times) - MAX_FILES]:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
    except OSError as error:
        logger.debug("convt3d: could not prune the kernel cache in %s (%s)", directory, error)
