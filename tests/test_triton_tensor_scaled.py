"""TF32 mode's FP16 operands scaled per tensor (backends/triton/tensor_scaled.py), under TRITON_INTERPRET=1 on the CPU
(and natively on a GPU). The forward's results in this form are also checked by test_triton_forward.py's TF32 tests,
which take it by default."""

import pytest
import torch

from conftest import assert_close_rel, float64_reference, layer_args, run_in_sample, skip_without_usable_triton

skip_without_usable_triton()
from convt3d.backends.triton import forward, tap_columns, tensor_scaled  # noqa: E402
from convt3d.backends.triton.tensor_scaled import FP16_TENSOR_SCALED  # noqa: E402
from convt3d.plan import make_plan  # noqa: E402
from test_triton_forward import CASES, DEVICE, round_to_tf32, tensors  # noqa: E402


def scaled_fp16(t: torch.Tensor, e: int) -> torch.Tensor:
    return (round_to_tf32(t) * 2.0**e).half()


@pytest.mark.parametrize("cfg, held", [(CASES[0], False), (CASES[2], False), (CASES[4], True)],
                         ids=["one_phase", "groups", "held"])
def test_operands_are_tf32_rounded_and_scaled_into_fp16(cfg, held):
    """Both operands TF32-rounded, times 2**e with e putting the tensor's largest magnitude in [2^14, 2^15), as FP16 in
    the TF32 pass's layouts; the sync words zero again afterwards, with e_x and e_w left for the main kernel. In
    both of the pass's forms: the tiles held in registers (here, a layer of one tile), or read again."""
    x, w, _ = tensors(cfg, torch.float32)
    x = (x * 3.0).transpose(3, 4)  # any strides, a largest magnitude not a power of two
    # (a GPU holds these small layers whole)
    assert tensor_scaled._geometry(tuple(x.shape), tuple(w.shape), cfg["groups"], tensor_scaled.cuda_index(x.device),
                                   True)[-1] == (
        held or DEVICE == "cuda")
    x_op, w_op, sync = forward._operands(x, w, cfg["groups"], FP16_TENSOR_SCALED)
    e_x, e_w = sync[4].item(), sync[5].item()
    assert tensor_scaled.cleared(sync)
    for t, e in ((x, e_x), (w, e_w)):
        assert 2.0**14 <= t.abs().max().item() * 2.0**e < 2.0**15
    c_in, c_out_g = w.shape[:2]
    w_expected = w.reshape(cfg["groups"], c_in // cfg["groups"], c_out_g, -1).permute(3, 0, 2, 1)
    assert x_op.dtype == w_op.dtype == torch.float16
    assert torch.equal(x_op, scaled_fp16(x.permute(0, 2, 3, 4, 1), e_x))
    assert torch.equal(w_op, scaled_fp16(w_expected, e_w))


def test_weight_tiles_over_several_channel_and_column_blocks():
    """The weight in tiles of 64 channels of one group by (co, tap) columns: here two groups of 96 channels (a second,
    partial channel block) by 5 x 8 columns (more than one column block under the interpreter's 2,048-element
    tiles, the last partial)."""
    assert tensor_scaled._geometry((1, 192, 1, 2, 2), (192, 5, 2, 2, 2), 2, None, True)[2:5] == (2 * 2 * 2, 64, 32)
    x, w = torch.rand(1, 192, 1, 2, 2, device=DEVICE) - 0.5, torch.randn(192, 5, 2, 2, 2, device=DEVICE)
    x_op, w_op, sync = forward._operands(x, w, 2, FP16_TENSOR_SCALED)
    w_expected = w.reshape(2, 96, 5, -1).permute(3, 0, 2, 1)
    assert torch.equal(w_op, scaled_fp16(w_expected, sync[5].item()))
    assert torch.equal(x_op, scaled_fp16(x.permute(0, 2, 3, 4, 1), sync[4].item()))


# Each kernel on a case it serves: the general one on every case, tap_columns on those with W stride 1 or 2.
KERNEL_CASES = [("general", i) for i in range(len(CASES))] + [("tap_columns", i) for i in (0, 3, 4)]


@pytest.mark.parametrize("kernel, case", KERNEL_CASES, ids=[f"{k}-{i}" for k, i in KERNEL_CASES])
def test_results_are_the_tf32_rounded_operands_sums(kernel, case):
    """Values within 2^28 of their tensor's largest convert to FP16 exactly, so each sum is that of the TF32-rounded
    operands, also with one input value 2^20 above the others (checked per element, so that the others count)."""
    run_in_sample(case != 1)  # (CASES[1], the largest, took 40 s of the interpreter's time)
    cfg = CASES[case]
    x, w, b = tensors(cfg, torch.float32)
    # Every value within 2^28 of the largest, as the claim needs: the few normal draws below 2^-8 (about 0.3% of
    # them) would otherwise land in FP16's subnormals and keep fewer bits.
    x = torch.where(x.abs() < 2.0**-8, 2.0**-8, x)
    x[0, 0, 0, 0, 0] = 2.0**20
    plan = make_plan(tuple(x.shape), tuple(w.shape), **layer_args(cfg))
    config = forward._configs()[0] if kernel == "general" else tap_columns.configs(plan)[0]
    y = forward.conv_transpose3d_triton(x, w, b, plan, FP16_TENSOR_SCALED, config=config)
    x, w = round_to_tf32(x), round_to_tf32(w)
    expected = float64_reference(x, w, b, cfg)
    # Per element: float32 sums of at most a few hundred products stay within 1e-5 of the sum of their magnitudes.
    magnitude = float64_reference(x.abs(), w.abs(), b.abs() if b is not None else None, cfg)
    assert ((y.double() - expected).abs() <= 1e-5 * magnitude).all()
    assert_close_rel(y, expected, 1e-6)


def test_infinities_and_nans_stay_and_leave_the_scale_to_the_finite_values(monkeypatch):
    """The scale comes from the largest finite magnitude, so an infinity does not push the other values into
    FP16's subnormals: every output is what TF32 operands give, the infinite and NaN ones included."""
    cfg = CASES[3]  # (a small one: the interpreter runs the layer twice)
    x, w, b = tensors(cfg, torch.float32)
    x[0, 0, 0, 1, 2] = float("inf")
    x[0, 3, 1, 2, 3] = float("nan")
    plan = make_plan(tuple(x.shape), tuple(w.shape), **layer_args(cfg))
    config = forward._configs()[0]
    y = forward.conv_transpose3d_triton(x, w, b, plan, FP16_TENSOR_SCALED, config=config)
    monkeypatch.setattr(tensor_scaled, "TF32_AS_FP16", False)
    expected = forward.conv_transpose3d_triton(x, w, b, plan, forward.TF32, config=config)
    assert expected.isnan().any() and expected.isinf().any()
    assert torch.equal(y.isnan(), expected.isnan()) and torch.equal(y.isinf(), expected.isinf())
    finite = y.isfinite()
    assert_close_rel(y[finite], expected[finite], 1e-6)


def test_tf32_mode_takes_this_form_where_the_pass_holds_the_layer(monkeypatch):
    """Float32 in TF32 mode only, unless switched off; natively only layers whose tiles the pass holds (here, a GPU's
    multiprocessors made 2: two tiles of 64 channels by 256 positions)."""
    x, w = torch.rand(2, 64, 1, 16, 16), torch.rand(64, 2, 3, 3, 3)
    assert tensor_scaled.operand_precision(x, w, 1, forward.TF32) == FP16_TENSOR_SCALED
    assert tensor_scaled.operand_precision(x, w, 1, forward.TF32X3) == forward.TF32X3
    assert tensor_scaled.operand_precision(x.half(), w.half(), 1, forward.NATIVE) == forward.NATIVE
    monkeypatch.setattr(tensor_scaled, "cuda_index", lambda device: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: type("P", (), {"multi_processor_count": 2}))
    tensor_scaled._geometry.cache_clear()
    assert tensor_scaled.operand_precision(x, w, 1, forward.TF32) == FP16_TENSOR_SCALED
    assert tensor_scaled._geometry((2, 64, 1, 16, 16), (64, 2, 3, 3, 3), 1, 0, True) == (2, 2, 2, 64, 32, True)
    # (held, the pass indexes the input in 32 bits: an input whose offsets do not fit is not held)
    assert tensor_scaled._geometry((2, 64, 1, 16, 16), (64, 2, 3, 3, 3), 1, 0, False)[-1] is False
    assert tensor_scaled.operand_precision(torch.rand(3, 64, 1, 16, 16), w, 1, forward.TF32) == forward.TF32
    tensor_scaled._geometry.cache_clear()
    monkeypatch.setattr(tensor_scaled, "TF32_AS_FP16", False)
    assert tensor_scaled.operand_precision(x, w, 1, forward.TF32) == forward.TF32


@pytest.mark.skipif(DEVICE != "cuda", reason="sync words per stream are CUDA's")
def test_sync_words_per_stream_and_thread():
    import threading

    device = torch.device("cuda", torch.cuda.current_device())
    stream = torch.cuda.Stream()
    current = torch.cuda.current_stream().cuda_stream
    first = tensor_scaled.sync_words(device, current)
    assert tensor_scaled.sync_words(device, current) is first
    assert tensor_scaled.sync_words(device, stream.cuda_stream) is not first
    in_thread = []
    thread = threading.Thread(target=lambda: in_thread.append(tensor_scaled.sync_words(device, current)))
    thread.start()
    thread.join()
    assert in_thread[0] is not first
