import os
import random

import pytest
import torch

# Without a GPU, Triton kernels run in the interpreter; it must be chosen before any kernel is defined.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Under pytest-xdist each worker takes its share of the cores for PyTorch's own threads: two workers of two threads
# each on the 2-core CI machine ran test_cuda_phases.py's forward phases 15-25% and test_triton_tiled.py 7% slower.
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))

# Some parametrized tests run a sample of their combinations by default (run_in_sample): each layer in each precision,
# say, with or without a bias in turn. Their full products took the 2-core CI machine past its 15 minutes (1,083 s on
# 2026-12-02). CONVT3D_FULL_TESTS=1 runs every combination.
FULL_TESTS = os.environ.get("CONVT3D_FULL_TESTS", "0") == "1"


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device (skipped without one)")
    config.addinivalue_line("markers", "interpreter: runs Triton kernels under TRITON_INTERPRET=1 on the CPU")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def skip_without_usable_triton():
    """Skip where convt3d's Triton kernels cannot run: no Triton, or one older than triton.OLDEST_TRITON (the
    library steps aside there, so its Triton tests would fail rather than test anything)."""
    from convt3d.backends.triton import triton_unusable

    reason = triton_unusable()
    if reason is not None:
        pytest.skip(reason, allow_module_level=True)


def run_in_sample(selected: bool) -> None:
    """Skip this parameter combination unless the test selected it for the default sample or CONVT3D_FULL_TESTS=1."""
    if not (selected or FULL_TESTS):
        pytest.skip("outside the default sample of this test's combinations (CONVT3D_FULL_TESTS=1 runs it)")


@pytest.fixture
def nan_poisoned_allocator():
    """Every torch.empty and Tensor.new_empty hands out NaN-filled memory, so an element a kernel skips shows up.
    (Integer buffers, such as autotuning's, stay as they are.)"""
    from convt3d.bench.protocol import nan_poisoned_allocations

    with nan_poisoned_allocations():
        yield


def eager_called_models():
    """A two-layer convt3d model (tuple strides, padding and output_padding, groups, dilation, a layer without bias)
    that has already run eager calls, so that its modules hold bound forwards, and its float64 nn.ConvTranspose3d twin
    with the same parameters: for the tests of what records or exports a model (torch.jit.trace and script,
    torch.export, torch.onnx)."""
    import convt3d
    from torch import nn

    torch.manual_seed(0)
    first = dict(stride=(2, 1, 2), padding=(1, 0, 1), output_padding=(1, 0, 0), groups=2, dilation=(1, 2, 1))
    model = nn.Sequential(convt3d.ConvTranspose3d(4, 6, 3, **first), nn.ReLU(),
                          convt3d.ConvTranspose3d(6, 2, 2, stride=(1, 2, 2), bias=False))
    reference = nn.Sequential(nn.ConvTranspose3d(4, 6, 3, **first), nn.ReLU(),
                              nn.ConvTranspose3d(6, 2, 2, stride=(1, 2, 2), bias=False)).double()
    reference.load_state_dict(model.state_dict())
    model(torch.rand(2, 4, 3, 4, 5))
    model(torch.rand(2, 4, 3, 4, 5))
    return model, reference


def random_config(rng: random.Random, max_size: int = 5) -> dict:
    """A random valid ConvTranspose3d configuration, small enough for float64 on the CPU."""
    while True:
        groups = rng.choice([1, 1, 1, 2, 3])
        cfg = dict(
            batch=rng.choice([0, 1, 1, 2]),
            in_channels=groups * rng.randint(1, 3),
            out_channels=groups * rng.randint(1, 3),
            groups=groups,
            kernel_size=tuple(rng.randint(1, 4) for _ in range(3)),
            stride=tuple(rng.randint(1, 3) for _ in range(3)),
            padding=tuple(rng.randint(0, 3) for _ in range(3)),
            dilation=tuple(rng.randint(1, 3) for _ in range(3)),
            spatial=tuple(rng.randint(1, max_size) for _ in range(3)),
            bias=rng.random() < 0.5,
            unbatched=rng.random() < 0.1,
        )
        cfg["output_padding"] = tuple(
            rng.randint(0, max(s, d) - 1) for s, d in zip(cfg["stride"], cfg["dilation"])
        )
        out = [
            (n - 1) * s - 2 * p + d * (k - 1) + op + 1
            for n, s, p, d, k, op in zip(
                cfg["spatial"], cfg["stride"], cfg["padding"], cfg["dilation"], cfg["kernel_size"],
                cfg["output_padding"])
        ]
        if min(out) >= 1:
            if rng.random() < 0.5:  # ints where all three agree, as users often write them
                for key in ("stride", "padding", "dilation", "output_padding"):
                    if len(set(cfg[key])) == 1:
                        cfg[key] = cfg[key][0]
            return cfg


