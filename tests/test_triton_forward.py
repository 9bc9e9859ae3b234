"""The fused Triton forward, under TRITON_INTERPRET=1 on the CPU (and natively on a GPU)."""

import ctypes
import itertools
import random
import re

import pytest
import torch
import torch.nn.functional as F

import convt3d
from conftest import (assert_close_rel, float64_reference, layer_args, make_tensors, random_config, run_in_sample,
                      skip_without_usable_triton)

skip_without_usable_triton()
import triton  # noqa: E402
from convt3d.backends.triton import tensor_scaled  # noqa: E402
from convt3d.backends.triton.forward import (  # noqa: E402
    NATIVE, TF32, TF32X3, _configs, _operands, conv_transpose3d_triton, operand_pass_weight_tile, weight_tiles)
from convt3d.plan import make_plan  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def round_to_tf32(t: torch.Tensor) -> torch.Tensor:
    """Reference rounding: float32 to 10 mantissa bits, nearest, ties away from zero."""
    bits = t.float().contiguous().view(torch.int32)
    return ((bits + 0x1000) & -8192).view(torch.float32)


# Each call takes the next tile config in turn, so that every config meets several layers without autotuning
# (compiling all of them for every layer would take most of the GPU run); autotuning has its own tests.
_next_config = itertools.cycle(_configs())


def run(x, w, b, cfg, precision):
    plan = make_plan(tuple(x.shape), tuple(w.shape), **layer_args(cfg))
    for _ in _configs():
        try:
            y = conv_transpose3d_triton(x, w, b, plan, precision=precision, config=next(_next_config))
            break
        except triton.runtime.errors.OutOfResources:  # e.g. the largest tiles with 3xTF32's doubled operands
            continue
    assert y.shape == plan.output_shape
    return y


def tensors(cfg, dtype):
    x, w, b = make_tensors(dict(cfg, unbatched=False), torch.float32, DEVICE)
    return x.to(dtype), w.to(dtype), (b.to(dtype) if b is not None else None)


CASES = [
    # Problem 77 in miniature: one non-empty phase of eight, taps cut at the borders.
    dict(batch=2, in_channels=4, out_channels=8, groups=1, kernel_size=(3, 3, 3), stride=2, padding=1, dilation=2,
         output_padding=0, spatial=(3, 5, 6), bias=False),
    # Tile edges: widths and heights not multiples of the block; more channels than one block.
    dict(batch=1, in_channels=20, out_channels=40, groups=1, kernel_size=(2, 3, 4), stride=(1, 2, 3),
         padding=(0, 1, 2), dilation=1, output_padding=(0, 1, 2), spatial=(2, 7, 13), bias=True),
    # Groups, dilation, stride 3 with phases only some taps reach.
    dict(batch=2, in_channels=6, out_channels=9, groups=3, kernel_size=(3, 2, 3), stride=(3, 3, 2), padding=(2, 0, 1),
         dilation=(2, 1, 3), output_padding=(1, 0, 2), spatial=(3, 4, 5), bias=True),
    # k2 s2 (U-Net) and k4 s2 p1 (VAE decoder).
    dict(batch=1, in_channels=5, out_channels=3, groups=1, kernel_size=(2, 2, 2), stride=2, padding=0, dilation=1,
         output_padding=0, spatial=(3, 3, 4), bias=True),
    dict(batch=1, in_channels=3, out_channels=4, groups=1, kernel_size=(4, 4, 4), stride=2, padding=1, dilation=1,
         output_padding=0, spatial=(2, 3, 5), bias=False),
    # Padding so large that whole phases read nothing.
    dict(batch=1, in_channels=2, out_channels=2, groups=1, kernel_size=(1, 3, 3), stride=(4, 2, 2), padding=(0, 2, 3),
         dilation=1, output_padding=(3, 1, 0), spatial=(2, 2, 4), bias=True),
]


# TF32 mode's two forms: operands as FP16 scaled per tensor (tensor_scaled.py, the default) on every case, and TF32
# itself (CONVT3D_TF32_AS_FP16=0) on two small ones.
@pytest.mark.parametrize("as_fp16, cfg", [(True, cfg) for cfg in CASES] + [(False, CASES[0]), (False, CASES[4])],
                         ids=[f"fp16-{i}" for i in range(len(CASES))] + ["tf32-0", "tf32-4"])
