"""CUDA C++ kernels of our own, compiled at run time by NVRTC, for what Triton does not reach: on Hopper's wgmma
tensor-core instructions, the phase correlation (phase_conv.py; in FP16 and 3xFP16 for 32 input channels into blocks
of 64 over grids one column block wide, row_runs.py's) and a phase's weight gradient (grad_weight.py).

Compiled through torch.cuda._compile_kernel (a private API, in torch 2.9 and later, run on the GPU with 2.11 only; so
every failure to find or use it falls back to cuDNN, logged at debug level), once per configuration, kept on disk for
later processes (kernel_cache.py, CONVT3D_CACHE_DIR), and launched here through the driver (driver.Launch) with
argument arrays built once per launch geometry: the compiled kernel's own call builds them anew and loads libcuda on
every launch, host time that shows on the GPU machine.

Set CONVT3D_CUDA_KERNELS=0 (or cuda.ENABLED = False) to use cuDNN instead. In TF32 mode the phase correlation computes
in FP16 on operands scaled by powers of two (FP16, phase_conv.py's SPLIT 3: rounded as TF32 rounds them wherever a
value lies within 2^29 of the largest its tile reads); CONVT3D_TF32_AS_FP16=0 (or cuda.TF32_SPLIT = 0) takes TF32
itself. With TF32 off it splits its operands in FP16 parts (3xFP16); CONVT3D_SPLIT=1 (or cuda.SPLIT = 1) takes TF32
parts instead (3xTF32, twice the MMAs). CONVT3D_ROW_RUNS=0 (or cuda.ROW_RUNS = False) keeps phase_conv.py's kernel
where row_runs.py's would serve; CONVT3D_DIRECT_INPUT=0 (or cuda.DIRECT_INPUT = False) has row_runs.py's forward read
the operand pass's window rather than the input itself. row_runs.py's kernel fills the output around a layer's only
phase itself rather than after a fill of the whole output: with TF32 off, and in TF32 mode where a second warpgroup of
each program does it (row_runs.fill_warpgroup, which with TF32 off serves every such phase); CONVT3D_REGION_FILL=1 (or
cuda.REGION_FILL = True) has it do so in TF32 mode wherever it computes such a phase, CONVT3D_REGION_FILL=0 (False)
nowhere.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import os
from concurrent.futures import ThreadPoolExecutor

import torch

from ... import environment
from .. import cudnn_allow_tf32, driver
from ..triton import cdiv  # (these two import no Triton)
from ..triton.launch import _current_stream
from . import grad_weight, kernel_cache, phase_conv, row_runs

logger = logging.getLogger("convt3d")

ENABLED = environment.switch("CONVT3D_CUDA_KERNELS", True)
# The phase correlation's precision with TF32 off (phase_conv.py's SPLIT): 1 (3xTF32) or 2 (3xFP16).
SPLIT = environment.choice("CONVT3D_SPLIT", {"1": 1, "2": 2}, "2")
# Its precision in TF32 mode: 3 (FP16 on operands scaled by powers of two: TF32's 11 significant bits at twice its
# MMA rate, phase_conv.py) or 0 (TF32 itself, CONVT3D_TF32_AS_FP16=0).
TF32_SPLIT = 3 if environment.switch("CONVT3D_TF32_AS_FP16", True) else 0
# Whether correlations of 32 input channels into blocks of 64 output channels over grids one column block wide run
# row_runs.py's kernel (FP16 and 3xFP16) rather than phase_conv.py's; CONVT3D_ROW_RUNS=0 takes phase_conv.py's. Set
# before a layer's first call: its launches are worked out once (tile_rows, phase_launches).
ROW_RUNS = environment.switch("CONVT3D_ROW_RUNS", True)
# Whether row_runs.py's kernel, in the forward in FP16, reads its planes straight from an input whose rows are
# contiguous rather than from the operand pass's window (row_runs.py, INPUT_DIRECT; reads_input); CONVT3D_DIRECT_INPUT=0
# keeps the window. That kernel is compiled per input geometry (sizes and strides; not the batch): on the H200 a new
# input shape's first call took 0.8-0.9 s.
DIRECT_INPUT = environment.switch("CONVT3D_DIRECT_INPUT", True)
# Whether row_runs.py's kernel, where it computes a layer's only phase (problem 77), fills the rest of the output itself
# (row_runs.py, REGION_FILL; phases.region_fill says where) rather than after a fill of the whole output: True, False,
# or None (the default): with TF32 off (3xFP16), and in TF32 mode (FP16) where a fill warpgroup does it
# (row_runs.fill_warpgroup: N up to 136; with TF32 off it always does). Problem 77's forward with TF32 off took
# 0.2997-0.3003 ms with the fill in the computing warps against 0.3469-0.3490 on the H200 (seventy-ninth session), and
# by a fill warpgroup 0.3417-0.3440 (median) against 0.3494-0.3500 and 0.410-0.415 on an H100 (eightieth); in TF32
# mode, by a fill warpgroup, 0.2933-0.2944 against 0.3384-0.3436 with a fill first on an H100 and, on a noisy H200,
# medians of 0.250-0.283 against 0.268-0.310 (fastest calls 0.233-0.235 against 0.256-0.261), where the fill in the
# computing warps, which the shorter FP16 correlation hid less of, took 0.352 on the H100 and 0.275-0.284 at the
# fastest on the H200 (benchmarks/diag_region_fill.py, seventy-ninth and eightieth sessions).
REGION_FILL = environment.switch("CONVT3D_REGION_FILL", None)
# Whether a prepared forward launches row_runs.py's kernel as its operand pass's dependent (programmatic dependent
# launch: the pass lets it start once all the pass's programs have begun; its fill warpgroup, which reads nothing the
# pass writes, fills at once, and its computing warpgroup waits for the pass's writes, griddepcontrol.wait):
# CONVT3D_CUDA_DEPENDENT=0 launches it after the pass. With row_runs.PLANE_MAXIMA (a pass of 64 programs for problem 77)
# the forward took 0.2669-0.2686 ms so on an H100 against 0.2698-0.2702 (benchmarks/diag_pass_share.py, ninety-third
# session); with the pass's maxima (its programs fill the GPU), 0.2767-0.2773 against 0.2773-0.2781.
DEPENDENT = environment.switch("CONVT3D_CUDA_DEPENDENT", True)
# Where compiled kernels are kept for later processes (kernel_cache.py): CONVT3D_CACHE_DIR, by default
# $XDG_CACHE_HOME/convt3d or ~/.cache/convt3d; an empty CONVT3D_CACHE_DIR (or cuda.CACHE_DIR = "") keeps none.
CACHE_DIR = os.environ.get("CONVT3D_CACHE_DIR", kernel_cache.default_directory())

# Hopper (sm_90a: wgmma); the same SASS would not run on later architectures.
ARCHITECTURE = (9, 0)
TILE_COLUMNS = 32
MAX_SHARED_BYTES = 227 * 1024


def phase_conv_unsupported(device: torch.device, dtype: torch.dtype, c_in: int, c_out: int, groups: int, taps,
                           dilation, split: int = 0, batch: int = 1, grid=(1, 1, 1)) -> str | None:
    """None when phase_conv.py's wgmma phase correlation serves a correlation of c_in -> c_out channels with these
    taps and tap dilations on this device, in TF32 (split 0), 3xTF32 (1), 3xFP16 (2) or FP16 (3), over batch x grid
    (the tile it compiles for), else a short reason: correlation_unsupported's, or a failure to compile it."""
    reason = correlation_unsupported(device, dtype, c_in, c_out, groups, taps, dilation, split)
    if reason is not None:
        return reason
    try:  # compiled here, once per layer (the callers cache this answer), so that a failure falls back to cuDNN
        _kernel(device.index if device.index is not None else torch.cuda.current_device(), c_in, c_out, tuple(taps),
                tuple(dilation), False, split, tile_rows(c_in, c_out, tuple(taps), tuple(dilation), split, batch,
                                                         tuple(grid)))
    except Exception as error:  # noqa: BLE001 (NVRTC, the driver or torch's private API: any failure means cuDNN)
        return f"compiling the kernel failed: {error}"
    return None