def make_tensors(cfg: dict, dtype=torch.float64, device="cpu", generator=None):
    shape = (cfg["in_channels"], *cfg["spatial"])
    if not cfg["unbatched"]:
        shape = (cfg["batch"], *shape)
    x = torch.randn(shape, dtype=dtype, device=device, generator=generator)
    w = torch.randn(
        cfg["in_channels"], cfg["out_channels"] // cfg["groups"], *cfg["kernel_size"], dtype=dtype, device=device,
        generator=generator,
    )
    b = torch.randn(cfg["out_channels"], dtype=dtype, device=device, generator=generator) if cfg["bias"] else None
    return x, w, b


def layer_args(cfg: dict) -> dict:
    return {k: cfg[k] for k in ("stride", "padding", "output_padding", "groups", "dilation")}


def float64_reference(x, w, b, cfg: dict):
    """PyTorch's conv_transpose3d of the layer cfg on the operands in float64 (b may be None)."""
    return torch.nn.functional.conv_transpose3d(x.double(), w.double(), b.double() if b is not None else None,
                                                **layer_args(cfg))


def assert_close_rel(actual, expected, rel: float, what: str = ""):
    """Relative Frobenius error, with the first mismatching elements printed on failure."""
    assert actual.shape == expected.shape, f"{what} shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    assert not torch.isnan(actual).any(), f"{what} has NaN (an element was not written?)"
    a, e = actual.double(), expected.double()
    denom = e.norm().item()
    err = (a - e).norm().item() / denom if denom > 0 else (a - e).norm().item()
    if err > rel:
        diff = (a - e).abs().flatten()
        worst = diff.topk(min(5, diff.numel())).indices
        rows = [f"  at {tuple(torch.unravel_index(i, a.shape))}: got {a.flatten()[i]:.6g}, want {e.flatten()[i]:.6g}"
                for i in worst]
        raise AssertionError(f"{what} relative error {err:.3e} > {rel:.1e}\n" + "\n".join(rows))
    return err


def assert_compiled_calls_match(compiled, model, reference, inputs, rel: float = 1e-5):
    """Each input through the compiled model: the output's strides as the model's own call gives them, and the
    output and the gradients of the input and of every parameter against the float64 reference model (which has
    the model's parameters)."""
    for x in inputs:
        x = x.detach().requires_grad_()
        x64 = x.detach().double().requires_grad_()
        y, y64 = compiled(x), reference(x64)
        assert y.stride() == model(x).stride()
        grad = torch.randn(y.shape, device=y.device)
        y.backward(grad)
        y64.backward(grad.double())
        what = f"input {tuple(x.shape)} strides {x.stride()}"
        assert_close_rel(y, y64, rel, what)
        assert_close_rel(x.grad, x64.grad, rel, what)
        for p, p64 in zip(model.parameters(), reference.parameters()):
            assert_close_rel(p.grad, p64.grad, rel, what)
        model.zero_grad()
        reference.zero_grad()


def assert_autocast_call_matches(x, w, b, args, dtype, backend: str, output_rel: float, grad_rel: float = 1e-2):
    """convt3d.conv_transpose3d(x, w, b, *args) under torch.autocast to dtype on x's device type: the output in
    PyTorch's dtype there, against float64 on the operands cast to dtype, and the gradients of x, w and b in
    float32 against float64's."""
    import torch.nn.functional as F

    import convt3d  # (here: this module sets TRITON_INTERPRET before anything imports the kernels)

    with torch.autocast(x.device.type, dtype=dtype):
        expected_dtype = F.conv_transpose3d(x, w, b, *args).dtype
        y = convt3d.conv_transpose3d(x, w, b, *args, backend=backend)
    assert y.dtype == expected_dtype == dtype
    cast64 = [t.detach().to(dtype).double().requires_grad_() for t in (x, w, b)]
    y64 = F.conv_transpose3d(*cast64, *args)
    assert_close_rel(y, y64, output_rel, "output")
    grad = torch.randn(y.shape, device=y.device)
    grads = torch.autograd.grad(y, (x, w, b), grad.to(dtype))
    for got, want, name in zip(grads, torch.autograd.grad(y64, cast64, grad.double()), ("input", "weight", "bias")):
        assert got.dtype == torch.float32, name
        assert_close_rel(got, want, grad_rel, f"grad {name}")