def test_tf32_rounds_operands_to_nearest(as_fp16, cfg, monkeypatch):
    run_in_sample(CASES.index(cfg) % 2 == 0 or not as_fp16)  # the other cases in tf32x3 below
    monkeypatch.setattr(tensor_scaled, "TF32_AS_FP16", as_fp16)
    x, w, b = tensors(cfg, torch.float32)
    y = run(x, w, b, cfg, TF32)
    # Exactly the products of the TF32-rounded operands, summed in float32.
    ref_rounded = F.conv_transpose3d(round_to_tf32(x).double(), round_to_tf32(w).double(),
                                     b.double() if b is not None else None, **layer_args(cfg))
    assert_close_rel(y, ref_rounded, 1e-6)
    ref = float64_reference(x, w, b, cfg)
    assert_close_rel(y, ref, 2e-3)  # TF32 keeps 11 significant bits


@pytest.mark.parametrize("cfg", CASES, ids=range(len(CASES)))
def test_tf32x3_is_float32_accurate(cfg):
    run_in_sample(CASES.index(cfg) % 2 == 1)  # the cases tf32_rounds leaves out
    x, w, b = tensors(cfg, torch.float32)
    ref = float64_reference(x, w, b, cfg)
    assert_close_rel(run(x, w, b, cfg, TF32X3), ref, 1e-6)


# float16 keeps 11 significant bits, bfloat16 8: the output's own rounding dominates. Sampled: each case in one
# dtype, in turn.
@pytest.mark.parametrize("dtype, rel", [(torch.float16, 2e-3), (torch.bfloat16, 1.5e-2)])
@pytest.mark.parametrize("cfg", CASES[:3], ids=range(3))
def test_half_precision(cfg, dtype, rel):
    run_in_sample((CASES.index(cfg) + (dtype == torch.bfloat16)) % 2 == 0)
    x, w, b = tensors(cfg, dtype)
    y = run(x, w, b, cfg, NATIVE)
    assert y.dtype == dtype
    ref = float64_reference(x, w, b, cfg)
    assert_close_rel(y, ref, rel)


