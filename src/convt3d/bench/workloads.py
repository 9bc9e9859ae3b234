"""Layers to benchmark: KernelBench level-1 problem 77 by default, any layer by --config, or a sweep."""

from __future__ import annotations

import copy
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ..plan import make_plan, triple

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass
class Layer:
    name: str = "kernelbench_l1_77"
    in_channels: int = 32
    out_channels: int = 64
    kernel_size: object = 3
    stride: object = 2
    padding: object = 1
    output_padding: object = 0
    groups: int = 1
    dilation: object = 2
    bias: bool = False
    input_shape: list = field(default_factory=lambda: [16, 32, 16, 32, 32])
    dtype: str = "float32"

    def validate(self) -> "Layer":
        """Raise ValueError/TypeError naming the bad field, before any work."""
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        if len(self.input_shape) != 5:
            raise ValueError(f"input_shape must be [N, C, D, H, W], got {self.input_shape}")
        if self.input_shape[1] != self.in_channels:
            raise ValueError(f"input_shape[1]={self.input_shape[1]} must equal in_channels={self.in_channels}")
        if self.groups < 1 or self.out_channels % self.groups:
            raise ValueError(f"groups={self.groups} must divide out_channels={self.out_channels}")
        self.plan()
        return self

    def weight_shape(self) -> tuple[int, ...]:
        return (self.in_channels, self.out_channels // self.groups, *triple(self.kernel_size, "kernel_size"))

    def plan(self):
        return make_plan(self.input_shape, self.weight_shape(), self.stride, self.padding, self.output_padding,
                         self.groups, self.dilation)

    def module(self) -> torch.nn.ConvTranspose3d:
        return torch.nn.ConvTranspose3d(
            self.in_channels, self.out_channels, self.kernel_size, stride=self.stride, padding=self.padding,
            output_padding=self.output_padding, groups=self.groups, bias=self.bias, dilation=self.dilation,
        )

    def phase_case(self, device) -> tuple:
        """For timing the phase path's pieces on a layer whose taps reach one phase (problem 77): (the plan, that
        phase's axis phases, a fresh random input, a fresh random weight scaled by 0.05)."""
        plan = self.plan()
        (phase,) = plan.nonempty_phases
        dtype = DTYPES[self.dtype]
        x = torch.rand(self.input_shape, device=device, dtype=dtype)
        w = torch.randn(self.weight_shape(), device=device, dtype=dtype) * 0.05
        return plan, phase.axes, x, w

    def kernel_case(self, device) -> tuple:
        """For timing kernels on their own: (the nn module in the layer's dtype, its weights seeded with 0, a fresh
        random input, the module's weight and bias detached, the layer's float64 result on them)."""
        dtype = DTYPES[self.dtype]
        torch.manual_seed(0)
        module = self.module().to(device=device, dtype=dtype)
        x = torch.rand(self.input_shape, device=device, dtype=dtype)
        w, b = module.weight.detach(), module.bias.detach() if module.bias is not None else None
        plan = self.plan()
        reference = torch.nn.functional.conv_transpose3d(
            x.double(), w.double(), b.double() if b is not None else None, plan.stride, plan.padding,
            plan.output_padding, plan.groups, plan.dilation)
        return module, x, w, b, reference

    def training_case(self, device) -> tuple:
        """For forward+backward timings: (the nn module, convt3d's with the same weights, a fresh random input
        that requires grad, a fresh random gradient of the output)."""
        from ..module import convert

        dtype = DTYPES[self.dtype]
        eager = self.module().to(device=device, dtype=dtype)
        ours = convert(copy.deepcopy(eager))
        x = torch.rand(self.input_shape, device=device, dtype=dtype, requires_grad=True)
        return eager, ours, x, torch.rand(self.plan().output_shape, device=device, dtype=dtype)

    def with_batch(self, batch: int) -> "Layer":
        return Layer(**{**asdict(self), "input_shape": [batch, *self.input_shape[1:]]})

    def describe(self) -> str:
        return (f"ConvTranspose3d({self.in_channels}, {self.out_channels}, k={self.kernel_size}, s={self.stride}, "
                f"p={self.padding}, op={self.output_padding}, g={self.groups}, d={self.dilation}, bias={self.bias}) "
                f"on {self.dtype} input {list(self.input_shape)}")


PROBLEM_77 = Layer()


def parse_config(text: str) -> Layer:
    """A layer from JSON (inline or a file path); fields default to problem 77's."""
    path = Path(text)
    try:
        data = json.loads(path.read_text() if path.is_file() else text)
    except json.JSONDecodeError as error:
        raise ValueError(f"--config must be JSON or a path to a JSON file: {error}") from None
    if not isinstance(data, dict):
        raise ValueError("--config must be a JSON object of layer fields")
    unknown = set(data) - set(Layer.__dataclass_fields__)
    if unknown:
        raise ValueError(f"--config has unknown fields {sorted(unknown)}; known: {sorted(Layer.__dataclass_fields__)}")
    if "input_shape" not in data and "in_channels" in data:
        data["input_shape"] = [PROBLEM_77.input_shape[0], data["in_channels"], *PROBLEM_77.input_shape[2:]]
    return Layer(**{"name": "custom", **data}).validate()


def default_sweep_path() -> Path:
    # The public sweep ships with the package, so that an installed convt3d runs it too (benchmarks/sweep.json in a
    # checkout links to this file).
    return Path(__file__).resolve().parent / "sweep.json"


def load_sweep(path: str | None) -> list[Layer]:
    sweep_path = Path(path) if path else default_sweep_path()
    if not sweep_path.is_file():
        if path:
            raise ValueError(f"--sweep: no file {sweep_path} (a JSON list of layers)")
        raise ValueError(f"the public sweep {sweep_path} is missing from this installation of convt3d: pass --sweep "
                         "PATH to a JSON list of layers")
    return [Layer(**entry).validate() for entry in json.loads(sweep_path.read_text())]


def sweep_layers(names: str, path: str | None = None) -> list[Layer]:
    """The sweep's layers named in a comma-separated list, in the list's order (bench's and the diagnostic scripts'
    --layers)."""
    layers = {layer.name: layer for layer in load_sweep(path)}
    unknown = [name for name in names.split(",") if name not in layers]
    if unknown:
        raise ValueError(f"layers: no sweep layer named {', '.join(unknown)} (the sweep has {', '.join(layers)})")
    return [layers[name] for name in names.split(",")]
