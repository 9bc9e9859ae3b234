"""A third kernel on forward.py's operands: the general kernel's phase GEMMs turned around, both tiles loaded by the
Tensor Memory Accelerator (TMA; Hopper), for groups 1 and FP16 operands (float16 layers, and TF32 mode's float32
layers scaled per tensor).

forward.py's general kernel multiplies [positions, C_in] input tiles by [C_in, C_out] weight tiles: its MMA's N is the
block of output channels, 64 on most layers. This one multiplies the weight tile [BLOCK_CO, BLOCK_CI] by the input
tile transposed, [BLOCK_CI, positions]: the MMA's N is the tile's BLOCK_R x BLOCK_Q positions (128 or 256), and the
accumulator's fast axis lies along the output's rows. Each K-step loads the input tile as one TMA box [1, 1, BLOCK_R,
BLOCK_Q, BLOCK_CI] of the channels-last operand at the tap's shift (rows, columns and planes outside the input come
back as zeros: no masks, no index arithmetic per element) and the weight tile as one box of the tap-major rows.
Work items and tap ranges are the general kernel's, one item a program.

Launches. Triton's own launcher encodes each descriptor's tensor map on every launch: on one H100 machine that left
this kernel's cold-L2 means up to 0.055 ms above its fastest calls (benchmarks/RESULTS.md, eighty-ninth session).
Here the maps are encoded once per operand address (cuTensorMapEncodeTiled, as Triton's launcher encodes them) and
the compiled kernel is launched by the driver (driver.Launch), its parameters packed as Triton passes a descriptor
(the map, then the shape as i32 and the strides as i64), checked against the PTX's parameter list. Where they do not
match (another Triton's layout), and under CONVT3D_DRIVER_LAUNCH=0, Triton's launcher serves. It is launched after
the operand pass, not as its dependent (bind says why).

Measured on an H100 (ninetieth session, `python3 -m convt3d bench --sweep --layers ...` with CONVT3D_TURNED=0 and
without, TF32 mode), the whole call's median time with it against without: 12% less on vae_k4s2p1, 7% less on
video_spatial_k144, 16% less on wide_256to128_k3s2 (against tap_columns), 10% less on vae_k4s2p1_fp16, 1% more on
k3s1p1. Not yet measured on the H200.
"""

from __future__ import annotations

import ctypes
import functools
import threading

import torch
import triton
import triton.language as tl

from ... import environment
from ...plan import Plan
from .. import current_cuda_device, driver
from . import interpreted
from .forward import (_axis_taps, _column_taps, _geometry, contiguous_strides, count_on, inverse_scales,
                      mma_precision, work_item)
from . import launch
from .launch import (_INTEGER_TYPES, _current_stream, _entry_parameter_bytes, _launches_plainly, _no_launch_hooks,
                     _scratch_pointers)

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # a Triton without host-side tensor descriptors
    TensorDescriptor = None

# Whether forward.py's autotuner weighs this kernel's configs: on unless CONVT3D_TURNED=0 (read at import).
ENABLED = environment.switch("CONVT3D_TURNED", True)


def unsupported_reason(plan: Plan, operand_dtype: torch.dtype, device_index: int | None) -> str | None:
    """None when this kernel can serve the layer on operands of operand_dtype on CUDA device device_index (None: in
    the interpreter), else why not."""
    if not ENABLED:
        return "CONVT3D_TURNED=0"
    if TensorDescriptor is None:
        return "this Triton has no host-side tensor descriptors"
    if plan.groups != 1:
        return "groups > 1"
    # (bfloat16 not: Triton 3.9's interpreter, which CI tests the kernels in, returns wrong sums for tl.dot(b,
    # tl.trans(a)) on bfloat16 tiles, so this kernel could not be tested there.)
    if operand_dtype != torch.float16:
        return "operands not float16"
    if plan.in_channels % 8:  # (TMA's strides are whole 16-byte units)
        return "input channels not a multiple of 8"
    if device_index is not None and torch.cuda.get_device_capability(device_index)[0] < 9:
        return "no TMA before Hopper (sm_90)"
    return None


def configs() -> list[dict]:
    """Tile configs; "KERNEL" names this module for forward.py's launcher. On the H100 (ninetieth session) each of
    these was the fastest of five on one or more of five sweep layers; 64 positions were the slowest everywhere."""
    if interpreted():
        return [dict(KERNEL="turned", BLOCK_M=32, BLOCK_CO=16, BLOCK_CI=16, num_warps=4, num_stages=1)]
    return [dict(KERNEL="turned", BLOCK_M=m, BLOCK_CO=64, BLOCK_CI=64, num_warps=w, num_stages=s)
            for m, w, s in [(128, 4, 3), (128, 4, 4), (256, 8, 3)]]


