"""conv_transpose3d(): validate -> plan -> pick backend -> run."""

from __future__ import annotations

import functools
import logging
import statistics
import time

import torch

from .backends import cudnn_allow_tf32, torch_phase
from .ops import apply, cached_plan
from .plan import Plan, make_plan, single_int, triple

logger = logging.getLogger("convt3d")

BACKENDS = ("auto", "torch", "triton", "eager")


def _check_tensor(value, name: str, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")


# Arguments already validated -> (plan, unbatched). Host time counts on a GPU: KernelBench's timing (and ours) sees
# every microsecond a call spends in Python beyond the time of the L2 flush before it. On the H200 machine "auto"
# spent 47-71 us per call against F.conv_transpose3d's 30-40, and profiling on the CPU put the full checks below
# at half of convt3d's own share. Two levels: _seen, keyed by the arguments' values, serves a call that passes the
# very same argument objects again (a module's own tuples, a literal's constants); _validated, keyed by their repr,
# any other call (repr keeps apart what compares equal but is an error, True == 1 and 1.0 == 1; it costs 1 us on
# the 2-core CPU, about 10 us of the GPU machine's host).
_validated: dict = {}
_seen: dict = {}


def validate(input, weight, bias, stride, padding, output_padding, groups, dilation) -> tuple[torch.Tensor, Plan, bool]:
    """Check every argument before any work. Returns the batched input, the plan, and whether input was unbatched."""
    key = seen_key = None
    if not torch.compiler.is_compiling():
        args = (stride, padding, output_padding, groups, dilation)
        try:
            tensors = (input.shape, input.dtype, input.device, weight.shape, weight.dtype, weight.device,
                       None if bias is None else (bias.shape, bias.dtype, bias.device))
        except AttributeError:  # not tensors: the checks below say which argument
            tensors = None
        if tensors is not None:
            seen_key = (tensors, args)
            try:
                hit = _seen.get(seen_key)
            except TypeError:  # unhashable arguments (lists): by repr only
                hit = seen_key = None
            if hit is not None:
                # The same objects: ints and tuples of ints cannot have changed since they were checked.
                a = hit[2]
                if (a[0] is stride and a[1] is padding and a[2] is output_padding and a[3] is groups
                        and a[4] is dilation):
                    return (input.unsqueeze(0) if hit[1] else input), hit[0], hit[1]
            key = (tensors, repr(args))
        hit = _validated.get(key) if key is not None else None
        if hit is not None:
            plan, unbatched = hit
            if seen_key is not None and _plain_ints(args):
                _remember(_seen, seen_key, (plan, unbatched, args))
            return (input.unsqueeze(0) if unbatched else input), plan, unbatched
    batched, plan, unbatched = _validate(input, weight, bias, stride, padding, output_padding, groups, dilation)
    if key is not None:
        _remember(_validated, key, (plan, unbatched))
        if seen_key is not None and _plain_ints(args):
            _remember(_seen, seen_key, (plan, unbatched, args))
    return batched, plan, unbatched


def _plain_ints(args) -> bool:
    """Whether every argument is an int or a tuple of ints, whose values the same objects keep: _seen's identity
    check holds for them, not for what PyTorch also takes for ints (a 0-d tensor or numpy array changes in place;
    _validated's key, their repr, shows their values)."""
    return all(type(a) is int or (type(a) is tuple and all(type(v) is int for v in a)) for a in args)


def _remember(cache: dict, key, value) -> None:
    if len(cache) >= 4096:  # many distinct shapes: start over rather than grow without bound
        cache.clear()
    cache[key] = value


def _validate(input, weight, bias, stride, padding, output_padding, groups, dilation):
    _check_tensor(input, "input")
    _check_tensor(weight, "weight")
    _check_tensor(bias, "bias", optional=True)
    if input.dim() not in (4, 5):
        raise ValueError(
            f"input must be 5-D (N, C, D, H, W) or 4-D unbatched (C, D, H, W), "
            f"got {input.dim()}-D shape {tuple(input.shape)}"
        )
    if weight.dim() != 5:
        raise ValueError(f"weight must be 5-D (C_in, C_out/groups, kD, kH, kW), got shape {tuple(weight.shape)}")
    if not (input.is_floating_point() or input.is_complex()):
        raise TypeError(f"input must be a floating-point tensor, got {input.dtype}")
    if weight.dtype != input.dtype:
        raise TypeError(f"weight dtype {weight.dtype} must match input dtype {input.dtype}")
    if weight.device != input.device:
        raise ValueError(
            f"weight is on {weight.device} but input is on {input.device}; they must be on the same device")
    unbatched = input.dim() == 4
    batched = input.unsqueeze(0) if unbatched else input
    # The cache is for eager calls; torch.compile traces the plain function (it ignores lru_cache wrappers).
    build_plan = make_plan if torch.compiler.is_compiling() else cached_plan
    plan = build_plan(tuple(batched.shape), tuple(weight.shape), triple(stride, "stride"), triple(padding, "padding"),
                      triple(output_padding, "output_padding"), single_int(groups, "groups"),
                      triple(dilation, "dilation"))
    if bias is not None:
        if bias.dtype != input.dtype:
            raise TypeError(f"bias dtype {bias.dtype} must match input dtype {input.dtype}")
        if bias.device != input.device:
            raise ValueError(
                f"bias is on {bias.device} but input is on {input.device}; they must be on the same device")
        if tuple(bias.shape) != (plan.out_channels,):
            raise ValueError(
                f"bias must have shape ({plan.out_channels},) = (C_out,), got {tuple(bias.shape)}"
            )
    return batched, plan, unbatched


_choice: dict = {}


def choose_backend(input: torch.Tensor, weight: torch.Tensor, bias, plan: Plan) -> str:
    """The fastest backend for this layer, device, dtype and precision mode, timed once.

    The first call of each (layer, dtype, device, TF32 mode, thread count) times the candidates (on CUDA the
    fused Triton kernel, the torch phase path and PyTorch's own kernel; on the CPU the phase path and PyTorch's
    own) and keeps the fastest whose result agrees with PyTorch's own, as cudnn.benchmark does: no rule of
    thumb held across layers (on a 2-core CPU the phase path ran 4x faster than eager on one layer and 2x
    slower on another), and with PyTorch's own kernel among the candidates "auto" is never slower than eager
    beyond timing noise and host time.
    """
    key = _choice_key(input, bias, plan)
    choice = _choice.get(key)
    if choice is not None:
        return choice
    candidates = ["torch", "eager"]
    if input.device.type == "cuda":
        from .backends.triton import unsupported_reason

        reason = unsupported_reason(input, plan)
        if reason is None:
            candidates.insert(0, "triton")
        else:
            logger.debug("convt3d: triton backend not used (%s)", reason)
    elif all(s == 1 for s in plan.stride):
        return "eager"  # one phase: the phase path could only add a weight flip and a copy
    if input.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return candidates[0]  # no timing inside a CUDA graph capture
    _choice[key] = _fastest(candidates, input, weight, bias, plan)
    logger.debug("convt3d: auto chose %s for %s", _choice[key], plan.key)
    return _choice[key]


def without_data(t: torch.Tensor) -> bool:
    """Whether t has no data: on the meta device, or a FakeTensor (torch._subclasses.FakeTensorMode: sizes, no data;
    as a subclass, so plain tensors skip that test). A kernel of convt3d's would read memory that is not there."""
    if t.is_meta:
        return True
    if type(t) is torch.Tensor:
        return False
    from torch._subclasses.fake_tensor import is_fake

    return is_fake(t)


def _choice_key(input: torch.Tensor, bias, plan: Plan) -> tuple:
    # The plan itself (its hash computed once; the same object for the same layer), not its key, which hashes anew.
    return (plan, input.dtype, input.device, cudnn_allow_tf32(), torch.get_num_threads(), bias is not None,
            input.is_contiguous())


def chosen_backend(input: torch.Tensor, bias, plan: Plan):
    """The backend "auto" has chosen for this call's layer, dtype, device and precision mode, or None if it has not
    chosen one yet (choose_backend times them on the first call)."""
    return _choice.get(_choice_key(input, bias, plan))


# How far a candidate's result may stray from PyTorch's own on the same input, elementwise (atol = rtol):
# KernelBench's tolerances for float32 and half precision.
_AGREEMENT = {torch.float16: 1e-2, torch.bfloat16: 1e-2, torch.float32: 1e-4, torch.float64: 1e-7}


def _fastest(candidates, input, weight, bias, plan) -> str:
    """The fastest candidate (median over a few calls; near-ties on CUDA as _pick says) among those whose result
    agrees with PyTorch's own on this input: in TF32 two correct kernels can differ by more than KernelBench's
    tolerance (cuDNN runs some grouped layers without TF32, for one), and "auto" must never be the reason a check
    against eager fails.

    On CUDA each timed call follows an L2 flush (skipped if its buffer does not fit in memory), and the candidates
    take turns in blocks of consecutive calls, as a benchmark times one implementation after another, several
    rounds, so that a drift of the machine's state within a run meets them all. Taking turns call by call (one
    sweep on the H200, benchmarks/RESULTS.md, nineteenth session), the Triton kernel's median came out 2-100% above
    what the bench then measured for it in consecutive calls, while eager's agreed, and "auto" chose eager's kernel
    on unet3d_k2s2_deep, where the Triton kernel took half its time."""
    on_cuda = input.device.type == "cuda"
    # On the CPU, turns call by call as before (wall clock; a load on the machine that comes and goes meets all).
    rounds, block = (3, 4) if on_cuda else (5, 1)
    tolerance = _AGREEMENT.get(input.dtype, 1e-4)
    reference = run_backend("eager", input, weight, bias, plan)
    timed = []
    pending = list(candidates)
    while pending:
        name = pending.pop(0)
        try:
            result = run_backend(name, input, weight, bias, plan)
        except torch.cuda.OutOfMemoryError:  # beside the reference held here; eager needs no more than its call
            logger.debug("convt3d: auto skips %s for %s: out of memory", name, plan.key)
            continue
        if name != "eager" and not torch.allclose(result, reference, rtol=tolerance, atol=tolerance, equal_nan=True):
            logger.debug("convt3d: auto skips %s for %s: its result differs from eager's beyond %g",
                         name, plan.key, tolerance)
            if name == "triton" and input.dtype == torch.float32 and cudnn_allow_tf32():
                # TF32 is allowed, not required: cuDNN runs some layers (grouped ones) in float32 all the same,
                # and a TF32 result then strays from its. The Triton kernel at float32 accuracy may still win.
                pending.insert(0, "triton_float32")
            continue
        del result
        for _ in range(2 if on_cuda else 0):  # more warm-up: compilation, autotuning, algorithm search
            run_backend(name, input, weight, bias, plan)
        timed.append(name)
    del reference
    flush = None
    if on_cuda:
        from .bench.protocol import FLUSH_BYTES  # the benchmark's L2 flush

        try:
            flush = torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device=input.device)
        except torch.cuda.OutOfMemoryError:
            logger.debug("convt3d: auto times %s without an L2 flush: no memory for its buffer", plan.key)
    samples = {name: [] for name in timed}
    host = {name: [] for name in timed}  # on CUDA: the host's ms per call, from the call to its return
    for _ in range(rounds):
        for name in timed:
            if on_cuda:
                run_backend(name, input, weight, bias, plan)  # the first after another candidate: not timed
            for _ in range(block):
                if on_cuda:
                    if flush is not None:
                        flush.fill_(1)
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    t0 = time.perf_counter()
                    run_backend(name, input, weight, bias, plan)
                    host[name].append((time.perf_counter() - t0) * 1e3)
                    end.record()
                    end.synchronize()
                    samples[name].append(start.elapsed_time(end))
                else:
                    t0 = time.perf_counter()
                    run_backend(name, input, weight, bias, plan)
                    samples[name].append(time.perf_counter() - t0)
    times = {name: statistics.median(s) for name, s in samples.items()}
    host_ms = {name: statistics.median(s) for name, s in host.items()} if on_cuda else None
    logger.debug("convt3d: auto's median times for %s: %s%s", plan.key, times,
                 f"; host ms: {host_ms}" if on_cuda else "")
    return _pick(times, host_ms)


