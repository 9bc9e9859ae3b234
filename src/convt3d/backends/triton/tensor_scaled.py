"""TF32 mode's float32 operands for the general and tap_columns kernels as FP16 with one power-of-two scale per tensor.

FP16 keeps TF32's 11 significant bits, and Hopper's tensor cores multiply FP16 at twice TF32's rate on half the
bytes: on the H200 the two kernels alone took 11-31% less time on FP16 operands than on TF32 ones, and whole calls
with this pass 13-23% less by the minima on four of five sweep layers (benchmarks/RESULTS.md, thirty-first,
forty-sixth and forty-seventh sessions). Their sums mix input positions and weight taps, so a scale per
row (the tiled kernel's, tiled.py) would not factor out of them; one scale per tensor does. The operand pass
TF32-rounds each tensor, multiplies it by 2**e, e putting its largest finite magnitude in [2^14, 2^15), and stores it
as FP16 in the layouts forward.py's pass makes (input channels-last, weight tap-major and K-major); the main kernel
multiplies each sum by 2**-(e_x + e_w) in its epilogue (forward.inverse_scales). Every value within 2^28 of its
tensor's largest finite magnitude is then exactly its TF32 rounding; smaller ones lie in FP16's subnormals and keep
fewer bits, and those below about 2^-39 of it become zeros. Infinities and NaNs stay what they are.

The largest magnitudes are found in the same launch: a cooperative grid (every program resident at once) reads its
share of both tensors, posts the exponent fields of its largest magnitudes (all that e depends on) in a word of its
own, marked as posted, and reads every program's word until all are posted: a grid-wide barrier whose arrivals carry
the maxima, with no atomic read-modify-write or fence on the way. Then it scales and stores its share, which it held
in registers (under the interpreter, whose grid is one program, larger layers read theirs again). A launch of its own
for the maxima cost more host time than the FP16 kernels saved (thirty-first session, a47d641). The words live per
device and stream (sync_words), zero between launches: the last program out of a launch (an atomic counter) clears
them and leaves the scale exponents for the main kernel.
"""

from __future__ import annotations

import functools
import threading

import torch
import triton
import triton.language as tl

from ... import environment
from . import TF32, cdiv, interpreted, next_power_of_2
from .forward import (_power_of_2, _round_to_tf32, _stream_capturing, exponent_field, fp16_scale_exponent_of_field,
                      let_next_start, tap_major_tile, weight_tiles)
from .launch import Launcher, _current_stream

# This module's precision, beside NATIVE, TF32 and TF32X3 (forward.py) and tiled.FP16_SCALED (3).
FP16_TENSOR_SCALED = 4
# TF32 mode's float32 operands as FP16 (the module docstring); CONVT3D_TF32_AS_FP16=0 keeps TF32, as it does for the
# tiled and CUDA kernels. Set before a layer's first call, as calls are prepared per layer.
TF32_AS_FP16 = environment.switch("CONVT3D_TF32_AS_FP16", True)
# The sync words: the departures (word 0), the exponents e_x and e_w of the last launch, which its main kernel reads
# (words 4 and 5), and from word POSTS one word per program, POSTED | x's field << 8 | w's field once it has posted;
# all but e_x and e_w zero between launches.
# (constexpr: a kernel reads no other globals)
POSTS, POSTED, MAX_PROGRAMS = tl.constexpr(8), tl.constexpr(1 << 16), 1024
SYNC_WORDS = POSTS.value + MAX_PROGRAMS
# The pass's programs: an input tile of 64 channels by 256 positions and a weight chunk of up to 8,192 elements, held
# in registers from the first read to the store, 8 warps, one program per multiprocessor (so for layers of up to
# 16,384 input values and 8,192 weights per multiprocessor; compiled for sm_90, 127-234 registers and no spills at
# chunks of 512-8,192, 255 and spills at 16,384). Under the interpreter, where the grid is one program, larger layers
# read their tiles again after the barrier (READ_AGAIN). On the H200 that form, with two programs of 4 warps per
# multiprocessor, made the pass 0.004 ms slower than the held one on video_k3s2p1op1, about what FP16 saved in the
# main kernel (benchmarks/RESULTS.md, forty-sixth session), so on a GPU larger layers keep TF32 operands.
BLOCK_C, BLOCK_S, MAX_BLOCK_W, NUM_WARPS = 64, 256, 8192, 8
# Programs per multiprocessor that the held form counts on (benchmarks/diag_pass_tiles.py varies it with BLOCK_S and
# NUM_WARPS; every program of the cooperative grid must be resident at once).
PROGRAMS_PER_SM = 1
READ_AGAIN_BLOCK_W = 2048
# A weight tile's input channels (forward.tap_major_tile): 64 FP16 values, 128 bytes stored together.
W_BLOCK_CI = 64