def correlation_unsupported(device: torch.device, dtype: torch.dtype, c_in: int, c_out: int, groups: int, taps,
                            dilation, split: int = 0) -> str | None:
    """phase_conv_unsupported without compiling: None where the settings, the channels and the shared memory allow
    the correlation, else why not. The caller compiles the kernels it launches (correlation_kernel) before relying
    on them."""
    reason = _unsupported_setting(device, dtype, groups, tf32_only=False)
    if reason is not None:
        return reason
    reason = phase_conv_channels_unsupported(c_in, c_out)
    if reason is not None:
        return reason
    if _compile_kernel() is None:
        return "torch.cuda._compile_kernel is missing"
    if config(c_in, c_out, tuple(taps), tuple(dilation), split) is None:
        return "the taps' window plane does not fit in shared memory"
    return None


def phase_conv_channels_unsupported(c_in: int, c_out: int) -> str | None:
    """None when the phase correlation's source serves c_in -> c_out channels, else why not."""
    if c_in not in (32, 64, 128) or c_out % 8 or not (c_out <= 64 or c_out % 64 == 0):
        return f"channels {c_in} -> {c_out} (needs 32, 64 or 128 in, a multiple of 8 up to 64, or of 64, out)"
    return None


def grad_weight_channels_unsupported(c_in: int, c_out: int) -> str | None:
    """None when the weight gradient's source serves c_in -> c_out channels, else why not."""
    if c_in % 16 or c_out % 8 or not (c_out <= 64 or c_out % 64 == 0):
        return f"channels {c_in} -> {c_out} (needs a multiple of 16 in, a multiple of 8 up to 64, or of 64, out)"
    return None