# On CUDA, candidates whose scores (_pick) lie within this fraction of the best count as equally good.
TIE = 0.05
# On CUDA, the factor by which a candidate's host time per call may grow after auto has timed it. On the H200's
# machines the phase path's host time on video_spatial_k144 with TF32 off was 0.062, 0.117 and 0.092 ms in three
# processes' auto timings; in a sweep (benchmarks/RESULTS.md, fifty-first session) auto chose it there, which its
# timing allowed only at a host time of about 0.08 ms or less, and the bench then measured it at 0.127.
HOST_SLOWDOWN = 1.5


def _pick(times: dict, host_ms: dict | None = None) -> str:
    """The candidate with the least median time. On CUDA (host_ms given), the candidate with the least score: the
    time it would take were its host HOST_SLOWDOWN times slower; among those within TIE of the best score, the one
    with the least host time per call.

    A call's CUDA time includes whatever of its host time outlasts the GPU work queued before it, so the candidate
    that needs more of the host gains most from a fast host at the moment of timing and loses most to a slow one
    later. The score takes a call whose host time exceeds its CUDA time as host-bound, its CUDA time growing as much
    as its host time, and any other as taking the longer of its CUDA time and its slower host time. On the H200
    (fifty-first session) auto's timing had the phase path on video_spatial_k144 with TF32 off at 0.0557 ms (host
    0.062) against the Triton kernel's 0.0747 (host 0.027), and in a sweep the bench measured auto's choice, the
    phase path, at 0.136 ms (host 0.127) against the Triton kernel's 0.083; scored, the phase path's 0.087 loses.
    Near-ties: in two sweeps (fortieth and forty-first sessions) auto chose the phase path over the Triton kernel on
    unet3d_k2s2 with TF32 off, 2% faster in its own timing (0.0911 against 0.0931 ms, then 0.0900 against 0.0921),
    and the bench then measured it at 0.0991 and 0.1741 ms (host 0.069 and 0.132 ms a call) against the Triton
    kernel's 0.0936 and 0.0988 (host 0.026, 0.048)."""
    if host_ms is None:
        return min(times, key=times.get)
    scores = {name: max(times[name], HOST_SLOWDOWN * host_ms[name] - max(0.0, host_ms[name] - times[name]))
              for name in times}
    best = min(scores.values())
    ties = [name for name in times if scores[name] <= (1 + TIE) * best]
    return min(ties, key=host_ms.get)


