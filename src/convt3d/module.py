"""convt3d.ConvTranspose3d, a drop-in nn.ConvTranspose3d, and convert(model)."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from . import ops
from .functional import BACKENDS, autocast_dtype, conv_transpose3d, recording, validate
from .plan import output_padding_for_size

# Bound forwards kept per module (one per input signature) before starting over.
MAX_BOUND = 8


class ConvTranspose3d(nn.ConvTranspose3d):
    """nn.ConvTranspose3d computed by convt3d: same constructor, parameters and state_dict.

    `backend` ("auto", "torch", "triton", "eager") is an attribute, not a parameter, so
    state_dicts move freely between this class and nn.ConvTranspose3d. torch.jit.script compiles
    nn.ConvTranspose3d's forward in its place (_scripted_forward).
    """

    backend: str = "auto"
    # Per input signature (ops.signature): the forward bound after the first call with it (ops.BoundForward), or None
    # where none serves; and the attributes they were bound with (_config). Not saved with the module.
    _bound_forwards: Optional[dict] = None
    _bound_config: Optional[tuple] = None
    # What torch.jit.script leaves out of a scripted module (_scripted_forward uses none of them).
    __jit_ignored_attributes__ = ["backend", "_bound_forwards", "_bound_config"]

    def forward(self, input: torch.Tensor, output_size: Optional[list[int]] = None) -> torch.Tensor:
        """As nn.ConvTranspose3d's: input (N, C_in, D, H, W) or unbatched (C_in, D, H, W); output_size, the output's
        spatial size (optionally with N and C in front), picks the output_padding that gives it. Computed by
        convt3d.conv_transpose3d with this layer's backend attribute."""
        if torch.jit.is_scripting():
            return self._scripted_forward(input, output_size)
        return self._eager_forward(input, output_size)

    def _scripted_forward(self, input: torch.Tensor, output_size: Optional[list[int]] = None) -> torch.Tensor:
        """torch.jit.script's forward: PyTorch's own op, as nn.ConvTranspose3d's forward runs it (TorchScript compiles
        none of convt3d's Python), so that a scripted model saves and loads wherever TorchScript runs."""
        if self.padding_mode != "zeros":
            raise ValueError("Only 'zeros' padding mode is supported for ConvTranspose3d")
        output_padding = self._output_padding(
            input, output_size, self.stride, self.padding, self.kernel_size, 3, self.dilation)  # type: ignore[arg-type]
        return F.conv_transpose3d(input, self.weight, self.bias, self.stride, self.padding, output_padding, self.groups,
                                  self.dilation)

    @torch.jit.unused  # (TorchScript compiles _scripted_forward instead)
    def _eager_forward(self, input: torch.Tensor, output_size: Optional[list[int]] = None) -> torch.Tensor:
        params = self._parameters
        # Read from the parameters' dict: nn.Module's attribute lookup cost 1 us per parameter on the 2-core CPU.
        # Where weight or bias is not a plain parameter (torch.nn.utils.parametrize, weight_norm), as attributes.
        if "weight" in params and "bias" in params:
            weight, bias = params["weight"], params["bias"]
        else:
            weight, bias = self.weight, self.bias
        bounds = signature = None
        # (Under autocast the full way casts the operands as autocast does; the bound forwards run them as given. An
        # input that is no tensor takes the full way too, whose checks name it.)
        if (output_size is None and not recording() and isinstance(input, torch.Tensor)
                and autocast_dtype(input.device.type) is None):
            bounds = self._bound_forwards
            if bounds is not None and self._config_is(self._bound_config):
                signature = ops.signature(input)
                if signature in bounds:
                    bound = bounds[signature]
                    out = None if bound is None else bound(input, weight, bias)
                    if out is not None:
                        return out
                    if bound is None:
                        signature = None  # known to take the full way: nothing to bind
            else:
                bounds, signature = {}, ops.signature(input)
        if self.padding_mode != "zeros":
            raise ValueError(f"Only 'zeros' padding mode is supported for ConvTranspose3d, got {self.padding_mode!r}")
        output_padding = self.output_padding
        if output_size is not None:
            output_padding = output_padding_for_size(
                tuple(input.shape), output_size, self.kernel_size, self.stride, self.padding, self.dilation
            )
        out = conv_transpose3d(
            input, weight, bias, self.stride, self.padding, output_padding, self.groups, self.dilation,
            backend=self.backend,
        )
        if signature is not None:
            self._bind(bounds, signature, input, weight, bias)
        return out

    def _config(self) -> tuple:
        return (self.stride, self.padding, self.output_padding, self.groups, self.dilation, self.padding_mode,
                self.backend)

    def _config_is(self, config) -> bool:
        # By identity: ints and tuples of ints cannot change in place (_bind binds no others), and an equal value of
        # another type (True for 1) may be an error that the full way reports.
        return (config is not None and self.stride is config[0] and self.padding is config[1]
                and self.output_padding is config[2] and self.groups is config[3] and self.dilation is config[4]
                and self.padding_mode is config[5] and self.backend is config[6])

    def _bind(self, bounds: dict, signature, input, weight, bias) -> None:
        """After a call by the full way: the bound forward for later calls with input's signature (None if none
        serves), kept with the attributes it was bound with."""
        if self.__dict__.get("_is_replica") or not ops.can_bind(input):
            return  # (nn.DataParallel's replicas live for one call; ops.can_bind says which calls pass)
        config = self._config()
        if not all(type(v) is int or type(v) is tuple and all(type(i) is int for i in v) for v in config[:5]):
            return  # lists, or values that the full way may reject: always the full way
        batched, plan, unbatched = validate(input, weight, bias, *config[:5])
        bound = None if unbatched else ops.bind_forward(batched, weight, bias, plan, self.backend)
        if len(bounds) >= MAX_BOUND:
            bounds.clear()
        bounds[signature] = bound
        if self.__dict__.get("_bound_forwards") is not bounds or self._bound_config is not config:
            self.__dict__["_bound_forwards"], self.__dict__["_bound_config"] = bounds, config

    def _replicate_for_data_parallel(self):
        # nn.DataParallel's replicas, made anew for every call and holding copies of the parameters, take the full way:
        # sharing this module's bound forwards, each replica's call would rebind them to its own copies.
        replica = super()._replicate_for_data_parallel()
        replica.__dict__["_bound_forwards"] = replica.__dict__["_bound_config"] = None
        return replica

    def __getstate__(self):
        # The bound forwards hold the backends' prepared launches, which neither pickle nor belong to a copy.
        state = super().__getstate__()
        state.pop("_bound_forwards", None)
        state.pop("_bound_config", None)
        return state


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