def _unsupported_setting(device: torch.device, dtype: torch.dtype, groups: int, tf32_only: bool) -> str | None:
    """What both kernels need: enabled, an sm_90 GPU, float32 (in TF32 mode if tf32_only), one group."""
    if not ENABLED:
        return "CONVT3D_CUDA_KERNELS=0"
    if device.type != "cuda" or _capability(device.index or 0) != ARCHITECTURE:
        return f"needs an sm_90 GPU (Hopper), got {device}"
    if dtype != torch.float32:
        return "float32 only"
    if tf32_only and not cudnn_allow_tf32():
        return "TF32 mode only (torch.backends.cudnn.allow_tf32)"
    if groups != 1:
        return "groups > 1"
    return None


@functools.lru_cache(maxsize=None)
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def _compile_kernel():
    """torch.cuda._compile_kernel, or None where torch lacks it; through the disk cache (kernel_cache.py) where
    CACHE_DIR is set and torch has the steps it takes."""
    compile_kernel = getattr(torch.cuda, "_compile_kernel", None)
    if compile_kernel is not None and CACHE_DIR and kernel_cache.available():
        return functools.partial(kernel_cache.compile_kernel, CACHE_DIR)
    return compile_kernel


@functools.lru_cache(maxsize=1024)
def config(c_in: int, c_out: int, taps, dilation, split: int = 0):
    """(tile rows BH, output channels per program, shared bytes, input channels per weight stage) or None: the most
    rows (up to 8; with TF32 off (split 1: 3xTF32, 2: 3xFP16) 2, or as many as keep SLABS x COB x C_IN / 32 within
    64 x split: ptxas spilled registers beyond, compiled here for sm_90a; 3xFP16 takes 4 rows on problem 77's
    forward and grad_input, the forward's correlation 0.261 ms into the lattice where 2 rows took 0.292,
    twenty-fifth session) whose program's shared memory lets two programs share a multiprocessor, else one. Up to
    64 input channels a weight stage holds a tap's every channel; with 128, 64 or 32 of them (the most that fit
    beside the plane), as a stage of 128 would leave room for no plane. On the H200,
    problem 77's forward correlation took 0.157 ms with 8 rows, 0.167 with 4 and 0.561 with 16 (one program per
    multiprocessor); its grad_input's about 0.24 with 4 rows and 0.283 with 8 (one program per multiprocessor;
    benchmarks/RESULTS.md, twelfth session). A correlation runs with tile_rows' rows: these, or fewer on a small
    grid."""
    cob = min(c_out, 64)
    units = (c_in,) if c_in <= 64 else (64, 32)
    for limit in (MAX_SHARED_BYTES // 2 - 1024, MAX_SHARED_BYTES):
        for rows in (8, 4, 2):
            if split in (1, 2) and rows > 2 and rows // 2 * cob * c_in // 32 > 64 * split:  # (rows // 2: SLABS)
                continue
            for unit in units:
                smem = phase_conv.shared_bytes(c_in, cob, taps, dilation, rows, split, unit)
                if smem <= limit:
                    return rows, cob, smem, unit
    return None


# Programs that keep an H200 (132 multiprocessors, two programs each) busy: tile_rows halves the tile's rows while
# a correlation's grid has fewer.
FULL_GRID = 2 * 132


@functools.lru_cache(maxsize=1024)
def tile_rows(c_in: int, c_out: int, taps, dilation, split: int, batch: int, grid) -> int:
    """The rows of a program's tile for a correlation over batch x grid (QD, QH, QW): config()'s (the most that fit),
    halved down to 2 while the programs would number fewer than FULL_GRID, so that a small layer's correlation
    spreads over every multiprocessor (at 8 rows a sweep layer's phase had 64-128 programs). Where row_runs.py's
    kernel may serve (_row_runs_layer), its rows."""
    if _row_runs_layer(c_in, c_out, split, grid):
        return row_runs.ROWS
    rows, cob = config(c_in, c_out, taps, dilation, split)[:2]
    while rows > 2 and _programs(batch, grid, rows, c_out, cob) < FULL_GRID:
        rows //= 2
    return rows


def _row_runs_layer(c_in: int, c_out: int, split: int, grid) -> bool:
    """Whether row_runs.py's kernel may serve a correlation: 32 input channels, whole blocks of 64 output channels,
    FP16 or 3xFP16, a grid one column block wide. It does where the window's width and the taps also allow
    (_row_runs_kernel)."""
    return ROW_RUNS and c_in == 32 and c_out % 64 == 0 and split in (2, 3) and grid[2] <= TILE_COLUMNS


@functools.lru_cache(maxsize=256)
def _row_runs_kernel(device_index: int, c_out: int, taps, dilation, window_columns: int, has_bias: bool,
                     split: int, input_geometry=None, region=None):
    """row_runs.py's kernel for a layer that _row_runs_layer admits (reading the input itself, of input_geometry,
    where given, and filling the output's region, where given: row_runs.source's), or None where its N (ROWS rows of
    the window) or its shared memory (two programs a multiprocessor) would not fit, or where it does not compile
    (logged)."""
    spec = _row_runs_spec(c_out, taps, dilation, window_columns, has_bias, split, input_geometry, region)
    if spec is None:
        return None
    try:
        with torch.cuda.device(device_index):
            return _Kernel(*spec)
    except Exception as error:  # noqa: BLE001 (NVRTC, the driver or torch's private API: phase_conv.py's serves)
        logger.debug("convt3d: row_runs kernel not used (%s)", error)
        return None


def _row_runs_spec(c_out: int, taps, dilation, window_columns: int, has_bias: bool, split: int,
                   input_geometry=None, region=None):
    """_Kernel's arguments for _row_runs_kernel, or None where the kernel does not fit."""
    if row_runs.positions(window_columns) > row_runs.MAX_POSITIONS[split]:
        return None
    shared = row_runs.shared_bytes(taps, dilation, window_columns, split)
    if shared > MAX_SHARED_BYTES // 2 - 1024:
        return None
    return (row_runs.source(c_out, taps, dilation, window_columns, has_bias, split, input_geometry, region),
            "phase_conv_rows", shared, row_runs.block_threads(split, window_columns, region, input_geometry))


def _programs(batch: int, grid, rows: int, c_out: int, cob: int) -> int:
    """The programs of a correlation over batch x grid: tiles of rows x TILE_COLUMNS positions and cob channels."""
    return batch * grid[0] * cdiv(grid[1], rows) * cdiv(grid[2], TILE_COLUMNS) * (c_out // cob)


class _Kernel:
    """A compiled kernel and its launches (driver.Launch), kept per grid and argument values: the compiled kernel's
    own call builds its argument array anew and loads libcuda on every launch, host time that shows on the GPU
    machine. Compiled here, on the current device, unless compiled_together compiled it already."""

    def __init__(self, source: str, name: str, shared_bytes: int, threads: int):
        key = (torch.cuda.current_device(), source, name)
        kernel = _precompiled.pop(key, None)
        if kernel is None:
            kernel = _compile_kernel()(source, name, compute_capability="90a")
        kernel.set_shared_memory_config(shared_bytes)
        _compiled.add(key)
        self.function = kernel.func
        self._keep = kernel  # holds the module loaded
        self.shared_bytes = shared_bytes
        self.threads = threads
        # Whether it may be launched as the dependent of the launch before it: it waits for that launch's writes.
        self.waits_for_previous = "griddepcontrol.wait" in source
        self._launches = {}

    def launch(self, grid: int, pointers, ints, longs, stream: int, table=(), dependent: bool = False) -> None:
        """pointers: device addresses (ints), then the int and the long long arguments, in the kernel's order, then
        (where given) table: long longs that the kernel takes by value as one array (a struct) after them; dependent:
        launched as the dependent of the launch before it (only a kernel that waits_for_previous)."""
        if dependent and not self.waits_for_previous:
            raise ValueError("convt3d: a kernel that does not wait for the launch before it launched as its dependent")
        key = (grid, ints, longs, table, dependent)
        launch = self._launches.get(key)
        if launch is None:
            if len(self._launches) >= 64:
                self._launches.clear()
            values = [ctypes.c_int(v) for v in ints] + [ctypes.c_longlong(v) for v in longs]
            if table:
                values.append((ctypes.c_longlong * len(table))(*table))
            launch = self._launches[key] = driver.Launch(self.function, (grid,), self.threads, self.shared_bytes,
                                                         len(pointers), values, dependent=dependent)
        launch(stream, *pointers)


# Kernels that compiled_together compiled, per (device, source, name), until a _Kernel takes them; and the keys of
# every _Kernel made, which compiled_together leaves alone.
_precompiled: dict = {}
_compiled: set = set()


@contextlib.contextmanager
def compiled_together(device_index: int, specs):
    """Compiles the kernels of specs (_Kernel's arguments) not compiled or kept on disk yet at the same time, for the
    _Kernels made inside the with block: a k3 s2 layer's forward launches eight, one a phase. NVRTC compiles them side
    by side, a thread each up to the CPU's cores (on the project's 2-core CPU in 0.70 s against 1.38 one after the
    other in FP16, 0.92 against 1.72 in 3xFP16, the same cubins: benchmarks/cpu_first_call_compiles.py), and each is
    loaded here, on the calling thread: a worker thread has no CUDA context current, and loads there failed on the
    H200 (seventy-second session), so that each kernel was compiled again on this thread. Needs torch's two steps
    (kernel_cache.available); the loaded kernels are kept in CACHE_DIR as _Kernel's compiles keep them. A kernel that
    fails here is left to its _Kernel, which compiles it again and reports the failure as before (logged at debug
    level here); what the block does not take is dropped at its end."""
    wanted = {(source, name) for source, name, _, _ in specs if (device_index, source, name) not in _compiled
              and not kernel_cache.cached(CACHE_DIR, source, name, "90a")}
    if len(wanted) > 1 and kernel_cache.available():
        with ThreadPoolExecutor(min(len(wanted), os.cpu_count() or 1)) as pool:
            futures = {pool.submit(kernel_cache.compile_binary, source, name, "90a"): (source, name)
                       for source, name in wanted}
        with torch.cuda.device(device_index):
            for future, (source, name) in futures.items():
                try:
                    _precompiled[(device_index, source, name)] = kernel_cache.load_binary(
                        CACHE_DIR, source, name, "90a", *future.result())
                except Exception as error:  # noqa: BLE001 (its _Kernel compiles it again and reports what fails)
                    logger.debug("convt3d: compiling %s beside others failed (%s)", name, error)
    try:
        yield
    finally:
        _precompiled.clear()


@functools.lru_cache(maxsize=256)
def _kernel(device_index: int, c_in: int, c_out: int, taps, dilation, has_bias: bool, split: int,
            rows: int) -> _Kernel:
    with torch.cuda.device(device_index):
        return _Kernel(*_phase_conv_spec(c_in, c_out, taps, dilation, has_bias, split, rows))


def _phase_conv_spec(c_in: int, c_out: int, taps, dilation, has_bias: bool, split: int, rows: int):
    """_Kernel's arguments for _kernel."""
    _, cob, _, unit = config(c_in, c_out, taps, dilation, split)
    smem = phase_conv.shared_bytes(c_in, cob, taps, dilation, rows, split, unit)
    return phase_conv.source(c_in, c_out, cob, taps, dilation, rows, has_bias, split, unit), "phase_conv", smem, 128


def window_extent(c_in: int, c_out: int, grid, taps, dilation, offsets, split: int = 0,
                  batch: int = 1) -> tuple[int, int, int]:
    """The window sizes (depth, rows, columns) that a correlation over batch x grid (QD, QH, QW) reads from offsets on
    (its first position in the window): whole tiles of rows and columns, so that partial tiles read inside it too."""
    rows = tile_rows(c_in, c_out, tuple(taps), tuple(dilation), split, batch, tuple(grid))
    (qd, qh, qw), (kd, kh, kw), (dd, dh, dw) = grid, taps, dilation
    return (offsets[0] + qd + (kd - 1) * dd, offsets[1] + cdiv(qh, rows) * rows + (kh - 1) * dh,
            offsets[2] + cdiv(qw, TILE_COLUMNS) * TILE_COLUMNS + (kw - 1) * dw)


def correlate(window: torch.Tensor, weight_taps: torch.Tensor, bias, out: torch.Tensor, out_offset: int, out_strides,
              grid, offsets, taps, first_taps, tap_steps, dilation, scales=None, split=None, direct=None) -> None:
    """out (float32) at element out_offset with out_strides, over grid (QD, QH, QW) x C_out: the correlation of
    phase_conv.py plus bias. window: (N, XD, XH, XW, C_in) with XD, XH, XW at least window_extent(...); weight_taps:
    (kD, kH, kW, C_out, C_in) of the whole kernel, contiguous, TF32-rounded like the window (TF32), or (2, kD, kH,
    kW, C_out, C_in), its hi and lo parts, with the window as it is (3xTF32), or float16 (kD, kH, kW, C_out, 2 C_in),
    its scaled FP16 parts, with the window as it is and scales (3xFP16: window.correlation_operands' block maxima,
    their block's columns and the weight's inverse scales); first_taps, tap_steps: per axis the correlation's first
    kernel tap and the step between its taps. split: the precision, None for the one the operands imply (TF32,
    3xTF32 or 3xFP16); FP16 (3) takes 3xFP16's operands and reads their hi parts alone. direct: correlate_phases'."""
    correlate_phases(window, weight_taps, bias, out, out_strides, grid, taps, dilation,
                     ((*offsets, *first_taps, *tap_steps, out_offset),), scales, split, direct=direct)


def correlate_phases(window: torch.Tensor, weight_taps: torch.Tensor, bias, out: torch.Tensor, out_strides, grid,
                     taps, dilation, phases, scales=None, split=None, direct=None, region=None) -> None:
    """correlate for several correlations of the same grid, tap counts and dilation (phases of one layer), each
    (window offsets, first taps, tap steps: three each, then its element offset in out): one launch per
    phase_conv.MAX_PHASES of them. Their window extent: window_extent's with batch N x len(phases). direct (where
    reads_input allows it): (the window's shape, phase_launches' input_geometry), and window is the input itself.
    region (phases.region_fill's, for the layer's only phase): row_runs.py's kernel fills the rest of out too."""
    if split is None:
        split = 2 if weight_taps.dtype == torch.float16 else int(weight_taps.dim() == 6)
    window_shape, input_geometry = direct if direct is not None else (tuple(window.shape), None)
    launches = phase_launches(window.device.index or 0, window_shape, tuple(weight_taps.shape[-4:-1]), split,
                              bias is not None, tuple(out_strides), tuple(grid), tuple(taps), tuple(dilation),
                              tuple(phases), (scales[1], scales[0].shape[-1]) if split >= 2 else None,
                              input_geometry, region)
    if split >= 2:
        block_max, _, w_inverse = scales
        scale_pointers = (block_max.data_ptr(), w_inverse.data_ptr())
    else:
        scale_pointers = (0, 0)
    lo_part = weight_taps.data_ptr() + 4 * weight_taps.stride(0) if split == 1 else 0
    pointers = (window.data_ptr(), weight_taps.data_ptr(), lo_part, bias.data_ptr() if bias is not None else 0,
                *scale_pointers, out.data_ptr())
    stream = _current_stream(window.device.index or 0)
    for kernel, programs, ints, longs, table in launches:
        kernel.launch(programs, pointers, ints, longs, stream, table)


@functools.lru_cache(maxsize=256)
def phase_launches(device: int, window_shape, weight_taps_shape, split: int, has_bias: bool, out_strides, grid,
                   taps, dilation, phases, scale_blocks, input_geometry=None, region=None) -> tuple:
    """correlate_phases' launches, (kernel, programs, ints, longs, table) each, once per layer: window_shape (N, XD,
    XH, XW, C_in); weight_taps_shape (kH, kW, C_out) of the whole kernel's taps; scale_blocks (the block maxima's
    columns per block, their blocks per row) under 3xFP16 and FP16 (split 2, 3), else None. Each is launched with
    the pointers (window, weight taps, their lo part (3xTF32), bias, block maxima, the weight's inverse scales, out),
    0 for those not read. input_geometry (where reads_input allows it): the input's spatial sizes, the window's start
    in it and its strides (N, C, D, H: its rows contiguous), for row_runs.py's kernel reading the input itself (the
    same arguments); then the pointers' first is the input's. region: correlate_phases'."""
    n, xd, xh, xw, c_in = window_shape
    kh, kw, c_out = weight_taps_shape
    cob = config(c_in, c_out, taps, dilation, split)[1]
    rows = tile_rows(c_in, c_out, taps, dilation, split, n * len(phases), grid)
    kernel = correlation_kernel(device, window_shape, c_out, split, has_bias, grid, taps, dilation, len(phases),
                                input_geometry, region)
    qd, qh, qw = grid
    qh_blocks, qw_blocks = cdiv(qh, rows), cdiv(qw, TILE_COLUMNS)
    programs = _programs(n, grid, rows, c_out, cob)
    if programs == 0:
        return ()
    scale_ints = scale_blocks if split >= 2 else (0, 0)
    launches = []
    for first in range(0, len(phases), phase_conv.MAX_PHASES):
        chunk = phases[first:first + phase_conv.MAX_PHASES]
        ints = (xd, xh, xw, kh, kw, qd, qh, qw, qh_blocks, qw_blocks, *scale_ints, len(chunk))
        launches.append((kernel, programs * len(chunk), ints, out_strides, _phase_table(tuple(chunk))))
    return tuple(launches)


def correlation_kernel(device: int, window_shape, c_out: int, split: int, has_bias: bool, grid, taps, dilation,
                       phases: int, input_geometry=None, region=None) -> _Kernel:
    """The kernel that phase_launches launches for a correlation of so many phases over the window of window_shape
    (N, XD, XH, XW, C_in), or over the input of input_geometry itself: row_runs.py's where it serves (the same
    programs and arguments: its rows, cob 64, one column block), else phase_conv.py's. Compiled at its first use;
    raises where phase_conv.py's kernel does not compile, or where input_geometry or region is given and row_runs.py's
    does not serve (reads_input and phases.region_fill say where it does)."""
    n, _, _, window_columns, c_in = window_shape
    if _row_runs_layer(c_in, c_out, split, grid):
        kernel = _row_runs_kernel(device, c_out, taps, dilation, window_columns, has_bias, split, input_geometry,
                                  region)
        if kernel is not None:
            return kernel
    if input_geometry is not None:
        raise RuntimeError("convt3d: the correlation cannot read the input itself here (see cuda.reads_input)")
    if region is not None:
        raise RuntimeError("convt3d: the correlation cannot fill the output here (see phases.region_fill)")
    return _kernel(device, c_in, c_out, taps, dilation, has_bias, split,
                   tile_rows(c_in, c_out, taps, dilation, split, n * phases, grid))


def correlation_spec(window_shape, c_out: int, split: int, has_bias: bool, grid, taps, dilation, phases: int,
                     input_geometry=None, region=None):
    """_Kernel's arguments for the kernel that correlation_kernel builds where it compiles (for compiled_together)."""
    n, _, _, window_columns, c_in = window_shape
    if _row_runs_layer(c_in, c_out, split, grid):
        spec = _row_runs_spec(c_out, taps, dilation, window_columns, has_bias, split, input_geometry, region)
        if spec is not None:
            return spec
    return _phase_conv_spec(c_in, c_out, taps, dilation, has_bias, split,
                            tile_rows(c_in, c_out, taps, dilation, split, n * phases, grid))


def reads_input(device: int, c_in: int, c_out: int, taps, dilation, window_columns: int, has_bias: bool, split: int,
                grid, input_geometry, region=None) -> bool:
    """Whether a correlation may read an input of input_geometry itself (phase_launches'; filling region, where given):
    row_runs.py's kernel serves it (INPUT_DIRECT), in FP16 (split 3). In 3xFP16 it was slower than reading the window:
    problem 77's forward took 0.354-0.360 ms against 0.350-0.354 on the H200, where FP16's took 0.272-0.273 against
    0.290 (benchmarks/diag_direct_input.py, sixty-eighth session). The caller checks DIRECT_INPUT and that the input's
    rows are contiguous."""
    return (split == 3 and _row_runs_layer(c_in, c_out, split, grid)
            and _row_runs_kernel(device, c_out, tuple(taps), tuple(dilation), window_columns, has_bias, split,
                                 input_geometry, region) is not None)


@functools.lru_cache(maxsize=256)
def _phase_table(phases) -> tuple:
    """The kernel's struct Phases: each phase's fields, the unused phases' zeros."""
    fields = [value for phase in phases for value in phase]
    return tuple(fields) + (0,) * (phase_conv.MAX_PHASES * phase_conv.PHASE_FIELDS - len(fields))


def grad_weight_kernel_unsupported(device: torch.device, dtype: torch.dtype, c_in: int, c_out: int, groups: int, taps,
                                   dilation) -> str | None:
    """None when grad_weight.py's kernel computes the weight gradient of a phase correlation reading c_in channels
    of the input with these taps and tap dilations into c_out channels, else a short reason."""
    reason = _unsupported_setting(device, dtype, groups, tf32_only=True)
    if reason is not None:
        return reason
    reason = grad_weight_channels_unsupported(c_in, c_out)
    if reason is not None:
        return reason
    if _compile_kernel() is None:
        return "torch.cuda._compile_kernel is missing"
    if grad_weight_config(c_in, c_out, tuple(taps), tuple(dilation)) is None:
        return "the input's row rings do not fit in shared memory"
    try:  # compiled here, once per layer (the callers cache this answer), so that a failure falls back
        _grad_weight_kernel(device.index if device.index is not None else torch.cuda.current_device(), c_in, c_out,
                            tuple(taps), tuple(dilation))
    except Exception as error:  # noqa: BLE001 (NVRTC, the driver or torch's private API: any failure falls back)
        return f"compiling the kernel failed: {error}"
    return None


@functools.lru_cache(maxsize=1024)
def grad_weight_config(c_in: int, c_out: int, taps, dilation):
    """(output channels per program, tiles of 64 GEMM rows per program, programs along the rows, depth taps per
    program, shared bytes) or None where the shared memory does not suffice. A program takes at most
    2 x MAX_TILES_PER_WARPGROUP tiles; the rows (tap, channel) are split evenly among as few programs as that allows,
    so that each reads grad_output as few times as possible."""
    kd, kh, kw = taps
    cob = min(c_out, 64)
    tiles = cdiv(kd * kh * kw * c_in, 64)
    groups = cdiv(tiles, 2 * grad_weight.MAX_TILES_PER_WARPGROUP)
    per_program = cdiv(tiles, groups)
    groups = cdiv(tiles, per_program)
    planes = 1
    for group in range(groups):
        first_tap = group * per_program * 64 // c_in
        last_tap = min((min((group + 1) * per_program, tiles) * 64 - 1) // c_in, kd * kh * kw - 1)
        planes = max(planes, last_tap // (kh * kw) - first_tap // (kh * kw) + 1)
    smem = grad_weight.shared_bytes(c_in, cob, taps, dilation, planes)
    return None if smem > MAX_SHARED_BYTES else (cob, per_program, groups, planes, smem)


@functools.lru_cache(maxsize=256)
def _grad_weight_kernel(device_index: int, c_in: int, c_out: int, taps, dilation) -> _Kernel:
    cob, per_program, _, planes, smem = grad_weight_config(c_in, c_out, taps, dilation)
    with torch.cuda.device(device_index):
        return _Kernel(grad_weight.source(c_in, c_out, cob, taps, dilation, per_program, planes), "phase_grad_weight",
                       smem, grad_weight.THREADS)


def grad_weight_splits(c_in: int, c_out: int, taps, dilation, grid, batch: int, sms: int) -> int:
    """How many runs of grid rows the reduction is split into: enough programs for one per multiprocessor, each
    run at least one row; where there are more (n, qd, column block) planes than runs, whole planes per run."""
    cob, _, groups, _, _ = grad_weight_config(c_in, c_out, tuple(taps), tuple(dilation))
    qd, qh, qw = grid
    planes = batch * qd * cdiv(qw, TILE_COLUMNS)
    wanted = max(1, sms // (groups * (c_out // cob)))
    if planes >= wanted:
        return cdiv(planes, cdiv(planes, wanted))
    return max(1, min(wanted, planes * qh))


def grad_weight_operands_unsupported(input: torch.Tensor, lattice_shape, lattice_strides) -> str | None:
    """None when grad_weight.py's kernel reads these operands as they lie, else why not: the input's rows contiguous
    and every row 16-byte aligned (its 16-byte copies), offsets inside a sample 32-bit (input and lattice)."""
    return _operands_unsupported(tuple(input.shape), input.stride(), input.data_ptr() % 16 == 0, tuple(lattice_shape),
                                 tuple(lattice_strides))


@functools.lru_cache(maxsize=1024)
def _operands_unsupported(input_shape, input_strides, aligned: bool, lattice_shape, lattice_strides) -> str | None:
    sample = lambda shape, strides: sum((size - 1) * stride for size, stride in zip(shape[1:], strides[1:]))
    if input_strides[4] != 1 or not aligned or any(stride % 4 for stride in input_strides[:4]):
        return "the input's rows are not contiguous and 16-byte aligned"
    if max(sample(input_shape, input_strides), sample(lattice_shape, lattice_strides)) >= 2**31:
        return "a sample spans 2**31 elements or more"
    return None


def correlate_grad_weight(input: torch.Tensor, grad_output: torch.Tensor, lattice_offset: int, lattice_strides, grid,
                          starts, taps, dilation, splits: int) -> torch.Tensor:
    """The weight gradient of a phase correlation (grad_weight.py): (C_in, C_out, taps per axis), the phase's taps in
    ascending order, float32. input (N, C_in, D, H, W) with strides that grad_weight_operands_unsupported accepts;
    grad_output's lattice of the phase at element lattice_offset with lattice_strides (N, C_out, QD, QH, QW), over
    grid (QD, QH, QW); starts: per axis the input position of grid position 0 with tap 0 (the correlation reads
    start + q + k * dilation)."""
    n, c_in, xd, xh, xw = input.shape
    c_out = grad_output.shape[1]
    device = input.device.index or 0
    cob, per_program, groups, _, _ = grad_weight_config(c_in, c_out, tuple(taps), tuple(dilation))
    kernel = _grad_weight_kernel(device, c_in, c_out, tuple(taps), tuple(dilation))
    qd, qh, qw = grid
    qw_blocks = cdiv(qw, TILE_COLUMNS)
    rows = n * qd * qh * qw_blocks
    if rows == 0:
        return torch.zeros((c_in, c_out, *taps), dtype=torch.float32, device=input.device)
    partial = torch.empty((splits, c_in, c_out, *taps), dtype=torch.float32, device=input.device)  # all written
    ints = (xd, xh, xw, *starts, qd, qh, qw, qw_blocks, per_program, splits, *input.stride()[1:4],
            *lattice_strides[1:])
    longs = (rows, input.stride(0), lattice_strides[0])
    kernel.launch(splits * groups * (c_out // cob), (input.data_ptr(), grad_output.data_ptr() + 4 * lattice_offset,
                                                     partial.data_ptr()), ints, longs, _current_stream(device))
    return partial.sum(0) if splits > 1 else partial[0]