def operand_precision(input: torch.Tensor, weight: torch.Tensor, groups: int, precision: int) -> int:
    """The precision the general and tap_columns kernels compute a layer in: FP16_TENSOR_SCALED for TF32 on float32
    where TF32_AS_FP16 and the pass holds the layer (_geometry), else precision (forward.py's)."""
    if precision != TF32 or input.dtype != torch.float32 or not TF32_AS_FP16:
        return precision
    device_index = cuda_index(input.device)
    narrow = _fits_32_bits(input.shape, input.stride())
    held = _geometry(tuple(input.shape), tuple(weight.shape), groups, device_index, narrow)[-1]
    return FP16_TENSOR_SCALED if held or device_index is None else precision


def _fits_32_bits(sizes, strides) -> bool:
    """Whether every element offset of a tensor with these sizes and strides fits 32-bit indexing."""
    return sum((size - 1) * stride for size, stride in zip(sizes, strides)) < 2**31


def cuda_index(device: torch.device):
    """device's index where the pass runs natively on CUDA, else None (the interpreter, or another device)."""
    return None if device.type != "cuda" or interpreted() else (device.index or 0)


@functools.lru_cache(maxsize=256)
def _geometry(input_shape, weight_shape, groups: int, device_index, narrow: bool):
    """(programs, input tiles, weight tiles (forward.tap_major_tile), their channels and (co, tap) columns, held) of
    the pass for a layer on CUDA device device_index (None under the interpreter or off CUDA: one program). narrow:
    the input's element offsets fit 32 bits, as the held form indexes it (64-bit offsets held beside the tile pushed
    it into spills)."""
    n, c = input_shape[:2]
    s = input_shape[2] * input_shape[3] * input_shape[4]
    cin_g, columns = weight_shape[0] // groups, weight_shape[1] * weight_shape[2] * weight_shape[3] * weight_shape[4]
    # The programs that can be resident at once (the held form's cooperative grid needs them all resident).
    resident = (1 if device_index is None
                else torch.cuda.get_device_properties(device_index).multi_processor_count * PROGRAMS_PER_SM)
    x_tiles = n * cdiv(c, BLOCK_C) * cdiv(s, BLOCK_S)
    block_ci = min(W_BLOCK_CI, next_power_of_2(cin_g))

    def w_tiles(block_w):
        block_k = max(1, block_w // block_ci)
        return weight_tiles(groups, cin_g, columns, block_ci, block_k)[2], block_k

    # The smallest tiles that take the weight in as many programs as can be resident, at most.
    block_w = max(16, next_power_of_2(cdiv(groups * cin_g * columns, resident)))
    while w_tiles(block_w)[0] > resident and block_w <= MAX_BLOCK_W:
        block_w *= 2
    if x_tiles <= resident <= MAX_PROGRAMS and block_w <= MAX_BLOCK_W and narrow:
        tiles, block_k = w_tiles(block_w)
        return max(x_tiles, tiles), x_tiles, tiles, block_ci, block_k, True
    # (interpreted, programs run one after another: a second would wait at the barrier for ever)
    tiles, block_k = w_tiles(READ_AGAIN_BLOCK_W)
    return 1, x_tiles, tiles, block_ci, block_k, False


@triton.jit
def _x_tile(t, X_TILES, C, S, C_BLOCKS, S_BLOCKS, sxn, sxc, sxs, BLOCK_C: tl.constexpr, BLOCK_S: tl.constexpr,
            WIDE: tl.constexpr):
    """(offsets in x, mask, offsets in the channels-last operand) of input tile t of x (N, C, S) (none past X_TILES):
    BLOCK_C channels by BLOCK_S positions, the positions along the input's contiguous axis. WIDE: 64-bit offsets."""
    n = t // (S_BLOCKS * C_BLOCKS)
    c = (t // S_BLOCKS % C_BLOCKS) * BLOCK_C + tl.arange(0, BLOCK_C)
    sp = (t % S_BLOCKS) * BLOCK_S + tl.arange(0, BLOCK_S)
    ok = (c[:, None] < C) & (sp[None, :] < S * (t < X_TILES))  # (a scalar mask broadcast: the interpreter's way)
    if WIDE:
        n = n.to(tl.int64)
        c = c.to(tl.int64)
        sp = sp.to(tl.int64)
    return n * sxn + c[:, None] * sxc + sp[None, :] * sxs, ok, n * S * C + sp[None, :] * C + c[:, None]


@triton.jit
def _largest_finite(v):
    a = tl.abs(v)
    return tl.max(tl.where(a < float("inf"), a, 0.0))  # (NaN compares false)


@triton.jit
def _scaled(v, e):
    return (_round_to_tf32(v) * _power_of_2(e)).to(tl.float16)


@triton.jit
def fp16_operands_kernel(
    x_ptr, x_op_ptr, w_ptr, w_op_ptr, sync_ptr,
    C, S, C_BLOCKS, S_BLOCKS, X_TILES, sxn, sxc, sxs, GROUPS, CIN_G, COUT_G, TAPS, CI_BLOCKS, K_BLOCKS, W_TILES,
    BLOCK_C: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_WCI: tl.constexpr, BLOCK_WK: tl.constexpr, HELD: tl.constexpr,
    PROGRAMS_P2: tl.constexpr, LET_NEXT_START: tl.constexpr, DIAG: tl.constexpr = 0,
):
    """Both operands as FP16 scaled per tensor (module docstring). Program p takes input tiles p, p + programs, ...
    (_x_tile) and the weight tiles the same way (forward.tap_major_tile); HELD: at most one of each, kept in
    registers from the first read to the store, else read again after the barrier. Launched cooperatively: the
    barrier below waits for every program. PROGRAMS_P2: the programs, rounded up to a power of two. DIAG (benchmarks
    only, to see where the pass's time goes; the operands are then wrong): 1 arrives at the barrier without waiting
    there, 2 posts no maxima, skips the barrier and scales by 1."""
    if LET_NEXT_START:
        let_next_start()
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    if HELD:
        x_offs, x_ok, _ = _x_tile(pid, X_TILES, C, S, C_BLOCKS, S_BLOCKS, sxn, sxc, sxs, BLOCK_C, BLOCK_S, False)
        x = tl.load(x_ptr + x_offs, mask=x_ok, other=0.0)
        w_offs, w_ok, _ = tap_major_tile(pid, W_TILES, GROUPS, CIN_G, COUT_G, TAPS, CI_BLOCKS, K_BLOCKS, BLOCK_WCI,
                                         BLOCK_WK)
        w = tl.load(w_ptr + w_offs, mask=w_ok, other=0.0)
        x_largest = _largest_finite(x)
        w_largest = _largest_finite(w)
    else:
        x_largest = 0.0
        for t in range(pid, X_TILES, programs):
            offs, ok, _ = _x_tile(t, X_TILES, C, S, C_BLOCKS, S_BLOCKS, sxn, sxc, sxs, BLOCK_C, BLOCK_S, True)
            x_largest = tl.maximum(x_largest, _largest_finite(tl.load(x_ptr + offs, mask=ok, other=0.0)))
        w_largest = 0.0
        for j in range(pid, W_TILES, programs):
            offs, ok, _ = tap_major_tile(j, W_TILES, GROUPS, CIN_G, COUT_G, TAPS, CI_BLOCKS, K_BLOCKS, BLOCK_WCI,
                                         BLOCK_WK)
            w_largest = tl.maximum(w_largest, _largest_finite(tl.load(w_ptr + offs, mask=ok, other=0.0)))
    others = tl.arange(0, PROGRAMS_P2)
    if DIAG < 2:
        # The posts carry the maxima themselves, so reading them needs no fence; they are polled by loads (atomics
        # polling an arrival counter slowed every program's arrival).
        post = POSTED | exponent_field(x_largest) << 8 | exponent_field(w_largest)
        tl.atomic_xchg(sync_ptr + POSTS + pid, post, sem="relaxed")
        posts = tl.load(sync_ptr + POSTS + others, mask=others < programs, other=POSTED, volatile=True)
        if DIAG == 0:
            while tl.min(posts) < POSTED:
                posts = tl.load(sync_ptr + POSTS + others, mask=others < programs, other=POSTED, volatile=True)
        e_x = fp16_scale_exponent_of_field(tl.max(posts >> 8 & 0xFF))
        e_w = fp16_scale_exponent_of_field(tl.max(posts & 0xFF))
    else:
        e_x = tl.full((), 0, tl.int32)
        e_w = tl.full((), 0, tl.int32)
    # The offsets and masks are formed again here rather than held across the barrier: held (and 64-bit), they pushed
    # the pass past 255 registers into spills (benchmarks/RESULTS.md, forty-sixth and forty-seventh sessions).
    if HELD:
        _, x_ok, x_op_offs = _x_tile(pid, X_TILES, C, S, C_BLOCKS, S_BLOCKS, sxn, sxc, sxs, BLOCK_C, BLOCK_S, False)
        tl.store(x_op_ptr + x_op_offs, _scaled(x, e_x), mask=x_ok)
        _, w_ok, w_op_offs = tap_major_tile(pid, W_TILES, GROUPS, CIN_G, COUT_G, TAPS, CI_BLOCKS, K_BLOCKS, BLOCK_WCI,
                                            BLOCK_WK)
        tl.store(w_op_ptr + w_op_offs, _scaled(w, e_w), mask=w_ok)
    else:
        for t in range(pid, X_TILES, programs):
            offs, ok, op_offs = _x_tile(t, X_TILES, C, S, C_BLOCKS, S_BLOCKS, sxn, sxc, sxs, BLOCK_C, BLOCK_S, True)
            tl.store(x_op_ptr + op_offs, _scaled(tl.load(x_ptr + offs, mask=ok, other=0.0), e_x), mask=ok)
        for j in range(pid, W_TILES, programs):
            offs, ok, op_offs = tap_major_tile(j, W_TILES, GROUPS, CIN_G, COUT_G, TAPS, CI_BLOCKS, K_BLOCKS, BLOCK_WCI,
                                               BLOCK_WK)
            tl.store(w_op_ptr + op_offs, _scaled(tl.load(w_ptr + offs, mask=ok, other=0.0), e_w), mask=ok)
    if tl.atomic_add(sync_ptr, 1, sem="acq_rel") == programs - 1:  # the last one out: all have read the posts
        tl.store(sync_ptr + 4, e_x)
        tl.store(sync_ptr + 5, e_w)
        tl.store(sync_ptr, 0)
        tl.store(sync_ptr + POSTS + others, 0, mask=others < programs)


# Per (device, stream, thread): the sync words of the passes launched on it, which run one after another.
_sync: dict = {}


def sync_words(device: torch.device, stream: int | None = None) -> torch.Tensor:
    """The sync words for a pass on this device and stream (a raw stream handle; None: the device's current one).
    Passes on one stream run in turn, so they share them; per thread, so that no other thread's pass comes between a
    pass and the main kernel that reads its exponents (words 4 and 5). A CUDA graph capture gets words of its own,
    zeroed inside the graph, so that its replays share them with nothing else."""
    if device.type != "cuda" or _stream_capturing():
        return torch.zeros(SYNC_WORDS, dtype=torch.int32, device=device)
    if stream is None:
        stream = _current_stream(device.index)
    key = device.index, stream, threading.get_ident()
    words = _sync.get(key)
    if words is None:
        if len(_sync) >= 64:  # (many threads or streams come and go: start over)
            _sync.clear()
        words = _sync[key] = torch.zeros(SYNC_WORDS, dtype=torch.int32, device=device)
    return words


def cleared(sync: torch.Tensor) -> bool:
    """Whether sync words are as a launch leaves them: all zero but the exponents (words 4 and 5)."""
    return not sync[:4].any() and not sync[6:].any()


@functools.lru_cache(maxsize=256)
def operand_pass(input_shape, weight_shape, groups: int, flat_strides, let_next_start: bool, device_index,
                 diag: int = 0):
    """The pass for a layer that operand_precision gives FP16_TENSOR_SCALED, for an input with these strides (as (N,
    C, D*H*W)), on CUDA device device_index (None under the interpreter or off CUDA), bound (launch.BoundLaunch): call
    it with (x as (N, C, D*H*W), x_op, the contiguous weight, w_op, sync words). diag: the kernel's DIAG."""
    c = input_shape[1]
    s = input_shape[2] * input_shape[3] * input_shape[4]
    c_in, cout_g = weight_shape[:2]
    programs, x_tiles, w_tiles, block_ci, block_k, held = _geometry(
        input_shape, weight_shape, groups, device_index, _fits_32_bits((input_shape[0], c, s), flat_strides))
    cin_g, taps = c_in // groups, weight_shape[2] * weight_shape[3] * weight_shape[4]
    ci_blocks, k_blocks, _ = weight_tiles(groups, cin_g, cout_g * taps, block_ci, block_k)
    return _pass.bind(
        (programs,),
        (c, s, cdiv(c, BLOCK_C), cdiv(s, BLOCK_S), x_tiles, *flat_strides, groups, cin_g, cout_g, taps, ci_blocks,
         k_blocks, w_tiles),
        (("BLOCK_C", BLOCK_C), ("BLOCK_S", BLOCK_S), ("BLOCK_WCI", block_ci), ("BLOCK_WK", block_k), ("HELD", held),
         ("PROGRAMS_P2", next_power_of_2(programs)), ("LET_NEXT_START", let_next_start), ("DIAG", diag),
         ("num_warps", NUM_WARPS), ("launch_cooperative_grid", True)))


_pass = Launcher(fp16_operands_kernel)