def run_backend(backend: str, input, weight, bias, plan: Plan) -> torch.Tensor:
    if backend == "torch":
        run = torch_phase.conv_transpose3d
    elif backend == "triton":
        run = _triton_forward()
    elif backend == "triton_float32":  # one of "auto"'s candidates, not a backend users name
        from .backends.triton import TF32X3

        return _triton_forward()(input, weight, bias, plan, TF32X3)
    else:
        return torch.nn.functional.conv_transpose3d(
            input, weight, bias, plan.stride, plan.padding, plan.output_padding, plan.groups, plan.dilation
        )
    return run(input, weight, bias, plan)


@functools.lru_cache(maxsize=1)
def _triton_forward():
    """The Triton backend's entry, imported on first use (Triton stays out of import time), then kept: an import
    statement per call costs host time that a GPU waits through."""
    from .backends.triton import conv_transpose3d

    return conv_transpose3d


_any_autocast_enabled = getattr(torch._C, "_is_any_autocast_enabled", None)
_jit_tracing = torch._C._is_tracing
_tracing_state, _set_tracing_state = torch._C._get_tracing_state, torch._C._set_tracing_state


def recording() -> bool:
    """Whether torch.compile (or torch.export) or torch.jit.trace records this call into a graph: the registered op
    then stands for the layer there, and no cache or bound forward of eager calls serves it (under torch.jit.trace
    sizes are traced tensors, under torch.compile they may be symbolic)."""
    return torch.compiler.is_compiling() or _jit_tracing()


