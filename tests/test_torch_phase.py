"""The portable phase backend's own functions, against PyTorch in float64."""

import random

import pytest
import torch

from conftest import assert_close_rel, layer_args, make_tensors, random_config
from convt3d.backends.torch_phase import conv_transpose3d_grad_input
from convt3d.plan import make_plan


@pytest.mark.parametrize("seed", range(60))
def test_grad_input_matches_autograd(seed):
    cfg = dict(random_config(random.Random(500 + seed)), unbatched=False)
    x, w, _ = make_tensors(cfg)
    plan = make_plan(tuple(x.shape), tuple(w.shape), **layer_args(cfg))
    x.requires_grad_()
    y = torch.nn.functional.conv_transpose3d(x, w, None, **layer_args(cfg))
    grad = torch.randn_like(y)
    (expected,) = torch.autograd.grad(y, x, grad)
    actual = conv_transpose3d_grad_input(grad, w, plan)
    assert actual.shape == expected.shape
    if expected.numel():
        assert_close_rel(actual, expected, 1e-10, str(cfg))
