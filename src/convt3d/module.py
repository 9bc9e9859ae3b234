"""convt3d.ConvTranspose3d, a drop-in nn.ConvTranspose3d, and convert(model)."""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from .functional import BACKENDS, conv_transpose3d
from .plan import output_padding_for_size


class ConvTranspose3d(nn.ConvTranspose3d):
    """nn.ConvTranspose3d computed by convt3d: same constructor, parameters and state_dict.

    `backend` ("auto", "torch", "triton", "eager") is an attribute, not a parameter, so
    state_dicts move freely between this class and nn.ConvTranspose3d.
    """

    backend: str = "auto"

    def forward(self, input: torch.Tensor, output_size: Optional[list[int]] = None) -> torch.Tensor:
        if self.padding_mode != "zeros":
            raise ValueError(f"Only 'zeros' padding mode is supported for ConvTranspose3d, got {self.padding_mode!r}")
        output_padding = self.output_padding
        if output_size is not None:
            output_padding = output_padding_for_size(
                tuple(input.shape), output_size, self.kernel_size, self.stride, self.padding, self.dilation
            )
        return conv_transpose3d(
            input, self.weight, self.bias, self.stride, self.padding, output_padding, self.groups, self.dilation,
            backend=self.backend,
        )


def convert(model: nn.Module, backend: str = "auto") -> nn.Module:
    """Replace every nn.ConvTranspose3d inside `model` (or `model` itself) by convt3d.ConvTranspose3d.

    Parameters are shared, not copied, so device, dtype, weights and optimizer state are kept.
    Returns the model (or the replacement, if `model` itself was a ConvTranspose3d).
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if isinstance(model, nn.ConvTranspose3d):
        return _swap(model, backend)
    for name, child in model.named_children():
        if isinstance(child, nn.ConvTranspose3d):
            setattr(model, name, _swap(child, backend))
        else:
            convert(child, backend)
    return model


def _swap(layer: nn.ConvTranspose3d, backend: str) -> ConvTranspose3d:
    new = ConvTranspose3d.__new__(ConvTranspose3d)
    new.__dict__ = layer.__dict__.copy()  # shares the Parameters, hooks and flags
    new.backend = backend
    return new