def autocast_dtype(device_type: str):
    """The dtype autocast runs convolutions in on this device type, or None where it is off there (or the device
    type has no autocast, as "meta"). PyTorch puts conv_transpose3d among the operations autocast runs in its lower
    precision, on the CPU and on CUDA."""
    if _any_autocast_enabled is not None and not torch.compiler.is_compiling() and not _any_autocast_enabled():
        return None  # (one call, 0.15 us on the 2-core CPU: the common case)
    try:
        enabled = torch.is_autocast_enabled(device_type)
    except RuntimeError:  # no autocast for this device type
        return None
    return torch.get_autocast_dtype(device_type) if enabled else None


def _autocast_cast(t, dtype: torch.dtype, device_type: str):
    """t as autocast casts an operand: floating-point tensors on its device type other than float64 to dtype."""
    if (isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype not in (torch.float64, dtype)
            and t.device.type == device_type):
        return t.to(dtype)
    return t


def conv_transpose3d(
    input,
    weight,
    bias=None,
    stride=1,
    padding=0,
    output_padding=0,
    groups=1,
    dilation=1,
    *,
    backend: str = "auto",
) -> torch.Tensor:
    """Same arguments and result as torch.nn.functional.conv_transpose3d.

    backend: "auto" (the fastest of the others for this layer, timed on its first call), "torch" (portable
    phase decomposition),
    "triton" (fused Triton kernel: CUDA, or CPU under TRITON_INTERPRET=1) or "eager"
    (torch.nn.functional.conv_transpose3d itself). Autograd flows through every backend.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if isinstance(input, torch.Tensor):
        cast_to = autocast_dtype(input.device.type)
        if cast_to is not None:
            # As autocast runs F.conv_transpose3d: floating-point operands but float64 cast to its dtype (the
            # casts recorded by autograd, so gradients reach the parameters in their own dtype), then the call with
            # autocast off.
            device_type = input.device.type
            input, weight, bias = (_autocast_cast(t, cast_to, device_type) for t in (input, weight, bias))
            with torch.autocast(device_type, enabled=False):
                return conv_transpose3d(input, weight, bias, stride, padding, output_padding, groups, dilation,
                                        backend=backend)
    if not torch.compiler.is_compiling() and _jit_tracing():  # (torch.compile cannot trace _jit_tracing)
        # The checks on the sizes as numbers: under torch.jit.trace they are traced tensors, and each comparison
        # would warn that the trace might not generalise. The batching and the registered op are recorded.
        state = _tracing_state()
        _set_tracing_state(None)
        try:
            _, plan, unbatched = validate(input, weight, bias, stride, padding, output_padding, groups, dilation)
        finally:
            _set_tracing_state(state)
        batched = input.unsqueeze(0) if unbatched else input
    else:
        batched, plan, unbatched = validate(input, weight, bias, stride, padding, output_padding, groups, dilation)
    out = apply(batched, weight, bias, plan, backend)
    return out.squeeze(0) if unbatched else out