@triton.jit
def program_block(
    y_ptr, b_ptr, COUT, D, H, OD, OH, KD, KH, syn, syd, U_H_BLOCKS, U_W_BLOCKS, CO_BLOCKS,
    S_D: tl.constexpr, S_H: tl.constexpr, P_D: tl.constexpr, P_H: tl.constexpr, DIL_D: tl.constexpr,
    DIL_H: tl.constexpr, STEP_D: tl.constexpr, STEP_H: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_R: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_CO: tl.constexpr,
):
    """This program's block, as the library's general kernel (forward.py) takes its work item: the sample n, the row
    phase v_h, the output channels co0 + [0, BLOCK_CO) (co, co_ok), the output's base at (n, od), the bias, the depth
    and height tap ranges (forward._axis_taps), and the block's first row u_h0 and column u_w0."""
    co_block, uw_block, uh_block, v_h, od, n = work_item(tl.program_id(0), CO_BLOCKS, U_W_BLOCKS, U_H_BLOCKS, S_H, OD)
    co0 = co_block * BLOCK_CO
    co = co0 + tl.arange(0, BLOCK_CO)
    co_ok = co < COUT
    y_base = y_ptr + n.to(tl.int64) * syn + od.to(tl.int64) * syd
    if HAS_BIAS:
        bias = tl.load(b_ptr + co, mask=co_ok, other=0.0).to(tl.float32)
    else:
        bias = tl.zeros([BLOCK_CO], dtype=tl.float32)
    base_d, m0_d, t0_d, jd_lo, jd_hi = _axis_taps(od % S_D, od // S_D, od // S_D, D, KD, S_D, P_D, DIL_D, STEP_D)
    q_d = od // S_D + base_d
    u_h0 = uh_block * BLOCK_R
    u_h_end = tl.minimum(u_h0 + BLOCK_R, (OH - v_h + S_H - 1) // S_H)
    base_h, m0_h, t0_h, jh_lo, jh_hi = _axis_taps(v_h, u_h0, u_h_end - 1, H, KH, S_H, P_H, DIL_H, STEP_H)
    u_w0 = uw_block * BLOCK_Q
    return (n, v_h, co0, co, co_ok, y_base, bias, q_d, m0_d, t0_d, jd_lo, jd_hi, u_h0, base_h, m0_h, t0_h, jh_lo,
            jh_hi, u_w0)


@triton.jit
def turned_kernel(
    x_desc, w_desc, w_lo_ptr, b_ptr, y_ptr,
    COUT, D, H, W, OD, OH, OW, KD, KH, KW,
    syn, syc, syd, syh, syw,
    U_H_BLOCKS, U_W_BLOCKS, CO_BLOCKS,
    S_D: tl.constexpr, S_H: tl.constexpr, S_W: tl.constexpr,
    P_D: tl.constexpr, P_H: tl.constexpr, P_W: tl.constexpr,
    DIL_D: tl.constexpr, DIL_H: tl.constexpr, DIL_W: tl.constexpr,
    STEP_D: tl.constexpr, STEP_H: tl.constexpr, STEP_W: tl.constexpr,
    HAS_BIAS: tl.constexpr, SCALED: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_CO: tl.constexpr, BLOCK_CI: tl.constexpr,
    CI_BLOCKS: tl.constexpr,
):
    # x_desc: the input (N, D, H, W, C_in) channels-last, boxes [1, 1, BLOCK_R, BLOCK_Q, BLOCK_CI]; w_desc: the weight
    # as (taps x C_out, C_in), boxes [BLOCK_CO, BLOCK_CI]. SCALED: FP16 operands scaled per tensor (tensor_scaled.py),
    # w_lo_ptr pointing at their pass's sync words.
    BLOCK_P: tl.constexpr = BLOCK_R * BLOCK_Q
    (n, v_h, co0, co, co_ok, y_base, bias, q_d, m0_d, t0_d, jd_lo, jd_hi, u_h0, base_h, m0_h, t0_h, jh_lo, jh_hi,
     u_w0) = program_block(y_ptr, b_ptr, COUT, D, H, OD, OH, KD, KH, syn, syd, U_H_BLOCKS, U_W_BLOCKS, CO_BLOCKS, S_D,
                           S_H, P_D, P_H, DIL_D, DIL_H, STEP_D, STEP_H, HAS_BIAS, BLOCK_R, BLOCK_Q, BLOCK_CO)
    M_STEP_D: tl.constexpr = STEP_D * DIL_D // S_D
    M_STEP_H: tl.constexpr = STEP_H * DIL_H // S_H
    M_STEP_W: tl.constexpr = STEP_W * DIL_W // S_W
    p = tl.arange(0, BLOCK_P)
    oh = S_H * (u_h0 + p // BLOCK_Q) + v_h
    u_w = u_w0 + p % BLOCK_Q
    for v_w in tl.static_range(S_W):
        base_w, m0_w, t0_w, jw_lo, jw_hi = _column_taps(v_w, u_w0, OW, W, KW, S_W, P_W, DIL_W, STEP_W, BLOCK_Q)
        # K-steps over (depth tap, height tap, width tap, channel block), the last fastest; a phase no tap reaches
        # takes none and stores the bias.
        acc = tl.zeros([BLOCK_CO, BLOCK_P], dtype=tl.float32)
        ci0 = jd_lo * 0
        jd = jd_lo
        jh = jh_lo
        jw = jw_lo
        for _ in range((jd_hi - jd_lo) * (jh_hi - jh_lo) * (jw_hi - jw_lo) * CI_BLOCKS):
            tap = ((t0_d + jd * STEP_D) * KH + t0_h + jh * STEP_H) * KW + t0_w + jw * STEP_W
            a = x_desc.load([n, q_d - m0_d - jd * M_STEP_D, u_h0 + base_h - m0_h - jh * M_STEP_H,
                             u_w0 + base_w - m0_w - jw * M_STEP_W, ci0]).reshape(BLOCK_P, BLOCK_CI)
            b = w_desc.load([tap * COUT + co0, ci0])
            acc = tl.dot(b, tl.trans(a), acc)  # [C_out, C_in] x [C_in, positions]
            ci0, carry = count_on(ci0, 0, CI_BLOCKS * BLOCK_CI, True, BLOCK_CI)
            jw, carry = count_on(jw, jw_lo, jw_hi, carry)
            jh, carry = count_on(jh, jh_lo, jh_hi, carry)
            jd = tl.where(carry, jd + 1, jd)
        if SCALED:
            scale_a, scale_b = inverse_scales(w_lo_ptr)
            acc = acc * scale_a * scale_b
        out = acc + bias[:, None]
        if S_W != 2:
            ow = S_W * u_w + v_w
            ok = (oh < OH) & (ow < OW)
            tl.store(y_base + co[:, None] * syc + (oh * syh + ow * syw)[None, :], out.to(y_ptr.dtype.element_ty),
                     mask=co_ok[:, None] & ok[None, :])
        elif v_w == 0:
            even = out
        else:
            # Stride 2: each position's two columns side by side, as they lie in the row, stored contiguously.
            tile = tl.reshape(tl.join(even, out), (BLOCK_CO, 2 * BLOCK_P))
            j = tl.arange(0, 2 * BLOCK_P)
            oh2 = S_H * (u_h0 + j // (2 * BLOCK_Q)) + v_h
            ow2 = 2 * u_w0 + j % (2 * BLOCK_Q)
            ok2 = (oh2 < OH) & (ow2 < OW)
            tl.store(y_base + co[:, None] * syc + (oh2 * syh + ow2 * syw)[None, :], tile.to(y_ptr.dtype.element_ty),
                     mask=co_ok[:, None] & ok2[None, :])


def bind(cfg, plan: Plan, precision: int, has_bias: bool, out_strides, device_index: int) -> "TurnedLaunch":
    """A config's launch for a layer on forward._operands' results, bound: call it with (x, w, w_lo, bias, out)."""
    _, sizes, blocks, constexprs = _geometry(plan, cfg["BLOCK_M"], cfg["BLOCK_CO"], cfg["BLOCK_CI"], 0, device_index)
    c = dict(constexprs)
    u_h_blocks, u_w_blocks, co_blocks, _, items = blocks
    names = ("S_D", "S_H", "S_W", "P_D", "P_H", "P_W", "DIL_D", "DIL_H", "DIL_W", "STEP_D", "STEP_H", "STEP_W",
             "BLOCK_R", "BLOCK_Q", "BLOCK_CO", "BLOCK_CI", "CI_BLOCKS")
    # Launched after the operand pass has finished, not as its dependent (the general kernel's dependent_options): on an
    # H100 the whole call of video_spatial_k144 took 0.0377 ms (median) in one process and 0.0311 in another as the
    # pass's dependent, and 0.0307-0.0313 after it (benchmarks/diag_turned_calls.py, ninetieth session).
    options = (*((name, c[name]) for name in names), ("HAS_BIAS", has_bias),
               ("SCALED", mma_precision(precision)[1][1]), ("num_warps", cfg["num_warps"]),
               ("num_stages", cfg["num_stages"]))
    return _bound(items, sizes[1:], tuple(out_strides), (u_h_blocks, u_w_blocks, co_blocks), options, plan.batch,
                  plan.in_channels, plan.input_spatial, plan.kernel_size)


@functools.lru_cache(maxsize=256)
def _bound(items, sizes, out_strides, blocks, options, batch, c_in, input_spatial, kernel_size):
    return TurnedLaunch(items, (*sizes, *out_strides, *blocks), options, (batch, *input_spatial, c_in),
                        (kernel_size[0] * kernel_size[1] * kernel_size[2] * sizes[0], c_in))


class TurnedLaunch:
    """A layer's launch of turned_kernel with one config, as launch.BoundLaunch is for the pointer-only kernels: call
    it with the tensors (x, w, w_lo, bias, out), or get it at addresses (at_addresses). x is (N, D, H, W, C_in) and w
    (taps, 1, C_out, C_in), both contiguous and 16-byte aligned, as forward's operand pass lays them out."""

    pointers = 5

    def __init__(self, items: int, scalars, options, x_shape, w_shape):
        self.grid, self.scalars, self.options = (items,), scalars, dict(options)
        self.x_shape, self.w_shape = x_shape, w_shape
        self.x_strides, self.w_strides = list(contiguous_strides(x_shape)), list(contiguous_strides(w_shape))
        self.x_box = [1, 1, self.options["BLOCK_R"], self.options["BLOCK_Q"], self.options["BLOCK_CI"]]
        self.w_box = [self.options["BLOCK_CO"], self.options["BLOCK_CI"]]
        self._compiled = {}

    def _descriptors(self, x, w):
        return (TensorDescriptor(x, list(self.x_shape), self.x_strides, self.x_box),
                TensorDescriptor(w, list(self.w_shape), self.w_strides, self.w_box))

    def _through_triton(self, x, w, w_lo, bias, out):
        return turned_kernel[self.grid](*self._descriptors(x, w), w_lo, bias, out, *self.scalars, **self.options)

    def __call__(self, pointers):
        if interpreted():
            self._through_triton(*pointers)
            return
        device = current_cuda_device()
        addresses = [t.data_ptr() for t in pointers]
        key = (device, *[(t.dtype, address % 16 == 0) for t, address in zip(pointers, addresses)])
        if key not in self._compiled:
            compiled = self._through_triton(*pointers)
            self._compiled[key] = (_DriverLaunch.of(compiled, self.grid, self.scalars, pointers[0].dtype, self)
                                   if launch.DRIVER_LAUNCH else None)
            return
        by_driver = self._compiled[key]
        if by_driver is not None and _no_launch_hooks():
            by_driver(_current_stream(device), *addresses)
        else:
            self._through_triton(*pointers)

    def at_addresses(self, device: int, dtypes):
        """This launch as a function of (stream, x, w, w_lo, bias, out addresses), through the driver, where an earlier
        call on device with 16-byte aligned pointers of these dtypes compiled it and the driver's launch matched the
        kernel; else None (the caller then launches through tensors)."""
        if interpreted():
            return None
        return self._compiled.get((device, *[(dtype, True) for dtype in dtypes]))


# CUtensorMapDataType by operand dtype; CUtensorMapL2promotion's 128B, as Triton's launcher asks.
_TENSOR_MAP_TYPES = {torch.float16: 6}
_L2_PROMOTION_128B = 2


class _TensorMap:
    """A descriptor's tensor map (CUtensorMap, 128 bytes) in place among a launch's parameters, for a contiguous tensor
    of this shape and dtype in boxes of box, encoded as Triton's launcher encodes it (zeros outside the tensor) for the
    address it was last encoded for."""

    def __init__(self, shape, strides, box, swizzle: int, dtype: torch.dtype):
        self.holder = (ctypes.c_uint8 * 192)()
        at = (ctypes.addressof(self.holder) + 63) // 64 * 64  # (a CUtensorMap is 64-byte aligned)
        self.value = (ctypes.c_uint8 * 128).from_address(at)
        self.shape, self.strides, self.box, self.swizzle, self.dtype = shape, strides, list(box), swizzle, dtype
        self.address = None

    def encode(self, address: int) -> None:
        rank = len(self.shape)
        result = driver.libcuda().cuTensorMapEncodeTiled(
            ctypes.c_void_p(ctypes.addressof(self.value)), ctypes.c_int(_TENSOR_MAP_TYPES[self.dtype]),
            ctypes.c_uint32(rank), ctypes.c_void_p(address), (ctypes.c_uint64 * rank)(*reversed(self.shape)),
            (ctypes.c_uint64 * rank)(*[self.dtype.itemsize * s for s in reversed(self.strides[:-1])], 0),
            (ctypes.c_uint32 * rank)(*reversed(self.box)), (ctypes.c_uint32 * rank)(*([1] * rank)), ctypes.c_int(0),
            ctypes.c_int(self.swizzle), ctypes.c_int(_L2_PROMOTION_128B), ctypes.c_int(0))
        if result:
            raise RuntimeError(f"convt3d: cuTensorMapEncodeTiled failed ({result})")
        self.address = address


class _DriverLaunch:
    """turned_kernel's compiled launch through the driver: a function of (stream, x, w, w_lo, bias, out addresses).
    Its parameters are packed once: each descriptor as Triton packs one (its tensor map, 128 bytes, then its shape as
    i32 and strides as i64), the three pointers, the integers the signature keeps, and the scratch pointers (null);
    a call writes the pointers and, where x or w moved, encodes their maps again."""

    @classmethod
    def of(cls, compiled, grid, scalars, dtype, bound: TurnedLaunch):
        """The driver's launch of compiled, or None where its parameters are not as packed here or it asks for what
        this launch does not give (scratch memory, clusters)."""
        try:
            metadata, function, signature = compiled.metadata, compiled.function, compiled.src.signature
            sizes = _entry_parameter_bytes(compiled.asm["ptx"])
        except Exception:  # noqa: BLE001 (another Triton's compiled kernel: its own launcher serves)
            return None
        maps = getattr(metadata, "tensordesc_meta", None)
        if (not maps or len(maps) != 2 or sizes is None or not _launches_plainly(metadata)
                or dtype not in _TENSOR_MAP_TYPES or any(m.get("fp4_padded") or m.get("is_im2col") for m in maps)):
            return None
        by_driver = cls(function, grid, metadata, signature, scalars, dtype, bound, maps)
        return by_driver if by_driver.sizes == sizes else None

    def __init__(self, function, grid, metadata, signature, scalars, dtype, bound, maps):
        self.lock = threading.Lock()
        self.maps = []
        self.pointers = [ctypes.c_uint64(0) for _ in range(3)]
        values = []
        kinds = list(signature.values())
        for shape, strides, meta in zip((bound.x_shape, bound.w_shape), (bound.x_strides, bound.w_strides), maps):
            self.maps.append(_TensorMap(shape, strides, meta["block_size"], meta["swizzle"], dtype))
            values += [self.maps[-1].value, *(ctypes.c_int32(v) for v in shape), *(ctypes.c_int64(v) for v in strides)]
        values += self.pointers
        for kind, value in zip(kinds[5:], scalars):
            if kind != "constexpr":  # (Triton makes integers equal to 1 constexpr)
                values.append(_INTEGER_TYPES.get(kind, ctypes.c_void_p)(value))
        values += _scratch_pointers(metadata)
        # The parameters' sizes as packed, for of() to check against the PTX's (a kind not known here: none).
        known = all(k.startswith("tensordesc") for k in kinds[:2]) and all(
            k in _INTEGER_TYPES or k == "constexpr" for k in kinds[5:])
        self.sizes = [ctypes.sizeof(v) for v in values] if known else None
        self.launch = driver.Launch(function, grid, 32 * metadata.num_warps, metadata.shared, 0, values,
                                    dependent=bool(getattr(metadata, "launch_pdl", False)))

    def __call__(self, stream: int, x: int, w: int, w_lo: int, bias: int, out: int) -> None:
        with self.lock:  # (the maps and pointers are read by the driver during the launch)
            for tensor_map, address in zip(self.maps, (x, w)):
                if tensor_map.address != address:
                    tensor_map.encode(address)
            for slot, address in zip(self.pointers, (w_lo, bias, out)):
                slot.value = address
            self.launch(stream)