@pytest.mark.parametrize("precision", [NATIVE, TF32, TF32X3])
def test_operand_pass_layouts(precision):
    """The input channels-last, rounded under TF32 and left whole under 3xTF32 (the kernels split it as they load it);
    the weight (taps, groups, C_out/g, C_in/g), rounded or split into a high part and a rounded remainder."""
    cfg = CASES[2]  # groups
    x, w, _ = tensors(cfg, torch.float32)
    x = x.transpose(3, 4)  # any strides
    x_op, w_op, w_lo = _operands(x, w, cfg["groups"], precision)
    x_expected = x.permute(0, 2, 3, 4, 1)
    c_in, c_out_g = w.shape[:2]
    w_expected = w.reshape(cfg["groups"], c_in // cfg["groups"], c_out_g, -1).permute(3, 0, 2, 1)
    if precision == TF32:
        x_expected, w_expected = round_to_tf32(x_expected), round_to_tf32(w_expected)
    elif precision == TF32X3:
        w_lo_expected = round_to_tf32(w_expected - round_to_tf32(w_expected))
        w_expected = round_to_tf32(w_expected)
        assert torch.equal(w_lo, w_lo_expected) and w_lo.abs().max() > 0
    if precision != TF32X3:
        assert w_lo is w_op
    assert torch.equal(x_op, x_expected) and torch.equal(w_op, w_expected)


@pytest.mark.parametrize("precision", [TF32, TF32X3])
def test_operand_pass_weight_tiles(precision):
    """The pass reads the weight in tiles of up to 32 channels of one group by 1,024 / 32 (co, tap) columns
    (forward.tap_major_tile): here two groups of 48 channels (a second, partial channel block) by 5 x 8 columns (a
    second, partial column block)."""
    assert operand_pass_weight_tile(48) == (32, 32) and operand_pass_weight_tile(3) == (4, 256)
    assert weight_tiles(2, 48, 5 * 8, 32, 32) == (2, 2, 2 * 2 * 2)
    x, w = torch.rand(1, 96, 1, 2, 2, device=DEVICE) - 0.5, torch.randn(96, 5, 2, 2, 2, device=DEVICE)
    _, w_op, w_lo = _operands(x, w, 2, precision)
    w_expected = w.reshape(2, 48, 5, -1).permute(3, 0, 2, 1)
    assert torch.equal(w_op, round_to_tf32(w_expected))
    if precision == TF32X3:
        assert torch.equal(w_lo, round_to_tf32(w_expected - round_to_tf32(w_expected)))


@pytest.mark.parametrize("seed", range(12))
def test_random_configs_tf32x3(seed):
    run_in_sample(seed % 2 == 0)
    cfg = random_config(random.Random(7000 + seed))
    cfg["batch"] = max(1, cfg["batch"])
    x, w, b = tensors(cfg, torch.float32)
    ref = float64_reference(x, w, b, cfg)
    assert_close_rel(run(x, w, b, cfg, TF32X3), ref, 1e-6, str(cfg))


def test_strided_and_channels_last_inputs_keep_pytorchs_memory_format():
    # Groups and bias (CASES[1] took 89 s of the interpreter here), output_padding below stride: PyTorch's kernel
    # (oneDNN on the CPU, cuDNN) keeps the channels-last layout, so the kernel stores into a channels-last output.
    cfg = dict(CASES[2], output_padding=(1, 0, 1))
    x, w, b = tensors(cfg, torch.float32)
    ref = F.conv_transpose3d(x.double(), w.double(), b.double(), **layer_args(cfg))
    x_cl = x.to(memory_format=torch.channels_last_3d)
    y = run(x_cl, w, b, cfg, TF32X3)
    assert y.stride() == F.conv_transpose3d(x_cl, w, b, **layer_args(cfg)).stride()
    assert y.is_contiguous(memory_format=torch.channels_last_3d)
    assert_close_rel(y, ref, 1e-6)
    x_t = x.transpose(3, 4).contiguous().transpose(3, 4)
    assert_close_rel(run(x_t, w, b, cfg, TF32X3), ref, 1e-6)


def test_functional_backend_triton_and_batch_zero():
    cfg = CASES[0]
    x, w, b = tensors(cfg, torch.float32)
    with torch.backends.cudnn.flags(allow_tf32=False):
        y = convt3d.conv_transpose3d(x, w, None, **layer_args(cfg), backend="triton")
    assert_close_rel(y, F.conv_transpose3d(x.double(), w.double(), None, **layer_args(cfg)), 1e-6)
    empty = convt3d.conv_transpose3d(x[:0], w, None, **layer_args(cfg), backend="triton")
    assert empty.shape == (0, *y.shape[1:])


@pytest.mark.parametrize("transform", ["vmap", "jvp"])
def test_backend_triton_under_vmap_and_jvp(transform):
    """backend="triton" under torch.func.vmap and jvp, whose wrapped tensors its kernels cannot read (before, "Cannot
    access storage of TensorWrapper"): PyTorch's kernel runs there, against float64 (TF32 off)."""
    cfg = CASES[0]
    x, w, _ = tensors(cfg, torch.float32)
    other = torch.randn_like(x)
    ours = lambda x: convt3d.conv_transpose3d(x, w, None, **layer_args(cfg), backend="triton")  # noqa: E731
    reference = lambda x: F.conv_transpose3d(x, w.double(), None, **layer_args(cfg))  # noqa: E731
    with torch.backends.cudnn.flags(allow_tf32=False):
        if transform == "vmap":
            actual, expected = torch.func.vmap(ours)(torch.stack([x, other])), torch.func.vmap(reference)(
                torch.stack([x, other]).double())
        else:
            actual = torch.func.jvp(ours, (x,), (other,))[1]
            expected = torch.func.jvp(reference, (x.double(),), (other.double(),))[1]
    assert_close_rel(actual, expected, 1e-6)


def test_every_element_written(nan_poisoned_allocator):
    """The output is allocated uninitialised: poison what the allocator hands out and check no NaN survives."""
    cfg = CASES[5]
    x, w, b = tensors(cfg, torch.float32)
    plan = make_plan(tuple(x.shape), tuple(w.shape), **layer_args(cfg))
    y = conv_transpose3d_triton(x, w, b, plan, precision=TF32X3)
    ref = F.conv_transpose3d(x.double(), w.double(), b.double(), **layer_args(cfg))
    assert_close_rel(y, ref, 1e-6)


@pytest.mark.parametrize("mode", ["off", "wait", "early"])
@pytest.mark.parametrize("kernel", ["forward", "tiled"])
def test_main_kernel_launched_as_the_passs_dependent(monkeypatch, nan_poisoned_allocator, mode, kernel):
    """On Hopper and later the main kernel may be launched as the operand pass's dependent (dependent_launch_mode):
    it then starts before the pass ends and must wait for the pass's writes. Each mode's result against float64,
    into poisoned memory, and, on such a GPU, each launch's attribute as the mode says (in the interpreter every
    mode launches as "off")."""
    import convt3d.backends.triton as triton_backend
    from convt3d.backends.triton import forward, tiled

    monkeypatch.setattr(triton_backend, "dependent_launch_mode", mode)
    cfg = CASES[5] if kernel == "forward" else CASES[3]
    x, w, b = tensors(cfg, torch.float32)
    plan = make_plan(tuple(x.shape), tuple(w.shape), **layer_args(cfg))
    if kernel == "forward":
        y = conv_transpose3d_triton(x, w, b, plan, precision=TF32X3, config=_configs()[0])
    else:
        y = tiled.conv_transpose3d_tiled(x, w, b, plan, precision=TF32X3, config=tiled.configs()[0])
    assert_close_rel(y, F.conv_transpose3d(x.double(), w.double(), b.double(), **layer_args(cfg)), 1e-6)
    hopper = DEVICE == "cuda" and torch.cuda.get_device_capability()[0] >= 9
    assert forward.dependent_options(0) == ((("PDL", True), ("launch_pdl", True)) if hopper and mode != "off"
                                            else (("PDL", False),))
    assert triton_backend.pass_lets_main_start(x.device) == (hopper and mode == "early")


def test_unsupported_reason_names_samples_past_32_bit_offsets():
    from convt3d.backends.triton import unsupported_reason

    x = torch.rand(1, 1, 1, 1, 1, device=DEVICE)  # the sizes come from the plan
    small = make_plan((2, 8, 4, 4, 4), (8, 8, 2, 2, 2), stride=2)
    assert unsupported_reason(x, small) is None
    large = make_plan((1, 64, 64, 1024, 1024), (64, 64, 2, 2, 2), stride=2)  # 2**35 outputs per sample
    assert "2**31" in unsupported_reason(x, large)


def test_an_interpreter_that_cannot_run_the_kernels_is_named_before_any_work(monkeypatch):
    # Triton 3.6's interpreter with NumPy 2.4.6 or 2.5.2 fails inside every kernel (backends/triton/probe.py): the
    # backend says so up front. (The failing pair itself was checked by hand: Triton 3.6.0 with NumPy 2.4.6.)
    import convt3d.backends.triton as triton_backend

    if not triton_backend.interpreted():
        pytest.skip("the interpreter's check (TRITON_INTERPRET=1)")
    assert triton_backend._interpreter_runs_loops()  # this machine's Triton and NumPy run them
    x, w, b = torch.rand(1, 3, 2, 3, 5), torch.randn(3, 5, 3, 3, 3), torch.randn(5)  # a layer no other test prepares
    before = x.clone()
    monkeypatch.setattr(triton_backend, "_interpreter_runs_loops", lambda: False)
    with pytest.raises(RuntimeError, match="backend='triton' cannot run this call: Triton's interpreter here"):
        convt3d.conv_transpose3d(x, w, b, stride=2, backend="triton")
    assert torch.equal(x, before)


@pytest.mark.parametrize("version, usable", [("3.0.0", False), ("3.4.1+git1a2b", False), ("3.5.0", True),
                                             ("3.10.1", True), ("4.0.0", True)])
def test_a_triton_older_than_3_5_is_named_and_the_paths_without_it_serve(monkeypatch, version, usable):
    """convt3d's Triton kernels need Triton 3.5 (older ones failed to compile or run them: triton.OLDEST_TRITON): an
    older one counts as none, so that backend="triton" says why before any work, the bias fill and the CUDA
    correlation (whose operand pass is Triton's) step aside, and "auto" takes the portable path."""
    import triton

    import convt3d.backends.triton as triton_backend
    from convt3d.backends import torch_phase

    monkeypatch.setattr(triton, "__version__", version)
    for cached in (triton_backend.triton_unusable, torch_phase._triton_fill):
        cached.cache_clear()
    try:
        assert triton_backend.triton_available() is usable
        assert (torch_phase._triton_fill() is not None) is usable
        x, w, b = torch.rand(1, 3, 2, 3, 4), torch.randn(3, 5, 3, 3, 3), torch.randn(5)
        expected = F.conv_transpose3d(x.double(), w.double(), b.double(), stride=2)
        out = convt3d.conv_transpose3d(x, w, b, stride=2, backend="auto")
        assert_close_rel(out, expected, 1e-5)
        if not usable:
            with pytest.raises(RuntimeError, match=f"backend='triton' cannot run this call: Triton {re.escape(version)} "
                                                   "is older than 3.5"):
                convt3d.conv_transpose3d(x, w, b, stride=2, backend="triton")
    finally:
        monkeypatch.undo()  # (the caches then hold what this machine's own Triton gives)
        for cached in (triton_backend.triton_unusable, torch_phase._triton_fill):
            cached.cache_clear()


@pytest.mark.parametrize("value", ["1", "true", "On", "0", "false", ""])
def test_interpreted_reads_triton_interpret_as_triton_jit_does(monkeypatch, value):
    # TRITON_INTERPRET=true makes triton.jit interpret its kernels; the backend once took only "1" for it, and so
    # sent CPU tensors away ("needs TRITON_INTERPRET=1") and would have launched interpreted kernels as compiled ones.
    import triton
    from triton.runtime.interpreter import InterpretedFunction

    import convt3d.backends.triton as triton_backend

    monkeypatch.setenv("TRITON_INTERPRET", value)

    def kernel(x_ptr):
        pass

    assert triton_backend.interpreted() is isinstance(triton.jit(kernel), InterpretedFunction)


@pytest.mark.parametrize("allow_tf32", [True, False])
def test_auto_tries_triton_at_float32_accuracy_where_its_tf32_result_disagrees(monkeypatch, caplog, allow_tf32):
    # cuDNN runs some layers in float32 although TF32 is allowed (grouped ones, on the H200): the TF32 result then
    # fails the agreement check, and "auto" times the same kernel in 3xTF32 instead. With TF32 off the kernel
    # already computes at float32 accuracy: nothing to retry.
    import logging

    import convt3d.backends.triton as triton_backend
    from convt3d import functional
    from convt3d.backends.triton import forward

    real_run, real_triton = functional.run_backend, forward.conv_transpose3d_triton
    precisions = []

    def run(name, input, weight, bias, plan):
        if name == "eager":  # float32 accurate, as cuDNN's float32 kernels (eager in TF32 on a GPU would not be)
            return real_run(name, input.double(), weight.double(), None, plan).float()
        out = real_run(name, input, weight, bias, plan)
        return out + 1e-2 if name == "triton" and allow_tf32 else out  # the TF32 result strays from it

    def spy(*args, **kwargs):
        precisions.append(args[4] if len(args) > 4 else kwargs.get("precision"))
        return real_triton(*args, **kwargs)

    monkeypatch.setattr(functional, "run_backend", run)
    monkeypatch.setattr(forward, "conv_transpose3d_triton", spy)
    monkeypatch.setattr(triton_backend, "_prepared", {})  # each precision's first call reaches the spy
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", allow_tf32)
    caplog.set_level(logging.DEBUG, logger="convt3d")
    x, w = torch.rand(1, 4, 3, 4, 4, device=DEVICE), torch.randn(4, 3, 3, 3, 3, device=DEVICE)
    plan = make_plan(tuple(x.shape), tuple(w.shape), 2, 1, 0, 1, 1)
    functional._fastest(["triton", "eager"], x, w, None, plan)
    timed = caplog.text.split("auto's median times")[-1]
    if allow_tf32:
        assert "auto skips triton for" in caplog.text
        assert "'triton_float32'" in timed and TF32X3 in precisions
    else:  # (the flags' precision, TF32X3 here, is what the backend's entry hands the kernel module)
        assert "auto skips" not in caplog.text and "triton_float32" not in caplog.text
        assert "'triton'" in timed and set(precisions) == {TF32X3}


def test_the_float32_candidate_is_float32_accurate():
    from convt3d import functional

    x, w = torch.rand(2, 6, 3, 4, 5, device=DEVICE), torch.randn(6, 2, 3, 3, 3, device=DEVICE)
    b = torch.randn(4, device=DEVICE)
    plan = make_plan(tuple(x.shape), tuple(w.shape), 2, 1, 1, 2, 1)
    y = functional.run_backend("triton_float32", x, w, b, plan)
    reference = F.conv_transpose3d(x.double(), w.double(), b.double(), 2, 1, 1, 2, 1)
    assert_close_rel(y, reference, 1e-6)


def test_autotune_keeps_the_fastest_config_that_fits_and_logs_the_times(monkeypatch, caplog):
    # Timing needs a GPU; do_bench is replaced by each config's stated time, or by the error of a config whose
    # tiles do not fit in shared memory.
    import logging

    from convt3d.backends.triton import forward

    def do_bench(fn, warmup, rep):
        ms = fn()
        if ms is None:
            raise triton.runtime.errors.OutOfResources(245760, 232448, "shared memory")
        return ms

    monkeypatch.setattr(triton.testing, "do_bench", do_bench)
    caplog.set_level(logging.DEBUG, logger="convt3d")
    candidates = [dict(ms=0.05), dict(ms=None), dict(ms=0.03), dict(ms=0.04)]
    assert forward._autotune(lambda cfg: cfg["ms"], candidates, "layer") == dict(ms=0.03)
    assert "{'ms': 0.03} for layer" in caplog.text and "{0: 0.05, 2: 0.03, 3: 0.04}" in caplog.text
    with pytest.raises(RuntimeError, match="no Triton tile config fits"):
        forward._autotune(lambda cfg: None, [dict(), dict()], "layer")


@pytest.mark.parametrize("kernel", ["forward", "tiled"])
def test_the_chosen_configs_launch_serves_later_calls(monkeypatch, kernel):
    """After its first call a layer's launch is bound once and kept (_chosen), with nothing but the pointers
    changing between calls. The interpreter never remembers a config (no timing), so the choice is stood in for
    here: the first candidate, remembered as the autotuner would."""
    from convt3d.backends.triton import forward, tiled

    module, run_layer = (forward, conv_transpose3d_triton) if kernel == "forward" else (
        tiled, tiled.conv_transpose3d_tiled)
    picks = []

    def remember_first(cache, key, candidates, launch, device):
        picks.append(key)
        cache[key] = candidates[0]
        return cache[key]

    monkeypatch.setattr(module, "pick_config", remember_first)
    monkeypatch.setattr(module, "_best_config", {})
    monkeypatch.setattr(module, "_chosen", {})
    # Small layers: the interpreter took 120 s for three calls of CASES[1].
    cfg = dict(CASES[0], batch=1) if kernel == "forward" else CASES[3]  # (one sample: half the interpreter's time)
    plan = make_plan(tuple(tensors(cfg, torch.float32)[0].shape), tuple(tensors(cfg, torch.float32)[1].shape),
                     **layer_args(cfg))
    for _ in range(3):  # fresh inputs each time, through the same bound launches
        x, w, b = tensors(cfg, torch.float32)
        y = run_layer(x, w, b, plan, TF32X3)
        reference = F.conv_transpose3d(x.double(), w.double(), b.double() if b is not None else None,
                                       plan.stride, plan.padding, plan.output_padding, plan.groups, plan.dilation)
        assert_close_rel(y, reference, 1e-6)
    assert len(picks) == 1 and len(module._chosen) == 1


def tensor_at(address: int, dtype) -> torch.Tensor:
    """A CPU tensor over the memory at address. The interpreter reads and writes a kernel's pointers by address
    (masks decide which; the tensor's claimed size does not), so a launch at addresses can be run in it."""
    return torch.frombuffer((ctypes.c_char * 16).from_address(address), dtype=dtype)


def interpreted_at_addresses(launched: list):
    """launch.BoundLaunch.at_addresses for the interpreter, which compiles nothing: the launch it returns records
    its addresses and runs the kernel on CPU tensors over them."""
    def at_addresses(bound, device, dtypes):
        def launch(stream, *addresses):
            launched.append(addresses)
            bound.kernel[bound.grid](*[tensor_at(a, dtype) for a, dtype in zip(addresses, dtypes)], *bound.scalars,
                                     **bound.options)
        return launch
    return at_addresses


@pytest.mark.parametrize("kernel, dtype, precision", [
    ("forward", torch.float32, TF32X3), ("forward", torch.bfloat16, NATIVE), ("forward", torch.float32, TF32),
    ("tiled", torch.float32, TF32X3), ("tiled", torch.float32, TF32), ("tiled", torch.float16, NATIVE)])
def test_later_calls_go_through_the_prepared_call(monkeypatch, nan_poisoned_allocator, kernel, dtype, precision):
    """After a layer's first call with contiguous operands, backends.triton.conv_transpose3d keeps that call bound
    (the kernel module's prepare()) and serves later calls with it: fresh inputs, bias or none, into NaN-poisoned
    memory, against float64, its launches taking the operands' addresses (natively on a GPU; in the interpreter
    through tensors over those addresses). A misaligned input then goes through the prepared call's launches with
    tensors (what serves where no launch at addresses does: in the interpreter, every other test's later calls), a
    non-contiguous input the whole way again. The config choice is stood in for as in the test above (the
    interpreter never remembers one)."""
    import convt3d.backends.triton as triton_backend
    from convt3d.backends.triton import forward, launch, tiled

    module = forward if kernel == "forward" else tiled
    run_layer = "conv_transpose3d_triton" if kernel == "forward" else "conv_transpose3d_tiled"
    whole_calls, launched, prepared_at_addresses = [], [], []
    real = getattr(module, run_layer)
    monkeypatch.setattr(module, run_layer, lambda *a, **k: whole_calls.append(1) or real(*a, **k))
    monkeypatch.setattr(module, "pick_config", lambda cache, key, candidates, launch, device: cache.setdefault(
        key, candidates[0]))
    monkeypatch.setattr(module, "_best_config", {})
    monkeypatch.setattr(module, "_chosen", {})
    monkeypatch.setattr(triton_backend, "_prepared", {})
    real_at_addresses_else = module.at_addresses_else
    monkeypatch.setattr(module, "at_addresses_else", lambda *args: prepared_at_addresses.append(
        1) or real_at_addresses_else(*args))
    if DEVICE == "cpu":
        monkeypatch.setattr(launch.BoundLaunch, "at_addresses", interpreted_at_addresses(launched))
        monkeypatch.setattr(forward, "ready_stream", lambda device: 0)  # (forward.at_addresses_else asks it)
    # (CASES[5], empty phases and at most four taps a phase: 24-29 s a case in the interpreter against 52-76 s for
    # CASES[0]; the calls' path, not the sums, is under test here)
    cfg = CASES[5] if kernel == "forward" else CASES[3]
    # (TF32: the tiled kernel's FP16_SCALED operands and the general kernel's FP16_TENSOR_SCALED ones, FP16 buffers
    # beside float32 input and output; the latter's sync words are addressed apart from the operands.)
    rel = 2e-3 if precision == TF32 else {torch.float32: 1e-6, torch.float16: 2e-3, torch.bfloat16: 1.5e-2}[dtype]

    def check(x, w, b, plan):
        y = triton_backend.conv_transpose3d(x, w, b, plan, precision)
        reference = F.conv_transpose3d(x.double(), w.double(), b.double() if b is not None else None,
                                       plan.stride, plan.padding, plan.output_padding, plan.groups, plan.dilation)
        assert y.dtype == dtype and y.is_contiguous()
        assert_close_rel(y, reference, rel)

    for with_bias in (True, False, True):
        x, w, b = tensors(dict(cfg, bias=with_bias), dtype)
        plan = make_plan(tuple(x.shape), tuple(w.shape), **layer_args(cfg))
        for _ in range(2):  # the first call of each (bias or not) the whole way, the second prepared
            check(x, w, b, plan)
    assert len(whole_calls) == 2 and len(triton_backend._prepared) == 2
    assert len(prepared_at_addresses) == 2
    launches_per_call = 2 if kernel == "forward" or dtype == torch.float32 else 1  # operand pass, main kernel
    assert len(launched) == (0 if DEVICE == "cuda" else 4 * launches_per_call)  # 4 prepared calls
    misaligned = torch.empty(x.numel() + 1, dtype=dtype, device=DEVICE)[1:].view(x.shape).copy_(x)
    launched.clear()
    check(misaligned, w, b, plan)
    assert not launched and len(whole_calls) == 2
    check(x.transpose(3, 4).contiguous().transpose(3, 4), w, b, plan)
    assert len(whole_calls) == 3


def test_prepared_calls_keep_one_small_operands_buffer_per_stream_and_thread(monkeypatch):
    """forward.at_addresses_else's calls share an operands' buffer per device, stream and thread, grown to the largest
    operands asked of it, where those hold at most KEPT_OPERANDS_BYTES; they allocate one on every call where they
    hold more or a CUDA graph is being captured (a stand-in launch records the addresses it is given; the streams
    and the capture are stood in for)."""
    import threading

    from convt3d.backends.triton import forward

    class Bound:
        pointers = 1

        def at_addresses(self, device, dtypes):
            return "launch"

    given, stream, capturing = [], [1], [False]
    monkeypatch.setattr(forward, "ready_stream", lambda device: stream[0])
    monkeypatch.setattr(forward, "_capturing", lambda device: capturing[0])
    monkeypatch.setattr(forward, "_kept_operands", {})
    x = torch.rand(2, 3)

    def prepared(operands_size):
        return forward.at_addresses_else(None, x, (2, 2), operands_size, (Bound(),),
                                         lambda launches, stream, x, w, b, operands, out: given.append(operands))

    def addresses(call):
        given.clear()
        call(x, x, None), call(x, x, None)
        return list(given)

    def kept_sizes():
        return sorted(size for size, _, _ in forward._kept_operands.values())

    quarter = forward.KEPT_OPERANDS_BYTES // 16  # (float32 elements: a sixteenth of the bytes kept at most)
    small, larger = prepared(quarter), prepared(2 * quarter)
    first = addresses(small)
    assert first[0] == first[1] != 0 and kept_sizes() == [4 * quarter]
    assert addresses(prepared(quarter // 2)) == first  # another layer with fewer operands: the same buffer
    grown = addresses(larger)
    assert grown[0] == grown[1] and kept_sizes() == [8 * quarter]  # more: a larger buffer in its place
    assert addresses(small) == grown
    stream[0] = 2
    assert addresses(small)[0] not in grown  # another stream: a buffer of its own
    stream[0] = 1
    assert addresses(small) == grown and kept_sizes() == [4 * quarter, 8 * quarter]  # and the first one still kept
    thread = threading.Thread(target=lambda: addresses(small))
    thread.start()
    thread.join()
    assert given[0] == given[1] and given[0] not in grown and len(kept_sizes()) == 3  # another thread: its own
    capturing[0] = True
    assert grown[0] not in addresses(small) and len(kept_sizes()) == 3  # a capture's buffers: never kept
    capturing[0] = False
    large = prepared(forward.KEPT_OPERANDS_BYTES // 4 + 1)
    assert 0 not in addresses(large) and len(kept_sizes()) == 3 and max(kept_sizes()) == 8 * quarter
    assert addresses(prepared(0)) == [0, 0]  # no operands: no buffer
