"""kernelbench/level1_77_convt3d.py: ModelNew against Model, as KernelBench's harness runs them."""

import importlib.util
from pathlib import Path

import torch

from conftest import assert_close_rel

PATH = Path(__file__).resolve().parents[1] / "kernelbench" / "level1_77_convt3d.py"


def _load():
    spec = importlib.util.spec_from_file_location("level1_77_convt3d", PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_model_new_matches_model():
    kb = _load()
    init = kb.get_init_inputs()
    torch.manual_seed(42)
    model = kb.Model(*init)
    torch.manual_seed(42)
    model_new = kb.ModelNew(*init)
    assert torch.equal(model.conv_transpose3d.weight, model_new.conv_transpose3d.weight)
    assert type(model_new.conv_transpose3d).__module__.startswith("convt3d")
    (x,) = kb.get_inputs()
    assert x.shape == (16, 32, 16, 32, 32)
    x = x[:2]  # two samples keep the CPU run short; the GPU bench runs the full batch
    with torch.no_grad():
        expected, actual = model(x), model_new(x)
        reference = torch.nn.functional.conv_transpose3d(
            x.double(), model.conv_transpose3d.weight.double(), None, 2, 1, 0, 1, 2)
    assert torch.allclose(actual, expected, atol=1e-4, rtol=1e-4)  # KernelBench's float32 check
    assert_close_rel(actual, reference, 1e-5)
